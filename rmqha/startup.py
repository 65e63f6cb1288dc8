# -*- test-case-name: tests.test_logging -*-
"""
The line a broker logs once it has started: what an operator reading the
log of a node must know first (docs/operations.md, "Logging") -- its
version, its role (or its coordinator's), its store, every port it listens
on as bound, its in-sync settings and its coordinator.

    rmqha 0.1.0 (codec: compiled) started: role SYNC_MASTER; store
    /var/lib/rmqha/a (commit log /var/lib/rmqha/a/commitlog, 1073741824-byte
    segments, ASYNC_FLUSH); listening on HA 0.0.0.0:10912, HTTP
    127.0.0.1:8080; in-sync replicas 2 (min 2), slave timeout 3000 ms,
    fall-behind max 268435456 bytes, busy poll 200 us; coordinator: none (fixed role)

(one line in the log.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.application.internet import StreamServerEndpointService
from twisted.internet.endpoints import SSL4ServerEndpoint

from rmqha import __version__

if TYPE_CHECKING:
    from rmqha.broker import Broker

__all__ = ["startup_line", "listening_ports"]


def _bound(service: StreamServerEndpointService) -> str:
    """
    The address C{service} listens on (C{HOST:PORT}, the port bound for
    C{tcp:0}), read without changing what its C{Deferred} holds; its
    endpoint's description while it is not bound yet.
    """
    found: list[Any] = []

    def keep(port: Any) -> Any:
        found.append(port)
        return port

    waiting = service._waitingForPort
    if waiting is not None:
        waiting.addCallback(keep)
    address = found[0].getHost() if found else None
    host, port = getattr(address, "host", None), getattr(address, "port", None)
    if host is None or port is None:
        return str(getattr(address, "name", None) or service.endpoint)
    text = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if isinstance(service.endpoint, SSL4ServerEndpoint):
        text += " (TLS)"
    return text


def listening_ports(broker: Broker) -> list[tuple[str, str]]:
    """
    Every port C{broker} listens on, as C{(name, address)}: the HA port
    (a master's, or the one a failover node holds in every role), then
    the admin HTTP port.
    """
    from rmqha._ports import Port
    from rmqha.ha.masterside import MasterSide

    ports: list[tuple[str, str]] = []
    held = broker.ports.held
    side = broker.role_service
    if held is not None:
        ports.append(("HA", _bound(held[0])))
    elif isinstance(side, MasterSide) and side.port is not None:
        ports.append(("HA", _bound(side.port)))
    for child in broker:
        if isinstance(child, Port) and child.port is not None:
            ports.append((str(child.name).upper(), _bound(child.port)))
    return ports


def _role(broker: Broker) -> str:
    settings = broker.settings
    if settings.failover:
        electable = (
            f"{settings.role.value} once elected"
            if not settings.no_failover
            else "never stands for election (--no-failover)"
        )
        return (
            f"node {settings.node_id} of group {settings.group} (advertising HA "
            f"{settings.advertise}), elected by the coordinator: starts as a slave, "
            f"{electable}"
        )
    if broker.role.is_master:
        return f"role {broker.role.value}"
    if broker.roles.endpoint_text() is None and broker.registration is not None:
        return "role SLAVE of the master its NameServers name (none yet)"
    return f"role SLAVE of {broker.roles.endpoint_text()}"


def _coordinator(broker: Broker) -> str:
    settings = broker.settings
    if settings.coordinator is None:
        return "none (fixed role)"
    from rmqha.coord.etcd import parse_coordinator

    # (Endpoints only: no user name, no file path.)
    return f"{parse_coordinator(settings.coordinator)}, lease {settings.lease_ttl} s"


def _fd_limit(broker: Broker) -> str:
    from rmqha._limits import FD_RESERVE

    budget = broker.ports.budget
    if budget is None:
        return ""
    return f"; open-files limit {budget.total + FD_RESERVE}"


def startup_line(broker: Broker) -> str:
    """
    What C{broker}, just started, tells the log about itself in one line.
    """
    from rmqha.store._record import ACCELERATED

    settings = broker.settings
    log = broker.commitlog
    ports = ", ".join(f"{name} {address}" for name, address in listening_ports(broker))
    return (
        f"rmqha {__version__} (codec: {'compiled' if ACCELERATED else 'pure Python'}) "
        f"started: {_role(broker)}; "
        f"store {log.store_dir} (commit log {log.commitlog_dir}, "
        f"{log.segment_size}-byte segments, {settings.flush_disk_type.value}); "
        f"listening on {ports or 'no port'}{_fd_limit(broker)}; "
        f"in-sync replicas {settings.in_sync_replicas} "
        f"(min {settings.min_in_sync_replicas}), "
        f"slave timeout {round(settings.slave_timeout * 1000)} ms, "
        f"fall-behind max {settings.slave_fallbehind_max} bytes, "
        f"busy poll {_busy_poll(settings.busy_poll)}; "
        f"coordinator: {_coordinator(broker)}"
    )


def _busy_poll(window: float) -> str:
    """
    C{--busy-poll} as the start line says it (docs/sync.md, "Busy polling").
    """
    return f"{round(window * 1e6)} us" if window else "off"
