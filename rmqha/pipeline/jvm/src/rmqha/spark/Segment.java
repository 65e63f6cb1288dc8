package rmqha.spark;

import java.io.Serializable;

/** One segment file: its start offset, length and location (for messages). */
public final class Segment implements Serializable {
  private static final long serialVersionUID = 1L;
  /** The commit-log offset of the segment's first byte (its file name). */
  public final long base;
  /** Its length in bytes, when listed. */
  public final long size;
  /** Its 20-digit file name. */
  public final String name;
  /** Where it is: a plain path for a local file, else a URI. */
  public final String location;

  public Segment(long base, long size, String name, String location) {
    this.base = base;
    this.size = size;
    this.name = name;
    this.location = location;
  }

  @Override
  public String toString() {
    return location;
  }
}
