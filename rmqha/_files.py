"""
Small files a store keeps beside its segments (the queue-table snapshot,
what the master is, this replica's id), written so that a crash or a full
disk leaves the old file or the new one, never half of one, and no
temporary file behind; and the byte comparison of two stores' files (the
demos' last check).
"""

from __future__ import annotations

import os
from typing import IO, Callable

__all__ = ["compare_stores", "write_atomically"]


def write_atomically(path: str, write: Callable[[IO[str]], object]) -> None:
    """
    Replace C{path} with what C{write} writes to the open (text) file it is
    given: a temporary file beside it, flushed to disk, then renamed over
    C{path}, and the directory synced so the rename itself survives a
    crash; C{path}'s directory is created if missing.

    @raise OSError: it could not be written (or whatever C{write} raised):
        C{path} is unchanged and the temporary file is removed.
    """
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _sync_directory(os.path.dirname(path))
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _sync_directory(path: str) -> None:
    """
    Flush C{path}'s directory entries to disk (a rename is durable only
    once its directory is).
    """
    fd = os.open(path or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def compare_stores(a: str, b: str, part: str = "commitlog") -> tuple[bool, int, int]:
    """
    Compare the files under two stores' C{part} byte for byte:
    C{commitlog} (the segment files) or C{consumequeue} (every queue file
    of every topic, C{{topic}/{queueId}/{20 digits}}).  A missing
    C{part} holds no files.

    @return: C{(identical, file count, bytes compared)}; not identical
        when the two hold different file names (then nothing is read).
    """
    names = _files_under(os.path.join(a, part))
    if names != _files_under(os.path.join(b, part)):
        return False, len(names), 0
    compared = 0
    for name in names:
        with open(os.path.join(a, part, name), "rb") as fa, open(os.path.join(b, part, name), "rb") as fb:
            while True:
                chunk_a, chunk_b = fa.read(1 << 20), fb.read(1 << 20)
                if chunk_a != chunk_b:
                    return False, len(names), compared
                if not chunk_a:
                    break
                compared += len(chunk_a)
    return True, len(names), compared


def _files_under(directory: str) -> list[str]:
    """
    The files under C{directory} (recursively), as sorted relative paths.
    """
    found = []
    for parent, _, names in os.walk(directory):
        for name in names:
            found.append(os.path.relpath(os.path.join(parent, name), directory))
    return sorted(found)
