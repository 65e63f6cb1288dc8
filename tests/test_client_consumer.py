"""
Tests for L{rmqha.client.PullConsumer} and L{rmqha.client.PushConsumer}:
consumers against fake brokers that answer as 4.9.8's
PullMessageProcessor (statuses, long polling, suggestWhichBrokerId),
ClientManageProcessor (HEART_BEAT, UNREGISTER_CLIENT, the
NOTIFY_CONSUMER_IDS_CHANGED they send) and ConsumerManageProcessor
(consumer lists, offsets) do, routed by the FakeNameServer, all in memory
on a Clock; and the sans-IO parts (allocation, the process queue, the
heartbeat body, record decoding).
"""

from __future__ import annotations

import json
import zlib
from random import Random
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IAddress
from twisted.internet.task import Clock
from twisted.logger import Logger
from twisted.trial.unittest import SynchronousTestCase

from rmqha.client import (
    ConsumeFromWhere,
    ConsumerError,
    ConsumeStatus,
    MessageQueue,
    NoMasterError,
    PullConsumer,
    PullStatus,
    PushConsumer,
    QueueChange,
    ReceivedMessage,
)
from rmqha.client._consume import (
    ProcessQueue,
    PullMessageRequestHeader,
    Subscription,
    allocate_averagely,
    decode_messages,
    heartbeat_body,
    tag_hash_code,
)
from rmqha.remoting._frames import RemotingCommand, header_from_ext_fields, header_to_ext_fields, make_response
from rmqha.remoting.codes import RequestCode, ResponseCode
from rmqha.remoting.offsets import QueryConsumerOffsetRequestHeader, UpdateConsumerOffsetRequestHeader
from rmqha.remoting.protocol import Dispatcher, RemotingProtocol
from rmqha.store._record import Message, encode_record
from rmqha.testing import FakeNameServer
from tests.test_client_producer import BrokerEndpoint, FakeBroker, _RecordingFactory, _register

_OFFSET = 0x0


class _Data:
    """A broker's messages: per (topic, queue) the records and their tag hashes; shared by a master
    and its slave."""

    def __init__(self) -> None:
        self.queues: dict[tuple[str, int], list[tuple[bytes, int]]] = {}
        self.min: dict[tuple[str, int], int] = {}
        self.commit_offset = 0
        self.times: dict[tuple[str, int], list[int]] = {}


class _ProtocolsFactory(_RecordingFactory):
    def buildProtocol(self, addr: IAddress | None) -> Any:
        protocol = super().buildProtocol(addr)
        self.protocols.append(protocol)
        return protocol


class ConsumeBroker(FakeBroker):
    """
    FakeBroker plus the consumer side, as 4.9.8 answers it:

    - PULL_MESSAGE: DefaultMessageStore.getMessage's statuses mapped as
      PullMessageProcessor maps them (PULL_OFFSET_MOVED on a master,
      PULL_RETRY_IMMEDIATELY on a slave), tags filtered by hash against
      the subscription (from the request with flag 0x4, else the
      heartbeat's; none: SUBSCRIPTION_NOT_EXIST), the commit offset
      stored with flag 0x1 (first pass, master only), a PULL_NOT_FOUND
      with flag 0x2 held until a message comes or suspendTimeoutMillis
      passes (then answered PULL_NOT_FOUND), suggestWhichBrokerId as
      scripted;
    - HEART_BEAT / UNREGISTER_CLIENT: the group's clients; a change
      notifies every other client of the group (oneway
      NOTIFY_CONSUMER_IDS_CHANGED);
    - GET_CONSUMER_LIST_BY_GROUP, QUERY/UPDATE_CONSUMER_OFFSET (a group
      with no offset on a queue whose min is 0 gets 0 when C{young}),
      GET_MAX/MIN_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP.
    """

    def __init__(
        self, name: str, host: str, port: int, topics: dict[str, int], clock: Clock, data: _Data | None = None,
        broker_id: int = 0,
    ) -> None:
        super().__init__(name, host, port, topics)
        self.clock = clock
        self.data = data or _Data()
        self.broker_id = broker_id
        self.suggest = 0
        self.young = True
        self.refuse_list = False
        self.filter = True
        self.groups: dict[str, dict[str, dict[str, Any]]] = {}
        self.peers: dict[str, Any] = {}
        self.committed: dict[tuple[str, str, int], int] = {}
        self.held: list[tuple[Any, ...]] = []  # type: ignore[assignment]
        self.pulls: list[PullMessageRequestHeader] = []
        self.codes: list[int] = []
        self.factory = _ProtocolsFactory(
            Dispatcher({
                RequestCode.PULL_MESSAGE: self._pull,
                RequestCode.HEART_BEAT: self._heartbeat,
                RequestCode.UNREGISTER_CLIENT: self._unregister,
                RequestCode.GET_CONSUMER_LIST_BY_GROUP: self._consumer_list,
                RequestCode.QUERY_CONSUMER_OFFSET: self._query,
                RequestCode.UPDATE_CONSUMER_OFFSET: self._update,
                RequestCode.GET_MAX_OFFSET: self._max,
                RequestCode.GET_MIN_OFFSET: self._min,
                RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self._search,
            }),
            clock,
        )
        self.factory.protocols = []

    # -- data --------------------------------------------------------------------

    def append(self, topic: str, queue_id: int, body: bytes, tags: str | None = None, uniq: str | None = None,
               sysflag: int = 0, props: dict[str, str] | None = None) -> None:
        q = self.data.queues.setdefault((topic, queue_id), [])
        properties = dict(props or {})
        if tags:
            properties["TAGS"] = tags
        if uniq:
            properties["UNIQ_KEY"] = uniq
        ts = round(self.clock.seconds() * 1000)
        record = encode_record(
            Message(topic, body, queue_id=queue_id, properties=properties, sysflag=sysflag,
                    born_timestamp=ts, born_host=("10.9.9.9", 40000)),
            queue_offset=len(q), physical_offset=self.data.commit_offset, store_timestamp=ts,
            store_host=(self.host, self.port),
        )
        self.data.commit_offset += len(record)
        q.append((record, tag_hash_code(tags) if tags else 0))
        self.data.times.setdefault((topic, queue_id), []).append(ts)
        held, self.held = self.held, []
        for request, header, d, call in held:
            if (header.topic, header.queue_id) == (topic, queue_id):
                call.cancel()
                d.callback(self._serve_pull(request, header, False))
            else:
                self.held.append((request, header, d, call))

    # -- pulls -------------------------------------------------------------------

    def _pull(self, request: RemotingCommand, peer: IAddress | None) -> Any:
        header = header_from_ext_fields(PullMessageRequestHeader, request.ext_fields)
        self.pulls.append(header)
        if self.codes:
            return make_response(request, self.codes.pop(0), "scripted")
        if header.sys_flag & 0x1 and self.broker_id == 0:
            self.committed[(header.consumer_group, header.topic, header.queue_id)] = header.commit_offset
        response = self._serve_pull(request, header, True)
        if response is None:
            d: Deferred[RemotingCommand] = Deferred()

            def expire() -> None:
                self.held = [h for h in self.held if h[2] is not d]
                d.callback(self._serve_pull(request, header, False))

            call = self.clock.callLater(header.suspend_timeout_millis / 1000, expire)
            self.held.append((request, header, d, call))
            return d
        return response

    def _subscription(self, header: PullMessageRequestHeader) -> Subscription | None:
        if header.sys_flag & 0x4:
            return Subscription.build(header.topic, header.subscription, header.sub_version)
        client = self.groups.get(header.consumer_group)
        for data in (client or {}).values():
            for cd in data["consumerDataSet"]:
                for sd in cd["subscriptionDataSet"]:
                    if sd["topic"] == header.topic:
                        return Subscription.build(sd["topic"], sd["subString"], sd["subVersion"])
        return None

    def _serve_pull(self, request: RemotingCommand, header: PullMessageRequestHeader, first: bool) -> Any:
        if header.queue_id >= self.topics.get(header.topic, 0):
            return make_response(request, ResponseCode.SYSTEM_ERROR, f"queueId[{header.queue_id}] is illegal")
        sub = self._subscription(header)
        if sub is None:
            return make_response(request, ResponseCode.SUBSCRIPTION_NOT_EXIST, "the consumer's subscription not exist")
        key = (header.topic, header.queue_id)
        q = self.data.queues.get(key, [])
        lo, hi, offset = self.data.min.get(key, 0), len(q), header.queue_offset
        body = b""
        if hi == 0:
            status, nxt = "NO_MESSAGE_IN_QUEUE", 0
            code = ResponseCode.PULL_OFFSET_MOVED if offset != 0 else ResponseCode.PULL_NOT_FOUND
        elif offset < lo:
            status, nxt, code = "OFFSET_TOO_SMALL", lo, ResponseCode.PULL_OFFSET_MOVED
        elif offset == hi:
            status, nxt, code = "OFFSET_OVERFLOW_ONE", offset, ResponseCode.PULL_NOT_FOUND
        elif offset > hi:
            status, nxt, code = "OFFSET_OVERFLOW_BADLY", hi, ResponseCode.PULL_OFFSET_MOVED
        else:
            found, i = [], offset
            codes = set(sub.codes())
            while i < hi and len(found) < header.max_msg_nums:
                record, tag = q[i]
                if not codes or not self.filter or tag in codes:
                    found.append(record)
                i += 1
            nxt, body = i, b"".join(found)
            status, code = (
                ("FOUND", ResponseCode.SUCCESS) if found else ("NO_MATCHED_MESSAGE", ResponseCode.PULL_RETRY_IMMEDIATELY)
            )
        if code == ResponseCode.PULL_OFFSET_MOVED and self.broker_id != 0:
            code = ResponseCode.PULL_RETRY_IMMEDIATELY
        if code == ResponseCode.PULL_NOT_FOUND and first and header.sys_flag & 0x2:
            return None
        ext = {"suggestWhichBrokerId": str(self.suggest), "nextBeginOffset": str(nxt), "minOffset": str(lo),
               "maxOffset": str(hi)}
        return make_response(request, code, status, ext_fields=ext, body=body)

    # -- clients -----------------------------------------------------------------

    def _notify(self, group: str, but: str | None) -> None:
        ext = {"consumerGroup": group}
        for cid in self.groups.get(group, {}):
            if cid == but:
                continue
            for protocol in self.factory.protocols:
                if protocol.is_open and protocol.peer == self.peers.get(cid):
                    protocol.send_oneway(RemotingCommand(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, ext_fields=ext))

    def join(self, group: str, cid: str) -> None:
        """A member whose heartbeat came (from nowhere): the others are notified."""
        self.groups.setdefault(group, {})[cid] = {"consumerDataSet": []}
        self._notify(group, cid)

    def _heartbeat(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
        self.requests.append(request)
        data = json.loads(request.body)
        cid = data["clientID"]
        for cd in data["consumerDataSet"]:
            members = self.groups.setdefault(cd["groupName"], {})
            new = cid not in members
            members[cid] = data
            self.peers[cid] = peer
            if new:
                self._notify(cd["groupName"], cid)
        return make_response(request, ResponseCode.SUCCESS)

    def _unregister(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
        self.requests.append(request)
        cid, group = request.ext("clientID"), request.ext("consumerGroup")
        if group and self.groups.get(group, {}).pop(str(cid), None) is not None:
            self._notify(group, None)
        return make_response(request, ResponseCode.SUCCESS)

    def _consumer_list(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
        self.requests.append(request)
        group = str(request.ext("consumerGroup"))
        ids = list(self.groups.get(group, {}))
        if not ids or self.refuse_list:
            return make_response(request, ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return make_response(request, ResponseCode.SUCCESS, body=json.dumps({"consumerIdList": ids}).encode())

    def _query(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
        self.requests.append(request)
        h = header_from_ext_fields(QueryConsumerOffsetRequestHeader, request.ext_fields)
        offset = self.committed.get((h.consumer_group, h.topic, h.queue_id))
        if offset is None and self.young and self.data.min.get((h.topic, h.queue_id), 0) == 0:
            offset = 0
        if offset is None:
            return make_response(request, ResponseCode.QUERY_NOT_FOUND, "Not found")
        return make_response(request, ResponseCode.SUCCESS, ext_fields={"offset": str(offset)})

    def _update(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
        self.requests.append(request)
        h = header_from_ext_fields(UpdateConsumerOffsetRequestHeader, request.ext_fields)
        self.committed[(h.consumer_group, h.topic, h.queue_id)] = h.commit_offset
        return make_response(request, ResponseCode.SUCCESS)

    def _max(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
        self.requests.append(request)
        n = len(self.data.queues.get((str(request.ext("topic")), int(request.ext("queueId") or 0)), []))
        return make_response(request, ResponseCode.SUCCESS, ext_fields={"offset": str(n)})

    def _min(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
        key = (str(request.ext("topic")), int(request.ext("queueId") or 0))
        return make_response(request, ResponseCode.SUCCESS, ext_fields={"offset": str(self.data.min.get(key, 0))})

    def _search(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
        self.requests.append(request)
        key = (str(request.ext("topic")), int(request.ext("queueId") or 0))
        ts = int(request.ext("timestamp") or 0)
        times = self.data.times.get(key, [])
        offset = next((i for i, t in enumerate(times) if t >= ts), len(times))
        return make_response(request, ResponseCode.SUCCESS, ext_fields={"offset": str(offset)})

    def sent(self, code: int) -> list[RemotingCommand]:
        return [r for r in self.requests if r.code == code]


class _Case(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1_700_000_000)
        self.ns = FakeNameServer(self.clock)
        self.endpoints: dict[str, BrokerEndpoint] = {}
        self.a = self.broker("broker-a", "10.0.0.1", {"T": 4})
        self.services: list[Any] = []
        self.addCleanup(self.stop_all)

    def broker(self, name: str, host: str, topics: dict[str, int], broker_id: int = 0,
               data: _Data | None = None) -> ConsumeBroker:
        broker = ConsumeBroker(name, host, 10911, topics, self.clock, data, broker_id)
        self.endpoints[broker.addr] = BrokerEndpoint(broker, self.clock)
        _register(self.ns, broker, broker_id)
        return broker

    def push(self, handler: Any = None, cid: str = "10.9.9.9@1#1", start: bool = True, **options: Any) -> PushConsumer:
        self.got: list[ReceivedMessage] = getattr(self, "got", [])

        def record(messages: list[ReceivedMessage]) -> None:
            self.got.extend(messages)

        consumer = PushConsumer(
            None, [self.ns.client_endpoint(self.clock)], "CG", handler or record, clock=self.clock,
            endpoint_for=lambda addr: self.endpoints[addr], client_id=cid, rng=Random(0), **options,
        )
        consumer.subscribe("T")
        if start:
            consumer.startService()
            self.services.append(consumer)
            self.pump()
        return consumer

    def pull_consumer(self) -> PullConsumer:
        consumer = PullConsumer(None, [self.ns.client_endpoint(self.clock)], "PCG", clock=self.clock,
                                endpoint_for=lambda addr: self.endpoints[addr], rng=Random(0))
        consumer.startService()
        self.services.append(consumer)
        return consumer

    def stop_all(self) -> None:
        for s in self.services:
            if s.running:
                s.stopService()
            self.pump()
        for b in [e.broker for e in self.endpoints.values()]:
            for _, _, d, call in b.held:  # type: ignore[misc]
                if call.active():
                    call.cancel()
        self.clock.advance(200)
        self.pump()
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def pump(self) -> None:
        for _ in range(20):
            self.clock.advance(0)
            self.ns.flush()
            for endpoint in self.endpoints.values():
                for connection in endpoint.connections:
                    connection.flush()

    def advance(self, seconds: float, step: float = 1.0) -> None:
        while seconds > 0:
            self.clock.advance(min(step, seconds))
            seconds -= step
            self.pump()

    def result(self, d: Deferred[Any]) -> Any:
        self.pump()
        return self.successResultOf(d)

    def count_lookups(self) -> list[str]:
        """The topics of every GET_ROUTEINFO_BY_TOPIC the NameServer answers from now on."""
        topics: list[str] = []
        handlers = self.ns.handler._handlers
        answer = handlers[RequestCode.GET_ROUTEINFO_BY_TOPIC]

        def counted(request: RemotingCommand, peer: IAddress | None) -> Any:
            topics.append(str(request.ext("topic")))
            return answer(request, peer)

        handlers[RequestCode.GET_ROUTEINFO_BY_TOPIC] = counted
        return topics

    def kill(self, broker: ConsumeBroker) -> None:
        """The broker's process gone: its connections reset, new ones refused."""
        self.endpoints[broker.addr].up = False
        for connection in self.endpoints[broker.addr].connections:
            connection.hang_up()


class SansIOTests(SynchronousTestCase):
    def test_allocate_averagely(self) -> None:
        """
        AllocateMessageQueueAveragely: 8 queues over 3 consumers give 3,
        3, 2 contiguous queues (sorted ids and queues); 2 queues over 3
        consumers leave the last without; a consumer not listed gets none.
        """
        mqs = [MessageQueue("T", b, i) for b in ("broker-b", "broker-a") for i in range(4)]
        cids = ["c3", "c1", "c2"]
        got = [allocate_averagely("G", c, mqs, cids) for c in ("c1", "c2", "c3")]
        self.assertEqual([[(q.broker_name, q.queue_id) for q in g] for g in got], [
            [("broker-a", 0), ("broker-a", 1), ("broker-a", 2)],
            [("broker-a", 3), ("broker-b", 0), ("broker-b", 1)],
            [("broker-b", 2), ("broker-b", 3)],
        ])
        two = mqs[:2]
        self.assertEqual([len(allocate_averagely("G", c, two, cids)) for c in ("c1", "c2", "c3")], [1, 1, 0])
        self.assertEqual(allocate_averagely("G", "c9", mqs, cids), [])

    def test_process_queue_frontier(self) -> None:
        """
        ProcessQueue.removeMessage: the offset to commit is the smallest
        still held, or one past the largest ever put; -1 when nothing was
        held.
        """
        pq = ProcessQueue()
        msgs = [_message(i) for i in range(5, 9)]
        self.assertEqual(pq.remove(msgs[:1]), -1)
        pq.put(msgs)
        self.assertEqual((pq.msg_count, pq.msg_size, pq.max_span), (4, 4, 3))
        self.assertEqual(pq.remove([msgs[2], msgs[1]]), 5)
        self.assertEqual(pq.remove([msgs[0]]), 8)
        self.assertEqual(pq.remove([msgs[3]]), 9)
        self.assertEqual(pq.msg_count, 0)

    def test_heartbeat_bytes(self) -> None:
        """
        The HEART_BEAT body byte for byte against a HeartbeatData derived
        by hand from 4.9.8's classes and fastjson's defaults: keys sorted,
        enums by name, codeSet = String.hashCode of each tag (TagA
        2598919), sets in HashSet order (TagA before TagB whatever the
        expression's order), the subString as written.
        """
        subs = [Subscription.build("TopicTest", "TagB || TagA", 1700000000000),
                Subscription.build("%RETRY%CG", "*", 1700000000000)]
        body = heartbeat_body("10.0.0.5@12345#987", "CG", subs, ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET)
        expected = (
            '{"clientID":"10.0.0.5@12345#987","consumerDataSet":[{"consumeFromWhere":"CONSUME_FROM_LAST_OFFSET",'
            '"consumeType":"CONSUME_PASSIVELY","groupName":"CG","messageModel":"CLUSTERING","subscriptionDataSet":['
            '{"classFilterMode":false,"codeSet":[],"expressionType":"TAG","subString":"*","subVersion":1700000000000,'
            '"tagsSet":[],"topic":"%RETRY%CG"},'
            '{"classFilterMode":false,"codeSet":[2598919,2598920],"expressionType":"TAG","subString":"TagB || TagA",'
            '"subVersion":1700000000000,"tagsSet":["TagA","TagB"],"topic":"TopicTest"}],"unitMode":false}],'
            '"producerDataSet":[]}'
        )
        self.assertEqual(body.decode(), expected)

    def test_decode_stops_at_a_bad_record(self) -> None:
        """
        MessageDecoder.decodes: records back to back; a compressed body
        inflated; msgId the UNIQ_KEY (else the offset id); a record that
        does not decode drops it and the rest, silently.
        """
        r1 = encode_record(Message("T", b"one", properties={"UNIQ_KEY": "U1"}), queue_offset=0, physical_offset=0,
                           store_timestamp=1, store_host=("10.0.0.1", 10911))
        r2 = encode_record(Message("T", zlib.compress(b"two"), sysflag=0x1), queue_offset=1,
                           physical_offset=len(r1), store_timestamp=1, store_host=("10.0.0.1", 10911))
        bad = bytearray(r1)
        bad[4:8] = b"\0\0\0\0"
        got = decode_messages(r1 + r2 + bytes(bad) + r1, MessageQueue("T", "broker-a", 0))
        self.assertEqual([(m.body, m.msg_id) for m in got],
                         [(b"one", "U1"), (b"two", f"0A00000100002A9F{len(r1):016X}")])
        self.assertEqual(got[0].offset_msg_id, "0A00000100002A9F0000000000000000")


def _message(offset: int) -> ReceivedMessage:
    return ReceivedMessage("T", b"x", {}, MessageQueue("T", "b", 0), offset, 0, "id", "id", 0, 0, 0, "h:1", 0,
                           "h:1", 0, 0)


class PullConsumerTests(_Case):
    def test_pull_statuses(self) -> None:
        """
        pull: NO_NEW_MSG on an empty queue; FOUND with the records decoded
        (UNIQ_KEY as msgId, the store host and offset as offsetMsgId,
        MIN_OFFSET/MAX_OFFSET added); NO_MATCHED_MSG when the tag filter
        takes everything; OFFSET_ILLEGAL past the end, with the
        nextBeginOffset to go on from; NO_NEW_MSG at the end.
        """
        consumer = self.pull_consumer()
        queues = self.result(consumer.queues("T"))
        self.assertEqual(queues, [MessageQueue("T", "broker-a", i) for i in range(4)])
        q = queues[1]
        r = self.result(consumer.pull(q, 0))
        self.assertEqual((r.status, r.next_begin_offset, r.messages), (PullStatus.NO_NEW_MSG, 0, ()))
        for i, tag in enumerate(["A", "B", "A"]):
            self.a.append("T", 1, b"m%d" % i, tags=tag, uniq=f"U{i}")
        r = self.result(consumer.pull(q, 0, 32, "A"))
        self.assertEqual((r.status, r.next_begin_offset, r.min_offset, r.max_offset), (PullStatus.FOUND, 3, 0, 3))
        self.assertEqual([(m.body, m.msg_id, m.queue_offset, m.tags) for m in r.messages],
                         [(b"m0", "U0", 0, "A"), (b"m2", "U2", 2, "A")])
        m = r.messages[0]
        self.assertEqual((m.properties["MIN_OFFSET"], m.properties["MAX_OFFSET"]), ("0", "3"))
        self.assertEqual(m.offset_msg_id, "0A00000100002A9F0000000000000000")
        self.assertEqual(m.queue, q)
        [header] = self.a.pulls[-1:]
        self.assertEqual((header.sys_flag, header.subscription, header.consumer_group), (0x4, "A", "PCG"))
        r = self.result(consumer.pull(q, 1, 32, "C"))
        self.assertEqual((r.status, r.next_begin_offset, r.messages), (PullStatus.NO_MATCHED_MSG, 3, ()))
        r = self.result(consumer.pull(q, 10))
        self.assertEqual((r.status, r.next_begin_offset), (PullStatus.OFFSET_ILLEGAL, 3))
        r = self.result(consumer.pull(q, 3))
        self.assertEqual(r.status, PullStatus.NO_NEW_MSG)

    def test_client_side_tag_filter(self) -> None:
        """
        The broker filters by tag hash only; the client filters again by
        the tag itself (a broker that did not filter at all here).
        """
        consumer = self.pull_consumer()
        self.a.filter = False
        self.a.append("T", 0, b"a", tags="A")
        self.a.append("T", 0, b"b", tags="B")
        self.a.append("T", 0, b"n")
        r = self.result(consumer.pull(MessageQueue("T", "broker-a", 0), 0, 32, "B || C"))
        self.assertEqual([m.body for m in r.messages], [b"b"])
        self.assertEqual(r.next_begin_offset, 3)

    def test_suggest_which_broker_id(self) -> None:
        """
        suggestWhichBrokerId: the next pull of the queue goes to the
        suggested broker (a slave, without the commit flag), and back to
        the master when the slave suggests 0.
        """
        slave = self.broker("broker-a", "10.0.0.11", {"T": 4}, broker_id=1, data=self.a.data)
        consumer = self.pull_consumer()
        q = MessageQueue("T", "broker-a", 0)
        self.a.append("T", 0, b"x")
        self.result(consumer.queues("T"))
        self.a.suggest = slave.suggest = 1
        self.result(consumer.pull(q, 0))
        self.assertEqual((len(self.a.pulls), len(slave.pulls)), (1, 0))
        r = self.result(consumer.pull(q, 0))
        self.assertEqual((len(self.a.pulls), len(slave.pulls)), (1, 1))
        self.assertEqual([m.body for m in r.messages], [b"x"])
        # A slave gets no commit flag.
        sub = Subscription.build("T", "*", 0)
        pull = consumer.client.pull(q, 1, 32, sub, suspend=None, commit_offset=5, timeout=3, post_subscription=True)
        self.result(Deferred.fromCoroutine(pull))
        self.assertEqual((slave.pulls[-1].sys_flag, slave.pulls[-1].commit_offset), (0x4, 0))
        slave.suggest = self.a.suggest = 0
        self.result(consumer.pull(q, 1))
        self.assertEqual((len(self.a.pulls), len(slave.pulls)), (1, 3))
        self.result(consumer.pull(q, 1))
        self.assertEqual((len(self.a.pulls), len(slave.pulls)), (2, 3))
        pull = consumer.client.pull(q, 1, 32, sub, suspend=None, commit_offset=5, timeout=3, post_subscription=True)
        self.result(Deferred.fromCoroutine(pull))
        self.assertEqual((self.a.pulls[-1].sys_flag, self.a.pulls[-1].commit_offset), (0x5, 5))

    def test_offsets(self) -> None:
        """
        Offset helpers: commit (oneway UPDATE_CONSUMER_OFFSET), query,
        max, min and search by timestamp.
        """
        consumer = self.pull_consumer()
        q = MessageQueue("T", "broker-a", 2)
        self.a.append("T", 2, b"x")
        self.clock.advance(10)
        self.a.append("T", 2, b"y")
        self.result(consumer.commit_offset(q, 1))
        self.assertEqual(self.a.committed, {("PCG", "T", 2): 1})
        self.assertEqual(self.result(consumer.query_offset(q)), 1)
        self.assertEqual(self.result(consumer.max_offset(q)), 2)
        self.assertEqual(self.result(consumer.min_offset(q)), 0)
        self.assertEqual(self.result(consumer.search_offset(q, self.clock.seconds() - 5)), 1)
        self.a.young = False
        self.assertEqual(self.result(consumer.query_offset(MessageQueue("T", "broker-a", 3))), -1)


class PushConsumerTests(_Case):
    def test_long_poll_cycle(self) -> None:
        """
        Each queue is pulled with flag 0x2, suspendTimeoutMillis 15000 and
        32 messages at most; the broker holds the pull; a message that
        comes wakes it and reaches the handler; a hold that times out is
        answered PULL_NOT_FOUND and the next pull goes at once.  Once an
        offset is known, pulls carry it with flag 0x1.
        """
        self.push()
        self.assertEqual(len(self.a.held), 4)
        header = self.a.pulls[0]
        self.assertEqual((header.sys_flag, header.suspend_timeout_millis, header.max_msg_nums, header.queue_offset,
                          header.subscription, header.expression_type), (0x2, 15000, 32, 0, None, "TAG"))
        self.advance(10)
        self.assertEqual(len(self.a.pulls), 4)
        self.a.append("T", 2, b"hello", tags="A")
        self.pump()
        self.assertEqual([m.body for m in self.got], [b"hello"])
        self.assertEqual(self.a.pulls[-1].queue_id, 2)
        self.assertEqual((self.a.pulls[-1].queue_offset, self.a.pulls[-1].sys_flag,
                          self.a.pulls[-1].commit_offset), (1, 0x3, 1))
        self.advance(5.5)
        self.assertEqual(len(self.a.pulls), 8)  # the three others expired and went again
        self.assertEqual(self.a.committed[("CG", "T", 2)], 1)

    def test_rebalance_two_consumers(self) -> None:
        """
        Two consumers of one group over 2 brokers x 4 queues.  The first
        takes all 8.  When a second member's heartbeat reaches the brokers,
        they notify the first (NOTIFY_CONSUMER_IDS_CHANGED): it rebalances
        at once, and commits the offsets of the queues it lets go (its
        held pulls carried none).  The second then starts from those
        offsets; each queue ends with exactly one of them, and every
        message is consumed once.
        """
        b = self.broker("broker-b", "10.0.0.2", {"T": 4})
        for q in range(4):
            self.a.append("T", q, b"a%d" % q)
            b.append("T", q, b"b%d" % q)
        got1: list[bytes] = []
        got2: list[bytes] = []
        later: list[Deferred[None]] = []

        def slow(messages: list[ReceivedMessage]) -> Deferred[None]:
            got1.extend(m.body for m in messages)
            later.append(Deferred())
            return later[-1]

        c1 = self.push(slow, cid="10.9.9.9@1#1")
        self.assertEqual(len(c1.assigned), 8)
        self.assertEqual(len(got1), 8)
        for d in later:
            d.callback(None)
        self.assertEqual(b.committed, {})  # (the pulls held carry no offset yet)
        second = "10.9.9.9@2#2"
        self.a.join("CG", second)
        b.join("CG", second)
        self.pump()
        self.assertEqual(set(c1.assigned), {MessageQueue("T", "broker-a", i) for i in range(4)})
        self.assertEqual(b.committed, {("CG", "T", i): 1 for i in range(4)})
        c2 = self.push(lambda ms: got2.extend(m.body for m in ms), cid=second)
        self.assertEqual(set(c2.assigned), {MessageQueue("T", "broker-b", i) for i in range(4)})
        self.assertEqual(sorted(h.queue_offset for h in b.pulls[-4:]), [1, 1, 1, 1])
        for q in range(4):
            self.a.append("T", q, b"a%d'" % q)
            b.append("T", q, b"b%d'" % q)
        self.pump()
        self.assertEqual(sorted(got1 + got2), sorted([b"a%d" % q for q in range(4)] + [b"b%d" % q for q in range(4)]
                                                     + [b"a%d'" % q for q in range(4)] + [b"b%d'" % q for q in range(4)]))
        self.assertEqual(sorted(got2), [b"b%d'" % q for q in range(4)])

    def test_commits_only_the_processed_frontier(self) -> None:
        """
        Handlers that finish out of order: the committed offset is the
        smallest message not yet consumed, whatever came after it; it
        moves on when that one is done.  Commits go oneway every 5 s.
        """
        waiting: dict[bytes, Deferred[None]] = {}

        def handler(messages: list[ReceivedMessage]) -> Deferred[None]:
            d: Deferred[None] = Deferred()
            waiting[messages[0].body] = d
            return d

        for i in range(3):
            self.a.append("T", 0, b"%d" % i)
        consumer = self.push(handler)
        self.assertEqual(sorted(waiting), [b"0", b"1", b"2"])
        waiting[b"2"].callback(None)
        waiting[b"1"].callback(None)
        self.advance(5)
        self.assertEqual(consumer.offsets[MessageQueue("T", "broker-a", 0)], 0)
        self.assertEqual(self.a.committed[("CG", "T", 0)], 0)
        waiting[b"0"].callback(None)
        self.advance(5)
        self.assertEqual(self.a.committed[("CG", "T", 0)], 3)
        self.assertGreaterEqual(len(self.a.sent(RequestCode.UPDATE_CONSUMER_OFFSET)), 2)

    def test_restart_resumes_from_committed_offset(self) -> None:
        """
        A consumer stopped after consuming 5 messages commits 5; a new one
        of the group gets only the messages after them.
        """
        for i in range(5):
            self.a.append("T", 1, b"%d" % i)
        first = self.push()
        self.assertEqual(len(self.got), 5)
        self.result(first.stopService())
        self.assertEqual(self.a.committed[("CG", "T", 1)], 5)
        self.assertEqual(len(self.a.sent(RequestCode.UNREGISTER_CLIENT)), 1)
        for i in range(5, 8):
            self.a.append("T", 1, b"%d" % i)
        self.got = []
        self.push(cid="10.9.9.9@3#3")
        self.assertEqual([m.body for m in self.got], [b"5", b"6", b"7"])

    def test_consume_from_where(self) -> None:
        """
        A group with no offset on a queue the broker says QUERY_NOT_FOUND
        for: LAST_OFFSET starts at GET_MAX_OFFSET, FIRST_OFFSET at 0,
        TIMESTAMP at SEARCH_OFFSET_BY_TIMESTAMP's answer.
        """
        self.a.young = False
        self.a.append("T", 0, b"old")
        self.clock.advance(100)
        self.a.append("T", 0, b"new")
        self.push(cid="c-last")
        self.assertEqual(self.got, [])
        self.assertEqual(len(self.a.sent(RequestCode.GET_MAX_OFFSET)), 4)
        self.result(self.services[-1].stopService())
        self.a.committed.clear()
        self.push(cid="c-first", consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
        self.assertEqual([m.body for m in self.got], [b"old", b"new"])
        self.result(self.services[-1].stopService())
        self.a.committed.clear()
        self.got = []
        self.push(cid="c-time", consume_from_where=ConsumeFromWhere.CONSUME_FROM_TIMESTAMP,
                  consume_timestamp=self.clock.seconds() - 50)
        self.assertEqual([m.body for m in self.got], [b"new"])
        self.assertEqual(len(self.a.sent(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP)), 4)

    def test_offset_illegal(self) -> None:
        """
        OFFSET_ILLEGAL (PULL_OFFSET_MOVED): the queue is dropped; 10 s
        later the broker's nextBeginOffset is committed and the queue let
        go; the next rebalance takes it again from there.
        """
        self.a.committed[("CG", "T", 3)] = 100
        for i in range(2):
            self.a.append("T", 3, b"%d" % i)
        consumer = self.push()
        q = MessageQueue("T", "broker-a", 3)
        self.assertEqual(consumer.assigned[q].pq.dropped, True)
        self.advance(10)
        self.assertEqual(self.a.committed[("CG", "T", 3)], 2)
        self.assertNotIn(q, consumer.assigned)
        self.a.append("T", 3, b"2")
        self.advance(10)
        self.assertIn(q, consumer.assigned)
        self.assertEqual([m.body for m in self.got], [b"2"])

    def test_failed_handler_retried_locally(self) -> None:
        """
        A handler that fails (an exception, or RECONSUME_LATER) gets the
        message again after 10 s, then 30 s, with reconsume_times counted;
        the offset is not committed past it meanwhile.
        """
        calls: list[tuple[bytes, int]] = []

        def handler(messages: list[ReceivedMessage]) -> Any:
            m = messages[0]
            calls.append((m.body, m.reconsume_times))
            if m.body == b"bad" and m.reconsume_times == 0:
                raise ValueError("boom")
            if m.body == b"bad" and m.reconsume_times == 1:
                return ConsumeStatus.RECONSUME_LATER
            return succeed(ConsumeStatus.CONSUME_SUCCESS)

        for body in (b"ok", b"bad", b"ok2"):
            self.a.append("T", 0, body)
        consumer = self.push(handler)
        q = MessageQueue("T", "broker-a", 0)
        self.assertEqual(consumer.offsets[q], 1)
        self.advance(10)
        self.assertEqual(calls[-1], (b"bad", 1))
        self.assertEqual(consumer.offsets[q], 1)
        self.advance(30)
        self.assertEqual(calls[-1], (b"bad", 2))
        self.assertEqual(consumer.offsets[q], 3)
        self.assertEqual(len(self.flushLoggedErrors(ValueError)), 1)

    def test_flow_control_and_concurrency(self) -> None:
        """
        pullThresholdForQueue: a queue holding more messages than allowed
        is not pulled again (checked every 50 ms) until its handlers free
        room; at most max_concurrency handlers run at once.
        """
        running: list[Deferred[None]] = []

        def handler(messages: list[ReceivedMessage]) -> Deferred[None]:
            d: Deferred[None] = Deferred()
            running.append(d)
            return d

        for i in range(10):
            self.a.append("T", 0, b"%d" % i)
        consumer = self.push(handler, pull_threshold_for_queue=2, pull_batch_size=4, max_concurrency=3)
        q0 = [h for h in self.a.pulls if h.queue_id == 0]
        self.assertEqual(len(q0), 1)
        self.assertEqual(len(running), 3)
        self.advance(0.2, 0.05)
        self.assertEqual(len([h for h in self.a.pulls if h.queue_id == 0]), 1)
        self.assertGreater(consumer.flow_controlled, 2)
        for d in list(running):
            d.callback(None)
        self.pump()
        self.assertEqual(len(running), 4)
        running[3].callback(None)
        self.advance(0.1, 0.05)
        self.assertEqual(len([h for h in self.a.pulls if h.queue_id == 0]), 2)

    def test_stop_waits_commits_unregisters(self) -> None:
        """
        stopService: no more pulls; it waits for the running handler,
        commits what it consumed, sends UNREGISTER_CLIENT, and leaves no
        timer behind.  A handler still running past stop_timeout is not
        committed.
        """
        pending: list[Deferred[None]] = []

        def handler(messages: list[ReceivedMessage]) -> Deferred[None]:
            d: Deferred[None] = Deferred()
            pending.append(d)
            return d

        self.a.append("T", 0, b"x")
        self.a.append("T", 1, b"y")
        consumer = self.push(handler, stop_timeout=5)
        stopped = consumer.stopService()
        self.pump()
        self.assertNoResult(stopped)
        pending[0].callback(None)
        self.advance(5)
        self.successResultOf(stopped)
        self.assertEqual(self.a.committed[("CG", "T", 0)], 1)
        self.assertNotIn(("CG", "T", 1), self.a.committed)
        [unregister] = self.a.sent(RequestCode.UNREGISTER_CLIENT)
        self.assertEqual(dict(unregister.ext_fields or {}), {"clientID": "10.9.9.9@1#1", "consumerGroup": "CG"})
        self.assertEqual(consumer.assigned, {})


    def test_stop_from_a_handler(self) -> None:
        """
        A handler that stops its consumer: the stop waits for that handler
        to return and commits its message.
        """
        stops: list[Deferred[None]] = []
        consumers: list[PushConsumer] = []

        def handler(messages: list[ReceivedMessage]) -> None:
            stops.append(consumers[0].stopService())

        self.a.append("T", 0, b"x")
        consumers.append(self.push(handler, start=False))
        consumers[0].startService()
        self.services.append(consumers[0])
        self.pump()
        self.successResultOf(stops[0])
        self.assertEqual(self.a.committed[("CG", "T", 0)], 1)

    def test_heartbeat_on_the_wire(self) -> None:
        """
        HEART_BEAT goes at start and every 30 s to every address of the
        topic's brokers, the slave too, with the HeartbeatData of the
        consumer's group, client id, subscriptions (the group's retry
        topic added) and subVersion (the subscribe time in ms).
        """
        slave = self.broker("broker-a", "10.0.0.11", {"T": 4}, broker_id=1, data=self.a.data)
        consumer = self.push(start=False)
        consumer.subscribe("T", "TagB || TagA")
        consumer.startService()
        self.services.append(consumer)
        self.pump()
        expected = (
            '{"clientID":"10.9.9.9@1#1","consumerDataSet":[{"consumeFromWhere":"CONSUME_FROM_LAST_OFFSET",'
            '"consumeType":"CONSUME_PASSIVELY","groupName":"CG","messageModel":"CLUSTERING","subscriptionDataSet":['
            '{"classFilterMode":false,"codeSet":[],"expressionType":"TAG","subString":"*","subVersion":1700000000000,'
            '"tagsSet":[],"topic":"%RETRY%CG"},'
            '{"classFilterMode":false,"codeSet":[2598919,2598920],"expressionType":"TAG","subString":"TagB || TagA",'
            '"subVersion":1700000000000,"tagsSet":["TagA","TagB"],"topic":"T"}],"unitMode":false}],'
            '"producerDataSet":[]}'
        ).encode()
        for broker in (self.a, slave):
            [beat] = broker.sent(RequestCode.HEART_BEAT)
            self.assertEqual((beat.body, beat.ext_fields), (expected, None))
        self.advance(30, 5)
        self.assertEqual([len(b.sent(RequestCode.HEART_BEAT)) for b in (self.a, slave)], [2, 2])

    def test_second_stop_is_the_first(self) -> None:
        """
        A stop while one is under way (waiting for a handler) is the same
        stop: one UNREGISTER_CLIENT, both fire when it is done.
        """
        pending: list[Deferred[None]] = []

        def handler(messages: list[ReceivedMessage]) -> Deferred[None]:
            pending.append(Deferred())
            return pending[-1]

        self.a.append("T", 0, b"x")
        consumer = self.push(handler)
        first, second = consumer.stopService(), consumer.stopService()
        self.pump()
        self.assertNoResult(second)
        pending[0].callback(None)
        self.pump()
        self.successResultOf(first)
        self.successResultOf(second)
        self.assertEqual(len(self.a.sent(RequestCode.UNREGISTER_CLIENT)), 1)

    def test_pull_error_retried_after_3s(self) -> None:
        """
        A pull answered with a code that is not a pull status
        (SUBSCRIPTION_NOT_EXIST here) is tried again after 3 s, from the
        same offset.
        """
        self.a.codes = [ResponseCode.SUBSCRIPTION_NOT_EXIST]
        self.a.append("T", 0, b"x")
        self.push()
        self.assertEqual(self.got, [])
        self.advance(2)
        self.assertEqual(self.got, [])
        self.advance(1)
        self.assertEqual([m.body for m in self.got], [b"x"])
        self.assertEqual(self.a.pulls[0].queue_offset, self.a.pulls[4].queue_offset)

    def test_topic_that_appears_later(self) -> None:
        """
        A subscribed topic the NameServers do not know yet is looked up
        again at each rebalance: once a broker registers it, its queues
        are taken within 20 s.
        """
        consumer = self.push(start=False)
        consumer.subscribe("U")
        consumer.startService()
        self.services.append(consumer)
        self.pump()
        self.assertEqual({q.topic for q in consumer.assigned}, {"T"})
        self.a.topics["U"] = 2
        _register(self.ns, self.a, 0, version=2)
        self.a.append("U", 1, b"u")
        self.advance(20, 5)
        self.assertEqual({q for q in consumer.assigned if q.topic == "U"},
                         {MessageQueue("U", "broker-a", 0), MessageQueue("U", "broker-a", 1)})
        self.assertEqual([m.body for m in self.got], [b"u"])

    def test_stop_during_start(self) -> None:
        """
        A stop that comes while the start still waits for the NameServer:
        no heartbeat, no pull, no loop left running; the stop completes.
        """
        consumer = self.push(start=False)
        consumer.startService()
        self.services.append(consumer)
        stopped = consumer.stopService()
        self.pump()
        self.successResultOf(stopped)
        self.assertEqual((self.a.sent(RequestCode.HEART_BEAT), self.a.pulls), ([], []))
        self.advance(60, 10)
        self.assertEqual((self.a.sent(RequestCode.HEART_BEAT), self.a.pulls), ([], []))

    # -- heartbeats at once: a broker that does not know this consumer --------------

    def test_heartbeat_at_once_after_a_route_change(self) -> None:
        """
        A master promoted at a new address (the route names it as brokerId
        0): the consumer's heartbeat goes there at the route's next poll,
        not at the next 30 s round, so its pulls there are served at once
        (4.9.8 waits for the round: SUBSCRIPTION_NOT_EXIST meanwhile).
        """
        self.a.append("T", 0, b"before")
        self.push(poll_interval=1.0)
        self.assertEqual([m.body for m in self.got], [b"before"])
        promoted = self.broker("broker-a", "10.0.0.11", {"T": 4}, data=self.a.data)
        self.advance(1)
        self.assertEqual(len(promoted.sent(RequestCode.HEART_BEAT)), 1)
        promoted.append("T", 0, b"after")
        self.advance(3)
        self.assertEqual([m.body for m in self.got], [b"before", b"after"])
        self.assertEqual([p.queue_offset for p in promoted.pulls if p.queue_id == 0][:1], [1])

    def test_heartbeat_at_once_when_a_pull_lacks_the_subscription(self) -> None:
        """
        A pull answered SUBSCRIPTION_NOT_EXIST (the broker lost the
        consumer: restarted, expired it) or SUBSCRIPTION_NOT_LATEST sends a
        heartbeat at once; the pull goes again 3 s later and is served.
        """
        self.push()
        beats = len(self.a.sent(RequestCode.HEART_BEAT))
        self.a.groups.clear()
        self.a.append("T", 0, b"x")  # (the held pull answers SUBSCRIPTION_NOT_EXIST)
        self.pump()
        self.assertEqual(len(self.a.sent(RequestCode.HEART_BEAT)), beats + 1)
        self.a.codes = [ResponseCode.SUBSCRIPTION_NOT_LATEST]
        self.advance(3)
        self.assertEqual(len(self.a.sent(RequestCode.HEART_BEAT)), beats + 2)
        self.assertEqual(self.got, [])
        self.advance(3)
        self.assertEqual([m.body for m in self.got], [b"x"])

    def test_rebalance_heartbeats_when_not_listed(self) -> None:
        """
        A rebalance whose broker does not list this consumer (a master just
        promoted that has other members' heartbeats and not its own)
        heartbeats and asks again, instead of letting go of every queue
        (or, when the group is not listed at all, keeping queues another
        member may take meanwhile).
        """
        consumer = self.push()
        self.assertEqual(len([q for q in consumer.assigned if q.topic == "T"]), 4)
        beats = len(self.a.sent(RequestCode.HEART_BEAT))
        self.a.groups.clear()
        consumer.rebalance_now()
        self.pump()
        self.assertEqual(len(self.a.sent(RequestCode.HEART_BEAT)), beats + 1)
        self.assertEqual(list(self.a.groups["CG"]), ["10.9.9.9@1#1"])
        self.a.groups["CG"] = {}
        self.a.join("CG", "10.9.9.9@2#2")
        consumer.rebalance_now()
        self.pump()
        self.assertEqual(len(self.a.sent(RequestCode.HEART_BEAT)), beats + 2)
        self.assertEqual({q.queue_id for q in consumer.assigned if q.topic == "T"}, {0, 1})

    def test_failover_to_a_master_without_heartbeats(self) -> None:
        """
        Issue 30's second failover, in memory: a group of two (started 11 s
        apart, so their 30 s rounds differ) and a master promoted at a new
        address that has no member's heartbeat (the offsets it has from the
        old one).  Both heartbeat it at the route's next poll: its messages
        are consumed within seconds, each once, by the queue's owner, and
        no queue changes hands.  (4.9.8 waits for each member's 30 s round:
        pulls fail meanwhile, and the first member whose round comes lists
        itself alone.)
        """
        got: list[tuple[str, int, int]] = []

        def handler(name: str) -> Any:
            return lambda ms: got.extend((name, m.queue.queue_id, m.queue_offset) for m in ms)

        c1 = self.push(handler("c1"), cid="10.9.9.9@1#1", poll_interval=1.0)
        self.advance(11, 5.5)
        c2 = self.push(handler("c2"), cid="10.9.9.9@2#2", poll_interval=1.0)
        held = ({q.queue_id for q in c1.assigned if q.topic == "T"}, {q.queue_id for q in c2.assigned if q.topic == "T"})
        self.assertEqual(held, ({0, 1}, {2, 3}))
        promoted = self.broker("broker-a", "10.0.0.11", {"T": 4}, data=self.a.data)
        promoted.committed = dict(self.a.committed)
        for i in range(8):
            for q in range(4):
                promoted.append("T", q, b"%d" % i)
        self.advance(5)
        self.assertEqual(sorted(got), sorted({("c1" if q < 2 else "c2", q, o) for q in range(4) for o in range(8)}))
        self.advance(60, 15)
        self.assertEqual(len(got), 32)
        self.assertEqual(
            ({q.queue_id for q in c1.assigned if q.topic == "T"}, {q.queue_id for q in c2.assigned if q.topic == "T"}),
            held,
        )
        self.assertEqual({k[2]: v for k, v in promoted.committed.items() if k[1] == "T"}, {q: 8 for q in range(4)})

def _mq(topic: str, *ids: int) -> frozenset[MessageQueue]:
    return frozenset(MessageQueue(topic, "broker-a", i) for i in ids)


class MasterOnlyOffsetsTests(_Case):
    def test_commits_wait_for_a_master(self) -> None:
        """
        The failover that lost a group's offsets: master A (brokerId 0)
        killed and gone from the route, its slave B registered as id 2;
        A restarted as a slave with id 1, a lower id than B's.  The
        consumer goes on consuming from a slave, but no offset goes to a
        slave (before: every commit went to the lowest id, A, and was
        lost), neither by UPDATE_CONSUMER_OFFSET nor by a pull's commit
        flag; the offsets are kept here and said once (one warning line,
        not one per round).  Once B is registered as the master (id 0),
        the next round commits them there.
        """
        b = self.broker("broker-a", "10.0.0.12", {"T": 4}, broker_id=2, data=self.a.data)
        events: list[dict[str, Any]] = []
        consumer = self.push(post_subscription_when_pull=True)
        consumer._log = Logger(observer=events.append)
        q = MessageQueue("T", "broker-a", 0)
        self.a.append("T", 0, b"m0")
        self.advance(5)
        self.assertEqual(self.a.committed[("CG", "T", 0)], 1)
        self.kill(self.a)
        self.ns.broker_addr["broker-a"].addrs.pop(0)
        restarted = ConsumeBroker("broker-a", "10.0.0.1", 10911, {"T": 4}, self.clock, self.a.data, 1)
        endpoint = self.endpoints[self.a.addr]
        endpoint.broker, endpoint.up = restarted, True
        _register(self.ns, restarted, 1)
        self.assertEqual(dict(self.ns.brokers("broker-a")), {1: "10.0.0.1:10911", 2: "10.0.0.12:10911"})
        self.pump()
        self.advance(2, 0.25)
        restarted.append("T", 0, b"m1")
        restarted.append("T", 0, b"m2")
        self.advance(20)
        self.assertEqual([m.body for m in self.got], [b"m0", b"m1", b"m2"])
        self.assertEqual(consumer.offsets[q], 3)
        slaves = (restarted, b)
        self.assertEqual([s.sent(RequestCode.UPDATE_CONSUMER_OFFSET) for s in slaves], [[], []])
        self.assertEqual([s.committed for s in slaves], [{}, {}])
        self.assertTrue(restarted.pulls)
        self.assertEqual({h.sys_flag & 0x1 for h in restarted.pulls}, {0})
        # (Queues 1-3 have an offset to commit once their first held pull
        # expired: a second line, for them only.)
        lines = [e["log_format"].format(**e) for e in events if "kept here" in e.get("log_format", "")]
        self.assertEqual(lines, [
            "offsets of consumer group CG kept here, committed once the route names a master for broker "
            "broker-a (addresses by brokerId: 1: 10.0.0.1:10911, 2: 10.0.0.12:10911) (tried every 5 s): " + queues
            for queues in ("T:0 at 3", "T:1 at 0, T:2 at 0, T:3 at 0")
        ])
        # B promoted: it registers as brokerId 0.
        _register(self.ns, b, 0, version=2)
        self.advance(6)
        self.assertEqual(b.committed[("CG", "T", 0)], 3)
        self.assertEqual(restarted.committed, {})
        self.assertTrue([e for e in events if "has a master again" in e.get("log_format", "")])

    def test_final_commit_goes_to_the_master_named_now(self) -> None:
        """
        A failover the consumer has not noticed (its pulls still answered:
        the old master is a slave now, at the same address, as id 1; the
        promoted one registered as id 0), then a stop before the next
        route poll: the routes are looked up again before the final
        commit, which goes to the master the NameServer names now, not to
        the slave (whose next sync would drop it).
        """
        consumer = self.push(post_subscription_when_pull=True)
        q = MessageQueue("T", "broker-a", 0)
        self.a.append("T", 0, b"m0")
        self.advance(5)
        self.assertEqual(self.a.committed[("CG", "T", 0)], 1)
        b = self.broker("broker-a", "10.0.0.12", {"T": 4}, broker_id=1, data=self.a.data)
        self.a.append("T", 0, b"m1")
        self.pump()
        self.assertEqual(consumer.offsets[q], 2)
        # The failover: B is the master now, A (the same address) its slave.
        _register(self.ns, b, 0, version=2)
        _register(self.ns, self.a, 1, version=2)
        self.a.broker_id = 1
        self.assertEqual(dict(self.ns.brokers("broker-a")), {0: "10.0.0.12:10911", 1: "10.0.0.1:10911"})
        before = len(self.a.sent(RequestCode.UPDATE_CONSUMER_OFFSET))
        consumer.stopService()
        self.pump()
        self.assertEqual(b.committed.get(("CG", "T", 0)), 2)
        self.assertEqual(len(self.a.sent(RequestCode.UPDATE_CONSUMER_OFFSET)), before)

    def test_a_node_not_serving_reads_refreshes_the_route(self) -> None:
        """
        SYSTEM_BUSY to a pull (an rmqha failover node standing by, or a
        slave not yet checked against its master: it serves no reads) is
        a moved broker's answer: the topic's route is looked up at once
        and the pull goes again within a second.
        """
        lookups = self.count_lookups()
        self.push(post_subscription_when_pull=True)
        self.assertEqual(len(self.a.held), 4)
        self.a.codes = [ResponseCode.SYSTEM_BUSY] * 4
        before = len(lookups)
        # The held pulls expire at 15 s; the next four are refused, and go
        # again within a second (3 s after any other code): 4 + 4 + 4.
        self.advance(16, 0.05)
        self.assertEqual(self.a.codes, [])
        self.assertEqual(lookups[before:].count("T"), 1)
        self.assertEqual(len(self.a.pulls), 12)

    def test_stop_without_a_master_names_what_is_not_committed(self) -> None:
        """
        Stopping while the route names no master: the final commit goes
        nowhere (not to the slave) and one line names the broker, each
        queue and its offset.
        """
        slave = self.broker("broker-a", "10.0.0.11", {"T": 4}, broker_id=1, data=self.a.data)
        consumer = self.push(post_subscription_when_pull=True)
        events: list[dict[str, Any]] = []
        consumer._log = Logger(observer=events.append)
        self.advance(2)
        self.kill(self.a)
        self.ns.broker_addr["broker-a"].addrs.pop(0)
        self.advance(2, 0.25)
        slave.append("T", 1, b"x")
        self.advance(1, 0.25)
        self.assertEqual([m.body for m in self.got], [b"x"])
        self.result(consumer.stopService())
        self.assertEqual(slave.committed, {})
        [line] = [e["log_format"].format(**e) for e in events if "stops with offsets" in e.get("log_format", "")]
        self.assertIn("broker broker-a (addresses by brokerId: 1: 10.0.0.11:10911)", line)
        self.assertIn("T:1 at 1", line)

    def test_pull_consumer_offsets(self) -> None:
        """
        The pull consumer's query reads the master; with the master gone
        (unreachable, then out of the route) it reads a slave (a copy of
        the master's table, at most a sync old: reading is harmless).
        Its commit goes to the master only: none in the route, even after
        a lookup, fails with NoMasterError and the slave gets nothing.
        """
        slave = self.broker("broker-a", "10.0.0.11", {"T": 4}, broker_id=1, data=self.a.data)
        consumer = self.pull_consumer()
        q = MessageQueue("T", "broker-a", 0)
        self.a.committed[("PCG", "T", 0)] = 5
        slave.committed[("PCG", "T", 0)] = 4
        self.assertEqual(self.result(consumer.query_offset(q)), 5)
        self.clock.advance(2)
        self.kill(self.a)
        self.ns.broker_addr["broker-a"].addrs.pop(0)
        d = consumer.query_offset(q)
        self.advance(0.5, 0.05)  # (the connection to the master is tried again 0.1 s after its loss)
        self.assertEqual(self.successResultOf(d), 4)
        self.clock.advance(2)
        d = consumer.commit_offset(q, 9)
        self.pump()
        error = self.failureResultOf(d, NoMasterError).value
        self.assertEqual(
            str(error),
            "offset 9 of PCG on T@broker-a:0 not committed: the route names no master for broker broker-a "
            "(addresses by brokerId: 1: 10.0.0.11:10911)",
        )
        self.assertEqual(slave.committed, {("PCG", "T", 0): 4})
        self.assertEqual(slave.sent(RequestCode.UPDATE_CONSUMER_OFFSET), [])
        self.assertEqual(len(self.flushLoggedErrors()), 0)


class RouteRefreshTests(_Case):
    def test_failed_pulls_refresh_the_route_at_once(self) -> None:
        """
        Four queues long-polled on broker-a's master; the master killed
        and its slave promoted (a new address registered as brokerId 0).
        The four pulls fail together: the topic's route is looked up once
        (not once per queue), and the pulls reach the new master within a
        second, not at the next NameServer poll (30 s).  With no master
        reachable at all, each queue's pulls back off to one every 3 s at
        most, and the route is looked up at most once a second.
        """
        lookups = self.count_lookups()
        self.push(post_subscription_when_pull=True)
        self.assertEqual(len(self.a.held), 4)
        self.clock.advance(2)
        promoted = self.broker("broker-a", "10.0.0.3", {"T": 4}, broker_id=0, data=self.a.data)
        before = len(lookups)
        self.kill(self.a)
        self.pump()
        self.assertEqual(lookups[before:].count("T"), 1)
        self.advance(0.5, 0.05)
        self.assertEqual(sorted(h.queue_id for h in promoted.pulls), [0, 1, 2, 3])
        promoted.append("T", 3, b"after")
        self.pump()
        self.assertEqual([m.body for m in self.got], [b"after"])
        # No master reachable: bounded retries and lookups.
        self.clock.advance(2)
        pulls = len(promoted.pulls)
        before = len(lookups)
        self.kill(promoted)
        self.advance(10, 0.05)
        self.assertEqual(len(promoted.pulls), pulls)
        self.assertLessEqual(len(lookups) - before, 11)
        self.assertGreaterEqual(len(lookups) - before, 3)

    def test_promoted_master_gets_a_heartbeat_at_once(self) -> None:
        """
        A route that names a new broker address (the promoted master)
        sends it a heartbeat at once, not at the next round (30 s): its
        first pulls find the group's subscription (no
        SUBSCRIPTION_NOT_EXIST) and its member list names the consumer.
        """
        self.push()
        self.clock.advance(2)
        promoted = self.broker("broker-a", "10.0.0.3", {"T": 4}, broker_id=0, data=self.a.data)
        self.kill(self.a)
        self.pump()
        self.advance(1, 0.05)
        self.assertEqual(len(promoted.sent(RequestCode.HEART_BEAT)), 1)
        self.assertEqual(list(promoted.groups["CG"]), ["10.9.9.9@1#1"])
        promoted.append("T", 1, b"after")
        self.pump()
        self.assertEqual([m.body for m in self.got], [b"after"])

    def test_rebalance_backs_off_without_a_route(self) -> None:
        """
        A subscribed topic the NameServers do not know: the rebalance is
        tried again after 1 s, doubling to 20 s (less up to half), besides
        the 20 s rounds, never in a tight loop; a topic registered 3 s
        after the start is taken within seconds, not at the next round.
        """
        lookups = self.count_lookups()
        consumer = self.push(start=False)
        consumer.subscribe("U")
        consumer.startService()
        self.services.append(consumer)
        self.pump()
        self.advance(60, 0.25)
        n = lookups.count("U")
        self.assertTrue(6 <= n <= 16, n)
        self.a.topics["U"] = 2
        _register(self.ns, self.a, 0, version=2)
        self.advance(20, 0.25)
        self.assertEqual({q for q in consumer.assigned if q.topic == "U"}, _mq("U", 0, 1))

    def test_topic_registered_soon_after_start(self) -> None:
        """A topic unknown at the start and registered 3 s later is taken within 7 s of the start."""
        consumer = self.push(start=False)
        consumer.subscribe("U")
        consumer.startService()
        self.services.append(consumer)
        self.advance(3, 0.25)
        self.a.topics["U"] = 2
        _register(self.ns, self.a, 0, version=2)
        self.advance(4, 0.25)
        self.assertEqual({q for q in consumer.assigned if q.topic == "U"}, _mq("U", 0, 1))


class QueueListenerTests(_Case):
    def test_listener_and_when_balanced(self) -> None:
        """
        The queue listener hears, per topic, the queues taken (with their
        start offsets) before any of their messages reach the handler,
        and the queues let go at a rebalance and at stop.  when_balanced()
        fires with the queues owned after the next complete round: the
        first after the start; each member's share once a second joined.
        """
        order: list[tuple[str, Any]] = []
        changes: list[QueueChange] = []

        def handler(messages: list[ReceivedMessage]) -> None:
            order.append(("m", messages[0].queue.queue_id))

        def listener(change: QueueChange) -> None:
            changes.append(change)
            order.append(("change", sorted(q.queue_id for q in change.assigned)))

        for i in range(4):
            self.a.append("T", i, b"%d" % i)
        self.a.committed[("CG", "T", 2)] = 1
        c1 = self.push(handler, start=False, queue_listener=listener)
        c1.startService()
        self.services.append(c1)
        balanced = c1.when_balanced()
        self.pump()
        self.assertEqual(self.successResultOf(balanced), _mq("T", 0, 1, 2, 3))
        self.assertEqual(c1.owned, _mq("T", 0, 1, 2, 3))
        [change] = changes
        self.assertEqual(change, QueueChange(
            "T", {MessageQueue("T", "broker-a", i): (1 if i == 2 else 0) for i in range(4)}, frozenset(),
            _mq("T", 0, 1, 2, 3)))
        self.assertEqual(order[0], ("change", [0, 1, 2, 3]))
        self.assertEqual(sorted(order[1:]), [("m", 0), ("m", 1), ("m", 3)])
        changes.clear()
        c2 = self.push(cid="10.9.9.9@2#2")
        d1, d2 = c1.when_balanced(), c2.when_balanced()
        self.pump()
        owned1, owned2 = self.successResultOf(d1), self.successResultOf(d2)
        self.assertEqual((owned1, owned2), (_mq("T", 0, 1), _mq("T", 2, 3)))
        self.assertEqual(changes, [QueueChange("T", {}, _mq("T", 2, 3), _mq("T", 0, 1))])
        changes.clear()
        self.result(c1.stopService())
        self.assertEqual(changes, [QueueChange("T", {}, _mq("T", 0, 1), frozenset())])
        self.failureResultOf(c1.when_balanced(), ConsumerError)

    def test_when_balanced_waits_for_a_complete_round(self) -> None:
        """
        A round that cannot complete (the member list refused) does not
        fire when_balanced(); it is tried again after a back-off (1 s,
        2 s, ...), not only every 20 s, and the waiter fires once a round
        completes.  A stop fails the waiters with one line.
        """
        self.a.refuse_list = True
        consumer = self.push(start=False)
        consumer.startService()
        self.services.append(consumer)
        d = consumer.when_balanced()
        self.pump()
        self.assertNoResult(d)
        self.advance(4, 0.25)
        self.assertNoResult(d)
        # (Rounds at 0, 1, 3 s, give or take the jitter; each asks twice:
        # "no consumer for this group" sends a heartbeat and asks again.)
        asked = len(self.a.sent(RequestCode.GET_CONSUMER_LIST_BY_GROUP))
        self.assertTrue(6 <= asked <= 10 and asked % 2 == 0, asked)
        self.a.refuse_list = False
        self.advance(8, 0.25)
        self.assertEqual(self.successResultOf(d), _mq("T", 0, 1, 2, 3))
        waiting = consumer.when_balanced()
        self.a.refuse_list = True
        self.pump()
        self.assertNoResult(waiting)
        consumer.stopService()
        error = self.failureResultOf(waiting, ConsumerError).value
        self.assertEqual(str(error), "consumer group 'CG' stopped before a rebalance completed")
