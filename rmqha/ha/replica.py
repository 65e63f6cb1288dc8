# -*- test-case-name: tests.test_slave_probe,tests.test_roles -*-
"""
A slave's side of replication, as one service with an explicit lifecycle.

    STOPPED -> PROBING -> REPLICATING           (the check passed, or classic)
                       -> BACKING_OFF -> PROBING (the check could not finish)
                       -> HALTED                 (a divergence with halt, or a
                                                  fact only an operator can fix)
                       -> REPAIRING -> REPLICATING (truncate or rebootstrap)
    REPAIRING -> HALTED, BACKING_OFF   (failover: the check after an epoch cut)
    REPLICATING -> BACKING_OFF         (failover: a master refused on a re-check)
    any -> STOPPED

PROBING runs the checks of a L{rmqha.ha.mastercheck.MasterCheck}, this
service's part: the control probe and the divergence check that follows
(L{rmqha.ha.control.probe}, L{rmqha.ha.divergence.find_divergence}).
In failover mode (an epoch file, L{rmqha.ha.epochs}) it also asks the
master's epochs first: a master without epochs, or at an older epoch than
this node has seen, is refused (back off: the coordinator will point this
node elsewhere); the log is cut back to the end of the newest epoch both
share (REPAIRING, the cut bytes quarantined), the digest check then only
verifies, and the master's list is adopted when replication starts.
While REPLICATING, a connection that ends suspiciously (before the master
sent anything, or on an offset mismatch) checks again without stopping
replication; a failed re-check retries after the back-off, replication
left running.  Against a master taken for RocketMQ's (silent to the
probe) the probe's connection is kept and handed to the connection
service (its next connection is made on it: the real report follows the
-1, and a RocketMQ master never sees a probe closed unanswered), and each
later connection probes in place instead of a separate re-check
(L{rmqha.ha.slave}).  L{Replica._to} is the only place the state
changes: the checks and repairs raise, or ask this service (their L{CheckHost
<rmqha.ha.mastercheck.CheckHost>}) to stop replicating and enter
REPAIRING.

The L{ClientService} that keeps the connection to the master (built by
L{rmqha.ha.slave.make_slave_service}) is a child this service starts and
stops itself: it runs only in REPLICATING.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

from twisted.application.internet import ClientService, backoffPolicy
from twisted.application.service import Service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.endpoints import clientFromString
from twisted.internet.interfaces import IDelayedCall, IStreamClientEndpoint
from twisted.logger import Logger
from twisted.python.failure import Failure

from rmqha.store._segments import FlushDiskType
from rmqha.store.commitlog import CommitLog
from rmqha.store.errors import StoreDamagedError
from rmqha.ha.config import (
    DEFAULT_HA_CONFIG,
    DEFAULT_MAX_UNFLUSHED,
    DEFAULT_PROBE_TIMEOUT,
    PROBE_FIRST_TIMEOUT,
    HAConfig,
    MasterKind,
    OnDivergence,
)
from rmqha.ha.auth import GroupAuth
from rmqha.ha.control import CheckFailed, MasterUnreachable
from rmqha.ha.divergence import Divergence, DivergenceKind
from rmqha.ha.epochs import EpochFile
from rmqha.ha.mastercheck import Halt, MasterCheck, NotAnswering, Refused
from rmqha.ha.slave import SlaveFactory, make_slave_service
from rmqha.store.service import CommitLogService
from rmqha.tls import plain_master_warning, split_description

__all__ = ["Replica", "ReplicaState", "ReplicaStatus"]


class ReplicaState(enum.Enum):
    STOPPED = "stopped"
    #: Probing the master and checking for divergence (not replicating).
    PROBING = "probing"
    #: The first check could not finish: waiting to try again.
    BACKING_OFF = "backing off"
    REPLICATING = "replicating"
    #: Stopped until an operator acts (the problem says why).
    HALTED = "halted"
    #: Truncating or moving the store aside after a divergence.
    REPAIRING = "repairing"


@dataclass(frozen=True)
class ReplicaStatus:
    """
    A slave's replication as it stands, read-only (L{Replica.status}; the
    admin interface's C{/status} and C{/metrics} show it).

    @ivar state: the L{ReplicaState}.
    @ivar connected: connected to the master now.
    @ivar caught_up: connected, and the master said it has nothing newer.
    @ivar checked: the connection uses checked framing (CRC-32 on every
        frame and report).
    @ivar divergence: the divergence replication is halted on, if any.
    @ivar divergences: divergences found, by kind (every kind named).
    @ivar failed_checks: checks of the master that could not finish, in a
        row.
    @ivar epoch_truncations: failover: cuts back to the newest epoch shared
        with the master; C{epoch_truncated_bytes} the bytes they moved to
        quarantine.
    @ivar master_kind: what the master is, or C{None} while unknown.
    @ivar problem: why it is not replicating, or C{None}.
    @ivar bytes_received: commit-log bytes received from the master;
        C{connections_made}, C{rejected_records} and C{checksum_failures}
        count connections, replicated records that failed validation, and
        checked-framing messages that failed their CRC.
    """

    state: ReplicaState = ReplicaState.STOPPED
    connected: bool = False
    caught_up: bool = False
    checked: bool = False
    divergence: Divergence | None = None
    divergences: Mapping[str, int] = field(
        default_factory=lambda: MappingProxyType({k.value: 0 for k in DivergenceKind})
    )
    failed_checks: int = 0
    epoch_truncations: int = 0
    epoch_truncated_bytes: int = 0
    master_kind: MasterKind | None = None
    problem: str | None = None
    bytes_received: int = 0
    connections_made: int = 0
    rejected_records: int = 0
    checksum_failures: int = 0


_S = ReplicaState
#: The transitions L{Replica._to} allows.
_ALLOWED: dict[ReplicaState, frozenset[ReplicaState]] = {
    _S.STOPPED: frozenset([_S.PROBING, _S.REPLICATING]),
    _S.PROBING: frozenset([_S.REPLICATING, _S.BACKING_OFF, _S.HALTED, _S.REPAIRING]),
    _S.BACKING_OFF: frozenset([_S.PROBING, _S.HALTED]),
    _S.REPLICATING: frozenset([_S.HALTED, _S.REPAIRING, _S.BACKING_OFF]),
    _S.REPAIRING: frozenset([_S.REPLICATING, _S.HALTED, _S.BACKING_OFF]),
    _S.HALTED: frozenset(),
}



class Replica(Service):
    """
    Replication from one master into an open store: the state machine, the
    connection service it starts and stops, and the status.  The checks of
    the master and the repairs they call for are its part, a
    L{MasterCheck}; what they learn and count is read from it (the
    properties below).

    @ivar state: the L{ReplicaState}.
    @ivar master_kind: what the master is (L{MasterKind.RMQHA},
        L{MasterKind.ROCKETMQ}), or
        C{None} while unknown (remembered in the store).
    @ivar divergence: the divergence replication is halted on, if any.
    @ivar divergences: divergences found, by kind.
    @ivar failed_checks: checks in a row that could not finish.
    @ivar epoch_truncations: failover: times the log was cut back to the
        end of the newest epoch it shares with its master.
    @ivar epoch_truncated_bytes: the bytes those cuts moved to quarantine.
    """

    _log = Logger()

    def __init__(
        self,
        reactor: Any,
        store: CommitLogService,
        master_endpoint: str | IStreamClientEndpoint,
        *,
        config: HAConfig = DEFAULT_HA_CONFIG,
        retry_policy: Callable[[int], float] | None = None,
        max_unflushed: int = DEFAULT_MAX_UNFLUSHED,
        on_divergence: OnDivergence | None = OnDivergence.HALT,
        probe_timeout: float = DEFAULT_PROBE_TIMEOUT,
        master_kind: MasterKind = MasterKind.AUTO,
        replica_id: str | None = None,
        epochs: EpochFile | None = None,
        auth: GroupAuth | None = None,
        expected_leader: tuple[str, int] | None = None,
        max_cut: int | None = None,
    ) -> None:
        """
        @param replica_id: the id this replica declares (IDENTIFY); by
            default the one kept in the store (failover mode: the node id).
        @param epochs: the store's epoch file: failover mode (see the
            module's docstring); C{None}: no epochs.
        @param auth: failover: how this node and its master prove their
            node ids (L{rmqha.ha.auth}); with a group secret every
            connection to the master starts with the handshake.  A master
            that proves no id, or not the expected leader's, is refused.
            C{None}: ids are not proven (C{--insecure-group}, fixed roles).
        @param expected_leader: see L{expected_leader}.
        @param max_cut: failover: the most bytes a check may cut from this
            log (epochs or digests); a bigger cut halts replication with
            one line naming the option that allows it.  C{None}: no limit.
        """
        self.reactor = reactor
        self.store = store
        self._master_endpoint = master_endpoint
        self._config = config
        self._retry_policy = retry_policy
        self._max_unflushed = max_unflushed
        self._auth = auth
        self._probe_timeout = probe_timeout
        self.state = ReplicaState.STOPPED
        #: The log passed the checks against this master at least once
        #: (it reached REPLICATING): a prefix of the master's since,
        #: which consumers may read (L{RoleMachine.read_refusal
        #: <rmqha.ha.roles.RoleMachine.read_refusal>}).
        self.reconciled = False
        self.failed_checks = 0
        self._problem: str | None = None
        self._check_backoff = backoffPolicy(initialDelay=1.0, maxDelay=30.0)
        if epochs is not None:
            # Failover mode: the election names the new master before it
            # has taken office (flush, epoch record, then its HA port), so
            # a slave's first dial often finds no listener yet.  Retry
            # within 0.1-0.2 s, doubling from there (issue 16's bench: a
            # 1-2 s first retry was most of the producers' gap).
            self._check_backoff = backoffPolicy(
                initialDelay=0.1, factor=2.0, maxDelay=30.0, jitter=lambda: random.random() * 0.1
            )
        self._check: Deferred[Any] | None = None
        self._retry: IDelayedCall | None = None
        self._client: IStreamClientEndpoint | None = None
        self.slave_factory: SlaveFactory | None = None
        self.client_service: ClientService | None = None
        self._unobserve_damage: Callable[[], None] = lambda: None
        self._halting: IDelayedCall | None = None
        #: The checks of the master (and the repairs), with what they
        #: learnt and counted.
        self._checks = MasterCheck(
            self,
            reactor,
            store,
            self.master_address,
            on_divergence=on_divergence,
            probe_timeout=probe_timeout,
            master_kind=master_kind,
            replica_id=replica_id,
            epochs=epochs,
            auth=auth,
            expected_leader=expected_leader,
            max_cut=max_cut,
        )

    # -- the lifecycle --------------------------------------------------------

    def _to(self, state: ReplicaState) -> None:
        """
        The only place the state changes; starts or stops the connection
        service to match (it runs only in REPLICATING).
        """
        if state is self.state:
            return
        if state is not ReplicaState.STOPPED and state not in _ALLOWED[self.state]:
            raise RuntimeError(f"replica: {self.state.value} -> {state.value} is not a transition")
        self._log.debug(
            "replica: {old} -> {new}", old=self.state.value, new=state.value
        )
        self.state = state
        if state is ReplicaState.REPLICATING:
            self.reconciled = True
        service = self.client_service
        if service is None:
            return
        if state is ReplicaState.REPLICATING and not service.running:
            service.startService()

    @property
    def replicating(self) -> bool:
        """
        The connection service runs (L{CheckHost.replicating
        <rmqha.ha.mastercheck.CheckHost.replicating>}).
        """
        service = self.client_service
        return service is not None and bool(service.running)

    def _stop_replicating(self) -> Deferred[None]:
        if self.slave_factory is not None:
            # (A probe connection kept for a service that will not start.)
            self.slave_factory.drop_kept()
        service = self.client_service
        if service is not None and service.running:
            stopping = service.stopService()
            return stopping if isinstance(stopping, Deferred) else succeed(None)
        return succeed(None)

    def startService(self) -> None:
        Service.startService(self)
        master = self._master_endpoint
        if isinstance(master, str):
            kind, positional, keywords = split_description(master)
            host = keywords.get("host") or (positional[0] if positional else "")
            warning = plain_master_warning(host) if kind == "tcp" else None
            if warning is not None:
                self._log.warn(warning.format, **warning.fields)
            master = clientFromString(self.reactor, master)
        self._client = master
        self._build(self.commitlog)
        self._check_then_replicate()

    def stopService(self) -> Deferred[None]:
        Service.stopService(self)
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None
        if self._halting is not None and self._halting.active():
            self._halting.cancel()
        self._halting = None
        stopped = self._stop_replicating()
        self.state = ReplicaState.STOPPED
        if self.slave_factory is not None:
            self._forget_factory()
        return stopped

    @property
    def commitlog(self) -> CommitLog:
        commitlog = self.store.commitlog
        if commitlog is None:
            raise RuntimeError("the store is not open")
        return commitlog

    def _build(self, commitlog: CommitLog) -> None:
        """
        The slave factory and the connection service over C{commitlog}.
        """
        if self.slave_factory is not None:
            self._forget_factory()
        assert self._client is not None
        factory = self.slave_factory = SlaveFactory(
            commitlog,
            self.reactor,
            self._config,
            max_unflushed=(
                None
                if commitlog.flush_disk_type is FlushDiskType.SYNC_FLUSH
                else self._max_unflushed
            ),
            request_flush=lambda: self.store.flush_now(thorough=True),
            on_suspect=self._suspect,
            identity=self._checks.identity,
            auth=self._auth,
            expected_master=self._checks.expected_master,
        )
        # (What the last probe found: it may change at the next one.)
        factory.checked = bool(self._checks.checked)
        factory.probe_first = self._checks.probe_first
        factory.probe_wait = min(PROBE_FIRST_TIMEOUT, self._probe_timeout)
        self.store.flush_observers.append(factory.flushed)
        # This slave's own segment file changed under it: no more appends.
        self._unobserve_damage = commitlog.observe_damage(self._store_damaged)
        self.client_service = make_slave_service(
            self._client, factory, self.reactor, self._retry_policy, master=self.master_address
        )
        self.client_service.setName("ha")

    def _forget_factory(self) -> None:
        assert self.slave_factory is not None
        self.slave_factory.drop_kept()
        if self.slave_factory.flushed in self.store.flush_observers:
            self.store.flush_observers.remove(self.slave_factory.flushed)
        self._unobserve_damage()

    def _store_damaged(self, damage: StoreDamagedError) -> None:
        """
        The commit log found one of its segment files changed under it (an
        observer: this runs inside whatever found it, an append among
        them): halt on the reactor's next turn.
        """
        if self._halting is None and self.running:
            self._halting = self.reactor.callLater(0, self._halt_damaged)

    def _halt_damaged(self) -> None:
        self._halting = None
        damage = self.commitlog.damage
        if damage is not None and self.state not in (ReplicaState.HALTED, ReplicaState.STOPPED):
            self._halt(f"this slave's commit log is damaged: {damage}")

    # -- checks -------------------------------------------------------------

    def _suspect(self) -> None:
        """
        A connection ended before the master sent anything, or on an
        offset mismatch: check for divergence (replication keeps retrying
        meanwhile, with its back-off).
        """
        if self._may_check():
            self._check_then_replicate()

    def _may_check(self) -> bool:
        return (
            bool(self.running)
            and self._check is None
            and self.state in (ReplicaState.REPLICATING, ReplicaState.BACKING_OFF)
        )

    def _check_then_replicate(self) -> None:
        if self.commitlog.damage is not None:
            # (Its own digests would read the damage as different bytes.)
            self._halt_damaged()
            return
        if self.state is not ReplicaState.REPLICATING:
            self._to(ReplicaState.PROBING)
        assert self._client is not None
        d = Deferred.fromCoroutine(self._checks.run(self._client))
        d.addCallback(lambda found: Deferred.fromCoroutine(self._act_on(found)))
        self._check = d

        def done(result: object) -> None:
            self._check = None
            if isinstance(result, Failure):
                if result.check(Halt):
                    self._halt(result.getErrorMessage())
                else:
                    self._check_failed(result)
            else:
                self.failed_checks = 0
                self._problem = None

        d.addBoth(done)

    def _halt(self, why: str) -> None:
        """
        Stop replicating for good (until a restart): only an operator can
        fix C{why}.
        """
        self._problem = why
        self._log.error("{why}; replication halted", why=why)
        if self.running:
            self._stop_replicating()
            self._to(ReplicaState.HALTED)

    def _check_failed(self, failure: Failure) -> None:
        """
        A check could not finish (the master unreachable, a control session
        lost or damaged, a master that spoke the extension not answering
        it): try again after a back-off.  Replication is left as it was:
        not started before a first check has finished.
        """
        self.failed_checks += 1
        delay = self._check_backoff(self.failed_checks - 1)
        master = self.master_address
        if failure.check(MasterUnreachable):
            why = f"cannot reach master {master}: {failure.getErrorMessage()}"
        elif failure.check(NotAnswering):
            why = failure.getErrorMessage()
        else:
            why = f"checking master {master} failed: {failure.getErrorMessage()}"
            if not failure.check(CheckFailed):
                self._log.failure("checking the master", failure)
        self._problem = why
        self._log.warn("{why}; retrying in {delay:.1f} s", why=why, delay=delay)
        if not self.running:
            return
        if failure.check(Refused) and self.state is ReplicaState.REPLICATING:
            # Not a master to follow: stop, not just retry.
            self._stop_replicating()
            self._to(ReplicaState.BACKING_OFF)
        if self.state in (ReplicaState.PROBING, ReplicaState.REPAIRING):
            self._to(ReplicaState.BACKING_OFF)
        if self._retry is None:
            self._retry = self.reactor.callLater(delay, self._retry_check)

    def _retry_check(self) -> None:
        self._retry = None
        if self._may_check():
            self._check_then_replicate()

    @property
    def problem(self) -> str | None:
        """
        Why this slave is not replicating (its master unreachable, not
        answering, a segment size that differs, its own commit log damaged,
        what the master said when it closed the connection, or that it
        keeps closing it), or C{None}.
        """
        store = self.store.commitlog
        if store is not None and store.damage is not None:
            return f"this slave's commit log is damaged: {store.damage}; replication halted"
        if self._problem is not None:
            return self._problem
        factory = self.slave_factory
        if factory is None:
            return None
        master = self.master_address
        if factory.connection is None and factory.connect_failure:
            return f"cannot reach master {master}: {factory.connect_failure}"
        if factory.closing_reason is not None:
            return f"master {master} stopped replicating to this slave: {factory.closing_reason}"
        if factory.closed_without_frame >= 2:
            # (One close is a master restarting; the same close again and
            # again is a master that cannot serve this slave.)
            return (
                f"master {master} closed the connection at offset {factory.closed_at} "
                f"{factory.closed_without_frame} times before sending anything; see the "
                "master's log"
            )
        return None

    def status(self) -> ReplicaStatus:
        """
        This slave's replication as it stands now.
        """
        factory = self.slave_factory
        connection = factory.connection if factory is not None else None
        return ReplicaStatus(
            state=self.state,
            connected=connection is not None,
            caught_up=connection is not None and connection.caught_up,
            checked=factory is not None and factory.checked,
            divergence=self.divergence,
            divergences=MappingProxyType(dict(self.divergences)),
            failed_checks=self.failed_checks,
            epoch_truncations=self.epoch_truncations,
            epoch_truncated_bytes=self.epoch_truncated_bytes,
            master_kind=self.master_kind,
            problem=self.problem,
            bytes_received=factory.bytes_received if factory is not None else 0,
            connections_made=factory.connections_made if factory is not None else 0,
            rejected_records=factory.rejected_records if factory is not None else 0,
            checksum_failures=factory.checksum_failures if factory is not None else 0,
        )

    @property
    def master_endpoint(self) -> str:
        """
        The master's endpoint description.
        """
        master = self._master_endpoint
        if isinstance(master, str):
            return master
        return str(getattr(master, "description", master))

    @property
    def master_address(self) -> str:
        """
        The master as C{HOST:PORT} (or its endpoint description when it
        has no host and port).
        """
        master = self.master_endpoint
        if not isinstance(self._master_endpoint, str):
            return master  # (a TLS endpoint says "tls:HOST:PORT (verifying NAME)")
        kind, positional, keywords = split_description(master)
        host = keywords.get("host") or (positional[0] if positional else "")
        port = keywords.get("port") or (positional[1] if len(positional) > 1 else "")
        if kind == "tcp" and host and port:
            return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return master

    # -- what the checks found (owned by the part) ---------------------------

    @property
    def master_kind(self) -> MasterKind | None:
        return self._checks.master_kind

    @property
    def divergence(self) -> Divergence | None:
        return self._checks.divergence

    @property
    def divergences(self) -> Mapping[str, int]:
        return self._checks.divergences

    @property
    def epoch_truncations(self) -> int:
        return self._checks.epoch_truncations

    @property
    def epoch_truncated_bytes(self) -> int:
        return self._checks.epoch_truncated_bytes

    @property
    def epochs(self) -> EpochFile | None:
        return self._checks.epochs

    @property
    def expected_leader(self) -> tuple[str, int] | None:
        """
        The node id and epoch the coordinator names as the leader
        (failover), or C{None}: with group authentication, the master must
        prove this node id (on the probe and on every replication
        connection), or it is not followed.
        """
        return self._checks.expected_leader

    # -- acting on the outcome ----------------------------------------------

    async def stop_to_repair(self) -> bool:
        """
        A check is about to cut this log (L{CheckHost.stop_to_repair
        <rmqha.ha.mastercheck.CheckHost.stop_to_repair>}): stop
        replicating, then enter REPAIRING unless stopped meanwhile.
        """
        await self._stop_replicating()
        if not self.running:
            return False
        self._to(ReplicaState.REPAIRING)
        return True

    def rebuild(self) -> None:
        """
        The store was reopened empty: a new slave factory and connection
        service over it.
        """
        self._build(self.commitlog)

    async def _act_on(self, divergence: Divergence | None) -> None:
        if not self.running or self.state is ReplicaState.HALTED:
            if self.slave_factory is not None:
                self.slave_factory.drop_kept()
            return  # (halted meanwhile: this log is damaged)
        checks = self._checks
        if divergence is None:
            checks.adopt_epochs()
            self._to(ReplicaState.REPLICATING)
            return
        mode = checks.found(divergence)
        await self._stop_replicating()
        if not self.running:
            return  # (stopped meanwhile: the store may be a master's now)
        if mode is OnDivergence.HALT:
            checks.forget_epochs()
            self._to(ReplicaState.HALTED)
            return
        checks.allow_repair(divergence, mode)
        self._to(ReplicaState.REPAIRING)
        await checks.repair(divergence, mode)
        if self.running:
            checks.adopt_epochs()
            self._to(ReplicaState.REPLICATING)
