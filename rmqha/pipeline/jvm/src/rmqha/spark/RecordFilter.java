package rmqha.spark;

import java.io.Serializable;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * The filters pushed to the reader ({@link CommitLogSource}), as a
 * conjunction of conditions on four columns, checked for each whole record
 * after reading only its offset, queue id, store timestamp and topic: a
 * record refused is skipped before anything else of it is decoded.  Also
 * the span-level test: whether a span whose records' offsets, or store
 * times, lie in a known range can hold a row at all.
 */
final class RecordFilter implements Serializable {
  private static final long serialVersionUID = 1L;

  /** One column's condition: lo <= value <= hi, and in every set. */
  static final class Range implements Serializable {
    private static final long serialVersionUID = 1L;
    long lo = Long.MIN_VALUE;
    long hi = Long.MAX_VALUE;
    final List<long[]> sets = new ArrayList<>(); // each sorted

    boolean any() {
      return lo != Long.MIN_VALUE || hi != Long.MAX_VALUE || !sets.isEmpty();
    }

    boolean accepts(long v) {
      if (v < lo || v > hi) {
        return false;
      }
      for (long[] set : sets) {
        if (Arrays.binarySearch(set, v) < 0) {
          return false;
        }
      }
      return true;
    }

    /** Can any value in [a, b] pass? */
    boolean overlaps(long a, long b) {
      long from = Math.max(a, lo);
      long to = Math.min(b, hi);
      if (from > to) {
        return false;
      }
      for (long[] set : sets) {
        int i = Arrays.binarySearch(set, from);
        int next = i >= 0 ? i : -i - 1;
        if (next >= set.length || set[next] > to) {
          return false;
        }
      }
      return true;
    }

    void atLeast(long v) {
      lo = Math.max(lo, v);
    }

    void atMost(long v) {
      hi = Math.min(hi, v);
    }

    void in(long[] values) {
      long[] sorted = values.clone();
      Arrays.sort(sorted);
      sets.add(sorted);
    }
  }

  final Range offset = new Range();
  final Range queueId = new Range();
  /** In Spark's microseconds (a record's epoch ms * 1000). */
  final Range storeTime = new Range();
  /** Each a set of topics (UTF-8, as the rows show them); all must hold. */
  final List<byte[][]> topics = new ArrayList<>();
  /** A condition nothing passes (= null, IN of nulls only). */
  boolean none;
  /**
   * Whether a wanted topic holds U+FFFD, which a stored topic of invalid
   * UTF-8 shows as (only then is a record's topic decoded to compare).
   */
  boolean replacementWanted;

  /**
   * Is the topic b[at, +length) in {@code set}, as the row shows it?  Its
   * bytes are compared where they lie, with no copy (a wanted topic is
   * valid UTF-8: equal bytes are the same string); only when no bytes
   * match, the topic is not valid UTF-8 and a wanted one holds U+FFFD is
   * it decoded with replacements, as the row is.
   */
  private boolean topicIn(byte[][] set, ByteBuffer b, int at, int length) {
    for (byte[] t : set) {
      if (t.length == length && sameBytes(t, b, at)) {
        return true;
      }
    }
    if (!replacementWanted) {
      return false;
    }
    byte[] topic = new byte[length];
    b.get(at, topic, 0, length);
    if (SpanDecoder.Utf8.valid(topic, 0, length)) {
      return false;
    }
    byte[] shown = SpanDecoder.Utf8.replaced(topic, 0, length);
    for (byte[] t : set) {
      if (Arrays.equals(t, shown)) {
        return true;
      }
    }
    return false;
  }

  private static boolean sameBytes(byte[] t, ByteBuffer b, int at) {
    for (int i = 0; i < t.length; i++) {
      if (t[i] != b.get(at + i)) {
        return false;
      }
    }
    return true;
  }

  void topicIn(String[] names) {
    byte[][] set = new byte[names.length][];
    for (int i = 0; i < names.length; i++) {
      set[i] = names[i].getBytes(StandardCharsets.UTF_8);
      replacementWanted |= names[i].indexOf('\uFFFD') >= 0;
    }
    topics.add(set);
  }

  boolean any() {
    return none || offset.any() || queueId.any() || storeTime.any() || !topics.isEmpty();
  }

  /** The record's fields (its store time in epoch ms; its topic b[topicAt, +length)). */
  boolean accepts(long off, int queue, long storeMs, ByteBuffer b, int topicAt, int topicLength) {
    if (none
        || !offset.accepts(off)
        || !queueId.accepts(queue)
        // A store time out of Spark's range is a null column: no comparison holds.
        || (storeTime.any()
            && (storeMs < SpanDecoder.MIN_MS || storeMs > SpanDecoder.MAX_MS
                || !storeTime.accepts(storeMs * 1000L)))) {
      return false;
    }
    if (topics.isEmpty()) {
      return true;
    }
    for (byte[][] set : topics) {
      if (!topicIn(set, b, topicAt, topicLength)) {
        return false;
      }
    }
    return true;
  }
}
