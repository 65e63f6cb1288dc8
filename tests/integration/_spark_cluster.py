"""
A real Spark standalone cluster on loopback for the pipeline's cluster
tests: one master and workers of one core each, started with pip's
PySpark (which has no C{sbin} scripts) through C{spark-class}, every JVM
in its own process group and stopped by it at the end, nothing left
running.

A worker may run in its own mount namespace (C{unshare --mount
--propagation private}) with empty tmpfs mounted over some directories:
over rmqha's installed package, so its executors' Python lacks rmqha
(the driver must ship it), and over a directory of stores, so its
executors cannot see them (C{ENOENT}) while the driver and the other
worker can.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from tools.processes import free_ports

__all__ = ["SparkCluster", "hidden_argv", "python_jobs", "why_no_cluster", "why_no_namespaces", "worker_env"]

#: How long the JVMs get to start and the workers to register.
START_TIMEOUT = 90.0

#: Mounts the tmpfs given as arguments (up to "--"), then runs the rest.
_MOUNT_THEN_RUN = (
    'while [ "$1" != "--" ]; do mount -t tmpfs -o size=16m rmqha-test "$1" || exit 97; shift; '
    'done; shift; exec "$@"'
)


def _spark_home() -> str:
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


def why_no_cluster() -> str | None:
    """
    Why a standalone cluster cannot be started here, or C{None}.
    """
    from tests._spark import why_no_spark

    why = why_no_spark()
    if why is not None:
        return why
    if not os.path.exists(os.path.join(_spark_home(), "bin", "spark-class")):
        return "this PySpark has no bin/spark-class"
    return None


def why_no_namespaces(scratch: str) -> str | None:
    """
    Why a worker cannot get a private mount namespace with a tmpfs here
    (C{unshare} missing, or no permission to mount), or C{None}.
    """
    if shutil.which("unshare") is None:
        return "no unshare command"
    target = os.path.join(scratch, "mount-probe")
    os.makedirs(target, exist_ok=True)
    try:
        probe = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", _MOUNT_THEN_RUN,
             "sh", target, "--", "true"],
            capture_output=True, timeout=30,
        )
    finally:
        os.rmdir(target)
    if probe.returncode != 0:
        text = probe.stderr.decode(errors="replace").strip().splitlines()
        return f"cannot unshare a mount namespace and mount tmpfs as this user: {text[-1:]}"
    return None


def hidden_argv(hidden: list[str], argv: list[str]) -> list[str]:
    """
    C{argv} run in its own mount namespace with an empty tmpfs over each
    of C{hidden} (C{argv} itself when there is none).
    """
    if not hidden:
        return argv
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", _MOUNT_THEN_RUN,
            "sh", *hidden, "--", *argv]


def worker_env(scratch: str) -> dict[str, str]:
    """
    The environment of the cluster's JVMs: loopback, their own (empty)
    Spark configuration, and no C{PYTHONPATH} (so the worker's Python has
    only what is installed, not this checkout).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_"))}
    env.pop("PYTHONPATH", None)
    conf = os.path.join(scratch, "conf")
    os.makedirs(conf, exist_ok=True)
    env.update(
        SPARK_HOME=_spark_home(),
        SPARK_CONF_DIR=conf,
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOCAL_HOSTNAME="localhost",
        SPARK_NO_DAEMONIZE="1",
        # The master and workers are short-lived and mostly idle: the C1
        # compiler only and the serial collector, as the jobs' driver and
        # executors (test_pipeline_cluster.SETTINGS): less CPU starting up
        # on two shared cores.
        SPARK_DAEMON_JAVA_OPTS="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    )
    if "JAVA_HOME" not in env:
        from rmqha.pipeline.source import _java_home

        home = _java_home()
        if home is not None:
            env["JAVA_HOME"] = home
    return env



@dataclass
class SparkCluster:
    """
    A started cluster: C{url} is its C{spark://} master URL.
    """

    scratch: str
    url: str = ""
    webui: int = 0
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def _start(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        log = open(os.path.join(self.scratch, f"{name}.log"), "wb")
        with log:
            self.processes.append(
                subprocess.Popen(
                    argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.scratch,
                )
            )

    def start(self, workers: list[list[str]]) -> None:
        """
        Start the master and one worker per entry of C{workers}: the
        directories to hide from that worker behind an empty tmpfs (its
        own mount namespace when not empty); wait until every worker has
        registered.
        """
        env = worker_env(self.scratch)
        spark_class = os.path.join(env["SPARK_HOME"], "bin", "spark-class")
        port, self.webui = free_ports(2)
        self.url = f"spark://127.0.0.1:{port}"
        self._start("master", [
            spark_class, "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(self.webui),
        ], env)
        # The master's web UI is where it says it is: a port chosen free may
        # be taken before the JVM binds it (by another test's process, or a
        # worker's UI on port 0), and Spark then binds the next one.  The
        # workers start once the master listens.
        self.webui = self._master_ui()
        for i, hidden in enumerate(workers):
            work = os.path.join(self.scratch, f"worker-{i}")
            os.makedirs(work)
            argv = [
                spark_class, "org.apache.spark.deploy.worker.Worker",
                "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                "--webui-port", "0", "--work-dir", work, self.url,
            ]
            self._start(f"worker-{i}", hidden_argv(hidden, argv), env)
        self._wait(len(workers))

    def _master_ui(self) -> int:
        """
        The port the master's web UI bound, from its log.
        """
        bound = re.compile(rb"Bound MasterWebUI to [^,]+, and started at https?://[^:/]+:(\d+)")
        deadline = time.monotonic() + START_TIMEOUT
        path = os.path.join(self.scratch, "master.log")
        while time.monotonic() < deadline:
            if self.processes[0].poll() is not None:
                raise RuntimeError(f"the master exited; {self.logs()}")
            with open(path, "rb") as f:
                found = bound.search(f.read())
            if found:
                return int(found.group(1))
            time.sleep(0.2)  # polling is fine here: a real process
        raise RuntimeError(f"the master's web UI did not start; {self.logs()}")

    def _wait(self, workers: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        state: dict[str, object] = {}
        while time.monotonic() < deadline:
            dead = [p.args for p in self.processes if p.poll() is not None]
            if dead:
                raise RuntimeError(f"a cluster process exited: {dead[0]!r}; {self.logs()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.webui}/json/", timeout=5) as r:
                    state = json.load(r)
            except (OSError, ValueError):  # (not up yet, or not JSON yet)
                state = {}
            if state.get("aliveworkers") == workers:
                return
            time.sleep(0.5)  # polling is fine here: real processes
        raise RuntimeError(f"{workers} workers did not register: {state!r}; {self.logs()}")

    def logs(self) -> str:
        """
        The tail of every JVM's log (for a failure's message).
        """
        tails = []
        for name in sorted(os.listdir(self.scratch)):
            if name.endswith(".log"):
                with open(os.path.join(self.scratch, name), "rb") as f:
                    text = f.read().decode(errors="replace").splitlines()[-15:]
                tails.append(f"--- {name}\n" + "\n".join(text))
        return "\n".join(tails)

    def stop(self) -> None:
        """
        Stop every process group (the JVMs, the executors they started and
        their Python workers); SIGKILL what is still there after 15 s.
        """
        for p in self.processes:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 15
        for p in self.processes:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the group: also executors left behind
            except ProcessLookupError:
                pass
            p.wait()
        self.processes.clear()


_JOBS_SCRIPT = """
import contextlib, io, json, sys
from rmqha.pipeline.jobs import main
results = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as e:
            status = e.code
    results.append({"returncode": status, "stdout": out.getvalue(), "stderr": err.getvalue()})
# Which codec the executors ran: the compiled one, loaded from the shipped zip?
from pyspark.sql import SparkSession
session = SparkSession.getActiveSession()
codec = None if session is None else (
    session.sparkContext.parallelize(range(4), 4)
    .map(lambda _: __import__("rmqha.store._record", fromlist=["_record"]).ACCELERATED)
    .collect()
)
print("CODEC " + json.dumps(codec), flush=True)
print("RESULTS " + json.dumps(results), flush=True)
"""


def python_jobs(
    argvs: list[list[str]], cwd: str, timeout: float = 600, driver: dict[str, Any] | None = None
) -> list[subprocess.CompletedProcess[str]]:
    """
    Each C{argv} through C{rmqha.pipeline.jobs.main} (the entry point of
    C{python -m rmqha.pipeline.jobs}), in turn, in ONE driver process in
    C{cwd}: the jobs share a SparkSession and its executors, so the JVMs
    start once, not once per job.  Each result is that job's exit status
    and what it printed (Python's stdout and stderr; Spark's own log goes
    to the process's stderr, not into a job's: C{driver["stderr"]} when
    C{driver} is given, and C{driver["codec"]} whether four executor tasks
    ran the compiled codec after the jobs).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_"))}
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = here
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["SPARK_LOCAL_HOSTNAME"] = "localhost"
    done = subprocess.run(
        [sys.executable, "-c", _JOBS_SCRIPT, json.dumps(argvs)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )
    if driver is not None:
        driver["stderr"] = done.stderr
        codec = [line for line in done.stdout.splitlines() if line.startswith("CODEC ")]
        driver["codec"] = json.loads(codec[-1][len("CODEC "):]) if codec else None
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULTS ")]
    if done.returncode != 0 or not lines:
        raise AssertionError(f"the driver failed ({done.returncode}): {done.stderr[-3000:]}")
    return [
        subprocess.CompletedProcess(argv, r["returncode"], r["stdout"], r["stderr"])
        for argv, r in zip(argvs, json.loads(lines[-1][len("RESULTS "):]))
    ]
