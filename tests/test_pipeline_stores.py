"""
Tests for L{rmqha.pipeline.stores}: where the pipeline reads a store from,
resolved on the driver into a small picklable description.
"""

from __future__ import annotations

import errno
import os
import pickle
import threading
from typing import Callable

from twisted.trial.unittest import SynchronousTestCase

from rmqha.pipeline.stores import (
    ArrowStore,
    LocalStore,
    PlanError,
    Segment,
    SegmentReader,
    resolve,
)
from rmqha.store import _record
from rmqha.store.commitlog import CommitLog

from tests._helpers import make_message


class ResolveTests(SynchronousTestCase):
    """
    A location becomes the right kind of store, made absolute on the
    driver.
    """

    def test_relative_path_is_absolute(self) -> None:
        """
        A relative path is made absolute where it is resolved (executors
        run in another directory); so is a C{file:} URI's path.
        """
        store = resolve("some/store")
        assert isinstance(store, LocalStore)
        self.assertEqual(store.uri, os.path.join(os.getcwd(), "some", "store"))
        self.assertEqual(resolve("file:///data/store").uri, "/data/store")
        self.assertEqual(resolve("file://localhost/data/store").uri, "/data/store")
        self.assertRaises(PlanError, resolve, "file://elsewhere/data/store")
        self.assertRaises(PlanError, resolve, "")

    def test_other_schemes_go_to_pyarrow(self) -> None:
        """
        C{s3://}, C{gs://}, C{hdfs://} are C{pyarrow.fs} stores, opened
        lazily (resolving contacts nothing); a store is passed through.
        """
        for uri in ("s3://bucket/prefix/store", "gs://b/s", "hdfs://nn:8020/s"):
            store = resolve(uri)
            assert isinstance(store, ArrowStore)
            self.assertEqual(store.uri, uri)
            self.assertIs(resolve(store), store)

    def test_secrets_are_not_shown(self) -> None:
        """
        Credentials in an object store's URI are hidden wherever the store
        is shown (messages, stats.json), and kept for opening it: in the
        pickled state a task carries, and in what is handed to Spark.
        """
        uri = "s3://AKIA:s3cr3t@bucket/store?endpoint_override=h:9000&secret_key=x2&scheme=http"
        store = resolve(uri)
        assert isinstance(store, ArrowStore)
        self.assertEqual(
            store.uri, "s3://AKIA:***@bucket/store?endpoint_override=h:9000&secret_key=***&scheme=http"
        )
        self.assertNotIn("s3cr3t", str(store) + store.location(Segment(0, "0" * 20, 1)))
        self.assertEqual(store.load_location, uri)
        self.assertEqual(pickle.loads(pickle.dumps(store)).load_location, uri)
        self.assertEqual(resolve("plain/store").load_location, os.path.abspath("plain/store"))

    def test_local_store_reads_and_pickles(self) -> None:
        """
        A local store lists its segments and reads byte ranges (short
        only where the file ends), and pickled (as a task carries it)
        opens the same files.
        """
        path = self.mktemp()
        with CommitLog.open(path, segment_size=64 * 1024) as log:
            for i in range(100):
                log.put(make_message(os.urandom(1000)))
        store = resolve(path)
        found = store.segments()
        self.assertEqual([s.base for s in found], [0, 65536])
        self.assertEqual(found[0], Segment(0, "00000000000000000000", 65536))
        again = pickle.loads(pickle.dumps(store))
        with open(os.path.join(path, "commitlog", found[1].name), "rb") as f:
            expected = f.read()
        with again.open(found[1]) as reader:
            self.assertEqual(reader.size, 65536)
            self.assertEqual(reader.read_at(1000, 5000), expected[1000:6000])
            self.assertEqual(reader.read_at(65530, 100), expected[65530:])
            self.assertEqual(reader.read_at(70000, 10), b"")
        self.assertEqual(
            store.location(found[1]), os.path.join(os.path.abspath(path), "commitlog", found[1].name)
        )

    def test_not_a_store(self) -> None:
        """
        A missing directory, and one holding no commit log, are one line
        naming the absolute path.
        """
        missing = self.mktemp()
        e = self.assertRaises(PlanError, resolve(missing).segments)
        self.assertEqual(str(e), f"{os.path.abspath(missing)}: no such directory")
        empty = self.mktemp()
        os.makedirs(empty)
        e = self.assertRaises(PlanError, resolve(empty).segments)
        self.assertIn("no commitlog directory and no segment files", str(e))

    def test_unreadable_segment_names_it(self) -> None:
        """
        A segment that cannot be opened is an C{OSError} naming its path.
        """
        store = LocalStore(self.mktemp())
        segment = Segment(0, "00000000000000000000", 10)
        e = self.assertRaises(OSError, store.open, segment)
        self.assertEqual(e.filename, store.location(segment))


class ListingTests(SynchronousTestCase):
    """
    A local store's segment listing never skips a hole.
    """

    def test_directory_where_a_segment_belongs(self) -> None:
        """
        A directory named like a segment file is an error naming it (every
        job would read past the hole otherwise), and the command line's
        check before Spark says it in one line (exit 2).
        """
        import argparse

        from rmqha.pipeline.jobs import check_inputs

        store = os.path.abspath(self.mktemp())
        with CommitLog.open(store, segment_size=64 * 1024) as log:
            log.put(make_message(b"x"))
        hole = os.path.join(store, "commitlog", f"{64 * 1024:020d}")
        os.mkdir(hole)
        e = self.assertRaises(OSError, LocalStore(store).segments)
        self.assertEqual(e.filename, hole)
        self.assertIn("a directory, not a segment file", str(e))
        args = argparse.Namespace(job="stats", dir=store, out=None, option=None)
        error = self.assertRaises(PlanError, check_inputs, args)
        self.assertIn(f"cannot read {hole}", str(error))
        # The same through pyarrow's filesystems (S3, HDFS ...), here its
        # local one.
        from pyarrow import fs as pafs

        remote = ArrowStore("file://" + store)
        remote._fs, remote._root = pafs.LocalFileSystem(), store
        e = self.assertRaises(OSError, remote.segments)
        self.assertEqual(e.filename, hole)


class BlockSizeTests(SynchronousTestCase):
    """
    A reader's C{block_size} sets how much L{read_span} asks for at once:
    a remote store gets few large requests, a local file small reads.
    """

    def test_remote_blocks_are_large(self) -> None:
        """
        Over a 16 MiB segment holding 11 MB of plain records, a reader
        with 64 MiB blocks is asked for the whole span at once; a local
        file's reader (4 MiB) several times.
        """
        from rmqha.pipeline.scan import plan, read_span
        from rmqha.store import _record

        if not getattr(_record, "ACCELERATED", False):
            raise self.skipTest("the block reads are the compiled decoder's path")
        path = self.mktemp()
        with CommitLog.open(path, segment_size=16 * 1024 * 1024) as log:
            body = os.urandom(1000)
            for i in range(11_000):
                log.put(make_message(body))
        asked: list[int] = []

        class Counting(LocalStore):
            big = False

            def open(self, segment: Segment):  # type: ignore[no-untyped-def]
                reader = super().open(segment)
                inner = reader.read_at

                def read_at(position: int, length: int) -> bytes:
                    asked.append(length)
                    return inner(position, length)

                reader.read_at = read_at  # type: ignore[method-assign]
                inner_into = reader.read_into

                def read_into(position: int, buffer: memoryview) -> int | None:
                    asked.append(len(buffer))
                    return inner_into(position, buffer)

                reader.read_into = read_into  # type: ignore[method-assign]
                if self.big:
                    reader.block_size = 64 * 1024 * 1024
                return reader

        for big, most in ((False, 4 * 1024 * 1024), (True, 64 * 1024 * 1024)):
            store = Counting(path)
            store.big = big
            asked.clear()
            (span,) = plan(store, split_bytes=64 * 1024 * 1024)
            rows = sum(b.num_rows for b in read_span(span))
            self.assertEqual(rows, 11_000)
            self.assertLessEqual(max(asked), most)
            if big:  # the whole span at once (then 8 bytes where the records stop)
                self.assertEqual(asked[0], span.end - span.start)
                self.assertLessEqual(len(asked), 2, asked)
            else:
                self.assertGreater(len(asked), 2, asked)


class _GatedReader(SegmentReader):
    """
    A segment of C{data} in memory whose reads can be held back
    (C{gates}: position -> event waited for), fail (C{fail_at}), or
    signal (C{after}: position -> called once read); it records the
    positions read, the threads that read and the most reads at once.
    """

    def __init__(
        self,
        data: bytes,
        prefetch: int,
        gates: dict[int, threading.Event] | None = None,
        after: dict[int, Callable[[], None]] | None = None,
        fail_at: int | None = None,
    ) -> None:
        self.data = data
        self.size = len(data)
        self.prefetch = prefetch
        self.gates = gates or {}
        self.after = after or {}
        self.fail_at = fail_at
        self.started: list[int] = []
        self.threads: set[str] = set()
        self.running = 0
        self.most = 0
        self._lock = threading.Lock()

    def read_at(self, position: int, length: int) -> bytes:
        with self._lock:
            self.started.append(position)
            self.threads.add(threading.current_thread().name)
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            gate = self.gates.get(position)
            if gate is not None and not gate.wait(10):
                raise AssertionError(f"the read at {position} was never let through")
            if position == self.fail_at:
                raise OSError(errno.EIO, "boom", f"segment@{position}")
            return self.data[position : position + length]
        finally:
            with self._lock:
                self.running -= 1
            hook = self.after.get(position)
            if hook is not None:
                hook()


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("rmqha-prefetch")]


class ReadAheadTests(SynchronousTestCase):
    """
    L{SegmentReader.blocks}: a remote store's next blocks are read on
    threads while the caller works on one; in order, bounded, errors on
    the block that failed, no thread left behind.
    """

    data = bytes(range(256)) * 40  # 10240 bytes: 10 blocks of 1024

    def test_in_order_whatever_order_reads_finish(self) -> None:
        """
        Blocks come in file order even when a later block's read finishes
        first (here the first block's read waits for the second's): the
        reads run at once, on read-ahead threads, not the caller's.
        """
        first_may_finish = threading.Event()
        reader = _GatedReader(
            self.data, prefetch=2, gates={0: first_may_finish}, after={1024: first_may_finish.set}
        )
        blocks = list(reader.blocks(0, len(self.data), 1024))
        self.assertEqual(b"".join(blocks), self.data)
        self.assertEqual([len(b) for b in blocks], [1024] * 10)
        self.assertEqual(reader.most, 2)
        self.assertTrue(all(n.startswith("rmqha-prefetch") for n in reader.threads), reader.threads)
        self.assertEqual(_prefetch_threads(), [])

    def test_bounded(self) -> None:
        """
        At most C{prefetch} reads run at once, and when the caller gets
        block k no read past block k + prefetch has started: memory stays
        at C{prefetch + 1} blocks however long the span.  A range that
        does not fall on block boundaries ends with a shorter block.
        """
        reader = _GatedReader(self.data, prefetch=2)
        got = []
        for k, block in enumerate(reader.blocks(100, 10000, 1024)):
            self.assertLessEqual(len(reader.started), k + 1 + 2)
            got.append(block)
        self.assertEqual(b"".join(got), self.data[100:10000])
        self.assertEqual(len(got[-1]), (10000 - 100) % 1024)
        self.assertLessEqual(reader.most, 2)

    def test_error_on_the_block_that_failed(self) -> None:
        """
        A read that fails raises its C{OSError} (naming the location) when
        the caller reaches that block: the blocks before it arrive whole;
        the read-ahead threads are gone after it.
        """
        reader = _GatedReader(self.data, prefetch=2, fail_at=3072)
        blocks = reader.blocks(0, len(self.data), 1024)
        self.assertEqual([next(blocks) for _ in range(3)], [self.data[i : i + 1024] for i in (0, 1024, 2048)])
        e = self.assertRaises(OSError, next, blocks)
        self.assertEqual(e.filename, "segment@3072")
        self.assertEqual(_prefetch_threads(), [])

    def test_closed_early_leaves_no_thread(self) -> None:
        """
        A caller that stops after the first block (closing the iterator)
        leaves no thread behind: reads not started are cancelled, the one
        under way is waited for.
        """
        third_may_finish = threading.Event()
        reader = _GatedReader(self.data, prefetch=2, gates={2048: third_may_finish})
        blocks = reader.blocks(0, len(self.data), 1024)
        self.assertEqual(next(blocks), self.data[:1024])
        third_may_finish.set()
        blocks.close()
        self.assertEqual(_prefetch_threads(), [])
        self.assertEqual(reader.running, 0)
        self.assertLessEqual(len(reader.started), 3)

    def test_local_reads_on_the_callers_thread(self) -> None:
        """
        Without C{prefetch} (a local file) the blocks are read one by one
        by the caller, and stop where the file ends.
        """
        reader = _GatedReader(self.data, prefetch=0)
        self.assertEqual(b"".join(reader.blocks(0, 20000, 4096)), self.data)
        self.assertEqual(reader.threads, {threading.current_thread().name})
        self.assertEqual(reader.started, [0, 4096, 8192])

    def test_local_blocks_in_one_buffer(self) -> None:
        """
        With C{reuse}, a local file's blocks are read into one buffer
        (no fresh memory per block: its page faults cost a local scan
        ~10 % of its CPU), each holding the file's bytes when handed out,
        the last one shorter where the file ends; a reader that only hands
        out its own bytes (a remote one) goes on doing so.
        """
        path = self.mktemp()
        os.makedirs(os.path.join(path, "commitlog"))
        with open(os.path.join(path, "commitlog", "%020d" % 0), "wb") as f:
            f.write(self.data)
        store = LocalStore(path)
        (segment,) = store.segments()
        with store.open(segment) as reader:
            seen = []
            buffers = set()
            for block in reader.blocks(100, 20000, 4096, reuse=True):
                seen.append(bytes(block))
                with memoryview(block) as view:
                    buffers.add(id(view.obj))
            self.assertEqual(b"".join(seen), self.data[100:])
            self.assertEqual([len(b) for b in seen], [4096, 4096, len(self.data) - 100 - 8192])
            self.assertEqual(len(buffers), 1)
        remote = _GatedReader(self.data, prefetch=0)
        blocks = list(remote.blocks(0, 20000, 4096, reuse=True))
        self.assertEqual(b"".join(blocks), self.data)
        self.assertTrue(all(type(b) is bytes for b in blocks))


class RemoteReadSpanTests(SynchronousTestCase):
    """
    L{read_span} over a store that reads ahead: the same records as a
    local read, in fewer requests.
    """

    def remote(self, path: str, block_size: int, asked: list[tuple[int, int]]) -> LocalStore:
        class Remote(LocalStore):
            def open(self, segment: Segment) -> SegmentReader:
                reader = super().open(segment)
                inner = reader.read_at

                def read_at(position: int, length: int) -> bytes:
                    asked.append((position, length))
                    self.threads.add(threading.current_thread().name)
                    return inner(position, length)

                reader.read_at = read_at  # type: ignore[method-assign]
                reader.block_size = block_size
                reader.prefetch = 1
                return reader

        store = Remote(path)
        store.threads = set()  # type: ignore[attr-defined]
        return store

    def test_records_cut_by_blocks(self) -> None:
        """
        Blocks smaller than a header, than the records, or holding a few
        (7, 700, 5000 bytes; bodies up to 900, IPv6 hosts now and then,
        which the compiled decoder leaves to the Python one): every record
        read from the read-ahead threads, the same rows as one read of the
        whole span.
        """
        from rmqha.pipeline import scan
        from tests.test_pipeline import arrow_rows, random_store

        if not getattr(_record, "ACCELERATED", False):
            raise self.skipTest("the block reads are the compiled decoder's path")
        path = random_store(self, 300, 64 * 1024, seed=7)
        expected = arrow_rows(b for s in scan.plan(path) for b in scan.read_span(s))
        self.patch(scan, "_READ_BLOCK", 1)
        for block_size in (7, 700, 5000):
            asked: list[tuple[int, int]] = []
            store = self.remote(path, block_size, asked)
            got = arrow_rows(b for s in scan.plan(store, 20000) for b in scan.read_span(s))
            self.assertEqual(len(got), 300)
            self.assertEqual(got, expected, f"blocks of {block_size}")
            threads = store.threads  # type: ignore[attr-defined]
            self.assertTrue(any(n.startswith("rmqha-prefetch") for n in threads))
            self.assertEqual(_prefetch_threads(), [])

    def test_no_request_after_the_blocks(self) -> None:
        """
        A segment read whole in one block, ending in a BLANK filler: the
        filler is judged from that block, with no further request (a
        ranged GET may cost an object store the whole object).
        """
        from rmqha.pipeline.scan import plan, read_span

        if not getattr(_record, "ACCELERATED", False):
            raise self.skipTest("the block reads are the compiled decoder's path")
        path = self.mktemp()
        with CommitLog.open(path, segment_size=256 * 1024) as log:
            while log.max_offset < 300 * 1024:
                log.put(make_message(os.urandom(1000)))
        asked: list[tuple[int, int]] = []
        store = self.remote(path, 1 << 20, asked)
        first = plan(store)[0]
        self.assertEqual(first.end, 256 * 1024)
        rows = sum(b.num_rows for b in read_span(first))
        self.assertGreater(rows, 200)
        self.assertEqual(asked, [(0, 256 * 1024)])
