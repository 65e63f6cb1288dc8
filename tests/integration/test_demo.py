"""
The quick-start demo runs as a real process: it produces and consumes
through rmqha.client and ends with every message consumed once and
identical stores.
"""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any


def test_demo_process(tmp_path: Any) -> None:
    """
    C{python -m rmqha demo} (small counts, 1 MiB segments) produces and
    consumes through rmqha.client over the remoting protocol, shows
    catch-up progress, and ends with every message consumed exactly once
    and the commit logs and the consume queues IDENTICAL, exit 0.  The
    stores show that the messages came through the client and went out
    through the consumer group: each record has the C{UNIQ_KEY} a
    producer gives it and the remoting port as its store host, and the
    group's committed offsets cover every message.
    """
    from rmqha.remoting.metadata import parse_fastjson
    from rmqha.store.commitlog import CommitLog

    where = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "rmqha", "demo", "--dir", str(where),
         "--count", "3000", "--live", "400", "--segment-size", "1m"],
        capture_output=True, text=True, timeout=120,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    for expected in (
        "rmqha.testing.FakeNameServer",
        "producer: 3,000 messages of 1 KiB sent with rmqha.client's Producer (SEND_BATCH_MESSAGE",
        "2 PushConsumers",
        "slave acked",
        "consumed: 3,400 of the 3,400 messages produced",
        "0 missing, 0 consumed twice or more (every one exactly once)",
        "byte-for-byte comparison: IDENTICAL",
        "consume queues: IDENTICAL on master and slave (12 queue files",
    ):
        assert expected in out, out
    remoting = re.search(r"remoting port (127\.0\.0\.1:\d+)", out)
    assert remoting is not None, out
    with CommitLog.open(str(where / "master"), read_only=True) as log:
        records = list(log.records(with_body=False))
    assert len(records) == 3400
    assert len({r.properties["UNIQ_KEY"] for r in records}) == 3400  # type: ignore[union-attr]
    assert {"%s:%d" % r.store_host for r in records} == {remoting.group(1)}  # type: ignore[union-attr]
    with open(where / "master" / "config" / "consumerOffset.json") as f:
        offsets = parse_fastjson(f.read())["offsetTable"]  # type: ignore[index,call-overload]
    committed = {k: v for k, v in offsets.items() if k.endswith("@DemoConsumers")}
    assert len(committed) == 3, offsets
    assert sum(sum(queues.values()) for queues in committed.values()) == 3400


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
