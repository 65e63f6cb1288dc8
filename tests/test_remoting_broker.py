"""
Tests for L{rmqha.remoting.broker}: a broker's remoting port, driven
with the codec's frames over an in-memory transport, and the broker's
metadata (loaded at start, flushed, persisted).
"""

from __future__ import annotations

import os
from typing import Any

import attrs

from twisted.internet.address import IPv4Address
from twisted.internet.defer import fail, succeed
from twisted.internet.error import CannotListenError
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.trial.unittest import SynchronousTestCase

from rmqha._limits import LimitedFactory
from rmqha.assemble import build_service
from rmqha.broker import Broker, ListenFailed
from rmqha.ha.config import Role
from rmqha.remoting._frames import FrameDecoder, RemotingCommand, encode
from rmqha.remoting.broker import RemotingPort, format_runtime, human_bytes
from rmqha.remoting.codes import RequestCode, ResponseCode, SerializeType
from rmqha.remoting.metadata import (
    ConsumerOffsetTable,
    DelayOffsetTable,
    GroupTable,
    MetadataFile,
    SubscriptionGroupConfig,
    TopicTable,
    builtin_groups,
    builtin_topics,
    decode_table,
    parse_fastjson,
)
from rmqha.remoting.registration import default_broker_name
from rmqha.settings import BrokerSettings, SettingsError
from rmqha.store._record import Message
from rmqha.store.commitlog import CommitLog
from tests._helpers import fixed_clock

_CREATE = {
    "topic": "Orders",
    "defaultTopic": "TBW102",
    "readQueueNums": "4",
    "writeQueueNums": "4",
    "perm": "6",
    "topicFilterType": "SINGLE_TAG",
    "topicSysFlag": "0",
    "order": "false",
}


class _Connection:
    """
    One accepted connection to a broker's remoting port.
    """

    def __init__(self, factory: LimitedFactory, host: str = "10.0.0.1") -> None:
        protocol = factory.buildProtocol(IPv4Address("TCP", host, 40000))
        assert protocol is not None, "the connection was refused"
        self.protocol = protocol
        self.transport = StringTransport()
        protocol.makeConnection(self.transport)
        self._opaque = 0

    def ask(
        self,
        code: int,
        ext: dict[str, str] | None = None,
        body: bytes = b"",
        serialize_type: SerializeType = SerializeType.JSON,
    ) -> RemotingCommand:
        self._opaque += 1
        request = RemotingCommand(
            code=code, opaque=self._opaque, ext_fields=ext, body=body, serialize_type=serialize_type
        )
        self.transport.clear()
        self.protocol.dataReceived(encode(request))
        decoder = FrameDecoder()
        decoder.feed(self.transport.value())
        response = decoder.next_command()
        assert response is not None, "no answer"
        assert response.is_response and response.opaque == self._opaque
        assert response.serialize_type is serialize_type
        return response


class _BrokerCase(SynchronousTestCase):
    #: Whether the broker's store keeps consume queues (as a broker's
    #: assembled store does), of this many units a file.
    consume_queues = False
    consume_queue_units = 64

    def setUp(self) -> None:
        self.store = self.mktemp()
        self.reactor = MemoryReactorClock()
        self.reactor.advance(1_700_000_000)

    def start(self, role: Role = Role.MASTER, **settings: Any) -> Broker:
        settings.setdefault("listen", "tcp:0")
        broker = Broker(
            BrokerSettings(
                role=role,
                ha_listen="tcp:0",
                master_endpoint="tcp:host=127.0.0.1:port=10912" if role is Role.SLAVE else None,
                **settings,
            ),
            reactor=self.reactor,
            open_commitlog=lambda: CommitLog.open(
                self.store, segment_size=64 * 1024, clock=fixed_clock,
                consume_queues=self.consume_queues, consume_queue_units=self.consume_queue_units,
            ),
            # (Disk work inline: the fake reactor has no threads.)
            run_in_thread=lambda f: succeed(f()),
        )
        broker.startService()
        self.addCleanup(lambda: broker.running and broker.stopService())
        return broker

    def remoting_factory(self) -> LimitedFactory:
        (factory,) = [f for _, f, *_ in self.reactor.tcpServers if getattr(f, "name", None) == "remoting"]
        assert isinstance(factory, LimitedFactory)
        return factory

    def connect(self, host: str = "10.0.0.1") -> _Connection:
        return _Connection(self.remoting_factory(), host)


class TableTests(_BrokerCase):
    """
    Codes 21, 43, 45 and 201 answer the broker's tables in the bodies a
    genuine broker sends, which parse back to the tables.
    """

    def test_topics(self) -> None:
        broker = self.start()
        connection = self.connect()
        created = connection.ask(RequestCode.UPDATE_AND_CREATE_TOPIC, _CREATE)
        self.assertEqual((created.code, created.remark), (ResponseCode.SUCCESS, None))
        # The binary header is answered in kind.
        response = connection.ask(RequestCode.GET_ALL_TOPIC_CONFIG, serialize_type=SerializeType.ROCKETMQ)
        self.assertEqual(response.code, ResponseCode.SUCCESS)
        table = decode_table(MetadataFile.TOPICS, response.body.decode())
        assert isinstance(table, TopicTable)
        # Orders, and the built-in topics a broker has from its start.
        builtins = builtin_topics("DefaultCluster", broker.settings.group or default_broker_name())
        self.assertEqual(set(table.topics), {"Orders", *builtins})
        self.assertEqual({n: table.topics[n] for n in builtins}, builtins)
        topic = table.topics["Orders"]
        self.assertEqual((topic.read_queue_nums, topic.write_queue_nums, topic.perm), (4, 4, 6))
        self.assertTrue(table.data_version.same(broker.metadata.topics_version))
        # Compact fastjson, TopicConfigSerializeWrapper's field order.
        self.assertTrue(response.body.startswith(b'{"dataVersion":{"counter":1,'), response.body)
        self.assertIn(b'"Orders":{"order":false,"perm":6,', response.body)
        # topics.json holds the whole table, as a genuine broker's does.
        with open(os.path.join(self.store, "config", "topics.json")) as f:
            written = decode_table(MetadataFile.TOPICS, f.read())
        assert isinstance(written, TopicTable)
        self.assertEqual(set(written.topics), {"Orders", *builtins})

    def test_offsets_and_groups(self) -> None:
        broker = self.start()
        broker.metadata.commit_offset("G1", "Orders", 3, 120)
        broker.metadata.update_delay_offset(2, 15)
        broker.metadata.update_group(SubscriptionGroupConfig("G1"))
        connection = self.connect()

        response = connection.ask(RequestCode.GET_ALL_CONSUMER_OFFSET)
        self.assertEqual(response.body, b'{"offsetTable":{"Orders@G1":{3:120}}}')
        offsets = decode_table(MetadataFile.CONSUMER_OFFSETS, response.body.decode())
        assert isinstance(offsets, ConsumerOffsetTable)
        self.assertEqual(offsets.offsets, {"Orders@G1": {3: 120}})

        response = connection.ask(RequestCode.GET_ALL_DELAY_OFFSET)
        delay = decode_table(MetadataFile.DELAY_OFFSETS, response.body.decode())
        assert isinstance(delay, DelayOffsetTable)
        self.assertEqual(dict(delay.offsets), {2: 15})

        response = connection.ask(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
        groups = decode_table(MetadataFile.SUBSCRIPTION_GROUPS, response.body.decode())
        assert isinstance(groups, GroupTable)
        self.assertEqual(set(groups.groups), {"G1", *builtin_groups()})
        self.assertTrue(groups.data_version.same(broker.metadata.groups_version))

    def test_slave_answers_too(self) -> None:
        """
        A slave answers its tables (a tool may ask any broker).
        """
        broker = self.start(Role.SLAVE)
        broker.metadata.commit_offset("G1", "Orders", 0, 7)
        response = self.connect().ask(RequestCode.GET_ALL_CONSUMER_OFFSET)
        self.assertEqual(response.body, b'{"offsetTable":{"Orders@G1":{0:7}}}')

    def test_unknown_code(self) -> None:
        self.start()
        response = self.connect().ask(RequestCode.QUERY_MESSAGE, {"topic": "Orders"})
        self.assertEqual(response.code, ResponseCode.REQUEST_CODE_NOT_SUPPORTED)
        self.assertEqual(response.remark, " request type 12 not supported")

    def test_query_data_version(self) -> None:
        """
        Code 322, as a NameServer answers it: C{changed} against the body's
        version, the body the broker's topic table version.
        """
        broker = self.start()
        connection = self.connect()
        response = connection.ask(RequestCode.QUERY_DATA_VERSION)
        self.assertEqual(response.ext_fields, {"changed": "true"})
        ours = broker.metadata.topics_version
        self.assertEqual(response.body, b'{"counter":%d,"timestamp":%d}' % (ours.counter, ours.timestamp))
        response = connection.ask(RequestCode.QUERY_DATA_VERSION, body=response.body)
        self.assertEqual(response.ext_fields, {"changed": "false"})
        response = connection.ask(RequestCode.QUERY_DATA_VERSION, body=b"[1,")
        self.assertEqual(response.code, ResponseCode.SYSTEM_ERROR)
        self.assertIn("not a DataVersion", response.remark or "")


class RuntimeInfoTests(_BrokerCase):
    def test_runtime_info(self) -> None:
        """
        Code 28: a KVTable of the fields of 4.9.8's C{prepareRuntimeInfo}
        rmqha knows.
        """
        broker = self.start()
        self.reactor.advance(90061)
        response = self.connect().ask(RequestCode.GET_BROKER_RUNTIME_INFO)
        self.assertEqual(response.code, ResponseCode.SUCCESS)
        body = parse_fastjson(response.body.decode())
        assert isinstance(body, dict)
        table = body["table"]
        assert isinstance(table, dict)
        commitlog = broker.commitlog
        self.assertEqual(table["brokerVersionDesc"], "V4_9_8")
        self.assertEqual(table["brokerVersion"], "409")
        self.assertEqual(table["runtime"], "[ 1 days, 1 hours, 1 minutes, 1 seconds ]")
        self.assertEqual(table["bootTimestamp"], "1700000000000")
        self.assertEqual(table["commitLogMaxOffset"], str(commitlog.max_offset))
        self.assertEqual(table["commitLogMinOffset"], str(commitlog.min_offset))
        self.assertEqual(table["putMessageTimesTotal"], "0")
        self.assertEqual(table["remainHowManyDataToFlush"], "0 B")
        self.assertRegex(str(table["commitLogDirCapacity"]), r"^Total : .*B, Free : .*B\.$")
        self.assertNotIn("dispatchBehindBytes", table)  # (no consume queues kept)

    def test_dispatch_behind(self) -> None:
        """
        With consume queues: C{dispatchBehindBytes}, the log's bytes the
        queues do not describe yet (0 once dispatch caught up).
        """
        self.consume_queues = True
        broker = self.start()
        commitlog = broker.commitlog
        commitlog.put(Message("T", b"x" * 100))
        table = self.runtime_table()
        self.assertEqual(table["dispatchBehindBytes"], str(commitlog.max_offset))
        self.reactor.advance(1)
        self.assertEqual(self.runtime_table()["dispatchBehindBytes"], "0")

    def runtime_table(self) -> dict[Any, Any]:
        body = parse_fastjson(self.connect().ask(RequestCode.GET_BROKER_RUNTIME_INFO).body.decode())
        assert isinstance(body, dict) and isinstance(body["table"], dict)
        return body["table"]

    def test_formats(self) -> None:
        self.assertEqual(
            [human_bytes(n) for n in (0, 1023, 1024, 1536, 5 << 30)],
            ["0 B", "1023 B", "1.0 KiB", "1.5 KiB", "5.0 GiB"],
        )
        self.assertEqual(format_runtime(0), "[ 0 days, 0 hours, 0 minutes, 0 seconds ]")
        self.assertEqual(format_runtime(1234 * 86_400_000), "[ 1,234 days, 0 hours, 0 minutes, 0 seconds ]")


class CreateTopicTests(_BrokerCase):
    """
    UPDATE_AND_CREATE_TOPIC: validated as 4.9.8 validates it, persisted to
    config/topics.json before the answer, kept across a restart.
    """

    def test_persisted_and_kept(self) -> None:
        broker = self.start()
        before = broker.metadata.topics_version
        response = self.connect().ask(RequestCode.UPDATE_AND_CREATE_TOPIC, {**_CREATE, "perm": "4"})
        self.assertEqual(response.code, ResponseCode.SUCCESS)
        self.assertEqual(broker.metadata.topics_version.counter, before.counter + 1)
        path = os.path.join(self.store, "config", "topics.json")
        with open(path) as f:
            on_disk = decode_table(MetadataFile.TOPICS, f.read())
        assert isinstance(on_disk, TopicTable)
        self.assertEqual(on_disk.topics["Orders"].perm, 4)

        self.successResultOf(broker.stopService())
        again = self.start()
        self.assertEqual(again.metadata.topics["Orders"].perm, 4)
        self.assertTrue(again.metadata.topics_version.same(broker.metadata.topics_version))

    def test_refused(self) -> None:
        """
        A bad request is answered SYSTEM_ERROR with 4.9.8's remark (or
        rmqha's, naming the field) and changes nothing.
        """
        broker = self.start()
        connection = self.connect()
        cases = [
            ({"topic": ""}, "The specified topic is blank."),
            ({"topic": "a b"}, "The specified topic contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"),
            ({"topic": "x" * 128}, "The specified topic is longer than topic max length."),
            ({"topic": "TBW102"}, "The topic[TBW102] is conflict with system topic."),
            ({"topic": "rmq_sys_x"}, "The topic[rmq_sys_x] is conflict with system topic."),
            ({"readQueueNums": "four"}, "the custom field <readQueueNums> is not an int: 'four'"),
            ({"perm": "99999999999"}, "the custom field <perm> is not an int: '99999999999'"),
            ({"writeQueueNums": "70000"}, "topic 'Orders': writeQueueNums 70000 is not 0-65535"),
            ({"perm": "16"}, "topic 'Orders': perm 16 is not 0-15"),
            ({"topicFilterType": "SQL92"}, "topicFilterType 'SQL92' is not SINGLE_TAG or MULTI_TAG"),
        ]
        for change, remark in cases:
            response = connection.ask(RequestCode.UPDATE_AND_CREATE_TOPIC, {**_CREATE, **change})
            self.assertEqual((response.code, response.remark), (ResponseCode.SYSTEM_ERROR, remark))
        missing = dict(_CREATE)
        del missing["defaultTopic"]
        response = connection.ask(RequestCode.UPDATE_AND_CREATE_TOPIC, missing)
        self.assertEqual(response.remark, "the custom field <defaultTopic> is null")
        self.assertNotIn("Orders", broker.metadata.topics)
        self.assertFalse(os.path.exists(os.path.join(self.store, "config", "topics.json")))

    def test_unwritable(self) -> None:
        """
        A topics.json that cannot be written is a SYSTEM_ERROR naming it.
        """
        broker = self.start()
        os.makedirs(os.path.join(self.store, "config", "topics.json"))
        response = self.connect().ask(RequestCode.UPDATE_AND_CREATE_TOPIC, _CREATE)
        self.assertEqual(response.code, ResponseCode.SYSTEM_ERROR)
        self.assertIn("topics.json could not be written", response.remark or "")
        self.assertIn(MetadataFile.TOPICS, broker.metadata.dirty)


class MetadataLifeTests(_BrokerCase):
    """
    The broker's metadata: loaded at start, offsets written every 5 s and
    at stop, a bad file a one-line refusal to start.
    """

    def test_not_before_start(self) -> None:
        broker = Broker(
            BrokerSettings(), reactor=self.reactor, open_commitlog=lambda: CommitLog.open(self.store)
        )
        e = self.assertRaises(RuntimeError, lambda: broker.metadata)
        self.assertIn("not running", str(e))

    def test_offsets_flushed(self) -> None:
        broker = self.start()
        path = os.path.join(self.store, "config", "consumerOffset.json")
        broker.metadata.commit_offset("G1", "Orders", 0, 5)
        self.reactor.advance(5)
        with open(path) as f:
            self.assertIn("Orders@G1", f.read())
        broker.metadata.commit_offset("G1", "Orders", 0, 9)
        self.successResultOf(broker.stopService())
        with open(path) as f:
            self.assertIn("0:9", f.read())

    def test_bad_file_one_line(self) -> None:
        """
        A metadata file and its backup both unusable: under twistd one
        line naming the file; the store is closed again.
        """
        os.makedirs(os.path.join(self.store, "config"))
        path = os.path.abspath(os.path.join(self.store, "config", "topics.json"))
        with open(path, "w") as f:
            f.write("{not json")
        service = build_service(
            BrokerSettings(store_dir=self.store, ha_listen="tcp:0", segment_size=64 * 1024),
            self.reactor,
            one_line_errors=True,
        )
        exit = self.assertRaises(SystemExit, service.startService)
        self.assertTrue(
            str(exit.code).startswith(f"twistd rmqha: cannot load the broker's metadata: {path} is unusable"),
            exit.code,
        )
        self.assertEqual(str(exit.code).count("\n"), 0)
        self.assertIsNone(service.store.commitlog)  # type: ignore[attr-defined]
        self.assertFalse(os.path.exists(os.path.join(self.store, "abort")))


class PortTests(_BrokerCase):
    """
    The remoting port listens through the broker's helper, behind its
    connection limits, and says in one line when it cannot.
    """

    def test_limited(self) -> None:
        broker = self.start(max_connections=2, max_connections_per_peer=1)
        factory = self.remoting_factory()
        self.assertIs(factory.budget, broker.ports.budget)
        self.assertIs(broker.ports.port_limits["remoting"], factory)
        self.connect("10.0.0.1")
        self.assertIsNone(factory.buildProtocol(IPv4Address("TCP", "10.0.0.1", 40001)))
        self.connect("10.0.0.2")
        self.assertIsNone(factory.buildProtocol(IPv4Address("TCP", "10.0.0.3", 40001)))

    def test_no_port_by_default(self) -> None:
        broker = Broker(
            BrokerSettings(ha_listen="tcp:0"),
            reactor=self.reactor,
            open_commitlog=lambda: CommitLog.open(
                self.store, segment_size=64 * 1024, clock=fixed_clock,
                consume_queues=self.consume_queues, consume_queue_units=self.consume_queue_units,
            ),
            # (Disk work inline: the fake reactor has no threads.)
            run_in_thread=lambda f: succeed(f()),
        )
        broker.startService()
        self.addCleanup(broker.stopService)
        self.assertEqual([s for s in broker if isinstance(s, RemotingPort)], [])
        self.assertEqual([f.name for _, f, *_ in self.reactor.tcpServers], ["HA"])

    def test_in_use(self) -> None:
        class InUse:
            def listen(self, factory: object) -> object:
                return fail(CannotListenError("", 10911, OSError(98, "Address already in use")))

        broker = Broker(
            BrokerSettings(ha_listen="tcp:0", listen=InUse()),  # type: ignore[arg-type]
            reactor=self.reactor,
            open_commitlog=lambda: CommitLog.open(self.store),
        )
        e = self.assertRaises(ListenFailed, broker.startService)
        self.assertEqual((e.port, e.reason), ("remoting", "Address already in use"))
        self.assertFalse(os.path.exists(self.store))

        service = build_service(
            BrokerSettings(store_dir=self.store, ha_listen="tcp:0", listen="tcp:10911"),
            self.reactor,
            one_line_errors=True,
        )
        (port,) = [s for s in service if isinstance(s, RemotingPort) and s.name == "remoting"]  # type: ignore[attr-defined]
        port.where = InUse()  # type: ignore[assignment]
        exit = self.assertRaises(SystemExit, service.privilegedStartService)
        self.assertEqual(
            exit.code, "twistd rmqha: cannot listen on tcp:10911 (--listen): Address already in use"
        )


class VIPPortTests(_BrokerCase):
    """
    RocketMQ's second port, listenPort - 2 (the VIP channel a genuine
    slave asks its master's topic config on): served with the remoting
    port's own handler, behind its own connection limits.
    """

    def factory(self, name: str) -> LimitedFactory:
        (factory,) = [f for _, f, *_ in self.reactor.tcpServers if getattr(f, "name", None) == name]
        assert isinstance(factory, LimitedFactory)
        return factory

    def test_served_on_listen_port_less_2(self) -> None:
        """
        C{--listen tcp:10911:interface=...} listens on 10909 too, on the
        same interface, answering what the remoting port answers, from
        one handler shared by both ports; it is in the startup line.
        """
        from rmqha.startup import listening_ports

        broker = self.start(listen="tcp:10911:interface=127.0.0.1")
        self.assertEqual(
            sorted((p, i, getattr(f, "name", None)) for p, f, _, i in self.reactor.tcpServers),
            [(0, "", "HA"), (10909, "127.0.0.1", "vip"), (10911, "127.0.0.1", "remoting")],
        )
        main, vip = _Connection(self.factory("remoting")), _Connection(self.factory("vip"))
        created = vip.ask(RequestCode.UPDATE_AND_CREATE_TOPIC, _CREATE)
        self.assertEqual(created.code, ResponseCode.SUCCESS)
        asked = [c.ask(RequestCode.GET_ALL_TOPIC_CONFIG) for c in (main, vip)]
        self.assertEqual(asked[0].body, asked[1].body)
        self.assertIn(b'"Orders"', asked[0].body)
        self.assertEqual(vip.ask(9999).code, ResponseCode.REQUEST_CODE_NOT_SUPPORTED)
        (remoting,) = [s for s in broker if isinstance(s, RemotingPort) and s.name == "remoting"]
        (vip_port,) = [s for s in broker if isinstance(s, RemotingPort) and s.name == "vip"]
        self.assertIs(vip_port.handler()._handler, remoting.handler())  # type: ignore[attr-defined]
        # (A MemoryReactor's ports say 0.0.0.0 whatever their interface.)
        self.assertIn(("VIP", "0.0.0.0:10909"), listening_ports(broker))

    def test_not_pull_message(self) -> None:
        """
        The VIP port takes every code the remoting port takes but
        PULL_MESSAGE, as 4.9.8 registers its processors.
        """
        from rmqha.remoting.broker import _VIPHandler
        from rmqha.remoting.protocol import Dispatcher

        serve = lambda command, peer: None  # noqa: E731
        handler = _VIPHandler(Dispatcher({RequestCode.PULL_MESSAGE: serve, RequestCode.GET_ALL_TOPIC_CONFIG: serve}))
        self.assertFalse(handler.handles(RequestCode.PULL_MESSAGE))
        self.assertTrue(handler.handles(RequestCode.GET_ALL_TOPIC_CONFIG))
        self.assertFalse(handler.handles(RequestCode.SEND_MESSAGE))

    def test_limits_of_its_own(self) -> None:
        """
        Its own connection caps (a genuine slave holds one connection on
        each port), sharing the broker's descriptor budget.
        """
        broker = self.start(listen="tcp:10911", max_connections=1, max_connections_per_peer=1)
        vip = self.factory("vip")
        self.assertIs(broker.ports.port_limits["vip"], vip)
        self.assertIs(vip.budget, broker.ports.budget)
        _Connection(self.factory("remoting"), "10.0.0.1")
        _Connection(vip, "10.0.0.1")
        self.assertIsNone(vip.buildProtocol(IPv4Address("TCP", "10.0.0.2", 40001)))

    def test_none_for_port_0(self) -> None:
        broker = self.start()
        self.assertEqual(sorted(broker.ports.port_limits), ["HA", "remoting"])

    def test_descriptions(self) -> None:
        """
        The same description on the port less 2, for tcp:, tcp6: and
        ssl: with a port number; none for port 0 or another endpoint;
        ports 1 and 2 refused.
        """
        from rmqha.remoting.broker import vip_description

        for listen, vip in [
            ("tcp:10911", "tcp:10909"),
            ("tcp:10911:interface=127.0.0.1:backlog=9", "tcp:10909:interface=127.0.0.1:backlog=9"),
            (r"tcp6:port=10911:interface=\:\:1", r"tcp6:port=10909:interface=\:\:1"),
            (r"tcp:interface=\:\:1:10911", r"tcp:interface=\:\:1:10909"),
            ("ssl:10911:interface=127.0.0.1", "ssl:10909:interface=127.0.0.1"),
            ("tcp:3", "tcp:1"),
            ("tcp:0", None),
            ("tcp:port=0:interface=127.0.0.1", None),
            ("unix:/run/rmqha.sock", None),
            ("systemd:domain=INET:index=0", None),
        ]:
            self.assertEqual(vip_description(listen), vip, listen)
        for listen in ("tcp:2", "tcp:port=1"):
            e = self.assertRaises(ValueError, vip_description, listen)
            self.assertIn("would be", str(e))
        e = self.assertRaises(SettingsError, BrokerSettings.from_sources, {"listen": "2"})
        self.assertEqual(
            str(e),
            "--listen tcp:2: the VIP port (the remoting port less 2, as RocketMQ derives it) "
            "would be 0: give a port above 2",
        )
        self.assertRaises(SettingsError, BrokerSettings.from_sources, {}, {"listenPort": "1"}, "b.conf")

    def test_tls(self) -> None:
        """
        C{--listen ssl:PORT}: the VIP port is TLS too, with the same key
        pair, on the same interface.
        """
        from rmqha.assemble import check_files
        from rmqha.tls import server_endpoint_port
        from tests.test_tls import PKI

        files = PKI(self.mktemp()).master()
        settings = BrokerSettings(
            store_dir=self.mktemp(),
            ha_listen="ssl:0:interface=127.0.0.1",
            listen="ssl:10911:interface=127.0.0.1",
            tls_cert=files.cert,
            tls_key=files.key,
        )
        check_files(settings)
        service = build_service(settings, MemoryReactorClock())
        ports = {s.name: s for s in service if isinstance(s, RemotingPort)}  # type: ignore[attr-defined]
        self.assertEqual({n: server_endpoint_port(p.where) for n, p in ports.items()}, {"remoting": 10911, "vip": 10909})
        self.assertEqual(ports["vip"].where._interface, "127.0.0.1")
        self.assertEqual(ports["vip"].where._tls_listen[1], ports["remoting"].where._tls_listen[1])

    def test_in_use(self) -> None:
        """
        The VIP port in use is one line naming it, like any port's.
        """

        class InUse:
            def listen(self, factory: object) -> object:
                return fail(CannotListenError("", 10909, OSError(98, "Address already in use")))

        service = build_service(
            BrokerSettings(store_dir=self.store, ha_listen="tcp:0", listen="tcp:10911:interface=127.0.0.1"),
            self.reactor,
            one_line_errors=True,
        )
        (port,) = [s for s in service if isinstance(s, RemotingPort) and s.name == "vip"]  # type: ignore[attr-defined]
        port.where = InUse()  # type: ignore[assignment]
        exit = self.assertRaises(SystemExit, service.privilegedStartService)
        self.assertEqual(
            exit.code,
            "twistd rmqha: cannot listen on tcp:10909:interface=127.0.0.1 (the VIP port: --listen's "
            "port less 2, as RocketMQ's): Address already in use",
        )
        self.assertFalse(os.path.exists(self.store))


class SettingsTests(SynchronousTestCase):
    def test_listen(self) -> None:
        """
        C{--listen} takes a port or an endpoint; C{listenPort} a port; a
        bad value is one line naming the flag or key; no port by default.
        """
        self.assertIsNone(BrokerSettings.from_sources({}).listen)
        self.assertEqual(BrokerSettings.from_sources({"listen": "10911"}).listen, "tcp:10911")
        self.assertEqual(
            BrokerSettings.from_sources({"listen": "tcp:0:interface=127.0.0.1"}).listen,
            "tcp:0:interface=127.0.0.1",
        )
        self.assertEqual(
            BrokerSettings.from_sources({}, {"listenPort": "10911"}, "b.conf").listen, "tcp:10911"
        )
        e = self.assertRaises(SettingsError, BrokerSettings.from_sources, {"listen": "nonsense:1"})
        self.assertTrue(str(e).startswith("--listen: 'nonsense:1' is neither a port nor"), str(e))
        e = self.assertRaises(
            SettingsError, BrokerSettings.from_sources, {}, {"listenPort": "x"}, "b.conf"
        )
        self.assertEqual(str(e), "listenPort in b.conf: 'x' is not a port")
        e = self.assertRaises(SettingsError, BrokerSettings.from_sources, {"listen": "ssl:10911"})
        self.assertIn("give --tls-cert and --tls-key", str(e))


class TLSTests(SynchronousTestCase):
    def test_ssl_listen(self) -> None:
        """
        C{--listen ssl:PORT} serves TLS with the broker's key pair: the
        port listens on a TLS endpoint of the C{--tls-*} files.
        """
        from twisted.internet.endpoints import SSL4ServerEndpoint

        from rmqha.assemble import check_files
        from tests.test_tls import PKI

        files = PKI(self.mktemp()).master()
        settings = BrokerSettings(
            store_dir=self.mktemp(),
            ha_listen="ssl:0:interface=127.0.0.1",
            listen="ssl:0:interface=127.0.0.1",
            tls_cert=files.cert,
            tls_key=files.key,
        )
        check_files(settings)
        service = build_service(settings, MemoryReactorClock())
        (port,) = [s for s in service if isinstance(s, RemotingPort)]  # type: ignore[attr-defined]
        self.assertIsInstance(port.where, SSL4ServerEndpoint)
        e = self.assertRaises(ValueError, check_files, attrs.evolve(settings, listen="ssl:0:certKey=x"))
        self.assertIn("--listen", str(e))


class MasterRemotingTests(_BrokerCase):
    """
    A slave started with C{--master-remoting} runs its own metadata sync
    (L{rmqha.remoting.sync.MetadataSync}) from its start: 3 s later it
    asks the master's remoting port for its tables and keeps them in its
    own C{config/*.json}.
    """

    def test_slave_copies_the_masters_topics(self) -> None:
        from twisted.test.iosim import FakeTransport, connect

        master = self.start(Role.MASTER)
        created = self.connect().ask(RequestCode.UPDATE_AND_CREATE_TOPIC, _CREATE)
        self.assertEqual(created.code, ResponseCode.SUCCESS)
        slave_reactor = MemoryReactorClock()
        slave_reactor.advance(1_700_000_000)
        slave_store = self.mktemp()
        slave = Broker(
            BrokerSettings(
                role=Role.SLAVE,
                ha_listen="tcp:0",
                master_endpoint="tcp:host=127.0.0.1:port=10912",
                master_remoting="127.0.0.1:10911",
            ),
            reactor=slave_reactor,
            open_commitlog=lambda: CommitLog.open(slave_store, segment_size=64 * 1024, clock=fixed_clock),
        )
        slave.startService()
        self.addCleanup(lambda: slave.running and slave.stopService())
        self.assertIsNotNone(slave.metadata_sync)
        self.assertNotIn("Orders", slave.metadata.topics)
        before = len(slave_reactor.tcpClients)
        slave_reactor.advance(3)
        # The sync dialled the master's remoting address: join the two.
        dialled = slave_reactor.tcpClients[before:]
        self.assertEqual([(host, port) for host, port, *_ in dialled], [("127.0.0.1", 10911)])
        client = dialled[0][2].buildProtocol(IPv4Address("TCP", "127.0.0.1", 10911))
        server = self.remoting_factory().buildProtocol(IPv4Address("TCP", "127.0.0.1", 50000))
        pump = connect(
            server, FakeTransport(server, isServer=True),
            client, FakeTransport(client, isServer=False),
        )
        for _ in range(20):
            pump.flush()
            slave_reactor.advance(0.1)
            self.reactor.advance(0.1)
        self.assertIn("Orders", slave.metadata.topics)
        with open(os.path.join(slave_store, "config", "topics.json")) as f:
            self.assertIn('"Orders"', f.read())
        self.assertEqual(master.metadata.topics["Orders"], slave.metadata.topics["Orders"])


class MetadataSyncScheduleTests(_BrokerCase):
    """
    A classic slave's first metadata sync comes 3 s after it becomes a
    slave (4.9.8's); a failover node's as soon as it follows a master: a
    node elected within those 3 s would serve the consumer offsets of its
    own last run (a deposed master restarted).
    """

    def test_classic(self) -> None:
        broker = self.start(Role.SLAVE, namesrv=("127.0.0.1:9876",), broker_id=1)
        assert broker.metadata_sync is not None
        self.assertEqual(broker.metadata_sync.first_delay, 3.0)

    def test_failover(self) -> None:
        broker = self.start(
            Role.MASTER, namesrv=("127.0.0.1:9876",), broker_id=1, coordinator="etcd:http://127.0.0.1:2379", group="g",
            node_id="n0", advertise="127.0.0.1:10912", insecure_group=True,
        )
        assert broker.metadata_sync is not None
        self.assertEqual(broker.metadata_sync.first_delay, 0.0)
