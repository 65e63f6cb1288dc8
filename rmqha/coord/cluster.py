# -*- test-case-name: tests.test_coordinator -*-
"""
What C{rmqha cluster status} and C{rmqha cluster switchover} do, on any
L{IDCS} (docs/failover.md, "Operating it").
"""

from __future__ import annotations

import time
from typing import Any, Callable

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater

from rmqha.coord.dcs import IDCS, ClusterView, DCSError, Switchover
from rmqha.coord.failover import DEFAULT_RENEW_INTERVAL


class ClusterError(Exception):
    """
    A cluster command could not do what was asked (one line).
    """


#: How long C{cluster status} watches the members' reports: twice the
#: default renew interval, at which every live node rewrites its member
#: key (docs/failover.md, "Operating it").
REPORT_WINDOW = 2 * DEFAULT_RENEW_INTERVAL


def describe(
    view: ClusterView, silent: frozenset[str] = frozenset(), window: float | None = None
) -> dict[str, Any]:
    """
    A group's state as JSON-able data: the master, the epoch, the in-sync
    set, and every member with its lag behind the master (from the
    offsets members publish about twice a second).

    @param silent: the members whose key was not rewritten during the
        C{window} seconds before C{view} was read (see L{status}).
    @param window: how long the reports were watched, or C{None}: not
        watched (every member's C{reporting} is then C{None}).
    """
    leader = view.leader
    in_sync = view.in_sync
    members_in_sync = set(in_sync.members) if in_sync is not None and in_sync.epoch == view.epoch else set()
    master_offset = None
    if leader is not None and leader.node_id in view.members:
        master_offset = view.members[leader.node_id].offset
    members = []
    for node_id, member in sorted(view.members.items()):
        members.append(
            {
                "node_id": node_id,
                "role": member.role,
                "epoch": member.epoch,
                "offset": member.offset,
                "lag_bytes": None if master_offset is None else max(0, master_offset - member.offset),
                "in_sync": node_id in members_in_sync,
                "electable": member.electable,
                "ha": member.ha,
                "http": member.http,
                "state": member.state,
                "reporting": None if window is None else node_id not in silent,
            }
        )
    return {
        # (null: the epoch key is malformed, the counter unknown)
        "epoch": None if view.malformed_key("epoch") is not None else view.epoch,
        "master": None
        if leader is None
        else {
            "node_id": leader.node_id,
            "epoch": leader.epoch,
            "ha": leader.ha,
            "http": leader.http,
            "reporting": None if window is None else leader.node_id not in silent,
        },
        "report_window": window,
        "in_sync": sorted(members_in_sync),
        "switchover": None
        if view.switchover is None
        else {"target": view.switchover.target, "leader": view.switchover.leader},
        "members": members,
        # Keys skipped because their values cannot be read (docs/failover.md,
        # "Malformed keys"): the first MAX_MALFORMED of malformed_total.
        "malformed": [{"key": m.key, "reason": m.reason} for m in view.malformed],
        "malformed_total": view.malformed_total,
    }


def render(group: str, state: dict[str, Any]) -> str:
    """
    L{describe}'s data as text for a terminal.
    """
    master = state["master"]
    epoch = "unknown" if state["epoch"] is None else state["epoch"]
    window = state.get("report_window")
    silence = f"NOT REPORTING for {window:g} s" if window is not None else ""
    lines = [
        f"group {group}: epoch {epoch}, "
        + (
            f"master {master['node_id']} ({master['ha']}"
            + (
                f"; {silence}: dead or cut off from the coordinator; its keys go when "
                "its lease expires"
                if master.get("reporting") is False
                else ""
            )
            + ")"
            if master
            else "NO MASTER"
        )
        + (f", switchover to {state['switchover']['target']} pending" if state["switchover"] else "")
    ]
    if not state["members"]:
        groups = state.get("groups")
        lines.append(
            f"no node of group {group} is registered in etcd"
            + (
                ""
                if groups is None
                else (
                    f" (groups there: {', '.join(groups)})"
                    if groups
                    else " (it holds no group at all)"
                )
            )
        )
    rows = [("NODE", "ROLE", "EPOCH", "OFFSET", "LAG", "IN-SYNC", "STATE")]
    for m in state["members"]:
        rows.append(
            (
                m["node_id"],
                m["role"],
                str(m["epoch"]),
                str(m["offset"]),
                "-" if m["lag_bytes"] is None else str(m["lag_bytes"]),
                "yes" if m["in_sync"] else "no",
                "; ".join(
                    part for part in (
                        silence if m.get("reporting") is False else "",
                        m["state"] + ("" if m["electable"] else " (not electable)"),
                    ) if part.strip()
                ),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows if len(rows) > 1 else []:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1])
    missing = [n for n in state["in_sync"] if n not in {m["node_id"] for m in state["members"]}]
    if missing:
        lines.append(f"in-sync but not alive: {', '.join(missing)}")
    for bad in state["malformed"]:
        lines.append(f"malformed key {bad['key']} (skipped): {bad['reason']}")
    more = state["malformed_total"] - len(state["malformed"])
    if more > 0:
        lines.append(f"... and {more} more malformed keys")
    return "\n".join(lines)


async def status(
    dcs: IDCS, clock: IReactorTime | None = None, window: float = REPORT_WINDOW
) -> dict[str, Any]:
    """
    The group's state (L{describe}), read twice C{window} seconds apart
    on C{clock}: a live node rewrites its member key every renew interval
    (0.5 s by default), so a member whose key did not change meanwhile is
    marked as not reporting -- dead, or cut off from the coordinator --
    though its keys stay until its lease expires.  Without C{clock}, one
    read, nothing marked.  A group with no member also names the groups
    there are (C{groups}: C{None} if they cannot be listed).
    """
    view = await dcs.load()
    silent: frozenset[str] = frozenset()
    watched = None
    if clock is not None and window > 0 and view.members:
        await _sleep(clock, window)
        first, view = view, await dcs.load()
        silent = frozenset(
            node_id
            for node_id, member in view.members.items()
            if node_id in first.members and first.members[node_id].revision == member.revision
        )
        watched = window
    state = describe(view, silent, watched)
    if not view.members:
        try:
            state["groups"] = await dcs.groups()
        except DCSError:
            state["groups"] = None
    return state


async def switchover(
    clock: IReactorTime,
    dcs: IDCS,
    target: str,
    timeout: float,
    *,
    now: Callable[[], float] = time.monotonic,
    poll: float = 0.1,
) -> dict[str, Any]:
    """
    Ask the master to hand over to C{target} and wait until C{target} is
    elected.

    @raise ClusterError: there is no master (or its key or the
        switchover key is malformed), C{target} is not a live
        member of the in-sync set, a switchover is already pending, or
        C{target} was not elected within C{timeout} seconds (the request is
        then withdrawn).
    """
    started = now()
    view = await dcs.load()
    bad = view.malformed_key("leader")
    if bad is not None:
        raise ClusterError(
            f"key {bad.key} is malformed ({bad.reason}): the master is unknown "
            "(docs/failover.md, \"Malformed keys\")"
        )
    bad = view.malformed_key("switchover")
    if bad is not None:
        raise ClusterError(
            f"key {bad.key} is malformed ({bad.reason}): delete it first (etcdctl del {bad.key})"
        )
    leader = view.leader
    if leader is None:
        raise ClusterError("the group has no master: nothing to switch over from")
    if leader.node_id == target:
        raise ClusterError(f"{target} is the master already")
    if target not in view.members:
        raise ClusterError(
            f"{target} is not a live member (members: {', '.join(sorted(view.members)) or 'none'})"
        )
    if view.in_sync is None or target not in view.in_sync.members:
        members = ", ".join(view.in_sync.members) if view.in_sync else "none"
        raise ClusterError(
            f"{target} is not in the in-sync set ({members}): it may lack acknowledged puts"
        )
    if not view.members[target].electable:
        raise ClusterError(f"{target} is not electable (--no-failover, or its replication halted)")
    request = Switchover(target, leader.node_id, time.time())
    if not await dcs.request_switchover(request):
        raise ClusterError("a switchover is already pending, or the master just changed")
    while True:
        view = await dcs.load()
        if view.leader is not None and view.leader.node_id == target:
            return {
                "master": target,
                "epoch": view.leader.epoch,
                "seconds": round(now() - started, 3),
            }
        if now() - started > timeout:
            pending = view.switchover
            if pending is not None and pending.target == target:
                await dcs.clear_switchover(pending)
            raise ClusterError(
                f"{target} was not elected within {timeout:g} s; the request is withdrawn "
                f"(master now: {view.leader.node_id if view.leader else 'none'})"
            )
        await _sleep(clock, poll)


def _sleep(clock: IReactorTime, seconds: float) -> Deferred[None]:
    return deferLater(clock, seconds, lambda: None)
