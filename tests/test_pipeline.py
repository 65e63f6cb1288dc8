"""
Tests for L{rmqha.pipeline.scan}: planning record-aligned spans and
decoding them to Arrow, without Spark (the data source runs this code in
each task; the Spark side is in C{tests.test_pipeline_spark}).
"""

from __future__ import annotations

import datetime
import os
import random
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from rmqha.store.commitlog import CommitLog, Record
from rmqha.pipeline.scan import hop, plan, read_span, scan
from rmqha.pipeline.stores import LocalStore, Segment
from rmqha.store._record import format_host

from tests._helpers import make_message, open_store, segment_path, xor_byte, zero_from

try:
    import pyarrow  # noqa: F401
except ImportError:  # pragma: no cover - the spark extra is not installed
    skip_arrow = "pyarrow is not installed (pip install 'rmqha[spark]')"
else:
    skip_arrow = None


def random_store(case: SynchronousTestCase, count: int, segment_size: int, seed: int) -> str:
    """
    A store of C{count} random messages: topics, queues, properties (some
    empty), bodies of 0..900 bytes, IPv6 born hosts now and then.
    """
    rng = random.Random(seed)
    path = case.mktemp()
    log = CommitLog.open(path, segment_size=segment_size)
    for i in range(count):
        properties = {}
        if rng.random() < 0.8:
            properties["TAGS"] = f"tag{rng.randrange(5)}"
        if rng.random() < 0.5:
            properties["KEYS"] = f"k{i}"
        if rng.random() < 0.3:
            properties["custom"] = "v" * rng.randrange(1, 40)
        message = make_message(
            os.urandom(rng.randrange(0, 900)),
            topic=rng.choice(["orders", "payments", "audit-log"]),
            queue_id=rng.randrange(4),
            properties=properties,
        )
        if rng.random() < 0.1:
            message.born_host = ("2001:db8::7", 4321)
        log.put(message)
    log.close()
    return path


def forged_record_store(case: Any) -> tuple[str, int]:
    """
    A closed store of seven records in which the sixth's body forges a
    whole record header at its own offset, chained to the next real
    record: a search for record starts can be misled into cutting there.
    Returns the store's directory and the sixth record's offset.
    """
    import struct

    from rmqha.store._record import MESSAGE_MAGIC_V1
    from tests._helpers import record_size

    log = open_store(case, segment_size=1 << 20)
    for _ in range(5):
        log.put(make_message(b"f" * 100))
    start = log.max_offset
    end = start + record_size(make_message(bytes(1000)))
    forged_at = start + 88 + 200  # the body starts 88 bytes in (IPv4 hosts)
    header = struct.pack(">iiiiiqq", end - forged_at, MESSAGE_MAGIC_V1, 0, 0, 0, 0, forged_at)
    log.put(make_message(bytes(200) + header + bytes(1000 - 200 - len(header))))
    log.put(make_message(b"after"))
    log.close()
    return log.store_dir, start


def store_rows(path: str) -> list[dict[str, object]]:
    """
    The store's records, decoded by the commit log itself, as rows.
    """
    with CommitLog.open(path, read_only=True) as log:
        return [row_of(r) for r in log.records(check_crc=False) if isinstance(r, Record)]


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def instant(millis: int) -> datetime.datetime | None:
    """
    Epoch milliseconds as the reader's timestamp columns hold them (UTC);
    C{None} for garbage (the column's null; past what Python's datetime
    holds, which is less than the column's range).
    """
    try:
        return _EPOCH + datetime.timedelta(milliseconds=millis)
    except OverflowError:
        return None


def row_of(r: Record) -> dict[str, object]:
    return {
        "offset": r.offset,
        "size": r.size,
        "topic": r.topic,
        "queue_id": r.queue_id,
        "queue_offset": r.queue_offset,
        "flag": r.flag,
        "sysflag": r.sysflag,
        "born_timestamp": instant(r.born_timestamp),
        "store_timestamp": instant(r.store_timestamp),
        "born_host": format_host(r.born_host),
        "store_host": format_host(r.store_host),
        "reconsume_times": r.reconsume_times,
        "prepared_tx_offset": r.prepared_tx_offset,
        "properties": sorted(r.properties.items()),
        "tags": r.tags,
        "keys": r.keys,
        "body": r.body,
        "body_size": len(r.body),
        "crc_ok": r.crc_ok,
    }


def arrow_rows(batches: object) -> list[dict[str, object]]:
    rows = []
    for batch in batches:  # type: ignore[attr-defined]
        for row in batch.to_pylist():
            row["properties"] = sorted(row["properties"])
            rows.append(row)
    return rows


def arrow_rows_plain(batches: object) -> list[dict[str, object]]:
    return [row for batch in batches for row in batch.to_pylist()]  # type: ignore[attr-defined]


class PlanTests(SynchronousTestCase):
    """
    Spans start and end on record boundaries wherever the cut points fall.
    """

    skip = skip_arrow

    def test_rows_equal_the_store_at_every_split(self) -> None:
        """
        Whatever the split size — smaller than a record, straddling records,
        landing exactly on BLANK fillers or segment ends — the spans' rows
        are exactly the store's records, in order, each once.
        """
        path = random_store(self, 300, 16 * 1024, seed=1)
        expected = store_rows(path)
        self.assertGreater(len({r["offset"] // (16 * 1024) for r in expected}), 5)
        for split in [1, 97, 500, 1000, 1024, 4096, 5000, 16 * 1024, 1 << 30]:
            spans = plan(path, split)
            for a, b in zip(spans, spans[1:]):
                self.assertLessEqual(a.end_offset, b.offset)
            got = arrow_rows(b for s in spans for b in read_span(s))
            self.assertEqual(got, expected, f"split {split}")

    def test_zero_tail_is_not_read(self) -> None:
        """
        A segment that is mostly zeros after its records (a broker's newest
        segment, preallocated) is read up to one read block (4 MiB) past its
        records, not to its end, however large the tail: a reader's time
        and memory do not grow with it.
        """
        path = self.mktemp()
        with CommitLog.open(path, segment_size=16 << 20) as log:
            for i in range(50):
                log.put(make_message(b"x" * 500, topic="orders"))
            end = log.max_offset
        read: list[int] = []

        class Counting(LocalStore):
            def open(self, segment: Segment) -> Any:
                reader = super().open(segment)
                inner = reader.read_at

                def read_at(position: int, length: int) -> bytes:
                    data = inner(position, length)
                    read.append(len(data))
                    return data

                reader.read_at = read_at  # type: ignore[method-assign]
                return reader

        store = Counting(path)
        spans = plan(store, 1 << 30)
        self.assertEqual(sum(b.num_rows for s in spans for b in read_span(s)), 50)
        self.assertLessEqual(sum(read), (4 << 20) + 8)
        self.assertLess(end, 4 << 20)
        # A topic filter takes the record loop (as the pure codec does):
        # it too stops where the records end.
        read.clear()
        rows = sum(b.num_rows for s in spans for b in read_span(s, topics=["orders"]))
        self.assertEqual(rows, 50)
        self.assertLessEqual(sum(read), (4 << 20) + 8)

    def test_cuts_are_record_starts(self) -> None:
        """
        C{hop} cuts at the first record at or after each multiple.
        """
        path = random_store(self, 50, 64 * 1024, seed=2)
        starts = [r["offset"] for r in store_rows(path)]
        store = LocalStore(path)
        with store.open(store.segments()[0]) as reader:
            cuts, end = hop(reader, 3000)
        for cut in cuts:
            self.assertIn(cut, starts)
            multiple = cut // 3000 * 3000
            self.assertEqual(cut, min(s for s in starts if s >= multiple))
        self.assertEqual(end, starts[-1] + store_rows(path)[-1]["size"])  # type: ignore[operator]

    def test_torn_tail(self) -> None:
        """
        A record cut by a crash (zeroed from its middle) and one with a
        garbled header end the rows where recovery would: at the last whole
        record.
        """
        path = random_store(self, 40, 1 << 20, seed=3)
        rows = store_rows(path)
        last = rows[-1]
        zero_from(segment_path(path, 0), int(last["offset"]) + 30)  # type: ignore[call-overload]
        got = arrow_rows(scan(path))
        self.assertEqual(got, rows[:-1])
        xor_byte(segment_path(path, 0), int(rows[-2]["offset"]) + 5)  # type: ignore[call-overload]
        self.assertEqual(arrow_rows(scan(path)), rows[:-2])

    def test_damage_before_valid_records_fails_loudly(self) -> None:
        """
        A garbled header with whole records after it is damage, not a torn
        tail: the scan fails naming the segment, the bad record and where
        valid records follow (as C{rmqha store check} does), instead of
        silently leaving out every record after it; with a topic filter
        and without bodies too.
        """
        from rmqha.pipeline.scan import PlanError

        path = random_store(self, 40, 1 << 20, seed=3)
        rows = store_rows(path)
        bad, after = int(rows[10]["offset"]), int(rows[11]["offset"])  # type: ignore[call-overload]
        xor_byte(segment_path(path, 0), bad + 5)  # its magic
        topics = sorted({str(r["topic"]) for r in rows})
        for options in [{}, {"topics": topics}, {"bodies": False}]:
            with self.assertRaises(PlanError) as raised:
                list(scan(path, **options))  # type: ignore[arg-type]
            message = str(raised.exception)
            self.assertIn(f"{segment_path(path, 0)}: bad record at offset {bad}: ", message)
            self.assertIn(f"; valid records follow at offset {after}: the store is damaged", message)

    def test_flipped_body_byte_is_crc_false(self) -> None:
        """
        A body byte flipped on disk: the row is still there, with
        C{crc_ok} false (the body CRC is what tells).
        """
        log = open_store(self, segment_size=1 << 20)
        log.put(make_message(b"x" * 100))
        second = log.put(make_message(b"y" * 100))
        log.close()
        # Tail after the body: topic length (1), "TopicA", properties length (2).
        xor_byte(segment_path(log.store_dir, 0), second.offset + second.size - 9 - 50)
        rows = arrow_rows(scan(log.store_dir))
        self.assertEqual([r["crc_ok"] for r in rows], [True, False])

    def test_offsets_topics_and_no_bodies(self) -> None:
        """
        An offset range (edges inside records move to the next record),
        a topic list and bodies off give exactly the matching records.
        """
        path = random_store(self, 200, 32 * 1024, seed=4)
        rows = store_rows(path)
        start = int(rows[50]["offset"]) + 3  # type: ignore[call-overload]
        end = int(rows[150]["offset"])  # type: ignore[call-overload]
        got = arrow_rows(b for s in plan(path, 2000, start, end) for b in read_span(s))
        self.assertEqual(got, rows[51:150])
        got = arrow_rows(
            b for s in plan(path, 2000) for b in read_span(s, bodies=False, topics=["audit-log"])
        )
        wanted = [dict(r, body=None) for r in rows if r["topic"] == "audit-log"]
        self.assertEqual(got, wanted)
        self.assertTrue(0 < len(wanted) < len(rows))

    def test_timestamps_are_instants(self) -> None:
        """
        C{born_timestamp} and C{store_timestamp} are Arrow timestamps in
        microseconds, UTC (Spark's C{timestamp}), equal to the records'
        epoch milliseconds, on the compiled and the pure path; a value
        whose microseconds would not fit 64 bits (garbage) is null.
        """
        import pyarrow as pa

        from rmqha.store import _record

        log = open_store(self, segment_size=1 << 20)
        log.put(make_message(born_timestamp=1_700_000_000_123))
        log.put(make_message(born_timestamp=-(2**63)))
        log.put(make_message(born_timestamp=2**62))
        log.close()
        stored = [r["store_timestamp"] for r in store_rows(log.store_dir)]
        kind = pa.timestamp("us", tz="UTC")
        for accel in (_record._accel, None):
            saved, _record._accel = _record._accel, accel
            try:
                batches = list(scan(log.store_dir, columns=["born_timestamp", "store_timestamp"]))
            finally:
                _record._accel = saved
            self.assertEqual([f.type for f in batches[0].schema], [kind, kind])
            rows = arrow_rows_plain(batches)
            self.assertEqual(
                [r["born_timestamp"] for r in rows], [instant(1_700_000_000_123), None, None]
            )
            self.assertEqual([r["store_timestamp"] for r in rows], stored)

    def test_not_a_store(self) -> None:
        """
        A directory without segment files is a clear error.
        """
        from rmqha.pipeline.scan import PlanError

        os.makedirs("empty")
        e = self.assertRaises(PlanError, plan, "empty")
        self.assertIn("no commitlog directory", str(e))

    def test_segments_one_after_another(self) -> None:
        """
        A segment missing between two others, or files that overlap, fail
        the plan naming the offsets (the rows after a hole were read past
        silently before), in the JVM reader's words.
        """
        import shutil

        from rmqha.pipeline.scan import PlanError
        from tests._helpers import segment_path

        path = random_store(self, 60, 4096, seed=24)
        middle = segment_path(path, 4096)
        os.rename(middle, middle + ".moved")
        e = self.assertRaises(PlanError, plan, path)
        self.assertIn(
            "missing segment: no segment file holds offsets 4096..8192 (between "
            f"{os.path.basename(segment_path(path, 0))} and "
            f"{os.path.basename(segment_path(path, 8192))}; segments are 4096 bytes): "
            "the store is incomplete",
            str(e),
        )
        os.rename(middle + ".moved", middle)
        self.assertTrue(plan(path))
        shutil.copyfile(segment_path(path, 0), segment_path(path, 2048))
        e = self.assertRaises(PlanError, plan, path)
        self.assertIn("segment files overlap", str(e))


class ProjectionTests(SynchronousTestCase):
    """
    C{read_span(columns=...)}: only the columns asked for, in that order,
    each exactly as in the whole row, on the compiled and the pure path.
    """

    def test_columns_are_the_whole_rows_columns(self) -> None:
        """
        Any choice and order of columns (the properties map, the body, the
        nullable strings among them, or not) gives the whole rows' values
        of those columns, for plain records (the compiled decoder) and for
        the others (IPv6 hosts: the record loop), bodies on and off.
        """
        from rmqha.store import _record

        path = random_store(self, 120, 16 * 1024, seed=21)
        spans = plan(path, 5000)
        for accel in (_record._accel, None):
            saved, _record._accel = _record._accel, accel
            try:
                for bodies in (True, False):
                    whole = arrow_rows(b for s in spans for b in read_span(s, bodies))
                    for columns in (
                        ["crc_ok", "offset", "properties", "body"],
                        ["size", "body_size"],
                        ["tags", "keys", "born_host", "topic"],
                    ):
                        got = [
                            row
                            for s in spans
                            for b in read_span(s, bodies, columns=columns)
                            for row in b.to_pylist()
                        ]
                        for row in got:
                            if "properties" in row:
                                row["properties"] = sorted(row["properties"])
                        self.assertEqual(got, [{c: r[c] for c in columns} for r in whole])
            finally:
                _record._accel = saved

    def test_unknown_or_repeated_column(self) -> None:
        """
        A name that is not a column, or a column named twice, is refused
        in one line naming it.
        """
        from rmqha.pipeline.scan import PlanError, project

        e = self.assertRaises(PlanError, project, ["size", "bodies"])
        self.assertIn("'bodies' is not a column", str(e))
        e = self.assertRaises(PlanError, project, ["size", "size"])
        self.assertIn("named twice", str(e))
        self.assertEqual(project(["body", "size"]).names, ["body", "size"])


class SyncSearchTests(SynchronousTestCase):
    """
    Cut points are found by the record-start check, not by walking the log.
    """

    skip = skip_arrow

    def test_magic_bytes_in_bodies(self) -> None:
        """
        Bodies full of message magic codes (without the matching offset)
        do not fool the search: rows equal the store at every split.
        """
        from rmqha.store._record import MESSAGE_MAGIC_V1, MESSAGE_MAGIC_V2

        magic = MESSAGE_MAGIC_V1.to_bytes(4, "big", signed=True)
        magic2 = MESSAGE_MAGIC_V2.to_bytes(4, "big", signed=True)
        log = open_store(self, segment_size=64 * 1024)
        for i in range(150):
            log.put(make_message((magic + bytes(24) + magic2) * (i % 20 + 1)))
        log.close()
        expected = store_rows(log.store_dir)
        for split in [50, 333, 4096, 20000]:
            self.assertEqual(arrow_rows(scan(log.store_dir, split_bytes=split)), expected)

    def test_forged_record_start_fails_loudly(self) -> None:
        """
        A body forging a whole record header at its own offset, chained to
        the next real record, would mislead the search; the reader of the
        span before it sees a record cross the cut and raises instead of
        returning wrong rows.
        """
        from rmqha.pipeline.scan import PlanError

        store, start = forged_record_store(self)
        self.assertEqual(len(store_rows(store)), 7)
        with self.assertRaises(PlanError) as raised:
            list(scan(store, split_bytes=start + 100))
        self.assertIn("runs past the partition boundary", str(raised.exception))


class PipelineInputTests(SynchronousTestCase):
    """
    C{rmqha pipeline stats/export/verify} check their inputs before Spark
    starts (issue 12, item 6): one line, exit 2.  PySpark is made
    unimportable and starting a session fails the test, so these run (and
    must pass) without Spark.
    """

    def setUp(self) -> None:
        import sys

        from rmqha.pipeline import source

        def no_spark(*args: object, **kwargs: object) -> None:
            self.fail("Spark was started")

        self.patch(source, "spark_session", no_spark)
        saved = sys.modules.get("pyspark")
        sys.modules["pyspark"] = None  # type: ignore[assignment]

        def restore() -> None:
            if saved is None:
                sys.modules.pop("pyspark", None)
            else:
                sys.modules["pyspark"] = saved

        self.addCleanup(restore)
        self.store = random_store(self, 5, 64 * 1024, seed=41)

    def run_cli(self, *argv: str) -> tuple[int, str]:
        import io

        from rmqha.cli import main

        out, err = io.StringIO(), io.StringIO()
        status = main(["pipeline", *argv], stdout=out, stderr=err)
        self.assertEqual(out.getvalue(), "")
        self.assertEqual(err.getvalue().count("\n"), 1, err.getvalue())
        self.assertNotIn("Traceback", err.getvalue())
        return status, err.getvalue()

    def test_bad_inputs(self) -> None:
        """
        A missing store, a directory that is not a store, a master store
        without segments, an existing export OUT or one whose parent is
        missing, and a stats --out holding stats.json: each is one line
        naming it, exit 2, and nothing is written.
        """
        not_store = self.mktemp()
        os.makedirs(not_store)
        empty_master = self.mktemp()
        os.makedirs(os.path.join(empty_master, "commitlog"))
        taken = self.mktemp()
        os.makedirs(taken)
        with open(os.path.join(taken, "stats.json"), "w") as f:
            f.write("mine")
        missing = self.mktemp()
        cases = [
            (("stats", missing), f"{missing}: no such directory"),
            (("export", missing, self.mktemp()), f"{missing}: no such directory"),
            (("verify", missing, self.store), f"{missing}: no such directory"),
            (("verify", self.store, missing), f"{missing}: no such directory"),
            (("stats", not_store), f"{not_store}: no commitlog directory and no segment files"),
            (("verify", empty_master, self.store), "the master's store has no segment files"),
            (("export", self.store, taken), f"{taken} exists"),
            (("export", self.store, os.path.join(missing, "out")), f"no directory {missing}"),
            (("stats", self.store, "--out", taken), "stats.json exists"),
        ]
        for argv, needle in cases:
            status, err = self.run_cli(*argv)
            self.assertEqual(status, 2, argv)
            self.assertTrue(err.startswith("rmqha: error: "), err)
            self.assertIn(needle, err, argv)
        self.assertEqual(os.listdir(taken), ["stats.json"])
        self.assertFalse(os.path.exists(missing))

    def test_good_inputs_reach_spark(self) -> None:
        """
        Inputs that pass the checks go on to Spark: here, the message that
        PySpark is missing (exit 2, as every error of a job), so the checks
        did not refuse them.
        """
        status, err = self.run_cli("export", self.store, self.mktemp())
        self.assertEqual(status, 2)
        self.assertIn("needs PySpark", err)

    def test_bad_settings(self) -> None:
        """
        A C{--conf} that is not KEY=VALUE or not a Spark setting, an
        C{--option} that is not KEY=VALUE or names the path, and an empty
        C{--py-files}: one line naming it, exit 2, from C{rmqha pipeline}
        and from C{python -m rmqha.pipeline.jobs}'s C{main} alike, before
        Spark.
        """
        import contextlib
        import io

        from rmqha.pipeline.jobs import main

        cases = [
            (("--conf", "spark.executor.memory"), "--conf 'spark.executor.memory' is not KEY=VALUE"),
            (("--conf", "executor.memory=2g"), "KEY starts with 'spark.'"),
            (("--option", "=1"), "--option '=1' is not KEY=VALUE"),
            (("--option", "path=/x"), "the store is the DIR argument"),
            (("--py-files", ","), "--py-files ',' names no file"),
        ]
        for flags, needle in cases:
            status, err = self.run_cli("stats", self.store, *flags)
            self.assertEqual(status, 2, flags)
            self.assertIn(needle, err, flags)
            err_io = io.StringIO()
            with contextlib.redirect_stderr(err_io), self.assertRaises(SystemExit) as raised:
                main(["stats", self.store, *flags])
            self.assertEqual(raised.exception.code, 2)
            self.assertEqual(err_io.getvalue().count("\n"), 1, err_io.getvalue())
            self.assertIn(needle, err_io.getvalue())


class VerdictTests(SynchronousTestCase):
    """
    C{verify}'s block comparison and the driver's proof of a difference,
    as pure functions (no Spark): an unreadable block is an error, never a
    difference, and a difference is shown byte by byte or not claimed.
    """

    def test_unreadable_block_is_an_error_naming_path_and_host(self) -> None:
        """
        A slave (or master) file that cannot be read is reported as the
        path and this host, not as C{"different"}.
        """
        import socket

        from rmqha.pipeline.jobs import _compare_block

        segment = Segment(0, "00000000000000000000", 100)
        gone = LocalStore(self.mktemp())
        missing = gone.location(segment)
        here = LocalStore(self.mktemp())
        os.makedirs(here.root)
        with open(here.location(segment), "wb") as f:
            f.write(b"x" * 100)
        for task in [
            (3, gone, segment, here, segment, 0, 100),
            (4, here, segment, gone, segment, 0, 100),
        ]:
            index, verdict = _compare_block(task)
            self.assertEqual(index, task[0])
            assert verdict is not None
            self.assertNotEqual(verdict, "different")
            self.assertIn(f"cannot read {missing} on host {socket.gethostname()}", verdict)
        self.assertEqual(_compare_block((5, here, segment, here, segment, 0, 100)), (5, "equal"))

    def test_equal_bytes_are_not_a_divergence(self) -> None:
        """
        The driver's search over a flagged block whose bytes are equal is
        a "could not compare" error, not a divergence at the block's end.
        """
        from rmqha.pipeline.jobs import CompareError, _first_difference, prove_difference

        self.assertRaises(CompareError, prove_difference, b"abc", b"abcdef", 8)
        store = LocalStore(self.mktemp())
        os.makedirs(store.root)
        segment = Segment(1000, "00000000000000001000", 64)
        with open(store.location(segment), "wb") as f:
            f.write(bytes(range(64)))
        e = self.assertRaises(
            CompareError, _first_difference, (0, store, segment, store, segment, 16, 32)
        )
        self.assertTrue(str(e).startswith("could not compare: block at offset 1016"), str(e))

    def test_difference_is_shown(self) -> None:
        """
        A difference comes with its offset and the master's and slave's
        bytes there; a master that ends early differs where it ends.
        """
        from rmqha.pipeline.jobs import first_difference, prove_difference

        master = bytes(range(32))
        slave = bytearray(master)
        slave[20] = 0xEE
        offset, shown = prove_difference(bytes(slave), master, 4096)
        self.assertEqual(offset, 4096 + 20)
        self.assertEqual(shown[0], "master byte 0x14, slave byte 0xee")
        self.assertIn("[14]", shown[1])
        self.assertIn("[ee]", shown[2])
        self.assertEqual(first_difference(b"abcd", b"ab"), 2)
        self.assertIsNone(first_difference(b"ab", b"abcd"))
        offset, shown = prove_difference(b"abcd", b"ab", 0)
        self.assertEqual((offset, shown[0]), (2, "master byte none (the master ends), slave byte 0x63"))

    def test_spark_failure_is_one_line(self) -> None:
        """
        A Spark failure whose cause is our error (its trace text) becomes
        that error's one line; anything else is not ours (C{None}).
        """
        from rmqha.pipeline.jobs import CompareError, error_line

        trace = (
            "An error occurred while calling o1.collect.\n  File \"x\", line 1\n"
            "rmqha.pipeline.jobs.CompareError: could not compare: cannot read /s on host h: "
            "Permission denied\n\tat org.apache.spark.Foo(Foo.java:1)\n"
        )
        self.assertEqual(
            error_line(RuntimeError(trace)),
            "could not compare: cannot read /s on host h: Permission denied",
        )
        self.assertEqual(str(CompareError("x")), "could not compare: x")
        self.assertEqual(
            error_line(RuntimeError("NullPointerException\n  at x")),
            "RuntimeError: NullPointerException (a bug? --debug shows the trace)",
        )

    def test_pyspark_and_py4j_failures_are_their_cause(self) -> None:
        """
        A PySpark error carrying a Python worker's trace is that trace's
        exception line (ours without its class, Spark's SQLSTATE tail
        dropped); a Py4J error is its Java cause's line.
        """
        from rmqha.pipeline.jobs import error_line

        planning = (
            "[PYTHON_DATA_SOURCE_ERROR] Failed to initialize Python data source reader: "
            "Traceback (most recent call last):\n  File \"s.py\", line 74, in _read_options\n"
            "    raise OptionError(...)\n"
            "rmqha.pipeline.source.OptionError: option bodies='maybe' is not true or false\n"
            " SQLSTATE: 38000"
        )
        self.assertEqual(
            error_line(RuntimeError(planning)), "option bodies='maybe' is not true or false"
        )
        task = (
            "An exception was thrown from the Python worker:\nTraceback (most recent call "
            "last):\n  File \"w.py\", line 1, in f\n    open(p)\n"
            "FileNotFoundError: [Errno 2] No such file or directory: '/s/x'"
        )
        self.assertEqual(
            error_line(RuntimeError(task)),
            "FileNotFoundError: [Errno 2] No such file or directory: '/s/x'",
        )
        java = (
            "An error occurred while calling o79.parquet.\n: org.apache.hadoop.fs."
            "UnsupportedFileSystemException: No FileSystem for scheme \"x\"\n\tat a.b(C.java:1)"
        )
        self.assertEqual(
            error_line(RuntimeError(java)),
            'org.apache.hadoop.fs.UnsupportedFileSystemException: No FileSystem for scheme "x"',
        )


class StatsBucketTests(SynchronousTestCase):
    """
    C{stats}' time bucket, chosen from the store's span.
    """

    def test_bucket_from_span(self) -> None:
        """
        Minutes under 2 hours, hours up to 4 days, days beyond.
        """
        from rmqha.pipeline.jobs import time_bucket

        hour = 3600 * 1000
        t0 = 1_700_000_000_000
        self.assertEqual(time_bucket(t0, t0), "minute")
        self.assertEqual(time_bucket(t0, t0 + 2 * hour - 1), "minute")
        self.assertEqual(time_bucket(t0, t0 + 2 * hour), "hour")
        self.assertEqual(time_bucket(t0, t0 + 96 * hour), "hour")
        self.assertEqual(time_bucket(t0, t0 + 96 * hour + 1), "day")


class _Stage:
    def __init__(self, stage: int, done: int, total: int, active: int, failed: int = 0) -> None:
        self.stageId = stage
        self.numCompletedTasks = done
        self.numTasks = total
        self.numActiveTasks = active
        self.numFailedTasks = failed


class _Tracker:
    """
    PySpark's C{StatusTracker}, as far as L{Progress} asks it.
    """

    def __init__(self) -> None:
        self.stages: dict[int, _Stage] = {}
        self.polls = 0

    def getActiveStageIds(self) -> list[int]:
        self.polls += 1
        return list(self.stages)

    def getStageInfo(self, stage: int) -> _Stage | None:
        return self.stages.get(stage)


class ProgressTests(SynchronousTestCase):
    """
    L{rmqha.pipeline.jobs.Progress}: a line per running stage that moved.
    """

    def test_lines(self) -> None:
        """
        Each poll prints a line for each running stage whose tasks moved
        since the last, and nothing for one that did not.
        """
        import io

        from rmqha.pipeline.jobs import Progress

        tracker, err = _Tracker(), io.StringIO()
        progress = Progress(tracker, "stats", err)
        tracker.stages = {3: _Stage(3, 0, 12, 2)}
        progress.poll()
        progress.poll()
        tracker.stages = {3: _Stage(3, 5, 12, 2, 1), 4: _Stage(4, 0, 8, 0)}
        progress.poll()
        self.assertEqual(
            err.getvalue().splitlines(),
            [
                "rmqha pipeline: stats: stage 3: 0/12 tasks done, 2 running",
                "rmqha pipeline: stats: stage 3: 5/12 tasks done, 2 running, 1 failed",
                "rmqha pipeline: stats: stage 4: 0/8 tasks done",
            ],
        )

    def test_thread_stops(self) -> None:
        """
        C{running(True)} polls from a daemon thread while its block runs
        and stops it, joined, when the block ends -- by an exception too;
        C{running(False)} starts none.
        """
        import io
        import threading
        import time

        from rmqha.pipeline.jobs import Progress

        tracker, err = _Tracker(), io.StringIO()
        tracker.stages = {1: _Stage(1, 0, 2, 1)}
        progress = Progress(tracker, "export", err, interval=0.01)
        before = threading.active_count()
        with self.assertRaises(KeyError):
            with progress.running(True):
                self.assertEqual(threading.active_count(), before + 1)
                deadline = time.monotonic() + 10
                while not tracker.polls and time.monotonic() < deadline:
                    time.sleep(0.01)
                raise KeyError("the job failed")
        self.assertEqual(threading.active_count(), before)
        self.assertEqual(err.getvalue(), "rmqha pipeline: export: stage 1: 0/2 tasks done, 1 running\n")
        polls = tracker.polls
        with Progress(tracker, "export", err, interval=0.01).running(False):
            # (No thread at all, rather than a wait to see none poll.)
            self.assertEqual(threading.active_count(), before)
        self.assertEqual(tracker.polls, polls)
