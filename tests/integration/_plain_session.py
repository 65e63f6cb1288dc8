"""
A Spark application that knows nothing of rmqha's Python, run as a script
by L{tests.integration.test_pipeline_cluster} against the standalone
cluster: it makes plain C{SparkSession.builder} sessions with only the jar
C{rmqha pipeline jar} printed on C{spark.jars}, one per master given (in
one process), and through each reads a store by C{format("rmqha")}, with
pushed filters, by SQL, and as a stream into a Parquet sink run twice
over a store that grows between the runs.  Prints one JSON line per
master.

    python _plain_session.py JAR STORE WORK MASTER[,MASTER...] [KEY=VALUE...]
"""

import json
import os
import shutil
import sys

sys.modules["rmqha"] = None  # type: ignore[assignment]  # the jar alone: no rmqha here

from pyspark.sql import SparkSession  # noqa: E402


def _segments(store: str) -> list[str]:
    directory = os.path.join(store, "commitlog")
    return sorted(os.path.join(directory, n) for n in os.listdir(directory))


def _stream_twice(spark: SparkSession, store: str, work: str) -> dict[str, int]:
    """
    A stream of a store that holds half the segments, then all: its sink's
    rows, distinct offsets, and the rows each run added.
    """
    grow = os.path.join(work, "grow", "commitlog")
    os.makedirs(grow)
    segments = _segments(store)
    half = len(segments) // 2
    for path in segments[:half]:
        shutil.copy(path, grow)
    sink, checkpoint = os.path.join(work, "sink"), os.path.join(work, "checkpoint")
    added = []
    for run in range(2):
        if run == 1:
            for path in segments[half:]:
                shutil.copy(path, grow)
        query = (
            spark.readStream.format("rmqha").load(os.path.dirname(grow))
            .writeStream.format("parquet").option("path", sink)
            .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
        )
        query.awaitTermination()
        added.append(sum(p["numInputRows"] for p in query.recentProgress))
    rows = spark.read.parquet(sink)
    return {
        "stream_rows": rows.count(),
        "stream_offsets": rows.select("offset").distinct().count(),
        "first_run": added[0],
        "second_run": added[1],
    }


def main(jar: str, store: str, work: str, masters: str, *settings: str) -> None:
    for i, master in enumerate(masters.split(",")):
        builder = (
            SparkSession.builder.master(master).config("spark.jars", jar)
            .config("spark.ui.enabled", "false")
        )
        for setting in settings:
            key, value = setting.split("=", 1)
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        df = spark.read.format("rmqha").option("splitBytes", "20k").load(store)
        pushed = df.filter("topic = 'orders' AND queue_id IN (0, 1)")
        table = f"commitlog_{i}"
        spark.sql(f"CREATE TABLE {table} USING rmqha LOCATION '{store}'")
        result = {
            "master": master,
            "rows": df.count(),
            "partitions": df.rdd.getNumPartitions(),
            "pushed": pushed.count(),
            "plan": pushed._jdf.queryExecution().executedPlan().toString(),
            "sql": spark.sql(
                f"SELECT count(*) FROM {table} WHERE queue_id IN (0, 1)"
            ).first()[0],
            **_stream_twice(spark, store, os.path.join(work, str(i))),
        }
        spark.sql(f"DROP TABLE {table}")
        spark.stop()
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
