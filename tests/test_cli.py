"""
Tests for the C{rmqha} command (L{rmqha.cli}), run in-process.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import sys
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from rmqha.store._record import Message
from rmqha.cli import main
from rmqha.store.commitlog import CommitLog

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

    def test_info_on_damage_in_an_old_segment(self) -> None:
        """
        Damage older than the segments recovery walks does not make
        C{store info} fail: it reports the corruption and the messages
        before it.
        """
        store, size = self.make_store(count=60)
        path = os.path.join(store, "commitlog", "0" * 20)
        with open(path, "r+b") as f:
            f.seek(2 * size + 5)  # the magic code
            f.write(b"\x00")
        status, out, err = self.run_cli("store", "info", store, "--json")
        self.assertEqual((status, err), (0, ""))
        info = json.loads(out)
        self.assertIn(f"bad record at offset {2 * size}", info["corruption"])
        self.assertEqual(info["messages"], 2)

    def test_check_sound(self) -> None:
        """
        A sound store: exit 0 and the record count.
        """
        store, _ = self.make_store()
        status, out, _ = self.run_cli("store", "check", store)
        self.assertEqual(status, 0)
        self.assertIn("sound: 10 records", out)

    def test_check_consume_queues(self) -> None:
        """
        C{store check} verifies the consume queues against the log: a unit
        with the wrong size is one line naming its file and unit (exit 1);
        sound queues are said so.
        """
        store, _ = self.make_store()
        status, out, _ = self.run_cli("store", "check", store)
        self.assertEqual(status, 0)
        self.assertIn("note: no consume queues (consumequeue/)", out)
        with CommitLog.open(store, consume_queues=True):
            pass  # (builds them, as a broker's open does)
        status, out, _ = self.run_cli("store", "check", store)
        self.assertEqual(status, 0)
        self.assertIn("consume queues: every unit matches its record", out)
        queue = os.path.join(store, "consumequeue", "TopicA", "1", "0" * 20)
        with open(queue, "r+b") as f:
            f.seek(20 + 8)
            f.write(b"\x00\x00\x00\x07")
        status, out, _ = self.run_cli("store", "check", store)
        self.assertEqual(status, 1)
        self.assertIn(f"{queue} unit 1 (queue offset 1): size 7, but the record", out)
        self.assertIn("1 consume-queue finding(s)", out)

    def test_check_unreadable_consume_queues(self) -> None:
        """
        A queue that cannot be read (its directory a file, a queue file a
        directory) is one finding naming the path and why, after the log's
        report, with exit 1; the other queues are checked as before.  A
        queue missing its units reports ten of them and counts the rest.
        """
        from rmqha.store.consumequeue import PER_QUEUE_FINDINGS

        store, _ = self.make_store(count=60)
        with CommitLog.open(store, consume_queues=True):
            pass
        b0 = os.path.join(store, "consumequeue", "TopicB", "0")
        shutil.rmtree(b0)
        with open(b0, "wb") as f:
            f.write(b"junk")
        a1 = os.path.join(store, "consumequeue", "TopicA", "1", "0" * 20)
        os.remove(a1)
        os.mkdir(a1)
        status, out, err = self.run_cli("store", "check", store)
        self.assertEqual((status, err), (1, ""))
        lines = out.splitlines()
        self.assertTrue(lines[0].startswith("sound: 60 records"), out)
        self.assertIn(f"{b0}: Not a directory: unreadable; the units of TopicB queue 0 are not checked", lines)
        self.assertIn(f"{a1}: Is a directory: unreadable; the units of TopicA queue 1 are not checked", lines)
        self.assertIn("2 consume-queue finding(s)", out)
        shutil.rmtree(a1)  # (queue 1 of TopicA: 30 records without units)
        status, out, err = self.run_cli("store", "check", store)
        self.assertEqual(status, 1)
        missing = [line for line in out.splitlines() if "(TopicA, queue 1," in line and "has no unit" in line]
        self.assertEqual(len(missing), PER_QUEUE_FINDINGS)
        self.assertIn(
            f"... and {30 - PER_QUEUE_FINDINGS} more finding(s) in TopicA queue 1 "
            f"({os.path.dirname(a1)})",
            out,
        )

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
        self.assertNotIn("sound", out)

    def test_check_names_valid_data_after_damage(self) -> None:
        """
        A bad record with valid records after it is damage, not a torn
        tail: check says where the valid records are, how many bytes, and
        points at C{rmqha store repair}; it keeps going and lists later
        damage too.
        """
        store, size = self.make_store()
        path = os.path.join(store, "commitlog", "0" * 20)
        for record in (2, 6):
            with open(path, "r+b") as f:
                f.seek(record * size + 100)
                f.write(b"\xff")
        status, out, _ = self.run_cli("store", "check", store)
        self.assertEqual(status, 1)
        self.assertIn(
            f"bad record at offset {2 * size} in segment {'0' * 20}: body CRC "
            f"mismatch", out,
        )
        self.assertIn(
            f"valid records follow at offset {3 * size} ({3 * size} bytes, up to "
            f"offset {6 * size})", out,
        )
        self.assertIn(f"bad record at offset {6 * size}", out)
        self.assertIn(f"rmqha store repair {store} --from REPLICA_DIR", out)

    def test_check_incomplete_tail_of_live_slave(self) -> None:
        """
        A live slave's store whose last record is still arriving (its first
        bytes written, zeros after): check notes "incomplete tail at X
        (still being written)" and is not an error.
        """
        source, size = self.make_store(count=3)
        with CommitLog.open(source, read_only=True) as log:
            data = log.read(0, 3 * size)
        slave = self.mktemp()
        with CommitLog.open(slave, segment_size=SEGMENT) as log:
            log.append_at(0, data[: 2 * size + 120])
            status, out, _ = self.run_cli("store", "check", slave)
        self.assertEqual(status, 0, out)
        self.assertIn(f"incomplete tail at {2 * size} (still being written)", out)
        self.assertIn("sound: 2 records", out)

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


class RepairTests(SynchronousTestCase):
    """
    C{rmqha store repair DIR --from REPLICA_DIR}.
    """

    run_cli = CLITests.run_cli

    def setUp(self) -> None:
        # 30 records of 297 bytes: three segments (13 per 4 KiB segment).
        self.store, self.size = CLITests.make_store(self, count=30)  # type: ignore[arg-type]
        self.replica = self.mktemp()
        shutil.copytree(self.store, self.replica)

    def flip(self, store: str, offset: int) -> None:
        start = offset - offset % SEGMENT
        with open(os.path.join(store, "commitlog", f"{start:020d}"), "r+b") as f:
            f.seek(offset - start)
            byte = f.read(1)
            f.seek(offset - start)
            f.write(bytes([byte[0] ^ 0x5A]))

    def commitlog(self, store: str) -> dict[str, bytes]:
        directory = os.path.join(store, "commitlog")
        files = {}
        for name in sorted(os.listdir(directory)):
            with open(os.path.join(directory, name), "rb") as f:
                files[name] = f.read()
        return files

    def test_repair_from_good_replica(self) -> None:
        """
        Damaged records in an old segment and a later one are replaced by
        the replica's verified copies: exit 0, one line per repair, the
        store checks sound and is byte-identical to the replica, and the
        damaged bytes are kept in quarantine.
        """
        bad = [2 * self.size + 100, SEGMENT + 3 * self.size + 150]
        for offset in bad:
            self.flip(self.store, offset)
        damaged = self.commitlog(self.store)
        status, out, err = self.run_cli("store", "repair", self.store, "--from", self.replica)
        self.assertEqual((status, err), (0, ""), out)
        starts = [2 * self.size, SEGMENT + 3 * self.size]
        for start in starts:
            self.assertIn(
                f"repaired offsets {start}..{start + self.size} (body CRC mismatch", out
            )
        self.assertEqual(out.count("\n"), 2)
        self.assertEqual(self.commitlog(self.store), self.commitlog(self.replica))
        status, out, _ = self.run_cli("store", "check", self.store)
        self.assertEqual(status, 0)
        quarantine = os.path.join(self.store, "rmqha", "quarantine")
        kept = sorted(n for n in os.listdir(quarantine) if n.endswith(".bin"))
        self.assertEqual(len(kept), 2)
        with open(os.path.join(quarantine, kept[0]), "rb") as f:
            self.assertEqual(f.read(), damaged["0" * 20][starts[0] : starts[0] + self.size])

    def test_repair_across_a_blank(self) -> None:
        """
        A hole of zeros from inside a segment's last record through its
        BLANK filler (valid records in the next segment) is repaired with
        the replica's record and BLANK: byte-identical, sound.
        """
        path = os.path.join(self.store, "commitlog", "0" * 20)
        last = 12 * self.size
        with open(path, "r+b") as f:
            f.seek(last + 50)
            f.write(bytes(SEGMENT - last - 50))
        status, out, _ = self.run_cli("store", "repair", self.store, "--from", self.replica)
        self.assertEqual(status, 0, out)
        self.assertIn(f"repaired offsets {last}..{SEGMENT} ", out)
        self.assertIn("with 2 record(s)", out)
        self.assertEqual(self.commitlog(self.store), self.commitlog(self.replica))
        self.assertEqual(self.run_cli("store", "check", self.store)[0], 0)

    def test_repair_torn_tail(self) -> None:
        """
        A torn last record (nothing valid after it) is repaired from the
        replica's whole copy too.
        """
        with CommitLog.open(self.store, read_only=True) as log:
            last = [r.offset for r in log.records()][-1]
        start = last - last % SEGMENT
        with open(os.path.join(self.store, "commitlog", f"{start:020d}"), "r+b") as f:
            f.seek(last - start + 120)
            f.write(bytes(100))
        status, out, _ = self.run_cli("store", "repair", self.store, "--from", self.replica)
        self.assertEqual(status, 0, out)
        self.assertIn(f"repaired offsets {last}..{last + self.size} ", out)
        self.assertEqual(self.commitlog(self.store), self.commitlog(self.replica))

    def test_dry_run(self) -> None:
        """
        C{--dry-run} says what would be repaired and writes nothing.
        """
        self.flip(self.store, 2 * self.size + 100)
        before = self.commitlog(self.store)
        status, out, _ = self.run_cli(
            "store", "repair", self.store, "--from", self.replica, "--dry-run"
        )
        self.assertEqual(status, 0, out)
        self.assertIn(f"would repair offsets {2 * self.size}..{3 * self.size}", out)
        self.assertEqual(self.commitlog(self.store), before)
        self.assertFalse(os.path.exists(os.path.join(self.store, "rmqha", "quarantine")))

    def test_replica_damaged_there_too(self) -> None:
        """
        When the replica's record at the damaged offset fails its own
        checks, that record is not repaired (exit 1, saying why) and the
        store is left as it was.
        """
        self.flip(self.store, 2 * self.size + 100)
        self.flip(self.replica, 2 * self.size + 120)
        before = self.commitlog(self.store)
        status, out, _ = self.run_cli("store", "repair", self.store, "--from", self.replica)
        self.assertEqual(status, 1, out)
        self.assertIn(
            f"cannot repair offset {2 * self.size} (body CRC mismatch", out
        )
        self.assertIn(f"the replica's record at offset {2 * self.size} is bad too", out)
        self.assertEqual(self.commitlog(self.store), before)

    def test_replica_of_another_log(self) -> None:
        """
        A "replica" whose record is valid at the damaged offset but whose
        records around it differ is another log: refused.
        """
        other, _ = CLITests.make_store(self, count=30, body=b"c" * 200)  # type: ignore[arg-type]
        self.flip(self.store, 2 * self.size + 100)
        before = self.commitlog(self.store)
        status, out, _ = self.run_cli("store", "repair", self.store, "--from", other)
        self.assertEqual(status, 1, out)
        self.assertIn("differs in the replica", out)
        self.assertEqual(self.commitlog(self.store), before)

    def test_nothing_to_repair(self) -> None:
        """
        A sound store: exit 0, nothing written.
        """
        status, out, _ = self.run_cli("store", "repair", self.store, "--from", self.replica)
        self.assertEqual(status, 0)
        self.assertIn("nothing to repair", out)

    def test_refuses_open_store(self) -> None:
        """
        A store another process holds open (its lock taken, as a running
        broker does) is not touched: one-line error, exit 1.
        """
        self.flip(self.store, 2 * self.size + 100)
        holder = subprocess.Popen(
            [sys.executable, "-c",
             "import fcntl, os, sys\n"
             "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
             "fcntl.lockf(fd, fcntl.LOCK_EX)\n"
             "print('locked', flush=True)\n"
             "sys.stdin.read()\n",
             os.path.join(self.store, "lock")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        try:
            assert holder.stdout is not None
            self.assertEqual(holder.stdout.readline(), "locked\n")
            before = self.commitlog(self.store)
            status, _, err = self.run_cli("store", "repair", self.store, "--from", self.replica)
        finally:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait(timeout=60)
            holder.stdout.close()  # type: ignore[union-attr]
        self.assertEqual(status, 1)
        CLITests.assertOneLineError(self, err, "in use by another process")  # type: ignore[arg-type]
        self.assertEqual(self.commitlog(self.store), before)

    def test_usage(self) -> None:
        """
        Bad usage exits 2: no C{--from}, or C{--from} naming the store
        itself.
        """
        for argv in (
            ("store", "repair", self.store),
            ("store", "repair", self.store, "--from", self.store),
        ):
            status, _, err = self.run_cli(*argv)
            self.assertEqual(status, 2, argv)
            CLITests.assertOneLineError(self, err, "--from")  # type: ignore[arg-type]


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
            master.subOptions.settings.store_dir, slave.subOptions.settings.store_dir
        )
        self.assertEqual(
            master.subOptions.settings.ha_listen, "ssl:10912:interface=127.0.0.1"
        )


class CertsIssueTests(SynchronousTestCase):
    """
    C{rmqha certs issue}: one more key pair from an existing CA.
    """

    def run_cli(self, *argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        status = main(list(argv), stdout=out, stderr=err)
        return status, out.getvalue(), err.getvalue()

    def setUp(self) -> None:
        self.d = self.mktemp()
        self.assertEqual(self.run_cli("certs", "init", self.d)[0], 0)

    def load(self, name: str) -> Any:
        from cryptography import x509

        with open(os.path.join(self.d, name), "rb") as f:
            return x509.load_pem_x509_certificate(f.read())

    def test_issues_what_was_asked(self) -> None:
        """
        The new certificate is signed by the CA in DIR, carries the name
        (CN and first DNS name), the extra DNS names and addresses, only
        the usage asked for and the validity asked for; its key is 0600;
        the output says where, for what and until when.
        """
        import datetime

        from cryptography import x509
        from cryptography.x509.oid import ExtendedKeyUsageOID as EKU, NameOID

        status, out, err = self.run_cli(
            "certs", "issue", self.d, "ops", "--dns", "ops.example", "--ip", "10.0.0.3,::1",
            "--usage", "client", "--days", "30",
        )
        self.assertEqual((status, err), (0, ""))
        cert = self.load("ops.pem")
        cert.verify_directly_issued_by(self.load("ca.pem"))
        self.assertEqual(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value, "ops")
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        self.assertEqual(san.get_values_for_type(x509.DNSName), ["ops", "ops.example"])
        self.assertEqual([str(a) for a in san.get_values_for_type(x509.IPAddress)],
                         ["10.0.0.3", "::1"])
        self.assertEqual(
            list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value),
            [EKU.CLIENT_AUTH],
        )
        self.assertEqual(
            cert.not_valid_after_utc - cert.not_valid_before_utc, datetime.timedelta(days=30)
        )
        self.assertEqual(os.stat(os.path.join(self.d, "ops.key")).st_mode & 0o777, 0o600)
        self.assertIn(f"certificate     {self.d}/ops.pem  {self.d}/ops.key", out)
        self.assertIn("names           ops, ops.example, 10.0.0.3, ::1", out)
        self.assertIn("usage           TLS client", out)
        self.assertIn(f"valid until     {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC", out)
        status, _, _ = self.run_cli("certs", "issue", self.d, "web", "--usage", "server",
                                    "--out", self.d, "--stem", "web-2")
        self.assertEqual(status, 0)
        self.assertEqual(
            list(self.load("web-2.pem").extensions.get_extension_for_class(
                x509.ExtendedKeyUsage).value),
            [EKU.SERVER_AUTH],
        )

    def test_default_is_a_broker_certificate(self) -> None:
        """
        Without C{--usage} the certificate is for server and client use,
        as C{certs init} gives every broker; an IP address as the name
        goes into the IP names.
        """
        from cryptography import x509
        from cryptography.x509.oid import ExtendedKeyUsageOID as EKU

        self.assertEqual(self.run_cli("certs", "issue", self.d, "10.0.0.9")[0], 0)
        cert = self.load("10.0.0.9.pem")
        self.assertEqual(
            set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value),
            {EKU.SERVER_AUTH, EKU.CLIENT_AUTH},
        )
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        self.assertEqual(san.get_values_for_type(x509.DNSName), [])
        self.assertEqual([str(a) for a in san.get_values_for_type(x509.IPAddress)], ["10.0.0.9"])

    def test_refusals_are_one_line(self) -> None:
        """
        An existing file is never overwritten (named; the files are left
        as they were); a missing CA directory, a missing CA key, a key
        that is not the CA's, bad names and addresses: each one line
        naming the thing, exit status 1, nothing written.
        """
        with open(os.path.join(self.d, "slave-slave.pem"), "rb") as f:
            before = f.read()
        other = self.mktemp()
        self.assertEqual(self.run_cli("certs", "init", other)[0], 0)
        nokey = self.mktemp()
        os.makedirs(nokey)
        with open(os.path.join(nokey, "ca.pem"), "wb") as f:
            with open(os.path.join(self.d, "ca.pem"), "rb") as g:
                f.write(g.read())
        mismatched = self.mktemp()
        os.makedirs(mismatched)
        for name, source in (("ca.pem", self.d), ("ca.key", other)):
            with open(os.path.join(mismatched, name), "wb") as f:
                with open(os.path.join(source, name), "rb") as g:
                    f.write(g.read())
        before_listing = sorted(os.listdir(self.d))
        for argv, needle in [
            ((self.d, "x", "--stem", "slave-slave"),
             f"{self.d}/slave-slave.pem, {self.d}/slave-slave.key exist; not overwriting"),
            (("/nonexistent-ca", "x"), "/nonexistent-ca: no such directory"),
            ((nokey, "x"), f"{nokey}/ca.key: No such file or directory"),
            ((mismatched, "x"), f"{mismatched}/ca.key is not the key of {mismatched}/ca.pem"),
            ((self.d, "a/b"), "'a/b' is not a usable certificate name"),
            ((self.d, "x", "--ip", "10.0.0"), "'10.0.0' is not an IP address"),
            ((self.d, "x", "--days", "0"), "a validity of 0 days"),
            ((self.d, "x", "--out", "/nonexistent-out"), "/nonexistent-out: no such directory"),
        ]:
            status, _, err = self.run_cli("certs", "issue", *argv)
            self.assertEqual(status, 1, argv)
            self.assertIn(needle, err, argv)
            self.assertEqual(err.count("\n"), 1, err)
        self.assertEqual(sorted(os.listdir(self.d)), before_listing)
        self.assertEqual(os.listdir(nokey), ["ca.pem"])
        with open(os.path.join(self.d, "slave-slave.pem"), "rb") as f:
            self.assertEqual(f.read(), before)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class ClusterSpecTests(SynchronousTestCase):
    """
    C{rmqha cluster ...} takes the brokers' C{--coordinator} spec, its
    credentials options included (tests/integration/test_etcd_auth.py runs
    it against etcd).
    """

    def run_cli(self, *argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        status = main(list(argv), stdout=out, stderr=err)
        return status, out.getvalue(), err.getvalue()

    def test_unreadable_credentials_are_usage_errors(self) -> None:
        """
        A missing password file, a user without any password, or a
        password written into the spec: exit status 2 and one line naming
        the option, before anything is asked of etcd; never the password.
        """
        self.patch(os, "environ", {k: v for k, v in os.environ.items() if k != "RMQHA_ETCD_PASSWORD"})
        for action in (["status"], ["switchover", "--to", "b"]):
            for spec, words in [
                ("etcd:http://127.0.0.1:1,user=u,passwordFile=/nonexistent",
                 "--coordinator: passwordFile /nonexistent: No such file or directory"),
                ("etcd:http://127.0.0.1:1,user=u",
                 "--coordinator: user=u needs passwordFile=PATH (or RMQHA_ETCD_PASSWORD"),
                ("etcd:http://127.0.0.1:1,user=u,password=s3cret",
                 "--coordinator: a password is never given in the spec"),
            ]:
                status, out, err = self.run_cli(
                    "cluster", *action[:1], "--coordinator", spec, "--group", "g", *action[1:]
                )
                self.assertEqual((status, out), (2, ""), err)
                self.assertEqual(err.count("\n"), 1, err)
                self.assertTrue(err.startswith("rmqha cluster: error: "), err)
                self.assertIn(words, err)
                self.assertNotIn("s3cret", err)

    def test_status_exit_says_whether_a_master_reports(self) -> None:
        """
        C{cluster status} exits 0 with a master that reports, 1 with none
        or with one that stopped reporting (dead: its keys outlive it).
        """
        import rmqha.cli
        from rmqha.coord.cluster import describe
        from rmqha.coord.dcs import ClusterView, Leader, Member

        view = ClusterView(
            leader=Leader("a", 1, "a:10912", None), epoch=1, epoch_revision=1, in_sync=None,
            members={"a": Member("a", "a:10912", role="master")}, switchover=None, revision=5,
        )
        for silent, expected in [(frozenset(), 0), (frozenset({"a"}), 1)]:
            state = describe(view, silent, 1.0)
            self.patch(rmqha.cli, "_on_cluster", lambda args, work: state)
            status, out, _ = self.run_cli(
                "cluster", "status", "--coordinator", "etcd:http://127.0.0.1:1", "--group", "g"
            )
            self.assertEqual(status, expected, out)
        state = describe(view.__class__(None, 0, 0, None, {}, None, 1))
        self.patch(rmqha.cli, "_on_cluster", lambda args, work: state)
        self.assertEqual(
            self.run_cli(
                "cluster", "status", "--coordinator", "etcd:http://127.0.0.1:1", "--group", "g"
            )[0],
            1,
        )
