# -*- test-case-name: tests.test_epochs -*-
"""
A node's epoch file (docs/failover.md, "Epochs and rejoining"): which
epoch (election) wrote which part of the commit log, as RocketMQ 5's
C{epochFileCheckpoint} and Kafka's C{leader-epoch-checkpoint} keep it.

Each entry is C{(epoch, start offset)}: the bytes from C{start} up to the
next entry's start (or the log's end) were written by the master elected
in C{epoch}.  A master appends C{(its epoch, its max offset)} when it takes
office; a slave adopts its master's list.  L{common_end} is RocketMQ's
C{doTruncate}: where a rejoining node's log stops agreeing with its new
master's.

The file, C{<store>/rmqha/epochs}, is RocketMQ's checkpoint text::

    2                  the number of entries
    1391301210         the CRC-32 of the entry lines, newlines included
    7-7000             epoch-start, in decimal, one a line
    8-8000

written crash-safely (a temporary file, fsync, rename, directory fsync),
the previous list first copied to C{epochs.bak}.
"""

from __future__ import annotations

import os
import zlib
from typing import Iterable, Sequence

from twisted.logger import Logger

from rmqha._files import write_atomically
from rmqha.ha._wire import MAX_EPOCH_ENTRIES

__all__ = [
    "EPOCHS_PATH",
    "MAX_EPOCH_ENTRIES",
    "Entry",
    "EpochFile",
    "EpochFileError",
    "common_end",
    "end_of",
    "check_entries",
]

#: Where a store keeps its epoch file.
EPOCHS_PATH = os.path.join("rmqha", "epochs")
#: C{(epoch, start offset)}.
Entry = tuple[int, int]

_INT64_MAX = (1 << 63) - 1


class EpochFileError(ValueError):
    """
    An epoch file (or list) that cannot be used; the text names it and why.
    """


def check_entries(entries: Sequence[Entry], what: str) -> list[Entry]:
    """
    C{entries} as a list, when they are a valid epoch list: at most
    L{MAX_EPOCH_ENTRIES}, epochs positive and strictly growing, start
    offsets non-negative and strictly growing.

    @param what: names the list in the error.
    @raise EpochFileError: one line saying what is wrong.
    """
    if len(entries) > MAX_EPOCH_ENTRIES:
        raise EpochFileError(
            f"{what}: {len(entries)} entries; the limit is {MAX_EPOCH_ENTRIES}"
        )
    result: list[Entry] = []
    for epoch, start in entries:
        if not (0 < epoch <= _INT64_MAX and 0 <= start <= _INT64_MAX):
            raise EpochFileError(f"{what}: impossible entry epoch {epoch} start {start}")
        if result and not (epoch > result[-1][0] and start > result[-1][1]):
            raise EpochFileError(
                f"{what}: entry epoch {epoch} start {start} does not follow "
                f"epoch {result[-1][0]} start {result[-1][1]} (both must grow)"
            )
        result.append((int(epoch), int(start)))
    return result


def end_of(entries: Sequence[Entry], epoch: int, log_end: int) -> int | None:
    """
    Where C{epoch}'s bytes end in a log ending at C{log_end} whose epoch
    list is C{entries}: the next entry's start, or the log's end (whichever
    comes first: a slave's list may name epochs it holds no bytes of yet);
    C{None} when the list has no such epoch.
    """
    for i, (e, _) in enumerate(entries):
        if e == epoch:
            if i + 1 < len(entries):
                return min(entries[i + 1][1], log_end)
            return log_end
    return None


def common_end(
    local_entries: Sequence[Entry],
    local_end: int,
    master_entries: Sequence[Entry],
    master_end: int,
) -> int | None:
    """
    Where a node's log (C{local_entries}, ending at C{local_end}) stops
    agreeing with its master's: RocketMQ 5's C{doTruncate}, Kafka's
    KIP-101 with KIP-279's fix.  The newest local epoch the master also
    has I{with the same start offset} was written by one master, so both
    logs agree on it up to the shorter one's end of it: the cut is the
    smaller of the two ends.  C{None}: no common epoch (histories that
    never met).
    """
    master = dict(master_entries)
    for epoch, start in reversed(local_entries):
        if master.get(epoch) == start:
            ours = end_of(local_entries, epoch, local_end)
            theirs = end_of(master_entries, epoch, master_end)
            assert ours is not None and theirs is not None
            return max(0, min(ours, theirs))
    return None


def _format(entries: Sequence[Entry]) -> str:
    lines = "".join(f"{epoch}-{start}\n" for epoch, start in entries)
    return f"{len(entries)}\n{zlib.crc32(lines.encode('ascii'))}\n{lines}"


def _parse(text: str, path: str) -> list[Entry]:
    """
    @raise EpochFileError: naming C{path} and what is wrong.
    """
    if not text.endswith("\n"):
        raise EpochFileError(f"epoch file {path} is torn (no final newline)")
    lines = text.split("\n")[:-1]
    if len(lines) < 2:
        raise EpochFileError(f"epoch file {path} is torn (no count and CRC lines)")
    try:
        count, crc = int(lines[0]), int(lines[1])
    except ValueError:
        raise EpochFileError(f"epoch file {path}: bad count or CRC line") from None
    body = lines[2:]
    if count != len(body):
        raise EpochFileError(
            f"epoch file {path} says {count} entries and holds {len(body)}"
        )
    computed = zlib.crc32("".join(line + "\n" for line in body).encode("utf-8"))
    if crc != computed:
        raise EpochFileError(
            f"epoch file {path} fails its CRC (says {crc}, computed {computed})"
        )
    entries: list[Entry] = []
    for line in body:
        epoch, sep, start = line.partition("-")
        if not (sep and epoch.isdigit() and start.isdigit()):
            raise EpochFileError(f"epoch file {path}: bad entry {line[:40]!r}")
        entries.append((int(epoch), int(start)))
    return check_entries(entries, f"epoch file {path}")


class EpochFile:
    """
    A store's epoch list, in memory and in C{<store>/rmqha/epochs}.

    Every change is written before it is taken in memory: the previous
    list to C{epochs.bak}, then the new one, each crash-safely.  A damaged
    file is never read as an empty list (which means "a new replica"):
    the previous list in C{epochs.bak} is used instead, with a warning
    (it lacks at most the newest change, which only makes a later cut
    deeper), and when that is damaged too, opening fails.
    """

    _log = Logger()

    def __init__(self, store_dir: str) -> None:
        """
        Read the store's epoch file (none: an empty list).

        @raise EpochFileError: the file and its backup are both damaged
            (or the file is, and there is no backup).
        @raise OSError: it could not be read.
        """
        self.path = os.path.join(store_dir, EPOCHS_PATH)
        self.backup_path = self.path + ".bak"
        self._entries = self._load()

    def _read(self, path: str) -> list[Entry] | None:
        try:
            with open(path, encoding="utf-8", newline="") as f:
                text = f.read(64 * (MAX_EPOCH_ENTRIES + 2))
        except FileNotFoundError:
            return None
        except UnicodeDecodeError:
            raise EpochFileError(f"epoch file {path} is not text") from None
        return _parse(text, path)

    def _load(self) -> list[Entry]:
        try:
            entries = self._read(self.path)
        except EpochFileError as e:
            problem: EpochFileError | None = e
            entries = None
        else:
            if entries is not None:
                return entries
            problem = None
        try:
            previous = self._read(self.backup_path)
        except EpochFileError as e:
            raise EpochFileError(
                f"{problem or f'epoch file {self.path} is missing'}, and its backup: {e}"
            ) from None
        if previous is None:
            if problem is not None:
                raise EpochFileError(f"{problem}, and there is no backup {self.backup_path}")
            return []  # Neither: a store that never had an epoch.
        self._log.warn(
            "{problem}: using the previous list from {backup} (it may lack the "
            "newest epoch)",
            problem=problem or f"epoch file {self.path} is missing",
            backup=self.backup_path,
        )
        return previous

    def reload(self) -> None:
        """
        Read the file again (the store was moved aside and started afresh).
        """
        self._entries = self._load()

    @property
    def entries(self) -> list[Entry]:
        """
        The list, oldest first (a copy).
        """
        return list(self._entries)

    @property
    def last_epoch(self) -> int:
        """
        The newest epoch in the list, 0 when it is empty.
        """
        return self._entries[-1][0] if self._entries else 0

    def _write(self, entries: list[Entry]) -> None:
        if entries == self._entries:
            return
        old = _format(self._entries)
        write_atomically(self.backup_path, lambda f: f.write(old))
        new = _format(entries)
        write_atomically(self.path, lambda f: f.write(new))
        self._entries = entries

    def append(self, epoch: int, start: int) -> None:
        """
        Record that C{epoch}'s bytes start at C{start}.  A newer epoch
        starting where the last one does (a re-election with nothing
        written since) replaces it: that epoch holds no bytes.  The same
        entry again changes nothing.

        @raise EpochFileError: C{epoch} or C{start} is lower than the last
            entry's (one line).
        @raise OSError: the file could not be written (nothing changed).
        """
        entries = list(self._entries)
        if entries:
            last_epoch, last_start = entries[-1]
            if (epoch, start) == (last_epoch, last_start):
                return
            if epoch <= last_epoch or start < last_start:
                raise EpochFileError(
                    f"epoch file {self.path}: cannot add epoch {epoch} start {start} "
                    f"after epoch {last_epoch} start {last_start}"
                )
            if start == last_start:
                entries.pop()
        entries.append((epoch, start))
        if len(entries) > MAX_EPOCH_ENTRIES:
            # A bounded ring: the oldest entries go (docs/failover.md, "The
            # epoch file"); where two logs part is decided by recent epochs.
            dropped, entries = entries[:-MAX_EPOCH_ENTRIES], entries[-MAX_EPOCH_ENTRIES:]
            self._log.info(
                "epoch file {path} holds {limit} entries: dropped the oldest {count} "
                "(epochs {first} to {last})",
                path=self.path,
                limit=MAX_EPOCH_ENTRIES,
                count=len(dropped),
                first=dropped[0][0],
                last=dropped[-1][0],
            )
        self._write(check_entries(entries, f"epoch file {self.path}"))

    def truncate_to(self, offset: int) -> None:
        """
        Drop the entries of epochs starting past C{offset} (the log was
        cut back to it).
        """
        self._write([e for e in self._entries if e[1] <= offset])

    def replace(self, entries: Iterable[Entry]) -> None:
        """
        Make C{entries} the list (a slave adopting its master's).

        @raise EpochFileError: they are not a valid list.
        """
        self._write(check_entries(list(entries), f"epoch list for {self.path}"))

    def end_of(self, epoch: int, log_end: int) -> int | None:
        """
        L{end_of} this list.
        """
        return end_of(self._entries, epoch, log_end)
