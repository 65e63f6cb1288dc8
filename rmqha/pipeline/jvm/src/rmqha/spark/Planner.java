package rmqha.spark;

import java.io.IOException;
import java.io.Serializable;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;

/**
 * The driver's planning: rmqha.pipeline.scan.plan (cuts at record
 * boundaries about every splitBytes, found by find_record_start; an
 * offset range) and rmqha.pipeline.source.pack (consecutive small spans
 * in one partition up to splitBytes), transcribed, over a {@link
 * SegmentStore}.
 */
final class Planner {
  private Planner() {}

  /** A record is at most this long (rmqha.pipeline.scan.MAX_RECORD). */
  static final int MAX_RECORD = 4 * 1024 * 1024 + 64 * 1024;

  private static final int SEARCH_BLOCK = 1024 * 1024;

  /**
   * Record-aligned bytes [start, end) of one segment.  When exact, end is
   * a record start (the next span's), and the last record must end there.
   */
  static final class Span implements Serializable {
    private static final long serialVersionUID = 1L;
    final Segment segment;
    final long start;
    final long end;
    final boolean exact;
    /**
     * STORETIMESTAMP of the span's first record, in epoch ms, when planning
     * read it (Long.MIN_VALUE: not known).
     */
    long firstStoreTime = Long.MIN_VALUE;

    Span(Segment segment, long start, long end, boolean exact) {
      this.segment = segment;
      this.start = start;
      this.end = end;
      this.exact = exact;
    }

    long base() {
      return segment.base;
    }

    @Override
    public String toString() {
      return segment.name + "[" + start + "," + end + (exact ? ")!" : ")");
    }
  }

  /** rmqha.pipeline.scan.plan. */
  static List<Span> plan(SegmentStore store, long split, long startOffset, long endOffset)
      throws IOException {
    // startOffset -1: none; endOffset -1: none.
    List<Span> spans = new ArrayList<>();
    for (Segment segment : store.segments()) {
      long base = segment.base;
      long size = segment.size;
      if (endOffset >= 0 && base >= endOffset) {
        break;
      }
      if (startOffset >= 0 && base + size <= startOffset) {
        continue;
      }
      long first = startOffset < 0 || startOffset <= base ? 0 : startOffset - base;
      long last = endOffset < 0 || endOffset >= base + size ? size : endOffset - base;
      if (first == 0 && last >= size && size <= split) {
        spans.add(new Span(segment, 0, size, false));
        continue;
      }
      try (SegmentInput f = store.open(segment)) {
        if (first > 0) {
          long found = findRecordStart(f, base, first, size);
          if (found < 0) {
            continue;
          }
          first = found;
        }
        List<Long> cuts = new ArrayList<>();
        cuts.add(first);
        boolean exactLast = false;
        long nominal = (first / split + 1) * split;
        while (nominal < last) {
          long found = findRecordStart(f, base, nominal, size);
          if (found < 0 || found >= last) {
            break;
          }
          cuts.add(found);
          nominal = (found / split + 1) * split;
        }
        long end = last;
        if (last < size) {
          long found = findRecordStart(f, base, last, size);
          if (found >= 0) {
            end = found;
            exactLast = true;
          } else {
            end = Math.min(size, last + MAX_RECORD);
          }
        }
        for (int i = 0; i < cuts.size(); i++) {
          long a = cuts.get(i);
          long b = i + 1 < cuts.size() ? cuts.get(i + 1) : end;
          boolean exact = i < cuts.size() - 1 || exactLast;
          if (b > a) {
            spans.add(new Span(segment, a, b, exact));
          }
        }
      }
    }
    return spans;
  }

  /** rmqha.pipeline.source.pack: spans in order, in groups of at most limit bytes. */
  static List<List<Span>> pack(List<Span> spans, long limit) {
    List<List<Span>> groups = new ArrayList<>();
    List<Span> group = new ArrayList<>();
    long size = 0;
    for (Span span : spans) {
      long length = span.end - span.start;
      if (!group.isEmpty() && size + length > limit) {
        groups.add(group);
        group = new ArrayList<>();
        size = 0;
      }
      group.add(span);
      size += length;
    }
    if (!group.isEmpty()) {
      groups.add(group);
    }
    return groups;
  }

  /**
   * rmqha.pipeline.scan.find_record_start: the first record start at or
   * after position and before limit whose record is followed by another
   * (or the segment's end, a BLANK, zeros); -1 when there is none.
   */
  static long findRecordStart(SegmentInput f, long base, long position, long limit)
      throws IOException {
    long size = f.size();
    long blockStart = position;
    while (blockStart < limit) {
      // Overlap blocks by a header so a match across the seam is seen.
      ByteBuffer data = f.read(blockStart, (int) Math.min(SEARCH_BLOCK, limit - blockStart) + 40);
      int n = data.limit();
      if (n == 0) {
        return -1;
      }
      long segmentEnd = size - blockStart;
      int from = (int) Math.max(0, position - blockStart);
      // record_starts: a magic at p + 4, for p + 36 <= n.
      for (int p = from; p + SpanDecoder.PHYSICALOFFSET_AT + 8 <= n; p++) {
        if ((p & 7) == 0 && p + 16 <= n && data.getLong(p) == 0L && data.getLong(p + 8) == 0L) {
          p += 7; // no magic at p + 4 .. p + 11 (zeros)
          continue;
        }
        int magic = data.getInt(p + 4);
        if (magic != SpanDecoder.MAGIC_V1 && magic != SpanDecoder.MAGIC_V2) {
          continue;
        }
        if (!isRecordStart(data, p, base + blockStart, segmentEnd, n)) {
          continue;
        }
        long candidate = blockStart + p;
        if (candidate < limit && followedByRecord(f, base, candidate, data, blockStart)) {
          return candidate;
        }
      }
      blockStart += SEARCH_BLOCK;
    }
    return -1;
  }

  /** is_record_start over data (whose byte 0 is at offset dataBase); size: the segment's end. */
  static boolean isRecordStart(ByteBuffer data, int p, long dataBase, long size, int n) {
    if (p < 0 || (long) p + SpanDecoder.PHYSICALOFFSET_AT + 8 > n) {
      return false;
    }
    int total = data.getInt(p);
    int magic = data.getInt(p + 4);
    if ((magic != SpanDecoder.MAGIC_V1 && magic != SpanDecoder.MAGIC_V2)
        || total < SpanDecoder.MIN_FIXED
        || total > size - p) {
      return false;
    }
    return data.getLong(p + SpanDecoder.PHYSICALOFFSET_AT) == dataBase + p;
  }

  /** rmqha.pipeline.scan._followed_by_record. */
  private static boolean followedByRecord(
      SegmentInput f, long base, long start, ByteBuffer data, long dataStart) throws IOException {
    long size = f.size();
    int total = at(f, data, dataStart, start, 8).getInt(0);
    long after = start + total;
    if (after >= size) {
      return after == size;
    }
    ByteBuffer follow = at(f, data, dataStart, after, (int) Math.min(40, size - after));
    if (follow.limit() < 8) {
      return true;
    }
    int follower = follow.getInt(0);
    int magic = follow.getInt(4);
    if (magic == SpanDecoder.BLANK_MAGIC) {
      return after + follower == size;
    }
    if (follower == 0 && magic == 0) {
      return true; // the log ends there
    }
    return isRecordStart(follow, 0, base + after, size - after, follow.limit());
  }

  private static ByteBuffer at(SegmentInput f, ByteBuffer data, long dataStart, long position, int length)
      throws IOException {
    long i = position - dataStart;
    if (i >= 0 && i + length <= data.limit()) {
      return data.slice((int) i, length);
    }
    return f.read(position, length);
  }

  /**
   * STORETIMESTAMP of the record at each span's start (for pruning by
   * store time): one small read per span, of a header whose place the
   * plan proved (Long.MIN_VALUE where no record is there).
   */
  static void readFirstStoreTimes(SegmentStore store, List<Span> spans) throws IOException {
    SegmentInput f = null;
    Segment open = null;
    try {
      for (Span span : spans) {
        if (open != span.segment) {
          if (f != null) {
            f.close();
          }
          f = store.open(span.segment);
          open = span.segment;
        }
        span.firstStoreTime = SpanDecoder.storeTimestampAt(f.read(span.start, 96), span.base() + span.start);
      }
    } finally {
      if (f != null) {
        f.close();
      }
    }
  }
}
