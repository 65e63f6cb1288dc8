# -*- test-case-name: tests.test_tap -*-
"""
C{twistd rmqha}: options and the service tree.

    twistd -n rmqha --role master --store-dir DIR [--ha-listen tcp:10912]
    twistd -n rmqha --role slave --master HOST:PORT --store-dir DIR

Settings come from RocketMQ's defaults, then C{--config broker.conf}, then
the command line, each overriding the one before.  A bad value is a usage
error naming the flag or the C{broker.conf} key it came from.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from twisted.application.service import IService
from twisted.logger import Logger
from twisted.python import usage

from rmqha._limits import DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_PEER
from rmqha._units import parse_rate, parse_size
from rmqha.admin import AdminService
from rmqha._ports import ListenFailed
from rmqha.broker import Broker
from rmqha.coord.node import DEFAULT_LEASE_TTL
from rmqha.ha.auth import GroupAuth, load_group_secret
from rmqha.ha.epochs import EpochFile, EpochFileError
from rmqha.store._segments import MAX_SEGMENT_SIZE, MIN_SEGMENT_SIZE, FlushDiskType
from rmqha.store.commitlog import CommitLog
from rmqha.store.errors import StoreError
from rmqha.ha.config import (
    DEFAULT_HA_CONFIG,
    DEFAULT_HA_LISTEN,
    DEFAULT_IN_SYNC_REPLICAS,
    DEFAULT_MASTER_KIND,
    DEFAULT_MIN_IN_SYNC_REPLICAS,
    DEFAULT_ON_DIVERGENCE,
    DEFAULT_PROBE_TIMEOUT,
    DEFAULT_SLAVE_FALLBEHIND_MAX,
    DEFAULT_SLAVE_TIMEOUT,
    DEFAULT_SYNC_FLUSH_TIMEOUT,
    HAConfig,
    MasterKind,
    OnDivergence,
    Role,
)
from rmqha.store.scrub import DEFAULT_SCRUB_RATE, parse_scrub_rate
from rmqha.store.service import DEFAULT_FLUSH_INTERVAL
from rmqha.tls import (
    PeerPolicy,
    TLSFiles,
    client_endpoint,
    parse_ssl_listen,
    server_context,
    server_endpoint,
    split_description,
)

__all__ = ["Options", "makeService", "parse_host_port", "read_properties"]


def parse_host_port(text: str, what: str) -> tuple[str, int]:
    """
    C{host:port} (C{[v6]:port} for IPv6) as a pair.

    @raise ValueError: naming C{what}.
    """
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what} {text!r} is not HOST:PORT")
    return host, int(port)


def read_properties(path: str) -> dict[str, str]:
    """
    A Java properties file (RocketMQ's C{broker.conf}): C{key=value},
    C{key: value} or C{key value} lines, C{#} and C{!} comments, a trailing
    backslash continuing a line.

    @raise ValueError: the file cannot be read.
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"--config {path}: {e.strerror}") from None
    result: dict[str, str] = {}
    logical = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not logical and (not line or line[0] in "#!"):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            logical += line[:-1]
            continue
        logical += line
        key, value = logical, ""
        for i, char in enumerate(logical):
            if char in "=:" or char.isspace():
                key = logical[:i].strip()
                value = logical[i + 1 :].strip()
                if char.isspace() and value[:1] in ("=", ":"):
                    value = value[1:].strip()
                break
        result[key] = value
        logical = ""
    return result


def _role(text: str) -> Role:
    value = text.strip().upper()
    if value == "MASTER":
        return Role.ASYNC_MASTER
    try:
        return Role(value)
    except ValueError:
        raise ValueError(
            f"{text!r} is not master, slave, ASYNC_MASTER, SYNC_MASTER or SLAVE"
        ) from None


def _replicas(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"{text!r} is not a number of replicas (1 or more)")
    return int(text)


def _connections(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"{text!r} is not a number of connections (1 or more)")
    return int(text)


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"{text!r} is not true or false")
    return value == "true"


def _positive_ms(text: str) -> float:
    if not text.strip().isdigit() or int(text) <= 0:
        raise ValueError(f"{text!r} is not a positive number of milliseconds")
    return int(text) / 1000


def _segment_size(text: str) -> int:
    size = parse_size(text, "value")
    if not MIN_SEGMENT_SIZE <= size <= MAX_SEGMENT_SIZE:
        raise ValueError(f"{size} is outside {MIN_SEGMENT_SIZE}..{MAX_SEGMENT_SIZE}")
    return size


def _batch_size(text: str) -> int:
    size = parse_size(text, "value")
    HAConfig(transfer_batch_size=size)  # the range check, in one place
    return size


def _flush_type(text: str) -> FlushDiskType:
    try:
        return FlushDiskType(text.strip().upper())
    except ValueError:
        raise ValueError(f"{text!r} is not ASYNC_FLUSH or SYNC_FLUSH") from None


def _port_endpoint(text: str) -> str:
    if not text.strip().isdigit() or not 0 <= int(text) < 65536:
        raise ValueError(f"{text!r} is not a port")
    return f"tcp:{int(text)}"


def _listen_endpoint(text: str) -> str:
    """
    A port to listen on: a bare port (C{10912}, as RocketMQ's
    C{haListenPort}) is C{tcp:10912}; anything else must be a Twisted
    server endpoint description (C{ssl:} ones are checked with the TLS
    settings).
    """
    if text.strip().isdigit():
        return _port_endpoint(text)
    if not text.startswith("ssl:"):
        from twisted.internet.endpoints import serverFromString

        try:
            # Only parses: the endpoint is not used, so needs no reactor.
            serverFromString(None, text)
        except Exception as e:
            raise ValueError(
                f"{text!r} is neither a port nor a Twisted server endpoint "
                f"description like tcp:PORT:interface=ADDRESS ({e})"
            ) from None
    return text


def _master_address(text: str) -> str:
    host, port = parse_host_port(text.strip(), "address")
    # Colons in an IPv6 address are escaped in endpoint descriptions.
    return f"tcp:host={host.replace(':', chr(92) + ':')}:port={port}"


def _advertised(text: str) -> str:
    host, port = parse_host_port(text.strip(), "address")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _coordinator(text: str) -> str:
    if not text.strip().startswith("etcd:"):
        raise ValueError(
            f"{text!r} is not a coordinator: give etcd:http://HOST:PORT[,http://HOST:PORT...]"
        )
    return text.strip()


def _group_name(text: str) -> str:
    name = _name(text)
    if "/" in name or any(c.isspace() for c in name):
        raise ValueError(f"{text!r}: no '/' or spaces in a name")
    return name


def _lease_ttl(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 2:
        raise ValueError(f"{text!r} is not a lease TTL of 2 seconds or more")
    return int(text)


def _on_divergence(text: str) -> OnDivergence | None:
    value = text.strip().lower()
    if value == "off":
        return None
    try:
        return OnDivergence(value)
    except ValueError:
        raise ValueError(f"{text!r} is not halt, truncate, rebootstrap or off") from None


def _master_kind(text: str) -> MasterKind:
    try:
        return MasterKind(text.strip().lower())
    except ValueError:
        raise ValueError(f"{text!r} is not auto, rmqha or rocketmq") from None


def _peers(text: str) -> frozenset[str]:
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise ValueError(f"{text!r} names no peer")
    return names


def _name(text: str) -> str:
    if not text.strip():
        raise ValueError("empty name")
    return text.strip()


@dataclass(frozen=True)
class _Setting:
    """
    One setting: its option name, its broker.conf key, how to parse it.
    """

    option: str
    key: str | None
    parse: Callable[[str], Any]
    #: How the broker.conf key is parsed, when it differs from the flag.
    parse_key: Callable[[str], Any] | None = None


_SETTINGS = [
    _Setting("role", "brokerRole", _role),
    _Setting("store-dir", "storePathRootDir", str),
    _Setting("commitlog-dir", "storePathCommitLog", str),
    _Setting("segment-size", "mappedFileSizeCommitLog", _segment_size),
    _Setting("flush-disk-type", "flushDiskType", _flush_type),
    _Setting("flush-interval", "flushIntervalCommitLog", _positive_ms),
    _Setting("store-host", None, lambda t: parse_host_port(t, "value")),
    _Setting("ha-listen", "haListenPort", _listen_endpoint, _port_endpoint),
    _Setting("master", "haMasterAddress", _master_address),
    _Setting("master-endpoint", None, str),
    _Setting("http", None, _listen_endpoint),
    _Setting("batch-size", "haTransferBatchSize", _batch_size),
    _Setting("heartbeat-interval", "haSendHeartbeatInterval", _positive_ms),
    _Setting("housekeeping-interval", "haHousekeepingInterval", _positive_ms),
    _Setting("slave-fallbehind-max", "haSlaveFallbehindMax", lambda t: parse_size(t, "value")),
    _Setting("slave-timeout", "slaveTimeout", _positive_ms),
    _Setting("sync-flush-timeout", "syncFlushTimeout", _positive_ms),
    _Setting("in-sync-replicas", "inSyncReplicas", _replicas),
    _Setting("min-in-sync-replicas", "minInSyncReplicas", _replicas),
    _Setting("on-divergence", "haOnDivergence", _on_divergence),
    _Setting("probe-timeout", "haProbeTimeout", _positive_ms),
    _Setting("max-connections", "maxConnections", _connections),
    _Setting("max-connections-per-peer", "maxConnectionsPerPeer", _connections),
    _Setting("master-kind", "haMasterKind", _master_kind),
    _Setting("tls-cert", "haTlsCert", str),
    _Setting("tls-key", "haTlsKey", str),
    _Setting("tls-ca", "haTlsCa", str),
    _Setting("tls-allowed-peers", "haTlsAllowedPeers", _peers),
    _Setting("tls-server-name", "haTlsServerName", _name),
    _Setting("http-allowed-peers", None, _peers),
    _Setting("scrub-rate", "scrubRate", parse_scrub_rate),
    _Setting("serve-commitlog", "serveCommitLog", lambda t: parse_rate(t, "commit-log rate")),
    _Setting("coordinator", "coordinator", _coordinator),
    _Setting("group", "brokerName", _group_name),
    _Setting("node-id", "nodeId", _group_name),
    _Setting("advertise", "advertise", _advertised),
    _Setting("advertise-http", "advertiseHttp", _advertised),
    _Setting("lease-ttl", "leaseTtl", _lease_ttl),
    _Setting("max-cut", "haMaxCut", lambda t: parse_size(t, "value")),
    _Setting("group-secret-file", "groupSecretFile", str),
]

#: The environment variable naming the group secret file when neither the
#: command line nor broker.conf does (failover only).
GROUP_SECRET_ENV = "RMQHA_GROUP_SECRET_FILE"

#: Flags (no value on the command line) and their broker.conf true/false keys.
_FLAG_KEYS = [
    ("sync-from-last-file", "syncFromLastFile"),
    ("tls-require-client-cert", "haTlsRequireClientCert"),
    ("allow-unclean-election", "allowUncleanElection"),
    ("no-failover", "noFailover"),
    ("insecure-group", "insecureGroup"),
]

_DEFAULTS: dict[str, Any] = {
    "role": Role.MASTER,
    "flush-disk-type": FlushDiskType.ASYNC_FLUSH,
    "flush-interval": DEFAULT_FLUSH_INTERVAL,
    "store-host": ("127.0.0.1", 10911),
    "ha-listen": DEFAULT_HA_LISTEN,
    "batch-size": DEFAULT_HA_CONFIG.transfer_batch_size,
    "heartbeat-interval": DEFAULT_HA_CONFIG.heartbeat_interval,
    "housekeeping-interval": DEFAULT_HA_CONFIG.housekeeping_interval,
    "sync-from-last-file": DEFAULT_HA_CONFIG.sync_from_last_file,
    "slave-fallbehind-max": DEFAULT_SLAVE_FALLBEHIND_MAX,
    "slave-timeout": DEFAULT_SLAVE_TIMEOUT,
    "sync-flush-timeout": DEFAULT_SYNC_FLUSH_TIMEOUT,
    "in-sync-replicas": DEFAULT_IN_SYNC_REPLICAS,
    "min-in-sync-replicas": DEFAULT_MIN_IN_SYNC_REPLICAS,
    "tls-require-client-cert": False,
    "on-divergence": DEFAULT_ON_DIVERGENCE,
    "probe-timeout": DEFAULT_PROBE_TIMEOUT,
    "max-connections": DEFAULT_MAX_CONNECTIONS,
    "max-connections-per-peer": DEFAULT_MAX_CONNECTIONS_PER_PEER,
    "scrub-rate": DEFAULT_SCRUB_RATE,
    "serve-commitlog": 0,
    "master-kind": DEFAULT_MASTER_KIND,
    "lease-ttl": DEFAULT_LEASE_TTL,
    "allow-unclean-election": False,
    "no-failover": False,
    "insecure-group": False,
}


class Fatal(SystemExit, Exception):
    """
    Stops twistd with one line (the text) and exit status 1.  A
    C{SystemExit}, so that C{twistd -n} prints just the line; also an
    C{Exception}, so that a daemonizing twistd hands the line to the parent
    through its status pipe (which passes only exceptions, in 100 bytes:
    hence no module path in the name) instead of "An error has occurred: ''".
    """

    __module__ = "builtins"


class Options(usage.Options):
    """
    C{twistd rmqha} command line.
    """

    synopsis = "--role master|SYNC_MASTER|slave --store-dir DIR [options]"
    longdesc = (
        "Runs an rmqha broker: a RocketMQ 4.9-compatible commit log under "
        "--store-dir replicated with RocketMQ's classic HA protocol. A master "
        "serves slaves on --ha-listen; a slave follows --master (or any "
        "Twisted client endpoint given as --master-endpoint). SIGTERM shuts "
        "down cleanly. Settings may come from a RocketMQ broker.conf "
        "(--config); flags override it."
    )

    optFlags = [
        [
            "truncate-corrupt",
            None,
            "when the store has a bad record with valid records after it, cut "
            "the log there (everything cut is kept in STORE/rmqha/quarantine/) "
            "instead of refusing to start; prefer 'rmqha store repair' (no "
            "broker.conf key: a one-off decision)",
        ],
        [
            "tls-require-client-cert",
            None,
            "master: refuse slaves without a certificate signed by --tls-ca "
            "[haTlsRequireClientCert]",
        ],
        [
            "allow-unclean-election",
            None,
            "with --coordinator: when no member of the in-sync set lives, elect "
            "another node anyway, losing every put it lacks (docs/failover.md) "
            "[allowUncleanElection]",
        ],
        [
            "no-failover",
            None,
            "with --coordinator: never stand for election (follow only) [noFailover]",
        ],
        [
            "insecure-group",
            None,
            "with --coordinator: run the group without authentication (node ids "
            "on the HA port only declared: anyone who reaches it can pose as a "
            "member and ack puts it does not hold; docs/failover.md) [insecureGroup]",
        ],
        [
            "sync-from-last-file",
            None,
            "an empty slave gets only the master's last segment (4.9's rule; "
            "default: the whole log) [syncFromLastFile]",
        ],
    ]
    optParameters = [
        ["config", None, None, "a RocketMQ broker.conf to read settings from"],
        [
            "role",
            None,
            None,
            "master (= ASYNC_MASTER), SYNC_MASTER or slave (SLAVE) [brokerRole]",
        ],
        [
            "slave-timeout",
            None,
            None,
            "ms a SYNC_MASTER put waits for slaves (3000) [slaveTimeout]",
        ],
        [
            "in-sync-replicas",
            None,
            None,
            "copies a SYNC_MASTER put waits for, the master's included (2) "
            "[inSyncReplicas]",
        ],
        [
            "min-in-sync-replicas",
            None,
            None,
            "fewer in-sync copies fail a put at once with "
            "IN_SYNC_REPLICAS_NOT_ENOUGH (1) [minInSyncReplicas]",
        ],
        [
            "coordinator",
            None,
            None,
            "automatic failover through etcd: etcd:http://HOST:PORT[,http://HOST:PORT...] "
            "(https:// endpoints take ,tlsCa=PATH,tlsCert=PATH,tlsKey=PATH; etcd's auth "
            ",user=NAME,passwordFile=PATH or RMQHA_ETCD_PASSWORD); every node starts as a "
            "slave, --role says how it acts once elected (docs/failover.md) [coordinator]",
        ],
        ["group", None, None, "with --coordinator: the group's name [brokerName]"],
        ["node-id", None, None, "with --coordinator: this node's unique id [nodeId]"],
        [
            "advertise",
            None,
            None,
            "with --coordinator: HOST:PORT of --ha-listen as peers dial it [advertise]",
        ],
        [
            "advertise-http",
            None,
            None,
            "with --coordinator: HOST:PORT of --http as clients reach it [advertiseHttp]",
        ],
        [
            "lease-ttl",
            None,
            None,
            f"with --coordinator: seconds of the lease a master holds "
            f"({DEFAULT_LEASE_TTL}; a dead master is replaced after about this long) [leaseTtl]",
        ],
        [
            "group-secret-file",
            None,
            None,
            "with --coordinator: a file holding the group's shared secret (not "
            "readable by others; rmqha certs init --group writes one): members "
            "prove their node ids to each other with it on every HA connection "
            f"(docs/failover.md) [groupSecretFile; or ${GROUP_SECRET_ENV}]",
        ],
        ["store-dir", None, None, "store root [storePathRootDir]"],
        [
            "commitlog-dir",
            None,
            None,
            "commit log directory (default STORE_DIR/commitlog) [storePathCommitLog]",
        ],
        [
            "segment-size",
            None,
            None,
            "segment size for a new store, e.g. 1g, 64m (default 1g; an "
            "existing store's files decide) [mappedFileSizeCommitLog]",
        ],
        ["flush-disk-type", None, None, "ASYNC_FLUSH (default) or SYNC_FLUSH [flushDiskType]"],
        ["flush-interval", None, None, "ms between async flushes (500) [flushIntervalCommitLog]"],
        ["store-host", None, None, "HOST:PORT written as STOREHOST (127.0.0.1:10911)"],
        [
            "ha-listen",
            None,
            None,
            "master: a port or Twisted server endpoint for slaves (tcp:10912) "
            "[haListenPort, honoured, unlike 4.9]",
        ],
        ["master", None, None, "slave: the master's HA address HOST:PORT [haMasterAddress]"],
        [
            "master-endpoint",
            None,
            None,
            "slave: the master as any Twisted client endpoint description",
        ],
        [
            "http",
            None,
            None,
            "admin HTTP (/status, /metrics, produce) on this port or Twisted "
            "server endpoint, e.g. tcp:8080:interface=127.0.0.1, or "
            "ssl:PORT[:interface=...] for TLS with --tls-cert/--tls-key, client "
            "certificates from --tls-ca required",
        ],
        [
            "http-allowed-peers",
            None,
            None,
            "with --http ssl:...: NAME[,NAME...] an admin client certificate's "
            "DNS names (or CN) must include one of",
        ],
        [
            "on-divergence",
            None,
            None,
            "slave: when its log has diverged from the master's: halt (default), "
            "truncate, rebootstrap, or off [haOnDivergence]",
        ],
        [
            "max-cut",
            None,
            None,
            "failover: the most bytes a slave's checks may cut from its log "
            "(quarantined); a bigger cut halts it, naming this option "
            "(2 x --slave-fallbehind-max) [haMaxCut]",
        ],
        [
            "probe-timeout",
            None,
            None,
            "slave: most ms to wait for the master's whole answer to the rmqha "
            "control probe (3000); one silent for 500 ms is taken for a RocketMQ "
            "master unless it spoke the extension before [haProbeTimeout]",
        ],
        [
            "master-kind",
            None,
            None,
            "slave: auto (default: probe; a master once seen speaking the rmqha "
            "extension is never taken for a RocketMQ one), rmqha (never replicate "
            "classically) or rocketmq (no probe) [haMasterKind]",
        ],
        [
            "max-connections",
            None,
            None,
            "connections each listening port (HA, HTTP) accepts at once; more are "
            f"closed at once ({DEFAULT_MAX_CONNECTIONS}) [maxConnections]",
        ],
        [
            "max-connections-per-peer",
            None,
            None,
            "connections one host may hold on each port "
            f"({DEFAULT_MAX_CONNECTIONS_PER_PEER}) [maxConnectionsPerPeer]",
        ],
        [
            "tls-cert",
            None,
            None,
            "PEM certificate (and chain) of this broker; on a master, serve "
            "TLS on --ha-listen ssl:PORT [haTlsCert]",
        ],
        ["tls-key", None, None, "PEM private key of --tls-cert [haTlsKey]"],
        [
            "tls-ca",
            None,
            None,
            "PEM CA certificate(s) the peer must chain to; on a slave, follow "
            "--master over TLS [haTlsCa]",
        ],
        [
            "tls-allowed-peers",
            None,
            None,
            "master: NAME[,NAME...] a slave certificate's DNS names (or CN) "
            "must include one of [haTlsAllowedPeers]",
        ],
        [
            "tls-server-name",
            None,
            None,
            "slave: the name the master's certificate must carry (default: "
            "the --master host) [haTlsServerName]",
        ],
        [
            "scrub-rate",
            None,
            None,
            "bytes per second the background scrub re-reads and re-checks "
            "every record at, e.g. 8MiB; 0 or off disables it (32MiB) [scrubRate]",
        ],
        [
            "serve-commitlog",
            None,
            None,
            "with --http: serve the commit log's segment files read-only under "
            "/commitlog at this many bytes per second for all readers together, "
            "e.g. 64m (a live-broker pipeline source); 0 or off: not served (off) "
            "[serveCommitLog]",
        ],
        [
            "batch-size",
            None,
            None,
            "most bytes in one frame, at most 4 MiB - 12 (32k) [haTransferBatchSize]",
        ],
        [
            "heartbeat-interval",
            None,
            None,
            "ms of silence before a heartbeat or report (5000) [haSendHeartbeatInterval]",
        ],
        [
            "housekeeping-interval",
            None,
            None,
            "ms of silence before a peer is dropped (20000) [haHousekeepingInterval]",
        ],
    ]

    def parseOptions(self, options: list[str] | None = None) -> None:
        try:
            usage.Options.parseOptions(self, options)
        except usage.UsageError as e:
            if self.parent is None:
                raise
            # Under twistd, which would print its own and our whole usage
            # (some 70 lines) around the one that matters.
            raise Fatal(f"twistd rmqha: {e}; see twistd rmqha --help") from None

    def postOptions(self) -> None:
        settings = dict(_DEFAULTS)
        try:
            conf = read_properties(self["config"]) if self["config"] else {}
            for setting in _SETTINGS:
                if setting.key is not None and setting.key in conf:
                    source = f"{setting.key} in {self['config']}"
                    try:
                        parse = setting.parse_key or setting.parse
                        settings[setting.option] = parse(conf[setting.key])
                    except ValueError as e:
                        raise ValueError(f"{source}: {e}") from None
                if self.get(setting.option) is not None:
                    try:
                        settings[setting.option] = setting.parse(self[setting.option])
                    except ValueError as e:
                        raise ValueError(f"--{setting.option}: {e}") from None
            for option, key in _FLAG_KEYS:
                if key in conf:
                    try:
                        settings[option] = _bool(conf[key])
                    except ValueError as e:
                        raise ValueError(f"{key} in {self['config']}: {e}") from None
                if self[option]:
                    settings[option] = True
            if settings["min-in-sync-replicas"] > settings["in-sync-replicas"]:
                raise ValueError(
                    f"--min-in-sync-replicas {settings['min-in-sync-replicas']} is "
                    f"more than --in-sync-replicas {settings['in-sync-replicas']}"
                )
            if settings["master-kind"] is MasterKind.RMQHA and settings["on-divergence"] is None:
                raise ValueError(
                    "--master-kind rmqha needs the control probe, which "
                    "--on-divergence off turns off"
                )
            if not settings.get("store-dir"):
                raise ValueError("--store-dir (or storePathRootDir) is required")
            if not settings.get("coordinator"):
                for option, key in (
                    ("group-secret-file", "groupSecretFile"),
                    ("insecure-group", "insecureGroup"),
                ):
                    if settings.get(option):
                        raise ValueError(
                            f"--{option} ({key}) is for failover groups: give --coordinator"
                        )
            if settings.get("coordinator"):
                self._check_failover(settings, conf)
            elif settings.get("max-cut") is not None:
                raise ValueError("--max-cut (haMaxCut) is for failover mode: give --coordinator")
            elif settings["role"] is Role.SLAVE:
                if settings.get("master") and self["master-endpoint"]:
                    raise ValueError("give --master or --master-endpoint, not both")
                if not (settings.get("master") or settings.get("master-endpoint")):
                    raise ValueError(
                        "a slave needs --master HOST:PORT (or haMasterAddress, or "
                        "--master-endpoint)"
                    )
            self._check_tls(settings, conf)
            self._check_http(settings)
        except ValueError as e:
            raise usage.UsageError(str(e)) from None
        self.settings = settings

    def _check_failover(self, settings: dict[str, Any], conf: dict[str, str]) -> None:
        """
        With a coordinator: the node's identity is required, its role is
        the one it takes once elected, and it follows whoever is elected
        (no fixed master).
        """
        from rmqha.coord.etcd import parse_coordinator

        parse_coordinator(settings["coordinator"])
        if self["role"] is None and "brokerRole" not in conf:
            settings["role"] = Role.SYNC_MASTER
        if not settings["role"].is_master:
            raise ValueError(
                "with --coordinator, --role says how the node acts once elected: "
                "SYNC_MASTER or ASYNC_MASTER (every node starts as a slave)"
            )
        for option in ("master", "master-endpoint"):
            if settings.get(option):
                raise ValueError(f"--{option}: with --coordinator the election decides the master")
        for option in ("group", "node-id", "advertise"):
            if not settings.get(option):
                raise ValueError(f"--coordinator needs --{option}")
        if settings.get("http") and not settings.get("advertise-http"):
            raise ValueError("--coordinator with --http needs --advertise-http (for the master hint)")
        if self["min-in-sync-replicas"] is None and "minInSyncReplicas" not in conf:
            if settings["role"] is Role.SYNC_MASTER and settings["in-sync-replicas"] >= 2:
                # A PUT_OK must survive the loss of any one node.
                settings["min-in-sync-replicas"] = 2
        if settings.get("tls-cert") is not None and settings.get("tls-ca") is None:
            raise ValueError(
                "--coordinator with --tls-cert needs --tls-ca: a node follows its peers over TLS"
            )
        if settings.get("tls-server-name") is not None:
            raise ValueError(
                "--tls-server-name: with --coordinator a master's certificate must name "
                "its node id, which is what a slave checks"
            )
        self._check_group_auth(settings, conf)

    def _check_group_auth(self, settings: dict[str, Any], conf: dict[str, str]) -> None:
        """
        Failover: how members prove their node ids (docs/failover.md, "Who
        counts"): a group secret, TLS client certificates, or, only when
        asked for by name, neither.  The secret is read now, so a bad file
        is a usage error naming where its path came from.
        """
        path = settings.get("group-secret-file")
        if self["group-secret-file"] is not None:
            source = "--group-secret-file"
        elif path is not None:
            source = f"groupSecretFile in {self['config']}"
        else:
            path = os.environ.get(GROUP_SECRET_ENV) or None
            source = GROUP_SECRET_ENV
        certificates = settings.get("tls-cert") is not None and settings["tls-require-client-cert"]
        if settings["insecure-group"]:
            if path is not None or certificates:
                what = source if path is not None else "--tls-require-client-cert"
                raise ValueError(
                    f"--insecure-group and {what} contradict each other: the group "
                    "is either authenticated or not"
                )
            return
        if path is None and not certificates:
            raise ValueError(
                "--coordinator needs an authenticated group: give --group-secret-file "
                f"PATH (groupSecretFile, or ${GROUP_SECRET_ENV}; rmqha certs init --group "
                "writes one), or TLS client certificates naming the node ids (--tls-cert, "
                "--tls-key, --tls-ca, --tls-require-client-cert), or --insecure-group to "
                "run without (docs/failover.md)"
            )
        if path is not None:
            settings["group-secret"] = load_group_secret(path, source)
        settings["group-certificates"] = certificates

    @staticmethod
    def group_auth(settings: dict[str, Any]) -> GroupAuth | None:
        """
        Failover: how this node and its peers prove their node ids, or
        C{None} (C{--insecure-group}).
        """
        secret = settings.get("group-secret")
        certificates = bool(settings.get("group-certificates"))
        if secret is None and not certificates:
            return None
        return GroupAuth(
            settings["group"], settings["node-id"], secret, certificates=certificates
        )

    def _check_tls(self, settings: dict[str, Any], conf: dict[str, str]) -> None:
        """
        Decide the TLS set-up, and load every file now so a bad one is a
        usage error naming its flag, not a failure at the first connection.
        """
        files = self.tls_files(settings)
        if settings["role"].is_master:
            for option in ("tls-server-name",):
                if settings.get(option) is not None:
                    raise ValueError(f"--{option} is for slaves")
            if settings.get("tls-cert") is not None:
                listen = settings["ha-listen"]
                bare = self.get("ha-listen") is None or self["ha-listen"].strip().isdigit()
                if bare and listen.startswith("tcp:"):
                    # A bare port (haListenPort, --ha-listen 10912, the
                    # default) with a certificate: TLS.
                    listen = settings["ha-listen"] = "ssl:" + listen[len("tcp:") :]
                if not listen.startswith("ssl:"):
                    raise ValueError(
                        f"--ha-listen {listen}: with --tls-cert the HA port serves "
                        "TLS; give ssl:PORT[:interface=ADDRESS]"
                    )
                parse_ssl_listen(listen)
                server_context(files, self.peer_policy(settings))
            else:
                for option in ("tls-key", "tls-ca", "tls-allowed-peers"):
                    if settings.get(option) is not None:
                        raise ValueError(f"--{option} needs --tls-cert (the master's)")
                if settings["tls-require-client-cert"]:
                    raise ValueError("--tls-require-client-cert needs --tls-cert and --tls-ca")
        else:
            for option in ("tls-allowed-peers", "tls-require-client-cert"):
                if settings.get(option):
                    raise ValueError(f"--{option} is for masters")
            if settings.get("tls-ca") is None:
                for option in ("tls-cert", "tls-key", "tls-server-name"):
                    if settings.get(option) is not None:
                        raise ValueError(f"--{option} needs --tls-ca (the master's CA)")
            else:
                if self["master-endpoint"]:
                    raise ValueError(
                        "--tls-* settings apply to --master; with --master-endpoint "
                        "give TLS in the description (tls:HOST:PORT:trustRoots=...)"
                    )
                files.trust_root()
                if files.cert is not None or files.key is not None:
                    files.key_pair()

    def _check_http(self, settings: dict[str, Any]) -> None:
        """
        C{--http ssl:…} serves the admin port over TLS with this broker's
        key pair, requiring client certificates from C{--tls-ca}.
        """
        http = settings.get("http")
        if http is None and settings.get("serve-commitlog"):
            raise ValueError("--serve-commitlog (serveCommitLog) needs --http")
        if http is None or not http.startswith("ssl:"):
            if settings.get("http-allowed-peers") is not None:
                raise ValueError("--http-allowed-peers needs --http ssl:PORT")
            return
        files = self.tls_files(settings)
        if files.cert is None or files.key is None or files.ca is None:
            raise ValueError(
                f"--http {http}: the admin port serves TLS requiring client "
                "certificates; give --tls-cert, --tls-key and --tls-ca"
            )
        parse_ssl_listen(http, "--http")
        server_context(files, self.http_peer_policy(settings))

    @staticmethod
    def http_peer_policy(settings: dict[str, Any]) -> PeerPolicy:
        return PeerPolicy(
            require_client_cert=True,
            allowed_peers=settings.get("http-allowed-peers"),
            allowlist_flag="--http-allowed-peers",
        )

    @staticmethod
    def tls_files(settings: dict[str, Any]) -> TLSFiles:
        return TLSFiles(settings.get("tls-cert"), settings.get("tls-key"), settings.get("tls-ca"))

    @staticmethod
    def peer_policy(settings: dict[str, Any]) -> PeerPolicy:
        return PeerPolicy(
            require_client_cert=settings["tls-require-client-cert"],
            allowed_peers=settings.get("tls-allowed-peers"),
        )

    def ha_config(self) -> HAConfig:
        s = self.settings
        return HAConfig(
            transfer_batch_size=s["batch-size"],
            heartbeat_interval=s["heartbeat-interval"],
            housekeeping_interval=s["housekeeping-interval"],
            sync_from_last_file=s["sync-from-last-file"],
        )


def makeService(options: Options) -> IService:
    """
    The service tree for C{options}.
    """
    from twisted.internet import reactor

    s = options.settings
    store_dir = os.path.abspath(s["store-dir"])

    def open_commitlog() -> CommitLog:
        try:
            return CommitLog.open(
                store_dir,
                segment_size=s.get("segment-size"),
                commitlog_dir=s.get("commitlog-dir"),
                store_host=s["store-host"],
                flush_disk_type=s["flush-disk-type"],
                clock=reactor.seconds,
                truncate_corrupt=bool(options["truncate-corrupt"]),
            )
        except (StoreError, ValueError, OSError) as e:
            # An operator's problem, not a bug: one line, exit status 1.
            raise Fatal(f"twistd rmqha: cannot open the store: {e}") from None

    files = options.tls_files(s)
    policy = options.peer_policy(s)
    ha_listen: Any = s["ha-listen"]
    master: Any = s.get("master-endpoint") or s.get("master")
    if s["role"].is_master and files.cert is not None:
        ha_listen = server_endpoint(reactor, ha_listen, files, policy)
    elif not s["role"].is_master and files.ca is not None:
        _, _, keywords = split_description(master)
        master = client_endpoint(
            reactor, keywords["host"], int(keywords["port"]), files, s.get("tls-server-name")
        )
    http: Any = s.get("http")
    if http is not None and http.startswith("ssl:"):
        http = server_endpoint(reactor, http, files, options.http_peer_policy(s), "--http")
    coordinated = bool(s.get("coordinator"))
    broker = _TwistdBroker(
        {"ha": f"{s['ha-listen']} (--ha-listen)", "http": f"{s.get('http')} (--http)"},
        reactor,
        open_commitlog,
        Role.SLAVE if coordinated else s["role"],
        ha_listen=ha_listen,
        master_endpoint=master,
        coordinated=coordinated,
        replica_id=s.get("node-id"),
        epochs=_epoch_file(store_dir) if coordinated else None,
        max_cut=s.get("max-cut"),
        group_auth=options.group_auth(s) if coordinated else None,
        peer_policy=policy,
        on_divergence=s["on-divergence"],
        probe_timeout=s["probe-timeout"],
        # (Failover peers are rmqha nodes: never followed classically.)
        master_kind=MasterKind.RMQHA if coordinated else s["master-kind"],
        config=options.ha_config(),
        flush_interval=s["flush-interval"],
        in_sync_replicas=s["in-sync-replicas"],
        min_in_sync_replicas=s["min-in-sync-replicas"],
        slave_timeout=s["slave-timeout"],
        slave_fallbehind_max=s["slave-fallbehind-max"],
        sync_flush_timeout=s["sync-flush-timeout"],
        max_connections=s["max-connections"],
        max_connections_per_peer=s["max-connections-per-peer"],
        scrub_rate=s["scrub-rate"],
    )
    if http is not None:
        AdminService(
            broker, http, options.http_peer_policy(s), serve_commitlog=s["serve-commitlog"]
        ).setServiceParent(broker)  # type: ignore[no-untyped-call]
    if coordinated:
        return _coordinated(reactor, broker, s, files)
    return broker


def _epoch_file(store_dir: str) -> EpochFile:
    try:
        return EpochFile(store_dir)
    except (EpochFileError, OSError) as e:
        raise Fatal(f"twistd rmqha: {e}") from None


def _coordinated(reactor: Any, broker: Broker, s: dict[str, Any], files: TLSFiles) -> IService:
    """
    A broker under a failover coordinator: both under one parent, the
    coordinator started after the broker (the store must be open) and
    stopped before it (it leaves the group first).
    """
    from twisted.application.service import MultiService

    from rmqha.coord.etcd import EtcdDCS, parse_coordinator
    from rmqha.coord.node import Coordinator, FailoverSettings

    def dial(address: str, node_id: str) -> Any:
        host, port = parse_host_port(address, "address")
        if files.ca is not None:
            # The master's certificate must name the elected node's id.
            return client_endpoint(reactor, host, port, files, node_id)
        return f"tcp:host={host.replace(':', chr(92) + ':')}:port={port}"

    settings = FailoverSettings(
        s["group"],
        s["node-id"],
        s["advertise"],
        s.get("advertise-http"),
        role=s["role"],
        lease_ttl=s["lease-ttl"],
        allow_unclean_election=s["allow-unclean-election"],
        electable=not s["no-failover"],
    )
    try:
        dcs = EtcdDCS(reactor, parse_coordinator(s["coordinator"]), s["group"])
    except ValueError as e:
        # (A TLS or password file of the spec cannot be read: one line.)
        raise Fatal(f"twistd rmqha: {e}") from None
    coordinator = Coordinator(reactor, dcs, broker, settings, dial, on_fatal=_stop_twistd(reactor))
    broker.coordinator = coordinator
    top = MultiService()
    broker.setServiceParent(top)  # type: ignore[no-untyped-call]
    coordinator.setServiceParent(top)  # type: ignore[no-untyped-call]
    return top


def _stop_twistd(reactor: Any) -> Callable[[str], None]:
    """
    What stops twistd, with exit status 1, when the node must not run (the
    coordinator found its node id live in another process): a clean
    shutdown first (the store closed, the pidfile removed), then the
    status, which twistd has no way of its own to set.
    """

    def stop(why: str) -> None:
        import atexit
        import sys

        def exit_1() -> None:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)

        atexit.register(exit_1)
        reactor.callLater(0, reactor.stop)

    return stop


@contextmanager
def _one_line(ports: dict[str, str]) -> Iterator[None]:
    try:
        yield
    except ListenFailed as e:
        # An operator's problem: one line, exit status 1.
        raise Fatal(
            f"twistd rmqha: cannot listen on {ports.get(e.port, e.description)}: {e.reason}"
        ) from None


class _TwistdBroker(Broker):
    """
    A L{Broker} under twistd: a port it cannot listen on stops twistd
    with one line naming the flag, before the store is opened.
    """

    def __init__(self, ports: dict[str, str], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Log as the broker it is (a class attribute's namespace would
        # name this class).
        self._log = Logger(namespace="rmqha.broker.Broker", source=self)
        self._port_flags = ports

    def privilegedStartService(self) -> None:
        with _one_line(self._port_flags):
            super().privilegedStartService()

    def startService(self) -> None:
        with _one_line(self._port_flags):
            super().startService()
