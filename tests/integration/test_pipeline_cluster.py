"""
The pipeline jobs on a real Spark standalone cluster on loopback (a
master and two workers of one core, L{tests.integration._spark_cluster}),
run through C{python -m rmqha.pipeline.jobs}'s entry point with
C{--spark-master spark://...}, from a directory of their own, with
RELATIVE store and OUT paths (executors run in their worker's directory:
the driver must make them absolute).  Every job of the module runs in one
driver process, at the module's start (L{python_jobs}: the JVMs start
once); the tests then check each job's exit status and output.

Both workers run with a Python that lacks rmqha (an empty tmpfs over the
installed package, no C{PYTHONPATH}): the driver ships it.  Worker 1 also
has an empty tmpfs over C{hidden/}: stores there exist for the driver and
worker 0, not for worker 1's executor (C{ENOENT}), and what that executor
writes there stays in its private tmpfs (an OUT not shared).

Marked C{cluster}: C{pytest -m cluster} runs them alone.  One cluster for
the module: JVM start-ups are expensive.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any, Iterator

import pytest

from rmqha.store.commitlog import CommitLog

from tests._helpers import make_message
from tests.integration._spark_cluster import (
    SparkCluster,
    hidden_argv,
    python_jobs,
    why_no_cluster,
    why_no_namespaces,
    worker_env,
)

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

_why = why_no_cluster()
if _why is not None:
    pytestmark.append(pytest.mark.skip(reason=_why))

#: Every job: both executors registered before the first task (so both
#: get tasks), no retry of a failed task on the other worker (that would
#: hide the unreadable store), a partition per segment, few shuffle
#: partitions (Spark's 200 cost minutes on two cores).
SETTINGS = [
    "--conf", "spark.cores.max=2",
    "--conf", "spark.scheduler.minRegisteredResourcesRatio=1.0",
    "--conf", "spark.scheduler.maxRegisteredResourcesWaitingTime=300s",
    "--conf", "spark.task.maxFailures=1",
    "--conf", "spark.executor.memory=512m",
    # Short-lived JVMs on two shared cores: the C1 compiler only.
    "--conf", "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    "--conf", "spark.executor.extraJavaOptions=-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    "--conf", "spark.default.parallelism=4",
    "--conf", "spark.sql.shuffle.partitions=4",
    "--option", "splitBytes=64k",
]


def _make_store(path: str, count: int, seed: int) -> None:
    """
    C{count} messages in 64 KiB segments (verify compares one block per
    segment at least: many tasks), three topics.
    """
    import random

    rng = random.Random(seed)
    log = CommitLog.open(path, segment_size=64 * 1024)
    for i in range(count):
        log.put(make_message(
            rng.randbytes(rng.randrange(0, 900)),
            topic=rng.choice(["orders", "payments", "audit-log"]),
            queue_id=rng.randrange(4),
            properties={"KEYS": f"k{i}"},
        ))
    log.close()


def _installed_rmqha(scratch: str) -> str | None:
    """
    Where the workers' Python finds rmqha without this checkout on its
    path (to hide it from them), or C{None}.
    """
    found = subprocess.run(
        [sys.executable, "-c", "import os, rmqha; print(os.path.dirname(rmqha.__file__))"],
        cwd=scratch, env=worker_env(scratch), capture_output=True, text=True,
    )
    return found.stdout.strip() or None if found.returncode == 0 else None


class Cluster:
    def __init__(
        self, root: str, cluster: SparkCluster, namespaces: str | None, hidden: list[str]
    ) -> None:
        self.root = root  # the jobs' working directory
        self.cluster = cluster
        #: Why the workers hide nothing (no namespaces), or None.
        self.namespaces = namespaces
        #: What every worker hides (the installed rmqha).
        self.hidden = hidden

        #: Each job's result, by name (L{_run_jobs}).
        self.done: dict[str, subprocess.CompletedProcess[str]] = {}
        #: Puts into the live master before and after the jobs ran.
        self.puts = (0, 0)
        #: The driver process's own stderr (not a job's), and the codec
        #: its executors ran (L{python_jobs}).
        self.driver: dict[str, Any] = {}

    def argv(self, *argv: str) -> list[str]:
        job, *rest = argv
        return [job, "--spark-master", self.cluster.url, *SETTINGS, *rest]


#: The jobs, by name: every store and OUT relative to the jobs' directory.
_JOBS = {
    "stats": ("stats", "store", "--out", "stats-out"),
    "export": ("export", "store", "exported"),
    "verify": ("verify", "store", "copy"),
}
#: The jobs that need worker 1's private mount of hidden/.
_HIDDEN_JOBS = {
    "verify hidden": ("verify", "store", "hidden/store"),
    "stats hidden": ("stats", "hidden/store", "--out", "no-stats"),
    "export hidden": ("export", "hidden/store", "no-export"),
    "export to hidden": ("export", "store", "hidden/out"),
}


class Sources:
    """
    The other places a store can be, for the cluster's executors: a copy
    of C{store} in an S3-compatible server (moto's, on 127.0.0.1), and a
    live master and slave (C{twistd rmqha} processes serving their commit
    logs over HTTP) with a thread putting messages into the master
    throughout.
    """

    def __init__(self, root: str) -> None:
        self.root = root
        self.processes: list[subprocess.Popen[bytes]] = []
        self.moto: object = None
        self.putting = False
        self.puts = 0
        self.s3 = ""
        self.master = self.slave = ""
        self.putter: Any = None

    def start(self) -> None:
        import threading

        from moto.server import ThreadedMotoServer
        from pyarrow import fs

        from tools.processes import free_ports, twistd_command, twistd_slave_command
        from tools.bench import wait_http

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        self.moto = server
        host, port = server.get_host_and_port()
        s3 = fs.S3FileSystem(
            access_key="testing", secret_key="testing", endpoint_override=f"{host}:{port}",
            scheme="http", region="us-east-1", allow_bucket_creation=True,
        )
        s3.create_dir("backups")
        fs.copy_files(
            os.path.join(self.root, "store", "commitlog"), "backups/store/commitlog",
            destination_filesystem=s3,
        )
        # Credentials in the URI: the executors' environment is the workers'.
        self.s3 = (
            f"s3://testing:testing@backups/store?endpoint_override={host}:{port}"
            "&scheme=http&region=us-east-1"
        )
        ha, http_master, http_slave = free_ports(3)
        live = os.path.join(os.path.dirname(self.root), "live")
        os.makedirs(live, exist_ok=True)
        common = ["--segment-size", "65536", "--serve-commitlog", "64m"]
        self.processes.append(subprocess.Popen(twistd_command(
            os.path.join(live, "master"), os.path.join(live, "master.log"), "--role", "master",
            "--ha-listen", f"tcp:{ha}:interface=127.0.0.1",
            "--http", f"tcp:{http_master}:interface=127.0.0.1", *common,
        )))
        self.processes.append(subprocess.Popen(twistd_slave_command(
            os.path.join(live, "slave"), f"tcp:host=127.0.0.1:port={ha}",
            os.path.join(live, "slave.log"), "--ha-listen", "tcp:0:interface=127.0.0.1",
            "--http", f"tcp:{http_slave}:interface=127.0.0.1", *common,
        )))
        wait_http(f"http://127.0.0.1:{http_master}/status", self.processes[0], "the master")
        wait_http(f"http://127.0.0.1:{http_slave}/status", self.processes[1], "the slave")
        self.master = f"rmqha+http://127.0.0.1:{http_master}"
        self.slave = f"rmqha+http://127.0.0.1:{http_slave}"
        for _ in range(300):
            self._put(http_master)
        self.putting = True
        self.putter = threading.Thread(
            target=self._keep_putting, args=(http_master,), daemon=True
        )
        self.putter.start()

    def _put(self, port: int) -> None:
        import urllib.request

        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/topics/Live/messages?queueId={self.puts % 4}",
            data=os.urandom(700), method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200, answer.status
        self.puts += 1

    def _keep_putting(self, port: int) -> None:
        import time

        while self.putting:
            self._put(port)
            time.sleep(0.02)

    def stop(self) -> None:
        self.putting = False
        if self.putter is not None:
            # (Its last put done before the brokers stop: a put racing the
            # master's shutdown is answered 503, an error in the thread.)
            self.putter.join(timeout=30)
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            process.wait(timeout=30)
        if self.moto is not None:
            self.moto.stop()  # type: ignore[attr-defined]


def _run_jobs(cluster: Cluster) -> None:
    """
    Every job in one driver process (a copy of the store for verify,
    removed afterwards), the S3 copy and the live brokers among the
    stores.
    """
    jobs = dict(_JOBS)
    if cluster.namespaces is None:
        jobs.update(_HIDDEN_JOBS)
    sources = Sources(cluster.root)
    copy = os.path.join(cluster.root, "copy")
    shutil.copytree(os.path.join(cluster.root, "store"), copy)
    try:
        sources.start()
        jobs["verify s3"] = ("verify", "store", sources.s3)
        jobs["stats live"] = ("stats", sources.master)
        jobs["verify live"] = ("verify", sources.master, sources.slave)
        puts_before = sources.puts
        results = python_jobs(
            [cluster.argv(*argv) for argv in jobs.values()], cwd=cluster.root,
            driver=cluster.driver,
        )
        cluster.puts = (puts_before, sources.puts)
    finally:
        sources.stop()
        shutil.rmtree(copy)
    cluster.done = dict(zip(jobs, results))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = str(tmp_path_factory.mktemp("cluster-jobs"))
    scratch = str(tmp_path_factory.mktemp("cluster-jvms"))
    os.makedirs(os.path.join(root, "hidden"))
    _make_store(os.path.join(root, "store"), 1000, seed=1)
    _make_store(os.path.join(root, "hidden", "store"), 1000, seed=1)
    why = why_no_namespaces(scratch)
    hide: list[str] = []
    if why is None:
        installed = _installed_rmqha(scratch)
        if installed is not None:
            hide.append(installed)
    spark = SparkCluster(scratch)
    try:
        spark.start([hide, hide + [os.path.join(root, "hidden")] if why is None else []])
        cluster = Cluster(root, spark, why, hide)
        _run_jobs(cluster)
        yield cluster
    finally:
        spark.stop()


def _expected_stats(path: str) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """
    stats' per-topic and per-minute rows of the store at C{path}, from the
    records the commit log itself decodes (first principles, no Spark):
    counts, bytes, first and last offsets, and the exact nearest-rank
    percentiles (the job's sketches are exact below their k, which 1,000
    records are).
    """
    import collections
    import datetime

    from tests.test_pipeline import store_rows

    def rank(values: list[int], p: int) -> int:
        ordered = sorted(values)
        return ordered[-(-p * len(ordered) // 100) - 1]

    def summary(rows: list[dict[str, Any]]) -> dict[str, object]:
        offsets = [r["offset"] for r in rows]
        sizes = [r["body_size"] for r in rows]
        latencies = [
            (r["store_timestamp"] - r["born_timestamp"]) // datetime.timedelta(milliseconds=1)
            for r in rows
        ]
        return {
            "messages": len(rows), "bytes": sum(r["size"] for r in rows),
            "first_offset": min(offsets), "last_offset": max(offsets),
            "bad_crc": 0, "first_bad_crc_offset": None,
            **{f"body_size_p{p}": rank(sizes, p) for p in (50, 90, 99)},
            **{f"latency_ms_p{p}": rank(latencies, p) for p in (50, 90, 99)},
        }

    rows: list[dict[str, Any]] = store_rows(path)
    assert all(r["crc_ok"] for r in rows)
    topics: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    minutes: dict[tuple[str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    for r in rows:
        topics[r["topic"]].append(r)
        minutes[(r["topic"], r["store_timestamp"].strftime("%Y-%m-%dT%H:%MZ"))].append(r)
    return (
        [{"topic": t, **summary(rs)} for t, rs in sorted(topics.items())],
        [{"topic": t, "time": m, **summary(rs)} for (t, m), rs in sorted(minutes.items())],
    )


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """
    The job failed with exit status 2 and its last line of stderr is the
    one-line error (Spark's start-up chatter may come before it).
    """
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr[-3000:])
    assert done.stdout == "", done.stdout
    last = done.stderr.rstrip("\n").splitlines()[-1]
    assert last.startswith("rmqha pipeline: error: "), done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return last


def test_stats_export_verify_right(cluster: Cluster) -> None:
    """
    stats, export and verify on the cluster, given relative paths, are
    right for the store (stats equal the records the commit log decodes,
    L{_expected_stats}; the export holds every offset once; verify of a
    copy is consistent), with executors whose Python lacks rmqha
    (shipped by the driver).
    """
    if cluster.hidden:  # the premise: without the shipped zip, no rmqha there
        bare = subprocess.run(
            hidden_argv(cluster.hidden, [sys.executable, "-c", "import rmqha.pipeline"]),
            cwd=cluster.cluster.scratch, env=worker_env(cluster.cluster.scratch),
            capture_output=True, text=True,
        )
        assert "No module named 'rmqha" in bare.stderr, bare.stderr
    done = cluster.done["stats"]
    assert done.returncode == 0, done.stderr[-3000:]
    printed = json.loads(done.stdout.splitlines()[0])
    with open(os.path.join(cluster.root, "stats-out", "stats.json")) as f:
        written = json.load(f)
    topics, series = _expected_stats(os.path.join(cluster.root, "store"))
    assert printed["topics"] == topics
    assert (written["bucket"], written["series"]) == ("minute", series)
    assert written["messages"] == 1000

    done = cluster.done["export"]
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == f"exported 1,000 records to file://{cluster.root}/exported (parquet, by topic and date)\n"
    import pyarrow.parquet as pq

    from tests.test_pipeline import store_rows

    # (Read by pyarrow, the offsets by the commit log: no Spark job here.)
    here = pq.read_table(os.path.join(cluster.root, "exported"), columns=["offset"])
    assert sorted(here.column("offset").to_pylist()) == [
        r["offset"] for r in store_rows(os.path.join(cluster.root, "store"))
    ]
    assert "copy" not in os.listdir(cluster.root)
    assert sorted(n for n in os.listdir(cluster.root) if not n.startswith("no-")) == [
        "exported", "hidden", "stats-out", "store"
    ]

    done = cluster.done["verify"]
    assert (done.returncode, done.stdout.split(":")[0]) == (0, "consistent"), done.stderr[-3000:]


def test_quiet_driver(cluster: Cluster) -> None:
    """
    The jobs' driver process (the entry point of C{python -m
    rmqha.pipeline.jobs}, no C{--verbose}) writes nothing on its stderr
    besides the jobs' own lines: no JVM or log4j start-up lines, no Spark
    warning or error -- failed tasks included.
    """
    assert cluster.driver["stderr"] == "", cluster.driver["stderr"][-3000:]


def test_executors_run_the_compiled_codec(cluster: Cluster) -> None:
    """
    The executors, whose Python lacks rmqha, run the compiled codec the
    driver shipped in its zip (loaded from it: L{rmqha.store._native}),
    not the pure-Python one, when the driver has it.
    """
    from rmqha.store import _record

    if not _record.ACCELERATED:
        pytest.skip("the driver has no compiled codec to ship")
    assert cluster.driver["codec"] == [True] * 4, cluster.driver


def _needs_hidden(cluster: Cluster) -> None:
    if cluster.namespaces is not None:
        pytest.skip(f"no worker with a private mount: {cluster.namespaces}")


def test_verify_store_one_executor_cannot_see(cluster: Cluster) -> None:
    """
    A slave store worker 1's executor cannot see: "could not compare:
    cannot read PATH on host H", exit 2, never 1 (a divergence).
    """
    _needs_hidden(cluster)
    done = cluster.done["verify hidden"]
    line = _one_error_line(done)
    assert line.startswith(
        f"rmqha pipeline: error: could not compare: cannot read {cluster.root}/hidden/store/"
    ), line
    assert " on host " in line and "No such file or directory" in line, line


def test_stats_and_export_of_a_store_one_executor_cannot_see(cluster: Cluster) -> None:
    """
    stats and export of a store worker 1's executor cannot see: one line
    naming the file, exit 2, and no OUT (nor its temporary sibling) left.
    """
    _needs_hidden(cluster)
    for name in ("stats hidden", "export hidden"):
        line = _one_error_line(cluster.done[name])
        assert f"{cluster.root}/hidden/store/" in line, line
        assert "No such file or directory" in line, line
    left = [n for n in os.listdir(cluster.root) if "no-" in n]
    assert left == [], left


def test_export_out_one_executor_cannot_see(cluster: Cluster) -> None:
    """
    An export whose OUT lies where worker 1's executor writes into its
    own private tmpfs: the not-shared error with both counts, exit 2, no
    OUT and no temporary sibling.
    """
    _needs_hidden(cluster)
    line = _one_error_line(cluster.done["export to hidden"])
    assert line.startswith(
        f"rmqha pipeline: error: file://{cluster.root}/hidden/out is not shared by the driver and "
        "every executor: 1,000 records written, "
    ), line
    assert line.endswith(" visible to the driver; use a shared filesystem or an object store URI")
    assert sorted(os.listdir(os.path.join(cluster.root, "hidden"))) == ["store"]


def test_s3_and_live_broker_sources(cluster: Cluster) -> None:
    """
    On the cluster's executors: verify of the local store against its
    copy in the S3 server is consistent; stats of a live master over
    C{rmqha+http://} while it takes puts counts at least what it held
    when the jobs started; verify of the live master
    against its live slave (replicating meanwhile) is consistent.
    """
    before, after = cluster.puts
    assert after > before  # the master took puts while the jobs ran
    done = cluster.done["verify s3"]
    assert (done.returncode, done.stdout.split(":")[0]) == (0, "consistent"), done.stderr[-3000:]
    done = cluster.done["stats live"]
    assert done.returncode == 0, done.stderr[-3000:]
    printed = json.loads(done.stdout.splitlines()[0])
    assert printed["messages"] >= before
    assert [t["topic"] for t in printed["topics"]] == ["Live"]
    done = cluster.done["verify live"]
    assert (done.returncode, done.stdout.split(":")[0]) == (0, "consistent"), (
        done.stdout, done.stderr[-3000:]
    )


def test_plain_session_on_the_cluster(cluster: Cluster, tmp_path: Any) -> None:
    """
    A Spark application with nothing of rmqha but the jar C{rmqha pipeline
    jar} prints (rmqha's Python cannot be imported in it; the workers'
    Python lacks it too): a plain C{SparkSession.builder} session with
    that jar on C{spark.jars}, on the standalone cluster, reads the store
    by C{format("rmqha")} (every record, in partitions), with a topic and queue filter pushed to the source (shown
    in the plan), by SQL (C{CREATE TABLE ... USING rmqha}), and as a
    stream into a Parquet sink run twice -- stopped after the first run,
    restarted from its checkpoint when the store has grown -- whose sink
    then holds every record once.
    """
    from tests.test_pipeline import store_rows

    store = os.path.join(cluster.root, "store")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_"))}
    env.pop("PYTHONPATH", None)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["SPARK_LOCAL_HOSTNAME"] = "localhost"
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    printed = subprocess.run(
        [sys.executable, "-m", "rmqha.cli", "pipeline", "jar"],
        capture_output=True, text=True, env={**env, "PYTHONPATH": here}, check=True,
    ).stdout.split()
    assert len(printed) == 1 and printed[0].endswith(".jar"), printed
    settings = [SETTINGS[i + 1] for i, s in enumerate(SETTINGS) if s == "--conf"]
    work = str(tmp_path)
    done = subprocess.run(
        [sys.executable, os.path.join(here, "tests", "integration", "_plain_session.py"),
         printed[0], store, work, cluster.cluster.url, *settings],
        cwd=work, env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = [
        json.loads(line[len("RESULT "):])
        for line in done.stdout.splitlines() if line.startswith("RESULT ")
    ]
    assert [r["master"] for r in results] == [cluster.cluster.url], done.stdout
    rows = store_rows(store)
    ours = sum(1 for r in rows if r["topic"] == "orders" and r["queue_id"] in (0, 1))
    for r in results:
        assert r["rows"] == len(rows) == 1000, r
        assert r["partitions"] > 2, r
        assert r["pushed"] == ours, r
        assert "PushedFilters: [" in r["plan"] and "topic = 'orders'" in r["plan"], r["plan"]
        assert r["sql"] == sum(1 for x in rows if x["queue_id"] in (0, 1)), r
        assert (r["stream_rows"], r["stream_offsets"]) == (len(rows), len(rows)), r
        assert r["first_run"] > 0 and r["first_run"] + r["second_run"] == len(rows), r
