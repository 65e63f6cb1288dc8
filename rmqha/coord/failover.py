# -*- test-case-name: tests.test_coordinator -*-
"""
A failover node's settings as its coordinator and the coordinator's parts
read them (L{FailoverSettings}), derived from the broker's settings by
L{rmqha.assemble.failover_settings}.
"""

from __future__ import annotations

from dataclasses import dataclass

from rmqha.ha.config import Role
from rmqha.ha.insync import DEFAULT_CATCHUP_TIMEOUT
from rmqha.settings import DEFAULT_LEASE_TTL

__all__ = ["DEFAULT_FENCE_MARGIN", "DEFAULT_RENEW_INTERVAL", "FailoverSettings"]

#: Default seconds between lease renewals (and member-key refreshes).
DEFAULT_RENEW_INTERVAL = 0.5
#: Default seconds before a lease could expire that a master stops
#: acknowledging puts.
DEFAULT_FENCE_MARGIN = 0.5


@dataclass(frozen=True)
class FailoverSettings:
    group: str
    node_id: str
    #: The HA address peers dial, C{host:port}.
    advertise: str
    #: The admin HTTP address, C{host:port}, if any.
    advertise_http: str | None = None
    #: How this node acts once elected.
    role: Role = Role.SYNC_MASTER
    lease_ttl: int = DEFAULT_LEASE_TTL
    renew_interval: float = DEFAULT_RENEW_INTERVAL
    fence_margin: float = DEFAULT_FENCE_MARGIN
    catchup_timeout: float = DEFAULT_CATCHUP_TIMEOUT
    #: Elect a node outside the in-sync set when no member of it lives
    #: (loses every put it lacks: docs/failover.md).
    allow_unclean_election: bool = False
    #: False: this node never stands for election (C{--no-failover}).
    electable: bool = True

    def __post_init__(self) -> None:
        if not self.group or "/" in self.group:
            raise ValueError(f"group {self.group!r}: give a name without '/'")
        if not self.node_id or "/" in self.node_id:
            raise ValueError(f"node id {self.node_id!r}: give a name without '/'")
        if not self.role.is_master:
            raise ValueError(
                f"role {self.role.value}: with a coordinator, --role says how the node "
                "acts once elected (SYNC_MASTER or ASYNC_MASTER)"
            )
        if self.lease_ttl < 2:
            raise ValueError(f"lease TTL {self.lease_ttl} s: etcd's minimum is 2")
        if not 0 < self.renew_interval < self.lease_ttl - self.fence_margin:
            raise ValueError(
                f"renew interval {self.renew_interval} s must be positive and shorter "
                f"than the lease TTL {self.lease_ttl} s less the fence margin "
                f"{self.fence_margin} s"
            )
        if self.fence_margin < 0:
            raise ValueError(f"fence margin {self.fence_margin} s must not be negative")
