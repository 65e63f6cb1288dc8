# -*- test-case-name: tests.test_pipeline -*-
"""
Reading a commit log in parallel pieces, without Spark.

L{plan} lists a store's segment files and cuts them into L{Span}s: whole
segments, and sub-ranges of large ones that begin and end on record
boundaries.  The commit log has no sync marker, but every record holds its
own offset (PHYSICALOFFSET) 28 bytes after its start, 4 bytes after its
magic code: a position where the magic is followed at the right distance by
that position's own offset is a record start (L{find_record_start}, a C
speed C{bytes.find} for the magic, then the check, then the next record's
header checked the same way).  So planning reads a few kilobytes per cut,
not the log; readers stop where records stop (a BLANK filler, zero bytes,
a torn record), and a reader that finds a record running past a cut fails
loudly instead of returning wrong rows.

L{read_span} decodes one span with the project's decoder
(L{rmqha.store._record.parse_record}) into Arrow record batches of the
C{rocketmq-commitlog} schema; L{scan} does every span in this process (the
plain single-process reader the Spark benchmark compares against).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from rmqha.store import _record
from rmqha.store._record import (
    BLANK_MAGIC,
    Blank,
    RecordError,
    format_host,
    is_record_start,
    parse_record,
    read_header,
    record_body_length,
    record_starts,
    record_topic,
    walk_headers,
)
from rmqha.pipeline.stores import PlanError, Segment, SegmentReader, Store, resolve

__all__ = [
    "DEFAULT_SPLIT_BYTES",
    "PlanError",
    "SCHEMA_DDL",
    "Span",
    "arrow_schema",
    "hop",
    "walk",
    "plan",
    "project",
    "read_span",
    "scan",
    "schema_ddl",
]

#: The DataFrame schema, as Spark DDL.  The timestamps are Spark's
#: C{timestamp} (an instant; Arrow microseconds, UTC) from RocketMQ's epoch
#: milliseconds (L{_instants}).
SCHEMA_DDL = (
    "offset long, size int, topic string, queue_id int, queue_offset long, "
    "flag int, sysflag int, born_timestamp timestamp, store_timestamp timestamp, "
    "born_host string, store_host string, reconsume_times int, "
    "prepared_tx_offset long, properties map<string,string>, tags string, "
    "keys string, body binary, body_size int, crc_ok boolean"
)



def schema_ddl(columns: Sequence[str]) -> str:
    """
    L{SCHEMA_DDL} for C{columns} only, in that order: the schema that makes
    the Spark source build those columns alone (C{spark.read.schema}).

    @raise PlanError: a name that is not a column.
    """
    types = dict(part.split(" ", 1) for part in SCHEMA_DDL.split(", "))
    for name in columns:
        if name not in types:
            raise PlanError(f"{name!r} is not a column of the commit log's rows")
    return ", ".join(f"{name} {types[name]}" for name in columns)


_HOP_BLOCK = 16 * 1024 * 1024
#: Sub-ranges of large segments aim at this many bytes (and the Spark
#: source packs small segments into partitions of about as many): a Spark
#: task costs tens of milliseconds besides its reading (docs/benchmarks.md).
DEFAULT_SPLIT_BYTES = 128 * 1024 * 1024


@dataclass(frozen=True)
class Span:
    """
    Record-aligned bytes C{[start, end)} of one segment of C{store}.  When
    C{exact} is true, C{end} is a record start (the next span's), and the
    last record must end exactly there; otherwise records end before
    C{end} (or at it).
    """

    store: Store
    segment: Segment
    start: int
    end: int
    exact: bool = False

    @property
    def base(self) -> int:
        return self.segment.base

    @property
    def path(self) -> str:
        """
        The segment's location, for messages.
        """
        return self.store.location(self.segment)

    @property
    def offset(self) -> int:
        return self.base + self.start

    @property
    def end_offset(self) -> int:
        return self.base + self.end


def walk(reader: SegmentReader) -> Iterator[tuple[int, int]]:
    """
    C{(position, size)} of each message record of one open segment, from
    its start to where the records end (a BLANK filler, zero bytes, a
    header that is not a record, or a record running past the file),
    reading big blocks (one request each for a remote store).
    """
    size = reader.size
    position = 0
    buf = b""
    block_start = 0
    while position + 8 <= size:
        if position + 8 > block_start + len(buf):
            block_start = position
            buf = reader.read_at(position, _HOP_BLOCK)
            if len(buf) < 8:
                return
        starts, stop = walk_headers(buf, position - block_start, size - block_start)
        for start, end in zip(starts, starts[1:] + [stop]):
            yield block_start + start, end - start
        position = block_start + stop
        if stop + 8 <= len(buf):
            return  # not a record header


def hop(reader: SegmentReader, every: int) -> tuple[list[int], int]:
    """
    Walk the record headers of one open segment (L{walk}).

    @param every: the distance between the cut points wanted.
    @return: C{(cuts, end)}: record starts, the first at or after each
        multiple of C{every}; and the position where the records end.
    """
    cuts: list[int] = []
    next_cut = every
    end = 0
    for position, total in walk(reader):
        if position >= next_cut:
            cuts.append(position)
            next_cut = (position // every + 1) * every
        end = position + total
    return cuts, end


#: A record is at most this long (RocketMQ's maxMessageSize plus headers):
#: a search for the next record start never needs to look further.
MAX_RECORD = 4 * 1024 * 1024 + 64 * 1024
_SEARCH_BLOCK = 1024 * 1024
#: A whole search block (with its overlap) of zeros, which holds no record
#: start: comparing to it (memcmp) skips a segment's zero tail ~10x faster
#: than searching it for the magic (a broker's newest segment is mostly
#: zeros: 0.5 s per 470 MiB of them, on every plan).
_ZERO_BLOCK = bytes(_SEARCH_BLOCK + 40)


def find_record_start(
    reader: SegmentReader, base: int, position: int, limit: int
) -> int | None:
    """
    The first record start at or after segment position C{position} and
    before C{limit}, in the open segment C{reader} (which begins at
    commit-log offset C{base}); C{None} when there is none (only zeros, a
    BLANK, or the tail of one record lie there).  A candidate counts only
    if the record after it also checks out (or it ends at the segment's
    end, or a BLANK/zeros follow).
    """
    size = reader.size
    block_start = position
    while block_start < limit:
        # Overlap blocks by a header so a match across the seam is seen.
        data = reader.read_at(block_start, min(_SEARCH_BLOCK, limit - block_start) + 40)
        if not data:
            return None
        if data == _ZERO_BLOCK:
            block_start += _SEARCH_BLOCK
            continue
        candidates = record_starts(
            data, max(0, position - block_start), len(data), base + block_start,
            size - block_start,
        )
        for candidate in (block_start + p for p in candidates):
            if candidate < limit and _followed_by_record(reader, base, candidate, data, block_start):
                return candidate
        block_start += _SEARCH_BLOCK
    return None


def _followed_by_record(
    reader: SegmentReader, base: int, start: int, data: bytes, data_start: int
) -> bool:
    """
    Does a record (or the segment's end, a BLANK, zeros) follow the
    candidate record at C{start}?  Reads from C{data} (the block read at
    C{data_start}) when it holds the bytes, so a search over a remote
    store costs one request per block, not one per candidate.
    """
    size = reader.size

    def at(position: int, length: int) -> bytes:
        i = position - data_start
        if 0 <= i and i + length <= len(data):
            return data[i : i + length]
        return reader.read_at(position, length)

    total, _ = read_header(at(start, 8))
    after = start + total
    if after >= size:
        return after == size
    follow = at(after, min(40, size - after))
    if len(follow) < 8:
        return True
    follower, magic = read_header(follow)
    if magic == BLANK_MAGIC:
        return after + follower == size
    if follower == 0 and magic == 0:
        return True  # the log ends there
    return is_record_start(follow, 0, base + after, size - after)


def contiguous(store: Store, segments: Sequence[Segment]) -> None:
    """
    Refuse a store whose segment files are not one after another at the
    segment size (the largest file's): a segment missing between two
    others would have its rows read past silently.  The JVM reader's
    C{HadoopStore.segments} says the same, in the same words.

    @raise PlanError: naming the store and the offsets no file holds.
    """
    size = max((s.size for s in segments), default=0)
    for a, b in zip(segments, segments[1:]):
        if b.base > a.base + size:
            raise PlanError(
                f"{store}: missing segment: no segment file holds offsets {a.base + size}.."
                f"{b.base} (between {a.name} and {b.name}; segments are {size} bytes): "
                "the store is incomplete"
            )
        if b.base < a.base + size:
            raise PlanError(
                f"{store}: segment files overlap: {b.name} starts before {a.name}'s "
                f"{size} bytes end (at {a.base + size}): not one commit log"
            )


def plan(
    store: "Store | str",
    split_bytes: int = DEFAULT_SPLIT_BYTES,
    start_offset: int | None = None,
    end_offset: int | None = None,
) -> list[Span]:
    """
    The spans covering the records of C{store} (a L{Store} or a location)
    whose offsets lie in C{[start_offset, end_offset)}: one per segment,
    segments larger than C{split_bytes} cut at record boundaries about
    every C{split_bytes}.  A span never starts in the middle of a record;
    an offset range edge inside a record moves to the next record.  A
    whole segment no larger than C{split_bytes} is planned without reading
    a byte of it.
    """
    if split_bytes <= 0:
        raise PlanError(f"split size {split_bytes} must be positive")
    store = resolve(store)
    spans: list[Span] = []
    segments = store.segments()
    contiguous(store, segments)
    for segment in segments:
        base, size = segment.base, segment.size
        if end_offset is not None and base >= end_offset:
            break
        if start_offset is not None and base + size <= start_offset:
            continue
        first = 0 if start_offset is None or start_offset <= base else start_offset - base
        last = size if end_offset is None or end_offset >= base + size else end_offset - base
        if first == 0 and last >= size and size <= split_bytes:
            spans.append(Span(store, segment, 0, size))
            continue
        with store.open(segment) as f:
            if first > 0:
                found = find_record_start(f, base, first, size)
                if found is None:
                    continue
                first = found
            cuts = [first]
            exact_last = False
            nominal = (first // split_bytes + 1) * split_bytes
            while nominal < last:
                found = find_record_start(f, base, nominal, size)
                if found is None:
                    break  # no record starts after here: the data ends
                if found >= last:
                    break
                cuts.append(found)
                nominal = (found // split_bytes + 1) * split_bytes
            end = last
            if last < size:
                found = find_record_start(f, base, last, size)
                if found is not None:
                    end, exact_last = found, True
                else:
                    end = min(size, last + MAX_RECORD)
            ends = [*cuts[1:], end]
            for i, (a, b) in enumerate(zip(cuts, ends)):
                exact = i < len(cuts) - 1 or exact_last
                if b > a:
                    spans.append(Span(store, segment, a, b, exact))
    return spans


def _valid_record_after(data: Any, position: int, length: int, base: int) -> int | None:
    """
    The offset of the first record start after the bad record at
    C{position} of C{data} (which starts at offset C{base} and holds what
    is left of the span): a header passing L{is_record_start} (its magic,
    a TOTALSIZE that fits, its own offset as PHYSICALOFFSET) whose record
    is followed by the span's end, zeros, a BLANK filler to the end, or
    another such header; C{None} for a torn tail, with nothing after it.
    (The JVM span reader's C{validRecordAfter} is its transcription.)
    """
    buf = data if isinstance(data, (bytes, bytearray)) else bytes(data)  # (find)
    for p in record_starts(buf, position + 1, length, base, length):
        after = p + read_header(buf, p)[0]
        if length - after < 8:
            return base + p
        follower, magic = read_header(buf, after)
        if (
            (magic == BLANK_MAGIC and after + follower == length)
            or (follower == 0 and magic == 0)
            or is_record_start(buf, after, base, length)
        ):
            return base + p
    return None


def _is_zero_or_short(view: memoryview, position: int) -> bool:
    return len(view) - position < 8 or not any(view[position : position + 8])


def arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("offset", pa.int64()),
            ("size", pa.int32()),
            ("topic", pa.string()),
            ("queue_id", pa.int32()),
            ("queue_offset", pa.int64()),
            ("flag", pa.int32()),
            ("sysflag", pa.int32()),
            ("born_timestamp", pa.timestamp("us", tz="UTC")),
            ("store_timestamp", pa.timestamp("us", tz="UTC")),
            ("born_host", pa.string()),
            ("store_host", pa.string()),
            ("reconsume_times", pa.int32()),
            ("prepared_tx_offset", pa.int64()),
            ("properties", pa.map_(pa.string(), pa.string())),
            ("tags", pa.string()),
            ("keys", pa.string()),
            ("body", pa.binary()),
            ("body_size", pa.int32()),
            ("crc_ok", pa.bool_()),
        ]
    )


def project(columns: Sequence[str] | None) -> Any:
    """
    The schema of L{read_span}'s batches for C{columns}: those columns of
    C{arrow_schema()}, in that order (all of them for C{None}).

    @raise PlanError: a name that is not a column, or a column twice.
    """
    schema = arrow_schema()
    if columns is None:
        return schema
    names = list(columns)
    for name in names:
        if name not in schema.names:
            raise PlanError(
                f"{name!r} is not a column of the commit log's rows "
                f"(they are: {', '.join(schema.names)})"
            )
    if len(set(names)) != len(names):
        raise PlanError(f"a column is named twice in {', '.join(names)}")
    import pyarrow as pa

    return pa.schema([schema.field(name) for name in names])


def read_span(
    span: Span,
    bodies: bool = True,
    topics: Sequence[str] | None = None,
    batch_rows: int = 8192,
    columns: Sequence[str] | None = None,
) -> Iterator[Any]:
    """
    The records of C{span} as Arrow record batches (C{arrow_schema()}, or
    C{project(columns)}).

    @param bodies: C{False} leaves C{body} null (C{body_size} and
        C{crc_ok} are still filled): far less to move when bodies are not
        needed.
    @param topics: only records of these topics; others are skipped after
        reading just their topic, before any other decoding.
    @param columns: only these columns, in this order (L{project}): the
        others are not built, and bodies are not copied unless C{body} is
        among them.  Spark's JVM turns every column it is given into rows,
        needed or not (docs/benchmarks.md, "Where the time goes: Spark").
    """
    import pyarrow as pa

    out = project(columns)
    if columns is not None and "body" not in columns:
        bodies = False
    schema = arrow_schema()
    wanted = None if topics is None else {t.encode() for t in topics}
    # The compiled decoder takes the plain records (IPv4 hosts, ASCII topic
    # and properties) straight into column buffers; the loop below takes
    # each record it stops at, and every record when topics are filtered.
    fast = _record._accel if wanted is None else None
    done = 0  # where the plain records end, from span.start
    span_length = span.end - span.start
    rest: list[tuple[Any, bool]] = []  # what the blocks read after the plain records
    with span.store.open(span.segment) as f:
        if fast is not None:
            # Block by block while the records are plain: a block of a few
            # MiB is read several times faster than one span-sized read
            # into fresh memory (page faults), and stays in the CPU caches;
            # a remote store reads the next blocks meanwhile.  (Closed
            # before the reader is, whatever stops the loop.)
            with closing(
                _plain_blocks(f, span, bodies, batch_rows, fast, pa, out, rest)
            ) as plain:
                for batch, done in plain:
                    yield batch
        # The rest (from the first record that is not plain, if any) in one
        # read, as the record loop needs to judge it against the span's end;
        # nothing when the records end there (zeros: a broker's newest
        # segment is mostly zeros, which the loop below would read whole
        # only to stop at their first 8 bytes).
        data: Any = b""
        tail, whole = rest[0] if rest else (b"", False)
        if len(tail) >= 8 and not any(tail[:8]):
            pass  # zeros: the records end
        elif whole:
            data = tail if len(tail) >= 8 else b""
        elif done < span_length:
            head = f.read_at(span.start + done, min(8, span_length - done))
            if len(head) == 8 and any(head):
                data = _records_until_zeros(f, span.start + done, span_length - done)
    view = memoryview(data)
    length = len(data)
    values_of: dict[str, list[Any]] = {name: [] for name in schema.names}
    keys: list[str] = []
    values: list[str] = []
    map_offsets = [0]
    (offset_c, size_c, topic_c, queue_c, qoff_c, flag_c, sysflag_c, born_c, store_c,
     bhost_c, shost_c, recons_c, prep_c, _, tags_c, keys_c, body_c, bsize_c,
     crc_c) = (values_of[n] for n in schema.names)
    position = 0
    base = span.base + span.start + done
    while position < length:
        if fast is not None:
            stop, rows, buffers = fast.decode_span(
                view, position, length, base, bodies, batch_rows
            )
            if rows:
                if offset_c:  # rows decoded below go first, in order
                    yield _batch(pa, out, values_of, keys, values, map_offsets)
                    for column in values_of.values():
                        column.clear()
                    keys.clear()
                    values.clear()
                    map_offsets[:] = [0]
                yield _column_batch(pa, out, rows, buffers, bodies)
                position = stop
                continue
        if wanted is not None:
            topic = record_topic(view, position, length)
            if topic is not None and topic not in wanted:
                position += read_header(view, position)[0]
                continue
        try:
            record = parse_record(
                view,
                position,
                length,
                base + position,
                check_crc=False,
                with_body=bodies,
                report_crc=True,
                strict=True,
            )
        except RecordError as e:
            if _is_zero_or_short(view, position):
                break  # where records stop: zeros
            if span.exact:
                # The next span starts at span.end: a record running past
                # it means the cut was not a record start.
                raise PlanError(
                    f"{span.path}: the record at offset {base + position} runs past "
                    f"the partition boundary at offset {span.end_offset}: {e}"
                ) from None
            following = _valid_record_after(data, position, length, base)
            if following is not None:
                # Not a torn tail: damage, and dropping the records after
                # it would be a silent loss.
                raise PlanError(
                    f"{span.path}: {e}; valid records follow at offset {following}: "
                    "the store is damaged ('rmqha store check' says where, 'rmqha "
                    "store repair' mends it from a replica)"
                ) from None
            break  # where records stop: a torn record
        if isinstance(record, Blank):
            break
        body_size = len(record.body) if bodies else record_body_length(view, position)
        position += record.size
        offset_c.append(record.offset)
        size_c.append(record.size)
        topic_c.append(record.topic)
        queue_c.append(record.queue_id)
        qoff_c.append(record.queue_offset)
        flag_c.append(record.flag)
        sysflag_c.append(record.sysflag)
        born_c.append(record.born_timestamp)
        store_c.append(record.store_timestamp)
        bhost_c.append(format_host(record.born_host))
        shost_c.append(format_host(record.store_host))
        recons_c.append(record.reconsume_times)
        prep_c.append(record.prepared_tx_offset)
        properties = record.properties
        keys.extend(properties)
        values.extend(properties.values())
        map_offsets.append(len(keys))
        tags_c.append(properties.get("TAGS"))
        keys_c.append(properties.get("KEYS"))
        body_c.append(record.body if bodies else None)
        bsize_c.append(body_size)
        crc_c.append(record.crc_ok)
        if len(offset_c) >= batch_rows:
            yield _batch(pa, out, values_of, keys, values, map_offsets)
            for column in values_of.values():
                column.clear()
            keys.clear()
            values.clear()
            map_offsets[:] = [0]
    if offset_c:
        yield _batch(pa, out, values_of, keys, values, map_offsets)


#: How much of a span L{read_span} reads at a time while records are
#: plain, at least (the reader's C{block_size} when larger: a remote store).
_READ_BLOCK = 4 * 1024 * 1024


def _records_until_zeros(f: SegmentReader, start: int, length: int) -> bytearray:
    """
    The C{length} bytes from C{start} (a record start) for the record loop
    of L{read_span}, read block by block and only as far as the records go
    when they end in zeros (a broker's preallocated segment): the pure
    codec's path and a topic filter's do not read the tail, whatever its
    size.  Where the header hop meets anything else (a BLANK filler, a
    damaged header), the rest is read whole: the record loop judges it.
    """
    buf = bytearray()
    position = 0  # the next record header, from start
    while len(buf) < length:
        block = f.read_at(start + len(buf), min(_READ_BLOCK, length - len(buf)))
        if not block:
            break
        buf += block
        _, position = walk_headers(buf, position, length)
        if position + 8 <= len(buf):
            # The hop stopped at what is not a record header.
            if not any(buf[position : position + 8]):
                del buf[position:]
                break
            buf += f.read_at(start + len(buf), length - len(buf))
            break
    return buf


def _plain_blocks(
    f: SegmentReader,
    span: Span,
    bodies: bool,
    batch_rows: int,
    fast: Any,
    pa: Any,
    schema: Any,
    rest: list[Any],
) -> Generator[tuple[Any, int], None, None]:
    """
    The plain records from the start of C{span}, read a block at a time
    (L{SegmentReader.blocks}: a remote store's next blocks travel while
    this one is decoded) and decoded by the compiled decoder: C{(batch,
    end)} pairs, C{end} being where the records of C{batch} end, from
    C{span.start}.  Stops at the span's end or at the first record the
    decoder does not take (which the caller's record loop then judges).
    A record cut by a block's end is decoded on its own from its two (or
    more) pieces joined: the only bytes copied (a local file's blocks are
    read into one buffer, L{SegmentReader.blocks}'s C{reuse}, so a piece
    is copied out before the next block is read).  C{rest} gets the bytes
    read after the last record decoded, and whether they reach the span's
    end (the caller then asks the store for nothing more, nor when they
    begin with zeros: a remote store's request may cost far more than its
    bytes).
    """
    length = span.end - span.start
    block_size = max(_READ_BLOCK, f.block_size)
    done = 0  # where the records decoded so far end, from span.start
    carry: list[bytes] = []  # bytes from `done` on of a record cut by a block's end
    carried = 0
    block_at = 0  # where the current block starts, from span.start
    with closing(f.blocks(span.start, span.end, block_size, reuse=True)) as blocks:
        for block in blocks:
            view = memoryview(block)
            try:
                at = 0  # where this block's undecoded bytes start
                if carried:
                    # The record cut by the previous block's end: its header,
                    # then its length (a record longer than a block spans more).
                    first = carry[0] if len(carry[0]) >= 8 else b"".join(carry)
                    head = (first + block[:8])[:8] if len(first) < 8 else first[:8]
                    if len(head) < 8:
                        carry.append(bytes(block))  # (the block's memory is reused)
                        carried += len(block)
                        block_at += len(block)
                        continue  # (the file ends)
                    total = read_header(head)[0]
                    if not carried < total <= length - done:
                        return  # not a record: the caller judges it
                    missing = total - carried
                    if missing > len(block):
                        carry.append(bytes(block))
                        carried += len(block)
                        block_at += len(block)
                        continue
                    record = b"".join(carry) + block[:missing]
                    carry, carried = [], 0
                    base = span.base + span.start + done
                    stop, rows, buffers = fast.decode_span(
                        memoryview(record), 0, total, base, bodies, batch_rows
                    )
                    if rows != 1 or stop != total:
                        return
                    done += total
                    yield _column_batch(pa, schema, rows, buffers, bodies), done
                    at = missing
                base = span.base + span.start + block_at
                while True:
                    stop, rows, buffers = fast.decode_span(view, at, len(block), base, bodies, batch_rows)
                    if not rows:
                        break
                    at = stop
                    done = block_at + at
                    yield _column_batch(pa, schema, rows, buffers, bodies), done
                block_at += len(block)
                if block_at >= length:
                    rest.append((view[at:], True))  # the caller judges it
                    return
                if at >= len(block):
                    continue  # a clean cut
                left = len(block) - at
                if left >= 8:
                    total = read_header(view, at)[0]
                    if not left < total <= length - done:
                        rest.append((view[at:], False))
                        return  # not a record cut by the block's end
                carry, carried = [bytes(view[at:])], left
            finally:
                # Dropped before the next is asked for: with the blocks
                # read ahead, at most prefetch + 1 in memory.
                del block, view
    if carried:
        rest.append((b"".join(carry), True))  # the file ends before the span does


def _column_batch(pa: Any, schema: Any, rows: int, buffers: tuple[Any, ...], bodies: bool) -> Any:
    """
    An Arrow record batch of C{schema}'s columns (all or some of
    C{arrow_schema()}'s) from the compiled decoder's column buffers
    (C{_speedups.decode_span}: little-endian values, int32 offsets, LSB-first
    bitmaps), without a Python object per record and without copying them
    (C{pa.py_buffer} reads a C{ColumnBuffer} where it is).
    """
    (offset, queue_offset, born, store, prepared, size, queue_id, flag, sysflag,
     reconsume, body_size, crc_ok, topic_offsets, topic, born_offsets, born_host,
     store_offsets, store_host, map_offsets, key_offsets, key_data, value_offsets,
     value_data, tags_valid, tags_offsets, tags, keys_valid, keys_offsets, keys,
     body_offsets, body) = buffers

    def fixed(kind: Any, data: Any) -> Any:
        return pa.Array.from_buffers(kind, rows, [None, pa.py_buffer(data)])

    def text(offsets: Any, data: Any, valid: Any = None, count: int = rows) -> Any:
        return pa.Array.from_buffers(
            pa.string(),
            count,
            [None if valid is None else pa.py_buffer(valid), pa.py_buffer(offsets), pa.py_buffer(data)],
        )

    def properties() -> Any:
        pairs = len(key_offsets) // 4 - 1  # key offsets: one more than the keys
        return pa.MapArray.from_arrays(
            pa.Array.from_buffers(pa.int32(), rows + 1, [None, pa.py_buffer(map_offsets)]),
            text(key_offsets, key_data, count=pairs),
            text(value_offsets, value_data, count=pairs),
        )

    build: dict[str, Callable[[], Any]] = {
        "offset": lambda: fixed(pa.int64(), offset),
        "size": lambda: fixed(pa.int32(), size),
        "topic": lambda: text(topic_offsets, topic),
        "queue_id": lambda: fixed(pa.int32(), queue_id),
        "queue_offset": lambda: fixed(pa.int64(), queue_offset),
        "flag": lambda: fixed(pa.int32(), flag),
        "sysflag": lambda: fixed(pa.int32(), sysflag),
        "born_timestamp": lambda: _instants(pa, fixed(pa.int64(), born)),
        "store_timestamp": lambda: _instants(pa, fixed(pa.int64(), store)),
        "born_host": lambda: text(born_offsets, born_host),
        "store_host": lambda: text(store_offsets, store_host),
        "reconsume_times": lambda: fixed(pa.int32(), reconsume),
        "prepared_tx_offset": lambda: fixed(pa.int64(), prepared),
        "properties": properties,
        "tags": lambda: text(tags_offsets, tags, tags_valid),
        "keys": lambda: text(keys_offsets, keys, keys_valid),
        "body": lambda: (
            pa.Array.from_buffers(
                pa.binary(), rows, [None, pa.py_buffer(body_offsets), pa.py_buffer(body)]
            )
            if bodies
            else pa.nulls(rows, pa.binary())
        ),
        "body_size": lambda: fixed(pa.int32(), body_size),
        "crc_ok": lambda: fixed(pa.bool_(), crc_ok),
    }
    return pa.RecordBatch.from_arrays([build[name]() for name in schema.names], schema=schema)


def _batch(
    pa: Any,
    schema: Any,
    columns: dict[str, list[Any]],
    keys: list[str],
    values: list[str],
    map_offsets: list[int],
) -> Any:
    arrays = []
    for field in schema:
        if field.name == "properties":
            arrays.append(
                pa.MapArray.from_arrays(
                    pa.array(map_offsets, pa.int32()),
                    pa.array(keys, pa.string()),
                    pa.array(values, pa.string()),
                )
            )
        elif field.name in ("born_timestamp", "store_timestamp"):
            arrays.append(_instants(pa, pa.array(columns[field.name], pa.int64())))
        else:
            arrays.append(pa.array(columns[field.name], field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


#: The epoch milliseconds a timestamp column holds: those whose
#: microseconds fit Arrow's (and Spark's) int64 (about 292,000 years
#: either side of 1970); a record's field outside is garbage, and null.
_MILLIS_RANGE = (-(2**63) // 1000 + 1, (2**63 - 1) // 1000)


def _instants(pa: Any, millis: Any) -> Any:
    """
    A column of epoch milliseconds (int64, as RocketMQ stores them) as
    Arrow's C{timestamp("us", "UTC")}: Spark's C{timestamp} type, which its
    Python data source takes only in microseconds.  One multiplication per
    batch; a value whose microseconds would overflow (L{_MILLIS_RANGE}) is
    null.
    """
    import pyarrow.compute as pc

    kind = pa.timestamp("us", tz="UTC")
    low, high = pc.min_max(millis).values()
    if len(millis) and not (_MILLIS_RANGE[0] <= low.as_py() and high.as_py() <= _MILLIS_RANGE[1]):
        outside = pc.or_(pc.less(millis, _MILLIS_RANGE[0]), pc.greater(millis, _MILLIS_RANGE[1]))
        millis = pc.if_else(outside, pa.scalar(None, pa.int64()), millis)
    return pc.multiply(millis, 1000).view(kind)


def scan(
    store_dir: "Store | str",
    bodies: bool = True,
    topics: Sequence[str] | None = None,
    split_bytes: int = DEFAULT_SPLIT_BYTES,
    columns: Sequence[str] | None = None,
) -> Iterator[Any]:
    """
    Every record of the store as Arrow batches, in offset order, in this
    process (only C{columns}, when given: L{read_span}).
    """
    for span in plan(store_dir, split_bytes):
        yield from read_span(span, bodies, topics, columns=columns)

