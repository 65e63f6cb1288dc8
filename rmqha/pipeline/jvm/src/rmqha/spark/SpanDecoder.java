package rmqha.spark;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.List;
import java.util.zip.CRC32;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * The records of a task's spans as columnar batches: a transcription of
 * rmqha.pipeline.scan.read_span's record loop and of the record decoder it
 * calls (rmqha.store._record.parse_record with strict=True,
 * report_crc=True; record_topic for the topic filter; decode_properties;
 * format_host), producing the same rows, values and nulls.
 *
 * <p>Where the records of a span stop: a BLANK filler, zero bytes, a torn
 * or damaged record.  A span whose end is the next span's first record
 * (exact) must end with a whole record: one that runs past it is an error
 * (the cut was not a record start), as in Python.
 *
 * <p>A span is read in windows ({@link SegmentInput#window()}): a local
 * file's are memory mappings of at most {@link #WINDOW} bytes, whose page
 * cache bytes are decoded where they are; another filesystem's are read
 * into the heap ({@link HadoopStore#REMOTE_WINDOW} bytes, or one record
 * when longer).  A body is copied once, when Spark asks for it ({@link
 * BodyVector}).  The task's heap holds one batch of columns and, for a
 * filesystem that is not local, one window (and, only while judging a bad
 * record, the rest of its span).
 */
final class SpanDecoder implements PartitionReader<ColumnarBatch> {
  static final int MAGIC_V1 = -626843481;
  static final int MAGIC_V2 = -626843477;
  static final int BLANK_MAGIC = -875286124;
  /** The smallest record (rmqha.store._record._MIN_FIXED). */
  static final int MIN_FIXED = 91;
  /** Where PHYSICALOFFSET lies in a record (rmqha.store._record.PHYSICALOFFSET_AT). */
  static final int PHYSICALOFFSET_AT = 28;

  static final int BORNHOST_V6 = 0x10;
  static final int STOREHOST_V6 = 0x20;

  /** The largest mapping: a span larger than this is mapped in windows. */
  static final int WINDOW = 1 << 30;

  private final int window;
  private long needed; // the bytes a record needs mapped, when NewWindow is thrown
  static final int BATCH_ROWS = 4096;

  // The columns, in SCHEMA_DDL's order.
  static final int OFFSET = 0;
  static final int SIZE = 1;
  static final int TOPIC = 2;
  static final int QUEUE_ID = 3;
  static final int QUEUE_OFFSET = 4;
  static final int FLAG = 5;
  static final int SYSFLAG = 6;
  static final int BORN_TIMESTAMP = 7;
  static final int STORE_TIMESTAMP = 8;
  static final int BORN_HOST = 9;
  static final int STORE_HOST = 10;
  static final int RECONSUME_TIMES = 11;
  static final int PREPARED_TX_OFFSET = 12;
  static final int PROPERTIES = 13;
  static final int TAGS = 14;
  static final int KEYS = 15;
  static final int BODY = 16;
  static final int BODY_SIZE = 17;
  static final int CRC_OK = 18;
  static final int COLUMNS = 19;

  private static final byte[] TAGS_KEY = "TAGS".getBytes(StandardCharsets.US_ASCII);
  private static final byte[] KEYS_KEY = "KEYS".getBytes(StandardCharsets.US_ASCII);

  private final SegmentStore store;
  private final Planner.Span[] spans;
  private final RecordFilter filter; // null: every record
  private final boolean bodies;
  private final byte[][] wanted; // null: every topic
  private final WritableColumnVector[] vector = new WritableColumnVector[COLUMNS];
  private final ColumnVector[] outputs;
  private final BodyVector bodyVector; // null: the body column is not read
  private final ColumnarBatch batch;
  private final boolean needCrc;
  private final boolean needProperties;
  private final CRC32 crc = new CRC32();

  private int spanIndex = -1;
  private Planner.Span span;
  private SegmentInput channel;
  private long position; // the next record, in the segment file
  private long end; // where the span's bytes end (the file's end, if sooner)

  private ByteBuffer map; // the file's bytes [mapAt, mapAt + mapLen)
  private ByteBuffer crcView; // another view of map, for the CRC
  private long mapAt;
  private int mapLen;
  private byte[] scratch = new byte[4096]; // a topic's or the properties' bytes

  // One record's properties, decoded (key and value as UTF-8, the first
  // occurrence's place, the last occurrence's value: a Python dict).
  private byte[][] propKeys = new byte[16][];
  private byte[][] propValues = new byte[16][];
  private int propCount;
  private final StringBuilder host = new StringBuilder(64);

  SpanDecoder(Planner.Span[] spans, CommitLogSource.ReadOptions options, StructType schema) {
    this.store = options.store;
    this.spans = spans;
    this.window = options.window;
    this.filter = options.filter;
    String[] names = options.columns;
    outputs = new ColumnVector[names.length];
    List<String> all = Arrays.asList(CommitLogSource.SCHEMA.fieldNames());
    BodyVector body = null;
    for (int i = 0; i < names.length; i++) {
      int c = all.indexOf(names[i]);
      if (c < 0) {
        throw new IllegalArgumentException(names[i] + " is not a column of the commit log's rows");
      }
      if (c == BODY) {
        body = new BodyVector(BATCH_ROWS);
        outputs[i] = body;
      } else {
        vector[c] = new OnHeapColumnVector(BATCH_ROWS, schema.fields()[i].dataType());
        outputs[i] = vector[c];
      }
    }
    bodyVector = body;
    // Bodies are read only when the body column is (as read_span).
    this.bodies = options.bodies && body != null;
    needCrc = vector[CRC_OK] != null;
    needProperties = vector[PROPERTIES] != null || vector[TAGS] != null || vector[KEYS] != null;
    if (options.topics == null) {
      wanted = null;
    } else {
      wanted = new byte[options.topics.length][];
      for (int i = 0; i < wanted.length; i++) {
        wanted[i] = options.topics[i].getBytes(StandardCharsets.UTF_8);
      }
    }
    batch = new ColumnarBatch(outputs);
  }

  @Override
  public boolean next() throws IOException {
    for (WritableColumnVector v : vector) {
      if (v != null) {
        v.reset();
      }
    }
    int rows = 0;
    // A batch's bodies are read from one mapping: it ends with its span,
    // or where the next record lies outside the current window.
    while (rows < BATCH_ROWS) {
      if (channel == null) {
        if (rows > 0 || !openNext()) {
          break;
        }
      }
      if (rows > 0 && !mapped(position, Math.min(end - position, 8))) {
        break;
      }
      int before = rows;
      try {
        if (!decodeOne(rows)) {
          closeSpan();
          continue;
        }
      } catch (NewWindow w) {
        if (rows > 0) {
          break;
        }
        remap(position, needed);
        continue;
      }
      if (lastWasRow) {
        rows++;
      }
      assert rows >= before;
    }
    batch.setNumRows(rows);
    return rows > 0;
  }

  @Override
  public ColumnarBatch get() {
    return batch;
  }

  @Override
  public void close() throws IOException {
    closeSpan();
    batch.close();
  }

  private boolean openNext() throws IOException {
    if (spanIndex + 1 >= spans.length) {
      return false;
    }
    span = spans[++spanIndex];
    channel = store.open(span.segment); // (its error is the line to print)
    try {
      position = span.start;
      end = Math.min(span.end, channel.size());
      channel.readingTo(end);
      map = null;
      mapLen = 0;
      if (end > position) {
        remap(position, 0);
      }
    } catch (IOException e) {
      closeSpan();
      throw e;
    }
    return true;
  }

  /**
   * rmqha.pipeline._store.unreadable's line: the file could not be read on
   * this host (the executor's), and why, in the C library's words where
   * Java has its own.
   */
  static String unreadable(String path, IOException e) {
    String why;
    if (e instanceof java.nio.file.NoSuchFileException
        || e instanceof java.io.FileNotFoundException) {
      why = "No such file or directory";
    } else if (e instanceof java.nio.file.AccessDeniedException) {
      why = "Permission denied";
    } else {
      why = String.valueOf(e.getMessage());
    }
    String host;
    try {
      host = java.net.InetAddress.getLocalHost().getHostName();
    } catch (IOException unknown) {
      host = "(unknown)";
    }
    return "cannot read " + path + " on host " + host + ": " + why;
  }

  /** Map the file from `at`: a window, or the `need` bytes of a longer record. */
  private void remap(long at, long need) throws IOException {
    mapAt = at;
    int w = window > 0 ? window : channel.window();
    int asked = (int) Math.min(end - at, Math.max(w, need));
    map = channel.read(at, asked);
    mapLen = map.limit();
    if (mapLen < asked) {
      throw new StoreReadError(
          span.segment.location + ": short read at " + at + " (" + mapLen + " of " + asked
              + " bytes): the file changed while it was read");
    }
    crcView = map.duplicate();
    if (bodyVector != null) {
      bodyVector.source = map;
    }
  }

  private void closeSpan() throws IOException {
    if (channel != null) {
      channel.close(); // (a mapping stays valid until collected)
      channel = null;
    }
  }

  private boolean mapped(long at, long need) {
    return at >= mapAt && at + need <= mapAt + mapLen;
  }

  /** Thrown (before anything is written) when a record is outside the window. */
  private static final class NewWindow extends RuntimeException {
    private static final long serialVersionUID = 1L;
    static final NewWindow INSTANCE = new NewWindow();

    private NewWindow() {
      super(null, null, false, false);
    }
  }

  /** Where the bytes [at, at + need) are in map. */
  private int at(long at, long need) {
    if (!mapped(at, need)) {
      needed = need;
      throw NewWindow.INSTANCE;
    }
    return (int) (at - mapAt);
  }

  private boolean lastWasRow;

  /** A record that is not one: where the span's records stop. */
  private static class Stop extends Exception {
    private static final long serialVersionUID = 1L;

    Stop(String reason) {
      super(reason, null, false, false);
    }
  }

  /** A BLANK filler reaching the span's end: the records end, quietly. */
  private static final class BlankStop extends Stop {
    private static final long serialVersionUID = 1L;

    BlankStop() {
      super("BLANK");
    }
  }

  /**
   * Decode the record at position into row `row`, or skip it (a topic not
   * wanted): true; false when the span's records end here.
   */
  private boolean decodeOne(int row) throws IOException {
    lastWasRow = false;
    long available = end - position;
    if (available <= 0) {
      return false;
    }
    try {
      if (wanted != null && skipTopic(available)) {
        return true;
      }
      lastWasRow = decode(row, available);
      return true;
    } catch (BlankStop blank) {
      return false;
    } catch (Stop stop) {
      if (zeroOrShort(available)) {
        return false; // where records stop: zeros
      }
      if (span.exact) {
        throw new StoreReadError(
            span.segment.location
                + ": the record at offset "
                + (span.base() + position)
                + " runs past the partition boundary at offset "
                + (span.base() + span.end)
                + ": bad record at offset "
                + (span.base() + position)
                + ": "
                + stop.getMessage());
      }
      long following = validRecordAfter();
      if (following >= 0) {
        // Not a torn tail: damage, and dropping the records after it
        // would be a silent loss.
        throw new StoreReadError(
            span.segment.location
                + ": bad record at offset "
                + (span.base() + position)
                + ": "
                + stop.getMessage()
                + "; valid records follow at offset "
                + following
                + ": the store is damaged ('rmqha store check' says where, 'rmqha store"
                + " repair' mends it from a replica)");
      }
      return false; // where records stop: a torn record
    }
  }

  /**
   * The offset of the first record start after the bad record at position,
   * up to the span's end: a header with a message magic, a TOTALSIZE that
   * fits and its own offset as PHYSICALOFFSET, whose record is followed by
   * the span's end, zeros, a BLANK filler to the end, or another such
   * header; -1 for a torn tail, with nothing after it.  A transcription of
   * rmqha.pipeline.scan._valid_record_after, over a mapping of its own.
   */
  private long validRecordAfter() throws IOException {
    long from = position + 1;
    long n = end - from;
    if (n < 8) {
      return -1;
    }
    int length = (int) Math.min(n, Integer.MAX_VALUE);
    ByteBuffer m = channel.read(from, length);
    length = m.limit();
    long base = span.base() + from; // the offset of m's first byte
    for (int p = 0; p + PHYSICALOFFSET_AT + 8 <= length; p++) {
      if (p + 8 <= length && m.getLong(p) == 0L) {
        // No magic lies in a zero long: the next four positions' magic
        // fields overlap it.
        p += 3;
        continue;
      }
      if (!Planner.isRecordStart(m, p, base, length, length)) {
        continue;
      }
      long after = p + (long) m.getInt(p);
      if (length - after < 8) {
        return base + p;
      }
      int follower = m.getInt((int) after);
      int magic = m.getInt((int) after + 4);
      if ((magic == BLANK_MAGIC && after + follower == length)
          || (follower == 0 && magic == 0)
          || Planner.isRecordStart(m, (int) after, base, length, length)) {
        return base + p;
      }
    }
    return -1;
  }

  private boolean zeroOrShort(long available) {
    return available < 8 || map.getLong(at(position, 8)) == 0L;
  }

  /**
   * STORETIMESTAMP (epoch ms) of the record whose header begins b (at
   * commit-log offset `offset`), or Long.MIN_VALUE when b holds no record
   * header there (a BLANK, zeros, damage).
   */
  /** Epoch ms whose microseconds fit a long (rmqha.pipeline.scan._instants' bounds). */
  static final long MIN_MS = Long.MIN_VALUE / 1000; // truncated toward zero: fits
  static final long MAX_MS = Long.MAX_VALUE / 1000;

  /** Epoch ms as Spark's microseconds; null where they do not fit (garbage), as in Python. */
  private static void putInstant(WritableColumnVector v, int row, long ms) {
    if (ms < MIN_MS || ms > MAX_MS) {
      v.putNull(row);
    } else {
      v.putLong(row, ms * 1000L);
    }
  }

  static long storeTimestampAt(ByteBuffer b, long offset) {
    if (b.limit() < 76
        || !Planner.isRecordStart(b, 0, offset, Integer.MAX_VALUE, Integer.MAX_VALUE)) {
      return Long.MIN_VALUE;
    }
    int sysflag = b.getInt(36);
    return b.getLong(48 + ((sysflag & BORNHOST_V6) != 0 ? 20 : 8));
  }

  private static int bodyLengthAt(int sysflag) {
    return 48 + 8 + 8 + 8 + 4 + 8
        + ((sysflag & BORNHOST_V6) != 0 ? 12 : 0)
        + ((sysflag & STOREHOST_V6) != 0 ? 12 : 0);
  }

  /**
   * rmqha.store._record.record_topic, and the skip: true when the record at
   * position is of a topic not wanted (position moved past it).
   */
  private boolean skipTopic(long available) {
    if (available < 48) {
      return false;
    }
    int r = at(position, 48);
    int total = map.getInt(r);
    int magic = map.getInt(r + 4);
    if ((magic != MAGIC_V1 && magic != MAGIC_V2) || total < MIN_FIXED || total > available) {
      return false;
    }
    r = at(position, total);
    int sysflag = map.getInt(r + 36);
    int p = r + bodyLengthAt(sysflag);
    int bodyLength = map.getInt(p);
    long q = (long) p + 4 + bodyLength;
    int limit = r + total;
    if (bodyLength < 0 || q + 2 > limit) {
      return false;
    }
    p = (int) q;
    int length;
    if (magic == MAGIC_V1) {
      length = map.get(p);
      p += 1;
    } else {
      length = map.getShort(p);
      p += 2;
    }
    if (length < 0 || p + length > limit) {
      return false;
    }
    byte[] topic = bytes(p, length);
    for (byte[] w : wanted) {
      if (w.length == length && Arrays.equals(topic, 0, length, w, 0, length)) {
        return false;
      }
    }
    position += total;
    return true;
  }

  /** map's bytes [p, p + length) in scratch. */
  private byte[] bytes(int p, int length) {
    if (scratch.length < length) {
      scratch = new byte[Math.max(length, scratch.length * 2)];
    }
    map.get(p, scratch, 0, length);
    return scratch;
  }

  /**
   * parse_record(strict=True, report_crc=True) into row `row`: true; or
   * false when the record is whole but the pushed filters refuse it
   * (skipped, its row not written).
   */
  private boolean decode(int row, long available) throws Stop {
    long offset = span.base() + position;
    if (available < 8) {
      int i = at(position, available);
      boolean zeros = true;
      for (int k = 0; k < available; k++) {
        zeros &= map.get(i + k) == 0;
      }
      throw new Stop(
          zeros
              ? "no record here (zero bytes)"
              : "truncated: " + available + " bytes left, a record header needs 8");
    }
    int r = at(position, 8);
    int total = map.getInt(r);
    int magic = map.getInt(r + 4);
    if (magic == BLANK_MAGIC) {
      if (total != available) {
        throw new Stop(
            "BLANK filler says " + total + " bytes but " + available + " remain in the segment");
      }
      throw new BlankStop();
    }
    if (magic != MAGIC_V1 && magic != MAGIC_V2) {
      if (total == 0 && magic == 0) {
        throw new Stop("no record here (zero bytes)");
      }
      throw new Stop(String.format("bad magic code 0x%08X", magic));
    }
    if (total < MIN_FIXED) {
      throw new Stop("total size " + total + " is smaller than any record (" + MIN_FIXED + ")");
    }
    if (total > available) {
      throw new Stop(
          "total size " + total + " runs past the " + available
              + " bytes written after it (torn record)");
    }
    r = at(position, total);
    final ByteBuffer b = map;
    int storedCrc = b.getInt(r + 8);
    int sysflag = b.getInt(r + 36);
    boolean bornV6 = (sysflag & BORNHOST_V6) != 0;
    boolean storeV6 = (sysflag & STOREHOST_V6) != 0;
    int limit = r + total;
    int bornAt = r + 48;
    int p = bornAt + (bornV6 ? 20 : 8);
    int storeTimestampAt = p;
    p += 8;
    int storeAt = p;
    p += storeV6 ? 20 : 8;
    if (p + 16 > limit) {
      throw new Stop("total size " + total + " is too small for its hosts");
    }
    int middle = p;
    int bodyLength = b.getInt(p + 12);
    p += 16;
    if (bodyLength < 0 || (long) p + bodyLength > limit) {
      throw new Stop("body length " + bodyLength + " does not fit in total size " + total);
    }
    int bodyAt = p;
    p += bodyLength;
    int topicLength;
    if (magic == MAGIC_V1) {
      if (p + 1 > limit) {
        throw new Stop("topic length runs past the record");
      }
      topicLength = b.get(p);
      p += 1;
    } else {
      if (p + 2 > limit) {
        throw new Stop("topic length runs past the record");
      }
      topicLength = b.getShort(p);
      p += 2;
    }
    if (topicLength < 0 || p + topicLength + 2 > limit) {
      throw new Stop("topic length " + topicLength + " does not fit in total size " + total);
    }
    int topicAt = p;
    if (topicLength > 0 && b.get(p + topicLength - 1) == 0) {
      throw new Stop("topic ends in a zero byte (torn record)");
    }
    p += topicLength;
    int propertiesLength = b.getShort(p);
    p += 2;
    if (propertiesLength < 0 || p + propertiesLength > limit) {
      throw new Stop(
          "properties length " + propertiesLength + " does not fit in total size " + total);
    }
    int propertiesAt = p;
    if (propertiesLength > 0 && b.get(p + propertiesLength - 1) == 0) {
      throw new Stop("properties end in a zero byte (torn record)");
    }
    p += propertiesLength;
    if (p != limit) {
      throw new Stop(
          "total size " + total + " does not match the " + (p - r)
              + " bytes its fields add up to");
    }
    long physical = b.getLong(r + 28);
    if (physical != offset) {
      throw new Stop("PHYSICALOFFSET field says " + physical + ", the record is at " + offset);
    }
    if (filter != null
        && !filter.accepts(
            offset, b.getInt(r + 12), b.getLong(storeTimestampAt), b, topicAt, topicLength)) {
      position += total;
      return false;
    }
    // A record: its row.
    WritableColumnVector v;
    if ((v = vector[OFFSET]) != null) v.putLong(row, offset);
    if ((v = vector[SIZE]) != null) v.putInt(row, total);
    if ((v = vector[TOPIC]) != null) putText(v, row, bytes(topicAt, topicLength), 0, topicLength);
    if ((v = vector[QUEUE_ID]) != null) v.putInt(row, b.getInt(r + 12));
    if ((v = vector[QUEUE_OFFSET]) != null) v.putLong(row, b.getLong(r + 20));
    if ((v = vector[FLAG]) != null) v.putInt(row, b.getInt(r + 16));
    if ((v = vector[SYSFLAG]) != null) v.putInt(row, sysflag);
    // Spark's timestamps are microseconds since the epoch; RocketMQ's ms.
    if ((v = vector[BORN_TIMESTAMP]) != null) putInstant(v, row, b.getLong(r + 40));
    if ((v = vector[STORE_TIMESTAMP]) != null) putInstant(v, row, b.getLong(storeTimestampAt));
    if ((v = vector[BORN_HOST]) != null) putHost(v, row, bornAt, bornV6);
    if ((v = vector[STORE_HOST]) != null) putHost(v, row, storeAt, storeV6);
    if ((v = vector[RECONSUME_TIMES]) != null) v.putInt(row, b.getInt(middle));
    if ((v = vector[PREPARED_TX_OFFSET]) != null) v.putLong(row, b.getLong(middle + 4));
    if (needProperties) {
      properties(bytes(propertiesAt, propertiesLength), propertiesLength);
      if ((v = vector[PROPERTIES]) != null) putProperties(v, row);
      if ((v = vector[TAGS]) != null) putProperty(v, row, TAGS_KEY);
      if ((v = vector[KEYS]) != null) putProperty(v, row, KEYS_KEY);
    }
    if (bodyVector != null) {
      bodyVector.put(row, bodies ? bodyAt : -1, bodyLength);
    }
    if ((v = vector[BODY_SIZE]) != null) v.putInt(row, bodyLength);
    if (needCrc) {
      // RocketMQ checks the CRC only when the body is not empty.
      boolean ok = true;
      if (bodyLength > 0) {
        crc.reset();
        crcView.limit(bodyAt + bodyLength).position(bodyAt);
        crc.update(crcView);
        ok = (int) (crc.getValue() & 0x7FFFFFFF) == storedCrc;
      }
      vector[CRC_OK].putBoolean(row, ok);
    }
    position += total;
    return true;
  }

  private static void putText(WritableColumnVector v, int row, byte[] b, int at, int length) {
    if (Utf8.valid(b, at, length)) {
      v.putByteArray(row, b, at, length);
    } else {
      byte[] text = Utf8.replaced(b, at, length);
      v.putByteArray(row, text, 0, text.length);
    }
  }

  /** rmqha.store._record.format_host of _unpack_host. */
  private void putHost(WritableColumnVector v, int row, int at, boolean v6) {
    StringBuilder s = host;
    s.setLength(0);
    int port;
    if (v6) {
      int[] h = new int[8];
      for (int i = 0; i < 8; i++) {
        h[i] = map.getShort(at + 2 * i) & 0xFFFF;
      }
      // Python's ipaddress: the longest run (the first of equals) of two
      // or more zero groups becomes "::"; no IPv4 forms.
      int bestStart = -1;
      int bestLength = 0;
      for (int i = 0; i < 8; ) {
        if (h[i] != 0) {
          i++;
          continue;
        }
        int j = i;
        while (j < 8 && h[j] == 0) {
          j++;
        }
        if (j - i > bestLength) {
          bestStart = i;
          bestLength = j - i;
        }
        i = j;
      }
      if (bestLength < 2) {
        bestStart = -1;
      }
      s.append('[');
      for (int i = 0; i < 8; i++) {
        if (i == bestStart) {
          s.append(i == 0 ? "::" : ":");
          i += bestLength - 1;
          continue;
        }
        s.append(Integer.toHexString(h[i]));
        if (i < 7) {
          s.append(':');
        }
      }
      s.append("]:");
      port = map.getInt(at + 16);
    } else {
      s.append(map.get(at) & 0xFF).append('.').append(map.get(at + 1) & 0xFF).append('.')
          .append(map.get(at + 2) & 0xFF).append('.').append(map.get(at + 3) & 0xFF).append(':');
      port = map.getInt(at + 4);
    }
    s.append(port);
    byte[] text = s.toString().getBytes(StandardCharsets.US_ASCII);
    v.putByteArray(row, text, 0, text.length);
  }

  /**
   * rmqha.store._record.decode_properties of b[0:length]: chunks split by
   * \x02, each a name and a value split at its first \x01, both non-empty
   * (other chunks are ignored); a name seen again keeps its first place
   * and takes the later value.  The separators are ASCII, never part of a
   * UTF-8 sequence nor of a replaced one, so the bytes are split before
   * they are decoded.
   */
  private void properties(byte[] b, int length) {
    propCount = 0;
    int chunk = 0;
    while (chunk <= length && length > 0) {
      int next = chunk;
      while (next < length && b[next] != 2) {
        next++;
      }
      int sep = chunk;
      while (sep < next && b[sep] != 1) {
        sep++;
      }
      if (sep > chunk && sep < next - 1) {
        byte[] key = decoded(b, chunk, sep - chunk);
        byte[] value = decoded(b, sep + 1, next - sep - 1);
        int i = 0;
        while (i < propCount && !Arrays.equals(propKeys[i], key)) {
          i++;
        }
        if (i == propCount) {
          if (propCount == propKeys.length) {
            propKeys = Arrays.copyOf(propKeys, propCount * 2);
            propValues = Arrays.copyOf(propValues, propCount * 2);
          }
          propKeys[propCount++] = key;
        }
        propValues[i] = value;
      }
      chunk = next + 1;
    }
  }

  private static byte[] decoded(byte[] b, int at, int length) {
    return Utf8.valid(b, at, length)
        ? Arrays.copyOfRange(b, at, at + length)
        : Utf8.replaced(b, at, length);
  }

  private void putProperties(WritableColumnVector v, int row) {
    WritableColumnVector keys = v.getChild(0);
    WritableColumnVector values = v.getChild(1);
    int first = keys.getElementsAppended();
    keys.reserve(first + propCount);
    values.reserve(first + propCount);
    for (int i = 0; i < propCount; i++) {
      keys.putByteArray(first + i, propKeys[i]);
      values.putByteArray(first + i, propValues[i]);
    }
    keys.addElementsAppended(propCount);
    values.addElementsAppended(propCount);
    v.putArray(row, first, propCount);
  }

  private void putProperty(WritableColumnVector v, int row, byte[] name) {
    for (int i = 0; i < propCount; i++) {
      if (Arrays.equals(propKeys[i], name)) {
        v.putByteArray(row, propValues[i]);
        return;
      }
    }
    v.putNull(row);
  }

  /**
   * The body column: where each row's body lies in the span's mapping,
   * copied out only when Spark asks for it (once per row, into the row it
   * builds), or null for every row (bodies=false).
   */
  static final class BodyVector extends ColumnVector {
    ByteBuffer source;
    private final int[] at;
    private final int[] length;
    private int nulls;

    BodyVector(int capacity) {
      super(org.apache.spark.sql.types.DataTypes.BinaryType);
      at = new int[capacity];
      length = new int[capacity];
    }

    /** Row `row` is source's [at, at + length), or null for at == -1. */
    void put(int row, int at, int length) {
      if (row == 0) {
        nulls = 0;
      }
      this.at[row] = at;
      this.length[row] = length;
      if (at < 0) {
        nulls++;
      }
    }

    @Override
    public byte[] getBinary(int row) {
      int a = at[row];
      if (a < 0) {
        return null;
      }
      byte[] out = new byte[length[row]];
      source.get(a, out, 0, out.length);
      return out;
    }

    @Override
    public boolean isNullAt(int row) {
      return at[row] < 0;
    }

    @Override
    public boolean hasNull() {
      return nulls > 0;
    }

    @Override
    public int numNulls() {
      return nulls;
    }

    @Override
    public void close() {}

    private static UnsupportedOperationException notBinary() {
      return new UnsupportedOperationException("the body column is binary");
    }

    @Override
    public boolean getBoolean(int row) {
      throw notBinary();
    }

    @Override
    public byte getByte(int row) {
      throw notBinary();
    }

    @Override
    public short getShort(int row) {
      throw notBinary();
    }

    @Override
    public int getInt(int row) {
      throw notBinary();
    }

    @Override
    public long getLong(int row) {
      throw notBinary();
    }

    @Override
    public float getFloat(int row) {
      throw notBinary();
    }

    @Override
    public double getDouble(int row) {
      throw notBinary();
    }

    @Override
    public org.apache.spark.sql.vectorized.ColumnarArray getArray(int row) {
      throw notBinary();
    }

    @Override
    public org.apache.spark.sql.vectorized.ColumnarMap getMap(int row) {
      throw notBinary();
    }

    @Override
    public org.apache.spark.sql.types.Decimal getDecimal(int row, int precision, int scale) {
      throw notBinary();
    }

    @Override
    public org.apache.spark.unsafe.types.UTF8String getUTF8String(int row) {
      throw notBinary();
    }

    @Override
    public ColumnVector getChild(int ordinal) {
      throw notBinary();
    }
  }

  /** UTF-8 checks and Python's "replace" decoding, to UTF-8 bytes. */
  static final class Utf8 {
    private static final byte[] REPLACEMENT = {(byte) 0xEF, (byte) 0xBF, (byte) 0xBD};

    private Utf8() {}

    static boolean valid(byte[] b, int at, int length) {
      int i = at;
      int stop = at + length;
      while (i < stop && b[i] >= 0) {
        i++;
      }
      while (i < stop) {
        int n = sequence(b, i, stop);
        if (n < 0) {
          return false;
        }
        i += n;
      }
      return true;
    }

    /**
     * The length of the well-formed sequence at b[i], or minus the length
     * of its maximal invalid prefix (at least 1): the Unicode practice
     * Python's decoder follows, one U+FFFD per maximal subpart.
     */
    static int sequence(byte[] b, int i, int stop) {
      int c = b[i] & 0xFF;
      if (c < 0x80) {
        return 1;
      }
      int need;
      int lo = 0x80;
      int hi = 0xBF;
      if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
      } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
      } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
      } else {
        return -1;
      }
      for (int k = 1; k <= need; k++) {
        if (i + k >= stop) {
          return -k;
        }
        int d = b[i + k] & 0xFF;
        if (d < lo || d > hi) {
          return -k;
        }
        lo = 0x80;
        hi = 0xBF;
      }
      return need + 1;
    }

    static byte[] replaced(byte[] b, int at, int length) {
      java.io.ByteArrayOutputStream out = new java.io.ByteArrayOutputStream(length + 8);
      int i = at;
      int stop = at + length;
      while (i < stop) {
        int n = sequence(b, i, stop);
        if (n > 0) {
          out.write(b, i, n);
          i += n;
        } else {
          out.write(REPLACEMENT, 0, 3);
          i -= n;
        }
      }
      return out.toByteArray();
    }
  }
}
