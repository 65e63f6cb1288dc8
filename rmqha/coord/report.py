# -*- test-case-name: tests.test_coordinator,tests.test_admin_view -*-
"""
What a failover node says about itself, read from its coordinator's state:
the member key it writes into the group (L{NodeReport.member}), the
coordinator's part of /status (L{NodeReport.status}), and a warning for
each malformed key it skips (L{MalformedKeys}).

Views only: nothing here changes what the coordinator
(L{rmqha.coord.node.Coordinator}) holds; it reads through
L{CoordinatorState}, so this module does not import the coordinator's.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from twisted.logger import Logger

from rmqha.coord.failover import FailoverSettings
from rmqha.broker import Broker
from rmqha.coord.dcs import IDCS, ClusterView, Lease, Member
from rmqha.ha.insync import InSyncSet


class LastElection(Protocol):
    """
    The last change of master a coordinator saw or made
    (L{rmqha.coord.node.Election}).
    """

    @property
    def epoch(self) -> int: ...

    @property
    def master(self) -> str | None: ...

    @property
    def at(self) -> float: ...

    @property
    def why(self) -> str: ...


class CoordinatorState(Protocol):
    """
    What a L{NodeReport} reads of its coordinator.
    """

    @property
    def settings(self) -> FailoverSettings: ...

    @property
    def dcs(self) -> IDCS: ...

    @property
    def broker(self) -> Broker: ...

    @property
    def view(self) -> ClusterView | None: ...

    @property
    def election(self) -> LastElection | None: ...

    @property
    def lease(self) -> Lease | None: ...

    @property
    def valid_until(self) -> float: ...

    @property
    def in_sync(self) -> InSyncSet | None: ...

    @property
    def following(self) -> str | None: ...

    @property
    def highest_epoch(self) -> int: ...

    @property
    def note(self) -> str | None: ...

    @property
    def dcs_error(self) -> str | None: ...

    @property
    def fatal(self) -> str | None: ...

    @property
    def unfit(self) -> str | None: ...

    @property
    def counts(self) -> dict[str, int]: ...

    def is_master(self) -> bool: ...

    def healthy(self) -> bool: ...


class NodeReport:
    """
    A coordinator's state as its member key and its /status show it.
    """

    def __init__(self, state: CoordinatorState, now: Callable[[], float]) -> None:
        """
        @param now: the monotonic clock the lease is measured on.
        """
        self._state = state
        self._now = now

    def member(self) -> Member:
        """
        This node's member key: its addresses, role, epoch and offset, what
        it is doing, and whether it may stand for election.
        """
        c = self._state
        broker = c.broker
        commitlog = broker.store.commitlog
        state = c.note or ""
        if not state:
            if c.is_master():
                state = "master"
            elif broker.problem:
                state = broker.problem
            elif c.following is not None:
                state = f"following {c.following}"
            else:
                state = "standing by"
        epochs = broker.role_services.epochs
        return Member(
            node_id=c.settings.node_id,
            ha=c.settings.advertise,
            http=c.settings.advertise_http,
            role="master" if c.is_master() else "slave",
            epoch=epochs.last_epoch if epochs is not None else c.highest_epoch,
            offset=commitlog.max_offset if commitlog is not None else 0,
            state=state[:200],
            electable=c.settings.electable and c.healthy(),
        )

    def status(self) -> dict[str, Any]:
        """
        The coordinator's part of /status, as JSON-ready values.
        """
        c = self._state
        view = c.view
        leader = view.leader if view is not None else None
        election = c.election
        # (What etcd holds, as this node last saw it: a slave's in-sync set.)
        held = list(view.in_sync.members) if view is not None and view.in_sync else None
        return {
            "group": c.settings.group,
            "node_id": c.settings.node_id,
            "coordinator": c.dcs.endpoint,
            "coordinator_error": c.dcs_error,
            "master": None
            if leader is None
            else {
                "node_id": leader.node_id,
                "ha": leader.ha,
                "http": leader.http,
                "epoch": leader.epoch,
            },
            "is_master": c.is_master(),
            "epoch": view.epoch if view is not None else None,
            "highest_epoch": c.highest_epoch,
            "in_sync": sorted(c.in_sync.effective) if c.in_sync is not None else held,
            # (Who may be elected after this master: the set etcd holds,
            # which trails the one its puts wait for while a change is on
            # its way.)
            "in_sync_published": sorted(c.in_sync.published) if c.in_sync is not None else held,
            "lease_valid_for": max(0.0, c.valid_until - self._now())
            if c.lease is not None
            else 0.0,
            "last_election": None
            if election is None
            else {"epoch": election.epoch, "master": election.master, "at": election.at, "why": election.why},
            "note": c.note,
            # Why this node cannot serve as master until restarted, if so.
            "unfit": c.unfit,
            # Why this process does not take part (a duplicate node id).
            "fatal": c.fatal,
            "counts": dict(c.counts),
        }


class MalformedKeys:
    """
    Warns once about each malformed key in the group (until it is
    repaired; docs/failover.md, "Malformed keys").
    """

    _log = Logger()

    def __init__(self) -> None:
        self._warned: set[tuple[str, str]] = set()

    def report(self, view: ClusterView) -> None:
        """
        Warn about each malformed key of C{view} not warned about since it
        last appeared.
        """
        seen = {(bad.key, bad.reason) for bad in view.malformed}
        for key, reason in sorted(seen - self._warned):
            self._log.warn("coordinator: key {key} is malformed and skipped: {reason}",
                           key=key, reason=reason)
        self._warned = seen
