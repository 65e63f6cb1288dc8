"""
The quick-start demo runs as a real process and ends with identical stores.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any


def test_demo_process(tmp_path: Any) -> None:
    """
    C{python -m rmqha demo} (small counts, 1 MiB segments) shows catch-up progress and
    ends with the byte-for-byte comparison reporting IDENTICAL, exit 0.
    """
    result = subprocess.run(
        [sys.executable, "-m", "rmqha", "demo", "--dir", str(tmp_path / "demo"),
         "--count", "3000", "--live", "400", "--segment-size", "1m"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "slave acked" in result.stdout
    assert "IDENTICAL" in result.stdout


def test_failover_demo_process(tmp_path: Any) -> None:
    """
    C{python -m rmqha demo --failover} (one kill): three broker processes
    and one etcd member; it shows the master killed, a new one elected and
    answering PUT_OK, the old one rejoining, no PUT_OK lost, and the three
    stores IDENTICAL and sound, exit 0; it stops every process it started.
    """
    import pytest

    from tools.processes import etcd_binary

    if etcd_binary() is None:
        pytest.skip("etcd is not installed (python3 dev.py test installs etcd-server as root)")
    result = subprocess.run(
        [sys.executable, "-m", "rmqha", "demo", "--failover", "--dir", str(tmp_path / "demo")],
        capture_output=True, text=True, timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for expected in (
        "elected master (epoch 1)",
        "kill -9 ",
        "elected master (its lease ran out)",
        "first PUT_OK from ",
        "(0 missing)",
        "rejoins as a slave",
        "is back in the in-sync set",
        "PUT_OK lost: 0",
        "IDENTICAL",
        "store check: sound",
    ):
        assert expected in out, out
    found = subprocess.run(
        ["pgrep", "-f", str(tmp_path / "demo")], capture_output=True, text=True
    )
    assert found.stdout.strip() == "", "the demo left processes running"
