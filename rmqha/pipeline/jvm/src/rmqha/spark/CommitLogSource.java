package rmqha.spark;

import java.io.IOException;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.EnumSet;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.hadoop.conf.Configuration;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.expressions.filter.Predicate;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.connector.read.SupportsPushDownV2Filters;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * The {@code rmqha} data source: {@code spark.read.format("rmqha").load(STORE)}
 * from any session whose classpath has this jar, and {@code CREATE TABLE t
 * USING rmqha LOCATION 'STORE'} in SQL.  The driver plans (the store's
 * segments listed, cut at record boundaries about every splitBytes, small
 * ones packed: {@link Planner}); each task decodes its spans in the
 * executor's JVM ({@link SpanDecoder}).  Columns are pruned, and filters on
 * topic, queue_id, store_timestamp and offset are pushed down: spans
 * pruned while planning, records skipped while decoding
 * (docs/pipeline.md, "The data source").
 */
public final class CommitLogSource implements TableProvider, DataSourceRegister {
  /** The rows' schema (rmqha.pipeline.scan.SCHEMA_DDL). */
  public static final String SCHEMA_DDL =
      "offset long, size int, topic string, queue_id int, queue_offset long, "
          + "flag int, sysflag int, born_timestamp timestamp, store_timestamp timestamp, "
          + "born_host string, store_host string, reconsume_times int, "
          + "prepared_tx_offset long, properties map<string,string>, tags string, "
          + "keys string, body binary, body_size int, crc_ok boolean";

  static final StructType SCHEMA = StructType.fromDDL(SCHEMA_DDL);

  /** The name given to spark.read.format and to USING. */
  public static final String SHORT_NAME = "rmqha";

  /** Spark instantiates providers by reflection. */
  public CommitLogSource() {}

  @Override
  public String shortName() {
    return SHORT_NAME;
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return SCHEMA;
  }

  @Override
  public Table getTable(
      StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return new CommitLogTable(Options.parse(properties));
  }

  // -- options ---------------------------------------------------------------

  /** The options, parsed and checked (each error one line naming it). */
  static final class Options implements Serializable {
    private static final long serialVersionUID = 1L;
    static final long DEFAULT_SPLIT_BYTES = 128L << 20;
    static final long DEFAULT_TIME_TOLERANCE_MS = 60 * 60 * 1000L;

    final String path;
    final boolean bodies;
    final String[] topics; // null: every topic
    final long startOffset; // -1: none
    final long endOffset; // -1: none
    final long splitBytes;
    final long timeToleranceMs; // -1: no pruning of spans by store time
    final int window; // 0: the input's own (the tests' "_window")
    final boolean viaHadoop; // the tests' "_viaHadoop": local files read as a remote store's
    final Map<String, String> hadoop; // fs.* options, for the Hadoop FileSystem
    final Map<String, String> given; // every option, keys lower-cased (the stream's, a live broker's)

    private Options(Map<String, String> o) {
      given = new HashMap<>(o);
      String p = o.get("path");
      if (o.containsKey("paths") && !o.get("paths").equals("[]")) {
        throw new IllegalArgumentException(
            "give one store: .load(STORE_DIR or URI), not " + o.get("paths"));
      }
      if (p == null || p.isEmpty()) {
        throw new IllegalArgumentException("give the store: .load(STORE_DIR or URI)");
      }
      path = p;
      String b = o.getOrDefault("bodies", "true").trim().toLowerCase(Locale.ROOT);
      if (!b.equals("true") && !b.equals("false")) {
        throw new IllegalArgumentException(
            "option bodies='" + o.get("bodies") + "' is not true or false");
      }
      bodies = b.equals("true");
      String t = o.get("topics");
      if (t == null) {
        topics = null;
      } else {
        List<String> names = new ArrayList<>();
        for (String name : t.split(",")) {
          if (!name.trim().isEmpty()) {
            names.add(name.trim());
          }
        }
        if (names.isEmpty()) {
          throw new IllegalArgumentException("option topics='" + t + "' names no topic");
        }
        topics = names.toArray(new String[0]);
      }
      splitBytes = o.containsKey("splitbytes") ? size("splitBytes", o.get("splitbytes")) : DEFAULT_SPLIT_BYTES;
      if (splitBytes <= 0) {
        throw new IllegalArgumentException(
            "option splitBytes='" + o.get("splitbytes") + "' must be positive");
      }
      startOffset = offset("startOffset", o.get("startoffset"));
      endOffset = offset("endOffset", o.get("endoffset"));
      if (startOffset >= 0 && endOffset >= 0 && endOffset < startOffset) {
        throw new IllegalArgumentException(
            "option endOffset " + endOffset + " is before startOffset " + startOffset);
      }
      timeToleranceMs = duration("timeTolerance", o.get("timetolerance"));
      String w = o.get("_window");
      int win = 0;
      if (w != null) {
        long v = size("_window", w);
        if (v <= 0 || v > SpanDecoder.WINDOW) {
          throw new IllegalArgumentException("option _window='" + w + "' is not 1..1g");
        }
        win = (int) v;
      }
      window = win;
      viaHadoop = o.getOrDefault("_viahadoop", "false").equalsIgnoreCase("true");
      hadoop = new HashMap<>();
      for (Map.Entry<String, String> e : o.entrySet()) {
        if (e.getKey().startsWith("fs.")) {
          hadoop.put(e.getKey(), e.getValue());
        }
      }
    }

    static Options parse(Map<String, String> given) {
      Map<String, String> lowered = new HashMap<>();
      for (Map.Entry<String, String> e : given.entrySet()) {
        String key = e.getKey().toLowerCase(Locale.ROOT);
        // (Hadoop's fs.* settings keep their case.)
        lowered.put(key.startsWith("fs.") ? e.getKey() : key, e.getValue());
      }
      return new Options(lowered);
    }

    private static final Pattern SIZE =
        Pattern.compile("\\s*([0-9]+)\\s*([kmgtKMGT]?)([iI]?[bB])?\\s*");

    /** rmqha._units.parse_size: 4096, 64k, 128m, 1g, 1GiB. */
    static long size(String name, String text) {
      Matcher m = SIZE.matcher(text);
      if (!m.matches()) {
        throw new IllegalArgumentException(
            "option " + name + " '" + text + "' is not a size (examples: 4096, 64k, 1g, 1GiB)");
      }
      int shift = "kmgt".indexOf(m.group(2).toLowerCase(Locale.ROOT)) * 10 + 10;
      try {
        long v = Long.parseLong(m.group(1));
        return m.group(2).isEmpty() ? v : Math.multiplyExact(v, 1L << shift);
      } catch (ArithmeticException | NumberFormatException e) {
        throw new IllegalArgumentException("option " + name + " '" + text + "' is too large");
      }
    }

    private static long offset(String name, String text) {
      if (text == null) {
        return -1;
      }
      String s = text.trim();
      if (!s.matches("[0-9]+")) {
        throw new IllegalArgumentException(
            "option " + name + "='" + text + "' is not a non-negative offset");
      }
      try {
        return Long.parseLong(s);
      } catch (NumberFormatException e) {
        throw new IllegalArgumentException("option " + name + "='" + text + "' is too large");
      }
    }

    private static final Pattern DURATION =
        Pattern.compile("\\s*([0-9]+)\\s*(ms|s|m|h|d)?\\s*", Pattern.CASE_INSENSITIVE);

    /** 300000 (ms), 500ms, 30s, 5m, 1h, 1d; off: -1. */
    static long duration(String name, String text) {
      if (text == null) {
        return DEFAULT_TIME_TOLERANCE_MS;
      }
      if (text.trim().equalsIgnoreCase("off")) {
        return -1;
      }
      Matcher m = DURATION.matcher(text);
      if (!m.matches()) {
        throw new IllegalArgumentException(
            "option " + name + " '" + text + "' is not a duration (examples: 500ms, 30s, 5m, 1h, off)");
      }
      String unit = m.group(2) == null ? "ms" : m.group(2).toLowerCase(Locale.ROOT);
      long factor =
          unit.equals("ms") ? 1 : unit.equals("s") ? 1000 : unit.equals("m") ? 60_000
              : unit.equals("h") ? 3_600_000 : 86_400_000;
      try {
        return Math.multiplyExact(Long.parseLong(m.group(1)), factor);
      } catch (ArithmeticException | NumberFormatException e) {
        throw new IllegalArgumentException("option " + name + " '" + text + "' is too large");
      }
    }

    SegmentStore store() {
      Configuration conf;
      SparkSession active = SparkSession.getActiveSession().isDefined()
          ? SparkSession.getActiveSession().get() : SparkSession.getDefaultSession().getOrElse(null);
      conf = active == null ? new Configuration() : new Configuration(active.sparkContext().hadoopConfiguration());
      for (Map.Entry<String, String> e : hadoop.entrySet()) {
        conf.set(e.getKey(), e.getValue());
      }
      if (HttpStore.handles(path)) {
        return HttpStore.of(path, given);
      }
      return HadoopStore.of(path, conf, viaHadoop);
    }
  }

  /** What every task needs besides its spans. */
  static final class ReadOptions implements Serializable {
    private static final long serialVersionUID = 1L;
    final SegmentStore store;
    final boolean bodies;
    final String[] topics; // null: every topic
    final String[] columns;
    final int window; // 0: the input's own
    final RecordFilter filter; // null: none

    ReadOptions(SegmentStore store, boolean bodies, String[] topics, String[] columns, int window,
        RecordFilter filter) {
      this.store = store;
      this.bodies = bodies;
      this.topics = topics;
      this.columns = columns;
      this.window = window;
      this.filter = filter;
    }
  }

  // -- the table, the scan ---------------------------------------------------

  static final class CommitLogTable implements Table, SupportsRead {
    private final Options options;
    private final SegmentStore store;

    CommitLogTable(Options options) {
      this.options = options;
      this.store = options.store();
    }

    @Override
    public String name() {
      return "rmqha " + store.location();
    }

    @Override
    @SuppressWarnings("deprecation") // columns() calls it
    public StructType schema() {
      return SCHEMA;
    }

    @Override
    public Set<TableCapability> capabilities() {
      return EnumSet.of(TableCapability.BATCH_READ, TableCapability.MICRO_BATCH_READ);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap ignored) {
      return new CommitLogScanBuilder(options, store);
    }
  }

  static final class CommitLogScanBuilder
      implements ScanBuilder, SupportsPushDownRequiredColumns, SupportsPushDownV2Filters {
    private final Options options;
    private final SegmentStore store;
    private StructType required = SCHEMA;
    private final RecordFilter filter = new RecordFilter();
    private final List<Predicate> pushed = new ArrayList<>();

    CommitLogScanBuilder(Options options, SegmentStore store) {
      this.options = options;
      this.store = store;
    }

    @Override
    public void pruneColumns(StructType requiredSchema) {
      required = requiredSchema;
    }

    @Override
    public Predicate[] pushPredicates(Predicate[] predicates) {
      for (Predicate p : predicates) {
        if (Pushdown.apply(p, filter)) {
          pushed.add(p);
        }
      }
      // Every one is checked again by Spark after the scan: the reader's
      // skipping is exact, but costs Spark little to prove.
      return predicates;
    }

    @Override
    public Predicate[] pushedPredicates() {
      return pushed.toArray(new Predicate[0]);
    }

    @Override
    public Scan build() {
      return new CommitLogScan(options, store, required,
          filter.any() ? filter : null, pushedPredicates());
    }
  }

  static final class CommitLogScan implements Scan, Batch {
    private final Options options;
    private final SegmentStore store;
    private final StructType required;
    private final RecordFilter filter;
    private final Predicate[] pushed;
    private InputPartition[] partitions;
    private String pruning = "";

    CommitLogScan(Options options, SegmentStore store, StructType required, RecordFilter filter,
        Predicate[] pushed) {
      this.options = options;
      this.store = store;
      this.required = required;
      this.filter = filter;
      this.pushed = pushed;
    }

    @Override
    public StructType readSchema() {
      return required;
    }

    @Override
    public String description() {
      StringBuilder s = new StringBuilder("rmqha commit log ").append(store.location());
      List<String> named = new ArrayList<>();
      if (options.startOffset >= 0) named.add("startOffset=" + options.startOffset);
      if (options.endOffset >= 0) named.add("endOffset=" + options.endOffset);
      if (options.topics != null) named.add("topics=" + String.join(",", options.topics));
      if (!options.bodies) named.add("bodies=false");
      if (!named.isEmpty()) s.append(" ").append(named);
      List<String> p = new ArrayList<>();
      for (Predicate predicate : pushed) {
        p.add(predicate.toString());
      }
      s.append(", PushedFilters: ").append(p);
      s.append(pruning);
      return s.toString();
    }

    @Override
    public Batch toBatch() {
      return this;
    }

    @Override
    public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
      return new CommitLogStream(options, options.given, store, required, checkpointLocation);
    }

    @Override
    public synchronized InputPartition[] planInputPartitions() {
      if (partitions == null) {
        List<Planner.Span> spans;
        try {
          long start = options.startOffset;
          long end = options.endOffset;
          String planned = "";
          if (filter != null) {
            // Offset filters narrow the plan itself: only the bytes of
            // [start, end) are planned and read (the rule of the options).
            long[] range = Pushdown.offsets(filter.offset);
            if (range[0] > Math.max(start, 0)) {
              start = range[0];
            }
            if (range[1] >= 0 && (end < 0 || range[1] < end)) {
              end = range[1];
            }
            if (start >= 0 && end >= 0 && end < start) {
              end = start; // nothing
            }
            if (start != options.startOffset || end != options.endOffset) {
              planned = ", offsets planned: [" + Math.max(start, 0) + ", "
                  + (end < 0 ? "end" : String.valueOf(end)) + ")";
            }
          }
          spans = Planner.plan(store, options.splitBytes, start, end);
          pruning = planned;
          if (filter != null) {
            Pushdown.Pruned pruned = Pushdown.prune(store, spans, filter, options.timeToleranceMs);
            pruning = planned + pruned.note;
            spans = pruned.spans;
          }
        } catch (IOException e) {
          throw new UncheckedIOException(e.getMessage(), e);
        }
        List<InputPartition> out = new ArrayList<>();
        for (List<Planner.Span> group : Planner.pack(spans, options.splitBytes)) {
          out.add(new SpanGroup(group.toArray(new Planner.Span[0])));
        }
        partitions = out.toArray(new InputPartition[0]);
      }
      return partitions.clone();
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
      return new SpanReaderFactory(
          new ReadOptions(store, options.bodies, options.topics, required.fieldNames(),
              options.window, filter),
          required);
    }
  }

  /** Consecutive spans read by one task. */
  static final class SpanGroup implements InputPartition {
    private static final long serialVersionUID = 1L;
    final Planner.Span[] spans;

    SpanGroup(Planner.Span[] spans) {
      this.spans = spans;
    }
  }

  static final class SpanReaderFactory implements PartitionReaderFactory {
    private static final long serialVersionUID = 1L;
    private final ReadOptions options;
    private final StructType required;

    SpanReaderFactory(ReadOptions options, StructType required) {
      this.options = options;
      this.required = required;
    }

    @Override
    public boolean supportColumnarReads(InputPartition partition) {
      return true;
    }

    @Override
    public PartitionReader<InternalRow> createReader(InputPartition partition) {
      throw new UnsupportedOperationException("columnar reads only");
    }

    @Override
    public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
      return new SpanDecoder(((SpanGroup) partition).spans, options, required);
    }
  }
}
