# -*- test-case-name: tests.test_bench -*-
"""
C{python -m tools.bench remoting}: SYNC sends over the remoting port of a
C{twistd rmqha} SYNC_MASTER with one C{twistd rmqha} slave, both on
loopback (L{tools.httpbench}'s pair, with C{--listen}): SEND_MESSAGE_V2
(310) from 1 and C{--connections} (32) connections, SEND_BATCH_MESSAGE
(320) of C{--batch} (32) messages from the same, and, alternating with
them in the same run, the in-process C{bench sync --producers 1} and
C{--producers 32}; messages/s, latency, CPU per message in each process,
and the ratios against issue 30's targets.

The load generator is a separate process (L{send_load}, the C{_remoting-send}
helper): a raw frame sender on plain sockets and C{selectors}, each
connection sending its next frame when the answer to the previous one
is in (one request in flight per connection, as a SYNC producer thread
of a Java client).  The frames are what a 4.9.8 producer sends (JSON
header, the V2 short names, properties C{UNIQ_KEY} and C{WAIT}), encoded
once by rmqha's codec; per send only the opaque's ten digits are
rewritten.  Every answer's code and opaque are read.  L{rmqha.client}'s
producer is not used: it costs more CPU a send than the broker does, and
the two would share the machine's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

from tools.httpbench import TOPIC, _cpu_seconds, _Pair

__all__ = ["add_arguments", "remoting_bench", "send_frames", "send_load", "report"]

#: The opaques sent: always 10 digits, so a frame's length never changes.
_OPAQUE_BASE = 1_000_000_000


def send_frames(body_size: int, batch: int, queue_id: int) -> bytes:
    """
    The frame of one send: SEND_MESSAGE_V2 of one C{body_size} body, or
    (C{batch} > 1) SEND_BATCH_MESSAGE of C{batch} of them, to
    L{TOPIC} queue C{queue_id}, with opaque L{_OPAQUE_BASE}.
    """
    from rmqha.client._codec import encode_batch, properties_string
    from rmqha.remoting._frames import RemotingCommand, encode, header_to_ext_fields
    from rmqha.remoting.codes import RequestCode
    from rmqha.remoting.sends import SendMessageRequestHeaderV2

    body = os.urandom(body_size)
    uniq = "7F00000100002A9F0000000000000000"  # (a 32-hex-digit UNIQ_KEY)
    if batch > 1:
        payload = encode_batch(
            [(body, 0, properties_string({"UNIQ_KEY": uniq})) for _ in range(batch)]
        )
        properties = properties_string({"WAIT": "true"})
        code = RequestCode.SEND_BATCH_MESSAGE
    else:
        payload = body
        properties = properties_string({"WAIT": "true", "UNIQ_KEY": uniq})
        code = RequestCode.SEND_MESSAGE_V2
    header = SendMessageRequestHeaderV2(
        a="BenchProducerGroup", b=TOPIC, c="TBW102", d=4, e=queue_id, f=0,
        g=int(time.time() * 1000), h=0, i=properties, j=0, k=False, m=batch > 1,
    )
    return encode(
        RemotingCommand(
            code=code, opaque=_OPAQUE_BASE, ext_fields=header_to_ext_fields(header), body=payload
        )
    )


class _Connection:
    def __init__(self, sock: socket.socket, frame: bytes) -> None:
        self.sock = sock
        self.frame = bytearray(frame)
        marker = b'"opaque":%d' % _OPAQUE_BASE
        self.at = frame.index(marker) + len(marker) - 10
        self.buffer = bytearray()
        self.opaque = _OPAQUE_BASE
        self.started = 0

    def send(self) -> None:
        self.opaque = _OPAQUE_BASE + (self.opaque + 1 - _OPAQUE_BASE) % 1_000_000_000
        self.frame[self.at : self.at + 10] = b"%d" % self.opaque
        self.started = time.perf_counter_ns()
        self.sock.sendall(self.frame)

    def answer(self) -> tuple[int, int] | None:
        """
        (code, opaque) of the answer once it is whole, else None.
        """
        buffer = self.buffer
        if len(buffer) < 8:
            return None
        length = int.from_bytes(buffer[:4], "big")
        if len(buffer) < 4 + length:
            return None
        header_length = int.from_bytes(buffer[5:8], "big")
        header = json.loads(bytes(buffer[8 : 8 + header_length]))
        del buffer[: 4 + length]
        return header["code"], header["opaque"]


def send_load(port: int, connections: int, seconds: float, body_size: int, batch: int) -> None:
    """
    The C{_remoting-send} helper: C{connections} connections, each one
    send in flight, for C{seconds}; its figures as one JSON line.
    """
    frames = [send_frames(body_size, batch, q) for q in range(4)]
    conns = []
    for n in range(connections):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conns.append(_Connection(sock, frames[n % 4]))
    selector = selectors.DefaultSelector()
    for c in conns:
        selector.register(c.sock, selectors.EVENT_READ, c)
    latencies: list[int] = []
    codes: dict[int, int] = {}
    wrong = 0
    clock_ns = time.perf_counter_ns
    print("ready", flush=True)
    cpu_started = time.process_time()
    started = time.perf_counter()
    deadline = started + seconds
    for c in conns:
        c.send()
    open_ = len(conns)
    while open_:
        for key, _ in selector.select():
            c = key.data
            data = c.sock.recv(65536)
            if not data:
                raise RuntimeError("the broker closed a connection")
            c.buffer += data
            while (got := c.answer()) is not None:
                code, opaque = got
                latencies.append(clock_ns() - c.started)
                codes[code] = codes.get(code, 0) + 1
                wrong += opaque != c.opaque
                if time.perf_counter() < deadline:
                    c.send()
                else:
                    selector.unregister(c.sock)
                    c.sock.close()
                    open_ -= 1
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    latencies.sort()

    def percentile(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] / 1000

    print(
        json.dumps(
            {
                "seconds": elapsed,
                "cpu_seconds": cpu,
                "requests": len(latencies),
                "ok": codes.get(0, 0),
                "codes": codes,
                "wrong_opaques": wrong,
                "p50_us": percentile(0.5),
                "p99_us": percentile(0.99),
            }
        )
    )


def produce_load(port: int, connections: int, seconds: float, body_size: int) -> None:
    """
    The C{_remoting-produce} helper: L{rmqha.client.Producer} sending
    from C{connections} concurrent senders (each awaiting its send before
    the next; the producer keeps one connection to the broker) for
    C{seconds}, routed by an in-process L{rmqha.testing.FakeNameServer}
    that knows the broker at C{port}; the figures as one JSON line, after
    a C{ready} line.
    """
    from twisted.internet import reactor
    from twisted.internet.defer import ensureDeferred, gatherResults, maybeDeferred

    from rmqha.client import Producer
    from rmqha.remoting.metadata import DataVersion, TopicConfig, TopicTable
    from rmqha.remoting.namesrv import RegisterBrokerBody, RegisterBrokerRequestHeader
    from rmqha.testing import FakeNameServer

    figures: dict[str, Any] = {}

    async def main() -> None:
        namesrv = FakeNameServer(reactor)
        listening = await namesrv.listen(reactor)
        addr = f"127.0.0.1:{port}"
        namesrv.register_broker(
            RegisterBrokerRequestHeader("bench", addr, "DefaultCluster", addr, 0),
            RegisterBrokerBody(
                TopicTable(
                    DataVersion(1000, 1),
                    {
                        TOPIC: TopicConfig(TOPIC, 4, 4, perm=6),
                        "TBW102": TopicConfig("TBW102", 8, 8, perm=7),
                    },
                )
            ),
        )
        ns_port = getattr(listening.getHost(), "port")
        producer = Producer(reactor, f"127.0.0.1:{ns_port}", "BenchProducerGroup")
        producer.startService()
        body = os.urandom(body_size)
        await producer.send(TOPIC, body)
        latencies: list[int] = []
        statuses: dict[str, int] = {}
        print("ready", flush=True)
        cpu_started = time.process_time()
        started = time.perf_counter()
        deadline = started + seconds

        async def sender() -> None:
            while time.perf_counter() < deadline:
                at = time.perf_counter_ns()
                result = await producer.send(TOPIC, body)
                latencies.append(time.perf_counter_ns() - at)
                statuses[result.status.name] = statuses.get(result.status.name, 0) + 1

        await gatherResults([ensureDeferred(sender()) for _ in range(connections)])
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        await producer.stopService()
        await maybeDeferred(listening.stopListening)
        latencies.sort()
        figures.update(
            seconds=elapsed,
            cpu_seconds=cpu,
            requests=len(latencies),
            ok=statuses.get("SEND_OK", 0),
            codes=statuses,
            wrong_opaques=0,
            p50_us=latencies[len(latencies) // 2] / 1000,
            p99_us=latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] / 1000,
        )

    def done(result: object) -> None:
        reactor.stop()

    reactor.callWhenRunning(lambda: ensureDeferred(main()).addBoth(done))
    reactor.run()
    print(json.dumps(figures), flush=True)


def echo_server(port: int) -> None:
    """
    The C{_remoting-echo} helper, the floor of the I/O alone: a Twisted
    process (the master's reactor) answering every whole frame on
    C{port} with a fixed SEND_OK-sized answer carrying the request's
    opaque, at once (as the master answers a send, without the send).
    """
    from twisted.internet import reactor
    from twisted.internet.protocol import Factory, Protocol

    from rmqha._sockets import send_now, set_tcp_no_delay
    from rmqha.remoting._frames import FLAG_RESPONSE, RemotingCommand, encode

    answer = encode(
        RemotingCommand(
            code=0, opaque=_OPAQUE_BASE, flag=FLAG_RESPONSE,
            ext_fields={
                "msgId": "7F00000100002A9F0000000000000000", "queueId": "1",
                "queueOffset": "12345", "MSG_REGION": "DefaultRegion", "TRACE_ON": "true",
            },
        )
    )
    at = answer.index(b'"opaque":') + 9
    marker = b'"opaque":'

    class Echo(Protocol):
        def connectionMade(self) -> None:
            set_tcp_no_delay(self.transport)
            self.buffer = bytearray()

        def dataReceived(self, data: bytes) -> None:
            buffer = self.buffer
            buffer += data
            while len(buffer) >= 4 and len(buffer) >= 4 + int.from_bytes(buffer[:4], "big"):
                end = 4 + int.from_bytes(buffer[:4], "big")
                o = buffer.index(marker, 8) + 9
                send_now(self.transport, [answer[:at], bytes(buffer[o : o + 10]), answer[at + 10 :]])
                del buffer[:end]

    factory: Any = Factory.forProtocol(Echo)
    reactor.listenTCP(port, factory, interface="127.0.0.1")
    print("listening", flush=True)
    reactor.run()


def _system_seconds(pid: int) -> float:
    """
    CPU seconds process C{pid} has spent in the kernel.
    """
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return int(fields[12]) / os.sysconf("SC_CLK_TCK")


def _remoting_run(
    processes: dict[str, int], port: int, connections: int, seconds: float, body_size: int, batch: int,
    checkout: str | None = None,
) -> dict[str, Any]:
    """
    One run of the load generator against C{port}; the CPU of
    C{processes} (C{master}, maybe C{slave}) and its own per message.
    C{checkout}: run the load generator from that checkout's code (its
    C{tools/bench.py} must know the helper).
    """
    processes = dict(processes)
    # (batch 0: rmqha.client's Producer instead of the raw sender.)
    helper = ["_remoting-send", str(port), str(connections), str(seconds), str(body_size), str(batch)]
    if batch == 0:
        helper = ["_remoting-produce", *helper[1:-1]]
    load = subprocess.Popen(
        [sys.executable, "-m", "tools.bench", *helper],
        env=None if checkout is None else dict(os.environ, PYTHONPATH=checkout),
        cwd=checkout,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert load.stdout is not None
    # (From its connections made to its last answer: not its start-up.)
    ready = load.stdout.readline()
    cpu_before = {name: _cpu_seconds(pid) for name, pid in processes.items()}
    system_before = _system_seconds(processes["master"])
    out = load.stdout.readline()
    cpu = {name: _cpu_seconds(pid) - cpu_before[name] for name, pid in processes.items()}
    master_system = _system_seconds(processes["master"]) - system_before
    load.wait()
    if load.returncode or ready != "ready\n":
        raise RuntimeError(f"the load generator failed (exit {load.returncode})")
    figures: dict[str, Any] = json.loads(out)
    cpu["clients"] = figures.pop("cpu_seconds")
    messages = figures["ok"] * max(batch, 1)
    elapsed = figures["seconds"]
    figures.update(
        # (Of the master's CPU, the share in the kernel: its sockets, and
        # on loopback the peers' TCP input run in its context.)
        master_system_share=master_system / max(cpu["master"], 1e-9),
        messages=messages,
        messages_per_s=messages / elapsed,
        requests_per_s=figures["requests"] / elapsed,
        **{f"{name}_cpu_us_per_message": 1e6 * used / max(messages, 1) for name, used in cpu.items()},
        **{f"{name}_busy": used / elapsed for name, used in cpu.items()},
    )
    return figures


def remoting_bench(args: argparse.Namespace) -> dict[str, Any]:
    """
    The remoting benchmark (module docstring): its figures as one dict.
    """
    import shutil
    import tempfile

    from twisted.internet.defer import Deferred, ensureDeferred
    from twisted.internet.task import react

    from tools.bench import _progress, _sync, machine_info
    from tools.processes import free_ports

    root = tempfile.mkdtemp(prefix="rmqha-bench-", dir=args.dir)
    (remoting_port,) = free_ports(1)
    pair_args = argparse.Namespace(
        segment_size=args.segment_size,
        # (All the connections come from 127.0.0.1: above the default 16
        # a peer may hold.)
        master_option=[
            "--listen", f"tcp:{remoting_port}:interface=127.0.0.1",
            "--max-connections-per-peer", str(max(64, 2 * args.connections)),
            *args.master_option,
        ],
    )
    profile = os.path.abspath(args.profile) if args.profile else None
    many = args.connections
    variants = [
        "echo_1", f"echo_{many}", f"inproc_{1}", f"inproc_{many}", "single_1", f"single_{many}",
        f"batch{args.batch}_1", f"batch{args.batch}_{many}", "producer_1", f"producer_{many}",
    ]
    pairs = {"": (_Pair(root, "now", None, pair_args, profile), remoting_port)}
    if args.against:
        (before_port,) = free_ports(1)
        before_args = argparse.Namespace(
            segment_size=args.segment_size,
            master_option=[
                "--listen", f"tcp:{before_port}:interface=127.0.0.1",
                *pair_args.master_option[2:],
            ],
        )
        pairs["before_"] = (
            _Pair(root, "before", os.path.abspath(args.against), before_args, None), before_port,
        )
        variants += [
            f"before_{v}" for v in variants if v.startswith(("single", "batch", "producer"))
        ]
    if args.only:
        variants = args.only.split(",")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    load_before = os.getloadavg()
    (echo_port,) = free_ports(1)
    echo = subprocess.Popen(
        [sys.executable, "-m", "tools.bench", "_remoting-echo", str(echo_port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert echo.stdout is not None
        if echo.stdout.readline() != "listening\n":
            raise RuntimeError("the echo server did not start")
        for pair, port in pairs.values():
            pair.ready(os.urandom(args.body_size))
            # One send over the remoting port before the clock: the topic
            # is created from TBW102 then.
            subprocess.run(
                [
                    sys.executable, "-m", "tools.bench", "_remoting-send", str(port), "1",
                    "0.2", str(args.body_size), "1",
                ],
                check=True,
                stdout=subprocess.DEVNULL,
            )

        def main(reactor: Any) -> Deferred[None]:
            async def go() -> None:
                for run in range(args.runs):
                    for name in variants:
                        _progress(f"run {run + 1}/{args.runs}: {name}")
                        prefix = "before_" if name.startswith("before_") else ""
                        kind, n = name[len(prefix) :].rsplit("_", 1)
                        if kind == "inproc":
                            figures = await _sync(
                                reactor, "sync", int(n), args.seconds, args.body_size, args.dir
                            )
                            figures.pop("machine")
                            figures["messages_per_s"] = figures["puts_per_s"]
                        else:
                            batch = (
                                int(kind[5:]) if kind.startswith("batch")
                                else 0 if kind == "producer" else 1
                            )
                            if kind == "echo":
                                processes, port = {"master": echo.pid}, echo_port
                                batch = 1
                            else:
                                pair, port = pairs[prefix]
                                processes = {"master": pair.master.pid, "slave": pair.slave.pid}
                            # (The Producer's own code is part of what is
                            # compared: a before_ one runs the other checkout's.)
                            figures = _remoting_run(
                                processes, port, int(n), args.seconds, args.body_size, batch,
                                os.path.abspath(args.against) if prefix and batch == 0 else None,
                            )
                        runs[name].append(figures)

            return ensureDeferred(go())

        try:
            react(main)
        except SystemExit as e:
            if e.code:
                raise
    finally:
        echo.terminate()
        echo.wait()
        for pair, _ in pairs.values():
            pair.stop()
        shutil.rmtree(root, ignore_errors=True)

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    out: dict[str, Any] = {
        "benchmark": "remoting",
        "machine": machine_info(),
        "load_average": [list(load_before), list(os.getloadavg())],
        "runs": args.runs,
        "seconds": args.seconds,
        "body_size": args.body_size,
        "batch": args.batch,
        "connections": many,
        "load_generator": "raw frame sender (selectors), one request in flight per connection",
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
    targets = {
        f"single_{many}_over_inproc_{many}": (f"single_{many}", f"inproc_{many}", 0.70),
        "single_1_over_inproc_1": ("single_1", "inproc_1", 0.70),
        f"batch{args.batch}_1_over_single_1": (f"batch{args.batch}_1", "single_1", 3.0),
        f"batch{args.batch}_{many}_over_single_{many}": (
            f"batch{args.batch}_{many}", f"single_{many}", 3.0,
        ),
    }
    out["ratios"] = {}
    for key, (a, b, target) in targets.items():
        for prefix in ("", "before_"):
            if prefix + a in runs and (prefix + b if b.startswith("single") else b) in runs:
                ratio = median(prefix + a, "messages_per_s") / median(
                    prefix + b if b.startswith("single") else b, "messages_per_s"
                )
                out["ratios"][prefix + key] = {
                    "ratio": ratio, "target": target, "met": ratio >= target,
                }
    for n in (1, many):
        if f"single_{n}" in runs and f"echo_{n}" in runs:
            # (How much of the I/O floor a send keeps.)
            out["ratios"][f"single_{n}_over_echo_{n}"] = {
                "ratio": median(f"single_{n}", "messages_per_s") / median(f"echo_{n}", "messages_per_s"),
                "target": None,
                "met": None,
            }
    for name in variants:
        if name.startswith("before_") and name[7:] in runs:
            out["ratios"][f"{name[7:]}_now_over_before"] = {
                "ratio": median(name[7:], "messages_per_s") / median(name, "messages_per_s"),
                "target": None,
                "met": None,
            }
    if profile is not None:
        out["profile"] = profile
    return out


def add_arguments(parser: argparse.ArgumentParser, existing_dir: Any) -> None:
    parser.add_argument("--seconds", type=float, default=5.0, help="per variant and run (5)")
    parser.add_argument("--runs", type=int, default=3, help="alternating runs of each variant (3)")
    parser.add_argument("--connections", type=int, default=32, help="the many-connection case (32)")
    parser.add_argument("--batch", type=int, default=32, help="messages per batch (32)")
    parser.add_argument(
        "--only", default=None, metavar="NAMES",
        help="only these variants, e.g. single_1,inproc_1 (default: echo_1, echo_32, "
        "inproc_1, inproc_32, single_1, single_32, batch32_1, batch32_32, producer_1, "
        "producer_32: rmqha.client's Producer from 1 and 32 concurrent senders)",
    )
    parser.add_argument(
        "--against", default=None, metavar="CHECKOUT",
        help="also run the remoting variants against a master and slave from another "
        "checkout (the code before a change; its accelerator built), alternating: before_* "
        "(before_producer_*: that checkout's Producer too; its tools/ must have this bench)",
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


def report(result: dict[str, Any]) -> str:
    medians = result["medians"]
    parts = []
    for name, m in medians.items():
        text = f"{name}: {m['messages_per_s']:,.0f} msgs/s (p50 {m['p50_us']:,.0f} µs, p99 {m['p99_us']:,.0f} µs"
        if "master_cpu_us_per_message" in m:
            slave = m.get("slave_cpu_us_per_message")
            text += (
                f"; CPU µs a message: {'echo' if slave is None else 'master'} "
                f"{m['master_cpu_us_per_message']:.1f}, "
                + ("" if slave is None else f"slave {slave:.1f}, ")
                + f"client {m['clients_cpu_us_per_message']:.1f}; "
                f"busy {m['master_busy']:.0%}, {m['master_system_share']:.0%} of it in the kernel"
            )
        parts.append(text + ")")
    ratios = [
        f"{key.replace('_', ' ')}: {r['ratio']:.2f}x"
        + (
            f" (target {r['target']:g}x, {'met' if r['met'] else 'NOT met'})"
            if r["target"] is not None
            else ""
        )
        for key, r in result["ratios"].items()
    ]
    return "remoting: " + "; ".join(parts + ratios) + f" (median of {result['runs']})"
