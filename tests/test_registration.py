"""
rmqha.remoting.registration: a broker's registration with its NameServers
(in memory, against rmqha.testing.FakeNameServer, on a Clock).
"""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from rmqha.remoting._frames import FrameDecoder, RemotingCommand
from rmqha.remoting.codes import RequestCode
from rmqha.remoting.metadata import BrokerMetadata, MetadataFile, TopicConfig
from rmqha.remoting.namesrv import body_crc32, decode_register_body
from rmqha.remoting.registration import BrokerIdentity, NameServerRegistration
from rmqha.testing import FakeNameServer, StringEndpoint

from tests._helpers import LoggedEvents

_MASTER = BrokerIdentity("C", "broker-a", 0, "10.0.0.1:10911", "10.0.0.1:10912")
_SLAVE = BrokerIdentity("C", "broker-a", 1, "10.0.0.2:10911", "10.0.0.2:10912")


class RegistrationTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.metadata = BrokerMetadata(self.mktemp(), self.clock)
        self.metadata.update_topic(TopicConfig("TopicTest", 4, 4), persist=False)
        self.ns = FakeNameServer(self.clock)
        self.others: list[FakeNameServer] = []

    def registration(
        self, identity: BrokerIdentity = _MASTER, servers: list[Any] | None = None, **kw: Any
    ) -> NameServerRegistration:
        metadata = self.metadata
        registration = NameServerRegistration(
            None,
            servers or [self.ns.client_endpoint(self.clock)],
            identity,
            lambda: metadata.table(MetadataFile.TOPICS),  # type: ignore[arg-type,return-value]
            clock=self.clock,
            **kw,
        )
        return registration

    def settle(self, *servers: FakeNameServer) -> None:
        for _ in range(5):
            self.clock.advance(0)
            for ns in servers or (self.ns,):
                ns.flush()

    def test_every_30s_with_header_and_body(self) -> None:
        """
        REGISTER_BROKER at start and every 30 s, with the identity in the
        header, the body's CRC, and the topic table (DataVersion included)
        as the body; a change of the table goes out in the next round.
        """
        registration = self.registration()
        registration.startService()
        self.settle()
        self.assertEqual(len(self.ns.registrations), 1)
        taken = self.ns.registrations[0]
        self.assertEqual(
            (taken.header.cluster_name, taken.header.broker_name, taken.header.broker_id,
             taken.header.broker_addr, taken.header.ha_server_addr, taken.header.compressed),
            ("C", "broker-a", 0, "10.0.0.1:10911", "10.0.0.1:10912", False),
        )
        self.assertEqual(taken.body.topics, self.metadata.table(MetadataFile.TOPICS))
        self.assertEqual(self.ns.topic_names(), {"TopicTest"})
        self.clock.advance(29)
        self.settle()
        self.assertEqual(len(self.ns.registrations), 1)
        self.metadata.update_topic(TopicConfig("Second", 2, 2), persist=False)
        self.clock.advance(1)
        self.settle()
        self.assertEqual(len(self.ns.registrations), 2)
        self.assertEqual(self.ns.topic_names(), {"TopicTest", "Second"})
        self.assertEqual(registration.registrations, 2)
        registration.stopService()
        self.settle()

    def test_body_on_the_wire(self) -> None:
        """
        The frame's body parses back to the table, its crc32 matches the
        header; compressed when asked.
        """
        endpoint = StringEndpoint()
        registration = self.registration(servers=[endpoint], compressed=True)
        registration.startService()
        self.clock.advance(0)
        protocol, transport = endpoint.connected[0]
        decoder = FrameDecoder()
        decoder.feed(transport.value())
        command = decoder.next_command()
        assert command is not None
        self.assertEqual(command.code, RequestCode.REGISTER_BROKER)
        self.assertEqual(command.version, 409)
        self.assertEqual(command.ext("compressed"), "true")
        self.assertEqual(command.ext("bodyCrc32"), str(body_crc32(command.body)))
        self.assertEqual(
            decode_register_body(command.body, True).topics.topics["TopicTest"],
            TopicConfig("TopicTest", 4, 4),
        )

    def test_one_down_one_silent(self) -> None:
        """
        A NameServer that refuses connections and one that never answers
        do not stop the registration with the third; each failure is one
        log line naming the NameServer; the one that comes back gets the
        next round.
        """
        logged = LoggedEvents(self)
        down = FakeNameServer(self.clock)
        down.up = False
        silent = StringEndpoint()
        registration = self.registration(
            servers=[down.client_endpoint(self.clock), silent, self.ns.client_endpoint(self.clock)],
            retry_policy=lambda n: 1.0,
        )
        out: list[Any] = []
        registration.startService()
        self.settle(self.ns, down)
        self.assertEqual(len(self.ns.registrations), 1)
        self.clock.advance(6)
        self.settle(self.ns, down)
        failures = [t for t in logged.texts() if "failed" in t]
        self.assertEqual(len(failures), 2, failures)
        self.assertTrue(any("refused" in t.lower() for t in failures), failures)
        self.assertTrue(any("within 6 s" in t for t in failures), failures)
        down.up = True
        self.clock.advance(24)
        self.settle(self.ns, down)
        self.clock.advance(1)
        self.settle(self.ns, down)
        self.assertEqual(len(down.registrations), 1)
        self.assertEqual(len(self.ns.registrations), 2)
        registration.register().addBoth(out.append)
        self.settle(self.ns, down)
        self.clock.advance(6)
        self.assertEqual(len(out[0]), 2)

    def test_unregister_on_stop(self) -> None:
        registration = self.registration()
        registration.startService()
        self.settle()
        self.assertEqual(self.ns.brokers("broker-a"), {0: "10.0.0.1:10911"})
        stopped: list[Any] = []
        registration.stopService().addBoth(stopped.append)
        self.settle()
        self.assertEqual(stopped, [None])
        self.assertEqual(len(self.ns.unregistrations), 1)
        self.assertEqual(self.ns.brokers("broker-a"), {})
        self.clock.advance(60)
        self.settle()
        self.assertEqual(len(self.ns.registrations), 1)

    def test_slave_follows_ha_server_addr(self) -> None:
        """
        A slave learns the master's haServerAddr and masterAddr from the
        answer, is told of a new one once (not every round), and of the
        change when another master registers.
        """
        followed: list[str] = []
        master = self.registration(_MASTER)
        slave = self.registration(_SLAVE, on_master_ha=followed.append)
        slave.startService()
        self.settle()
        self.assertEqual((followed, slave.master_addr), ([], None))
        master.startService()
        self.settle()
        self.clock.advance(30)
        self.settle()
        self.assertEqual(followed, ["10.0.0.1:10912"])
        self.assertEqual(slave.master_addr, "10.0.0.1:10911")
        self.clock.advance(30)
        self.settle()
        self.assertEqual(followed, ["10.0.0.1:10912"])
        # Another master takes over broker-a: its own registration, then the slave's next round.
        master.stopService()
        other = self.registration(BrokerIdentity("C", "broker-a", 0, "10.0.0.3:10911", "10.0.0.3:10912"))
        other.startService()
        self.settle()
        self.clock.advance(30)
        self.settle()
        self.assertEqual(followed, ["10.0.0.1:10912", "10.0.0.3:10912"])
        self.assertEqual(slave.master_addr, "10.0.0.3:10911")

    def test_role_change_registers_at_once(self) -> None:
        """
        A promotion registers at once as brokerId 0 (the NameServer moves
        the address from id 1 to 0); a demotion as the slave's own id.
        """
        registration = self.registration(_SLAVE)
        registration.startService()
        self.settle()
        self.assertEqual(self.ns.brokers("broker-a"), {1: "10.0.0.2:10911"})
        self.assertEqual(self.ns.topic_names(), set())
        self.clock.advance(5)
        registration.role_changed(0)
        self.settle()
        self.assertEqual(self.ns.brokers("broker-a"), {0: "10.0.0.2:10911"})
        self.assertEqual(self.ns.topic_names(), {"TopicTest"})
        registration.role_changed(1)
        self.settle()
        self.assertEqual(self.ns.brokers("broker-a"), {1: "10.0.0.2:10911"})
        self.assertEqual(len(self.ns.registrations), 3)

    def test_error_answer_logged(self) -> None:
        """A NameServer's error answer is a logged failure, not a result."""
        logged = LoggedEvents(self)
        registration = self.registration()
        bad = RemotingCommand(RequestCode.REGISTER_BROKER, ext_fields={"brokerName": "x"})
        registration._register_command = lambda: bad  # type: ignore[method-assign]
        out: list[Any] = []
        registration.startService()
        registration.register().addBoth(out.append)
        self.settle()
        self.assertEqual(out, [[]])
        self.assertTrue(any("answered code 1" in t and "brokerAddr" in t for t in logged.texts()))


class BrokerRegistrationTests(SynchronousTestCase):
    """
    A Broker with --namesrv: registered at start and on every role change,
    unregistered at stop; a slave without --master follows the master the
    NameServer names and re-points when it changes.
    """

    def setUp(self) -> None:
        from twisted.internet.testing import MemoryReactorClock

        self.clock = MemoryReactorClock()
        self.ns = FakeNameServer(self.clock)

    def broker(self, ip: str, **values: Any) -> Any:
        from twisted.internet.defer import succeed

        from rmqha.broker import Broker
        from rmqha.remoting.protocol import RemotingClient
        from rmqha.settings import BrokerSettings
        from rmqha.store.commitlog import CommitLog
        from tests._helpers import fixed_clock

        store = self.mktemp()
        settings = BrokerSettings(
            ha_listen="tcp:10912", scrub_rate=0, namesrv=("127.0.0.1:9876",), group="broker-a",
            broker_ip1=ip, **values,
        )
        broker = Broker(
            settings,
            reactor=self.clock,
            open_commitlog=lambda: CommitLog.open(store, segment_size=64 * 1024, clock=fixed_clock),
            run_in_thread=lambda f: succeed(f()),
            retry_policy=lambda attempt: 1.0,
            fd_limit=lambda: 4096,
        )
        registration = broker.registration
        assert registration is not None
        # The NameServer in memory instead of 127.0.0.1:9876.
        registration.clients = [RemotingClient(None, self.ns.client_endpoint(self.clock), clock=self.clock)]
        broker.startService()
        self.settle()
        return broker

    def settle(self) -> None:
        for _ in range(5):
            self.clock.advance(0)
            self.ns.flush()

    def test_slave_follows_and_repoints(self) -> None:
        from rmqha.ha.config import Role

        master = self.broker("10.0.0.1")
        self.assertEqual(self.ns.brokers("broker-a"), {0: "10.0.0.1:10911"})
        self.assertEqual(self.ns.registrations[0].header.ha_server_addr, "10.0.0.1:10912")
        slave = self.broker("10.0.0.2", role=Role.SLAVE, broker_id=1)
        self.assertEqual(self.ns.brokers("broker-a"), {0: "10.0.0.1:10911", 1: "10.0.0.2:10911"})
        self.assertEqual(slave.master_endpoint, "tcp:host=10.0.0.1:port=10912")
        assert slave.registration is not None
        self.assertEqual(slave.registration.master_addr, "10.0.0.1:10911")
        # The metadata sync is the broker's own, towards the masterAddr given.
        self.assertEqual(slave.metadata_sync.master, "10.0.0.1:10911")
        self.assertIsNone(master.metadata_sync.master)
        # The master goes; another registers as broker-a's master.
        stopped = master.stopService()
        self.settle()
        self.successResultOf(stopped)
        self.assertEqual(self.ns.brokers("broker-a"), {1: "10.0.0.2:10911"})
        other = self.broker("10.0.0.3")
        self.clock.advance(30)
        self.settle()
        self.assertEqual(slave.master_endpoint, "tcp:host=10.0.0.3:port=10912")
        self.assertEqual(slave.metadata_sync.master, "10.0.0.3:10911")
        # The slave promoted: registered as 0 at once, its address moved.
        promoted = slave.become_master(Role.ASYNC_MASTER)
        self.settle()
        self.successResultOf(promoted)
        self.assertEqual(self.ns.brokers("broker-a")[0], "10.0.0.2:10911")
        self.assertNotIn(1, self.ns.brokers("broker-a"))
        for broker in (slave, other):
            d = broker.stopService()
            self.settle()
            self.successResultOf(d)
        self.assertEqual(self.ns.brokers("broker-a"), {})

    def test_slave_with_master_does_not_follow(self) -> None:
        """
        --master and --master-remoting win over what the NameServer says.
        """
        from rmqha.ha.config import Role

        self.broker("10.0.0.1", listen="tcp:20911")
        self.assertEqual(self.ns.brokers("broker-a"), {0: "10.0.0.1:20911"})
        slave = self.broker(
            "10.0.0.2", role=Role.SLAVE, broker_id=1, master="tcp:host=10.9.9.9:port=1",
            master_remoting="10.9.9.9:2",
        )
        self.assertEqual(slave.master_endpoint, "tcp:host=10.9.9.9:port=1")
        self.assertEqual(slave.metadata_sync.master, "10.9.9.9:2")


class PortOfTests(SynchronousTestCase):
    def test_port_of(self) -> None:
        from rmqha.remoting.registration import port_of

        self.assertEqual(port_of("tcp:10912", 1), 10912)
        self.assertEqual(port_of("ssl:20912:privateKey=k.pem", 1), 20912)
        self.assertEqual(port_of("tcp:port=30912:interface=127.0.0.1", 1), 30912)
        self.assertEqual(port_of("tcp:0:interface=127.0.0.1", 1), 0)
        self.assertEqual(port_of(None, 10911), 10911)
        self.assertEqual(port_of(object(), 10911), 10911)


class SeekMasterTests(SynchronousTestCase):
    """
    A slave that follows the NameServers' master, started before its
    master registered, registers again after 1 s, 2 s, 4 s ... (up to
    the 30 s period) until a NameServer names a master: it finds one
    within seconds of the master's registration, not at its next period.
    """

    # (RegistrationTests' fixtures, not its tests.)
    setUp = RegistrationTests.setUp
    registration = RegistrationTests.registration
    settle = RegistrationTests.settle

    def test_slave_before_master(self) -> None:
        followed: list[str] = []
        slave = self.registration(_SLAVE, on_master_ha=followed.append)
        slave.startService()
        self.addCleanup(slave.stopService)
        self.settle()
        rounds = [slave.registrations]
        for step in (1, 2, 4):
            self.clock.advance(step)
            self.settle()
            rounds.append(slave.registrations)
        self.assertEqual(rounds, [1, 2, 3, 4])  # seeking: 1 s, 2 s, 4 s later
        self.assertEqual(followed, [])
        master = self.registration(_MASTER)
        master.startService()
        self.addCleanup(master.stopService)
        self.settle()
        self.clock.advance(8)  # the next early round, 15 s into the slave's period
        self.settle()
        self.assertEqual(followed, ["10.0.0.1:10912"])
        # Found: no more early rounds, only the period's.
        before = slave.registrations
        self.clock.advance(14)
        self.settle()
        self.assertEqual(slave.registrations, before)

    def test_not_for_a_master_or_a_slave_with_one(self) -> None:
        """
        A master, or a slave given its master (no C{on_master_ha}),
        registers on the period only.
        """
        for identity in (_MASTER, _SLAVE):
            registration = self.registration(identity)
            registration.startService()
            self.addCleanup(registration.stopService)
            self.settle()
            self.clock.advance(29)
            self.settle()
            self.assertEqual(registration.registrations, 1)


class RegistrationStatusTests(SynchronousTestCase):
    """
    L{NameServerRegistration.status}: per NameServer, whether the broker
    is registered now, the last success, the last error, the brokerId and
    the master's addresses the answer gave.
    """

    setUp = RegistrationTests.setUp
    registration = RegistrationTests.registration
    settle = RegistrationTests.settle

    def test_per_namesrv(self) -> None:
        down = FakeNameServer(self.clock)
        down.up = False
        down_endpoint = down.client_endpoint(self.clock)
        master = self.registration(_MASTER)
        master.startService()
        self.addCleanup(master.stopService)
        self.settle()
        self.clock.advance(10)
        slave_endpoint = self.ns.client_endpoint(self.clock)
        slave = self.registration(
            _SLAVE, servers=[slave_endpoint, down_endpoint],
            retry_policy=lambda n: 1.0,
        )
        slave.startService()
        self.settle(self.ns, down)
        self.clock.advance(4)
        up, gone = slave.status()
        self.assertEqual(
            (up.registered, up.last_success, up.age(self.clock.seconds()), up.broker_id,
             up.master_addr, up.ha_server_addr, up.registrations, up.failures, up.last_error),
            (True, 10.0, 4.0, 1, "10.0.0.1:10911", "10.0.0.1:10912", 1, 0, None),
        )
        self.assertEqual(
            (gone.registered, gone.last_success, gone.broker_id, gone.failures),
            (False, None, None, 1),
        )
        failed_at = gone.last_error_at
        assert gone.last_error is not None and failed_at is not None and 10 <= failed_at <= 14
        self.assertIn("cannot connect", gone.last_error)
        self.assertNotIn("\n", gone.last_error)
        # The master's own answer names no master.
        (own,) = master.status()
        self.assertEqual((own.registered, own.broker_id, own.master_addr, own.ha_server_addr),
                         (True, 0, None, None))
        self.assertEqual(own.as_json(self.clock.seconds())["last_success_age_seconds"], 14.0)
        # The connection closes: the NameServer forgot the slave, and so
        # does the status, until the next round registers it again.
        slave_endpoint.hang_up()
        self.settle(self.ns, down)
        self.assertFalse(slave.status()[0].registered)
        down.up = True
        self.clock.advance(26)
        self.settle(self.ns, down)
        self.clock.advance(0.5)
        self.settle(self.ns, down)
        up, back = slave.status()
        self.assertEqual((up.registered, up.last_success, up.registrations), (True, 40.0, 2))
        self.assertEqual((back.registered, back.last_success, back.broker_id), (True, 40.0, 1))
        # (The last error stays, with its time.)
        self.assertEqual(back.last_error_at, failed_at)
        # A promotion: registered under id 0, no master named.
        slave.role_changed(0)
        self.settle(self.ns, down)
        self.assertEqual([(s.broker_id, s.master_addr) for s in slave.status()], [(0, None)] * 2)
        self.successResultOf(self._stop(slave, down))
        self.assertEqual([s.registered for s in slave.status()], [False, False])

    def _stop(self, registration: NameServerRegistration, *others: FakeNameServer) -> Any:
        d = registration.stopService()
        self.settle(self.ns, *others)
        return d


class TopicChangeTests(SynchronousTestCase):
    """
    L{NameServerRegistration.topics_changed}: a round at once, one per
    reactor turn however many changes it had.
    """

    setUp = RegistrationTests.setUp
    registration = RegistrationTests.registration
    settle = RegistrationTests.settle

    def test_burst_is_one_round(self) -> None:
        other = FakeNameServer(self.clock)
        registration = self.registration(
            servers=[self.ns.client_endpoint(self.clock), other.client_endpoint(self.clock)]
        )
        registration.topics_changed()  # (not running: nothing)
        registration.startService()
        self.addCleanup(registration.stopService)
        self.settle(self.ns, other)
        self.clock.advance(5)
        for name in ("A", "B", "C"):
            self.metadata.update_topic(TopicConfig(name, 2, 2), persist=False)
            registration.topics_changed()
        self.settle(self.ns, other)
        for ns in (self.ns, other):
            self.assertEqual(len(ns.registrations), 2)
            self.assertTrue(ns.registrations[-1].body.topics.data_version.same(self.metadata.topics_version))
            self.assertEqual(ns.topic_names(), {"TopicTest", "A", "B", "C"})
        self.assertEqual(registration.topic_rounds, 1)
        # The period is not moved: the next round is 30 s after the start.
        self.clock.advance(25)
        self.settle(self.ns, other)
        self.assertEqual(len(self.ns.registrations), 3)

    def test_stopped_before_the_turn(self) -> None:
        registration = self.registration()
        registration.startService()
        self.settle()
        registration.topics_changed()
        registration.stopService()
        self.settle()
        self.assertEqual((len(self.ns.registrations), registration.topic_rounds), (1, 0))
        self.assertEqual(self.clock.getDelayedCalls(), [])


class BrokerTopicRegistrationTests(SynchronousTestCase):
    """
    A master Broker with --namesrv registers at once when its topic table
    changes (UPDATE_AND_CREATE_TOPIC on its remoting port, any update of
    its metadata); a slave does not (a NameServer takes topics only from
    brokerId 0).  /status and /metrics show the registration.
    """

    setUp = BrokerRegistrationTests.setUp
    broker = BrokerRegistrationTests.broker
    settle = BrokerRegistrationTests.settle

    def test_create_topic_registers_at_once(self) -> None:
        from rmqha.ha.config import Role
        from rmqha.remoting.codes import ResponseCode
        from tests.test_remoting_broker import _CREATE, _Connection

        master = self.broker("10.0.0.1", listen="tcp:20911")
        self.addCleanup(master.stopService)
        self.assertEqual(len(self.ns.registrations), 1)
        (factory,) = [f for _, f, *_ in self.clock.tcpServers if getattr(f, "name", None) == "remoting"]
        self.clock.advance(3)
        connection = _Connection(factory)
        for queues in ("4", "8"):
            answer = connection.ask(RequestCode.UPDATE_AND_CREATE_TOPIC, {**_CREATE, "writeQueueNums": queues})
            self.assertEqual(answer.code, ResponseCode.SUCCESS)
        master.metadata.update_topic(TopicConfig("Payments", 2, 2))
        self.settle()
        self.assertEqual(len(self.ns.registrations), 2)
        taken = self.ns.registrations[-1].body.topics
        self.assertTrue(taken.data_version.same(master.metadata.topics_version))
        self.assertEqual(taken.topics["Orders"].write_queue_nums, 8)
        self.assertEqual(self.ns.topic_queues["Orders"]["broker-a"].write_queue_nums, 8)
        self.assertIn("Payments", self.ns.topic_names())
        # A slave's topic change registers nothing before its period.
        slave = self.broker("10.0.0.2", role=Role.SLAVE, broker_id=1)
        self.addCleanup(slave.stopService)
        before = len(self.ns.registrations)
        slave.metadata.update_topic(TopicConfig("Local", 1, 1))
        self.settle()
        self.assertEqual(len(self.ns.registrations), before)

    def test_status_and_metrics(self) -> None:
        import json

        from rmqha.admin import AdminRoot
        from rmqha.ha.config import Role
        from tests.test_admin import request

        self.clock.advance(1_700_000_000)
        self.broker("10.0.0.1")
        slave = self.broker("10.0.0.2", role=Role.SLAVE, broker_id=1)
        self.addCleanup(slave.stopService)
        self.clock.advance(7)
        root = AdminRoot(slave)
        (shown,) = json.loads(request(root, b"GET", b"/status")[1])["namesrv"]
        del shown["namesrv"]  # (the in-memory endpoint's repr)
        self.assertEqual(
            shown,
            {
                "registered": True, "broker_id": 1, "last_success": 1_700_000_000.0,
                "last_success_age_seconds": 7.0, "master_addr": "10.0.0.1:10911",
                "ha_server_addr": "10.0.0.1:10912", "last_error": None, "last_error_at": None,
                # (Its first round, and again as it became the named master's slave.)
                "registrations": 2, "failures": 0,
            },
        )
        from tests.test_monitoring import scrape

        samples = {(n, dict(labels).get("master_addr")): v for (n, labels), v in scrape(root).items()
                   if n.startswith("rmqha_namesrv_")}
        self.assertEqual(
            samples,
            {
                ("rmqha_namesrv_registered", None): 1.0,
                ("rmqha_namesrv_registration_last_success_timestamp_seconds", None): 1_700_000_000.0,
                ("rmqha_namesrv_registration_last_success_age_seconds", None): 7.0,
                ("rmqha_namesrv_registrations_total", None): 2.0,
                ("rmqha_namesrv_registration_failures_total", None): 0.0,
                ("rmqha_namesrv_registration_info", "10.0.0.1:10911"): 1.0,
            },
        )
        # A broker without --namesrv shows none.
        self.assertNotIn("namesrv", json.loads(request(AdminRoot(self.broker_without()), b"GET", b"/status")[1]))

    def broker_without(self) -> Any:
        from twisted.internet.defer import succeed

        from rmqha.broker import Broker
        from rmqha.settings import BrokerSettings
        from rmqha.store.commitlog import CommitLog
        from tests._helpers import fixed_clock

        store = self.mktemp()
        broker = Broker(
            BrokerSettings(ha_listen="tcp:10912", scrub_rate=0),
            reactor=self.clock,
            open_commitlog=lambda: CommitLog.open(store, segment_size=64 * 1024, clock=fixed_clock),
            run_in_thread=lambda f: succeed(f()),
            fd_limit=lambda: 4096,
        )
        broker.startService()
        self.addCleanup(broker.stopService)
        return broker


class TopicListenerTests(SynchronousTestCase):
    """
    L{BrokerMetadata.topic_listeners} hear every change of the topic
    table, with its data version: what the broker registers at once on.
    """

    def test_every_change(self) -> None:
        from rmqha.remoting.metadata import SubscriptionGroupConfig, builtin_topics

        clock = Clock()
        metadata = BrokerMetadata(self.mktemp(), clock)
        heard: list[Any] = []
        metadata.topic_listeners.append(heard.append)
        metadata.update_topic(TopicConfig("A"), persist=False)
        self.assertEqual(heard, [metadata.topics_version])
        metadata.delete_topic("A", persist=False)
        metadata.delete_topic("A", persist=False)  # (unknown: no change)
        metadata.update_group(SubscriptionGroupConfig("G"), persist=False)  # (not a topic)
        self.assertEqual(len(heard), 2)
        metadata.add_builtins(builtin_topics("C", "b"), {})
        metadata.add_builtins(builtin_topics("C", "b"), {})  # (nothing new)
        self.assertEqual(len(heard), 3)
        master = BrokerMetadata(self.mktemp(), clock)
        clock.advance(1)
        master.update_topic(TopicConfig("M"), persist=False)
        self.assertTrue(metadata.apply_master_topics(master.encode(MetadataFile.TOPICS)))
        self.assertEqual(heard[-1], master.topics_version)
        self.assertEqual(len(heard), 4)
