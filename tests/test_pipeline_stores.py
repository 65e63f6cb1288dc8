"""
Tests for L{rmqha.pipeline.stores}: where the pipeline reads a store from,
resolved on the driver into a small picklable description.
"""

from __future__ import annotations

import os
import pickle

from twisted.trial.unittest import SynchronousTestCase

from rmqha.pipeline.stores import ArrowStore, LocalStore, PlanError, Segment, resolve
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
