# -*- test-case-name: tests.test_pipeline_stores -*-
"""
Where the pipeline reads a commit log from.

A store's location is resolved once, on the driver (L{resolve}), into a
small picklable L{Store} that every executor opens segment by segment:

    /data/store, ./store          a local path, made absolute on the driver
                                  (executors run in their worker's
                                  directory); every executor needs it at the
                                  same path (a shared filesystem)
    file:///data/store            the same, as a URI
    s3://bucket/prefix/store      anything C{pyarrow.fs} opens by URI (S3 and
    gs://..., hdfs://...          S3-compatible servers, GCS, HDFS), with the
                                  usual credentials from the environment and
                                  config files (AWS_ACCESS_KEY_ID, ~/.aws, ...)
    rmqha+http://HOST:PORT        a live broker's admin HTTP (read-only byte
    rmqha+https://HOST:PORT       ranges of its segment files; docs/admin.md)

A store root holds a C{commitlog} directory, or is one (segment files named
by their 20-digit start offset).  Readers only read: nothing here writes.
A read that fails is an C{OSError} whose C{filename} names the segment's
location; callers add the host (L{unreadable}).
"""

from __future__ import annotations

import os
import re
import socket
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Generator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Mapping
from urllib.parse import urlsplit

__all__ = [
    "Segment",
    "SegmentReader",
    "Store",
    "LocalStore",
    "ArrowStore",
    "PlanError",
    "resolve",
    "unreadable",
    "SEGMENT_NAME",
]

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

    def blocks(self, start: int, end: int, size: int) -> Generator[bytes, None, None]:
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
        """
        if size <= 0:
            raise ValueError(f"block size {size} is not positive")
        if self.prefetch <= 0:
            position = start
            while position < end:
                want = min(size, end - position)
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


# -- local files -------------------------------------------------------------


class _FileReader(SegmentReader):
    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY)
        try:
            self.size = os.fstat(self._fd).st_size
        except BaseException:
            os.close(self._fd)
            raise

    def read_at(self, position: int, length: int) -> bytes:
        try:
            chunks = []
            while length > 0:
                data = os.pread(self._fd, length, position)
                if not data:
                    break
                chunks.append(data)
                position += len(data)
                length -= len(data)
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        except OSError as e:
            e.filename = self.path
            raise

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class LocalStore(Store):
    """
    A store on a local (or shared) filesystem, by absolute path.
    """

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.uri = self.root
        #: Where the segment files were listed (the executors open them
        #: there, whatever they see).
        self._directory: str | None = None

    def directory(self) -> str:
        """
        The directory holding the segment files.
        """
        nested = os.path.join(self.root, "commitlog")
        if os.path.isdir(nested):
            return nested
        if not os.path.isdir(self.root):
            raise PlanError(f"{self.root}: no such directory")
        if any(SEGMENT_NAME.match(n) for n in os.listdir(self.root)):
            return self.root
        raise PlanError(f"{self.root}: no commitlog directory and no segment files")

    def segments(self) -> list[Segment]:
        directory = self._directory = self.directory()
        out = []
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            if SEGMENT_NAME.match(name) and os.path.isfile(path):
                out.append(Segment(int(name), name, os.path.getsize(path)))
        return out

    def path(self, segment: Segment) -> str:
        """
        The segment's file path on this host.
        """
        directory = self._directory
        if directory is None:
            nested = os.path.join(self.root, "commitlog")
            directory = nested if os.path.isdir(nested) else self.root
        return os.path.join(directory, segment.name)

    def location(self, segment: Segment) -> str:
        return self.path(segment)

    def open(self, segment: Segment) -> SegmentReader:
        return _FileReader(self.path(segment))


# -- pyarrow.fs: S3, GCS, HDFS, ... ------------------------------------------


class _ArrowReader(SegmentReader):
    # Large blocks: an S3-compatible server may pay about the whole
    # object's size for every ranged GET (moto's does); one block read
    # ahead (a span larger than a block: 1 GiB segments, 128 MiB spans),
    # so at most 128 MiB per reader.
    block_size = 64 * 1024 * 1024
    prefetch = 1

    def __init__(self, handle: Any, location: str) -> None:
        self._handle = handle
        self.location = location
        self.size = int(handle.size())

    def read_at(self, position: int, length: int) -> bytes:
        length = max(0, min(length, self.size - position))
        if length == 0:
            return b""
        try:
            data = self._handle.read_at(length, position)
        except OSError as e:
            raise OSError(e.errno, str(e), self.location) from None
        return data if isinstance(data, bytes) else bytes(data)

    def close(self) -> None:
        self._handle.close()


class ArrowStore(Store):
    """
    A store that C{pyarrow.fs} reaches by URI (C{s3://bucket/prefix/store},
    C{gs://...}, C{hdfs://...}).  Credentials and endpoints come from the
    environment and config files, as for any Arrow or AWS client
    (C{AWS_ACCESS_KEY_ID}, C{AWS_SECRET_ACCESS_KEY}, C{AWS_ENDPOINT_URL},
    C{~/.aws/config}, ...), or from the URI's query (C{?endpoint_override=
    HOST:PORT&scheme=http}).  The filesystem is opened again on each
    executor from the URI: nothing secret is pickled.
    """

    def __init__(self, uri: str) -> None:
        #: The URI as given: what the filesystem is opened from.
        self.full_uri = uri
        self.uri = _redacted(uri)
        self._fs: Any = None
        self._root = ""
        self._directory: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"uri": self.full_uri, "directory": self._directory}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["uri"])  # type: ignore[misc]
        self._directory = state["directory"]

    def _filesystem(self) -> tuple[Any, str]:
        if self._fs is None:
            from pyarrow import fs

            try:
                self._fs, root = fs.FileSystem.from_uri(self.full_uri)
            except (ValueError, TypeError) as e:  # pyarrow.ArrowInvalid is a ValueError
                raise PlanError(f"{self.uri}: {e}") from None
            self._root = root.rstrip("/")
            if not self._root:
                raise PlanError(f"{self.uri}: names no bucket or directory")
        return self._fs, self._root

    def _listing(self) -> tuple[str, list[Any]]:
        try:
            return self._list()
        except (ValueError, TypeError) as e:
            if isinstance(e, PlanError):
                raise
            raise PlanError(f"{self.uri}: {' '.join(str(e).split())}") from None
        except OSError as e:
            # pyarrow's messages run over lines: one line, naming the store.
            raise OSError(e.errno, " ".join(str(e).split()), self.uri) from None

    def _list(self) -> tuple[str, list[Any]]:
        from pyarrow import fs as pafs

        fs, root = self._filesystem()
        for directory in (f"{root}/commitlog", root):
            info = fs.get_file_info(directory)
            if info.type != pafs.FileType.Directory:
                continue
            entries = fs.get_file_info(pafs.FileSelector(directory))
            files = [
                e for e in entries
                if e.type == pafs.FileType.File and SEGMENT_NAME.match(e.base_name)
            ]
            if files or directory == root:
                return directory, files
        raise PlanError(f"{self.uri}: no commitlog directory and no segment files")

    @property
    def load_location(self) -> str:
        return self.full_uri

    def segments(self) -> list[Segment]:
        directory, files = self._listing()
        if not files:
            raise PlanError(f"{self.uri}: no commitlog directory and no segment files")
        self._directory = directory
        return sorted(Segment(int(e.base_name), e.base_name, int(e.size)) for e in files)

    def open(self, segment: Segment) -> SegmentReader:
        fs, _ = self._filesystem()
        if self._directory is None:
            self._directory, _ = self._listing()
        path = f"{self._directory}/{segment.name}"
        location = self.location(segment)
        try:
            handle = fs.open_input_file(path)
        except OSError as e:
            raise OSError(e.errno, str(e), location) from None
        return _ArrowReader(handle, location)


def _redacted(uri: str) -> str:
    """
    C{uri} with any password (C{s3://KEY:SECRET@bucket/...}) and any
    secret-looking query value hidden, for messages.
    """
    parts = urlsplit(uri)
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.split(':', 1)[0]}:***@{host}" if ":" in user else f"{user}@{host}"
    query = "&".join(
        f"{k}=***" if any(w in k.lower() for w in ("secret", "token", "password", "key")) else
        f"{k}={v}" if sep else k
        for k, sep, v in (item.partition("=") for item in parts.query.split("&") if item)
    )
    if netloc == parts.netloc and query == parts.query:
        return uri  # (geturl() would not give back "s3://" itself)
    return parts._replace(netloc=netloc, query=query).geturl()


# -- resolving a location ------------------------------------------------------

_HTTP_SCHEMES = ("rmqha+http", "rmqha+https")


def resolve(location: "str | Store", options: Mapping[str, str] | None = None) -> Store:
    """
    The L{Store} at C{location} (a path or a URI, module docstring), as
    the driver sees it; C{options} are the data source's (TLS files for a
    live broker).  Lists nothing: a wrong location fails at first use.

    @raise PlanError: an unknown scheme, or a bad option.
    """
    if isinstance(location, Store):
        return location
    options = options or {}
    if not location:
        raise PlanError("no store location given")
    scheme = urlsplit(location).scheme.lower()
    if scheme == "" or (len(scheme) == 1 and os.name == "nt"):
        return LocalStore(location)
    if scheme == "file":
        parts = urlsplit(location)
        if parts.netloc not in ("", "localhost"):
            raise PlanError(f"{location}: a file: URI names no host")
        return LocalStore(parts.path)
    if scheme in _HTTP_SCHEMES:
        from rmqha.pipeline.httpstore import HttpStore

        return HttpStore.from_location(location, options)
    return ArrowStore(location)
