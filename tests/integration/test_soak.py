"""
A short run of C{python -m tools.soak}: three processes come up, load
flows, samples are taken, and nothing is judged to grow.
"""

from __future__ import annotations

import json
import os
from typing import Any

from tools import soak


def test_short_soak(tmp_path: Any) -> None:
    """
    Twelve seconds with 1 MiB segments (so segments roll during the run):
    samples every second, the PNG written, no growth, no error.
    """
    out = str(tmp_path / "out")
    summary = soak.run(12, out, rate=300, segment_size=1 << 20)
    assert summary["messages"] > 1000, summary
    assert summary["errors"] == 0
    assert len(summary["samples"]) >= 10
    assert summary["ok"], summary["grows"]
    with open(os.path.join(out, "soak.json")) as f:
        assert json.load(f)["messages"] == summary["messages"]
    with open(os.path.join(out, "soak.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_growth_verdict() -> None:
    """
    The verdict: a steady series does not grow, a climbing one does.
    """
    assert not soak.grows([100.0] * 50, 4)
    assert soak.grows([float(i) for i in range(50)], 4)
    assert not soak.grows([float(i % 5) for i in range(50)], 4)
