# -*- test-case-name: tests.test_rolemachine,tests.test_roles -*-
"""
A broker's role, owned by one state machine (docs/architecture.md, "The
role has one owner"): the only place the role changes, and what every
other part reads it from.

    state      what runs                      what is in effect
    STANDBY    nothing                        a slave with no master (takes no puts)
    SLAVE      a Replica                      a slave of C{endpoint}
    MASTER     a MasterSide                   a master (C{role}: MASTER, SYNC_, ASYNC_)
    CHANGING   the steps of one change        the role before it (puts refused)
    STOPPED    nothing                        the broker is stopping or stopped

Inputs: L{RoleMachine.promote} (become a master, with an epoch to record:
failover), L{RoleMachine.follow} (become a slave of an endpoint),
L{RoleMachine.stand_by}, L{RoleMachine.stop}.  Every (state, input) pair
is decided:

- In STANDBY, SLAVE or MASTER, an input starts a change at once.  A change
  stops the old role's service first (a master's port connections are
  dropped, its waiting puts end C{SLAVE_NOT_AVAILABLE}), except a promotion
  of a master (a re-election: the master keeps serving while its epoch is
  recorded).
- In CHANGING, an input waits for the running step (a service stopping, a
  flush, an epoch write: none can be abandoned half done) and then
  **replaces** the rest of the running change: the change's own result
  fails with L{Superseded} and the newest input is carried out instead.
  Inputs that arrive while one is already waiting replace it the same way
  (only the newest matters).  So C{stand_by} while a promotion is flushing
  never ends with a master side installed (issue 25: it did).
- C{stop} in any state: the waiting input, if any, is superseded; the
  running step is waited for; the role's service stops; STOPPED is final.
- A change that fails (the epoch file cannot be written, the log cannot
  be flushed) leaves STANDBY, with the error as its result.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Protocol as TypingProtocol

from twisted.application.service import IService
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime, IStreamClientEndpoint
from twisted.logger import Logger
from twisted.python.failure import Failure

from rmqha.ha.fence import OPEN
from rmqha.ha.interfaces import IFence
from rmqha.ha.config import Role

__all__ = ["RoleState", "RoleMachine", "Superseded", "RoleHost"]


class RoleState(enum.Enum):
    STANDBY = "standing by"
    SLAVE = "slave"
    MASTER = "master"
    CHANGING = "changing"
    STOPPED = "stopped"


class Superseded(Exception):
    """
    A role change that a later one replaced before it took effect.
    """


class RoleHost(TypingProtocol):
    """
    What the machine needs of its broker: the role services it builds,
    and the steps of a promotion.
    """

    def master_side(self, role: Role, fence: IFence) -> Any: ...

    def replica(self, endpoint: Any, leader: tuple[str, int] | None) -> Any: ...

    def start_master_side(self, side: Any) -> None: ...

    def prepare_promotion(self, from_master: bool, epoch: int | None) -> Deferred[None]: ...


@dataclass(frozen=True)
class _Input:
    #: "promote", "follow" or "stand_by".
    kind: str
    role: Role = Role.SLAVE
    epoch: int | None = None
    endpoint: str | IStreamClientEndpoint | None = None
    leader: tuple[str, int] | None = None
    fence: IFence = OPEN


#: Seconds a change waits for the old role's service to stop (its
#: connections to close) before it goes on: a connection whose peer is cut
#: off may not close for minutes.
STOP_TIMEOUT = 10.0


def _stopped(service: IService) -> Deferred[None]:
    stopping = service.stopService()
    d: Deferred[Any] = stopping if isinstance(stopping, Deferred) else succeed(None)
    return d.addBoth(lambda _: None)


class RoleMachine:
    """
    @ivar state: the L{RoleState}.
    @ivar role: the role in effect (C{Role.SLAVE} for a slave, standing by
        or changing from a slave role).
    @ivar service: the running L{rmqha.ha.masterside.MasterSide} or
        L{rmqha.ha.replica.Replica}, or C{None}.
    @ivar endpoint: a slave's master endpoint (also while it changes
        towards it), else C{None}.
    @ivar leader: a failover slave's expected leader (node id, epoch).
    """

    _log = Logger()

    def __init__(self, host: RoleHost, role: Role, clock: IReactorTime) -> None:
        self._host = host
        self._clock = clock
        self.role = role
        self.state = RoleState.STANDBY
        self.service: Any = None
        self.endpoint: str | IStreamClientEndpoint | None = None
        self.leader: tuple[str, int] | None = None
        # The change running now, and the newest input waiting for it.
        self._running: _Input | None = None
        self._waiting: tuple[_Input, Deferred[None]] | None = None
        self._stopping: Deferred[None] | None = None
        #: Called with the new L{RoleState} whenever it changes (the
        #: broker's metadata sync follows the slave role with it).
        self.listeners: list[Callable[[RoleState], None]] = []

    # -- what the rest of the broker reads -----------------------------------

    @property
    def is_slave(self) -> bool:
        """
        This store is a slave's copy (also standing by or changing towards
        a slave role): the scrub's hint, the HA port's answer.
        """
        return not self.role.is_master

    def read_refusal(self) -> str | None:
        """
        Failover mode: why this node must not serve consumers' reads now,
        or C{None} when it may.  A master reads up to what its in-sync
        replicas hold (L{rmqha.ha.group.HAService.visible_end}); a slave
        once its log has passed the checks against its master in this
        role (a prefix of that master's); anything else (standing by, a
        role changing, a slave still checking or halted) may hold a tail
        the failover then cuts, such as a deposed master's restart with
        the unreplicated end of its old log, and reads nothing.
        """
        if self.state is RoleState.MASTER:
            return None
        if self.state is RoleState.SLAVE and getattr(self.service, "reconciled", False):
            return None
        if self.state is RoleState.SLAVE:
            return "a slave whose log has not yet passed the checks against its master"
        return f"{self.state.value}: neither the elected master nor a slave following it"

    # -- the starting role ------------------------------------------------------

    def started(self, service: Any, endpoint: str | IStreamClientEndpoint | None) -> None:
        """
        The broker started with C{service} running for its constructor's
        role (none: standing by).
        """
        self.service = service
        self.endpoint = endpoint
        if service is None:
            self.state = RoleState.STANDBY
        elif self.role.is_master:
            self.state = RoleState.MASTER
        else:
            self.state = RoleState.SLAVE
        self._tell()

    def _tell(self) -> None:
        for listener in list(self.listeners):
            try:
                listener(self.state)
            except Exception:
                self._log.failure("a listener of the role state failed")

    # -- inputs -------------------------------------------------------------------

    def promote(
        self, role: Role, epoch: int | None = None, fence: IFence = OPEN
    ) -> Deferred[None]:
        """
        Become a master (C{role}) on the same open store: replication
        stops, an incomplete record at the log's tail (one still arriving
        from the old master) is dropped, and the HA port is listened on.

        @param epoch: failover: the epoch this broker was elected in: the
            log is flushed up to its max offset, then C{(epoch, max
            offset)} is added to the epoch file, before the HA port listens
            (also when it is a master already: a re-election).  If that
            fails, the broker is not a master.
        @param fence: failover: whether the master may take and acknowledge
            puts, and whose acks count -- what its coordinator writes
            (L{rmqha.ha.fence.Fence}); the master side is built with it (a
            re-election keeps the first one).
        """
        return self._input(_Input("promote", role=role, epoch=epoch, fence=fence))

    def follow(
        self, endpoint: str | IStreamClientEndpoint, leader: tuple[str, int] | None = None
    ) -> Deferred[None]:
        """
        Become a slave of C{endpoint} on the same open store: the HA port
        closes, its slaves are disconnected, puts still waiting for
        replicas end with C{SLAVE_NOT_AVAILABLE} (they are stored), and
        replication starts with the usual checks.

        @param leader: failover: the node id and epoch the coordinator
            names as leader (a master answering another epoch is not
            followed).
        """
        return self._input(_Input("follow", endpoint=endpoint, leader=leader))

    def stand_by(self) -> Deferred[None]:
        """
        Be neither a master nor a replicating slave (failover mode: no
        master is known, or this master has lost its lease): as L{follow}
        stops a master, and puts are refused until a role is given.
        """
        return self._input(_Input("stand_by"))

    def _input(self, wanted: _Input) -> Deferred[None]:
        if self.state is RoleState.STOPPED or self._stopping is not None:
            raise RuntimeError("the broker is not running: give the role to its constructor")
        if self._running is None:
            return self._start(wanted)
        # A change runs: this input replaces whatever was waiting, and the
        # rest of the running change (at its next step).
        done: Deferred[None] = Deferred()
        if self._waiting is not None:
            self._waiting[1].errback(Failure(Superseded(f"replaced by {wanted.kind}")))
        self._waiting = (wanted, done)
        return done

    # -- changes --------------------------------------------------------------------

    def _start(self, wanted: _Input) -> Deferred[None]:
        self._running = wanted
        d = Deferred.fromCoroutine(self._change(wanted))

        def finished(result: object) -> object:
            self._running = None
            waiting, self._waiting = self._waiting, None
            if self._stopping is not None:
                if waiting is not None:
                    waiting[1].errback(Failure(Superseded("the broker is stopping")))
                stopping, self._stopping = self._stopping, None
                self._stop_now().chainDeferred(stopping)
            elif waiting is not None:
                self._start(waiting[0]).chainDeferred(waiting[1])
            return result

        return d.addBoth(finished)

    def _replaced(self) -> bool:
        return self._waiting is not None or self._stopping is not None

    async def _change(self, wanted: _Input) -> None:
        host = self._host
        old_state, old = self.state, self.service
        re_election = wanted.kind == "promote" and old_state is RoleState.MASTER
        self.state = RoleState.CHANGING
        self._tell()
        if not re_election:
            self.service = None
            if old is not None:
                await self._stop_old(old)
            if wanted.kind != "promote":
                self.role = Role.SLAVE
        if wanted.kind == "stand_by":
            self.endpoint = self.leader = None
            self._settle(RoleState.STANDBY, "this broker stands by: no master to follow")
            return
        if wanted.kind == "follow":
            if self._replaced():
                self._settle(RoleState.STANDBY)
                raise Superseded("replaced before it took effect")
            assert wanted.endpoint is not None
            self.endpoint, self.leader = wanted.endpoint, wanted.leader
            replica = self.service = host.replica(wanted.endpoint, wanted.leader)
            replica.startService()
            self._settle(RoleState.SLAVE, "this broker is now a slave of {master}")
            return
        # Promote.
        try:
            await host.prepare_promotion(re_election, wanted.epoch)
        except BaseException:
            if re_election:
                self._settle(RoleState.MASTER)
            else:
                self._settle(RoleState.STANDBY)
            raise
        if self._replaced():
            self._settle(RoleState.MASTER if re_election else RoleState.STANDBY)
            raise Superseded("replaced before it took effect")
        self.role = wanted.role
        self.endpoint = self.leader = None
        if re_election:
            old.ha.sync = wanted.role is Role.SYNC_MASTER
            self._settle(RoleState.MASTER)
            return
        side = self.service = host.master_side(wanted.role, wanted.fence)
        host.start_master_side(side)
        self._settle(RoleState.MASTER, "this broker is now a master ({role})")

    async def _stop_old(self, old: IService) -> None:
        """
        Stop the old role's service; go on when it has stopped, or after
        L{STOP_TIMEOUT} (logged) -- it is stopped by then, only its
        connections may not have closed yet.
        """
        done: Deferred[None] = Deferred()

        def go_on(_: object = None) -> None:
            if not done.called:
                done.callback(None)

        def late() -> None:
            self._log.warn(
                "the old role's service did not finish stopping within {timeout} s "
                "(a connection not closing): going on",
                timeout=STOP_TIMEOUT,
            )
            go_on()

        timer = self._clock.callLater(STOP_TIMEOUT, late)
        _stopped(old).addBoth(go_on)
        await done
        if timer.active():
            timer.cancel()

    def _settle(self, state: RoleState, message: str | None = None) -> None:
        self.state = state
        if state is RoleState.STANDBY:
            self.role = Role.SLAVE
        self._tell()
        if message is not None:
            self._log.info(message, master=self.endpoint_text(), role=self.role.value)

    def endpoint_text(self) -> str | None:
        endpoint = self.endpoint
        if endpoint is None or isinstance(endpoint, str):
            return endpoint
        return str(getattr(endpoint, "description", endpoint))

    # -- stopping ------------------------------------------------------------------------

    def stop(self) -> Deferred[None]:
        """
        Stop for good: a waiting input is superseded, the running step is
        waited for, the role's service stops.
        """
        if self.state is RoleState.STOPPED and self._running is None:
            return succeed(None)
        if self._running is not None:
            waiting, self._waiting = self._waiting, None
            if waiting is not None:
                waiting[1].errback(Failure(Superseded("the broker is stopping")))
            if self._stopping is None:
                self._stopping = Deferred()
            stopping: Deferred[None] = Deferred()
            self._stopping.addBoth(lambda _: stopping.callback(None))
            return stopping
        return self._stop_now()

    def _stop_now(self) -> Deferred[None]:
        service, self.service = self.service, None
        self.state = RoleState.STOPPED
        self._tell()
        return _stopped(service) if service is not None else succeed(None)
