# -*- test-case-name: tests.test_bench -*-
"""
C{python -m tools.bench pulls}: how fast a consumer drains a backlog over
the remoting protocol, against C{rmqha store check}'s rate on the same
store, in one run (issue 30's target: pulls at least 50 % of the check's
rate).

A store of C{--size} bytes of C{--body-size} messages on C{--queues}
queues of one topic is filled (C{rmqha store fill}, which builds the
consume queues); C{rmqha store check} reads it C{--runs} times; a
C{twistd rmqha} master (ASYNC, no slave: pulls do not wait for replicas)
serves it on a remoting port, registered with an in-process fake
NameServer; then, C{--runs} times, rmqha.client's L{PullConsumer} in this
process pulls every queue from offset 0 to its end, one pull in flight
per queue (C{--max-nums} messages each, at most the broker's
C{maxTransferCountOnMessageInMemory}: 32 unless C{--master-option} says
otherwise), decoding every message as a user's code receives it.  The
rate is commit-log bytes drained per second (the record bytes of the
messages pulled), with messages/s and
the CPU seconds of the broker and of this process.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from twisted.internet.defer import Deferred, gatherResults, maybeDeferred

from tools.httpbench import _cpu_seconds
from tools.processes import free_ports, twistd_command

__all__ = ["add_arguments", "pull_bench", "report"]

TOPIC = "PullBench"
GROUP = "pull-bench"
BROKER = "pull-bench-broker"


def _self_cpu() -> float:
    times = os.times()
    return times.user + times.system


def _store_bytes(store: str) -> int:
    from rmqha.store.commitlog import CommitLog

    with CommitLog.open(store, read_only=True) as log:
        return log.max_offset - log.min_offset


def _check_seconds(store: str) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "rmqha", "store", "check", store],
        check=True, stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - started


async def _drain(reactor: Any, namesrv: str, max_nums: int) -> tuple[int, float]:
    """
    Pull every queue of L{TOPIC} from 0 to its end: (messages, seconds).
    """
    from rmqha.client import PullConsumer
    from rmqha.client._consume import PullStatus

    consumer = PullConsumer(reactor, namesrv, GROUP)
    consumer.startService()
    try:
        queues = await consumer.queues(TOPIC)
        counts = [0]
        started = time.perf_counter()

        async def one(queue: Any) -> None:
            offset = 0
            while True:
                result = await consumer.pull(queue, offset, max_nums)
                if result.status is not PullStatus.FOUND:
                    if offset >= result.max_offset:
                        return
                    raise RuntimeError(f"pull of {queue} at {offset}: {result.status.name}")
                counts[0] += len(result.messages)
                offset = result.next_begin_offset

        from twisted.internet.defer import ensureDeferred

        await gatherResults([ensureDeferred(one(q)) for q in queues], consumeErrors=True)
        return counts[0], time.perf_counter() - started
    finally:
        await consumer.stopService()


def pull_bench(args: argparse.Namespace) -> dict[str, Any]:
    """
    Fill, check, serve and drain; the figures of each run.
    """
    from twisted.internet.task import react

    root = tempfile.mkdtemp(prefix="rmqha-pullbench-", dir=args.dir)
    store = os.path.join(root, "store")
    result: dict[str, Any] = {"check": [], "pull": []}
    try:
        count = max(1, args.size // (args.body_size + 100 + len(TOPIC)))
        subprocess.run(
            [
                sys.executable, "-m", "rmqha", "store", "fill", store, "--count", str(count),
                "--body-size", str(args.body_size), "--topics", TOPIC, "--queues", str(args.queues),
                "--segment-size", "1g",
            ],
            check=True, stdout=subprocess.DEVNULL,
        )
        # (The topic as an operator creates it: in config/topics.json.)
        from twisted.internet import reactor

        from rmqha.remoting.metadata import BrokerMetadata, TopicConfig

        BrokerMetadata.load(store, reactor).update_topic(TopicConfig(TOPIC, args.queues, args.queues))
        size = _store_bytes(store)
        result.update(store_bytes=size, messages=count)
        _check_seconds(store)  # (Warm: the pulls read a warm page cache too.)
        for _ in range(args.runs):
            result["check"].append(_check_seconds(store))

        def main(reactor: Any) -> Deferred[None]:
            from twisted.internet.defer import ensureDeferred

            return ensureDeferred(_serve_and_drain(reactor, root, store, args, result))

        try:
            react(main, [])
        except SystemExit as e:
            if e.code not in (0, None):
                raise
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return result


async def _serve_and_drain(
    reactor: Any, root: str, store: str, args: argparse.Namespace, result: dict[str, Any]
) -> None:
    from twisted.internet.task import deferLater

    from rmqha.testing import FakeNameServer

    namesrv = FakeNameServer(reactor)
    port = await namesrv.listen(reactor, "tcp:0:interface=127.0.0.1")
    address = f"127.0.0.1:{port.getHost().port}"  # type: ignore[attr-defined]
    ha_port, listen_port = free_ports(2)
    command = twistd_command(
        store, os.path.join(root, "master.log"), "--role", "ASYNC_MASTER",
        "--ha-listen", f"tcp:{ha_port}:interface=127.0.0.1",
        "--listen", f"tcp:{listen_port}:interface=127.0.0.1",
        "--namesrv", address, "--broker-ip1", "127.0.0.1", "--group", BROKER,
        *args.master_option,
    )
    if args.profile:
        at = command.index("rmqha")
        command[at:at] = ["--profile", os.path.abspath(args.profile), "--profiler", "cprofile", "--savestats"]
    broker = subprocess.Popen(command)
    try:
        deadline = time.monotonic() + 120
        while not namesrv.brokers(BROKER):
            if broker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the master did not register (see {root}/master.log)")
            await deferLater(reactor, 0.2, lambda: None)
        for _ in range(args.runs):
            broker_cpu, own_cpu = _cpu_seconds(broker.pid), _self_cpu()
            messages, seconds = await _drain(reactor, address, args.max_nums)
            if messages != result["messages"]:
                raise RuntimeError(f"pulled {messages:,} messages of {result['messages']:,}")
            result["pull"].append(
                {
                    # (Every record of the store is the topic's: the whole
                    # log is drained.)
                    "seconds": seconds, "messages": messages, "bytes": result["store_bytes"],
                    "broker_cpu": _cpu_seconds(broker.pid) - broker_cpu,
                    "consumer_cpu": _self_cpu() - own_cpu,
                }
            )
    finally:
        broker.terminate()
        broker.wait()
        await maybeDeferred(port.stopListening)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", type=int, default=1 << 30, help="bytes of backlog (default 1 GiB)")
    parser.add_argument("--body-size", type=int, default=1024, help="message body bytes (default 1024)")
    parser.add_argument("--queues", type=int, default=4, help="queues of the topic (default 4)")
    parser.add_argument("--max-nums", type=int, default=32, help="messages per pull (default 32)")
    parser.add_argument("--runs", type=int, default=3, help="checks and drains (default 3)")
    parser.add_argument("--dir", default=None, help="where the store goes (default: a temporary directory)")
    parser.add_argument(
        "--master-option", action="append", default=[],
        help="a further twistd rmqha option for the master (repeatable), e.g. "
        "--master-option=--max-transfer-count-on-message-in-memory=256",
    )
    parser.add_argument(
        "--profile", default=None, metavar="FILE",
        help="run the master under cProfile, stats saved to FILE (its figures are then slower)",
    )


def report(result: dict[str, Any]) -> str:
    size = result["store_bytes"]
    check = statistics.median(result["check"])
    check_rate = size / check
    lines = [
        f"store: {size / 2**20:,.0f} MiB, {result['messages']:,} messages",
        f"store check: median {check:.2f} s = {check_rate / 1e6:,.0f} MB/s "
        f"(runs: {', '.join(f'{s:.2f}' for s in result['check'])})",
    ]
    rates = []
    for run in result["pull"]:
        rate = run["bytes"] / run["seconds"]
        rates.append(rate)
        lines.append(
            f"pull: {run['messages']:,} messages, {run['bytes'] / 2**20:,.0f} MiB in {run['seconds']:.2f} s = "
            f"{rate / 1e6:,.0f} MB/s, {run['messages'] / run['seconds']:,.0f} msgs/s; CPU broker "
            f"{run['broker_cpu']:.2f} s, consumer {run['consumer_cpu']:.2f} s"
        )
    ratio = statistics.median(rates) / check_rate
    lines.append(
        f"pulls / store check: {ratio:.1%} (target >= 50 %: {'met' if ratio >= 0.5 else 'NOT met'})"
    )
    return "\n".join(lines)
