# -*- test-case-name: tests.test_pipeline -*-
"""
The C{rmqha pipeline} jobs, runnable as C{rmqha pipeline JOB ...}, as
C{python -m rmqha.pipeline.jobs JOB ...} or with C{spark-submit}:

    spark-submit --master spark://host:7077 \\
        "$(python -c 'import rmqha.pipeline.jobs as j; print(j.__file__)')" \\
        stats /shared/store --out /shared/stats

    stats DIR [--out DIR]        per topic and hour: messages, bytes, body-size
                                 and store-born latency percentiles; stats.json
                                 and stats.png
    export DIR OUT [--format F]  the records to Parquet (or ORC / JSON),
                                 partitioned by topic
    verify MASTER SLAVE          is the slave's store a prefix of the master's?
                                 prints "consistent" (exit 0) or the first
                                 divergent byte offset and its record (exit 1)

Each runs on C{local[*]} unless C{--spark-master} says otherwise (or
C{spark-submit} set a master).  Errors are one line, exit status 2; the
inputs (a store where one is read, C{OUT} free where one is written) are
checked by L{check_inputs} before Spark is started.  No job overwrites a
file: C{export} writes into a temporary sibling of C{OUT} and renames it
on success, C{stats --out} refuses a directory that holds its files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import mmap
import os
import shutil
import sys
import uuid
from dataclasses import dataclass
from typing import IO, Any, Sequence

from rmqha.store._record import Blank, RecordError, parse_record, read_header, record_json
from rmqha.pipeline.scan import PlanError, hop, segments

__all__ = ["stats", "export", "verify", "VerifyResult", "check_inputs", "main"]

#: Bytes per block compared by one verify task, and hashed at once.
VERIFY_BLOCK = 8 * 1024 * 1024
_PERCENTILES = [0.5, 0.9, 0.99]


def _load(spark: Any, store_dir: str, **options: str) -> Any:
    from rmqha.pipeline.source import FORMAT

    reader = spark.read.format(FORMAT)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(store_dir)


# -- stats -----------------------------------------------------------------


def stats(spark: Any, store_dir: str, out_dir: str | None = None) -> dict[str, Any]:
    """
    Per topic and per hour (of the store timestamp, UTC): messages, bytes,
    and percentiles of body size and of store − born latency (ms).  Written
    as C{stats.json} and C{stats.png} into C{out_dir} when given.
    """
    from pyspark.sql import functions as F

    df = _load(spark, store_dir, bodies="false")
    hour = F.date_format(
        F.date_trunc("hour", F.timestamp_millis("store_timestamp")), "yyyy-MM-dd'T'HH:00'Z'"
    )
    latency = F.col("store_timestamp") - F.col("born_timestamp")

    def summary(*keys: Any) -> list[Any]:
        rows: list[Any] = (
            df.groupBy(*keys)
            .agg(
                F.count("*").alias("messages"),
                F.sum("size").alias("bytes"),
                F.percentile_approx("body_size", _PERCENTILES, 10000).alias("body_size"),
                F.percentile_approx(latency, _PERCENTILES, 10000).alias("latency_ms"),
                F.min("offset").alias("first_offset"),
                F.max("offset").alias("last_offset"),
            )
            .orderBy(*keys)
            .collect()
        )
        return rows

    def row(r: Any) -> dict[str, Any]:
        d: dict[str, Any] = r.asDict()
        for name in ("body_size", "latency_ms"):
            values = d.pop(name) or [None] * len(_PERCENTILES)
            for p, v in zip(_PERCENTILES, values):
                d[f"{name}_p{int(p * 100)}"] = v
        return d

    previous = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    try:
        hourly = [row(r) for r in summary("topic", hour.alias("hour"))]
        topics = [row(r) for r in summary("topic")]
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous)
    result = {
        "store": os.path.abspath(store_dir),
        "messages": sum(t["messages"] for t in topics),
        "bytes": sum(t["bytes"] for t in topics),
        "topics": topics,
        "hourly": hourly,
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


def _chart(result: dict[str, Any]) -> bytes:
    """
    Messages per hour, one line per topic (the ten largest topics), as PNG.
    """
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hours = sorted({h["hour"] for h in result["hourly"]})
    biggest = sorted(result["topics"], key=lambda t: -t["messages"])[:10]
    fig, ax = plt.subplots(figsize=(10, 5), dpi=100)
    for topic in (t["topic"] for t in biggest):
        counts = {h["hour"]: h["messages"] for h in result["hourly"] if h["topic"] == topic}
        ax.plot(range(len(hours)), [counts.get(h, 0) for h in hours], marker="o", label=topic)
    ax.set_xticks(range(len(hours)))
    ax.set_xticklabels([h[5:13].replace("T", " ") for h in hours], rotation=45, ha="right")
    ax.set_ylabel("messages per hour")
    ax.set_title(f"{result['store']}: {result['messages']:,} messages")
    if biggest:
        ax.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png")
    plt.close(fig)
    return png.getvalue()


# -- export ----------------------------------------------------------------

_EXPORT_FORMATS = ("parquet", "orc", "json")


def export(spark: Any, store_dir: str, out: str, fmt: str = "parquet") -> int:
    """
    Write every record to C{out} in C{fmt}, partitioned by topic (one
    C{topic=NAME} directory each).  C{out} must not exist.  Spark writes
    into a new temporary sibling (C{.NAME.export-XXXXXXXX}) that is renamed
    to C{out} once written and counted, so C{out} appears complete or not
    at all, and a failed export leaves nothing that blocks the retry (the
    sibling is removed; only a killed process leaves one behind).

    @return: the number of records written.
    """
    if fmt not in _EXPORT_FORMATS:
        raise ValueError(f"--format {fmt!r} is not one of {', '.join(_EXPORT_FORMATS)}")
    _check_export_out(out)
    out = os.path.normpath(out)
    parent, name = os.path.split(out)
    partial = os.path.join(parent, f".{name}.export-{uuid.uuid4().hex[:8]}")
    if os.path.lexists(partial):  # pragma: no cover (a 32-bit collision)
        raise ValueError(f"{partial} exists; not writing into it")
    try:
        df = _load(spark, store_dir)
        df.write.partitionBy("topic").format(fmt).save(partial)
        count: int = spark.read.format(fmt).load(partial).count()
        # (os.rename would replace an empty directory: check just before.)
        _check_export_out(out)
        os.rename(partial, out)
    except BaseException:
        # The name was new and unique: everything under it is this run's.
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return count


def _check_export_out(out: str) -> None:
    if os.path.lexists(out):
        raise ValueError(f"{out} exists; export writes a new directory")
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


def _check_store(store_dir: str, master: bool = False) -> None:
    if not os.path.isdir(store_dir):
        raise ValueError(f"{store_dir}: no such directory")
    found = segments(store_dir)  # PlanError: not a commit log
    if master and not found:
        raise PlanError(f"{store_dir}: the master's store has no segment files")


def check_inputs(args: argparse.Namespace) -> None:
    """
    What can be checked without Spark, before starting it: each store read
    is a directory holding a commit log (the master's, for C{verify}, with
    segment files), C{export}'s C{OUT} does not exist and can be created,
    C{stats --out} holds no C{stats.json}/C{stats.png}.  Cheap: directory
    listings only.

    @raise ValueError: the first problem, as one line.
    """
    if args.job == "verify":
        _check_store(args.master_dir, master=True)
        _check_store(args.slave_dir)
    else:
        _check_store(args.dir)
    if args.job == "export":
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

    def lines(self) -> list[str]:
        if self.consistent:
            return [
                f"consistent: {self.compared_bytes:,} bytes compared; slave max offset "
                f"{self.slave_max_offset}, master max offset {self.master_max_offset}"
            ]
        out = list(self.problems)
        if self.divergent_offset is not None:
            out.append(f"first divergent byte at offset {self.divergent_offset}")
            if self.record is not None:
                r = self.record
                out.append(
                    f"in the master's record at offset {r['offset']} (size {r['size']}, "
                    f"topic {r['topic']!r}, queue {r['queue_id']}, queue offset "
                    f"{r['queue_offset']})"
                )
        return out


def _store_layout(store_dir: str) -> tuple[list[tuple[int, str, int]], int, int]:
    """
    Segments, segment size, and the max offset (where whole records end in
    the last segment holding any).
    """
    found = segments(store_dir)
    if not found:
        return [], 0, 0
    size = max(s for _, _, s in found)
    max_offset = found[0][0]
    for base, path, length in reversed(found):
        _, end = hop(path, length, max(length, 1))
        if end > 0:
            max_offset = base + end
            break
    return found, size, max_offset


def _compare_block(task: tuple[int, str, str | None, int, int]) -> tuple[int, bool]:
    """
    Hash one block of both files (a missing or short master file counts
    as different); return C{(task index, equal)}.
    """
    index, slave_path, master_path, position, length = task

    def digest(path: str | None) -> bytes | None:
        if path is None:
            return None
        try:
            with open(path, "rb") as f:
                f.seek(position)
                data = f.read(length)
        except OSError:
            return None
        if len(data) != length:
            return None
        return hashlib.blake2b(data, digest_size=16).digest()

    a = digest(slave_path)
    return index, a is not None and a == digest(master_path)


def verify(spark: Any, master_dir: str, slave_dir: str) -> VerifyResult:
    """
    Is the slave's store a byte-for-byte prefix of the master's?  Both
    directories must be readable by the executors.  Compares, in parallel
    tasks, blake2b checksums of 8 MiB blocks from the slave's first offset
    up to its max offset; the first differing block is then compared byte
    by byte.  Also reported: slave segment files the master does not have,
    slave files shorter than the segment size (truncated), and a slave
    ahead of the master.
    """
    master_segments, master_size, master_max = _store_layout(master_dir)
    slave_segments, slave_size, slave_max = _store_layout(slave_dir)
    problems: list[str] = []
    if not master_segments:
        raise PlanError(f"{master_dir}: the master's store has no segment files")
    master_paths = {base: path for base, path, _ in master_segments}
    if slave_segments and slave_size != master_size:
        problems.append(
            f"segment size differs: master {master_size}, slave {slave_size} bytes"
        )
    for base, path, length in slave_segments:
        name = os.path.basename(path)
        if base not in master_paths:
            problems.append(f"extra segment {name}: the master has no segment at offset {base}")
        if length < slave_size or (master_size and length < master_size):
            problems.append(
                f"segment {name} is truncated: {length} bytes, the segment size is "
                f"{max(slave_size, master_size)}"
            )
        if base % max(master_size, 1):
            problems.append(f"segment {name} does not start at a multiple of {master_size}")
    if slave_max > master_max:
        problems.append(
            f"the slave is ahead: its max offset {slave_max} is past the master's {master_max}"
        )
    # Blocks in offset order: the lowest failing index is the first.
    tasks: list[tuple[int, str, str | None, int, int]] = []
    bases: list[int] = []
    for base, path, length in slave_segments:
        limit = min(length, slave_max - base)
        position = 0
        while position < limit:
            n = min(VERIFY_BLOCK, limit - position)
            tasks.append((len(tasks), path, master_paths.get(base), position, n))
            bases.append(base)
            position += n
    compared = sum(t[4] for t in tasks)
    divergent = None
    if tasks:
        failed = (
            spark.sparkContext.parallelize(tasks, max(1, min(len(tasks), 256)))
            .map(_compare_block)
            .filter(lambda r: not r[1])
            .keys()
            .collect()
        )
        if failed:
            first = min(failed)
            divergent = _first_difference(tasks[first], bases[first])
    record = None
    if divergent is not None:
        record = _record_at(master_dir, divergent)
    consistent = not problems and divergent is None
    return VerifyResult(
        consistent, compared, slave_max, master_max, problems, divergent, record
    )


def _first_difference(task: tuple[int, str, str | None, int, int], base: int) -> int:
    _, slave_path, master_path, position, length = task
    with open(slave_path, "rb") as f:
        f.seek(position)
        theirs = f.read(length)
    ours = b""
    if master_path is not None:
        with open(master_path, "rb") as f:
            f.seek(position)
            ours = f.read(length)
    for i, (a, b) in enumerate(zip(theirs, ours)):
        if a != b:
            return base + position + i
    return base + position + min(len(theirs), len(ours))


def _record_at(store_dir: str, offset: int) -> dict[str, Any] | None:
    """
    The master's record containing C{offset}, found by hopping headers
    from its segment's start.
    """
    for base, path, length in segments(store_dir):
        if base <= offset < base + length:
            with open(path, "rb") as f:
                data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            position = 0
            while position + 8 <= len(data):
                total, _ = read_header(data, position)
                if total <= 0:
                    return None
                if base + position + total > offset:
                    try:
                        record = parse_record(
                            data, position, len(data), base + position, check_crc=False
                        )
                    except RecordError:
                        return None
                    if isinstance(record, Blank):
                        return None
                    fields = record_json(record)
                    return {k: fields[k] for k in _RECORD_FIELDS}
                position += total
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
        ("stats", "per topic and hour: counts, bytes, percentiles; JSON and PNG"),
        ("export", "records to Parquet (ORC, JSON) partitioned by topic"),
        ("verify", "is a slave's store a byte-for-byte prefix of the master's?"),
    ]:
        job = jobs.add_parser(name, help=help_text)
        job.add_argument(
            "--spark-master", default=None,
            help="Spark master URL (default local[*], or what spark-submit set)",
        )
        if name == "verify":
            job.add_argument("master_dir", help="the master's store root")
            job.add_argument("slave_dir", help="the slave's store root")
        else:
            job.add_argument("dir", help="store root")
        if name == "stats":
            job.add_argument("--out", default=None, help="write stats.json and stats.png here")
        if name == "export":
            job.add_argument("out", help="output directory (must not exist)")
            job.add_argument("--format", default="parquet", choices=_EXPORT_FORMATS)


def run(args: argparse.Namespace, out: IO[str]) -> int:
    """
    Run the job C{args} chose; return the exit status.
    """
    from rmqha.pipeline.source import spark_session

    check_inputs(args)
    spark = spark_session(args.spark_master, app_name=f"rmqha {args.job}")
    if args.job == "stats":
        result = stats(spark, args.dir, args.out)
        out.write(json.dumps({k: result[k] for k in ("store", "messages", "bytes", "topics")}))
        out.write("\n")
        if args.out:
            out.write(f"wrote {os.path.join(args.out, 'stats.json')} and stats.png\n")
        return 0
    if args.job == "export":
        count = export(spark, args.dir, args.out, args.format)
        out.write(f"exported {count:,} records to {args.out} ({args.format}, by topic)\n")
        return 0
    result_v = verify(spark, args.master_dir, args.slave_dir)
    for line in result_v.lines():
        out.write(line + "\n")
    return 0 if result_v.consistent else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rmqha pipeline", description="Spark jobs over RocketMQ commit logs."
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args, sys.stdout)
    except (ValueError, PlanError, OSError) as e:
        print(f"rmqha pipeline: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # spark-submit .../rmqha/pipeline/jobs.py JOB ...
    sys.exit(main())
