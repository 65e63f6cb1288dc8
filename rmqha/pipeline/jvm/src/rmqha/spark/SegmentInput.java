package rmqha.spark;

import java.io.Closeable;
import java.io.IOException;
import java.nio.ByteBuffer;

/** An open segment: positioned reads of its bytes. */
public interface SegmentInput extends Closeable {
  /** The segment's length in bytes (as opened). */
  long size();

  /**
   * The bytes [at, at + length), fewer where the segment ends first: a
   * big-endian buffer from position 0 to its limit (a memory mapping of a
   * local file, or bytes read into the heap).  Nothing else holds it: the
   * caller may keep it after later reads.
   *
   * @throws IOException the bytes could not be read (the message names
   *     the segment)
   */
  ByteBuffer read(long at, int length) throws IOException;

  /**
   * How many bytes a reader should ask for at once: the decoder's window.
   * A mapping costs address space, not memory (1 GiB); bytes read into the
   * heap cost memory (a few MiB).
   */
  int window();

  /**
   * The caller reads no byte at or past `end` (its span ends there): an
   * input that reads ahead stops there.
   */
  default void readingTo(long end) {}
}
