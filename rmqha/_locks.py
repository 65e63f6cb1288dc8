"""
The one way rmqha keeps two processes off one directory: the POSIX
record lock (C{fcntl.lockf}) RocketMQ takes on C{<store>/lock} -- Java's
C{FileChannel.tryLock} is one, so a store's lock excludes a running Apache
RocketMQ broker too.  Every command that writes a directory takes it for
its lifetime (docs/cli.md, "Directories a command writes"): a broker,
C{store fill} and C{store repair} on the store, C{demo} on its C{--dir},
C{pipeline export --incremental} on a local C{OUT}.

A lock dies with its process (a crash, C{kill -9}): nothing to clean up.
POSIX locks belong to the process, not to the descriptor: a second lock
taken by the same process succeeds, and closing any descriptor of the
file releases it -- hence one holder per file, the descriptor kept until
the end.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import sys

__all__ = ["DIRECTORY_LOCK", "InUseError", "lock_directory", "lock_file"]

#: The lock file a command that writes a directory (not a store: its lock
#: is C{<store>/lock}) takes in it.
DIRECTORY_LOCK = ".rmqha.lock"

#: Linux's C{struct flock}: l_type, l_whence, l_start, l_len, l_pid.
_FLOCK = "hhqqi"


class InUseError(OSError):
    """
    Another process holds the lock.

    @ivar directory: the directory the lock guards.
    @ivar path: the lock file.
    @ivar pid: the holder's process id, if the system says.
    """

    def __init__(self, directory: str, path: str, pid: int | None) -> None:
        self.directory = directory
        self.path = path
        self.pid = pid
        super().__init__(errno.EAGAIN, self.describe("rmqha"))

    def describe(self, holder: str) -> str:
        """
        One line: C{DIR is in use by another HOLDER (pid N)}.
        """
        who = f" (pid {self.pid})" if self.pid is not None else ""
        return f"{self.directory} is in use by another {holder}{who}"

    def __str__(self) -> str:
        return self.describe("rmqha")


def _holder(fd: int) -> int | None:
    """
    The pid of the process holding a lock on C{fd}'s file (F_GETLK), or
    C{None} where C{struct flock}'s layout is not known (not Linux) or
    the lock was released meanwhile.
    """
    if not sys.platform.startswith("linux"):
        return None
    query = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
    try:
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
    except OSError:
        return None
    kind, _, _, _, pid = struct.unpack(_FLOCK, answer)
    return pid if kind != fcntl.F_UNLCK and pid > 0 else None


def lock_file(path: str, directory: str | None = None) -> int:
    """
    Take the exclusive lock on the file at C{path} (created if missing),
    without waiting.

    @param directory: what the lock guards, as errors name it (default:
        C{path}'s directory).
    @return: the lock's descriptor: the lock is held until it is closed
        (or the process ends).
    @raise InUseError: another process holds it.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        try:
            if e.errno in (errno.EACCES, errno.EAGAIN):
                where = directory if directory is not None else os.path.dirname(path)
                raise InUseError(where, path, _holder(fd)) from None
            raise
        finally:
            os.close(fd)
    return fd


def lock_directory(directory: str) -> int:
    """
    Take C{directory}'s lock (L{DIRECTORY_LOCK} in it; the directory must
    exist) for a command that writes it.

    @return: the lock's descriptor (see L{lock_file}).
    @raise InUseError: another process holds it: C{DIR is in use by
        another rmqha (pid N)}.
    """
    return lock_file(os.path.join(directory, DIRECTORY_LOCK), directory)
