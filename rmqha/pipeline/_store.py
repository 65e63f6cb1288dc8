# -*- test-case-name: tests.test_pipeline_stores -*-
"""
What every pipeline store is (L{Store}, L{Segment}, L{SegmentReader} with
its read-ahead), without any store kind: L{rmqha.pipeline.stores} (local
files, pyarrow.fs, the resolver) and L{rmqha.pipeline.httpstore} (a live
broker) both build on it.
"""

from __future__ import annotations

import re
import socket
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Generator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType

#: A segment file's name: its start offset, 20 digits.
SEGMENT_NAME = re.compile(r"[0-9]{20}\Z")


class PlanError(ValueError):
    """
    A store location cannot be used (the message names it and says why):
    not a commit log, an unknown scheme, a bad option.
    """


@dataclass(frozen=True, order=True)
class Segment:
    """
    One segment file: commit-log offset C{base} of its first byte, its
    20-digit C{name}, and its length in bytes.
    """

    base: int
    name: str
    size: int


class SegmentReader(ABC):
    """
    Random access to one open segment file.  Use as a context manager.
    """

    #: The file's length.
    size: int
    #: How many bytes a sequential reader should ask for at once: small
    #: for a local file (page cache), large for a remote one, where every
    #: read is a request (and an object store may cost the whole object's
    #: size per ranged request).
    block_size: int = 4 * 1024 * 1024
    #: How many blocks L{blocks} reads ahead of the one its caller is
    #: working on, each on its own thread and request: 0 for a local file
    #: (the page cache is faster than a thread hand-off); a remote store's
    #: bytes then travel while the previous block is decoded.
    prefetch: int = 0

    @abstractmethod
    def read_at(self, position: int, length: int) -> bytes:
        """
        C{length} bytes from C{position}; fewer only where the file ends.
        Safe to call from several threads at once (L{blocks} does, when
        C{prefetch} is set).

        @raise OSError: the bytes could not be read (C{filename} says which).
        """

    def read_into(self, position: int, buffer: memoryview) -> int | None:
        """
        Read C{len(buffer)} bytes from C{position} into C{buffer} (fewer
        only where the file ends) and say how many; C{None} from a reader
        that only hands out bytes of its own (L{read_at}: every remote
        one), which is this default.

        @raise OSError: the bytes could not be read (C{filename} says which).
        """
        return None

    def blocks(
        self, start: int, end: int, size: int, reuse: bool = False
    ) -> Generator["bytes | memoryview", None, None]:
        """
        Bytes C{start} to C{end} as consecutive blocks of C{size} bytes
        (the last one shorter; the blocks stop early where the file ends).
        With C{prefetch} set, the next C{prefetch} blocks are read on
        threads while the caller works on the one it got: at most
        C{prefetch + 1} blocks are in memory at once (those being read and
        the one handed out) if the caller drops each block before asking
        for the next, as L{rmqha.pipeline.scan.read_span} does;
        C{prefetch + 2} if it holds on to it.  A block that could not be read raises its
        C{OSError} when the caller reaches it, not before.  Closing the
        iterator (or dropping it) cancels the reads not started and waits
        for those under way: no thread outlives it.

        @param reuse: without read-ahead, from a reader that reads into
            memory it is given (L{read_into}: a local file), every block
            is read into the same buffer: a block is then good only until
            the next is asked for, and the caller copies what it keeps.
            (Fresh memory for every block cost a local scan ~10 % of its
            CPU in page faults: docs/benchmarks.md.)
        """
        if size <= 0:
            raise ValueError(f"block size {size} is not positive")
        if self.prefetch <= 0:
            buffer = memoryview(bytearray(min(size, max(0, end - start)))) if reuse else None
            position = start
            while position < end:
                want = min(size, end - position)
                data: "bytes | memoryview | None" = None
                if buffer is not None:
                    got = self.read_into(position, buffer[:want])
                    if got is None:
                        buffer = None  # this reader hands out its own bytes
                    else:
                        data = buffer[:got]
                if data is None:
                    data = self.read_at(position, want)
                if data:
                    yield data
                if len(data) < want:
                    return
                position += want
            return
        yield from _read_ahead(self, start, end, size, self.prefetch)

    def close(self) -> None:
        """
        Release the file (or connection).
        """

    def __enter__(self) -> "SegmentReader":
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _read_ahead(
    reader: SegmentReader, start: int, end: int, size: int, depth: int
) -> Generator[bytes, None, None]:
    """
    L{SegmentReader.blocks} with C{depth} reads under way ahead of the
    caller, on a pool of C{depth} threads of its own.
    """
    positions = iter(range(start, end, size))
    pending: deque[tuple[int, Future[bytes]]] = deque()
    pool = ThreadPoolExecutor(max_workers=depth, thread_name_prefix="rmqha-prefetch")

    def submit() -> None:
        position = next(positions, None)
        if position is not None:
            want = min(size, end - position)
            pending.append((want, pool.submit(reader.read_at, position, want)))

    try:
        for _ in range(depth):
            submit()
        while pending:
            want, future = pending.popleft()
            submit()
            data = future.result()  # (its OSError, if the read failed)
            del future
            if data:
                yield data
            if len(data) < want:
                return  # the file ends here
            del data
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class Store(ABC):
    """
    A commit log somewhere, as the driver resolved it: small and picklable
    (a task carries it to an executor, which opens segments there).
    """

    #: The resolved location, as shown in messages (absolute; no secret).
    uri: str

    @property
    def load_location(self) -> str:
        """
        The location to hand to C{spark.read...load()}: resolved again
        there to this same store (with any credentials it holds).
        """
        return self.uri

    @abstractmethod
    def segments(self) -> list[Segment]:
        """
        The segment files, in offset order.

        @raise PlanError: this is not a commit log.
        @raise OSError: it could not be listed.
        """

    @abstractmethod
    def open(self, segment: Segment) -> SegmentReader:
        """
        Open C{segment} for reading.

        @raise OSError: it could not be opened.
        """

    def location(self, segment: Segment) -> str:
        """
        Where C{segment} is, for messages.
        """
        return f"{self.uri.rstrip('/')}/{segment.name}"

    def max_offset(self) -> int | None:
        """
        Where whole records end, when the store knows it without reading
        (a live broker says so); C{None}: find it by reading.
        """
        return None

    def __str__(self) -> str:
        return self.uri


def unreadable(location: str, e: OSError) -> str:
    """
    One line: C{location} could not be read on this host (an executor's,
    when called in a task), and why.
    """
    return f"cannot read {location} on host {socket.gethostname()}: {e.strerror or e}"
