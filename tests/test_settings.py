"""
Tests for L{rmqha.settings}: one frozen, typed L{BrokerSettings}, its
declarations (flags, broker.conf keys), its cross-field rules, and the
broker.conf unknown-key policy.
"""

from __future__ import annotations

import os
from typing import Any

import attrs
from twisted.logger import capturedLogs, formatEvent
from twisted.python.usage import UsageError
from twisted.trial.unittest import SynchronousTestCase

from rmqha.ha.config import (
    DEFAULT_HA_CONFIG,
    DEFAULT_HA_LISTEN,
    DEFAULT_IN_SYNC_REPLICAS,
    DEFAULT_MASTER_KIND,
    DEFAULT_MAX_UNFLUSHED,
    DEFAULT_MIN_IN_SYNC_REPLICAS,
    DEFAULT_ON_DIVERGENCE,
    DEFAULT_PROBE_TIMEOUT,
    DEFAULT_SLAVE_FALLBEHIND_MAX,
    DEFAULT_SLAVE_TIMEOUT,
    DEFAULT_SYNC_FLUSH_TIMEOUT,
    MasterKind,
    OnDivergence,
    Role,
)
from rmqha.settings import (
    CRITICAL_KEYS,
    ROCKETMQ_KEYS,
    BrokerSettings,
    SettingsError,
    check_keys,
    declarations,
)
from rmqha.store._segments import FlushDiskType
from rmqha.tap import Options

#: A failover node's settings that pass every rule.
FAILOVER: dict[str, Any] = dict(
    coordinator="etcd:http://127.0.0.1:2379",
    group="g",
    node_id="a",
    advertise="127.0.0.1:10912",
    insecure_group=True,
)


class DefaultsTests(SynchronousTestCase):
    """
    The defaults are RocketMQ's (and rmqha's), in one place.
    """

    def test_defaults(self) -> None:
        """
        C{BrokerSettings()} is an ASYNC_MASTER on tcp:10912 with RocketMQ's
        HA defaults and rmqha's checks on.
        """
        s = BrokerSettings()
        self.assertEqual(s.role, Role.ASYNC_MASTER)
        self.assertEqual(s.ha_listen, DEFAULT_HA_LISTEN)
        self.assertEqual(s.ha_config, DEFAULT_HA_CONFIG)
        self.assertEqual(s.flush_disk_type, FlushDiskType.ASYNC_FLUSH)
        self.assertIsNone(s.store_host)
        self.assertEqual(
            (s.in_sync_replicas, s.min_in_sync_replicas, s.slave_timeout,
             s.slave_fallbehind_max, s.sync_flush_timeout, s.max_unflushed),
            (DEFAULT_IN_SYNC_REPLICAS, DEFAULT_MIN_IN_SYNC_REPLICAS, DEFAULT_SLAVE_TIMEOUT,
             DEFAULT_SLAVE_FALLBEHIND_MAX, DEFAULT_SYNC_FLUSH_TIMEOUT, DEFAULT_MAX_UNFLUSHED),
        )
        self.assertEqual(
            (s.on_divergence, s.probe_timeout, s.master_kind),
            (DEFAULT_ON_DIVERGENCE, DEFAULT_PROBE_TIMEOUT, DEFAULT_MASTER_KIND),
        )
        self.assertEqual((s.max_connections, s.max_connections_per_peer), (256, 16))
        self.assertEqual((s.scrub_rate, s.serve_commitlog, s.lease_ttl), (32 << 20, 0, 2))
        self.assertFalse(s.failover)

    def test_command_line_defaults_are_the_objects(self) -> None:
        """
        Parsing only C{--store-dir} gives the same settings as the
        object's defaults.
        """
        options = Options()
        options.parseOptions(["--store-dir", "s"])
        self.assertEqual(options.settings, BrokerSettings(store_dir="s"))

    def test_frozen(self) -> None:
        """
        Settings cannot be changed in place; L{attrs.evolve} makes new ones,
        checked again.
        """
        s = BrokerSettings()
        self.assertRaises(attrs.exceptions.FrozenInstanceError, setattr, s, "role", Role.SLAVE)
        self.assertEqual(attrs.evolve(s, in_sync_replicas=3).in_sync_replicas, 3)
        self.assertRaises(SettingsError, attrs.evolve, s, role=Role.SLAVE)
        self.assertEqual(hash(s), hash(BrokerSettings()))

    def test_enums_from_text(self) -> None:
        """
        Code may give C{on_divergence} and C{master_kind} as their values'
        text; anything else names the flag.
        """
        s = BrokerSettings(on_divergence="truncate", master_kind="rocketmq")
        self.assertIs(s.on_divergence, OnDivergence.TRUNCATE)
        self.assertIs(s.master_kind, MasterKind.ROCKETMQ)
        e = self.assertRaises(SettingsError, BrokerSettings, on_divergence="panic")
        self.assertIn("--on-divergence", str(e))
        e = self.assertRaises(SettingsError, BrokerSettings, master_kind="java")
        self.assertIn("--master-kind", str(e))


class RuleTests(SynchronousTestCase):
    """
    Each cross-field rule, checked however the settings are built, with
    one line naming the flag.
    """

    def refused(self, needle: str, **values: Any) -> None:
        e = self.assertRaises(SettingsError, BrokerSettings, **values)
        self.assertIn(needle, str(e))
        self.assertNotIn("\n", str(e))

    def test_replica_counts(self) -> None:
        """
        minInSyncReplicas is between 1 and inSyncReplicas (the rule
        broker.py and tap.py each had, once).
        """
        self.refused("--min-in-sync-replicas (minInSyncReplicas) 3 must be between 1 and "
                     "--in-sync-replicas (inSyncReplicas) 2", min_in_sync_replicas=3)
        self.refused("--min-in-sync-replicas", min_in_sync_replicas=0)
        self.refused("--in-sync-replicas", in_sync_replicas=0, min_in_sync_replicas=0)
        BrokerSettings(in_sync_replicas=3, min_in_sync_replicas=3)

    def test_connection_limits(self) -> None:
        """
        Both connection limits are at least 1.
        """
        self.refused("--max-connections", max_connections=0)
        self.refused("--max-connections-per-peer", max_connections_per_peer=0)

    def test_ha_config(self) -> None:
        """
        RocketMQ's HA settings are checked with the settings.
        """
        self.refused("haTransferBatchSize", batch_size=0)
        self.refused("haSendHeartbeatInterval", heartbeat_interval=0)

    def test_probe_needed(self) -> None:
        """
        --master-kind rmqha, and failover, need the control probe that
        --on-divergence off turns off (the other rule broker.py and tap.py
        each had).
        """
        self.refused("--master-kind rmqha needs the control probe, which --on-divergence "
                     "off turns off", master_kind=MasterKind.RMQHA, on_divergence=None)
        self.refused("--on-divergence off", on_divergence=None, **FAILOVER)
        BrokerSettings(on_divergence=None)

    def test_slave_needs_one_master(self) -> None:
        """
        A slave (fixed roles) follows --master or --master-endpoint: one.
        """
        self.refused("a slave needs --master", role=Role.SLAVE)
        self.refused("not both", role=Role.SLAVE, master="tcp:host=h:port=1",
                     master_endpoint="tcp:h:1")
        BrokerSettings(role=Role.SLAVE, master="tcp:host=h:port=1")

    def test_namesrv(self) -> None:
        """
        With --namesrv a slave may leave its master to the NameServers, and
        registers with its own brokerId (1 or more), as a failover node
        does; the NameServer list and identity come from broker.conf's
        RocketMQ keys.
        """
        BrokerSettings(role=Role.SLAVE, namesrv=("h:9876",), broker_id=1)
        self.refused("--broker-id (brokerId) 0: with --namesrv, a slave needs its own brokerId",
                     role=Role.SLAVE, namesrv=("h:9876",))
        self.refused("--coordinator needs its own brokerId", namesrv=("h:9876",), **FAILOVER)
        BrokerSettings(namesrv=("h:9876",))
        settings = BrokerSettings.from_sources(
            {"broker-ip1": "10.0.0.1"},
            {"namesrvAddr": "a:9876;b:9876", "brokerClusterName": "Prod", "brokerId": "2",
             "brokerName": "broker-a", "brokerRole": "SLAVE", "brokerIP2": "10.1.0.1"},
        )
        self.assertEqual(
            (settings.namesrv, settings.cluster, settings.broker_id, settings.group,
             settings.broker_ip1, settings.broker_ip2),
            (("a:9876", "b:9876"), "Prod", 2, "broker-a", "10.0.0.1", "10.1.0.1"),
        )
        e = self.assertRaises(SettingsError, BrokerSettings.from_sources, {"namesrv": "a:9876;b"})
        self.assertEqual(str(e), "--namesrv: NameServer address 'b' is not HOST:PORT")
        e = self.assertRaises(SettingsError, BrokerSettings.from_sources, {}, {"brokerId": "-1"}, "b.conf")
        self.assertIn("brokerId in b.conf: '-1' is not a broker id", str(e))

    def test_failover_only(self) -> None:
        """
        Failover settings without a coordinator are refused.
        """
        self.refused("--group-secret-file (groupSecretFile) is for failover groups",
                     group_secret_file="x")
        self.refused("--insecure-group (insecureGroup) is for failover groups",
                     insecure_group=True)
        self.refused("--max-cut (haMaxCut) is for failover mode", max_cut=1)

    def test_failover(self) -> None:
        """
        With a coordinator: a valid spec, a master role (the one taken once
        elected), no fixed master, an identity, the admin port's advertised
        address, TLS with a CA and without a fixed server name.
        """
        BrokerSettings(**FAILOVER)
        self.refused("--coordinator", **{**FAILOVER, "coordinator": "etcd:nonsense"})
        self.refused("once elected", **{**FAILOVER, "role": Role.SLAVE})
        self.refused("--master: with --coordinator", **FAILOVER, master="tcp:host=h:port=1")
        for name in ("group", "node_id", "advertise"):
            self.refused(f"--coordinator needs --{name.replace('_', '-')}",
                         **{**FAILOVER, name: None})
        self.refused("--advertise-http", **FAILOVER, http="tcp:0")
        self.refused("needs --tls-ca", **FAILOVER, tls_cert="c.pem")
        self.refused("--tls-server-name: with --coordinator", **FAILOVER, tls_server_name="x")

    def test_group_auth(self) -> None:
        """
        A failover group is authenticated (secret or certificates) or says
        it is not; not both.
        """
        values = {**FAILOVER, "insecure_group": False}
        self.refused("--coordinator needs an authenticated group", **values)
        self.refused("contradict", **FAILOVER, group_secret_file="s")
        BrokerSettings(**values, group_secret_file="s")

    def test_tls_master(self) -> None:
        """
        A master's TLS settings: a certificate serves ssl:, the rest needs
        one, the server name is a slave's.
        """
        self.refused("--tls-server-name is for slaves", tls_server_name="x")
        self.refused("--ha-listen tcp:10912: with --tls-cert", tls_cert="c", tls_key="k")
        for name in ("tls_key", "tls_ca"):
            self.refused(f"--{name.replace('_', '-')} needs --tls-cert", **{name: "x"})
        self.refused("--tls-require-client-cert needs --tls-cert", tls_require_client_cert=True)
        self.refused("--tls-allowed-peers needs --tls-require-client-cert", tls_cert="c",
                     ha_listen="ssl:1", tls_allowed_peers=frozenset({"s1"}))
        BrokerSettings(tls_cert="c", tls_key="k", ha_listen="ssl:1")

    def test_tls_slave(self) -> None:
        """
        A slave's TLS settings: no master-only ones, a CA for the rest,
        not with --master-endpoint.
        """
        slave: dict[str, Any] = dict(role=Role.SLAVE, master="tcp:host=h:port=1")
        self.refused("--tls-allowed-peers is for masters", **slave,
                     tls_allowed_peers=frozenset({"a"}))
        self.refused("--tls-cert needs --tls-ca", **slave, tls_cert="c")
        self.refused("--master-endpoint", role=Role.SLAVE, master_endpoint="tcp:h:1",
                     tls_ca="ca")
        BrokerSettings(**slave, tls_ca="ca", tls_server_name="m")

    def test_http(self) -> None:
        """
        --serve-commitlog and --http-allowed-peers need --http (ssl: for
        the second), which needs the three TLS files.
        """
        self.refused("--serve-commitlog (serveCommitLog) needs --http", serve_commitlog=1)
        self.refused("--http-allowed-peers needs --http ssl:PORT", http="tcp:1",
                     http_allowed_peers=frozenset({"ops"}))
        self.refused("--http ssl:1: the admin port serves TLS", http="ssl:1")


class DeclarationTests(SynchronousTestCase):
    """
    The flags and broker.conf keys come from the declarations.
    """

    def test_every_flag_is_an_option(self) -> None:
        """
        twistd's options are the declared flags (plus --config and the
        process's log file options), each help line naming its broker.conf
        key.
        """
        parameters = {p[0]: p[3] for p in Options.optParameters}
        switches = {f[0]: f[2] for f in Options.optFlags}
        for d in declarations():
            if d.flag is None:
                continue
            where = switches if d.switch else parameters
            self.assertIn(d.flag, where)
            if d.key is not None:
                self.assertIn(f"[{d.key}", where[d.flag])
        self.assertEqual(
            set(parameters) | set(switches),
            {d.flag for d in declarations() if d.flag}
            | {"config", "log-file", "log-rotate-size", "log-keep"},
        )

    def test_keys_are_unique(self) -> None:
        """
        No two settings share a flag or a key; every key RocketMQ's or
        ours, critical keys among ours.
        """
        keys = [d.key for d in declarations() if d.key]
        flags = [d.flag for d in declarations() if d.flag]
        self.assertEqual(len(keys), len(set(keys)))
        self.assertEqual(len(flags), len(set(flags)))
        self.assertFalse(set(keys) & ROCKETMQ_KEYS)
        self.assertLessEqual(CRITICAL_KEYS, set(keys))

    def test_broker_conf_mapping(self) -> None:
        """
        Each broker.conf key sets its setting; the command line overrides
        the file.
        """
        conf = {
            "brokerRole": "SYNC_MASTER",
            "storePathRootDir": "/data",
            "haSlaveFallbehindMax": "1m",
            "syncFlushTimeout": "2000",
            "haListenPort": "20912",
            "syncFromLastFile": "true",
            "haOnDivergence": "off",
        }
        s = BrokerSettings.from_sources({"role": "slave", "master": "h:1"}, conf, "b.conf")
        self.assertEqual(
            (s.role, s.store_dir, s.slave_fallbehind_max, s.sync_flush_timeout, s.ha_listen,
             s.sync_from_last_file, s.on_divergence, s.master),
            (Role.SLAVE, "/data", 1 << 20, 2.0, "tcp:20912", True, None, "tcp:host=h:port=1"),
        )
        e = self.assertRaises(
            SettingsError, BrokerSettings.from_sources, {}, {"slaveTimeout": "0"}, "b.conf"
        )
        self.assertTrue(str(e).startswith("slaveTimeout in b.conf: "), str(e))

    def test_master_remoting(self) -> None:
        """
        A slave's --master-remoting / masterRemotingAddress: HOST:PORT
        (the metadata sync's master), for slaves with fixed roles only.
        """
        s = BrokerSettings.from_sources(
            {"role": "slave", "master": "h:10912"}, {"masterRemotingAddress": " h:10911 "}, "b.conf"
        )
        self.assertEqual(s.master_remoting, "h:10911")
        s = BrokerSettings.from_sources({"role": "slave", "master": "h:1", "master-remoting": "::1:10911"})
        self.assertEqual(s.master_remoting, "[::1]:10911")
        e = self.assertRaises(
            SettingsError, BrokerSettings.from_sources,
            {"role": "slave", "master": "h:1", "master-remoting": "h"},
        )
        self.assertIn("--master-remoting", str(e))
        for needle, values in (
            ("--master-remoting (masterRemotingAddress) is for slaves", {"master_remoting": "h:1"}),
            ("--master-remoting: with --coordinator", {**FAILOVER, "master_remoting": "h:1"}),
        ):
            e = self.assertRaises(SettingsError, BrokerSettings, **values)
            self.assertIn(needle, str(e))

    def test_failover_defaults(self) -> None:
        """
        From the command line, a failover node's role defaults to
        SYNC_MASTER, its minInSyncReplicas to 2, its secret file to
        $RMQHA_GROUP_SECRET_FILE.
        """
        flags = {"coordinator": "etcd:http://h:2379", "group": "g", "node-id": "a",
                 "advertise": "h:1"}
        s = BrokerSettings.from_sources(flags, environ={"RMQHA_GROUP_SECRET_FILE": "/s"})
        self.assertEqual((s.role, s.min_in_sync_replicas, s.group_secret_file),
                         (Role.SYNC_MASTER, 2, "/s"))


class UnknownKeyTests(SynchronousTestCase):
    """
    A broker.conf key rmqha does not know: a warning naming the nearest
    known key, or, when a misspelling would change the role or the store,
    an error.
    """

    def conf(self, text: str) -> str:
        path = self.mktemp()
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_known_keys_are_quiet(self) -> None:
        """
        Our keys and RocketMQ's others give no warning.
        """
        conf = {"brokerClusterName": "c", "brokerId": "0", "namesrvAddr": "h:9876",
                "haMasterAddress": "h:1"}
        self.assertEqual(check_keys(conf, "b.conf"), [])

    def test_unknown_key_warns(self) -> None:
        """
        A misspelt harmless key is ignored with a warning (logged, and kept
        on the options) naming the key, the file and the nearest known key.
        """
        path = self.conf("storePathRootDir=s\nhaSendHeartbeatIntervall=1000\nzzz=1\n")
        options = Options()
        with capturedLogs() as events:
            options.parseOptions(["--config", path])
        expected = [
            f"unknown key 'haSendHeartbeatIntervall' in {path} ignored (did you mean "
            "haSendHeartbeatInterval?)",
            f"unknown key 'zzz' in {path} ignored (not a RocketMQ or rmqha key)",
        ]
        self.assertEqual(options.warnings, expected)
        self.assertEqual([formatEvent(e) for e in events], expected)
        self.assertEqual(options.settings.heartbeat_interval, 5.0)

    def test_misspelt_critical_key_is_an_error(self) -> None:
        """
        C{brokerRol=SLAVE} would start a master that takes writes: a usage
        error naming the key, the file and the key meant.
        """
        for line, meant in [
            ("brokerRol=SLAVE", "brokerRole"),
            ("storePathRootdir=/data", "storePathRootDir"),
            ("storePathCommitlog=/data/cl", "storePathCommitLog"),
            ("mappedFileSizeCommitlog=1g", "mappedFileSizeCommitLog"),
            ("flushDiskTyp=SYNC_FLUSH", "flushDiskType"),
            ("haMasterAdress=h:1", "haMasterAddress"),
            ("haListenPrt=20912", "haListenPort"),
        ]:
            path = self.conf(f"storePathRootDir=s\n{line}\n")
            e = self.assertRaises(UsageError, Options().parseOptions, ["--config", path])
            key = line.split("=")[0]
            self.assertEqual(
                str(e),
                f"unknown key {key!r} in {path}: did you mean {meant}? (refusing to start: "
                "a misspelt one changes the role or the store)",
            )

    def test_error_under_twistd(self) -> None:
        """
        Under twistd the error stops it with one line (exit status 1).
        """
        import io
        import sys

        from twisted.scripts.twistd import ServerOptions

        self.patch(sys, "stdout", io.StringIO())
        path = self.conf("storePathRootDir=s\nbrokerRol=SLAVE\n")
        e = self.assertRaises(SystemExit, ServerOptions().parseOptions, ["rmqha", "--config", path])
        self.assertIsInstance(e.code, str)
        self.assertIn("'brokerRol'", str(e.code))
        self.assertIn("brokerRole", str(e.code))
        self.assertIn(path, str(e.code))
        self.assertNotIn("\n", str(e.code))
        self.assertFalse(os.path.exists("s"))


class AssembleTests(SynchronousTestCase):
    """
    L{rmqha.assemble.build_service}: the service tree from settings, for
    embedders as for twistd.
    """

    def test_embedder_builds_a_broker(self) -> None:
        """
        An embedder's settings give a plain L{Broker} (its errors are
        exceptions, not twistd's one-line exits) holding those settings,
        its store not yet opened; settings without a store are refused.
        """
        from twisted.internet.testing import MemoryReactorClock

        from rmqha.assemble import build_service
        from rmqha.broker import Broker

        store = self.mktemp()
        settings = BrokerSettings(store_dir=store, ha_listen="tcp:0", http="tcp:0")
        broker = build_service(settings, MemoryReactorClock())
        self.assertIs(type(broker), Broker)
        assert isinstance(broker, Broker)
        self.assertIs(broker.settings, settings)
        self.assertEqual([s.name for s in broker], ["store", "scrub", "http"])
        self.assertIsNone(broker.store.commitlog)
        self.assertFalse(os.path.exists(store))
        e = self.assertRaises(ValueError, build_service, BrokerSettings(), MemoryReactorClock())
        self.assertIn("--store-dir", str(e))
