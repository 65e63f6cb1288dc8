package rmqha.spark;

import java.io.IOException;

/**
 * A store the span reader cannot read as planned: a segment gone or
 * unreadable, a record running past a cut, damage.  Its message is the
 * whole of what to tell (the file first, as the Python reader's errors);
 * rmqha.pipeline.jobs.error_line prints it without the class name.
 */
final class StoreReadError extends IOException {
  private static final long serialVersionUID = 1L;

  StoreReadError(String message) {
    super(message);
  }
}
