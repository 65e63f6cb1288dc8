# -*- test-case-name: tests.test_tap,tests.test_group_auth,tests.test_settings -*-
"""
A running broker from its L{BrokerSettings}: the service tree that
C{twistd rmqha} runs (L{rmqha.tap.makeService} is one call to
L{build_service}), for embedders too.

    settings = BrokerSettings(store_dir="/data/store", role=Role.SYNC_MASTER)
    check_files(settings)                # optional: bad TLS files now
    service = build_service(settings, reactor)
    service.setServiceParent(application)

What is built here and not in L{Broker}: the store opener of
C{--store-dir}, the TLS endpoints of the C{--tls-*} files, the admin HTTP
service of C{--http}, the epoch file, the group's authentication, and the
failover coordinator of C{--coordinator} (its L{FailoverSettings} derived
from the settings here, in L{failover_settings}).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import attrs
from twisted.application.service import IService, MultiService
from twisted.logger import Logger

from rmqha._ports import ListenFailed
from rmqha.admin import AdminService
from rmqha.broker import Broker
from rmqha.coord.failover import FailoverSettings
from rmqha.coord.node import Coordinator
from rmqha.ha.auth import GroupAuth, load_group_secret
from rmqha.ha.epochs import EpochFile, EpochFileError
from rmqha.logfile import DEFAULT_LOG_KEEP, DEFAULT_LOG_ROTATE_SIZE, LogFileSettings, open_log_file
from rmqha.remoting.broker import vip_description
from rmqha.remoting.metadata import MetadataError
from rmqha.remoting.registration import store_host_for
from rmqha.settings import BrokerSettings, master_description, parse_host_port
from rmqha.store.commitlog import CommitLog
from rmqha.store.errors import StoreError
from rmqha.tls import client_endpoint, parse_ssl_listen, server_context, server_endpoint, split_description

__all__ = [
    "Fatal",
    "build_service",
    "check_files",
    "failover_settings",
    "group_auth",
    "load_group_secret",
]


class Fatal(SystemExit, Exception):
    """
    Stops twistd with one line (the text) and exit status 1.  A
    C{SystemExit}, so that C{twistd -n} prints just the line; also an
    C{Exception}, so that a daemonizing twistd hands the line to the parent
    through its status pipe (which passes only exceptions, in 100 bytes:
    hence no module path in the name) instead of "An error has occurred: ''".
    """

    __module__ = "builtins"


def check_files(settings: BrokerSettings) -> None:
    """
    Read every TLS file the settings name, and parse the C{ssl:}
    descriptions, so that a bad one is an error naming its flag now, not a
    failure at the first connection.

    @raise ValueError: naming the flag.
    """
    files = settings.tls_files
    if settings.role.is_master:
        if files.cert is not None and isinstance(settings.ha_listen, str):
            parse_ssl_listen(settings.ha_listen)
            server_context(files, settings.peer_policy)
    elif files.ca is not None and isinstance(settings.master_endpoint, (str, type(None))):
        files.trust_root()
        if files.cert is not None or files.key is not None:
            files.key_pair()
    if settings.http is not None and settings.http.startswith("ssl:"):
        parse_ssl_listen(settings.http, "--http")
        server_context(files, settings.http_peer_policy)
    if isinstance(settings.listen, str) and settings.listen.startswith("ssl:"):
        parse_ssl_listen(settings.listen, "--listen")
        server_context(files, settings.peer_policy)
    if settings.access_log is not None:
        # Opened (made if missing) and closed: the admin port opens it again.
        open_log_file(
            LogFileSettings(settings.access_log, DEFAULT_LOG_ROTATE_SIZE, DEFAULT_LOG_KEEP),
            "--access-log",
        ).close()


def group_auth(settings: BrokerSettings, secret: bytes | None) -> GroupAuth | None:
    """
    Failover: how this node and its peers prove their node ids, or C{None}
    (C{--insecure-group}, or no coordinator).

    @param secret: the group secret (L{load_group_secret} of
        C{settings.group_secret_file}).
    """
    if not settings.failover or (secret is None and not settings.group_certificates):
        return None
    assert settings.group is not None and settings.node_id is not None
    return GroupAuth(
        settings.group, settings.node_id, secret, certificates=settings.group_certificates
    )


def failover_settings(settings: BrokerSettings) -> FailoverSettings:
    """
    The coordinator's settings, from the broker's.
    """
    assert settings.group and settings.node_id and settings.advertise
    return FailoverSettings(
        settings.group,
        settings.node_id,
        settings.advertise,
        settings.advertise_http,
        role=settings.role,
        lease_ttl=settings.lease_ttl,
        allow_unclean_election=settings.allow_unclean_election,
        electable=not settings.no_failover,
    )


def build_service(
    settings: BrokerSettings,
    reactor: Any = None,
    *,
    group_secret: bytes | None = None,
    one_line_errors: bool = False,
    listen_now: bool = False,
) -> IService:
    """
    The service tree for C{settings}: a L{Broker} (with its admin HTTP
    service under it), or, with a coordinator, the broker and its
    coordinator under one parent.

    @param reactor: default: the global reactor.
    @param group_secret: failover: the group secret, if already read
        (default: read from C{settings.group_secret_file}).
    @param one_line_errors: an operator's problem (the store cannot be
        opened, a port cannot be listened on) is a L{Fatal} of one line,
        as twistd shows it, instead of the exception.
    @param listen_now: with C{one_line_errors}, listen on the broker's
        ports now, not when the tree is started: under twistd, before it
        starts logging, so that a port in use is twistd's only output (one
        line on stderr, exit status 1) instead of following its start-up
        lines.
    @raise ValueError: the settings have no C{store_dir}.
    """
    if reactor is None:
        from twisted.internet import reactor
    if settings.store_dir is None:
        raise ValueError("--store-dir (or storePathRootDir) is required")
    store_dir = os.path.abspath(settings.store_dir)

    def open_commitlog() -> CommitLog:
        try:
            return CommitLog.open(
                store_dir,
                segment_size=settings.segment_size,
                commitlog_dir=settings.commitlog_dir,
                store_host=store_host_for(settings, _remoting_port(broker)),
                flush_disk_type=settings.flush_disk_type,
                clock=reactor.seconds,
                truncate_corrupt=settings.truncate_corrupt,
                consume_queues=True,
                # (RocketMQ rounds mappedFileSizeConsumeQueue up to units.)
                consume_queue_units=(
                    None
                    if settings.consume_queue_file_size is None
                    else -(-settings.consume_queue_file_size // 20)
                ),
            )
        except (StoreError, ValueError, OSError) as e:
            if not one_line_errors:
                raise
            # An operator's problem, not a bug: one line, exit status 1.
            raise Fatal(f"twistd rmqha: cannot open the store: {e}") from None

    files = settings.tls_files
    ports = {
        "ha": f"{settings.ha_listen} (--ha-listen)",
        "http": f"{settings.http} (--http)",
        "remoting": f"{settings.listen} (--listen)",
    }
    if isinstance(settings.listen, str):
        vip = vip_description(settings.listen)
        if vip is not None:
            ports["vip"] = f"{vip} (the VIP port: --listen's port less 2, as RocketMQ's)"
    built = settings
    if settings.role.is_master and files.cert is not None and isinstance(settings.ha_listen, str):
        built = attrs.evolve(
            built,
            ha_listen=server_endpoint(reactor, settings.ha_listen, files, settings.peer_policy),
        )
    elif not settings.role.is_master and files.ca is not None and settings.master is not None:
        _, _, keywords = split_description(settings.master)
        built = attrs.evolve(
            built,
            master=None,
            master_endpoint=client_endpoint(
                reactor, keywords["host"], int(keywords["port"]), files, settings.tls_server_name
            ),
        )
    if isinstance(settings.listen, str) and settings.listen.startswith("ssl:"):
        built = attrs.evolve(
            built,
            listen=server_endpoint(reactor, settings.listen, files, settings.peer_policy, "--listen"),
        )
    http: Any = settings.http
    if http is not None and http.startswith("ssl:"):
        http = server_endpoint(reactor, http, files, settings.http_peer_policy, "--http")
    epochs = None
    auth = None
    if settings.failover:
        epochs = _epoch_file(store_dir, one_line_errors)
        if group_secret is None and settings.group_secret_file is not None:
            group_secret = load_group_secret(settings.group_secret_file, "--group-secret-file")
        auth = group_auth(settings, group_secret)
    kwargs: dict[str, Any] = dict(
        reactor=reactor, open_commitlog=open_commitlog, epochs=epochs, group_auth=auth
    )
    broker = _TwistdBroker(ports, built, **kwargs) if one_line_errors else Broker(built, **kwargs)
    top: IService = broker
    coordinator = None
    if settings.failover:
        top, coordinator = _coordinated(reactor, broker, settings, one_line_errors)
    if http is not None:
        AdminService(
            broker,
            http,
            settings.http_peer_policy,
            serve_commitlog=settings.serve_commitlog,
            failover=coordinator,
            access_log=settings.access_log,
        ).setServiceParent(broker)  # type: ignore[no-untyped-call]
    if listen_now:
        assert isinstance(broker, _TwistdBroker), "listen_now needs one_line_errors"
        broker.listen_now()
    return top


def _remoting_port(broker: Broker) -> int | None:
    """The port the broker's remoting port listens on (for STOREHOST), if any."""
    from rmqha.remoting.broker import RemotingPort

    for child in broker:
        if isinstance(child, RemotingPort):
            return child.listened_port()
    return None


def _epoch_file(store_dir: str, one_line_errors: bool) -> EpochFile:
    try:
        return EpochFile(store_dir)
    except (EpochFileError, OSError) as e:
        if not one_line_errors:
            raise
        raise Fatal(f"twistd rmqha: {e}") from None


def _coordinated(
    reactor: Any, broker: Broker, settings: BrokerSettings, under_twistd: bool
) -> tuple[IService, Coordinator]:
    """
    A broker under a failover coordinator: both under one parent, the
    coordinator started after the broker (the store must be open) and
    stopped before it (it leaves the group first).  Returns the parent
    and the coordinator (which the admin interface shows).
    """
    from rmqha.coord.etcd import EtcdDCS, parse_coordinator

    files = settings.tls_files

    def dial(address: str, node_id: str) -> Any:
        host, port = parse_host_port(address, "address")
        if files.ca is not None:
            # The master's certificate must name the elected node's id.
            return client_endpoint(reactor, host, port, files, node_id)
        return master_description(host, port)

    assert settings.coordinator is not None and settings.group is not None
    try:
        dcs = EtcdDCS(reactor, parse_coordinator(settings.coordinator), settings.group)
    except ValueError as e:
        # (A TLS or password file of the spec cannot be read: one line.)
        raise Fatal(f"twistd rmqha: {e}") from None
    fatal: dict[str, Any] = {"on_fatal": _stop_twistd(reactor)} if under_twistd else {}
    coordinator = Coordinator(reactor, dcs, broker, failover_settings(settings), dial, **fatal)
    top = MultiService()
    broker.setServiceParent(top)  # type: ignore[no-untyped-call]
    coordinator.setServiceParent(top)  # type: ignore[no-untyped-call]
    return top, coordinator


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
    except MetadataError as e:
        raise Fatal(f"twistd rmqha: cannot load the broker's metadata: {e}") from None


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

    def listen_now(self) -> None:
        """
        Listen on every port now (twistd's C{makeService}, which runs with
        the privileges C{privilegedStartService} has); starting the
        broker then finds them open.

        @raise Fatal: one line naming the port, its flag and why.
        """
        with _one_line(self._port_flags):
            self._listen()

    def privilegedStartService(self) -> None:
        with _one_line(self._port_flags):
            super().privilegedStartService()

    def startService(self) -> None:
        with _one_line(self._port_flags):
            super().startService()
