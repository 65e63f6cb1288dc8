package rmqha.spark;

import java.io.File;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.List;
import java.util.regex.Pattern;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.util.SerializableConfiguration;

/**
 * A store on a filesystem: local files (a path, a {@code file:} URI),
 * memory-mapped; or any Hadoop FileSystem on the classpath ({@code hdfs:},
 * {@code s3a:}, ...), read through {@code FSDataInputStream} into heap
 * buffers of {@link #REMOTE_WINDOW} bytes.  The root holds a {@code
 * commitlog} directory or is one.  A local root is made absolute on the
 * driver: executors run in their worker's directory.
 */
final class HadoopStore implements SegmentStore {
  private static final long serialVersionUID = 1L;
  static final Pattern SEGMENT_NAME = Pattern.compile("[0-9]{20}");
  /**
   * The bytes a task reads into its heap at once from a filesystem that is
   * not local (a record longer than this is read whole).
   */
  static final int REMOTE_WINDOW = 16 << 20;

  /** The root as a local absolute path, or null. */
  private final String local;
  /** The root as a URI (not local), or null. */
  private final String uri;
  /** The Hadoop settings (not local): the driver's, with the read's options. */
  private final SerializableConfiguration conf;
  /** Where the segment files were listed (set by segments()). */
  private String directory;

  private HadoopStore(String local, String uri, Configuration conf) {
    this.local = local;
    this.uri = uri;
    this.conf = conf == null ? null : new SerializableConfiguration(conf);
  }

  /**
   * The store at {@code location}: a path (made absolute here), a {@code
   * file:} URI, or a URI a Hadoop FileSystem on the classpath reads.
   *
   * @throws IllegalArgumentException one line: no FileSystem for its scheme
   */
  static HadoopStore of(String location, Configuration conf) {
    return of(location, conf, false);
  }

  /**
   * As {@link #of(String, Configuration)}; with {@code viaHadoop}, local
   * files too are listed and read through Hadoop's FileSystem API (its
   * {@code file:} FileSystem) into heap buffers, as a remote store's are:
   * the tests' way to that path (option {@code _viaHadoop}).
   */
  static HadoopStore of(String location, Configuration conf, boolean viaHadoop) {
    HadoopStore found = resolve(location, conf);
    if (viaHadoop && found.local != null) {
      return new HadoopStore(null, new File(found.local).toURI().toString(), conf);
    }
    return found;
  }

  private static HadoopStore resolve(String location, Configuration conf) {
    URI parsed;
    try {
      parsed = new URI(location);
    } catch (URISyntaxException e) {
      parsed = null; // a path with characters a URI does not take
    }
    String scheme = parsed == null ? null : parsed.getScheme();
    if (scheme == null || scheme.length() == 1) { // (C:\... on Windows)
      return new HadoopStore(new File(location).getAbsolutePath(), null, null);
    }
    if (scheme.equalsIgnoreCase("file")) {
      String path = parsed.getPath();
      if (path == null || path.isEmpty()) {
        throw new IllegalArgumentException(location + ": a file: URI names no path");
      }
      return new HadoopStore(new File(path).getAbsolutePath(), null, null);
    }
    try {
      FileSystem.getFileSystemClass(scheme, conf);
    } catch (IOException e) {
      throw new IllegalArgumentException(
          location + ": no Hadoop FileSystem for scheme '" + scheme + "' on Spark's classpath"
              + " (add its jars with --jars or spark.jars, e.g. hadoop-aws for s3a:)");
    }
    return new HadoopStore(null, location, conf);
  }

  @Override
  public String location() {
    return local != null ? local : uri;
  }

  @Override
  public List<Segment> segments() throws IOException {
    List<Segment> found = local != null ? localSegments() : hadoopSegments();
    found.sort(Comparator.comparingLong(s -> s.base));
    long size = 0;
    for (Segment s : found) {
      size = Math.max(size, s.size);
    }
    for (int i = 1; i < found.size(); i++) {
      Segment a = found.get(i - 1);
      Segment b = found.get(i);
      if (b.base > a.base + size) {
        throw new StoreReadError(
            directory + ": missing segment: no segment file holds offsets " + (a.base + size)
                + ".." + b.base + " (between " + a.name + " and " + b.name
                + "; segments are " + size + " bytes): the store is incomplete");
      }
      if (b.base < a.base + size) {
        throw new StoreReadError(
            directory + ": segment files overlap: " + b.name + " starts before " + a.name
                + "'s " + size + " bytes end (at " + (a.base + size) + "): not one commit log");
      }
    }
    return found;
  }

  private List<Segment> localSegments() throws IOException {
    File root = new File(local);
    File nested = new File(root, "commitlog");
    File dir;
    if (nested.isDirectory()) {
      dir = nested;
    } else if (!root.isDirectory()) {
      throw new StoreReadError(local + ": no such directory");
    } else {
      dir = root;
    }
    String[] names = dir.list();
    if (names == null) {
      throw new StoreReadError("cannot list " + dir.getPath() + ": permission denied or not a directory");
    }
    Arrays.sort(names);
    List<Segment> out = new ArrayList<>();
    for (String name : names) {
      if (!SEGMENT_NAME.matcher(name).matches()) {
        continue;
      }
      File f = new File(dir, name);
      if (!f.isFile()) {
        // (Skipping it would leave a hole every job reads past.)
        throw new StoreReadError(
            f.getPath() + ": " + (f.isDirectory() ? "a directory" : "not a regular file")
                + ", not a segment file");
      }
      out.add(new Segment(Long.parseLong(name), f.length(), name, f.getPath()));
    }
    if (out.isEmpty() && dir == root) {
      throw new StoreReadError(local + ": no commitlog directory and no segment files");
    }
    directory = dir.getPath();
    return out;
  }

  private List<Segment> hadoopSegments() throws IOException {
    Path root = new Path(uri);
    FileSystem fs = root.getFileSystem(conf.value());
    Path nested = new Path(root, "commitlog");
    Path dir;
    try {
      if (fs.getFileStatus(nested).isDirectory()) {
        dir = nested;
      } else {
        dir = root;
      }
    } catch (FileNotFoundException e) {
      dir = root;
    }
    FileStatus[] listed;
    try {
      listed = fs.listStatus(dir);
    } catch (FileNotFoundException e) {
      throw new StoreReadError(uri + ": no such directory");
    }
    List<Segment> out = new ArrayList<>();
    for (FileStatus status : listed) {
      String name = status.getPath().getName();
      if (!SEGMENT_NAME.matcher(name).matches()) {
        continue;
      }
      if (!status.isFile()) {
        throw new StoreReadError(
            status.getPath() + ": " + (status.isDirectory() ? "a directory" : "not a regular file")
                + ", not a segment file");
      }
      out.add(new Segment(Long.parseLong(name), status.getLen(), name, status.getPath().toString()));
    }
    if (out.isEmpty() && dir == root) {
      throw new StoreReadError(uri + ": no commitlog directory and no segment files");
    }
    directory = dir.toString();
    return out;
  }

  @Override
  public SegmentInput open(Segment segment) throws IOException {
    if (local != null) {
      try {
        return new LocalInput(FileChannel.open(Paths.get(segment.location), StandardOpenOption.READ),
            segment.location);
      } catch (IOException e) {
        // Not chained: the job's error line is the last cause's (jobs.error_line).
        throw new StoreReadError(SpanDecoder.unreadable(segment.location, e));
      }
    }
    try {
      Path path = new Path(segment.location);
      FileSystem fs = path.getFileSystem(conf.value());
      long size = fs.getFileStatus(path).getLen();
      return new RemoteInput(fs.open(path), size, segment.location);
    } catch (IOException e) {
      throw new StoreReadError(SpanDecoder.unreadable(segment.location, e));
    }
  }

  /** A local file, memory-mapped. */
  static final class LocalInput implements SegmentInput {
    private final FileChannel channel;
    private final String location;
    private final long size;

    LocalInput(FileChannel channel, String location) throws IOException {
      this.channel = channel;
      this.location = location;
      try {
        this.size = channel.size();
      } catch (IOException e) {
        channel.close();
        throw e;
      }
    }

    @Override
    public long size() {
      return size;
    }

    @Override
    public ByteBuffer read(long at, int length) throws IOException {
      long n = Math.max(0, Math.min(length, size - at));
      try {
        return channel.map(FileChannel.MapMode.READ_ONLY, at, n); // (valid after close)
      } catch (IOException e) {
        throw new StoreReadError(SpanDecoder.unreadable(location, e));
      }
    }

    @Override
    public int window() {
      return SpanDecoder.WINDOW;
    }

    @Override
    public void close() throws IOException {
      channel.close();
    }
  }

  /** A file of a Hadoop FileSystem, read into the heap. */
  static final class RemoteInput implements SegmentInput {
    private final FSDataInputStream in;
    private final long size;
    private final String location;

    RemoteInput(FSDataInputStream in, long size, String location) {
      this.in = in;
      this.size = size;
      this.location = location;
    }

    @Override
    public long size() {
      return size;
    }

    @Override
    public ByteBuffer read(long at, int length) throws IOException {
      int n = (int) Math.max(0, Math.min(length, size - at));
      byte[] b = new byte[n];
      try {
        in.readFully(at, b, 0, n);
      } catch (IOException e) {
        throw new StoreReadError(SpanDecoder.unreadable(location, e));
      }
      return ByteBuffer.wrap(b);
    }

    @Override
    public int window() {
      return REMOTE_WINDOW;
    }

    @Override
    public void close() throws IOException {
      in.close();
    }
  }
}
