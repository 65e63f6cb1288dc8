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


def consume_queue_digest(store_dir: str) -> dict[str, str]:
    """
    Path under C{consumequeue/} (C{topic/queueId/file}) -> sha256 of the
    file's bytes.
    """
    root = os.path.join(store_dir, "consumequeue")
    out = {}
    for path, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(path, name), "rb") as f:
                out[os.path.relpath(os.path.join(path, name), root)] = hashlib.sha256(f.read()).hexdigest()
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


# -- remoting failover groups (test_remoting_failover, test_produce_consume) ---


def namesrv_options(namesrv_port: int) -> list[str]:
    """
    The C{twistd rmqha} flags of a failover node with a remoting port
    that registers with the NameServer on C{namesrv_port}: remoting port
    0 (each node registers the port it got, and the NameServer says
    where it is), advertised as 127.0.0.1.
    """
    return [
        "--namesrv", f"127.0.0.1:{namesrv_port}", "--broker-ip1", "127.0.0.1",
        "--listen", "tcp:0:interface=127.0.0.1",
    ]


def failover_role(group: Any, i: int) -> bool | None:
    """
    Whether node C{i} of a L{tools.failover_cluster.FailoverCluster} says
    it is the elected master (C{None}: it does not answer).
    """
    status = group.status(i)
    return None if status is None else (status.get("failover") or {}).get("is_master")


def metadata_syncs(group: Any, i: int) -> int:
    """
    How many complete metadata syncs node C{i} has done as a slave.
    """
    sync = (group.status(i) or {}).get("metadata_sync") or {}
    return int(sync.get("complete_syncs") or 0)


def topic_fields(topic: str, queues: int = 4) -> dict[str, str]:
    """
    The extFields of an UPDATE_AND_CREATE_TOPIC making C{topic}, read-write,
    with C{queues} read and write queues.
    """
    return {
        "topic": topic,
        "defaultTopic": "TBW102",
        "readQueueNums": str(queues),
        "writeQueueNums": str(queues),
        "perm": "6",
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": "0",
        "order": "false",
    }


async def ask(client: Any, code: int, ext: dict[str, str] | None = None) -> Any:
    """
    One request over a L{rmqha.remoting.protocol.RemotingClient}, its
    answer within 5 s.
    """
    from rmqha.remoting._frames import RemotingCommand

    return await client.request(RemotingCommand(code=code, ext_fields=ext), timeout=5)
