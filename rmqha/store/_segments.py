# -*- test-case-name: tests.test_commitlog,tests.test_recovery -*-
"""
RocketMQ's C{MappedFileQueue}: the segment files of a commit log, their
names, allocation, the store lock, flush plans, zeroing, and the quarantine
recovery and truncation move bytes into.
"""

from __future__ import annotations

import enum
import errno
import json
import mmap
import os
import re
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from rmqha._locks import InUseError, lock_file
from rmqha.store import _guard
from rmqha.store._record import (
    is_message_magic,
    read_header,
)
from rmqha.store.errors import (
    _QUARANTINE,
    CorruptStoreError,
    StoreLockedError,
)


#: RocketMQ's C{mappedFileSizeCommitLog} default.
DEFAULT_SEGMENT_SIZE = 1024 * 1024 * 1024


#: Small enough for tests, large enough for one minimal record and a BLANK.
MIN_SEGMENT_SIZE = 256


#: A BLANK filler's size is an int32, so a segment cannot be larger.
MAX_SEGMENT_SIZE = 0x7FFFFFFF


_SEGMENT_NAME = re.compile(r"[0-9]{20}\Z")


_PAGE = mmap.PAGESIZE


_ZERO_CHUNK = bytes(1 << 20)

#: How much of a mapping a long read-through (the record walk, the scans for
#: non-zero bytes) keeps mapped into the process behind it: every this many
#: bytes it gives the pages it went over back (L{_drop_pages}), so that
#: checking a store keeps an RSS that does not grow with the segment size.
_WALK_BLOCK = 8 << 20


def segment_name(start: int) -> str:
    """
    The file name of the segment starting at C{start}: 20 zero-padded digits.
    """
    return f"{start:020d}"


class FlushDiskType(enum.Enum):
    """
    RocketMQ's C{flushDiskType}.
    """

    #: A periodic flush (see L{rmqha.store.service.CommitLogService}).
    ASYNC_FLUSH = "ASYNC_FLUSH"
    #: Every put and append is on disk before it returns.
    SYNC_FLUSH = "SYNC_FLUSH"


class _Segment:
    """
    One segment file, mapped lazily.

    @ivar wrote: bytes of the segment holding data (RocketMQ's wrote
        position); the segment is full when it equals C{size}.
    @ivar identity: C{(st_dev, st_ino)} of the file, from its first
        opening: a descriptor opened again later must find the same file.
    """

    __slots__ = (
        "start", "path", "size", "wrote", "writable", "fd", "_mm", "identity",
        "_guard", "_faulted_at",
    )

    def __init__(self, start: int, path: str, size: int, writable: bool) -> None:
        self.start = start
        self.path = path
        self.size = size
        self.wrote = 0
        self.writable = writable
        self.fd: int | None = None
        self._mm: mmap.mmap | None = None
        self.identity: tuple[int, int] | None = None
        # The SIGBUS guard's slot for the mapping (-1: none), and a fault
        # it recorded before the mapping went.
        self._guard = -1
        self._faulted_at: int | None = None

    @property
    def mm(self) -> mmap.mmap:
        if self._mm is None:
            # The segment's descriptor, opened here if need be: a second one
            # would leak (one descriptor per segment for ever).
            fd = self.ensure_fd()
            self._mm = mmap.mmap(
                fd,
                self.size,
                access=mmap.ACCESS_WRITE if self.writable else mmap.ACCESS_READ,
            )
            # A file truncated under the mapping must not kill the process
            # at the next access past its end (rmqha/store/_guard.py).
            self._guard = _guard.add(self._mm)
            if not self.writable:
                self.close_fd()
        return self._mm

    @property
    def mapped(self) -> bool:
        """
        Whether the segment is mapped already (L{mm} maps it on first use).
        """
        return self._mm is not None

    @property
    def end(self) -> int:
        return self.start + self.wrote

    def ensure_fd(self) -> int:
        """
        The segment's descriptor, opened if need be.

        @raise OSError: the file cannot be opened (C{ENOENT}: removed), or
            (C{ESTALE}) the path names another file than the one first
            opened: replaced.
        """
        if self.fd is None:
            flags = os.O_RDWR if self.writable else os.O_RDONLY
            fd = os.open(self.path, flags | getattr(os, "O_CLOEXEC", 0))
            info = os.fstat(fd)
            identity = (info.st_dev, info.st_ino)
            if self.identity is None:
                self.identity = identity
            elif identity != self.identity:
                os.close(fd)
                raise OSError(errno.ESTALE, "replaced by another file", self.path)
            self.fd = fd
        return self.fd

    def fault(self) -> int | None:
        """
        Where in the segment an access through its mapping faulted (the
        file did not reach there, or could not be read), if one did: the
        SIGBUS guard absorbed it.
        """
        if self._faulted_at is None and self._guard >= 0:
            self._faulted_at = _guard.fault(self._guard)
        return self._faulted_at

    def examine(self, by_path: bool = False) -> str | None:
        """
        What is wrong with the segment's file, as its open descriptor
        (C{fstat}) and its mapping's guard tell — C{None}: nothing seen.
        A segment without an open descriptor is not looked at (its file is
        checked when it is opened again: L{ensure_fd}).

        @param by_path: also look up the path (a C{stat}): a file replaced
            by one renamed over it while a hard link keeps the old one.
        """
        what = None
        if self.fd is not None:
            info = os.fstat(self.fd)
            if info.st_size < self.size:
                what = f"was truncated to {info.st_size} bytes (a segment is {self.size} bytes"
                what += f", {self.wrote} of them written)" if self.writable else ")"
            elif info.st_size > self.size:
                what = f"grew to {info.st_size} bytes (a segment is {self.size} bytes)"
            if what is None and (info.st_nlink == 0 or by_path):
                try:
                    named = os.stat(self.path)
                except FileNotFoundError:
                    what = "was removed"
                else:
                    if (named.st_dev, named.st_ino) != (info.st_dev, info.st_ino):
                        what = "was replaced by another file"
                    elif info.st_nlink == 0:  # (a race with the stat)
                        what = "was removed"
        position = self.fault()
        if what is None and position is not None:
            what = (
                f"could not be read or written through its mapping at position {position} "
                "(SIGBUS: the file does not reach there, or an I/O error)"
            )
        return what

    def pread(self, position: int, size: int) -> bytes:
        fd = self.ensure_fd()
        data = os.pread(fd, size, position)
        while len(data) < size:  # short reads are allowed; finish the job
            more = os.pread(fd, size - len(data), position + len(data))
            if not more:
                raise OSError(f"{self.path}: unexpected end of file at {position + len(data)}")
            data += more
        return data

    def pwrite(self, position: int, data: memoryview) -> None:
        fd = self.ensure_fd()
        while data:
            written = os.pwrite(fd, data, position)
            position += written
            data = data[written:]

    def pwritev(self, position: int, data: list[memoryview]) -> None:
        """
        Write the buffers C{data}, one after the other, from C{position}:
        one C{pwritev} (per C{IOV_MAX} buffers) instead of joining them.
        """
        fd = self.ensure_fd()
        pending = [view for view in data if view]
        while pending:
            written = os.pwritev(fd, pending[:_IOV_MAX], position)
            position += written
            # Drop what was written; a buffer written in part keeps its rest.
            while pending and written >= len(pending[0]):
                written -= len(pending.pop(0))
            if written:
                pending[0] = pending[0][written:]

    def close_fd(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def release_mapping(self) -> None:
        """
        Unmap (the descriptor stays open for flushes and preads).  A full
        segment is only read with C{pread} after this; keeping its pages
        mapped would count every byte ever put towards the process's RSS.
        """
        if self._mm is not None:
            self.fault()  # (kept: the guard's slot goes with the mapping)
            _guard.remove(self._guard)
            try:
                self._mm.close()
            except BufferError:
                # A read_view of it is still alive; unmapped later.
                self._guard = _guard.add(self._mm)
                return
            self._mm, self._guard = None, -1

    def close(self) -> None:
        if self._mm is not None:
            self.fault()
            _guard.remove(self._guard)
            try:
                self._mm.close()
            except BufferError:
                self._guard = _guard.add(self._mm)
                raise
            self._mm, self._guard = None, -1
        self.close_fd()


@dataclass
class FlushPlan:
    """
    One flush: C{fdatasync} these descriptors and everything up to C{target}
    is on disk.  L{execute} may run on a worker thread; the rest of the
    store must only be touched from the thread that owns it.
    """

    target: int
    fds: list[int]

    def execute(self) -> None:
        for fd in self.fds:
            os.fdatasync(fd)


def _check_segment_size(size: int) -> None:
    if not isinstance(size, int) or not MIN_SEGMENT_SIZE <= size <= MAX_SEGMENT_SIZE:
        raise ValueError(
            f"segment size {size!r} must be between {MIN_SEGMENT_SIZE} and "
            f"{MAX_SEGMENT_SIZE} bytes"
        )


def _lock(path: str) -> int:
    """
    Take the POSIX record lock RocketMQ takes on C{<store>/lock} (Java's
    C{FileChannel.tryLock} is an C{fcntl} lock, so this excludes a running
    broker too): L{rmqha._locks.lock_file}, the one lock every command
    that writes a directory takes.
    """
    try:
        return lock_file(path)
    except InUseError as e:
        # (Perhaps a RocketMQ broker: "another process".)
        holder = f"pid {e.pid}; " if e.pid is not None else ""
        raise StoreLockedError(
            f"{e.directory} is in use by another process ({holder}lock held on {path})"
        ) from None


#: The most buffers one C{pwritev} takes (Linux's C{IOV_MAX}).
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


def _allocate(fd: int, size: int) -> None:
    """
    Give a new segment its full size with blocks allocated, like RocketMQ's
    pre-allocated files.  Writing into holes of a sparse file costs a
    block allocation per page fault: about ten times the copy itself.
    """
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        os.ftruncate(fd, size)


def create_segment(commitlog_dir: str, start: int, size: int) -> _Segment:
    """
    Make the segment file starting at C{start}, allocated to its full
    C{size}; on failure (a full disk, say) nothing of a new file is left.
    """
    path = os.path.join(commitlog_dir, segment_name(start))
    existed = os.path.exists(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        _allocate(fd, size)
    except OSError:
        if not existed:
            # Ours and holding nothing (the disk is full, say): give
            # its blocks back.
            os.unlink(path)
        raise
    finally:
        os.close(fd)
    _fsync_dir(commitlog_dir)
    return _Segment(start, path, size, writable=True)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _all_zero(path: str) -> bool:
    """
    Whether every byte of the file at C{path} is zero (an empty file, which
    cannot be mapped, is).
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if not size:
            return True
        with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mm:
            return not _nonzero_after(mm, 0, size)


def _unfinished_segment(
    found: list[tuple[int, str, int]], segment_size: int | None
) -> str | None:
    """
    The path of the last segment file if its creation was interrupted: it
    is shorter than a segment and holds only zeros.  A process killed
    between creating a segment file and giving it its full size leaves one
    (so does RocketMQ, whose broker then refuses to start); nothing was
    ever written to it, since writing starts only once it has its size.
    """
    if not found:
        return None
    start, path, size = found[-1]
    if len(found) > 1:
        expected: int | None = found[0][2] if segment_size is None else segment_size
        if start != found[-2][0] + found[-2][2]:
            return None
    else:
        expected = segment_size
    if expected is None:
        # A lone file, no configured size: short if no segment has its size.
        try:
            _check_segment_size(size)
            return None
        except ValueError:
            pass
    elif size >= expected:
        return None
    return path if _all_zero(path) else None


def _load_segments(
    commitlog_dir: str, segment_size: int | None, writable: bool
) -> tuple[list[_Segment], int, str | None]:
    """
    List the segment files, checking names, sizes and contiguity.

    @return: the segments, the segment size, and the path of an unfinished
        last segment file (see L{_unfinished_segment}), which is not among
        the segments.
    """
    names = sorted(os.listdir(commitlog_dir))
    found: list[tuple[int, str, int]] = []
    for name in names:
        path = os.path.join(commitlog_dir, name)
        if not _SEGMENT_NAME.match(name) or not os.path.isfile(path):
            raise CorruptStoreError(
                f"{path}: not a commit-log segment (segment files are named by "
                "their 20-digit start offset)"
            )
        found.append((int(name), path, os.path.getsize(path)))
    unfinished = _unfinished_segment(found, segment_size)
    if unfinished is not None:
        del found[-1]
    if not found:
        return [], segment_size or DEFAULT_SEGMENT_SIZE, unfinished
    sizes = {size for _, _, size in found}
    if segment_size is None:
        # The first file's size decides; every file must have it.
        segment_size = found[0][2]
        try:
            _check_segment_size(segment_size)
        except ValueError:
            raise CorruptStoreError(
                f"{found[0][1]}: {segment_size} bytes is not a valid segment size"
            ) from None
    for start, path, size in found:
        if size != segment_size:
            raise CorruptStoreError(
                f"{path}: {size} bytes, but segments are {segment_size} bytes"
                + (" (configured)" if len(sizes) == 1 else "")
            )
        if start % segment_size:
            raise CorruptStoreError(
                f"{path}: start offset {start} is not a multiple of the segment "
                f"size {segment_size}"
            )
    for (a, path_a, _), (b, path_b, _) in zip(found, found[1:]):
        if b != a + segment_size:
            raise CorruptStoreError(
                f"segments are not contiguous: {os.path.basename(path_a)} is "
                f"followed by {os.path.basename(path_b)}"
            )
    segments = [_Segment(start, path, size, writable) for start, path, size in found]
    for segment in segments:
        segment.wrote = segment.size
    return segments, segment_size, unfinished


def _segment_index(segments: list[_Segment], offset: int) -> int | None:
    """
    The index of the segment holding C{offset}, if any.
    """
    if not segments or offset < segments[0].start:
        return None
    index = (offset - segments[0].start) // segments[0].size
    return index if index < len(segments) else None


def _quarantine_target(store_dir: str, stem: str, suffix: str, clock: Callable[[], float]) -> str:
    """
    A new path in C{<store>/rmqha/quarantine/} named C{stem}, the UTC time
    and C{suffix}; never one that exists (so nothing quarantined is ever
    replaced).
    """
    directory = os.path.join(store_dir, *_QUARANTINE)
    os.makedirs(directory, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(clock()))
    base = os.path.join(directory, f"{stem}-{stamp}")
    target, n = base + suffix, 1
    while os.path.exists(target) or os.path.exists(target + ".json"):
        target, n = f"{base}.{n}{suffix}", n + 1
    return target


def _write_sidecar(path: str, info: dict[str, object], clock: Callable[[], float]) -> None:
    info = {
        **info,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(clock())),
    }
    with open(path + ".json", "w") as f:
        json.dump(info, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def _quarantine_bytes(
    store_dir: str,
    offset: int,
    chunks: Iterator[bytes],
    info: dict[str, object],
    clock: Callable[[], float],
) -> str:
    """
    Keep C{chunks}, the bytes at commit-log C{offset} about to be zeroed or
    overwritten, byte for byte in C{<store>/rmqha/quarantine/<offset>-<utc
    time>.bin}, with a JSON sidecar (C{info}: why, from where), both on
    disk before this returns.

    @return: the path of the C{.bin} file.
    """
    target = _quarantine_target(store_dir, f"{offset:020d}", ".bin", clock)
    length = 0
    with open(target, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
            length += len(chunk)
        f.flush()
        os.fsync(f.fileno())
    _write_sidecar(target, {"offset": offset, "length": length, **info}, clock)
    _fsync_dir(os.path.dirname(target))
    return target


def _quarantine_segment(
    store_dir: str, segment: _Segment, info: dict[str, object], clock: Callable[[], float]
) -> str:
    """
    Move a whole segment file into quarantine (renamed, bytes untouched),
    with a JSON sidecar.
    """
    name = os.path.basename(segment.path)
    target = _quarantine_target(store_dir, name, ".segment", clock)
    _write_sidecar(
        target, {"offset": segment.start, "length": segment.size, "segment": name, **info},
        clock,
    )
    os.rename(segment.path, target)
    _fsync_dir(os.path.dirname(target))
    return target


def _drop_pages(mm: mmap.mmap, start: int, end: int) -> None:
    """
    Take the whole pages of C{mm[start:end]} out of the process
    (C{MADV_DONTNEED}): a read-through of a segment would otherwise count
    every byte it touched towards the RSS until the mapping is closed.  The
    mappings are all shared (C{MAP_SHARED}, never copy-on-write), so the
    bytes stay in the page cache, dirty ones included, and the next touch
    maps them again: nothing is lost, whatever was written.
    """
    start = -(-max(start, 0) // _PAGE) * _PAGE
    end = min(end, len(mm)) // _PAGE * _PAGE
    if end > start:
        mm.madvise(mmap.MADV_DONTNEED, start, end - start)


def _mapped_chunks(mm: mmap.mmap, start: int, end: int) -> Iterator[bytes]:
    step = len(_ZERO_CHUNK)
    for position in range(start, end, step):
        yield mm[position : min(end, position + step)]


def _first_nonzero(mm: mmap.mmap, start: int, end: int) -> int | None:
    step = len(_ZERO_CHUNK)
    position = start
    while position < end:
        n = min(step, end - position)
        chunk = mm[position : position + n]
        if chunk != _ZERO_CHUNK[:n]:
            return position + len(chunk) - len(chunk.lstrip(b"\0"))
        position += n
        if (position - start) % _WALK_BLOCK < step:
            _drop_pages(mm, position - _WALK_BLOCK, position)
    return None


def _last_nonzero(mm: mmap.mmap, start: int, end: int) -> int | None:
    step = len(_ZERO_CHUNK)
    position = end
    while position > start:
        n = min(step, position - start)
        chunk = mm[position - n : position]
        if chunk != _ZERO_CHUNK[:n]:
            return position - n + len(chunk.rstrip(b"\0")) - 1
        position -= n
        if (end - position) % _WALK_BLOCK < step:
            _drop_pages(mm, position, position + _WALK_BLOCK)
    return None


def _nonzero_after(mm: mmap.mmap, start: int, end: int) -> bool:
    return _first_nonzero(mm, start, end) is not None


def _zero_after(mm: mmap.mmap, start: int, end: int) -> None:
    step = len(_ZERO_CHUNK)
    position = start
    while position < end:
        n = min(step, end - position)
        if mm[position : position + n] != _ZERO_CHUNK[:n]:
            mm[position : position + n] = _ZERO_CHUNK[:n]
        position += n


def cut_segments(segments: list[_Segment], offset: int) -> None:
    """
    Zero every byte of C{segments} from commit-log C{offset} on, in
    whichever segments they reached; segments that then begin past the cut
    go, their files too (the next append must land in the segment holding
    the cut).  The first segment always stays.
    """
    detach_segments(segments, offset)()


def detach_segments(segments: list[_Segment], offset: int) -> Callable[[], None]:
    """
    L{cut_segments} in two halves.  Now: the segments that begin past
    commit-log C{offset} leave C{segments} (their mappings closed), and
    the ones that stay end at C{offset} (C{wrote}), so no reader reaches a
    cut byte from here on.  Returned: the bulk -- zeroing the cut bytes of
    the segments that stay, removing the files of those that left -- which
    touches nothing a reader can reach, so it may run in a thread; nothing
    may append until it has run.
    """
    zero: list[tuple[mmap.mmap, int, int]] = []
    for segment in reversed(segments):
        if segment.start + segment.wrote <= offset:
            break
        keep = max(0, offset - segment.start)
        if segment is segments[0] or segment.start <= offset:
            zero.append((segment.mm, keep, segment.wrote))
        segment.wrote = keep
    gone: list[str] = []
    while len(segments) > 1 and segments[-1].start > offset:
        segment = segments.pop()
        segment.close()
        gone.append(segment.path)

    def bulk() -> None:
        for mm, keep, wrote in zero:
            _zero_after(mm, keep, wrote)
        for path in gone:
            os.unlink(path)

    return bulk


def _incomplete(mm: mmap.mmap, position: int, written: int, size: int) -> bool:
    """
    Whether the bytes at C{position} are the valid start of a record that
    continues past C{written} (but within the segment).
    """
    if written - position < 8:
        return True
    total, magic = read_header(mm, position)
    return (
        is_message_magic(magic)
        and written - position < total <= size - position
    )


def release_store(
    store_dir: str, segments: list[_Segment], lock_fd: int | None, *, clean: bool
) -> None:
    """
    The last of closing a store: close every segment, remove the C{abort}
    marker if the store is C{clean} (closed read-write and undamaged: the
    next open need not recover its tail), and release the lock.
    """
    for segment in segments:
        segment.close()
    if clean:
        try:
            os.unlink(os.path.join(store_dir, "abort"))
        except FileNotFoundError:
            pass
        _fsync_dir(store_dir)
    if lock_fd is not None:
        os.close(lock_fd)
