"""
rmqha opens stores written the way Apache RocketMQ 4.9.8's broker writes them.

The stores come from C{tests/fixtures/RocketMQStoreWriter.java}, a Java 17
transcription of RocketMQ's own encoder (C{CommitLog.MessageExtEncoder.encode},
C{DefaultAppendMessageCallback.doAppend}, C{MappedFileQueue.getLastMappedFile},
C{MessageDecoder.messageProperties2String}, C{UtilAll.crc32} and
C{offset2FileName}, C{MessageExt.socketAddress2ByteBuffer}); it shares no code
with rmqha.  The writer also emits a manifest (JSON lines) of every record and
BLANK filler it placed, from its own bookkeeping, which these tests compare
with what rmqha reads.

Two stores are written once per test run (in parallel, into one temporary
directory removed at exit):

  - C{clean}: a broker that shut down cleanly (no C{abort}, and no
    pre-allocated file, which C{AllocateMappedFileService.shutdown} deletes);
    IPv4 store host.
  - C{crashed}: a broker that is still running or was killed (C{abort}
    present, the all-zero pre-allocated next segment still there); IPv6
    store host.

Both have 64 KiB segments (so seven data segments and six BLANK fillers, one
of them exactly 8 bytes), IPv6 born hosts, producer-compressed bodies,
TRANSACTION_COMMIT and TRANSACTION_PREPARED records (the latter take
QUEUEOFFSET 0 and no queue slot), non-ASCII property values, and batches
(C{CommitLog.asyncPutMessages}: one record per message, consecutive queue
offsets, the batch's properties appended to each message's so that C{WAIT}
appears twice, and a BLANK whenever the whole batch does not fit).

Every test is skipped when there is no C{java} executable.
"""

from __future__ import annotations

import atexit
import hashlib
import ipaddress
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any
from unittest import SkipTest

from twisted.trial.unittest import SynchronousTestCase

from rmqha.store._record import MESSAGE_MAGIC_V1, Blank, Message, Record, encode_properties
from rmqha.store.commitlog import CommitLog

try:
    import pytest
except ImportError:  # pragma: no cover - trial without pytest installed
    pass
else:
    pytestmark = pytest.mark.java

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WRITER = os.path.join(HERE, "fixtures", "RocketMQStoreWriter.java")

FILE_SIZE = 64 * 1024

#: The writer is short-lived: C1 only and the serial collector more than
#: halve its run time (most of which is compiling the source file).
JAVA_FLAGS = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]

_COMMON = [
    "--file-size", str(FILE_SIZE),
    "--messages", "400",
    "--cq-file-size", "2000",
    "--ipv6-every", "5",
    "--large-every", "23",
    "--commit-every", "19",
    "--prepared-every", "31",
    "--prepared-topic", "HalfTopic",
    "--batch-every", "5",
    "--batch-size", "8",
    "--exact-fit",
]

#: variant name -> (writer options, the store host the broker had)
VARIANTS: dict[str, tuple[list[str], tuple[str, int]]] = {
    "clean": (
        _COMMON + ["--seed", "20240501", "--store-host", "192.168.0.10:10911"],
        ("192.168.0.10", 10911),
    ),
    "crashed": (
        _COMMON
        + ["--seed", "7", "--store-host", "[2001:db8::10]:10911", "--abort"],
        ("2001:db8::10", 10911),
    ),
}


@dataclass
class JavaStore:
    """
    A store the Java writer produced, and what its manifest says about it.
    """

    path: str
    store_host: tuple[str, int]
    items: list[dict[str, Any]]
    summary: dict[str, Any]
    messages: list[dict[str, Any]] = field(default_factory=list)
    blanks: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.messages = [i for i in self.items if i["kind"] == "message"]
        self.blanks = [i for i in self.items if i["kind"] == "blank"]

    @property
    def data_files(self) -> list[str]:
        return [f["name"] for f in self.summary["files"]]


_workdir: str | None = None
_stores: dict[str, JavaStore | BaseException] = {}


def _work_directory() -> str:
    global _workdir
    if _workdir is None:
        _workdir = tempfile.mkdtemp(prefix="rmqha-rocketmq-stores-")
        atexit.register(shutil.rmtree, _workdir, True)
    return _workdir


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        raise SkipTest(
            "no java executable on PATH: these tests run RocketMQ's encoder "
            "(tests/fixtures/RocketMQStoreWriter.java) under Java 17"
        )
    return java


def _generate_all() -> None:
    """
    Run the writer once per variant, all at once (starting Java and
    compiling the source file costs seconds), and cache the results.
    """
    java = _java()
    work = _work_directory()
    running = {}
    for name, (options, _) in VARIANTS.items():
        out = os.path.join(work, name)
        manifest = os.path.join(work, name + ".manifest.jsonl")
        running[name] = (
            subprocess.Popen(
                [java, *JAVA_FLAGS, WRITER, out, *options, "--manifest", manifest],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
            out,
            manifest,
        )
    for name, (process, out, manifest) in running.items():
        try:
            stdout, stderr = process.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            _stores[name] = AssertionError(f"RocketMQStoreWriter ({name}) timed out")
            continue
        if process.returncode != 0:
            _stores[name] = AssertionError(
                f"RocketMQStoreWriter ({name}) exited with {process.returncode}:\n"
                f"{stdout}{stderr}"
            )
            continue
        with open(manifest, encoding="utf-8") as f:
            items = [json.loads(line) for line in f]
        summary = items.pop()
        assert summary["kind"] == "summary", summary
        _stores[name] = JavaStore(out, VARIANTS[name][1], items, summary)


def java_store(name: str) -> JavaStore:
    """
    The store of variant C{name}; generated on first use.  Never modify it:
    use L{copy_store}.
    """
    _java()
    if name not in _stores:
        _generate_all()
    store = _stores[name]
    if isinstance(store, BaseException):
        raise store
    return store


def copy_store(testcase: SynchronousTestCase, store: JavaStore) -> str:
    """
    A private copy of C{store} (file times preserved), removed after the test.
    """
    target = tempfile.mkdtemp(prefix="copy-", dir=_work_directory())
    testcase.addCleanup(shutil.rmtree, target, True)
    path = os.path.join(target, "store")
    shutil.copytree(store.path, path)
    return path


def snapshot(path: str) -> dict[str, tuple[Any, ...]]:
    """
    Everything observable about a directory tree: every entry's type, mode,
    inode, size, mtime and ctime, and a SHA-256 of every file.
    """
    result: dict[str, tuple[Any, ...]] = {}
    for directory, dirs, files in os.walk(path):
        for name in dirs + files:
            full = os.path.join(directory, name)
            st = os.lstat(full)
            digest = None
            if stat.S_ISREG(st.st_mode):
                with open(full, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
            result[os.path.relpath(full, path)] = (
                stat.S_IFMT(st.st_mode),
                st.st_mode,
                st.st_ino,
                st.st_size,
                st.st_mtime_ns,
                st.st_ctime_ns,
                digest,
            )
    return result


def file_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def packed_host(host: tuple[str, int]) -> tuple[str, int]:
    return ipaddress.ip_address(host[0]).packed.hex(), host[1]


class _StoreChecks:
    """
    Comparisons between what rmqha read and the manifest.
    """

    def assertRecordMatches(self, record: Record, expected: dict[str, Any]) -> None:
        body = bytes.fromhex(expected["body_hex"])
        actual = {
            "offset": record.offset,
            "size": record.size,
            "physical_offset": record.physical_offset,
            "magic": record.magic,
            "topic": record.topic,
            "queue_id": record.queue_id,
            "queue_offset": record.queue_offset,
            "flag": record.flag,
            "sysflag": record.sysflag,
            "body_crc": record.body_crc,
            "crc_ok": record.crc_ok,
            "body": record.body,
            "body_sha256": hashlib.sha256(record.body).hexdigest(),
            "born_timestamp": record.born_timestamp,
            "store_timestamp": record.store_timestamp,
            "born_host": packed_host(record.born_host),
            "store_host": packed_host(record.store_host),
            "reconsume_times": record.reconsume_times,
            "prepared_tx_offset": record.prepared_tx_offset,
            "properties": record.properties,
            "msg_id": record.msg_id,
        }
        wanted = {
            "offset": expected["offset"],
            "size": expected["size"],
            "physical_offset": expected["offset"],
            "magic": MESSAGE_MAGIC_V1,
            "topic": expected["topic"],
            "queue_id": expected["queue_id"],
            "queue_offset": expected["queue_offset"],
            "flag": expected["flag"],
            "sysflag": expected["sysflag"],
            "body_crc": expected["body_crc"],
            "crc_ok": True,
            "body": body,
            "body_sha256": expected["body_sha256"],
            "born_timestamp": expected["born_timestamp"],
            "store_timestamp": expected["store_timestamp"],
            "born_host": (
                expected["born_host"]["address_hex"],
                expected["born_host"]["port"],
            ),
            "store_host": (
                expected["store_host"]["address_hex"],
                expected["store_host"]["port"],
            ),
            "reconsume_times": expected["reconsume_times"],
            "prepared_tx_offset": expected["prepared_tx_offset"],
            "properties": expected["properties"],
            "msg_id": expected["msg_id"],
        }
        self.assertEqual(actual, wanted)  # type: ignore[attr-defined]

    def assertReadsManifest(self, commitlog: CommitLog, store: JavaStore) -> None:
        """
        Every record and every BLANK filler, in order, with every field.
        """
        items = list(commitlog.records(check_crc=True, blanks=True))
        self.assertEqual(  # type: ignore[attr-defined]
            [(type(i).__name__, i.offset, i.size) for i in items],
            [
                ("Blank" if e["kind"] == "blank" else "Record", e["offset"], e["size"])
                for e in store.items
            ],
        )
        records = [i for i in items if isinstance(i, Record)]
        for record, expected in zip(records, store.messages):
            self.assertRecordMatches(record, expected)

    def assertDataUntouched(self, copy: str, store: JavaStore, upto: int | None = None) -> None:
        """
        The data segments in C{copy} hold the Java writer's bytes, all of
        them, or (with C{upto}) every byte before that commit-log offset.
        """
        for name in store.data_files:
            original = file_bytes(os.path.join(store.path, "commitlog", name))
            now = file_bytes(os.path.join(copy, "commitlog", name))
            start = int(name)
            if upto is not None and start + len(original) > upto:
                keep = max(0, upto - start)
                self.assertEqual(now[:keep], original[:keep], name)  # type: ignore[attr-defined]
            else:
                self.assertEqual(  # type: ignore[attr-defined]
                    hashlib.sha256(now).hexdigest(),
                    hashlib.sha256(original).hexdigest(),
                    name,
                )

    def assertPutsContinue(self, copy: str, store: JavaStore) -> None:
        """
        Open C{copy} read-write and put one message on every topic-queue the
        Java broker used and on a new one: each continues that queue's
        offsets, the first lands at the old max offset, and nothing before
        it changes.
        """
        old_max = store.summary["max_offset"]
        expected_next = {
            (topic, queue_id): next_offset
            for topic, queue_id, next_offset in store.summary["topic_queue_table"]
        }
        results = []
        with CommitLog.open(copy, store_host=store.store_host) as commitlog:
            self.assertEqual(commitlog.max_offset, old_max)  # type: ignore[attr-defined]
            for (topic, queue_id), next_offset in sorted(expected_next.items()):
                result = commitlog.put(
                    Message(
                        topic=topic,
                        body=f"after {topic}-{queue_id}".encode(),
                        queue_id=queue_id,
                        properties={"TAGS": "rmqha"},
                    )
                )
                results.append(result)
                self.assertEqual(  # type: ignore[attr-defined]
                    result.queue_offset, next_offset, f"{topic}-{queue_id}"
                )
            fresh = commitlog.put(Message(topic="BrandNewTopic", body=b"x", queue_id=7))
            self.assertEqual(fresh.queue_offset, 0)  # type: ignore[attr-defined]
        first = results[0]
        position = old_max % FILE_SIZE
        if position + first.size + 8 <= FILE_SIZE:
            self.assertEqual(first.offset, old_max)  # type: ignore[attr-defined]
        else:  # pragma: no cover - depends on the generated data
            self.assertEqual(first.offset, old_max - position + FILE_SIZE)  # type: ignore[attr-defined]
        self.assertDataUntouched(copy, store, upto=old_max)
        # What rmqha wrote reads back, after the Java records, in order.
        with CommitLog.open(copy, read_only=True) as commitlog:
            records = list(commitlog.records(check_crc=True))
            self.assertEqual(  # type: ignore[attr-defined]
                [r.offset for r in records[len(store.messages):]],
                [r.offset for r in results] + [fresh.offset],
            )
            for record, expected in zip(records, store.messages):
                self.assertRecordMatches(record, expected)


class CleanRocketMQStoreTests(_StoreChecks, SynchronousTestCase):
    """
    A store a RocketMQ 4.9.8 broker left after a clean shutdown.
    """

    def setUp(self) -> None:
        self.store = java_store("clean")
        self.commitlog = CommitLog.open(self.store.path, read_only=True)
        self.addCleanup(self.commitlog.close)

    def test_fixture(self) -> None:
        """
        The generated store exercises what these tests claim: several
        segments, an exactly-8-byte BLANK, a BLANK before a batch whose
        first record alone would have fitted, IPv6 born hosts, compressed
        bodies, COMMIT and PREPARED transaction records, non-ASCII
        properties, batch records repeating a property name; and no abort
        marker or pre-allocated file.
        """
        messages = self.store.messages
        items = self.store.items
        self.assertTrue(
            any(
                a["kind"] == "blank" and b["batch"] and b["size"] + 8 <= a["size"]
                for a, b in zip(items, items[1:])
            )
        )
        self.assertTrue(
            any(
                m["batch"] and bytes.fromhex(m["properties_hex"]).count(b"WAIT\x01") == 2
                for m in messages
            )
        )
        self.assertGreaterEqual(len(self.store.data_files), 4)
        self.assertIn(8, [b["size"] for b in self.store.blanks])
        self.assertTrue(any(m["sysflag"] & 0x10 for m in messages))
        self.assertTrue(any(m["sysflag"] & 0x1 for m in messages))
        self.assertTrue(any(m["sysflag"] & 0xC == 0x8 for m in messages))
        self.assertTrue(any(m["sysflag"] & 0xC == 0x4 for m in messages))
        # Topic-queues holding only PREPARED records: RocketMQ's next queue
        # offset there is still 0.
        self.assertIn(
            0, [n for t, _, n in self.store.summary["topic_queue_table"] if t == "HalfTopic"]
        )
        self.assertTrue(
            any(any(ord(c) > 127 for c in m["properties"].get("note", "")) for m in messages)
        )
        self.assertEqual(self.store.summary["preallocated"], [])
        self.assertFalse(os.path.exists(os.path.join(self.store.path, "abort")))
        self.assertEqual(
            sorted(os.listdir(os.path.join(self.store.path, "commitlog"))),
            self.store.data_files,
        )

    def test_recovery(self) -> None:
        """
        Opening read-only recovers to the end of the last record: a clean
        shutdown, nothing torn, nothing dropped, no stop reason.
        """
        recovery = self.commitlog.recovery
        self.assertTrue(recovery.clean_shutdown)
        self.assertEqual(recovery.end_offset, self.store.summary["max_offset"])
        self.assertIsNone(recovery.stop_reason)
        self.assertFalse(recovery.torn)
        self.assertEqual(recovery.dropped_segments, [])

    def test_offsets(self) -> None:
        """
        The min and max offsets are the Java broker's: the first segment's
        start and the end of the last record.
        """
        self.assertEqual(self.commitlog.min_offset, self.store.summary["min_offset"])
        self.assertEqual(self.commitlog.max_offset, self.store.summary["max_offset"])
        self.assertEqual(self.commitlog.segment_size, FILE_SIZE)

    def test_segments(self) -> None:
        """
        Every segment file is found with its start offset, and its written
        size is the Java MappedFile's wrote position (the full file for a
        segment closed by a BLANK).
        """
        self.assertEqual(
            self.commitlog.segments,
            [(f["name"], f["from"], f["wrote"]) for f in self.store.summary["files"]],
        )

    def test_records(self) -> None:
        """
        C{records(check_crc=True)} yields exactly the manifest's messages,
        every field equal, and BLANK fillers exactly where the Java writer
        put them.
        """
        self.assertReadsManifest(self.commitlog, self.store)

    def test_blanks_close_segments(self) -> None:
        """
        Each BLANK filler covers the rest of its segment, and every segment
        but the last ends with one.
        """
        blanks = [
            b for b in self.commitlog.records(blanks=True) if isinstance(b, Blank)
        ]
        self.assertEqual(
            [(b.offset + b.size) % FILE_SIZE for b in blanks], [0] * len(blanks)
        )
        self.assertEqual(len(blanks), len(self.store.data_files) - 1)

    def test_properties_bytes(self) -> None:
        """
        rmqha's properties encoding reproduces 4.9.8's
        C{messageProperties2String} bytes (no trailing separator) for the
        same names and values in the same order.  (Batch records are left
        out: their stored string repeats C{WAIT}, which no map can.)
        """
        compared = 0
        for record, expected in zip(
            self.commitlog.records(with_body=False), self.store.messages
        ):
            if expected["batch"]:
                continue
            self.assertEqual(
                encode_properties(record.properties).hex(), expected["properties_hex"]
            )
            compared += 1
        self.assertGreater(compared, 50)

    def test_read_write(self) -> None:
        """
        Opening a copy read-write recovers to the same max offset and
        changes no data byte, even after close.
        """
        copy = copy_store(self, self.store)
        with CommitLog.open(copy, store_host=self.store.store_host) as commitlog:
            self.assertTrue(commitlog.recovery.clean_shutdown)
            self.assertEqual(commitlog.max_offset, self.store.summary["max_offset"])
            self.assertEqual(commitlog.recovery.dropped_segments, [])
        self.assertDataUntouched(copy, self.store)
        self.assertFalse(os.path.exists(os.path.join(copy, "abort")))

    def test_put_continues(self) -> None:
        """
        After a read-write open, puts continue every topic-queue's queue
        offsets from the Java-written ones (PREPARED records not counted)
        and start at the old max offset.
        """
        self.assertPutsContinue(copy_store(self, self.store), self.store)


class CrashedRocketMQStoreTests(_StoreChecks, SynchronousTestCase):
    """
    A store of a RocketMQ 4.9.8 broker that is still running or crashed:
    C{abort} present, the pre-allocated all-zero next segment still there,
    and an IPv6 store host.
    """

    def setUp(self) -> None:
        self.store = java_store("crashed")

    def test_fixture(self) -> None:
        """
        The generated store has the abort marker, one pre-allocated segment
        after the data, and IPv6 store-host records.
        """
        self.assertTrue(os.path.exists(os.path.join(self.store.path, "abort")))
        preallocated = self.store.summary["preallocated"]
        self.assertEqual(len(preallocated), 1)
        self.assertEqual(
            int(preallocated[0]), int(self.store.data_files[-1]) + FILE_SIZE
        )
        path = os.path.join(self.store.path, "commitlog", preallocated[0])
        self.assertEqual(file_bytes(path), bytes(FILE_SIZE))
        self.assertTrue(all(m["sysflag"] & 0x20 for m in self.store.messages))

    def test_read_only(self) -> None:
        """
        With C{abort} present a read-only open reports an unclean shutdown,
        still reads every message, ends at the last record and ignores the
        pre-allocated segment (listing it as dropped without touching it).
        """
        with CommitLog.open(self.store.path, read_only=True) as commitlog:
            recovery = commitlog.recovery
            self.assertFalse(recovery.clean_shutdown)
            self.assertIsNone(recovery.stop_reason)
            self.assertFalse(recovery.torn)
            self.assertEqual(recovery.end_offset, self.store.summary["max_offset"])
            self.assertEqual(recovery.dropped_segments, self.store.summary["preallocated"])
            self.assertEqual(commitlog.min_offset, 0)
            self.assertEqual(commitlog.max_offset, self.store.summary["max_offset"])
            self.assertEqual(
                [name for name, _, _ in commitlog.segments], self.store.data_files
            )
            self.assertReadsManifest(commitlog, self.store)
        for name in self.store.summary["preallocated"]:
            self.assertTrue(os.path.exists(os.path.join(self.store.path, "commitlog", name)))

    def test_read_write(self) -> None:
        """
        A read-write open of a copy recovers to the same max offset,
        deletes the all-zero pre-allocated segment (rmqha's recovery unlinks
        never-written segments past the end), leaves every data byte as it
        was, and on close removes C{abort}.
        """
        copy = copy_store(self, self.store)
        with CommitLog.open(copy, store_host=self.store.store_host) as commitlog:
            self.assertFalse(commitlog.recovery.clean_shutdown)
            self.assertEqual(commitlog.max_offset, self.store.summary["max_offset"])
            self.assertEqual(
                commitlog.recovery.dropped_segments, self.store.summary["preallocated"]
            )
            self.assertEqual(
                sorted(os.listdir(os.path.join(copy, "commitlog"))),
                self.store.data_files,
            )
            self.assertReadsManifest(commitlog, self.store)
        self.assertDataUntouched(copy, self.store)
        self.assertFalse(os.path.exists(os.path.join(copy, "abort")))
        self.assertFalse(os.path.exists(os.path.join(copy, "rmqha", "dropped")))

    def test_put_continues(self) -> None:
        """
        Puts after recovering the crashed store continue the queue offsets
        and start at the old max offset, with an IPv6 store host.
        """
        self.assertPutsContinue(copy_store(self, self.store), self.store)


class ReadOnlyOpenTests(SynchronousTestCase):
    """
    A read-only open, a full read and a close modify nothing at all.
    """

    def assertUnmodified(self, name: str) -> None:
        copy = copy_store(self, java_store(name))
        before = snapshot(copy)
        with CommitLog.open(copy, read_only=True) as commitlog:
            for _ in commitlog.records(check_crc=True, blanks=True):
                pass
        after = snapshot(copy)
        self.assertEqual(sorted(after), sorted(before))
        self.assertNotIn("rmqha", after)
        self.assertEqual(after, before)

    def test_clean(self) -> None:
        """
        The cleanly shut down store: same entries, bytes, modes, inodes,
        mtimes and ctimes; no C{rmqha/} directory, no C{abort}.
        """
        self.assertUnmodified("clean")

    def test_crashed(self) -> None:
        """
        The crashed store: C{abort} and the pre-allocated segment stay,
        and nothing else changes either.
        """
        self.assertUnmodified("crashed")


_cli_probe: list[bool] = []


def _cli_has_store_check() -> bool:
    if not _cli_probe:
        _cli_probe.append(_probe_cli())
    return _cli_probe[0]


def _probe_cli() -> bool:
    if not os.path.exists(os.path.join(ROOT, "rmqha", "cli.py")):
        return False
    try:
        probe = subprocess.run(
            [sys.executable, "-m", "rmqha", "store", "check", "--help"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


class StoreCheckCommandTests(SynchronousTestCase):
    """
    C{python -m rmqha store check DIR} on the Java-written stores.
    """

    def setUp(self) -> None:
        _java()
        if not _cli_has_store_check():
            raise SkipTest("rmqha has no `store check` command (rmqha/cli.py)")

    def assertSound(self, name: str) -> None:
        store = java_store(name)
        copy = copy_store(self, store)
        before = snapshot(copy)
        result = subprocess.run(
            [sys.executable, "-m", "rmqha", "store", "check", copy],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn(str(store.summary["max_offset"]), result.stdout)
        self.assertIn(str(len(store.messages)), result.stdout)
        self.assertEqual(snapshot(copy), before)

    def test_clean(self) -> None:
        """
        The cleanly shut down store checks sound, with its record count and
        max offset in the report, and is not modified.
        """
        self.assertSound("clean")

    def test_crashed(self) -> None:
        """
        The crashed store (abort, pre-allocated zero segment) checks sound
        too and is not modified.
        """
        self.assertSound("crashed")
