"""
Tests for the twistd plugin and L{rmqha.tap}.
"""

from __future__ import annotations

import os

from twisted.application.service import IServiceMaker
from twisted.plugin import getPlugins
from twisted.python.usage import UsageError
from twisted.trial.unittest import SynchronousTestCase

from rmqha.store._segments import FlushDiskType
from rmqha.admin import AdminService
from rmqha.broker import Broker, Role
from rmqha.settings import BrokerSettings
from rmqha.tap import Options, makeService


class PluginTests(SynchronousTestCase):
    """
    twistd finds the C{rmqha} plugin.
    """

    def test_discovered(self) -> None:
        """
        C{getPlugins(IServiceMaker)} (what C{twistd} uses) yields a maker
        named C{rmqha} whose options are L{rmqha.tap.Options}.
        """
        makers = {m.tapname: m for m in getPlugins(IServiceMaker)}
        self.assertIn("rmqha", makers)
        self.assertIs(makers["rmqha"].options, Options)


class OptionsTests(SynchronousTestCase):
    """
    L{Options} resolves RocketMQ defaults, then broker.conf, then flags, and
    names the bad value's source.
    """

    def setUp(self) -> None:
        # (The group secret's environment variable of whoever runs the tests.)
        environ = {k: v for k, v in os.environ.items() if k != "RMQHA_GROUP_SECRET_FILE"}
        self.patch(os, "environ", environ)

    def parse(self, *argv: str) -> Options:
        options = Options()
        options.parseOptions(list(argv))
        return options

    def conf(self, text: str) -> str:
        path = self.mktemp()
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_defaults(self) -> None:
        """
        Only C{--store-dir} is needed: an ASYNC_FLUSH master on tcp:10912
        with RocketMQ's HA defaults.
        """
        s = self.parse("--store-dir", "s").settings
        self.assertEqual(s.role, Role.MASTER)
        self.assertEqual(s.flush_disk_type, FlushDiskType.ASYNC_FLUSH)
        self.assertEqual(s.flush_interval, 0.5)
        self.assertIsNone(s.store_host)
        self.assertEqual(s.ha_listen, "tcp:10912")
        config = self.parse("--store-dir", "s").settings.ha_config
        self.assertEqual(
            (config.transfer_batch_size, config.heartbeat_interval,
             config.housekeeping_interval, config.sync_from_last_file),
            (32768, 5.0, 20.0, False),
        )

    def test_values(self) -> None:
        """
        Sizes take suffixes, names are case-insensitive, an IPv6 host is
        written C{[addr]:port}, intervals are milliseconds.
        """
        s = self.parse(
            "--store-dir", "s", "--segment-size", "64m",
            "--flush-disk-type", "sync_flush", "--flush-interval", "200",
            "--store-host", "[::1]:10911", "--role", "slave",
            "--master", "10.1.2.3:10912", "--batch-size", "64k",
            "--heartbeat-interval", "1000", "--sync-from-last-file",
        ).settings
        self.assertEqual(s.segment_size, 64 << 20)
        self.assertEqual(s.flush_disk_type, FlushDiskType.SYNC_FLUSH)
        self.assertEqual(s.flush_interval, 0.2)
        self.assertEqual(s.store_host, ("::1", 10911))
        self.assertEqual(s.role, Role.SLAVE)
        self.assertEqual(s.master, "tcp:host=10.1.2.3:port=10912")
        self.assertEqual(s.batch_size, 65536)
        self.assertEqual(s.heartbeat_interval, 1.0)
        self.assertTrue(s.sync_from_last_file)

    def test_broker_conf(self) -> None:
        """
        RocketMQ broker.conf keys are read (comments, spacing and ':' as in
        Java properties files); flags override them.
        """
        path = self.conf(
            "# a RocketMQ broker.conf\n"
            "brokerClusterName = DefaultCluster\n"
            "brokerRole=SLAVE\n"
            "haMasterAddress : 192.0.2.1:10912\n"
            "storePathRootDir=/data/store\n"
            "mappedFileSizeCommitLog=1073741824\n"
            "flushDiskType=SYNC_FLUSH\n"
            "haSendHeartbeatInterval=2000\n"
            "haHousekeepingInterval=8000\n"
            "haTransferBatchSize=65536\n"
            "syncFromLastFile=true\n"
            "! another comment\n"
        )
        s = self.parse("--config", path, "--flush-disk-type", "ASYNC_FLUSH").settings
        self.assertEqual(s.role, Role.SLAVE)
        self.assertEqual(s.master, "tcp:host=192.0.2.1:port=10912")
        self.assertEqual(s.store_dir, "/data/store")
        self.assertEqual(s.segment_size, 1 << 30)
        self.assertEqual(s.flush_disk_type, FlushDiskType.ASYNC_FLUSH)
        self.assertEqual((s.heartbeat_interval, s.housekeeping_interval), (2.0, 8.0))
        self.assertEqual(s.batch_size, 65536)
        self.assertTrue(s.sync_from_last_file)

    def test_ha_listen_port_honoured(self) -> None:
        """
        haListenPort is used (4.9 overwrites it with listenPort + 1,
        RocketMQ #6537).
        """
        path = self.conf("storePathRootDir=s\nhaListenPort=20912\n")
        self.assertEqual(self.parse("--config", path).settings.ha_listen, "tcp:20912")

    def test_errors_name_the_source(self) -> None:
        """
        Each bad value is a L{UsageError} naming its flag, or its
        broker.conf key.
        """
        flag_cases = [
            ((), "--store-dir"),
            (("--segment-size", "12q"), "--segment-size"),
            (("--segment-size", "10"), "--segment-size"),
            (("--flush-disk-type", "SOMETIMES"), "--flush-disk-type"),
            (("--flush-interval", "0"), "--flush-interval"),
            (("--store-host", "nohost"), "--store-host"),
            (("--role", "boss"), "--role"),
            (("--in-sync-replicas", "0"), "--in-sync-replicas"),
            (("--min-in-sync-replicas", "3"), "--min-in-sync-replicas"),
            (("--role", "slave"), "--master"),
            (("--role", "slave", "--master", "nohost"), "--master"),
            (("--batch-size", "5m"), "haTransferBatchSize"),
            (("--on-divergence", "panic"), "--on-divergence"),
            (("--probe-timeout", "0"), "--probe-timeout"),
        ]
        for extra, needle in flag_cases:
            argv = extra if extra == () else ("--store-dir", "s", *extra)
            e = self.assertRaises(UsageError, self.parse, *argv)
            self.assertIn(needle, str(e), argv)
        for line, key in [
            ("brokerRole=BOSS", "brokerRole"),
            ("haSendHeartbeatInterval=-5", "haSendHeartbeatInterval"),
            ("haTransferBatchSize=0", "haTransferBatchSize"),
            ("syncFromLastFile=yes", "syncFromLastFile"),
            ("mappedFileSizeCommitLog=100", "mappedFileSizeCommitLog"),
            ("haSlaveFallbehindMax=lots", "haSlaveFallbehindMax"),
            ("slaveTimeout=0", "slaveTimeout"),
            ("haOnDivergence=panic", "haOnDivergence"),
            ("haProbeTimeout=soon", "haProbeTimeout"),
        ]:
            path = self.conf(f"storePathRootDir=s\n{line}\n")
            e = self.assertRaises(UsageError, self.parse, "--config", path)
            self.assertIn(key, str(e), line)
        e = self.assertRaises(UsageError, self.parse, "--config", self.mktemp())
        self.assertIn("--config", str(e))

    def test_make_service(self) -> None:
        """
        The service tree is a L{Broker} with the chosen role, whose store
        is not touched until started.
        """
        store = self.mktemp()
        service = makeService(self.parse("--store-dir", store, "--role", "slave",
                                         "--master", "127.0.0.1:10912"))
        self.assertIsInstance(service, Broker)
        self.assertEqual(service.role, Role.SLAVE)
        self.assertEqual(service.settings.probe_timeout, 3.0)
        service = makeService(self.parse("--store-dir", store, "--role", "slave",
                                         "--master", "127.0.0.1:10912", "--probe-timeout", "500"))
        self.assertEqual(service.settings.probe_timeout, 0.5)
        self.assertIsNone(service.store.commitlog)
        self.assertFalse(os.path.exists(store))

    def test_failover(self) -> None:
        """
        With --coordinator: the node's identity is required, --role is the
        role once elected (default SYNC_MASTER, minInSyncReplicas 2), no
        fixed master; broker.conf keys work; the service is the broker
        and its coordinator under one parent, the broker standing by.
        """
        from rmqha.coord.node import Coordinator

        base = (
            "--store-dir", "s", "--coordinator", "etcd:http://127.0.0.1:2379",
            "--group", "g", "--node-id", "a", "--advertise", "127.0.0.1:10912",
            "--insecure-group",
        )
        s = self.parse(*base).settings
        self.assertEqual((s.role, s.min_in_sync_replicas, s.lease_ttl),
                         (Role.SYNC_MASTER, 2, 2))
        s = self.parse(*base, "--role", "master", "--lease-ttl", "5").settings
        self.assertEqual((s.role, s.min_in_sync_replicas, s.lease_ttl),
                         (Role.ASYNC_MASTER, 1, 5))
        path = self.conf(
            "storePathRootDir=s\ncoordinator=etcd:http://127.0.0.1:2379\nbrokerName=g\n"
            "nodeId=b\nadvertise=h:1\nleaseTtl=3\nallowUncleanElection=true\n"
            "insecureGroup=true\n"
        )
        s = self.parse("--config", path).settings
        self.assertEqual((s.node_id, s.advertise, s.lease_ttl, s.allow_unclean_election),
                         ("b", "h:1", 3, True))
        for extra, needle in [
            (("--role", "slave"), "once elected"),
            (("--master", "127.0.0.1:1"), "--master: with --coordinator"),
            (("--lease-ttl", "1"), "--lease-ttl"),
            (("--advertise", "127.0.0.1:0"), "--advertise"),
            (("--http", "tcp:0"), "--advertise-http"),
            (("--tls-cert", "x.pem"), "--tls-ca"),
        ]:
            e = self.assertRaises(UsageError, self.parse, *base, *extra)
            self.assertIn(needle, str(e), extra)
        for missing in ("--group", "--node-id", "--advertise"):
            argv = list(base)
            i = argv.index(missing)
            del argv[i : i + 2]
            e = self.assertRaises(UsageError, self.parse, *argv)
            self.assertIn(missing, str(e))
        e = self.assertRaises(
            UsageError, self.parse, "--store-dir", "s", "--coordinator", "zk:h:1"
        )
        self.assertIn("--coordinator", str(e))
        store = self.mktemp()
        service = makeService(
            self.parse(
                *base[2:], "--store-dir", store,
                "--http", "tcp:0", "--advertise-http", "127.0.0.1:8080",
            )
        )
        broker, coordinator = list(service)  # type: ignore[call-overload]
        self.assertIsInstance(broker, Broker)
        self.assertIsInstance(coordinator, Coordinator)
        self.assertEqual(broker.role, Role.SLAVE)
        # (The admin interface, composed into the broker, shows it.)
        self.assertIs(broker.getServiceNamed("http").failover, coordinator)
        self.assertIsNotNone(broker.role_services.epochs)
        self.assertEqual(coordinator.settings.node_id, "a")

    def test_failover_unreadable_password_file(self) -> None:
        """
        A coordinator password file that cannot be read stops twistd with
        one line naming the option, before anything is started.
        """
        from rmqha.tap import Fatal

        spec = "etcd:https://127.0.0.1:2379,user=node-a,passwordFile=/nonexistent/etcd.password"
        options = self.parse(
            "--store-dir", self.mktemp(), "--coordinator", spec,
            "--group", "g", "--node-id", "a", "--advertise", "127.0.0.1:10912", "--insecure-group",
        )
        e = self.assertRaises(Fatal, makeService, options)
        self.assertEqual(
            str(e),
            "twistd rmqha: --coordinator: passwordFile /nonexistent/etcd.password: "
            "No such file or directory",
        )

    def test_connection_limits(self) -> None:
        """
        --max-connections and --max-connections-per-peer (broker.conf
        maxConnections, maxConnectionsPerPeer) reach the broker; a value
        below 1 is an error naming its source.
        """
        store = self.mktemp()
        service = makeService(self.parse("--store-dir", store))
        self.assertEqual(
            (service.settings.max_connections, service.settings.max_connections_per_peer),
            (256, 16),
        )
        path = self.conf("storePathRootDir=s\nmaxConnectionsPerPeer=4\n")
        service = makeService(self.parse("--config", path, "--max-connections", "100"))
        s = service.settings
        self.assertEqual((s.max_connections, s.max_connections_per_peer), (100, 4))
        e = self.assertRaises(UsageError, self.parse, "--store-dir", "s", "--max-connections", "0")
        self.assertIn("--max-connections", str(e))
        path = self.conf("storePathRootDir=s\nmaxConnectionsPerPeer=many\n")
        e = self.assertRaises(UsageError, self.parse, "--config", path)
        self.assertIn("maxConnectionsPerPeer", str(e))

    def test_store_error_is_one_line_exit(self) -> None:
        """
        A store that cannot be opened stops twistd with a one-line message
        naming the problem (SystemExit), not a traceback.
        """
        store = self.mktemp()
        os.makedirs(os.path.join(store, "commitlog"))
        with open(os.path.join(store, "commitlog", "junk"), "w"):
            pass
        # (A slave: it listens on nothing before opening its store.)
        service = makeService(self.parse("--store-dir", store, "--role", "slave",
                                         "--master", "127.0.0.1:10912"))
        e = self.assertRaises(SystemExit, service.startService)
        self.assertIn("cannot open the store", str(e.code))
        self.assertIn("junk", str(e.code))
        self.assertNotIn("\n", str(e.code))

    def _corrupt_store(self) -> tuple[str, int]:
        """
        A closed store of three records whose second has a flipped body
        byte (valid data after it); the bad record's offset.
        """
        from rmqha.store.commitlog import CommitLog
        from tests._helpers import make_message, segment_path, xor_byte

        store = self.mktemp()
        with CommitLog.open(store, segment_size=4096) as log:
            results = [log.put(make_message(b"x" * 100)) for _ in range(3)]
        xor_byte(segment_path(store, 0), results[1].offset + 150)
        return store, results[1].offset

    def test_corrupt_store_refused_one_line(self) -> None:
        """
        A store with a bad record followed by valid ones stops twistd with
        one line naming the offset and both ways out (repair, or
        --truncate-corrupt).
        """
        store, bad = self._corrupt_store()
        # (It listens before it opens the store: on a port of its own, not
        # the default one another test or broker may hold.)
        service = makeService(
            self.parse("--store-dir", store, "--ha-listen", "tcp:0:interface=127.0.0.1")
        )
        e = self.assertRaises(SystemExit, service.startService)
        self.assertNotIn("\n", str(e.code))
        self.assertIn(f"bad record at offset {bad}", str(e.code))
        self.assertIn("rmqha store repair", str(e.code))
        self.assertIn("--truncate-corrupt", str(e.code))

    def test_truncate_corrupt_flag(self) -> None:
        """
        C{--truncate-corrupt} opens the same store cut at the bad record
        (no broker.conf key: a one-off decision).
        """
        store, bad = self._corrupt_store()
        service = makeService(self.parse("--store-dir", store, "--truncate-corrupt"))
        log = service.store._open_commitlog()
        self.addCleanup(log.close)
        self.assertEqual(log.max_offset, bad)
        self.assertTrue(log.recovery.truncated_corrupt)


class ListenOptionsTests(SynchronousTestCase):
    """
    Where a broker listens, how a slave treats its master, and how twistd
    shows a bad command line.
    """

    def parse(self, *argv: str) -> Options:
        options = Options()
        options.parseOptions(["--store-dir", "s", *argv])
        return options

    def test_bare_ports(self) -> None:
        """
        A bare port (RocketMQ's haListenPort style) for --ha-listen and
        --http is tcp:PORT; a description is kept as given.
        """
        s = self.parse("--ha-listen", "10912", "--http", "8080").settings
        self.assertEqual((s.ha_listen, s.http), ("tcp:10912", "tcp:8080"))
        s = self.parse("--ha-listen", "tcp:0:interface=127.0.0.1").settings
        self.assertEqual(s.ha_listen, "tcp:0:interface=127.0.0.1")

    def test_bad_endpoints_name_the_flag(self) -> None:
        """
        A description Twisted cannot parse, or a port out of range, is a
        one-line usage error naming the flag (not a traceback at start).
        """
        for argv, needle in [
            (("--ha-listen", "foo:1"), "--ha-listen"),
            (("--ha-listen", "70000"), "--ha-listen"),
            (("--http", "tcp:eighty"), "--http"),
            (("--http", "8080x"), "--http"),
        ]:
            e = self.assertRaises(UsageError, self.parse, *argv)
            self.assertIn(needle, str(e), argv)
            self.assertNotIn("\n", str(e))

    def test_master_kind(self) -> None:
        """
        --master-kind (haMasterKind): auto by default, rmqha or rocketmq;
        anything else names the flag; the broker gets it.
        """
        slave = ("--role", "slave", "--master", "127.0.0.1:10912")
        self.assertEqual(self.parse(*slave).settings.master_kind, "auto")
        options = self.parse(*slave, "--master-kind", "RocketMQ")
        self.assertEqual(options.settings.master_kind, "rocketmq")
        self.assertEqual(makeService(options).settings.followed_kind, "rocketmq")  # type: ignore[attr-defined]
        path = self.mktemp()
        with open(path, "w") as f:
            f.write("haMasterKind=rmqha\n")
        self.assertEqual(
            self.parse(*slave, "--config", path).settings.master_kind, "rmqha"
        )
        e = self.assertRaises(UsageError, self.parse, *slave, "--master-kind", "java")
        self.assertIn("--master-kind", str(e))
        e = self.assertRaises(
            UsageError, self.parse, *slave, "--master-kind", "rmqha", "--on-divergence", "off"
        )
        self.assertIn("--on-divergence off", str(e))

    def twistd(self, *argv: str) -> tuple[SystemExit, str]:
        """
        Parse C{argv} as twistd does (its ServerOptions, our options as its
        subcommand), capturing what it prints.
        """
        import io
        import sys

        from twisted.scripts.twistd import ServerOptions

        out = io.StringIO()
        self.patch(sys, "stdout", out)
        e = self.assertRaises(SystemExit, ServerOptions().parseOptions, list(argv))
        return e, out.getvalue()

    def test_twistd_usage_error_is_one_line(self) -> None:
        """
        Under twistd, an unknown option or a bad value stops it with one
        line and a pointer to --help (twistd would print its whole usage
        and ours first); --help still prints the whole usage.
        """
        for argv, needle in [
            (("rmqha", "--bad"), "--bad"),
            (("rmqha", "--store-dir", "s", "--role", "boss"), "--role"),
            (("rmqha", "--store-dir", "s", "--ha-listen", "foo"), "--ha-listen"),
        ]:
            e, printed = self.twistd(*argv)
            self.assertEqual(printed, "")
            self.assertIsInstance(e.code, str)
            self.assertIn(needle, str(e.code))
            self.assertTrue(str(e.code).endswith("; see twistd rmqha --help"), e.code)
            self.assertNotIn("\n", str(e.code))
        e, printed = self.twistd("rmqha", "--help")
        self.assertEqual(e.code, 0)
        self.assertIn("--master-kind", printed)
        self.assertGreater(printed.count("\n"), 40)


class ListenFirstTests(SynchronousTestCase):
    """
    A broker listens before it opens its store.
    """

    def test_listen_failure_before_the_store(self) -> None:
        """
        A port that cannot be listened on raises L{ListenFailed} naming it
        and why, before the store is opened (no store directory, no abort
        marker) and with nothing left listening; under twistd it is one
        line naming the flag.
        """
        from twisted.internet.defer import fail
        from twisted.internet.error import CannotListenError
        from twisted.internet.testing import MemoryReactorClock

        from rmqha.broker import ListenFailed

        class InUse:
            def listen(self, factory: object) -> object:
                return fail(CannotListenError("", 10912, OSError(98, "Address already in use")))

        opened: list[bool] = []
        store = self.mktemp()

        def open_commitlog() -> object:
            opened.append(True)
            raise AssertionError("the store must not be opened")

        reactor = MemoryReactorClock()
        broker = Broker(
            BrokerSettings(ha_listen=InUse()),  # type: ignore[arg-type]
            reactor=reactor,
            open_commitlog=open_commitlog,  # type: ignore[arg-type]
        )
        e = self.assertRaises(ListenFailed, broker.startService)
        self.assertEqual((e.port, e.reason), ("ha", "Address already in use"))
        self.assertEqual(opened, [])
        self.assertFalse(os.path.exists(store))

        broker = Broker(
            BrokerSettings(ha_listen="tcp:0"),
            reactor=reactor,
            open_commitlog=open_commitlog,  # type: ignore[arg-type]
        )
        admin = AdminService(broker, "nonsense:1")
        admin.setServiceParent(broker)
        e = self.assertRaises(ListenFailed, broker.startService)
        self.assertEqual(e.port, "http")
        self.assertIn("nonsense", str(e))
        self.assertEqual(opened, [])
        # The HA port that did listen was stopped again.
        self.assertEqual(len(reactor.tcpServers), 1)
        self.assertIsNone(broker.ha_service)
        self.assertEqual(list(broker), [broker.store, broker.scrub, admin])
        self.assertIsNone(admin.port)

        options = Options()
        options.parseOptions(["--store-dir", store, "--ha-listen", "tcp:0", "--http", "unix:/x"])
        service = makeService(options)
        import attrs

        # (The endpoint the master side is built with.)
        services = service.role_services  # type: ignore[attr-defined]
        services._settings = attrs.evolve(services._settings, ha_listen=InUse())
        exit = self.assertRaises(SystemExit, service.privilegedStartService)
        self.assertEqual(
            exit.code,
            "twistd rmqha: cannot listen on tcp:0 (--ha-listen): Address already in use",
        )
        self.assertFalse(os.path.exists(store))


class TLSOptionsTests(SynchronousTestCase):
    """
    The C{--tls-*} flags and their broker.conf keys.
    """

    def setUp(self) -> None:
        from rmqha import certs

        self.dir = self.mktemp()
        self.set = certs.init(self.dir, "master", ["s1"])

    def parse(self, *argv: str) -> Options:
        options = Options()
        options.parseOptions(["--store-dir", "s", *argv])
        return options

    def master_flags(self) -> list[str]:
        cert, key = self.set.master
        return ["--tls-cert", cert, "--tls-key", key, "--tls-ca", self.set.ca]

    def test_master(self) -> None:
        """
        A TLS master: the flags and the allowlist land in the settings and
        the service listens with the TLS endpoint.
        """
        options = self.parse(
            "--ha-listen", "ssl:0:interface=127.0.0.1", *self.master_flags(),
            "--tls-require-client-cert", "--tls-allowed-peers", "s1, s2",
        )
        s = options.settings
        self.assertEqual(s.tls_allowed_peers, frozenset({"s1", "s2"}))
        self.assertTrue(s.tls_require_client_cert)
        broker = makeService(options)
        self.assertNotIsInstance(broker.settings.ha_listen, str)  # type: ignore[attr-defined]

    def test_certificate_makes_default_port_tls(self) -> None:
        """
        With a certificate and no --ha-listen, or a bare port, the port
        serves TLS.
        """
        options = self.parse(*self.master_flags(), "--tls-require-client-cert")
        self.assertEqual(options.settings.ha_listen, "ssl:10912")
        options = self.parse(
            "--ha-listen", "20912", *self.master_flags(), "--tls-require-client-cert"
        )
        self.assertEqual(options.settings.ha_listen, "ssl:20912")

    def test_conf_keys(self) -> None:
        """
        broker.conf keys set the same; haListenPort with a certificate
        serves TLS on that port.
        """
        cert, key = self.set.master
        path = self.mktemp()
        with open(path, "w") as f:
            f.write(
                f"storePathRootDir=s\nhaListenPort=20912\nhaTlsCert={cert}\nhaTlsKey={key}\n"
                f"haTlsCa={self.set.ca}\nhaTlsRequireClientCert=true\nhaTlsAllowedPeers=s1\n"
            )
        options = Options()
        options.parseOptions(["--config", path])
        s = options.settings
        self.assertEqual(s.ha_listen, "ssl:20912")
        self.assertEqual((s.tls_cert, s.tls_require_client_cert), (cert, True))

    def test_slave(self) -> None:
        """
        A slave with --tls-ca follows --master over TLS, verifying the
        --tls-server-name; /status shows the endpoint.
        """
        cert, key = self.set.slaves["s1"]
        options = self.parse(
            "--role", "slave", "--master", "127.0.0.1:10912", "--tls-ca", self.set.ca,
            "--tls-cert", cert, "--tls-key", key, "--tls-server-name", "master",
        )
        broker = makeService(options)
        self.assertEqual(broker.master_endpoint, "tls:127.0.0.1:10912 (verifying master)")

    def test_errors_name_the_setting(self) -> None:
        """
        Contradictory or broken TLS settings are usage errors naming the
        flag.
        """
        cert, key = self.set.master
        slave_cert, slave_key = self.set.slaves["s1"]
        cases = [
            (("--ha-listen", "tcp:10912", "--tls-cert", cert, "--tls-key", key),
             "--ha-listen tcp:10912"),
            (("--ha-listen", "ssl:1", "--tls-cert", cert), "--tls-cert and --tls-key"),
            (("--ha-listen", "ssl:1", "--tls-cert", cert, "--tls-key", slave_key),
             "is not the key of --tls-cert"),
            (("--ha-listen", "ssl:1", "--tls-cert", "/nonexistent", "--tls-key", key),
             "--tls-cert /nonexistent"),
            (("--ha-listen", "ssl:1:privateKey=k.pem", *self.master_flags()), "privateKey"),
            (("--ha-listen", "ssl:1", "--tls-cert", cert, "--tls-key", key,
              "--tls-require-client-cert"), "--tls-ca"),
            (("--ha-listen", "ssl:1", *self.master_flags(), "--tls-allowed-peers", "s1"),
             "--tls-allowed-peers needs --tls-require-client-cert"),
            (("--tls-require-client-cert",), "--tls-require-client-cert"),
            (("--ha-listen", "ssl:1", *self.master_flags()), "add --tls-require-client-cert"),
            (("--tls-ca", self.set.ca), "--tls-ca needs --tls-cert"),
            (("--tls-server-name", "x"), "--tls-server-name is for slaves"),
            (("--role", "slave", "--master", "h:1", "--tls-cert", slave_cert),
             "--tls-cert needs --tls-ca"),
            (("--role", "slave", "--master", "h:1", "--tls-ca", slave_key), "--tls-ca"),
            (("--role", "slave", "--master-endpoint", "tcp:h:1", "--tls-ca", self.set.ca),
             "--master-endpoint"),
            (("--role", "slave", "--master", "h:1", "--tls-allowed-peers", "a"),
             "--tls-allowed-peers is for masters"),
        ]
        for argv, needle in cases:
            e = self.assertRaises(UsageError, self.parse, *argv)
            self.assertIn(needle, str(e), argv)


class AdminHTTPOptionsTests(SynchronousTestCase):
    """
    C{--http}: the admin port over TLS with the C{--tls-*} files.
    """

    setUp = TLSOptionsTests.setUp
    parse = TLSOptionsTests.parse
    master_flags = TLSOptionsTests.master_flags

    def test_admin_over_tls(self) -> None:
        """
        C{--http ssl:…} serves the admin port with this broker's key pair
        and requires client certificates from C{--tls-ca}, with
        C{--http-allowed-peers} as its allowlist.
        """
        options = self.parse(
            "--http", "ssl:0:interface=127.0.0.1", *self.master_flags(),
            "--tls-require-client-cert", "--http-allowed-peers", "ops, admin",
        )
        broker = makeService(options)
        admin = broker.getServiceNamed("http")  # type: ignore[attr-defined]
        self.assertNotIsInstance(admin.where, str)
        policy = admin.peer_policy
        self.assertTrue(policy.require_client_cert)
        self.assertEqual(policy.allowed_peers, frozenset({"ops", "admin"}))
        plain = makeService(self.parse("--http", "tcp:0:interface=127.0.0.1"))
        self.assertEqual(
            plain.getServiceNamed("http").where,  # type: ignore[attr-defined]
            "tcp:0:interface=127.0.0.1",
        )

    def test_admin_errors_name_the_setting(self) -> None:
        """
        An admin TLS port without the files, with key files in the
        description, or an allowlist without TLS: usage errors naming
        C{--http}.
        """
        cert, key = self.set.master
        cases = [
            (("--http", "ssl:1"), "--http ssl:1: the admin port serves TLS"),
            (("--http", "ssl:1", "--tls-cert", cert, "--tls-key", key,
              "--ha-listen", "ssl:2"), "give --tls-cert, --tls-key and --tls-ca"),
            (("--http", "ssl:1:privateKey=k.pem", *self.master_flags(),
              "--tls-require-client-cert"), "--http 'ssl:1:privateKey=k.pem'"),
            (("--http", "tcp:1", "--http-allowed-peers", "ops"),
             "--http-allowed-peers needs --http ssl:PORT"),
        ]
        for argv, needle in cases:
            e = self.assertRaises(UsageError, self.parse, *argv)
            self.assertIn(needle, str(e), argv)
class ScrubOptionsTests(SynchronousTestCase):
    """
    C{--scrub-rate} / C{scrubRate}: the background scrub's rate.
    """

    def parse(self, *argv: str) -> Options:
        options = Options()
        options.parseOptions(list(argv))
        return options

    def test_values(self) -> None:
        """
        On by default at 32 MiB/s; sizes with suffixes, C{0} and C{off}
        turn it off; broker.conf's C{scrubRate} is read and the flag
        overrides it; the broker built gets the rate.
        """
        self.assertEqual(self.parse("--store-dir", "s").settings.scrub_rate, 32 << 20)
        self.assertEqual(
            self.parse("--store-dir", "s", "--scrub-rate", "8MiB").settings.scrub_rate,
            8 << 20,
        )
        for off in ("0", "off"):
            settings = self.parse("--store-dir", "s", "--scrub-rate", off).settings
            self.assertEqual(settings.scrub_rate, 0)
        path = self.mktemp()
        with open(path, "w") as f:
            f.write("storePathRootDir=s\nscrubRate=1m\n")
        self.assertEqual(self.parse("--config", path).settings.scrub_rate, 1 << 20)
        self.assertEqual(
            self.parse("--config", path, "--scrub-rate", "2m").settings.scrub_rate, 2 << 20
        )
        service = makeService(
            self.parse("--store-dir", self.mktemp(), "--scrub-rate", "4m")
        )
        assert isinstance(service, Broker)
        self.assertEqual(service.scrub.rate, 4 << 20)

    def test_bad_value_one_line(self) -> None:
        """
        A bad rate is a one-line usage error naming the flag, or the
        broker.conf key, and the value.
        """
        e = self.assertRaises(UsageError, self.parse, "--store-dir", "s", "--scrub-rate", "fast")
        self.assertIn("--scrub-rate", str(e))
        self.assertIn("'fast'", str(e))
        self.assertNotIn("\n", str(e))
        path = self.mktemp()
        with open(path, "w") as f:
            f.write("storePathRootDir=s\nscrubRate=-1\n")
        e = self.assertRaises(UsageError, self.parse, "--config", path)
        self.assertIn("scrubRate", str(e))
        self.assertNotIn("\n", str(e))
