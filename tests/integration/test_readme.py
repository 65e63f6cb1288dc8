"""
README.md's produce/consume example (the Python block using
rmqha.client) runs as written, in the test reactor: tests/test_docs.py
only runs its blocks' top level, and this one's main(reactor) needs a
running reactor.
"""

from __future__ import annotations

import os
from typing import Any

import pytest_twisted

from tests.test_docs import ROOT, python_blocks


@pytest_twisted.ensureDeferred
async def test_produce_consume_example(tmp_path: Any, monkeypatch: Any) -> None:
    """
    The example starts a NameServer and a master on loopback, sends one
    message and a batch through rmqha.client's Producer, consumes all
    three with a PushConsumer and stops everything; it prints what the
    README says it prints, and its store is in the working directory.
    """
    from twisted.internet import reactor

    monkeypatch.chdir(tmp_path)
    (block,) = [b for b in python_blocks(os.path.join(ROOT, "README.md")) if "rmqha.client" in b]
    printed: list[str] = []
    namespace: dict[str, Any] = {
        "__name__": "readme", "print": lambda *a: printed.append(" ".join(map(str, a))),
    }
    exec(compile(block, "README.md", "exec"), namespace)
    bodies = await namespace["main"](reactor)
    assert bodies == [b"order 1", b"order 2", b"order 3"]
    assert printed == ["SEND_OK SEND_OK", "[b'order 1', b'order 2', b'order 3']"]
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    assert f"It prints `{printed[0]}`, then `{printed[1]}`." in readme
    assert os.listdir(tmp_path) == ["BROKER"]
