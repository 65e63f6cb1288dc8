"""
C{rmqha pipeline verify} against damaged store pairs: a generator of
master/slave pairs with every kind of damage we could think of, on either
side, and an oracle written from first principles (the stores' bytes,
compared in plain Python, and C{rmqha store check}'s own code for where a
store's records are damaged) that the verdict must agree with.

Most cases run through L{verify_local} (the same driver-side checks and
verdict as the Spark job, the blocks compared without Spark); a handful
go through the real Spark job (marker C{spark}, the shared session).
"""

from __future__ import annotations

import errno
import os
import random
import shutil
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
from twisted.trial.unittest import SynchronousTestCase

from rmqha.pipeline.stores import LocalStore, PlanError, Segment, SegmentReader
from rmqha.store._record import Record, parse_record
from rmqha.store._recovery import verify_store
from rmqha.store.commitlog import CommitLog

from tests._helpers import make_message
from tests._spark import spark, why_no_spark

#: Marks, in a side's files, what is not a segment file's bytes.
DIRECTORY = "directory"
DANGLING = "dangling symlink"
#: C{(LINK, data)}: a symlink to a file holding C{data}, outside the store.
LINK = "symlink"


@dataclass
class Side:
    """
    One store of a pair, as files to write: name -> bytes, or
    L{DIRECTORY} / L{DANGLING}; C{unreadable}: names no one may read.
    """

    files: dict[str, Any]
    size: int
    unreadable: set[str] = field(default_factory=set)

    def copy(self) -> "Side":
        return Side(dict(self.files), self.size, set(self.unreadable))

    def segments(self) -> dict[int, bytes]:
        """
        The segment files' bytes (a symlink's target's), by base.
        """
        return {
            int(n): v[1] if isinstance(v, tuple) else v for n, v in self.files.items()
            if len(n) == 20 and n.isdigit() and isinstance(v, (bytes, tuple))
        }

    def write(self, root: str) -> str:
        directory = os.path.join(root, "commitlog")
        os.makedirs(directory)
        for name, value in self.files.items():
            path = os.path.join(directory, name)
            if value == DIRECTORY:
                os.mkdir(path)
            elif value == DANGLING:
                os.symlink(os.path.join(directory, "nowhere"), path)
            elif isinstance(value, tuple):
                target = os.path.join(root, f"elsewhere-{name}")
                with open(target, "wb") as f:
                    f.write(value[1])
                os.symlink(target, path)
            else:
                with open(path, "wb") as f:
                    f.write(value)
        for name in self.unreadable:
            if isinstance(self.files.get(name), (bytes, tuple)):
                os.chmod(os.path.join(directory, name), 0)
        return root


@dataclass
class Base:
    """
    A master written by the commit log itself: its files and its records.
    """

    size: int
    files: dict[str, bytes]
    records: list[tuple[int, int]]


def name(base: int) -> str:
    return f"{base:020d}"


def make_base(root: str, size: int, count: int, seed: int) -> Base:
    rng = random.Random(seed)  # (the same seed: the same messages)
    with CommitLog.open(root, segment_size=size) as log:
        for i in range(count):
            log.put(make_message(
                rng.randbytes(rng.randrange(0, size // 12)),
                topic=rng.choice(["orders", "audit"]),
                queue_id=rng.randrange(3),
                properties={"KEYS": f"k{i}"} if rng.random() < 0.5 else {},
            ))
        records = [
            (r.offset, r.size) for r in log.records(check_crc=False) if isinstance(r, Record)
        ]
    directory = os.path.join(root, "commitlog")
    files = {}
    for n in sorted(os.listdir(directory)):
        with open(os.path.join(directory, n), "rb") as f:
            files[n] = f.read()
    return Base(size, files, records)


# -- damage ------------------------------------------------------------------
#
# Each takes (side, its records, rng) and changes the side, returning what
# it did, or None when it does not apply (then another is drawn).

Records = list[tuple[int, int]]


def _patch(side: Side, offset: int, data: bytes) -> bool:
    base = offset - offset % side.size
    old = side.segments().get(base)
    if not isinstance(old, bytes) or offset - base + len(data) > len(old):
        return False
    p = offset - base
    side.files[name(base)] = old[:p] + data + old[p + len(data):]
    return True


def _byte(side: Side, offset: int) -> int | None:
    base = offset - offset % side.size
    data = side.segments().get(base)
    if not isinstance(data, bytes) or offset - base >= len(data):
        return None
    return data[offset - base]


def _flip(side: Side, offset: int) -> bool:
    b = _byte(side, offset)
    return b is not None and _patch(side, offset, bytes([b ^ 0x5A]))


def _zero(side: Side, start: int, end: int) -> None:
    while start < end:
        base = start - start % side.size
        stop = min(end, base + side.size)
        _patch(side, start, bytes(stop - start))
        start = stop


def torn_header_only(side: Side, recs: Records, rng: random.Random) -> str | None:
    if not recs:
        return None
    offset, size = recs[-1]
    keep = rng.randrange(8, 60)
    _zero(side, offset + keep, offset + size)
    return f"last record {offset} torn: {keep} header bytes kept"


def torn_partial_body(side: Side, recs: Records, rng: random.Random) -> str | None:
    if not recs or recs[-1][1] < 100:
        return None
    offset, size = recs[-1]
    keep = rng.randrange(60, size - 1)
    _zero(side, offset + keep, offset + size)
    return f"last record {offset} torn after {keep} of {size} bytes"


def torn_partial_header(side: Side, recs: Records, rng: random.Random) -> str | None:
    if not recs:
        return None
    offset, size = recs[-1]
    keep = rng.randrange(1, 8)
    _zero(side, offset + keep, offset + size)
    return f"last record {offset} torn: {keep} bytes of its header kept"


def zeros_for_records(side: Side, recs: Records, rng: random.Random) -> str | None:
    if len(recs) < 2:
        return None
    i = rng.randrange(len(recs))
    j = min(len(recs), i + rng.randrange(1, 3))
    _zero(side, recs[i][0], recs[j - 1][0] + recs[j - 1][1])
    return f"zeros for records {recs[i][0]}..{recs[j - 1][0]}"


def garbage_after_last(side: Side, recs: Records, rng: random.Random) -> str | None:
    end = recs[-1][0] + recs[-1][1] if recs else 0
    at = end + rng.randrange(0, 40)
    junk = bytes(rng.randrange(1, 256) for _ in range(rng.randrange(1, 24)))
    if not _patch(side, at, junk):
        return None
    return f"{len(junk)} garbage bytes at {at}, after the last record"


def garbage_far_after(side: Side, recs: Records, rng: random.Random) -> str | None:
    """
    Bytes that are no record far from the last record (past the reach of
    the largest record, with the walk windows made small), in its segment
    or in a later (preallocated) one.
    """
    end = recs[-1][0] + recs[-1][1] if recs else 0
    last = max(side.segments(), default=None)
    if last is None or last + side.size <= end + 100:
        return None
    at = rng.randrange(end + 100, last + side.size - 8)
    junk = bytes(rng.randrange(1, 256) for _ in range(rng.randrange(1, 8)))
    if not _patch(side, at, junk):
        return None
    return f"{len(junk)} garbage bytes at {at}, far after the last record ({end})"


def _body_offset(side: Side, offset: int, size: int) -> int | None:
    base = offset - offset % side.size
    data = side.segments().get(base)
    if data is None:
        return None
    p = offset - base
    try:
        record = parse_record(data, p, len(data), offset, check_crc=False)
    except Exception:
        return None
    if not isinstance(record, Record) or not record.body:
        return None
    at = data.find(record.body, p + 40, p + size)
    return None if at < 0 else base + at


def flip_body(which: str) -> Callable[[Side, Records, random.Random], str | None]:
    def damage(side: Side, recs: Records, rng: random.Random) -> str | None:
        if not recs:
            return None
        i = len(recs) - 1 if which == "last" else rng.randrange(len(recs))
        offset, size = recs[i]
        body = _body_offset(side, offset, size)
        if body is None:
            return None
        at = body + rng.randrange(0, 4)
        if not _flip(side, at):
            return None
        return f"body byte {at} of record {offset} ({which}) flipped: bad CRC"

    damage.__name__ = f"flip_body_{which}"
    return damage


def flip_header(side: Side, recs: Records, rng: random.Random) -> str | None:
    if not recs:
        return None
    offset, _ = rng.choice(recs)
    field_name, position = rng.choice(
        [("size", 0), ("size", 3), ("magic", 4), ("magic", 7), ("physical offset", 28),
         ("physical offset", 35), ("queue offset", 27), ("born timestamp", 47)]
    )
    if not _flip(side, offset + position):
        return None
    return f"header byte {position} ({field_name}) of record {offset} flipped"


def _segment_names(side: Side) -> list[str]:
    return sorted(side.segments() and [name(b) for b in side.segments()])


def truncate_segment(side: Side, recs: Records, rng: random.Random) -> str | None:
    names = _segment_names(side)
    if len(names) < 2:
        return None
    n = rng.choice(names[:-1])
    length = rng.choice([0, rng.randrange(1, side.size)])
    side.files[n] = side.segments()[int(n)][:length]
    return f"segment {n} (not the last) cut to {length} bytes"


def wrong_size_segment(side: Side, recs: Records, rng: random.Random) -> str | None:
    names = _segment_names(side)
    if not names:
        return None
    n = rng.choice(names)
    data = side.segments()[int(n)]
    if rng.random() < 0.5:
        side.files[n] = data + bytes(rng.randrange(1, 300))
        return f"segment {n} longer than a segment (zeros appended)"
    length = rng.randrange(1, side.size)
    side.files[n] = data[:length]
    return f"segment {n} cut to {length} bytes"


def drop_segment(where: str) -> Callable[[Side, Records, random.Random], str | None]:
    def damage(side: Side, recs: Records, rng: random.Random) -> str | None:
        names = _segment_names(side)
        if where == "middle":
            if len(names) < 3:
                return None
            n = rng.choice(names[1:-1])
        elif len(names) < 2:
            return None
        else:
            n = names[0] if where == "first" else names[-1]
        del side.files[n]
        return f"{where} segment {n} missing"

    damage.__name__ = f"missing_{where}_segment"
    return damage


def gap(side: Side, recs: Records, rng: random.Random) -> str | None:
    names = _segment_names(side)
    if len(names) < 4:
        return None
    i = rng.randrange(1, len(names) - 2)
    for n in names[i : i + 2]:
        del side.files[n]
    return f"segments {names[i]} and {names[i + 1]} missing"


def empty_segment(side: Side, recs: Records, rng: random.Random) -> str | None:
    names = _segment_names(side)
    if not names:
        return None
    n = rng.choice(names)
    side.files[n] = b""
    return f"segment {n} an empty file"


def odd_name(side: Side, recs: Records, rng: random.Random) -> str | None:
    names = _segment_names(side)
    if not names:
        return None
    n = rng.choice(names)
    how = rng.choice(["short", "long", "suffix", "stray"])
    data = side.segments()[int(n)]
    if how == "stray":
        side.files[n[1:] + ".bak"] = data
        return f"a stray copy of {n} named {n[1:]}.bak"
    del side.files[n]
    renamed = {"short": n[1:], "long": "0" + n, "suffix": n + ".tmp"}[how]
    side.files[renamed] = data
    return f"segment {n} renamed {renamed}"


def replace_segment(kind: str) -> Callable[[Side, Records, random.Random], str | None]:
    def damage(side: Side, recs: Records, rng: random.Random) -> str | None:
        names = _segment_names(side)
        if not names:
            return None
        n = rng.choice(names)
        if kind == "unreadable":
            side.unreadable.add(n)
        else:
            side.files[n] = kind
        return f"segment {n}: {kind}"

    damage.__name__ = kind.replace(" ", "_")
    return damage


def blank_damage(side: Side, recs: Records, rng: random.Random) -> str | None:
    blanks = []
    for base, data in side.segments().items():
        if len(recs) and recs[-1][0] < base:
            continue
        ends = [o + s for o, s in recs if base <= o < base + side.size]
        if ends and max(ends) < base + len(data) and any(data[max(ends) - base :][:8]):
            blanks.append(max(ends))
    if not blanks:
        return None
    at = rng.choice(blanks)
    if rng.random() < 0.5:
        _zero(side, at, at + 8)
        return f"the BLANK filler at {at} zeroed"
    _flip(side, at + 2)
    return f"the BLANK filler at {at}: its size flipped"


def refill_segment(kind: str) -> Callable[[Side, Records, random.Random], str | None]:
    def damage(side: Side, recs: Records, rng: random.Random) -> str | None:
        names = _segment_names(side)
        if not names:
            return None
        n = rng.choice(names)
        side.files[n] = bytes(side.size) if kind == "zeros" else rng.randbytes(side.size)
        return f"segment {n} all {kind}"

    damage.__name__ = f"segment_of_{kind}"
    return damage


def linked_segment(side: Side, recs: Records, rng: random.Random) -> str | None:
    names = _segment_names(side)
    if not names:
        return None
    n = rng.choice(names)
    side.files[n] = (LINK, side.segments()[int(n)])
    return f"segment {n} a symlink to its bytes elsewhere"


def misplaced_segment(side: Side, recs: Records, rng: random.Random) -> str | None:
    names = _segment_names(side)
    if not names:
        return None
    n = rng.choice(names)
    moved = name(int(n) + rng.randrange(1, side.size))
    side.files[moved] = side.files.pop(n)
    return f"segment {n} renamed {moved} (not at a multiple of the segment size)"


def extra_zero_segment(side: Side, recs: Records, rng: random.Random) -> str | None:
    names = _segment_names(side)
    last = int(names[-1]) if names else -side.size
    side.files[name(last + side.size)] = bytes(side.size)
    return f"a preallocated (all zeros) segment {name(last + side.size)} after the last"


def extra_segment_before(side: Side, recs: Records, rng: random.Random) -> str | None:
    names = _segment_names(side)
    if not names or int(names[0]) == 0:
        return None
    first = int(names[0])
    side.files[name(first - side.size)] = bytes([7]) * side.size
    return f"an extra segment {name(first - side.size)} before the first"


DAMAGES: list[Callable[[Side, Records, random.Random], str | None]] = [
    torn_header_only, torn_partial_body, torn_partial_header, zeros_for_records,
    garbage_after_last, garbage_far_after, flip_body("middle"), flip_body("last"), flip_header,
    truncate_segment, wrong_size_segment, drop_segment("first"), drop_segment("middle"),
    drop_segment("last"), gap, empty_segment, odd_name, replace_segment(DIRECTORY),
    replace_segment(DANGLING), replace_segment("unreadable"), blank_damage,
    extra_zero_segment, extra_segment_before, refill_segment("zeros"),
    refill_segment("random bytes"), linked_segment, misplaced_segment,
]


# -- pairs -------------------------------------------------------------------


def cut(base: Base, end: int, keep_next: bool) -> tuple[Side, Records]:
    """
    The base store holding only its records before C{end} (a record
    boundary): what a slave behind the master at C{end} holds.
    """
    size = base.size
    side = Side({}, size)
    for n, data in base.files.items():
        b = int(n)
        if b + size <= end:
            side.files[n] = data
        elif b <= end and (b < end or keep_next):
            side.files[n] = data[: end - b] + bytes(size - (end - b))
    return side, [r for r in base.records if r[0] + r[1] <= end]


@dataclass
class Pair:
    label: str
    master: Side
    slave: Side


def random_pair(base: Base, rng: random.Random, damages: int) -> Pair:
    ends = [o + s for o, s in base.records]
    # The master: whole, or itself cut (then the slave may be longer).
    master_end = ends[-1] if rng.random() < 0.8 else rng.choice(ends[len(ends) // 2 :])
    master, master_recs = cut(base, master_end, rng.random() < 0.5)
    slave_end = rng.choice([ends[-1], master_end, master_end, rng.choice(ends), rng.choice(ends)])
    slave, slave_recs = cut(base, slave_end, rng.random() < 0.3)
    labels = [f"S={base.size} master to {master_end}, slave to {slave_end}"]
    for _ in range(damages):
        for _attempt in range(10):
            damage = rng.choice(DAMAGES)
            which = rng.choice(["master", "slave", "slave"])
            side, recs = (master, master_recs) if which == "master" else (slave, slave_recs)
            did = damage(side, recs, rng)
            if did is not None:
                labels.append(f"{which}: {did}")
                break
    return Pair("; ".join(labels), master, slave)


def enumerated_pairs(base: Base) -> list[Pair]:
    """
    Each damage once on each side, on a slave as long as the master and on
    one behind it; and the plain cases.
    """
    pairs = []
    ends = [o + s for o, s in base.records]
    full = ends[-1]
    behind = ends[len(ends) // 2]
    rng = random.Random(base.size)

    def pair(label: str, master_end: int, slave_end: int) -> tuple[Side, Records, Side, Records]:
        m, mr = cut(base, master_end, False)
        s, sr = cut(base, slave_end, False)
        return m, mr, s, sr

    m, _, s, _ = pair("equal", full, full)
    pairs.append(Pair("slave equal to master", m, s))
    m, _, s, _ = pair("behind", full, behind)
    pairs.append(Pair("slave behind master", m, s))
    m, _, s, _ = pair("longer", behind, full)
    pairs.append(Pair("slave longer than master", m, s))
    empty = Side({name(0): bytes(base.size)}, base.size)
    pairs.append(Pair("both empty (one zero segment each)", empty, empty.copy()))
    pairs.append(Pair("empty slave", pair("", full, full)[0], empty.copy()))
    pairs.append(Pair("slave with no segment file", pair("", full, full)[0], Side({}, base.size)))
    pairs.append(Pair("master with no segment file", Side({}, base.size), pair("", full, full)[2]))
    pairs.append(Pair("both with no segment file", Side({}, base.size), Side({}, base.size)))
    for damage in DAMAGES:
        for which in ("master", "slave"):
            for slave_end in (full, behind):
                m, mr, s, sr = pair("", full, slave_end)
                side, recs = (m, mr) if which == "master" else (s, sr)
                if which == "master" and damage in (torn_header_only, torn_partial_body,
                                                    torn_partial_header, garbage_after_last):
                    recs = [r for r in recs if r[0] + r[1] <= slave_end]
                did = damage(side, recs, rng)
                if did is not None:
                    where = "as long as" if slave_end == full else "behind"
                    pairs.append(Pair(f"S={base.size} slave {where} master; {which}: {did}", m, s))
    # The master's torn tail, the slave holding the same bytes.
    m, mr, s, sr = pair("", full, full)
    torn_partial_body(m, mr, random.Random(1))
    s.files = dict(m.files)
    pairs.append(Pair("slave with the master's torn tail", m, s))
    # A damaged record of the master inside the slave's range, the slave's good.
    m, mr, s, sr = pair("", full, full)
    flip_body("middle")(m, mr[: len(mr) // 2], random.Random(2))
    pairs.append(Pair("master damaged inside the slave's range", m, s))
    # The same damage in both (a copy of a damaged master).
    m, mr, s, sr = pair("", full, full)
    flip_body("middle")(m, mr[: len(mr) // 2], random.Random(3))
    s.files = dict(m.files)
    pairs.append(Pair("the master's damage copied to the slave", m, s))
    return pairs


# -- the oracle --------------------------------------------------------------


@dataclass
class Verdict:
    code: int
    why: str
    slave_max: int | None = None


def _readable_segments(side: Side) -> tuple[dict[int, bytes], str | None]:
    """
    The side's segment files (20-digit names), or why one cannot be read.
    """
    for n, v in side.files.items():
        if len(n) == 20 and n.isdigit():
            if not isinstance(v, (bytes, tuple)):
                return {}, f"{n} is a {v}"
            if n in side.unreadable:
                return {}, f"{n} is unreadable"
    return side.segments(), None


def _unfinished_dropped(files: dict[int, bytes], size: int) -> dict[int, bytes]:
    files = dict(sorted(files.items()))
    if files:
        last = max(files)
        if len(files[last]) < size and not any(files[last]):
            del files[last]
    return files


def _store_check(root: str, files: dict[int, bytes], size: int) -> Any:
    """
    C{rmqha store check}'s report for a store of these files, the missing
    and odd ones made whole segments of zeros (they hold no records).
    """
    directory = os.path.join(root, "commitlog")
    os.makedirs(directory)
    aligned = {b: d for b, d in files.items() if b % size == 0}
    if not aligned:
        return None
    for b in range(min(aligned), max(aligned) + size, size):
        data = aligned.get(b, b"")[:size]
        with open(os.path.join(directory, name(b)), "wb") as f:
            f.write(data + bytes(size - len(data)))
    return verify_store(root)


def oracle(pair: Pair, scratch: str) -> Verdict:
    """
    The right verdict, from first principles, in this order: 2 when a
    segment file of either side cannot be read, or the master has none at
    a multiple of the segment size; 1 for a fact about the slave's files (a
    hole between them, a file not a segment's size or place, a segment
    with data past the master's last, another segment size); 2 for a
    defect of the master's files anywhere (a hole, a file not a segment's
    size or place) or slave bytes before the master's first segment; else
    the slave's bytes, up to its last non-zero one, compared with the
    master's: equal is 0; at the first difference, 2 if the master's store
    is damaged there (store check: a bad record with valid records after
    it), else 1.  An unfinished last file (short, only zeros) is no file.
    The segment size is the one the pair was written with, not guessed.
    """
    size = pair.master.size
    master, why = _readable_segments(pair.master)
    if why:
        return Verdict(2, f"master: {why}")
    slave, why = _readable_segments(pair.slave)
    if why:
        return Verdict(2, f"slave: {why}")
    if not master:
        return Verdict(2, "the master has no segment file")
    master = _unfinished_dropped(master, size)
    slave = _unfinished_dropped(slave, pair.slave.size)
    if not master:
        return Verdict(2, "the master has no segment file that holds anything")
    if not any(b % size == 0 for b in master):
        return Verdict(2, "the master has no segment file at a multiple of the segment size")
    master_end = max(b for b in master if b % size == 0) + size
    bases = sorted(slave)
    slave_end = bases[0] if bases else 0
    for b in reversed(bases):
        data = slave[b].rstrip(b"\0")
        if data:
            slave_end = b + len(data)
            break
    facts = []
    for a, b in zip(bases, bases[1:]):
        if b > a + pair.slave.size:
            facts.append(f"slave misses {a + pair.slave.size}..{b}")
    for b in bases:
        if len(slave[b]) != pair.slave.size or b % pair.slave.size:
            facts.append(f"slave segment {b} is {len(slave[b])} bytes")
        if b >= master_end and b < slave_end:
            facts.append(f"slave segment {b} has data past the master's last segment")
    if bases and pair.slave.size != size:
        facts.append("segment sizes differ")
    if facts:
        return Verdict(1, "; ".join(facts))

    def master_bytes(start: int, end: int) -> bytes:
        """
        The master's bytes from C{start} (in one segment) to C{end} or
        where its file for them ends.
        """
        b = start - start % size
        return master.get(b, b"")[start - b : end - b]

    # The master's files: contiguous whole segments, wherever they lie.
    master_bases = sorted(master)
    for a, b in zip(master_bases, master_bases[1:]):
        if b != a + size:
            return Verdict(2, f"the master's files {a} and {b} are not one segment apart")
    for b in master_bases:
        if len(master[b]) != size or b % size:
            return Verdict(2, f"the master's file {b} is {len(master[b])} bytes")
    # Every byte the slave holds must be in a master file (or past the
    # master's last one), or there is nothing to compare it with.
    if bases and bases[0] < min(slave_end, master_bases[0]):
        return Verdict(2, "the slave holds bytes before the master's first segment")
    first_difference = None
    for b in bases:
        stop = min(b + len(slave[b]), slave_end)
        if stop <= b:
            continue
        theirs = slave[b][: stop - b]
        ours = master_bytes(b, stop)
        if ours != theirs:
            # (The first byte that differs, or where the master's bytes end.)
            i = next((i for i, (x, y) in enumerate(zip(theirs, ours)) if x != y), len(ours))
            first_difference = b + i
            break
    if first_difference is None:
        report = _store_check(os.path.join(scratch, "slave-check"), slave, size) if bases else None
        return Verdict(0, "the slave's bytes are the master's",
                       report.end_offset if report is not None else None)
    report = _store_check(os.path.join(scratch, "master-check"), master, size)
    for damage in report.damage:
        if damage.next_valid is not None and damage.offset <= first_difference < damage.next_valid:
            return Verdict(2, f"differs at {first_difference}, in the master's damage at "
                              f"{damage.offset} ({damage.reason})")
    return Verdict(1, f"differs at {first_difference}")


# -- running verify ------------------------------------------------------------


class Unreadable(LocalStore):
    """
    A local store whose named segment files cannot be opened (C{chmod 0}
    stops no read by root, and the tests may run as root).
    """

    def __init__(self, root: str, names: set[str]) -> None:
        super().__init__(root)
        self.names = names

    def open(self, segment: Segment) -> SegmentReader:
        if segment.name in self.names:
            raise PermissionError(errno.EACCES, "Permission denied", self.path(segment))
        return super().open(segment)


def store(side: Side, root: str) -> LocalStore:
    side.write(root)
    return Unreadable(root, side.unreadable) if side.unreadable else LocalStore(root)


def run_verify(verify: Callable[[Any, Any], Any], master: Any, slave: Any) -> Verdict:
    from rmqha.pipeline.jobs import CompareError

    try:
        result = verify(master, slave)
    except (CompareError, PlanError) as e:
        return Verdict(2, str(e))
    return Verdict(0 if result.consistent else 1, "\n".join(result.lines()),
                   result.slave_max_offset)


def _scratch(case: SynchronousTestCase) -> str:
    """
    A directory for the pairs' stores: in memory (C{/dev/shm}) where there
    is one (hundreds of small stores written and removed: on a busy disk
    that is most of the time), else the test's own.
    """
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        import tempfile

        path = tempfile.mkdtemp(prefix="rmqha-verify-fuzz-", dir="/dev/shm")
        case.addCleanup(shutil.rmtree, path, True)
        return path
    path = os.path.abspath(case.mktemp())
    os.makedirs(path)
    return path


def check(case: SynchronousTestCase, pairs: list[Pair], verify: Callable[[Any, Any], Any]) -> None:
    """
    Each pair's verdict from C{verify} is the oracle's (its exit status;
    and, when consistent, the slave's max offset is store check's).  The
    pairs must reach all three verdicts.
    """
    wrong = []
    seen = set()
    scratch = _scratch(case)
    for i, pair in enumerate(pairs):
        root = os.path.join(scratch, str(i))
        os.makedirs(root)
        expected = oracle(pair, root)
        seen.add(expected.code)
        got = run_verify(
            verify, store(pair.master, os.path.join(root, "m")),
            store(pair.slave, os.path.join(root, "s")),
        )
        if got.code != expected.code or (
            got.code == 0 and expected.slave_max is not None
            and got.slave_max != expected.slave_max
        ):
            wrong.append(
                f"{pair.label}: verify {got.code} ({got.why}; slave max {got.slave_max}), "
                f"expected {expected.code} ({expected.why}; slave max {expected.slave_max})"
            )
        shutil.rmtree(root)
    if wrong:
        case.fail(f"{len(wrong)} of {len(pairs)} verdicts wrong:\n" + "\n".join(wrong))
    case.assertEqual(seen, {0, 1, 2})


_bases: dict[int, Base] = {}


def bases(case: SynchronousTestCase) -> list[Base]:
    for size, count in ((4096, 40), (8192, 60), (16384, 70)):
        if size not in _bases:
            _bases[size] = make_base(os.path.abspath(case.mktemp()), size, count, seed=size)
    return list(_bases.values())


def other_size_pairs(case: SynchronousTestCase) -> list[Pair]:
    """
    A slave written with another segment size than its master's, from the
    same messages (its BLANK fillers elsewhere): whole, and behind.
    """
    master = bases(case)[1]
    other = make_base(os.path.abspath(case.mktemp()), 4096, 60, seed=8192)
    pairs = []
    for end in (other.records[-1], other.records[5]):
        slave, _ = cut(other, end[0] + end[1], False)
        pairs.append(Pair(f"slave with 4096-byte segments, master 8192, slave to {end[0]}",
                          cut(master, master.records[-1][0] + master.records[-1][1], False)[0],
                          slave))
    return pairs


class VerifyFuzzTests(SynchronousTestCase):
    """
    L{verify_local} agrees with the oracle on every enumerated damage and
    on seeded random combinations of them.
    """

    def test_enumerated(self) -> None:
        """
        Every kind of damage, once on each side, at each segment size.
        """
        from rmqha.pipeline.jobs import verify_local

        pairs = [p for base in bases(self) for p in enumerated_pairs(base)]
        check(self, pairs + other_size_pairs(self), verify_local)

    def test_random(self) -> None:
        """
        Seeded random pairs with one to three damages each.
        """
        from rmqha.pipeline.jobs import verify_local

        rng = random.Random(2027)
        all_bases = bases(self)
        pairs = [random_pair(rng.choice(all_bases), rng, rng.randrange(1, 4)) for _ in range(150)]
        check(self, pairs, verify_local)


    def test_small_windows(self) -> None:
        """
        The driver's walks read a segment in windows (4 MiB, and the
        longest record beyond) and look for its last non-zero byte in
        blocks backwards: with windows and blocks far smaller than these
        segments, records and damage fall across their edges, and every
        verdict stays the oracle's.
        """
        from rmqha.pipeline import jobs
        from rmqha.pipeline._store import SegmentReader as Reader

        self.patch(jobs, "_WALK_WINDOW", 700)
        self.patch(jobs, "MAX_RECORD", 2048)  # (the bases' records are smaller)
        self.patch(Reader, "block_size", 333)
        rng = random.Random(2028)
        all_bases = bases(self)
        pairs = [random_pair(rng.choice(all_bases), rng, rng.randrange(1, 4)) for _ in range(50)]
        check(self, pairs + enumerated_pairs(all_bases[2])[:40], jobs.verify_local)


@pytest.mark.spark
class VerifySparkFuzzTests(SynchronousTestCase):
    """
    A handful of the pairs through the real Spark job.
    """

    skip = why_no_spark()

    def test_representative(self) -> None:
        """
        One pair of each verdict and cause: equal, behind, a torn tail (0);
        a flipped byte, a missing segment (1); the master damaged where
        they differ, a segment that cannot be read (2).
        """
        from rmqha.pipeline.jobs import verify

        base = bases(self)[0]
        wanted = (
            "slave equal to master", "slave behind master",
            "slave behind master; slave: last record",
            "slave as long as master; slave: body byte",
            "slave as long as master; slave: middle segment",
            "master damaged inside the slave's range",
            "slave as long as master; slave: segment 00000000000000004096: unreadable",
        )
        pairs = {}
        for p in enumerated_pairs(base):
            for w in wanted:
                if w not in pairs and p.label.split("=4096 ")[-1].startswith(w):
                    pairs[w] = p
        self.assertEqual(len(pairs), len(wanted), sorted(pairs))
        check(self, list(pairs.values()), lambda m, s: verify(spark(), m, s))
