# -*- test-case-name: tests.test_scrub -*-
"""
The background scrub: every record of the commit log re-read and re-checked
(structure, PHYSICALOFFSET, body CRC: L{rmqha.store._record.parse_record}, the
project's one record decoder) over and over, at a bounded rate, so that
corruption in old segments — which recovery never walks — is found while a
good copy still exists somewhere.

Two halves:

  - L{check_chunk}, sans-IO: the records in some bytes of one segment,
    and where the walk goes next (including searching past a damaged
    record for the next record that verifies); the records that verify
    are hopped over in one compiled walk (L{walk_valid}: L{parse_record}'s
    checks, ~0.13 us a 1 KiB record against ~8 us parsed one by one);
  - L{ScrubService}, the lifecycle: plans each read on the reactor thread
    from the log's public offsets, reads and checks it on a worker thread
    through its B{own} file descriptor (nothing of the L{CommitLog} is
    touched off the reactor thread), applies the result on the reactor
    thread, and waits so that the bytes read per second stay under the
    rate.

A record that fails is read (and checked) a second time, from a fresh
plan, before it is reported; a result is thrown away when the log was cut
back below what was read meanwhile (a slave's truncation); each read starts
by re-verifying the last good record before it (its "anchor"), so a walk
whose position stopped being a record boundary starts its segment again
instead of reporting the bytes there.  See docs/store.md, "Scrub".
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from twisted.application.service import Service
from twisted.internet.defer import Deferred, maybeDeferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorThreads, IReactorTime
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure

from rmqha.store._record import (
    PHYSICALOFFSET_AT,
    MAGIC_BYTES,
    BLANK_MAGIC,
    Blank,
    RecordError,
    check_header,
    parse_record,
    read_header,
    read_physical_offset,
    walk_valid,
)
from rmqha._units import parse_rate
from rmqha.store._segments import segment_name
from rmqha.store.commitlog import CommitLog

__all__ = [
    "DEFAULT_SCRUB_RATE",
    "DEFAULT_PASS_INTERVAL",
    "ChunkResult",
    "CorruptRecord",
    "ScrubService",
    "ScrubStatus",
    "check_chunk",
    "parse_scrub_rate",
]

#: Bytes per second read by default: 32 MiB/s re-reads 100 GiB in under an
#: hour and 1 TiB in about 9 hours (several passes inside RocketMQ's default
#: 72-hour retention), a few percent of an SSD's sequential bandwidth.
DEFAULT_SCRUB_RATE = 32 * 1024 * 1024
#: A pass starts at most this often (seconds, start to start): a small
#: store is not re-read back to back for ever; a large one is scrubbed
#: continuously at the rate.
DEFAULT_PASS_INTERVAL = 600.0
#: The most read (and checked) in one step.
MAX_SLICE = 1024 * 1024
#: Steps are never smaller than this (a slow rate means longer waits).
MIN_SLICE = 64 * 1024
#: The scrub works at most this fraction of the time (wall time of a step,
#: read and check, against the wait after it): the rate bounds bytes, this
#: bounds CPU — checking small records costs more per byte (~0.13 us a 1 KiB
#: record compiled, ~8 us on the pure path), disk waits count too, and the
#: checking thread holds the GIL the reactor thread needs while in Python.
MAX_BUSY = 0.1
#: How many corrupt records are listed (the first ones by offset).
MAX_LISTED = 1000
#: The largest record read whole (RocketMQ's default maxMessageSize is
#: 4 MiB): a longer one is skipped with a warning, not read into memory.
MAX_RECORD_READ = 64 * 1024 * 1024
#: Seconds to wait when the log is closed, or nothing new is stable yet.
IDLE_DELAY = 1.0
# Reads of one range beyond the second when each finds damage the one
# before did not; then the walk moves on (the next pass looks again).
_MAX_REREADS = 2

_FADVISE = getattr(os, "posix_fadvise", None)
_DONTNEED = getattr(os, "POSIX_FADV_DONTNEED", 0)


def parse_scrub_rate(text: str | int) -> int:
    """
    C{--scrub-rate}: bytes per second (C{32MiB}, C{64m}, C{1048576},
    optionally followed by C{/s}); C{0} or C{off} disables the scrub.

    @raise ValueError: naming the value.
    """
    return parse_rate(text, "scrub rate")


@dataclass(frozen=True)
class Finding:
    """
    A record that did not verify, as one read saw it.

    @ivar resumed_at: where the next record that verifies was found, or
        C{None} when none was found before the end of what was read.
    """

    offset: int
    reason: str
    resumed_at: int | None = None


@dataclass
class ChunkResult:
    """
    What L{check_chunk} found in one read, and where the walk goes next.

    @ivar next_offset: where the next read continues (a record boundary,
        or where to go on searching when C{searching}).
    @ivar anchor: the last record that verified in this segment, re-checked
        at the start of the next read; C{None} at a segment's start.
    @ivar want: bytes needed from C{next_offset} for progress (more than a
        slice for a large record), else 0.
    @ivar lost_anchor: the chunk's first record, which verified before, does
        not now: the log changed under the walk.
    """

    next_offset: int
    searching: bool
    anchor: int | None
    findings: list[Finding] = field(default_factory=list)
    records: int = 0
    want: int = 0
    lost_anchor: bool = False


def _next_candidate(buf: bytes, pos: int, end: int) -> int | None:
    """
    The first position at or after C{pos} whose MAGICCODE field holds a
    message magic (a place a record may start), if any.
    """
    best: int | None = None
    for magic in MAGIC_BYTES:
        i = buf.find(magic, pos + 4, end)
        if i >= 0 and (best is None or i - 4 < best):
            best = i - 4
    return best


def _placed(buf: bytes, pos: int, end: int, here: int) -> bool:
    """
    Whether the record header at C{buf[pos:]} may be one at commit-log
    offset C{here}: its PHYSICALOFFSET says so, or is not in C{buf} yet.
    Only used to decide whether to read a long record's bytes;
    L{parse_record} judges the record.
    """
    return end - pos < PHYSICALOFFSET_AT + 8 or (
        read_physical_offset(buf, pos) == here
    )


def _continues(total: int, magic: int, room: int, position: int, size: int) -> bool:
    """
    Whether the header C{(total, magic)} at C{position} of a segment of
    C{size} bytes may start a message record running past the C{room}
    bytes left in the chunk (L{check_header}; L{parse_record} judges it
    once it is read whole).
    """
    return (
        total > room
        and magic != BLANK_MAGIC
        and check_header(total, magic, position, size) is None
    )


def check_chunk(
    buf: bytes,
    offset: int,
    *,
    segment_start: int,
    segment_size: int,
    limit: int,
    anchored: bool,
    searching: bool,
) -> ChunkResult:
    """
    Check the records in C{buf}, the commit-log bytes from C{offset} (in
    the segment starting at C{segment_start}); C{offset + len(buf)} is at
    most C{limit}, the end of the bytes that may be checked now (the
    segment's end, or the log's stable end).

    Each record is held to L{parse_record}'s checks (strict, with the body
    CRC): the ones that pass are hopped over by L{walk_valid}, the one it
    stops at is parsed to learn what it is.  A BLANK filler must reach the
    segment's end.  After a record that does
    not verify, the walk searches for the next place whose MAGICCODE field
    holds a message magic and which L{parse_record} accepts (its
    PHYSICALOFFSET must equal its position, so a match in the middle of
    other bytes is all but impossible), and goes on from there.

    @param anchored: the chunk starts with the last record that verified
        before; if it does not verify now, the walk's position cannot be
        trusted and nothing in this chunk is reported.
    @param searching: the previous chunk ended while searching.
    """
    end = len(buf)
    segment_end = segment_start + segment_size
    at_limit = offset + end == limit
    findings: list[Finding] = []
    records = 0
    anchor: int | None = None
    pos = 0
    if anchored and not searching:
        try:
            item = parse_record(buf, pos, end, offset, with_body=False, strict=True)
        except RecordError:
            item = None
        if item is None or type(item) is Blank:
            return ChunkResult(segment_start, False, None, lost_anchor=True)
        anchor = offset
        pos = item.size

    def resumed(at: int) -> None:
        if findings and findings[-1].resumed_at is None:
            findings[-1] = Finding(findings[-1].offset, findings[-1].reason, at)

    while pos < end:
        if not searching:
            # The whole records from here that parse_record accepts, hopped
            # over in one compiled walk (walk_valid: the same checks); the
            # one it stops at goes through the steps below.
            stop, hopped, last = walk_valid(
                buf, pos, end, offset + pos, check_crc=True, strict=True
            )
            if hopped:
                records += hopped
                anchor = offset + last
                pos = stop
                if pos >= end:
                    break
        here = offset + pos
        if searching:
            candidate = _next_candidate(buf, pos, end)
            if candidate is None:
                if at_limit and limit == segment_end:
                    # Nothing verifies up to the segment's end.
                    return ChunkResult(segment_end, False, None, findings, records)
                # Go on searching in the next read (a magic may straddle).
                resume = max(here, offset + end - 7)
                return ChunkResult(resume, True, None, findings, records, want=8)
            pos = candidate
            here = offset + pos
            total, magic = read_header(buf, pos)
            if _continues(total, magic, end - pos, here - segment_start, segment_size):
                if _placed(buf, pos, end, here):
                    # Maybe a record, continuing after this chunk: read all
                    # of it next time (once it is below the stable end).
                    return ChunkResult(here, True, None, findings, records, want=total)
                pos += 1
                continue
            try:
                item = parse_record(buf, pos, end, here, with_body=False, strict=True)
            except RecordError:
                pos += 1
                continue
            if type(item) is Blank:  # pragma: no cover - candidates are messages
                pos += 1
                continue
            searching = False
            resumed(here)
            records += 1
            anchor = here
            pos += item.size
            continue
        if end - pos < 8:
            if not at_limit or limit < segment_end:
                return ChunkResult(here, False, anchor, findings, records, want=8)
        else:
            total, magic = read_header(buf, pos)
            if magic == BLANK_MAGIC:
                # Nothing after a BLANK is read: its size must reach the
                # segment's end, which parse_record checks against "end".
                try:
                    parse_record(buf, pos, pos + segment_end - here, here)
                except RecordError as e:
                    findings.append(Finding(here, e.reason))
                    searching = True
                    pos += 1
                    continue
                return ChunkResult(segment_end, False, None, findings, records)
            if _continues(total, magic, end - pos, here - segment_start, segment_size):
                if _placed(buf, pos, end, here):
                    # The record continues after this chunk: read all of it
                    # next time (once it is below the stable end).
                    return ChunkResult(here, False, anchor, findings, records, want=total)
                physical = read_physical_offset(buf, pos)
                findings.append(Finding(
                    here, f"PHYSICALOFFSET field says {physical}, the record is at {here}"
                ))
                searching = True
                pos += 1
                continue
        try:
            record = parse_record(buf, pos, end, here, with_body=False, strict=True)
        except RecordError as e:
            findings.append(Finding(here, e.reason))
            searching = True
            pos += 1
            continue
        if type(record) is Blank:  # pragma: no cover - handled above
            return ChunkResult(segment_end, False, None, findings, records)
        records += 1
        anchor = here
        pos += record.size
    next_offset = offset + end
    if next_offset >= segment_end and not searching:
        return ChunkResult(segment_end, False, None, findings, records)
    return ChunkResult(next_offset, searching, anchor, findings, records)


@dataclass(frozen=True)
class _Plan:
    """
    One read, decided on the reactor thread.
    """

    commitlog: CommitLog
    path: str
    segment_name: str
    segment_start: int
    segment_size: int
    start: int
    length: int
    limit: int
    anchored: bool
    searching: bool
    #: Whether the range is in a full, flushed segment (its cached pages
    #: are dropped around the read, so that the disk's bytes are checked
    #: and the scrub does not fill the page cache).
    cold: bool


@dataclass
class _Read:
    """
    What a step's worker-thread half returns.
    """

    size: int
    result: ChunkResult | None
    #: Why the read failed, when it did.
    error: str | None = None
    #: The failure is about the rest of the segment, not just this range.
    whole: bool = False


def _read_and_check(plan: _Plan) -> _Read:
    """
    The worker-thread half of a step: read the planned range through a
    descriptor of our own (never one of the L{CommitLog}'s, which the
    reactor thread may close or reuse), then check it.
    """
    try:
        fd = os.open(plan.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        # Cut back or moved aside meanwhile (the reactor thread tells),
        # or lost: the rest of the segment is unreadable.
        return _Read(0, None, f"segment file {plan.segment_name} is missing", whole=True)
    except OSError as e:
        return _Read(0, None, f"cannot open {plan.segment_name}: {e.strerror}", whole=True)
    try:
        position = plan.start - plan.segment_start
        if plan.cold and _FADVISE is not None:
            _FADVISE(fd, position, plan.length, _DONTNEED)
        chunks = []
        got = 0
        while got < plan.length:
            data = os.pread(fd, plan.length - got, position + got)
            if not data:
                break
            chunks.append(data)
            got += len(data)
        if plan.cold and _FADVISE is not None:
            _FADVISE(fd, position, plan.length, _DONTNEED)
    except OSError as e:
        return _Read(0, None, f"cannot read {plan.segment_name}: {e.strerror}")
    finally:
        os.close(fd)
    if got < plan.length:
        return _Read(
            got, None, f"segment file {plan.segment_name} ends at {position + got}",
            whole=True,
        )
    buf = b"".join(chunks) if len(chunks) != 1 else chunks[0]
    result = check_chunk(
        buf,
        plan.start,
        segment_start=plan.segment_start,
        segment_size=plan.segment_size,
        limit=plan.limit,
        anchored=plan.anchored,
        searching=plan.searching,
    )
    return _Read(got, result)


@dataclass
class CorruptRecord:
    """
    A record the scrub found bad on two reads.

    @ivar resumed_at: the next record that verifies after it (the damaged
        bytes are C{offset .. resumed_at}), or C{None}: none in its
        segment.
    """

    offset: int
    segment: str
    reason: str
    found_at: float
    resumed_at: int | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "offset": self.offset,
            "segment": self.segment,
            "reason": self.reason,
            "found_at": self.found_at,
            "resumed_at": self.resumed_at,
        }


@dataclass(frozen=True)
class ScrubStatus:
    """
    The scrub as it stands, read-only (L{ScrubService.snapshot}); its
    L{as_dict} is the C{scrub} object of C{/status}.

    @ivar position: the offset the walk has reached.
    @ivar pass_started: when the pass under way started, or C{None}.
    @ivar next_pass: between passes, when the next one starts.
    @ivar last_pass: the last finished pass, or C{None}.
    @ivar corrupt_records: corrupt records known now, listed or not;
        C{corrupt} lists them (up to a bound), by offset.
    """

    enabled: bool
    rate: int
    position: int
    pass_started: float | None
    next_pass: float | None
    pass_bytes: int
    passes: int
    last_pass: dict[str, Any] | None
    bytes_total: int
    corrupt_records: int
    corrupt: tuple[CorruptRecord, ...]

    def as_dict(self) -> dict[str, Any]:
        """
        The C{scrub} object of C{/status}.
        """
        return {
            "enabled": self.enabled,
            "rate": self.rate,
            "position": self.position,
            "pass_started": self.pass_started,
            "next_pass": self.next_pass,
            "pass_bytes": self.pass_bytes,
            "passes": self.passes,
            "last_pass": self.last_pass,
            "bytes_total": self.bytes_total,
            "corrupt_records": self.corrupt_records,
            "corrupt": [r.as_dict() for r in self.corrupt],
        }


class ScrubService(Service):
    """
    Re-reads and re-checks every record of the commit log, a pass after
    another, reading at most C{rate} bytes per second.

    @ivar corrupt: the corrupt records known now, by offset (at most
        L{MAX_LISTED}; L{corrupt_count} counts those beyond).
    @ivar bytes_total: bytes read since the service was made.
    @ivar passes: passes finished.
    @ivar slave: whether the log is a slave's copy: the repair advice
        logged with a corrupt record depends on it (a broker gives a
        function reading its role machine: L{rmqha.ha.roles}).
    """

    _log = Logger()

    @property
    def slave(self) -> bool:
        return self._slave()

    def __init__(
        self,
        commitlog: Callable[[], CommitLog | None],
        clock: IReactorTime,
        *,
        rate: int = DEFAULT_SCRUB_RATE,
        slave: bool | Callable[[], bool] = False,
        run_in_thread: Callable[[Callable[[], _Read]], Deferred[_Read]] | None = None,
        pass_interval: float = DEFAULT_PASS_INTERVAL,
        slice_bytes: int | None = None,
        max_listed: int = MAX_LISTED,
    ) -> None:
        """
        @param commitlog: the open log, or C{None} while there is none
            (asked at every step: a slave moving its store aside gets a
            new one).
        @param rate: bytes per second; 0 disables the scrub.
        @param slave: whether this is a slave's copy, or a function that
            says so now (see L{slave}).
        @param run_in_thread: runs a step's read and check; defaults to
            the reactor's thread pool (in-line on a reactor without
            threads, such as the in-memory ones tests use).
        """
        if rate < 0:
            raise ValueError(f"scrub rate {rate!r} is negative")
        self.rate = rate
        self._commitlog = commitlog
        self._clock = clock
        self._slave = slave if callable(slave) else (lambda: slave)
        self._run_in_thread = run_in_thread or self._default_run_in_thread
        self._pass_interval = pass_interval
        self._slice = slice_bytes or min(MAX_SLICE, max(MIN_SLICE, rate // 8))
        self._max_listed = max_listed
        self._call: IDelayedCall | None = None
        self._in_flight: Deferred[Any] | None = None
        # Bumped at each stop: a read that was in flight then is ignored
        # even if the service was started again meanwhile.
        self._generation = 0
        # The walk.
        self._log_seen: CommitLog | None = None
        self._offset = 0
        self._anchor: int | None = None
        self._searching = False
        self._want = 0
        # The read being confirmed: the first read's findings.
        self._first_findings: dict[int, Finding] | None = None
        self._rereads = 0
        # Passes.
        self._pass_target: int | None = None
        self._pass_started: float | None = None
        self._next_pass: float | None = None
        self._pass_bytes = 0
        self._pass_overflow = 0
        self.last_pass: dict[str, Any] | None = None
        self.passes = 0
        self.bytes_total = 0
        self.corrupt: dict[int, CorruptRecord] = {}
        self._overflow = 0

    def _default_run_in_thread(self, f: Callable[[], _Read]) -> Deferred[_Read]:
        reactor: Any = self._clock
        if IReactorThreads.providedBy(reactor):
            return deferToThreadPool(reactor, reactor.getThreadPool(), f)
        return maybeDeferred(f)

    # -- lifecycle ---------------------------------------------------------

    def startService(self) -> None:
        Service.startService(self)
        commitlog = self._commitlog()
        where = commitlog.commitlog_dir if commitlog is not None else "the store"
        if self.rate > 0:
            self._log.info(
                "scrubbing {dir} at {rate} bytes/s (--scrub-rate)", dir=where, rate=self.rate
            )
            self._schedule(0)
        else:
            self._log.info("scrub of {dir} is off (--scrub-rate 0)", dir=where)

    def stopService(self) -> Deferred[None]:
        """
        Cancel the next step; fires when a read in progress has finished
        (its result is dropped).
        """
        Service.stopService(self)
        self._generation += 1
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
        in_flight = self._in_flight
        if in_flight is None:
            return succeed(None)
        waiting: Deferred[None] = Deferred()

        def finished(result: object) -> object:
            waiting.callback(None)
            return result

        in_flight.addBoth(finished)
        return waiting

    def _schedule(self, delay: float) -> None:
        if self.running and self._call is None:
            self._call = self._clock.callLater(max(delay, 0.0), self._step)

    # -- figures -----------------------------------------------------------

    @property
    def corrupt_count(self) -> int:
        """
        Corrupt records known now, listed or not.
        """
        return len(self.corrupt) + self._overflow

    def snapshot(self) -> ScrubStatus:
        """
        Where the scrub is and what it found, now.
        """
        return ScrubStatus(
            enabled=self.rate > 0,
            rate=self.rate,
            position=self._offset,
            pass_started=self._pass_started,
            next_pass=self._next_pass if self._pass_started is None else None,
            pass_bytes=self._pass_bytes,
            passes=self.passes,
            last_pass=dict(self.last_pass) if self.last_pass is not None else None,
            bytes_total=self.bytes_total,
            corrupt_records=self.corrupt_count,
            corrupt=tuple(replace(r) for _, r in sorted(self.corrupt.items())),
        )

    def status(self) -> dict[str, Any]:
        """
        The C{scrub} object of C{/status} (L{snapshot}'s).
        """
        return self.snapshot().as_dict()

    # -- the walk ------------------------------------------------------------

    def _step(self) -> None:
        self._call = None
        commitlog = self._commitlog()
        if commitlog is None or commitlog.closed:
            self._schedule(IDLE_DELAY)
            return
        plan = self._plan(commitlog)
        if plan is None:
            return
        started = self._clock.seconds()
        d = self._in_flight = self._run_in_thread(lambda: _read_and_check(plan))
        d.addCallback(self._read_done, plan, started, self._generation)
        d.addErrback(self._step_failed)

    def _stable_end(self, commitlog: CommitLog) -> int:
        # Whole records (record_end) that are on disk (flushed_offset):
        # never the tail a slave is still receiving or a put is writing.
        return min(commitlog.record_end, commitlog.flushed_offset)

    def _plan(self, commitlog: CommitLog) -> _Plan | None:
        """
        Where the next read goes, or C{None} (and the next step scheduled)
        when there is nothing to read now.
        """
        if commitlog is not self._log_seen:
            # A new log (the service started, or a slave moved its store
            # aside): what was known is about another one.
            self._log_seen = commitlog
            self.corrupt.clear()
            self._overflow = 0
            self._pass_target = None
        if self._pass_target is None:
            self._start_pass(commitlog)
        stable = self._stable_end(commitlog)
        min_offset = commitlog.min_offset
        if self._offset < min_offset:
            # Segments went: nothing to say about them any more.
            self._offset, self._anchor, self._searching, self._want = min_offset, None, False, 0
            for offset in [o for o in self.corrupt if o < min_offset]:
                del self.corrupt[offset]
        if self._offset > stable or (self._anchor is not None and self._anchor >= stable):
            # The log was cut back below the walk (a slave's truncation):
            # go on from its record end, a record boundary.
            self._offset = min(self._offset, commitlog.record_end)
            self._anchor, self._searching, self._want = None, False, 0
            self._first_findings, self._rereads = None, 0
        assert self._pass_target is not None
        # A log cut back below the pass's end: the pass ends where it does.
        self._pass_target = min(self._pass_target, commitlog.record_end)
        if self._offset >= self._pass_target:
            self._end_pass(commitlog, 0.0)
            return None
        size = commitlog.segment_size
        segment_start = self._offset - self._offset % size
        segment_end = segment_start + size
        limit = min(stable, segment_end)
        if self._want > MAX_RECORD_READ:
            self._log.warn(
                "scrub: the record at offset {offset} in segment {segment} says it "
                "is {size} bytes, more than the scrub reads at once ({most}); the "
                "rest of the segment is not checked in this pass (rmqha store "
                "check reads it)",
                offset=self._offset,
                segment=segment_name(segment_start),
                size=self._want,
                most=MAX_RECORD_READ,
            )
            self._offset, self._anchor, self._searching, self._want = (
                segment_end, None, False, 0,
            )
            self._schedule(0)
            return None
        if self._offset + max(self._want, 1) > limit:
            # Nothing (or not all of the next record) is stable yet.
            self._schedule(IDLE_DELAY)
            return None
        start = self._anchor if self._anchor is not None else self._offset
        length = min(max(self._slice, self._want + self._offset - start), limit - start)
        name = segment_name(segment_start)
        return _Plan(
            commitlog=commitlog,
            path=os.path.join(commitlog.commitlog_dir, name),
            segment_name=name,
            segment_start=segment_start,
            segment_size=size,
            start=start,
            length=length,
            limit=limit,
            anchored=self._anchor is not None,
            searching=self._searching,
            cold=segment_end <= commitlog.flushed_offset,
        )

    def _start_pass(self, commitlog: CommitLog) -> None:
        self._offset = commitlog.min_offset
        self._anchor, self._searching, self._want = None, False, 0
        self._first_findings, self._rereads = None, 0
        self._pass_target = self._stable_end(commitlog)
        self._pass_started = self._clock.seconds()
        self._pass_bytes = 0
        self._pass_overflow = 0

    def _end_pass(self, commitlog: CommitLog, delay: float) -> None:
        """
        A pass reached its end: count it, and start the next one after
        the pass interval (measured from this pass's start), and at least
        C{delay} from now.
        """
        now = self._clock.seconds()
        assert self._pass_started is not None
        self.passes += 1
        self._overflow = self._pass_overflow
        self.last_pass = {
            "started": self._pass_started,
            "ended": now,
            "bytes": self._pass_bytes,
            "end_offset": self._pass_target,
            "corrupt_records": self.corrupt_count,
        }
        self._log.info(
            "scrub pass {passes} of {dir} done: {bytes} bytes up to offset {end} "
            "in {seconds:.0f} s, {corrupt} corrupt records",
            passes=self.passes,
            dir=commitlog.commitlog_dir,
            bytes=self._pass_bytes,
            end=self._pass_target,
            seconds=now - self._pass_started,
            corrupt=self.corrupt_count,
        )
        self._pass_target = self._pass_started = None
        self._next_pass = max(now + delay, self.last_pass["started"] + self._pass_interval)
        self._schedule(self._next_pass - now)

    def _step_failed(self, failure: Failure) -> None:
        self._in_flight = None
        if not self.running:
            return
        self._log.failure("scrub step failed; trying again", failure)
        self._schedule(IDLE_DELAY * 10)

    def _read_done(self, read: _Read, plan: _Plan, started: float, generation: int) -> None:
        if generation != self._generation:
            return
        self._in_flight = None
        if not self.running:
            return
        now = self._clock.seconds()
        self.bytes_total += read.size
        self._pass_bytes += read.size
        commitlog = self._commitlog()
        delay = max(started + read.size / self.rate - now, (now - started) * (1 / MAX_BUSY - 1))
        if (
            commitlog is not plan.commitlog
            or commitlog is None
            or commitlog.closed
            or self._stable_end(commitlog) < plan.limit
            or commitlog.min_offset > plan.start
        ):
            # The log changed under the read (cut back, moved aside,
            # closed): plan again from what it is now, reporting nothing.
            self._first_findings, self._rereads = None, 0
            self._schedule(delay)
            return
        result = read.result
        if result is None:
            # Unreadable bytes (EIO), or a file missing or short while the
            # log says it is there: one finding for the range (for the
            # rest of the segment when the file is the problem), and the
            # walk goes on after it.
            assert read.error is not None
            after = plan.start + plan.length
            segment_end = plan.segment_start + plan.segment_size
            if read.whole:
                after = segment_end
            result = ChunkResult(
                min(after, segment_end),
                after < segment_end,
                None,
                [Finding(plan.start, f"{read.error} (offsets {plan.start}..{after})")],
            )
            delay = max(delay, IDLE_DELAY)
        if result.lost_anchor:
            self._log.debug(
                "scrub: record at {offset} changed under the walk; segment "
                "{segment} again from its start",
                offset=plan.start,
                segment=plan.segment_name,
            )
            self._offset, self._anchor, self._searching, self._want = (
                plan.segment_start, None, False, 0,
            )
            self._first_findings, self._rereads = None, 0
            self._schedule(delay)
            return
        found = {f.offset: f for f in result.findings}
        if found and self._first_findings is None:
            # Read it all again (from a fresh plan) before saying anything.
            self._first_findings = found
            self._schedule(delay)
            return
        first, self._first_findings = self._first_findings or {}, None
        confirmed = [f for offset, f in sorted(found.items()) if offset in first]
        for finding in confirmed:
            self._report(commitlog, plan, finding, now)
        if set(found) - set(first) and self._rereads < _MAX_REREADS:
            # This read saw damage the one before did not (it reached
            # further): read again rather than step over it unconfirmed.
            self._rereads += 1
            self._first_findings = found
            self._schedule(delay)
            return
        self._rereads = 0
        uncertain = set(found) | set(first)
        covered_end = result.next_offset
        for offset in [
            o for o in self.corrupt
            if plan.start <= o < covered_end and o not in uncertain
        ]:
            record = self.corrupt.pop(offset)
            self._log.info(
                "scrub: the record at offset {offset} in segment {segment} "
                "verifies again",
                offset=offset,
                segment=record.segment,
            )
        self._offset = result.next_offset
        self._anchor = result.anchor
        self._searching = result.searching
        self._want = result.want
        if self._pass_target is not None and self._offset >= min(
            self._pass_target, commitlog.record_end
        ):
            self._end_pass(commitlog, delay)
        else:
            self._schedule(delay)

    def _report(
        self, commitlog: CommitLog, plan: _Plan, finding: Finding, now: float
    ) -> None:
        known = self.corrupt.get(finding.offset)
        if known is not None:
            known.reason, known.resumed_at = finding.reason, finding.resumed_at
            return
        if len(self.corrupt) >= self._max_listed:
            self._pass_overflow += 1
            self._overflow = max(self._overflow, self._pass_overflow)
            if self._pass_overflow == 1:
                self._log.error(
                    "scrub: more than {n} corrupt records in {dir}; the rest "
                    "are counted, not listed (rmqha store check lists the first)",
                    n=self._max_listed,
                    dir=commitlog.commitlog_dir,
                )
            return
        self.corrupt[finding.offset] = CorruptRecord(
            finding.offset, plan.segment_name, finding.reason, now, finding.resumed_at
        )
        store = commitlog.store_dir
        if self.slave:
            hint = (
                "this slave's copy is damaged; the master has the record: stop "
                f"the slave and run `rmqha store repair {store} --from "
                "MASTER_DIR`, or move the store aside and let the slave copy "
                "the log from its master again"
            )
        else:
            hint = (
                "repair it from a replica's good copy: stop the broker and run "
                f"`rmqha store repair {store} --from REPLICA_DIR`"
            )
        self._log.error(
            "scrub: corrupt record at offset {offset} in segment {segment}: "
            "{reason}; {next}; {hint}",
            offset=finding.offset,
            segment=os.path.join(commitlog.commitlog_dir, plan.segment_name),
            reason=finding.reason,
            next=(
                f"the next good record is at offset {finding.resumed_at}"
                if finding.resumed_at is not None
                else "no good record after it in what was read"
            ),
            hint=hint,
        )

