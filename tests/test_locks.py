"""
Tests for L{rmqha._locks}: the one lock a command that writes a directory
takes (docs/cli.md, "Directories a command writes").  POSIX locks belong
to a process, so the other holder is a real one: a small Python
subprocess.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from twisted.trial.unittest import SynchronousTestCase

import rmqha
from rmqha._locks import DIRECTORY_LOCK, InUseError, lock_directory
from rmqha.store.commitlog import CommitLog, StoreLockedError

from tests._helpers import fixed_clock

_HOLD = (
    "import sys\n"
    "from rmqha._locks import lock_file\n"
    "lock_file(sys.argv[1])\n"
    "print('locked', flush=True)\n"
    "sys.stdin.read()\n"
)


def hold(case: SynchronousTestCase, path: str) -> subprocess.Popen[str]:
    """
    Start a process that takes the lock on C{path} and holds it until its
    stdin closes (or it is killed); killed at the end of the test.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(rmqha.__file__)))
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, path],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )

    def end() -> None:
        if holder.poll() is None:
            holder.kill()
        holder.wait(timeout=60)
        for stream in (holder.stdin, holder.stdout):
            if stream is not None:
                stream.close()

    case.addCleanup(end)
    assert holder.stdout is not None
    line = holder.stdout.readline()
    case.assertEqual(line, "locked\n")
    return holder


class DirectoryLockTests(SynchronousTestCase):
    """
    L{lock_directory}: one holder at a time, the other named by pid; the
    lock ends with its holder, whichever way it ends.
    """

    def test_second_holder_refused_naming_the_first(self) -> None:
        """
        While another process holds a directory's lock, taking it fails
        with one line naming the directory and the holder's pid; once the
        holder is killed (a crash: nothing cleaned up), it is free.
        """
        d = os.path.abspath(self.mktemp())
        os.makedirs(d)
        holder = hold(self, os.path.join(d, DIRECTORY_LOCK))
        error = self.assertRaises(InUseError, lock_directory, d)
        self.assertEqual(str(error), f"{d} is in use by another rmqha (pid {holder.pid})")
        self.assertEqual((error.directory, error.pid), (d, holder.pid))
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=60)
        fd = lock_directory(d)
        os.close(fd)

    def test_store_lock_names_the_holder(self) -> None:
        """
        A store's lock (C{STORE/lock}, RocketMQ's) is the same lock: a
        writable open while another process holds it names that process
        (perhaps a RocketMQ broker: "another process") and the lock file.
        """
        store = os.path.abspath(self.mktemp())
        os.makedirs(store)
        lock = os.path.join(store, "lock")
        holder = hold(self, lock)
        error = self.assertRaises(StoreLockedError, CommitLog.open, store, clock=fixed_clock)
        self.assertEqual(
            str(error),
            f"{store} is in use by another process (pid {holder.pid}; lock held on {lock})",
        )
        assert holder.stdin is not None
        holder.stdin.close()  # (it ends normally)
        holder.wait(timeout=60)
        CommitLog.open(store, clock=fixed_clock).close()
