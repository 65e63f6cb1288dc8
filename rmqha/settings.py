# -*- test-case-name: tests.test_settings,tests.test_tap -*-
"""
A broker's settings: one frozen, typed L{BrokerSettings}.

Every setting is declared once, in L{BrokerSettings}: its type, its
default, its C{twistd rmqha} flag, its RocketMQ C{broker.conf} key (where
there is one), how the text of either is parsed, and its help line.  The
twistd options (L{rmqha.tap}) and the broker.conf mapping are generated
from these declarations; the cross-field rules are checked when the object
is built, whoever builds it (the command line, a broker.conf, an embedder's
code), and each raises L{SettingsError} with one line naming the flag.

A new setting is one field here (and its use where it acts).
"""

from __future__ import annotations

import difflib
import os
from typing import Any, Callable, Mapping

import attrs
from twisted.internet.interfaces import IStreamClientEndpoint, IStreamServerEndpoint

from rmqha._limits import DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_PEER
from rmqha._units import parse_rate, parse_size
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
    MAX_BUSY_POLL,
    HAConfig,
    MasterKind,
    OnDivergence,
    Role,
)
from rmqha.store._segments import MAX_SEGMENT_SIZE, MIN_SEGMENT_SIZE, FlushDiskType
from rmqha.store.scrub import DEFAULT_SCRUB_RATE, parse_scrub_rate
from rmqha.store.service import DEFAULT_FLUSH_INTERVAL
from rmqha.tls import PeerPolicy, TLSFiles

__all__ = [
    "BrokerSettings",
    "Declaration",
    "SettingsError",
    "CRITICAL_KEYS",
    "DEFAULT_LEASE_TTL",
    "GROUP_SECRET_ENV",
    "ROCKETMQ_KEYS",
    "check_keys",
    "declarations",
    "master_description",
    "parse_bool",
    "parse_host_port",
]

#: The default C{--lease-ttl}, seconds: etcd's minimum with its default
#: election timeout (a TTL of 1 is granted as 2).
DEFAULT_LEASE_TTL = 2

#: The environment variable naming the group secret file when neither the
#: command line nor broker.conf does (failover only).
GROUP_SECRET_ENV = "RMQHA_GROUP_SECRET_FILE"


class SettingsError(ValueError):
    """
    A bad setting, or settings that contradict each other: one line naming
    the flag (and the broker.conf key or file, where it came from there).
    """


# -- parsing the text of a flag or a broker.conf value -------------------------


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


def parse_bool(text: str) -> bool:
    """
    A broker.conf C{true} or C{false} (any case).

    @raise ValueError: anything else.
    """
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"{text!r} is not true or false")
    return value == "true"


def _positive_ms(text: str) -> float:
    if not text.strip().isdigit() or int(text) <= 0:
        raise ValueError(f"{text!r} is not a positive number of milliseconds")
    return int(text) / 1000


def _busy_poll(text: str) -> float:
    limit = round(MAX_BUSY_POLL * 1e6)
    if not text.strip().isdigit() or int(text) > limit:
        raise ValueError(f"{text!r} is not a number of microseconds in 0..{limit}")
    return int(text) / 1e6


def _millis(text: str) -> int:
    if not text.strip().isdigit() or not 0 < int(text) <= 3_600_000:
        raise ValueError(f"{text!r} is not a number of milliseconds in 1..3600000")
    return int(text)


def _size(text: str) -> int:
    return parse_size(text, "value")


def _transfer_limit(text: str) -> int:
    if not text.strip().isdigit() or not 0 < int(text) <= 1 << 30:
        raise ValueError(f"{text!r} is not a number in 1..1073741824")
    return int(text)


def _segment_size(text: str) -> int:
    size = parse_size(text, "value")
    if not MIN_SEGMENT_SIZE <= size <= MAX_SEGMENT_SIZE:
        raise ValueError(f"{size} is outside {MIN_SEGMENT_SIZE}..{MAX_SEGMENT_SIZE}")
    return size


def _consume_queue_file_size(text: str) -> int:
    size = parse_size(text, "value")
    if size < 20:
        raise ValueError(f"{size} is less than one 20-byte consume-queue unit")
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


def master_description(host: str, port: int) -> str:
    """
    The Twisted client endpoint description of the master at C{host:port}.
    """
    # Colons in an IPv6 address are escaped in endpoint descriptions.
    return f"tcp:host={host.replace(':', chr(92) + ':')}:port={port}"


def _master_address(text: str) -> str:
    return master_description(*parse_host_port(text.strip(), "address"))


def _host_port(text: str) -> str:
    host, port = parse_host_port(text.strip(), "address")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _advertised(text: str) -> str:
    host, port = parse_host_port(text.strip(), "address")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _coordinator(text: str) -> str:
    if not text.strip().startswith("etcd:"):
        raise ValueError(
            f"{text!r} is not a coordinator: give etcd:http://HOST:PORT[,http://HOST:PORT...]"
        )
    return text.strip()


def _name(text: str) -> str:
    if not text.strip():
        raise ValueError("empty name")
    return text.strip()


def _group_name(text: str) -> str:
    name = _name(text)
    if "/" in name or any(c.isspace() for c in name):
        raise ValueError(f"{text!r}: no '/' or spaces in a name")
    return name


def _namesrv(text: str) -> tuple[str, ...]:
    from rmqha.remoting.namesrv import parse_namesrv_addr

    return parse_namesrv_addr(text)


def _broker_id(text: str) -> int:
    if not text.strip().isdigit():
        raise ValueError(f"{text!r} is not a broker id (0 or more)")
    return int(text)


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


def _file_path(text: str) -> str:
    if not text.strip():
        raise ValueError("no file named")
    return os.path.abspath(text)


def _peers(text: str) -> frozenset[str]:
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise ValueError(f"{text!r} names no peer")
    return names


def _store_host(text: str) -> tuple[str, int]:
    return parse_host_port(text, "value")


# -- converters: what code may give instead of the enum ------------------------


def _to_on_divergence(value: OnDivergence | str | None) -> OnDivergence | None:
    if value is None or isinstance(value, OnDivergence):
        return value
    try:
        return OnDivergence(value)
    except ValueError:
        allowed = ", ".join(m.value for m in OnDivergence)
        raise SettingsError(f"--on-divergence {value!r} is not one of {allowed}") from None


def _to_master_kind(value: MasterKind | str) -> MasterKind:
    if isinstance(value, MasterKind):
        return value
    try:
        return MasterKind(value)
    except ValueError:
        allowed = ", ".join(m.value for m in MasterKind)
        raise SettingsError(f"--master-kind {value!r} is not one of {allowed}") from None


# -- declarations --------------------------------------------------------------


@attrs.frozen
class Declaration:
    """
    How one setting is given: its flag, its broker.conf key, how their
    text is parsed, its help line.

    @ivar name: the attribute of L{BrokerSettings}.
    @ivar flag: the C{twistd rmqha} option without C{--}, or C{None} (from
        code only).
    @ivar key: the broker.conf key, or C{None}.
    @ivar parse: the flag's text to the value (C{None} for a switch).
    @ivar parse_key: the broker.conf value's text to the value, when it
        differs from C{parse}.
    @ivar switch: a flag without a value (its key is C{true}/C{false}).
    @ivar help: the help line, without the key.
    @ivar key_note: added after the key in the help line.
    """

    name: str
    flag: str | None
    key: str | None
    parse: Callable[[str], Any] | None
    parse_key: Callable[[str], Any] | None
    switch: bool
    help: str
    key_note: str = ""

    @property
    def source(self) -> str:
        """
        How an error names the setting: C{--flag}, or the attribute.
        """
        return f"--{self.flag}" if self.flag else self.name

    @property
    def help_line(self) -> str:
        """
        The help line, with the broker.conf key in brackets.
        """
        if self.key is None:
            return self.help
        return f"{self.help} [{self.key}{self.key_note}]"


_META = "rmqha.setting"


def _setting(
    default: Any,
    help: str = "",
    *,
    flag: str | None = "",
    key: str | None = None,
    parse: Callable[[str], Any] | None = str,
    parse_key: Callable[[str], Any] | None = None,
    switch: bool = False,
    key_note: str = "",
    converter: Callable[[Any], Any] | None = None,
) -> Any:
    """
    One field of L{BrokerSettings} and its L{Declaration} (completed with
    the field's name when the class is built): C{flag=""} is the name
    with dashes, C{flag=None} no flag.
    """
    spec = {
        "flag": flag,
        "key": key,
        "parse": None if switch else parse,
        "parse_key": parse_key,
        "switch": switch,
        "help": help,
        "key_note": key_note,
    }
    if converter is not None:
        return attrs.field(default=default, metadata={_META: spec}, converter=converter)
    return attrs.field(default=default, metadata={_META: spec})


@attrs.frozen(kw_only=True)
class BrokerSettings:
    """
    Every setting of one broker, checked.  Build it with keywords (the
    attributes below; intervals in seconds, sizes in bytes), from
    C{twistd rmqha}'s options (L{rmqha.tap.Options.settings}) or with
    L{BrokerSettings.from_sources}; change one with L{attrs.evolve}, which
    checks again.

    @raise SettingsError: a bad value or a contradiction, naming the flag.
    """

    # -- the role and the store
    role: Role = _setting(
        Role.MASTER,
        "master (= ASYNC_MASTER), SYNC_MASTER or slave (SLAVE)",
        key="brokerRole",
        parse=_role,
    )
    store_dir: str | None = _setting(None, "store root", key="storePathRootDir")
    commitlog_dir: str | None = _setting(
        None,
        "commit log directory (default STORE_DIR/commitlog)",
        key="storePathCommitLog",
    )
    segment_size: int | None = _setting(
        None,
        "segment size for a new store, e.g. 1g, 64m (default 1g; an existing "
        "store's files decide)",
        key="mappedFileSizeCommitLog",
        parse=_segment_size,
    )
    consume_queue_file_size: int | None = _setting(
        None,
        "bytes per consume-queue file for new queues, rounded up to 20-byte "
        "units (default 6000000 = 300,000 units; existing files decide)",
        key="mappedFileSizeConsumeQueue",
        parse=_consume_queue_file_size,
    )
    flush_disk_type: FlushDiskType = _setting(
        FlushDiskType.ASYNC_FLUSH,
        "ASYNC_FLUSH (default) or SYNC_FLUSH",
        key="flushDiskType",
        parse=_flush_type,
    )
    flush_interval: float = _setting(
        DEFAULT_FLUSH_INTERVAL,
        "ms between async flushes (500)",
        key="flushIntervalCommitLog",
        parse=_positive_ms,
    )
    store_host: tuple[str, int] | None = _setting(
        None,
        "HOST:PORT written as STOREHOST, the address in every msgId (default: "
        "brokerIP1:listenPort with --listen, as RocketMQ; else 127.0.0.1:10911)",
        parse=_store_host,
    )
    truncate_corrupt: bool = _setting(
        False,
        "when the store has a bad record with valid records after it, cut the log "
        "there (everything cut is kept in STORE/rmqha/quarantine/) instead of "
        "refusing to start; prefer 'rmqha store repair' (no broker.conf key: a "
        "one-off decision)",
        switch=True,
    )

    # -- where it listens, whom it follows
    ha_listen: str | IStreamServerEndpoint = _setting(
        DEFAULT_HA_LISTEN,
        "master: a port or Twisted server endpoint for slaves (tcp:10912)",
        key="haListenPort",
        key_note=", honoured, unlike 4.9",
        parse=_listen_endpoint,
        parse_key=_port_endpoint,
    )
    master: str | None = _setting(
        None,
        "slave: the master's HA address HOST:PORT",
        key="haMasterAddress",
        parse=_master_address,
    )
    master_endpoint: str | IStreamClientEndpoint | None = _setting(
        None, "slave: the master as any Twisted client endpoint description"
    )
    listen: str | IStreamServerEndpoint | None = _setting(
        None,
        "RocketMQ remoting port (topic config, offsets, runtime info for a "
        "NameServer, a slave, mqadmin) on this port or Twisted server endpoint, "
        "e.g. tcp:10911, or ssl:PORT for TLS with --tls-cert/--tls-key; a fixed "
        "port also opens RocketMQ's VIP port, the port less 2 "
        "(default: none, unlike RocketMQ's 10911; docs/remoting.md)",
        key="listenPort",
        parse=_listen_endpoint,
        parse_key=_port_endpoint,
    )
    master_remoting: str | None = _setting(
        None,
        "slave: the master's remoting address HOST:PORT (its listenPort, e.g. "
        "10911), to copy its topics, offsets and subscription groups from every 10 s",
        key="masterRemotingAddress",
        key_note=", rmqha's",
        parse=_host_port,
    )
    http: str | None = _setting(
        None,
        "admin HTTP (/status, /metrics, produce) on this port or Twisted server "
        "endpoint, e.g. tcp:8080:interface=127.0.0.1, or ssl:PORT[:interface=...] "
        "for TLS with --tls-cert/--tls-key, client certificates from --tls-ca required",
        parse=_listen_endpoint,
    )
    http_allowed_peers: frozenset[str] | None = _setting(
        None,
        "with --http ssl:...: NAME[,NAME...] an admin client certificate's DNS "
        "names (or CN) must include one of",
        parse=_peers,
    )
    serve_commitlog: int = _setting(
        0,
        "with --http: serve the commit log's segment files read-only under "
        "/commitlog at this many bytes per second for all readers together, e.g. "
        "64m (a live-broker pipeline source); 0 or off: not served (off)",
        key="serveCommitLog",
        parse=lambda t: parse_rate(t, "commit-log rate"),
    )
    access_log: str | None = _setting(
        None,
        "with --http: write a line per admin HTTP request (Combined Log Format) "
        "to FILE, rotated at 10 MiB keeping FILE.1..FILE.10 (and by SIGUSR1); "
        "default: none (every POST would be a line)",
        key="accessLog",
        parse=_file_path,
    )

    # -- RocketMQ's HA settings
    batch_size: int = _setting(
        DEFAULT_HA_CONFIG.transfer_batch_size,
        "most bytes in one frame, at most 4 MiB - 12 (32k)",
        key="haTransferBatchSize",
        parse=_batch_size,
    )
    heartbeat_interval: float = _setting(
        DEFAULT_HA_CONFIG.heartbeat_interval,
        "ms of silence before a heartbeat or report (5000)",
        key="haSendHeartbeatInterval",
        parse=_positive_ms,
    )
    housekeeping_interval: float = _setting(
        DEFAULT_HA_CONFIG.housekeeping_interval,
        "ms of silence before a peer is dropped (20000)",
        key="haHousekeepingInterval",
        parse=_positive_ms,
    )
    sync_from_last_file: bool = _setting(
        DEFAULT_HA_CONFIG.sync_from_last_file,
        "an empty slave gets only the master's last segment (4.9's rule; default: "
        "the whole log)",
        key="syncFromLastFile",
        switch=True,
    )
    busy_poll: float = _setting(
        DEFAULT_HA_CONFIG.busy_poll,
        "us the reactor polls without sleeping, before it sleeps, while a SYNC "
        "put waits for its ack (master) or frames come back to back (slave): "
        "lower latency for CPU (200; 0: off; at most 10000; docs/sync.md, "
        "'Busy polling')",
        key="haBusyPoll",
        key_note=", rmqha's",
        parse=_busy_poll,
    )
    slave_fallbehind_max: int = _setting(
        DEFAULT_SLAVE_FALLBEHIND_MAX,
        "a slave this many bytes behind a put's end does not count as in sync (256m)",
        flag=None,
        key="haSlaveFallbehindMax",
        parse=_size,
    )
    slave_timeout: float = _setting(
        DEFAULT_SLAVE_TIMEOUT,
        "ms a SYNC_MASTER put waits for slaves (3000)",
        key="slaveTimeout",
        parse=_positive_ms,
    )
    sync_flush_timeout: float = _setting(
        DEFAULT_SYNC_FLUSH_TIMEOUT,
        "ms a SYNC_FLUSH put waits for its flush (5000)",
        flag=None,
        key="syncFlushTimeout",
        parse=_positive_ms,
    )
    in_sync_replicas: int = _setting(
        DEFAULT_IN_SYNC_REPLICAS,
        "copies a SYNC_MASTER put waits for, the master's included (2)",
        key="inSyncReplicas",
        parse=_replicas,
    )
    min_in_sync_replicas: int = _setting(
        DEFAULT_MIN_IN_SYNC_REPLICAS,
        "fewer in-sync copies fail a put at once with IN_SYNC_REPLICAS_NOT_ENOUGH "
        "(1; 2 for a failover SYNC_MASTER of 2 or more in-sync replicas)",
        key="minInSyncReplicas",
        parse=_replicas,
    )
    max_unflushed: int = _setting(
        DEFAULT_MAX_UNFLUSHED,
        "a slave stops reading from its master while more received bytes than "
        "this are not on disk",
        flag=None,
    )

    # -- rmqha's slave checks
    on_divergence: OnDivergence | None = _setting(
        DEFAULT_ON_DIVERGENCE,
        "slave: when its log has diverged from the master's: halt (default), "
        "truncate, rebootstrap, or off",
        key="haOnDivergence",
        parse=_on_divergence,
        converter=_to_on_divergence,
    )
    probe_timeout: float = _setting(
        DEFAULT_PROBE_TIMEOUT,
        "slave: most ms to wait for the master's whole answer to the rmqha control "
        "probe (3000); one silent for 500 ms is taken for a RocketMQ master unless "
        "it spoke the extension before",
        key="haProbeTimeout",
        parse=_positive_ms,
    )
    master_kind: MasterKind = _setting(
        DEFAULT_MASTER_KIND,
        "slave: auto (default: probe; a master once seen speaking the rmqha "
        "extension is never taken for a RocketMQ one), rmqha (never replicate "
        "classically) or rocketmq (no probe)",
        key="haMasterKind",
        parse=_master_kind,
        converter=_to_master_kind,
    )
    scrub_rate: int = _setting(
        DEFAULT_SCRUB_RATE,
        "bytes per second the background scrub re-reads and re-checks every record "
        "at, e.g. 8MiB; 0 or off disables it (32MiB)",
        key="scrubRate",
        parse=parse_scrub_rate,
    )

    # -- limits
    max_connections: int = _setting(
        DEFAULT_MAX_CONNECTIONS,
        "connections each listening port (HA, HTTP) accepts at once; more are "
        f"closed at once ({DEFAULT_MAX_CONNECTIONS})",
        key="maxConnections",
        parse=_connections,
    )
    max_connections_per_peer: int = _setting(
        DEFAULT_MAX_CONNECTIONS_PER_PEER,
        f"connections one host may hold on each port ({DEFAULT_MAX_CONNECTIONS_PER_PEER})",
        key="maxConnectionsPerPeer",
        parse=_connections,
    )

    # -- TLS
    tls_cert: str | None = _setting(
        None,
        "PEM certificate (and chain) of this broker; on a master, serve TLS on "
        "--ha-listen ssl:PORT",
        key="haTlsCert",
    )
    tls_key: str | None = _setting(None, "PEM private key of --tls-cert", key="haTlsKey")
    tls_ca: str | None = _setting(
        None,
        "PEM CA certificate(s) the peer must chain to; on a slave, follow --master "
        "over TLS",
        key="haTlsCa",
    )
    tls_require_client_cert: bool = _setting(
        False,
        "master: refuse slaves without a certificate signed by --tls-ca",
        key="haTlsRequireClientCert",
        switch=True,
    )
    tls_allowed_peers: frozenset[str] | None = _setting(
        None,
        "master: NAME[,NAME...] a slave certificate's DNS names (or CN) must include one of",
        key="haTlsAllowedPeers",
        parse=_peers,
    )
    tls_server_name: str | None = _setting(
        None,
        "slave: the name the master's certificate must carry (default: the --master host)",
        key="haTlsServerName",
        parse=_name,
    )

    # -- NameServers (docs/remoting.md, "NameServers")
    namesrv: tuple[str, ...] | None = _setting(
        None,
        "NameServers HOST:PORT[;HOST:PORT...] to register with every 30 s (a slave "
        "without --master follows the master they name)",
        key="namesrvAddr",
        parse=_namesrv,
    )
    cluster: str = _setting(
        "DefaultCluster",
        "with --namesrv: the cluster's name (DefaultCluster)",
        key="brokerClusterName",
        parse=_group_name,
    )
    broker_id: int = _setting(
        0,
        "with --namesrv: the id a slave registers as, 1 or more (a master registers as 0)",
        key="brokerId",
        parse=_broker_id,
    )
    broker_ip1: str | None = _setting(
        None,
        "with --namesrv: the address clients reach the remoting port at (default: "
        "the host name's address)",
        key="brokerIP1",
        parse=_name,
    )
    broker_ip2: str | None = _setting(
        None,
        "with --namesrv: the address slaves reach --ha-listen at, registered as "
        "haServerAddr (default: --broker-ip1)",
        key="brokerIP2",
        parse=_name,
    )
    auto_create_topic_enable: bool = _setting(
        True,
        "true (default, as RocketMQ) or false: a send to an unknown topic creates it "
        "from TBW102 (docs/remoting.md, \"Producing\")",
        key="autoCreateTopicEnable",
        parse=parse_bool,
    )
    # -- pulls (docs/remoting.md, "Consuming")
    slave_read_enable: bool = _setting(
        False,
        "true or false (default, as RocketMQ): pull replies suggest a slave "
        "(whichBrokerWhenConsumeSlowly) to a consumer reading far behind",
        key="slaveReadEnable",
        parse=parse_bool,
    )
    long_polling_enable: bool = _setting(
        True,
        "true (default, as RocketMQ) or false: a pull that finds nothing is held until "
        "its queue grows (false: for shortPollingTimeMills)",
        key="longPollingEnable",
        parse=parse_bool,
    )
    broker_suspend_max_time_millis: int = _setting(
        15_000,
        "ms a pull is held at most, whatever its suspendTimeoutMillis (15000)",
        key="brokerSuspendMaxTimeMillis",
        parse=_millis,
    )
    short_polling_time_mills: int = _setting(
        1000,
        "ms a pull is held with longPollingEnable=false (1000, as RocketMQ)",
        key="shortPollingTimeMills",
        parse=_millis,
    )
    offset_check_in_slave: bool = _setting(
        False,
        "true or false (default, as RocketMQ): a slave corrects a pull's offset "
        "(PULL_OFFSET_MOVED) as a master does, instead of PULL_RETRY_IMMEDIATELY",
        key="offsetCheckInSlave",
        parse=parse_bool,
    )
    max_transfer_bytes_on_message_in_memory: int = _setting(
        256 * 1024,
        "bytes one pull carries at most while its records are in memory (262144, as RocketMQ)",
        key="maxTransferBytesOnMessageInMemory",
        parse=_transfer_limit,
    )
    max_transfer_count_on_message_in_memory: int = _setting(
        32,
        "records one pull carries at most while they are in memory (32, as RocketMQ)",
        key="maxTransferCountOnMessageInMemory",
        parse=_transfer_limit,
    )
    max_transfer_bytes_on_message_in_disk: int = _setting(
        64 * 1024,
        "bytes one pull carries at most once its records are in disk (65536, as RocketMQ)",
        key="maxTransferBytesOnMessageInDisk",
        parse=_transfer_limit,
    )
    max_transfer_count_on_message_in_disk: int = _setting(
        8,
        "records one pull carries at most once they are in disk (8, as RocketMQ)",
        key="maxTransferCountOnMessageInDisk",
        parse=_transfer_limit,
    )

    # -- failover
    coordinator: str | None = _setting(
        None,
        "automatic failover through etcd: etcd:http://HOST:PORT[,http://HOST:PORT...] "
        "(https:// endpoints take ,tlsCa=PATH,tlsCert=PATH,tlsKey=PATH; etcd's auth "
        ",user=NAME,passwordFile=PATH or RMQHA_ETCD_PASSWORD); every node starts as a "
        "slave, --role says how it acts once elected (docs/failover.md)",
        key="coordinator",
        parse=_coordinator,
    )
    group: str | None = _setting(
        None,
        "the broker's name: with --coordinator the group's name; with --namesrv "
        "the brokerName registered (default: the host name)",
        key="brokerName",
        parse=_group_name,
    )
    node_id: str | None = _setting(
        None,
        "with --coordinator: this node's unique id (also the id a slave declares to "
        "its master)",
        key="nodeId",
        parse=_group_name,
    )
    advertise: str | None = _setting(
        None,
        "with --coordinator: HOST:PORT of --ha-listen as peers dial it",
        key="advertise",
        parse=_advertised,
    )
    advertise_http: str | None = _setting(
        None,
        "with --coordinator: HOST:PORT of --http as clients reach it",
        key="advertiseHttp",
        parse=_advertised,
    )
    lease_ttl: int = _setting(
        DEFAULT_LEASE_TTL,
        f"with --coordinator: seconds of the lease a master holds ({DEFAULT_LEASE_TTL}; "
        "a dead master is replaced after about this long)",
        key="leaseTtl",
        parse=_lease_ttl,
    )
    max_cut: int | None = _setting(
        None,
        "failover: the most bytes a slave's checks may cut from its log "
        "(quarantined); a bigger cut halts it, naming this option "
        "(2 x --slave-fallbehind-max)",
        key="haMaxCut",
        parse=_size,
    )
    group_secret_file: str | None = _setting(
        None,
        "with --coordinator: a file holding the group's shared secret (not readable "
        "by others; rmqha certs init --group writes one): members prove their node "
        "ids to each other with it on every HA connection (docs/failover.md)",
        key="groupSecretFile",
        key_note=f"; or ${GROUP_SECRET_ENV}",
    )
    allow_unclean_election: bool = _setting(
        False,
        "with --coordinator: when no member of the in-sync set lives, elect another "
        "node anyway, losing every put it lacks (docs/failover.md)",
        key="allowUncleanElection",
        switch=True,
    )
    no_failover: bool = _setting(
        False,
        "with --coordinator: never stand for election (follow only)",
        key="noFailover",
        switch=True,
    )
    insecure_group: bool = _setting(
        False,
        "with --coordinator: run the group without authentication (node ids on the "
        "HA port only declared: anyone who reaches it can pose as a member and ack "
        "puts it does not hold; docs/failover.md)",
        key="insecureGroup",
        switch=True,
    )

    def __attrs_post_init__(self) -> None:
        for rule in _RULES:
            rule(self)

    # -- derived settings ----------------------------------------------------

    @property
    def ha_config(self) -> HAConfig:
        """
        RocketMQ's HA settings, as the protocols take them.
        """
        return HAConfig(
            transfer_batch_size=self.batch_size,
            heartbeat_interval=self.heartbeat_interval,
            housekeeping_interval=self.housekeeping_interval,
            sync_from_last_file=self.sync_from_last_file,
            busy_poll=self.busy_poll,
        )

    @property
    def failover(self) -> bool:
        """
        Whether a coordinator gives this broker its role.
        """
        return self.coordinator is not None

    @property
    def followed_kind(self) -> MasterKind:
        """
        The kind of master a slave follows: failover peers are rmqha nodes,
        never followed classically.
        """
        return MasterKind.RMQHA if self.failover else self.master_kind

    @property
    def master_address(self) -> str | IStreamClientEndpoint | None:
        """
        A slave's master as a Twisted client endpoint description
        (C{--master-endpoint}, else C{--master}'s).
        """
        return self.master_endpoint or self.master

    @property
    def tls_files(self) -> TLSFiles:
        """
        The C{--tls-*} files (not yet read).
        """
        return TLSFiles(self.tls_cert, self.tls_key, self.tls_ca)

    @property
    def peer_policy(self) -> PeerPolicy:
        """
        What a master asks of a slave's certificate.
        """
        return PeerPolicy(
            require_client_cert=self.tls_require_client_cert,
            allowed_peers=self.tls_allowed_peers,
        )

    @property
    def http_peer_policy(self) -> PeerPolicy:
        """
        What the admin TLS port asks of a client's certificate.
        """
        return PeerPolicy(
            require_client_cert=True,
            allowed_peers=self.http_allowed_peers,
            allowlist_flag="--http-allowed-peers",
        )

    @property
    def group_certificates(self) -> bool:
        """
        Failover: members prove their node ids with TLS client certificates.
        """
        return self.tls_cert is not None and self.tls_require_client_cert

    # -- building from text ------------------------------------------------

    @classmethod
    def from_sources(
        cls,
        flags: Mapping[str, Any] | None = None,
        conf: Mapping[str, str] | None = None,
        conf_path: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> BrokerSettings:
        """
        The settings of RocketMQ's defaults, then a broker.conf, then the
        command line, each overriding the one before.

        A failover node's role defaults to SYNC_MASTER (its role once
        elected), and a failover SYNC_MASTER of 2 or more in-sync replicas
        has C{minInSyncReplicas} 2 unless given (a PUT_OK must survive the
        loss of any one node); its group secret file may come from
        C{$RMQHA_GROUP_SECRET_FILE}.  A bare port (the default, C{haListenPort},
        C{--ha-listen 10912}) on a master with a certificate serves TLS.

        @param flags: each flag's text (C{True} for a switch given) by its
            name without C{--}; C{None} (or absent): not given.
        @param conf: the broker.conf's keys and values (unknown keys are
            L{check_keys}'s concern).
        @param conf_path: the broker.conf's path, for error messages.
        @param environ: the environment (default: none).
        @raise SettingsError: naming the flag, or the key and the file.
        """
        flags = flags or {}
        conf = conf or {}
        environ = environ or {}
        values: dict[str, Any] = {}
        for d in declarations():
            if d.key is not None and d.key in conf:
                parse = parse_bool if d.switch else (d.parse_key or d.parse)
                assert parse is not None
                try:
                    values[d.name] = parse(conf[d.key])
                except ValueError as e:
                    raise SettingsError(f"{d.key} in {conf_path}: {e}") from None
            given = flags.get(d.flag) if d.flag else None
            if d.switch:
                if given:
                    values[d.name] = True
            elif given is not None:
                assert d.parse is not None
                try:
                    values[d.name] = d.parse(given)
                except ValueError as e:
                    raise SettingsError(f"--{d.flag}: {e}") from None
        if values.get("coordinator"):
            values.setdefault("role", Role.SYNC_MASTER)
            if values["role"] is Role.SYNC_MASTER and "min_in_sync_replicas" not in values:
                if values.get("in_sync_replicas", DEFAULT_IN_SYNC_REPLICAS) >= 2:
                    values["min_in_sync_replicas"] = 2
            if "group_secret_file" not in values:
                values["group_secret_file"] = environ.get(GROUP_SECRET_ENV) or None
        listen = values.get("ha_listen")
        bare = flags.get("ha-listen") is None or str(flags["ha-listen"]).strip().isdigit()
        if (
            values.get("tls_cert") is not None
            and values.get("role", Role.MASTER).is_master
            and bare
            and (listen or DEFAULT_HA_LISTEN).startswith("tcp:")
        ):
            # A bare port with a certificate: TLS.
            values["ha_listen"] = "ssl:" + (listen or DEFAULT_HA_LISTEN)[len("tcp:") :]
        try:
            return cls(**values)
        except SettingsError:
            raise
        except ValueError as e:
            raise SettingsError(str(e)) from None


def declarations() -> tuple[Declaration, ...]:
    """
    Every setting's L{Declaration}, in the order of L{BrokerSettings}.
    """
    return _DECLARATIONS


def _declaration(a: Any) -> Declaration:
    spec = dict(a.metadata[_META])
    if spec["flag"] == "":
        spec["flag"] = a.name.replace("_", "-")
    return Declaration(name=a.name, **spec)


_DECLARATIONS = tuple(_declaration(a) for a in attrs.fields(BrokerSettings))


# -- the cross-field rules, each written once ---------------------------------


def _replica_counts(s: BrokerSettings) -> None:
    if s.in_sync_replicas < 1:
        raise SettingsError(
            f"--in-sync-replicas (inSyncReplicas) {s.in_sync_replicas} must be 1 or more"
        )
    if not 1 <= s.min_in_sync_replicas <= s.in_sync_replicas:
        raise SettingsError(
            f"--min-in-sync-replicas (minInSyncReplicas) {s.min_in_sync_replicas} must be "
            f"between 1 and --in-sync-replicas (inSyncReplicas) {s.in_sync_replicas}"
        )


def _connection_limits(s: BrokerSettings) -> None:
    if s.max_connections < 1 or s.max_connections_per_peer < 1:
        raise SettingsError(
            f"--max-connections {s.max_connections} and --max-connections-per-peer "
            f"{s.max_connections_per_peer} must be at least 1"
        )


def _ha_config(s: BrokerSettings) -> None:
    try:
        s.ha_config
    except ValueError as e:
        raise SettingsError(str(e)) from None


def _probe_needed(s: BrokerSettings) -> None:
    if s.on_divergence is not None:
        return
    if s.master_kind is MasterKind.RMQHA:
        raise SettingsError(
            "--master-kind rmqha needs the control probe, which --on-divergence off turns off"
        )
    if s.failover:
        raise SettingsError(
            "--coordinator: peers are rmqha masters, followed with the control probe, "
            "which --on-divergence off turns off"
        )


def _fixed_roles(s: BrokerSettings) -> None:
    if s.failover:
        return
    for name, key in (("group-secret-file", "groupSecretFile"), ("insecure-group", "insecureGroup")):
        if getattr(s, name.replace("-", "_")):
            raise SettingsError(f"--{name} ({key}) is for failover groups: give --coordinator")
    if s.max_cut is not None:
        raise SettingsError("--max-cut (haMaxCut) is for failover mode: give --coordinator")
    if s.master_remoting is not None and s.role is not Role.SLAVE:
        raise SettingsError(
            "--master-remoting (masterRemotingAddress) is for slaves: a master syncs from no one"
        )
    if s.role is Role.SLAVE:
        if s.master and s.master_endpoint:
            raise SettingsError("give --master or --master-endpoint, not both")
        if not (s.master or s.master_endpoint or s.namesrv):
            raise SettingsError(
                "a slave needs --master HOST:PORT (or haMasterAddress, or "
                "--master-endpoint, or --namesrv to learn it from the NameServers)"
            )


def _namesrv_identity(s: BrokerSettings) -> None:
    """
    With NameServers: a slave registers with its own id, 1 or more (a
    genuine broker refuses to start otherwise); a failover node registers
    as 0 once elected and with its id as a slave.
    """
    if s.namesrv is None:
        return
    if (s.failover or s.role is Role.SLAVE) and s.broker_id < 1:
        who = "--coordinator" if s.failover else "a slave"
        raise SettingsError(
            f"--broker-id (brokerId) {s.broker_id}: with --namesrv, {who} needs its own "
            "brokerId, 1 or more (the id it registers as a slave; a master registers as 0)"
        )


def _failover(s: BrokerSettings) -> None:
    """
    With a coordinator: the node's identity is required, its role is the
    one it takes once elected, and it follows whoever is elected (no fixed
    master).
    """
    if s.coordinator is None:
        return
    from rmqha.coord.etcd import parse_coordinator

    try:
        parse_coordinator(s.coordinator)
    except ValueError as e:
        raise SettingsError(str(e)) from None
    if not s.role.is_master:
        raise SettingsError(
            "with --coordinator, --role says how the node acts once elected: "
            "SYNC_MASTER or ASYNC_MASTER (every node starts as a slave)"
        )
    for name in ("master", "master-endpoint", "master-remoting"):
        if getattr(s, name.replace("-", "_")):
            raise SettingsError(f"--{name}: with --coordinator the election decides the master")
    for name in ("group", "node-id", "advertise"):
        if not getattr(s, name.replace("-", "_")):
            raise SettingsError(f"--coordinator needs --{name}")
    if s.http and not s.advertise_http:
        raise SettingsError("--coordinator with --http needs --advertise-http (for the master hint)")
    if s.tls_cert is not None and s.tls_ca is None:
        raise SettingsError(
            "--coordinator with --tls-cert needs --tls-ca: a node follows its peers over TLS"
        )
    if s.tls_server_name is not None:
        raise SettingsError(
            "--tls-server-name: with --coordinator a master's certificate must name "
            "its node id, which is what a slave checks"
        )


def _group_auth(s: BrokerSettings) -> None:
    """
    Failover: how members prove their node ids (docs/failover.md, "Who
    counts"): a group secret, TLS client certificates, or, only when asked
    for by name, neither.
    """
    if s.coordinator is None:
        return
    if s.insecure_group:
        if s.group_secret_file is not None or s.group_certificates:
            what = (
                "--group-secret-file (groupSecretFile, $RMQHA_GROUP_SECRET_FILE)"
                if s.group_secret_file is not None
                else "--tls-require-client-cert"
            )
            raise SettingsError(
                f"--insecure-group and {what} contradict each other: the group "
                "is either authenticated or not"
            )
    elif s.group_secret_file is None and not s.group_certificates:
        raise SettingsError(
            "--coordinator needs an authenticated group: give --group-secret-file "
            f"PATH (groupSecretFile, or ${GROUP_SECRET_ENV}; rmqha certs init --group "
            "writes one), or TLS client certificates naming the node ids (--tls-cert, "
            "--tls-key, --tls-ca, --tls-require-client-cert), or --insecure-group to "
            "run without (docs/failover.md)"
        )


def _tls(s: BrokerSettings) -> None:
    """
    Which C{--tls-*} settings go with which role (the files are read by
    whoever builds the endpoints: L{rmqha.assemble}).
    """
    if s.role.is_master:
        if s.tls_server_name is not None:
            raise SettingsError("--tls-server-name is for slaves")
        if s.tls_cert is not None:
            # (An endpoint given by code is the code's business.)
            if isinstance(s.ha_listen, str) and not s.ha_listen.startswith("ssl:"):
                raise SettingsError(
                    f"--ha-listen {s.ha_listen}: with --tls-cert the HA port serves "
                    "TLS; give ssl:PORT[:interface=ADDRESS]"
                )
            try:
                s.peer_policy  # (its own rule: an allowlist needs certificates)
            except ValueError as e:
                raise SettingsError(str(e)) from None
        else:
            for name in ("tls-key", "tls-ca", "tls-allowed-peers"):
                if getattr(s, name.replace("-", "_")) is not None:
                    raise SettingsError(f"--{name} needs --tls-cert (the master's)")
            if s.tls_require_client_cert:
                raise SettingsError("--tls-require-client-cert needs --tls-cert and --tls-ca")
    else:
        for name in ("tls-allowed-peers", "tls-require-client-cert"):
            if getattr(s, name.replace("-", "_")):
                raise SettingsError(f"--{name} is for masters")
        if s.tls_ca is None:
            for name in ("tls-cert", "tls-key", "tls-server-name"):
                if getattr(s, name.replace("-", "_")) is not None:
                    raise SettingsError(f"--{name} needs --tls-ca (the master's CA)")
        elif isinstance(s.master_endpoint, str):
            raise SettingsError(
                "--tls-* settings apply to --master; with --master-endpoint "
                "give TLS in the description (tls:HOST:PORT:trustRoots=...)"
            )


def _listen(s: BrokerSettings) -> None:
    """
    C{--listen ssl:…} serves the remoting port over TLS with this broker's
    key pair (and the HA port's client-certificate policy).
    """
    if isinstance(s.listen, str) and s.listen.startswith("ssl:") and (s.tls_cert is None or s.tls_key is None):
        raise SettingsError(
            f"--listen {s.listen}: the remoting port serves TLS with this broker's "
            "key pair; give --tls-cert and --tls-key"
        )
    if isinstance(s.listen, str):
        from rmqha.remoting.broker import vip_description

        try:
            vip_description(s.listen)
        except ValueError as e:
            raise SettingsError(f"--listen {s.listen}: {e}") from None


def _http(s: BrokerSettings) -> None:
    """
    C{--http ssl:…} serves the admin port over TLS with this broker's key
    pair, requiring client certificates from C{--tls-ca}.
    """
    if s.http is None and s.serve_commitlog:
        raise SettingsError("--serve-commitlog (serveCommitLog) needs --http")
    if s.http is None and s.access_log:
        raise SettingsError("--access-log (accessLog) needs --http")
    if s.http is None or not s.http.startswith("ssl:"):
        if s.http_allowed_peers is not None:
            raise SettingsError("--http-allowed-peers needs --http ssl:PORT")
        return
    if s.tls_cert is None or s.tls_key is None or s.tls_ca is None:
        raise SettingsError(
            f"--http {s.http}: the admin port serves TLS requiring client "
            "certificates; give --tls-cert, --tls-key and --tls-ca"
        )


_RULES: list[Callable[[BrokerSettings], None]] = [
    _replica_counts,
    _connection_limits,
    _ha_config,
    _probe_needed,
    _fixed_roles,
    _namesrv_identity,
    _failover,
    _group_auth,
    _tls,
    _listen,
    _http,
]


# -- broker.conf keys ------------------------------------------------------------

#: RocketMQ 4.9 broker.conf keys that rmqha reads nowhere (its broker, name
#: server and client settings): accepted without a word.
ROCKETMQ_KEYS = frozenset(
    """
    deleteWhen fileReservedTime autoCreateSubscriptionGroup
    storePathConsumeQueue storePathIndex storeCheckpoint abortFile
    mapedFileSizeConsumeQueue mapedFileSizeCommitLog
    maxMessageSize flushCommitLogLeastPages flushConsumeQueueLeastPages
    flushIntervalConsumeQueue flushCommitLogThoroughInterval
    sendMessageThreadPoolNums pullMessageThreadPoolNums useReentrantLockWhenPutMessage
    transientStorePoolEnable transientStorePoolSize enableDLegerCommitLog dLegerGroup
    dLegerPeers dLegerSelfId aclEnable brokerPermission defaultTopicQueueNums
    messageDelayLevel diskMaxUsedSpaceRatio cleanResourceInterval
    deleteCommitLogFilesInterval redeleteHangedFileInterval
    destroyMapedFileIntervalForcibly checkCRCOnRecover warmMapedFileEnable
    transferMsgByHeap osPageCacheBusyTimeOutMills
    waitTimeMillsInSendQueue accessMessageInMemoryMaxRatio
    traceTopicEnable msgTraceTopicName enablePropertyFilter
    fetchNamesrvAddrByAddressServer rocketmqHome duplicationEnable
    """.split()
)

#: Keys whose misspelling would start a broker with another role, or on
#: another store, than the file means: an unknown key nearest one of them
#: is an error, not a warning.  (C{brokerId} is not one: the role comes
#: from C{brokerRole}; C{brokerId} is only what a slave registers as.)
CRITICAL_KEYS = frozenset(
    [
        "brokerRole",
        "storePathRootDir",
        "storePathCommitLog",
        "mappedFileSizeCommitLog",
        "flushDiskType",
        "haMasterAddress",
        "haListenPort",
        "coordinator",
        "nodeId",
    ]
)


def check_keys(conf: Mapping[str, str], path: str) -> list[str]:
    """
    The broker.conf's unknown keys: a warning for each, naming the nearest
    known key.

    @return: the warnings (one line each).
    @raise SettingsError: an unknown key whose nearest known key is one of
        L{CRITICAL_KEYS}, naming the key, the file and the known key.
    """
    ours = {d.key for d in declarations() if d.key is not None}
    known = sorted(ours | ROCKETMQ_KEYS)
    warnings = []
    for key in conf:
        if key in ours or key in ROCKETMQ_KEYS:
            continue
        near = difflib.get_close_matches(key, known, n=1)
        if not near:
            by_case = [k for k in known if k.lower() == key.lower()]
            near = by_case[:1]
        if near and near[0] in CRITICAL_KEYS:
            raise SettingsError(
                f"unknown key {key!r} in {path}: did you mean {near[0]}? (refusing "
                "to start: a misspelt one changes the role or the store)"
            )
        hint = f"did you mean {near[0]}?" if near else "not a RocketMQ or rmqha key"
        warnings.append(f"unknown key {key!r} in {path} ignored ({hint})")
    return warnings
