# -*- test-case-name: tests.test_bench -*-
"""
Benchmarks (commands, not tests): C{python -m tools.bench store} and
C{python -m tools.bench replicate}.

C{store} measures the put path (1 KiB bodies by default, ASYNC_FLUSH: the
real L{CommitLogService} flushes on a thread while the reactor thread puts)
and the transfer read path (C{CommitLog.read} in C{haTransferBatchSize}
chunks, from page cache).

C{sync} measures puts through the embedding API (C{Broker.put}) by N
concurrent producers on a SYNC_MASTER or ASYNC_MASTER with one real slave
process over loopback: puts per second and latency percentiles.

C{spark} scans and decodes a 2 GiB store with the plain single-process
reader (L{rmqha.pipeline.scan.scan}) and with Spark on C{local[1]} and
C{local[2]} (the C{rocketmq-commitlog} data source).

C{puts} runs single puts, batches of 32 and C{store check} in this checkout
and in another (C{--against}: the code before a change), alternating.

C{codec} times the codec's hot loops per record, pure Python against the
compiled accelerator (C{rmqha.store._speedups}), in one process.

C{crc} reads and checks one store (the plain reader, bodies on and off,
and C{store check}) with the compiled CRC-32's PCLMULQDQ folding on and
off, alternating in one process: the readers with the CRC the only
variable, against C{zlib.crc32} over the same files.

C{sources} reads one store from the local files, an S3-compatible server
(moto's, a process on 127.0.0.1) and a live broker's admin HTTP
(C{rmqha+http://}), by the plain reader and by Spark C{local[2]}, and
measures in the same runs each source's raw ceiling: its segments read
block by block by the store's reader, one request at a time, nothing
decoded.

C{tls} replicates the same backlog over TCP and over mutual TLS, runs
alternating, and reports both and their ratio; both legs use checked
framing (what two rmqha peers negotiate, over TLS too) unless
C{--framing classic}.

C{scrub} times the background scrub's check (L{rmqha.store.scrub.check_chunk},
the worker thread's work) over every record of one store in 1 MiB steps,
from the page cache, in this checkout and in C{--against} (each in its own
process, alternating): MB and records per CPU second, and the share of a
core the default C{--scrub-rate} (32 MiB/s) costs.

C{replicate} measures a master process streaming a backlog (1 GiB by
default) to an empty slave process over loopback, with each process's
RSS, against the raw ceiling measured in the same run: a plain socket pair
moving the same bytes into a file.  A last phase throttles the slave to
1 MB/s and samples the master's RSS, which must stay flat.

C{http} runs SYNC puts over the admin HTTP port (single and batches, 1
and 16 keep-alive connections) against a C{twistd rmqha} master and
slave (L{tools.httpbench}).

C{pulls} drains a backlog with rmqha.client's PullConsumer over the
remoting protocol and compares the rate with C{rmqha store check}'s on
the same store (L{tools.pullbench}).

C{failover} runs a failover group of three C{twistd rmqha} processes under
one etcd member, with HTTP producers following the master hint, and
SIGKILLs the master C{--kills} times (restarting it each time): the
unavailability window as a producer sees it (last C{PUT_OK} from the old
master -> first from the new), the election time (kill -> a new master in
C{/status}) and the C{PUT_OK}s the new master lacks (must be 0); at the end
every store is compared with the master's and checked
(L{tools.failover_cluster}; docs/failover.md).

Each figure is the median of C{--runs} runs; the last line printed is one
JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from typing import Any, Callable

from twisted.internet.defer import Deferred, ensureDeferred, gatherResults
from twisted.internet.task import deferLater, react

from rmqha.store._record import ACCELERATED, Message
from rmqha.store.commitlog import CommitLog
from rmqha.store.service import CommitLogService
from tools import httpbench, pullbench, remotingbench
from tools.processes import twistd_slave_command

__all__ = ["main", "machine_info"]


def machine_info() -> dict[str, Any]:
    """
    What the figures were measured on.
    """
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(
            os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30), 1
        ),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "free_page_reporting": free_page_reporting(),
    }


#: The guest kernel's free page reporting (virtio-balloon): its settings.
_PAGE_REPORTING = "/sys/module/page_reporting/parameters"
#: Above the buddy allocator's largest order (10 on x86-64): nothing is
#: reported.
_PAGE_REPORTING_OFF = 11


def free_page_reporting(directory: str = _PAGE_REPORTING) -> dict[str, int] | None:
    """
    The guest's free page reporting, when its kernel has it: C{order} (free
    blocks of 2**order pages are reported), C{min_free_ms}, and whether
    it is C{active} (an order the allocator has).  A virtual machine whose
    balloon device reports free pages hands every freed block back to
    the host, which discards it; the next write to that memory is then a
    fault in the host too.  On the 2-core VM that made replication and
    SYNC figures move 2-3x from one run to the next (docs/benchmarks.md,
    "Free page reporting"); C{None} where there is none.
    """
    try:
        with open(os.path.join(directory, "page_reporting_order")) as f:
            order = int(f.read())
        with open(os.path.join(directory, "min_free_ms")) as f:
            min_free_ms = int(f.read())
    except (OSError, ValueError):
        return None
    return {
        "order": order,
        "min_free_ms": min_free_ms,
        "active": int(order < _PAGE_REPORTING_OFF),
    }


def _warn_page_reporting(reporting: dict[str, int] | None) -> None:
    """
    Say so, before a benchmark runs, when freed memory goes back to the
    host (see L{free_page_reporting}), and how to hold that off.
    """
    if reporting is None or not reporting["active"]:
        return
    _progress(
        f"note: free page reporting is on (page_reporting_order {reporting['order']}): "
        "memory a run frees goes back to the host, and figures move 2-3x between runs; "
        f"as root, 'echo {_PAGE_REPORTING_OFF} > {_PAGE_REPORTING}/page_reporting_order' holds it "
        f"off until 'echo {reporting['order']} > ...' (docs/benchmarks.md, 'Free page reporting')"
    )


def _messages(body_size: int, n: int = 16384) -> list[Message]:
    # n is a multiple of every batch size used (powers of two up to 4096),
    # so batches never wrap around the end of the list.
    body = os.urandom(body_size)
    return [
        Message(
            "BenchTopic",
            body,
            queue_id=i % 8,
            properties={
                "UNIQ_KEY": f"7F000001000100000000{i:012X}",
                "TAGS": "TagA",
                "WAIT": "true",
            },
        )
        for i in range(n)
    ]


async def _put_run(
    reactor: Any,
    directory: str,
    count: int,
    messages: list[Message],
    segment_size: int,
    batch_size: int,
) -> dict[str, float]:
    service = CommitLogService(
        lambda: CommitLog.open(
            directory, segment_size=segment_size, clock=reactor.seconds
        ),
        reactor,
    )
    service.startService()
    commitlog = service.commitlog
    assert commitlog is not None
    put, put_batch = commitlog.put, commitlog.put_batch
    n = len(messages)
    turn = 4096  # puts between two reactor turns
    started = time.perf_counter()
    done = 0
    while done < count:
        if batch_size == 1:
            for i in range(done, min(done + turn, count)):
                put(messages[i % n])
        else:
            for i in range(done, min(done + turn, count), batch_size):
                put_batch(messages[i % n : i % n + min(batch_size, count - i)])
        done += turn
        # Let the reactor run the flush loop, as a broker's would.
        await deferLater(reactor, 0, lambda: None)
    elapsed = time.perf_counter() - started
    written = commitlog.max_offset
    await service.stopService()
    return {
        "msgs_per_s": count / elapsed,
        "mb_per_s": written / elapsed / 1e6,
        "seconds": elapsed,
        "bytes": written,
    }


def _read_run(directory: str, chunk: int) -> dict[str, float]:
    with CommitLog.open(directory, read_only=True) as commitlog:
        offset, end = commitlog.min_offset, commitlog.max_offset
        read = commitlog.read
        total = 0
        started = time.perf_counter()
        while offset < end:
            data = read(offset, chunk)
            total += len(data)
            offset += len(data)
        elapsed = time.perf_counter() - started
    return {"gb_per_s": total / elapsed / 1e9, "bytes": total, "seconds": elapsed}


async def _store(reactor: Any, args: argparse.Namespace) -> dict[str, Any]:
    messages = _messages(args.body_size)
    root = tempfile.mkdtemp(prefix="rmqha-bench-", dir=args.dir)
    puts, reads = [], []
    try:
        for run in range(args.runs):
            directory = os.path.join(root, f"run{run}")
            result = await _put_run(
                reactor, directory, args.count, messages, args.segment_size, args.batch
            )
            puts.append(result)
            _progress(
                f"put run {run + 1}/{args.runs}: {result['msgs_per_s']:,.0f} msgs/s, "
                f"{result['mb_per_s']:,.0f} MB/s"
            )
            # Reads from page cache: read once to warm it, then measure.
            _read_run(directory, args.chunk)
            result = _read_run(directory, args.chunk)
            reads.append(result)
            _progress(
                f"read run {run + 1}/{args.runs}: {result['gb_per_s']:.2f} GB/s "
                f"({args.chunk}-byte reads)"
            )
            shutil.rmtree(directory)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "benchmark": "store",
        "machine": machine_info(),
        "count": args.count,
        "body_size": args.body_size,
        "batch": args.batch,
        "runs": args.runs,
        "put_msgs_per_s": statistics.median(r["msgs_per_s"] for r in puts),
        "put_mb_per_s": statistics.median(r["mb_per_s"] for r in puts),
        "put_runs_msgs_per_s": [round(r["msgs_per_s"]) for r in puts],
        "read_gb_per_s": statistics.median(r["gb_per_s"] for r in reads),
        "read_runs_gb_per_s": [round(r["gb_per_s"], 2) for r in reads],
        "read_chunk": args.chunk,
    }


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- replicate ---------------------------------------------------------------


def _rss() -> int:
    """
    This process's resident set size, in bytes.
    """
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _spawn(*args: str) -> "subprocess.Popen[str]":
    import subprocess

    # The helper runs this module again: put its checkout first on the
    # path, wherever the benchmark was started from.
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(p for p in (checkout, os.environ.get("PYTHONPATH")) if p)
    return subprocess.Popen(
        [sys.executable, "-m", "tools.bench", *args],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=path),
    )


def _json_line(process: "subprocess.Popen[str]") -> dict[str, Any]:
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        raise RuntimeError(f"benchmark helper {process.args!r} ended without output")
    result: dict[str, Any] = json.loads(line)
    return result


def _serve_master(store: str, tls: str | None = None) -> None:
    """
    A master on 127.0.0.1:0 (mutual TLS with the C{rmqha certs init} set
    in directory C{tls}, if given); prints its port, then (at SIGTERM) its
    idle and maximum RSS, sampled every 50 ms.
    """
    from twisted.internet import reactor
    from twisted.internet.task import LoopingCall

    import attrs

    from rmqha.broker import Broker, Role
    from rmqha.settings import BrokerSettings
    from rmqha.tls import server_endpoint

    settings = BrokerSettings(role=Role.MASTER, ha_listen="tcp:0:interface=127.0.0.1")
    if tls is not None:
        settings = BrokerSettings(
            role=Role.MASTER,
            tls_cert=f"{tls}/master.pem",
            tls_key=f"{tls}/master.key",
            tls_ca=f"{tls}/ca.pem",
            tls_require_client_cert=True,
            tls_allowed_peers=frozenset({"slave"}),
            ha_listen="ssl:0:interface=127.0.0.1",
        )
        listen = server_endpoint(
            reactor, "ssl:0:interface=127.0.0.1", settings.tls_files, settings.peer_policy
        )
        settings = attrs.evolve(settings, ha_listen=listen)
    broker = Broker(
        settings,
        reactor=reactor,
        open_commitlog=lambda: CommitLog.open(store, read_only=False, clock=reactor.seconds),
    )
    samples = {"idle": _rss(), "max": 0, "cpu": 0.0}

    def sample() -> None:
        samples["max"] = max(samples["max"], _rss())

    def report() -> None:
        # (CPU seconds since listening: what serving the slave cost.)
        cpu = time.process_time() - samples["cpu"]
        print(
            json.dumps({"idle_rss": samples["idle"], "max_rss": samples["max"], "cpu": cpu}),
            flush=True,
        )

    def started(address: Any) -> None:
        samples["idle"] = _rss()
        samples["cpu"] = time.process_time()
        print(json.dumps({"port": address.port}), flush=True)

    broker.startService()
    broker.ha_address().addCallback(started)
    sampler = LoopingCall(sample)
    sampler.clock = reactor
    sampler.start(0.05)
    reactor.addSystemEventTrigger("before", "shutdown", report)
    reactor.addSystemEventTrigger("before", "shutdown", broker.stopService)
    reactor.run()


def _run_slave(
    store: str,
    port: int,
    target: int,
    throttle: float,
    seconds: float,
    tls: str | None = None,
    checked: bool = False,
    segment_size: int | None = None,
) -> None:
    """
    A slave following 127.0.0.1:PORT until it holds TARGET bytes (or, when
    throttled to THROTTLE bytes/s, for SECONDS); prints the time, the bytes
    and its maximum RSS.  C{checked}: with checked framing.

    The time is measured as the raw ceiling's is (from the accepted
    connection to the last byte): from this slave's connection to the
    append that reaches TARGET (C{seconds}); C{seconds_from_start} is from
    before it connects to the poll that saw it done (what was reported
    before 2026-11-23).
    """
    from twisted.internet import reactor
    from twisted.internet.endpoints import clientFromString
    from twisted.internet.task import LoopingCall

    from rmqha.ha.config import HAConfig
    from rmqha.ha.slave import SlaveConnection, SlaveFactory, make_slave_service

    if tls is None:
        endpoint = clientFromString(reactor, f"tcp:host=127.0.0.1:port={port}")
    else:
        # Before the clock starts: importing the TLS stack takes a while.
        from rmqha.tls import TLSFiles, client_endpoint

        files = TLSFiles(f"{tls}/slave-slave.pem", f"{tls}/slave-slave.key", f"{tls}/ca.pem")
        endpoint = client_endpoint(reactor, "127.0.0.1", port, files)
    # The master's segment size: a slave's must be its master's.
    commitlog = CommitLog.open(store, segment_size=segment_size, clock=reactor.seconds)
    started = time.perf_counter()
    cpu_started = time.process_time()
    state = {"max_rss": 0, "done": False}
    window: dict[str, float] = {}

    def appended(end: int) -> None:
        if end >= target and "end" not in window:
            window["end"] = time.perf_counter()
            window["bytes"] = end

    commitlog.observe_appends(appended)

    class Timed(SlaveConnection):
        def connectionMade(self) -> None:
            window.setdefault("start", time.perf_counter())
            super().connectionMade()

    class Throttled(Timed):
        def dataReceived(self, data: bytes) -> None:
            super().dataReceived(data)
            allowed = throttle * (time.perf_counter() - started)
            excess = self.factory.bytes_received - allowed
            if excess > 0 and not self._closed:
                self.transport.pauseProducing()  # type: ignore[union-attr]
                reactor.callLater(excess / throttle, self.transport.resumeProducing)  # type: ignore[union-attr]

    class Factory(SlaveFactory):
        def buildProtocol(self, addr: Any) -> SlaveConnection:
            return Throttled(self) if throttle else Timed(self)

    factory = Factory(commitlog, reactor, HAConfig())
    factory.checked = checked
    service = make_slave_service(endpoint, factory, reactor)

    def check() -> None:
        state["max_rss"] = max(state["max_rss"], _rss())
        elapsed = time.perf_counter() - started
        if state["done"]:
            return
        if commitlog.max_offset >= target or (throttle and elapsed >= seconds):
            state["done"] = True
            reached = "end" in window and "start" in window
            print(
                json.dumps(
                    {
                        "seconds": window["end"] - window["start"] if reached else elapsed,
                        "bytes": window["bytes"] if reached else commitlog.max_offset,
                        "seconds_from_start": elapsed,
                        "max_rss": state["max_rss"],
                        "cpu": time.process_time() - cpu_started,
                    }
                ),
                flush=True,
            )
            service.stopService().addBoth(lambda _: commitlog.close()).addBoth(
                lambda _: reactor.stop()
            )

    service.startService()
    poll = LoopingCall(check)
    poll.clock = reactor
    poll.start(0.01)
    reactor.run()


def _raw_receive(path: str) -> None:
    """
    The raw ceiling's receiving end: accept one connection on 127.0.0.1:0
    (port printed), write everything into PATH, print bytes and seconds.
    """
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    print(json.dumps({"port": server.getsockname()[1]}), flush=True)
    conn, _ = server.accept()
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    total = 0
    started, cpu = time.perf_counter(), time.process_time()
    with open(path, "wb") as f:
        while True:
            n = conn.recv_into(buf)
            if not n:
                break
            f.write(view[:n])
            total += n
    print(
        json.dumps(
            {
                "bytes": total,
                "seconds": time.perf_counter() - started,
                "cpu": time.process_time() - cpu,
            }
        ),
        flush=True,
    )


def _raw_send(store: str, port: int) -> None:
    import socket

    directory = os.path.join(store, "commitlog")
    sock = socket.create_connection(("127.0.0.1", port))
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            while chunk := f.read(1 << 20):
                sock.sendall(chunk)
    sock.close()


def _replicate(args: argparse.Namespace) -> dict[str, Any]:
    checked = args.framing == "checked"
    root = tempfile.mkdtemp(prefix="rmqha-bench-", dir=args.dir)
    master_store = os.path.join(root, "master")
    try:
        from rmqha.cli import fill

        _progress(f"filling a {args.size / (1 << 30):.2f} GiB backlog ...")
        with CommitLog.open(master_store, segment_size=args.segment_size) as log:
            fill(log, args.size // 1141 + 1, 1024, ["BenchTopic"], 8)
            target = log.max_offset
        # Page cache and fresh memory warm for every variant alike.
        _backlog_warm_up(root, master_store)
        raw: list[float] = []
        raw_cpu: list[dict[str, float]] = []
        rmq: list[dict[str, Any]] = []
        for run in range(args.runs):
            # Alternate the order, so that neither variant always runs
            # just after the other's writes.
            for variant in ("raw", "rmqha") if run % 2 == 0 else ("rmqha", "raw"):
                _settle()
                if variant == "raw":
                    raw_cpu.append(_raw_run(root, master_store))
                    raw.append(raw_cpu[-1]["mb_per_s"])
                    _progress(
                        f"run {run + 1}: raw ceiling {raw[-1]:,.0f} MB/s; MB per CPU second: "
                        f"receiver {raw_cpu[-1]['receiver_mb_per_cpu_s']:,.0f}, sender "
                        f"{raw_cpu[-1]['sender_mb_per_cpu_s']:,.0f}"
                    )
                else:
                    rmq.append(_rmqha_run(root, master_store, target, checked=checked))
                    r = rmq[-1]
                    _progress(
                        f"run {run + 1}: rmqha {r['mb_per_s']:,.0f} MB/s; master RSS "
                        f"{r['master_idle_rss'] >> 20} -> {r['master_max_rss'] >> 20} MiB, "
                        f"slave RSS {r['slave_max_rss'] >> 20} MiB; MB per CPU second: "
                        f"slave {r['slave_mb_per_cpu_s']:,.0f}, master "
                        f"{r['master_mb_per_cpu_s']:,.0f}"
                    )
        # A slave throttled to 1 MB/s: the master must not buffer for it.
        slave_store = os.path.join(root, "slow-slave")
        master = _spawn("_serve-master", master_store)
        port = _json_line(master)["port"]
        slave = _spawn(
            "_run-slave", slave_store, str(port), str(target), str(args.throttle),
            str(args.throttle_seconds), *(("--checked",) if checked else ()),
            "--segment-size", str(_segment_size(master_store)),
        )
        slow = _json_line(slave)
        slave.wait()
        master.terminate()
        slow_memory = _json_line(master)
        master.wait()
        _progress(
            f"throttled slave: {slow['bytes'] / slow['seconds'] / 1e6:.2f} MB/s for "
            f"{slow['seconds']:.0f} s; master RSS {slow_memory['idle_rss'] >> 20} -> "
            f"{slow_memory['max_rss'] >> 20} MiB"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    median_raw = statistics.median(raw)
    median_rmq = statistics.median(r["mb_per_s"] for r in rmq)
    return {
        "benchmark": "replicate",
        "machine": machine_info(),
        "framing": args.framing,
        "backlog_bytes": target,
        "runs": args.runs,
        "raw_mb_per_s": median_raw,
        "rmqha_mb_per_s": median_rmq,
        "fraction_of_raw": median_rmq / median_raw,
        "paired_fractions": [round(r["mb_per_s"] / x, 2) for r, x in zip(rmq, raw)],
        "raw_runs": [round(x) for x in raw],
        "rmqha_runs": [round(r["mb_per_s"]) for r in rmq],
        "rmqha_runs_from_start": [round(r["mb_per_s_from_start"]) for r in rmq],
        "slave_mb_per_cpu_s": statistics.median(r["slave_mb_per_cpu_s"] for r in rmq),
        "master_mb_per_cpu_s": statistics.median(r["master_mb_per_cpu_s"] for r in rmq),
        # The raw copy's processes, per CPU second: what the machine's
        # load moves least (the raw ceiling's MB/s moved 1.0-3.4 GB/s on
        # the VM); rmqha's slave and master against them.
        "raw_receiver_mb_per_cpu_s": statistics.median(
            r["receiver_mb_per_cpu_s"] for r in raw_cpu
        ),
        "raw_sender_mb_per_cpu_s": statistics.median(r["sender_mb_per_cpu_s"] for r in raw_cpu),
        "slave_cpu_fraction_of_raw": statistics.median(r["slave_mb_per_cpu_s"] for r in rmq)
        / statistics.median(r["receiver_mb_per_cpu_s"] for r in raw_cpu),
        "master_cpu_fraction_of_raw": statistics.median(r["master_mb_per_cpu_s"] for r in rmq)
        / statistics.median(r["sender_mb_per_cpu_s"] for r in raw_cpu),
        "master_rss_growth_mib": max(
            (r["master_max_rss"] - r["master_idle_rss"]) >> 20 for r in rmq
        ),
        "master_max_rss_mib": max(r["master_max_rss"] for r in rmq) >> 20,
        "slave_max_rss_mib": max(r["slave_max_rss"] for r in rmq) >> 20,
        "throttled_mb_per_s": slow["bytes"] / slow["seconds"] / 1e6,
        "throttled_master_rss_growth_mib": (slow_memory["max_rss"] - slow_memory["idle_rss"]) >> 20,
    }


#: A scrub walk, run in a checkout's own process (C{-c}, its C{rmqha} first
#: on the path): every record of the store in argv[1] through check_chunk in
#: 1 MiB steps, each read with its own C{pread} as the scrub's worker thread
#: reads it (the page cache warm: no C{fadvise}).
_SCRUB_WALK = """
import json, os, sys, time
from rmqha.store.commitlog import CommitLog
from rmqha.store.scrub import check_chunk
store = sys.argv[1]
with CommitLog.open(store, read_only=True) as log:
    size, end = log.segment_size, log.max_offset
directory = os.path.join(store, "commitlog")
names = sorted(os.listdir(directory))
def walk():
    records = read = 0
    for name in names:
        start = int(name)
        fd = os.open(os.path.join(directory, name), os.O_RDONLY)
        limit = min(start + size, end)
        at, anchored, searching = start, False, False
        while at < limit:
            step = min(1 << 20, limit - at)
            result = check_chunk(
                os.pread(fd, step, at - start), at, segment_start=start,
                segment_size=size, limit=limit, anchored=anchored, searching=searching,
            )
            assert not result.findings, result.findings
            records += result.records
            read += step
            anchored = result.anchor is not None
            at, searching = (result.anchor if anchored else result.next_offset), result.searching
            if result.next_offset >= limit:
                break
        os.close(fd)
    return records, read
walk()
cpu = time.process_time()
records, read = walk()
print(json.dumps({"records": records, "bytes": read, "cpu": time.process_time() - cpu}))
"""


def _scrub(args: argparse.Namespace) -> dict[str, Any]:
    """
    The scrub's check over one store, in this checkout and in
    C{--against}, alternating (see the module docstring).
    """
    from rmqha.store.scrub import DEFAULT_SCRUB_RATE

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    checkouts = {"this": here}
    if args.against:
        checkouts["against"] = os.path.abspath(args.against)
    root = os.path.abspath(tempfile.mkdtemp(prefix="rmqha-bench-", dir=args.dir))
    store = os.path.join(root, "store")
    figures: dict[str, list[dict[str, float]]] = {name: [] for name in checkouts}
    try:
        from rmqha.cli import fill

        _progress(f"filling {args.size / (1 << 20):,.0f} MiB of {args.body_size}-byte bodies ...")
        with CommitLog.open(store, segment_size=args.segment_size) as log:
            fill(log, args.size // (args.body_size + 117) + 1, args.body_size, ["BenchTopic"], 8)
        for run in range(args.runs):
            order = list(checkouts) if run % 2 == 0 else list(reversed(checkouts))
            for name in order:
                done = subprocess.run(
                    [sys.executable, "-c", _SCRUB_WALK, store],
                    env=dict(os.environ, PYTHONPATH=checkouts[name]),
                    capture_output=True, text=True, check=True, cwd=checkouts[name],
                )
                walked = json.loads(done.stdout.splitlines()[-1])
                cpu = max(walked["cpu"], 1e-9)
                figures[name].append({
                    "mb_per_cpu_s": walked["bytes"] / cpu / 1e6,
                    "us_per_record": cpu / max(walked["records"], 1) * 1e6,
                    "records": walked["records"],
                })
                _progress(
                    f"run {run + 1}, {name}: {figures[name][-1]['mb_per_cpu_s']:,.0f} MB per CPU "
                    f"second, {figures[name][-1]['us_per_record']:.2f} us a record"
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result: dict[str, Any] = {"benchmark": "scrub", "machine": machine_info(), "runs": args.runs}
    for name, runs in figures.items():
        rate = statistics.median(r["mb_per_cpu_s"] for r in runs)
        result[name] = {
            "mb_per_cpu_s": rate,
            "us_per_record": statistics.median(r["us_per_record"] for r in runs),
            "records": runs[0]["records"],
            # (What the default rate costs when the scrub is not held to
            # MAX_BUSY: a core's share.)
            "core_share_at_default_rate": DEFAULT_SCRUB_RATE / 1e6 / rate,
        }
    if "against" in result:
        result["speedup"] = result["this"]["mb_per_cpu_s"] / result["against"]["mb_per_cpu_s"]
    return result


def _segment_size(store: str) -> int:
    """
    The segment size of the master's C{store}, which its slave must use
    (a slave with another one halts: docs/replication.md).
    """
    with CommitLog.open(store, read_only=True) as log:
        return log.segment_size


def _settle() -> None:
    """
    Write back what earlier phases left dirty, so it does not slow the
    next measured transfer down.
    """
    os.sync()
    time.sleep(1)


def _raw_run(root: str, master_store: str) -> dict[str, float]:
    """
    One raw socket-to-file copy of the master's segment files: MB/s, and
    MB per CPU second of the receiving process and of the sender (this
    process, doing nothing else meanwhile).
    """
    out = os.path.join(root, "raw.bin")
    receiver = _spawn("_raw-receive", out)
    port = _json_line(receiver)["port"]
    cpu = time.process_time()
    _raw_send(master_store, port)
    sender_cpu = time.process_time() - cpu
    result = _json_line(receiver)
    receiver.wait()
    os.unlink(out)
    size = result["bytes"]
    return {
        "mb_per_s": size / result["seconds"] / 1e6,
        "receiver_mb_per_cpu_s": size / max(result["cpu"], 1e-9) / 1e6,
        "sender_mb_per_cpu_s": size / max(sender_cpu, 1e-9) / 1e6,
    }


def _rmqha_run(
    root: str, master_store: str, target: int, tls: str | None = None, checked: bool = False
) -> dict[str, Any]:
    slave_store = os.path.join(root, "slave")
    extra = ("--tls", tls) if tls is not None else ()
    master = _spawn("_serve-master", master_store, *extra)
    port = _json_line(master)["port"]
    framing = ("--checked",) if checked else ()
    slave = _spawn(
        "_run-slave", slave_store, str(port), str(target), "0", "0", *extra, *framing,
        "--segment-size", str(_segment_size(master_store)),
    )
    result = _json_line(slave)
    slave.wait()
    master.terminate()
    memory = _json_line(master)
    master.wait()
    shutil.rmtree(slave_store)
    return {
        "mb_per_s": result["bytes"] / result["seconds"] / 1e6,
        # (The window reported before 2026-11-23: connecting and the poll's
        # delay included.)
        "mb_per_s_from_start": result["bytes"] / result["seconds_from_start"] / 1e6,
        # MB per CPU second of each process: what a shared machine's load
        # changes least (the wall-clock figure is the scheduler's too).
        "slave_mb_per_cpu_s": result["bytes"] / max(result["cpu"], 1e-9) / 1e6,
        "master_mb_per_cpu_s": result["bytes"] / max(memory["cpu"], 1e-9) / 1e6,
        "master_idle_rss": memory["idle_rss"],
        "master_max_rss": memory["max_rss"],
        "slave_max_rss": result["max_rss"],
    }


#: The paired comparisons: the baseline's options, then the other's.
_PAIRED: dict[str, dict[str, dict[str, Any]]] = {
    "tls": {"tcp": {}, "tls": {"tls": True}},
    "framing": {"classic": {}, "checked": {"checked": True}},
}


def _paired(
    args: argparse.Namespace, name: str, variants: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """
    Replication of the same backlog by two variants of the slave and master
    (keyword arguments of L{_rmqha_run}), runs alternating in one
    invocation, so the machine's drift hits both alike.  C{"tls"} in a
    variant's options is replaced by a fresh certificate directory.
    """
    from rmqha import certs
    from rmqha.cli import fill

    (base, other) = variants
    root = tempfile.mkdtemp(prefix="rmqha-bench-", dir=args.dir)
    master_store = os.path.join(root, "master")
    tls_dir = os.path.join(root, "certs")
    try:
        certs.init(tls_dir, "master", ["slave"])
        _progress(f"filling a {args.size / (1 << 30):.2f} GiB backlog ...")
        with CommitLog.open(master_store, segment_size=args.segment_size) as log:
            fill(log, args.size // 1141 + 1, 1024, ["BenchTopic"], 8)
            target = log.max_offset
        _backlog_warm_up(root, master_store)
        runs: dict[str, list[float]] = {base: [], other: []}
        cpu: dict[str, list[tuple[float, float]]] = {base: [], other: []}
        for run in range(args.runs):
            for variant in (base, other) if run % 2 == 0 else (other, base):
                options = dict(variants[variant])
                if options.get("tls"):
                    options["tls"] = tls_dir
                _settle()
                r = _rmqha_run(root, master_store, target, **options)
                runs[variant].append(r["mb_per_s"])
                cpu[variant].append((r["slave_mb_per_cpu_s"], r["master_mb_per_cpu_s"]))
                _progress(
                    f"run {run + 1}: {variant} {r['mb_per_s']:,.0f} MB/s; master RSS "
                    f"{r['master_idle_rss'] >> 20} -> {r['master_max_rss'] >> 20} MiB, slave "
                    f"RSS {r['slave_max_rss'] >> 20} MiB; MB per CPU second: slave "
                    f"{r['slave_mb_per_cpu_s']:,.0f}, master {r['master_mb_per_cpu_s']:,.0f}"
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    first, second = statistics.median(runs[base]), statistics.median(runs[other])
    return {
        "benchmark": name,
        "machine": machine_info(),
        "backlog_bytes": target,
        "runs": args.runs,
        f"{base}_mb_per_s": first,
        f"{other}_mb_per_s": second,
        f"{other}_fraction_of_{base}": second / first,
        "paired_fractions": [round(t / c, 2) for t, c in zip(runs[other], runs[base])],
        f"{base}_runs": [round(x) for x in runs[base]],
        f"{other}_runs": [round(x) for x in runs[other]],
        **{
            f"{variant}_{side}_mb_per_cpu_s": statistics.median(c[i] for c in cpu[variant])
            for variant in (base, other)
            for i, side in enumerate(("slave", "master"))
        },
    }


#: The columns the Spark benchmark's query reads (C{--prune}: the only
#: ones read, on both sides).
_SPARK_QUERY_COLUMNS = ("size", "body", "crc_ok")


def _spark_scan(
    store: str,
    master: str,
    bodies: str = "true",
    split_bytes: str | None = None,
    prune: bool = False,
    reader_kind: str = "python",
    queries: int = 2,
) -> None:
    """
    C{queries} Spark scans (at least two) of C{store} on C{master}, by
    the Python data source (C{reader_kind} C{python}:
    C{spark.read.format("rocketmq-commitlog")}) or the JVM span reader
    (C{jvm}: L{read_store}, which must pick it), after a warm-up query on
    a small slice in many partitions (so every Python worker is started):
    prints, as JSON, the seconds, CPU and totals of the warm queries'
    median (the 2nd to the last) and the seconds and CPU of the first
    (C{first_seconds}, C{first_cpu_s}).  A fresh JVM compiles the query's
    row path while the first scan runs (2-3 s of JIT CPU on two cores,
    more than the scan's own work), and keeps compiling over the next
    few: the later queries are the steady state a longer job runs at.
    With C{prune}, the reader is given a schema of the query's
    columns only (L{_SPARK_QUERY_COLUMNS}).
    """
    from pyspark.sql import functions as F

    from rmqha.pipeline.scan import SCHEMA_DDL
    from rmqha.pipeline.source import jvm_reader, read_store, spark_session

    spark = spark_session(master, app_name=f"rmqha bench {master}")
    if reader_kind == "jvm" and not jvm_reader(spark):
        raise SystemExit("bench: --reader jvm, but the session has no JVM span reader")
    if reader_kind == "jvm":
        read_store(spark, store, endOffset="2000000", splitBytes="100k").count()
    else:
        (
            spark.read.format("rocketmq-commitlog")
            .option("endOffset", "2000000")
            .option("splitBytes", "100k")
            .load(store)
            .count()
        )

    def load() -> Any:
        if reader_kind == "jvm":
            options = {"bodies": bodies}
            if split_bytes is not None:
                options["splitBytes"] = split_bytes
            return read_store(
                spark, store, columns=_SPARK_QUERY_COLUMNS if prune else None, **options
            )
        reader = spark.read.format("rocketmq-commitlog").option("bodies", bodies)
        if prune:
            ddl = dict(column.split(" ", 1) for column in SCHEMA_DDL.split(", "))
            reader = reader.schema(", ".join(f"{c} {ddl[c]}" for c in _SPARK_QUERY_COLUMNS))
        if split_bytes is not None:
            reader = reader.option("splitBytes", split_bytes)
        return reader.load(store)

    def timed() -> tuple[float, dict[str, float], Any]:
        cpu_before = _descendants_cpu()
        started = time.perf_counter()
        row = (
            load()
            .agg(F.count("*"), F.sum("size"), F.sum(F.length("body")),
                 F.sum(F.col("crc_ok").cast("int")))
            .collect()[0]
        )
        elapsed = time.perf_counter() - started
        cpu_after = _descendants_cpu()
        cpu = {k: round(cpu_after.get(k, 0.0) - cpu_before.get(k, 0.0), 2) for k in cpu_after}
        return elapsed, cpu, row

    first, first_cpu, _ = timed()
    # Warm queries: the median of the 2nd to the last, and its CPU.
    warm = sorted((timed() for _ in range(max(1, queries - 1))), key=lambda t: t[0])
    elapsed, cpu, row = warm[(len(warm) - 1) // 2]
    print(
        json.dumps({
            "seconds": elapsed, "records": row[0], "bytes": row[1], "cpu_s": cpu,
            "first_seconds": first, "first_cpu_s": first_cpu,
        }),
        flush=True,
    )
    spark.stop()


def _descendants_cpu() -> dict[str, float]:
    """
    CPU seconds (user + system) so far of this process's descendants, by
    kind: C{jvm} (Spark's driver and executor), C{python_workers} (the
    Python workers that run the data source's reads), C{other} (Spark's
    planning workers): where a Spark query's time goes besides waiting.
    """
    tick = os.sysconf("SC_CLK_TCK")
    table: dict[int, tuple[int, float, str]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        table[int(name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick, command)
    totals = {"jvm": 0.0, "python_workers": 0.0, "other": 0.0}
    parents = [os.getpid()]
    while parents:
        parent = parents.pop()
        for pid, (ppid, seconds, command) in table.items():
            if ppid != parent:
                continue
            parents.append(pid)
            if "java" in command.split(" ", 1)[0]:
                totals["jvm"] += seconds
            elif "pyspark.worker" in command:
                totals["python_workers"] += seconds
            else:
                totals["other"] += seconds
    return totals


def _plain_scan(store: str, bodies: bool = True, prune: bool = False) -> dict[str, Any]:
    from rmqha.pipeline.scan import scan

    import pyarrow.compute as pc

    started = time.perf_counter()
    cpu = time.process_time()
    records = size = 0
    for batch in scan(store, bodies=bodies, columns=_SPARK_QUERY_COLUMNS if prune else None):
        records += batch.num_rows
        # (Not to_pylist: a Python int per record would be the bench's cost.)
        size += pc.sum(batch.column("size")).as_py() or 0
    return {
        "seconds": time.perf_counter() - started,
        "records": records,
        "bytes": size,
        "cpu_s": {"python": round(time.process_time() - cpu, 2)},
    }


def _crc_ceiling(store: str) -> dict[str, float]:
    """
    C{zlib.crc32} over every segment file of C{store}, read whole from the
    page cache: the work a reader that checks every body cannot skip
    (issue 15: the readers must reach a quarter of it).
    """
    directory = os.path.join(store, "commitlog")
    seconds = 0.0
    size = 0
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            data = f.read()
        started = time.perf_counter()
        zlib.crc32(data)
        seconds += time.perf_counter() - started
        size += len(data)
        del data
    return {"seconds": seconds, "bytes": size}


def _check_scan(store: str) -> dict[str, float]:
    """
    C{rmqha store check}'s work (L{verify_store}: every record, body CRC
    included) in this process.
    """
    from rmqha.store._recovery import verify_store

    started = time.perf_counter()
    report = verify_store(store)
    elapsed = time.perf_counter() - started
    if not report.ok:
        raise RuntimeError(f"store check: {report.error}")
    return {
        "seconds": elapsed,
        "records": report.records,
        "bytes": report.end_offset - report.min_offset,
    }


def _spark_bench(args: argparse.Namespace) -> dict[str, Any]:
    """
    Scan + decode of one store: the plain single-process reader, and Spark
    with local[1] and local[2], runs alternating.
    """
    from rmqha.cli import fill

    root = tempfile.mkdtemp(prefix="rmqha-bench-", dir=args.dir)
    store = os.path.join(root, "store")
    try:
        _progress(f"filling a {args.size / (1 << 30):.2f} GiB store ...")
        with CommitLog.open(store, segment_size=args.segment_size) as log:
            fill(log, args.size // 1141 + 1, 1024, ["orders", "payments", "audit"], 8)
        _raw_read_all(store)
        readers = ["python", "jvm"] if args.reader == "both" else [args.reader]
        spark_variants = [
            f"{'jvm ' if reader == 'jvm' else ''}local[{n}]" for reader in readers for n in (1, 2)
        ]
        order = ["plain", *spark_variants, "check", "crc32"]
        runs: dict[str, list[dict[str, Any]]] = {variant: [] for variant in order}
        for run in range(args.runs):
            for variant in order if run % 2 == 0 else order[::-1]:
                if variant == "plain":
                    result = _plain_scan(store, args.bodies == "true", args.prune)
                elif variant == "check":
                    result = _check_scan(store)
                elif variant == "crc32":
                    result = _crc_ceiling(store)
                else:
                    split = ["--split-bytes", args.split_bytes] if args.split_bytes else []
                    prune = ["--prune"] if args.prune else []
                    reader = "jvm" if variant.startswith("jvm ") else "python"
                    process = _spawn(
                        "_spark-scan", store, variant.split(" ")[-1], "--bodies", args.bodies,
                        "--reader", reader, "--queries", str(args.queries), *split, *prune,
                    )
                    result = _json_line(process)
                    process.wait()
                runs[variant].append(result)
                _progress(
                    f"run {run + 1}: {variant}: {result['bytes'] / result['seconds'] / 1e6:,.0f} "
                    f"MB/s, {result.get('records', 0) / result['seconds']:,.0f} records/s "
                    f"({result['seconds']:.1f} s)"
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out: dict[str, Any] = {
        "benchmark": "spark",
        "machine": machine_info(),
        "runs": args.runs,
        "bodies": args.bodies == "true",
        "split_bytes": args.split_bytes or "default",
        "columns": list(_SPARK_QUERY_COLUMNS) if args.prune else "all",
        "readers": readers,
    }
    for variant, results in runs.items():
        seconds = statistics.median(r["seconds"] for r in results)
        key = variant.replace("[", "").replace("]", "").replace(" ", "_")
        out[f"{key}_seconds"] = seconds
        out[f"{key}_mb_per_s"] = results[0]["bytes"] / seconds / 1e6
        if "records" in results[0]:
            out[f"{key}_records_per_s"] = results[0]["records"] / seconds
        out[f"{key}_runs_s"] = [round(r["seconds"], 2) for r in results]
        if "cpu_s" in results[0]:
            # Spark's CPU seconds per query by process kind (medians).
            out[f"{key}_cpu_s"] = {
                kind: round(statistics.median(r["cpu_s"][kind] for r in results), 2)
                for kind in results[0]["cpu_s"]
            }
        if "first_seconds" in results[0]:
            # The same query as the first in a fresh JVM (JIT included).
            first = statistics.median(r["first_seconds"] for r in results)
            out[f"{key}_first_seconds"] = first
            out[f"{key}_first_mb_per_s"] = results[0]["bytes"] / first / 1e6
            out[f"{key}_first_runs_s"] = [round(r["first_seconds"], 2) for r in results]
            out[f"{key}_first_cpu_s"] = {
                kind: round(statistics.median(r["first_cpu_s"][kind] for r in results), 2)
                for kind in results[0]["first_cpu_s"]
            }
    out["store_bytes"] = runs["plain"][0]["bytes"]
    out["records"] = runs["plain"][0]["records"]
    # jvm_*: the JVM span reader; the unprefixed keys: the Python source.
    for prefix in ("jvm_" if reader == "jvm" else "" for reader in readers):
        one, two = out[f"{prefix}local1_seconds"], out[f"{prefix}local2_seconds"]
        first_one = out[f"{prefix}local1_first_seconds"]
        out[f"{prefix}local2_speedup_over_local1"] = one / two
        out[f"{prefix}local1_fraction_of_plain"] = out["plain_seconds"] / one
        out[f"first_{prefix}local2_speedup_over_local1"] = (
            first_one / out[f"{prefix}local2_first_seconds"]
        )
        out[f"first_{prefix}local1_fraction_of_plain"] = out["plain_seconds"] / first_one
    # The readers against zlib.crc32 over the same bytes (issue 15, item 3).
    out["plain_fraction_of_crc32"] = out["plain_mb_per_s"] / out["crc32_mb_per_s"]
    out["check_fraction_of_crc32"] = out["check_mb_per_s"] / out["crc32_mb_per_s"]
    out["codec"] = "compiled" if ACCELERATED else "pure Python"
    return out


def _source_scan(store: str, session: str, queries: int) -> None:
    """
    The rmqha data source's scans in one fresh C{local[2]} session, printed
    as one JSON line: C{session} C{helper} is L{spark_session} and
    L{read_store} (the JVM reader as the jobs use it); C{plain} a plain
    C{SparkSession.builder} with only the jar on C{spark.jars} and
    C{spark.read.format("rmqha")}.  Each query writes every column of
    every row to Spark's C{noop} sink (the whole scan, no output): the
    store, and the store filtered to one topic of four (a pushed filter).
    After a warm-up, the median of C{queries} of each, alternating.
    """
    from pyspark.sql import SparkSession

    from rmqha.pipeline._jar import ensure_jar
    from rmqha.pipeline.source import read_store, spark_session

    if session == "helper":
        spark = spark_session("local[2]", app_name="rmqha bench source")

        def load() -> Any:
            return read_store(spark, store)
    else:
        jar, why = ensure_jar()
        if jar is None:
            raise SystemExit(f"bench: no jar: {why}")
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        spark = (
            SparkSession.builder.master("local[2]").config("spark.jars", jar)
            .config("spark.ui.enabled", "false").getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")

        def load() -> Any:
            return spark.read.format("rmqha").load(store)

    def timed(where: str | None) -> float:
        df = load() if where is None else load().where(where)
        started = time.perf_counter()
        df.write.format("noop").mode("overwrite").save()
        return time.perf_counter() - started

    timed(None)
    timed("topic = 'orders'")
    scans: list[float] = []
    filtered: list[float] = []
    for _ in range(queries):
        scans.append(timed(None))
        filtered.append(timed("topic = 'orders'"))
    records = load().count()
    print(json.dumps({
        "scan_seconds": statistics.median(scans),
        "topic_seconds": statistics.median(filtered),
        "records": records,
    }), flush=True)
    spark.stop()


def _source_bench(args: argparse.Namespace) -> dict[str, Any]:
    """
    C{format("rmqha")} from a session the user built (plain
    C{SparkSession.builder} + the jar) against the JVM reader as the jobs
    use it (L{spark_session}, L{read_store}), and a topic filter on one
    topic of four against the unfiltered scan: fresh JVMs each, the two
    sessions alternating, one store.
    """
    from rmqha.cli import fill

    root = tempfile.mkdtemp(prefix="rmqha-bench-", dir=args.dir)
    store = os.path.join(root, "store")
    try:
        _progress(f"filling a {args.size / (1 << 20):.0f} MiB store, 4 topics ...")
        count = args.size // (args.body_size + 130) + 1
        with CommitLog.open(store, segment_size=args.segment_size) as log:
            fill(log, count, args.body_size, ["orders", "payments", "audit", "metrics"], 8)
        _raw_read_all(store)
        runs: dict[str, list[dict[str, Any]]] = {"helper": [], "plain": []}
        for run in range(args.runs):
            for session in ("helper", "plain") if run % 2 == 0 else ("plain", "helper"):
                process = _spawn("_source-scan", store, session, "--queries", str(args.queries))
                result = _json_line(process)
                process.wait()
                runs[session].append(result)
                _progress(
                    f"run {run + 1}: {session}: scan {result['scan_seconds']:.2f} s, "
                    f"one topic of four {result['topic_seconds']:.2f} s"
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)

    def median(session: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[session])

    return {
        "benchmark": "source",
        "machine": machine_info(),
        "runs": args.runs,
        "queries": args.queries,
        "store_bytes": args.size,
        "records": runs["plain"][0]["records"],
        "helper_scan_seconds": median("helper", "scan_seconds"),
        "plain_scan_seconds": median("plain", "scan_seconds"),
        "plain_topic_seconds": median("plain", "topic_seconds"),
        "helper_topic_seconds": median("helper", "topic_seconds"),
        # >= 0.95 wanted: the user's own session as fast as the jobs' one.
        "plain_fraction_of_helper": median("helper", "scan_seconds")
        / median("plain", "scan_seconds"),
        # >= 3 wanted: one topic of four, pushed, against the whole scan.
        "topic_speedup": median("plain", "scan_seconds") / median("plain", "topic_seconds"),
        "runs_s": {k: [round(r["scan_seconds"], 2) for r in v] for k, v in runs.items()},
    }


def _paced_master(store: str, http_port: str, rate: str, seconds: str, body_size: str) -> None:
    """
    A master broker as C{twistd rmqha} builds it (L{build_service}: the
    admin HTTP port on 127.0.0.1:C{http_port}, serving its commit log),
    putting C{rate} messages a second of C{body_size} bytes (four topics)
    through L{Broker.put} for C{seconds} seconds, in steps of 5 ms; prints
    C{{"t": time.time(), "end": max_offset, "puts": n}} every 50 ms, then
    C{{"done": true, ...}}.
    """
    import random

    from twisted.internet import reactor
    from twisted.internet.task import LoopingCall

    from rmqha.assemble import build_service
    from rmqha.broker import Role
    from rmqha.settings import BrokerSettings

    settings = BrokerSettings(
        role=Role.MASTER, store_dir=store, ha_listen="tcp:0:interface=127.0.0.1",
        http=f"tcp:{http_port}:interface=127.0.0.1", serve_commitlog=4 << 30,
        segment_size=256 << 20,
    )
    top = build_service(settings, reactor)
    broker: Any = top
    per_second, size, duration = float(rate), int(body_size), float(seconds)
    pool = random.Random(0).randbytes(1 << 16)
    topics = ["orders", "payments", "audit", "metrics"]
    state: dict[str, Any] = {"puts": 0, "failed": 0, "start": 0.0}

    def put() -> None:
        now = time.monotonic()
        due = int((now - state["start"]) * per_second)
        while state["puts"] < due:
            i = state["puts"]
            start = (i * 131) % (len(pool) - size)
            d = broker.put(Message(
                topic=topics[i % 4], body=pool[start:start + size], queue_id=i % 8,
                properties={"KEYS": f"k{i}"},
            ))
            d.addErrback(lambda f: state.__setitem__("failed", state["failed"] + 1))
            state["puts"] += 1
        if now - state["start"] >= duration:
            pacer.stop()
            print(json.dumps({"done": True, **report()}), flush=True)
            reactor.stop()

    def report() -> dict[str, Any]:
        return {"t": time.time(), "end": broker.commitlog.max_offset, "puts": state["puts"],
                "failed": state["failed"]}

    def tick() -> None:
        print(json.dumps(report()), flush=True)

    pacer = LoopingCall(put)
    ticker = LoopingCall(tick)

    def go() -> None:
        state["start"] = time.monotonic()
        print(json.dumps({"started": True, **report()}), flush=True)
        pacer.start(0.005)
        ticker.start(0.05)

    top.startService()
    reactor.callLater(0.2, go)
    reactor.addSystemEventTrigger("before", "shutdown", top.stopService)
    reactor.run()


def _stream_bench(args: argparse.Namespace) -> dict[str, Any]:
    """
    C{readStream.format("rmqha")} following a live master that takes
    C{--rate} puts a second (L{_paced_master}), from its store directory
    and from its admin HTTP (C{rmqha+http://}), each into a Parquet file
    sink partitioned as C{export} does, with back-to-back micro-batches:
    the lag of every batch (from when its first record was written to
    when the batch was committed), the rows/s the query kept up with,
    and the backlog left at the end.  One C{local[2]} session (the jobs'
    one), one master per source, in turn.
    """

    from rmqha.pipeline import jobs
    from rmqha.pipeline.source import spark_session
    from tools.processes import free_ports

    spark = spark_session("local[2]", quiet=True)
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")
    results: dict[str, Any] = {}
    for where in args.sources.split(","):
        root = tempfile.mkdtemp(prefix="rmqha-bench-", dir=args.dir)
        (http_port,) = free_ports(1)
        store = os.path.join(root, "store")
        master = _spawn(
            "_paced-master", store, str(http_port), str(args.rate), str(args.seconds + 15),
            str(args.body_size),
        )
        timeline: list[tuple[float, int]] = []
        writer: dict[str, Any] = {}
        try:
            first = _json_line(master)
            timeline.append((first["t"], first["end"]))
            writer.update(first)
            import threading

            def follow() -> None:
                assert master.stdout is not None
                for line in master.stdout:
                    report = json.loads(line)
                    timeline.append((report["t"], report["end"]))
                    writer["last"] = report

            threading.Thread(target=follow, daemon=True).start()
            time.sleep(2)  # a backlog of records to start from
            source = store if where == "store" else f"rmqha+http://127.0.0.1:{http_port}"
            frame = jobs.export_frame(
                spark.readStream.format("rmqha").option("startingOffsets", "latest").load(source)
            )
            query = (
                frame.writeStream.format("parquet").partitionBy(*jobs.EXPORT_PARTITIONS)
                .option("path", os.path.join(root, "out"))
                .option("checkpointLocation", os.path.join(root, "checkpoint"))
                .start()
            )
            _progress(f"stream from the {where}: following {args.rate:,} puts/s for "
                      f"{args.seconds:.0f} s ...")
            time.sleep(args.seconds)
            query.stop()
            progress = list(query.recentProgress)
            writer_end = timeline[-1][1]
        finally:
            master.terminate()
            master.wait()
            shutil.rmtree(root, ignore_errors=True)
        lags: list[float] = []
        each: list[tuple[int, float, float]] = []
        rows = 0
        batches = 0
        last_end = None
        import datetime

        for p in progress:
            source_progress = p["sources"][0]
            start = jobs._stream_offset(source_progress["startOffset"])
            end = jobs._stream_offset(source_progress["endOffset"])
            if start is None or end is None or end == start:
                continue
            began = datetime.datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00"))
            committed = began.timestamp() + p["batchDuration"] / 1000
            # When the batch's first record was not yet written: the last
            # report of the writer whose end was at most the batch's start.
            written = max((t for t, e in timeline if e <= start), default=timeline[0][0])
            lags.append(committed - written)
            each.append((int(p["numInputRows"]), p["batchDuration"] / 1000, committed - written))
            rows += int(p["numInputRows"])
            batches += 1
            last_end = end
        steady = lags[1:] or lags
        results[where] = {
            "batches": batches,
            "rows": rows,
            "rows_per_s": rows / args.seconds,
            "lag_median_s": statistics.median(steady) if steady else None,
            "lag_max_s": max(steady) if steady else None,
            "backlog_bytes_at_stop": (writer_end - last_end) if last_end is not None else None,
            # What the master really took: puts/s from its first to its last report.
            "writer_puts_per_s": (writer["last"]["puts"] - writer["puts"])
            / (writer["last"]["t"] - writer["t"]),
            "writer_failed": writer["last"]["failed"],
            # (rows, seconds, lag) of every batch.
            "batches_each": [(n, round(d, 2), round(lag, 2)) for n, d, lag in each],
        }
        _progress(f"  {where}: {results[where]}")
    spark.stop()
    return {
        "benchmark": "stream",
        "machine": machine_info(),
        "rate": args.rate,
        "seconds": args.seconds,
        "body_size": args.body_size,
        **results,
    }


def _stats_bench(args: argparse.Namespace) -> dict[str, Any]:
    """
    The C{stats} job against a bare scan of the same columns
    (L{rmqha.pipeline.jobs.STATS_COLUMNS}: counted and summed, nothing
    grouped) on one C{local[2]} session, alternating, after one warm-up
    of each: the job's cost over reading what it reads.
    """
    from pyspark.sql import functions as F

    from rmqha.cli import fill
    from rmqha.pipeline import jobs, source

    root = tempfile.mkdtemp(prefix="rmqha-bench-", dir=args.dir)
    store = os.path.join(root, "store")
    try:
        _progress(f"filling a {args.size / (1 << 20):.0f} MiB store ...")
        count = args.size // (args.body_size + 130) + 1
        with CommitLog.open(store, segment_size=64 << 20) as log:
            fill(log, count, args.body_size, ["orders", "payments", "audit", "t4", "t5"], 8)
        _raw_read_all(store)
        if args.reader == "python":
            # (read_store then takes the Python data source for a local store.)
            source.jvm_reader = lambda spark: False
        spark = source.spark_session("local[2]", app_name="rmqha bench stats", quiet=True)

        def bare() -> None:
            df = jobs._load(spark, store, jobs.STATS_COLUMNS)
            # (Every column stats reads, the topic included: each decoded.)
            df.agg(
                F.count("*"), F.sum("size"), F.sum("body_size"), F.max("store_timestamp"),
                F.min("born_timestamp"), F.sum(F.col("crc_ok").cast("int")), F.max("offset"),
                F.max("topic"),
            ).collect()

        def job() -> None:
            jobs.stats(spark, store)

        variants = {"scan": bare, "stats": job}
        for work in variants.values():
            work()  # (the JIT's first compilation, the workers' start)
        runs: dict[str, list[float]] = {name: [] for name in variants}
        # CPU seconds of every process of the query (the JVM, Python
        # workers, this driver): less disturbed by other work on the
        # machine than the elapsed time.
        cpus: dict[str, list[float]] = {name: [] for name in variants}
        for run in range(args.runs):
            names = list(variants) if run % 2 == 0 else list(variants)[::-1]
            for name in names:
                cpu_before = sum(_descendants_cpu().values()) + time.process_time()
                started = time.perf_counter()
                variants[name]()
                runs[name].append(time.perf_counter() - started)
                cpus[name].append(
                    sum(_descendants_cpu().values()) + time.process_time() - cpu_before
                )
            _progress(
                f"run {run + 1}: scan {runs['scan'][-1]:.2f} s ({cpus['scan'][-1]:.2f} s CPU), "
                f"stats {runs['stats'][-1]:.2f} s ({cpus['stats'][-1]:.2f} s CPU)"
            )
        spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    scan_s = statistics.median(runs["scan"])
    stats_s = statistics.median(runs["stats"])
    return {
        "benchmark": "stats",
        "machine": machine_info(),
        "reader": args.reader,
        "records": count,
        "store_mib": args.size / (1 << 20),
        "runs": args.runs,
        "scan_seconds": scan_s,
        "stats_seconds": stats_s,
        "stats_over_scan": stats_s / scan_s,
        "scan_runs_s": [round(t, 3) for t in runs["scan"]],
        "stats_runs_s": [round(t, 3) for t in runs["stats"]],
        "scan_cpu_s": statistics.median(cpus["scan"]),
        "stats_cpu_s": statistics.median(cpus["stats"]),
        "stats_over_scan_cpu": statistics.median(cpus["stats"]) / statistics.median(cpus["scan"]),
    }


# One process of C{bench puts}: only the store's public API, so that it runs
# in any checkout (this one, or the one given with --against).
_PUTS_CHILD = r"""
import json, os, shutil, sys, tempfile, time, zlib
from rmqha.store.commitlog import CommitLog, Message
from rmqha.store import _record
try:
    from rmqha.store._recovery import verify_store
except ImportError:  # a checkout from before issue 15 (no store check)
    verify_store = None
root, count, check_store = sys.argv[1], int(sys.argv[2]), sys.argv[3]
body = os.urandom(1024)
messages = [
    Message("BenchTopic", body, queue_id=i % 8, properties={
        "UNIQ_KEY": f"7F000001000100000000{i:012X}", "TAGS": "TagA", "WAIT": "true"})
    for i in range(4096)
]
out = {"compiled": getattr(_record, "_accel", None) is not None}
for batch in (1, 32):
    directory = tempfile.mkdtemp(dir=root)
    with CommitLog.open(directory, segment_size=64 << 20) as log:
        put, put_batch = log.put, log.put_batch
        started, thread_started = time.process_time(), time.thread_time()
        wall_started = time.perf_counter()
        if batch == 1:
            for i in range(count):
                put(messages[i & 4095])
        else:
            for i in range(0, count, batch):
                put_batch(messages[i & 4095 : (i & 4095) + batch])
        out[f"batch{batch}_wall_msgs_per_s"] = count / (time.perf_counter() - wall_started)
        out[f"batch{batch}_msgs_per_s"] = count / (time.process_time() - started)
        # The put thread alone (pre-faulting runs on a thread of its own).
        out[f"batch{batch}_thread_msgs_per_s"] = count / (time.thread_time() - thread_started)
    shutil.rmtree(directory)
if verify_store is None:
    print(json.dumps(out))
    sys.exit(0)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak RSS from here on
def kib(field):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(field + ":"))
rss = kib("VmRSS")
started = time.perf_counter()
report = verify_store(check_store)
out["check_seconds"] = time.perf_counter() - started
out["check_rss_growth_mib"] = (kib("VmHWM") - rss) / 1024
assert report.ok, report.error
started = time.perf_counter()
commitlog = os.path.join(check_store, "commitlog")
for name in sorted(os.listdir(commitlog)):
    with open(os.path.join(commitlog, name), "rb") as f:
        while block := f.read(4 << 20):
            zlib.crc32(block)
out["crc32_seconds"] = time.perf_counter() - started
print(json.dumps(out))
"""


def _puts_bench(args: argparse.Namespace) -> dict[str, Any]:
    """
    This checkout's put path and store check against another checkout's
    (C{--against}, a checkout of main: the code before a change), runs
    alternating, each a fresh process: single C{CommitLog.put}s and
    C{put_batch}es of 32 (1 KiB bodies, 64 MiB segments; CPU time of the
    process, so that the other processes on a shared machine count less,
    and of the put thread alone, since pre-faulting runs on another
    thread; for single puts also the wall clock, what a caller waits),
    then C{store check}'s walk (L{verify_store}, CRC on) over one store of
    C{--check-size} bytes in 64 MiB segments, with its peak RSS growth, and
    C{zlib.crc32} over the same files.
    """
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    checkouts = {"after": here, "before": os.path.abspath(args.against)}
    # Absolute: the children run in the checkouts' directories.
    root = os.path.abspath(tempfile.mkdtemp(prefix="rmqha-bench-", dir=args.dir))
    figures: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    try:
        store = os.path.join(root, "check")
        body = os.urandom(1000)
        with CommitLog.open(store, segment_size=64 << 20) as log:
            while log.max_offset < args.check_size:
                log.put_batch([Message("CheckTopic", body, queue_id=i % 8) for i in range(256)])
        for run in range(args.runs):
            for name in ("before", "after") if run % 2 == 0 else ("after", "before"):
                env = dict(os.environ, PYTHONPATH=checkouts[name])
                done = subprocess.run(
                    [sys.executable, "-c", _PUTS_CHILD, root, str(args.count), store],
                    env=env, capture_output=True, text=True, check=True, cwd=checkouts[name],
                )
                figures[name].append(json.loads(done.stdout.splitlines()[-1]))
                _progress(f"run {run + 1}/{args.runs} {name}: {figures[name][-1]}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out: dict[str, Any] = {
        "benchmark": "puts",
        "machine": machine_info(),
        "count": args.count,
        "runs": args.runs,
        "check_bytes": args.check_size,
        "against": checkouts["before"],
    }
    for name, runs in figures.items():
        for key in runs[0]:
            if key != "compiled":
                out[f"{name}_{key}"] = statistics.median(r[key] for r in runs)
        out[f"{name}_compiled"] = all(r["compiled"] for r in runs)
        for key in ("batch1_msgs_per_s", "batch32_msgs_per_s", "batch1_wall_msgs_per_s"):
            out[f"{name}_{key}_runs"] = [round(r[key]) for r in runs]
        if "check_seconds" in runs[0]:  # (not in a checkout from before issue 15)
            out[f"{name}_check_fraction_of_crc32"] = (
                out[f"{name}_crc32_seconds"] / out[f"{name}_check_seconds"]
            )
    out["put_speedup"] = out["after_batch1_msgs_per_s"] / out["before_batch1_msgs_per_s"]
    out["put_wall_speedup"] = (
        out["after_batch1_wall_msgs_per_s"] / out["before_batch1_wall_msgs_per_s"]
    )
    out["batch32_speedup"] = out["after_batch32_msgs_per_s"] / out["before_batch32_msgs_per_s"]
    return out


def _roundtrip_producers(
    broker: Any,
    connection: Any,
    transport: Any,
    message: Message,
    args: argparse.Namespace,
    ends: list[int],
) -> float:
    """
    C{roundtrip --producer}: C{--producers} producers each putting again
    as its put is answered -- coroutines awaiting C{Broker.put} (C{await})
    or chains of C{Broker.put_then} answers (C{callback}) -- and one ack
    of the log's end after each round (what bench sync's 32 producers
    do, without sockets): µs per put, the producers' resumption included.
    (C{ends}: the log's end after each round, for the slave's frames.)
    """
    import struct

    from twisted.internet.defer import ensureDeferred

    ack = struct.Struct(">q").pack
    log = broker.commitlog
    rounds = (args.count + 100) // args.producers
    # (Each producer's puts left; a producer stops when it has none.)
    left = [rounds] * args.producers
    answers: list[Any] = []

    async def awaiting(n: int) -> None:
        while left[n] > 0:
            left[n] -= 1
            answers.append(await broker.put(message))

    def answering(n: int) -> None:
        def answered(result: object) -> None:
            if result is not None:
                answers.append(result)
            if left[n] > 0:
                left[n] -= 1
                if broker.put_then(message, answered) is not None:
                    raise RuntimeError("a SYNC put was answered at once")

        answered(None)

    if args.producer == "await":
        for n in range(args.producers):
            ensureDeferred(awaiting(n))
    else:
        for n in range(args.producers):
            answering(n)
    for i in range(rounds):
        if i == 100 // args.producers:
            started, first = time.perf_counter(), log.max_offset
            puts_before = broker.put_path.puts
        ends.append(log.max_offset)
        transport.clear()
        connection.dataReceived(ack(log.max_offset))
    if log.max_offset <= first:
        raise RuntimeError("no put was made")
    if len(answers) != broker.put_path.puts or any(a.status.value != "PUT_OK" for a in answers):
        raise RuntimeError(f"{broker.put_path.puts} puts, {len(answers)} answered PUT_OK")
    return (time.perf_counter() - started) / (broker.put_path.puts - puts_before) * 1e6


def _roundtrip(args: argparse.Namespace) -> dict[str, Any]:
    """
    The Python of a SYNC round trip in one process, no sockets: a
    SYNC_MASTER with one slave connection on a C{StringTransport},
    C{--per-ack} puts then their ack, C{--count} puts in all (µs per put,
    its share of the ack included); and a slave
    connection of checked framing on its own commit log fed those puts as
    one-record frames (µs per frame: decode, validate, C{pwrite}, report).
    Best and median of C{--runs}.
    """
    import struct

    from twisted.internet.address import IPv4Address
    from twisted.internet.testing import MemoryReactorClock, StringTransport

    from rmqha.broker import Broker, Role
    from rmqha.ha import _wire
    from rmqha.ha.slave import SlaveFactory
    from rmqha.settings import BrokerSettings

    ack = struct.Struct(">q").pack
    masters: list[float] = []
    slaves: list[float] = []
    for _ in range(args.runs):
        root = tempfile.mkdtemp(prefix="rmqha-bench-", dir=args.dir)
        reactor = MemoryReactorClock()
        broker = Broker(
            BrokerSettings(role=Role.SYNC_MASTER, ha_listen="tcp:0", slave_timeout=3.0),
            reactor=reactor,
            open_commitlog=lambda: CommitLog.open(
                os.path.join(root, "master"), segment_size=256 << 20
            ),
        )
        broker.startService()
        replica = None
        try:
            factory = broker.master_factory
            assert factory is not None
            connection = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 1))
            transport = StringTransport()
            connection.makeConnection(transport)
            connection.dataReceived(ack(0))
            message = Message("BenchTopic", os.urandom(args.body_size))
            log = broker.commitlog
            ends: list[int] = []
            if args.producer is not None:
                masters.append(
                    _roundtrip_producers(broker, connection, transport, message, args, ends)
                )
            else:
                per_ack = args.per_ack
                for i in range((args.count + 100) // per_ack):
                    if i == 100 // per_ack:
                        started = time.perf_counter()
                    for _ in range(per_ack):
                        broker.put(message)
                        ends.append(log.max_offset)
                    transport.clear()
                    connection.dataReceived(ack(log.max_offset))
                masters.append(
                    (time.perf_counter() - started) / (args.count // per_ack * per_ack) * 1e6
                )
            records = log.read(0, log.max_offset)
            frames, start = [], 0
            for end in ends:
                body = records[start:end]
                frames.append(_wire.encode_checked_header(start, body) + body)
                start = end
            replica = CommitLog.open(os.path.join(root, "slave"), segment_size=256 << 20)
            slave_factory = SlaveFactory(replica, reactor)
            slave_factory.checked = True
            slave = slave_factory.buildProtocol(None)
            slave.makeConnection(StringTransport())
            slave.dataReceived(_wire._CHECKED_ACK_BYTES + frames[0])
            started = time.perf_counter()
            for frame in frames[1:]:
                slave.dataReceived(frame)
            slaves.append((time.perf_counter() - started) / (len(frames) - 1) * 1e6)
            if replica.record_end != log.max_offset:
                raise RuntimeError(f"the slave validated to {replica.record_end}, not {log.max_offset}")
        finally:
            broker.stopService()
            if replica is not None:
                replica.close()
            shutil.rmtree(root, ignore_errors=True)
    return {
        "benchmark": "roundtrip",
        "machine": machine_info(),
        "count": args.count,
        "per_ack": args.per_ack,
        "producer": args.producer,
        "producers": args.producers,
        "runs": args.runs,
        "master_put_and_ack_us": {"best": min(masters), "median": statistics.median(masters)},
        "slave_frame_us": {"best": min(slaves), "median": statistics.median(slaves)},
        "all": {"master": masters, "slave": slaves},
    }


def _codec_bench(args: argparse.Namespace) -> dict[str, Any]:
    """
    Microseconds per record of the codec's hot loops, on the pure-Python
    path and the compiled one, runs alternating, in one process (issue 15):
    encode into a buffer, C{check_record}, the replica validator fed 32 KiB
    chunks, recovery's walk (C{walk_valid}, CRC on), the pipeline's reader
    over an in-memory span; and the CRC-32 over the same bytes (C{crc32}:
    the codec's own, C{zlib.crc32} on the pure path and the compiled one
    on the other).
    """
    from rmqha.store import _record
    from rmqha.store._record import ReplicaValidator, RecordEncoder, walk_valid

    compiled = _record._accel
    if compiled is None:
        raise SystemExit("bench codec: the compiled codec is not built (or RMQHA_PURE is set)")
    messages = _messages(args.body_size, args.count)
    buf = bytearray(args.count * (args.body_size + 300))
    figures: dict[str, dict[str, list[float]]] = {"pure": {}, "compiled": {}}

    def timed(path: str, name: str, work: Any) -> Any:
        started = time.perf_counter()
        result = work()
        figures[path].setdefault(name, []).append(
            (time.perf_counter() - started) / args.count * 1e6
        )
        return result

    for run in range(args.runs):
        for path in ("pure", "compiled") if run % 2 == 0 else ("compiled", "pure"):
            _record._accel = None if path == "pure" else compiled
            _record.crc32 = zlib.crc32 if path == "pure" else compiled.crc32
            try:
                encoder = RecordEncoder(("127.0.0.1", 10911))

                def encode() -> int:
                    pos = 0
                    for i, message in enumerate(messages):
                        pos += encoder.encode(buf, pos, len(buf) - pos, message, i, pos, 1)
                    return pos

                end = timed(path, "encode", encode)
                data = bytes(buf[:end])
                view = memoryview(data)

                def check() -> None:
                    pos = 0
                    while pos < end:
                        total, magic = _record.read_header(data, pos)
                        _record.check_record(data, pos, pos, total, magic)
                        pos += total

                timed(path, "check_record", check)

                def replicate() -> None:
                    validator = ReplicaValidator(1 << 30, lambda o, n: data[o : o + n])
                    reached = 0
                    for at in range(0, end, 32768):
                        chunk = view[at : at + 32768]
                        reached = validator.advance(reached, at + len(chunk), at, chunk)

                timed(path, "replica_validator", replicate)
                timed(path, "walk_valid", lambda: walk_valid(
                    data, 0, end, 0, check_crc=True, strict=True))
                timed(path, "crc32", lambda: _record.crc32(data))
            finally:
                _record._accel = compiled
                _record.crc32 = compiled.crc32
    out: dict[str, Any] = {
        "benchmark": "codec",
        "machine": machine_info(),
        "count": args.count,
        "body_size": args.body_size,
        "runs": args.runs,
    }
    for path, named in figures.items():
        for name, values in named.items():
            out[f"{path}_{name}_us"] = round(statistics.median(values), 3)
    for name in figures["pure"]:
        out[f"{name}_speedup"] = round(out[f"pure_{name}_us"] / out[f"compiled_{name}_us"], 2)
    return out


def _crc_bench(args: argparse.Namespace) -> dict[str, Any]:
    """
    The reading figures of issue 15's target 3 with the CRC-32 as the only
    variable, in one process: the plain reader (bodies on and off) and
    C{store check}'s walk over one store, runs rotating the compiled
    CRC's folding as wide as the CPU has it ("fold": 512-bit VPCLMULQDQ
    where there is AVX-512, else 128-bit PCLMULQDQ), 128-bit folding
    ("fold128"; left out where there is no wide path) and no folding
    ("zlib": zlib's crc32, the code before), and C{zlib.crc32} / the
    compiled C{crc32} over the same segment files.  MB/s of wall clock and
    MB per CPU second (per core).
    """
    from rmqha.cli import fill
    from rmqha.store import _record

    compiled = _record._accel
    if compiled is None:
        raise SystemExit("bench crc: the compiled codec is not built (or RMQHA_PURE is set)")
    root = tempfile.mkdtemp(prefix="rmqha-bench-", dir=args.dir)
    store = os.path.join(root, "store")
    # name -> [(bytes, wall seconds, CPU seconds)] per run
    figures: dict[str, list[tuple[int, float, float]]] = {}
    try:
        _progress(f"filling a {args.size / (1 << 30):.2f} GiB store ...")
        with CommitLog.open(store, segment_size=args.segment_size) as log:
            fill(log, args.size // 1141 + 1, 1024, ["orders", "payments", "audit"], 8)
        _raw_read_all(store)
        files = []
        for name in sorted(os.listdir(os.path.join(store, "commitlog"))):
            with open(os.path.join(store, "commitlog", name), "rb") as f:
                files.append(f.read())
        size = sum(len(data) for data in files)

        def timed(name: str, work: Callable[[], int]) -> None:
            started, cpu = time.perf_counter(), time.process_time()
            nbytes = work()
            figures.setdefault(name, []).append(
                (nbytes, time.perf_counter() - started, time.process_time() - cpu)
            )

        def crc_all(crc32: Callable[[bytes], int]) -> int:
            for data in files:
                crc32(data)
            return size

        variants = ["zlib", "fold128", "fold"] if compiled._crc32_set_wide(True) else ["zlib", "fold"]
        for run in range(args.runs):
            shift = run % len(variants)
            for crc in variants[shift:] + variants[:shift]:
                if compiled._crc32_set_folding(crc != "zlib") != (crc != "zlib"):
                    raise SystemExit("bench crc: this CPU has no PCLMULQDQ/SSE4.1 folding")
                compiled._crc32_set_wide(crc == "fold")
                timed(f"{crc}_plain", lambda: int(_plain_scan(store, True)["bytes"]))
                timed(f"{crc}_plain_nobodies", lambda: int(_plain_scan(store, False)["bytes"]))
                timed(f"{crc}_check", lambda: int(_check_scan(store)["bytes"]))
                timed(f"{crc}_crc32", lambda: crc_all(
                    zlib.crc32 if crc == "zlib" else compiled.crc32))
    finally:
        compiled._crc32_set_folding(True)
        compiled._crc32_set_wide(True)
        shutil.rmtree(root, ignore_errors=True)
    out: dict[str, Any] = {
        "benchmark": "crc",
        "machine": machine_info(),
        "runs": args.runs,
        "store_bytes": size,
    }
    for name, values in figures.items():
        nbytes = values[0][0]
        wall = statistics.median(v[1] for v in values)
        cpu = statistics.median(v[2] for v in values)
        out[f"{name}_mb_per_s"] = round(nbytes / wall / 1e6)
        out[f"{name}_mb_per_cpu_s"] = round(nbytes / cpu / 1e6) if cpu else 0
        out[f"{name}_runs_s"] = [round(v[1], 3) for v in values]
    for name in ("plain", "plain_nobodies", "check"):
        for crc in variants:
            out[f"{crc}_{name}_fraction_of_zlib_crc32"] = round(
                out[f"{crc}_{name}_mb_per_s"] / out["zlib_crc32_mb_per_s"], 2
            )
    return out


def wait_http(url: str, process: "subprocess.Popen[Any]", what: str, timeout: float = 60) -> None:
    """
    Poll C{url} until it answers (any HTTP status), failing at once if
    C{process} (the server) exits, or after C{timeout} seconds; C{what}
    names the server in the error.
    """
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with status {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not answer {url} in {timeout:.0f} s") from None
            time.sleep(0.2)


#: Fake credentials for the benchmark's own S3 server (moto accepts any).
_S3_ENV = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def _sources_bench(args: argparse.Namespace) -> dict[str, Any]:
    """
    One store read from three sources, in the same run: the local files,
    an S3-compatible server (moto's, a separate process on 127.0.0.1) and
    a live broker's admin HTTP (a C{twistd rmqha} master serving the store
    with C{--serve-commitlog}); each by the plain reader (this process)
    and by Spark C{local[2]}; runs alternate the order.
    """
    from pyarrow import fs as pafs

    from rmqha.cli import fill
    from tools.processes import free_ports, twistd_command

    root = tempfile.mkdtemp(prefix="rmqha-bench-", dir=args.dir)
    store = os.path.join(root, "store")
    processes: list[subprocess.Popen[Any]] = []
    try:
        _progress(f"filling a {args.size / (1 << 20):,.0f} MiB store ...")
        with CommitLog.open(store, segment_size=args.segment_size) as log:
            fill(log, args.size // 1141 + 1, 1024, ["orders", "payments", "audit"], 8)
        s3_port, http_port = free_ports(2)
        moto = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(s3_port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        processes.append(moto)
        broker = subprocess.Popen(
            twistd_command(
                store, os.path.join(root, "broker.log"), "--role", "master",
                "--segment-size", str(args.segment_size),
                "--ha-listen", "tcp:0:interface=127.0.0.1",
                "--http", f"tcp:{http_port}:interface=127.0.0.1",
                "--serve-commitlog", args.http_rate, "--scrub-rate", "off",
            ),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        processes.append(broker)
        wait_http(f"http://127.0.0.1:{s3_port}/", moto, "the S3 server")
        wait_http(f"http://127.0.0.1:{http_port}/status", broker, "the broker")
        s3 = pafs.S3FileSystem(
            access_key="bench", secret_key="bench", endpoint_override=f"127.0.0.1:{s3_port}",
            scheme="http", region="us-east-1", allow_bucket_creation=True,
        )
        s3.create_dir("bench")
        _progress("uploading the store to the S3 server ...")
        pafs.copy_files(
            os.path.join(store, "commitlog"), "bench/store/commitlog", destination_filesystem=s3
        )
        os.environ.update(_S3_ENV)  # the plain reader, and Spark's workers through it
        sources = {
            "local": store,
            "s3": f"s3://bench/store?endpoint_override=127.0.0.1:{s3_port}&scheme=http"
                  "&region=us-east-1",
            "http": f"rmqha+http://127.0.0.1:{http_port}",
        }
        _raw_read_all(store)
        readers = args.readers.split(",")
        cluster = None
        if "cluster" in readers:
            # A standalone master and two workers of one core each, on
            # loopback, as the suite's cluster tests start them.
            from tests.integration._spark_cluster import SparkCluster

            cluster = SparkCluster(tempfile.mkdtemp(prefix="cluster-", dir=root))
            _progress("starting a Spark standalone cluster (a master, two workers) ...")
            cluster.start([[], []])
        variants = [(reader, source) for reader in readers for source in sources]
        runs: dict[str, list[dict[str, Any]]] = {f"{r} {s}": [] for r, s in variants}
        for run in range(args.runs):
            for reader, source in variants if run % 2 == 0 else variants[::-1]:
                if reader == "raw":
                    result = _raw_scan(sources[source])
                elif reader == "plain":
                    result = _plain_scan(sources[source], args.bodies == "true")
                elif reader == "cluster":
                    # The JVM reader where it reads the source (local files,
                    # a live broker), the Python source for s3://.
                    assert cluster is not None
                    process = _spawn(
                        "_spark-scan", sources[source], cluster.url, "--bodies", args.bodies,
                        "--reader", "python" if source == "s3" else "jvm",
                    )
                    result = _json_line(process)
                    process.wait()
                else:
                    process = _spawn(
                        "_spark-scan", sources[source], reader, "--bodies", args.bodies
                    )
                    result = _json_line(process)
                    process.wait()
                runs[f"{reader} {source}"].append(result)
                _progress(
                    f"run {run + 1}: {reader} from {source}: "
                    f"{result['bytes'] / result['seconds'] / 1e6:,.0f} MB/s "
                    f"({result['seconds']:.1f} s, "
                    + (f"{result['records']:,} records)" if "records" in result else "not decoded)")
                )
    finally:
        if cluster is not None:
            cluster.stop()
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait()
        shutil.rmtree(root, ignore_errors=True)
    out: dict[str, Any] = {
        "benchmark": "sources",
        "machine": machine_info(),
        "runs": args.runs,
        "bodies": args.bodies == "true",
        "http_rate": args.http_rate,
    }
    decoded = {name: results for name, results in runs.items() if not name.startswith("raw")}
    records = {len(set(r["records"] for r in results)) for results in decoded.values()}
    out["same_records_everywhere"] = records == {1} and len(
        {results[0]["records"] for results in decoded.values()}
    ) == 1
    for name, results in runs.items():
        seconds = statistics.median(r["seconds"] for r in results)
        key = name.replace("[", "").replace("]", "").replace(" ", "_")
        out[f"{key}_mb_per_s"] = results[0]["bytes"] / seconds / 1e6
        out[f"{key}_runs_s"] = [round(r["seconds"], 2) for r in results]
        if "cpu_s" in results[0]:
            # Spark's CPU seconds per query by process kind (medians).
            out[f"{key}_cpu_s"] = {
                kind: round(statistics.median(r["cpu_s"][kind] for r in results), 2)
                for kind in results[0]["cpu_s"]
            }
    for reader in [r.replace("[", "").replace("]", "") for r in readers if r != "raw"]:
        for source in ("s3", "http"):
            out[f"{reader}_{source}_fraction_of_local"] = (
                out[f"{reader}_{source}_mb_per_s"] / out[f"{reader}_local_mb_per_s"]
            )
    for source in ("s3", "http") if "raw" in readers and "plain" in readers else ():
        # The server's own ceiling against what the target asks (70 % of
        # the plain reader's local figure), and how near the reader gets.
        out[f"raw_{source}_fraction_of_plain_local"] = (
            out[f"raw_{source}_mb_per_s"] / out["plain_local_mb_per_s"]
        )
        out[f"plain_{source}_fraction_of_raw"] = (
            out[f"plain_{source}_mb_per_s"] / out[f"raw_{source}_mb_per_s"]
        )
    some = next(name for name in runs if not name.startswith("raw"))
    out["store_bytes"] = runs[some][0]["bytes"]
    out["records"] = runs[some][0]["records"]
    return out


def _raw_scan(location: str) -> dict[str, Any]:
    """
    Every segment of the store at C{location} read through its reader in
    blocks of the reader's C{block_size}, one request at a time, nothing
    decoded: the source's raw ceiling (C{bytes} counts what was read).
    """
    from rmqha.pipeline.stores import resolve

    store = resolve(location)
    started = time.perf_counter()
    cpu = time.process_time()
    read = 0
    for segment in store.segments():
        with store.open(segment) as f:
            for position in range(0, f.size, f.block_size):
                read += len(f.read_at(position, f.block_size))
    return {
        "seconds": time.perf_counter() - started,
        "bytes": read,
        "cpu_s": {"python": round(time.process_time() - cpu, 2)},
    }


def _raw_read_all(store: str) -> None:
    directory = os.path.join(store, "commitlog")
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            while f.read(1 << 24):
                pass


def _warm_memory(directory: str, nbytes: int) -> None:
    """
    Write C{nbytes} into a scratch file in C{directory} and remove it, so
    that the first timed transfer does not pay alone for memory the
    machine touches for the first time.  On the 2-core VM a transfer into
    memory not used for a while ran at a quarter of the speed of the next
    one (docs/benchmarks.md, "the first run into cold memory"), and the
    raw ceiling, which runs first, took the whole penalty.
    """
    chunk = bytes(1 << 20)
    fd, path = tempfile.mkstemp(prefix="warm-", dir=directory)
    try:
        written = 0
        while written < nbytes:
            written += os.write(fd, chunk[: min(len(chunk), nbytes - written)])
    finally:
        os.close(fd)
        os.unlink(path)


def _backlog_warm_up(root: str, master_store: str) -> None:
    """
    Before the first timed run of a replication benchmark: the master's
    segments in the page cache, and as much fresh memory as a run's
    receiving side writes (the slave's whole segments) touched once.
    """
    _raw_read_all(master_store)
    segments = len(os.listdir(os.path.join(master_store, "commitlog")))
    _warm_memory(root, segments * _segment_size(master_store))


# -- sync -----------------------------------------------------------------------

#: What C{sync --reactor} installs, as code run before anything imports
#: the reactor (in this process and in the slave and echo processes).
_REACTORS = {
    "epoll": "",
    "asyncio": "from twisted.internet import asyncioreactor; asyncioreactor.install()",
    "uvloop": (
        "import asyncio, uvloop; asyncio.set_event_loop_policy(uvloop.EventLoopPolicy()); "
        "from twisted.internet import asyncioreactor; "
        "asyncioreactor.install(asyncio.new_event_loop())"
    ),
}


def _install_reactor() -> str:
    """
    Install the reactor C{RMQHA_BENCH_REACTOR} names (default epoll);
    return its name.
    """
    name = os.environ.get("RMQHA_BENCH_REACTOR", "epoll")
    exec(_REACTORS[name])
    return name


def _slave_command(*args: str) -> list[str]:
    """
    L{twistd_slave_command}, on the reactor C{RMQHA_BENCH_REACTOR} names.
    """
    command = twistd_slave_command(*args)
    install = _REACTORS[os.environ.get("RMQHA_BENCH_REACTOR", "epoll")]
    if install:
        assert command[1] == "-c"
        command[2] = install + "; " + command[2]
    return command


#: The ping-pong floor's message sizes: about one 1 KiB-body record out (a
#: frame header and the record), one report back.
_PING_BYTES = 1200
_PONG_BYTES = 8


def _pingpong_echo() -> None:
    """
    The ping-pong floor's far end (another process, like the slave): on
    127.0.0.1:0 (port printed), answer every C{_PING_BYTES} received with
    C{_PONG_BYTES}, with TCP_NODELAY, on the default reactor; nothing else.
    """
    _install_reactor()
    from twisted.internet import reactor
    from twisted.internet.endpoints import TCP4ServerEndpoint
    from twisted.internet.protocol import Factory, Protocol

    class Echo(Protocol):
        received = 0

        def connectionMade(self) -> None:
            self.transport.setTcpNoDelay(True)  # type: ignore[union-attr]

        def dataReceived(self, data: bytes) -> None:
            self.received += len(data)
            if self.received >= _PING_BYTES:
                self.received -= _PING_BYTES
                self.transport.write(b"\0" * _PONG_BYTES)  # type: ignore[union-attr]

        def connectionLost(self, reason: object = None) -> None:
            if reactor.running:
                reactor.stop()

    def listening(port: Any) -> None:
        print(json.dumps({"port": port.getHost().port}), flush=True)

    endpoint = TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1")
    endpoint.listen(Factory.forProtocol(Echo)).addCallback(listening)
    reactor.run()


async def _pingpong(reactor: Any, seconds: float) -> dict[str, Any]:
    """
    The floor a SYNC_MASTER put cannot beat on this machine: two Twisted
    processes over loopback, C{_PING_BYTES} one way and C{_PONG_BYTES}
    back, one at a time, for C{seconds}; round trips per second and
    latency percentiles.
    """
    from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
    from twisted.internet.protocol import Protocol

    echo = _spawn("_pingpong-echo")
    try:
        port = _json_line(echo)["port"]
        latencies: list[int] = []
        done: Deferred[None] = Deferred()
        deadline = time.perf_counter() + seconds
        clock_ns = time.perf_counter_ns
        ping = b"\1" * _PING_BYTES

        class Ping(Protocol):
            received = 0
            started = 0

            def connectionMade(self) -> None:
                self.transport.setTcpNoDelay(True)  # type: ignore[union-attr]
                self.send()

            def send(self) -> None:
                self.started = clock_ns()
                self.transport.write(ping)  # type: ignore[union-attr]

            def dataReceived(self, data: bytes) -> None:
                self.received += len(data)
                if self.received < _PONG_BYTES:
                    return
                self.received -= _PONG_BYTES
                latencies.append(clock_ns() - self.started)
                if time.perf_counter() < deadline:
                    self.send()
                else:
                    self.transport.loseConnection()  # type: ignore[union-attr]
                    done.callback(None)

        await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), Ping())
        started = time.perf_counter()
        await done
        elapsed = time.perf_counter() - started
    finally:
        echo.terminate()
        echo.wait()
    return _latency_figures(latencies, elapsed)


def _latency_figures(latencies_ns: list[int], elapsed: float) -> dict[str, Any]:
    """
    Count, rate and p50/p99/p99.9 (microseconds) of C{latencies_ns}.
    """
    latencies_ns.sort()

    def percentile(p: float) -> float:
        return latencies_ns[min(len(latencies_ns) - 1, int(p * len(latencies_ns)))] / 1000

    return {
        "seconds": elapsed,
        "count": len(latencies_ns),
        "per_s": len(latencies_ns) / elapsed,
        "p50_us": percentile(0.50),
        "p99_us": percentile(0.99),
        "p999_us": percentile(0.999),
    }


async def _sync(
    reactor: Any,
    mode: str,
    producers: int,
    seconds: float,
    body_size: int = 1024,
    directory: str | None = None,
    busy_poll: int | None = None,
    producer_api: str = "await",
    backlog: int = 0,
) -> dict[str, Any]:
    """
    C{producers} coroutines putting in a loop for C{seconds} on a master of
    C{mode} with one twistd slave; C{busy_poll}: both processes'
    C{--busy-poll} in microseconds (C{None}: the default).  C{backlog}:
    bytes of 1 KiB records in the master's store before it starts (the
    slave has all of them before the clock starts), so that the
    background scrub (both processes' own, at the default rate) works
    through them while the puts run.
    C{producer_api}: C{await} (each producer a coroutine awaiting
    C{Broker.put}) or C{callback} (each a chain of C{Broker.put_then}
    answers, no Deferred: docs/sync.md, "Puts without a Deferred").
    """
    from rmqha.broker import Broker, Role
    from rmqha.ha.group import PutStatus
    from rmqha.settings import BrokerSettings

    root = tempfile.mkdtemp(prefix="rmqha-bench-", dir=directory)
    role = Role.SYNC_MASTER if mode == "sync" else Role.ASYNC_MASTER
    polling: dict[str, Any] = {} if busy_poll is None else {"busy_poll": busy_poll / 1e6}
    master = Broker(
        BrokerSettings(
            role=role, ha_listen="tcp:0:interface=127.0.0.1", heartbeat_interval=1.0, **polling
        ),
        reactor=reactor,
        # (Consume queues kept, as a broker's store keeps them.)
        open_commitlog=lambda: CommitLog.open(
            os.path.join(root, "master"), clock=reactor.seconds, consume_queues=True
        ),
    )
    if backlog:
        from rmqha.cli import fill

        with CommitLog.open(os.path.join(root, "master"), consume_queues=True) as log:
            fill(log, backlog // 1141 + 1, 1024, ["BacklogTopic"], 8)
            caught_up = log.max_offset
    else:
        caught_up = 0
    master.startService()
    slave = None
    try:
        port = (await master.ha_address()).port
        slave = subprocess.Popen(
            _slave_command(
                os.path.join(root, "slave"),
                f"tcp:host=127.0.0.1:port={port}",
                os.path.join(root, "slave.log"),
                *([] if busy_poll is None else ["--busy-poll", str(busy_poll)]),
            )
        )
        # Until the slave's first report (not merely its connection, which
        # may be the divergence check's control session) every put would be
        # SLAVE_NOT_AVAILABLE.
        while not any(
            s.ack_offset is not None and s.ack_offset >= caught_up for s in master.slaves()
        ):
            await deferLater(reactor, 0.05, lambda: None)
        body = os.urandom(body_size)
        # One put before the clock starts: the first creates the 1 GiB
        # segment (on tmpfs, fallocate zeroes it: ~0.25 s in one put).
        await master.put(Message("BenchTopic", body))
        latencies: list[int] = []
        statuses: dict[str, int] = {}
        deadline = time.perf_counter() + seconds
        clock_ns = time.perf_counter_ns

        async def producer(n: int) -> None:
            message = Message("BenchTopic", body, queue_id=n % 8)
            count = 0
            while time.perf_counter() < deadline:
                started = clock_ns()
                result = await master.put(message)
                latencies.append(clock_ns() - started)
                statuses[result.status.value] = statuses.get(result.status.value, 0) + 1
                count += 1
                if result.status is PutStatus.PUT_OK and mode == "async" and count % 64 == 0:
                    # An ASYNC put completes at once; let the reactor (and
                    # the other producers, and replication) run.
                    await deferLater(reactor, 0, lambda: None)

        def answering(n: int) -> Deferred[None]:
            # The same loop as producer's, driven by put_then's answers.
            message = Message("BenchTopic", body, queue_id=n % 8)
            finished: Deferred[None] = Deferred()
            started = [0]
            count = [0]

            def answered(result: Any) -> None:
                while True:
                    latencies.append(clock_ns() - started[0])
                    statuses[result.status.value] = statuses.get(result.status.value, 0) + 1
                    count[0] += 1
                    if time.perf_counter() >= deadline:
                        finished.callback(None)
                        return
                    if result.status is PutStatus.PUT_OK and mode == "async" and count[0] % 64 == 0:
                        reactor.callLater(0, put)
                        return
                    started[0] = clock_ns()
                    result = master.put_then(message, answered)
                    if result is None:
                        return

            def put() -> None:
                started[0] = clock_ns()
                result = master.put_then(message, answered)
                if result is not None:
                    answered(result)

            put()
            return finished

        # (CPU seconds of this process -- the master, its threads included
        # -- and of the slave over the timed window: what a loaded machine
        # moves least.)
        cpu_before = (httpbench._cpu_seconds(os.getpid()), httpbench._cpu_seconds(slave.pid))
        polled_before = _busy_poll_figures(reactor)
        started = time.perf_counter()
        if producer_api == "callback":
            await gatherResults([answering(n) for n in range(producers)])
        else:
            await gatherResults([ensureDeferred(producer(n)) for n in range(producers)])
        elapsed = time.perf_counter() - started
        cpu_after = (httpbench._cpu_seconds(os.getpid()), httpbench._cpu_seconds(slave.pid))
        polled_after = _busy_poll_figures(reactor)
    finally:
        await master.stopService()
        if slave is not None:
            slave.terminate()
            slave.wait()
        shutil.rmtree(root, ignore_errors=True)
    figures = _latency_figures(latencies, elapsed)
    return {
        "benchmark": "sync",
        "machine": machine_info(),
        "mode": mode,
        "producers": producers,
        "seconds": elapsed,
        "puts": figures["count"],
        "puts_per_s": figures["per_s"],
        "p50_us": figures["p50_us"],
        "p99_us": figures["p99_us"],
        "p999_us": figures["p999_us"],
        "statuses": statuses,
        "busy_poll_us": busy_poll,
        "producer_api": producer_api,
        "master_cpu_us_per_put": (cpu_after[0] - cpu_before[0]) / max(1, figures["count"]) * 1e6,
        "slave_cpu_us_per_put": (cpu_after[1] - cpu_before[1]) / max(1, figures["count"]) * 1e6,
        # (The master's busy polling over the timed window: windows that
        # got events, that did not, and the µs a put spent polling.)
        "master_busy_poll": {
            "windows_with_events": polled_after[0] - polled_before[0],
            "windows_without_events": polled_after[1] - polled_before[1],
            "us_per_put": (polled_after[2] - polled_before[2]) / max(1, figures["count"]) * 1e6,
        },
    }


def _sync_against(args: argparse.Namespace) -> dict[str, Any]:
    """
    C{sync} in this checkout and in C{--against} (the code a target is
    relative to: issue 31's filing, 976f6f3), each run a fresh
    C{python -m tools.bench sync} in its checkout, alternating, the order
    swapped every run: each side's median puts/s, p50 and p99, CPU per
    put, the ratios of the medians and the paired ratios.  C{--busy-poll}
    is given to this checkout's runs only (the other may not know it).
    """
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    checkouts = {"this": here, "against": os.path.abspath(args.against)}
    directory = os.path.abspath(args.dir) if args.dir else None
    figures: dict[str, list[dict[str, Any]]] = {"this": [], "against": []}
    for run in range(args.runs):
        for name in ("this", "against") if run % 2 == 0 else ("against", "this"):
            command = [
                sys.executable, "-m", "tools.bench", "sync", "--mode", args.mode,
                "--producers", str(args.producers), "--seconds", str(args.seconds),
                "--body-size", str(args.body_size),
            ]
            if directory:
                command += ["--dir", directory]
            if name == "this" and args.busy_poll is not None:
                command += ["--busy-poll", str(args.busy_poll)]
            if name == "this" and args.producer != "await":
                command += ["--producer", args.producer]
            env = dict(os.environ, PYTHONPATH=checkouts[name])
            done = subprocess.run(
                command, env=env, capture_output=True, text=True, check=True, cwd=checkouts[name]
            )
            result = json.loads(done.stdout.splitlines()[-1])
            figures[name].append(result)
            _progress(
                f"run {run + 1}/{args.runs} {name}: {result['puts_per_s']:,.0f} puts/s, "
                f"p50 {result['p50_us']:.0f} us, p99 {result['p99_us']:.0f} us"
            )

    def median(name: str, key: str) -> float:
        return statistics.median(r.get(key, 0.0) for r in figures[name])

    out: dict[str, Any] = {
        "benchmark": "sync-against",
        "machine": machine_info(),
        "mode": args.mode,
        "producers": args.producers,
        "runs": args.runs,
        "against": checkouts["against"],
    }
    for name in figures:
        for key in ("puts_per_s", "p50_us", "p99_us"):
            out[f"{name}_{key}"] = median(name, key)
        # (The filing's code did not report CPU: 0 there.)
        for key in ("master_cpu_us_per_put", "slave_cpu_us_per_put"):
            out[f"{name}_{key}"] = median(name, key)
        out[f"{name}_runs"] = [round(r["puts_per_s"]) for r in figures[name]]
    out["puts_ratio"] = out["this_puts_per_s"] / out["against_puts_per_s"]
    out["p99_ratio"] = out["this_p99_us"] / out["against_p99_us"]
    out["paired_ratios"] = [
        round(a["puts_per_s"] / b["puts_per_s"], 2)
        for a, b in zip(figures["this"], figures["against"])
    ]
    return out


def _busy_poll_figures(reactor: Any) -> tuple[int, int, float]:
    """
    C{reactor}'s busy-poll counts (windows with events, without, seconds),
    zeros when it has none (docs/sync.md, "Busy polling").
    """
    from rmqha._busypoll import figures

    polling = figures(reactor)
    if polling is None:
        return 0, 0, 0.0
    return polling.windows_with_events, polling.windows_without_events, polling.poll_seconds


async def _sync_targets(reactor: Any, args: argparse.Namespace) -> dict[str, Any]:
    """
    Issue 15's SYNC targets in one run: the ping-pong floor, SYNC_MASTER at
    1 producer, SYNC_MASTER and ASYNC_MASTER at C{--producers} (32), each
    C{--runs} times in alternation; medians and the ratios.
    """
    many = args.producers if args.producers > 1 else 32
    load_before = os.getloadavg()
    variants: dict[str, list[dict[str, Any]]] = {
        "floor": [], "sync_1": [], f"sync_{many}": [], f"async_{many}": []
    }
    for run in range(args.runs):
        for name in variants:
            _progress(f"run {run + 1}/{args.runs}: {name}")
            if name == "floor":
                figures = await _pingpong(reactor, args.seconds)
                figures = {"puts_per_s": figures["per_s"], **figures}
            else:
                mode, producers = name.split("_")
                figures = await _sync(
                    reactor, mode, int(producers), args.seconds, args.body_size, args.dir
                )
                figures.pop("machine")
            variants[name].append(figures)

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in variants[name])

    floor_p50 = median("floor", "p50_us")
    sync1_p50 = median("sync_1", "p50_us")
    return {
        "benchmark": "sync-targets",
        "machine": machine_info(),
        "reactor": args.reactor,
        # The machine's load average (1, 5, 15 min) before and after: the
        # figures of a loaded, shared machine are noisy.
        "load_average": [list(load_before), list(os.getloadavg())],
        "runs": args.runs,
        "seconds": args.seconds,
        "producers": many,
        "medians": {
            name: {k: median(name, k) for k in ("puts_per_s", "p50_us", "p99_us", "p999_us")}
            for name in variants
        },
        "sync_many_fraction_of_async": median(f"sync_{many}", "puts_per_s")
        / median(f"async_{many}", "puts_per_s"),
        "sync_1_p50_over_floor_p50": sync1_p50 / floor_p50,
        "sync_1_p99_over_p50": median("sync_1", "p99_us") / sync1_p50,
        "all": variants,
    }


def _failover_bench(args: argparse.Namespace) -> dict[str, Any]:
    """
    SIGKILL the master of a three-node failover group C{args.kills}
    times under HTTP load; the producers' unavailability windows, the
    election times and the acknowledged puts lost.
    """
    from tools.failover_cluster import (
        FailoverCluster, Producers, converge_and_check, kill_masters,
    )
    from tools.etcd_cluster import EtcdCluster
    from tools.processes import etcd_binary

    if etcd_binary() is None:
        raise SystemExit("bench failover: etcd is not installed (Debian: apt-get install etcd-server)")
    directory = tempfile.mkdtemp(prefix="rmqha-bench-failover-", dir=args.dir)

    def report(figures: dict[str, Any]) -> None:
        print(
            f"kill {figures['kill']:3d}: n{figures['old']} -> n{figures['new']}, "
            f"election {figures['election']:.2f} s, unavailable "
            f"{figures['unavailable']:.2f} s, {figures['acked']} PUT_OK so far, "
            f"{figures['missing']} missing",
            file=sys.stderr, flush=True,
        )

    started = time.monotonic()
    try:
        with EtcdCluster(os.path.join(directory, "etcd")) as etcd, FailoverCluster(
            directory, etcd.spec, 3, lease_ttl=args.lease_ttl, segment_size=args.segment_size,
            auth=args.auth,
        ) as group:
            load = Producers(group, args.producers, args.body_size)
            try:
                kills = kill_masters(group, load, args.kills, report)
            finally:
                load.stop()
            puts = load.puts()
            end = converge_and_check(group, None)
    finally:
        shutil.rmtree(directory, ignore_errors=True)

    def percentile(values: list[float], p: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))]

    windows = [k["unavailable"] for k in kills]
    elections = [k["election"] for k in kills]
    statuses: dict[str, int] = {}
    for put in puts:
        statuses[put.status] = statuses.get(put.status, 0) + 1
    return {
        "benchmark": "failover",
        "machine": machine_info(),
        "kills": len(kills),
        "producers": args.producers,
        "lease_ttl_s": args.lease_ttl,
        # How the nodes prove their ids (docs/failover.md, "Who counts").
        "auth": args.auth,
        "unavailable_median_s": statistics.median(windows),
        "unavailable_p99_s": percentile(windows, 0.99),
        "unavailable_max_s": max(windows),
        "election_median_s": statistics.median(elections),
        "election_p99_s": percentile(elections, 0.99),
        "put_ok_lost": sum(k["missing"] for k in kills),
        "put_ok": statuses.get("PUT_OK", 0),
        "statuses": statuses,
        "identical": all(end["identical"].values()),
        "store_check_sound": all(end["check"].values()),
        "seconds": time.monotonic() - started,
        "per_kill": [
            {"election_s": round(k["election"], 3), "unavailable_s": round(k["unavailable"], 3)}
            for k in kills
        ],
    }


def _existing_dir(text: str) -> str:
    """
    C{--dir}: an existing directory, in which each benchmark makes (and
    removes) a scratch directory of its own; nothing else there is touched.
    """
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text}: no such directory")
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.bench")
    commands = parser.add_subparsers(dest="benchmark", required=True)
    store = commands.add_parser("store", help="put and transfer-read throughput")
    store.add_argument("--count", type=int, default=400_000, help="puts per run")
    store.add_argument("--body-size", type=int, default=1024)
    store.add_argument(
        "--batch", type=int, default=1, help="messages per put_batch (1: single puts)"
    )
    store.add_argument("--runs", type=int, default=5)
    store.add_argument("--segment-size", type=int, default=1 << 30)
    store.add_argument("--chunk", type=int, default=32768, help="read size (haTransferBatchSize)")
    store.add_argument("--dir", type=_existing_dir, default=None, help="where to create the stores")
    sync = commands.add_parser("sync", help="puts/s and latency, SYNC_MASTER or ASYNC_MASTER")
    sync.add_argument("--producers", type=int, default=1)
    sync.add_argument("--seconds", type=float, default=10.0)
    sync.add_argument(
        "--mode",
        choices=["sync", "async", "targets"],
        default="sync",
        help="targets: the ping-pong floor, SYNC at 1 producer, SYNC and ASYNC at "
        "--producers (32 if 1), alternating --runs times, with issue 15's ratios",
    )
    sync.add_argument("--runs", type=int, default=3, help="(targets, --against) runs of each variant (3)")
    sync.add_argument(
        "--reactor",
        choices=sorted(_REACTORS),
        default="epoll",
        help="the reactor of every process (uvloop: Twisted's asyncio reactor on uvloop)",
    )
    sync.add_argument("--body-size", type=int, default=1024)
    sync.add_argument(
        "--backlog",
        type=int,
        default=0,
        help="(sync, async) bytes of records in the master's store before it starts, "
        "which the slave copies before the clock starts and both scrubs re-read while "
        "the puts run (0)",
    )
    sync.add_argument(
        "--against",
        type=_existing_dir,
        default=None,
        help="(sync, async) another checkout (e.g. issue 31's filing, 976f6f3): --runs "
        "runs in each, alternating, with medians and their ratios",
    )
    sync.add_argument(
        "--busy-poll",
        type=int,
        default=None,
        metavar="US",
        help="both processes' --busy-poll, microseconds (default: rmqha's default, 200; "
        "0: off; docs/sync.md, 'Busy polling')",
    )
    sync.add_argument(
        "--producer",
        choices=["await", "callback"],
        default="await",
        help="(sync, async) each producer a coroutine awaiting Broker.put (await) or a "
        "chain of Broker.put_then answers (callback; with --against, this checkout's "
        "runs only); docs/sync.md, 'Puts without a Deferred'",
    )
    sync.add_argument("--json", action="store_true", help="(the last line is JSON either way)")
    sync.add_argument("--dir", type=_existing_dir, default=None)
    scrub = commands.add_parser("scrub", help="the background scrub's check, MB per CPU second")
    scrub.add_argument("--size", type=int, default=256 << 20, help="store bytes (256 MiB)")
    scrub.add_argument("--body-size", type=int, default=1024)
    scrub.add_argument("--runs", type=int, default=3)
    scrub.add_argument("--segment-size", type=int, default=128 << 20)
    scrub.add_argument("--dir", type=_existing_dir, default=None, help="where to create the store")
    scrub.add_argument(
        "--against", type=_existing_dir, default=None, help="another checkout, alternating"
    )
    replicate = commands.add_parser(
        "replicate", help="master -> slave over loopback vs. the raw socket ceiling"
    )
    replicate.add_argument("--size", type=int, default=1 << 30, help="backlog bytes (1 GiB)")
    replicate.add_argument("--runs", type=int, default=3)
    replicate.add_argument("--segment-size", type=int, default=1 << 30)
    replicate.add_argument("--throttle", type=float, default=1e6, help="slow slave's bytes/s")
    replicate.add_argument("--throttle-seconds", type=float, default=15.0)
    replicate.add_argument("--dir", type=_existing_dir, default=None, help="where to create the stores")
    replicate.add_argument(
        "--framing",
        choices=["checked", "classic"],
        default="checked",
        help="checked (what two rmqha peers negotiate) or classic (RocketMQ's)",
    )
    tls = commands.add_parser(
        "tls", help="replication throughput over mutual TLS vs TCP, in one run"
    )
    tls.add_argument("--size", type=int, default=1 << 30, help="backlog bytes (1 GiB)")
    tls.add_argument("--runs", type=int, default=3)
    tls.add_argument("--segment-size", type=int, default=1 << 30)
    tls.add_argument("--dir", type=_existing_dir, default=None, help="where to create the stores")
    tls.add_argument(
        "--framing",
        choices=["checked", "classic"],
        default="checked",
        help="both legs: checked (what two rmqha peers negotiate, over TLS too) or classic",
    )
    framing = commands.add_parser(
        "framing", help="replication throughput, checked framing against classic"
    )
    framing.add_argument("--size", type=int, default=1 << 30, help="backlog bytes (1 GiB)")
    framing.add_argument("--runs", type=int, default=3)
    framing.add_argument("--segment-size", type=int, default=1 << 30)
    framing.add_argument("--dir", type=_existing_dir, default=None, help="where to create the stores")
    spark_bench = commands.add_parser(
        "spark", help="scan + decode: plain reader vs Spark local[1] and local[2]"
    )
    spark_bench.add_argument("--size", type=int, default=2 << 30, help="store bytes (2 GiB)")
    spark_bench.add_argument("--runs", type=int, default=3)
    spark_bench.add_argument("--segment-size", type=int, default=1 << 30)
    spark_bench.add_argument("--dir", type=_existing_dir, default=None, help="where to create the store")
    spark_bench.add_argument(
        "--bodies", choices=["true", "false"], default="true",
        help="decode and move bodies (the data source's bodies option)",
    )
    spark_bench.add_argument(
        "--split-bytes", default=None, help="the data source's splitBytes (default: its own)"
    )
    spark_bench.add_argument(
        "--prune", action="store_true",
        help="read only the query's columns (size, body, crc_ok): a schema given to Spark's "
        "reader, columns= for the plain one",
    )
    spark_bench.add_argument(
        "--reader", choices=["both", "python", "jvm"], default="both",
        help="the Spark readers: the Python data source, the JVM span reader "
        "(rmqha.pipeline.source.read_store), or both in the same runs (default)",
    )
    spark_bench.add_argument(
        "--queries", type=int, default=2,
        help="timed queries per Spark run: the first (fresh JVM) and the median of the "
        "others (warm) are reported (2)",
    )
    source_bench = commands.add_parser(
        "source",
        help="format('rmqha') from a plain session vs the jobs' session; a topic filter vs "
        "the whole scan (Spark local[2])",
    )
    source_bench.add_argument("--size", type=int, default=400 << 20, help="store bytes (400 MiB)")
    source_bench.add_argument("--body-size", type=int, default=1024, help="message body bytes")
    source_bench.add_argument("--segment-size", type=int, default=128 << 20)
    source_bench.add_argument("--runs", type=int, default=3)
    source_bench.add_argument("--queries", type=int, default=3)
    source_bench.add_argument("--dir", type=_existing_dir, default=None, help="where to create the store")
    stream_bench = commands.add_parser(
        "stream",
        help="readStream.format('rmqha') following a master taking --rate puts/s: lag per "
        "micro-batch, from its store and from its HTTP",
    )
    stream_bench.add_argument("--rate", type=int, default=20_000, help="puts/s (20,000)")
    stream_bench.add_argument("--seconds", type=float, default=60.0)
    stream_bench.add_argument("--body-size", type=int, default=1024)
    stream_bench.add_argument("--sources", default="store,http", help="store,http")
    stream_bench.add_argument("--dir", type=_existing_dir, default=None, help="where the stores go")
    stats_bench = commands.add_parser(
        "stats", help="the stats job against a bare scan of its columns, Spark local[2]"
    )
    stats_bench.add_argument("--size", type=int, default=160 << 20, help="store bytes (160 MiB)")
    stats_bench.add_argument("--body-size", type=int, default=200, help="message body bytes")
    stats_bench.add_argument("--runs", type=int, default=5)
    stats_bench.add_argument("--reader", choices=["jvm", "python"], default="jvm")
    stats_bench.add_argument("--dir", type=_existing_dir, default=None, help="where to create the store")
    puts = commands.add_parser(
        "puts",
        help="put, put_batch of 32 and store check: this checkout against another "
        "(--against: a checkout of the code before), alternating",
    )
    puts.add_argument("--against", type=_existing_dir, required=True, help="the other checkout")
    puts.add_argument("--count", type=int, default=100_000, help="puts per run")
    puts.add_argument("--check-size", type=int, default=256 << 20, help="store check's bytes")
    puts.add_argument("--runs", type=int, default=3)
    puts.add_argument("--dir", type=_existing_dir, default=None, help="where to create the stores")
    roundtrip = commands.add_parser(
        "roundtrip",
        help="µs of Python per SYNC put and ack (master) and per frame (slave), in one "
        "process, no sockets",
    )
    roundtrip.add_argument("--count", type=int, default=20000, help="puts per run")
    roundtrip.add_argument("--body-size", type=int, default=1024)
    roundtrip.add_argument(
        "--per-ack", type=int, default=1,
        help="puts per ack (1; ~12 is what one ack covers at 32 producers)",
    )
    roundtrip.add_argument(
        "--producer",
        choices=["await", "callback"],
        default=None,
        help="instead of --per-ack: --producers producers each putting again as its "
        "put is answered, coroutines awaiting Broker.put (await) or chains of "
        "Broker.put_then answers (callback), one ack per round",
    )
    roundtrip.add_argument("--producers", type=int, default=32, help="(--producer) 32")
    roundtrip.add_argument("--runs", type=int, default=3)
    roundtrip.add_argument("--dir", type=_existing_dir, default=None, help="where the stores go")
    codec = commands.add_parser(
        "codec", help="µs per record of the codec's hot loops, pure Python vs compiled"
    )
    codec.add_argument("--count", type=int, default=20000, help="records per run")
    codec.add_argument("--body-size", type=int, default=1024)
    codec.add_argument("--runs", type=int, default=5)
    crc = commands.add_parser(
        "crc", help="the readers with the compiled CRC-32's folding on vs off (zlib), alternating"
    )
    crc.add_argument("--size", type=int, default=256 << 20, help="store bytes (256 MiB)")
    crc.add_argument("--segment-size", type=int, default=64 << 20)
    crc.add_argument("--runs", type=int, default=5)
    crc.add_argument("--dir", type=_existing_dir, default=None, help="where to create the store")
    sources = commands.add_parser(
        "sources",
        help="plain reader and Spark local[2] over a local store, an S3 server and a live "
        "broker's HTTP",
    )
    sources.add_argument("--size", type=int, default=512 << 20, help="store bytes (512 MiB)")
    sources.add_argument("--runs", type=int, default=3)
    sources.add_argument("--segment-size", type=int, default=128 << 20)
    sources.add_argument("--dir", type=_existing_dir, default=None, help="where to create the store")
    sources.add_argument(
        "--http-rate", default="4g", help="the broker's --serve-commitlog rate (default 4g)"
    )
    sources.add_argument("--bodies", choices=["true", "false"], default="true")
    sources.add_argument(
        "--readers", default="raw,plain,local[2]",
        help="which readers, of raw (the sources' own ceiling), plain (rmqha's reader in this "
        "process), local[2] (Spark, the Python source) and cluster (a Spark standalone cluster "
        "of two one-core workers, the JVM reader where it reads the source)",
    )
    failover = commands.add_parser(
        "failover",
        help="kill -9 the master of a 3-node failover group under HTTP load: unavailability "
        "window, election time, PUT_OK lost",
    )
    failover.add_argument("--kills", type=int, default=20, help="masters killed (20)")
    failover.add_argument("--producers", type=int, default=3, help="HTTP producer threads (3)")
    failover.add_argument("--body-size", type=int, default=512)
    failover.add_argument("--lease-ttl", type=int, default=2, help="the nodes' --lease-ttl (2)")
    failover.add_argument(
        "--auth", choices=("secret", "tls", "insecure"), default="secret",
        help="how the nodes prove their ids: a group secret (default), TLS client "
        "certificates, or --insecure-group",
    )
    failover.add_argument("--segment-size", type=int, default=4 << 20)
    failover.add_argument("--dir", type=_existing_dir, default=None, help="where the stores go")
    http_bench = commands.add_parser(
        "http", help="SYNC puts over the admin HTTP port: single puts and batches, 1 and 16 "
        "keep-alive connections, a twistd master and slave on loopback"
    )
    httpbench.add_arguments(http_bench, _existing_dir)
    pullbench.add_arguments(
        commands.add_parser(
            "pulls", help="a PullConsumer drains a backlog over remoting, against store check's "
            "rate on the same store"
        )
    )
    remoting_bench = commands.add_parser(
        "remoting", help="SYNC sends over the remoting port (1 and 32 connections, batches of "
        "32) against the in-process bench sync, a twistd master and slave on loopback"
    )
    remotingbench.add_arguments(remoting_bench, _existing_dir)
    commands.add_parser("_remoting-echo").add_argument("port")
    remoting_produce = commands.add_parser("_remoting-produce")
    for param in ("port", "connections", "seconds", "body_size"):
        remoting_produce.add_argument(param)
    remoting_send = commands.add_parser("_remoting-send")
    for param in ("port", "connections", "seconds", "body_size", "batch"):
        remoting_send.add_argument(param)
    for name, params in [
        ("_spark-scan", ["store", "master"]),
        ("_source-scan", ["store", "session"]),
        ("_paced-master", ["store", "http_port", "rate", "seconds", "body_size"]),
        ("_serve-master", ["store"]),
        ("_run-slave", ["store", "port", "target", "throttle", "seconds"]),
        ("_raw-receive", ["path"]),
        ("_pingpong-echo", []),
    ]:
        helper = commands.add_parser(name)
        for param in params:
            helper.add_argument(param)
        if name == "_source-scan":
            helper.add_argument("--queries", type=int, default=3)
        if name == "_spark-scan":
            helper.add_argument("--bodies", default="true")
            helper.add_argument("--split-bytes", default=None)
            helper.add_argument("--prune", action="store_true")
            helper.add_argument("--reader", choices=["python", "jvm"], default="python")
            helper.add_argument("--queries", type=int, default=2)
        if name in ("_serve-master", "_run-slave"):
            helper.add_argument("--tls", default=None, help="an rmqha certs init directory")
        if name == "_run-slave":
            helper.add_argument("--checked", action="store_true", help="checked framing")
            helper.add_argument("--segment-size", type=int, default=None)
    args = parser.parse_args(argv)
    if not args.benchmark.startswith("_"):
        _warn_page_reporting(free_page_reporting())
    if args.benchmark == "_serve-master":
        return _serve_master(args.store, args.tls)
    if args.benchmark == "_run-slave":
        return _run_slave(
            args.store, int(args.port), int(args.target), float(args.throttle),
            float(args.seconds), args.tls, args.checked, args.segment_size,
        )
    if args.benchmark == "_paced-master":
        return _paced_master(args.store, args.http_port, args.rate, args.seconds, args.body_size)
    if args.benchmark == "stream":
        result = _stream_bench(args)
        print(
            "stream: " + "; ".join(
                f"from the {w}: lag median {result[w]['lag_median_s'] or 0:.2f} s, max "
                f"{result[w]['lag_max_s'] or 0:.2f} s, {result[w]['rows_per_s']:,.0f} rows/s over "
                f"{result[w]['batches']} batches, {result[w]['backlog_bytes_at_stop'] or 0:,} bytes "
                "behind at the stop"
                for w in args.sources.split(",")
            ) + f" (the master taking {args.rate:,} puts/s)",
            file=sys.stderr,
        )
        print(json.dumps(result))
        return None
    if args.benchmark == "_source-scan":
        return _source_scan(args.store, args.session, args.queries)
    if args.benchmark == "source":
        result = _source_bench(args)
        print(
            f"source: format('rmqha') from a plain session {result['plain_scan_seconds']:.2f} s = "
            f"{100 * result['plain_fraction_of_helper']:.0f}% of the jobs' session's speed "
            f"({result['helper_scan_seconds']:.2f} s); one topic of four "
            f"{result['plain_topic_seconds']:.2f} s = {result['topic_speedup']:.1f}x faster than "
            f"the whole scan; {result['records']:,} records, median of {args.runs}",
            file=sys.stderr,
        )
        print(json.dumps(result))
        return None
    if args.benchmark == "_spark-scan":
        return _spark_scan(
            args.store, args.master, args.bodies, args.split_bytes, args.prune, args.reader,
            args.queries,
        )
    if args.benchmark == "puts":
        result = _puts_bench(args)
        check = (
            f"; store check {100 * result['before_check_fraction_of_crc32']:.0f}% -> "
            f"{100 * result['after_check_fraction_of_crc32']:.0f}% of zlib.crc32, RSS +"
            f"{result['before_check_rss_growth_mib']:.0f} -> "
            f"+{result['after_check_rss_growth_mib']:.0f} MiB"
            if "before_check_fraction_of_crc32" in result
            else ""
        )
        print(
            f"puts: put {result['before_batch1_msgs_per_s']:,.0f} -> "
            f"{result['after_batch1_msgs_per_s']:,.0f} msgs/s of process CPU "
            f"({result['put_speedup']:.2f}x; put thread "
            f"{result['after_batch1_thread_msgs_per_s']:,.0f}; wall clock "
            f"{result['before_batch1_wall_msgs_per_s']:,.0f} -> "
            f"{result['after_batch1_wall_msgs_per_s']:,.0f}, {result['put_wall_speedup']:.2f}x); "
            f"put_batch 32 {result['before_batch32_msgs_per_s']:,.0f} -> "
            f"{result['after_batch32_msgs_per_s']:,.0f} msgs/s "
            f"({result['batch32_speedup']:.2f}x){check}; median of {args.runs}",
            file=sys.stderr,
        )
        print(json.dumps(result))
        return None
    if args.benchmark == "_remoting-send":
        return remotingbench.send_load(
            int(args.port), int(args.connections), float(args.seconds), int(args.body_size),
            int(args.batch),
        )
    if args.benchmark == "_remoting-produce":
        return remotingbench.produce_load(
            int(args.port), int(args.connections), float(args.seconds), int(args.body_size)
        )
    if args.benchmark == "_remoting-echo":
        return remotingbench.echo_server(int(args.port))
    if args.benchmark == "remoting":
        _install_reactor()
        result = remotingbench.remoting_bench(args)
        print(remotingbench.report(result), file=sys.stderr)
        if args.profile:
            httpbench.print_profile(args.profile)
        print(json.dumps(result))
        return None
    if args.benchmark == "http":
        result = httpbench.http_bench(args)
        print(httpbench.report(result, args), file=sys.stderr)
        if args.profile:
            httpbench.print_profile(args.profile)
        print(json.dumps(result))
        return None
    if args.benchmark == "pulls":
        result = pullbench.pull_bench(args)
        print(pullbench.report(result), file=sys.stderr)
        if args.profile:
            httpbench.print_profile(args.profile)
        print(json.dumps(result))
        return None
    if args.benchmark == "failover":
        result = _failover_bench(args)
        print(
            f"failover: unavailable median {result['unavailable_median_s']:.2f} s, p99 "
            f"{result['unavailable_p99_s']:.2f} s; election median "
            f"{result['election_median_s']:.2f} s, p99 {result['election_p99_s']:.2f} s; "
            f"{result['put_ok_lost']} of {result['put_ok']} PUT_OK lost; stores "
            f"{'identical' if result['identical'] else 'DIFFER'}, store check "
            f"{'sound' if result['store_check_sound'] else 'FAILED'} ({result['kills']} kills)",
            file=sys.stderr,
        )
        print(json.dumps(result))
        return None
    if args.benchmark == "roundtrip":
        result = _roundtrip(args)
        print(
            f"roundtrip: master put+ack {result['master_put_and_ack_us']['best']:.2f} µs, "
            f"slave frame {result['slave_frame_us']['best']:.2f} µs (best of {args.runs}; "
            f"medians {result['master_put_and_ack_us']['median']:.2f}, "
            f"{result['slave_frame_us']['median']:.2f})"
        )
        print(json.dumps(result))
        return None
    if args.benchmark == "codec":
        result = _codec_bench(args)
        print(
            "codec: "
            + ", ".join(
                f"{name} {result[f'pure_{name}_us']:.2f} -> {result[f'compiled_{name}_us']:.2f} "
                f"µs ({result[f'{name}_speedup']:.1f}x)"
                for name in ("encode", "check_record", "replica_validator", "walk_valid")
            )
            + f"; CRC-32 per record: zlib.crc32 {result['pure_crc32_us']:.2f} -> compiled "
            f"{result['compiled_crc32_us']:.2f} µs; median of {args.runs}"
        )
        print(json.dumps(result))
        return None
    if args.benchmark == "crc":
        result = _crc_bench(args)
        print(
            "crc: "
            + ", ".join(
                f"{what} {result[f'zlib_{name}_mb_per_s']:,} -> {result[f'fold_{name}_mb_per_s']:,}"
                f" MB/s ({result[f'zlib_{name}_mb_per_cpu_s']:,} -> "
                f"{result[f'fold_{name}_mb_per_cpu_s']:,} MB per CPU s)"
                for name, what in (
                    ("plain", "plain reader"),
                    ("plain_nobodies", "without bodies"),
                    ("check", "store check"),
                    ("crc32", "CRC-32 alone"),
                )
            )
            + f"; zlib -> folding, median of {args.runs}"
        )
        print(json.dumps(result))
        return None
    if args.benchmark == "sources":
        result = _sources_bench(args)
        print(
            "sources: " + "; ".join(
                f"{reader}: S3 {100 * result[f'{key}_s3_fraction_of_local']:.0f}%, HTTP "
                f"{100 * result[f'{key}_http_fraction_of_local']:.0f}% of local "
                f"({result[f'{key}_local_mb_per_s']:,.0f} MB/s)"
                for reader in args.readers.split(",") if reader != "raw"
                for key in [reader.replace("[", "").replace("]", "")]
            ) + f"; median of {args.runs}",
            file=sys.stderr,
        )
        if "raw_s3_fraction_of_plain_local" in result:
            print(
                f"sources: raw ceilings: S3 {result['raw_s3_mb_per_s']:,.0f} MB/s "
                f"({100 * result['raw_s3_fraction_of_plain_local']:.0f}% of the plain reader's "
                f"local), HTTP {result['raw_http_mb_per_s']:,.0f} MB/s "
                f"({100 * result['raw_http_fraction_of_plain_local']:.0f}%)",
                file=sys.stderr,
            )
        print(json.dumps(result))
        return None
    if args.benchmark == "stats":
        result = _stats_bench(args)
        print(
            f"stats {result['stats_seconds']:.2f} s = {result['stats_over_scan']:.2f}x a bare scan "
            f"of its columns ({result['scan_seconds']:.2f} s); CPU "
            f"{result['stats_over_scan_cpu']:.2f}x ({result['stats_cpu_s']:.2f} s, "
            f"{result['scan_cpu_s']:.2f} s); {result['records']:,} records, "
            f"{result['reader']} reader",
            file=sys.stderr,
        )
        print(json.dumps(result))
        return None
    if args.benchmark == "spark":
        result = _spark_bench(args)
        summaries = []
        for reader in result["readers"]:
            p = "jvm_" if reader == "jvm" else ""
            summaries.append(
                f"{reader} reader: local[2] {result[f'{p}local2_mb_per_s']:,.0f} MB/s = "
                f"{result[f'{p}local2_speedup_over_local1']:.2f}x local[1] "
                f"({result[f'{p}local1_mb_per_s']:,.0f} MB/s), local[1] = "
                f"{100 * result[f'{p}local1_fraction_of_plain']:.0f}% of the plain reader; "
                f"first query in a fresh JVM: local[2] "
                f"{result[f'first_{p}local2_speedup_over_local1']:.2f}x local[1], local[1] "
                f"{100 * result[f'first_{p}local1_fraction_of_plain']:.0f}% of plain"
            )
        print(
            f"spark: {'; '.join(summaries)}; "
            f"plain reader ({result['plain_mb_per_s']:,.0f} MB/s) "
            f"{100 * result['plain_fraction_of_crc32']:.0f}% and store check "
            f"{100 * result['check_fraction_of_crc32']:.0f}% of zlib.crc32 "
            f"({result['crc32_mb_per_s']:,.0f} MB/s); {result['codec']} codec; "
            f"median of {args.runs}"
        )
        print(json.dumps(result))
        return None
    if args.benchmark in _PAIRED:
        variants = _PAIRED[args.benchmark]
        if args.benchmark == "tls" and args.framing == "checked":
            variants = {v: {**o, "checked": True} for v, o in variants.items()}
        base, other = variants
        result = _paired(args, args.benchmark, variants)
        if args.benchmark == "tls":
            result["framing"] = args.framing
        print(
            f"{args.benchmark}: {other} {result[f'{other}_mb_per_s']:,.0f} MB/s, "
            f"{base} {result[f'{base}_mb_per_s']:,.0f} MB/s: "
            f"{100 * result[f'{other}_fraction_of_{base}']:.0f}% (median of {args.runs})"
        )
        print(json.dumps(result))
        return None
    if args.benchmark == "_raw-receive":
        return _raw_receive(args.path)
    if args.benchmark == "_pingpong-echo":
        return _pingpong_echo()
    if args.benchmark == "sync":
        if args.reactor == "uvloop":
            try:
                import uvloop  # noqa: F401
            except ImportError:
                parser.error("--reactor uvloop needs uvloop: pip install uvloop")
        # (Before anything imports the default reactor.)
        os.environ["RMQHA_BENCH_REACTOR"] = args.reactor
        _install_reactor()
    if args.benchmark == "sync" and args.against is not None:
        if args.mode == "targets":
            parser.error("--against takes --mode sync or async")
        if args.backlog:
            parser.error("--backlog is not given to --against (the other checkout's bench may not know it)")
    if args.benchmark == "sync" and args.mode == "targets":
        if args.backlog:
            parser.error("--backlog takes --mode sync or async")

        def run_targets(reactor: Any) -> Deferred[None]:
            async def go() -> None:
                result = await _sync_targets(reactor, args)
                for name, figures in result["medians"].items():
                    print(
                        f"{name}: {figures['puts_per_s']:,.0f}/s, p50 {figures['p50_us']:.0f} us, "
                        f"p99 {figures['p99_us']:.0f} us, p99.9 {figures['p999_us']:.0f} us"
                    )
                print(
                    f"SYNC at {result['producers']} producers = "
                    f"{100 * result['sync_many_fraction_of_async']:.0f}% of ASYNC; SYNC at 1 "
                    f"producer p50 = {result['sync_1_p50_over_floor_p50']:.2f}x the ping-pong "
                    f"floor, p99 = {result['sync_1_p99_over_p50']:.1f}x its p50 "
                    f"(median of {args.runs})"
                )
                print(json.dumps(result))

            return ensureDeferred(go())

        react(run_targets)
        return None
    if args.benchmark == "sync" and args.against is not None:
        result = _sync_against(args)
        print(
            f"{args.mode.upper()}_MASTER, {args.producers} producers, {args.runs} runs each: "
            f"{result['this_puts_per_s']:,.0f} against {result['against_puts_per_s']:,.0f} "
            f"puts/s ({result['puts_ratio']:.2f}x; paired {result['paired_ratios']}), p99 "
            f"{result['this_p99_us']:.0f} against {result['against_p99_us']:.0f} us "
            f"({result['p99_ratio']:.2f}x)"
        )
        print(json.dumps(result))
        return None
    if args.benchmark == "sync":

        def run_sync(reactor: Any) -> Deferred[None]:
            async def go() -> None:
                result = await _sync(
                    reactor,
                    args.mode,
                    args.producers,
                    args.seconds,
                    args.body_size,
                    args.dir,
                    args.busy_poll,
                    args.producer,
                    args.backlog,
                )
                print(
                    f"{args.mode.upper()}_MASTER, {args.producers} producers: "
                    f"{result['puts_per_s']:,.0f} puts/s, p50 {result['p50_us']:.0f} us, "
                    f"p99 {result['p99_us']:.0f} us, p99.9 {result['p999_us']:.0f} us "
                    f"{result['statuses']}"
                )
                print(json.dumps(result))

            return ensureDeferred(go())

        react(run_sync)
        return None
    if args.benchmark == "scrub":
        result = _scrub(args)
        this = result["this"]
        against = (
            f"; against {result['against']['mb_per_cpu_s']:,.0f} MB per CPU second, "
            f"{result['against']['us_per_record']:.2f} us a record ({result['speedup']:.1f}x)"
            if "against" in result
            else ""
        )
        print(
            f"scrub: {this['mb_per_cpu_s']:,.0f} MB per CPU second, "
            f"{this['us_per_record']:.2f} us a record, the default rate "
            f"{100 * this['core_share_at_default_rate']:.1f}% of a core{against} "
            f"(median of {args.runs})",
            file=sys.stderr,
        )
        print(json.dumps(result))
        return None
    if args.benchmark == "replicate":
        result = _replicate(args)
        print(
            f"replicate: {result['rmqha_mb_per_s']:,.0f} MB/s, "
            f"{100 * result['fraction_of_raw']:.0f}% of the raw ceiling "
            f"({result['raw_mb_per_s']:,.0f} MB/s), median of {args.runs}; MB per CPU "
            f"second against the raw copy's: slave {result['slave_cpu_fraction_of_raw']:.2f}, "
            f"master {result['master_cpu_fraction_of_raw']:.2f}; master RSS "
            f"growth {result['master_rss_growth_mib']} MiB (throttled slave: "
            f"{result['throttled_master_rss_growth_mib']} MiB)"
        )
        print(json.dumps(result))
        return None

    def run(reactor: Any) -> Deferred[None]:
        async def go() -> None:
            result = await _store(reactor, args)
            print(
                f"put:  {result['put_msgs_per_s']:,.0f} msgs/s, "
                f"{result['put_mb_per_s']:,.0f} MB/s (median of {args.runs})"
            )
            print(
                f"read: {result['read_gb_per_s']:.2f} GB/s (median of {args.runs})"
            )
            print(json.dumps(result))

        return ensureDeferred(go())

    react(run)


if __name__ == "__main__":
    main()
