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
import java.net.HttpURLConnection;
import java.net.SocketTimeoutException;
import java.net.URI;
import java.net.URISyntaxException;
import java.net.URL;
import javax.net.ssl.HttpsURLConnection;
import javax.net.ssl.SSLSocketFactory;
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
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collection;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
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
 * {@link #BLOCK} bytes at a time into its heap, the next block on another
 * thread while it decodes one (at most two blocks a task).  TLS: options tlsCert,
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
  /** TLS settings by (cert, key, ca): built once per JVM. */
  private static final Map<String, SSLSocketFactory> SOCKETS = new ConcurrentHashMap<>();

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

  /**
   * A connection for url (JDK's HttpURLConnection: kept alive between
   * requests, and 2-4x the JDK HttpClient's speed on bodies of MiBs).
   */
  private HttpURLConnection connect(String url) throws IOException {
    HttpURLConnection c = (HttpURLConnection) new URL(url).openConnection();
    if (c instanceof HttpsURLConnection) {
      String id = cert + "|" + key + "|" + ca;
      SSLSocketFactory tls = SOCKETS.get(id);
      if (tls == null) {
        tls = sslContext().getSocketFactory();
        SSLSocketFactory raced = SOCKETS.putIfAbsent(id, tls);
        if (raced != null) {
          tls = raced;
        }
      }
      ((HttpsURLConnection) c).setSSLSocketFactory(tls);
      // The certificate must name HOST: the JDK's own check, and no
      // leniency on a mismatch (this verifier is asked only then; a
      // process-wide default could be lenient).
      ((HttpsURLConnection) c).setHostnameVerifier((host, session) -> false);
    }
    c.setConnectTimeout(TIMEOUT_SECONDS * 1000);
    c.setReadTimeout(TIMEOUT_SECONDS * 1000);
    c.setInstanceFollowRedirects(false);
    c.setUseCaches(false);
    return c;
  }

  /** A broker's answer: its status, headers and body (to read, then close). */
  private static final class Answer {
    final int status;
    final HttpURLConnection connection;

    Answer(HttpURLConnection connection) throws IOException {
      this.connection = connection;
      this.status = connection.getResponseCode();
    }

    String header(String name) {
      return connection.getHeaderField(name);
    }

    InputStream body() throws IOException {
      InputStream in = status < 400 ? connection.getInputStream() : connection.getErrorStream();
      return in != null ? in : new ByteArrayInputStream(new byte[0]);
    }
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
    if (e instanceof SocketTimeoutException) {
      return url + ": no answer within " + TIMEOUT_SECONDS + " s";
    }
    if (e instanceof ConnectException) {
      return url + ": connection refused (" + oneLine(e) + ")";
    }
    if (String.valueOf(e.getMessage()).startsWith("HTTPS hostname wrong")) {
      // (HttpsURLConnection's words for a certificate naming another host.)
      return url + ": TLS: the broker's certificate does not name the host asked for ("
          + oneLine(e) + ")";
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
  private Answer get(String path, String range, String location) throws IOException {
    String url = uri + path;
    for (int busy = 0; ; busy++) {
      Answer response;
      try {
        HttpURLConnection c = connect(http + path);
        if (range != null) {
          c.setRequestProperty("Range", range);
        }
        response = new Answer(c);
      } catch (StoreReadError e) {
        throw e;
      } catch (IOException e) {
        if (Thread.currentThread().isInterrupted()) {
          throw new InterruptedIOException(url + ": interrupted");
        }
        throw new StoreReadError(failure(url, e));
      }
      if (response.status != 503 || busy >= busyRetries) {
        return response;
      }
      drain(response, url);
      long wait = (long) (busyScale * busyDelay(response.header("retry-after"), busy + 1));
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
  private static byte[] small(Answer response, int limit, String url)
      throws IOException {
    String length = response.header("content-length");
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

  private static void drain(Answer response, String url) throws IOException {
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
    Answer response = get("/commitlog", null, uri);
    byte[] body = small(response, MAX_LISTING, url);
    if (response.status != 200) {
      throw new StoreReadError(url + ": HTTP " + response.status + ": " + serverError(body));
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

  /** Reads ahead: daemon threads, so a task's JVM never waits for one to exit. */
  private static final ExecutorService AHEAD =
      Executors.newCachedThreadPool(
          r -> {
            Thread t = new Thread(r, "rmqha-http-read-ahead");
            t.setDaemon(true);
            return t;
          });

  /**
   * One segment, read a range at a time.  Once the caller has said where
   * its reading ends ({@link #readingTo}: a span decoder), while it
   * decodes a range the next one (the same length, right after it, up to
   * that end) is read on another thread, as the Python reader does
   * (rmqha.pipeline.httpstore): a read that asks for it takes it, any
   * other read drops it.
   */
  public final class HttpInput implements SegmentInput {
    private final Segment segment;
    private final String path;
    private Future<ByteBuffer> ahead;
    private long aheadAt = -1;
    private int aheadLength;
    /** Where the caller's reading ends (readingTo); 0: not said, no read-ahead. */
    private long readingEnd;

    HttpInput(Segment segment) {
      this.segment = segment;
      this.path = "/commitlog/" + segment.name;
    }

    @Override
    public long size() {
      return segment.size;
    }

    @Override
    public void readingTo(long end) {
      readingEnd = end;
    }

    @Override
    public ByteBuffer read(long at, int length) throws IOException {
      ByteBuffer data;
      if (ahead != null && aheadAt == at && aheadLength == clamp(at, length)) {
        data = taken(ahead);
        ahead = null;
      } else {
        drop();
        data = fetch(at, length);
      }
      long next = at + data.limit();
      int more = clamp(next, (int) Math.min(length, readingEnd - next));
      if (data.limit() > 0 && more > 0) {
        aheadAt = next;
        aheadLength = more;
        ahead = AHEAD.submit(() -> fetch(next, more));
      }
      return data;
    }

    /** What fetch(at, length) asks for: up to the segment's end. */
    private int clamp(long at, int length) {
      return (int) Math.max(0, Math.min(length, segment.size - at));
    }

    private ByteBuffer taken(Future<ByteBuffer> f) throws IOException {
      try {
        return f.get();
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        f.cancel(true);
        throw new StoreReadError(uri + path + ": interrupted while reading");
      } catch (ExecutionException e) {
        Throwable cause = e.getCause();
        if (cause instanceof IOException) {
          throw (IOException) cause;
        }
        if (cause instanceof RuntimeException) {
          throw (RuntimeException) cause;
        }
        throw new StoreReadError(uri + path + ": " + oneLine(cause));
      }
    }

    private void drop() {
      if (ahead != null) {
        ahead.cancel(true);
        ahead = null;
      }
    }

    private ByteBuffer fetch(long at, int length) throws IOException {
      int n = (int) Math.max(0, Math.min(length, segment.size - at));
      if (n == 0 || at < 0) {
        return ByteBuffer.allocate(0);
      }
      long last = at + n - 1;
      String url = uri + path;
      Answer response = get(path, "bytes=" + at + "-" + last, segment.location);
      int status = response.status;
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
      String range = String.valueOf(response.header("content-range"));
      String count = String.valueOf(response.header("content-length"));
      range = range.equals("null") ? "" : range;
      count = count.equals("null") ? "" : count;
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
    public void close() {
      drop();
    }
  }
}
