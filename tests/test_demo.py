"""
Tests for L{rmqha.demo}: C{compare_stores} (commit logs and consume
queues), the demo's last checks, and what C{rmqha demo} may delete.  The
demo itself (producing and consuming through rmqha.client) runs as a
process in tests/integration/test_demo.py.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tempfile

from twisted.trial.unittest import SynchronousTestCase

from rmqha import demo
from rmqha.cli import main
from rmqha._locks import DIRECTORY_LOCK
from rmqha.demo import compare_stores

from tests.test_locks import hold


class CompareStoresTests(SynchronousTestCase):
    """
    The demo's final check really compares bytes.
    """

    def make(self, files: dict[str, bytes]) -> str:
        root = self.mktemp()
        os.makedirs(os.path.join(root, "commitlog"))
        for name, data in files.items():
            with open(os.path.join(root, "commitlog", name), "wb") as f:
                f.write(data)
        return root

    def test_identical(self) -> None:
        """
        Same names and bytes: identical, with the count of bytes compared.
        """
        files = {"0" * 20: b"a" * 3000000, "1".zfill(20): b"b" * 10}
        self.assertEqual(compare_stores(self.make(files), self.make(files)), (True, 2, 3000010))

    def test_one_byte_differs(self) -> None:
        """
        One byte different past the first MiB: not identical.
        """
        a = b"a" * 3000000
        b = a[:2000000] + b"x" + a[2000001:]
        identical, _, _ = compare_stores(self.make({"0" * 20: a}), self.make({"0" * 20: b}))
        self.assertFalse(identical)

    def test_different_files(self) -> None:
        """
        A segment missing on one side: not identical.
        """
        self.assertFalse(
            compare_stores(self.make({"0" * 20: b"a"}), self.make({}))[0]
        )


class CompareQueuesTests(SynchronousTestCase):
    """
    C{compare_stores(a, b, "consumequeue")} compares every queue file of
    every topic (the demo's check that master and slave built the same
    consume queues).
    """

    def make(self, files: dict[str, bytes]) -> str:
        root = self.mktemp()
        for name, data in files.items():
            path = os.path.join(root, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
        return root

    QUEUES = {
        "commitlog/" + "0" * 20: b"log",
        "consumequeue/TopicA/0/" + "0" * 20: b"\x01" * 40,
        "consumequeue/TopicA/3/" + "0" * 20: b"\x02" * 20,
        "consumequeue/TopicB/1/" + "6000000".zfill(20): b"\x03" * 60,
    }

    def test_identical(self) -> None:
        """
        The same queue files of several topics: identical, every file and
        byte counted (the commit log is not part of it).
        """
        self.assertEqual(
            compare_stores(self.make(self.QUEUES), self.make(self.QUEUES), "consumequeue"),
            (True, 3, 120),
        )

    def test_one_unit_differs(self) -> None:
        """
        One byte of one queue's unit different: not identical.
        """
        other = dict(self.QUEUES)
        other["consumequeue/TopicA/3/" + "0" * 20] = b"\x02" * 19 + b"\x09"
        self.assertFalse(compare_stores(self.make(self.QUEUES), self.make(other), "consumequeue")[0])

    def test_queue_missing(self) -> None:
        """
        A queue that one store has and the other has not: not identical.
        """
        other = dict(self.QUEUES)
        del other["consumequeue/TopicA/0/" + "0" * 20]
        self.assertFalse(compare_stores(self.make(self.QUEUES), self.make(other), "consumequeue")[0])


class ReportTests(SynchronousTestCase):
    """
    The demo's last checks (L{demo._report}): every message produced
    consumed exactly once, by id, and both the commit logs and the
    consume queues identical; any of them failing fails the demo.
    """

    def store(self, queue_unit: bytes = b"\x01" * 20, queues: bool = True) -> str:
        root = self.mktemp()
        files = {"commitlog/" + "0" * 20: b"records"}
        if queues:
            files["consumequeue/DemoOrders/0/" + "0" * 20] = queue_unit
        for name, data in files.items():
            path = os.path.join(root, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
        return root

    def tally(self, produced: list[str], consumed: dict[str, list[int]]) -> demo._Tally:
        """
        A tally of two members' handlers, fed as the consumers feed them:
        C{consumed} maps an id to the members that received it.
        """
        tally = demo._Tally(2)
        tally.produced.extend(produced)
        for message_id, members in consumed.items():
            for member in members:
                tally.handler(member)([FakeMessage(message_id)])  # type: ignore[list-item]
        return tally

    def report(self, master: str, slave: str, tally: demo._Tally) -> tuple[bool, str]:
        out = io.StringIO()
        return demo._report(master, slave, tally, out), out.getvalue()

    def test_all_hold(self) -> None:
        """
        Every message consumed once, by one member or the other, and
        identical stores: the demo succeeds, one line for each check.
        """
        ok, out = self.report(
            self.store(), self.store(), self.tally(["A", "B", "C"], {"A": [0], "B": [1], "C": [0]})
        )
        self.assertTrue(ok, out)
        self.assertEqual(
            out.splitlines(),
            [
                "consumed: 3 of the 3 messages produced (2, 1 by the 2 members); 0 missing, "
                "0 consumed twice or more (every one exactly once)",
                "byte-for-byte comparison: IDENTICAL (1 segment file, 0.0 MiB compared)",
                "consume queues: IDENTICAL on master and slave (1 queue file, 0.0 MiB compared)",
            ],
        )

    def test_queues_differ(self) -> None:
        """
        Identical commit logs but a consume queue unit that differs: the
        demo fails, saying so.
        """
        tally = self.tally(["A"], {"A": [0]})
        ok, out = self.report(self.store(), self.store(b"\x02" * 20), tally)
        self.assertFalse(ok)
        self.assertIn("byte-for-byte comparison: IDENTICAL", out)
        self.assertIn("consume queues: DIFFER on master and slave (1 queue file on the master)", out)

    def test_no_queues(self) -> None:
        """
        Stores without consume queues though messages were produced fail
        the check (the brokers built none): nothing was compared.  With
        no message produced (C{--count 0 --live 0}) there are none to
        compare.
        """
        ok, _ = self.report(self.store(queues=False), self.store(queues=False), self.tally([], {}))
        self.assertTrue(ok)
        tally = self.tally(["A"], {"A": [0]})
        ok, out = self.report(self.store(queues=False), self.store(queues=False), tally)
        self.assertFalse(ok)
        self.assertIn("consume queues: DIFFER on master and slave (0 queue files on the master)", out)

    def test_duplicates_counted_not_failed(self) -> None:
        """
        A message consumed by both members, none lost: counted and said,
        and the demo passes (delivery is at least once).
        """
        tally = self.tally(["A", "B"], {"A": [0, 1], "B": [1]})
        ok, out = self.report(self.store(), self.store(), tally)
        self.assertTrue(ok)
        self.assertIn("0 missing, 1 consumed twice or more (none lost; duplicates are", out)

    def test_missing_and_duplicates(self) -> None:
        """
        A message consumed by both members and one never consumed: the
        demo fails, counting each.
        """
        tally = self.tally(["A", "B", "C"], {"A": [0, 1], "B": [1], "X": [0]})
        ok, out = self.report(self.store(), self.store(), tally)
        self.assertFalse(ok)
        self.assertIn(
            "consumed: 2 of the 3 messages produced (2, 2 by the 2 members); 1 missing, "
            "1 consumed twice or more\n",
            out,
        )


class FakeMessage:
    """What the tally reads of an L{rmqha.client.ReceivedMessage}."""

    def __init__(self, msg_id: str) -> None:
        self.msg_id = msg_id


class DemoDirectoryTests(SynchronousTestCase):
    """
    C{rmqha demo} deletes only what it created (issue 12, item 3): the
    demo itself is replaced by a fake, so these run no reactor.
    """

    def setUp(self) -> None:
        self.runs: list[str] = []

        async def fake_demo(reactor, directory, count, live, out, segment_size):  # type: ignore[no-untyped-def]
            self.runs.append(directory)
            for name in ("master", "slave"):
                os.makedirs(os.path.join(directory, name, "commitlog"))
                for path in (
                    "lock", "abort", "checkpoint", "commitlog/" + "0" * 20, "rmqha/queue-offsets.json",
                    "consumequeue/DemoAudit/3/" + "0" * 20, "config/topics.json", "config/topics.json.bak",
                ):
                    full = os.path.join(directory, name, path)
                    os.makedirs(os.path.dirname(full), exist_ok=True)
                    with open(full, "w") as f:
                        f.write("x")
            return 0

        def fake_react(main):  # type: ignore[no-untyped-def]
            main(None)

        self.patch(demo, "_demo", fake_demo)
        self.patch(demo, "react", fake_react)

    def run_cli(self, *argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        status = main(["demo", *argv], stdout=out, stderr=err)
        return status, out.getvalue(), err.getvalue()

    def test_refuses_a_directory_with_other_files(self) -> None:
        """
        C{--dir} naming a non-empty directory an earlier demo did not make
        (no marker file) is refused with one line naming it, exit 2, and
        the user's file is untouched (it used to be deleted with the
        directory).
        """
        d = self.mktemp()
        os.makedirs(d)
        with open(os.path.join(d, "notes.txt"), "w") as f:
            f.write("mine")
        status, _, err = self.run_cli("--dir", d)
        self.assertEqual(status, 2)
        self.assertEqual(err.count("\n"), 1, err)
        self.assertIn(f"--dir {d} is not empty", err)
        self.assertEqual(os.listdir(d), ["notes.txt"])
        self.assertEqual(self.runs, [])

    def test_refuses_a_file(self) -> None:
        """
        C{--dir} naming a file: one line, exit 2, the file kept.
        """
        path = self.mktemp()
        with open(path, "w") as f:
            f.write("mine")
        status, _, err = self.run_cli("--dir", path)
        self.assertEqual(status, 2)
        self.assertIn("is not a directory", err)
        with open(path) as f:
            self.assertEqual(f.read(), "mine")

    def test_new_directory_is_marked_and_kept(self) -> None:
        """
        A new C{--dir} is created, marked as the demo's, and kept with its
        stores afterwards.
        """
        d = self.mktemp()
        status, _, err = self.run_cli("--dir", d)
        self.assertEqual((status, err), (0, ""))
        self.assertEqual(
            sorted(os.listdir(d)), [demo.MARKER, DIRECTORY_LOCK, "master", "slave"]
        )

    def test_rerun_replaces_only_the_stores(self) -> None:
        """
        In a directory an earlier demo made, a re-run replaces the two
        stores and leaves anything else there alone.
        """
        d = self.mktemp()
        self.assertEqual(self.run_cli("--dir", d)[0], 0)
        with open(os.path.join(d, "notes.txt"), "w") as f:
            f.write("mine")
        stale = os.path.join(d, "master", "commitlog", "1".zfill(20))
        with open(stale, "w") as f:
            f.write("old segment")
        status, _, err = self.run_cli("--dir", d)
        self.assertEqual((status, err), (0, ""))
        self.assertFalse(os.path.exists(stale))
        self.assertEqual(
            sorted(os.listdir(d)),
            [demo.MARKER, DIRECTORY_LOCK, "master", "notes.txt", "slave"],
        )
        self.assertEqual(self.runs, [d, d])

    def test_rerun_refuses_foreign_files_in_a_store(self) -> None:
        """
        A file in an earlier demo's store that no store writes stops the
        re-run before anything is deleted: one line naming it, exit 2.
        """
        d = self.mktemp()
        self.assertEqual(self.run_cli("--dir", d)[0], 0)
        foreign = os.path.join(d, "slave", "keep-me.txt")
        with open(foreign, "w") as f:
            f.write("mine")
        before = sorted(os.listdir(os.path.join(d, "master", "commitlog")))
        status, _, err = self.run_cli("--dir", d)
        self.assertEqual(status, 2)
        self.assertEqual(err.count("\n"), 1, err)
        self.assertIn(foreign, err)
        self.assertTrue(os.path.exists(foreign))
        self.assertEqual(sorted(os.listdir(os.path.join(d, "master", "commitlog"))), before)

    def tree(self, d: str) -> dict[str, bytes]:
        found = {}
        for parent, _, names in os.walk(d):
            for name in names:
                with open(os.path.join(parent, name), "rb") as f:
                    found[os.path.relpath(os.path.join(parent, name), d)] = f.read()
        return found

    def test_second_demo_refused_touching_nothing(self) -> None:
        """
        While another process runs a demo in C{--dir D} (holds D's lock),
        a second refuses in one line naming D and the first's pid, exit 1,
        before it deletes or writes anything (it used to delete the first
        one's live stores); once the first ends, even killed, D is free.
        """
        d = os.path.abspath(self.mktemp())
        self.assertEqual(self.run_cli("--dir", d)[0], 0)
        before = self.tree(d)
        first = hold(self, os.path.join(d, DIRECTORY_LOCK))
        status, out, err = self.run_cli("--dir", d)
        self.assertEqual(
            (status, out, err),
            (1, "", f"rmqha: error: {d} is in use by another rmqha (pid {first.pid})\n"),
        )
        self.assertEqual(self.tree(d), before)
        self.assertEqual(self.runs, [d])
        first.kill()
        first.wait(timeout=60)
        self.assertEqual(self.run_cli("--dir", d)[0], 0)
        self.assertEqual(self.runs, [d, d])

    def test_directory_locked_for_the_whole_run(self) -> None:
        """
        The demo holds its C{--dir}'s lock while it runs (another process
        is refused, naming this one) and lets it go at the end.
        """
        seen: list[str] = []
        fake = demo._demo

        async def probing(reactor, directory, *rest):  # type: ignore[no-untyped-def]
            seen.append(self.try_lock(directory))
            return await fake(reactor, directory, *rest)

        self.patch(demo, "_demo", probing)
        d = os.path.abspath(self.mktemp())
        self.assertEqual(self.run_cli("--dir", d)[0], 0)
        self.assertEqual(seen, [f"{d} is in use by another rmqha (pid {os.getpid()})"])
        self.assertEqual(self.try_lock(d), "free")

    def try_lock(self, d: str) -> str:
        """
        What another process taking C{d}'s lock meets.
        """
        script = (
            "import sys\n"
            "from rmqha._locks import InUseError, lock_directory\n"
            "try:\n"
            "    lock_directory(sys.argv[1])\n"
            "    print('free')\n"
            "except InUseError as e:\n"
            "    print(e)\n"
        )
        env = dict(os.environ)
        env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(demo.__file__)))
        done = subprocess.run(
            [sys.executable, "-c", script, d], env=env, capture_output=True, text=True,
            timeout=60, check=True,
        )
        return done.stdout.strip()

    def test_no_dir_uses_a_temporary_directory_it_removes(self) -> None:
        """
        Without C{--dir} the demo works in a new temporary directory (not
        the working directory) and removes it at the end.
        """
        scratch = os.path.abspath(self.mktemp())
        os.makedirs(scratch)
        self.patch(tempfile, "tempdir", scratch)
        status, out, err = self.run_cli()
        self.assertEqual((status, err), (0, ""))
        (where,) = self.runs
        self.assertEqual(os.path.dirname(where), scratch)
        self.assertIn(where, out)
        self.assertEqual(os.listdir(scratch), [])

    def test_bad_segment_size(self) -> None:
        """
        A segment size the demo cannot use is one line, exit 2, before
        anything is created.
        """
        d = self.mktemp()
        status, _, err = self.run_cli("--dir", d, "--segment-size", "1k")
        self.assertEqual(status, 2)
        self.assertIn("--segment-size 1024", err)
        self.assertFalse(os.path.exists(d))
