# -*- test-case-name: tests.test_bench -*-
"""
C{python -m tools.bench http}: SYNC puts over the admin HTTP port of a
C{twistd rmqha} SYNC_MASTER with one C{twistd rmqha} slave, both on
loopback: single puts (C{POST /topics/T/messages}) over keep-alive
connections from 1 and C{--connections} (16) clients, and batches
(C{POST /topics/T/batch}, C{--batch} messages each, 32; JSON with base64
bodies and length-prefixed binary) from the same,
alternating in one run; messages/s, requests/s and latency percentiles,
and the ratio of batches to single puts.

The clients are one Twisted process (this one), each connection sending
its next request when the answer to the previous one is in (no
pipelining); every answer is read and its per-message statuses counted.
C{--against CHECKOUT} also starts a master and slave from another
checkout (the code before a change; its C{rmqha} with the accelerator
built) and runs single puts against them, alternating with the others:
today's single-put rate, in the same run.
C{--profile FILE} runs the master under cProfile (twistd's
C{--profiler cprofile}) and prints its top functions (the figures are
then the profiled broker's, slower).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import pstats
import shutil
import statistics
import subprocess
import tempfile
import time
import urllib.request
from typing import Any

from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import deferLater

from tools.processes import free_ports, twistd_command, twistd_slave_command

__all__ = ["add_arguments", "http_bench", "batch_json", "batch_binary"]

TOPIC = "BenchTopic"


def batch_json(bodies: list[bytes], queue_id: int = 0) -> bytes:
    """
    The JSON body of a batch of C{bodies} (base64).
    """
    return json.dumps(
        {
            "messages": [
                {"body_base64": base64.b64encode(b).decode("ascii"), "queueId": queue_id}
                for b in bodies
            ]
        }
    ).encode()


def batch_binary(bodies: list[bytes]) -> bytes:
    """
    The length-prefixed binary body of a batch of C{bodies}.
    """
    return b"".join(len(b).to_bytes(4, "big") + b for b in bodies)


def _request(path: str, body: bytes, content_type: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: {content_type}\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body


class _Client(Protocol):
    """
    One keep-alive connection: send C{request}, read the whole answer,
    count its messages' statuses, send again until the deadline.
    """

    def __init__(self, request: bytes, deadline: float, tally: dict[str, Any]) -> None:
        self.request = request
        self.deadline = deadline
        self.tally = tally
        self.buffer = b""
        self.done: Deferred[None] = Deferred()

    def connectionMade(self) -> None:
        self.send()

    def send(self) -> None:
        self.started = time.perf_counter_ns()
        assert self.transport is not None
        self.transport.write(self.request)

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        while True:
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buffer[:head_end].lower()
            at = head.find(b"content-length:")
            if at >= 0:
                at += 15
                line_end = head.find(b"\r\n", at)
                end = head_end + 4 + int(head[at : line_end if line_end >= 0 else len(head)])
                if len(self.buffer) < end:
                    return
                body = self.buffer[head_end + 4 : end]
            else:
                # Chunked (an answer written after NOT_DONE_YET without a length).
                body, end = self._chunked(head_end + 4)
                if end < 0:
                    return
            self.buffer = self.buffer[end:]
            self.answered(int(head[9:12]), body)

    def _chunked(self, at: int) -> tuple[bytes, int]:
        parts: list[bytes] = []
        buffer = self.buffer
        while True:
            line_end = buffer.find(b"\r\n", at)
            if line_end < 0:
                return b"", -1
            size = int(buffer[at:line_end].split(b";")[0], 16)
            start = line_end + 2
            if len(buffer) < start + size + 2:
                return b"", -1
            if size == 0:
                return b"".join(parts), start + 2
            parts.append(buffer[start : start + size])
            at = start + size + 2

    def answered(self, code: int, body: bytes) -> None:
        tally = self.tally
        tally["latencies"].append(time.perf_counter_ns() - self.started)
        answer = json.loads(body)
        statuses = tally["statuses"]
        for result in answer.get("results", (answer,)):
            statuses[result["status"]] = statuses.get(result["status"], 0) + 1
            if result.get("stored"):
                tally["stored"] += 1
        tally["codes"][code] = tally["codes"].get(code, 0) + 1
        if time.perf_counter() < self.deadline:
            self.send()
        else:
            assert self.transport is not None
            self.transport.loseConnection()

    def connectionLost(self, reason: Any = None) -> None:
        if not self.done.called:
            self.done.callback(None)


def _cpu_seconds(pid: int) -> float:
    """
    CPU seconds (user + system) process C{pid} has used.
    """
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _load(
    reactor: Any,
    port: int,
    request: bytes,
    connections: int,
    seconds: float,
    processes: dict[str, int],
) -> dict[str, Any]:
    from twisted.internet.endpoints import TCP4ClientEndpoint

    tally: dict[str, Any] = {"latencies": [], "statuses": {}, "codes": {}, "stored": 0}
    deadline = time.perf_counter() + seconds
    clients = []
    cpu_before = {name: _cpu_seconds(pid) for name, pid in processes.items()}
    started = time.perf_counter()
    for _ in range(connections):
        client = _Client(request, deadline, tally)
        clients.append(client)
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port)
        await endpoint.connect(Factory.forProtocol(lambda c=client: c))  # type: ignore[misc]
    await gatherResults([c.done for c in clients])
    elapsed = time.perf_counter() - started
    cpu = {name: _cpu_seconds(pid) - cpu_before[name] for name, pid in processes.items()}
    latencies = sorted(tally["latencies"])

    def percentile(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] / 1000

    return {
        "seconds": elapsed,
        "requests": len(latencies),
        "requests_per_s": len(latencies) / elapsed,
        "messages_per_s": tally["stored"] / elapsed,
        "stored": tally["stored"],
        "p50_us": percentile(0.5),
        "p99_us": percentile(0.99),
        "statuses": tally["statuses"],
        "codes": tally["codes"],
        # CPU µs per stored message in each process, and its share of the
        # wall clock (1.0: a core busy throughout).
        **{
            f"{name}_cpu_us_per_message": 1e6 * used / max(tally["stored"], 1)
            for name, used in cpu.items()
        },
        **{f"{name}_busy": used / elapsed for name, used in cpu.items()},
    }


def _get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as answer:
        result: dict[str, Any] = json.load(answer)
        return result


def _wait_for_slave(http_port: int, master: "subprocess.Popen[Any]") -> None:
    from tools.bench import wait_http

    url = f"http://127.0.0.1:{http_port}/status"
    wait_http(url, master, "the master")
    deadline = time.monotonic() + 60
    while True:
        status = _get_json(url)
        if any(s.get("ack_offset") is not None for s in status.get("slaves", [])):
            return
        if time.monotonic() > deadline:
            raise RuntimeError("the slave did not report to the master in 60 s")
        time.sleep(0.1)


class _Pair:
    """
    A C{twistd rmqha} SYNC_MASTER with an admin port and its slave, from
    the code in C{checkout} (C{None}: this one).
    """

    def __init__(
        self, root: str, name: str, checkout: str | None, args: argparse.Namespace,
        profile: str | None,
    ) -> None:
        ha_port, self.http_port = free_ports(2)
        env = None
        if checkout is not None:
            env = dict(os.environ, PYTHONPATH=checkout)
        master_command = twistd_command(
            os.path.join(root, f"{name}-master"), os.path.join(root, f"{name}-master.log"),
            "--role", "SYNC_MASTER", "--segment-size", str(args.segment_size),
            "--ha-listen", f"tcp:{ha_port}:interface=127.0.0.1",
            "--http", f"tcp:{self.http_port}:interface=127.0.0.1",
            *args.master_option,
        )
        if profile is not None:
            at = master_command.index("rmqha")
            master_command[at:at] = ["--profile", profile, "--profiler", "cprofile", "--savestats"]
        self.master = subprocess.Popen(master_command, env=env, cwd=checkout)
        self.slave = subprocess.Popen(
            twistd_slave_command(
                os.path.join(root, f"{name}-slave"), f"tcp:host=127.0.0.1:port={ha_port}",
                os.path.join(root, f"{name}-slave.log"), "--segment-size", str(args.segment_size),
            ),
            env=env,
            cwd=checkout,
        )

    def ready(self, body: bytes) -> None:
        """
        Wait for the slave's first report, then put one message (the first
        segment is made then: not on the clock).
        """
        _wait_for_slave(self.http_port, self.master)
        urllib.request.urlopen(
            urllib.request.Request(
                f"http://127.0.0.1:{self.http_port}/topics/{TOPIC}/messages", data=body
            ),
            timeout=30,
        ).read()

    def stop(self) -> None:
        for process in (self.master, self.slave):
            process.terminate()
        for process in (self.master, self.slave):
            process.wait()


def http_bench(args: argparse.Namespace) -> dict[str, Any]:
    """
    The HTTP benchmark (module docstring): its figures as one dict.
    """
    from tools.bench import machine_info, _progress

    from twisted.internet.task import react

    root = tempfile.mkdtemp(prefix="rmqha-bench-", dir=args.dir)
    profile = os.path.abspath(args.profile) if args.profile else None
    pairs = {"": _Pair(root, "now", None, args, profile)}
    if args.against:
        pairs["before_"] = _Pair(root, "before", os.path.abspath(args.against), args, None)
    body = os.urandom(args.body_size)
    single = _request(f"/topics/{TOPIC}/messages", body, "application/octet-stream")
    bodies = [body] * args.batch
    batches = {
        "batch": _request(f"/topics/{TOPIC}/batch", batch_json(bodies), "application/json"),
        "binary": _request(
            f"/topics/{TOPIC}/batch", batch_binary(bodies), "application/x-rmqha-batch"
        ),
    }
    formats = {"json": ["batch"], "binary": ["binary"], "both": ["batch", "binary"]}
    variants: dict[str, tuple[_Pair, bytes, int]] = {}
    for prefix, pair in pairs.items():
        variants[f"{prefix}single_1"] = (pair, single, 1)
        variants[f"{prefix}single_{args.connections}"] = (pair, single, args.connections)
    for kind in formats[args.batch_format] if args.batch > 1 else ():
        for n in (1, args.connections):
            variants[f"{kind}{args.batch}_{n}"] = (pairs[""], batches[kind], n)
    if args.only:
        variants = {name: variants[name] for name in args.only.split(",")}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    load_before = os.getloadavg()
    try:
        for pair in pairs.values():
            pair.ready(body)

        def main(reactor: Any) -> Deferred[None]:
            async def go() -> None:
                for run in range(args.runs):
                    for name, (pair, request, connections) in variants.items():
                        _progress(f"run {run + 1}/{args.runs}: {name}")
                        runs[name].append(
                            await _load(
                                reactor, pair.http_port, request, connections, args.seconds,
                                {
                                    "master": pair.master.pid,
                                    "slave": pair.slave.pid,
                                    "clients": os.getpid(),
                                },
                            )
                        )
                        await deferLater(reactor, 0.2, lambda: None)

            from twisted.internet.defer import ensureDeferred

            return ensureDeferred(go())

        try:
            react(main)
        except SystemExit as e:
            if e.code:
                raise
    finally:
        for pair in pairs.values():
            pair.stop()
        shutil.rmtree(root, ignore_errors=True)

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    out: dict[str, Any] = {
        "benchmark": "http",
        "machine": machine_info(),
        "load_average": [list(load_before), list(os.getloadavg())],
        "runs": args.runs,
        "seconds": args.seconds,
        "body_size": args.body_size,
        "batch": args.batch,
        "batch_format": args.batch_format,
        "connections": args.connections,
        "medians": {
            name: {
                k: median(name, k)
                for k in runs[name][0]
                if isinstance(runs[name][0][k], float) and k != "seconds"
            }
            for name in variants
        },
        "all": runs,
    }
    for n in (1, args.connections):
        for kind in ("batch", "binary"):
            batched = f"{kind}{args.batch}_{n}"
            for prefix in ("", "before_"):
                singles = f"{prefix}single_{n}"
                if batched in runs and singles in runs:
                    out[f"{kind}_over_{singles}"] = median(
                        batched, "messages_per_s"
                    ) / median(singles, "messages_per_s")
        if f"single_{n}" in runs and f"before_single_{n}" in runs:
            out[f"single_{n}_now_over_before"] = median(f"single_{n}", "messages_per_s") / median(
                f"before_single_{n}", "messages_per_s"
            )
    if profile is not None:
        out["profile"] = profile
    return out


def print_profile(path: str, top: int = 30) -> None:
    """
    The profiled master's top functions by internal and cumulative time.
    """
    stats = pstats.Stats(path)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)


def add_arguments(parser: argparse.ArgumentParser, existing_dir: Any) -> None:
    parser.add_argument("--seconds", type=float, default=5.0, help="per variant and run (5)")
    parser.add_argument("--runs", type=int, default=3, help="alternating runs of each variant (3)")
    parser.add_argument("--connections", type=int, default=16, help="the many-connection case (16)")
    parser.add_argument("--batch", type=int, default=32, help="messages per batch (32; 1: none)")
    parser.add_argument(
        "--batch-format", choices=["json", "binary", "both"], default="both",
        help="the batches' bodies: JSON with base64 bodies (batch32_N), length-prefixed "
        "binary (binary32_N), or both (default)",
    )
    parser.add_argument(
        "--only", default=None, metavar="NAMES",
        help="only these variants, e.g. batch32_1,single_16 (default: all)",
    )
    parser.add_argument(
        "--against", default=None, metavar="CHECKOUT",
        help="also run single puts against a master and slave from another checkout (the "
        "code before a change), alternating: before_single_1, before_single_16",
    )
    parser.add_argument("--body-size", type=int, default=1024)
    parser.add_argument("--segment-size", type=int, default=256 << 20)
    parser.add_argument(
        "--master-option", action="append", default=[],
        help="a further twistd rmqha option for the master (repeatable)",
    )
    parser.add_argument(
        "--profile", default=None, metavar="FILE",
        help="run the master under cProfile, stats saved to FILE and the top printed",
    )
    parser.add_argument("--dir", type=existing_dir, default=None, help="where the stores go")


def report(result: dict[str, Any], args: argparse.Namespace) -> str:
    medians = result["medians"]
    parts = [
        f"{name}: {m['messages_per_s']:,.0f} msgs/s ({m['requests_per_s']:,.0f} req/s, "
        f"p50 {m['p50_us']:,.0f} µs, p99 {m['p99_us']:,.0f} µs; CPU µs a message: master "
        f"{m['master_cpu_us_per_message']:.1f}, slave {m['slave_cpu_us_per_message']:.1f}, "
        f"clients {m['clients_cpu_us_per_message']:.1f}; master busy {m['master_busy']:.0%})"
        for name, m in medians.items()
    ]
    ratios = [
        f"{key.replace('_', ' ')}: {value:.2f}x"
        for key, value in result.items()
        if "_over_" in key
    ]
    return "http: " + "; ".join(parts + ratios) + f" (median of {args.runs})"
