"""
Replication through a network namespace this test creates, shaped by the
kernel: a rate-limited loopback (tbf) losing 2 % of TCP packets at random
(nftables), and a 4-second partition, while a SYNC_MASTER takes messages.
The scenario runs inside the namespace (L{_netns_scenario}); this test
creates and always deletes the namespace.

Needs root (CAP_NET_ADMIN), C{ip}, C{tc} and C{nft}; C{python3 dev.py
test} installs nftables where it can (docs/development.md). Skipped, with
the reason, otherwise. netem is not used: this machine's kernel has none
(docs/reliability.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _unavailable() -> str | None:
    if sys.platform != "linux":
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "creating a network namespace needs root"
    for tool in ("ip", "tc", "nft"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (python3 dev.py test installs nftables as root)"
    return None


@pytest.fixture
def namespace() -> Any:
    reason = _unavailable()
    if reason is not None:
        pytest.skip(reason)
    name = f"rmqha-test-{os.getpid()}"
    created = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if created.returncode:
        pytest.skip(f"cannot create a network namespace: {created.stderr.strip()}")
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True)


def test_loss_delay_partition(namespace: str, tmp_path: Any) -> None:
    """
    Through loss, a rate-limited queue and a partition, the slave keeps
    up, reconnects after the partition, and ends byte-identical; packets
    really were dropped and retransmitted by the kernel.
    """
    done = subprocess.run(
        ["ip", "netns", "exec", namespace, sys.executable, "-m",
         "tests.integration._netns_scenario", str(tmp_path), "--loss-permille", "20"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["identical"], result
    assert result["slave_record_end"] == result["master_max_offset"] > 0
    assert result["checked"], result
    assert result["nft_dropped_packets"] > 0, result
    assert result["tcp_retransmissions"] > 0, result
    assert result["connections_made"] >= 2, result
    assert result["statuses"].get("PUT_OK", 0) > 0, result
