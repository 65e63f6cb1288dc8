"""
What a broker writes to its log: the admin access log (off unless asked
for), the start-up line, and the log file rotated by size
(L{rmqha.logfile}, C{twistd rmqha --log-file}).
"""

from __future__ import annotations

import os
import signal
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.endpoints import SSL4ServerEndpoint
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.logger import LogPublisher, Logger, formatEvent, globalLogPublisher
from twisted.python.failure import Failure
from twisted.python.usage import UsageError
from twisted.scripts._twistd_unix import ServerOptions
from twisted.trial.unittest import SynchronousTestCase

from rmqha import logfile
from rmqha.admin import AdminService, make_site
from rmqha.admin.channel import AdminSite
from rmqha.broker import Broker
from rmqha.ha.config import Role
from rmqha.logfile import (
    TWISTD_LOGGER,
    LogFileSettings,
    file_observer,
    open_log_file,
    rotate_on_usr1,
    twistd_observer,
)
from rmqha.settings import BrokerSettings, SettingsError
from rmqha.store.commitlog import CommitLog
from rmqha.tap import Options

from tests._helpers import fixed_clock


def captured(case: SynchronousTestCase) -> list[str]:
    """
    Every event logged from now until the test ends, formatted.
    """
    events: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(events.append)
    case.addCleanup(globalLogPublisher.removeObserver, events.append)
    return _Formatted(events)


class _Formatted(list[str]):
    """
    The formatted lines of a list of events that is still growing.
    """

    def __init__(self, events: list[dict[str, Any]]) -> None:
        super().__init__()
        self._events = events

    def __iter__(self) -> Any:
        return iter([formatEvent(e) for e in self._events])


def started_broker(
    case: SynchronousTestCase,
    settings: BrokerSettings,
    http: str | None = None,
    reactor: MemoryReactorClock | None = None,
) -> Broker:
    """
    A broker of C{settings} on a memory reactor, started (and stopped at
    the end of the test); with an admin port on C{http}.
    """
    reactor = reactor or MemoryReactorClock()
    store = os.path.abspath(case.mktemp())
    broker = Broker(
        settings,
        reactor=reactor,
        open_commitlog=lambda: CommitLog.open(store, segment_size=64 * 1024, clock=fixed_clock),
        fd_limit=lambda: 4096,
    )
    if http is not None:
        AdminService(broker, http).setServiceParent(broker)
    broker.startService()
    case.addCleanup(broker.stopService)
    return broker


class AccessLogTests(SynchronousTestCase):
    """
    The admin site writes no access log unless given a file
    (C{--access-log FILE}), rotated as the broker's log file.
    """

    def serve(self, **kwargs: Any) -> tuple[list[str], int]:
        """
        Start the admin site of a master (as its port does), answer one
        C{GET /status}, stop it: the log lines meanwhile, and how many
        timers the site kept before any connection.
        """
        broker = started_broker(self, BrokerSettings(role=Role.MASTER, ha_listen="tcp:0"))
        clock = Clock()
        site = make_site(broker, reactor=clock, **kwargs)
        lines = captured(self)
        site.doStart()
        timers = len(clock.getDelayedCalls())
        channel = site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000))
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 40000))
        channel.makeConnection(transport)
        channel.dataReceived(b"GET /status HTTP/1.1\r\nHost: x\r\nUser-Agent: probe/1\r\n\r\n")
        self.assertIn(b"200 OK", transport.value())
        channel.connectionLost(Failure(ConnectionDone()))
        site.doStop()
        self.assertEqual(clock.getDelayedCalls(), [])
        return list(lines), timers

    def test_off_by_default(self) -> None:
        """
        By default a request leaves no line in the log, and the site keeps
        no once-a-second timer for access-log timestamps.
        """
        broker = started_broker(self, BrokerSettings(role=Role.MASTER, ha_listen="tcp:0"))
        self.assertIsNone(make_site(broker, reactor=Clock()).access_log)
        lines, timers = self.serve()
        self.assertEqual([line for line in lines if "/status" in line], [])
        self.assertEqual(timers, 0)

    def test_to_its_file(self) -> None:
        """
        With C{access_log=FILE} each request is one line in Combined Log
        Format in FILE (client, request line, status, user agent), none in
        the broker's log; FILE rotates at 10 MiB keeping 10 files, and on
        SIGUSR1 with the other files rotated then, until the site stops.
        """
        self.addCleanup(signal.signal, signal.SIGUSR1, signal.getsignal(signal.SIGUSR1))
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        path = os.path.join(directory, "access.log")
        opened: list[Any] = []
        real_open = AdminSite._openLogFile

        def spy(site: Any, where: str) -> Any:
            opened.append(real_open(site, where))
            return opened[-1]

        self.patch(AdminSite, "_openLogFile", spy)
        lines, timers = self.serve(access_log=path)
        self.assertEqual([line for line in lines if "/status" in line], [])
        with open(path) as f:
            (line,) = f.read().splitlines()
        self.assertIn('"127.0.0.1" - - [', line)
        self.assertIn('"GET /status HTTP/1.1" 200', line)
        self.assertIn('"probe/1"', line)
        self.assertEqual(timers, 1)  # (Twisted's cached timestamp)
        (log_file,) = opened
        self.assertEqual((log_file.rotateLength, log_file.maxRotatedFiles), (10 * 1024 * 1024, 10))
        self.assertTrue(log_file.closed)
        # Stopped: SIGUSR1 rotates it no more (the handler is gone with it).
        self.assertEqual(signal.getsignal(signal.SIGUSR1), signal.SIG_DFL)

    def test_usr1_rotates_it(self) -> None:
        """
        While the site runs, SIGUSR1 rotates the access log to FILE.1 (and
        the broker's log file too, when there is one).
        """
        self.addCleanup(signal.signal, signal.SIGUSR1, signal.getsignal(signal.SIGUSR1))
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        main = open_log_file(LogFileSettings(os.path.join(directory, "b.log"), 1024, 2))
        self.addCleanup(main.close)
        calls: list[Any] = []
        rotate_on_usr1(main, calls.append)
        broker = started_broker(self, BrokerSettings(role=Role.MASTER, ha_listen="tcp:0"))
        path = os.path.join(directory, "access.log")
        site = make_site(broker, reactor=Clock(), access_log=path)
        site.doStart()
        self.addCleanup(site.doStop)
        site.logFile.write("a request\n")
        os.kill(os.getpid(), signal.SIGUSR1)
        self.assertEqual(calls, [main.rotate])
        self.assertEqual(sorted(os.listdir(directory)), ["access.log", "access.log.1", "b.log"])
        self.assertEqual(os.path.getsize(path), 0)
        self.assertGreater(os.path.getsize(path + ".1"), 0)

    def test_setting(self) -> None:
        """
        C{--access-log FILE} (broker.conf C{accessLog=FILE}) gives the
        admin port twistd builds its access log (an absolute path; the file
        made at once); it needs C{--http}; a file that cannot be opened is
        one line naming the flag.
        """
        from rmqha.tap import makeService

        store = self.mktemp()
        path = os.path.abspath(self.mktemp())
        options = Options()
        options.parseOptions(
            ["--store-dir", store, "--http", "tcp:0:interface=127.0.0.1", "--access-log", path]
        )
        self.assertEqual(options.settings.access_log, path)
        self.assertTrue(os.path.isfile(path))
        broker = makeService(options)
        self.assertEqual(broker.getServiceNamed("http").access_log, path)  # type: ignore[attr-defined]
        options = Options()
        options.parseOptions(["--store-dir", store, "--http", "tcp:0:interface=127.0.0.1"])
        self.assertIsNone(makeService(options).getServiceNamed("http").access_log)  # type: ignore[attr-defined]
        self.assertEqual(
            BrokerSettings.from_sources(conf={"accessLog": "a.log", "storePathRootDir": store,
                                              "haListenPort": "0"}, flags={"http": "8080"}).access_log,
            os.path.abspath("a.log"),
        )
        e = self.assertRaises(SettingsError, BrokerSettings, access_log="/tmp/a.log")
        self.assertEqual(str(e), "--access-log (accessLog) needs --http")
        e = self.assertRaises(
            UsageError, Options().parseOptions,
            ["--store-dir", store, "--http", "8080", "--access-log", "/nonexistent/a.log"],
        )
        self.assertEqual(str(e), "--access-log /nonexistent/a.log: No such file or directory")


class StartupLineTests(SynchronousTestCase):
    """
    A started broker logs one line saying what it is and where.
    """

    def line(self, settings: BrokerSettings, http: str | None = None) -> tuple[str, Broker]:
        lines = captured(self)
        broker = started_broker(self, settings, http)
        (line,) = [line for line in lines if " started: " in line]
        return line, broker

    def test_master(self) -> None:
        """
        A master's line: version, role, store and commit-log paths with the
        segment size, every port as bound, the in-sync settings, and no
        coordinator.
        """
        line, broker = self.line(
            BrokerSettings(
                role=Role.SYNC_MASTER,
                ha_listen="tcp:10912",
                in_sync_replicas=3,
                min_in_sync_replicas=2,
                slave_timeout=2.5,
            ),
            http="tcp:8080:interface=127.0.0.1",
        )
        log = broker.commitlog
        self.assertTrue(line.startswith("rmqha 0."), line)
        self.assertIn("started: role SYNC_MASTER;", line)
        self.assertIn(f"store {log.store_dir} (commit log {log.commitlog_dir}, 65536-byte segments, "
                      "ASYNC_FLUSH);", line)
        self.assertIn("listening on HA 0.0.0.0:10912, HTTP 0.0.0.0:8080; open-files limit 4096;",
                      line)
        self.assertIn("in-sync replicas 3 (min 2), slave timeout 2500 ms, "
                      "fall-behind max 268435456 bytes, busy poll 200 us;", line)
        self.assertTrue(line.endswith("coordinator: none (fixed role)"), line)
        # Reading the ports left them stoppable (their Deferreds unchanged).
        self.successResultOf(broker.stopService())

    def test_tls_port(self) -> None:
        """
        A port serving TLS is marked so.
        """
        reactor = MemoryReactorClock()
        lines = captured(self)
        started_broker(
            self,
            BrokerSettings(role=Role.MASTER, ha_listen=SSL4ServerEndpoint(reactor, 10912, None)),
            reactor=reactor,
        )
        (line,) = [line for line in lines if " started: " in line]
        self.assertIn("listening on HA 0.0.0.0:10912 (TLS); open-files limit 4096;", line)

    def test_slave(self) -> None:
        """
        A slave's line names its master and lists no HA port.
        """
        line, _ = self.line(
            BrokerSettings(role=Role.SLAVE, master_endpoint="tcp:host=10.0.0.5:port=10912")
        )
        self.assertIn("started: role SLAVE of tcp:host=10.0.0.5:port=10912;", line)
        self.assertIn("listening on no port; open-files limit 4096;", line)

    def test_failover(self) -> None:
        """
        A failover node's line names its node, group, role once elected,
        the HA port it holds, and the coordinator's endpoints and lease --
        never its user or password file.
        """
        line, _ = self.line(
            BrokerSettings(
                coordinator="etcd:http://10.0.0.1:2379,http://10.0.0.2:2379,user=rmqha,"
                "passwordFile=/etc/rmqha/etcd.pw",
                group="broker-a",
                node_id="a",
                advertise="10.0.0.9:10912",
                ha_listen="tcp:10912",
                role=Role.SYNC_MASTER,
                min_in_sync_replicas=2,
                insecure_group=True,
            )
        )
        self.assertIn(
            "started: node a of group broker-a (advertising HA 10.0.0.9:10912), elected by "
            "the coordinator: starts as a slave, SYNC_MASTER once elected;", line
        )
        self.assertIn("listening on HA 0.0.0.0:10912", line)
        self.assertIn("in-sync replicas 2 (min 2)", line)
        self.assertTrue(
            line.endswith("coordinator: etcd:http://10.0.0.1:2379,http://10.0.0.2:2379, lease 2 s"),
            line,
        )
        self.assertNotIn("etcd.pw", line)
        self.assertNotIn("rmqha,", line)


class LogFileTests(SynchronousTestCase):
    """
    C{--log-file}: Twisted's L{LogFile}, rotated at the configured size,
    keeping the configured number of rotated files.
    """

    def setUp(self) -> None:
        self.addCleanup(logfile._handed.clear)
        os.makedirs(self.mktemp())
        self.dir = os.path.abspath(self.mktemp())
        os.makedirs(self.dir)
        self.path = os.path.join(self.dir, "broker.log")

    def test_rotates_at_size_keeps_n(self) -> None:
        """
        Past the rotate size the file moves to FILE.1 (FILE.1 to FILE.2...)
        and a new one starts; no more than C{keep} rotated files remain,
        each about the rotate size (a line may pass it).
        """
        log_file = open_log_file(LogFileSettings(self.path, 1024, 2))
        self.addCleanup(log_file.close)
        publisher = LogPublisher(file_observer(log_file))
        log = Logger(observer=publisher, namespace="test")
        line = "x" * 60
        for n in range(100):  # some 100 lines of 100 bytes: 10 KiB
            log.info("{n:03d} {line}", n=n, line=line)
        log_file.flush()
        names = sorted(os.listdir(self.dir))
        self.assertEqual(names, ["broker.log", "broker.log.1", "broker.log.2"])
        for name in names[1:]:
            size = os.path.getsize(os.path.join(self.dir, name))
            self.assertTrue(1024 <= size < 1024 + 200, (name, size))
        self.assertLess(os.path.getsize(self.path), 1024 + 200)
        with open(self.path) as f:
            self.assertIn("099 " + line, f.read())
        with open(self.path + ".2") as f:
            self.assertNotIn("] 000 ", f.read())  # the oldest lines are gone

    def test_options(self) -> None:
        """
        C{--log-file}, C{--log-rotate-size} and C{--log-keep} make the
        log file (defaults: 10 MiB, 10 files); bad values are one line
        naming the flag.
        """
        store = self.mktemp()
        options = Options()
        options.parseOptions(["--store-dir", store, "--log-file", self.path,
                              "--log-rotate-size", "1k", "--log-keep", "3"])
        self.addCleanup(options.log_file.close)
        self.assertEqual((options.log_file.path, options.log_file.rotateLength,
                          options.log_file.maxRotatedFiles), (self.path, 1024, 3))
        options = Options()
        options.parseOptions(["--store-dir", store, "--log-file", self.path])
        self.addCleanup(options.log_file.close)
        self.assertEqual((options.log_file.rotateLength, options.log_file.maxRotatedFiles),
                         (10 * 1024 * 1024, 10))
        options = Options()
        options.parseOptions(["--store-dir", store])
        self.assertIsNone(options.log_file)
        for argv, error in [
            (["--log-keep", "3"], "--log-keep needs --log-file"),
            (["--log-file", self.path, "--log-keep", "0"], "--log-keep 0 must be 1 or more"),
            (["--log-file", self.path, "--log-keep", "x"], "--log-keep 'x' is not a number of files"),
            (["--log-file", self.path, "--log-rotate-size", "100"],
             "--log-rotate-size 100 is below the minimum of 1024 bytes"),
            (["--log-file", "/nonexistent/dir/broker.log"],
             "--log-file /nonexistent/dir/broker.log: No such file or directory"),
        ]:
            e = self.assertRaises(UsageError, Options().parseOptions, ["--store-dir", store, *argv])
            self.assertEqual(str(e), error)

    def test_twistd_logs_to_it(self) -> None:
        """
        Under twistd, C{--log-file} becomes twistd's log observer (its
        C{--logger}, resolved by twistd's own option parsing); twistd's
        C{--logfile} with it is refused before the file is made.
        """
        store = self.mktemp()
        config = ServerOptions()
        config.parseOptions(["-n", "rmqha", "--store-dir", store, "--log-file", self.path])
        self.addCleanup(config.subOptions.log_file.close)
        self.assertIs(config["logger"], twistd_observer)
        self.addCleanup(signal.signal, signal.SIGUSR1, signal.getsignal(signal.SIGUSR1))
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        observer = config["logger"]()
        self.assertNotEqual(signal.getsignal(signal.SIGUSR1), signal.SIG_DFL)
        Logger(observer=observer).info("hello {who}", who="operator")
        config.subOptions.log_file.flush()
        with open(self.path) as f:
            self.assertIn("hello operator", f.read())
        other = os.path.join(self.dir, "other.log")
        config = ServerOptions()
        e = self.assertRaises(
            SystemExit, config.parseOptions,
            ["-n", "--logfile", "t.log", "rmqha", "--store-dir", store, "--log-file", other],
        )
        self.assertIn("--log-file and twistd's --logfile both say where to log: give one", str(e))
        self.assertFalse(os.path.exists(other))
        self.assertEqual(TWISTD_LOGGER, "rmqha.logfile.twistd_observer")

    def test_usr1_rotates(self) -> None:
        """
        SIGUSR1 rotates the log file at once (outside the signal handler),
        as twistd's own; a handler already there is left alone.
        """
        self.addCleanup(signal.signal, signal.SIGUSR1, signal.getsignal(signal.SIGUSR1))
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        log_file = open_log_file(LogFileSettings(self.path, 1024 * 1024, 3))
        self.addCleanup(log_file.close)
        log_file.write("before\n")
        calls: list[Any] = []
        rotate_on_usr1(log_file, calls.append)
        os.kill(os.getpid(), signal.SIGUSR1)
        self.assertEqual(calls, [log_file.rotate])
        calls[0]()
        log_file.write("after\n")
        log_file.flush()
        with open(self.path + ".1") as f:
            self.assertEqual(f.read(), "before\n")
        with open(self.path) as f:
            self.assertEqual(f.read(), "after\n")
        mine = signal.getsignal(signal.SIGUSR1)
        rotate_on_usr1(log_file, calls.append)
        self.assertIs(signal.getsignal(signal.SIGUSR1), mine)
