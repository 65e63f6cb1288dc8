package rmqha.spark;

import java.io.IOException;
import java.io.Serializable;
import java.util.List;

/**
 * Where a commit log's segment files are: listed on the driver while
 * planning, then shipped (serialized) with every task and opened there,
 * segment by segment.  {@link HadoopStore} reads any Hadoop FileSystem
 * (local files memory-mapped); another implementation (a live broker's
 * byte ranges) fits the same three methods.
 */
public interface SegmentStore extends Serializable {
  /** The store's location, for messages. */
  String location();

  /**
   * The segment files, in offset order: each named by its 20-digit start
   * offset, with no offset missing between the first and the last.
   *
   * @throws IOException one line naming the location: not a commit log, a
   *     directory where a segment file belongs, a missing segment, a
   *     listing that failed
   */
  List<Segment> segments() throws IOException;

  /**
   * Open a segment (listed by {@link #segments()}, possibly on another
   * machine) for positioned reads.
   *
   * @throws IOException it cannot be opened (the message is the line to
   *     print: the segment's location, this host, why)
   */
  SegmentInput open(Segment segment) throws IOException;
}
