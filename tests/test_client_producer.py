"""
Tests for L{rmqha.client.Producer}: sends to fake brokers that answer as
4.9.8's SendMessageProcessor does, routed by the FakeNameServer, all in
memory on a Clock: queue selection, the Java producer's retries and
their codes, the deadline, route lookups (TBW102, the 30 s refresh, a
refresh after a failure, NameServer failover), compression, batches,
back-pressure and stopping.
"""

from __future__ import annotations

import zlib
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.interfaces import IAddress, IProtocolFactory, IStreamClientEndpoint
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from rmqha.client import (
    Message,
    MessageQueue,
    NoRouteError,
    Producer,
    ProducerBusyError,
    SendFailedError,
    SendReplyError,
    SendResult,
    SendStatus,
    UniqueIdFactory,
)
from rmqha.remoting.sends import SendMessageRequestHeaderV2, decode_batch
from rmqha.store._record import decode_properties
from rmqha.remoting._frames import RemotingCommand, header_from_ext_fields, make_response
from rmqha.remoting.codes import RequestCode, ResponseCode
from rmqha.remoting.metadata import DataVersion, MetadataFile, TopicConfig, TopicTable
from rmqha.remoting.namesrv import RegisterBrokerBody, RegisterBrokerRequestHeader
from rmqha.remoting.protocol import Dispatcher, RemotingFactory
from rmqha.store._record import Record
from rmqha.testing import FakeNameServer, MemoryConnection, connect_in_memory

from tests.test_remoting_broker import _BrokerCase

def parse_properties(text: str) -> dict[str, str]:
    return decode_properties(text.encode("utf-8"))


#: SendMessageProcessor's remarks for the codes the tests script.
_REMARKS = {
    ResponseCode.SYSTEM_ERROR: "create mapped file failed, server is busy or broken.",
    ResponseCode.SERVICE_NOT_AVAILABLE: "service not available now. It may be caused by one of the "
    "following reasons: the broker's disk is full [CL:  0.50 CQ:  0.50 INDEX:  0.50], messages are "
    "put to the slave, message store has been shut down, etc.",
    ResponseCode.MESSAGE_ILLEGAL: "the message is illegal, maybe msg body or properties length not "
    "matched. msg body length limit 4194304B, msg properties length limit 32KB.",
    ResponseCode.NO_PERMISSION: "the broker[10.0.0.1] sending message is forbidden",
    ResponseCode.TOPIC_NOT_EXIST: "topic[T] not exist, apply first please!",
    ResponseCode.SYSTEM_BUSY: "[REJECTREQUEST]system busy, start flow control for a while",
    ResponseCode.NO_BUYER_ID: "no buyer id",
    ResponseCode.NOT_IN_CURRENT_UNIT: "not in current unit",
}


class _RecordingFactory(RemotingFactory):
    """Keeps every byte the brokers' connections received, in C{raw}."""

    raw = b""

    def buildProtocol(self, addr: IAddress | None) -> Any:
        protocol = super().buildProtocol(addr)
        received = protocol.dataReceived

        def record(data: bytes) -> None:
            self.raw += data
            received(data)

        protocol.dataReceived = record  # type: ignore[method-assign]
        return protocol


class FakeBroker:
    """
    A broker's send path as 4.9.8's SendMessageProcessor answers it:
    every reply carries MSG_REGION and TRACE_ON (preSend); an unknown
    topic is created from the request's defaultTopic (TBW102) with
    min(d, its write queues) queues, else TOPIC_NOT_EXIST; a queue id
    beyond the topic's queues is SYSTEM_ERROR; a stored message is
    answered msgId (store host + commit-log offset), queueId, queueOffset.

    @ivar script: response codes to answer the next sends with, instead
        of storing them (a "stored" code 10/11/12 stores too).
    @ivar hold: while set, sends are kept unanswered in C{held}.
    """

    def __init__(self, name: str, host: str, port: int, topics: dict[str, int]) -> None:
        self.name, self.host, self.port = name, host, port
        self.addr = f"{host}:{port}"
        self.topics = dict(topics)
        self.requests: list[RemotingCommand] = []
        self.stored: list[tuple[str, int, bytes, int, dict[str, str]]] = []
        self.offsets: dict[tuple[str, int], int] = {}
        self.commit_offset = 0
        self.script: list[int] = []
        self.hold = False
        self.held: list[tuple[RemotingCommand, Deferred[RemotingCommand]]] = []
        self.factory = _RecordingFactory(
            Dispatcher({RequestCode.SEND_MESSAGE_V2: self._send, RequestCode.SEND_BATCH_MESSAGE: self._send}),
            Clock(),
        )

    def _send(self, request: RemotingCommand, peer: IAddress | None) -> Any:
        self.requests.append(request)
        if self.hold:
            d: Deferred[RemotingCommand] = Deferred()
            self.held.append((request, d))
            return d
        return self.answer(request)

    def answer(self, request: RemotingCommand) -> RemotingCommand:
        ext = {"MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
        header = header_from_ext_fields(SendMessageRequestHeaderV2, request.ext_fields).to_v1()
        code = self.script.pop(0) if self.script else ResponseCode.SUCCESS
        if code not in (0, 10, 11, 12):
            return make_response(request, code, _REMARKS.get(code, "scripted"), ext_fields=ext)
        queues = self.topics.get(header.topic)
        if queues is None:
            default = self.topics.get(header.default_topic)
            if default is None:
                return make_response(request, ResponseCode.TOPIC_NOT_EXIST, _REMARKS[17], ext_fields=ext)
            queues = self.topics[header.topic] = min(header.default_topic_queue_nums, default)
        if header.queue_id >= queues:
            return make_response(request, ResponseCode.SYSTEM_ERROR, f"request queueId[{header.queue_id}] is illegal", ext_fields=ext)
        props = parse_properties(header.properties or "")
        props.pop("WAIT", None)
        items = (
            [(b, f, {**props, **decode_properties(p)}) for f, b, p in decode_batch(request.body)]
            if header.batch
            else [(request.body, header.flag, props)]
        )
        ids, first = [], self.offsets.get((header.topic, header.queue_id), 0)
        for body, flag, item_props in items:
            host = "".join(f"{int(part):02X}" for part in self.host.split("."))
            ids.append(f"{host}{self.port:08X}{self.commit_offset:016X}")
            self.stored.append((header.topic, header.queue_id, body, header.sys_flag, item_props))
            self.commit_offset += 100 + len(body)
        self.offsets[(header.topic, header.queue_id)] = first + len(items)
        ext.update(msgId=",".join(ids), queueId=str(header.queue_id), queueOffset=str(first))
        return make_response(request, code, None, ext_fields=ext)

    def release(self) -> None:
        """Answer the held sends."""
        held, self.held = self.held, []
        for request, d in held:
            d.callback(self.answer(request))


@implementer(IStreamClientEndpoint)
class BrokerEndpoint:
    """In-memory connections to a FakeBroker; refused while not C{up}."""

    def __init__(self, broker: FakeBroker, clock: Clock) -> None:
        self.broker, self.clock = broker, clock
        self.up = True
        self.connections: list[MemoryConnection] = []

    def connect(self, factory: IProtocolFactory) -> Deferred[Any]:
        if not self.up:
            return fail(ConnectionRefusedError(f"{self.broker.addr} is down"))
        connection = connect_in_memory(
            self.broker.factory, factory, self.clock,
            master_address=IPv4Address("TCP", self.broker.host, self.broker.port),
            slave_address=IPv4Address("TCP", "10.9.9.9", 40000 + len(self.connections)),
        )
        self.connections.append(connection)
        return succeed(connection.client)


def _register(ns: FakeNameServer, broker: FakeBroker, broker_id: int = 0, version: int = 1) -> None:
    table = TopicTable(
        DataVersion(1000, version),
        {t: TopicConfig(t, n, n, perm=7 if t == "TBW102" else 6) for t, n in broker.topics.items()},
    )
    ns.register_broker(
        RegisterBrokerRequestHeader(broker.name, broker.addr, "DefaultCluster", broker.addr, broker_id),
        RegisterBrokerBody(table),
    )


class _Case(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1_700_000_000)
        self.ns = FakeNameServer(self.clock)
        self.namesrvs = [self.ns]
        self.endpoints: dict[str, BrokerEndpoint] = {}
        self.a = self.broker("broker-a", "10.0.0.1", 10911, {"T": 2, "TBW102": 8})
        self.b = self.broker("broker-b", "10.0.0.2", 10911, {"T": 2, "TBW102": 8})

    def broker(self, name: str, host: str, port: int, topics: dict[str, int]) -> FakeBroker:
        broker = FakeBroker(name, host, port, topics)
        self.endpoints[broker.addr] = BrokerEndpoint(broker, self.clock)
        _register(self.ns, broker)
        return broker

    def producer(self, namesrv: list[Any] | None = None, **options: Any) -> Producer:
        from random import Random

        producer = Producer(
            None,
            namesrv or [self.ns.client_endpoint(self.clock)],
            "PG",
            clock=self.clock,
            endpoint_for=lambda addr: self.endpoints[addr],
            unique_ids=UniqueIdFactory(bytes([10, 9, 9, 9]), pid=7, instance=1),
            rng=Random(0),
            **options,
        )
        producer.startService()
        self.addCleanup(self.stop, producer)
        return producer

    def stop(self, producer: Producer) -> None:
        if producer.running:
            producer.stopService()
        self.pump()
        # (Past the NameServer's 120 s broker expiry too: its scan stops
        # with the last broker.)
        self.clock.advance(200)
        self.pump()
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def pump(self) -> None:
        for _ in range(12):
            self.clock.advance(0)
            for ns in self.namesrvs:
                ns.flush()
            for endpoint in self.endpoints.values():
                for connection in endpoint.connections:
                    connection.flush()

    def result(self, d: Deferred[SendResult]) -> SendResult:
        self.pump()
        return self.successResultOf(d)

    def failure(self, d: Deferred[SendResult], *kinds: type[BaseException]) -> BaseException:
        self.pump()
        return self.failureResultOf(d, *kinds).value


class SendTests(_Case):
    def test_send_frame_and_result(self) -> None:
        """
        One send is one SEND_MESSAGE_V2 (310) with the V2 short names as
        sendKernelImpl fills them; the result is SEND_OK with the UNIQ_KEY
        as msgId and the broker's msgId as offsetMsgId.
        """
        producer = self.producer()
        result = self.result(producer.send("T", b"hello", tags="TagA", keys=["k1", "k2"], properties={"p": "v"}))
        [request] = self.a.requests + self.b.requests
        self.assertEqual(request.code, RequestCode.SEND_MESSAGE_V2)
        ext = dict(request.ext_fields or {})
        props = parse_properties(ext.pop("i"))
        broker = self.a if self.a.requests else self.b
        self.assertEqual(
            ext,
            {"a": "PG", "b": "T", "c": "TBW102", "d": "4", "e": str(result.queue.queue_id), "f": "0",
             "g": "1700000000000", "h": "0", "j": "0", "k": "false", "m": "false", "n": broker.name},
        )
        self.assertEqual(
            props, {"TAGS": "TagA", "KEYS": "k1 k2", "WAIT": "true", "p": "v", "UNIQ_KEY": result.msg_id}
        )
        self.assertRegex(result.msg_id, r"^0A090909000700000001[0-9A-F]{8}0000$")
        self.assertEqual(result.status, SendStatus.SEND_OK)
        host = "0A000001" if broker is self.a else "0A000002"
        self.assertEqual(result.offset_msg_id, f"{host}00002A9F{0:016X}")
        self.assertEqual((result.queue.topic, result.queue.broker_name, result.queue_offset), ("T", broker.name, 0))
        self.assertEqual(broker.stored[0][2], b"hello")

    def test_frame_bytes(self) -> None:
        """
        The frame a send writes, byte for byte (derived by hand from
        RemotingCommand's JSON rules): extFields a..n in HashMap order,
        which for one-letter keys in a 32-bucket table is alphabetical;
        the properties' \\x01/\\x02 escaped as fastjson does; language
        PYTHON, version 409; the body after the header.
        """
        producer = self.producer()
        message = Message("T", b"body!", tags="A", keys="k", unique_id="ID")
        self.result(producer.send_message(message, queue=MessageQueue("T", "broker-a", 1)))
        header = (
            '{"code":310,"extFields":{"a":"PG","b":"T","c":"TBW102","d":"4","e":"1","f":"0",'
            '"g":"1700000000000","h":"0","i":"KEYS\\u0001k\\u0002UNIQ_KEY\\u0001ID\\u0002WAIT\\u0001true'
            '\\u0002TAGS\\u0001A","j":"0","k":"false","m":"false","n":"broker-a"},"flag":0,"language":"PYTHON",'
            '"opaque":0,"serializeTypeCurrentRPC":"JSON","version":409}'
        ).encode()
        expected = (4 + len(header) + 5).to_bytes(4, "big") + len(header).to_bytes(4, "big") + header + b"body!"
        self.assertEqual(self.a.factory.raw, expected)

    def test_round_robin(self) -> None:
        """
        selectOneMessageQueue: sends go to the topic's queues (2 per
        broker, brokers in name order) one after the other.
        """
        producer = self.producer()
        queues = [self.result(producer.send("T", b"x")).queue for _ in range(8)]
        order = [(q.broker_name, q.queue_id) for q in queues]
        cycle = [("broker-a", 0), ("broker-a", 1), ("broker-b", 0), ("broker-b", 1)]
        start = cycle.index(order[0])
        self.assertEqual(order, (cycle[start:] + cycle * 3)[:8])

    def test_compression(self) -> None:
        """
        A body of 4096 bytes or more goes zlib-compressed with sysFlag
        0x301 (COMPRESSED | ZLIB); 4095 bytes go as they are, sysFlag 0.
        """
        producer = self.producer()
        big, small = b"0123456789abcdef" * 256, b"z" * 4095
        self.result(producer.send("T", big))
        self.result(producer.send("T", small))
        stored = sorted(self.a.stored + self.b.stored, key=lambda s: len(s[2]))
        (_, _, body1, flag1, _), (_, _, body2, flag2, _) = stored
        self.assertEqual((flag1, zlib.decompress(body1)), (0x301, big))
        self.assertEqual((flag2, body2), (0, small))

    def test_batch(self) -> None:
        """
        send_batch is one SEND_BATCH_MESSAGE (320), m=true, header
        properties WAIT only, body the items as encodeMessages writes
        them, each its own UNIQ_KEY; msgId and offsetMsgId comma-joined;
        bodies are not compressed.
        """
        producer = self.producer()
        messages = [Message("T", b"first", tags="A"), Message("T", b"s" * 5000, keys="k")]
        result = self.result(producer.send_batch(messages))
        [request] = self.a.requests + self.b.requests
        self.assertEqual(request.code, RequestCode.SEND_BATCH_MESSAGE)
        self.assertEqual(((request.ext_fields or {})["m"], (request.ext_fields or {})["i"], (request.ext_fields or {})["f"]),
                         ("true", "WAIT\x01true", "0"))
        items = decode_batch(request.body)
        ids = result.msg_id.split(",")
        self.assertEqual(len(set(ids)), 2)
        self.assertEqual(
            [(b, decode_properties(p)) for _, b, p in items],
            [(b"first", {"TAGS": "A", "WAIT": "true", "UNIQ_KEY": ids[0]}),
             (b"s" * 5000, {"KEYS": "k", "WAIT": "true", "UNIQ_KEY": ids[1]})],
        )
        self.assertEqual(len(result.offset_msg_id.split(",")), 2)
        self.assertEqual(result.queue_offset, 0)

    def test_batch_refusals(self) -> None:
        """A batch of two topics, a delayed message or none is refused before sending."""
        producer = self.producer()
        for messages, text in [
            ([Message("T", b"x"), Message("U", b"x")], "one topic"),
            ([Message("T", b"x", delay_level=2)], "delayed"),
            ([], "at least one"),
        ]:
            self.assertIn(text, str(self.failure(producer.send_batch(messages), ValueError)))
        self.assertEqual(self.a.requests + self.b.requests, [])

    def test_invalid_message(self) -> None:
        """A message Java refuses fails with ValueError and is not sent."""
        producer = self.producer()
        error = self.failure(producer.send("T", b""), ValueError)
        self.assertIn("empty body", str(error))

    def test_explicit_queue_and_selector(self) -> None:
        """
        send(queue=) and send(selector=) go where asked, once: a failure
        is not retried elsewhere (send(msg, mq) / sendSelectImpl).
        """
        producer = self.producer()
        result = self.result(producer.send("T", b"x", queue=MessageQueue("T", "broker-b", 1)))
        self.assertEqual(result.queue, MessageQueue("T", "broker-b", 1))
        result = self.result(producer.send("T", b"x", selector=lambda queues: queues[-1]))
        self.assertEqual(result.queue, MessageQueue("T", "broker-b", 1))
        self.a.script = [ResponseCode.SYSTEM_ERROR]
        error = self.failure(producer.send("T", b"x", queue=MessageQueue("T", "broker-a", 0)), SendReplyError)
        self.assertEqual(len(self.a.requests), 1)
        self.assertIn("SYSTEM_ERROR (1)", str(error))
        self.a.hold = True
        d = producer.send("T", b"x", queue=MessageQueue("T", "broker-a", 0))
        self.pump()
        self.clock.advance(3)
        error = self.failure(d, SendFailedError)
        self.assertEqual(
            str(error),
            "send to topic 'T' on queue T@broker-a:0 failed: no response to SEND_MESSAGE_V2 (310) "
            "from 10.0.0.1:10911 within 3 s",
        )
        self.a.hold = False


class RetryTests(_Case):
    def test_retried_codes_go_to_another_broker(self) -> None:
        """
        Each code of retryResponseCodes (17, 14, 1, 16, 204, 205) makes
        the send try again at once, on the other broker: both refusing
        once, the third attempt (back on the first broker) is stored.
        """
        producer = self.producer()
        for code in (17, 14, 1, 16, 204, 205):
            self.a.requests.clear()
            self.b.requests.clear()
            self.a.script, self.b.script = [code], [code]
            result = self.result(producer.send("T", b"x"))
            self.assertEqual(result.status, SendStatus.SEND_OK)
            self.assertEqual(sorted([len(self.a.requests), len(self.b.requests)]), [1, 2], code)
            first = self.a if len(self.a.requests) == 2 else self.b
            self.assertEqual(result.queue.broker_name, first.name)

    def test_not_retried_codes(self) -> None:
        """
        Any other refusal (MESSAGE_ILLEGAL, SYSTEM_BUSY, FLOW_CONTROL...)
        fails at once with the broker's code and remark, one line.
        """
        producer = self.producer()
        for code in (13, 2, 215, 3):
            self.a.requests.clear()
            self.b.requests.clear()
            self.a.script = self.b.script = [code]
            error = self.failure(producer.send("T", b"x"), SendReplyError)
            assert isinstance(error, SendReplyError)
            self.assertEqual(error.code, code)
            self.assertEqual(len(self.a.requests) + len(self.b.requests), 1)
            self.a.script, self.b.script = [], []
        self.assertRegex(str(error), r"^broker broker-[ab] \(10\.0\.0\.[12]:10911\) answered a send to topic 'T' with REQUEST_CODE_NOT_SUPPORTED \(3\): scripted$")

    def test_three_attempts_then_error(self) -> None:
        """
        retryTimesWhenSendFailed 2: three attempts (a, b, a), then one
        error naming them and the last answer.
        """
        producer = self.producer()
        self.a.script = [1, 1]
        self.b.script = [1, 1]
        error = self.failure(producer.send("T", b"x"), SendFailedError)
        assert isinstance(error, SendFailedError)
        self.assertEqual(len(error.brokers), 3)
        self.assertEqual(error.brokers[0], error.brokers[2])
        self.assertNotEqual(error.brokers[0], error.brokers[1])
        self.assertEqual(error.code, 1)
        self.assertEqual((len(self.a.requests) + len(self.b.requests)), 3)
        self.assertIn("send to topic 'T' failed after 3 attempts (", str(error))
        self.assertIn("SYSTEM_ERROR (1): create mapped file failed", str(error))
        self.assertNotIn("\n", str(error))

    def test_stored_statuses_not_retried(self) -> None:
        """
        FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE mean
        stored: returned as the status, not retried (the default).
        """
        producer = self.producer()
        for code, status in [(10, SendStatus.FLUSH_DISK_TIMEOUT), (12, SendStatus.FLUSH_SLAVE_TIMEOUT),
                             (11, SendStatus.SLAVE_NOT_AVAILABLE)]:
            self.a.requests.clear()
            self.b.requests.clear()
            self.a.script = self.b.script = [code]
            self.assertEqual(self.result(producer.send("T", b"x")).status, status)
            self.assertEqual(len(self.a.requests) + len(self.b.requests), 1)
            self.a.script, self.b.script = [], []

    def test_retry_another_broker_when_not_store_ok(self) -> None:
        """
        With retryAnotherBrokerWhenNotStoreOK, a stored-but-not-OK send is
        tried again; all three not OK gives the last result.
        """
        producer = self.producer(retry_another_broker_when_not_store_ok=True)
        self.a.script = [11, 11]
        self.b.script = [12, 12]
        result = self.result(producer.send("T", b"x"))
        self.assertEqual(len(self.a.requests) + len(self.b.requests), 3)
        last = SendStatus.SLAVE_NOT_AVAILABLE if len(self.a.requests) == 2 else SendStatus.FLUSH_SLAVE_TIMEOUT
        self.assertEqual(result.status, last)
        self.a.script = [11]
        self.b.script = [11]
        self.assertEqual(self.result(producer.send("T", b"x")).status, SendStatus.SEND_OK)
        self.assertEqual(len(self.a.requests) + len(self.b.requests), 6)

    def test_refused_connection_retried(self) -> None:
        """A broker that refuses connections: the send goes to the other one."""
        producer = self.producer()
        self.endpoints[self.a.addr].up = False
        for _ in range(4):
            self.assertEqual(self.result(producer.send("T", b"x")).queue.broker_name, "broker-b")
        self.assertEqual(self.a.requests, [])

    def test_deadline(self) -> None:
        """
        The whole send has 3 s (sendMsgTimeout) on the clock: brokers that
        never answer make it fail then, naming the time and the attempts.
        """
        producer = self.producer()
        self.a.hold = self.b.hold = True
        d = producer.send("T", b"x")
        self.pump()
        self.assertNoResult(d)
        self.clock.advance(2.9)
        self.pump()
        self.assertNoResult(d)
        self.clock.advance(0.1)
        error = self.failure(d, SendFailedError)
        self.assertIn("send to topic 'T' ran out of its 3 s after 1 attempt", str(error))
        self.assertIn("no response to SEND_MESSAGE_V2 (310)", str(error))
        self.a.hold = self.b.hold = False

    def test_timeout_then_retry(self) -> None:
        """
        A per-send timeout shorter than one attempt's wait: the attempt
        times out with the send; with time left after a fast failure the
        next broker answers.
        """
        producer = self.producer()
        self.a.script = [14]
        self.b.hold = True
        d = producer.send("T", b"x", timeout=1.0)
        self.pump()
        self.clock.advance(1.0)
        error = self.failure(d, SendFailedError)
        self.assertIn("ran out of its 1 s", str(error))
        self.b.hold = False


class RouteTests(_Case):
    def test_unknown_topic_uses_tbw102(self) -> None:
        """
        TOPIC_NOT_EXIST from the NameServer: the send goes along TBW102's
        route, cut to 4 queues per broker (TBW102 has 8), and the broker
        creates the topic.
        """
        producer = self.producer()
        results = [self.result(producer.send("NewTopic", b"x")) for _ in range(8)]
        self.assertTrue(all(r.queue.queue_id < 4 for r in results))
        self.assertEqual({r.queue.broker_name for r in results}, {"broker-a", "broker-b"})
        self.assertEqual(self.a.topics["NewTopic"], 4)
        self.assertTrue(producer.routes.table["NewTopic"].from_default)

    def test_no_auto_create(self) -> None:
        """Without auto-creation an unknown topic fails at once, naming what the NameServer said."""
        producer = self.producer(auto_create_topic=False)
        error = self.failure(producer.send("NewTopic", b"x"), NoRouteError)
        self.assertEqual(
            str(error),
            "no route to topic 'NewTopic': NameServer answered TOPIC_NOT_EXIST (17) for topic 'NewTopic': "
            "No topic route info in name server for the topic: NewTopic",
        )

    def test_read_only_topic_not_replaced_by_tbw102(self) -> None:
        """
        A topic the NameServers route but without a writable queue (perm
        4) fails; TBW102 is only for topics without any route, as 4.9.8's
        tryToFindTopicPublishInfo.
        """
        ns = FakeNameServer(self.clock)
        self.namesrvs.append(ns)
        ns.register_broker(
            RegisterBrokerRequestHeader("broker-a", self.a.addr, "DefaultCluster", self.a.addr, 0),
            RegisterBrokerBody(TopicTable(DataVersion(1, 1), {
                "RO": TopicConfig("RO", 2, 2, perm=4), "TBW102": TopicConfig("TBW102", 8, 8, perm=7)})),
        )
        producer = self.producer([ns.client_endpoint(self.clock)])
        error = self.failure(producer.send("RO", b"x"), NoRouteError)
        self.assertEqual(str(error), "no route to topic 'RO': no writable queue on a broker with a master")
        self.assertEqual(self.a.requests, [])

    def test_unknown_topics_leave_nothing_behind(self) -> None:
        """Sends to many unknown topics keep neither routes nor errors."""
        producer = self.producer(auto_create_topic=False)
        for i in range(20):
            self.failure(producer.send(f"Nope{i}", b"x"), NoRouteError)
        self.assertEqual((producer.routes.table, producer.routes.errors), ({}, {}))

    def test_no_tbw102_either(self) -> None:
        """Neither the topic nor TBW102 known: NoRouteError naming both answers."""
        ns = FakeNameServer(self.clock)
        self.namesrvs.append(ns)
        producer = self.producer([ns.client_endpoint(self.clock)])
        error = self.failure(producer.send("T", b"x"), NoRouteError)
        self.assertIn("for topic 'T'", str(error))
        self.assertIn("for topic 'TBW102'", str(error))

    def test_refresh_every_30_s_follows_failover(self) -> None:
        """
        Routes are looked up again every 30 s: after broker-a's master
        moved (a new address registered as brokerId 0), sends go there,
        and the connection to the old address is closed.
        """
        producer = self.producer()
        self.result(producer.send("T", b"x", queue=MessageQueue("T", "broker-a", 0)))
        old = self.endpoints[self.a.addr].connections[0]
        moved = self.broker("broker-a", "10.0.0.3", 10911, {"T": 2, "TBW102": 8})
        _register(self.ns, moved, version=2)
        self.ns.broker_addr["broker-a"].addrs.pop(1, None)
        self.clock.advance(29)
        self.pump()
        self.result(producer.send("T", b"x", queue=MessageQueue("T", "broker-a", 0)))
        self.assertEqual(len(moved.requests), 0)
        self.clock.advance(1)
        self.pump()
        self.result(producer.send("T", b"x", queue=MessageQueue("T", "broker-a", 0)))
        self.assertEqual(len(moved.requests), 1)
        self.assertTrue(old.dropped)
        self.assertNotIn(self.a.addr, producer.brokers)

    def test_refresh_after_failure(self) -> None:
        """
        A failed attempt refreshes the route before the next: with one
        broker whose master moved, the retry reaches the new master within
        the same send.
        """
        ns = FakeNameServer(self.clock)
        self.namesrvs.append(ns)
        only = FakeBroker("broker-c", "10.0.0.5", 10911, {"Solo": 1})
        self.endpoints[only.addr] = BrokerEndpoint(only, self.clock)
        _register(ns, only)
        producer = self.producer([ns.client_endpoint(self.clock)])
        self.result(producer.send("Solo", b"x"))
        self.endpoints[only.addr].up = False
        for connection in self.endpoints[only.addr].connections:
            connection.hang_up()
        new = FakeBroker("broker-c", "10.0.0.6", 10911, {"Solo": 1})
        self.endpoints[new.addr] = BrokerEndpoint(new, self.clock)
        _register(ns, new, version=2)
        d = producer.send("Solo", b"y")
        self.pump()
        self.assertNoResult(d)  # waiting for the reconnection attempt, 0.1 s after the loss
        self.clock.advance(0.1)
        result = self.result(d)
        self.assertEqual(result.broker, "broker-c (10.0.0.6:10911)")
        self.assertEqual(new.stored[0][2], b"y")

    def test_namesrv_failover(self) -> None:
        """
        The chosen NameServer down: the lookup goes to the next one, and
        it stays chosen for the next lookups.
        """
        ns2 = FakeNameServer(self.clock)
        self.namesrvs.append(ns2)
        _register(ns2, self.a)
        self.ns.up = False
        producer = self.producer([self.ns.client_endpoint(self.clock), ns2.client_endpoint(self.clock)])
        producer.routes.namesrv.chosen = 0
        self.assertEqual(self.result(producer.send("T", b"x")).queue.broker_name, "broker-a")
        self.assertEqual(producer.routes.namesrv.chosen, 1)

    def test_no_namesrv(self) -> None:
        """
        Every NameServer down: the send looks the route up again, backing
        off (0.1 s doubling to 1 s, less up to half), until its 3 s run
        out; then NoRouteError naming the lookups, each NameServer and why.
        """
        self.ns.up = False
        producer = self.producer()
        d = producer.send("T", b"x")
        self.pump()
        self.assertNoResult(d)
        waits = []
        while not d.called:
            before = self.clock.seconds()
            self.clock.advance(0.01)
            self.pump()
            waits.append(self.clock.seconds() - before)
        error = self.failure(d, NoRouteError)
        self.assertRegex(
            str(error),
            r"^no route to topic 'T' within 3 s \(\d lookups in a row found none; the next is due in [0-9.]+ s\): "
            r"no NameServer answered GET_ROUTEINFO_BY_TOPIC \(105\) for topic 'T'",
        )
        self.assertIn("the fake NameServer is down", str(error))
        self.assertLessEqual(len(error.args[0].splitlines()), 1)
        lookups = producer.routes._no_route["T"].failures
        self.assertTrue(5 <= lookups <= 9, lookups)
        # Reset by a usable route: the next send goes at once.
        self.ns.up = True
        self.clock.advance(5)  # (the NameServer's connection is attempted again)
        self.pump()
        self.assertEqual(self.result(producer.send("T", b"x")).status, SendStatus.SEND_OK)
        self.assertNotIn("T", producer.routes._no_route)

    def test_no_namesrv_for_a_while(self) -> None:
        """
        The NameServer back within the send's deadline: the send waiting
        for a route gets it and is stored.  Sends waiting together share
        the topic's lookups and back-off.
        """
        self.ns.up = False
        producer = self.producer()
        sends = [producer.send("T", b"%d" % i) for i in range(50)]
        self.pump()
        self.clock.advance(1)
        self.pump()
        self.assertTrue(all(not d.called for d in sends))
        self.assertLessEqual(producer.routes._no_route["T"].failures, 5)
        self.ns.up = True
        for _ in range(150):
            self.clock.advance(0.01)
            self.pump()
        self.assertEqual({self.successResultOf(d).status for d in sends}, {SendStatus.SEND_OK})

    def test_send_waits_for_a_promoted_master(self) -> None:
        """
        A single broker failing over: its master unreachable and gone
        from the NameServer's route (only the slave left), then its slave
        promoted (a new address registered as brokerId 0) 1 s later.  A
        send in the gap fails its attempt on the old master, finds a
        route without a master, looks it up again backing off, and is
        stored on the new master within its 3 s.  Before this, the send
        failed at once ("no writable queue").
        """
        ns = FakeNameServer(self.clock)
        self.namesrvs.append(ns)
        old = FakeBroker("broker-c", "10.0.0.5", 10911, {"Solo": 1})
        self.endpoints[old.addr] = BrokerEndpoint(old, self.clock)
        _register(ns, old)
        slave = FakeBroker("broker-c", "10.0.0.6", 10911, {"Solo": 1})
        self.endpoints[slave.addr] = BrokerEndpoint(slave, self.clock)
        _register(ns, slave, broker_id=1)
        producer = self.producer([ns.client_endpoint(self.clock)])
        self.result(producer.send("Solo", b"x"))
        self.endpoints[old.addr].up = False
        for connection in self.endpoints[old.addr].connections:
            connection.hang_up()
        ns.broker_addr["broker-c"].addrs.pop(0)
        d = producer.send("Solo", b"y")
        for _ in range(100):
            self.clock.advance(0.01)
            self.pump()
        self.assertNoResult(d)
        failures = producer.routes._no_route["Solo"].failures
        self.assertTrue(3 <= failures <= 6, failures)
        _register(ns, slave, broker_id=0, version=2)  # promoted
        for _ in range(100):
            self.clock.advance(0.01)
            self.pump()
        self.assertEqual(self.successResultOf(d).broker, "broker-c (10.0.0.6:10911)")
        self.assertEqual(slave.stored[0][2], b"y")


class BoundsTests(_Case):
    def test_back_pressure(self) -> None:
        """
        At most max_in_flight sends await a broker, max_waiting more wait
        their turn; beyond, a send fails at once (ProducerBusyError).
        Answers free the places.
        """
        producer = self.producer(max_in_flight=2, max_waiting=1)
        self.a.hold = True
        q = MessageQueue("T", "broker-a", 0)
        sends = [producer.send("T", b"x", queue=q) for _ in range(3)]
        self.pump()
        self.assertEqual(len(self.a.held), 2)
        busy = self.failure(producer.send("T", b"x", queue=q), ProducerBusyError)
        self.assertEqual(
            str(busy), "2 sends await broker broker-a (10.0.0.1:10911) and 1 more wait; send to topic 'T' refused"
        )
        self.a.hold = False
        self.a.release()
        self.pump()
        for d in sends:
            self.assertEqual(self.successResultOf(d).status, SendStatus.SEND_OK)
        self.assertEqual(len(self.a.requests), 3)

    def test_sends_under_way_bounded(self) -> None:
        """
        At most max_sends sends are under way, route lookups included:
        more fail at once.
        """
        producer = self.producer(max_sends=3)
        held = []
        for _ in range(3):
            d = producer.send("T", b"x")
            self.assertNoResult(d)
            held.append(d)
        error = self.failure(producer.send("T", b"x"), ProducerBusyError)
        self.assertEqual(str(error), "3 sends are under way (at most 3); send to topic 'T' refused")
        self.pump()
        for d in held:
            self.assertEqual(self.successResultOf(d).status, SendStatus.SEND_OK)
        self.result(producer.send("T", b"x"))

    def test_stop_fails_pending_sends(self) -> None:
        """Stopping the producer fails its pending sends with one line, and leaves no timer."""
        producer = self.producer()
        self.a.hold = self.b.hold = True
        d = producer.send("T", b"x")
        self.pump()
        producer.stopService()
        error = self.failure(d, SendFailedError)
        self.assertIn("stopped with the producer", str(error))
        self.failureResultOf(producer.send("T", b"x"), SendFailedError)


@implementer(IStreamClientEndpoint)
class _FactoryEndpoint:
    """In-memory connections to a server factory (an rmqha broker's remoting port)."""

    def __init__(self, factory: Any, clock: Any, host: str, port: int) -> None:
        self.factory, self.clock, self.host, self.port = factory, clock, host, port
        self.connections: list[MemoryConnection] = []

    def connect(self, factory: IProtocolFactory) -> Deferred[Any]:
        connection = connect_in_memory(
            self.factory, factory, self.clock,
            master_address=IPv4Address("TCP", self.host, self.port),
            slave_address=IPv4Address("TCP", "10.9.9.9", 40000 + len(self.connections)),
        )
        self.connections.append(connection)
        return succeed(connection.client)


class RmqhaBrokerTests(_BrokerCase):
    """
    The producer against an rmqha master's own remoting port
    (rmqha.remoting.sends), routed by the FakeNameServer: what it sends is
    stored as a genuine 4.9.8 producer's message is.
    """

    def test_sends_stored(self) -> None:
        """
        A send, a compressed send, a batch and a send to an unknown topic
        (created from TBW102 by the broker) are stored with the producer's
        properties, and each result names the stored record
        (offsetMsgId = store host + commit-log offset, queue offset).
        """
        broker = self.start(store_host=("127.0.0.1", 10911), group="broker-a")
        broker.metadata.update_topic(TopicConfig("TopicTest", 4, 4))
        clock = self.reactor
        ns = FakeNameServer(clock)
        ns.register_broker(
            RegisterBrokerRequestHeader("broker-a", "127.0.0.1:10911", "DefaultCluster", "127.0.0.1:10912", 0),
            RegisterBrokerBody(broker.metadata.table(MetadataFile.TOPICS)),
        )
        endpoint = _FactoryEndpoint(self.remoting_factory(), clock, "127.0.0.1", 10911)
        producer = Producer(None, [ns.client_endpoint(clock)], "PG", clock=clock, endpoint_for=lambda addr: endpoint)
        producer.startService()
        self.addCleanup(producer.stopService)

        def result(d: Deferred[SendResult]) -> SendResult:
            for _ in range(12):
                clock.advance(0)
                ns.flush()
                for connection in endpoint.connections:
                    connection.flush()
            return self.successResultOf(d)

        one = result(producer.send("TopicTest", b"hello", tags="TagA", keys=["k1", "k2"], properties={"p": "v"}))
        big = result(producer.send("TopicTest", b"0123456789" * 500))
        batch = result(producer.send_batch([Message("TopicTest", b"b1"), Message("TopicTest", b"b2", tags="B")]))
        new = result(producer.send("BrandNew", b"auto"))
        records = {r.physical_offset: r for r in self.records(broker)}

        def record(offset_msg_id: str) -> Record:
            self.assertEqual(offset_msg_id[:16], "7F00000100002A9F")
            return records[int(offset_msg_id[16:], 16)]

        r = record(one.offset_msg_id)
        self.assertEqual((r.topic, r.queue_id, r.queue_offset, r.body), ("TopicTest", one.queue.queue_id, one.queue_offset, b"hello"))
        self.assertEqual(
            r.properties,
            {"TAGS": "TagA", "KEYS": "k1 k2", "p": "v", "UNIQ_KEY": one.msg_id, "CLUSTER": "DefaultCluster"},
        )
        r = record(big.offset_msg_id)
        self.assertEqual((r.sysflag & 0x301, zlib.decompress(r.body)), (0x301, b"0123456789" * 500))
        ids, offsets = batch.msg_id.split(","), batch.offset_msg_id.split(",")
        stored = [record(o) for o in offsets]
        self.assertEqual([s.body for s in stored], [b"b1", b"b2"])
        self.assertEqual([s.properties["UNIQ_KEY"] for s in stored], ids)
        self.assertEqual([s.queue_offset for s in stored], [batch.queue_offset, batch.queue_offset + 1])
        self.assertEqual(stored[1].properties["TAGS"], "B")
        r = record(new.offset_msg_id)
        self.assertEqual((r.topic, r.body), ("BrandNew", b"auto"))
        self.assertLess(new.queue.queue_id, 4)
        self.assertIn("BrandNew", broker.metadata.table(MetadataFile.TOPICS).topics)
        for res in (one, big, batch, new):
            self.assertEqual(res.status, SendStatus.SEND_OK)

    def records(self, broker: Any) -> list[Record]:
        return [r for r in broker.store.commitlog.records() if isinstance(r, Record)]
