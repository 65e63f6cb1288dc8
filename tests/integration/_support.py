"""
Helpers for the real-socket tests.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Callable

from twisted.internet.task import deferLater


def store_digest(store_dir: str) -> dict[str, str]:
    """
    Segment file name -> sha256 of its bytes.
    """
    directory = os.path.join(store_dir, "commitlog")
    out = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


async def until(
    reactor: Any, condition: Callable[[], bool], what: str, timeout: float = 120.0
) -> None:
    """
    Wait for C{condition}, checked every 20 ms on the running reactor;
    fail after C{timeout} seconds naming C{what}.
    """
    waited = 0.0
    while not condition():
        if waited >= timeout:
            raise AssertionError(f"timed out waiting for {what}")
        await deferLater(reactor, 0.02, lambda: None)
        waited += 0.02
