"""
C{rmqha store check}'s memory: the record walk gives back the pages it went
over every C{_WALK_BLOCK} bytes, so the check's RSS stays flat however large
the segments are (it mapped whole segments and kept every touched page
before).  Measured in a child process (its peak RSS, reset just before the
check), on both codec paths.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from rmqha.store.commitlog import CommitLog, Message

SEGMENT = 4 << 20
BLOCK = 1 << 20

_CHILD = """
import sys
from rmqha.store import _recovery, _segments

_recovery._WALK_BLOCK = _segments._WALK_BLOCK = {block}

def kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise SystemExit(field + " not in /proc/self/status")

with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak RSS to the current RSS
before = kib("VmRSS")
report = _recovery.verify_store(sys.argv[1])
assert report.ok and report.records == int(sys.argv[2]), report
print(kib("VmHWM") - before)
"""


@pytest.mark.parametrize("pure", ["", "1"])
def test_check_rss_flat(tmp_path: Any, pure: str) -> None:
    """
    Checking a store of three 4 MiB segments (12 MiB of records, every body
    CRC checked) raises the process's peak RSS by less than 4 MiB when the
    walk's block is 1 MiB; the whole-segment mapping grew it by the 12 MiB
    walked.
    """
    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("needs Linux's /proc/self/clear_refs")
    store = str(tmp_path / "store")
    body = os.urandom(1000)
    with CommitLog.open(store, segment_size=SEGMENT) as log:
        count = 0
        while log.max_offset < 3 * SEGMENT - 4096:
            log.put_batch([Message("RssTopic", body, queue_id=i % 4) for i in range(64)])
            count += 64
    env = dict(os.environ, RMQHA_PURE=pure)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD.format(block=BLOCK), store, str(count)],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )
    grew_kib = int(out.stdout.split()[-1])
    assert grew_kib < 4 * 1024, f"the check's peak RSS grew by {grew_kib} KiB"
