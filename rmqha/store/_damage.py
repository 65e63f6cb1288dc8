# -*- test-case-name: tests.test_store_faults,tests.test_commitlog -*-
"""
A segment file changed under the open commit log (truncated, removed,
replaced, or a page of its mapping faulted; docs/store.md): finding it,
keeping the first finding, telling the observers once, recording it for
the next open, and refusing writes from then on.

A part the commit log owns (composition, not a mixin): the damage found
and its observers are this object's own state, and nothing else writes
them.  (The SIGBUS guard's count when the log last looked stays on the
log: its read and put paths compare it on every mapped read and batch,
without a call or a hop.)  It shares the
log's list of segments (the same list object, never replaced) and is
given, at construction, the one thing it does to the log: stop the put
path's fast track (C{stop_puts}) when damage is found.
"""

from __future__ import annotations

import errno
import json
import os
import time
from typing import Callable

from twisted.logger import Logger

from rmqha._files import write_atomically
from rmqha.store._recovery import damage_record
from rmqha.store._segments import _Segment, _quarantine_target
from rmqha.store.errors import (
    _DAMAGED,
    SegmentReadError,
    StoreDamagedError,
    StoreError,
)

__all__ = ["DamageWatch", "open_failure"]


def open_failure(error: OSError) -> str:
    """
    What an C{open} of a segment file that failed with C{error} says
    about the file.
    """
    if error.errno == errno.ENOENT:
        return "was removed"
    if error.errno == errno.ESTALE:
        return "was replaced by another file"
    return f"cannot be opened: {error.strerror or error}"


class DamageWatch:
    """
    Watches the segment files of one commit log.

    @ivar damage: the first damage found, or C{None}.
    """

    _log = Logger()

    def __init__(
        self,
        store_dir: str,
        read_only: bool,
        segments: list[_Segment],
        clock: Callable[[], float],
        stop_puts: Callable[[], None],
    ) -> None:
        self._store_dir = store_dir
        self._read_only = read_only
        self._segments = segments
        self._clock = clock
        self._stop_puts = stop_puts
        self.damage: StoreDamagedError | None = None
        self._observers: list[Callable[[StoreDamagedError], object]] = []

    def observe(self, observer: Callable[[StoreDamagedError], object]) -> Callable[[], None]:
        """
        See L{rmqha.store.commitlog.CommitLog.observe_damage}.
        """
        self._observers.append(observer)

        def stop() -> None:
            if observer in self._observers:
                self._observers.remove(observer)

        return stop

    def check(self) -> StoreDamagedError | None:
        """
        See L{rmqha.store.commitlog.CommitLog.check} (which does not call
        this once the log is closed, and notes the SIGBUS guard's count
        when this finds nothing).
        """
        if self.damage is not None:
            return self.damage
        segments = self._segments
        for segment in segments:
            if segment.fd is None and not segment.mapped and segment.fault() is None:
                continue  # (nothing held, and no fault while it was: recovery's)
            what = segment.examine(by_path=segment is segments[-1])
            if what is not None:
                return self.damaged(segment, what)
        return None

    def refuse_if_faulted(self) -> None:
        """
        Raise L{StoreDamagedError} if an access to a mapping of one of this
        log's segments faulted (the SIGBUS guard counted a fault since the
        log last looked: L{rmqha.store.commitlog.CommitLog._check_faults}).
        """
        for segment in self._segments:
            if segment.fault() is not None:
                raise self.damaged(segment, segment.examine(by_path=True) or "")

    def refuse_if_changed(self, segment: _Segment) -> None:
        """
        Before writing into C{segment}'s file: raise L{StoreDamagedError}
        if it is not the file the log holds.
        """
        fd = segment.fd
        if fd is None:
            try:
                fd = segment.ensure_fd()
            except OSError as e:
                raise self.damaged(segment, open_failure(e)) from None
        # The file's size by lseek, not fstat: after a write, fstat costs
        # ~1.8 us here (a slave appends per read: ~15 % of a one-record
        # frame), lseek ~0.45.  A removed or replaced file keeps its size:
        # that is for check() (the timer, flushes, rolls) to find.
        if os.lseek(fd, 0, os.SEEK_END) != segment.size:
            raise self.damaged(segment, segment.examine(by_path=True) or "changed")

    def refuse_if_damaged(self) -> None:
        """
        Raise L{StoreDamagedError} if damage was found.
        """
        damage = self.damage
        if damage is not None:
            # (A new exception each time: one raised again and again would
            # carry every traceback it was raised with.)
            raise StoreDamagedError(damage.path, damage.what)

    def damaged(self, segment: _Segment, what: str) -> StoreDamagedError:
        """
        C{segment}'s file is not what the log holds (C{what}): from now on
        refuse every write.  Logged once, told to the observers once.

        @return: the error to raise (the first damage, if there was one).
        """
        if self.damage is None:
            damage = self.damage = StoreDamagedError(segment.path, what or "changed")
            self._stop_puts()
            self._log.error("the commit log is damaged: {error}", error=str(damage))
            self._record(segment, damage.what)
            for observer in list(self._observers):
                try:
                    observer(damage)
                except Exception:
                    self._log.failure("a damage observer failed")
        damage = self.damage
        return StoreDamagedError(damage.path, damage.what)

    def _record(self, segment: _Segment, what: str) -> None:
        """
        Write which file changed and how into C{rmqha/damaged.json}, for
        the next open: a file cut to zeros must not pass there for one
        whose creation was interrupted (and be deleted).
        """
        if self._read_only:
            return
        record = {
            "segment": os.path.basename(segment.path),
            "size": segment.size,
            "offset": segment.start,
            "written": segment.wrote,
            "what": what,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._clock())),
        }
        path = os.path.join(self._store_dir, *_DAMAGED)
        try:
            write_atomically(path, lambda f: json.dump(record, f, indent=1))
        except OSError as e:
            self._log.warn("cannot record the damage in {path}: {error}", path=path, error=e)

    def forget_recorded(self, end: int) -> None:
        """
        Opened although the last run recorded a segment file changed under
        it (the file was restored, or the log ends before it now, at
        C{end}): say so, and move the record into the quarantine (kept,
        not repeated).
        """
        record = damage_record(self._store_dir)
        path = os.path.join(self._store_dir, *_DAMAGED)
        if record is None and not os.path.exists(path):
            return
        target = _quarantine_target(self._store_dir, "damaged", ".json", self._clock)
        os.rename(path, target)
        self._log.warn(
            "the last run found segment file {segment} {what} under it; the log was "
            "recovered as the files are now, to offset {end} (the record is kept in "
            "{target})",
            segment=(record or {}).get("segment"),
            what=(record or {}).get("what"),
            end=end,
            target=target,
        )

    def read_failure(
        self, segment: _Segment, held: bool, position: int, size: int, error: OSError
    ) -> StoreError:
        """
        The error for a C{pread} of C{segment} that failed with C{error}: a
        damage if the file is one the log held open (C{held}: the last
        segment, or one not flushed yet) and it changed, else a
        L{SegmentReadError} naming the file and why.  (An older segment's
        file gone or cut costs the reads of it, not the puts.)
        """
        if segment.fd is None:
            # (ensure_fd failed: the file of a segment not held open.)
            return SegmentReadError(segment.path, open_failure(error))
        what = segment.examine(by_path=True)
        if not held:
            # Opened for this read: closed again, so that the look at the
            # files held (check) does not take it for one.
            segment.close_fd()
        elif what is not None:
            return self.damaged(segment, what)
        if what is not None:
            return SegmentReadError(segment.path, what)
        if error.errno is None:  # (a short read: the file ends early)
            return SegmentReadError(
                segment.path, f"ends before position {position + size} ({error})"
            )
        return SegmentReadError(
            segment.path,
            f"cannot read {size} bytes at position {position}: {error.strerror or error}",
        )
