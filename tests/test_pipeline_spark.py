"""
The C{rocketmq-commitlog} data source and the pipeline jobs on a local
Spark (one session shared by the run: L{tests._spark}).  Marked C{spark}:
C{pytest -m spark} runs them alone.
"""

from __future__ import annotations

import datetime
import http.server
import io
import json
import re
from contextlib import redirect_stderr, redirect_stdout
from typing import Any
import os
import shutil
import socket

import unittest

import pytest
from twisted.trial.unittest import SynchronousTestCase

from rmqha.store.commitlog import CommitLog

from tests._helpers import make_message, rewrite, segment_path, xor_byte, zero_from
from tests._spark import spark, why_no_spark
from tests.test_pipeline import forged_record_store, random_store
from tests.test_pipeline import store_rows as store_instants

pytestmark = pytest.mark.spark


def store_rows(path: str) -> list[dict[str, object]]:
    """
    The store's records as rows (L{tests.test_pipeline.store_rows}) with
    the timestamps as epoch milliseconds, as the commit log stores them:
    the form every comparison here uses (L{df_rows}, L{rows_of}).
    """
    return rows_of([store_instants(path)])


def df_rows(df: object) -> list[dict[str, object]]:
    """
    A DataFrame's rows in offset order, in L{rows_of}'s form.
    """
    return rows_of([[row.asDict() for row in as_millis(df).orderBy("offset").collect()]])


class DataSourceTests(SynchronousTestCase):
    """
    C{spark.read.format("rocketmq-commitlog")}.
    """

    skip = why_no_spark()

    def read(self, path: str, **options: str) -> object:
        reader = spark().read.format("rocketmq-commitlog")
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load(path)

    def test_rows_equal_the_store(self) -> None:
        """
        Every record once, field for field, over several partitions (large
        segments cut into sub-ranges at record boundaries).
        """
        path = random_store(self, 400, 64 * 1024, seed=11)
        df = self.read(path, splitBytes="10k")
        self.assertGreater(df.rdd.getNumPartitions(), 8)  # type: ignore[attr-defined]
        self.assertEqual(df_rows(df), store_rows(path))

    def test_small_segments_share_a_partition(self) -> None:
        """
        Consecutive segments smaller than C{splitBytes} are packed, in
        order, into partitions of at most C{splitBytes} (a Spark task costs
        tens of milliseconds besides its reading), and every record still
        comes once.
        """
        from rmqha.pipeline.scan import plan

        path = random_store(self, 400, 16 * 1024, seed=14)
        spans = plan(path, 1 << 30)
        self.assertGreater(len(spans), 8)
        df = self.read(path, splitBytes="32k")  # two 16 KiB segments each
        self.assertEqual(
            df.rdd.getNumPartitions(), (len(spans) + 1) // 2  # type: ignore[attr-defined]
        )
        self.assertEqual(df_rows(df), store_rows(path))

    def test_options_are_pushed_down(self) -> None:
        """
        Offsets, topics and bodies off: the matching records only.
        """
        path = random_store(self, 200, 64 * 1024, seed=12)
        rows = store_rows(path)
        start, end = int(rows[20]["offset"]), int(rows[180]["offset"])  # type: ignore[call-overload]
        df = self.read(path, startOffset=str(start), endOffset=str(end), topics="orders",
                       bodies="false")
        wanted = [dict(r, body=None) for r in rows[20:180] if r["topic"] == "orders"]
        self.assertEqual(df_rows(df), wanted)

    def test_schema_selects_columns(self) -> None:
        """
        A schema given to the reader (Spark's only column pruning for a
        Python data source) yields those columns of every row, in its
        order; a column declared with another type than the rows' fails
        the query naming it.
        """
        path = random_store(self, 200, 64 * 1024, seed=15)
        df = (
            spark().read.format("rocketmq-commitlog")
            .schema("crc_ok boolean, offset long, body binary, tags string")
            .load(path)
        )
        got = [
            dict(r.asDict(), body=bytes(r["body"]))
            for r in df.orderBy("offset").collect()  # type: ignore[attr-defined]
        ]
        wanted = [
            {k: row[k] for k in ("crc_ok", "offset", "body", "tags")} for row in store_rows(path)
        ]
        self.assertEqual(got, wanted)
        self.assertEqual(df.columns, ["crc_ok", "offset", "body", "tags"])  # type: ignore[attr-defined]
        with self.assertRaises(Exception) as raised:
            spark().read.format("rocketmq-commitlog").schema("size string").load(path).count()
        self.assertIn("column size is int32", str(raised.exception))

    def test_bad_option(self) -> None:
        """
        A bad option fails the query with its name in the message.
        """
        path = random_store(self, 3, 64 * 1024, seed=13)
        with self.assertRaises(Exception) as raised:
            self.read(path, bodies="maybe").count()  # type: ignore[attr-defined]
        self.assertIn("bodies='maybe'", str(raised.exception))


class JobTests(SynchronousTestCase):
    """
    C{stats}, C{export} and C{verify}.
    """

    skip = why_no_spark()

    def test_verify_consistent_and_prefix(self) -> None:
        """
        An identical copy, and a slave holding a prefix of the master's log
        (it is behind), are consistent.
        """
        from rmqha.pipeline.jobs import verify

        master = random_store(self, 300, 32 * 1024, seed=21)
        slave = self.mktemp()
        shutil.copytree(master, slave)
        self.assertTrue(verify(spark(), master, slave).consistent)
        with CommitLog.open(master) as log:
            log.put(make_message(b"more"))
        result = verify(spark(), master, slave)
        self.assertTrue(result.consistent, result.lines())
        self.assertLess(result.slave_max_offset, result.master_max_offset)

    def test_verify_finds_a_flipped_byte(self) -> None:
        """
        One byte flipped in the slave's third segment: its exact offset,
        and the master's record containing it.
        """
        from rmqha.pipeline.jobs import verify

        master = random_store(self, 300, 32 * 1024, seed=22)
        slave = self.mktemp()
        shutil.copytree(master, slave)
        rows = store_rows(master)
        target = next(r for r in rows if int(r["offset"]) > 2 * 32 * 1024)  # type: ignore[call-overload]
        flipped = int(target["offset"]) + 77  # type: ignore[call-overload]
        xor_byte(segment_path(slave, 2 * 32 * 1024), flipped - 2 * 32 * 1024)
        result = verify(spark(), master, slave)
        self.assertFalse(result.consistent)
        self.assertEqual(result.divergent_offset, flipped)
        assert result.record is not None
        self.assertEqual(result.record["offset"], target["offset"])
        self.assertIn(f"first divergent byte at offset {flipped}", result.lines())

    def test_verify_unreadable_store_is_an_error(self) -> None:
        """
        A slave store the executors cannot read (here: moved away after
        the driver planned the blocks) is a L{CompareError} naming the
        path and the executor's host, never a divergence.
        """
        import socket

        from rmqha.pipeline import jobs

        master = random_store(self, 100, 32 * 1024, seed=24)
        slave = os.path.abspath(self.mktemp())
        shutil.copytree(master, slave)
        planned = jobs._store_layout

        def vanish(store: Any, *args: Any) -> Any:
            layout = planned(store, *args)
            if store.uri == os.path.abspath(slave):
                os.rename(slave, slave + ".gone")
            return layout

        self.patch(jobs, "_store_layout", vanish)
        e = self.assertRaises(jobs.CompareError, jobs.verify, spark(), master, slave)
        text = str(e)
        self.assertTrue(text.startswith(f"could not compare: cannot read {os.path.abspath(slave)}{os.sep}"), text)
        self.assertIn(f"on host {socket.gethostname()}: No such file", text)

    def test_verify_truncated_slave_and_extra_segment(self) -> None:
        """
        A slave segment file cut short, and a segment the master does not
        have, are each reported.
        """
        from rmqha.pipeline.jobs import verify

        master = random_store(self, 300, 32 * 1024, seed=23)
        slave = self.mktemp()
        shutil.copytree(master, slave)
        os.truncate(segment_path(slave, 32 * 1024), 1000)
        shutil.copy(segment_path(slave, 0), segment_path(slave, 100 * 32 * 1024))
        result = verify(spark(), master, slave)
        self.assertFalse(result.consistent)
        text = "\n".join(result.lines())
        self.assertIn("segment 00000000000000032768 is truncated: 1000 bytes", text)
        self.assertIn("extra segment 00000000000003276800", text)

    def _copy(self, master: str) -> str:
        slave = os.path.abspath(self.mktemp())
        shutil.copytree(master, slave)
        return slave

    def _last_record(self, store: str) -> tuple[int, int]:
        last = store_rows(store)[-1]
        return int(last["offset"]), int(last["size"])  # type: ignore[call-overload]

    def test_verify_slave_mid_record_is_consistent(self) -> None:
        """
        A slave killed while its last record was arriving (the record's
        header there, zeros where the rest of it goes) holds the records
        before it: consistent, its max offset where they end, as C{store
        check} says ("incomplete tail ... still being written").
        """
        from rmqha.pipeline.jobs import verify

        master = random_store(self, 300, 32 * 1024, seed=31)
        slave = self._copy(master)
        offset, size = self._last_record(slave)
        base = offset - offset % (32 * 1024)
        zero_from(segment_path(slave, base), offset - base + size // 2)
        result = verify(spark(), master, slave)
        self.assertTrue(result.consistent, result.lines())
        self.assertEqual(result.slave_max_offset, offset)

    def test_verify_damaged_last_record(self) -> None:
        """
        A last record that does not verify is compared with the master's
        too: damaged (a byte differs) is divergent, at that byte; a torn
        one whose bytes are the master's is not (above).
        """
        from rmqha.pipeline.jobs import verify

        master = random_store(self, 300, 32 * 1024, seed=32)
        slave = self._copy(master)
        offset, size = self._last_record(slave)
        base = offset - offset % (32 * 1024)
        for flipped in (offset + size - 3, offset + 30):
            broken = self._copy(slave)
            xor_byte(segment_path(broken, base), flipped - base)
            result = verify(spark(), master, broken)
            self.assertFalse(result.consistent)
            self.assertEqual(result.divergent_offset, flipped, result.lines())
        # Bytes that are no record after the last one: written, compared.
        junk = self._copy(slave)
        rewrite(segment_path(junk, base), offset - base + size + 100, b"\xff" * 16)
        result = verify(spark(), master, junk)
        self.assertEqual(result.divergent_offset, offset + size + 100, result.lines())
        # Torn, and what is there damaged: divergent too.
        zero_from(segment_path(slave, base), offset - base + size // 2)
        xor_byte(segment_path(slave, base), offset - base + 40)
        result = verify(spark(), master, slave)
        self.assertEqual(result.divergent_offset, offset + 40, result.lines())

    def test_verify_missing_middle_segment(self) -> None:
        """
        A slave without a middle segment file lacks those offsets: not
        consistent, the missing range named (a proven hole, not a read
        error: exit 1).
        """
        from rmqha.pipeline.jobs import verify

        master = random_store(self, 300, 32 * 1024, seed=33)
        slave = self._copy(master)
        os.remove(segment_path(slave, 2 * 32 * 1024))
        result = verify(spark(), master, slave)
        self.assertFalse(result.consistent)
        self.assertIn(
            "missing segment: the slave has no segment file for offsets 65536..98304",
            "\n".join(result.lines()),
        )

    def test_verify_directory_for_a_segment(self) -> None:
        """
        A directory where a segment file belongs, on either side, cannot
        be read: exit 2 naming it, never consistent.
        """
        from rmqha.pipeline import jobs

        master = random_store(self, 300, 32 * 1024, seed=34)
        for side in ("slave", "master"):
            slave = self._copy(master)
            copy = self._copy(master)
            broken = slave if side == "slave" else copy
            path = segment_path(broken, 32 * 1024)
            os.remove(path)
            os.mkdir(path)
            e = self.assertRaises(jobs.CompareError, jobs.verify, spark(), copy, slave)
            self.assertIn(f"cannot read {path}", str(e))
            self.assertIn("a directory, not a segment file", str(e))

    def test_verify_master_missing_a_segment(self) -> None:
        """
        A master without a segment the slave holds: nothing to compare
        the slave's bytes with there: exit 2.
        """
        from rmqha.pipeline import jobs

        master = random_store(self, 300, 32 * 1024, seed=35)
        slave = self._copy(master)
        os.remove(segment_path(master, 3 * 32 * 1024))
        e = self.assertRaises(jobs.CompareError, jobs.verify, spark(), master, slave)
        self.assertIn("has no segment file for offsets 98304..131072", str(e))

    def _bad_crc_store(self, seed: int) -> tuple[str, int]:
        """
        A store with one record whose body no longer matches its CRC, and
        that record's offset.
        """
        path = random_store(self, 120, 64 * 1024, seed=seed)
        row = store_rows(path)[40]
        offset, body = int(row["offset"]), bytes(row["body"])  # type: ignore[call-overload,arg-type]
        base = offset - offset % (64 * 1024)
        with open(segment_path(path, base), "rb") as f:
            data = f.read()
        at = data.index(body, offset - base)
        xor_byte(segment_path(path, base), at)
        return path, offset

    def test_stats_counts_bad_crc(self) -> None:
        """
        stats.json and the result count the records whose body does not
        match its CRC, in all and per topic, with the first one's offset;
        a clean store counts none.
        """
        from rmqha.pipeline.jobs import stats

        path, offset = self._bad_crc_store(41)
        result = stats(spark(), path)
        self.assertEqual((result["bad_crc"], result["first_bad_crc_offset"]), (1, offset))
        self.assertEqual(sum(t["bad_crc"] for t in result["topics"]), 1)
        self.assertEqual(sum(t["bad_crc"] for t in result["series"]), 1)
        clean = stats(spark(), random_store(self, 50, 64 * 1024, seed=42))
        self.assertEqual((clean["bad_crc"], clean["first_bad_crc_offset"]), (0, None))

    def test_export_says_or_refuses_damage(self) -> None:
        """
        export writes a record with a bad body CRC as it is (crc_ok false)
        and says so in one line; with --fail-on-damage it publishes
        nothing and raises, naming the first offset.
        """
        from rmqha.pipeline import jobs

        path, offset = self._bad_crc_store(43)
        parent = os.path.abspath(self.mktemp())
        os.makedirs(parent)
        said: list[str] = []
        out = os.path.join(parent, "out")
        self.assertEqual(jobs.export(spark(), path, out, warn=said.append), 120)
        self.assertEqual(len(said), 1)
        self.assertIn(f"1 record(s) of {os.path.abspath(path)} with a body that does not match", said[0])
        self.assertIn(f"the first at offset {offset}", said[0])
        refused = os.path.join(parent, "refused")
        e = self.assertRaises(
            jobs.DamageFound, jobs.export, spark(), path, refused, fail_on_damage=True
        )
        self.assertIn("nothing exported (--fail-on-damage)", str(e))
        self.assertEqual(sorted(os.listdir(parent)), ["out"])

    def test_empty_export_reads_back_with_its_schema(self) -> None:
        """
        A store without records exports to a directory Spark reads back,
        with the columns of a non-empty export and no row.
        """
        from rmqha.pipeline.jobs import export

        empty = os.path.abspath(self.mktemp())
        with CommitLog.open(empty, segment_size=64 * 1024):
            pass
        full = random_store(self, 20, 64 * 1024, seed=45)
        parent = os.path.abspath(self.mktemp())
        os.makedirs(parent)
        for fmt in ("parquet", "orc"):
            self.assertEqual(export(spark(), empty, os.path.join(parent, f"empty-{fmt}"), fmt), 0)
            self.assertEqual(export(spark(), full, os.path.join(parent, f"full-{fmt}"), fmt), 20)
            back = spark().read.format(fmt).load(os.path.join(parent, f"empty-{fmt}"))
            wanted = spark().read.format(fmt).load(os.path.join(parent, f"full-{fmt}"))
            self.assertEqual(back.count(), 0)
            self.assertEqual(
                sorted((f.name, f.dataType) for f in back.schema.fields),
                sorted((f.name, f.dataType) for f in wanted.schema.fields),
            )

    def test_export_round_trip(self) -> None:
        """
        Parquet partitioned by topic and store date (UTC) reads back as the
        same records with the partition columns, to a relative OUT (made
        absolute on the driver) and to a C{file:} URI; ORC and JSON read
        back with their timestamp columns; nothing but OUT is left in its
        directory.
        """
        from pyspark.sql.types import DateType, TimestampType

        from rmqha.pipeline.jobs import export

        path = random_store(self, 150, 64 * 1024, seed=24)
        rows = store_instants(path)
        parent = os.path.abspath(self.mktemp())
        os.makedirs(parent)
        out = os.path.join(parent, "relative")
        self.assertEqual(export(spark(), path, os.path.relpath(out)), 150)
        dates = {
            (str(r["topic"]), r["store_timestamp"].date().isoformat())  # type: ignore[attr-defined]
            for r in rows
        }
        self.assertEqual(
            sorted(
                (topic[len("topic="):], date[len("date="):])
                for topic in os.listdir(out) if topic.startswith("topic=")
                for date in os.listdir(os.path.join(out, topic))
            ),
            sorted(dates),
        )
        whole = spark().read.parquet(out)
        self.assertIsInstance(whole.schema["date"].dataType, DateType)
        self.assertEqual(
            sorted((r["topic"], r["date"].isoformat()) for r in whole.select("topic", "date").distinct().collect()),
            sorted(dates),
        )
        rows = store_rows(path)
        back = whole.select(*store_rows_columns())
        self.assertEqual(df_rows(back), rows)
        self.assertEqual(export(spark(), path, "file://" + parent + "/uri", "json"), 150)
        from rmqha.pipeline.scan import SCHEMA_DDL

        json_back = (
            spark().read.schema(SCHEMA_DDL).json(os.path.join(parent, "uri"))
            .select(*store_rows_columns())
        )
        self.assertEqual(df_rows(json_back), rows)
        self.assertEqual(export(spark(), path, os.path.join(parent, "orc"), "orc"), 150)
        orc_back = spark().read.orc(os.path.join(parent, "orc")).select(*store_rows_columns())
        self.assertIsInstance(orc_back.schema["store_timestamp"].dataType, TimestampType)
        self.assertEqual(df_rows(orc_back), rows)
        self.assertEqual(sorted(os.listdir(parent)), ["orc", "relative", "uri"])

    def test_export_seen_partly_by_the_driver_leaves_nothing(self) -> None:
        """
        When the driver reads back fewer rows than the executors wrote (OUT
        not shared by them all), export fails with the counts and the
        advice, and removes what it wrote: no OUT, no temporary sibling.
        """
        from rmqha.pipeline import jobs

        path = random_store(self, 40, 64 * 1024, seed=26)
        parent = os.path.abspath(self.mktemp())
        os.makedirs(parent)
        self.patch(jobs, "_count_back", lambda *args: 25)
        with self.assertRaises(ValueError) as raised:
            jobs.export(spark(), path, os.path.join(parent, "out"))
        self.assertEqual(
            str(raised.exception),
            f"file://{parent}/out is not shared by the driver and every executor: 40 records "
            "written, 25 visible to the driver; use a shared filesystem or an object store URI",
        )
        self.assertEqual(os.listdir(parent), [])

    def test_stats(self) -> None:
        """
        Counts and bytes per topic equal the store's; percentiles and a
        PNG chart are written.
        """
        from rmqha.pipeline.jobs import stats

        path = random_store(self, 120, 64 * 1024, seed=25)
        out = self.mktemp()
        result = stats(spark(), path, out)
        rows = store_rows(path)
        for topic in result["topics"]:
            mine = [r for r in rows if r["topic"] == topic["topic"]]
            self.assertEqual(topic["messages"], len(mine))
            self.assertEqual(topic["bytes"], sum(int(r["size"]) for r in mine))  # type: ignore[call-overload]
            self.assertLessEqual(topic["body_size_p50"], topic["body_size_p99"])
        self.assertEqual(sum(h["messages"] for h in result["series"]), len(rows))
        with open(os.path.join(out, "stats.json")) as f:
            written = json.load(f)
        self.assertEqual(written["messages"], len(rows))
        # A fresh store spans seconds: per minute, not one dot per hour.
        self.assertEqual(written["bucket"], "minute")
        self.assertRegex(written["series"][0]["time"], r"^\d{4}-\d\d-\d\dT\d\d:\d\dZ$")
        with open(os.path.join(out, "stats.png"), "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

    def test_stats_reads_the_store_once(self) -> None:
        """
        stats reads the store in one pass: one stage of as many tasks as
        the store's partitions (the per-topic totals, the span and the
        three series all come from that one aggregation), and its
        percentiles stay within the sketches' error of the exact ones.
        """
        from rmqha.pipeline.jobs import stats
        from rmqha.pipeline.source import pack
        from rmqha.pipeline.scan import plan

        path = random_store(self, 150, 16 * 1024, seed=27)
        partitions = len(pack(plan(path, 10_000), 10_000))
        self.assertNotIn(partitions, (1, 8))  # (not a shuffle's stage)
        context = spark().sparkContext
        context.setJobGroup("rmqha-stats-once", "test")
        try:
            result = stats(spark(), path, options={"splitBytes": "10000"})
        finally:
            context.setLocalProperty("spark.jobGroup.id", None)
        tracker = context.statusTracker()
        stages = {
            s for j in tracker.getJobIdsForGroup("rmqha-stats-once")
            for s in tracker.getJobInfo(j).stageIds
        }
        infos = [tracker.getStageInfo(s) for s in stages]
        scans = [i for i in infos if i is not None and i.numTasks == partitions
                 and i.numCompletedTasks == partitions]
        self.assertEqual(len(scans), 1, [(i.stageId, i.numTasks) for i in infos if i])
        rows = store_rows(path)
        for topic in result["topics"]:
            sizes = sorted(int(r["body_size"]) for r in rows if r["topic"] == topic["topic"])  # type: ignore[call-overload]
            # (Fewer records than the sketches' k: exact, the smallest
            # value with at least that fraction of the values at or below it.)
            for p in (50, 90, 99):
                self.assertEqual(topic[f"body_size_p{p}"], sizes[-(-p * len(sizes) // 100) - 1])

    def test_stats_hour_and_day_series(self) -> None:
        """
        A store spanning 3 days is shown per hour, one spanning 9 days per
        day: each series row counts that topic's records of that UTC hour
        or day, and its percentiles are theirs (exact: few records).
        """
        import collections

        from rmqha.pipeline.jobs import stats

        for days, bucket, pattern in ((3, "hour", "%Y-%m-%dT%H:00Z"), (9, "day", "%Y-%m-%d")):
            ticks = iter(range(10_000))
            step = days * 86_400 / 40
            path = self.mktemp()
            log = CommitLog.open(
                path, segment_size=64 * 1024, clock=lambda: 1_700_000_000 + next(ticks) * step
            )
            for i in range(40):
                log.put(make_message(b"x" * (i % 7), topic=("a", "b")[i % 2]))
            log.close()
            result = stats(spark(), path)
            self.assertEqual(result["bucket"], bucket)
            groups: dict[tuple[str, str], list[int]] = collections.defaultdict(list)
            for r in store_instants(path):
                time = r["store_timestamp"].strftime(pattern)  # type: ignore[attr-defined]
                groups[(str(r["topic"]), time)].append(int(r["body_size"]))  # type: ignore[call-overload]
            self.assertEqual(
                [(s["topic"], s["time"], s["messages"], s["body_size_p50"], s["body_size_p99"])
                 for s in result["series"]],
                [(t, time, len(v), sorted(v)[-(-len(v) // 2) - 1], max(v))
                 for (t, time), v in sorted(groups.items())],
            )

    def test_stats_reads_only_its_columns(self) -> None:
        """
        The stats job asks the source for the six columns it uses, not the
        whole row: no body, properties map or host strings are built or
        converted to rows by Spark's JVM (most of a query's CPU).
        """
        from rmqha.pipeline import jobs

        path = random_store(self, 30, 64 * 1024, seed=26)
        loaded: list[list[str]] = []
        load = jobs._load

        def recording(*args: Any, **kwargs: Any) -> Any:
            df = load(*args, **kwargs)
            loaded.append(list(df.columns))
            return df

        self.patch(jobs, "_load", recording)
        result = jobs.stats(spark(), path)
        self.assertEqual(loaded, [list(jobs.STATS_COLUMNS)])
        self.assertEqual(result["messages"], 30)


def store_rows_columns() -> list[str]:
    from rmqha.pipeline.scan import arrow_schema

    return list(arrow_schema().names)


class CommandTests(SynchronousTestCase):
    """
    C{rmqha pipeline ...} (in this process, on the shared session).
    """

    skip = why_no_spark()

    def run_cli(self, *argv: str) -> tuple[int, str, str]:
        import io

        from rmqha.cli import main

        spark()  # the shared session: the command then reuses it
        out, err = io.StringIO(), io.StringIO()
        return main(list(argv), stdout=out, stderr=err), out.getvalue(), err.getvalue()

    def test_damage_exit_status(self) -> None:
        """
        A record with a bad body CRC: stats says so on stderr and exits 0,
        or 1 with --fail-on-damage (its JSON counts it either way).
        """
        import io
        import sys

        path, offset = JobTests._bad_crc_store(self, 44)  # type: ignore[arg-type]
        # (The job's warnings go to the process's stderr.)
        stderr = io.StringIO()
        self.patch(sys, "stderr", stderr)
        status, out, _ = self.run_cli("pipeline", "stats", path)
        err = stderr.getvalue()
        self.assertEqual(status, 0)
        self.assertEqual(json.loads(out)["bad_crc"], 1)
        self.assertIn("rmqha pipeline: warning: 1 record(s)", err)
        status, out, _ = self.run_cli("pipeline", "stats", "--fail-on-damage", path)
        err = stderr.getvalue()
        self.assertEqual(status, 1)
        self.assertIn(f"rmqha pipeline: error: 1 record(s)", err)
        self.assertIn(f"the first at offset {offset}", err)

    def test_verify_exit_status(self) -> None:
        """
        C{consistent} and 0; the divergent offset and 1; a missing
        directory is one error line, exit 2 (a bad input, found before
        Spark runs).
        """
        master = random_store(self, 100, 32 * 1024, seed=31)
        slave = self.mktemp()
        shutil.copytree(master, slave)
        status, out, _ = self.run_cli("pipeline", "verify", master, slave)
        self.assertEqual(status, 0)
        self.assertTrue(out.startswith("consistent: "), out)
        xor_byte(segment_path(slave, 0), 5000)
        status, out, _ = self.run_cli("pipeline", "verify", master, slave)
        self.assertEqual(status, 1)
        self.assertIn("first divergent byte at offset 5000\n", out)
        with open(segment_path(master, 0), "rb") as f:
            f.seek(5000)
            ours = f.read(1)[0]
        self.assertIn(f"master byte 0x{ours:02x}, slave byte 0x{ours ^ 0xFF:02x}\n", out)
        status, _, err = self.run_cli("pipeline", "verify", master, "nowhere")
        self.assertEqual((status, err), (2, f"rmqha: error: {os.path.abspath('nowhere')}: no such directory\n"))

    def test_verify_unreadable_exit_status(self) -> None:
        """
        A store the executors cannot read: one line "could not compare"
        naming the path, exit 2 (never 1, a divergence).
        """
        from rmqha.pipeline import jobs

        master = random_store(self, 50, 32 * 1024, seed=33)
        slave = os.path.abspath(self.mktemp())
        shutil.copytree(master, slave)
        planned = jobs._store_layout

        def vanish(store: Any, *args: Any) -> Any:
            layout = planned(store, *args)
            if store.uri == os.path.abspath(slave):
                shutil.rmtree(slave)
            return layout

        self.patch(jobs, "_store_layout", vanish)
        status, out, err = self.run_cli("pipeline", "verify", master, slave)
        self.assertEqual((status, out), (2, ""))
        self.assertTrue(err.startswith(f"rmqha: error: could not compare: cannot read {os.path.abspath(slave)}"), err)
        self.assertEqual(err.count("\n"), 1, err)

    def test_options_reach_the_data_source(self) -> None:
        """
        C{--option} goes to every store read: C{topics=orders} leaves one
        topic in stats; a bad option is one line naming it, exit 2, and
        export leaves no OUT.
        """
        path = random_store(self, 60, 64 * 1024, seed=34)
        status, out, _ = self.run_cli("pipeline", "stats", path, "--option", "topics=orders")
        self.assertEqual(status, 0)
        self.assertEqual([t["topic"] for t in json.loads(out.splitlines()[0])["topics"]], ["orders"])
        parent = self.mktemp()
        os.makedirs(parent)
        status, out, err = self.run_cli(
            "pipeline", "export", path, os.path.join(parent, "out"), "--option", "bodies=maybe"
        )
        self.assertEqual(
            (status, out, err),
            (2, "", "rmqha: error: option bodies='maybe' is not true or false\n"),
        )
        self.assertEqual(os.listdir(parent), [])

    def test_stats_command(self) -> None:
        """
        C{stats --out} prints the totals as JSON and writes the files.
        """
        path = random_store(self, 30, 64 * 1024, seed=32)
        out_dir = self.mktemp()
        status, out, _ = self.run_cli("pipeline", "stats", path, "--out", out_dir)
        self.assertEqual(status, 0)
        self.assertEqual(json.loads(out.splitlines()[0])["messages"], 30)
        self.assertTrue(os.path.exists(os.path.join(out_dir, "stats.png")))


class ShippingTests(SynchronousTestCase):
    """
    The rmqha package zipped for executors that lack it.
    """

    skip = why_no_spark()

    def test_package_zip(self) -> None:
        """
        The zip holds the package's modules under C{rmqha/} (so it imports
        from the zip), no bytecode, the compiled codec this interpreter
        loaded with the manifest of its SHA-256, and is made once per
        process.
        """
        import hashlib
        import zipfile

        from rmqha.pipeline.source import package_zip
        from rmqha.store import _record

        path = package_zip()
        self.assertEqual(package_zip(), path)
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            compiled = [n for n in names if n.endswith(".so")]
            if _record.ACCELERATED:
                self.assertEqual(
                    compiled, [f"rmqha/store/{os.path.basename(_record._accel.__file__)}"]
                )
                self.assertEqual(
                    z.read("rmqha/store/_speedups.sha256").decode(),
                    f"{hashlib.sha256(z.read(compiled[0])).hexdigest()}  {compiled[0]}\n",
                )
        self.assertIn("rmqha/__init__.py", names)
        self.assertIn("rmqha/pipeline/source.py", names)
        self.assertIn("rmqha/store/_record.py", names)
        self.assertEqual([n for n in names if "__pycache__" in n or n.endswith(".pyc")], [])
        self.assertEqual([n for n in names if not n.startswith("rmqha/")], [])

    def shipped_codec(self, zip_path: str, **env: str) -> list[object]:
        """
        What a Python with only the standard library and C{zip_path} on its
        path (as a cluster's executor without rmqha) imports as the codec.
        """
        import subprocess
        import sys

        code = (
            "import json, sys; sys.path.insert(0, sys.argv[1]); import rmqha; "
            "from rmqha.store import _record, _guard; "
            "print(json.dumps([rmqha.__file__, _record.ACCELERATED, _guard.AVAILABLE, "
            "getattr(_record._accel, '__file__', None)]))"
        )
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", code, zip_path],
            capture_output=True, text=True, timeout=60, env=dict(os.environ, **env),
        )
        self.assertEqual(done.stderr, "")
        result: list[object] = json.loads(done.stdout)
        self.assertEqual(result[0], os.path.join(zip_path, "rmqha", "__init__.py"))
        return result

    def test_shipped_package_runs_the_compiled_codec(self) -> None:
        """
        rmqha imported from the zip (by a Python with a clean path) runs
        the compiled codec, loaded from a private temporary copy that is
        gone once loaded; a codec whose digest does not match the
        manifest's, or C{RMQHA_PURE=1}, leaves the pure codec.
        """
        import zipfile

        from rmqha.pipeline.source import package_zip
        from rmqha.store import _record

        if not _record.ACCELERATED:
            raise unittest.SkipTest("no compiled codec here to ship")
        _, accelerated, guarded, where = self.shipped_codec(package_zip())
        self.assertEqual((accelerated, guarded), (True, True))
        assert isinstance(where, str)
        self.assertTrue(os.path.basename(os.path.dirname(where)).startswith("rmqha-speedups-"))
        self.assertFalse(os.path.exists(os.path.dirname(where)))
        self.assertEqual(self.shipped_codec(package_zip(), RMQHA_PURE="1")[1], False)
        tampered = os.path.abspath(self.mktemp() + ".zip")
        with zipfile.ZipFile(package_zip()) as source, zipfile.ZipFile(tampered, "w") as z:
            for item in source.infolist():
                data = source.read(item)
                if item.filename == "rmqha/store/_speedups.sha256":
                    data = b"0" * 64 + data[64:]
                z.writestr(item, data)
        self.assertEqual(self.shipped_codec(tampered)[1:3], [False, False])


class StreamTests(SynchronousTestCase):
    """
    C{spark.readStream.format("rmqha")} (the JVM source's micro-batch
    stream) over a local store being written, and C{export --incremental}.
    """

    skip = why_no_spark()

    def setUp(self) -> None:
        from rmqha.pipeline._jar import ensure_jar

        if shutil.which("javac") is None or shutil.which("jar") is None:
            raise unittest.SkipTest("no javac/jar: the JVM data source cannot be built here")
        jar, why = ensure_jar()
        self.assertIsNotNone(jar, why)

    def put(self, log: CommitLog, count: int, topic: str = "orders") -> list[Any]:
        results = [log.put(make_message(os.urandom(60 + i % 50), topic=topic, queue_id=i % 3))
                   for i in range(count)]
        log.flush()
        return results

    def batch(self, path: str) -> list[dict[str, object]]:
        from rmqha.pipeline.source import read_store

        return df_rows(read_store(spark(), path))

    def exported(self, out: str) -> list[dict[str, object]]:
        """
        The rows of an export (its partition columns: topic back in its
        place, date dropped).
        """
        from rmqha.pipeline.scan import SCHEMA_DDL

        names = [part.split(" ", 1)[0] for part in SCHEMA_DDL.split(", ")]
        return df_rows(spark().read.parquet(out).select(*names))

    def stream(self, path: str, **options: str) -> Any:
        reader = spark().readStream.format("rmqha")
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load(path)

    def memory(self, path: str, **options: str) -> tuple[Any, str]:
        name = f"rmqha_stream_{id(self)}"
        query = (
            self.stream(path, **options).writeStream.format("memory").queryName(name)
            .option("checkpointLocation", self.mktemp()).start()
        )
        self.addCleanup(query.stop)
        return query, name

    def test_follows_a_growing_store(self) -> None:
        """
        A stream's rows are the batch read's; records appended (rolling
        segments) come in the next batch, only they; a torn last record is
        waited for (not a row, not an error) and read once whole; a bad
        record with valid ones after it fails the query naming its offset.
        The store is changed while the query is stopped where a batch
        must not see it half done (a new query object then resumes from
        the checkpoint).
        """
        path, out, checkpoint = self.mktemp(), self.mktemp(), self.mktemp()
        log = CommitLog.open(path, segment_size=4096)
        self.addCleanup(log.close)
        self.put(log, 12)

        def start() -> Any:
            query = (
                self.stream(path).writeStream.format("parquet").option("path", out)
                .option("checkpointLocation", checkpoint).start()
            )
            self.addCleanup(query.stop)
            return query

        def sink() -> list[dict[str, object]]:
            return df_rows(spark().read.parquet(out))

        query = start()
        query.processAllAvailable()
        self.assertEqual(len(sink()), 12)
        self.assertEqual(sink(), self.batch(path))
        self.put(log, 30, topic="payments")  # two more segments
        query.processAllAvailable()
        self.assertEqual(sink(), self.batch(path))  # each record once
        self.assertEqual(len(sink()), 42)
        query.stop()

        # The last record half written: waited for, then read once.
        (last,) = self.put(log, 1, topic="late")
        segment = segment_path(path, last.offset - last.offset % 4096)
        inside = last.offset % 4096
        with open(segment, "rb") as f:
            f.seek(inside)
            whole = f.read(last.size)
        zero_from(segment, inside + 40)
        # A next segment made ahead of time, still empty (Apache RocketMQ
        # preallocates them): the records still go on here.
        ahead = segment_path(path, last.offset - last.offset % 4096 + 4096)
        with open(ahead, "wb") as f:
            f.write(bytes(4096))
        query = start()
        query.processAllAvailable()
        self.assertEqual(len(sink()), 42)
        rewrite(segment, inside, whole)
        query.processAllAvailable()
        self.assertEqual(len(sink()), 43)
        self.assertEqual(sink(), self.batch(path))
        query.stop()
        os.unlink(ahead)

        # Damage: a garbled header with records after it.
        bad, *_ = self.put(log, 3)
        xor_byte(segment_path(path, bad.offset - bad.offset % 4096), bad.offset % 4096 + 5)
        with self.assertRaises(Exception) as raised:
            start().processAllAvailable()
        self.assertIn(f"bad record at offset {bad.offset}: bad magic code", str(raised.exception))
        self.assertIn("valid records follow", str(raised.exception))

    def test_stop_fail_and_restart_exactly_once(self) -> None:
        """
        A stream into a Parquet file sink, in small batches
        (C{maxBytesPerTrigger}): stopped after a batch, failed in a batch's
        task (one topic's directory cannot be made), and run again from
        its checkpoint by new query objects: every record once in the
        sink, none lost or repeated.
        """
        from pyspark.errors import StreamingQueryException

        path, out, checkpoint = self.mktemp(), self.mktemp(), self.mktemp()
        log = CommitLog.open(path, segment_size=4096)
        self.addCleanup(log.close)
        self.put(log, 20)

        def run() -> Any:
            return (
                self.stream(path, maxBytesPerTrigger="3k").writeStream.format("parquet")
                .partitionBy("topic").option("path", out).option("checkpointLocation", checkpoint)
                .trigger(availableNow=True).start()
            )

        query = run()
        while query.isActive and not query.recentProgress:
            query.awaitTermination(0.05)
        query.stop()
        self.put(log, 20, topic="late")
        with open(os.path.join(out, "topic=late"), "w"):
            pass  # a file where the topic's directory must go
        with self.assertRaises(StreamingQueryException):
            run().awaitTermination()
        os.unlink(os.path.join(out, "topic=late"))
        query = run()
        query.awaitTermination()
        self.assertEqual(df_rows(spark().read.parquet(out)), self.batch(path))

    def test_starting_offsets(self) -> None:
        """
        C{startingOffsets} inside a record starts at the next record; a
        value that is no offset fails the query naming the option.
        """
        path = self.mktemp()
        log = CommitLog.open(path, segment_size=4096)
        self.addCleanup(log.close)
        puts = self.put(log, 8)
        name = f"rmqha_start_{id(self)}"
        query = (
            self.stream(path, startingOffsets=str(puts[2].offset + 5)).writeStream
            .format("memory").queryName(name).trigger(availableNow=True).start()
        )
        query.awaitTermination()
        self.assertEqual(df_rows(spark().table(name)), self.batch(path)[3:])
        with self.assertRaises(Exception) as raised:
            self.stream(path, startingOffsets="first").writeStream.format("memory").queryName(
                f"{name}_bad").trigger(availableNow=True).start().awaitTermination()
        self.assertIn("option startingOffsets='first' is not earliest, latest or an offset",
                      str(raised.exception))

    def test_export_incremental(self) -> None:
        """
        C{export --incremental} twice: all records, then only those
        appended since, the offsets said; an existing C{OUT} that is no
        incremental export is refused in one line, before Spark; segments
        deleted before the stream read them (C{failOnDataLoss}).
        """
        from rmqha.pipeline.jobs import export_incremental, main

        path, out = self.mktemp(), os.path.abspath(self.mktemp())
        log = CommitLog.open(path, segment_size=4096)
        self.addCleanup(log.close)
        self.put(log, 10)
        first = export_incremental(spark(), path, out)
        self.assertEqual((first.rows, first.start), (10, 0))
        more = self.put(log, 25, topic="payments")
        second = export_incremental(spark(), path, out)
        self.assertEqual(second.rows, 25)
        self.assertEqual((second.start, second.end), (first.end, more[-1].next_offset))
        self.assertEqual(
            second.line(out, "parquet"),
            f"exported 25 new records to {out} (parquet, by topic and date, incremental): "
            f"offsets {first.end}..{more[-1].next_offset} in 1 batch",
        )
        self.assertEqual(self.exported(out), self.batch(path))
        printed = io.StringIO()
        with redirect_stdout(printed):  # the command, on the shared session
            self.assertEqual(main(["export", path, out, "--incremental"]), 0)
        self.assertEqual(printed.getvalue(), f"exported 0 new records to file://{out} "
                         "(parquet, incremental): nothing new since the last run\n")

        plain = self.mktemp()
        os.mkdir(plain)
        err = io.StringIO()
        with redirect_stderr(err):
            self.assertEqual(main(["export", path, plain, "--incremental"]), 2)
        self.assertIn(f"{plain} exists and is not an incremental export", err.getvalue())
        self.assertEqual(err.getvalue().count("\n"), 1)
        with self.assertRaises(ValueError) as raised:
            export_incremental(spark(), path, out, "json")
        self.assertIn(f"{out} is the incremental export of", str(raised.exception))

        # Segments deleted (retention) before the stream read them: the
        # run fails naming both offsets, unless failOnDataLoss=false
        # (then it goes on from the first segment left).
        self.put(log, 60)
        for segment in range(0, second.end + 1, 4096):  # (the stream's next start among them)
            os.unlink(segment_path(path, segment))
        first_left = second.end - second.end % 4096 + 4096
        with self.assertRaises(Exception) as raised:
            export_incremental(spark(), path, out)
        self.assertIn(
            f"offsets {second.end}..{first_left} were deleted before this stream read them",
            str(raised.exception),
        )
        self.assertIn("give the option failOnDataLoss=false", str(raised.exception))
        lossy = export_incremental(spark(), path, out, options={"failOnDataLoss": "false"})
        left = self.batch(path)
        self.assertEqual(lossy.rows, len(left))
        self.assertEqual(self.exported(out)[35:], left)

        # Another run at the same time (holding OUT's lock, which the runs
        # above let go): refused in one line naming OUT and the other's
        # pid, before its stream starts (it exports nothing).
        from tests.test_locks import hold

        other = hold(self, os.path.join(out, "_checkpoint", ".rmqha.lock"))
        self.put(log, 1)
        batches = os.path.join(out, "_checkpoint", "offsets")
        before = sorted(os.listdir(batches))
        with self.assertRaises(ValueError) as raised:
            export_incremental(spark(), path, out)
        self.assertEqual(str(raised.exception), f"{out} is in use by another rmqha (pid {other.pid})")
        self.assertEqual(sorted(os.listdir(batches)), before)

    def test_export_incremental_counts_damage(self) -> None:
        """
        Records with a bad body CRC are exported as they are and counted
        in the run that exports them (a warning on stderr, exit 0); with
        C{--fail-on-damage} the run says so as an error, exit 1 (its sink
        has committed them); a later run without new damage is quiet.
        """
        from rmqha.pipeline.jobs import export_incremental, main

        path, out = self.mktemp(), os.path.abspath(self.mktemp())
        log = CommitLog.open(path, segment_size=4096)
        self.addCleanup(log.close)
        first = self.put(log, 6)
        # (A v1 record with IPv4 hosts: its body starts 88 bytes in.)
        xor_byte(segment_path(path, 0), first[2].offset + 90)
        added = export_incremental(spark(), path, out)
        self.assertEqual((added.rows, added.bad.bad_crc, added.bad.first_offset),
                         (6, 1, first[2].offset))
        more = self.put(log, 4)
        xor_byte(segment_path(path, more[1].offset - more[1].offset % 4096),
                 more[1].offset % 4096 + 90)
        printed, errors = io.StringIO(), io.StringIO()
        with redirect_stdout(printed), redirect_stderr(errors):
            self.assertEqual(main(["export", path, out, "--incremental", "--fail-on-damage"]), 1)
        self.assertIn("exported 4 new records", printed.getvalue())
        self.assertEqual(
            errors.getvalue(),
            f"rmqha pipeline: error: 1 record(s) of {path} with a body that does not match its "
            f"CRC (crc_ok false), the first at offset {more[1].offset}: 'rmqha store check' "
            "says where, 'rmqha store repair' mends them from a replica\n",
        )
        self.put(log, 2)
        errors = io.StringIO()
        with redirect_stdout(io.StringIO()), redirect_stderr(errors):
            self.assertEqual(main(["export", path, out, "--incremental", "--fail-on-damage"]), 0)
        self.assertEqual(errors.getvalue(), "")


class _Broker(http.server.BaseHTTPRequestHandler):
    """
    A broker's commit-log HTTP as scripted by the test (L{JvmHttpStoreTests}).
    """

    script: dict[str, Any] = {}

    def log_message(self, *args: Any) -> None:
        pass

    def answer(self, status: int, body: bytes, **headers: str) -> None:
        self.send_response(status)
        headers.setdefault("Content-Length", str(len(body)))
        for key, value in headers.items():
            self.send_header(key.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        script = self.script
        script.setdefault("requests", []).append((self.path, self.headers.get("Range")))
        if script.get("busy", 0) > 0:
            script["busy"] -= 1
            self.answer(503, b'{"error": "busy"}', Retry_After="0")
            return
        if self.path == "/commitlog":
            if "listing" in script:
                self.answer(*script["listing"])
                return
            segments = [
                {"offset": base, "name": f"{base:020d}", "size": len(data)}
                for base, data in sorted(script["segments"].items())
            ]
            self.answer(200, json.dumps({"segments": segments, "max_offset": script["max"]}).encode())
            return
        held = script.get("hold", {}).get(self.headers.get("Range"))
        if held is not None:
            # (The test sees the request arrive, and lets it be answered.)
            arrived, answer = held
            arrived.set()
            answer.wait(30)
        base = int(self.path.rsplit("/", 1)[-1])
        data = script["segments"][base]
        first, last = (int(n) for n in self.headers["Range"][len("bytes="):].split("-"))
        shift = script.get("shift", 0)
        part = data[first + shift : last + 1 + shift]
        self.answer(206, part, Content_Range=f"bytes {first + shift}-{last + shift}/{len(data)}")


class JvmHttpStoreTests(SynchronousTestCase):
    """
    The JVM source's live-broker store (C{rmqha.spark.HttpStore}), called
    in the driver's JVM against a scripted server on loopback: the
    protocol of L{rmqha.pipeline.httpstore} (tests/test_httpstore.py).
    """

    skip = why_no_spark()

    def setUp(self) -> None:
        import threading

        if shutil.which("javac") is None or shutil.which("jar") is None:
            raise unittest.SkipTest("no javac/jar: the JVM data source cannot be built here")
        self.script: dict[str, Any] = {
            "segments": {0: bytes(range(256)) * 4, 1024: b"\x07" * 100}, "max": 1100,
        }
        handler = type("Handler", (_Broker,), {"script": self.script})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        self.location = f"rmqha+http://127.0.0.1:{server.server_address[1]}"

    def store(self, location: str | None = None, **options: str) -> Any:
        from py4j.java_gateway import set_field

        jvm = spark().sparkContext._jvm
        given = jvm.java.util.HashMap()
        for key, value in options.items():
            given.put(key.lower(), value)
        store = jvm.rmqha.spark.HttpStore.of(location or self.location, given)
        set_field(store, "busyScale", 0.0)
        return store

    def error(self, call: Any) -> str:
        with self.assertRaises(Exception) as raised:
            call()
        e: Any = raised.exception
        java = getattr(e, "java_exception", None) or getattr(e, "_origin", None)
        line: str = java.getMessage() if java is not None else str(e)
        self.assertNotIn("\n", line)
        return line

    def test_listing_and_exact_ranges(self) -> None:
        """
        The segments as listed, the max offset as where records end, each
        read one range of exactly the bytes asked.
        """
        from py4j.java_gateway import get_field

        store = self.store()
        segments = list(store.segments())
        self.assertEqual([(get_field(s, "base"), get_field(s, "size"), get_field(s, "name"))
                          for s in segments],
                         [(0, 1024, f"{0:020d}"), (1024, 100, f"{1024:020d}")])
        self.assertEqual(store.recordsEnd(), 1100)
        reader = store.open(segments[0])
        self.assertEqual(bytes(reader.read(1000, 100).array()), self.script["segments"][0][1000:])
        self.assertEqual(self.script["requests"][-1], ("/commitlog/" + f"{0:020d}", "bytes=1000-1023"))
        self.assertEqual(reader.window(), 8 << 20)

    def test_reads_ahead_to_where_the_reading_ends(self) -> None:
        """
        An input told where its caller's reading ends reads the next range
        (the same length, right after the last, cut at that end) while the
        caller decodes one: the next read takes it (no second request); a
        read elsewhere drops it; an input not told reads only what is asked.
        """
        store = self.store()
        segment = list(store.segments())[0]
        data = self.script["segments"][0]
        name = f"/commitlog/{0:020d}"
        import threading

        arrived, answer = threading.Event(), threading.Event()
        self.script["hold"] = {"bytes=100-199": (arrived, answer)}
        reader = store.open(segment)
        reader.readingTo(250)
        # (As a span decoder asks: windows, the last cut at the end.)
        got = [bytes(reader.read(0, 100).array())]
        # The next range is asked for before the caller asks for it.
        self.assertTrue(arrived.wait(30))
        answer.set()
        got += [bytes(reader.read(at, n).array()) for at, n in ((100, 100), (200, 50))]
        self.assertEqual(got, [data[0:100], data[100:200], data[200:250]])
        self.assertEqual(
            self.script["requests"][-3:],
            [(name, "bytes=0-99"), (name, "bytes=100-199"), (name, "bytes=200-249")],
        )
        reader.close()
        arrived, answer = threading.Event(), threading.Event()
        self.script["hold"] = {"bytes=100-199": (arrived, answer)}
        reader = store.open(segment)
        reader.readingTo(510)
        self.assertEqual(bytes(reader.read(0, 100).array()), data[0:100])
        self.assertTrue(arrived.wait(30))
        # A read elsewhere (the range read ahead is not it: dropped), and
        # none after it (the reading ends at 510).
        self.assertEqual(bytes(reader.read(500, 10).array()), data[500:510])
        answer.set()
        reader.close()
        self.assertEqual(self.script["requests"][-1], (name, "bytes=500-509"))
        del self.script["requests"][:]
        plain = store.open(segment)
        self.assertEqual(bytes(plain.read(0, 100).array()), data[0:100])
        self.assertEqual(bytes(plain.read(100, 100).array()), data[100:200])
        self.assertEqual(self.script["requests"], [(name, "bytes=0-99"), (name, "bytes=100-199")])

    def test_certificate_must_name_the_host(self) -> None:
        """
        Over TLS, a broker whose certificate (signed by the CA given) does
        not name the host asked for is refused: one line saying TLS, no
        request made.
        """
        import ssl
        import threading

        from rmqha import certs

        directory = self.mktemp()
        os.makedirs(directory)
        ca = certs.make_ca()
        ca_path, _ = certs.write_pair(ca, directory, "ca")
        cert, key = certs.write_pair(
            certs.issue(ca, "elsewhere", ["elsewhere.example"], server=True), directory, "broker"
        )
        handler = type("Handler", (_Broker,), {"script": self.script})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        location = f"rmqha+https://127.0.0.1:{server.server_address[1]}"
        del self.script.setdefault("requests", [])[:]
        line = self.error(lambda: self.store(location, tlsCa=ca_path).segments())
        self.assertTrue(line.startswith(f"{location}/commitlog: TLS: "), line)
        self.assertEqual(self.script["requests"], [])

    def test_refused_answers(self) -> None:
        """
        An answer elsewhere than asked, a busy broker past its retries, a
        listing too long, a 404 and a refused connection are each one
        line naming the URL; a busy broker within the retries is asked
        again.
        """
        store = self.store()
        segment = list(store.segments())[0]
        self.script["busy"] = 2
        self.assertEqual(len(bytes(store.open(segment).read(0, 10).array())), 10)
        self.script["shift"] = 1
        url = f"{self.location}/commitlog/{0:020d}"
        self.assertEqual(
            self.error(lambda: store.open(segment).read(0, 10)),
            f"{url}: asked bytes 0-9, answered bytes 1-10/1024 (10 Content-Length)",
        )
        self.script["busy"] = 9
        self.assertIn(f"{url} bytes 0-9: HTTP 503: busy (still busy after 8 retries)",
                      self.error(lambda: store.open(segment).read(0, 10)))
        self.script["listing"] = (200, b"x" * ((8 << 20) + 1))
        self.assertEqual(self.error(store.segments),
                         f"{self.location}/commitlog: an answer of {(8 << 20) + 1} bytes")
        self.script["listing"] = (404, b'{"error": "the commit log is not served here"}')
        self.assertEqual(self.error(store.segments),
                         f"{self.location}/commitlog: HTTP 404: the commit log is not served here")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))  # (not listening: refused)
            nobody = f"rmqha+http://127.0.0.1:{s.getsockname()[1]}"
            self.assertIn(f"{nobody}/commitlog: connection refused",
                          self.error(self.store(nobody).segments))
        self.assertIn("the tlsCert option is for rmqha+https://, not plain HTTP",
                      self.error(lambda: self.store(tlsCert=__file__)))


class _FakeContext:
    def __init__(self, master: str) -> None:
        self.master = master
        self.py_files: list[str] = []

    def setLogLevel(self, level: str) -> None:
        pass

    def addPyFile(self, path: str) -> None:
        self.py_files.append(path)


class _FakeSession:
    """
    Just enough of C{SparkSession} and its builder for L{spark_session}:
    records the settings and the files added, starts no JVM.
    """

    def __init__(self) -> None:
        self.settings: dict[str, str] = {}
        self.dataSource = self
        self.builder = self
        self.registered: list[object] = []

    def appName(self, name: str) -> "_FakeSession":
        return self

    def master(self, url: str) -> "_FakeSession":
        self.sparkContext = _FakeContext(url)
        return self

    def config(self, key: str, value: str) -> "_FakeSession":
        self.settings[key] = value
        return self

    def getOrCreate(self) -> "_FakeSession":
        return self

    def register(self, source: object) -> None:
        self.registered.append(source)


class SessionSettingsTests(SynchronousTestCase):
    """
    L{spark_session}'s settings for every master (no JVM started).
    """

    skip = why_no_spark()

    def session(self, master: str, **kwargs: object) -> _FakeSession:
        import pyspark.sql

        from rmqha.pipeline.source import spark_session

        fake = _FakeSession()
        self.patch(pyspark.sql, "SparkSession", fake)
        result = spark_session(master, **kwargs)  # type: ignore[arg-type]
        self.assertIs(result, fake)
        return fake

    def environ(self, **values: str) -> None:
        """
        Start from an environment without the PySpark variables (restored
        after the test).
        """
        import sys

        saved = {k: os.environ.get(k) for k in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}

        def restore() -> None:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

        self.addCleanup(restore)
        for k in saved:
            os.environ.pop(k, None)
        os.environ.update(values)
        self.executable = sys.executable

    def test_cluster_gets_this_python_and_rmqha(self) -> None:
        """
        A C{spark://} master gets this interpreter as the executors'
        Python (not C{python3} from PATH), the rmqha zip, the
        C{--py-files} (absolute) and the C{--conf} settings.
        """
        from rmqha.pipeline.source import package_zip

        self.environ()
        extra = os.path.abspath(self.mktemp() + ".py")
        with open(extra, "w") as f:
            f.write("")
        fake = self.session(
            "spark://127.0.0.1:7077", conf={"spark.executor.memory": "2g"},
            py_files=[os.path.relpath(extra)],
        )
        self.assertEqual(os.environ["PYSPARK_PYTHON"], self.executable)
        self.assertEqual(fake.settings["spark.pyspark.python"], self.executable)
        self.assertEqual(fake.settings["spark.executor.memory"], "2g")
        self.assertEqual(fake.sparkContext.py_files, [package_zip(), extra])

    def test_the_users_python_wins(self) -> None:
        """
        C{--conf spark.pyspark.python} wins over C{PYSPARK_PYTHON}, which
        wins over this interpreter; a local master gets no zip (its
        workers are this Python).
        """
        self.environ(PYSPARK_PYTHON="/opt/py/bin/python3")
        fake = self.session("local[1]")
        self.assertEqual(os.environ["PYSPARK_PYTHON"], "/opt/py/bin/python3")
        self.assertEqual(fake.sparkContext.py_files, [])
        fake = self.session("local[1]", conf={"spark.pyspark.python": "/usr/bin/python3"})
        self.assertEqual(os.environ["PYSPARK_PYTHON"], "/usr/bin/python3")

    def test_local_jvm_collector(self) -> None:
        """
        A local master's JVM gets the parallel collector, added to the
        user's own driver options; a user who names a collector keeps it;
        a cluster's JVMs are left as they are.
        """
        self.environ()
        option = "spark.driver.extraJavaOptions"
        self.assertEqual(self.session("local[2]").settings[option], "-XX:+UseParallelGC")
        fake = self.session("local[1]", conf={option: "-Dx=1"})
        self.assertEqual(fake.settings[option], "-Dx=1 -XX:+UseParallelGC")
        fake = self.session("local[1]", conf={option: "-XX:+UseG1GC -Dx=1"})
        self.assertEqual(fake.settings[option], "-XX:+UseG1GC -Dx=1")
        self.assertNotIn(option, self.session("spark://127.0.0.1:7077").settings)

    def test_quiet_driver(self) -> None:
        """
        C{quiet} (the jobs without C{--verbose}): a JVM this call starts
        gets the quiet log4j settings beside the user's options, unless
        they name a log4j configuration; Spark's progress bar only when
        asked; without C{quiet}, nothing of it.
        """
        from rmqha.pipeline import source

        self.environ()
        self.patch(source, "_jvm_started", lambda: False)
        option = "spark.driver.extraJavaOptions"
        quiet = f"-Dlog4j.configurationFile=file:{source._QUIET_LOG4J}"
        fake = self.session("spark://127.0.0.1:7077", quiet=True)
        self.assertEqual(fake.settings[option], quiet)
        self.assertEqual(fake.settings["spark.ui.showConsoleProgress"], "false")
        self.assertTrue(os.path.isfile(source._QUIET_LOG4J))
        fake = self.session("local[1]", quiet=True, conf={option: "-Dx=1"})
        self.assertEqual(fake.settings[option], f"-Dx=1 {quiet} -XX:+UseParallelGC")
        mine = "-Dlog4j.configurationFile=file:/etc/mine.properties"
        fake = self.session("spark://127.0.0.1:7077", quiet=True, conf={option: mine})
        self.assertEqual(fake.settings[option], mine)
        fake = self.session("spark://127.0.0.1:7077", console_progress=True)
        self.assertNotIn(option, fake.settings)
        self.assertEqual(fake.settings["spark.ui.showConsoleProgress"], "true")

    def test_jvm_noise_left_out(self) -> None:
        """
        The quiet driver's stderr copy leaves out the lines the JVM prints
        itself (not through log4j) and passes every other line on, whole.
        """
        from rmqha.pipeline.source import _copy_lines

        source_r, source_w = os.pipe()
        target_r, target_w = os.pipe()
        os.write(
            source_w,
            b"WARNING: Using incubator modules: jdk.incubator.vector\n"
            b"Traceback (most recent call last):\n"
            b"Warning: Java versions > Java 11 can only operate in restricted mode where no "
            b"off-heap operations are allowed!\n"
            b"java.lang.OutOfMemoryError: Java heap space\n",
        )
        os.close(source_w)
        _copy_lines(source_r, target_w)
        os.close(target_w)
        with os.fdopen(target_r, "rb") as f:
            self.assertEqual(
                f.read(),
                b"Traceback (most recent call last):\njava.lang.OutOfMemoryError: Java heap space\n",
            )

    def test_reader_jar_on_spark_jars(self) -> None:
        """
        The JVM span reader's jar goes on C{spark.jars} after the user's
        jars; without one (no javac here), nothing is added and one line
        on stderr says why local stores will be read more slowly.
        """
        import contextlib
        import io

        from rmqha.pipeline import _jar, source

        self.environ()
        self.patch(_jar, "ensure_jar", lambda: ("/x/rmqha-spark.jar", ""))
        fake = self.session("local[1]", conf={"spark.jars": "/y/a.jar"})
        self.assertEqual(fake.settings["spark.jars"], "/y/a.jar,/x/rmqha-spark.jar")
        self.patch(_jar, "ensure_jar", lambda: (None, "no javac/jar on PATH"))
        self.patch(source, "_jar_said", False)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            fake = self.session("local[1]")
            self.session("local[1]")
        self.assertNotIn("spark.jars", fake.settings)
        self.assertEqual(
            err.getvalue(),
            "rmqha pipeline: no JVM span reader (no javac/jar on PATH): local stores are "
            "read by the Python data source, several times slower under Spark\n",
        )

    def test_missing_py_file(self) -> None:
        """
        A C{--py-files} path that does not exist is one line naming it,
        before Spark starts.
        """
        self.environ()
        with self.assertRaises(ValueError) as raised:
            self.session("local[1]", py_files=["nowhere.zip"])
        self.assertEqual(str(raised.exception), "--py-files nowhere.zip: no such file")


# -- the JVM span reader -----------------------------------------------------


def raw_record(
    offset: int,
    body: bytes = b"payload",
    topic: bytes = b"orders",
    properties: bytes = b"",
    *,
    v2: bool = False,
    born: bytes = bytes([10, 0, 0, 1]),
    store: bytes = bytes([192, 168, 1, 2]),
    port: int = 10911,
    crc: int | None = None,
) -> bytes:
    """
    One message record at commit-log C{offset}, encoded by hand so that it
    can hold what the project's encoder refuses to write: the v2 magic,
    IPv6 hosts (C{born}/C{store} of 16 bytes), topics and properties that
    are not UTF-8, a wrong body CRC.
    """
    import struct
    import zlib

    from rmqha.store._record import MESSAGE_MAGIC_V1, MESSAGE_MAGIC_V2

    sysflag = (0x10 if len(born) == 16 else 0) | (0x20 if len(store) == 16 else 0)
    topic_length = struct.pack(">h" if v2 else ">b", len(topic))
    tail = (
        struct.pack(">iqi", 2, 77, len(body)) + body + topic_length + topic
        + struct.pack(">h", len(properties)) + properties
    )
    hosts = born + struct.pack(">iq", 4321, 1_700_000_000_123) + store + struct.pack(">i", port)
    total = 48 + len(hosts) + len(tail)
    head = struct.pack(
        ">iiiiiqqiq", total, MESSAGE_MAGIC_V2 if v2 else MESSAGE_MAGIC_V1,
        zlib.crc32(body) & 0x7FFFFFFF if crc is None else crc, 3, 5, 42, offset, sysflag,
        1_700_000_000_000,
    )
    return head + hosts + tail


#: Records that take every decoding path: (keyword arguments of raw_record).
HOSTILE = [
    {},
    {"v2": True, "topic": b"t" * 200, "body": b""},
    {"born": bytes(15) + b"\x01", "store": b"\x20\x01\x0d\xb8" + bytes(11) + b"\x07"},
    {"born": bytes(10) + b"\xff\xff\x01\x02\x03\x04", "port": -1},
    {"store": b"\x00\x01\x00\x00\x00\x00\x00\x01" + bytes(6) + b"\xab\xcd", "v2": True},
    {"topic": b"t\xff\xed\xa0\x80x\xf4\x90\x80\x80\xe1\x80y\xf0\x90\x80z\xe2\x82"},
    {"properties": b"TAGS\x01a\x02KEYS\x01k1\x01k2\x02TAGS\x01b\x02\x01x\x02k\x01\x02ab\x02"},
    {"properties": b"\xe9\x01\xff\xfe\x02\x80\x01v\x02\x81\x01w\x02caf\xc3\xa9\x01\xe2\x82\xac"},
    {"properties": b"KEYS\x01"},
    {"body": b"bad crc", "crc": 12345},
    {"body": b"", "crc": 99},
    {"body": bytes(range(256)) * 3, "topic": b"payments"},
]


def hostile_store(case: SynchronousTestCase, segment_size: int = 4096) -> str:
    """
    Three segments written byte by byte: HOSTILE's records in each (their
    topics made of their own), then a BLANK filler to the first segment's
    end, a torn record (its first 40 bytes, then zeros) in the second, and
    in the third a record whose properties end in a zero byte (a torn
    write: the last record, as a torn one is; with a whole record after
    it, it would be damage, which fails the read:
    L{JvmReaderTests.test_damage_before_valid_records_fails_loudly}).
    """
    import struct

    from rmqha.store._record import BLANK_MAGIC

    path = case.mktemp()
    directory = os.path.join(path, "commitlog")
    os.makedirs(directory)
    for index in range(3):
        base = index * segment_size
        data = b""
        for i, fields in enumerate(HOSTILE):
            fields = dict(fields)
            if "topic" not in fields and i % 3 == index:
                fields["topic"] = b"audit"
            data += raw_record(base + len(data), **fields)  # type: ignore[arg-type]
        if index == 0:
            data += struct.pack(">ii", segment_size - len(data), BLANK_MAGIC)
        elif index == 1:
            data += raw_record(base + len(data), b"torn" * 20)[:40]
        else:
            data += raw_record(base + len(data), properties=b"TAGS\x01x\x00")
        assert len(data) <= segment_size, len(data)
        with open(os.path.join(directory, f"{base:020d}"), "wb") as f:
            f.write(data.ljust(segment_size, b"\0"))
    return path


class JvmReaderTests(SynchronousTestCase):
    """
    L{read_store} on a local store: the JVM span reader, which must give
    exactly the Python reader's rows (L{read_span}, the code of the
    C{rocketmq-commitlog} source) for every option.
    """

    skip = why_no_spark()

    def setUp(self) -> None:
        from rmqha.pipeline._jar import ensure_jar
        from rmqha.pipeline.source import jvm_reader

        if shutil.which("javac") is None or shutil.which("jar") is None:
            raise unittest.SkipTest("no javac/jar: the JVM span reader cannot be built here")
        jar, why = ensure_jar()
        self.assertIsNotNone(jar, why)  # a JDK here, so a jar
        # The shared session was made with the jar: not having it here is
        # the silent fallback these tests exist to catch.
        self.assertTrue(jvm_reader(spark()))

    def test_session_jvm_collector(self) -> None:
        """
        The shared local session's JVM runs the parallel collector
        (L{spark_session}'s default for a local master), not the JVM's G1.
        """
        jvm = spark().sparkContext._jvm
        beans = jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
        names = {bean.getName() for bean in beans}
        self.assertIn("PS Scavenge", names)
        self.assertNotIn("G1 Young Generation", names)

    def jvm(self, path: str, columns: list[str] | None = None, **options: str) -> Any:
        from rmqha.pipeline.source import read_store

        df = read_store(spark(), path, columns, **options)
        plan = df._jdf.queryExecution().executedPlan().toString()
        self.assertIn("rmqha commit log", plan)  # the JVM reader, not the fallback
        return as_millis(df)

    def python(
        self,
        path: str,
        columns: list[str] | None = None,
        split: int = 1 << 30,
        start: int | None = None,
        end: int | None = None,
        **options: Any,
    ) -> list[dict[str, object]]:
        from rmqha.pipeline.scan import plan, read_span

        return rows_of(
            batch.to_pylist()
            for span in plan(path, split, start, end)
            for batch in read_span(span, columns=columns, **options)
        )

    def test_rows_equal_the_python_readers(self) -> None:
        """
        A hostile store (v2 records, IPv6 hosts, invalid UTF-8 topics and
        properties, repeated and malformed properties, bad and empty-body
        CRCs, a BLANK filler, a torn record, a torn write's trailing zero),
        read whole and in many partitions of exact spans, with bodies off,
        a topic filter, an offset range, and a few columns: the JVM
        reader's rows are the Python reader's, value for value, in order.
        """
        path = hostile_store(self)
        whole = self.python(path)
        self.assertEqual(len(whole), 3 * len(HOSTILE))
        self.assertIn(False, [r["crc_ok"] for r in whole])
        self.assertIn("\ufffd", "".join(str(r["topic"]) for r in whole))
        self.assertEqual(collected(self.jvm(path)), whole)
        df = self.jvm(path, splitBytes="700")
        self.assertGreater(df.rdd.getNumPartitions(), 6)
        self.assertEqual(collected(df), self.python(path, split=700))
        self.assertEqual(
            collected(self.jvm(path, bodies="false", topics="audit,payments")),
            self.python(path, bodies=False, topics=["audit", "payments"]),
        )
        start, end = int(whole[3]["offset"]) + 5, int(whole[-5]["offset"])  # type: ignore[call-overload]
        self.assertEqual(
            collected(self.jvm(path, startOffset=str(start), endOffset=str(end), splitBytes="1000")),
            self.python(path, split=1000, start=start, end=end),
        )
        for columns in (["crc_ok", "topic", "properties", "body_size"],
                        ["store_host", "keys", "born_host", "tags", "offset"], ["body"]):
            df = self.jvm(path, columns)
            self.assertEqual(df.columns, columns)
            self.assertEqual(collected(df), self.python(path, columns=columns))

    def test_windows(self) -> None:
        """
        Spans mapped in windows smaller than their records (what a
        segment larger than the 1 GiB window gets, in miniature): records
        across a window's edge are read whole, batches end there, and
        the rows are the same.
        """
        path = hostile_store(self)
        for split, window in [(1 << 30, 97), (700, 1000)]:
            # (_window: the tests' hidden option, the largest window.)
            df = (spark().read.format("rmqha").option("splitBytes", str(split))
                  .option("_window", str(window)).load(os.path.abspath(path)))
            self.assertEqual(
                collected(as_millis(df)), self.python(path, split=split), (split, window)
            )

    def test_random_store_in_many_partitions(self) -> None:
        """
        The random store of the source's own tests, cut into sub-ranges at
        record boundaries: every record once, equal to the commit log's own
        decoding.
        """
        path = random_store(self, 400, 64 * 1024, seed=11)
        df = self.jvm(path, splitBytes="10k")
        self.assertGreater(df.rdd.getNumPartitions(), 8)
        self.assertEqual(df_rows(df), store_rows(path))

    def test_batches(self) -> None:
        """
        A partition of more records than a batch holds (4,096): every
        column, the properties map's included, is right in every batch.
        """
        path = random_store(self, 5000, 4 << 20, seed=17)
        df = self.jvm(path)
        self.assertEqual(df.rdd.getNumPartitions(), 1)
        self.assertEqual(df_rows(df), store_rows(path))

    def test_forged_record_start_fails_loudly(self) -> None:
        """
        A record that runs past its span's end (the cut was not a record
        start) fails the query, naming the segment and the offsets, as the
        Python reader does (or the span after the cut fails first, as
        damage).
        """
        store, start = forged_record_store(self)
        with self.assertRaises(Exception) as raised:
            self.jvm(store, splitBytes=str(start + 100)).count()
        # (The span after the false cut starts with no record, and real
        # ones follow: its task fails too, as damage; the first to fail
        # names the job's error.)
        message = str(raised.exception)
        self.assertTrue(
            "runs past the partition boundary" in message
            or "; valid records follow at offset " in message,
            message[:500],
        )
        self.assertIn(segment_path(store, 0), message)

    def test_damage_before_valid_records_fails_loudly(self) -> None:
        """
        A garbled header with whole records after it (damage, not a torn
        tail) fails the query with the Python reader's message: the
        segment, the bad record, where valid records follow.  A torn tail
        still just ends the rows.
        """
        from tests._helpers import zero_from

        path = random_store(self, 40, 1 << 20, seed=3)
        rows = store_rows(path)
        last = int(rows[-1]["offset"])  # type: ignore[call-overload]
        zero_from(segment_path(path, 0), last + 30)
        self.assertEqual(df_rows(self.jvm(path)), rows[:-1])
        bad, after = int(rows[10]["offset"]), int(rows[11]["offset"])  # type: ignore[call-overload]
        xor_byte(segment_path(path, 0), bad + 5)
        with self.assertRaises(Exception) as raised:
            self.jvm(path).count()
        from rmqha.pipeline.jobs import error_line

        line = error_line(raised.exception)
        damaged = os.path.abspath(segment_path(path, 0))
        self.assertTrue(line.startswith(f"{damaged}: bad record at offset {bad}: "), line)
        self.assertIn(f"; valid records follow at offset {after}: the store is damaged", line)

    def test_unreadable_segment(self) -> None:
        """
        A segment gone between planning and reading: the job's error line
        (L{error_line}) names the file, the executor's host and why, as the
        Python reader's does.
        """
        path = random_store(self, 50, 16 * 1024, seed=5)
        rdd = self.jvm(path).rdd
        rdd.getNumPartitions()  # planned: the segments listed
        gone = os.path.abspath(segment_path(path, 0))
        os.remove(gone)
        with self.assertRaises(Exception) as raised:
            rdd.count()
        from rmqha.pipeline.jobs import error_line

        self.assertEqual(
            error_line(raised.exception),
            f"cannot read {gone} on host {socket.gethostname()}: No such file or directory",
        )

    def test_live_broker_on_the_jvm_reader(self) -> None:
        """
        A live broker's store is read by the JVM reader too (its HTTP
        store): nothing is planned in Python.  A C{file:} URI is a local
        store: the JVM reader's.
        """
        from rmqha.pipeline import source

        path = random_store(self, 5, 64 * 1024, seed=3)
        df = source.read_store(spark(), "file://" + os.path.abspath(path))
        self.assertIn("rmqha commit log", df._jdf.queryExecution().executedPlan().toString())
        self.assertEqual(df.count(), 5)

        def planned(*args: object, **kwargs: object) -> None:
            self.fail("planned for the JVM reader")

        self.patch(source, "plan", planned)
        df = source.read_store(spark(), "rmqha+http://127.0.0.1:9")
        self.assertIn("rmqha rmqha+http://127.0.0.1:9", df._jdf.queryExecution().analyzed().toString())


class JarTests(SynchronousTestCase):
    """
    L{rmqha.pipeline._jar.ensure_jar}: built once, rebuilt when a source
    changes, or a reason.
    """

    skip = why_no_spark()

    def setUp(self) -> None:
        from rmqha.pipeline import _jar

        if shutil.which("javac") is None or shutil.which("jar") is None:
            raise unittest.SkipTest("no javac/jar: the jar cannot be built here")
        here = os.path.abspath(self.mktemp())
        self.built = _jar.ensure_jar()[0]
        shutil.copytree(_jar.SOURCES, os.path.join(here, "src"))
        shutil.copytree(_jar.RESOURCES, os.path.join(here, "resources"))
        self.patch(_jar, "_HERE", here)
        self.patch(_jar, "SOURCES", os.path.join(here, "src"))
        self.patch(_jar, "RESOURCES", os.path.join(here, "resources"))
        self.patch(_jar, "JAR", os.path.join(here, "rmqha-spark.jar"))
        self.jar = _jar

    def test_built_once_and_again_when_sources_change(self) -> None:
        """
        A jar built from the sources as they are (the shared session's,
        which the first call built: every JVM test uses it) holds the
        reader's classes and is used as it is; a changed source builds it
        again (one compile here, not two); no temporary directory is left.
        """
        import zipfile

        shutil.copy(self.built, self.jar.JAR)
        jar, why = self.jar.ensure_jar()
        self.assertEqual((jar, why), (self.jar.JAR, ""))
        with zipfile.ZipFile(self.jar.JAR) as z:
            self.assertIn("rmqha/spark/CommitLogSource.class", z.namelist())
            service = "META-INF/services/org.apache.spark.sql.sources.DataSourceRegister"
            self.assertEqual(z.read(service).decode().split(), ["rmqha.spark.CommitLogSource"])
        built = os.stat(self.jar.JAR).st_mtime_ns
        self.assertEqual(self.jar.ensure_jar(), (self.jar.JAR, ""))
        self.assertEqual(os.stat(self.jar.JAR).st_mtime_ns, built)
        source = os.path.join(self.jar.SOURCES, "rmqha", "spark", "CommitLogSource.java")
        with open(source, "a") as f:
            f.write("// changed\n")
        self.assertEqual(self.jar.ensure_jar(), (self.jar.JAR, ""))
        self.assertNotEqual(os.stat(self.jar.JAR).st_mtime_ns, built)
        # A resource is covered by the digest too: a changed one rebuilds.
        self.assertEqual(self.jar._built_digest(self.jar.JAR), self.jar.sources_digest())
        with open(os.path.join(self.jar.RESOURCES, "extra.txt"), "w") as f:
            f.write("x\n")
        self.assertNotEqual(self.jar._built_digest(self.jar.JAR), self.jar.sources_digest())
        self.assertEqual(
            sorted(os.listdir(self.jar._HERE)), ["resources", "rmqha-spark.jar", "src"]
        )

    def test_jar_command(self) -> None:
        """
        C{rmqha pipeline jar} prints the jar's path; or says in one line
        why there is none (exit status 2).
        """
        import io

        from rmqha.cli import main

        # (The session's jar, built from the same sources: not built again.)
        shutil.copy(self.built, self.jar.JAR)
        out, err = io.StringIO(), io.StringIO()
        self.assertEqual(main(["pipeline", "jar"], stdout=out, stderr=err), 0)
        self.assertEqual((out.getvalue(), err.getvalue()), (self.jar.JAR + "\n", ""))
        self.assertTrue(os.path.isfile(self.jar.JAR))
        os.remove(self.jar.JAR)
        self.patch(shutil, "which", lambda name: None)
        out, err = io.StringIO(), io.StringIO()
        self.assertEqual(main(["pipeline", "jar"], stdout=out, stderr=err), 2)
        self.assertEqual(
            (out.getvalue(), err.getvalue()),
            ("", "rmqha: error: no jar: no javac/jar on PATH (a JDK 17 builds it)\n"),
        )

    def test_reasons(self) -> None:
        """
        No javac, or a source that does not compile: no jar, and why.
        """
        with open(os.path.join(self.jar.SOURCES, "rmqha", "spark", "Broken.java"), "w") as f:
            f.write("class Broken {")
        jar, why = self.jar.ensure_jar()
        self.assertIsNone(jar)
        self.assertTrue(why.startswith("javac failed: ") and "Broken.java" in why, why)
        self.patch(shutil, "which", lambda name: None)
        self.assertEqual(self.jar.ensure_jar(), (None, "no javac/jar on PATH (a JDK 17 builds it)"))
        self.assertFalse(os.path.exists(self.jar.JAR))
        self.assertEqual(sorted(os.listdir(self.jar._HERE)), ["resources", "src"])


_TIMESTAMPS = ("born_timestamp", "store_timestamp")


def as_millis(df: Any) -> Any:
    """
    C{df} with its timestamp columns as epoch milliseconds (long), as the
    commit log stores them: the JVM source's rows (timestamps) compare
    with the Python reader's and the store's whichever type those say.
    """
    from pyspark.sql import functions as F

    for name in _TIMESTAMPS:
        if name in df.columns and dict(df.dtypes)[name] == "timestamp":
            df = df.withColumn(name, F.unix_millis(name))
    return df


def _millis(value: Any) -> Any:
    import calendar
    import datetime

    if isinstance(value, datetime.datetime):  # Arrow's timestamp("ms"): UTC
        utc = value if value.tzinfo is None else value.astimezone(datetime.timezone.utc)
        return calendar.timegm(utc.timetuple()) * 1000 + utc.microsecond // 1000
    return value


def rows_of(rows: Any) -> list[dict[str, object]]:
    """
    Rows (dicts, from Arrow or Spark) in one comparable form (timestamps
    as epoch ms).
    """
    out = []
    for batch in rows:
        for row in batch:
            for name in _TIMESTAMPS:
                if name in row:
                    row[name] = _millis(row[name])
            if "properties" in row:
                properties = row["properties"]
                items = properties.items() if isinstance(properties, dict) else properties
                row["properties"] = sorted(items)
            if row.get("body") is not None:
                row["body"] = bytes(row["body"])
            out.append(row)
    return out


def collected(df: Any) -> list[dict[str, object]]:
    """
    A DataFrame's rows in the order Spark gives them (partitions in
    order: offset order for one store), in L{rows_of}'s form.
    """
    return rows_of([[row.asDict() for row in df.collect()]])


def timed_store(
    case: SynchronousTestCase, times: list[float], segment_size: int = 4096, seed: int = 7
) -> str:
    """
    A store of one message per entry of C{times}, each stored at that
    time (seconds since the epoch): a broker whose clock C{times} says.
    """
    import random

    rng = random.Random(seed)
    path = case.mktemp()
    now = [0.0]
    log = CommitLog.open(path, segment_size=segment_size, clock=lambda: now[0])
    for i, t in enumerate(times):
        now[0] = t
        log.put(make_message(
            os.urandom(rng.randrange(0, 300)),
            topic=rng.choice(["orders", "payments", "audit"]),
            queue_id=rng.randrange(4),
            properties={"KEYS": f"k{i}"},
        ))
    log.close()
    return path


class RmqhaSourceTests(SynchronousTestCase):
    """
    C{spark.read.format("rmqha")}: the JVM data source, planned on the
    driver's JVM; its options, errors, SQL and pushed filters.
    """

    skip = why_no_spark()

    def setUp(self) -> None:
        from rmqha.pipeline.source import jvm_reader

        if shutil.which("javac") is None or shutil.which("jar") is None:
            raise unittest.SkipTest("no javac/jar: the JVM data source cannot be built here")
        self.assertTrue(jvm_reader(spark()))

    def read(self, path: str, **options: str) -> Any:
        reader = spark().read.format("rmqha")
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load(path)

    def error(self, query: Any) -> str:
        from rmqha.pipeline.jobs import error_line

        with self.assertRaises(Exception) as raised:
            query()
        return error_line(raised.exception)

    def test_rows_equal_the_python_sources(self) -> None:
        """
        The same store read by C{format("rmqha")} and by the Python source
        C{rocketmq-commitlog}, with the same options (large segments cut,
        small ones packed, an offset range, topics, bodies off): the same
        rows, in the same order, over as many partitions.
        """
        path = random_store(self, 150, 16 * 1024, seed=21)
        for options in [
            {"splitBytes": "40k"},
            {"startOffset": "7000", "endOffset": "60000", "splitBytes": "9k",
             "topics": "orders,audit-log", "bodies": "false"},
        ]:
            ours = self.read(path, **options)
            python = spark().read.format("rocketmq-commitlog")
            for key, value in options.items():
                python = python.option(key, value)
            theirs = python.load(path)
            self.assertEqual(ours.rdd.getNumPartitions(), theirs.rdd.getNumPartitions(), options)
            self.assertEqual(collected(as_millis(ours)), collected(as_millis(theirs)), options)
        # A file: URI and a relative path are the same store.
        self.assertEqual(self.read("file://" + os.path.abspath(path)).count(), 150)
        self.assertEqual(
            dict(self.read(path).dtypes)["store_timestamp"], "timestamp"
        )

    def test_hadoop_filesystem(self) -> None:
        """
        A store read through Hadoop's FileSystem API into heap buffers (as
        C{hdfs:} or C{s3a:} would be; here the local files through
        Hadoop's C{file:} FileSystem, the tests' hidden C{_viaHadoop}), in
        windows smaller than its records: the Python reader's rows; a
        missing segment is found by that listing too.
        """
        path = hostile_store(self)
        for split, window in [(1 << 30, 97), (700, 1000)]:
            df = self.read(path, splitBytes=str(split), _window=str(window), _viaHadoop="true")
            self.assertIn("rmqha commit log file:/", df._jdf.queryExecution().executedPlan().toString())
            self.assertEqual(
                collected(as_millis(df)),
                JvmReaderTests.python(self, path, split=split),  # type: ignore[arg-type]
                (split, window),
            )
        os.remove(segment_path(path, 4096))
        self.assertIn(
            ": missing segment: no segment file holds offsets 4096..8192",
            self.error(lambda: self.read(path, _viaHadoop="true").count()),
        )

    def test_timestamps(self) -> None:
        """
        C{born_timestamp} and C{store_timestamp} are Spark timestamps: the
        stored epoch milliseconds, exactly.
        """
        path = timed_store(self, [1700000000.123, 1700000001.5])
        rows = self.read(path).selectExpr(
            "unix_millis(store_timestamp) AS s", "unix_millis(born_timestamp) AS b"
        ).collect()
        self.assertEqual([r.s for r in rows], [1700000000123, 1700000001500])
        self.assertEqual([r.b for r in rows], [r["born_timestamp"] for r in store_rows(path)])

    def test_pushed_topic_as_the_row_shows_it(self) -> None:
        """
        A pushed topic filter matches a record by its topic as the row
        shows it: a stored topic of invalid UTF-8 (shown with U+FFFD) is
        matched by its shown form, and by no valid topic's bytes.
        """
        from pyspark.sql import functions as F

        path = os.path.abspath(hostile_store(self))
        df = self.read(path)
        shown = sorted({r.topic for r in df.select("topic").collect()})
        weird = [t for t in shown if "\ufffd" in t]
        plain = [t for t in shown if "\ufffd" not in t]
        self.assertTrue(weird and plain, shown)
        every = [r.topic for r in df.select("topic").collect()]
        for topic in (weird[0], plain[0]):
            pushed = df.where(F.col("topic") == topic)
            self.assertIn("PushedFilters: [topic = ", pushed._jdf.queryExecution().executedPlan().toString())
            self.assertEqual(pushed.count(), every.count(topic), topic)

    def test_garbage_timestamps_are_null(self) -> None:
        """
        A born time whose microseconds do not fit 64 bits (garbage) is a
        null timestamp, as the Python reader gives it (not a wrapped-around
        instant); the extremes that fit are kept; a pushed store-time
        filter reads such records without failing.
        """
        from tests._helpers import make_message

        low, high = -(2**63) // 1000 + 1, (2**63 - 1) // 1000
        path = self.mktemp()
        log = CommitLog.open(path, segment_size=1 << 20)
        for born in (1_700_000_000_123, -(2**63), 2**62, low - 1, low, high, high + 1):
            log.put(make_message(born_timestamp=born))
        log.close()
        rows = self.read(path).selectExpr("unix_millis(born_timestamp) AS b").collect()
        self.assertEqual(
            [r.b for r in rows], [1_700_000_000_123, None, None, None, low, high, None]
        )
        self.assertEqual(
            self.read(path).where("store_timestamp > timestamp_millis(0)").count(), 7
        )

    def test_sql(self) -> None:
        """
        C{CREATE TABLE ... USING rmqha} with C{LOCATION} or C{OPTIONS
        (path ...)}, options included, then C{SELECT}.
        """
        path = os.path.abspath(random_store(self, 40, 16 * 1024, seed=22))
        spark().sql(f"CREATE TABLE rmqha_sql_a USING rmqha LOCATION '{path}'")
        spark().sql(
            f"CREATE TABLE rmqha_sql_b USING rmqha OPTIONS (path '{path}', topics 'orders')"
        )
        try:
            self.assertEqual(spark().sql("SELECT count(*) FROM rmqha_sql_a").first()[0], 40)
            orders = sum(1 for r in store_rows(path) if r["topic"] == "orders")
            self.assertEqual(
                spark().sql("SELECT count(*) FROM rmqha_sql_b").first()[0], orders
            )
        finally:
            spark().sql("DROP TABLE IF EXISTS rmqha_sql_a")
            spark().sql("DROP TABLE IF EXISTS rmqha_sql_b")

    def test_option_errors(self) -> None:
        """
        A bad option is one line naming it and its value, before anything
        is read.
        """
        path = random_store(self, 3, 16 * 1024, seed=23)
        for options, line in [
            ({"splitBytes": "12q"},
             "option splitBytes '12q' is not a size (examples: 4096, 64k, 1g, 1GiB)"),
            ({"splitBytes": "0"}, "option splitBytes='0' must be positive"),
            ({"bodies": "yes"}, "option bodies='yes' is not true or false"),
            ({"topics": " , "}, "option topics=' , ' names no topic"),
            ({"startOffset": "-5"}, "option startOffset='-5' is not a non-negative offset"),
            ({"startOffset": "9", "endOffset": "3"}, "option endOffset 3 is before startOffset 9"),
            ({"timeTolerance": "soon"},
             "option timeTolerance 'soon' is not a duration (examples: 500ms, 30s, 5m, 1h, off)"),
        ]:
            self.assertEqual(self.error(lambda: self.read(path, **options).count()), line)
        self.assertEqual(
            self.error(lambda: spark().read.format("rmqha").load().count()),
            "give the store: .load(STORE_DIR or URI)",
        )

    def test_store_errors(self) -> None:
        """
        Not a store, a scheme no Hadoop FileSystem reads, a segment missing
        between two others, a directory where a segment file belongs: one
        line each, naming the path.
        """
        missing = os.path.abspath(self.mktemp())
        self.assertEqual(
            self.error(lambda: self.read(missing).count()), f"{missing}: no such directory"
        )
        os.mkdir(missing)
        self.assertEqual(
            self.error(lambda: self.read(missing).count()),
            f"{missing}: no commitlog directory and no segment files",
        )
        self.assertEqual(
            self.error(lambda: self.read("nosuchfs://bucket/store").count()),
            "nosuchfs://bucket/store: no Hadoop FileSystem for scheme 'nosuchfs' on Spark's "
            "classpath (add its jars with --jars or spark.jars, e.g. hadoop-aws for s3a:)",
        )
        path = os.path.abspath(random_store(self, 60, 4096, seed=24))
        middle = segment_path(path, 4096)
        os.rename(middle, middle + ".moved")
        directory = os.path.dirname(middle)
        self.assertEqual(
            self.error(lambda: self.read(path).count()),
            f"{directory}: missing segment: no segment file holds offsets 4096..8192 (between "
            f"{os.path.basename(segment_path(path, 0))} and "
            f"{os.path.basename(segment_path(path, 8192))}; segments are 4096 bytes): "
            "the store is incomplete",
        )
        os.mkdir(middle)
        self.assertEqual(
            self.error(lambda: self.read(path).count()),
            f"{middle}: a directory, not a segment file",
        )
        os.rmdir(middle)
        os.rename(middle + ".moved", middle)
        # A file named as if segments were 2048 bytes, among 4096-byte ones.
        shutil.copyfile(segment_path(path, 0), segment_path(path, 2048))
        self.assertEqual(
            self.error(lambda: self.read(path).count()),
            f"{directory}: segment files overlap: {os.path.basename(segment_path(path, 2048))} "
            f"starts before {os.path.basename(segment_path(path, 0))}'s 4096 bytes end "
            "(at 4096): not one commit log",
        )

    def test_pushed_filters_are_shown_and_prune_spans(self) -> None:
        """
        Filters on topic, queue_id, offset and store_timestamp are pushed:
        C{explain()} names them and how many spans are read; an offset
        range reads only the spans that hold it.
        """
        path = random_store(self, 200, 4096, seed=25)
        df = self.read(path).filter(
            "topic = 'orders' AND queue_id IN (1, 2) AND offset BETWEEN 9000 AND 20000"
            " AND store_timestamp > timestamp'2001-01-01 00:00:00'"
        )
        plan = df._jdf.queryExecution().executedPlan().toString()
        self.assertIn("PushedFilters: [topic = 'orders', queue_id IN (1, 2), offset >= 9000, "
                      "offset <= 20000, store_timestamp > ", plan)
        # The offset range is planned alone: three 4 KiB segments (8192..20480)
        # hold 9000..20000.
        self.assertIn("offsets planned: [9000, 20001), spans read: 3 of 3", plan)
        other = self.read(path).filter("offset IN (5000, 30000) OR offset = 40000")  # (not pushed)
        self.assertNotIn("offsets planned", other._jdf.queryExecution().executedPlan().toString())
        some = [int(r["offset"]) for r in store_rows(path)][10::60]  # type: ignore[call-overload]
        other = self.read(path).filter(f"offset IN ({', '.join(map(str, some))})")
        self.assertIn(
            f"offsets planned: [{some[0]}, {some[-1] + 1})",
            other._jdf.queryExecution().executedPlan().toString(),
        )
        self.assertEqual([r["offset"] for r in df_rows(other)], some)
        expected = [
            r for r in store_rows(path)
            if r["topic"] == "orders" and r["queue_id"] in (1, 2)
            and 9000 <= r["offset"] <= 20000  # type: ignore[operator]
        ]
        self.assertEqual(df_rows(df), expected)

    def test_random_filters_equal_unpushed(self) -> None:
        """
        Random conjunctions of the pushed filters (and ones not pushed)
        give exactly the rows of the same conditions applied to all the
        rows, in Python.
        """
        import random

        rng = random.Random(26)
        base = 1700000000.0
        times = [base + i * 0.5 for i in range(240)]
        path = timed_store(self, times, 4096)
        everything = store_rows(path)
        ms = [int(r["store_timestamp"]) for r in everything]  # type: ignore[call-overload]
        offsets = [int(r["offset"]) for r in everything]  # type: ignore[call-overload]

        def when(t: int) -> str:
            return f"timestamp_millis({t})"

        from functools import reduce

        from pyspark.sql import functions as F

        queries, wanted = [], []
        for number in range(16):
            conditions: list[tuple[str, Any]] = []
            for _ in range(rng.randrange(1, 4)):
                kind = rng.choice(["topic", "queue", "offset", "time", "between", "size"])
                if kind == "topic":
                    names = rng.sample(["orders", "payments", "audit", "none"], rng.randrange(1, 3))
                    conditions.append((
                        "topic IN (" + ", ".join(f"'{n}'" for n in names) + ")",
                        lambda r, names=names: r["topic"] in names,
                    ))
                elif kind == "queue":
                    q = rng.randrange(4)
                    conditions.append((f"queue_id = {q}", lambda r, q=q: r["queue_id"] == q))
                elif kind in ("offset", "time"):
                    values = offsets if kind == "offset" else ms
                    v = rng.choice(values) + rng.choice([-1, 0, 1])
                    op = rng.choice(["<", "<=", ">", ">=", "="])
                    column = "offset" if kind == "offset" else "store_timestamp"
                    literal = str(v) if kind == "offset" else when(v)
                    test = {"<": int.__lt__, "<=": int.__le__, ">": int.__gt__,
                            ">=": int.__ge__, "=": int.__eq__}[op]
                    conditions.append((
                        f"{column} {op} {literal}",
                        lambda r, c=column, v=v, test=test: test(int(r[c]), v),
                    ))
                elif kind == "between":
                    a, b = sorted(rng.sample(ms, 2))
                    conditions.append((
                        f"store_timestamp BETWEEN {when(a)} AND {when(b)}",
                        lambda r, a=a, b=b: a <= int(r["store_timestamp"]) <= b,
                    ))
                else:  # not pushed
                    n = rng.randrange(100, 300)
                    conditions.append((f"size > {n}", lambda r, n=n: int(r["size"]) > n))
            where = " AND ".join(c for c, _ in conditions)
            df = self.read(path, splitBytes="8k", timeTolerance="100ms").filter(where)
            queries.append(df.select(F.lit(number).alias("query"), "offset"))
            wanted.append((where, [
                r["offset"] for r in everything if all(test(r) for _, test in conditions)
            ]))
        # One Spark job for all of them (each its own scan, its own filters).
        union = reduce(lambda a, b: a.unionAll(b), queries)
        self.assertIn("PushedFilters: [", union._jdf.queryExecution().executedPlan().toString())
        got: dict[int, list[int]] = {i: [] for i in range(len(queries))}
        for row in union.collect():
            got[row.query].append(row.offset)
        for number, (where, offsets) in enumerate(wanted):
            self.assertEqual(sorted(got[number]), offsets, where)

    def test_store_time_going_back(self) -> None:
        """
        Store times that go back (a failover to a slave whose clock is
        behind): by less than timeTolerance, spans are pruned and no row is
        lost; by more, seen at a span's first record, nothing is pruned by
        time (the plan says so) and no row is lost; with timeTolerance off,
        nothing is pruned by time.
        """
        base = 1700000000.0
        first = [base + 30 * i for i in range(120)]  # an hour
        # The second broker's clock: 30 minutes behind, then on (a segment
        # holds about 15 records: the jump shows at a span's first record).
        behind = [base + 1800 + 30 * i for i in range(120)]
        path = timed_store(self, first + behind, 4096)
        everything = store_rows(path)
        since = int((base + 3000) * 1000)
        expected = [r for r in everything if int(r["store_timestamp"]) >= since]  # type: ignore[call-overload]
        self.assertEqual(len(expected), 20 + 80)  # both brokers' records

        def spans_read(df: Any) -> tuple[int, int]:
            plan = df._jdf.queryExecution().executedPlan().toString()
            read, of = re.findall(r"spans read: (\d+) of (\d+)", plan)[0]
            return int(read), int(of)

        # (The first broker's last records are at 3000..3570 s, in the
        # span whose next span starts at about 1800..2250 s: pruning that
        # span by "the next span's first time + 5 minutes" would lose them.)
        later = int((base + 5000) * 1000)
        for tolerance, note, pruned, after in [
            ("5m", "store time goes back", False, since),  # the jump is seen
            ("1h", "spans read: ", True, later),  # within the tolerance: pruned
            ("off", "timeTolerance=off", False, since),
        ]:
            df = self.read(path, timeTolerance=tolerance).filter(
                f"store_timestamp >= timestamp_millis({after})"
            )
            self.assertEqual(
                df_rows(df),
                [r for r in everything if int(r["store_timestamp"]) >= after],  # type: ignore[call-overload]
                tolerance,
            )
            plan = df._jdf.queryExecution().executedPlan().toString()
            self.assertIn(note, plan)
            read, of = spans_read(df)
            self.assertEqual(read < of, pruned, (tolerance, read, of))
        plan = self.read(path, timeTolerance="5m").filter(
            f"store_timestamp >= timestamp_millis({since})"
        )._jdf.queryExecution().executedPlan().toString()
        self.assertIn(", more than timeTolerance (300000 ms): no span pruned by store time", plan)
        # A small jump back (30 s, within 5 m): pruned, nothing lost.
        path = timed_store(self, first + [base + 3570 + 30 * i for i in range(120)], 4096)
        since = int((base + 3000) * 1000)
        df = self.read(path, timeTolerance="5m").filter(
            f"store_timestamp >= timestamp_millis({since})"
        )
        read, of = spans_read(df)
        self.assertLess(read, of)
        self.assertEqual(
            df_rows(df),
            [r for r in store_rows(path) if int(r["store_timestamp"]) >= since],  # type: ignore[call-overload]
        )
