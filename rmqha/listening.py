# -*- test-case-name: tests.test_limits,tests.test_haport,tests.test_tap -*-
"""
A broker's listening ports as one part (L{BrokerPorts}): the connection
limiter's shared budget, the HA port a failover node holds for its whole
life, and the ports composed into the broker (L{rmqha._ports.Port}).
"""

from __future__ import annotations

from typing import Any, Callable

from twisted.application.internet import StreamServerEndpointService
from twisted.application.service import IService, IServiceCollection
from twisted.internet.interfaces import IStreamServerEndpoint
from twisted.logger import Logger

from rmqha._limits import FD_RESERVE, ConnectionBudget, LimitedFactory
from rmqha._ports import ListenFailed, Port, listen
from rmqha.ha.fence import OPEN
from rmqha.ha.haport import HAGate
from rmqha.ha.roles import RoleHost, RoleMachine, RoleState
from rmqha.tls import exposure_warning

__all__ = ["BrokerPorts"]


class BrokerPorts:
    """
    A broker's ports: the HA port (held for the node's whole life in
    failover mode, L{rmqha.ha.haport.HAGate}; a fixed-role master's is its
    L{rmqha.ha.masterside.MasterSide}'s) and the L{Port} children composed
    into the broker (the admin interface), each behind the connection
    limiter, all sharing one budget of descriptors.

    @ivar port_limits: the connection limiter of each listening port, by
        name.
    @ivar budget: the descriptors all ports share, once sized.
    """

    _log = Logger(namespace="rmqha.broker.Broker")

    def __init__(
        self,
        reactor: Any,
        parent: IServiceCollection,
        *,
        max_connections: int,
        max_connections_per_peer: int,
        fd_limit: Callable[[], int],
    ) -> None:
        """
        @param parent: the broker, whose L{Port} children are listened on.
        @param fd_limit: raises the open-files limit and returns the soft
            limit (L{rmqha._limits.raise_fd_limit}).
        """
        self._reactor = reactor
        self._parent = parent
        self._max_connections = max_connections
        self._max_per_peer = max_connections_per_peer
        self._fd_limit = fd_limit
        self.port_limits: dict[str, LimitedFactory] = {}
        self.budget: ConnectionBudget | None = None
        self._held: tuple[StreamServerEndpointService, HAGate] | None = None
        self._listening = False

    def children(self) -> list[Port]:
        """
        The ports composed into the broker.
        """
        return [s for s in self._parent if isinstance(s, Port)]

    @property
    def held(self) -> tuple[StreamServerEndpointService, HAGate] | None:
        """
        Failover: the HA port held for the node's whole life and its gate.
        """
        return self._held

    def size_budget(self, ha_port: bool) -> None:
        """
        Raise the open-files limit and size the budget all ports share:
        the soft limit less a reserve for the store.

        @param ha_port: an HA port is listened on too.
        """
        soft = self._fd_limit()
        budget = self.budget = ConnectionBudget.for_fd_limit(soft)
        ports = (1 if ha_port else 0) + len(self.children())
        if ports * self._max_connections > budget.total:
            self._log.warn(
                "max-connections {max} on {ports} port(s) exceeds what the open-files "
                "limit {soft} allows with {reserve} kept for the store: at most {total} "
                "connections in all",
                max=self._max_connections,
                ports=ports,
                soft=soft,
                reserve=FD_RESERVE,
                total=budget.total,
            )

    def limited(self, name: str, factory: Any) -> LimitedFactory:
        """
        C{factory} behind the connection limiter of the port C{name},
        sharing the broker's descriptor budget with its other ports.
        """
        limited = LimitedFactory(
            factory,
            self._reactor,
            name=name,
            max_connections=self._max_connections,
            max_per_peer=self._max_per_peer,
            budget=self.budget,
        )
        self.port_limits[name] = limited
        return limited

    def hold_ha_port(self, where: str | IStreamServerEndpoint, why: Callable[[], str]) -> None:
        """
        Failover: listen on the HA port for the node's whole life, in
        every role, so nothing else can bind it while it is a slave; while
        it is not the master the port answers rmqha peers C{why()}.

        @raise ListenFailed: naming the port and why.
        """
        if isinstance(where, str):
            warning = exposure_warning(where)
            if warning is not None:
                self._log.warn(warning.format, **warning.fields)
        gate = HAGate(self._reactor, why)
        self._held = (listen(self._reactor, "ha", where, self.limited("HA", gate)), gate)

    def listen_children(self) -> None:
        """
        Listen on the composed ports.

        @raise ListenFailed: naming the port and why.
        """
        for port in self.children():
            port.listen(self.limited)

    def start(self) -> None:
        """
        Start serving on every port listened on (the role's own HA port
        aside).
        """
        if self._held is not None:
            self._held[0].startService()
        for port in self.children():
            port.startService()

    def open(
        self,
        roles: RoleMachine,
        services: RoleHost,
        *,
        hold_ha_port: bool,
        ha_listen: str | IStreamServerEndpoint,
    ) -> None:
        """
        Listen, once, before the store is opened: the HA port (held for the
        node's whole life with C{hold_ha_port}, failover; else a fixed-role
        master's, on the master side C{services} builds for C{roles}), then
        the composed ports.

        @raise ListenFailed: naming the port and why (nothing is left
            listening).
        """
        if self._listening:
            return
        self._listening = True
        self.size_budget(roles.role.is_master or hold_ha_port)
        try:
            if hold_ha_port:
                self.hold_ha_port(ha_listen, lambda: _not_master_why(roles))
            if roles.role.is_master:
                side = roles.service = services.master_side(roles.role, OPEN)
                side.listen()
            self.listen_children()
        except ListenFailed:
            self.shut(roles)
            raise

    def shut(self, roles: RoleMachine) -> None:
        """
        A start that failed: stop every port listened on (the role's too).
        """
        side, roles.service = roles.service, None
        if side is not None:
            side.stopService()
        for port in self.close():
            port.stopService()

    def close(self) -> list[IService]:
        """
        Forget every port; return the services to stop (the held HA port,
        the composed ports).
        """
        held, self._held = self._held, None
        self._listening = False
        return [*self.children(), *([held[0]] if held is not None else [])]


def _not_master_why(roles: RoleMachine) -> str:
    """
    What a node's held HA port tells an rmqha peer while it is not the
    master.
    """
    if roles.state is RoleState.SLAVE:
        return f"this node is not the master: it is a slave of {roles.endpoint_text()}"
    return "this node is not the master: it stands by (no master elected yet)"
