"""
Tests for the C{rmqha} command (L{rmqha.cli}), run in-process.
"""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys

from twisted.trial.unittest import SynchronousTestCase

from rmqha._record import Message
from rmqha.cli import main
from rmqha.commitlog import CommitLog

SEGMENT = 4096


class CLITests(SynchronousTestCase):
    """
    C{rmqha store ...} subcommands.
    """

    def run_cli(self, *argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        status = main(list(argv), stdout=out, stderr=err)
        return status, out.getvalue(), err.getvalue()

    def make_store(self, count: int = 10, body: bytes = b"b" * 200) -> tuple[str, int]:
        """
        A store of C{count} identical-size messages; returns it and the
        record size (computed from the record layout: 91 fixed bytes).
        """
        store = self.mktemp()
        with CommitLog.open(store, segment_size=SEGMENT, clock=lambda: 1700000000.0) as log:
            for i in range(count):
                log.put(Message("TopicA" if i % 2 else "TopicB", body, queue_id=i % 2))
        return store, 91 + len(body) + len("TopicA")

    def assertOneLineError(self, err: str, *needles: str) -> None:
        self.assertEqual(err.count("\n"), 1, err)
        self.assertTrue(err.startswith("rmqha"), err)
        self.assertNotIn("Traceback", err)
        for needle in needles:
            self.assertIn(needle, err)

    def test_fill_then_info_json(self) -> None:
        """
        C{store fill} appends exactly C{--count} messages over the topics;
        C{store info --json} reports them with the documented keys.
        """
        store = self.mktemp()
        status, out, err = self.run_cli(
            "store", "fill", store, "--count", "30", "--body-size", "300",
            "--topics", "a,b,c", "--segment-size", "8k",
        )
        self.assertEqual((status, err), (0, ""))
        self.assertIn("appended 30 messages", out)
        status, out, err = self.run_cli("store", "info", store, "--json")
        self.assertEqual(status, 0)
        info = json.loads(out)
        self.assertEqual(info["messages"], 30)
        self.assertEqual(info["topics"], {"a": 10, "b": 10, "c": 10})
        self.assertEqual(info["min_offset"], 0)
        self.assertEqual(info["segment_size"], 8192)
        self.assertEqual(
            info["max_offset"],
            sum(s["bytes"] for s in info["segments"]),
        )
        self.assertGreater(len(info["segments"]), 1)
        self.assertTrue(info["clean_shutdown"])

    def test_info_text(self) -> None:
        """
        Without C{--json}, info lists segments, offsets and topic counts.
        """
        store, size = self.make_store(count=4)
        status, out, _ = self.run_cli("store", "info", store)
        self.assertEqual(status, 0)
        self.assertIn("00000000000000000000", out)
        self.assertIn(f"max offset     {4 * size}", out)
        self.assertIn("messages       4", out)
        self.assertRegex(out, r"TopicA\s+2")

    def test_check_sound(self) -> None:
        """
        A sound store: exit 0 and the record count.
        """
        store, _ = self.make_store()
        status, out, _ = self.run_cli("store", "check", store)
        self.assertEqual(status, 0)
        self.assertIn("sound: 10 records", out)

    def test_check_flipped_body_byte(self) -> None:
        """
        A flipped body byte in the third record: exit 1, naming that
        record's offset and the CRC mismatch.
        """
        store, size = self.make_store()
        path = os.path.join(store, "commitlog", "0" * 20)
        with open(path, "r+b") as f:
            f.seek(2 * size + 100)
            byte = f.read(1)
            f.seek(2 * size + 100)
            f.write(bytes([byte[0] ^ 0x01]))
        status, out, _ = self.run_cli("store", "check", store)
        self.assertEqual(status, 1)
        self.assertIn(f"bad record at offset {2 * size}", out)
        self.assertIn("CRC", out)

    def test_check_unfinished_segment(self) -> None:
        """
        An empty next segment file (its creation was interrupted) is noted,
        and the store is still sound.
        """
        store, _ = self.make_store(count=3)
        name = f"{SEGMENT:020d}"
        with open(os.path.join(store, "commitlog", name), "wb"):
            pass
        status, out, _ = self.run_cli("store", "check", store)
        self.assertEqual(status, 0)
        self.assertIn(f"note: segment file {name} was never finished", out)
        self.assertIn("sound: 3 records in 1 segments", out)

    def test_check_garbage_after_end(self) -> None:
        """
        Non-zero bytes after the last record (a torn tail) fail the check.
        """
        store, size = self.make_store(count=3)
        path = os.path.join(store, "commitlog", "0" * 20)
        with open(path, "r+b") as f:
            f.seek(3 * size + 50)
            f.write(b"\x07")
        status, out, _ = self.run_cli("store", "check", store)
        self.assertEqual(status, 1)
        self.assertIn(f"offset {3 * size}", out)

    def test_dump(self) -> None:
        """
        C{store dump} prints one JSON object per record with the body in
        base64; C{--from} starts at a record boundary, C{--limit} stops.
        """
        store, size = self.make_store(count=5, body=b"hello" * 40)
        status, out, _ = self.run_cli("store", "dump", store, "--from", str(size), "--limit", "2")
        self.assertEqual(status, 0)
        lines = [json.loads(line) for line in out.splitlines()]
        self.assertEqual([r["offset"] for r in lines], [size, 2 * size])
        self.assertEqual(base64.b64decode(lines[0]["body"]), b"hello" * 40)
        self.assertEqual(lines[0]["topic"], "TopicA")
        self.assertEqual(lines[0]["store_timestamp"], 1700000000000)
        self.assertTrue(lines[0]["crc_ok"])

    def test_dump_from_mid_record(self) -> None:
        """
        C{--from} inside a record is a one-line error.
        """
        store, _ = self.make_store()
        status, out, err = self.run_cli("store", "dump", store, "--from", "5")
        self.assertEqual(status, 1)
        self.assertOneLineError(err, "--from 5", "not the start of a record")

    def test_errors_are_one_line(self) -> None:
        """
        Unreadable stores and bad arguments: one line on stderr, non-zero
        exit, no traceback.
        """
        store, _ = self.make_store()
        with open(os.path.join(store, "commitlog", "junk.txt"), "w") as f:
            f.write("x")
        cases = [
            (("store", "info", self.mktemp()), 1, "no such directory"),
            (("store", "check", self.mktemp()), 1, "no such directory"),
            (("store", "info", store), 1, "junk.txt"),
            (("store", "fill", self.mktemp(), "--count", "x", "--body-size", "1"), 2, "--count"),
            (("store", "fill", self.mktemp(), "--count", "1", "--body-size", "1q"), 2, "--body-size"),
            (("store", "fill", self.mktemp(), "--count", "1", "--body-size", "5m"), 1, "maxMessageSize"),
            (("store", "fill", self.mktemp(), "--count", "1", "--body-size", "1", "--topics", "bad topic"), 1, "bad topic"),
            (("store", "dump", store, "--limit", "-1"), 2, "--limit"),
            (("store", "frobnicate"), 2, "frobnicate"),
        ]
        for argv, expected, needle in cases:
            status, _, err = self.run_cli(*argv)
            self.assertEqual(status, expected, argv)
            self.assertOneLineError(err, needle)

    def test_read_only(self) -> None:
        """
        info, check and dump leave a store's files untouched (no lock, no
        abort marker, no rmqha/ directory).
        """
        store, _ = self.make_store()
        before = sorted(os.listdir(store))
        self.assertNotIn("abort", before)
        for action in ("info", "check", "dump"):
            self.run_cli("store", action, store)
        self.assertEqual(sorted(os.listdir(store)), before)

    def test_module_entry_point(self) -> None:
        """
        C{python -m rmqha} is the same command (one real process).
        """
        result = subprocess.run(
            [sys.executable, "-m", "rmqha", "store", "info", self.mktemp()],
            capture_output=True, text=True, timeout=60,
        )
        self.assertEqual(result.returncode, 1)
        self.assertIn("no such directory", result.stderr)


class CertsInitTests(SynchronousTestCase):
    """
    C{rmqha certs init}.
    """

    def run_cli(self, *argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        status = main(list(argv), stdout=out, stderr=err)
        return status, out.getvalue(), err.getvalue()

    def test_writes_a_usable_set(self) -> None:
        """
        A CA, the master's pair (for its name, localhost and loopback
        addresses) and one pair per slave; keys are private (0600); the
        printed command lines use them.
        """
        from cryptography import x509

        from rmqha.tls import PeerPolicy, TLSFiles, certificate_names, server_context

        d = self.mktemp()
        status, out, err = self.run_cli(
            "certs", "init", d, "--master-name", "broker-a", "--slave-names", "s1,s2"
        )
        self.assertEqual((status, err), (0, ""))
        self.assertEqual(
            sorted(os.listdir(d)),
            ["ca.key", "ca.pem", "master.key", "master.pem",
             "slave-s1.key", "slave-s1.pem", "slave-s2.key", "slave-s2.pem"],
        )
        for name in os.listdir(d):
            mode = os.stat(os.path.join(d, name)).st_mode & 0o777
            self.assertEqual(mode, 0o600 if name.endswith(".key") else 0o644 & ~_umask(), name)
        files = TLSFiles(f"{d}/master.pem", f"{d}/master.key", f"{d}/ca.pem")
        server_context(files, PeerPolicy(True, frozenset({"s1"})))
        with open(f"{d}/master.pem", "rb") as f:
            master = x509.load_pem_x509_certificate(f.read())
        self.assertEqual(certificate_names(master), ["broker-a", "localhost"])
        with open(f"{d}/slave-s2.pem", "rb") as f:
            slave = x509.load_pem_x509_certificate(f.read())
        self.assertEqual(certificate_names(slave), ["s2"])
        # Every broker serves (HA or admin port) and dials: both usages.
        from cryptography.x509.oid import ExtendedKeyUsageOID as EKU

        for certificate in (master, slave):
            self.assertEqual(
                set(certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value),
                {EKU.SERVER_AUTH, EKU.CLIENT_AUTH},
            )
        self.assertIn("--tls-allowed-peers s1,s2", out)
        self.assertIn(f"--tls-cert {d}/slave-s1.pem", out)

    def test_refuses_to_overwrite_and_bad_names(self) -> None:
        """
        An existing set is never overwritten; bad or repeated names are
        refused; each is one error line, exit status 1.
        """
        d = self.mktemp()
        self.assertEqual(self.run_cli("certs", "init", d)[0], 0)
        with open(f"{d}/ca.pem", "rb") as f:
            before = f.read()
        status, _, err = self.run_cli("certs", "init", d)
        self.assertEqual(status, 1)
        self.assertIn("exist; not overwriting", err)
        self.assertIn(f"{d}/ca.pem", err)
        with open(f"{d}/ca.pem", "rb") as f:
            self.assertEqual(f.read(), before)
        for argv, needle in [
            (("--slave-names", "a,a"), "must all differ"),
            (("--slave-names", "a/b"), "'a/b' is not a usable certificate name"),
            (("--master-name", "x", "--slave-names", "x"), "must all differ"),
        ]:
            status, _, err = self.run_cli("certs", "init", self.mktemp(), *argv)
            self.assertEqual(status, 1, argv)
            self.assertIn(needle, err, argv)
            self.assertEqual(err.count("\n"), 1)

    def test_names_every_existing_file(self) -> None:
        """
        When some files of the set exist, the one error line names each of
        them, and nothing is written or changed.
        """
        d = self.mktemp()
        os.makedirs(d)
        for name in ("master.key", "slave-s2.pem"):
            with open(os.path.join(d, name), "w") as f:
                f.write("mine")
        status, _, err = self.run_cli("certs", "init", d, "--slave-names", "s1,s2")
        self.assertEqual(status, 1)
        self.assertEqual(err.count("\n"), 1, err)
        self.assertIn(f"{d}/master.key, {d}/slave-s2.pem exist; not overwriting", err)
        self.assertEqual(sorted(os.listdir(d)), ["master.key", "slave-s2.pem"])
        with open(os.path.join(d, "master.key")) as f:
            self.assertEqual(f.read(), "mine")

    def test_failure_leaves_nothing_behind(self) -> None:
        """
        A failure half-way through (here, issuing the slave's certificate)
        removes the files this run wrote and the directory it created, so
        the retry succeeds.
        """
        from rmqha import certs

        d = self.mktemp()
        real_issue = certs.issue

        def failing_issue(ca, name, *args, **kwargs):  # type: ignore[no-untyped-def]
            if name == "slave":
                raise OSError(28, "No space left on device", d)
            return real_issue(ca, name, *args, **kwargs)

        self.patch(certs, "issue", failing_issue)
        status, _, err = self.run_cli("certs", "init", d)
        self.assertEqual(status, 1)
        self.assertIn("No space left on device", err)
        self.assertFalse(os.path.exists(d))
        self.patch(certs, "issue", real_issue)
        self.assertEqual(self.run_cli("certs", "init", d)[0], 0)

    def test_write_pair_never_overwrites(self) -> None:
        """
        L{certs.write_pair} creates new files only: an existing key is
        left as it was (FileExistsError), and no certificate is written
        beside it.
        """
        from rmqha import certs

        d = self.mktemp()
        os.makedirs(d)
        with open(os.path.join(d, "x.key"), "w") as f:
            f.write("mine")
        self.assertRaises(FileExistsError, certs.write_pair, certs.make_ca(), d, "x")
        self.assertEqual(os.listdir(d), ["x.key"])
        with open(os.path.join(d, "x.key")) as f:
            self.assertEqual(f.read(), "mine")

    def test_printed_commands_run_side_by_side(self) -> None:
        """
        The printed master and slave command lines parse as twistd command
        lines, and can run from one directory: different stores, different
        pidfiles (not both twistd.pid), the HA port bound to loopback.
        """
        import shlex

        from twisted.scripts.twistd import ServerOptions

        d = self.mktemp()
        status, out, _ = self.run_cli("certs", "init", d, "--slave-names", "s1")
        self.assertEqual(status, 0)
        parsed = {}
        for line in out.splitlines():
            if "twistd" in line:
                role, command = line.split(":", 1)
                argv = shlex.split(command)
                self.assertEqual(argv[:2], ["twistd", "-n"])
                options = ServerOptions()
                options.parseOptions(argv[2:])
                self.assertEqual(options.subCommand, "rmqha")
                parsed[role] = options
        master, slave = parsed["master"], parsed["slave"]
        self.assertNotEqual(master["pidfile"], slave["pidfile"])
        self.assertNotEqual(os.path.basename(master["pidfile"]), "twistd.pid")
        self.assertNotEqual(
            master.subOptions.settings["store-dir"], slave.subOptions.settings["store-dir"]
        )
        self.assertEqual(
            master.subOptions.settings["ha-listen"], "ssl:10912:interface=127.0.0.1"
        )


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
