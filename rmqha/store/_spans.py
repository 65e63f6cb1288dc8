# -*- test-case-name: tests.test_commitlog -*-
"""
Spans of a segment file for sending from the file itself (C{sendfile}):
L{SpanReader}, behind L{rmqha.store.commitlog.CommitLog.file_span}.

A catch-up master sends a frame's body from the segment file, and needs
its CRC-32 for the frame's header.  Read with C{pread}, those bytes were
copied into the process only to be checksummed: a fifth of a catch-up
master's time.  A span reader computes the CRC in a read-only mapping of
the file instead (nothing copied), with a descriptor and a mapping of its
own: what happens to the file meanwhile (removed, cut, replaced) is the
reader's error, one line naming the file (L{SegmentReadError}), as a
C{pread}'s is, and never damage to the log: an older segment's file gone
or cut costs the reads of it, not the puts (docs/store.md).
"""

from __future__ import annotations

import errno
import mmap
import os

from rmqha.store import _guard
from rmqha.store._damage import open_failure
from rmqha.store._record import crc32
from rmqha.store._segments import _PAGE, _Segment, _drop_pages
from rmqha.store.errors import SegmentReadError

__all__ = ["SpanReader"]

#: How much of a span reader's mapping stays in the process behind it: every
#: this many bytes it gives the pages back (C{madvise}).  A smaller step than
#: the record walk's (8 MiB): a catch-up master's RSS stays within a MiB of
#: idle, and one C{madvise} a MiB costs ~1 % of the span's CPU (one per
#: 256 KiB frame cost a third).
SPAN_BLOCK = 1 << 20


class SpanReader:
    """
    The CRC-32s of consecutive spans of one segment file, computed in a
    mapping of its own; their pages go out of the process again every
    L{SPAN_BLOCK} bytes (the RSS stays flat), and a span elsewhere in the
    file drops the pages before it first.  Without the SIGBUS guard (no
    compiled module, or every slot taken) a fault would kill the process:
    the bytes are read with C{pread} then.

    @ivar segment: the segment read.
    @ivar fd: the reader's descriptor of the segment file (for C{sendfile}):
        valid until L{close}.
    """

    def __init__(self, segment: _Segment) -> None:
        """
        Open and map C{segment}'s file.

        @raise SegmentReadError: the file cannot be opened, is another file
            than the log's, or is shorter than a segment.
        """
        self.segment = segment
        path = segment.path
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            raise SegmentReadError(path, open_failure(e)) from None
        try:
            info = os.fstat(fd)
            if segment.identity is not None and (info.st_dev, info.st_ino) != segment.identity:
                raise SegmentReadError(path, open_failure(OSError(errno.ESTALE, "replaced")))
            if info.st_size < segment.size:
                raise SegmentReadError(path, f"was truncated to {info.st_size} bytes")
            self._mm = mmap.mmap(fd, segment.size, access=mmap.ACCESS_READ)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        self._slot = _guard.add(self._mm)
        # Pages from here to the last span's end are still mapped.
        self._drop_from = 0
        self._end = 0

    def crc(self, position: int, end: int) -> int:
        """
        The CRC-32 of the file's bytes [C{position}, C{end}).

        @raise SegmentReadError: the file does not hold them now (cut, or
            unreadable); the reader is of no more use.
        """
        path = self.segment.path
        size = os.lseek(self.fd, 0, os.SEEK_END)
        if size < end:
            raise SegmentReadError(path, f"was truncated to {size} bytes")
        if self._slot < 0:
            data = os.pread(self.fd, end - position, position)
            if len(data) < end - position:
                raise SegmentReadError(path, f"ends before position {end}")
            value: int = crc32(data)
            return value
        mm = self._mm
        if position != self._end:
            _drop_pages(mm, self._drop_from, self._end)
            self._drop_from = position
        with memoryview(mm) as whole, whole[position:end] as view:
            value = crc32(view)
        fault = _guard.fault(self._slot)
        if fault is not None:
            raise SegmentReadError(
                path,
                f"could not be read through its mapping at position {fault} "
                "(SIGBUS: the file does not reach there, or an I/O error)",
            )
        self._end = end
        if end - self._drop_from >= SPAN_BLOCK:
            _drop_pages(mm, self._drop_from, end)
            self._drop_from = end - end % _PAGE
        return value

    def close(self) -> None:
        """
        Unmap and close.  Idempotent.
        """
        if self.fd < 0:
            return
        _guard.remove(self._slot)
        self._slot = -1
        self._mm.close()
        os.close(self.fd)
        self.fd = -1
