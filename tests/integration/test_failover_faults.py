"""
Automatic failover with real processes, the faults (issue 16, "Prove it";
the rest in test_failover.py, split so that the two run on different
workers): etcd losing members, TLS between the nodes, and, in network
namespaces the tests create (root and nftables, else skipped with the
reason), a master cut from its slaves and a partitioned master.

Run them alone: C{python3 dev.py test -m failover} (docs/development.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

import pytest

from tools.etcd_cluster import EtcdCluster
from tools.failover_cluster import FailoverCluster, Producers, kill_masters, wait_in_sync
from tools.processes import etcd_binary

from tests.integration._failover_support import TTL, assert_end, etcd, etcd3  # noqa: F401 (fixtures)

pytestmark = pytest.mark.failover

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_etcd_member_loss(etcd3: EtcdCluster, tmp_path: Any) -> None:
    """
    With three etcd members: one down (a follower) changes nothing: the
    same master keeps answering PUT_OK.  Two down (the survivor is the etcd
    leader, the worst case): the master stops acknowledging within its
    lease (no PUT_OK later than the kill + the lone leader's ~2 s of
    keepalives + TTL), puts get 503, and no node is master while quorum is
    lost.  Both back: a master again, puts succeed, the stores converge.
    """
    with FailoverCluster(str(tmp_path), etcd3.spec) as group:
        master = group.wait_master()
        wait_in_sync(group, master, 3)
        with Producers(group, 3) as load:
            leader = etcd3.leader_index()
            assert leader is not None
            followers = [i for i in range(3) if i != leader]
            etcd3.kill(followers[0])
            one_down = time.monotonic()
            time.sleep(3 * TTL)
            assert group.masters() == [master]
            ok = [p for p in load.puts() if p.ok and p.answered > one_down]
            assert ok and all(p.node == master for p in ok)
            # Puts kept flowing: no gap longer than a second.
            times = [one_down] + [p.answered for p in ok]
            assert max(b - a for a, b in zip(times, times[1:])) < 1.0

            etcd3.kill(followers[1])
            two_down = time.monotonic()
            time.sleep(2 + TTL + 1)
            stepped_down = time.monotonic()
            last_ok = max(p.answered for p in load.puts() if p.ok)
            assert last_ok < two_down + 2 + TTL, last_ok - two_down
            # Nobody is elected while quorum is lost; puts are refused.
            while time.monotonic() < stepped_down + 2 * TTL:
                assert group.masters() == []
                time.sleep(0.2)
            late = [p for p in load.puts() if p.answered > stepped_down]
            assert late and not any(p.ok for p in late)
            assert {p.code for p in late if p.code} <= {503}

            etcd3.start(followers[0], wait=False)
            etcd3.start(followers[1], wait=False)
            etcd3.wait_healthy()
            healed = time.monotonic()
            again = group.wait_master(timeout=30)
            deadline = time.monotonic() + 30
            while not any(p.ok and p.answered > healed for p in load.puts()):
                assert time.monotonic() < deadline, "no PUT_OK after etcd came back"
                time.sleep(0.05)
            assert again in range(3)
        assert_end(group, None)


def test_kill_master_tls(etcd: EtcdCluster, tmp_path: Any) -> None:
    """
    The group authenticated by TLS client certificates naming the node ids
    (C{rmqha certs init --group}'s), instead of the secret: two kills,
    every PUT_OK on the new master, the stores identical at the end.
    """
    with FailoverCluster(str(tmp_path), etcd.spec, auth="tls") as group:
        load = Producers(group, 3)
        try:
            kills = kill_masters(group, load, 2)
        finally:
            load.stop()
        for figures in kills:
            assert figures["new"] != figures["old"]
            assert figures["missing"] == 0, figures
        status = group.status(kills[-1]["new"]) or {}
        assert status["failover"]["auth"] == "TLS client certificates"
        assert_end(group, None)


def _netns_unavailable() -> str | None:
    if sys.platform != "linux":
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "creating a network namespace needs root"
    for tool in ("ip", "nft", "setpriv"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (python3 dev.py test installs nftables as root)"
    return None


def _in_namespace(scenario: str, tmp_path: Any) -> dict[str, Any]:
    """
    Run C{python -m scenario tmp_path} in a network namespace made for it
    (skipping, with the reason, where that cannot be done); its last line
    of output, as JSON.
    """
    reason = _netns_unavailable() or (
        "etcd is not installed (python3 dev.py test installs etcd-server as root)"
        if etcd_binary() is None
        else None
    )
    if reason is not None:
        pytest.skip(reason)
    name = f"rmqha-failover-{os.getpid()}"
    created = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if created.returncode:
        pytest.skip(f"cannot create a network namespace: {created.stderr.strip()}")
    try:
        done = subprocess.run(
            ["ip", "netns", "exec", name, sys.executable, "-m", scenario, str(tmp_path)],
            capture_output=True, text=True, cwd=ROOT, timeout=300,
            env=dict(os.environ, PYTHONPATH=ROOT),
        )
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_master_cut_from_slaves(tmp_path: Any) -> None:
    """
    minInSyncReplicas (2) is a floor for every PUT_OK (issue 25): the
    master's replication links cut -- to both slaves, then to one while
    the other is dead -- while every node stays alive in etcd: no put is
    answered PUT_OK in either window (each is refused, or stored and timed
    out), the master keeps its role, puts are PUT_OK again once the links
    heal, and at the end every node holds every PUT_OK and the stores are
    identical and sound.
    """
    result = _in_namespace("tests.integration._failover_cut", tmp_path)
    for window in ("both_cut", "dead_and_cut"):
        assert result[window]["put_ok"] == 0, result
        assert result[window]["answers"].get("IN_SYNC_REPLICAS_NOT_ENOUGH", 0) > 0, result
    assert len(result["both_cut"]["master_after"]) == 1, result
    assert result["ok_after_heal"] > 0, result
    assert result["nft_dropped_packets"] > 0, result
    assert result["acked"] > 0 and not any(result["missing"].values()), result
    assert all(result["identical"].values()), result
    assert all(result["check"].values()), result


def test_partitioned_master(tmp_path: Any) -> None:
    """
    The master cut off from etcd and from its slaves and producers
    (nftables in a network namespace this test creates; the scenario,
    L{tests.integration._failover_partition}, says how): it stops
    acknowledging within its lease, a new master is elected, no PUT_OK is
    answered by the old master after the new one's first, and once the
    partition heals the old master rejoins as a slave and every store ends
    byte-identical and sound.
    """
    result = _in_namespace("tests.integration._failover_partition", tmp_path)
    assert result["new"] != result["old"], result
    # docs/failover.md: the old master is silent by (last renewal) + TTL -
    # 0.5 s; the partition starts after its last renewal.
    assert result["old_last_ok_after_cut"] < TTL - 0.5 + 0.1, result
    assert result["old_ok_after_new_first"] == 0, result
    assert result["margin"] > 0, result
    assert result["missing"] == 0, result
    assert result["nft_dropped_packets"] > 0, result
    assert all(result["identical"].values()), result
    assert all(result["check"].values()), result
