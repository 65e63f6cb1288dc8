"""
The C{rocketmq-commitlog} data source and the pipeline jobs on a local
Spark (one session shared by the run: L{tests._spark}).  Marked C{spark}:
C{pytest -m spark} runs them alone.
"""

from __future__ import annotations

import datetime
import json
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
from tests.test_pipeline import forged_record_store, random_store, store_rows

pytestmark = pytest.mark.spark


def df_rows(df: object) -> list[dict[str, object]]:
    rows = []
    for row in df.orderBy("offset").collect():  # type: ignore[attr-defined]
        d = row.asDict()
        d["properties"] = sorted((d["properties"] or {}).items())
        d["body"] = None if d["body"] is None else bytes(d["body"])
        for name in ("born_timestamp", "store_timestamp"):
            # (PySpark gives a timestamp as a naive datetime in local time.)
            if isinstance(d.get(name), datetime.datetime):
                d[name] = d[name].astimezone(datetime.timezone.utc)
        rows.append(d)
    return rows


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

        def vanish(store: Any) -> Any:
            layout = planned(store)
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
        rows = store_rows(path)
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
            for r in store_rows(path):
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

        def vanish(store: Any) -> Any:
            layout = planned(store)
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
        self.assertIn("rocketmq-commitlog spans", plan)  # the JVM reader, not the fallback
        return df

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
        from rmqha.pipeline._jar import READER_CLASS
        from rmqha.pipeline.scan import plan
        from rmqha.pipeline.source import LocalStore, _spans_option, pack

        path = hostile_store(self)
        store = LocalStore(path)
        for split, window in [(1 << 30, 97), (700, 1000)]:
            spans = _spans_option(store, pack(plan(store, split), split), True, None)
            spans["window"] = window
            df = spark().read.format(READER_CLASS).option("spans", json.dumps(spans)).load()
            self.assertEqual(collected(df), self.python(path, split=split), (split, window))

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
        df = self.jvm(path)
        gone = os.path.abspath(segment_path(path, 0))
        os.remove(gone)
        with self.assertRaises(Exception) as raised:
            df.count()
        from rmqha.pipeline.jobs import error_line

        self.assertEqual(
            error_line(raised.exception),
            f"cannot read {gone} on host {socket.gethostname()}: No such file or directory",
        )

    def test_remote_store_keeps_the_python_source(self) -> None:
        """
        A store the executors cannot open as files (a live broker's) is
        read by the Python source: nothing is planned here for the JVM
        reader.  A C{file:} URI is a local store: the JVM reader's.
        """
        from rmqha.pipeline import source

        path = random_store(self, 5, 64 * 1024, seed=3)
        df = source.read_store(spark(), "file://" + os.path.abspath(path))
        self.assertIn("rocketmq-commitlog spans", df._jdf.queryExecution().executedPlan().toString())
        self.assertEqual(df.count(), 5)

        def planned(*args: object, **kwargs: object) -> None:
            self.fail("planned for the JVM reader")

        self.patch(source, "plan", planned)
        df = source.read_store(spark(), "rmqha+http://127.0.0.1:9")
        self.assertNotIn("rocketmq-commitlog spans", df._jdf.queryExecution().logical().toString())


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
        shutil.copytree(_jar.SOURCES, os.path.join(here, "src"))
        self.patch(_jar, "_HERE", here)
        self.patch(_jar, "SOURCES", os.path.join(here, "src"))
        self.patch(_jar, "JAR", os.path.join(here, "rmqha-spark.jar"))
        self.jar = _jar

    def test_built_once_and_again_when_sources_change(self) -> None:
        """
        The first call builds the jar (holding the reader's classes); the
        next uses it as it is; a changed source builds it again; no
        temporary directory is left.
        """
        import zipfile

        jar, why = self.jar.ensure_jar()
        self.assertEqual((jar, why), (self.jar.JAR, ""))
        with zipfile.ZipFile(self.jar.JAR) as z:
            self.assertIn("rmqha/spark/CommitLogSpans.class", z.namelist())
        built = os.stat(self.jar.JAR).st_mtime_ns
        self.assertEqual(self.jar.ensure_jar(), (self.jar.JAR, ""))
        self.assertEqual(os.stat(self.jar.JAR).st_mtime_ns, built)
        source = os.path.join(self.jar.SOURCES, "rmqha", "spark", "CommitLogSpans.java")
        with open(source, "a") as f:
            f.write("// changed\n")
        self.assertEqual(self.jar.ensure_jar(), (self.jar.JAR, ""))
        self.assertNotEqual(os.stat(self.jar.JAR).st_mtime_ns, built)
        self.assertEqual(sorted(os.listdir(self.jar._HERE)), ["rmqha-spark.jar", "src"])

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
        self.assertEqual(sorted(os.listdir(self.jar._HERE)), ["src"])


def rows_of(rows: Any) -> list[dict[str, object]]:
    """
    Rows (dicts, from Arrow or Spark) in one comparable form.
    """
    out = []
    for batch in rows:
        for row in batch:
            if "properties" in row:
                properties = row["properties"]
                items = properties.items() if isinstance(properties, dict) else properties
                row["properties"] = sorted(items)
            if row.get("body") is not None:
                row["body"] = bytes(row["body"])
            for name in ("born_timestamp", "store_timestamp"):
                # (Arrow gives a UTC datetime, PySpark a naive local one.)
                if isinstance(row.get(name), datetime.datetime):
                    row[name] = row[name].astimezone(datetime.timezone.utc)
            out.append(row)
    return out


def collected(df: Any) -> list[dict[str, object]]:
    """
    A DataFrame's rows in the order Spark gives them (partitions in
    order: offset order for one store), in L{rows_of}'s form.
    """
    return rows_of([[row.asDict() for row in df.collect()]])
