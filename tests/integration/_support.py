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


def make_broker(
    reactor: Any,
    store: str,
    role: Any,
    segment_size: int,
    heartbeat_interval: float = 0.5,
    housekeeping_interval: float = 5.0,
    **kwargs: Any,
) -> Any:
    """
    A L{Broker} on C{store} for the real-socket tests: fast heartbeats,
    reconnects every 0.1 s, the reactor's clock for the store; C{http=}
    (and C{http_peer_policy=}, C{serve_commitlog=}, C{failover=}) compose
    an L{AdminService} into it.
    """
    from rmqha.broker import Broker
    from rmqha.store.commitlog import CommitLog
    from rmqha.admin import AdminService
    from tests._helpers import settings_and_runtime

    http = kwargs.pop("http", None)
    http_peer_policy = kwargs.pop("http_peer_policy", None)
    serve_commitlog = kwargs.pop("serve_commitlog", 0)
    failover = kwargs.pop("failover", None)
    settings, runtime = settings_and_runtime(
        kwargs,
        role=role,
        heartbeat_interval=heartbeat_interval,
        housekeeping_interval=housekeeping_interval,
    )
    broker = Broker(
        settings,
        reactor=reactor,
        open_commitlog=lambda: CommitLog.open(store, segment_size=segment_size, clock=reactor.seconds),
        retry_policy=lambda attempt: 0.1,
        **runtime,
    )
    if http is not None:
        AdminService(
            broker, http, http_peer_policy, serve_commitlog, failover=failover
        ).setServiceParent(broker)
    return broker
