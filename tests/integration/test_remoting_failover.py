"""
Issue 29's "Prove it" for the metadata sync, with real processes: a
failover group of two C{twistd rmqha} nodes under etcd, each with a
remoting port (C{--listen}) and C{--namesrv} pointing at a
L{FakeNameServer} in this process (pytest-twisted, the global reactor).
A topic created and consumer offsets committed on the master over
remoting appear on the slave after its sync, and survive a kill -9 of
the master: the promoted node registers as brokerId 0 at once and
answers them as its own (docs/remoting.md, "The slave's metadata sync",
"Failover").
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import pytest_twisted

from rmqha.remoting._frames import header_to_ext_fields
from rmqha.remoting.codes import RequestCode, ResponseCode
from rmqha.remoting.metadata import (
    ConsumerOffsetTable,
    MetadataFile,
    MetadataLimits,
    TopicTable,
    decode_table,
    load_file,
)
from rmqha.remoting.offsets import QueryConsumerOffsetRequestHeader, UpdateConsumerOffsetRequestHeader
from rmqha.remoting.protocol import RemotingClient
from rmqha.testing import FakeNameServer
from tests.integration._support import (
    ask as _ask,
    failover_role,
    metadata_syncs,
    namesrv_options,
    topic_fields,
    until,
)
from tools.etcd_cluster import EtcdCluster
from tools.failover_cluster import FailoverCluster
from tools.processes import etcd_binary

pytestmark = pytest.mark.failover

TOPIC = "SyncedTopic"
GROUP = "SyncedGroup"
#: What the consumer group commits on the master, per queue.
COMMITTED = {0: 120, 1: 7, 2: 0, 3: 1 << 40}


async def _offsets(client: RemotingClient) -> dict[int, int]:
    found = {}
    for queue in COMMITTED:
        response = await _ask(
            client,
            RequestCode.QUERY_CONSUMER_OFFSET,
            header_to_ext_fields(QueryConsumerOffsetRequestHeader(GROUP, TOPIC, queue)),
        )
        assert response.code == ResponseCode.SUCCESS, (queue, response.code, response.remark)
        assert response.ext_fields is not None
        found[queue] = int(response.ext_fields["offset"])
    return found


async def _topics(client: RemotingClient) -> TopicTable:
    response = await _ask(client, RequestCode.GET_ALL_TOPIC_CONFIG)
    assert response.code == ResponseCode.SUCCESS
    table = decode_table(MetadataFile.TOPICS, response.body.decode("utf-8"))
    assert isinstance(table, TopicTable)
    return table


def _stored(store: str) -> tuple[dict[str, dict[int, int]], TopicTable]:
    """
    The store's C{config/consumerOffset.json} and C{config/topics.json},
    loaded back as a starting broker loads them.
    """
    offsets = load_file(
        os.path.join(store, "config", "consumerOffset.json"), MetadataFile.CONSUMER_OFFSETS, MetadataLimits()
    )
    topics = load_file(os.path.join(store, "config", "topics.json"), MetadataFile.TOPICS, MetadataLimits())
    assert isinstance(offsets, ConsumerOffsetTable) and isinstance(topics, TopicTable)
    return {k: dict(v) for k, v in offsets.offsets.items()}, topics


@pytest_twisted.ensureDeferred
async def test_metadata_survives_failover(tmp_path: Any) -> None:
    """
    Topics created on the master and consumer offsets committed there
    (UPDATE_AND_CREATE_TOPIC, UPDATE_CONSUMER_OFFSET over remoting) appear
    on the slave after its first sync (3 s after it became a slave),
    answered there and written to its C{config/}; after a kill -9 of the
    master, the promoted node registers with the NameServer as brokerId 0
    at its promotion, and answers QUERY_CONSUMER_OFFSET with the committed
    offsets and GET_ALL_TOPIC_CONFIG with the master's topic table, its
    DataVersion included: a promoted master keeps what it synced.  Its
    C{config/consumerOffset.json} and C{topics.json} load back.
    """
    from twisted.internet import reactor

    if etcd_binary() is None:
        pytest.skip("etcd is not installed (python3 dev.py test installs etcd-server as root)")
    namesrv = FakeNameServer(reactor)
    port = await namesrv.listen(reactor, "tcp:0:interface=127.0.0.1")
    options = namesrv_options(port.getHost().port)
    clients: list[RemotingClient] = []

    def client(address: str) -> RemotingClient:
        made = RemotingClient(reactor, f"tcp:{address}", retry_policy=lambda _: 0.1)
        clients.append(made)
        made.startService()
        return made

    try:
        with EtcdCluster(str(tmp_path / "etcd")) as etcd, FailoverCluster(
            str(tmp_path), etcd.spec, nodes=2, start=False, options=options
        ) as group:

            def start(i: int) -> None:
                group.start(i, "--broker-id", str(i + 1))

            def role(i: int) -> Any:
                return failover_role(group, i)

            # The master first, alone: the slave's first sync, 3 s after
            # it becomes one, then finds the topic and the offsets.
            start(0)
            await until(reactor, lambda: role(0) is True, "n0 to be elected", 30)
            await until(reactor, lambda: 0 in namesrv.brokers("g"), "n0 to register as 0", 10)
            n0 = namesrv.brokers("g")[0]
            master = client(n0)
            response = await _ask(master, RequestCode.UPDATE_AND_CREATE_TOPIC, topic_fields(TOPIC))
            assert (response.code, response.remark) == (ResponseCode.SUCCESS, None)
            for queue, offset in COMMITTED.items():
                response = await _ask(
                    master,
                    RequestCode.UPDATE_CONSUMER_OFFSET,
                    header_to_ext_fields(UpdateConsumerOffsetRequestHeader(GROUP, TOPIC, queue, offset)),
                )
                assert response.code == ResponseCode.SUCCESS, response.remark
            assert await _offsets(master) == COMMITTED
            masters_topics = await _topics(master)

            start(1)

            await until(reactor, lambda: metadata_syncs(group, 1) > 0, "n1's first complete metadata sync", 30)
            assert (group.status(1) or {})["metadata_sync"]["master"] == n0
            brokers = namesrv.brokers("g")
            assert set(brokers) == {0, 2}, brokers  # (n1 as its --broker-id)
            n1 = brokers[2]
            slave = client(n1)
            # On the slave: answered, and written at once by the sync.
            assert await _offsets(slave) == COMMITTED
            stored_offsets, stored_topics = _stored(group.nodes[1].store)
            assert stored_offsets[f"{TOPIC}@{GROUP}"] == COMMITTED
            assert TOPIC in stored_topics.topics

            def in_sync() -> bool:
                return len(((group.status(0) or {}).get("failover") or {}).get("in_sync") or []) == 2

            await until(reactor, in_sync, "n1 to enter n0's in-sync set", 30)

            registered = len(namesrv.registrations)
            group.kill(0)
            await until(reactor, lambda: role(1) is True, "n1 to be elected after the kill", 30)
            promoted = time.monotonic()
            # Registered as brokerId 0 at the promotion, not at the next
            # 30 s period (before it, standing by when its master went, as
            # its own id), and as nothing else since.
            await until(reactor, lambda: namesrv.brokers("g") == {0: n1}, "n1 to register as 0", 5)
            assert time.monotonic() - promoted < 5
            since = [(r.header.broker_addr, r.header.broker_id) for r in namesrv.registrations[registered:]]
            first = since.index((n1, 0))
            assert set(since[:first]) <= {(n1, 2)} and set(since[first:]) == {(n1, 0)}, since

            # The promoted master keeps what it synced: the offsets, the
            # topic table (its DataVersion too: adopted, not rebuilt).
            assert await _offsets(slave) == COMMITTED
            topics = await _topics(slave)
            assert topics.topics[TOPIC] == masters_topics.topics[TOPIC]
            assert topics.data_version.same(masters_topics.data_version)
            assert (group.status(1) or {})["metadata_sync"]["active"] is False
            stored_offsets, stored_topics = _stored(group.nodes[1].store)
            assert stored_offsets[f"{TOPIC}@{GROUP}"] == COMMITTED
            assert stored_topics.topics[TOPIC] == masters_topics.topics[TOPIC]
            with open(os.path.join(group.nodes[1].store, "config", "consumerOffset.json")) as f:
                text = f.read()
            # RocketMQ's format: unquoted integer keys, tabs, no final newline.
            assert '\t\t"SyncedTopic@SyncedGroup":{0:120,' in text and not text.endswith("\n")
    finally:
        for made in clients:
            if made.running:
                await made.stopService()
        await port.stopListening()
