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

PROBING covers the control probe and the divergence check that follows
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
left running.  L{Replica._to} is the only place the state changes.

The L{ClientService} that keeps the connection to the master (built by
L{rmqha.ha.slave.make_slave_service}) is a child this service starts and
stops itself: it runs only in REPLICATING.
"""

from __future__ import annotations

import enum
import os
import random
import time
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
from rmqha.store.errors import OffsetOutOfRangeError, StoreDamagedError
from rmqha.ha._wire import FEATURE_IDENTIFY
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
from rmqha.ha.control import (
    AuthFailed,
    CheckFailed,
    ControlClient,
    MasterInfo,
    MasterUnreachable,
    log_digest,
    probe,
)
from rmqha.ha.divergence import (
    Divergence,
    TAIL_WINDOW,
    DivergenceKind,
    find_divergence,
    read_master_kind,
    write_master_kind,
)
from rmqha.ha.epochs import Entry, EpochFile, common_end

#: Failover: the tail the digest check confirms after the epochs decided
#: where two logs part (docs/failover.md).
EPOCH_VERIFY_WINDOW = 1024 * 1024
from rmqha.ha.slave import SlaveFactory, load_replica_id, make_slave_service
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


class _Halt(Exception):
    """
    A check found something only an operator can fix (not a divergence):
    replication stays stopped; the text says what.
    """


class _NotAnswering(CheckFailed):
    """
    A master that must speak the rmqha extension did not answer it.
    """


class _Refused(_NotAnswering):
    """
    Failover: a master this node must not follow (no epochs, or an older
    epoch than this node has seen); replication stops until a check
    passes.
    """


def _cut_back(store: CommitLogService, commitlog: CommitLog, cut: int) -> Deferred[Any]:
    """
    Cut C{commitlog} back to C{cut}, the log held throughout
    (L{CommitLogService.exclusive}): its quarantine copy (up to --max-cut
    bytes, with fsync) in a thread; the log's ends moved back on the
    reactor (microseconds: L{CommitLog.cut_quarantined}); the zeroing of
    the cut bytes and the removal of the segments past them in a thread
    again.  Fires with the quarantine file, or C{None} when there was
    nothing to cut.
    """

    def finish(path: str | None) -> Deferred[str | None] | None:
        if path is None:
            return None
        bulk = commitlog.cut_quarantined(cut)
        return store.in_thread(bulk).addCallback(lambda _: path)

    return store.exclusive(lambda: commitlog.quarantine_tail(cut), finish)


class Replica(Service):
    """
    Replication from one master into an open store.

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
        #: The node id and epoch the coordinator names as the leader
        #: (failover), or C{None}: with group authentication, the master
        #: must prove this node id (on the probe and on every replication
        #: connection), or it is not followed.
        self.expected_leader = expected_leader
        self._auth = auth
        self.reactor = reactor
        self._replica_id = replica_id
        self.store = store
        self._master_endpoint = master_endpoint
        self._config = config
        self._retry_policy = retry_policy
        self._max_unflushed = max_unflushed
        self._on_divergence = on_divergence
        self._probe_timeout = probe_timeout
        self._master_kind_option = master_kind
        self.state = ReplicaState.STOPPED
        self.master_kind: MasterKind | None = None
        self.divergence: Divergence | None = None
        self.divergences: dict[str, int] = {k.value: 0 for k in DivergenceKind}
        self.failed_checks = 0
        self.epochs = epochs
        #: Failover: the leader's node id and epoch, as the coordinator
        #: read them from etcd.
        self.expected_leader = expected_leader
        self._max_cut = max_cut
        self.epoch_truncations = 0
        self.epoch_truncated_bytes = 0
        #: The master's epoch list, adopted when replication starts.
        self._master_epochs: list[Entry] | None = None
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
        #: Checked framing: C{None} until the master has been asked.
        self._checked: bool | None = None
        self._identity: str | None = None
        self._classic_logged = False
        self._client: IStreamClientEndpoint | None = None
        self.slave_factory: SlaveFactory | None = None
        self.client_service: ClientService | None = None
        self._unobserve_damage: Callable[[], None] = lambda: None
        self._halting: IDelayedCall | None = None

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
        service = self.client_service
        if service is None:
            return
        if state is ReplicaState.REPLICATING and not service.running:
            service.startService()

    def _stop_replicating(self) -> Deferred[None]:
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
            identity=self._identity,
            auth=self._auth,
            expected_master=self._expected_master(),
        )
        # (What the last probe found: it may change at the next one.)
        factory.checked = bool(self._checked)
        self.store.flush_observers.append(factory.flushed)
        # This slave's own segment file changed under it: no more appends.
        self._unobserve_damage = commitlog.observe_damage(self._store_damaged)
        self.client_service = make_slave_service(
            self._client, factory, self.reactor, self._retry_policy, master=self.master_address
        )
        self.client_service.setName("ha")

    def _forget_factory(self) -> None:
        assert self.slave_factory is not None
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

    def _expected_master(self) -> str | None:
        leader = self.expected_leader
        return leader[0] if leader is not None else None

    def _check_master_identity(self, info: MasterInfo) -> None:
        """
        With group authentication: the master must have proven a node id
        on the probe, and the expected leader's if one is named
        (docs/failover.md, "Who counts").

        @raise _Refused: it did not.
        """
        if self._auth is None:
            return
        master = self.master_address
        expected = self._expected_master()
        if not info.node_ids:
            raise _Refused(
                f"master {master} proved no node id ({self._auth.mode} required): not followed"
            )
        if expected is not None and expected not in info.node_ids:
            raise _Refused(
                f"master {master} proved it is node {', '.join(sorted(info.node_ids))}, "
                f"not {expected}, the elected leader: not followed"
            )

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
        d = Deferred.fromCoroutine(self._check_divergence())
        d.addCallback(lambda found: Deferred.fromCoroutine(self._act_on(found)))
        self._check = d

        def done(result: object) -> None:
            self._check = None
            if isinstance(result, Failure):
                if result.check(_Halt):
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
        elif failure.check(_NotAnswering):
            why = failure.getErrorMessage()
        else:
            why = f"checking master {master} failed: {failure.getErrorMessage()}"
            if not failure.check(CheckFailed):
                self._log.failure("checking the master", failure)
        self._problem = why
        self._log.warn("{why}; retrying in {delay:.1f} s", why=why, delay=delay)
        if not self.running:
            return
        if failure.check(_Refused) and self.state is ReplicaState.REPLICATING:
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

    def _known_master_kind(self) -> MasterKind | None:
        if self.master_kind is None:
            self.master_kind = read_master_kind(self.commitlog.store_dir, self.master_address)
        return self.master_kind

    def _learnt(self, kind: MasterKind) -> None:
        """
        The master is C{kind}: remember it in the store when that is news.
        """
        if read_master_kind(self.commitlog.store_dir, self.master_address) != kind:
            try:
                write_master_kind(
                    self.commitlog.store_dir, self.master_address, kind, self.reactor.seconds()
                )
            except OSError as e:
                self._log.warn(
                    "cannot remember in the store that the master is {kind}: {error}",
                    kind=kind,
                    error=e,
                )
        self.master_kind = kind

    def _set_framing(self, checked: bool, identify: bool = False) -> None:
        """
        How the replication connection talks: checked framing or classic,
        and whether it declares this replica's id (the master takes
        IDENTIFY).
        """
        if self._checked != checked:
            self._checked = checked
            self._log.info(
                "checked framing (CRC-32 on every frame and report) {state}",
                state="on" if checked else "off: the master does not offer it",
            )
        self._identity = (
            (self._replica_id or load_replica_id(self.commitlog.store_dir)) if identify else None
        )
        if self.slave_factory is not None:
            self.slave_factory.checked = checked
            self.slave_factory.identity = self._identity

    def _classic(self, why: str) -> None:
        self._set_framing(False)
        if not self._classic_logged:
            self._classic_logged = True
            self._log.warn(
                "{why}: replicating classically, without checked framing or "
                "divergence checks",
                why=why,
            )

    async def _check_divergence(self) -> Divergence | None:
        master = self.master_address
        self._master_epochs = None  # (only this check's answer is adopted)
        if self._master_kind_option is MasterKind.ROCKETMQ:
            self._learnt(MasterKind.ROCKETMQ)
            self._classic(f"master {master} is a RocketMQ master (--master-kind rocketmq)")
            return None
        if self._on_divergence is None and self.epochs is None:
            return None
        # Where this log ends, taken before the master's offsets are: the
        # master's max can only have grown since, so replication running
        # meanwhile cannot look like "ahead".
        slave_end = self.commitlog.record_end
        known = self._known_master_kind()
        sticky = known is MasterKind.RMQHA or self._master_kind_option is MasterKind.RMQHA
        # A master that must answer is given the whole probe timeout;
        # otherwise silence for the first timeout means RocketMQ.
        first = None if sticky else min(PROBE_FIRST_TIMEOUT, self._probe_timeout)
        assert self._client is not None
        try:
            session = await probe(
                self.reactor,
                self._client,
                self._probe_timeout,
                first_timeout=first,
                auth=self._auth,
                expected_master=self._expected_master(),
            )
        except AuthFailed as e:
            # (Not to be followed, as a master without epochs is not.)
            raise _Refused(f"master {master}: {e}") from None
        if session is None:
            if self.epochs is not None:
                raise _Refused(
                    f"master {master} does not answer the rmqha extension: a failover "
                    "slave follows only a master that keeps epochs"
                )
            if self._master_kind_option is MasterKind.RMQHA:
                raise _NotAnswering(
                    f"master {master} does not answer the rmqha extension "
                    "(--master-kind rmqha): not replicating classically"
                )
            if known is MasterKind.RMQHA:
                raise _NotAnswering(
                    f"master {master} spoke the rmqha extension before but is not "
                    "answering; not falling back to classic replication (if it is "
                    "now a RocketMQ master, restart with --master-kind rocketmq)"
                )
            self._learnt(MasterKind.ROCKETMQ)
            self._classic(
                f"master {master} does not answer the rmqha control extension "
                "(a RocketMQ master?)"
            )
            return None
        client, info = session
        try:
            self._check_master_identity(info)
            self._learnt(MasterKind.RMQHA)
            self._set_framing(info.checked_framing, bool(info.features & FEATURE_IDENTIFY))
            ours = self.commitlog.segment_size
            if info.segment_size != ours:
                raise _Halt(
                    f"master {master} uses segments of {info.segment_size} bytes "
                    f"(mappedFileSizeCommitLog) and this slave's store {ours}: a "
                    "slave's segment size must be its master's (start the slave "
                    f"on an empty store with --segment-size {info.segment_size})"
                )
            window = TAIL_WINDOW
            if self.epochs is not None:
                shared = bool(self.epochs.entries)
                slave_end = await self._cut_to_common_epoch(client, info, slave_end)
                if not self.running:
                    return None
                if shared:
                    # The epochs decided where the logs part; the digests
                    # only confirm it, over a short tail, so that a slave
                    # following a new master replicates (and a SYNC
                    # master's puts resume) without hashing 64 MiB first.
                    window = EPOCH_VERIFY_WINDOW
            if self._on_divergence is None:
                return None
            return await find_divergence(
                self.commitlog, client, info, window=window, slave_end=slave_end
            )
        finally:
            client.close()

    async def _cut_to_common_epoch(
        self, client: ControlClient, info: MasterInfo, slave_end: int
    ) -> int:
        """
        Failover: ask the master's epochs; refuse a master without them or
        at an older epoch than this node has seen; cut this log back to
        the end of the newest epoch both share (RocketMQ 5's doTruncate).
        An empty local list (a store from before failover, or a new one)
        leaves it to the digest check.

        @return: where this log now ends.
        @raise _Refused: a master not to follow.
        @raise _Halt: no epoch in common, or a cut before this log's start.
        """
        master = self.master_address
        epochs = self.epochs
        assert epochs is not None
        if not info.epochs:
            raise _Refused(
                f"master {master} keeps no epochs (it is not in failover mode): a "
                "failover slave does not follow it"
            )
        answer = await client.epochs()
        ours = epochs.entries
        expected = self.expected_leader
        if expected is not None and answer.epoch != expected[1]:
            raise _Refused(
                f"master {master} says it is at epoch {answer.epoch}, but the coordinator "
                f"elected {expected[0]} at epoch {expected[1]}: not followed, nothing cut"
            )
        if answer.epoch < epochs.last_epoch:
            raise _Refused(
                f"master {master} is at epoch {answer.epoch}, this node has seen epoch "
                f"{epochs.last_epoch}: a deposed master, not followed"
            )
        self._master_epochs = [e for e in answer.entries if e[1] <= answer.max_offset]
        if not ours or not self.commitlog.has_data():
            return slave_end
        cut = common_end(ours, slave_end, answer.entries, answer.max_offset)
        if cut is None:
            self._master_epochs = None
            raise _Halt(
                f"this node's log and master {master}'s share no epoch (this node's "
                f"last: epoch {ours[-1][0]} from {ours[-1][1]}; the master's last: "
                + (
                    f"epoch {answer.entries[-1][0]} from {answer.entries[-1][1]})"
                    if answer.entries
                    else "none)"
                )
            )
        if cut >= slave_end:
            return slave_end
        await self._prove_cut(client, cut, slave_end, "the epochs")
        await self._stop_replicating()
        if not self.running:
            return slave_end
        self._to(ReplicaState.REPAIRING)
        commitlog = self.commitlog
        end = commitlog.max_offset
        try:
            # (In a thread: the quarantine copy of up to --max-cut bytes,
            # with fsync, must not hold the reactor -- its lease renewals.)
            await _cut_back(self.store, commitlog, cut)
        except OffsetOutOfRangeError:
            self._master_epochs = None
            raise _Halt(
                f"the newest epoch this node shares with master {master} ends at {cut}, "
                f"before this log's oldest segment at {commitlog.min_offset}: it cannot "
                "be cut back there (rebootstrap it)"
            ) from None
        epochs.truncate_to(cut)
        self.epoch_truncations += 1
        self.epoch_truncated_bytes += end - cut
        self._log.warn(
            "cut this log back from {end} to {cut}, the end of the newest epoch it "
            "shares with master {master} (the cut bytes are in quarantine)",
            end=end,
            cut=cut,
            master=master,
        )
        return cut

    async def _prove_cut(self, client: ControlClient, cut: int, end: int, why: str) -> None:
        """
        Failover: before this log is cut back from C{end} to C{cut} on the
        master's word (C{why}), the master must prove the part both keep:
        never the whole log on one answer, never more than C{--max-cut},
        and the master's digest of the last bytes before the cut (up to
        1 MiB) must equal this log's.

        @raise _Halt: the cut is bigger than C{--max-cut} (an operator
            decides; nothing is cut).
        @raise _Refused: the cut is not proven (nothing is cut; checked
            again after a back-off, as for any master not to follow).
        """
        master = self.master_address
        commitlog = self.commitlog
        size = end - cut
        limit = self._max_cut
        if limit is not None and size > limit:
            raise _Halt(
                f"{why} of master {master} would cut {size} bytes from this log "
                f"(back to {cut} from {end}), more than --max-cut {limit}: not cut; "
                f"to allow it, restart this node with --max-cut {size} (the cut "
                "bytes go to quarantine)"
            )
        start = max(commitlog.min_offset, cut - EPOCH_VERIFY_WINDOW)
        if cut <= commitlog.min_offset or start >= cut:
            raise _Refused(
                f"{why} of master {master} would cut this node's whole log (back to "
                f"{cut} from {end}) on its word alone, with no common bytes to prove it: "
                "not cut; if the master is right, move this store aside and start the "
                "node on an empty one (it copies the master's log)"
            )
        theirs = await client.digest(start, cut)
        ours = log_digest(commitlog, start, cut)
        if theirs is None or ours is None or theirs != ours:
            raise _Refused(
                f"{why} of master {master} would cut this log back to {cut}, but the "
                f"master's bytes {start}-{cut} differ from this log's (or it would not "
                "digest them): not cut; compare the stores (rmqha pipeline verify) "
                "before moving this one aside"
            )

    def _adopt_epochs(self) -> None:
        """
        Failover: take the master's epoch list, once the checks let
        replication start.
        """
        entries, self._master_epochs = self._master_epochs, None
        if self.epochs is not None and entries is not None:
            self.epochs.replace(entries)

    async def _act_on(self, divergence: Divergence | None) -> None:
        if not self.running or self.state is ReplicaState.HALTED:
            return  # (halted meanwhile: this log is damaged)
        if divergence is None:
            self._adopt_epochs()
            self._to(ReplicaState.REPLICATING)
            return
        self.divergence = divergence
        self.divergences[divergence.kind.value] += 1
        mode = self._on_divergence
        if mode is OnDivergence.TRUNCATE and divergence.truncate_to is None:
            mode = OnDivergence.HALT
        self._log.warn(
            "divergence: {what}; on-divergence={mode}",
            what=divergence.describe(),
            mode=str(mode),
        )
        await self._stop_replicating()
        if not self.running:
            return  # (stopped meanwhile: the store may be a master's now)
        if mode is OnDivergence.HALT:
            self._master_epochs = None
            self._to(ReplicaState.HALTED)
            return
        if mode is OnDivergence.TRUNCATE and self._max_cut is not None:
            assert divergence.truncate_to is not None
            size = self.commitlog.max_offset - divergence.truncate_to
            if size > self._max_cut:
                self._master_epochs = None
                raise _Halt(
                    f"the divergence check would cut {size} bytes from this log (back to "
                    f"{divergence.truncate_to}), more than --max-cut {self._max_cut}: not "
                    f"cut; to allow it, restart this node with --max-cut {size}"
                )
        self._to(ReplicaState.REPAIRING)
        if mode is OnDivergence.TRUNCATE:
            assert divergence.truncate_to is not None
            commitlog, cut = self.commitlog, divergence.truncate_to
            path = await _cut_back(self.store, commitlog, cut)
            self._log.warn(
                "cut the log back to offset {offset}; the cut bytes are kept in {path}",
                offset=cut,
                path=path,
            )
            if self.epochs is not None:
                self.epochs.truncate_to(divergence.truncate_to)
        else:
            await self._rebootstrap()
        self.divergence = None
        if self.running:
            self._adopt_epochs()
            self._to(ReplicaState.REPLICATING)

    async def _rebootstrap(self) -> None:
        """
        Move the store aside (never deleted) and start an empty one.
        """
        old = self.commitlog.store_dir
        when = time.strftime("%Y%m%dT%H%M%S", time.gmtime(self.reactor.seconds()))
        aside = f"{old}.diverged-{when}"
        # (Closing the log, the move and opening an empty one run in a
        # thread: the reactor renews the lease meanwhile.)
        await self.store.reopen(lambda: os.rename(old, aside))
        self._log.warn("moved the diverged store aside to {aside}", aside=aside)
        if self.epochs is not None:
            # The epoch file went aside with the store too.
            self.epochs.reload()
        self._build(self.commitlog)
        if self.master_kind is not None:
            # The memory of what the master is went aside with the store.
            self._learnt(self.master_kind)
