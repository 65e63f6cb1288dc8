# -*- test-case-name: tests.test_pipeline -*-
"""
The C{rmqha pipeline} jobs, runnable as C{rmqha pipeline JOB ...}, as
C{python -m rmqha.pipeline.jobs JOB ...} or with C{spark-submit}:

    spark-submit --master spark://host:7077 \\
        "$(python -c 'import rmqha.pipeline.jobs as j; print(j.__file__)')" \\
        stats /shared/store --out /shared/stats

    stats DIR [--out DIR]        per topic and minute, hour or day (from the
                                 store's span): messages, bytes, body-size
                                 and store-born latency percentiles; stats.json
                                 and stats.png
    export DIR OUT [--format F]  the records to Parquet (or ORC / JSON),
                                 partitioned by topic and store date (UTC):
                                 OUT/topic=NAME/date=YYYY-MM-DD/
           [--incremental]       only those added since the last such run
                                 (a stream checkpointed in OUT/_checkpoint)
    verify MASTER SLAVE          is the slave's store a prefix of the master's?
                                 prints "consistent" (exit 0), or the first
                                 divergent byte shown (master's and slave's
                                 bytes), its offset and record (exit 1), or
                                 "could not compare: ..." (exit 2)

Each runs on C{local[*]} unless C{--spark-master} says otherwise (or
C{spark-submit} set a master).  Errors are one line, exit status 2 from
every entry point (a Spark failure caused by our error too); the
inputs (a store where one is read, C{OUT} free where one is written) are
checked by L{check_inputs} before Spark is started.  No job overwrites a
file: C{export} writes into a temporary sibling of C{OUT} and renames it
on success, C{stats --out} refuses a directory that holds its files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import socket
import sys
import threading
import traceback
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any, Iterator, Mapping, NoReturn, Sequence
from urllib.parse import urlsplit

from rmqha.store._record import (
    Blank, RecordError, parse_record, record_json, record_starts, walk_valid,
)
from rmqha.pipeline.scan import MAX_RECORD, walk
from rmqha.pipeline.stores import (
    LocalStore, PlanError, Segment, SegmentReader, Store, resolve, unreadable,
)

__all__ = [
    "stats", "export", "export_frame", "EXPORT_PARTITIONS", "verify", "verify_local",
    "VerifyResult", "CompareError", "check_inputs",
    "BadCrc", "DamageFound",
    "Progress", "error_line", "main",
]

#: Bytes per block compared by one verify task, and hashed at once.
VERIFY_BLOCK = 8 * 1024 * 1024
_PERCENTILES = [0.5, 0.9, 0.99]


def _load(
    spark: Any, store: "Store | str", columns: Sequence[str] | None = None, **options: str
) -> Any:
    """
    The store as a DataFrame (L{read_store}: the JVM span reader for a
    local store, else the Python source); a location is resolved here, on
    the driver (a relative path made absolute: executors run elsewhere).
    With C{columns}, only those are read: the readers build no other
    column and Spark's JVM converts no other to rows (docs/pipeline.md,
    "Reading fewer columns").
    """
    from rmqha.pipeline.source import read_store

    return read_store(spark, store, columns, **options)


# -- stats -----------------------------------------------------------------


#: What L{stats} reads: no body, properties or host strings to convert.
STATS_COLUMNS = (
    "offset", "size", "topic", "born_timestamp", "store_timestamp", "body_size", "crc_ok"
)


@dataclass(frozen=True)
class BadCrc:
    """
    The records of a store whose body does not match its BODYCRC
    (C{crc_ok} false): how many, and the first one's offset.  Such a
    record is still read and exported as it is (a reader decides); the
    jobs say so, and C{--fail-on-damage} makes it an error.
    """

    bad_crc: int
    first_offset: int | None

    def line(self, store: str) -> str:
        return (
            f"{self.bad_crc:,} record(s) of {store} with a body that does not match its "
            f"CRC (crc_ok false), the first at offset {self.first_offset}: 'rmqha store "
            "check' says where, 'rmqha store repair' mends them from a replica"
        )


class DamageFound(Exception):
    """
    C{--fail-on-damage}: the store holds records with a bad body CRC.
    Exit status 1 (nothing exported).
    """


def stats(
    spark: Any,
    store_dir: str,
    out_dir: str | None = None,
    options: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """
    Per topic and per time bucket (of the store timestamp, UTC; the bucket
    from the store's span, L{time_bucket}): messages, bytes, and
    percentiles of body size and of store − born latency (ms).  Written as
    C{stats.json} and C{stats.png} into C{out_dir} when given.
    C{options} go to the data source (C{--option}).

    One pass over the store (L{_summaries}): one query aggregates per
    topic and minute, with KLL sketches for the percentiles, and merges
    that small result per topic and minute, hour and day, and per topic;
    the span (the per-topic rows' first and last store timestamps) then
    picks which of the three series is shown.
    """
    groups = _summaries(_load(spark, store_dir, STATS_COLUMNS, **(options or {})))
    topics = groups[None]
    first = min((t.pop("first_store_ms") for t in topics), default=None)
    last = max((t.pop("last_store_ms") for t in topics), default=None)
    bucket = time_bucket(first or 0, last or 0)
    series = groups[bucket]
    for row in series:
        row.pop("first_store_ms")
        row.pop("last_store_ms")
    firsts = [t["first_bad_crc_offset"] for t in topics if t["first_bad_crc_offset"] is not None]
    result = {
        "store": resolve(store_dir).uri,
        "messages": sum(t["messages"] for t in topics),
        "bytes": sum(t["bytes"] for t in topics),
        # (Data quality: records whose body does not match its CRC.)
        "bad_crc": sum(t["bad_crc"] for t in topics),
        "first_bad_crc_offset": min(firsts, default=None),
        "topics": topics,
        "bucket": bucket,
        "series": series,
    }
    if out_dir is not None:
        _check_stats_out(out_dir)
        files = {
            "stats.json": (json.dumps(result, indent=1) + "\n").encode(),
            "stats.png": _chart(result),
        }
        os.makedirs(out_dir, exist_ok=True)
        written: list[str] = []
        try:
            for name, data in files.items():
                path = os.path.join(out_dir, name)
                # "x": never replace a file that appeared meanwhile.
                with open(path, "xb") as f:
                    written.append(path)
                    f.write(data)
        except BaseException:
            for path in written:  # this call's files only: no half result
                os.unlink(path)
            raise
    return result


#: At most this many topics get their own panel in C{stats.png}; the rest
#: are summed into one last panel.
_CHART_TOPICS = 12


def time_bucket(first_ms: int, last_ms: int) -> str:
    """
    The time bucket for a store whose store timestamps span C{first_ms} to
    C{last_ms}: C{"minute"} under 2 hours (a fresh store is more than one
    dot), C{"hour"} up to 4 days, C{"day"} beyond.
    """
    span = last_ms - first_ms
    if span < 2 * 3600 * 1000:
        return "minute"
    if span <= 4 * 24 * 3600 * 1000:
        return "hour"
    return "day"


#: Milliseconds per time bucket, and how a bucket's start is written in
#: C{stats.json} (UTC).
_BUCKETS = {
    "minute": (60_000, "%Y-%m-%dT%H:%MZ"),
    "hour": (3_600_000, "%Y-%m-%dT%H:00Z"),
    "day": (86_400_000, "%Y-%m-%d"),
}


def _summaries(df: Any) -> dict[str | None, list[dict[str, Any]]]:
    """
    The stats of C{df} (L{STATS_COLUMNS}) in one Spark query that reads
    the store once: an aggregation per topic and minute (counts, sums,
    first and last offsets and store timestamps, and a KLL sketch of body
    sizes and one of latencies: L{_SKETCH_K}), then, over that small
    result, one aggregation over the grouping sets (topic, minute),
    (topic, hour), (topic, day) and (topic) that merges the sketches and
    reads the percentiles from them.  Returned by bucket (C{None}: per
    topic), each list sorted by topic and time, each row a dict with the
    bucket's start as C{time} (UTC, L{_BUCKETS}) and the group's first and
    last store timestamps (ms; popped by L{stats}).
    """
    import datetime

    from pyspark.sql import functions as F

    stored = F.unix_millis("store_timestamp")
    minutes = (
        df.select(
            "topic", "offset", "size", "body_size", "crc_ok",
            stored.alias("stored"),
            (stored - F.unix_millis("born_timestamp")).alias("latency"),
            F.floor(stored / _BUCKETS["minute"][0]).alias("minute"),
        )
        .groupBy("topic", "minute")
        .agg(
            F.count("*").alias("messages"),
            F.sum("size").alias("bytes"),
            F.kll_sketch_agg_bigint("body_size", _SKETCH_K).alias("body_size"),
            F.kll_sketch_agg_bigint("latency", _SKETCH_K).alias("latency_ms"),
            F.min("offset").alias("first_offset"),
            F.max("offset").alias("last_offset"),
            F.sum(F.when(F.col("crc_ok"), 0).otherwise(1)).alias("bad_crc"),
            F.min(F.when(~F.col("crc_ok"), F.col("offset"))).alias("first_bad_crc_offset"),
            F.min("stored").alias("first_store_ms"),
            F.max("stored").alias("last_store_ms"),
        )
    )
    names = list(_BUCKETS)
    per = {name: _BUCKETS[name][0] // _BUCKETS["minute"][0] for name in names}
    keyed = minutes.select(
        "*", *(F.floor(F.col("minute") / per[n]).alias(n) for n in names if n != "minute")
    )
    ranks = F.array(*(F.lit(p) for p in _PERCENTILES))
    sets = [["topic", name] for name in names] + [["topic"]]
    rows = (
        keyed.groupingSets(sets, "topic", *names)
        .agg(
            F.grouping_id().alias("grouping"),
            F.sum("messages").alias("messages"),
            F.sum("bytes").alias("bytes"),
            F.kll_merge_agg_bigint("body_size", _SKETCH_K).alias("body_size"),
            F.kll_merge_agg_bigint("latency_ms", _SKETCH_K).alias("latency_ms"),
            F.min("first_offset").alias("first_offset"),
            F.max("last_offset").alias("last_offset"),
            F.sum("bad_crc").alias("bad_crc"),
            F.min("first_bad_crc_offset").alias("first_bad_crc_offset"),
            F.min("first_store_ms").alias("first_store_ms"),
            F.max("last_store_ms").alias("last_store_ms"),
        )
        .select(
            "grouping", "topic", *names, "messages", "bytes",
            _quantiles("body_size", ranks), _quantiles("latency_ms", ranks),
            "first_offset", "last_offset", "bad_crc", "first_bad_crc_offset",
            "first_store_ms", "last_store_ms",
        )
        .collect()
    )
    # grouping_id's bits: 1 for each grouping column not grouped by, the
    # first (topic, always grouped by) the highest bit.
    every = (1 << len(names)) - 1
    which: dict[int, str | None] = {
        every & ~(1 << (len(names) - 1 - i)): name for i, name in enumerate(names)
    }
    which[every] = None
    out: dict[str | None, list[tuple[Any, dict[str, Any]]]] = {k: [] for k in [*names, None]}
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    for r in rows:
        d: dict[str, Any] = r.asDict()
        bucket = which[d.pop("grouping")]
        keys = {name: d.pop(name) for name in names}
        row: dict[str, Any] = {"topic": d.pop("topic")}
        key = None
        if bucket is not None:
            key = keys[bucket]
            if key is None:
                continue  # no store timestamp (garbage): in the totals only
            ms, pattern = _BUCKETS[bucket]
            try:
                row["time"] = (epoch + datetime.timedelta(milliseconds=key * ms)).strftime(pattern)
            except (OverflowError, ValueError):
                continue  # past year 9999 (garbage): in the totals only
        row.update(d)
        for name in ("body_size", "latency_ms"):
            values = row.pop(name) or [None] * len(_PERCENTILES)
            for p, v in zip(_PERCENTILES, values):
                row[f"{name}_p{int(p * 100)}"] = v
        out[bucket].append(((row["topic"], key), row))
    return {
        bucket: [row for _, row in sorted(found, key=lambda kr: (kr[0][0], kr[0][1] or 0))]
        for bucket, found in out.items()
    }


#: The KLL sketches' k (stats' percentiles): a rank error of at most about
#: 0.01 % of a group's records (99 % confidence), percentile_approx's at
#: accuracy 10,000; exact for groups of up to k records.
_SKETCH_K = 32768


def _quantiles(name: str, ranks: Any) -> Any:
    """
    The percentiles C{ranks} of the merged KLL sketch C{name} (null when it
    holds no value: every latency of the group unknown).
    """
    from pyspark.sql import functions as F

    sketch = F.col(name)
    return (
        F.when(F.kll_sketch_get_n_bigint(sketch) > 0, F.kll_sketch_get_quantile_bigint(sketch, ranks))
        .alias(name)
    )


def _chart(result: dict[str, Any]) -> bytes:
    """
    L{_chart_figure} as PNG.
    """
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = _chart_figure(result)
    png = io.BytesIO()
    fig.savefig(png, format="png")
    plt.close(fig)
    return png.getvalue()


def _chart_panels(result: dict[str, Any]) -> list[tuple[str, list[tuple[str, int]]]]:
    """
    What C{stats.png} shows, from C{stats.json}'s C{result}: one panel per
    topic (largest first), past L{_CHART_TOPICS} the remaining topics summed
    into a last panel; each panel its (bucket start, messages) pairs, one
    per row of C{result["series"]} (the sum of the rows of the same bucket
    in the last panel), sorted by time, and nothing else: a bucket without
    a row has no pair.
    """
    ordered = [t["topic"] for t in sorted(result["topics"], key=lambda t: -t["messages"])]
    panels: list[tuple[str, set[str]]] = [(t, {t}) for t in ordered[:_CHART_TOPICS]]
    if len(ordered) > _CHART_TOPICS:
        rest = ordered[_CHART_TOPICS:]
        panels.append((f"{len(rest)} other topics", set(rest)))
    out: list[tuple[str, list[tuple[str, int]]]] = []
    for label, topics in panels:
        counts: dict[str, int] = {}
        for row in result["series"]:
            if row["topic"] in topics:
                counts[row["time"]] = counts.get(row["time"], 0) + row["messages"]
        out.append((label, sorted(counts.items(), key=lambda tc: _bucket_start(tc[0]))))
    return out


def _bucket_start(time: str) -> Any:
    """
    The start of the bucket C{stats.json} writes as C{time} (L{_BUCKETS}),
    as an aware UTC C{datetime}.  (Not C{strptime}: C{%Y} there wants four
    digits, and a store with garbage timestamps has years below 1000.)
    """
    import datetime

    found = re.fullmatch(r"(\d+)-(\d\d)-(\d\d)(?:T(\d\d):(\d\d)Z)?", time)
    if found is None:
        raise ValueError(f"stats.json time {time!r} is not a bucket start")
    year, month, day, hour, minute = (int(g or 0) for g in found.groups())
    return datetime.datetime(year, month, day, hour, minute, tzinfo=datetime.timezone.utc)


def _chart_figure(result: dict[str, Any]) -> Any:
    """
    Messages per time bucket (L{_chart_panels}) as a matplotlib figure:
    one panel per topic, all on the same true time axis (UTC), none
    hidden behind another.  Each row of the series is one bar spanning its
    bucket; a bucket with no row has no bar, so an hour that stored nothing
    reads as empty (zero, which is true: no record was stored in it), and
    no line joins two buckets across the empty ones between them, as if
    there were values there.
    """
    import datetime

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    bucket = result["bucket"]
    width = datetime.timedelta(milliseconds=_BUCKETS[bucket][0])
    panels = _chart_panels(result)
    rows = max(1, len(panels))
    fig, axes = plt.subplots(
        rows, 1, figsize=(10, 1.2 + 1.6 * rows), dpi=100, sharex=True, squeeze=False
    )
    starts = [_bucket_start(t) for _, bars in panels for t, _ in bars]
    for ax, (label, bars) in zip(axes[:, 0], panels):
        ax.bar(
            [_bucket_start(t) for t, _ in bars], [n for _, n in bars],
            width=width, align="edge", color="tab:blue", edgecolor="white", linewidth=0.5,
        )
        ax.set_ylabel("messages", fontsize="small")
        ax.set_title(label, fontsize="small", loc="left")
    bottom = axes[-1, 0]
    if starts:
        bottom.set_xlim(min(starts), max(starts) + width)
        # (matplotlib.dates is not annotated.)
        locator = mdates.AutoDateLocator(tz=datetime.timezone.utc)  # type: ignore[no-untyped-call]
        bottom.xaxis.set_major_locator(locator)
        bottom.xaxis.set_major_formatter(
            mdates.ConciseDateFormatter(  # type: ignore[no-untyped-call]
                locator, tz=datetime.timezone.utc
            )
        )
    bottom.set_xlabel(f"store time (UTC), messages per {bucket}")
    fig.suptitle(f"{result['store']}: {result['messages']:,} messages per {bucket}")
    fig.tight_layout()
    return fig


# -- export ----------------------------------------------------------------

_EXPORT_FORMATS = ("parquet", "orc", "json")


def export(
    spark: Any,
    store_dir: str,
    out: str,
    fmt: str = "parquet",
    options: Mapping[str, str] | None = None,
    fail_on_damage: bool = False,
    warn: Any = None,
) -> int:
    """
    Write every record to C{out} in C{fmt}, partitioned by topic and by
    the UTC date of its store timestamp (C{topic=NAME/date=YYYY-MM-DD}
    directories, L{export_frame}: a C{date} column read back from the
    directory names; a record without a store timestamp in
    C{date=__HIVE_DEFAULT_PARTITION__}).  C{out} is a path (a relative one is
    made absolute here, on the driver) or any URI Spark writes
    (C{file:}, C{hdfs:}, C{s3a:}, ...); it must not exist.  Spark writes
    into a new temporary sibling (C{.NAME.export-XXXXXXXX}) that is renamed
    to C{out} once written and counted, so C{out} appears complete or not
    at all, and a failed export leaves nothing that blocks the retry (the
    sibling is removed; only a killed process leaves one behind).  The
    existence checks, the rename and the removal go through Hadoop's
    C{FileSystem} (L{_output_fs}), so they work for every scheme.

    The rows are counted as the executors write them and again as the
    driver reads them back: a difference means C{out} is not one
    filesystem shared by the driver and every executor (a local path on a
    cluster), and is an error (nothing is renamed).  C{options} go to the
    data source (C{--option}).

    Records whose body does not match its CRC are exported as they are
    (C{crc_ok} false) and said: C{warn} is called with one line.  With
    C{fail_on_damage} they are an error instead: nothing is published.

    @return: the number of records written.
    @raise DamageFound: C{fail_on_damage} and such records exist.
    """
    if fmt not in _EXPORT_FORMATS:
        raise ValueError(f"--format {fmt!r} is not one of {', '.join(_EXPORT_FORMATS)}")
    out = output_location(out)
    fs = _output_fs(spark, out)
    fs.check_new(out)
    name = out.rstrip("/").rsplit("/", 1)[-1]
    partial = f"{out.rstrip('/')[: -len(name)]}.{name}.export-{uuid.uuid4().hex[:8]}"
    if fs.exists(partial):  # pragma: no cover (a 32-bit collision)
        raise ValueError(f"{partial} exists; not writing into it")
    try:
        df = export_frame(_load(spark, store_dir, **(options or {})))
        written, damage = _write_counted(df, fmt, partial)
        if written == 0:
            # Partitioned, no row writes no file, and Spark
            # cannot read the export back (UNABLE_TO_INFER_SCHEMA): write
            # one empty file that carries the schema instead (Parquet,
            # ORC; a JSON file has none to carry).
            fs.delete(partial)
            df.limit(0).coalesce(1).write.format(fmt).save(partial)
        if damage.bad_crc:
            line = damage.line(resolve(store_dir).uri)
            if fail_on_damage:
                raise DamageFound(f"{line}; nothing exported (--fail-on-damage)")
            if warn is not None:
                warn(line)
        visible = _count_back(spark, fs, fmt, partial)
        if visible != written:
            raise ValueError(
                f"{out} is not shared by the driver and every executor: {written:,} records "
                f"written, {visible:,} visible to the driver; use a shared filesystem or an "
                "object store URI"
            )
        # (A rename onto a directory would move into it: check just before.)
        fs.check_new(out)
        fs.rename(partial, out)
    except BaseException:
        # The name was new and unique: everything under it is this run's.
        fs.delete(partial)
        raise
    return visible


#: The directories of an export, outermost first (L{export_frame}).
EXPORT_PARTITIONS = ("topic", "date")


def export_frame(df: Any) -> Any:
    """
    C{df} with the C{date} column an export is partitioned by besides
    C{topic}: the store timestamp's date in UTC (whatever the session's
    time zone: computed from the instant's epoch milliseconds).
    """
    from pyspark.sql import functions as F

    day = F.floor(F.unix_millis("store_timestamp") / 86_400_000).cast("int")
    return df.withColumn("date", F.date_from_unix_date(day))


def output_location(out: str) -> str:
    """
    C{export}'s C{OUT} as the executors must see it: a URI unchanged, a
    path made absolute on the driver (executors run in their worker's
    directory) as a C{file:} URI: the local filesystem, which on a
    cluster must be one shared by all at that path (not Hadoop's default
    filesystem, as for a store path).
    """
    if not out:
        raise ValueError("export needs an OUT")
    if urlsplit(out).scheme:
        return out
    return "file://" + os.path.abspath(out)


class _HadoopFS:
    """
    The few file operations C{export} needs, through Hadoop's
    C{FileSystem} in the driver's JVM: any scheme Spark writes.
    """

    def __init__(self, spark: Any, uri: str) -> None:
        self._jvm = spark._jvm
        self._fs = self._path(uri).getFileSystem(spark._jsc.hadoopConfiguration())

    def _path(self, uri: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(uri)

    def exists(self, uri: str) -> bool:
        return bool(self._fs.exists(self._path(uri)))

    def check_new(self, uri: str) -> None:
        """
        C{uri} does not exist and its parent directory does.

        @raise ValueError: either is not so.
        """
        if self.exists(uri):
            raise ValueError(f"{uri} exists; export writes a new directory")
        parent = self._path(uri).getParent()
        if parent is not None and not self._fs.isDirectory(parent):
            raise ValueError(f"{uri}: no directory {parent.toString()} to create it in")

    def data_files(self, uri: str) -> int:
        """
        How many files not named C{_*} or C{.*} (Spark's markers and
        checksums) lie under C{uri}.
        """
        if not self.exists(uri):
            return 0
        found = 0
        files = self._fs.listFiles(self._path(uri), True)
        while files.hasNext():
            name = files.next().getPath().getName()
            if not name.startswith(("_", ".")):
                found += 1
        return found

    def rename(self, source: str, target: str) -> None:
        if not self._fs.rename(self._path(source), self._path(target)):
            raise ValueError(f"could not rename {source} to {target}")

    def delete(self, uri: str) -> None:
        """
        Remove C{uri} and what is under it, if it exists (best effort: the
        failure being reported matters more).
        """
        try:
            self._fs.delete(self._path(uri), True)
        except Exception:  # pragma: no cover (the JVM is gone)
            pass


def _output_fs(spark: Any, uri: str) -> _HadoopFS:
    return _HadoopFS(spark, uri)


def _quality_metrics() -> list[Any]:
    """
    What an export observes of the rows it writes: C{rows}, C{bad_crc}
    (records whose body does not match its CRC) and C{first_bad} (the
    first such record's offset).
    """
    from pyspark.sql import functions as F

    return [
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.when(F.col("crc_ok"), 0).otherwise(1)).alias("bad_crc"),
        F.min(F.when(~F.col("crc_ok"), F.col("offset"))).alias("first_bad"),
    ]


def _write_counted(df: Any, fmt: str, uri: str) -> tuple[int, BadCrc]:
    """
    Write C{df} to C{uri} by topic and date; return the rows the executors wrote
    and the records among them with a bad body CRC (an observation of the
    written DataFrame: counted in the tasks).
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    observation = Observation("rmqha export")
    observed = df.observe(observation, *_quality_metrics())
    observed.write.partitionBy(*EXPORT_PARTITIONS).format(fmt).save(uri)
    seen = observation.get
    return int(seen["rows"]), BadCrc(int(seen["bad_crc"] or 0), seen["first_bad"])


def _count_back(spark: Any, fs: _HadoopFS, fmt: str, uri: str) -> int:
    """
    The rows the driver sees in C{uri}.  On a C{file:} URI the driver
    counts them itself (L{_count_local}): executors reading them back
    could see other files at that path.  Elsewhere (HDFS, object stores:
    one filesystem for all) Spark counts them; none when there is no
    data file (Spark cannot even infer a schema then).
    """
    if urlsplit(uri).scheme == "file":
        return _count_local(fmt, urlsplit(uri).path)
    if fs.data_files(uri) == 0:
        return 0
    count: int = spark.read.format(fmt).load(uri).count()
    return count


def _count_local(fmt: str, path: str) -> int:
    """
    The rows in the data files under C{path} on this host, from Parquet
    and ORC footers or JSON lines (files named C{_*} or C{.*} are Spark's
    markers and checksums).
    """
    total = 0
    for here, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        for name in files:
            if name.startswith(("_", ".")):
                continue
            full = os.path.join(here, name)
            if fmt == "parquet":
                import pyarrow.parquet as pq

                total += pq.ParquetFile(full).metadata.num_rows
            elif fmt == "orc":
                import pyarrow.orc as orc

                total += orc.ORCFile(full).nrows
            else:
                with open(full, "rb") as f:
                    total += sum(1 for line in f if line.strip())
    return total


# -- export --incremental ----------------------------------------------------

#: An incremental export's stream checkpoint, inside its C{OUT}
#: (Spark's readers skip C{_*} directories).
INCREMENTAL_CHECKPOINT = "_checkpoint"
#: What it exported, and how: C{OUT/_checkpoint/rmqha-export.json}.
_INCREMENTAL_MARK = "rmqha-export.json"


#: The name of an incremental export's observed metrics.
_INCREMENTAL_QUALITY = "rmqha export quality"


@dataclass
class IncrementalResult:
    """
    What one run of L{export_incremental} added: C{rows} records of the
    commit-log offsets [C{start}, C{end}) in C{batches} micro-batches
    (C{start} and C{end} C{None}: nothing new).
    """

    rows: int
    start: int | None
    end: int | None
    batches: int
    #: The records among them whose body does not match its CRC.
    bad: BadCrc = field(default_factory=lambda: BadCrc(0, None))

    def line(self, out: str, fmt: str) -> str:
        if self.start is None or self.end is None or self.end <= self.start:
            return (
                f"exported 0 new records to {out} ({fmt}, incremental): "
                "nothing new since the last run"
            )
        return (
            f"exported {self.rows:,} new records to {out} ({fmt}, by topic and date, incremental): "
            f"offsets {self.start}..{self.end} in {self.batches} batch"
            f"{'' if self.batches == 1 else 'es'}"
        )


def export_incremental(
    spark: Any,
    store_dir: str,
    out: str,
    fmt: str = "parquet",
    options: Mapping[str, str] | None = None,
) -> IncrementalResult:
    """
    Add to C{out} the records written to the store since the last run
    (all of them the first time): C{spark.readStream.format("rmqha")} run
    with C{Trigger.AvailableNow} into C{out} in C{fmt}, partitioned as
    L{export} does, its checkpoint in C{out/_checkpoint}.  Spark's file
    sink and the source's commit-log offsets make each record land once,
    whether a run is stopped or fails midway (the next run redoes an
    unfinished batch). C{out} is new or an earlier incremental export of
    this store in this format (C{_checkpoint/rmqha-export.json} says
    which); anything else is refused.  Needs the JVM data source's jar.

    @raise ValueError: one line naming C{out}, the store or the format.
    """
    from rmqha.pipeline.source import _jvm_location, jvm_reader

    if fmt not in _EXPORT_FORMATS:
        raise ValueError(f"--format {fmt!r} is not one of {', '.join(_EXPORT_FORMATS)}")
    options = dict(options or {})
    if not jvm_reader(spark):
        raise ValueError(
            "export --incremental streams with the rmqha JVM data source, and this session has "
            "no jar for it ('rmqha pipeline jar' says why)"
        )
    try:
        location = _jvm_location(resolve(store_dir, options))
    except PlanError as e:
        raise ValueError(str(e)) from None
    out = output_location(out).rstrip("/")
    fs = _output_fs(spark, out)
    checkpoint = f"{out}/{INCREMENTAL_CHECKPOINT}"
    mark = f"{checkpoint}/{_INCREMENTAL_MARK}"
    wanted = {"store": location, "format": fmt}
    if fs.exists(out):
        if not fs.exists(mark):
            raise ValueError(
                f"{out} exists and is not an incremental export (no "
                f"{INCREMENTAL_CHECKPOINT}/{_INCREMENTAL_MARK}): give a new OUT, or one an "
                "earlier export --incremental wrote"
            )
        had = json.loads(_read_text(fs, mark))
        if had != wanted:
            raise ValueError(
                f"{out} is the incremental export of {had.get('store')} as "
                f"{had.get('format')}, not of {location} as {fmt}"
            )
    else:
        fs.check_new(out)
        _write_text(fs, mark, json.dumps(wanted))
    reader = spark.readStream.format("rmqha")
    for key, value in options.items():
        reader = reader.option(key, value)
    frame, columns = export_frame(reader.load(location)), EXPORT_PARTITIONS
    # Each batch's bad-CRC records, counted as its rows are written
    # (progress["observedMetrics"]).
    frame = frame.observe(_INCREMENTAL_QUALITY, *_quality_metrics())
    # Every batch's progress, to count the rows (Spark keeps 100).
    retention = "spark.sql.streaming.numRecentProgressUpdates"
    kept = spark.conf.get(retention, None)
    spark.conf.set(retention, "1000000")
    lock = _lock_incremental(out, checkpoint)
    try:
        try:
            query = (
                frame.writeStream.format(fmt).partitionBy(*columns)
                .option("path", out).option("checkpointLocation", checkpoint)
                .trigger(availableNow=True).start()
            )
        finally:
            if kept is None:
                spark.conf.unset(retention)
            else:
                spark.conf.set(retention, kept)
        query.awaitTermination()
    finally:
        if lock is not None:
            os.close(lock)
    rows, start, end, batches = 0, None, None, 0
    bad, first_bad = 0, None
    for progress in query.recentProgress:
        source = progress["sources"][0]
        if _stream_offset(source["endOffset"]) is None:
            continue
        rows += int(progress["numInputRows"])
        batches += 1
        # (A progress is a dict; its observed metrics, a dict of Rows.)
        metrics = progress["observedMetrics"] if "observedMetrics" in progress else {}
        row = (metrics or {}).get(_INCREMENTAL_QUALITY)
        seen: dict[str, Any] = row.asDict() if row is not None else {}
        bad += int(seen.get("bad_crc") or 0)
        if seen.get("first_bad") is not None:
            first = int(seen["first_bad"])
            first_bad = first if first_bad is None else min(first_bad, first)
        end = _stream_offset(source["endOffset"])
        if start is None:
            # (A query's first batch has none: the stream's first offset.)
            start = _stream_offset(source["startOffset"])
            if start is None:
                start = _stream_offset(_read_text(fs, f"{checkpoint}/sources/0/initial.json"))
    return IncrementalResult(rows, start, end, batches, BadCrc(bad, first_bad))


def _lock_incremental(out: str, checkpoint: str) -> int | None:
    """
    Lock a local C{out} for one incremental run (C{.rmqha.lock} in its
    checkpoint: L{rmqha._locks.lock_file}), since two runs at once would
    both advance its checkpoint; C{None} for an C{out} elsewhere (an
    object store has no POSIX lock: docs/cli.md).

    @raise ValueError: another process holds it (one line, its pid).
    """
    from rmqha._locks import DIRECTORY_LOCK, InUseError, lock_file

    if urlsplit(checkpoint).scheme != "file":
        return None
    try:
        return lock_file(
            os.path.join(urlsplit(checkpoint).path, DIRECTORY_LOCK), urlsplit(out).path
        )
    except InUseError as e:
        raise ValueError(str(e)) from None


def _stream_offset(value: Any) -> int | None:
    """
    The commit-log offset of a stream progress's C{{"offset": N}} (JSON
    text, or parsed), or C{None}.
    """
    if isinstance(value, str):
        value = json.loads(value)
    return int(value["offset"]) if isinstance(value, dict) and "offset" in value else None


def _read_text(fs: _HadoopFS, uri: str) -> str:
    stream = fs._fs.open(fs._path(uri))
    try:
        text: str = fs._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
    finally:
        stream.close()
    return text


def _write_text(fs: _HadoopFS, uri: str, text: str) -> None:
    stream = fs._fs.create(fs._path(uri), False)
    try:
        stream.write(bytearray(text.encode("utf-8")))
    finally:
        stream.close()


def _check_export_out(out: str) -> None:
    """
    The checks before Spark starts, for a local C{OUT} (a path or a
    C{file:} URI); any other URI is checked by L{export}, through Hadoop.
    """
    parts = urlsplit(out)
    if parts.scheme == "file":
        out = parts.path
    elif parts.scheme:
        return
    if os.path.lexists(out):
        raise ValueError(f"{out} exists; export writes a new directory")
    parent = os.path.dirname(os.path.normpath(out)) or "."
    if not os.path.isdir(parent):
        raise ValueError(f"{out}: no directory {parent} to create it in")


def _check_incremental_out(out: str) -> None:
    """
    L{_check_export_out} for C{export --incremental}: a local C{OUT} is
    new, or an incremental export's (L{export_incremental} checks the
    rest, and any other URI, through Hadoop).
    """
    parts = urlsplit(out)
    if parts.scheme == "file":
        out = parts.path
    elif parts.scheme:
        return
    if os.path.lexists(out):
        if not os.path.isfile(os.path.join(out, INCREMENTAL_CHECKPOINT, _INCREMENTAL_MARK)):
            raise ValueError(
                f"{out} exists and is not an incremental export (no "
                f"{INCREMENTAL_CHECKPOINT}/{_INCREMENTAL_MARK}): give a new OUT, or one an "
                "earlier export --incremental wrote"
            )
        return
    parent = os.path.dirname(os.path.normpath(out)) or "."
    if not os.path.isdir(parent):
        raise ValueError(f"{out}: no directory {parent} to create it in")


def _check_stats_out(out_dir: str) -> None:
    if os.path.lexists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"--out {out_dir} exists and is not a directory")
    existing = [
        os.path.join(out_dir, n)
        for n in ("stats.json", "stats.png")
        if os.path.lexists(os.path.join(out_dir, n))
    ]
    if existing:
        raise ValueError(f"{' and '.join(existing)} exist{'s' if len(existing) == 1 else ''}; "
                         "stats does not overwrite (choose another --out)")


def _check_store(
    location: str, options: Mapping[str, str], master: bool = False
) -> None:
    store = resolve(location, options)
    try:
        found = store.segments()  # PlanError: not a commit log
    except OSError as e:
        # (A segment that is a directory, a listing refused: for verify,
        # "could not compare", exit 2 like every other error here.)
        raise PlanError(unreadable(e.filename or store.uri, e)) from None
    if master and not found:
        raise PlanError(f"{store.uri}: the master's store has no segment files")


def check_inputs(args: argparse.Namespace) -> None:
    """
    What can be checked without Spark, before starting it: each store read
    holds a commit log (the master's, for C{verify}, with segment files),
    C{export}'s C{OUT} does not exist and can be created, C{stats --out}
    holds no C{stats.json}/C{stats.png}.  Cheap: directory listings only
    (one request for a remote store).

    @raise ValueError: the first problem, as one line.
    """
    options = dict(getattr(args, "option", None) or [])
    if args.job == "verify":
        _check_store(args.master_dir, options, master=True)
        _check_store(args.slave_dir, options)
    else:
        _check_store(args.dir, options)
    if args.job == "export" and getattr(args, "incremental", False):
        _check_incremental_out(args.out)
    elif args.job == "export":
        _check_export_out(args.out)
    if args.job == "stats" and args.out is not None:
        _check_stats_out(args.out)


# -- verify ----------------------------------------------------------------


@dataclass
class VerifyResult:
    """
    What L{verify} found.  C{consistent} is true when every byte the slave
    holds equals the master's and its files are sound.
    """

    consistent: bool
    compared_bytes: int
    slave_max_offset: int
    master_max_offset: int
    problems: list[str]
    divergent_offset: int | None = None
    record: dict[str, Any] | None = None
    #: The differing bytes, shown (L{prove_difference}).
    shown: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        if self.consistent:
            return [
                f"consistent: {self.compared_bytes:,} bytes compared; slave max offset "
                f"{self.slave_max_offset}, master max offset {self.master_max_offset}"
            ]
        out = list(self.problems)
        if self.divergent_offset is not None:
            out.extend(self.shown)
            out.append(f"first divergent byte at offset {self.divergent_offset}")
            if self.record is not None:
                r = self.record
                out.append(
                    f"in the master's record at offset {r['offset']} (size {r['size']}, "
                    f"topic {r['topic']!r}, queue {r['queue_id']}, queue offset "
                    f"{r['queue_offset']})"
                )
        return out


@dataclass(frozen=True)
class _Odd:
    """
    A segment file that is not a whole segment where one belongs: shorter
    or longer than the segment size, or not at a multiple of it.

    @ivar start: the first offset it does not hold as a segment should.
    @ivar end: the end of that range.
    """

    segment: Segment
    why: str
    start: int
    end: int


@dataclass(frozen=True)
class _Layout:
    """
    One store as C{verify} sees it.

    @ivar segments: its segment files at multiples of the segment size,
        in offset order; an unfinished last one (shorter than a segment,
        only zeros: a broker killed while creating it leaves one, C{store
        check} notes it) is left out: it holds nothing.
    @ivar size: the segment size (L{_segment_size}).
    @ivar gaps: C{(start, end)} of each range between its first and last
        segment no file holds (a segment deleted, or renamed).
    @ivar odd: its files that are not a whole segment where one belongs.
    @ivar written_end: one past its last non-zero byte (its first offset
        when it has none): past C{max_offset} when what follows its last
        valid record is not zeros (a record still being written, a damaged
        one, bytes that are no record), which is compared too.
    @ivar max_offset: where its whole, valid records end, by the rule
        C{rmqha store check} uses (L{_records_end}).
    """

    segments: list[Segment]
    size: int
    gaps: list[tuple[int, int]]
    odd: list[_Odd]
    written_end: int
    max_offset: int

    @property
    def first(self) -> int:
        return self.segments[0].base if self.segments else 0

    @property
    def files_end(self) -> int:
        """
        Where its last segment ends (its first offset when it has none).
        """
        return self.segments[-1].base + self.size if self.segments else 0


def _segment_size(found: Sequence[Segment], hint: int | None = None) -> int | None:
    """
    A store's segment size, from its files: consecutive segment files are
    one segment apart, so the least distance between two files' bases when
    a file has that length (a file missing, one of another length, aside);
    else, of that distance, the files' lengths and C{hint} (the other
    store's), the one that most files start at a multiple of and have as
    their length, each counted (ties: C{hint}, a power of two, the
    larger).
    C{None} for fewer than two files.
    """
    if len(found) < 2:
        return None
    spacing = min(b.base - a.base for a, b in zip(found, found[1:]))
    lengths = {s.size for s in found if s.size > 0}
    if spacing in lengths:
        return spacing

    def score(n: int) -> tuple[int, bool, bool, int]:
        placed = sum(1 for s in found if s.base % n == 0)
        whole = sum(1 for s in found if s.size == n and s.base % n == 0)
        return placed + whole, n == hint, n & (n - 1) == 0, n

    return max(lengths | {spacing} | ({hint} if hint else set()), key=score)


#: How much of a segment the driver's walks read at once (plus the longest
#: record, so that the record a window ends in is read whole).
_WALK_WINDOW = 4 * 1024 * 1024


def _last_nonzero(store: Store, segment: Segment) -> int | None:
    """
    The position of the last non-zero byte of C{segment}, read backwards
    from its end in blocks; C{None} when it holds only zeros.
    """
    with store.open(segment) as reader:
        end = reader.size
        while end > 0:
            start = max(0, end - reader.block_size)
            data = reader.read_at(start, end - start)
            kept = len(data.rstrip(b"\0"))
            if kept:
                return start + kept - 1
            end = start
    return None


def _store_layout(
    store: Store, found: list[Segment] | None = None, size: int | None = None
) -> _Layout:
    """
    The segments, segment size, gaps, odd files, written end and max offset
    of C{store} (its files C{found}, listed if not given; its segment size
    C{size}, from them if not given).  A live broker says where its records
    end; for files, the driver reads the last segments that hold anything.

    @raise OSError: a segment cannot be listed or read (naming it).
    """
    if found is None:
        found = store.segments()
    if not found:
        return _Layout([], size or 0, [], [], 0, 0)
    size = size or _segment_size(found) or found[0].size
    segments = list(found)
    # (The last non-zero byte of each segment read: read once.)
    last_nonzero: dict[Segment, int | None] = {}
    if segments[-1].size < size:
        last_nonzero[segments[-1]] = _last_nonzero(store, segments[-1])
        if last_nonzero[segments[-1]] is None:
            segments.pop()  # unfinished: it holds nothing
    if not segments:
        return _Layout([], size, [], [], found[0].base, found[0].base)
    odd: list[_Odd] = []
    for segment in segments:
        name, length = segment.name, segment.size
        if segment.base % size:
            odd.append(_Odd(segment, f"does not start at a multiple of the segment size {size}",
                            segment.base, segment.base))
        elif length < size:
            odd.append(_Odd(segment, f"is truncated: {length} bytes, the segment size is {size}",
                            segment.base + length, segment.base + size))
        elif length > size:
            # (Its bytes past the segment size are no offsets of the log.)
            odd.append(_Odd(segment, f"is {length} bytes, longer than the segment size {size}",
                            segment.base + size, segment.base + size))
    # A file not at a multiple of the segment size holds no offsets of the
    # log (the slave's is a problem; the master's is not read).
    segments = [s for s in segments if s.base % size == 0]
    if not segments:
        return _Layout([], size, [], odd, found[0].base, found[0].base)
    gaps = [
        (a.base + size, b.base) for a, b in zip(segments, segments[1:])
        if b.base != a.base + size
    ]
    known = store.max_offset()
    if known is not None:
        return _Layout(segments, size, gaps, odd, known, known)
    written_end = segments[0].base
    for segment in reversed(segments):
        last = (
            last_nonzero[segment] if segment in last_nonzero else _last_nonzero(store, segment)
        )
        if last is not None:
            written_end = segment.base + last + 1
            break
    return _Layout(
        segments, size, gaps, odd, written_end,
        _records_end(store, segments, size, written_end),
    )


def _walk_valid(
    reader: SegmentReader, base: int, position: int, until: int | None = None
) -> tuple[int, bool, str | None]:
    """
    Hop over the valid records of one open segment (every check C{rmqha
    store check} makes: structure, PHYSICALOFFSET, body CRC, strict) from
    C{position}, stopping once past C{until} if given.

    @return: C{(stop, blank, why)}: where they stop (the segment's end
        after a BLANK filler: C{blank} true), and why the bytes at the stop
        are not a record (C{None} at the end).
    """
    size = reader.size
    while position < size and (until is None or position <= until):
        window = reader.read_at(position, _WALK_WINDOW + MAX_RECORD)
        stop, _, _ = walk_valid(
            window, 0, min(len(window), _WALK_WINDOW), base + position,
            check_crc=True, strict=True,
        )
        if stop >= len(window):
            position += stop
            continue
        try:
            # (The record the hop stopped at, read whole: a BLANK must reach
            # the segment's end, which this window does if it is there.)
            item = parse_record(
                window, stop, len(window), base + position + stop,
                check_crc=True, with_body=False, strict=True,
            )
        except RecordError as e:
            return position + stop, False, e.reason
        if type(item) is Blank:
            return size, True, None
        position += stop + item.size
    return position, False, None


def _next_valid(
    store: Store, segments: Sequence[Segment], index: int, position: int, limit: int
) -> int | None:
    """
    The offset of the first valid record (L{_walk_valid}'s checks) after
    C{position} of C{segments[index]}, there or in a later segment, before
    offset C{limit} (the store holds only zeros from there): what C{rmqha
    store check} looks for after a bad record.
    """
    start = position + 1
    for segment in segments[index:]:
        if segment.base >= limit:
            return None
        with store.open(segment) as reader:
            end = min(reader.size, limit - segment.base)
            p = start
            while p < end:
                window = reader.read_at(p, _WALK_WINDOW + MAX_RECORD)
                room = reader.size - p
                for q in record_starts(
                    window, 0, min(len(window), _WALK_WINDOW, end - p), segment.base + p, room
                ):
                    try:
                        parse_record(
                            window, q, min(len(window), room), segment.base + p + q,
                            check_crc=True, with_body=False, strict=True,
                        )
                    except RecordError:
                        continue
                    return segment.base + p + q
                p += _WALK_WINDOW
        start = 0
    return None


def _records_end(
    store: Store, segments: Sequence[Segment], size: int, written_end: int
) -> int:
    """
    Where the whole, valid records of a store end, by the rule C{rmqha
    store check} uses: the end of the last run of valid records (after a
    bad record the walk goes on from the next valid one); a last record
    that does not verify -- one still being written, a damaged one -- is
    not held.  Only the segments from the last holding a non-zero byte
    (before C{written_end}) back to the last holding a valid record are
    read: every record before those is compared byte for byte anyway.
    """
    index = max(i for i, s in enumerate(segments) if s.base < written_end or i == 0)
    while True:
        segment = segments[index]
        found, end = False, 0
        with store.open(segment) as reader:
            position = 0
            while True:
                stop, blank, _ = _walk_valid(reader, segment.base, position)
                found = found or blank or stop > position
                end = stop
                if blank or stop >= reader.size:
                    break
                resume = _next_valid(store, segments, index, stop, written_end)
                if resume is None or resume >= segment.base + reader.size:
                    break
                found, position = True, resume - segment.base
        if found or index == 0 or segments[index - 1].base + size != segment.base:
            return segment.base + end
        # Nothing valid here: the records end in the segment before (or at
        # its end, if it is closed by a BLANK filler or full).
        index -= 1


class CompareError(Exception):
    """
    C{verify} could not compare (a block unreadable, or a difference the
    executors reported that the driver cannot show): neither consistent nor
    divergent.  Exit status 2.
    """

    def __str__(self) -> str:
        return f"could not compare: {self.args[0]}"


#: One verify task: (index, slave store, slave segment, master store,
#: master segment or None, position in the segment, length).
_Task = tuple[int, Store, Segment, Store, "Segment | None", int, int]


def _read_block(store: Store, segment: Segment, position: int, length: int) -> bytes:
    with store.open(segment) as reader:
        return reader.read_at(position, length)


def _compare_block(task: _Task) -> tuple[int, str | None]:
    """
    Compare one block of both stores by blake2b checksums; return C{(task
    index, verdict)}: C{"equal"}, C{"different"} (a missing or short master
    segment is different: the slave holds bytes the master lacks) or the
    one line why a segment could not be read, naming it and this host
    (never counted as different).
    """
    index, slave, slave_segment, master, master_segment, position, length = task
    try:
        theirs = _read_block(slave, slave_segment, position, length)
    except OSError as e:
        return index, unreadable(e.filename or slave.location(slave_segment), e)
    if len(theirs) != length:
        return index, (
            f"{slave.location(slave_segment)} on host {socket.gethostname()}: "
            f"short read at {position}"
        )
    if master_segment is None:
        return index, "different"
    try:
        ours = _read_block(master, master_segment, position, length)
    except OSError as e:
        return index, unreadable(e.filename or master.location(master_segment), e)
    if len(ours) != length:
        return index, "different"
    same = hashlib.blake2b(theirs, digest_size=16).digest() == hashlib.blake2b(
        ours, digest_size=16
    ).digest()
    return index, "equal" if same else "different"


def first_difference(slave: bytes, master: bytes) -> int | None:
    """
    The index of the first byte where C{slave} differs from C{master} (a
    master shorter than the slave differs where it ends), or C{None} when
    the slave's bytes equal the master's.
    """
    for i, (a, b) in enumerate(zip(slave, master)):
        if a != b:
            return i
    if len(master) < len(slave):
        return len(master)
    return None


def hex_window(data: bytes, index: int, radius: int = 8) -> str:
    """
    The bytes around C{data[index]} in hex, that byte in brackets (C{--}
    where C{data} has none).
    """
    lo = max(0, index - radius)
    cells = [f"{b:02x}" for b in data[lo : index + radius + 1]]
    at = index - lo
    if at < len(cells):
        cells[at] = f"[{cells[at]}]"
    else:
        cells.append("[--]")
    return " ".join(cells)


def prove_difference(
    slave: bytes, master: bytes, start: int
) -> tuple[int, list[str]]:
    """
    Find and show the first differing byte of a block the executors
    flagged (C{start}: the block's first offset): its offset and the lines
    showing the master's and the slave's bytes there.  Raises
    L{CompareError} when the bytes are equal: a difference not shown is
    not a divergence.
    """
    i = first_difference(slave, master)
    if i is None:
        raise CompareError(
            f"block at offset {start} ({len(slave)} bytes) was reported different by an "
            "executor but its bytes read on the driver are equal (did a file change, or "
            "do the executors see other files than the driver?)"
        )

    def value(data: bytes) -> str:
        return f"0x{data[i]:02x}" if i < len(data) else "none (the master ends)"

    return start + i, [
        f"master byte {value(master)}, slave byte {value(slave)}",
        f"master: {hex_window(master, i)}",
        f"slave:  {hex_window(slave, i)}",
    ]


def verify(
    spark: Any,
    master_dir: "Store | str",
    slave_dir: "Store | str",
    options: Mapping[str, str] | None = None,
) -> VerifyResult:
    """
    Is the slave's store a byte-for-byte prefix of the master's?  Both
    stores (paths or URIs, L{resolve}) must be readable by the executors.
    The driver lists and checks both stores' files (L{_plan_verify}); then
    parallel tasks compare blake2b checksums of 8 MiB blocks of every byte
    the slave holds (its first offset up to its last non-zero byte) with
    the master's; the first differing block is compared byte by byte on
    the driver (L{_conclude}).  C{options} are the data source's
    (C{--option}), for opening the stores (TLS files for a live broker).

    @raise CompareError: it cannot tell (a segment unreadable or missing
        on the master's side, the master damaged where they differ).
    @raise PlanError: a store is no commit log, or the master has no
        segment file.
    """
    plan = _plan_verify(master_dir, slave_dir, options)
    failed: list[tuple[int, str | None]] = []
    if plan.tasks:
        failed = (
            spark.sparkContext.parallelize(plan.tasks, max(1, min(len(plan.tasks), 256)))
            .map(_compare_block)
            .filter(lambda r: r[1] != "equal")
            .collect()
        )
    return _conclude(plan, failed)


def verify_local(
    master_dir: "Store | str",
    slave_dir: "Store | str",
    options: Mapping[str, str] | None = None,
) -> VerifyResult:
    """
    L{verify} without Spark: the same checks and verdicts, the blocks
    compared here one after the other (small stores; the tests).
    """
    plan = _plan_verify(master_dir, slave_dir, options)
    failed = [r for r in map(_compare_block, plan.tasks) if r[1] != "equal"]
    return _conclude(plan, failed)


@dataclass
class _VerifyPlan:
    """
    What the driver found before comparing: the stores, their layouts, the
    proven problems of the slave's files, the blocks to compare.
    """

    master: Store
    slave: Store
    master_layout: _Layout
    slave_layout: _Layout
    problems: list[str]
    tasks: list[_Task]


def _plan_verify(
    master_dir: "Store | str",
    slave_dir: "Store | str",
    options: Mapping[str, str] | None = None,
) -> _VerifyPlan:
    """
    The driver's part of L{verify}, before any block is compared: list
    both stores, check every segment file can be opened (local stores),
    and find what makes the verdict without comparing (docs/pipeline.md,
    "verify": the rule and its table).
    """
    master = resolve(master_dir, options)
    slave = resolve(slave_dir, options)
    # The slave first: a live master's log only grows meanwhile, so what
    # the slave holds is also the master's by the time it is listed.
    try:
        slave_found = slave.segments()
        master_found = master.segments()
        for store, found in ((slave, slave_found), (master, master_found)):
            if isinstance(store, LocalStore):
                for segment in found:
                    # (Cheap, and a file no one may read is "cannot tell"
                    # before anything is concluded from the others.)
                    store.open(segment).close()
        if not master_found:
            raise PlanError(f"{master.uri}: the master's store has no segment files")
        lone = slave_found[0].size if len(slave_found) == 1 else None
        master_size = _segment_size(master_found, _segment_size(slave_found) or lone)
        slave_size = _segment_size(slave_found, master_size)
        # (Else a lone file's length; any will do for stores of empty files.)
        size = master_size or slave_size or max(s.size for s in master_found + slave_found) or 1
        slave_layout = _store_layout(slave, slave_found, slave_size or size)
        master_layout = _store_layout(master, master_found, size)
    except OSError as e:
        raise CompareError(unreadable(e.filename or str(e), e)) from None
    if not master_layout.segments:
        if master_layout.odd:  # (none at a multiple of the segment size)
            odd = master_layout.odd[0]
            raise CompareError(
                f"{master.uri}: the master's segment {odd.segment.name} {odd.why}: cannot compare"
            )
        raise PlanError(f"{master.uri}: the master's store has no segment files")
    # The bytes the slave holds, all compared: from its first segment
    # (a slave may start later than the master: a new RocketMQ slave gets
    # the master's log from its last segment; retention deletes the oldest
    # segments on each side) up to its last non-zero byte.
    start, end = slave_layout.first, slave_layout.written_end
    problems: list[str] = []
    for gap_start, gap_end in slave_layout.gaps:
        problems.append(
            f"missing segment: the slave has no segment file for offsets {gap_start}..{gap_end} "
            f"({gap_end - gap_start:,} bytes; the files before and after it are there)"
        )
    for odd in slave_layout.odd:
        problems.append(f"segment {odd.segment.name} {odd.why}")
    if slave_layout.segments and slave_layout.size != master_layout.size:
        problems.append(
            f"segment size differs: master {master_layout.size}, slave {slave_layout.size} bytes"
        )
    for segment in slave_layout.segments:
        if segment.base >= master_layout.files_end and segment.base < end:
            problems.append(
                f"extra segment {segment.name}: the master has no segment at offset "
                f"{segment.base} (its last ends at {master_layout.files_end}), and this one "
                "holds data: the slave is ahead"
            )
    if problems:
        # Facts about the slave's own files: proven, whatever the master holds.
        return _VerifyPlan(master, slave, master_layout, slave_layout, problems, [])
    # The master's files must be sound: a segment missing between its first
    # and last, or a file not a whole segment where one belongs, is never
    # taken for the end of its log (wherever it lies: "consistent" would
    # hide a master that cannot be replicated from).
    defects = [(a, f"the master's store has no segment file for offsets {a}..{b} (the files "
                   "before and after it are there)") for a, b in master_layout.gaps]
    defects += [(o.segment.base, f"the master's segment {o.segment.name} {o.why}")
                for o in master_layout.odd]
    if defects:
        raise CompareError(f"{master.uri}: {min(defects)[1]}: cannot compare")
    if start < min(end, master_layout.first):
        # (Retention deleted them on the master, or it lost them.)
        raise CompareError(
            f"{master.uri}: the master's store has no segment file for offsets "
            f"{start}..{master_layout.first}, which the slave holds (its first segment starts at "
            f"{master_layout.first}): nothing to compare them with"
        )
    master_by_base = {m.base: m for m in master_layout.segments}
    # Blocks in offset order: the lowest failing index is the first.
    tasks: list[_Task] = []
    for segment in slave_layout.segments:
        limit = min(segment.size, end - segment.base)
        position = 0
        while position < limit:
            n = min(VERIFY_BLOCK, limit - position)
            tasks.append(
                (len(tasks), slave, segment, master, master_by_base.get(segment.base), position, n)
            )
            position += n
    return _VerifyPlan(master, slave, master_layout, slave_layout, problems, tasks)


def _conclude(plan: _VerifyPlan, failed: Sequence[tuple[int, str | None]]) -> VerifyResult:
    """
    The verdict from the blocks the executors did not find equal
    (C{failed}: task index and why): an unreadable block is a
    L{CompareError}; the first different one is read again here and its
    first differing byte proven (L{_first_difference}); where the master's
    own record there is damaged, with valid records after it (what C{rmqha
    store check} calls damage, not a torn tail), it cannot tell which store
    is right: a L{CompareError}.
    """
    tasks = plan.tasks
    errors = sorted((i, v) for i, v in failed if v != "different")
    if errors:
        raise CompareError(errors[0][1])
    divergent = None
    shown: list[str] = []
    if failed:
        first = min(i for i, _ in failed)
        divergent, shown = _first_difference(tasks[first])
    master_layout = plan.master_layout
    record = None
    problems = list(plan.problems)
    if divergent is not None:
        try:
            damage = _damage_at(plan.master, master_layout, divergent)
        except OSError as e:
            raise CompareError(unreadable(e.filename or plan.master.uri, e)) from None
        if damage is not None:
            raise CompareError(
                f"the slave differs at offset {divergent}, where the master's store "
                f"{plan.master.uri} is damaged: {damage}; which store is right there cannot be "
                "told: check the master ('rmqha store check'), repair it from a replica ('rmqha "
                "store repair')"
            )
        record = _record_at(plan.master, divergent)
        if divergent >= master_layout.max_offset:
            problems.append(
                f"the slave is ahead: it holds bytes at offset {divergent}, past the end of "
                f"the master's valid records ({master_layout.max_offset})"
            )
    consistent = not problems and divergent is None
    compared = sum(t[6] for t in tasks)
    return VerifyResult(
        consistent, compared, plan.slave_layout.max_offset, master_layout.max_offset,
        problems, divergent, record, shown,
    )


def _damage_at(master: Store, layout: _Layout, offset: int) -> str | None:
    """
    What is wrong with the master's store at C{offset}, if it lies in
    damage as C{rmqha store check} finds it: a bad record (or bytes that
    are no record) with valid records after it.  C{None} when C{offset}
    is in a valid record, or past the master's last valid record (a torn
    or damaged tail: where the master's log ends).
    """
    segments = layout.segments
    index = next(
        (i for i, s in enumerate(segments) if s.base <= offset < s.base + s.size), None
    )
    if index is None:
        return None
    segment = segments[index]
    position = 0
    with master.open(segment) as reader:
        while True:
            stop, blank, why = _walk_valid(reader, segment.base, position, offset - segment.base)
            if blank or segment.base + stop > offset:
                return None
            resume = _next_valid(master, segments, index, stop, layout.written_end)
            if resume is None:
                return None
            if resume > offset:
                return (
                    f"bad record at offset {segment.base + stop} ({why or 'not a record'}), "
                    f"valid records follow at offset {resume}"
                )
            position = resume - segment.base


def _first_difference(task: _Task) -> tuple[int, list[str]]:
    """
    Read a flagged block on the driver and prove its first difference
    (L{prove_difference}); an unreadable segment is a L{CompareError}.
    """
    _, slave, slave_segment, master, master_segment, position, length = task
    try:
        theirs = _read_block(slave, slave_segment, position, length)
        ours = (
            b"" if master_segment is None
            else _read_block(master, master_segment, position, length)
        )
    except OSError as e:
        raise CompareError(unreadable(e.filename or slave.location(slave_segment), e)) from None
    return prove_difference(theirs, ours, slave_segment.base + position)


def _record_at(store: Store, offset: int) -> dict[str, Any] | None:
    """
    The record of C{store} containing C{offset}, found by hopping headers
    from its segment's start (L{walk}).
    """
    for segment in store.segments():
        if segment.base <= offset < segment.base + segment.size:
            with store.open(segment) as reader:
                for position, total in walk(reader):
                    if segment.base + position + total <= offset:
                        continue
                    data = reader.read_at(position, total)
                    try:
                        record = parse_record(
                            data, 0, len(data), segment.base + position, check_crc=False
                        )
                    except RecordError:
                        return None
                    if isinstance(record, Blank):
                        return None
                    fields = record_json(record)
                    return {k: fields[k] for k in _RECORD_FIELDS}
    return None


_RECORD_FIELDS = ("offset", "size", "topic", "queue_id", "queue_offset", "store_host")


# -- command line ------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """
    The jobs as subcommands of C{parser} (shared with C{rmqha pipeline}).
    """
    jobs = parser.add_subparsers(dest="job", metavar="JOB", parser_class=type(parser))
    jobs.required = True
    for name, help_text in [
        ("stats", "per topic and time bucket: counts, bytes, percentiles; JSON, PNG"),
        ("export", "records to Parquet (ORC, JSON) partitioned by topic and date"),
        ("verify", "is a slave's store a byte-for-byte prefix of the master's?"),
    ]:
        job = jobs.add_parser(name, help=help_text)
        job.add_argument(
            "--spark-master", default=None,
            help="Spark master URL (default local[*], or what spark-submit set)",
        )
        job.add_argument(
            "--conf", action="append", default=[], type=_spark_setting, metavar="KEY=VALUE",
            help="a Spark setting, as spark-submit's (repeatable): spark.executor.memory=2g",
        )
        job.add_argument(
            "--py-files", default=None, type=_comma_list, metavar="FILES",
            help="comma-separated .py/.zip/.egg files for every task, as spark-submit's",
        )
        job.add_argument(
            "--option", action="append", default=[], type=_source_option, metavar="KEY=VALUE",
            help="a data source option for every store read (repeatable): splitBytes=16m",
        )
        job.add_argument(
            "--verbose", action="store_true",
            help="show Spark's own log (its start-up, warnings and errors) and progress bar "
            "on stderr",
        )
        job.add_argument(
            "--debug", action="store_true",
            help="on failure, print the full trace, not one line (implies --verbose)",
        )
        job.add_argument(
            "--progress", action="store_true",
            help="a line per running stage on stderr every 2 s (the default when stderr "
            "is a terminal)",
        )
        if name == "verify":
            job.add_argument("master_dir", help="the master's store root")
            job.add_argument("slave_dir", help="the slave's store root")
        else:
            job.add_argument("dir", help="store root")
        if name in ("stats", "export"):
            job.add_argument(
                "--fail-on-damage", action="store_true",
                help="records whose body does not match its CRC are an error (exit 1; "
                "export publishes nothing; export --incremental has committed them), not a "
                "warning",
            )
        if name == "stats":
            job.add_argument("--out", default=None, help="write stats.json and stats.png here")
        if name == "export":
            job.add_argument(
                "out", help="output directory or URI (file:, hdfs:, s3a:, ...; must not exist)"
            )
            job.add_argument("--format", default="parquet", choices=_EXPORT_FORMATS)
            job.add_argument(
                "--incremental", action="store_true",
                help="add only the records written since the last --incremental run into OUT "
                "(a stream, checkpointed in OUT/_checkpoint; OUT may be an earlier one's)",
            )
    # Not a Spark job: the JVM data source's jar, for --jars (rmqha.pipeline._jar).
    jobs.add_parser(
        "jar", help="print the path of the rmqha data source's jar (building it if needed), "
        "for spark-submit --jars / spark.jars"
    )


def _pair(flag: str, text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    key = key.strip()
    if not equals or not key or any(c.isspace() for c in key):
        raise argparse.ArgumentTypeError(f"{flag} {text!r} is not KEY=VALUE")
    return key, value


def _spark_setting(text: str) -> tuple[str, str]:
    key, value = _pair("--conf", text)
    if not key.startswith("spark."):
        # Spark would only warn and ignore it: a typo must not pass silently.
        raise argparse.ArgumentTypeError(f"--conf {text!r}: a Spark setting's KEY starts with 'spark.'")
    return key, value


def _source_option(text: str) -> tuple[str, str]:
    key, value = _pair("--option", text)
    if key.lower() == "path":
        raise argparse.ArgumentTypeError(f"--option {text!r}: the store is the DIR argument")
    return key, value


def _comma_list(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"--py-files {text!r} names no file")
    return items


def run(args: argparse.Namespace, out: IO[str], err: IO[str] | None = None) -> int:
    """
    Run the job C{args} chose; return the exit status.  Results go to
    C{out}; warnings (damaged records) to C{err} (default: stderr), so
    stats' JSON line stays alone on C{out}.
    """
    err = err if err is not None else sys.stderr
    from rmqha.pipeline.source import spark_session

    check_inputs(args)
    # Spark's own log (warnings, each failed task's trace) and progress
    # bar only with --verbose (or --debug): otherwise stdout is the answer,
    # stderr our lines, and a failure one line.
    verbose = bool(args.verbose or args.debug)
    spark = spark_session(
        args.spark_master,
        app_name=f"rmqha {args.job}",
        conf=dict(args.conf),
        py_files=args.py_files or (),
        quiet=not verbose,
        console_progress=verbose,
    )
    shown = args.progress or (not verbose and err.isatty())
    with Progress(spark.sparkContext.statusTracker(), args.job, err).running(shown):
        return _job(args, spark, out, err)


def _job(args: argparse.Namespace, spark: Any, out: IO[str], err: IO[str]) -> int:
    """
    L{run}'s job on C{spark}.
    """
    options = dict(args.option)
    if args.job == "stats":
        result = stats(spark, args.dir, args.out, options)
        shown = ("store", "messages", "bytes", "bad_crc", "first_bad_crc_offset", "topics")
        out.write(json.dumps({k: result[k] for k in shown}))
        out.write("\n")
        if args.out:
            out.write(f"wrote {os.path.join(args.out, 'stats.json')} and stats.png\n")
        if result["bad_crc"]:
            line = BadCrc(result["bad_crc"], result["first_bad_crc_offset"]).line(result["store"])
            print(f"rmqha pipeline: {'error' if args.fail_on_damage else 'warning'}: {line}",
                  file=err)
            if args.fail_on_damage:
                return 1
        return 0
    if args.job == "export" and args.incremental:
        target = output_location(args.out)
        added = export_incremental(spark, args.dir, target, args.format, options)
        out.write(added.line(target, args.format) + "\n")
        if added.bad.bad_crc:
            # (The sink has committed them: an incremental run cannot
            # withdraw them; --fail-on-damage makes it exit 1 saying so.)
            print(
                f"rmqha pipeline: {'error' if args.fail_on_damage else 'warning'}: "
                f"{added.bad.line(args.dir)}", file=err,
            )
            if args.fail_on_damage:
                return 1
        return 0
    if args.job == "export":
        target = output_location(args.out)

        def warn(line: str) -> None:
            print(f"rmqha pipeline: warning: {line}", file=err)

        try:
            count = export(
                spark, args.dir, target, args.format, options,
                fail_on_damage=args.fail_on_damage, warn=warn,
            )
        except DamageFound as e:
            print(f"rmqha pipeline: error: {e}", file=err)
            return 1
        out.write(f"exported {count:,} records to {target} ({args.format}, by topic and date)\n")
        return 0
    result_v = verify(
        spark, args.master_dir, args.slave_dir, options
    )
    for line in result_v.lines():
        out.write(line + "\n")
    return 0 if result_v.consistent else 1


class Progress:
    """
    A line on stderr for each running stage of the job whose tasks moved
    (C{rmqha pipeline: stats: stage 3: 5/12 tasks done, 2 running}), from
    PySpark's status tracker polled every C{interval} seconds by a daemon
    thread (L{running}): no SparkListener, nothing in the JVM.
    """

    def __init__(self, tracker: Any, job: str, err: IO[str], interval: float = 2.0) -> None:
        self._tracker = tracker
        self._job = job
        self._err = err
        self._interval = interval
        self._seen: dict[int, tuple[int, int, int, int]] = {}

    def poll(self) -> None:
        """
        One look at the running stages: a line for each new or moved one.
        """
        for stage in sorted(self._tracker.getActiveStageIds()):
            info = self._tracker.getStageInfo(stage)
            if info is None:
                continue  # (finished meanwhile)
            state = (
                info.numCompletedTasks, info.numTasks, info.numActiveTasks, info.numFailedTasks
            )
            if self._seen.get(stage) == state:
                continue
            self._seen[stage] = state
            done, total, active, failed = state
            line = f"rmqha pipeline: {self._job}: stage {stage}: {done}/{total} tasks done"
            if active:
                line += f", {active} running"
            if failed:
                line += f", {failed} failed"
            print(line, file=self._err, flush=True)

    @contextmanager
    def running(self, shown: bool) -> Iterator[None]:
        """
        Poll while the block runs (when C{shown}); stopped and joined on
        leaving, whatever the block did.
        """
        if not shown:
            yield
            return
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(self._interval):
                try:
                    self.poll()
                except Exception:  # (the JVM going away at the end: no line)
                    return

        thread = threading.Thread(target=loop, name="rmqha pipeline progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, as every failure of a job: this is read in scripts.
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: Sequence[str] | None = None) -> int:
    """
    C{python -m rmqha.pipeline.jobs} and C{spark-submit .../jobs.py}: exit
    status 0, 1 only for C{verify}'s proven divergence, 2 for any error
    (one line, L{error_line}; the trace too with C{--debug}).
    """
    parser = _Parser(
        prog="rmqha pipeline", description="Spark jobs over RocketMQ commit logs."
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.job == "jar":
        from rmqha.pipeline import _jar

        return _jar.main(sys.stdout)
    try:
        return run(args, sys.stdout)
    except Exception as e:
        if args.debug:
            traceback.print_exc()
        print(f"rmqha pipeline: error: {error_line(e)}", file=sys.stderr)
        return 2


#: Our errors, as a Python trace names them: their message is the line.
_OURS = re.compile(
    r"^(?:rmqha\.[\w.]*\.)?(?:CompareError|PlanError|OptionError|StoreLocationError): "
    # (The JVM span reader's: rmqha/pipeline/jvm/src/rmqha/spark/StoreReadError.java.)
    r"|^rmqha\.spark\.StoreReadError: "
)


def error_line(e: BaseException) -> str:
    """
    The one line to print for a job's failure C{e} (exit status 2).  Our
    errors are their message; a Spark failure (a Py4J / PySpark trace)
    is its cause: the last Python exception in it (raised in a task, or
    while planning the data source), else the Java cause; anything else
    (a bug) is its type and first line, pointing at C{--debug}.
    """
    if isinstance(e, OSError):
        name = f"{e.filename}: " if e.filename else ""
        return f"{name}{e.strerror or e}"
    if isinstance(e, (ValueError, PlanError, CompareError)):
        return str(e)
    text = str(e)
    lines = text.splitlines()
    tracebacks = [i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line]
    if tracebacks:
        for line in lines[tracebacks[-1] + 1 :]:
            if line and not line[0].isspace():
                return _OURS.sub("", _spark_suffix(line))
    caused = [line for line in lines if line.startswith("Caused by: ")]
    if caused:
        return _OURS.sub("", _spark_suffix(caused[-1][len("Caused by: ") :]))
    for line in lines:
        if line.startswith(": "):  # Py4J: "An error occurred while calling o1.x.\n: java..."
            return _OURS.sub("", _spark_suffix(line[2:]))
    for ours in (CompareError, PlanError):
        found = re.findall(rf"\b{ours.__name__}: (.*)", text)
        if found:
            message: str = found[-1].strip()
            return message
    first = lines[0].strip() if lines else ""
    if type(e).__module__.startswith(("pyspark", "py4j")):
        return _spark_suffix(first)
    return f"{type(e).__name__}: {first} (a bug? --debug shows the trace)"


def _spark_suffix(line: str) -> str:
    """
    C{line} without Spark's C{SQLSTATE: ...} tail.
    """
    return re.sub(r"\s*SQLSTATE: \w+\s*$", "", line).strip()


if __name__ == "__main__":  # spark-submit .../rmqha/pipeline/jobs.py JOB ...
    sys.exit(main())
