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

import errno
import os
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

from rmqha.pipeline._store import (
    SEGMENT_NAME,
    PlanError,
    Segment,
    SegmentReader,
    Store,
    unreadable,
)
from rmqha.pipeline.httpstore import HttpStore

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

    def read_into(self, position: int, buffer: memoryview) -> int:
        done = 0
        try:
            while done < len(buffer):
                got = os.preadv(self._fd, [buffer[done:]], position + done)
                if not got:
                    break
                done += got
        except OSError as e:
            e.filename = self.path
            raise
        return done

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
            if not SEGMENT_NAME.match(name):
                continue
            if not os.path.isfile(path):
                # (Skipping it would leave a hole every job reads past.)
                kind = "a directory" if os.path.isdir(path) else "not a regular file"
                raise OSError(errno.EISDIR, f"{kind}, not a segment file", path)
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
            if e.filename:  # (ours: a segment that is not a file, named)
                raise
            raise OSError(e.errno, " ".join(str(e).split()), self.uri) from None

    def _list(self) -> tuple[str, list[Any]]:
        from pyarrow import fs as pafs

        fs, root = self._filesystem()
        for directory in (f"{root}/commitlog", root):
            info = fs.get_file_info(directory)
            if info.type != pafs.FileType.Directory:
                continue
            entries = fs.get_file_info(pafs.FileSelector(directory))
            named = [e for e in entries if SEGMENT_NAME.match(e.base_name)]
            for e in named:
                if e.type != pafs.FileType.File:
                    # (Skipping it would leave a hole every job reads past.)
                    raise OSError(
                        errno.EISDIR, "a directory, not a segment file", f"{directory}/{e.base_name}"
                    )
            files = named
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
        return HttpStore.from_location(location, options)
    return ArrowStore(location)
