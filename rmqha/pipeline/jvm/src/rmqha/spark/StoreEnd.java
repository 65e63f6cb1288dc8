package rmqha.spark;

import java.io.IOException;

/**
 * A store that knows where its whole records end without their being read
 * (a live broker's max offset): the stream's latest offset.
 */
interface StoreEnd {
  /** The offset where whole records end now, on a record boundary. */
  long recordsEnd() throws IOException;
}
