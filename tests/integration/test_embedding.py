"""
The example in docs/embedding.md runs as written, in the test reactor.
"""

from __future__ import annotations

import os
import re
import tempfile
from typing import Any

import pytest_twisted

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest_twisted.ensureDeferred
async def test_embedding_example(tmp_path: Any, monkeypatch: Any) -> None:
    """
    The documented main(reactor) starts a master and a slave, puts a
    message, sees it replicated and stops both cleanly.  Its
    C{tempfile.mkdtemp()} lands in this test's temp directory (it used to
    leave two 64 MiB stores in the system temp directory every run).
    """
    from twisted.internet import reactor

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with open(os.path.join(ROOT, "docs", "embedding.md"), encoding="utf-8") as f:
        # The first block; the second is a unit test (tests/test_testing.py).
        block = re.findall(r"```python\n(.*?)```", f.read(), re.DOTALL)[0]
    printed: list[tuple[Any, ...]] = []
    namespace: dict[str, Any] = {"__name__": "docs_embedding", "print": lambda *a: printed.append(a)}
    exec(compile(block, "docs/embedding.md", "exec"), namespace)
    result = await namespace["main"](reactor)
    assert result.offset == 0
    assert printed[0][:2] == ("stored at offset", 0)
    master_status = printed[1][1]
    slave_status = printed[2][1]
    assert master_status["role"] == "ASYNC_MASTER"
    assert slave_status["max_offset"] == result.next_offset
    (root,) = os.listdir(tmp_path)
    assert sorted(os.listdir(tmp_path / root)) == ["master", "slave"]
