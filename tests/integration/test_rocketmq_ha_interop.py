"""
rmqha replicates to and from Apache RocketMQ 4.9's own HA code, over real
sockets on 127.0.0.1 (pytest-twisted, the global reactor).

The RocketMQ side is C{tests/fixtures/RocketMQHAPeer.java}, a Java 17
transcription of RocketMQ 4.9.x's classic HA peers that shares no code with
rmqha:

  - C{slave}: C{HAService.HAClient} (blocking connect then a selector, the
    4 MiB read buffer pair, C{dispatchReadRequest}'s 12-byte header and the
    C{slavePhyOffset != 0 && slavePhyOffset != masterPhyOffset} check, the
    first report only once C{haSendHeartbeatInterval} has passed after
    connecting) appending through C{CommitLog.appendData} /
    C{MappedFileQueue.getLastMappedFile} / C{MappedFile.appendMessage} into
    RocketMQ-layout files, with C{AllocateMappedFileService}'s
    pre-created next file;
  - C{master}: C{AcceptSocketService} plus C{HAConnection}'s
    C{ReadSocketService} (last 8-byte-aligned long; an ack beyond the max
    offset closes the connection) and C{WriteSocketService} (waits for the
    first report; an empty slave gets the start of the last file; frames of
    C{min(haTransferBatchSize, readable in one file)}; heartbeats), serving
    a store that rmqha wrote, after RocketMQ's normal recovery has found
    its max offset.

Each Java peer prints JSON about what it did; the tests compare files byte
for byte and check the offsets on the wire.  The peer is compiled once per
module (C{javac}, else run from source); everything is skipped without
C{java}.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
from typing import Any, Callable, Iterator

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.error import ProcessDone, ProcessTerminated
from twisted.internet.protocol import ProcessProtocol
from twisted.internet.task import LoopingCall, deferLater
from twisted.python.failure import Failure

from rmqha.ha._wire import MAX_BODY_SIZE
from rmqha.broker import Broker, Role
from tests._helpers import settings_and_runtime
from rmqha.store._record import Message
from rmqha.store.commitlog import CommitLog
from rmqha.ha.config import HAConfig
from tests._helpers import replica_of, replication_of

pytestmark = pytest.mark.java

HERE = os.path.dirname(os.path.abspath(__file__))
PEER_SOURCE = os.path.join(os.path.dirname(HERE), "fixtures", "RocketMQHAPeer.java")

#: mappedFileSizeCommitLog for every store here: 1 MiB, so a few MiB of
#: messages span several files.
SEGMENT = 1024 * 1024
#: Bytes of messages to put: a little over three segments, so four files
#: with the last one partly written.
LOG_BYTES = 3 * SEGMENT + 300 * 1024
#: haTransferBatchSize of the Java master (RocketMQ's default).
BATCH = 32 * 1024
#: The Java slave's haSendHeartbeatInterval (RocketMQ: 5000 ms).
JAVA_HEARTBEAT_MS = 200

#: The peer is short-lived: C1 only and the serial collector.
JAVA_FLAGS = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]

#: rmqha's HA settings in these tests: fast heartbeats, and a housekeeping
#: interval far above the Java slave's report interval.
CONFIG = HAConfig(heartbeat_interval=0.2, housekeeping_interval=10.0)


# -- the Java peer -------------------------------------------------------


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """
    The command line that runs C{RocketMQHAPeer}: compiled once with javac
    when there is one (saves a second or two per run), else from source.
    """
    java = shutil.which("java")
    if java is None:
        pytest.skip(
            "no java executable on PATH: these tests run RocketMQ 4.9's HA "
            "peers (tests/fixtures/RocketMQHAPeer.java) under Java 17"
        )
    javac = shutil.which("javac")
    if javac is None:
        return [java, *JAVA_FLAGS, PEER_SOURCE]
    classes = str(tmp_path_factory.mktemp("rocketmq-ha-peer"))
    compiled = subprocess.run(
        [javac, "-nowarn", "-d", classes, PEER_SOURCE],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert compiled.returncode == 0, f"javac {PEER_SOURCE} failed:\n{compiled.stderr}"
    return [java, *JAVA_FLAGS, "-cp", classes, "RocketMQHAPeer"]


class _Event:
    """
    Something that happens once; each L{wait} gets its own Deferred, so a
    waiter that times out (is cancelled) disturbs nobody.
    """

    def __init__(self) -> None:
        self._fired = False
        self._value: Any = None
        self._waiters: list[Deferred[Any]] = []

    def fire(self, value: Any) -> None:
        if self._fired:
            return
        self._fired, self._value = True, value
        waiters, self._waiters = self._waiters, []
        for d in waiters:
            if not d.called:
                d.callback(value)

    def wait(self) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        if self._fired:
            d.callback(self._value)
        else:
            self._waiters.append(d)
        return d


class JavaPeer(ProcessProtocol):
    """
    One run of the Java peer: its JSON lines, stderr, and exit code.
    """

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self.stderr = bytearray()
        self._buffer = bytearray()
        self._first_line = _Event()
        self._ended = _Event()
        self.exit_code: int | None = None
        self.running = False

    def first_line(self) -> Deferred[Any]:
        """
        Fires with the first JSON line (the master's C{listening} line), or
        C{None} if the process ended without printing one.
        """
        return self._first_line.wait()

    def ended(self) -> Deferred[Any]:
        """
        Fires with the exit code once the process has ended.
        """
        return self._ended.wait()

    def connectionMade(self) -> None:
        self.running = True

    def outReceived(self, data: bytes) -> None:
        self._buffer += data
        while b"\n" in self._buffer:
            line, _, rest = bytes(self._buffer).partition(b"\n")
            self._buffer = bytearray(rest)
            if line.strip():
                self.lines.append(json.loads(line))
                self._first_line.fire(self.lines[0])

    def errReceived(self, data: bytes) -> None:
        self.stderr += data

    def processEnded(self, reason: Failure) -> None:
        self.running = False
        if reason.check(ProcessDone):
            self.exit_code = 0
        elif reason.check(ProcessTerminated):
            self.exit_code = reason.value.exitCode
        self._first_line.fire(None)
        self._ended.fire(self.exit_code)

    @property
    def result(self) -> dict[str, Any]:
        """
        The last JSON line (the summary).
        """
        assert self.lines, f"no output from the Java peer; stderr:\n{self.log_tail()}"
        return self.lines[-1]

    def log_tail(self) -> str:
        return bytes(self.stderr[-4000:]).decode("utf-8", "replace")

    async def stop(self, reactor: Any) -> None:
        if self.running:
            self.transport.signalProcess("KILL")  # type: ignore[union-attr]
            await self.ended()


def spawn(reactor: Any, command: list[str], *args: object) -> JavaPeer:
    protocol = JavaPeer()
    argv = [*command, *map(str, args)]
    reactor.spawnProcess(protocol, argv[0], argv, env=dict(os.environ))
    return protocol


async def within(reactor: Any, d: Deferred[Any], seconds: float, what: str) -> Any:
    """
    Wait for C{d}, failing the test after C{seconds}.
    """
    try:
        return await d.addTimeout(seconds, reactor)
    except Exception as e:  # CancelledError/TimeoutError
        raise AssertionError(f"timed out after {seconds} s waiting for {what}") from e


async def until(reactor: Any, condition: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    waited = 0.0
    while not condition():
        if waited >= timeout:
            raise AssertionError(f"timed out waiting for {what}")
        await deferLater(reactor, 0.02, lambda: None)
        waited += 0.02


# -- stores ---------------------------------------------------------------


def messages(seed: int) -> Iterator[Message]:
    """
    Messages of varied sizes, topics, queues and properties, so BLANK
    fillers of varied lengths end every segment.
    """
    rng = random.Random(seed)
    topics = ["TopicTest", "OrderTopic", "%RETRY%group_a", "T" * 100]
    i = 0
    while True:
        body = rng.randbytes(rng.choice([1, 64, 700, 1500, 4000, 9000]) + rng.randrange(64))
        properties = {"KEYS": f"key-{i}", "TAGS": rng.choice(["a", "b", "c"])}
        if i % 7 == 0:
            properties["UNIQ_KEY"] = f"{seed:08X}{i:024X}"
        yield Message(rng.choice(topics), body, queue_id=i % 4, properties=properties)
        i += 1


def write_store(path: str, size: int = LOG_BYTES, seed: int = 1) -> int:
    """
    An rmqha store of C{size} bytes or a little more, closed cleanly.

    @return: its max offset.
    """
    with CommitLog.open(path, segment_size=SEGMENT, clock=lambda: 1_700_000_000.0) as commitlog:
        produce = messages(seed)
        while commitlog.max_offset < size:
            commitlog.put(next(produce))
        return commitlog.max_offset


def record_boundary(path: str, near: int) -> int:
    """
    The start of the first record at or after C{near} in the store at
    C{path} (closed).
    """
    with CommitLog.open(path, read_only=True) as commitlog:
        for record in commitlog.records():
            if record.offset >= near:
                return record.offset
    raise AssertionError(f"no record after {near}")


def files(store: str) -> dict[str, bytes]:
    directory = os.path.join(store, "commitlog")
    out = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            out[name] = f.read()
    return out


def copy_prefix(source: str, target: str, end: int, segment: int = SEGMENT) -> None:
    """
    Give the store at C{target} the first C{end} bytes of the log at
    C{source}: whole files before C{end}'s file, the head of that file
    (zeros after), no file after it.
    """
    directory = os.path.join(target, "commitlog")
    os.makedirs(directory)
    for name, data in files(source).items():
        start = int(name)
        if start >= end:
            continue
        kept = data[: end - start]
        with open(os.path.join(directory, name), "wb") as f:
            f.write(kept + bytes(segment - len(kept)))


def segment_name(offset: int) -> str:
    return f"{offset:020d}"


def assert_same_files(got: dict[str, bytes], expected: dict[str, bytes], names: list[str]) -> None:
    for name in names:
        assert name in got, f"segment {name} is missing"
        a, b = got[name], expected[name]
        if a != b:
            diff = next(i for i in range(min(len(a), len(b))) if a[i] != b[i]) if len(a) == len(b) else None
            raise AssertionError(
                f"segment {name} differs (sizes {len(a)} / {len(b)}, first "
                f"different byte at file position {diff})"
            )


def broker(
    reactor: Any, store: str, role: Role, config: HAConfig = CONFIG, segment: int = SEGMENT, **kwargs: Any
) -> Broker:
    settings, runtime = settings_and_runtime(
        kwargs,
        role=role,
        batch_size=config.transfer_batch_size,
        heartbeat_interval=config.heartbeat_interval,
        housekeeping_interval=config.housekeeping_interval,
        sync_from_last_file=config.sync_from_last_file,
    )
    return Broker(
        settings,
        reactor=reactor,
        open_commitlog=lambda: CommitLog.open(store, segment_size=segment, clock=reactor.seconds),
        retry_policy=lambda attempt: 0.1,
        **runtime,
    )


async def rmqha_master(
    reactor: Any, store: str, config: HAConfig = CONFIG, segment: int = SEGMENT, size: int = LOG_BYTES
) -> tuple[Broker, int]:
    """
    A running rmqha master Broker holding C{size} bytes of messages or a
    little more (put through L{Broker.put}), and its HA port.
    """
    master = broker(reactor, store, Role.MASTER, config, segment, ha_listen="tcp:0:interface=127.0.0.1")
    master.startService()
    produce = messages(seed=2)
    while master.commitlog.max_offset < size:
        await master.put(next(produce))
    master.commitlog.flush()
    address = await master.ha_address()
    return master, address.port


# -- rmqha master -> RocketMQ slave -----------------------------------------


async def run_java_slave(
    reactor: Any,
    peer: list[str],
    port: int,
    out: str,
    target: int,
    heartbeat_ms: int = JAVA_HEARTBEAT_MS,
    segment: int = SEGMENT,
) -> dict[str, Any]:
    slave = spawn(
        reactor, peer, "slave", "127.0.0.1", port, out, segment, target, 15000,
        "--heartbeat-ms", heartbeat_ms,
    )
    try:
        code = await within(reactor, slave.ended(), 25, "the Java slave")
    finally:
        await slave.stop(reactor)
    assert code == 0, f"Java slave exit {code}: {slave.lines}\n{slave.log_tail()}"
    result = slave.result
    assert result["event"] == "done"
    assert result["mismatches"] == [], result["mismatches"]
    assert result["append_failures"] == 0, result["append_failure_details"]
    assert result["connects"] == 1, result
    return result


def assert_java_slave_files(
    out: str, master_store: str, first: int, end: int, segment: int = SEGMENT
) -> None:
    """
    The Java slave's commit log holds the master's segments from the one at
    C{first} on, byte for byte, plus the all-zero next file that
    AllocateMappedFileService pre-creates.
    """
    got = files(out)
    expected = files(master_store)
    names = [n for n in expected if int(n) >= first]
    preallocated = segment_name(int(names[-1]) + segment)
    assert sorted(got) == sorted(names + [preallocated])
    assert_same_files(got, expected, names)
    zeros = got[preallocated] == bytes(segment)
    assert zeros, f"the pre-created file {preallocated} is not all zero"
    assert int(names[-1]) <= end < int(names[-1]) + segment


@pytest_twisted.ensureDeferred
async def test_java_slave_gets_whole_log(tmp_path: Any, peer: list[str]) -> None:
    """
    An empty RocketMQ slave reports 0; rmqha's master (by default) sends its
    whole log from the oldest segment, and the Java slave, creating its
    first file at the first frame's offset (getLastMappedFile), ends with
    every segment identical to the master's.
    """
    from twisted.internet import reactor

    master, port = await rmqha_master(reactor, str(tmp_path / "master"))
    try:
        end = master.commitlog.max_offset
        assert len(master.commitlog.segments) == 4
        result = await run_java_slave(reactor, peer, port, str(tmp_path / "java"), end)
    finally:
        await master.stopService()
    assert result["initial_max_offset"] == 0
    assert result["reports"][0] == 0
    assert result["first_frame_offset"] == 0
    assert result["min_offset"] == 0
    assert result["max_offset"] == end
    assert result["bytes"] == end
    assert result["reports"][-1] == end
    assert_java_slave_files(str(tmp_path / "java"), str(tmp_path / "master"), 0, end)


@pytest_twisted.ensureDeferred
async def test_java_slave_sync_from_last_file(tmp_path: Any, peer: list[str]) -> None:
    """
    With C{HAConfig(sync_from_last_file=True)} (4.9's own rule) the empty
    Java slave receives only the master's last segment, from its start.
    """
    from twisted.internet import reactor

    config = HAConfig(heartbeat_interval=0.2, housekeeping_interval=10.0, sync_from_last_file=True)
    master, port = await rmqha_master(reactor, str(tmp_path / "master"), config)
    try:
        end = master.commitlog.max_offset
        last = end - end % SEGMENT
        result = await run_java_slave(reactor, peer, port, str(tmp_path / "java"), end)
    finally:
        await master.stopService()
    assert result["reports"][0] == 0
    assert result["first_frame_offset"] == last
    assert result["min_offset"] == last
    assert result["max_offset"] == end
    assert result["bytes"] == end - last
    assert_java_slave_files(str(tmp_path / "java"), str(tmp_path / "master"), last, end)


@pytest_twisted.ensureDeferred
async def test_java_slave_largest_frames(tmp_path: Any, peer: list[str]) -> None:
    """
    rmqha's largest allowed C{haTransferBatchSize}, 4 MiB - 12 (frame and
    header exactly fill RocketMQ's 4 MiB read buffer), with 8 MiB segments:
    the Java slave's buffer pair (C{reallocateByteBuffer}) takes frames of
    that size that start anywhere in its buffer, and ends identical.
    """
    from twisted.internet import reactor

    segment = 8 * SEGMENT
    config = HAConfig(
        heartbeat_interval=0.2, housekeeping_interval=10.0, transfer_batch_size=MAX_BODY_SIZE
    )
    master, port = await rmqha_master(
        reactor, str(tmp_path / "master"), config, segment, size=segment + 3 * SEGMENT
    )
    try:
        end = master.commitlog.max_offset
        assert len(master.commitlog.segments) == 2
        result = await run_java_slave(reactor, peer, port, str(tmp_path / "java"), end, segment=segment)
    finally:
        await master.stopService()
    # 4 MiB - 12, 4 MiB - 12, the 24 bytes left of the first segment, then
    # the second segment in frames of at most 4 MiB - 12.
    offsets = result["frame_offsets"]
    assert offsets[:4] == [0, MAX_BODY_SIZE, 2 * MAX_BODY_SIZE, segment]
    assert result["max_offset"] == end
    assert_java_slave_files(str(tmp_path / "java"), str(tmp_path / "master"), 0, end, segment)


@pytest_twisted.ensureDeferred
async def test_java_slave_resumes(tmp_path: Any, peer: list[str]) -> None:
    """
    A RocketMQ slave that already holds the first N bytes (N a record
    boundary inside the second segment) recovers to N, reports N, and the
    rmqha master resumes exactly there.
    """
    from twisted.internet import reactor

    master_store = str(tmp_path / "master")
    master, port = await rmqha_master(reactor, master_store)
    try:
        end = master.commitlog.max_offset
        resume = next(
            r.offset for r in master.commitlog.records() if r.offset >= SEGMENT + SEGMENT // 2
        )
        copy_prefix(master_store, str(tmp_path / "java"), resume)
        result = await run_java_slave(reactor, peer, port, str(tmp_path / "java"), end)
    finally:
        await master.stopService()
    assert result["initial_max_offset"] == resume
    assert result["reports"][0] == resume
    assert result["first_frame_offset"] == resume
    assert result["bytes"] == end - resume
    assert result["max_offset"] == end
    assert_java_slave_files(str(tmp_path / "java"), master_store, 0, end)


@pytest_twisted.ensureDeferred
async def test_java_slave_first_report_is_late(tmp_path: Any, peer: list[str]) -> None:
    """
    RocketMQ 4.9.8's slave sends its first report only once
    C{now - lastWriteTimestamp > haSendHeartbeatInterval} after connecting
    (and its C{select(1000)} rounds that up).  The rmqha master keeps the
    connection waiting, sends nothing before the report, and then serves
    the slave from the right place.
    """
    from twisted.internet import reactor

    heartbeat_ms = 1200
    master, port = await rmqha_master(reactor, str(tmp_path / "master"))
    try:
        end = master.commitlog.max_offset
        factory = master.master_factory
        assert factory is not None
        waiting: list[float] = []

        def watch() -> None:
            # While no report has come, the connection is there, waiting.
            for connection in factory.connections:
                if connection.next_offset is None:
                    waiting.append(reactor.seconds())

        watcher = LoopingCall(watch)
        watcher.start(0.05)
        try:
            result = await run_java_slave(
                reactor, peer, port, str(tmp_path / "java"), end, heartbeat_ms=heartbeat_ms
            )
        finally:
            watcher.stop()
    finally:
        await master.stopService()
    assert result["first_report_after_connect_ms"] > heartbeat_ms
    assert result["bytes_read_before_first_report"] == 0
    assert waiting and waiting[-1] - waiting[0] >= heartbeat_ms / 1000 - 0.1
    assert result["first_frame_offset"] == 0
    assert result["max_offset"] == end
    assert_java_slave_files(str(tmp_path / "java"), str(tmp_path / "master"), 0, end)


@pytest_twisted.ensureDeferred
async def test_java_slave_ahead_of_rmqha_master(tmp_path: Any, peer: list[str]) -> None:
    """
    A RocketMQ slave holding more than the rmqha master: rmqha drops it at
    its first report (RocketMQ 4.9.8's master would take that report
    unchecked, send heartbeats, and close on the next ack), and the
    4.9.8 slave reconnects at once, is dropped again, and writes nothing.
    """
    from twisted.internet import reactor

    full = str(tmp_path / "full")
    end = write_store(full)
    behind = record_boundary(full, end - 100_000)
    master_store = str(tmp_path / "master")
    copy_prefix(full, master_store, behind)
    java_store = str(tmp_path / "java")
    shutil.copytree(full, java_store)

    master = broker(reactor, master_store, Role.MASTER, ha_listen="tcp:0:interface=127.0.0.1")
    master.startService()
    try:
        assert master.commitlog.max_offset == behind
        port = (await master.ha_address()).port
        slave = spawn(
            reactor, peer, "slave", "127.0.0.1", port, java_store, SEGMENT, end + 1, 2500,
            "--heartbeat-ms", JAVA_HEARTBEAT_MS,
        )
        try:
            code = await within(reactor, slave.ended(), 20, "the Java slave's timeout")
        finally:
            await slave.stop(reactor)
        assert master.master_factory is not None
        assert not master.master_factory.connections
        assert master.commitlog.max_offset == behind
    finally:
        await master.stopService()
    assert code == 3, slave.log_tail()
    result = slave.result
    assert result["event"] == "timeout"
    assert result["initial_max_offset"] == end
    assert result["connects"] >= 2
    assert set(result["reports"]) == {end}
    assert result["bytes"] == 0 and result["frames"] == 0 and result["heartbeats"] == 0
    expected = files(full)
    got = files(java_store)
    assert sorted(got) == sorted(expected)
    assert_same_files(got, expected, sorted(expected))


# -- RocketMQ master -> rmqha slave -----------------------------------------


async def start_java_master(
    reactor: Any,
    peer: list[str],
    store: str,
    max_offset: int,
    *extra: object,
    recovered: int | None = None,
    timeout_ms: int = 15000,
    batch: int = BATCH,
    heartbeat_ms: int = JAVA_HEARTBEAT_MS,
) -> tuple[JavaPeer, int]:
    """
    Start the Java master on the store at C{store}, serving up to
    C{max_offset}; C{recovered} is where RocketMQ's own recovery of that
    store must end (default: C{max_offset}).
    """
    master = spawn(
        reactor, peer, "master", 0, store, SEGMENT, batch, heartbeat_ms, timeout_ms, max_offset, *extra
    )
    listening = await within(reactor, master.first_line(), 20, "the Java master to listen")
    assert listening is not None and listening["event"] == "listening", (
        f"{master.lines}\n{master.log_tail()}"
    )
    # RocketMQ's own recovery of the store rmqha wrote ends where rmqha's does.
    assert listening["recovered_max_offset"] == (max_offset if recovered is None else recovered)
    assert listening["max_offset"] == max_offset
    return master, listening["port"]


#: (haTransferBatchSize, haSendHeartbeatInterval) of the Java master:
#: RocketMQ's batch with fast heartbeats; 1 MiB frames with a heartbeat
#: whenever a millisecond has passed since the last write.
VARIANTS = [(BATCH, JAVA_HEARTBEAT_MS), (SEGMENT, 0)]
VARIANT_IDS = ["32KiB-frames", "1MiB-frames-heartbeat-0"]


def assert_frames(connection: dict[str, Any], start: int, end: int, batch: int = BATCH) -> None:
    """
    The Java master's frames: contiguous from C{start} to C{end}, none
    larger than the batch size or crossing a file boundary.
    """
    offsets, sizes = connection["frame_offsets"], connection["frame_sizes"]
    assert offsets[0] == start
    position = start
    for offset, size in zip(offsets, sizes):
        assert offset == position
        assert 0 < size <= batch
        assert offset // SEGMENT == (offset + size - 1) // SEGMENT
        position += size
    assert position == end


def assert_writes(connection: dict[str, Any], start: int, end: int) -> None:
    """
    Everything the Java master wrote, in order: data frames contiguous from
    C{start} to C{end}, and every heartbeat naming exactly the offset the
    stream continues from.
    """
    position = start
    for write in connection["writes"]:
        kind, _, where = write.partition("@")
        if kind == "H":
            assert int(where) == position, connection["writes"]
        else:
            offset, size = map(int, where.split("+"))
            assert offset == position, connection["writes"]
            position += size
    assert position == end


async def serve_rmqha_slave(
    reactor: Any,
    peer: list[str],
    master_store: str,
    slave_store: str,
    end: int,
    batch: int,
    heartbeat_ms: int,
) -> dict[str, Any]:
    """
    The Java master serves the store at C{master_store} (max offset
    C{end}) to an rmqha slave Broker on C{slave_store} until the slave has
    acknowledged C{end}; with C{heartbeat_ms} 0 it then goes on serving
    (heartbeats only) for a while.

    @return: the Java master's summary of the connection.
    """
    idle = heartbeat_ms == 0
    extra = ("--no-exit-on-ack",) if idle else ()
    java, port = await start_java_master(
        reactor,
        peer,
        master_store,
        end,
        *extra,
        batch=batch,
        heartbeat_ms=heartbeat_ms,
        timeout_ms=1500 if idle else 15000,
    )
    slave = broker(reactor, slave_store, Role.SLAVE, master_endpoint=f"tcp:host=127.0.0.1:port={port}")
    started = reactor.seconds()
    slave.startService()
    try:
        await until(reactor, lambda: slave.commitlog.max_offset == end, "the rmqha slave to catch up")
        caught_up = reactor.seconds() - started
        code = await within(reactor, java.ended(), 25, "the Java master")
        connections_made = replication_of(slave).connections_made
    finally:
        await slave.stopService()
        await java.stop(reactor)
    assert code == 0, f"{java.lines}\n{java.log_tail()}"
    summary = java.result
    assert summary["event"] == ("timeout" if idle else "acked")
    (connection,) = classic(summary["connections"])
    assert_probe_invisible(java)
    assert connections_made == 1
    # Started, probed (0.5 s of silence), reported on the probe's own
    # connection and caught up: well within 2 s on an idle machine (the
    # bound is generous for a loaded CI host).
    print(f"rmqha slave at the Java master's max offset {caught_up:.2f} s after starting")
    assert caught_up < 4.0, caught_up
    assert end in connection["reports"]
    assert connection["close_reason"] is None
    if idle:
        # Caught up, the slave got heartbeats at its own max offset (one
        # every ~100 ms: allWaitForRunning(100)) and kept acknowledging.
        assert connection["heartbeats"] >= 3
        assert connection["writes"][-1] == f"H@{end}"
    assert_writes(connection, connection["transfer_from"], end)
    assert_frames(connection, connection["transfer_from"], end, batch)
    return connection


@pytest.mark.parametrize("batch, heartbeat_ms", VARIANTS, ids=VARIANT_IDS)
@pytest_twisted.ensureDeferred
async def test_rmqha_slave_gets_last_file(
    tmp_path: Any, peer: list[str], batch: int, heartbeat_ms: int
) -> None:
    """
    An empty rmqha slave reports 0 at once; RocketMQ's master applies its
    slave-offset-0 rule and sends the last file only, from its start.  The
    rmqha slave's one segment is identical to the master's, and its store
    opens afterwards with every record decoding (CRC checked) as the
    master's do.  Also with 1 MiB frames and haSendHeartbeatInterval 0,
    where the master sends a heartbeat whenever a millisecond has passed
    since its last write (usually one at the start offset before any data
    reaches the empty slave, then many once it has caught up).
    """
    from twisted.internet import reactor

    master_store = str(tmp_path / "master")
    end = write_store(master_store)
    last = end - end % SEGMENT
    slave_store = str(tmp_path / "slave")
    connection = await serve_rmqha_slave(
        reactor, peer, master_store, slave_store, end, batch, heartbeat_ms
    )
    assert connection["request_offset"] == 0
    assert connection["transfer_from"] == last

    got, expected = files(slave_store), files(master_store)
    assert sorted(got) == [segment_name(last)]
    assert_same_files(got, expected, [segment_name(last)])
    with CommitLog.open(slave_store, read_only=True) as replica, CommitLog.open(
        master_store, read_only=True
    ) as original:
        assert replica.min_offset == last
        assert replica.max_offset == end
        copied = list(replica.records(check_crc=True))
        assert copied
        originals = list(original.records(start=copied[0].offset, check_crc=True))
        assert len(copied) == len(originals)
        same = copied == originals
        assert same, "the replica's records differ from the master's"


def classic(connections: list[dict[str, Any]], probing: bool = False) -> list[dict[str, Any]]:
    """
    The replication connections RocketMQ's master saw, each checked to be
    an rmqha slave's probe kept: it opens with 8 bytes of -1 (the probe),
    which leave RocketMQ's request offset at its "none yet" -1 -- the
    master sends nothing and waits -- and goes on with the slave's real
    report on the same connection, which RocketMQ takes as the request
    offset.  No connection is a probe closed unanswered.

    @param probing: the last connection may still have been waiting for
        the end of its probe when the master stopped (the slave
        reconnects again and again); it is left out.
    """
    from rmqha.ha._wire import CONTROL_PROBE

    assert connections, "RocketMQ's master saw no connection"
    if probing and connections[-1]["reports"] == [CONTROL_PROBE]:
        assert not connections[-1]["closed"], connections[-1]
        connections = connections[:-1]
    for connection in connections:
        reports = connection["reports"]
        assert reports[0] == CONTROL_PROBE, connection
        assert len(reports) >= 2 and reports[1] >= 0, connection
        assert connection["request_offset"] == reports[1], connection
        assert CONTROL_PROBE not in reports[1:], connection
    return connections


def assert_probe_invisible(java: JavaPeer, drops: bool = False) -> None:
    """
    RocketMQ's master logged nothing about the probe beyond the request
    offset -1 it keeps for "none yet": no "Offset not matched", no other
    negative request offset, and no ERROR line at all (4.9.8 logs two,
    C{read socket[...] < 0} and C{processReadEvent error}, for every slave
    connection that closes, as a probe given up on did).

    @param drops: the master drops the slave for acks beyond its max
        offset (its WARN line); each drop's own C{processReadEvent error}
        is allowed, nothing else.
    """
    log = bytes(java.stderr).decode("utf-8", "replace")
    assert "Offset not matched" not in log, log
    negative = re.findall(r"request offset (-\d+)", log)
    assert set(negative) <= {"-1"}, negative
    errors = [line for line in log.splitlines() if "] ERROR " in line]
    if drops:
        dropped = log.count("greater than local commitLog offset")
        assert dropped >= 1, log
        assert all(line.endswith(": processReadEvent error") for line in errors), errors
        assert len(errors) == dropped, "\n".join(errors)
    else:
        assert errors == [], "\n".join(errors)


@pytest.mark.parametrize("batch, heartbeat_ms", VARIANTS, ids=VARIANT_IDS)
@pytest_twisted.ensureDeferred
async def test_rmqha_slave_resumes(
    tmp_path: Any, peer: list[str], batch: int, heartbeat_ms: int
) -> None:
    """
    An rmqha slave that already holds the log up to a record boundary in
    the second segment reports that offset; RocketMQ's master resumes
    there, and the two stores end identical, every segment.
    """
    from twisted.internet import reactor

    master_store = str(tmp_path / "master")
    end = write_store(master_store)
    resume = record_boundary(master_store, SEGMENT + SEGMENT // 3)
    slave_store = str(tmp_path / "slave")
    copy_prefix(master_store, slave_store, resume)
    with CommitLog.open(slave_store, read_only=True) as before:
        assert before.max_offset == resume

    connection = await serve_rmqha_slave(
        reactor, peer, master_store, slave_store, end, batch, heartbeat_ms
    )
    assert connection["request_offset"] == resume
    assert connection["transfer_from"] == resume
    expected = files(master_store)
    got = files(slave_store)
    assert sorted(got) == sorted(expected)
    assert_same_files(got, expected, sorted(expected))
    with CommitLog.open(slave_store, read_only=True) as replica:
        assert replica.max_offset == end
        assert sum(1 for _ in replica.records(check_crc=True)) > 0


@pytest_twisted.ensureDeferred
async def test_rmqha_slave_ahead_of_java_master(tmp_path: Any, peer: list[str]) -> None:
    """
    4.9.x's master (RocketMQ #3015) takes a slave's first report unchecked
    but closes the connection on a later ack beyond its max offset.  An
    rmqha slave holding more than the Java master sees only a heartbeat
    at its own offset, its next report gets it dropped, it reconnects and
    is dropped again; nothing is written to it.
    """
    from twisted.internet import reactor

    master_store = str(tmp_path / "master")
    end = write_store(master_store)
    slave_store = str(tmp_path / "slave")
    copy_prefix(master_store, slave_store, end)
    # The Java master serves only up to an earlier record boundary.
    served = record_boundary(master_store, end - 100_000)
    assert served < end
    java, port = await start_java_master(
        reactor, peer, master_store, served, "--no-exit-on-ack", recovered=end, timeout_ms=2500
    )
    slave = broker(reactor, slave_store, Role.SLAVE, master_endpoint=f"tcp:host=127.0.0.1:port={port}")
    slave.startService()
    try:
        code = await within(reactor, java.ended(), 20, "the Java master's timeout")
        assert slave.commitlog.max_offset == end
        assert replica_of(slave).slave_factory is not None
        assert replication_of(slave).bytes_received == 0
    finally:
        await slave.stopService()
        await java.stop(reactor)
    assert code == 0, java.log_tail()
    connections = classic(java.result["connections"], probing=True)
    assert_probe_invisible(java, drops=True)
    assert len(connections) >= 2
    for connection in connections[:-1]:
        assert connection["request_offset"] == end
        assert connection["frames"] == 0
        assert connection["close_reason"] == f"ack {end} greater than max offset {served}"
    with CommitLog.open(slave_store, read_only=True) as replica:
        assert replica.max_offset == end
    expected = files(master_store)
    got = files(slave_store)
    assert sorted(got) == sorted(expected)
    assert_same_files(got, expected, sorted(expected))
