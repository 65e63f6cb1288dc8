package rmqha.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.ByteArrayInputStream;
import java.io.File;
import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.InterruptedIOException;
import java.net.ConnectException;
import java.net.URI;
import java.net.URISyntaxException;
import java.net.http.HttpClient;
import java.net.http.HttpConnectTimeoutException;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.net.http.HttpTimeoutException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.spec.PKCS8EncodedKeySpec;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collection;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ThreadLocalRandom;
import java.util.regex.Pattern;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLException;
import javax.net.ssl.TrustManagerFactory;

/**
 * A live broker's commit log, {@code rmqha+http://HOST:PORT} or {@code
 * rmqha+https://HOST:PORT}, through its admin HTTP ({@code
 * --serve-commitlog}; docs/admin.md, "The commit log"): the protocol of
 * rmqha.pipeline.httpstore, transcribed.
 *
 * <pre>
 *   GET /commitlog          the segment files and max_offset ({@link #segments()})
 *   GET /commitlog/{name}   one byte range of one ({@link HttpInput#read})
 * </pre>
 *
 * Each read asks for exactly the bytes it wants (one {@code Range}) and
 * accepts exactly those; a busy broker (503) is asked again as its {@code
 * Retry-After} says or later, {@link #BUSY_RETRIES} times.  A task reads
 * {@link #BLOCK} bytes at a time into its heap.  TLS: options tlsCert,
 * tlsKey (PKCS#8 PEM, as rmqha's certificates are written), tlsCa, else
 * the environment's RMQHA_TLS_CERT/KEY/CA; the broker's certificate must
 * name HOST.  Errors are one line naming the URL.
 */
public final class HttpStore implements SegmentStore, StoreEnd {
  private static final long serialVersionUID = 1L;
  /** Seconds a connection, or an answer, may take (rmqha.pipeline.httpstore.TIMEOUT). */
  static final int TIMEOUT_SECONDS = 60;
  /** Times a 503 is asked again (rmqha.pipeline.httpstore.BUSY_RETRIES). */
  static final int BUSY_RETRIES = 8;
  /** The largest listing read (rmqha.pipeline.httpstore.MAX_LISTING). */
  static final int MAX_LISTING = 8 << 20;
  /** The bytes a task reads at once (the Python reader's block). */
  static final int BLOCK = 8 << 20;

  private static final Pattern SEGMENT_NAME = Pattern.compile("[0-9]{20}");
  private static final String[][] TLS = {
    {"tlsCert", "RMQHA_TLS_CERT"}, {"tlsKey", "RMQHA_TLS_KEY"}, {"tlsCa", "RMQHA_TLS_CA"},
  };
  /** One client per TLS setting in each JVM: its kept-alive connections shared by the tasks. */
  private static final Map<String, HttpClient> CLIENTS = new ConcurrentHashMap<>();

  final String uri; // rmqha+http(s)://HOST:PORT
  private final String http; // http(s)://HOST:PORT
  private final String cert;
  private final String key;
  private final String ca;
  /** Times a 503 is asked again (settable: the tests'). */
  public int busyRetries = BUSY_RETRIES;
  /** What the waits before those are multiplied by (the tests': 0). */
  public double busyScale = 1.0;
  private transient Long maxOffset;

  private HttpStore(String uri, String http, String cert, String key, String ca) {
    this.uri = uri;
    this.http = http;
    this.cert = cert;
    this.key = key;
    this.ca = ca;
  }

  /** Whether location is a live broker's. */
  static boolean handles(String location) {
    String l = location.trim().toLowerCase(Locale.ROOT);
    return l.startsWith("rmqha+http://") || l.startsWith("rmqha+https://");
  }

  /**
   * The store at location, with TLS files from the options (keys
   * lower-cased) or the environment.
   *
   * @throws IllegalArgumentException one line naming the location or option
   */
  public static HttpStore of(String location, Map<String, String> options) {
    URI parsed;
    try {
      parsed = new URI(location.trim());
    } catch (URISyntaxException e) {
      throw new IllegalArgumentException(location + ": not a URI: " + e.getReason());
    }
    String scheme = parsed.getScheme().toLowerCase(Locale.ROOT);
    boolean tls = scheme.equals("rmqha+https");
    String host = parsed.getHost();
    int port = parsed.getPort();
    if (host == null || port <= 0 || port > 65535) {
      throw new IllegalArgumentException(location + ": give HOST:PORT of the broker's admin HTTP");
    }
    String path = parsed.getRawPath();
    if ((path != null && !path.isEmpty() && !path.equals("/")) || parsed.getRawQuery() != null
        || parsed.getRawFragment() != null) {
      throw new IllegalArgumentException(
          location + ": a live broker's location is " + scheme + "://HOST:PORT (no path or query)");
    }
    if (parsed.getRawUserInfo() != null) {
      throw new IllegalArgumentException(location + ": no user or password: TLS client certificates");
    }
    String[] files = new String[3];
    for (int i = 0; i < 3; i++) {
      String given = options.get(TLS[i][0].toLowerCase(Locale.ROOT));
      if (given != null && given.isEmpty()) {
        given = null;
      }
      if (given != null && !tls) {
        throw new IllegalArgumentException(
            location + ": the " + TLS[i][0] + " option is for rmqha+https://, not plain HTTP");
      }
      if (tls && given == null) {
        String env = System.getenv(TLS[i][1]);
        given = env == null || env.isEmpty() ? null : env;
      }
      if (given != null && !new File(given).isFile()) {
        throw new IllegalArgumentException(TLS[i][0] + " " + given + ": no such file");
      }
      files[i] = given;
    }
    if ((files[0] == null) != (files[1] == null)) {
      throw new IllegalArgumentException(
          location + ": give tlsCert and tlsKey together (the client certificate and its key)");
    }
    String authority = host + ":" + port; // (getHost keeps an IPv6 address's brackets)
    return new HttpStore(scheme + "://" + authority, (tls ? "https://" : "http://") + authority,
        files[0], files[1], files[2]);
  }

  @Override
  public String location() {
    return uri;
  }

  // -- the client ------------------------------------------------------------

  private HttpClient client() throws IOException {
    String id = http.substring(0, 5) + "|" + cert + "|" + key + "|" + ca;
    HttpClient c = CLIENTS.get(id);
    if (c == null) {
      HttpClient.Builder b = HttpClient.newBuilder()
          .version(HttpClient.Version.HTTP_1_1)
          .connectTimeout(Duration.ofSeconds(TIMEOUT_SECONDS));
      if (http.startsWith("https:")) {
        b.sslContext(sslContext());
      }
      c = b.build();
      HttpClient raced = CLIENTS.putIfAbsent(id, c);
      if (raced != null) {
        c = raced;
      }
    }
    return c;
  }

  private SSLContext sslContext() throws IOException {
    String what = "TLS files for " + uri + " (cert " + cert + ", key " + key + ", ca " + ca + "): ";
    try {
      CertificateFactory x509 = CertificateFactory.getInstance("X.509");
      TrustManagerFactory tmf = null;
      if (ca != null) {
        KeyStore trust = KeyStore.getInstance(KeyStore.getDefaultType());
        trust.load(null, null);
        int i = 0;
        for (Certificate c : certificates(x509, ca)) {
          trust.setCertificateEntry("ca" + i++, c);
        }
        tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
        tmf.init(trust);
      }
      KeyManagerFactory kmf = null;
      if (cert != null) {
        KeyStore keys = KeyStore.getInstance(KeyStore.getDefaultType());
        keys.load(null, null);
        char[] none = new char[0];
        keys.setKeyEntry("client", privateKey(key), none,
            certificates(x509, cert).toArray(new Certificate[0]));
        kmf = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
        kmf.init(keys, none);
      }
      SSLContext context = SSLContext.getInstance("TLS");
      context.init(kmf == null ? null : kmf.getKeyManagers(),
          tmf == null ? null : tmf.getTrustManagers(), null);
      return context;
    } catch (IOException e) {
      throw new StoreReadError(what + oneLine(e));
    } catch (GeneralSecurityException | IllegalArgumentException e) {
      throw new StoreReadError(what + e.getMessage());
    }
  }

  private static Collection<? extends Certificate> certificates(CertificateFactory x509, String path)
      throws IOException, GeneralSecurityException {
    try (InputStream in = new FileInputStream(path)) {
      Collection<? extends Certificate> found = x509.generateCertificates(in);
      if (found.isEmpty()) {
        throw new GeneralSecurityException(path + " holds no PEM certificate");
      }
      return found;
    }
  }

  /** A PEM "PRIVATE KEY" (PKCS#8: rmqha certs' keys): EC, RSA or Ed25519. */
  private static PrivateKey privateKey(String path) throws IOException, GeneralSecurityException {
    String text = new String(Files.readAllBytes(new File(path).toPath()), StandardCharsets.US_ASCII);
    String begin = "-----BEGIN PRIVATE KEY-----";
    int a = text.indexOf(begin);
    int z = text.indexOf("-----END PRIVATE KEY-----");
    if (a < 0 || z < a) {
      throw new GeneralSecurityException(
          path + " is not a PKCS#8 PEM key (BEGIN PRIVATE KEY); convert it with"
              + " 'openssl pkcs8 -topk8 -nocrypt -in KEY -out KEY.pk8'");
    }
    byte[] der = Base64.getMimeDecoder().decode(text.substring(a + begin.length(), z));
    PKCS8EncodedKeySpec spec = new PKCS8EncodedKeySpec(der);
    for (String algorithm : new String[] {"EC", "RSA", "Ed25519", "EdDSA"}) {
      try {
        return KeyFactory.getInstance(algorithm).generatePrivate(spec);
      } catch (GeneralSecurityException e) {
        // the next algorithm
      }
    }
    throw new GeneralSecurityException(path + ": not an EC, RSA or Ed25519 key");
  }

  /** One line for a failed exchange with url. */
  private String failure(String url, Exception e) {
    if (e instanceof HttpConnectTimeoutException || e instanceof HttpTimeoutException) {
      return url + ": no answer within " + TIMEOUT_SECONDS + " s";
    }
    if (e instanceof ConnectException) {
      return url + ": connection refused (" + oneLine(e) + ")";
    }
    Throwable t = e;
    while (t.getCause() != null && !(t instanceof SSLException)) {
      t = t.getCause();
    }
    if (t instanceof SSLException) {
      String hint = cert == null
          ? " (no client certificate given: tlsCert/tlsKey options or RMQHA_TLS_CERT/RMQHA_TLS_KEY)"
          : "";
      return url + ": TLS: " + oneLine(t) + hint;
    }
    return url + ": " + oneLine(t);
  }

  private static String oneLine(Throwable t) {
    String m = t.getMessage();
    if (m == null || m.isEmpty()) {
      m = t.getClass().getSimpleName();
    }
    return String.join(" ", m.trim().split("\\s+"));
  }

  /**
   * GET path (with a Range, or none), a busy broker asked again; the
   * answer, its body still to read.
   */
  private HttpResponse<InputStream> get(String path, String range, String location)
      throws IOException {
    String url = uri + path;
    HttpRequest.Builder b = HttpRequest.newBuilder(URI.create(http + path))
        .timeout(Duration.ofSeconds(TIMEOUT_SECONDS)).GET();
    if (range != null) {
      b.header("Range", range);
    }
    HttpRequest request = b.build();
    for (int busy = 0; ; busy++) {
      HttpResponse<InputStream> response;
      try {
        response = client().send(request, HttpResponse.BodyHandlers.ofInputStream());
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new InterruptedIOException(url + ": interrupted");
      } catch (IOException e) {
        throw new StoreReadError(failure(url, e));
      }
      if (response.statusCode() != 503 || busy >= busyRetries) {
        return response;
      }
      drain(response, url);
      long wait = (long) (busyScale
          * busyDelay(response.headers().firstValue("retry-after").orElse(null), busy + 1));
      try {
        Thread.sleep(wait);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new InterruptedIOException(url + ": interrupted");
      }
    }
  }

  /** rmqha.pipeline.httpstore._busy_delay, in ms. */
  static long busyDelay(String retryAfter, int attempt) {
    double asked = 1.0;
    if (retryAfter != null && retryAfter.trim().matches("[0-9]{1,9}")) {
      asked = Math.min(Double.parseDouble(retryAfter.trim()), 60.0);
    }
    double backoff = Math.min(8.0, 0.5 * Math.pow(2, attempt));
    double jitter = ThreadLocalRandom.current().nextDouble();
    return (long) (Math.max(asked, backoff) * (1 + jitter / 4) * 1000);
  }

  /** A small answer's whole body, refused beyond limit bytes. */
  private static byte[] small(HttpResponse<InputStream> response, int limit, String url)
      throws IOException {
    String length = response.headers().firstValue("content-length").orElse(null);
    try (InputStream in = response.body()) {
      if (length != null && (!length.matches("[0-9]{1,18}") || Long.parseLong(length) > limit)) {
        throw new StoreReadError(url + ": an answer of " + length + " bytes");
      }
      byte[] data = in.readNBytes(limit + 1);
      if (data.length > limit) {
        throw new StoreReadError(url + ": an answer over " + limit + " bytes");
      }
      return data;
    } catch (StoreReadError e) {
      throw e;
    } catch (IOException e) {
      throw new StoreReadError(url + ": " + oneLine(e));
    }
  }

  private static void drain(HttpResponse<InputStream> response, String url) throws IOException {
    small(response, 64 * 1024, url);
  }

  /** The broker's one-line JSON error, or the start of what it sent. */
  private static String serverError(byte[] body) {
    String text;
    try {
      JsonNode answer = new ObjectMapper().readTree(body);
      JsonNode e = answer.get("error");
      if (e == null || e.isNull()) {
        e = answer.get("status");
      }
      text = e == null ? String.valueOf(answer) : e.asText();
    } catch (IOException | RuntimeException e) {
      text = new String(body, 0, Math.min(body.length, 200), StandardCharsets.UTF_8);
    }
    return String.join(" ", text.trim().split("\\s+"));
  }

  // -- SegmentStore ----------------------------------------------------------

  @Override
  public List<Segment> segments() throws IOException {
    String url = uri + "/commitlog";
    HttpResponse<InputStream> response = get("/commitlog", null, uri);
    byte[] body = small(response, MAX_LISTING, url);
    if (response.statusCode() != 200) {
      throw new StoreReadError(url + ": HTTP " + response.statusCode() + ": " + serverError(body));
    }
    List<Segment> out = new ArrayList<>();
    try {
      JsonNode answer = new ObjectMapper().readTree(new ByteArrayInputStream(body));
      JsonNode max = answer.get("max_offset");
      maxOffset = max != null && max.canConvertToLong() && max.isIntegralNumber() ? max.asLong() : null;
      for (JsonNode s : answer.get("segments")) {
        String name = s.get("name").asText();
        long base = s.get("offset").asLong();
        if (!SEGMENT_NAME.matcher(name).matches() || Long.parseLong(name) != base) {
          throw new StoreReadError(url + ": a segment named '"
              + name.substring(0, Math.min(40, name.length())) + "' at offset " + base);
        }
        out.add(new Segment(base, s.get("size").asLong(), name, uri + "/commitlog/" + name));
      }
    } catch (StoreReadError e) {
      throw e;
    } catch (IOException | RuntimeException e) {
      throw new StoreReadError(url + ": not a commit-log listing");
    }
    if (out.isEmpty()) {
      throw new StoreReadError(uri + ": the broker's commit log has no segment yet");
    }
    out.sort((a, b) -> Long.compare(a.base, b.base));
    return out;
  }

  /** The broker's max offset when it listed its segments now: whole records end there. */
  @Override
  public long recordsEnd() throws IOException {
    segments();
    if (maxOffset == null) {
      throw new StoreReadError(uri + "/commitlog: the listing gives no max_offset");
    }
    return maxOffset;
  }

  @Override
  public SegmentInput open(Segment segment) {
    return new HttpInput(segment);
  }

  /** One segment, read a range at a time. */
  public final class HttpInput implements SegmentInput {
    private final Segment segment;
    private final String path;

    HttpInput(Segment segment) {
      this.segment = segment;
      this.path = "/commitlog/" + segment.name;
    }

    @Override
    public long size() {
      return segment.size;
    }

    @Override
    public ByteBuffer read(long at, int length) throws IOException {
      int n = (int) Math.max(0, Math.min(length, segment.size - at));
      if (n == 0 || at < 0) {
        return ByteBuffer.allocate(0);
      }
      long last = at + n - 1;
      String url = uri + path;
      HttpResponse<InputStream> response = get(path, "bytes=" + at + "-" + last, segment.location);
      int status = response.statusCode();
      if (status != 206) {
        String shown = "";
        if (status != 200) {
          shown = ": " + serverError(small(response, 64 * 1024, url));
        } else {
          response.body().close();
        }
        throw new StoreReadError(url + " bytes " + at + "-" + last + ": HTTP " + status + shown
            + (status == 503 ? " (still busy after " + busyRetries + " retries)" : ""));
      }
      String range = response.headers().firstValue("content-range").orElse("");
      String count = response.headers().firstValue("content-length").orElse("");
      try (InputStream in = response.body()) {
        if (!range.startsWith("bytes " + at + "-" + last + "/") || !count.equals(String.valueOf(n))) {
          throw new StoreReadError(url + ": asked bytes " + at + "-" + last + ", answered "
              + (range.isEmpty() ? "no Content-Range" : range) + " ("
              + (count.isEmpty() ? "no" : count) + " Content-Length)");
        }
        byte[] data;
        try {
          data = in.readNBytes(n);
        } catch (IOException e) {
          throw new StoreReadError(url + " bytes " + at + "-" + last + ": " + oneLine(e));
        }
        if (data.length != n) {
          throw new StoreReadError(url + " bytes " + at + "-" + last + ": the answer ended after "
              + data.length + " bytes");
        }
        return ByteBuffer.wrap(data);
      }
    }

    @Override
    public int window() {
      return BLOCK;
    }

    @Override
    public void close() {}
  }
}
