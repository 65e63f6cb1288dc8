"""
Run inside a network namespace created by C{test_netns.py} (as root, via
C{ip netns exec}): shape the namespace's loopback with the kernel's own
tools, replicate through it while a SYNC_MASTER takes messages, and print
one JSON line with what happened.

The shaping (this kernel has no C{sch_netem}, docs/reliability.md):

- C{tbf} on C{lo}, MTU 1500: a rate-limited link whose queue adds delay
  and drops what overflows it;
- nftables C{numgen random} in the input hook: TCP packets lost at
  random, so the kernel's real retransmission does the recovering;
- a partition: every TCP packet dropped for a few seconds, then healed.

    python -m tests.integration._netns_scenario DIR [--loss-permille 20]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.task import deferLater, react

from rmqha.broker import Broker, Role
from rmqha.store._record import Message
from rmqha.ha.group import PutStatus

from tests._helpers import replica_of
from tests.integration._support import make_broker, store_digest, until

SEGMENT = 4 * 1024 * 1024
TABLE = "rmqha_faults"


def _run(*argv: str, stdin: str | None = None) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout


def _set_loss(permille: int) -> None:
    """
    Drop this many TCP packets in 1,000 as they arrive (1000: all).
    """
    _run("nft", "flush", "chain", "inet", TABLE, "in")
    if permille >= 1000:
        rule = "meta l4proto tcp counter drop"
    else:
        rule = f"meta l4proto tcp numgen random mod 1000 < {permille} counter drop"
    _run("nft", "add", "rule", "inet", TABLE, "in", *rule.split())


def _shape(rate: str, loss_permille: int) -> None:
    _run("ip", "link", "set", "lo", "up", "mtu", "1500")
    _run("tc", "qdisc", "replace", "dev", "lo", "root", "tbf",
         "rate", rate, "burst", "64kb", "latency", "20ms")
    _run("nft", "-f", "-", stdin=(
        f"table inet {TABLE} {{\n"
        "  chain in { type filter hook input priority 0; policy accept; }\n"
        "}\n"
    ))
    _set_loss(loss_permille)


def _dropped() -> int:
    """
    Packets the nftables rules dropped so far (the current rule only).
    """
    out = json.loads(_run("nft", "-j", "list", "table", "inet", TABLE))
    total = 0
    for item in out["nftables"]:
        for expr in item.get("rule", {}).get("expr", []):
            if "counter" in expr:
                total += expr["counter"]["packets"]
    return total


def _tcp_retransmissions() -> int:
    with open("/proc/net/snmp") as f:
        names, values = [line.split() for line in f if line.startswith("Tcp:")]
    return int(values[names.index("RetransSegs")])


def _tbf_stats() -> str:
    return _run("tc", "-s", "qdisc", "show", "dev", "lo").split("\n")[1].strip()


async def scenario(reactor: Any, root: str, rate: str, loss: int, seconds: float) -> dict[str, Any]:
    _shape(rate, loss)
    master = make_broker(
        reactor, os.path.join(root, "master"), Role.SYNC_MASTER, SEGMENT,
        heartbeat_interval=0.5, housekeeping_interval=3.0,
        ha_listen="tcp:0:interface=127.0.0.1", slave_timeout=1.0,
    )
    master.startService()
    slave: Broker | None = None
    statuses: dict[str, int] = {}
    dropped = 0
    producing = True
    try:
        port = (await master.ha_address()).port
        slave = make_broker(
            reactor, os.path.join(root, "slave"), Role.SLAVE, SEGMENT,
            heartbeat_interval=0.5, housekeeping_interval=3.0,
            master_endpoint=f"tcp:host=127.0.0.1:port={port}",
        )
        slave.startService()
        replica = slave.commitlog
        factory = replica_of(slave).slave_factory
        assert factory is not None
        body = os.urandom(1024)

        async def produce(n: int) -> None:
            while producing:
                result = await master.put(Message("NetnsTopic", body, queue_id=n))
                statuses[result.status.value] = statuses.get(result.status.value, 0) + 1
                if result.status is not PutStatus.PUT_OK:
                    await deferLater(reactor, 0.01, lambda: None)

        producers = [ensureDeferred(produce(n)) for n in range(4)]
        await deferLater(reactor, seconds / 2, lambda: None)
        # A partition longer than housekeeping: both ends give up; after
        # it heals the slave reconnects.
        made = factory.connections_made
        dropped += _dropped()
        _set_loss(1000)
        await deferLater(reactor, 4.0, lambda: None)
        dropped += _dropped()
        _set_loss(loss)
        await until(reactor, lambda: factory.connections_made > made, "a reconnect after the partition", 60)
        await deferLater(reactor, seconds / 2, lambda: None)
        producing = False
        for d in producers:
            await d
        end = master.commitlog.max_offset
        await until(reactor, lambda: replica.record_end == end, "the slave to catch up", 120)
        dropped += _dropped()
        result = {
            "master_max_offset": end,
            "slave_record_end": replica.record_end,
            "statuses": statuses,
            "connections_made": factory.connections_made,
            "checked": factory.checked,
            "checksum_failures": factory.checksum_failures,
            "nft_dropped_packets": dropped,
            "tcp_retransmissions": _tcp_retransmissions(),
            "tbf": _tbf_stats(),
        }
        await slave.stopService()
        slave = None
    finally:
        producing = False
        if slave is not None:
            await slave.stopService()
        await master.stopService()
    result["identical"] = store_digest(os.path.join(root, "slave")) == store_digest(
        os.path.join(root, "master")
    )
    return result


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--rate", default="100mbit")
    parser.add_argument("--loss-permille", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=6.0)
    args = parser.parse_args(argv)

    async def go(reactor: Any) -> None:
        result = await scenario(reactor, args.root, args.rate, args.loss_permille, args.seconds)
        print(json.dumps(result), flush=True)

    react(lambda reactor: Deferred.fromCoroutine(go(reactor)))


if __name__ == "__main__":
    main(sys.argv[1:])
