# -*- test-case-name: tests.test_coordinator -*-
"""
One node's part in automatic failover (docs/failover.md): a service that
holds a lease in the coordinator, says what the node is (its member key),
elects a master among the in-sync replicas, and gives the broker its role.

    every node          grants a lease, renews it every C{renew_interval},
                        touches its member key, watches the group
    no leader key       the in-sync member with the highest offset (then
                        the lowest node id) campaigns: one transaction
                        creates the leader key, bumps the epoch, and sets
                        the in-sync set to the winner alone
    leader is another   follow it (a master steps down first)
    leader is me        take puts while the lease is good: PUT_OK only
                        until (send time of the last successful renewal) +
                        TTL - C{fence_margin}, on a monotonic clock; the
                        in-sync set is published before it shrinks

Fencing does not depend on the coordinator answering: a master that cannot
renew stops acknowledging on its own clock, before the coordinator can
expire its lease and elect another (etcd expires leases on its leader's
clock, no sooner than TTL after the last renewal it received, which is
after this node sent it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from twisted.application.service import Service
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime, IStreamClientEndpoint
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from rmqha.broker import Broker
from rmqha.coord.candidacy import Candidacy
from rmqha.coord.candidacy import carried_members as carried_members
from rmqha.coord.candidacy import rank as rank
from rmqha.coord.claim import NodeIdClaim
from rmqha.coord.decisions import Decisions
from rmqha.coord.dcs import (
    IDCS,
    ClusterView,
    DCSError,
    IWatch,
    Leader,
    Lease,
    LeaseLost,
    Member,
)
from rmqha.coord.handover import Handover
from rmqha.coord.office import InSyncOffice
from rmqha.coord.failover import FailoverSettings
from rmqha.coord.report import MalformedKeys, NodeReport
from rmqha.coord.rolechange import RoleChanges
from rmqha.ha.fence import Fence
from rmqha.ha.insync import InSyncSet
from rmqha.ha.masterside import MasterSide
from rmqha.ha.roles import Superseded

@dataclass
class Election:
    """
    The last change of master this node saw or made, for /status.
    """

    epoch: int
    master: str | None
    #: Wall-clock seconds.
    at: float
    why: str
    history: list[dict[str, Any]] = field(default_factory=list)


class Coordinator(Service):
    """
    The failover service of one node: it keeps the lease, decides on each
    change of the group, campaigns, leads and steps down, and writes the
    L{Fence}; its parts (L{NodeIdClaim}, L{Candidacy}, L{Decisions},
    L{RoleChanges}, L{InSyncOffice}, L{Handover}, L{NodeReport}) are built
    with it.

    @ivar leader: this node's leadership, while it is the master.
    @ivar view: the last view of the group.
    @ivar election: the last election seen.
    """

    _log = Logger()

    def __init__(
        self,
        reactor: IReactorTime,
        dcs: IDCS,
        broker: Broker,
        settings: FailoverSettings,
        dial: Callable[[str, str], str | IStreamClientEndpoint],
        *,
        now: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        on_fatal: Callable[[str], object] = lambda why: None,
    ) -> None:
        """
        @param dial: the client endpoint for a master's advertised HA
            address and node id (TLS settings included: over TLS the
            master's certificate must name its node id).
        @param now: a monotonic clock (fencing is measured on it).
        @param on_fatal: called once with one line when this node must not
            run at all (its node id is live in another process): twistd
            stops with it.
        """
        self.reactor = reactor
        self.dcs = dcs
        self.broker = broker
        self.settings = settings
        self._now = now
        self._wall = wall
        #: What this node's master side may do (L{Fence}): written here
        #: through L{leader}, L{valid_until}, L{view} and the handover,
        #: read by the put path, which the broker's master side is built
        #: with (L{Broker.become_master}).
        self.fence = Fence(settings.node_id, now)
        self.lease: Lease | None = None
        self._leader: Leader | None = None
        self._view: ClusterView | None = None
        self.election: Election | None = None
        #: The highest epoch this node has seen.
        self.highest_epoch = 0
        #: Why this node is not electable / not acting, for /status.
        self.note: str | None = None
        #: The coordinator's last error, or None while it answers.
        self.dcs_error: str | None = None
        #: Elections this node won, leases lost, step-downs, and the
        #: changes of the group's epoch it saw after its first sight of a
        #: master (failovers and switchovers, for monitoring).
        self.counts = {
            "elected": 0,
            "stepped_down": 0,
            "lease_lost": 0,
            "campaigns_lost": 0,
            "epoch_changes": 0,
        }
        self._loop: LoopingCall | None = None
        self._watch: IWatch | None = None
        self._fence: IDelayedCall | None = None
        # This node's last leadership, once it stepped down (its key is
        # resigned; see _decide).
        self._deposed: Leader | None = None
        # Why this node may not lead until restarted (it failed to).
        self._unfit: str | None = None
        self._on_fatal = on_fatal
        #: Why this process does not take part at all (its node id is live
        #: in another one), or C{None}.
        self.fatal: str | None = None
        # The parts: the claim on the node id, when to campaign, one
        # decision at a time, the broker's role while this node does not
        # lead, the in-sync set while it does, a switchover's handover,
        # what it says about itself, the malformed-key warnings.
        self._claim = NodeIdClaim(settings.group, settings.node_id)
        self._candidacy = Candidacy(settings)
        self._decisions = Decisions(self._decide, self._may_decide)
        self._roles = RoleChanges(broker, dial, self._changed)
        self._office = InSyncOffice(
            reactor, dcs, settings.catchup_timeout, leader=lambda: self.leader, step_down=self._step_down
        )
        self._handover = Handover(dcs, self.fence, broker, settings.node_id)
        self._report = NodeReport(self, now)
        self._malformed = MalformedKeys()

    # -- what the fence holds -------------------------------------------------

    @property
    def leader(self) -> Leader | None:
        """
        This node's leadership, while it is the master.
        """
        return self._leader

    @leader.setter
    def leader(self, leader: Leader | None) -> None:
        self._leader = leader
        self.fence.elected = leader is not None

    @property
    def valid_until(self) -> float:
        """
        Until when (monotonic) the lease is known good.
        """
        return self.fence.valid_until

    @valid_until.setter
    def valid_until(self, when: float) -> None:
        self.fence.valid_until = when

    @property
    def view(self) -> ClusterView | None:
        """
        The last view of the group.
        """
        return self._view

    @view.setter
    def view(self, view: ClusterView | None) -> None:
        self._view = view
        self.fence.members = frozenset(view.members) if view is not None else frozenset()

    @property
    def in_sync(self) -> InSyncSet | None:
        """
        The master's in-sync set, while this node leads (L{InSyncOffice}).
        """
        return self._office.in_sync

    @property
    def following(self) -> str | None:
        """
        The HA address of the master this node follows (L{RoleChanges}).
        """
        return self._roles.following

    @property
    def unfit(self) -> str | None:
        """
        Why this node may not lead until restarted (it failed to), if so.
        """
        return self._unfit

    # -- start and stop -------------------------------------------------------

    def startService(self) -> None:
        Service.startService(self)
        self._watch = self.dcs.watch(self._changed, self._watch_failed)
        loop = self._loop = LoopingCall(self._tick)
        loop.clock = self.reactor
        loop.start(self.settings.renew_interval, now=True).addErrback(self._loop_failed)

    def stopService(self) -> Deferred[None]:
        Service.stopService(self)
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        if self._watch is not None:
            self._watch.stop()
        self._cancel_fence()
        lease, self.lease = self.lease, None
        if self.in_sync is not None:
            self.in_sync.stop()
        # Leave the group at once: a stopping master's successor need not
        # wait for its lease to expire.
        self.leader = None
        self.valid_until = float("-inf")
        return Deferred.fromCoroutine(self._leave(lease))

    async def _leave(self, lease: Lease | None) -> None:
        if lease is not None:
            try:
                await self.dcs.revoke(lease)
            except DCSError as e:
                self._log.warn("could not revoke the lease: {why}", why=str(e))
        await self.dcs.close()

    def _loop_failed(self, failure: Failure) -> None:
        self._log.failure("the failover loop stopped", failure)

    # -- the lease ------------------------------------------------------------

    def _tick(self) -> Deferred[None]:
        return ensureDeferred(self._renew())

    async def _renew(self) -> None:
        sent = self._now()
        try:
            if self.lease is None:
                self.lease = await self.dcs.grant(self.settings.lease_ttl)
                self._log.info(
                    "lease {lease:x} granted ({ttl} s)", lease=self.lease.id, ttl=self.lease.ttl
                )
            else:
                await self.dcs.keepalive(self.lease)
        except LeaseLost as e:
            self._lease_lost(str(e))
            return
        except DCSError as e:
            self._dcs_failed(e)
            return
        if not self.running:
            return
        self._renewed(sent)
        if not self._claim.claimed and not await self._claim_node_id():
            return
        try:
            assert self.lease is not None
            await self.dcs.touch_member(self.member(), self.lease)
        except LeaseLost as e:
            self._lease_lost(str(e))
            return
        except DCSError as e:
            self._dcs_failed(e)
            return
        if self.in_sync is not None and self.is_master():
            self.in_sync.check(self.broker.commitlog.max_offset)
        self._changed()

    async def _claim_node_id(self) -> bool:
        """
        Before this process writes its member key the first time: whether
        the node id is free (L{NodeIdClaim}); refuse to run beside another
        live process that holds it (L{fatal}).
        """
        try:
            view = await self.dcs.load()
        except DCSError as e:
            self._dcs_failed(e)
            return False
        if not self.running or self.lease is None:
            return False
        verdict = self._claim.consider(view, self.lease)
        if verdict.refused is not None:
            self._refuse_to_run(verdict.refused)
        elif verdict.waiting is not None:
            self.note = verdict.waiting
        return self._claim.claimed

    def _refuse_to_run(self, why: str) -> None:
        self.fatal = self.note = why
        self._log.critical("{why}", why=why)
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        if self._watch is not None:
            self._watch.stop()
            self._watch = None
        self._cancel_fence()
        lease, self.lease = self.lease, None
        if lease is not None:
            self.dcs.revoke(lease).addErrback(lambda _: None)
        self._on_fatal(why)

    def _renewed(self, sent: float) -> None:
        assert self.lease is not None
        if self.dcs_error is not None:
            self._log.info("the coordinator answers again")
            self.dcs_error = None
        self.valid_until = sent + self.lease.ttl - self.settings.fence_margin
        self._cancel_fence()
        self._fence = self.reactor.callLater(
            max(0.0, self.valid_until - self._now()), self._fence_expired
        )

    def _cancel_fence(self) -> None:
        if self._fence is not None and self._fence.active():
            self._fence.cancel()
        self._fence = None

    def _fence_expired(self) -> None:
        self._fence = None
        if self.leader is not None:
            self._step_down(
                f"lease not renewed for {self.settings.lease_ttl - self.settings.fence_margin:.1f} s"
                f" ({self.dcs_error or 'no answer'})"
            )

    def _lease_lost(self, why: str) -> None:
        self.counts["lease_lost"] += 1
        self._log.warn("lease lost: {why}", why=why)
        self.lease = None
        self.valid_until = float("-inf")
        if self.leader is not None:
            self._step_down(f"lease lost: {why}")

    def _dcs_failed(self, error: DCSError) -> None:
        if self.dcs_error != str(error):
            self._log.warn("coordinator: {error}", error=str(error))
        self.dcs_error = str(error)

    def _watch_failed(self, error: DCSError) -> None:
        self._dcs_failed(error)

    # -- what this node says about itself -------------------------------------

    def is_master(self) -> bool:
        """
        Whether this node leads and its broker is the master.
        """
        return self.leader is not None and isinstance(self.broker.role_service, MasterSide)

    def member(self) -> Member:
        """
        This node's member key (L{NodeReport.member}).
        """
        return self._report.member()

    def healthy(self) -> bool:
        """
        A node whose replication halted (a divergence, a wrong segment
        size) or that could not take office must not lead.
        """
        if self._unfit is not None:
            return False
        return not self.broker.halted

    def refusing(self) -> str | None:
        """
        Why this master may not take a put now, or C{None} (L{Fence}).
        """
        return self.fence.refusing()

    def accepts_node(self, node: str, host: str) -> bool:
        """
        Whether a replica that is node C{node} (connected from C{host})
        counts for the in-sync set (L{Fence.accepts_node}).
        """
        return self.fence.accepts_node(node, host)

    def may_acknowledge(self) -> bool:
        return self.fence.may_acknowledge()

    # -- deciding ----------------------------------------------------------------

    def _changed(self) -> None:
        """
        Something in the group changed (or the loop ticked): load and
        decide, one decision at a time (L{Decisions}).
        """
        self._decisions.request()

    def _may_decide(self) -> bool:
        return bool(self.running) and self._claim.claimed and self.fatal is None

    async def _decide(self) -> None:
        try:
            view = await self.dcs.load()
        except DCSError as e:
            self._dcs_failed(e)
            return
        if not self.running:
            return
        self.view = view
        self._malformed.report(view)
        self.highest_epoch = max(self.highest_epoch, view.epoch)
        me = self.settings.node_id
        leader = view.leader
        if self.leader is not None:
            if leader is None or leader.revision != self.leader.revision:
                self._step_down(
                    "the leader key is gone" if leader is None else f"{leader.node_id} leads now"
                )
            else:
                await self._lead(view)
                return
        if self._roles.changing is not None:
            return  # (a role change is under way; the next tick decides)
        if leader is not None:
            self._candidacy.master_seen()
            deposed = self._deposed
            if deposed is not None and leader.revision == deposed.revision:
                # This node's own old leadership (it stepped down while the
                # coordinator could not hear it): end it, so that an
                # election can happen.
                await _quietly(self.dcs.resign(deposed))
                self._decisions.again()
                return
            if leader.node_id == me:
                if self.lease is not None and leader.lease == self.lease.id:
                    # This incarnation's own campaign won but its answer
                    # was lost (a timeout under load): the key sits on
                    # the lease this node renews, so it would never
                    # expire.  Take office, or give the key up.
                    await self._own_lost_campaign(leader)
                    return
                self.note = (
                    "the leader key names this node but another incarnation holds it: "
                    "waiting for its lease to expire"
                )
                return
            self._note_election(leader.epoch, leader.node_id, "elected")
            self.note = None
            self._roles.follow(leader)
            return
        await self._stand(view)

    def _note_election(self, epoch: int, master: str | None, why: str) -> None:
        if self.election is not None and self.election.epoch == epoch and self.election.master == master:
            return
        if self.election is not None and self.election.epoch != epoch:
            self.counts["epoch_changes"] += 1
        history = self.election.history[-9:] if self.election is not None else []
        entry = {"epoch": epoch, "master": master, "at": self._wall(), "why": why}
        self.election = Election(epoch, master, entry["at"], why, [*history, entry])  # type: ignore[arg-type]

    async def _stand(self, view: ClusterView) -> None:
        """
        No leader: campaign if this node is the best candidate (or the
        best has not acted for long: L{Candidacy}).
        """
        now = self._now()
        self._candidacy.no_master(now)
        if self.following is not None or self.broker.role_service is not None:
            # Keep what was replicated; stop following a master that lost
            # its key (it is fenced, or dead).
            self._roles.stand_by()
            return
        lease = self.lease
        plan = self._candidacy.assess(
            view,
            now,
            lease_good=lease is not None and now < self.valid_until,
            unfit=None if self.healthy() else (self._unfit or self.broker.problem),
        )
        self.note = plan.note
        if plan.mine is None or lease is None:
            return
        try:
            won = await self.dcs.campaign(plan.mine, lease, view, plan.carried)
        except DCSError as e:
            self._dcs_failed(e)
            return
        if won is None:
            self.counts["campaigns_lost"] += 1
            self._decisions.again()
            return
        if not self.running:
            return
        await self._take_office(won, plan.why, plan.carried)

    async def _own_lost_campaign(self, leader: Leader) -> None:
        """
        The leader key is on this node's lease, though this node does not
        know it leads: a campaign succeeded whose answer never came.
        """
        if (
            self.settings.electable
            and self.healthy()
            and self._now() < self.valid_until
        ):
            view = self.view
            carried: tuple[str, ...] = ()
            if view is not None and view.in_sync is not None and view.in_sync.epoch == leader.epoch:
                carried = view.in_sync.members
            await self._take_office(leader, "a campaign whose answer was lost", carried)
            return
        self._log.warn(
            "the leader key (epoch {epoch}) is on this node's lease but this node may not lead: "
            "resigning",
            epoch=leader.epoch,
        )
        await _quietly(self.dcs.resign(leader))
        self._decisions.again()

    async def _take_office(self, won: Leader, why: str, carried: tuple[str, ...]) -> None:
        """
        This node won the election at C{won.epoch}, with an in-sync set of
        itself and C{carried} (what the campaign wrote): become master.
        """
        self.leader = won
        self.counts["elected"] += 1
        self.highest_epoch = max(self.highest_epoch, won.epoch)
        self._candidacy.master_seen()
        self._note_election(won.epoch, won.node_id, f"this node: {why}")
        self._log.info(
            "elected master of group {group} for epoch {epoch} ({why})",
            group=self.settings.group,
            epoch=won.epoch,
            why=why,
        )
        self._roles.leading()
        broker = self.broker
        try:
            await broker.become_master(self.settings.role, epoch=won.epoch, fence=self.fence)
        except Superseded:
            return  # (a later role change replaced it: stepped down meanwhile)
        except Exception as e:
            # (The HA port is taken, the epoch file cannot be written…:
            # an operator's problem.  This node stops standing for
            # election until restarted, so the group does not elect it
            # again and again.)
            self._unfit = f"could not become master: {e}"
            self._log.error("{why}; not standing for election again", why=self._unfit)
            self._step_down(self._unfit)
            return
        side = broker.role_service
        if self.leader is not won or not isinstance(side, MasterSide):
            return  # (stepped down meanwhile)
        self._office.open(won, carried, side, broker.settings.slave_fallbehind_max)

    async def _lead(self, view: ClusterView) -> None:
        """
        This node leads: step down if its store was found damaged (it
        takes no writes until restarted: another member should lead);
        carry out a switchover asked of it.
        """
        self._note_election(view.epoch, self.settings.node_id, "this node")
        damage = self.broker.store.commitlog.damage if self.broker.store.commitlog else None
        if damage is not None:
            self._unfit = f"the store is damaged: {damage}"
            self._log.error("{why}; stepping down, not standing again", why=self._unfit)
            self._step_down(self._unfit)
            return
        step = await self._handover.advance(
            view.switchover if self.leader is not None else None, self.in_sync
        )
        if step.note is not None:
            self.note = step.note
        if step.hand_over is not None:
            self._step_down(step.hand_over)

    def _step_down(self, why: str) -> None:
        if self.leader is None:
            return
        self.counts["stepped_down"] += 1
        self._log.warn("stepping down as master: {why}", why=why)
        self._deposed = self.leader
        self.dcs.resign(self.leader).addErrback(lambda _: None)
        self.leader = None
        self._handover.end()
        self._office.close()
        self._roles.stand_by()

    # -- for /status ---------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """
        The coordinator's part of /status (L{NodeReport.status}).
        """
        return self._report.status()


async def _quietly(d: Deferred[Any]) -> None:
    try:
        await d
    except DCSError:
        pass

