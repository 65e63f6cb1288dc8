# -*- test-case-name: tests.test_coordinator -*-
"""
Standing for election while a group has no master: who may become master,
in what order (L{rank}), which in-sync members a campaign keeps
(L{carried_members}), and when this node campaigns (L{Candidacy}).

Sans-IO: the coordinator (L{rmqha.coord.node.Coordinator}) hands over the
group's view, its clock and what it knows of its own lease and health, and
runs the campaign L{Candidacy.assess} plans.
"""

from __future__ import annotations

from dataclasses import dataclass

from twisted.logger import Logger

from rmqha.coord.failover import FailoverSettings
from rmqha.coord.dcs import ClusterView, Leader, Member


def rank(view: ClusterView, allow_unclean: bool) -> tuple[list[Member], str]:
    """
    Who may become master now, best first, and why the list is what it is.

    Eligible: the live, electable members of the in-sync set of the
    current epoch (before any election, every live member); with
    C{allow_unclean}, every live member when no in-sync one lives.  A
    pending switchover's target goes first; then by offset (highest
    first), then node id.  Nobody, even unclean, while the epoch or the
    leader key is malformed; a malformed insync key is no in-sync set.
    """
    # Malformed keys (docs/failover.md, "Malformed keys"): a bad epoch
    # could make an epoch repeat; a bad leader key may be a leader this
    # node cannot read, and the election txn needs it absent anyway.
    for name, why in (
        ("epoch", "nobody campaigns until it holds the epoch again (epochs must never repeat)"),
        ("leader", "nobody campaigns until it is deleted or its lease expires"),
    ):
        bad = view.malformed_key(name)
        if bad is not None:
            return [], f"key {bad.key} is malformed ({bad.reason}): {why}"
    live = {m.node_id: m for m in view.members.values() if m.electable}
    bad_in_sync = view.malformed_key("insync")
    if bad_in_sync is not None:
        eligible = []
        why = f"key {bad_in_sync.key} is malformed ({bad_in_sync.reason}): no in-sync set known"
    elif view.in_sync is None and view.epoch == 0:
        eligible = list(live.values())
        why = "no election yet: every live node may stand"
    elif view.in_sync is not None and view.in_sync.epoch == view.epoch:
        eligible = [live[n] for n in view.in_sync.members if n in live]
        why = f"in-sync set of epoch {view.epoch}: {','.join(view.in_sync.members)}"
    else:
        eligible = []
        why = f"no in-sync set for epoch {view.epoch}"
    if not eligible and allow_unclean and live:
        eligible = list(live.values())
        why += "; none lives: unclean election allowed"
    target = view.switchover.target if view.switchover is not None else None
    eligible.sort(key=lambda m: (m.node_id != target, -m.offset, m.node_id))
    return eligible, why


def carried_members(view: ClusterView, me: str) -> tuple[str, ...]:
    """
    The members of the current in-sync set that a campaign by C{me} keeps
    in the new epoch's set: every live one, when C{me} is a member too (a
    clean election).  They hold every put answered PUT_OK so far, and the
    new master has answered none yet, so the set stays true; it keeps them
    eligible should the winner fail to take office or die at once (with
    the winner alone in the set, nobody else could stand: the group would
    wedge).  The new master waits for their acks, and drops each one that
    does not reconnect within the catch-up timeout (published first).
    """
    in_sync = view.in_sync
    if in_sync is None or in_sync.epoch != view.epoch or me not in in_sync.members:
        return ()
    live = set(view.members)
    return tuple(sorted(n for n in in_sync.members if n != me and n in live))


@dataclass(frozen=True)
class Plan:
    """
    What this node does about a group without a master.

    @ivar note: why it does not campaign (for /status), if it does not.
    @ivar mine: the leader key to campaign with, if it campaigns.
    @ivar why: why it may (the ranking, and how long it waited).
    @ivar carried: the in-sync members the campaign keeps (L{carried_members}).
    """

    note: str | None = None
    mine: Leader | None = None
    why: str = ""
    carried: tuple[str, ...] = ()


class Candidacy:
    """
    When this node campaigns: the best candidate at once, each next one
    after another TTL and a half of the group being without a master, in
    case the ones before it are alive but cannot act.
    """

    _log = Logger()

    def __init__(self, settings: FailoverSettings) -> None:
        self._settings = settings
        # Since when (monotonic) the group has had no master, if so.
        self._leaderless_since: float | None = None

    def master_seen(self) -> None:
        """
        The group has a master (or this node became it).
        """
        self._leaderless_since = None

    def no_master(self, now: float) -> None:
        """
        The group has no master at C{now}: the wait starts if it had one.
        """
        if self._leaderless_since is None:
            self._leaderless_since = now
            self._log.info("no master in group {group}", group=self._settings.group)

    def assess(self, view: ClusterView, now: float, *, lease_good: bool, unfit: str | None) -> Plan:
        """
        Whether this node campaigns now, given the group's C{view}, whether
        its lease is good, and why it may not lead (C{unfit}) if so.
        """
        settings = self._settings
        if not lease_good:
            return Plan("no valid lease: cannot stand for election")
        if not settings.electable:
            return Plan("not electable (--no-failover)")
        if unfit is not None:
            return Plan(f"not electable: {unfit}")
        candidates, why = rank(view, settings.allow_unclean_election)
        me = settings.node_id
        names = [m.node_id for m in candidates]
        if me not in names:
            return Plan(f"not eligible: {why}")
        position = names.index(me)
        since = now if self._leaderless_since is None else self._leaderless_since
        waited = now - since
        if position > 0 and waited < position * settings.lease_ttl * 1.5:
            return Plan(f"candidate {position + 1} of {len(names)}: {names[0]} goes first")
        return Plan(
            mine=Leader(me, view.epoch + 1, settings.advertise, settings.advertise_http),
            why=why if position == 0 else f"{why}; after {waited:.1f} s",
            carried=carried_members(view, me),
        )
