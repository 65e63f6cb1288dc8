package rmqha.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.EnumSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * A DataSource V2 reader of commit-log spans planned in Python
 * (rmqha.pipeline.scan.plan, grouped by rmqha.pipeline.source.pack): the
 * option "spans" holds them as JSON, one InputPartition per group.  The
 * records are decoded here, in the executor JVM, by {@link SpanDecoder}.
 *
 * <p>Used through rmqha.pipeline.source.read_store, which plans the spans;
 * not meant to be given options by hand.
 */
public final class CommitLogSpans implements TableProvider {
  /** The rows' schema: rmqha.pipeline.scan.SCHEMA_DDL. */
  public static final String SCHEMA_DDL =
      "offset long, size int, topic string, queue_id int, queue_offset long, "
          + "flag int, sysflag int, born_timestamp long, store_timestamp long, "
          + "born_host string, store_host string, reconsume_times int, "
          + "prepared_tx_offset long, properties map<string,string>, tags string, "
          + "keys string, body binary, body_size int, crc_ok boolean";

  static final StructType SCHEMA = StructType.fromDDL(SCHEMA_DDL);

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return SCHEMA;
  }

  @Override
  public Table getTable(
      StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return new SpanTable(properties.get("spans"));
  }

  /** One span of one segment file, as planned in Python. */
  static final class Span implements Serializable {
    private static final long serialVersionUID = 1L;
    final String path;
    final long base;
    final long start;
    final long end;
    final boolean exact;

    Span(String path, long base, long start, long end, boolean exact) {
      this.path = path;
      this.base = base;
      this.start = start;
      this.end = end;
      this.exact = exact;
    }
  }

  /** Consecutive spans read by one task. */
  static final class SpanGroup implements InputPartition {
    private static final long serialVersionUID = 1L;
    final Span[] spans;

    SpanGroup(Span[] spans) {
      this.spans = spans;
    }
  }

  /** What every task needs besides its spans. */
  static final class ReadOptions implements Serializable {
    private static final long serialVersionUID = 1L;
    final boolean bodies;
    final String[] topics; // null: every topic
    final String[] columns;
    final int window; // the largest mapping of a span, in bytes

    ReadOptions(boolean bodies, String[] topics, String[] columns, int window) {
      this.bodies = bodies;
      this.topics = topics;
      this.columns = columns;
      this.window = window;
    }
  }

  static final class SpanTable implements Table, SupportsRead {
    private final String spans;

    SpanTable(String spans) {
      if (spans == null) {
        throw new IllegalArgumentException(
            "option spans is missing: read through rmqha.pipeline.source.read_store");
      }
      this.spans = spans;
    }

    @Override
    public String name() {
      return "rocketmq-commitlog spans";
    }

    @Override
    @SuppressWarnings("deprecation") // columns() calls it
    public StructType schema() {
      return SCHEMA;
    }

    @Override
    public Set<TableCapability> capabilities() {
      return EnumSet.of(TableCapability.BATCH_READ);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
      return new SpanScanBuilder(spans);
    }
  }

  static final class SpanScanBuilder implements ScanBuilder, SupportsPushDownRequiredColumns {
    private final String spans;
    private StructType required = SCHEMA;

    SpanScanBuilder(String spans) {
      this.spans = spans;
    }

    @Override
    public void pruneColumns(StructType requiredSchema) {
      required = requiredSchema;
    }

    @Override
    public Scan build() {
      return new SpanScan(spans, required);
    }
  }

  static final class SpanScan implements Scan, Batch {
    private final StructType required;
    private final SpanGroup[] groups;
    private final ReadOptions options;

    SpanScan(String json, StructType required) {
      this.required = required;
      JsonNode root;
      try {
        root = new ObjectMapper().readTree(json);
      } catch (IOException e) {
        throw new IllegalArgumentException("option spans is not JSON: " + e.getMessage(), e);
      }
      List<SpanGroup> parsed = new ArrayList<>();
      for (JsonNode group : root.get("partitions")) {
        Span[] spans = new Span[group.size()];
        for (int i = 0; i < spans.length; i++) {
          JsonNode s = group.get(i);
          spans[i] =
              new Span(
                  s.get("path").asText(),
                  s.get("base").asLong(),
                  s.get("start").asLong(),
                  s.get("end").asLong(),
                  s.get("exact").asBoolean());
        }
        parsed.add(new SpanGroup(spans));
      }
      groups = parsed.toArray(new SpanGroup[0]);
      String[] topics = null;
      JsonNode t = root.get("topics");
      if (t != null && !t.isNull()) {
        topics = new String[t.size()];
        for (int i = 0; i < topics.length; i++) {
          topics[i] = t.get(i).asText();
        }
      }
      // "window": the tests' way to map a span in several windows (records
      // across their edges) without a span of more than 1 GiB.
      JsonNode w = root.get("window");
      int window = w == null ? SpanDecoder.WINDOW : w.asInt();
      if (window <= 0) {
        throw new IllegalArgumentException("option spans: window " + w + " is not positive");
      }
      options =
          new ReadOptions(root.get("bodies").asBoolean(), topics, required.fieldNames(), window);
    }

    @Override
    public StructType readSchema() {
      return required;
    }

    @Override
    public Batch toBatch() {
      return this;
    }

    @Override
    public InputPartition[] planInputPartitions() {
      return groups.clone();
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
      return new SpanReaderFactory(options, required);
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

  /** Spark instantiates providers by reflection. */
  public CommitLogSpans() {}
}
