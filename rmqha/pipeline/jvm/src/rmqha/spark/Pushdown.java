package rmqha.spark;

import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.connector.expressions.Expression;
import org.apache.spark.sql.connector.expressions.Literal;
import org.apache.spark.sql.connector.expressions.NamedReference;
import org.apache.spark.sql.connector.expressions.filter.Predicate;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * Filters pushed to the reader: which predicates it takes ({@link #apply})
 * and which spans it then need not read ({@link #prune}).
 *
 * <p>Taken: {@code topic} (=, IN), {@code queue_id}, {@code offset} and
 * {@code store_timestamp} (=, IN, <, <=, >, >=; BETWEEN arrives as two),
 * a column on either side.  Spark checks every filter again after the
 * scan, pushed or not.
 *
 * <p>Spans pruned: by offset, exactly (a span's records start within its
 * bytes).  By store time, from the STORETIMESTAMP of each span's first
 * record (read while planning): the commit log is appended in time order,
 * but a broker's clock can go back (a failover to a slave whose clock is
 * behind; NTP stepping it).  A span is skipped only when, allowing its
 * records to be up to {@code timeTolerance} earlier than a record before
 * them, none of them can match: its records lie in [its first record's
 * time - tolerance, the next span's first record's time + tolerance].  And
 * when the first records themselves ever go back by more than the
 * tolerance, that assumption is proven false for this store: no span is
 * pruned by time (and the scan's description says so).
 */
final class Pushdown {
  private Pushdown() {}

  /** Take the predicate into filter: true; false when it is not one the reader applies. */
  static boolean apply(Predicate p, RecordFilter filter) {
    String op = p.name();
    Expression[] c = p.children();
    if (op.equals("IN")) {
      if (c.length < 1 || !(c[0] instanceof NamedReference)) {
        return false;
      }
      String column = column((NamedReference) c[0]);
      if (column == null) {
        return false;
      }
      DataType type = type(column);
      List<Object> values = new ArrayList<>();
      for (int i = 1; i < c.length; i++) {
        if (!(c[i] instanceof Literal) || !((Literal<?>) c[i]).dataType().equals(type)) {
          return false;
        }
        Object v = ((Literal<?>) c[i]).value();
        if (v != null) { // (x IN (..., null) is never true for a null's sake)
          values.add(v);
        }
      }
      if (column.equals("topic")) {
        String[] names = new String[values.size()];
        for (int i = 0; i < names.length; i++) {
          names[i] = values.get(i).toString();
        }
        filter.topicIn(names);
      } else {
        long[] longs = new long[values.size()];
        for (int i = 0; i < longs.length; i++) {
          longs[i] = ((Number) values.get(i)).longValue();
        }
        range(filter, column).in(longs);
      }
      return true;
    }
    if (c.length != 2) {
      return false;
    }
    boolean flipped = false;
    Expression ref = c[0];
    Expression lit = c[1];
    if (ref instanceof Literal && lit instanceof NamedReference) {
      ref = c[1];
      lit = c[0];
      flipped = true;
    }
    if (!(ref instanceof NamedReference) || !(lit instanceof Literal)) {
      return false;
    }
    String column = column((NamedReference) ref);
    if (column == null || !((Literal<?>) lit).dataType().equals(type(column))) {
      return false;
    }
    Object value = ((Literal<?>) lit).value();
    if (flipped) {
      op = op.equals("<") ? ">" : op.equals("<=") ? ">=" : op.equals(">") ? "<" : op.equals(">=") ? "<=" : op;
    }
    if (!op.equals("=") && !op.equals("<") && !op.equals("<=") && !op.equals(">") && !op.equals(">=")) {
      return false;
    }
    if (value == null) {
      filter.none = true; // a comparison with null is never true
      return true;
    }
    if (column.equals("topic")) {
      if (!op.equals("=")) {
        return false;
      }
      filter.topicIn(new String[] {((UTF8String) value).toString()});
      return true;
    }
    long v = ((Number) value).longValue();
    RecordFilter.Range r = range(filter, column);
    switch (op) {
      case "=":
        r.atLeast(v);
        r.atMost(v);
        break;
      case "<":
        if (v == Long.MIN_VALUE) {
          filter.none = true;
        } else {
          r.atMost(v - 1);
        }
        break;
      case "<=":
        r.atMost(v);
        break;
      case ">":
        if (v == Long.MAX_VALUE) {
          filter.none = true;
        } else {
          r.atLeast(v + 1);
        }
        break;
      default:
        r.atLeast(v);
    }
    return true;
  }

  private static String column(NamedReference ref) {
    String[] names = ref.fieldNames();
    if (names.length != 1) {
      return null;
    }
    switch (names[0]) {
      case "topic":
      case "queue_id":
      case "offset":
      case "store_timestamp":
        return names[0];
      default:
        return null;
    }
  }

  private static DataType type(String column) {
    switch (column) {
      case "topic":
        return DataTypes.StringType;
      case "queue_id":
        return DataTypes.IntegerType;
      case "offset":
        return DataTypes.LongType;
      default:
        return DataTypes.TimestampType;
    }
  }

  private static RecordFilter.Range range(RecordFilter filter, String column) {
    switch (column) {
      case "queue_id":
        return filter.queueId;
      case "offset":
        return filter.offset;
      default:
        return filter.storeTime;
    }
  }

  /**
   * The offsets [start, end) that can hold a row passing the offset
   * condition r; -1 for no bound (end exclusive: the planner's endOffset).
   */
  static long[] offsets(RecordFilter.Range r) {
    long lo = r.lo;
    long hi = r.hi;
    for (long[] set : r.sets) {
      if (set.length == 0) {
        return new long[] {0, 0};
      }
      lo = Math.max(lo, set[0]);
      hi = Math.min(hi, set[set.length - 1]);
    }
    long start = lo <= 0 ? -1 : lo;
    long end = hi == Long.MAX_VALUE ? -1 : hi < 0 ? 0 : hi + 1;
    return new long[] {start, end};
  }

  /** The spans to read, and what the scan's description says of it. */
  static final class Pruned {
    final List<Planner.Span> spans;
    final String note;

    Pruned(List<Planner.Span> spans, String note) {
      this.spans = spans;
      this.note = note;
    }
  }

  /** The spans (in order, all of the plan's) that may hold a row passing filter. */
  static Pruned prune(SegmentStore store, List<Planner.Span> spans, RecordFilter filter,
      long toleranceMs) throws IOException {
    if (filter.none) {
      return new Pruned(new ArrayList<>(), ", spans read: 0 of " + spans.size());
    }
    boolean byTime = filter.storeTime.any() && toleranceMs >= 0 && !spans.isEmpty();
    String note = "";
    if (byTime) {
      Planner.readFirstStoreTimes(store, spans);
      long previous = Long.MIN_VALUE;
      for (Planner.Span span : spans) {
        long t = span.firstStoreTime;
        if (t == Long.MIN_VALUE) {
          continue;
        }
        if (previous != Long.MIN_VALUE && t < previous - toleranceMs) {
          byTime = false;
          note = "; store time goes back " + (previous - t) + " ms at offset "
              + (span.base() + span.start) + ", more than timeTolerance ("
              + toleranceMs + " ms): no span pruned by store time";
          break;
        }
        previous = Math.max(previous, t);
      }
    } else if (filter.storeTime.any()) {
      note = "; timeTolerance=off: no span pruned by store time";
    }
    List<Planner.Span> out = new ArrayList<>();
    for (int i = 0; i < spans.size(); i++) {
      Planner.Span span = spans.get(i);
      long first = span.base() + span.start;
      long last = span.base() + span.end - 1;
      if (!filter.offset.overlaps(first, last)) {
        continue;
      }
      if (byTime) {
        long lo = Long.MIN_VALUE;
        long hi = Long.MAX_VALUE;
        if (span.firstStoreTime != Long.MIN_VALUE) {
          lo = micros(span.firstStoreTime - toleranceMs);
        }
        // The next span's first record: the next record after this span's
        // last (the plan's spans are consecutive where they are exact).
        if (span.exact && i + 1 < spans.size()) {
          Planner.Span next = spans.get(i + 1);
          if (next.segment == span.segment && next.start == span.end
              && next.firstStoreTime != Long.MIN_VALUE) {
            hi = micros(next.firstStoreTime + toleranceMs);
          }
        } else if (i + 1 < spans.size()) {
          Planner.Span next = spans.get(i + 1);
          if (next.segment != span.segment && next.start == 0
              && next.firstStoreTime != Long.MIN_VALUE) {
            hi = micros(next.firstStoreTime + toleranceMs);
          }
        }
        if (lo != Long.MIN_VALUE && lo > hi) {
          hi = Long.MAX_VALUE; // (cannot happen; read all rather than guess)
        }
        if (!filter.storeTime.overlaps(lo, hi)) {
          continue;
        }
      }
      out.add(span);
    }
    return new Pruned(out, ", spans read: " + out.size() + " of " + spans.size() + note);
  }

  private static long micros(long ms) {
    if (ms > Long.MAX_VALUE / 1000) {
      return Long.MAX_VALUE;
    }
    if (ms < Long.MIN_VALUE / 1000) {
      return Long.MIN_VALUE;
    }
    return ms * 1000;
  }
}
