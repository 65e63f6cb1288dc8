"""
Run inside a network namespace created by C{test_failover.py} (as root,
via C{ip netns exec}): a failover group whose master is cut off from etcd,
its slaves and the producers by nftables, then healed; prints one JSON
line with what happened.

How one node is cut off when everything is on loopback:

- each node listens on, and advertises, its own loopback address
  (127.0.0.11, .12, .13), so what is sent *to* it (slaves dialling its HA
  port, producers its HTTP port) is matched by C{ip daddr} in the input
  hook;
- each node runs under its own uid (C{setpriv}; 10001, 10002, ...), so
  what it sends from any socket (its answers, and its etcd client's
  requests, which leave from 127.0.0.1 like everyone else's) is matched
  by C{meta skuid} in the output hook.

etcd and the producers (this process, root) stay on 127.0.0.1.

    python -m tests.integration._failover_partition DIR
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from typing import Callable

from tools.etcd_cluster import EtcdCluster
from tools.failover_cluster import (
    FailoverCluster, Producers, converge_and_check, wait_in_sync, windows,
)

from tests.integration._netns_scenario import _run

TABLE = "rmqha_failover"


def _cut(host: str, uid: int) -> None:
    _run("nft", "-f", "-", stdin=(
        f"table inet {TABLE} {{\n"
        "  chain in { type filter hook input priority 0; policy accept;\n"
        f"    ip daddr {host} counter drop\n"
        "  }\n"
        "  chain out { type filter hook output priority 0; policy accept;\n"
        f"    meta skuid {uid} counter drop\n"
        "  }\n"
        "}\n"
    ))


def _dropped() -> int:
    out = json.loads(_run("nft", "-j", "list", "table", "inet", TABLE))
    total = 0
    for item in out["nftables"]:
        for expr in item.get("rule", {}).get("expr", []):
            if "counter" in expr:
                total += expr["counter"]["packets"]
    return total


def in_namespace(scenario: Callable[[str, str], int], directory: str) -> int:
    """
    Run C{scenario(directory, work)} in this namespace: its loopback up,
    and a work directory the nodes' users can reach (they run as other
    users, and the test's own temporary directory is under a 0700 one),
    removed at the end.
    """
    _run("ip", "link", "set", "lo", "up")
    work = tempfile.mkdtemp(prefix="rmqha-failover-")
    try:
        os.chmod(work, 0o755)
        return scenario(directory, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(directory: str) -> int:
    return in_namespace(_scenario, directory)


def _scenario(directory: str, work: str) -> int:
    hosts = [f"127.0.0.{11 + i}" for i in range(3)]
    users = [10001 + i for i in range(3)]
    result: dict[str, object] = {}
    with EtcdCluster(os.path.join(directory, "etcd")) as etcd, FailoverCluster(
        work, etcd.spec, 3, hosts=hosts, users=users
    ) as group:
        old = group.wait_master()
        wait_in_sync(group, old, 3)
        load = Producers(group, 3)
        try:
            time.sleep(1.0)
            _cut(hosts[old], users[old])
            cut_at = time.monotonic()
            new = group.wait_master(timeout=30, exclude=[old])
            elected_at = time.monotonic()
            deadline = time.monotonic() + 30
            while windows(load.puts(), old, new, cut_at)["first_new"] is None:
                if time.monotonic() > deadline:
                    raise AssertionError("no PUT_OK from the new master")
                time.sleep(0.05)
            # Let the old master's last answers (if any) arrive: producers
            # wait up to 5 s for one.
            time.sleep(6)
            puts = load.puts()
            seen = windows(puts, old, new, cut_at)
            first_new = seen["first_new"]
            last_old = seen["last_old"]
            assert first_new is not None and last_old is not None
            acked = [p for p in puts if p.ok]
            result.update(
                old=old,
                new=new,
                election=elected_at - cut_at,
                old_last_ok_after_cut=last_old - cut_at,
                unavailable=first_new - last_old,
                margin=first_new - last_old,
                old_ok_after_new_first=sum(
                    1 for p in acked if p.node == old and p.answered > first_new
                ),
                missing=len(group.missing_acked(new, acked)),
                acked=len(acked),
                nft_dropped_packets=_dropped(),
            )
            _run("nft", "delete", "table", "inet", TABLE)
            healed_at = time.monotonic()
            wait_in_sync(group, new, 3, timeout=60)
            result["rejoined_after_heal"] = time.monotonic() - healed_at
        finally:
            load.stop()
        end = converge_and_check(group, None)
        result.update(identical=end["identical"], check=end["check"])
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
