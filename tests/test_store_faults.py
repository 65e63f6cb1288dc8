"""
Faults the store cannot hide (issue 25, item 8): a segment file truncated,
removed or replaced by another process under the open commit log.

The log must not die of it (SIGBUS: the mapping's pages past the file's new
end), must refuse every write from then on with one line naming the file,
and must not count as written or flushed what went nowhere; the master
stops replicating and tells its slaves why (CLOSING), a slave shows it as
its problem, and a slave's own damaged log halts its replication.  Reads of
an older segment whose file went missing end the one transfer with a line
naming the file, without a traceback.
"""

from __future__ import annotations

import mmap
import os
import signal
import struct
import subprocess
import sys
import textwrap
import zlib
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.address import IPv4Address
from twisted.internet.defer import succeed
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import LogLevel, capturedLogs, formatEvent
from twisted.trial.unittest import SynchronousTestCase

import rmqha
from rmqha.admin import status
from rmqha.broker import NotStoredError, Role
from rmqha.ha._wire import (
    CHECKED_HELLO,
    MasterClosing,
    ProtocolError,
    TransferDecoder,
    encode_closing,
    encode_code,
)
from rmqha.ha.config import HAConfig
from rmqha.ha.group import PutStatus
from rmqha.ha.master import MasterConnection, MasterFactory
from rmqha.ha.replica import ReplicaState
from rmqha.ha.slave import SlaveFactory
from rmqha.store import _guard, _spans
from rmqha.store._record import Message
from rmqha.store._segments import FlushDiskType
from rmqha.store.commitlog import CommitLog
from rmqha.store.errors import CorruptStoreError, SegmentReadError, StoreDamagedError
from rmqha.store.service import CommitLogService

from tests._helpers import (
    PurePath,
    fixed_clock,
    make_message,
    mark_unclean,
    open_store,
    replica_records,
    segment_path,
)
from tests.test_roles import _InMemory

#: Large enough that the tests write several pages and cut well below the
#: put position (a cut inside the page, or the large folio, that holds the
#: put position may not fault: L{LiveSegmentTests.test_cut_found_by_check}).
SEGMENT = 1 << 20
BODY = b"f" * 1000


def closing(text: str) -> bytes:
    """
    A master's CLOSING, by hand: int64 -0x524D514841000E, uint16 length,
    the UTF-8 text, the CRC-32 of the bytes before it.
    """
    data = text.encode("utf-8")
    message = struct.pack(">qH", -0x524D514841000E, len(data)) + data
    return message + struct.pack(">I", zlib.crc32(message))


def checked_report(offset: int) -> bytes:
    """
    A checked report, by hand: int64 offset, CRC-32 of those 8 bytes.
    """
    data = struct.pack(">q", offset)
    return data + struct.pack(">I", zlib.crc32(data))


class _Store(SynchronousTestCase):
    """
    A store with a hundred records in its first segment.
    """

    def setUp(self) -> None:
        self.log = open_store(self, segment_size=SEGMENT)
        for _ in range(100):
            self.log.put(make_message(BODY))
        self.path = segment_path(self.log.store_dir, 0)
        self.written = self.log.max_offset
        self.told: list[StoreDamagedError] = []
        self.log.observe_damage(self.told.append)

    def assert_refuses(self, what: str) -> StoreDamagedError:
        """
        A put and a batch are refused with one line naming the file and
        C{what}, and write nothing.
        """
        end = self.log.max_offset
        error = self.assertRaises(StoreDamagedError, self.log.put, make_message(BODY))
        self.assertIn(self.path, str(error))
        self.assertIn(what, str(error))
        self.assertNotIn("\n", str(error))
        self.assertEqual(error.filename, self.path)
        self.assertRaises(StoreDamagedError, self.log.put_batch, [make_message(BODY)] * 3)
        self.assertEqual(self.log.max_offset, end)
        self.assertIsNotNone(self.log.damage)
        self.assertEqual(len(self.told), 1)
        return error


class LiveSegmentTests(_Store):
    """
    The segment file puts go to, changed under the open log.
    """

    def test_cut_put_refused_not_killed(self) -> None:
        """
        Truncated to nothing, the file no longer has the page the next put
        writes: the write faults (SIGBUS), the guard absorbs it, and the
        put is refused naming the file and its new size, as is every
        write after it.
        """
        if not _guard.AVAILABLE:
            self.skipTest("the compiled module (and its SIGBUS guard) is not built")
        faults = _guard.faults()
        os.truncate(self.path, 0)
        self.assert_refuses("was truncated to 0 bytes")
        self.assertGreater(_guard.faults(), faults)
        self.assertEqual(os.path.getsize(self.path), 0)

    def test_cut_ahead_of_the_puts(self) -> None:
        """
        Truncated past what is written: the puts before the cut are whole
        in the file; the first one reaching the cut is refused.
        """
        if not _guard.AVAILABLE:
            self.skipTest("the compiled module (and its SIGBUS guard) is not built")
        cut = self.written + 64 * 1024
        os.truncate(self.path, cut)
        with self.assertRaises(StoreDamagedError) as caught:
            for _ in range(200):
                self.log.put(make_message(BODY))
        self.assertIn(f"was truncated to {cut} bytes", str(caught.exception))
        self.assertLessEqual(self.log.max_offset, cut + 4096)

    def test_cut_found_by_check(self) -> None:
        """
        A cut inside the page (or large folio) the puts are writing does not
        fault: the put may go on into a page the file no longer has (the
        window docs/store.md states).  The next look at the file (the
        service's timer, a flush, a roll) finds it, and from then on
        every write is refused.
        """
        os.truncate(self.path, self.written - 10)
        damage = self.log.check()
        assert damage is not None
        self.assertIn(f"was truncated to {self.written - 10} bytes", str(damage))
        self.assertIn(f"{self.written} of them written", str(damage))
        self.assert_refuses("was truncated")
        self.assertIs(self.log.check(), self.log.damage)

    def test_fault_of_a_mapping_since_closed(self) -> None:
        """
        A fault absorbed in a mapping that was closed since (recovery's
        walk at open reads through mappings and lets them go) still counts:
        the open's own look refuses the log.
        """
        if not _guard.AVAILABLE:
            self.skipTest("the compiled module (and its SIGBUS guard) is not built")
        segment = self.log._segments[0]
        self.log._release_prefault()  # (its thread holds the mapping)
        segment.release_mapping()
        segment.close_fd()
        mm = segment.mm
        os.truncate(self.path, 4096)
        self.assertEqual(mm[SEGMENT // 2], 0)
        segment.close()
        self.assertIn("position 524288", str(self.log.check()))

    def test_removed(self) -> None:
        """
        The file unlinked: puts would go to a file nobody can open again.
        """
        os.unlink(self.path)
        self.assertIn("was removed", str(self.log.check()))
        self.assert_refuses("was removed")
        self.assertFalse(os.path.exists(self.path))

    def test_replaced(self) -> None:
        """
        Another file renamed over it (the directory entry replaced), even
        with a hard link keeping the old file alive.
        """
        os.link(self.path, self.path + ".old")
        other = self.path + ".new"
        with open(other, "wb") as f:
            f.truncate(SEGMENT)
        os.rename(other, self.path)
        self.assertIn("was replaced by another file", str(self.log.check()))
        self.assert_refuses("was replaced by another file")
        with open(self.path, "rb") as f:
            self.assertEqual(f.read(), bytes(SEGMENT))

    def test_read_of_cut_bytes_refused(self) -> None:
        """
        The transfer read of bytes this process put (a slice of the
        mapping) after the file was cut below them: refused, not zeros.
        """
        if not _guard.AVAILABLE:
            self.skipTest("the compiled module (and its SIGBUS guard) is not built")
        os.truncate(self.path, 0)
        error = self.assertRaises(StoreDamagedError, self.log.read, 4096, 1000)
        self.assertIn("was truncated to 0 bytes", str(error))

    def test_flush_does_not_count(self) -> None:
        """
        A flush to a file cut meanwhile is not counted: the flushed offset
        stays; with SYNC_FLUSH inline, the put is refused.
        """
        flushed = self.log.flush()
        self.log.put(make_message(BODY))
        os.truncate(self.path, self.written - 10)
        self.assertEqual(self.log.flush(), flushed)
        self.assertIsNotNone(self.log.damage)

    def test_sync_flush_put_refused(self) -> None:
        """
        Under SYNC_FLUSH (inline), the put's own flush finds the cut file
        and the put is refused (it is not on disk).
        """
        log = open_store(self, segment_size=SEGMENT, flush_disk_type=FlushDiskType.SYNC_FLUSH)
        log.put(make_message(BODY))
        end = log.max_offset
        os.truncate(segment_path(log.store_dir, 0), end - 10)
        self.assertRaises(StoreDamagedError, log.put, make_message(BODY))
        self.assertEqual(log.flushed_offset, end)

    def test_roll_refused(self) -> None:
        """
        The roll (BLANK and the next segment) looks at the file it closes
        first: a cut one is not closed with a BLANK, no segment is made.
        """
        log = open_store(self, segment_size=64 * 1024)
        while log.max_offset < 60 * 1024:
            log.put(make_message(BODY))
        path = segment_path(log.store_dir, 0)
        os.truncate(path, 4096)
        with self.assertRaises(StoreDamagedError):
            for _ in range(10):
                log.put(make_message(BODY))
        self.assertEqual(len(log.segments), 1)
        self.assertEqual(os.listdir(os.path.dirname(path)), [os.path.basename(path)])

    def test_told_once_logged_once(self) -> None:
        """
        The damage is logged once (an error naming the file), and each
        observer told once, however many writes are refused after it.
        """
        os.unlink(self.path)
        with capturedLogs() as events:
            for _ in range(3):
                self.log.check()
                self.assertRaises(StoreDamagedError, self.log.put, make_message(BODY))
        errors = [e for e in events if e["log_level"] >= LogLevel.warn]
        self.assertEqual(len(errors), 1, [formatEvent(e) for e in errors])
        self.assertIn(self.path, formatEvent(errors[0]))
        self.assertEqual(len(self.told), 1)

    def test_close_keeps_abort_reopen_refuses(self) -> None:
        """
        Closing a damaged log writes nothing (no queue snapshot, no cut)
        and leaves the abort marker; the next open refuses the short file,
        naming it, and leaves it as it is — also without a configured
        segment size, where a lone file's size used to be taken for the
        segment size.
        """
        os.truncate(self.path, self.written - 1000)
        self.log.check()
        self.log.close()
        self.assertTrue(os.path.exists(os.path.join(self.log.store_dir, "abort")))
        self.assertEqual(os.path.getsize(self.path), self.written - 1000)
        error = self.assertRaises(
            CorruptStoreError, CommitLog.open, self.log.store_dir, clock=fixed_clock
        )
        self.assertIn(self.path, str(error))
        self.assertIn(f"was truncated to {self.written - 1000} bytes", str(error))
        self.assertIn("damaged.json", str(error))
        self.assertEqual(os.path.getsize(self.path), self.written - 1000)


    def test_cut_to_nothing_is_not_deleted_at_open(self) -> None:
        """
        A file cut to nothing looks like one whose creation was interrupted
        (short, all zeros: deleted at open, the log then ending before it).
        The damage was recorded when it was found: the next open refuses
        it, naming it, and leaves it as it is.
        """
        os.truncate(self.path, 0)
        self.log.check()
        self.log.close()
        error = self.assertRaises(
            CorruptStoreError,
            CommitLog.open,
            self.log.store_dir,
            segment_size=SEGMENT,
            clock=fixed_clock,
        )
        self.assertIn(self.path, str(error))
        self.assertIn("was truncated to 0 bytes", str(error))
        self.assertNotIn("\n", str(error))
        self.assertEqual(os.path.getsize(self.path), 0)

    def test_restored_file_opens(self) -> None:
        """
        The file put back (from a replica, say): the store opens, says what
        the last run found, and keeps that record in the quarantine.
        """
        with open(self.path, "rb") as f:
            saved = f.read()
        os.truncate(self.path, 0)
        self.log.check()
        self.log.close()
        with open(self.path, "wb") as f:
            f.write(saved)
        with capturedLogs() as events:
            log = open_store(self, self.log.store_dir, segment_size=SEGMENT)
        self.assertEqual(log.max_offset, self.written)
        lines = [formatEvent(e) for e in events if "the last run found" in formatEvent(e)]
        self.assertEqual(len(lines), 1, lines)
        self.assertIn("was truncated to 0 bytes", lines[0])
        quarantine = os.path.join(self.log.store_dir, "rmqha", "quarantine")
        self.assertEqual(
            [name.startswith("damaged-") for name in os.listdir(quarantine)], [True]
        )
        self.assertFalse(os.path.exists(os.path.join(self.log.store_dir, "rmqha", "damaged.json")))


class ReplicaAppendTests(SynchronousTestCase):
    """
    A slave's appends (pwrite, not the mapping) into a changed file.
    """

    def setUp(self) -> None:
        self.log = open_store(self, segment_size=SEGMENT)
        self.log.append_at(0, replica_records(0, 500, 500, 500))
        self.path = segment_path(self.log.store_dir, 0)

    def test_cut_file_not_grown_back(self) -> None:
        """
        A pwrite past the end of a cut file would grow it back with a hole
        in place of the cut records: the append is refused first, and the
        file stays as the cut left it.
        """
        os.truncate(self.path, 100)
        error = self.assertRaises(
            StoreDamagedError, self.log.append_at, 1500, replica_records(1500, 500)
        )
        self.assertIn("was truncated to 100 bytes", str(error))
        self.assertEqual(os.path.getsize(self.path), 100)
        self.assertEqual(self.log.max_offset, 1500)

    def test_removed(self) -> None:
        """
        Into a removed file the bytes go nowhere: once the look at the
        files (the timer, a flush) found it, appends are refused.  (Before
        each append only the size is looked at: docs/store.md.)
        """
        os.unlink(self.path)
        self.assertIn("was removed", str(self.log.check()))
        error = self.assertRaises(
            StoreDamagedError, self.log.append_at, 1500, replica_records(1500, 500)
        )
        self.assertIn("was removed", str(error))
        self.assertEqual(self.log.max_offset, 1500)

    def test_discard_and_truncate(self) -> None:
        """
        A damaged log cuts nothing: discarding an incomplete record (every
        reconnect does) is a no-op, a divergence cut is refused.
        """
        self.log.append_at(1500, replica_records(1500, 500)[:100])
        os.unlink(self.path)
        self.log.check()
        self.log.discard_incomplete_record()
        self.assertEqual(self.log.max_offset, 1600)
        self.assertRaises(StoreDamagedError, self.log.truncate_replica, 500)


class OldSegmentReadTests(SynchronousTestCase):
    """
    Reading an older segment (full, flushed, its descriptor closed) whose
    file went: that read fails naming the file; the log still takes puts.
    """

    def setUp(self) -> None:
        self.log = open_store(self, segment_size=64 * 1024)
        while len(self.log.segments) < 3:
            self.log.put(make_message(BODY))
        self.log.flush()
        self.path = segment_path(self.log.store_dir, 0)

    def assert_read_fails(self, what: str) -> None:
        """
        A read and a span for sending from the file (L{CommitLog.file_span})
        fail naming the file and C{what}; the log is not damaged.
        """
        for read in (self.log.read, self.log.file_span):
            error = self.assertRaises(SegmentReadError, read, 0, 1000)
            self.assertIn(self.path, str(error))
            self.assertIn(what, str(error))
            self.assertIsNone(self.log.damage)
        self.log.put(make_message(BODY))
        self.assertIsNone(self.log.check())

    def test_removed(self) -> None:
        os.unlink(self.path)
        self.assert_read_fails("was removed")

    def test_replaced(self) -> None:
        """
        A copy renamed over it is another file (another inode): its bytes
        are not served as the log's.
        """
        copy = self.path + ".copy"
        with open(self.path, "rb") as f, open(copy, "wb") as g:
            g.write(f.read())
        os.rename(copy, self.path)
        self.assert_read_fails("was replaced by another file")

    def test_cut(self) -> None:
        os.truncate(self.path, 100)
        self.assert_read_fails("was truncated to 100 bytes")

    def test_cut_under_a_span(self) -> None:
        """
        Cut after a span opened it: the next span fails naming the cut; cut
        between the size check and the checksum (the mapping faults: the
        SIGBUS guard absorbs it), the span fails naming the fault.  The log
        is not damaged either way, and the next span opens the file again.
        """
        self.log.file_span(0, 1000)
        os.truncate(self.path, 100)
        error = self.assertRaises(SegmentReadError, self.log.file_span, 1000, 1000)
        self.assertIn(f"segment file {self.path}: was truncated to 100 bytes", str(error))
        self.assertIsNone(self.log.damage)
        if not _guard.AVAILABLE:
            self.skipTest("the compiled module (and its SIGBUS guard) is not built")
        with open(self.path, "r+b") as f:
            f.truncate(64 * 1024)
        self.log.file_span(0, 1000)
        os.truncate(self.path, 100)
        # (The size check passes as if the cut came just after it.)
        lseek = self.patch(_spans.os, "lseek", lambda fd, position, how: 64 * 1024)
        error = self.assertRaises(SegmentReadError, self.log.file_span, 8192, 1000)
        lseek.restore()
        self.assertIn(
            f"segment file {self.path}: could not be read through its mapping at position 8192",
            str(error),
        )
        self.log.put(make_message(BODY))
        self.assertIsNone(self.log.check())
        self.assertIsNone(self.log.damage)


class PureLiveSegmentTests(PurePath, LiveSegmentTests):
    """L{LiveSegmentTests} on the pure-Python codec (the guard stays: not codec)."""


class PureReplicaAppendTests(PurePath, ReplicaAppendTests):
    """L{ReplicaAppendTests} on the pure-Python codec."""


class ServiceCheckTests(SynchronousTestCase):
    """
    The store service looks at the files on a timer, in both flush modes.
    """

    def test_timer_finds_it(self) -> None:
        for flush in FlushDiskType:
            clock = Clock()
            store = self.mktemp()
            service = CommitLogService(
                lambda: CommitLog.open(
                    store, segment_size=SEGMENT, clock=fixed_clock, flush_disk_type=flush
                ),
                clock,
                run_in_thread=lambda f: succeed(f()),
            )
            service.startService()
            log = service.commitlog
            assert log is not None
            log.put(make_message(BODY))
            os.unlink(segment_path(store, 0))
            clock.advance(0.4)
            self.assertIsNone(log.damage)
            clock.advance(0.1)
            self.assertIn("was removed", str(log.damage))
            self.successResultOf(service.stopService())
            self.assertEqual(clock.getDelayedCalls(), [])
            self.assertTrue(os.path.exists(os.path.join(store, "abort")))


    def test_sync_flush_waiters_left_to_time_out(self) -> None:
        """
        SYNC_FLUSH group commit: the flush that finds the file cut does not
        count, and is not run again and again for the puts waiting on it
        (they end with their timeout, FLUSH_DISK_TIMEOUT).
        """
        clock = Clock()
        store = self.mktemp()
        flushes: list[object] = []

        def run(f: Any) -> Any:
            flushes.append(f)
            return succeed(f())

        service = CommitLogService(
            lambda: CommitLog.open(
                store,
                segment_size=SEGMENT,
                clock=fixed_clock,
                flush_disk_type=FlushDiskType.SYNC_FLUSH,
            ),
            clock,
            run_in_thread=run,
        )
        service.startService()
        log = service.commitlog
        assert log is not None
        end = log.put(make_message(BODY)).next_offset
        os.truncate(segment_path(store, 0), end - 10)
        waiting = service.when_flushed(end)
        self.assertNoResult(waiting)
        self.assertEqual(len(flushes), 1)
        self.assertIsNotNone(log.damage)
        self.successResultOf(service.stopService())
        self.assertEqual(clock.getDelayedCalls(), [])


class GuardProcessTests(SynchronousTestCase):
    """
    The SIGBUS guard in processes of their own: what it absorbs, and what
    it leaves to the handler before it (so faults elsewhere still kill).
    """

    def run_python(self, code: str, *extra: str) -> subprocess.CompletedProcess[str]:
        if not _guard.AVAILABLE:
            self.skipTest("the compiled module (and its SIGBUS guard) is not built")
        prelude = textwrap.dedent(
            """
            import faulthandler, mmap, os, sys, tempfile
            from rmqha.store import _guard

            def mapping():
                fd, path = tempfile.mkstemp(dir=sys.argv[1])
                os.posix_fallocate(fd, 0, 1 << 20)
                return fd, mmap.mmap(fd, 1 << 20)
            """
        )
        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        # (This checkout's rmqha, whatever the working directory is.)
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(rmqha.__file__)))
        env.pop("PYTHONFAULTHANDLER", None)
        return subprocess.run(
            [sys.executable, *extra, "-c", prelude + textwrap.dedent(code), directory],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )

    def test_guarded_fault_absorbed(self) -> None:
        """
        A write and a read past the end of a cut file, through a guarded
        mapping: both complete (the read gives zeros), the fault is
        recorded with its page.
        """
        done = self.run_python(
            """
            fd, mm = mapping()
            slot = _guard.add(mm)
            os.ftruncate(fd, 0)
            mm[600000:600004] = b"abcd"
            print(mm[600000:600004] == b"abcd", mm[900000], _guard.fault(slot), _guard.faults())
            """
        )
        page = 600000 - 600000 % mmap.PAGESIZE
        self.assertEqual(
            (done.returncode, done.stdout.split()), (0, ["True", "0", str(page), "1"]), done.stderr
        )

    def test_fault_elsewhere_still_kills(self) -> None:
        """
        A fault in a mapping nobody guarded goes to the default action
        (the guard installed meanwhile): the process dies of SIGBUS.
        """
        done = self.run_python(
            """
            fd, mm = mapping()
            _guard.add(mm)
            fd2, other = mapping()
            os.ftruncate(fd2, 0)
            other[500000] = 1
            print("alive")
            """
        )
        self.assertEqual((done.returncode, done.stdout), (-signal.SIGBUS, ""))

    def test_faulthandler_before_chained(self) -> None:
        """
        With faulthandler enabled first (python -X faulthandler, pytest): a
        guarded fault never reaches it; one elsewhere is its to report.
        """
        done = self.run_python(
            """
            fd, mm = mapping()
            _guard.add(mm)
            os.ftruncate(fd, 0)
            mm[600000] = 1
            print("alive", flush=True)
            fd2, other = mapping()
            os.ftruncate(fd2, 0)
            other[500000] = 1
            """,
            "-X",
            "faulthandler",
        )
        self.assertEqual((done.returncode, done.stdout), (-signal.SIGBUS, "alive\n"))
        self.assertEqual(done.stderr.count("Bus error"), 1, done.stderr)

    def test_faulthandler_after_survives(self) -> None:
        """
        faulthandler enabled after the guard sees a guarded fault first: it
        dumps the stacks, and the guard still keeps the process alive.
        """
        done = self.run_python(
            """
            fd, mm = mapping()
            slot = _guard.add(mm)
            faulthandler.enable()
            os.ftruncate(fd, 0)
            mm[600000] = 1
            print("alive", _guard.fault(slot))
            """
        )
        page = 600000 - 600000 % mmap.PAGESIZE
        self.assertEqual((done.returncode, done.stdout), (0, f"alive {page}\n"), done.stderr)

    def test_sigbus_from_another_process(self) -> None:
        """
        A SIGBUS another process sends is not a fault: the default action.
        """
        done = self.run_python(
            """
            import subprocess
            fd, mm = mapping()
            _guard.add(mm)
            subprocess.run([
                sys.executable, "-c",
                f"import os, signal; os.kill({os.getpid()}, signal.SIGBUS)",
            ])
            print("alive")
            """
        )
        self.assertEqual((done.returncode, done.stdout), (-signal.SIGBUS, ""))


class MasterSideTests(SynchronousTestCase):
    """
    The master reading for a slave from a log whose files changed.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.store = open_store(self, segment_size=64 * 1024)
        while len(self.store.segments) < 3:
            self.store.put(make_message(BODY))
        self.store.flush()
        self.factory = MasterFactory(self.store, self.clock, HAConfig())
        self.addCleanup(self.factory.stopFactory)
        self.store.observe_damage(self.factory.store_damaged)
        self.addCleanup(lambda: self.assertEqual(self.clock.getDelayedCalls(), []))

    def connect(self, checked: bool) -> tuple[MasterConnection, StringTransport]:
        connection = self.factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000))
        transport = StringTransport()
        connection.makeConnection(transport)
        self.addCleanup(lambda: transport.producer is not None and connection.connectionLost())
        return connection, transport

    def first_report(self, connection: MasterConnection, offset: int, checked: bool) -> None:
        if checked:
            connection.dataReceived(encode_code(CHECKED_HELLO) + checked_report(offset))
        else:
            connection.dataReceived(struct.pack(">q", offset))

    def last_words(self, transport: StringTransport) -> str:
        """
        The CLOSING text the master sent on a checked connection before it
        closed it (the slave's decoder reads it).
        """
        decoder = TransferDecoder(checked=True)
        decoder.feed(transport.value())
        try:
            while decoder.next_frame() is not None:
                pass
        except MasterClosing as e:
            return e.reason
        self.fail(f"no CLOSING in {transport.value()[-200:]!r}")

    def test_removed_old_segment(self) -> None:
        """
        A slave needing a segment whose file is gone: one line naming the
        file, no traceback; an rmqha slave is told the same line (CLOSING,
        exactly as built by hand) before the close; a classic one sees the
        connection end.  The master still takes puts.
        """
        path = segment_path(self.store.store_dir, 0)
        os.unlink(path)
        for checked in (False, True):
            connection, transport = self.connect(checked)
            with capturedLogs() as events:
                self.first_report(connection, 0, checked)
            lines = [formatEvent(e) for e in events if e["log_level"] >= LogLevel.warn]
            self.assertEqual(len(lines), 1, lines)
            self.assertIn(f"segment file {path}: was removed", lines[0])
            self.assertIn("at offset 0", lines[0])
            self.assertEqual(self.flushLoggedErrors(), [])
            if checked:
                reason = self.last_words(transport)
                self.assertIn(f"segment file {path}: was removed", reason)
                self.assertTrue(transport.value().endswith(closing(reason)))
                self.assertTrue(transport.disconnecting)
            else:
                self.assertTrue(transport.disconnected)
            connection.connectionLost()
        self.store.put(make_message(BODY))
        self.assertIsNone(self.store.damage)

    def test_damage_halts_replication(self) -> None:
        """
        The live segment cut: on the next reactor turn every slave is
        dropped, told why; a slave connecting later is refused the same way.
        """
        connection, transport = self.connect(True)
        self.first_report(connection, self.store.max_offset, True)
        os.unlink(segment_path(self.store.store_dir, 2 * 64 * 1024))
        self.store.check()
        self.assertFalse(transport.disconnecting)
        self.clock.advance(0)
        self.assertIn("the master's commit log is damaged", self.last_words(transport))
        self.assertIn("was removed", self.last_words(transport))
        later, later_transport = self.connect(True)
        self.first_report(later, 0, True)
        self.assertIn("was removed", self.last_words(later_transport))
        self.assertFalse(later.replicating)

    def test_control_session_on_damaged_master(self) -> None:
        """
        A control session gets INFO (an rmqha master), then the reason
        and the close.
        """
        os.unlink(segment_path(self.store.store_dir, 2 * 64 * 1024))
        self.store.check()
        self.clock.advance(0)
        connection, transport = self.connect(False)
        connection.dataReceived(encode_code(-1))
        sent = transport.value()
        self.assertEqual(struct.unpack_from(">q", sent)[0], -0x524D5148410002)
        self.assertTrue(sent[36:].startswith(struct.pack(">q", -0x524D514841000E)))
        self.assertIn(b"was removed", sent[36:])
        self.assertTrue(transport.disconnecting)

    def test_digest_of_removed_segment(self) -> None:
        """
        A DIGEST of bytes the log holds but whose file is gone is not
        answered as a refusal (which a slave takes for different bytes and
        may cut its log over) but with the reason, and the session ends.
        """
        path = segment_path(self.store.store_dir, 0)
        os.unlink(path)
        connection, transport = self.connect(False)
        request = struct.pack(">qqq", -0x524D5148410003, 0, 1000)
        with capturedLogs() as events:
            connection.dataReceived(
                encode_code(-1) + request + struct.pack(">I", zlib.crc32(request))
            )
        sent = transport.value()[36:]
        self.assertTrue(sent.startswith(struct.pack(">q", -0x524D514841000E)), sent)
        self.assertIn(f"segment file {path}: is missing".encode(), sent)
        lines = [formatEvent(e) for e in events if e["log_level"] >= LogLevel.warn]
        self.assertEqual(len(lines), 1, lines)
        self.assertIn(path, lines[0])
        self.assertEqual(self.flushLoggedErrors(), [])


class ClosingWireTests(SynchronousTestCase):
    """
    CLOSING on the wire, as the slave's checked decoder reads it.
    """

    @settings(deadline=None, derandomize=True, max_examples=200)
    @given(
        data=st.data(),
        reason=st.text(min_size=0, max_size=300).filter(str.isprintable),
    )
    def test_after_frames_any_chunking(self, data: Any, reason: str) -> None:
        """
        Frames, then CLOSING built by hand, fed in any chunking: the frames
        come out, then the reason (the stream ends there).
        """
        body = b"r" * 50
        head = struct.pack(">qiI", 0, len(body), zlib.crc32(body))
        stream = (
            encode_code(-0x524D5148410005)
            + head + struct.pack(">I", zlib.crc32(head)) + body
            + closing(reason)
        )
        cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
        decoder = TransferDecoder(checked=True)
        frames, said = [], None
        try:
            for start, end in zip([0, *cuts], [*cuts, len(stream)]):
                decoder.feed(stream[start:end])
                while (frame := decoder.next_frame()) is not None:
                    frames.append((frame.offset, bytes(frame.body)))
        except MasterClosing as e:
            said = e.reason
        self.assertEqual((frames, said), ([(0, body)], reason))

    def test_damaged(self) -> None:
        """
        Every single-bit flip of a CLOSING (after the code) is caught: a
        CRC failure, or a length over the limit; never a wrong reason.
        """
        message = closing("segment file X: was removed")
        for bit in range(64, len(message) * 8):
            flipped = bytearray(message)
            flipped[bit // 8] ^= 1 << (bit % 8)
            decoder = TransferDecoder(checked=True)
            decoder.feed(encode_code(-0x524D5148410005) + bytes(flipped) + bytes(2000))
            with self.assertRaises(ProtocolError) as caught:
                decoder.next_frame()
            self.assertNotIsInstance(caught.exception, MasterClosing)

    def test_encoder_matches_by_hand(self) -> None:
        """
        L{encode_closing} makes what the layout says (and cuts a long text
        at 1024 bytes, at a character).
        """
        self.assertEqual(encode_closing("why"), closing("why"))
        self.assertEqual(encode_closing("é" * 600), closing("é" * 512))


class SlaveSideTests(SynchronousTestCase):
    """
    A slave told why (CLOSING), or closed on without a word.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.log = open_store(self, segment_size=SEGMENT)
        self.factory = SlaveFactory(self.log, self.clock, HAConfig())
        self.factory.checked = True

    def connect(self) -> Any:
        connection = self.factory.buildProtocol(None)
        transport = StringTransport()
        connection.makeConnection(transport)
        return connection, transport

    def test_closing_kept_until_a_frame(self) -> None:
        """
        The master's reason is kept (the replica's problem shows it), the
        connection counts towards the back-off; a later frame clears it.
        """
        connection, transport = self.connect()
        with capturedLogs() as events:
            connection.dataReceived(encode_code(-0x524D5148410005) + closing("segment file X: was removed"))
        self.assertEqual(self.factory.closing_reason, "segment file X: was removed")
        self.assertTrue(transport.disconnected)
        lines = [formatEvent(e) for e in events if e["log_level"] >= LogLevel.warn]
        self.assertEqual(len(lines), 1, lines)
        self.assertIn("stopped replicating to this slave: segment file X: was removed", lines[0])
        connection.connectionLost()
        self.assertEqual(self.factory.fruitless_connections, 1)
        self.assertEqual(self.factory.closed_without_frame, 0)
        connection, transport = self.connect()
        connection.dataReceived(
            encode_code(-0x524D5148410005)
            + struct.pack(">qiI", 0, 0, zlib.crc32(b""))
            + struct.pack(">I", zlib.crc32(struct.pack(">qiI", 0, 0, zlib.crc32(b""))))
        )
        self.assertIsNone(self.factory.closing_reason)
        connection.connectionLost()
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_closed_without_a_word(self) -> None:
        """
        Connections the master closes before any frame, at the same
        offset, are counted (for the problem); a different offset starts
        the count again.
        """
        for _ in range(3):
            connection, _ = self.connect()
            connection.connectionLost()
        self.assertEqual((self.factory.closed_at, self.factory.closed_without_frame), (0, 3))
        self.log.append_at(0, replica_records(0, 500))
        connection, _ = self.connect()
        connection.connectionLost()
        self.assertEqual((self.factory.closed_at, self.factory.closed_without_frame), (500, 1))
        self.assertEqual(self.clock.getDelayedCalls(), [])


class BrokerTests(_InMemory):
    """
    A master and a slave broker in memory: what puts answer, what
    C{/status} shows, what the slave shows.
    """

    def test_master_cut(self) -> None:
        """
        The master's live segment cut under it: found by the store's timer;
        puts answer UNKNOWN_ERROR naming the file; /status shows it; the
        slave is told and shows it as its problem.
        """
        a = self.broker(Role.MASTER)
        b = self.broker(Role.SLAVE, master=a)
        self.settle()
        self.put(a)
        self.settle()
        self.assertIsNone(b.problem)
        path = segment_path(a.commitlog.store_dir, 0)
        os.truncate(path, 0)
        self.clock.advance(0.5)
        self.settle()
        error = self.assertRaises(NotStoredError, a.put, Message("RoleTopic", b"x"))
        self.assertIs(error.status, PutStatus.UNKNOWN_ERROR)
        self.assertIn(f"{path}: was truncated to 0 bytes", str(error))
        self.assertIn("was truncated to 0 bytes", status(a)["problem"])
        self.assertIn(path, b.problem or "")
        self.assertIn("stopped replicating to this slave", b.problem or "")
        self.assertEqual(self.flushLoggedErrors(), [])
        self.stop(b, a)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_master_closing_without_a_word(self) -> None:
        """
        A master that closes without saying why (an older one: here, its
        CLOSING taken away): the slave's problem says where and how often,
        and where to look, instead of nothing.
        """
        self.patch(MasterConnection, "refuse", lambda self, why, **fields: self.drop(why, **fields))
        a = self.broker(Role.MASTER)
        b = self.broker(Role.SLAVE, master=a)
        self.settle()
        self.put(a)
        self.settle()
        end = b.commitlog.record_end
        os.unlink(segment_path(a.commitlog.store_dir, 0))
        self.clock.advance(0.5)
        for _ in range(3):
            self.settle()
            self.clock.advance(1.0)
        self.settle()
        self.assertIn(f"closed the connection at offset {end}", b.problem or "")
        self.assertIn("see the master's log", b.problem or "")
        self.stop(b, a)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_slave_cut(self) -> None:
        """
        The slave's own live segment cut: its next append is refused,
        replication halts, the problem names the file.
        """
        a = self.broker(Role.MASTER)
        b = self.broker(Role.SLAVE, master=a)
        self.settle()
        self.put(a)
        self.settle()
        path = segment_path(b.commitlog.store_dir, 0)
        os.truncate(path, 10)
        self.put(a)
        self.settle()
        replica = b.role_service
        assert replica is not None
        self.assertIs(replica.state, ReplicaState.HALTED)
        self.assertIn(f"{path}: was truncated to 10 bytes", b.problem or "")
        self.assertEqual(os.path.getsize(path), 10)
        self.assertEqual(self.flushLoggedErrors(), [])
        self.stop(b, a)
        self.assertEqual(self.clock.getDelayedCalls(), [])
