# -*- test-case-name: tests.test_slave_probe,tests.test_epochs,tests.test_divergence,tests.test_group_auth -*-
"""
The checks a slave runs on its master before it replicates, and the
repairs they lead to: L{MasterCheck}, a part of L{rmqha.ha.replica.Replica}.

One check (L{MasterCheck.run}) is the control probe
(L{rmqha.ha.control.probe}: is the master rmqha or RocketMQ, does it
offer checked framing, which node id does it prove), in failover mode
the master's EPOCHS and the cut back to the newest epoch both logs share
(never more than C{--max-cut}, and only once the master proved the bytes
before the cut), then the digest divergence check
(L{rmqha.ha.divergence.find_divergence}).  A divergence is acted on by
the replica's state machine, which asks this part to repair it
(L{MasterCheck.repair}: truncate, or move the store aside and rebootstrap).

The part owns what the checks learnt (the master's kind, checked framing,
the master's epoch list until it is adopted) and what they counted
(divergences, epoch cuts).  It never changes the replica's state: it asks
its L{CheckHost} to stop replicating and enter REPAIRING, and raises
L{Halt}, L{NotAnswering} or L{Refused} for the state machine to act on.
"""

from __future__ import annotations

import os
import time
from typing import Any, Protocol

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.logger import Logger

from rmqha.store.commitlog import CommitLog
from rmqha.store.errors import OffsetOutOfRangeError
from rmqha.store.service import CommitLogService
from rmqha.ha._wire import FEATURE_IDENTIFY
from rmqha.ha.auth import GroupAuth
from rmqha.ha.config import (
    DEFAULT_PROBE_TIMEOUT,
    PROBE_FIRST_TIMEOUT,
    MasterKind,
    OnDivergence,
)
from rmqha.ha.control import (
    AuthFailed,
    CheckFailed,
    ControlClient,
    MasterInfo,
    SilentMaster,
    log_digest,
    probe,
)
from rmqha.ha.divergence import (
    TAIL_WINDOW,
    Divergence,
    DivergenceKind,
    find_divergence,
    read_master_kind,
    write_master_kind,
)
from rmqha.ha.epochs import Entry, EpochFile, common_end
from rmqha.ha.slave import SlaveFactory, load_replica_id

__all__ = [
    "EPOCH_VERIFY_WINDOW",
    "CheckHost",
    "Halt",
    "MasterCheck",
    "NotAnswering",
    "Refused",
    "cut_back",
]

#: Failover: the tail the digest check confirms after the epochs decided
#: where two logs part (docs/failover.md).
EPOCH_VERIFY_WINDOW = 1024 * 1024


def _size_text(size: int) -> str:
    """
    C{size} bytes as an operator writes it (C{16 MiB}), exact.
    """
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if size % unit == 0:
            return f"{size // unit} {name} ({size} bytes)"
    return f"{size} bytes"


class Halt(Exception):
    """
    A check found something only an operator can fix (not a divergence):
    replication stays stopped; the text says what.
    """


class NotAnswering(CheckFailed):
    """
    A master that must speak the rmqha extension did not answer it.
    """


class Refused(NotAnswering):
    """
    Failover: a master this node must not follow (no epochs, or an older
    epoch than this node has seen); replication stops until a check
    passes.
    """


def cut_back(store: CommitLogService, commitlog: CommitLog, cut: int) -> Deferred[Any]:
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


class CheckHost(Protocol):
    """
    What a L{MasterCheck} needs of the replica it checks for (the
    L{rmqha.ha.replica.Replica}, which owns the state and the connection).
    """

    @property
    def running(self) -> int:
        """
        Whether the replica runs (a check ends quietly once it does not).
        """

    @property
    def slave_factory(self) -> SlaveFactory | None:
        """
        The replication connection's factory, told how to talk.
        """

    @property
    def replicating(self) -> bool:
        """
        The replication connection service runs (a check while it does
        cannot hand its probe connection over to it).
        """

    async def stop_to_repair(self) -> bool:
        """
        Stop replicating and enter REPAIRING: C{False} if the replica was
        stopped meanwhile (then nothing is to be cut).
        """

    def rebuild(self) -> None:
        """
        Build the slave factory and the connection service again, over the
        store just reopened.
        """


class MasterCheck:
    """
    The checks of one replica's master, and the repairs they call for.

    @ivar master_kind: what the master is (L{MasterKind.RMQHA},
        L{MasterKind.ROCKETMQ}), or C{None} while unknown (remembered in
        the store).
    @ivar divergence: the divergence found and not yet repaired, if any.
    @ivar divergences: divergences found, by kind.
    @ivar epoch_truncations: failover: times the log was cut back to the
        end of the newest epoch it shares with its master.
    @ivar epoch_truncated_bytes: the bytes those cuts moved to quarantine.
    @ivar checked: checked framing: C{None} until the master has been
        asked.
    @ivar identity: the replica id the replication connection declares
        (IDENTIFY), or C{None}.
    """

    _log = Logger()

    def __init__(
        self,
        host: CheckHost,
        reactor: Any,
        store: CommitLogService,
        master: str,
        *,
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
        @param host: the replica checked for.
        @param master: the master as the log lines name it (C{HOST:PORT}).
        @param on_divergence: what to do on a divergence; C{None}: no
            divergence check.
        @param master_kind: the C{--master-kind} option.
        @param max_cut: the most bytes a check may cut from this log
            (epochs or digests), or C{None}: no limit.

        The others are L{rmqha.ha.replica.Replica}'s.
        """
        self._host = host
        self._reactor = reactor
        self._store = store
        self.master = master
        self._on_divergence = on_divergence
        self._probe_timeout = probe_timeout
        self._master_kind_option = master_kind
        self._replica_id = replica_id
        self.epochs = epochs
        self._auth = auth
        self.expected_leader = expected_leader
        self._max_cut = max_cut
        self.master_kind: MasterKind | None = None
        self.divergence: Divergence | None = None
        self.divergences: dict[str, int] = {k.value: 0 for k in DivergenceKind}
        self.epoch_truncations = 0
        self.epoch_truncated_bytes = 0
        #: The master's epoch list, adopted when replication starts.
        self._master_epochs: list[Entry] | None = None
        self.checked: bool | None = None
        self.identity: str | None = None
        #: The master is taken for RocketMQ's without being known to be:
        #: every replication connection probes (L{SlaveFactory.probe_first}).
        self.probe_first = False
        self._classic_logged = False

    @property
    def _commitlog(self) -> CommitLog:
        commitlog = self._store.commitlog
        if commitlog is None:
            raise RuntimeError("the store is not open")
        return commitlog

    # -- what the master is -------------------------------------------------

    @property
    def expected_master(self) -> str | None:
        """
        The node id the master must prove (with group authentication), or
        C{None}.
        """
        leader = self.expected_leader
        return leader[0] if leader is not None else None

    def check_master_identity(self, info: MasterInfo) -> None:
        """
        With group authentication: the master must have proven a node id
        on the probe, and the expected leader's if one is named
        (docs/failover.md, "Who counts").

        @raise Refused: it did not.
        """
        if self._auth is None:
            return
        master = self.master
        expected = self.expected_master
        if not info.node_ids:
            raise Refused(
                f"master {master} proved no node id ({self._auth.mode} required): not followed"
            )
        if expected is not None and expected not in info.node_ids:
            raise Refused(
                f"master {master} proved it is node {', '.join(sorted(info.node_ids))}, "
                f"not {expected}, the elected leader: not followed"
            )

    def _known_master_kind(self) -> MasterKind | None:
        if self.master_kind is None:
            self.master_kind = read_master_kind(self._commitlog.store_dir, self.master)
        return self.master_kind

    def _learnt(self, kind: MasterKind) -> None:
        """
        The master is C{kind}: remember it in the store when that is news.
        """
        store_dir = self._commitlog.store_dir
        if read_master_kind(store_dir, self.master) != kind:
            try:
                write_master_kind(store_dir, self.master, kind, self._reactor.seconds())
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
        if self.checked != checked:
            self.checked = checked
            self._log.info(
                "checked framing (CRC-32 on every frame and report) {state}",
                state="on" if checked else "off: the master does not offer it",
            )
        self.identity = (
            (self._replica_id or load_replica_id(self._commitlog.store_dir)) if identify else None
        )
        factory = self._host.slave_factory
        if factory is not None:
            factory.checked = checked
            factory.identity = self.identity
            factory.probe_first = self.probe_first
            factory.probe_wait = min(PROBE_FIRST_TIMEOUT, self._probe_timeout)

    def _classic(self, why: str, probe_first: bool = False) -> None:
        """
        Replicate classically (C{why}); with C{probe_first}, every
        replication connection probes first (a master taken for
        RocketMQ's, not configured as one).
        """
        self.probe_first = probe_first
        self._set_framing(False)
        if not self._classic_logged:
            self._classic_logged = True
            self._log.warn(
                "{why}: replicating classically, without checked framing or "
                "divergence checks",
                why=why,
            )

    # -- the check ----------------------------------------------------------

    async def run(self, client: IStreamClientEndpoint) -> Divergence | None:
        """
        Check the master at C{client}: the probe, in failover mode the
        epochs (and the cut they call for), then the digests.

        @return: the divergence found, or C{None} (replicate).
        @raise Halt: only an operator can fix what was found.
        @raise NotAnswering: the master did not answer as it must
            (L{Refused}: not a master to follow).
        """
        master = self.master
        self._master_epochs = None  # (only this check's answer is adopted)
        if self._master_kind_option is MasterKind.ROCKETMQ:
            self._learnt(MasterKind.ROCKETMQ)
            self._classic(f"master {master} is a RocketMQ master (--master-kind rocketmq)")
            return None
        self.probe_first = False
        if self._on_divergence is None and self.epochs is None:
            return None
        # Where this log ends, taken before the master's offsets are: the
        # master's max can only have grown since, so replication running
        # meanwhile cannot look like "ahead".
        slave_end = self._commitlog.record_end
        known = self._known_master_kind()
        sticky = known is MasterKind.RMQHA or self._master_kind_option is MasterKind.RMQHA
        # A master that must answer is given the whole probe timeout;
        # otherwise silence for the first timeout means RocketMQ.
        first = None if sticky else min(PROBE_FIRST_TIMEOUT, self._probe_timeout)
        # Where silence means RocketMQ, the probe's connection is kept:
        # a RocketMQ master waits on it (the -1 is its "no report yet")
        # and replication goes on there, so it never sees a connection
        # closed unanswered (two ERROR lines in its log).
        keep = not sticky and self.epochs is None
        try:
            session = await probe(
                self._reactor,
                client,
                self._probe_timeout,
                first_timeout=first,
                auth=self._auth,
                expected_master=self.expected_master,
                keep=keep,
            )
        except AuthFailed as e:
            # (Not to be followed, as a master without epochs is not.)
            raise Refused(f"master {master}: {e}") from None
        if isinstance(session, SilentMaster):
            self._learnt(MasterKind.ROCKETMQ)
            self._classic(
                f"master {master} does not answer the rmqha control extension "
                "(a RocketMQ master?)",
                probe_first=True,
            )
            self._hand_over(session.client)
            return None
        if session is None:
            if self.epochs is not None:
                raise Refused(
                    f"master {master} does not answer the rmqha extension: a failover "
                    "slave follows only a master that keeps epochs"
                )
            if self._master_kind_option is MasterKind.RMQHA:
                raise NotAnswering(
                    f"master {master} does not answer the rmqha extension "
                    "(--master-kind rmqha): not replicating classically"
                )
            if known is MasterKind.RMQHA:
                raise NotAnswering(
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
        control, info = session
        try:
            self.check_master_identity(info)
            self._learnt(MasterKind.RMQHA)
            self._set_framing(info.checked_framing, bool(info.features & FEATURE_IDENTIFY))
            if info.segment_size != self._commitlog.segment_size:
                if not await self._adopt_segment_size(info.segment_size):
                    return None
            window = TAIL_WINDOW
            if self.epochs is not None:
                shared = bool(self.epochs.entries)
                slave_end = await self._cut_to_common_epoch(control, info, slave_end)
                if not self._host.running:
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
                self._commitlog, control, info, window=window, slave_end=slave_end
            )
        finally:
            control.close()

    def _hand_over(self, client: ControlClient) -> None:
        """
        Give the silent master's probe connection to the replication
        connection service, which makes its next connection on it; closed
        when there is no service to take it, or one already running (a
        check while replicating: its own connections probe).
        """
        factory = self._host.slave_factory
        if factory is None or self._host.replicating or not self._host.running:
            client.close()
            return
        factory.keep(client)

    async def _adopt_segment_size(self, size: int) -> bool:
        """
        The master's segments are C{size} bytes, this log's are not: an
        empty log whose size nobody configured takes the master's
        (replication stopped meanwhile; a segment file holding no record
        is quarantined, L{CommitLog.adopt_segment_size}).

        @return: C{False} if the replica was stopped meanwhile.
        @raise Halt: the log holds records, or its size was configured.
        """
        master = self.master
        commitlog = self._commitlog
        ours = commitlog.segment_size
        configured = commitlog.configured_segment_size
        if commitlog.has_data():
            raise Halt(
                f"master {master} uses segments of {size} bytes "
                f"(mappedFileSizeCommitLog) and this slave's store {ours}: a "
                "slave's segment size must be its master's (start the slave "
                f"on an empty store with --segment-size {size})"
            )
        if configured is not None:
            raise Halt(
                f"master {master} uses segments of {size} bytes "
                f"(mappedFileSizeCommitLog) and this slave's store {ours}, as "
                "configured (--segment-size): a slave's segment size must be its "
                f"master's (its store is empty: configure {size}, or no size, and "
                "it adopts the master's)"
            )
        if not await self._host.stop_to_repair():
            return False
        commitlog = self._commitlog
        kept = await self._store.exclusive(lambda: commitlog.adopt_segment_size(size))
        self._log.info(
            "store is empty: adopting master {master}'s segment size {size}{kept}",
            master=master,
            size=_size_text(size),
            kept=(
                f" (its empty segment files are in quarantine: {', '.join(kept)})"
                if kept
                else ""
            ),
        )
        return True

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
        @raise Refused: a master not to follow.
        @raise Halt: no epoch in common, or a cut before this log's start.
        """
        master = self.master
        epochs = self.epochs
        assert epochs is not None
        if not info.epochs:
            raise Refused(
                f"master {master} keeps no epochs (it is not in failover mode): a "
                "failover slave does not follow it"
            )
        answer = await client.epochs()
        ours = epochs.entries
        expected = self.expected_leader
        if expected is not None and answer.epoch != expected[1]:
            raise Refused(
                f"master {master} says it is at epoch {answer.epoch}, but the coordinator "
                f"elected {expected[0]} at epoch {expected[1]}: not followed, nothing cut"
            )
        if answer.epoch < epochs.last_epoch:
            raise Refused(
                f"master {master} is at epoch {answer.epoch}, this node has seen epoch "
                f"{epochs.last_epoch}: a deposed master, not followed"
            )
        self._master_epochs = [e for e in answer.entries if e[1] <= answer.max_offset]
        if not ours or not self._commitlog.has_data():
            return slave_end
        cut = common_end(ours, slave_end, answer.entries, answer.max_offset)
        if cut is None:
            self._master_epochs = None
            raise Halt(
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
        if not await self._host.stop_to_repair():
            return slave_end
        commitlog = self._commitlog
        end = commitlog.max_offset
        try:
            # (In a thread: the quarantine copy of up to --max-cut bytes,
            # with fsync, must not hold the reactor -- its lease renewals.)
            await cut_back(self._store, commitlog, cut)
        except OffsetOutOfRangeError:
            self._master_epochs = None
            raise Halt(
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

        @raise Halt: the cut is bigger than C{--max-cut} (an operator
            decides; nothing is cut).
        @raise Refused: the cut is not proven (nothing is cut; checked
            again after a back-off, as for any master not to follow).
        """
        master = self.master
        commitlog = self._commitlog
        size = end - cut
        limit = self._max_cut
        if limit is not None and size > limit:
            raise Halt(
                f"{why} of master {master} would cut {size} bytes from this log "
                f"(back to {cut} from {end}), more than --max-cut {limit}: not cut; "
                f"to allow it, restart this node with --max-cut {size} (the cut "
                "bytes go to quarantine)"
            )
        start = max(commitlog.min_offset, cut - EPOCH_VERIFY_WINDOW)
        if cut <= commitlog.min_offset or start >= cut:
            raise Refused(
                f"{why} of master {master} would cut this node's whole log (back to "
                f"{cut} from {end}) on its word alone, with no common bytes to prove it: "
                "not cut; if the master is right, move this store aside and start the "
                "node on an empty one (it copies the master's log)"
            )
        theirs = await client.digest(start, cut)
        ours = log_digest(commitlog, start, cut)
        if theirs is None or ours is None or theirs != ours:
            raise Refused(
                f"{why} of master {master} would cut this log back to {cut}, but the "
                f"master's bytes {start}-{cut} differ from this log's (or it would not "
                "digest them): not cut; compare the stores (rmqha pipeline verify) "
                "before moving this one aside"
            )

    # -- what the state machine does with the outcome -------------------------

    def adopt_epochs(self) -> None:
        """
        Failover: take the master's epoch list, once the checks let
        replication start.
        """
        entries, self._master_epochs = self._master_epochs, None
        if self.epochs is not None and entries is not None:
            self.epochs.replace(entries)

    def forget_epochs(self) -> None:
        """
        Replication will not start on this check: its epoch list is not
        to be adopted.
        """
        self._master_epochs = None

    def found(self, divergence: Divergence) -> OnDivergence | None:
        """
        Count C{divergence} and say what to do about it: the
        C{--on-divergence} mode (C{truncate} becomes C{halt} when the
        divergence cannot be cut).
        """
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
        return mode

    def allow_repair(self, divergence: Divergence, mode: OnDivergence | None) -> None:
        """
        A repair in C{mode} may go ahead: a truncation cuts at most
        C{--max-cut} bytes.

        @raise Halt: it would cut more (nothing is cut).
        """
        if mode is OnDivergence.TRUNCATE and self._max_cut is not None:
            assert divergence.truncate_to is not None
            size = self._commitlog.max_offset - divergence.truncate_to
            if size > self._max_cut:
                self._master_epochs = None
                raise Halt(
                    f"the divergence check would cut {size} bytes from this log (back to "
                    f"{divergence.truncate_to}), more than --max-cut {self._max_cut}: not "
                    f"cut; to allow it, restart this node with --max-cut {size}"
                )

    async def repair(self, divergence: Divergence, mode: OnDivergence | None) -> None:
        """
        Repair C{divergence} (in REPAIRING): cut the log back (C{truncate},
        the cut bytes quarantined) or move the store aside and start an
        empty one (C{rebootstrap}).
        """
        if mode is OnDivergence.TRUNCATE:
            assert divergence.truncate_to is not None
            commitlog, cut = self._commitlog, divergence.truncate_to
            path = await cut_back(self._store, commitlog, cut)
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

    async def _rebootstrap(self) -> None:
        """
        Move the store aside (never deleted) and start an empty one.
        """
        old = self._commitlog.store_dir
        when = time.strftime("%Y%m%dT%H%M%S", time.gmtime(self._reactor.seconds()))
        aside = f"{old}.diverged-{when}"
        # (Closing the log, the move and opening an empty one run in a
        # thread: the reactor renews the lease meanwhile.)
        await self._store.reopen(lambda: os.rename(old, aside))
        self._log.warn("moved the diverged store aside to {aside}", aside=aside)
        if self.epochs is not None:
            # The epoch file went aside with the store too.
            self.epochs.reload()
        self._host.rebuild()
        if self.master_kind is not None:
            # The memory of what the master is went aside with the store.
            self._learnt(self.master_kind)
