"""
L{rmqha._files.write_atomically}: the one way small store files are
replaced.
"""

from __future__ import annotations

import os

from twisted.trial.unittest import SynchronousTestCase

from rmqha._files import write_atomically


class WriteAtomicallyTests(SynchronousTestCase):
    def test_replaces_and_creates_directory(self) -> None:
        """
        The file gets what was written, in a directory created for it; no
        temporary file stays.
        """
        path = os.path.join(self.mktemp(), "rmqha", "x.json")
        write_atomically(path, lambda f: f.write("one"))
        write_atomically(path, lambda f: f.write("two"))
        with open(path) as f:
            self.assertEqual(f.read(), "two")
        self.assertEqual(os.listdir(os.path.dirname(path)), ["x.json"])

    def test_failure_keeps_the_old_file(self) -> None:
        """
        A write that fails half-way (a full disk) leaves the old content
        and no temporary file, and the error reaches the caller.
        """
        path = os.path.join(self.mktemp(), "x.json")
        write_atomically(path, lambda f: f.write("old"))

        def half(f: object) -> None:
            f.write("ne")  # type: ignore[attr-defined]
            raise OSError(28, "No space left on device")

        self.assertRaises(OSError, write_atomically, path, half)
        with open(path) as f:
            self.assertEqual(f.read(), "old")
        self.assertEqual(os.listdir(os.path.dirname(path)), ["x.json"])

    def test_directory_is_synced(self) -> None:
        """
        After the rename the directory itself is fsynced: a rename is
        durable only once its directory entry is (failover's epoch file
        relies on it, docs/failover.md).
        """
        import stat

        synced: list[bool] = []
        real = os.fsync

        def fsync(fd: int) -> None:
            synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
            real(fd)

        self.patch(os, "fsync", fsync)
        write_atomically(os.path.join(self.mktemp(), "x.json"), lambda f: f.write("one"))
        self.assertEqual(synced, [False, True])
