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
