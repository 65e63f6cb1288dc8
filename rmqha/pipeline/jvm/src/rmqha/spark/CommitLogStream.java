package rmqha.spark;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadAllAvailable;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxBytes;
import org.apache.spark.sql.connector.read.streaming.SupportsAdmissionControl;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;
import org.apache.spark.sql.types.StructType;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * {@code spark.readStream.format("rmqha").load(STORE)}: a micro-batch
 * stream whose offsets are commit-log offsets, each a record start (JSON
 * {@code {"offset": N}}).  A batch [start, end) is planned exactly
 * ({@link #spans}) and decoded by the batch reader's tasks.  The latest
 * offset is where the store's whole, valid records end now: for a
 * filesystem store found by walking the headers from where the last walk
 * ended ({@link RecordWalk}); for a live broker its max offset
 * ({@link StoreEnd}).  A torn tail is waited for; damage fails the query.
 * docs/pipeline.md, "Streaming".
 */
final class CommitLogStream
    implements MicroBatchStream, SupportsAdmissionControl, SupportsTriggerAvailableNow {
  private static final Logger LOG = LoggerFactory.getLogger(CommitLogStream.class);

  /** The stream's options, checked (each error one line naming it). */
  static final class StreamOptions {
    /** -1: earliest; -2: latest; else the offset given. */
    final long starting;
    final long maxBytes; // 0: no limit
    final boolean failOnDataLoss;

    StreamOptions(Map<String, String> o) {
      if (o.containsKey("startoffset") || o.containsKey("endoffset")) {
        throw new IllegalArgumentException(
            "options startOffset/endOffset are for batch reads; a stream takes startingOffsets"
                + " (earliest, latest or an offset)");
      }
      String s = o.getOrDefault("startingoffsets", "earliest").trim().toLowerCase(Locale.ROOT);
      if (s.equals("earliest")) {
        starting = -1;
      } else if (s.equals("latest")) {
        starting = -2;
      } else if (s.matches("[0-9]{1,18}")) {
        starting = Long.parseLong(s);
      } else {
        throw new IllegalArgumentException(
            "option startingOffsets='" + o.get("startingoffsets")
                + "' is not earliest, latest or an offset");
      }
      String m = o.get("maxbytespertrigger");
      maxBytes = m == null ? 0 : CommitLogSource.Options.size("maxBytesPerTrigger", m);
      if (m != null && maxBytes <= 0) {
        throw new IllegalArgumentException(
            "option maxBytesPerTrigger='" + m + "' must be positive");
      }
      String f = o.getOrDefault("failondataloss", "true").trim().toLowerCase(Locale.ROOT);
      if (!f.equals("true") && !f.equals("false")) {
        throw new IllegalArgumentException(
            "option failOnDataLoss='" + o.get("failondataloss") + "' is not true or false");
      }
      failOnDataLoss = f.equals("true");
    }
  }

  /** A commit-log offset: a record start (or a segment's base). */
  static final class LogOffset extends Offset {
    final long offset;

    LogOffset(long offset) {
      this.offset = offset;
    }

    @Override
    public String json() {
      return "{\"offset\":" + offset + "}";
    }
  }

  private static final Pattern JSON = Pattern.compile("\\s*\\{\\s*\"offset\"\\s*:\\s*([0-9]{1,18})\\s*}\\s*");

  private final CommitLogSource.Options options;
  private final StreamOptions stream;
  private final SegmentStore store;
  private final StructType required;
  private final String checkpoint;
  /** Where the last walk found the valid records to end (-1: none yet). */
  private long tail = -1;
  /** The torn record the last walk stopped at. */
  private final RecordWalk.Torn torn = new RecordWalk.Torn();
  /** Trigger.AvailableNow's end, fixed when it starts (-1: none). */
  private long availableNow = -1;

  CommitLogStream(CommitLogSource.Options options, Map<String, String> given, SegmentStore store,
      StructType required, String checkpoint) {
    this.options = options;
    this.stream = new StreamOptions(given);
    this.store = store;
    this.required = required;
    this.checkpoint = checkpoint;
  }

  private static UncheckedIOException unchecked(IOException e) {
    return new UncheckedIOException(e.getMessage(), e);
  }

  /** The store's segments (an empty list: none yet). */
  private List<Segment> segments() throws IOException {
    return store.segments();
  }

  /** Where whole, valid records end now. */
  private synchronized long recordsEnd(List<Segment> segments, long from) throws IOException {
    if (store instanceof StoreEnd) {
      return ((StoreEnd) store).recordsEnd();
    }
    if (segments.isEmpty()) {
      return Math.max(tail, from);
    }
    long first = segments.get(0).base;
    long walkFrom = Math.max(Math.max(tail, from), first);
    tail = RecordWalk.end(store, segments, walkFrom, Long.MAX_VALUE, torn);
    return tail;
  }

  /** The file in the checkpoint holding the stream's first offset. */
  static final String INITIAL = "initial.json";

  /**
   * The first offset: chosen once (startingOffsets) and kept in the
   * checkpoint, so that a query stopped before its first batch was
   * committed starts again from the same record (as Kafka's source does).
   */
  @Override
  public synchronized Offset initialOffset() {
    org.apache.hadoop.fs.Path file = new org.apache.hadoop.fs.Path(checkpoint, INITIAL);
    try {
      org.apache.spark.sql.SparkSession spark = org.apache.spark.sql.SparkSession.active();
      org.apache.hadoop.fs.FileSystem fs =
          file.getFileSystem(spark.sessionState().newHadoopConf());
      if (fs.exists(file)) {
        try (java.io.InputStream in = fs.open(file)) {
          return deserializeOffset(new String(in.readAllBytes(), java.nio.charset.StandardCharsets.UTF_8));
        }
      }
      LogOffset chosen = chooseInitial();
      fs.mkdirs(file.getParent());
      try (java.io.OutputStream out = fs.create(file, false)) {
        out.write(chosen.json().getBytes(java.nio.charset.StandardCharsets.UTF_8));
      }
      return chosen;
    } catch (IOException e) {
      throw new UncheckedIOException(file + ": " + e.getMessage(), e);
    }
  }

  private LogOffset chooseInitial() {
    try {
      List<Segment> segments = segments();
      long first = segments.isEmpty() ? 0 : segments.get(0).base;
      if (stream.starting == -1) {
        return new LogOffset(first);
      }
      long end = recordsEnd(segments, first);
      if (stream.starting == -2) {
        return new LogOffset(end);
      }
      long n = stream.starting;
      if (n < first) {
        if (stream.failOnDataLoss) {
          throw new IllegalStateException(
              store.location() + ": startingOffsets " + n + " is before the commit log's first"
                  + " offset " + first + " (deleted); give failOnDataLoss=false to start there");
        }
        LOG.warn("{}: startingOffsets {} is before the commit log's first offset {}: starting there",
            store.location(), n, first);
        return new LogOffset(first);
      }
      if (n >= end) {
        if (n > end) {
          throw new IllegalStateException(
              store.location() + ": startingOffsets " + n + " is past the end of the commit log's"
                  + " records (" + end + ")");
        }
        return new LogOffset(end);
      }
      return new LogOffset(nextRecordStart(segments, n, end));
    } catch (IOException e) {
      throw unchecked(e);
    }
  }

  /** The first record start at or after n (before end, where records end). */
  private long nextRecordStart(List<Segment> segments, long n, long end) throws IOException {
    for (int i = 0; i < segments.size(); i++) {
      Segment s = segments.get(i);
      if (n >= s.base + s.size) {
        continue;
      }
      if (n <= s.base) {
        return s.base;
      }
      try (SegmentInput in = store.open(s)) {
        long limit = Math.min(in.size(), end - s.base);
        long found = Planner.findRecordStart(in, s.base, n - s.base, limit);
        if (found >= 0) {
          return s.base + found;
        }
      }
      return Math.min(end, i + 1 < segments.size() ? segments.get(i + 1).base : end);
    }
    return end;
  }

  @Override
  public Offset deserializeOffset(String json) {
    Matcher m = JSON.matcher(json);
    if (!m.matches()) {
      throw new IllegalArgumentException(
          "rmqha stream offset " + json + " is not {\"offset\": N} (a checkpoint of another source?)");
    }
    return new LogOffset(Long.parseLong(m.group(1)));
  }

  @Override
  public Offset latestOffset() {
    throw new UnsupportedOperationException("latestOffset(start, limit) is the one called");
  }

  @Override
  public ReadLimit getDefaultReadLimit() {
    return stream.maxBytes > 0 ? ReadLimit.maxBytes(stream.maxBytes) : ReadLimit.allAvailable();
  }

  @Override
  public void prepareForTriggerAvailableNow() {
    try {
      List<Segment> segments = segments();
      availableNow = recordsEnd(segments, segments.isEmpty() ? 0 : segments.get(0).base);
    } catch (IOException e) {
      throw unchecked(e);
    }
  }

  @Override
  public Offset latestOffset(Offset startOffset, ReadLimit limit) {
    long start = ((LogOffset) startOffset).offset;
    try {
      List<Segment> segments = segments();
      long end;
      if (availableNow >= 0) {
        end = availableNow;
      } else {
        end = recordsEnd(segments, start);
      }
      if (end <= start) {
        return startOffset;
      }
      long maxBytes = 0;
      if (limit instanceof ReadMaxBytes) {
        maxBytes = ((ReadMaxBytes) limit).maxBytes();
      } else if (!(limit instanceof ReadAllAvailable)) {
        maxBytes = stream.maxBytes;
      }
      if (maxBytes > 0 && end - start > maxBytes && !segments.isEmpty()) {
        long from = Math.max(start, segments.get(0).base);
        end = Math.min(end, RecordWalk.end(store, segments, from, maxBytes, null));
      }
      return new LogOffset(end);
    } catch (IOException e) {
      throw unchecked(e);
    }
  }

  @Override
  public Offset reportLatestOffset() {
    return tail < 0 ? null : new LogOffset(tail);
  }

  @Override
  public InputPartition[] planInputPartitions(Offset startOffset, Offset endOffset) {
    long start = ((LogOffset) startOffset).offset;
    long end = ((LogOffset) endOffset).offset;
    try {
      List<Segment> segments = segments();
      long first = segments.isEmpty() ? end : segments.get(0).base;
      if (start < first) {
        String lost = store.location() + ": offsets " + start + ".." + Math.min(first, end)
            + " were deleted before this stream read them (the commit log now begins at offset "
            + first + ")";
        if (stream.failOnDataLoss) {
          throw new IllegalStateException(
              lost + ": data lost; give the option failOnDataLoss=false to skip to " + first);
        }
        LOG.warn("{}: data lost, skipped (failOnDataLoss=false)", lost);
        start = first;
      }
      List<InputPartition> out = new ArrayList<>();
      if (end > start) {
        for (List<Planner.Span> group : Planner.pack(spans(store, segments, options.splitBytes, start, end),
            options.splitBytes)) {
          out.add(new CommitLogSource.SpanGroup(group.toArray(new Planner.Span[0])));
        }
      }
      return out.toArray(new InputPartition[0]);
    } catch (IOException e) {
      throw unchecked(e);
    }
  }

  /**
   * The spans of [start, end), both record starts (or segment bases): each
   * segment's part of it, cut about every split bytes at record starts
   * ({@link Planner#findRecordStart}).  A span ending inside its segment
   * ends on a record boundary (exact); one ending at the segment's end
   * reads to the records' end there, as the batch reader does.
   */
  static List<Planner.Span> spans(SegmentStore store, List<Segment> segments, long split,
      long start, long end) throws IOException {
    List<Planner.Span> spans = new ArrayList<>();
    for (Segment segment : segments) {
      long base = segment.base;
      if (base >= end) {
        break;
      }
      if (base + segment.size <= start) {
        continue;
      }
      long first = Math.max(start, base) - base;
      long last = Math.min(end, base + segment.size) - base;
      if (last <= first) {
        continue;
      }
      List<Long> cuts = new ArrayList<>();
      cuts.add(first);
      if (last - first > split) {
        try (SegmentInput in = store.open(segment)) {
          long nominal = (first / split + 1) * split;
          while (nominal < last) {
            long found = Planner.findRecordStart(in, base, nominal, last);
            if (found < 0 || found >= last) {
              break;
            }
            cuts.add(found);
            nominal = (found / split + 1) * split;
          }
        }
      }
      for (int i = 0; i < cuts.size(); i++) {
        long a = cuts.get(i);
        long b = i + 1 < cuts.size() ? cuts.get(i + 1) : last;
        if (b > a) {
          spans.add(new Planner.Span(segment, a, b, b < segment.size));
        }
      }
    }
    return spans;
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    return new CommitLogSource.SpanReaderFactory(
        new CommitLogSource.ReadOptions(store, options.bodies, options.topics,
            required.fieldNames(), options.window, null),
        required);
  }

  @Override
  public void commit(Offset end) {}

  @Override
  public void stop() {}

  @Override
  public String toString() {
    return "rmqha stream " + store.location();
  }
}
