# -*- test-case-name: tests.test_divergence -*-
"""
Telling whether a slave's log has diverged from its master's, with the
rmqha control extension (docs/protocol.md).

L{probe} opens a control session on the master's HA port with a hello a
genuine RocketMQ master cannot tell from a slave that has not reported
yet: it waits, silently, and L{probe} gives C{None} (classic only) after
a short wait.  The master's INFO also says whether it offers checked
framing, and its segment size.  What the master turned out to be is kept
in the store (L{read_master_kind}, L{write_master_kind}), so a slave that
once saw the extension never takes a silent master for a RocketMQ one.
L{find_divergence} then compares: the slave is I{behind} when its log ends
before the master's oldest segment, I{different} when the bytes they both
hold differ (the tail window is compared by digests, then narrowed to the
first differing byte), and I{ahead} when it holds more than the master.
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import dataclass
from typing import Any

from rmqha._files import write_atomically
from rmqha.store.commitlog import CommitLog
from rmqha.ha._wire import CONTROL_MAX_DIGEST_RANGE
from rmqha.ha.config import MasterKind
from rmqha.ha.control import ControlClient, MasterInfo, log_digest

__all__ = [
    "DivergenceKind",
    "Divergence",
    "read_master_kind",
    "write_master_kind",
    "find_divergence",
]


#: How much of the common tail is compared on every check.
TAIL_WINDOW = 64 * 1024 * 1024
#: Where a slave's store remembers what its master is.
MASTER_KIND_PATH = os.path.join("rmqha", "master-kind.json")
#: Master kinds a store remembers: speaks the rmqha extension, or a
#: RocketMQ master.
MASTER_KINDS = (MasterKind.RMQHA, MasterKind.ROCKETMQ)


class DivergenceKind(enum.StrEnum):
    """
    How a slave's log differs from its master's.
    """

    #: It ends before the master's oldest segment: it can never catch up.
    BEHIND = "behind"
    #: It holds bytes past the master's max offset: the master lost data.
    AHEAD = "ahead"
    #: The bytes both hold differ.
    DIFFERENT = "different"


@dataclass(frozen=True)
class Divergence:
    """
    What a check found.

    @ivar kind: the L{DivergenceKind}.
    @ivar slave_offset: where the slave's whole records end.
    @ivar master_offset: the master's max offset (its min offset for
        C{"behind"}).
    @ivar first_difference: for C{"different"}, the first byte that differs.
    @ivar truncate_to: where the slave may be cut back to to resume (the
        master's max offset when ahead, the start of the record holding the
        first difference when different); C{None} when behind.
    """

    kind: DivergenceKind
    slave_offset: int
    master_offset: int
    first_difference: int | None = None
    truncate_to: int | None = None

    def describe(self) -> str:
        if self.kind is DivergenceKind.BEHIND:
            return (
                f"the slave's log ends at {self.slave_offset}, before the master's oldest "
                f"segment at {self.master_offset}: it can never catch up"
            )
        if self.kind is DivergenceKind.AHEAD:
            return (
                f"the slave holds bytes up to {self.slave_offset}, past the master's max "
                f"offset {self.master_offset}: the master lost data"
            )
        return (
            f"the slave's bytes differ from the master's at offset {self.first_difference} "
            f"(the record at {self.truncate_to})"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "slave_offset": self.slave_offset,
            "master_offset": self.master_offset,
            "first_difference": self.first_difference,
            "truncate_to": self.truncate_to,
        }


def read_master_kind(store_dir: str, master: str) -> MasterKind | None:
    """
    What the store remembers its master at C{master} to be (C{"rmqha"} or
    C{"rocketmq"}), or C{None}: nothing remembered, another master, or an
    unreadable file (it is then rewritten at the next answer).
    """
    try:
        with open(os.path.join(store_dir, MASTER_KIND_PATH), encoding="utf-8") as f:
            saved = json.load(f)
        kind = saved["kind"]
        if saved["master"] == master and kind in MASTER_KINDS:
            return MasterKind(kind)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def write_master_kind(store_dir: str, master: str, kind: MasterKind, seen: float) -> None:
    """
    Remember that the master at C{master} is C{kind} (tmp file, fsync,
    rename: a crash leaves the old file or the new one).

    @raise OSError: it could not be written (the tmp file is removed).
    """
    write_atomically(
        os.path.join(store_dir, MASTER_KIND_PATH),
        lambda f: json.dump({"kind": kind, "master": master, "seen": seen}, f),
    )


async def _same(client: ControlClient, commitlog: CommitLog, start: int, end: int) -> bool:
    position = start
    while position < end:
        step = min(end, position + CONTROL_MAX_DIGEST_RANGE)
        theirs = await client.digest(position, step)
        ours = log_digest(commitlog, position, step)
        if ours is None or theirs != ours:
            return False
        position = step
    return True


async def find_divergence(
    commitlog: CommitLog,
    client: ControlClient,
    info: MasterInfo,
    window: int = TAIL_WINDOW,
    slave_end: int | None = None,
) -> Divergence | None:
    """
    Compare this slave's log with the master's; C{None} when the tail
    window agrees and the slave is neither ahead nor behind.

    @param slave_end: where the slave's records ended before C{info} was
        obtained (default: now).
    """
    if not commitlog.has_data():
        return None
    slave_min = commitlog.min_offset
    if slave_end is None:
        slave_end = commitlog.record_end
    if slave_end < info.min_offset:
        return Divergence(DivergenceKind.BEHIND, slave_end, info.min_offset)
    low = max(slave_min, info.min_offset)
    high = min(slave_end, info.max_offset)
    if high > low:
        start = max(low, high - window)
        if not await _same(client, commitlog, start, high):
            # [lo, hi) differs; step back a window at a time while the one
            # before differs too, so the first difference is in [lo, hi).
            lo, hi = start, high
            while lo > low and not await _same(client, commitlog, max(low, lo - window), lo):
                lo, hi = max(low, lo - window), lo
            # Bisect to one byte: [.., lo) agrees, the difference is in [lo, hi).
            while hi - lo > 1:
                middle = (lo + hi) // 2
                if await _same(client, commitlog, lo, middle):
                    lo = middle
                else:
                    hi = middle
            return Divergence(
                DivergenceKind.DIFFERENT,
                slave_end,
                info.max_offset,
                lo,
                commitlog.record_start_at_or_before(lo),
            )
    if slave_end > info.max_offset:
        return Divergence(DivergenceKind.AHEAD, slave_end, info.max_offset, None, info.max_offset)
    return None
