package rmqha.spark;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.List;

/**
 * Where a store's whole, valid records end, found by walking their headers
 * from a known record start (the streaming source's latest offset, {@link
 * CommitLogStream}).  A record is valid as {@link SpanDecoder} decodes it
 * (rmqha.store._record.parse_record, strict): the same checks, in the same
 * order, without decoding a field.  The walk stops where records stop:
 *
 * <ul>
 *   <li>zeros, or a torn record with nothing valid after it: the tail still
 *       being written; the walk ends before it (the next walk starts
 *       there), unless the next segment has begun (a valid record at its
 *       start: then, as the batch reader does, the records go on there;
 *       a next segment still empty may have been made ahead of time);
 *   <li>a BLANK filler to the segment's end, or the segment's end: the
 *       next segment's base;
 *   <li>a bad record with valid records after it (still bad when read
 *       again: not a record completed meanwhile): damage, a {@link
 *       StoreReadError} in the batch reader's words.
 * </ul>
 */
final class RecordWalk {
  private RecordWalk() {}

  /** Bytes looked at once, at most (a longer record is read whole). */
  static final int WINDOW = 8 << 20;
  /** Bytes a walk looks at first. */
  static final int FIRST_WINDOW = 64 << 10;

  /**
   * A torn record already judged so (nothing valid after it), by offset
   * and first bytes: not searched past again while it stays the same (a
   * crashed writer's torn tail would cost a scan of the segment's rest
   * at every trigger).
   */
  static final class Torn {
    long offset = -1;
    ByteBuffer head;
  }

  /**
   * The end of the valid records from {@code from} (a record start, or
   * where a segment begins), or where {@code budget} bytes from there end
   * on a record boundary (at least one record when there is one).
   *
   * @param segments the store's, in order (from {@link SegmentStore#segments()})
   * @param torn the torn record the last walk stopped at (updated), or null
   * @throws StoreReadError damage (bad record, valid records follow), an unreadable segment
   */
  static long end(SegmentStore store, List<Segment> segments, long from, long budget, Torn torn)
      throws IOException {
    long pos = from;
    long stopAt = budget == Long.MAX_VALUE ? Long.MAX_VALUE : from + budget;
    for (int i = 0; i < segments.size(); i++) {
      Segment segment = segments.get(i);
      boolean later = i + 1 < segments.size();
      if (pos > segment.base + segment.size
          || (pos == segment.base + segment.size && later)) {
        continue; // past this one
      }
      if (pos < segment.base) {
        pos = segment.base; // (from a segment's start: the caller judged data loss)
      }
      try (SegmentInput in = store.open(segment)) {
        long size = in.size();
        long p = pos - segment.base;
        Walked w = walk(in, segment, p, size, stopAt - segment.base, torn);
        pos = segment.base + w.at;
        if (w.full) {
          pos = segment.base + size; // (a BLANK or the exact end: the next segment's base)
          if (pos >= stopAt) {
            return pos;
          }
          continue;
        }
        if (w.budget || !later || !startsWithRecord(store, segments.get(i + 1))) {
          return pos;
        }
        // Records stop inside a segment whose successor has begun: the
        // batch reader reads on from the successor's start, and so does
        // the stream.  (A successor still empty may be one made ahead of
        // time, as Apache RocketMQ's broker does: records still go here.)
        pos = segments.get(i + 1).base;
      }
    }
    return pos;
  }

  /** How far a segment's records go: to `at`; `full` when to its end; `budget` when stopped by it. */
  private static final class Walked {
    final long at;
    final boolean full;
    final boolean budget;

    Walked(long at, boolean full, boolean budget) {
      this.at = at;
      this.full = full;
      this.budget = budget;
    }
  }

  private static Walked walk(SegmentInput in, Segment segment, long p, long size, long stopAt,
      Torn torn) throws IOException {
    long start = p;
    ByteBuffer w = null;
    long wAt = 0;
    int window = FIRST_WINDOW;
    while (true) {
      long available = size - p;
      if (available <= 0) {
        return new Walked(size, true, false);
      }
      if (w == null || p < wAt || p + Math.min(available, 8) > wAt + w.limit()) {
        // Small at first (a walk from the tail mostly finds a few records,
        // or none), larger while records go on.
        window = w == null ? FIRST_WINDOW : Math.min(WINDOW, window * 2);
        wAt = p;
        w = in.read(p, (int) Math.min(window, available));
      }
      int r = (int) (p - wAt);
      int have = w.limit() - r;
      if (have >= 8) {
        int total = w.getInt(r);
        int magic = w.getInt(r + 4);
        if (magic == SpanDecoder.BLANK_MAGIC && total == available) {
          return new Walked(size, true, false);
        }
        if ((magic == SpanDecoder.MAGIC_V1 || magic == SpanDecoder.MAGIC_V2)
            && total >= SpanDecoder.MIN_FIXED && total <= available) {
          if (total > have) {
            wAt = p;
            w = in.read(p, Math.max(total, (int) Math.min(WINDOW, available)));
            r = 0;
          }
          if (w.limit() - r >= total && check(w, r, total, magic, segment.base + p) == null) {
            if (p + total > stopAt && p > start) {
              return new Walked(p, false, true);
            }
            p += total;
            continue;
          }
        }
      }
      // No valid record at p.
      if (zeros(in, p, available)) {
        return new Walked(p, false, false);
      }
      ByteBuffer mapped = in.read(p, (int) Math.min(64, available));
      ByteBuffer head = ByteBuffer.allocate(mapped.limit()); // (a copy: a mapping changes)
      head.put(mapped.duplicate()).flip();
      if (torn != null && torn.offset == segment.base + p && head.equals(torn.head)) {
        return new Walked(p, false, false); // the same torn tail as last time
      }
      long following = validRecordAfter(in, segment.base, p + 1, size);
      if (following < 0) {
        if (torn != null) {
          torn.offset = segment.base + p;
          torn.head = head;
        }
        return new Walked(p, false, false); // a torn tail: wait for it
      }
      // Valid records after it: damage, unless the record was being
      // written and is whole now (then the walk goes on from it).
      ByteBuffer again = in.read(p, (int) Math.min(Math.max(WINDOW, 8), available));
      String why = reason(in, again, p, available, segment.base + p);
      if (why == null) {
        w = null;
        continue;
      }
      throw new StoreReadError(
          segment.location + ": bad record at offset " + (segment.base + p) + ": " + why
              + "; valid records follow at offset " + following
              + ": the store is damaged ('rmqha store check' says where, 'rmqha store"
              + " repair' mends it from a replica)");
    }
  }

  /** Whether a whole, valid record begins the segment. */
  static boolean startsWithRecord(SegmentStore store, Segment segment) throws IOException {
    try (SegmentInput in = store.open(segment)) {
      long size = in.size();
      ByteBuffer b = in.read(0, (int) Math.min(size, FIRST_WINDOW));
      if (b.limit() < 8) {
        return false;
      }
      int total = b.getInt(0);
      int magic = b.getInt(4);
      if ((magic != SpanDecoder.MAGIC_V1 && magic != SpanDecoder.MAGIC_V2)
          || total < SpanDecoder.MIN_FIXED || total > size) {
        return false;
      }
      if (total > b.limit()) {
        b = in.read(0, total);
      }
      return b.limit() >= total && check(b, 0, total, magic, segment.base) == null;
    }
  }

  private static boolean zeros(SegmentInput in, long p, long available) throws IOException {
    ByteBuffer b = in.read(p, (int) Math.min(8, available));
    for (int k = 0; k < b.limit(); k++) {
      if (b.get(k) != 0) {
        return false;
      }
    }
    return true;
  }

  /** Why the record at b's start (offset `offset`, `available` bytes to the segment's end) is not one; null: it is. */
  private static String reason(SegmentInput in, ByteBuffer b, long p, long available, long offset)
      throws IOException {
    if (b.limit() < 8) {
      return "truncated: " + available + " bytes left, a record header needs 8";
    }
    int total = b.getInt(0);
    int magic = b.getInt(4);
    if (magic == SpanDecoder.BLANK_MAGIC) {
      return total == available ? null
          : "BLANK filler says " + total + " bytes but " + available + " remain in the segment";
    }
    if (magic != SpanDecoder.MAGIC_V1 && magic != SpanDecoder.MAGIC_V2) {
      return String.format("bad magic code 0x%08X", magic);
    }
    if (total < SpanDecoder.MIN_FIXED) {
      return "total size " + total + " is smaller than any record (" + SpanDecoder.MIN_FIXED + ")";
    }
    if (total > available) {
      return "total size " + total + " runs past the " + available
          + " bytes written after it (torn record)";
    }
    if (total > b.limit()) {
      b = in.read(p, total);
    }
    return check(b, 0, total, magic, offset);
  }

  /**
   * SpanDecoder.decode's checks of a record of `total` bytes at b[r]
   * (whole in b): null when it is a record, else why not.
   */
  static String check(ByteBuffer b, int r, int total, int magic, long offset) {
    int sysflag = b.getInt(r + 36);
    boolean bornV6 = (sysflag & SpanDecoder.BORNHOST_V6) != 0;
    boolean storeV6 = (sysflag & SpanDecoder.STOREHOST_V6) != 0;
    int limit = r + total;
    int p = r + 48 + (bornV6 ? 20 : 8) + 8 + (storeV6 ? 20 : 8);
    if (p + 16 > limit) {
      return "total size " + total + " is too small for its hosts";
    }
    int bodyLength = b.getInt(p + 12);
    p += 16;
    if (bodyLength < 0 || (long) p + bodyLength > limit) {
      return "body length " + bodyLength + " does not fit in total size " + total;
    }
    p += bodyLength;
    int topicLength;
    if (magic == SpanDecoder.MAGIC_V1) {
      if (p + 1 > limit) {
        return "topic length runs past the record";
      }
      topicLength = b.get(p);
      p += 1;
    } else {
      if (p + 2 > limit) {
        return "topic length runs past the record";
      }
      topicLength = b.getShort(p);
      p += 2;
    }
    if (topicLength < 0 || p + topicLength + 2 > limit) {
      return "topic length " + topicLength + " does not fit in total size " + total;
    }
    if (topicLength > 0 && b.get(p + topicLength - 1) == 0) {
      return "topic ends in a zero byte (torn record)";
    }
    p += topicLength;
    int propertiesLength = b.getShort(p);
    p += 2;
    if (propertiesLength < 0 || p + propertiesLength > limit) {
      return "properties length " + propertiesLength + " does not fit in total size " + total;
    }
    if (propertiesLength > 0 && b.get(p + propertiesLength - 1) == 0) {
      return "properties end in a zero byte (torn record)";
    }
    p += propertiesLength;
    if (p != limit) {
      return "total size " + total + " does not match the " + (p - r)
          + " bytes its fields add up to";
    }
    long physical = b.getLong(r + SpanDecoder.PHYSICALOFFSET_AT);
    if (physical != offset) {
      return "PHYSICALOFFSET field says " + physical + ", the record is at " + offset;
    }
    return null;
  }

  /**
   * SpanDecoder.validRecordAfter over an input: the first record start at
   * or after p whose record is followed by the segment's end, zeros, a
   * BLANK to the end, or another record start; -1 when none (a torn tail).
   */
  static long validRecordAfter(SegmentInput in, long base, long from, long size)
      throws IOException {
    long blockAt = from;
    while (blockAt + SpanDecoder.PHYSICALOFFSET_AT + 8 <= size) {
      // Blocks overlap by a record's most: a record and its follower are seen whole.
      int length = (int) Math.min(size - blockAt, (long) WINDOW + Planner.MAX_RECORD + 40);
      ByteBuffer m = in.read(blockAt, length);
      length = m.limit();
      long mBase = base + blockAt;
      int scan = (int) Math.min(length, WINDOW);
      long segmentLeft = size - blockAt; // bytes from m's start to the segment's end
      for (int p = 0; p < scan && p + SpanDecoder.PHYSICALOFFSET_AT + 8 <= length; p++) {
        if (p + 8 <= length && m.getLong(p) == 0L) {
          p += 3;
          continue;
        }
        if (!Planner.isRecordStart(m, p, mBase, segmentLeft, length)) {
          continue;
        }
        long after = p + (long) m.getInt(p);
        if (segmentLeft - after < 8) {
          return mBase + p;
        }
        if (after + 8 > length) {
          continue; // (beyond this block's reach: judged from the next block)
        }
        int follower = m.getInt((int) after);
        int magic = m.getInt((int) after + 4);
        if ((magic == SpanDecoder.BLANK_MAGIC && after + follower == segmentLeft)
            || (follower == 0 && magic == 0)
            || Planner.isRecordStart(m, (int) after, mBase, segmentLeft, length)) {
          return mBase + p;
        }
      }
      blockAt += scan;
    }
    return -1;
  }
}
