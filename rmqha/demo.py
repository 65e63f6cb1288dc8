# -*- test-case-name: tests.test_demo -*-
"""
The quick-start demo (C{rmqha demo}): a master and a slave on loopback in
one process, over real sockets, fed and read through rmqha.client.
C{rmqha demo --failover}: automatic failover, three broker processes and
one etcd member (L{run_failover_demo}), started by the demo's launcher,
L{rmqha._demo_launcher}.

Both brokers answer RocketMQ's remoting protocol and register with a
NameServer (rmqha.testing's L{FakeNameServer}, in the same process; a
real deployment runs RocketMQ's), and the messages go in and out as a
RocketMQ user's application sends and reads them: through L{rmqha.client}
(docs/client.md), routed by the NameServer.  A L{Producer} sends a
backlog of batches to the master first; then the slave starts empty and
catches up, and a consumer group of two L{PushConsumer}s reads every
message, while the producer keeps sending; progress is shown as the
slave's acknowledged bytes, percentage, rate and ETA, and the messages
produced and consumed.  The demo ends checking that every message
produced was consumed exactly once (by message id), and comparing the two
stores byte for byte: the commit logs' segment files, then the consume
queues.

The demo deletes only what it created: without C{--dir} it works in a new
temporary directory and removes it at the end; C{--dir DIR} must be new,
empty, or a directory an earlier demo made (it holds the L{MARKER} file),
and of that only the two stores are replaced, after checking that they
hold nothing but store files.  A C{--dir} is locked for the whole run
(L{rmqha._locks.lock_directory}): a second demo there refuses in one line
naming the first one's pid, before it changes anything.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from typing import IO, Any, Callable

from twisted.internet.defer import (
    Deferred, DeferredSemaphore, ensureDeferred, gatherResults, maybeDeferred,
)
from twisted.internet.task import deferLater, react

from rmqha._files import compare_stores
from rmqha._locks import DIRECTORY_LOCK, lock_directory
from rmqha.assemble import _remoting_port
from rmqha.broker import Broker
from rmqha.client import (
    ConsumeFromWhere, Producer, PushConsumer, ReceivedMessage, SendError, SendStatus,
)
from rmqha.client import Message as ClientMessage
from rmqha.ha.config import Role
from rmqha.remoting.metadata import TopicConfig
from rmqha.remoting.registration import store_host_for
from rmqha.store.commitlog import CommitLog
from rmqha.settings import BrokerSettings
from rmqha.testing import FakeNameServer

__all__ = [
    "DemoDirectoryError", "MARKER", "compare_stores", "prepare_directory", "run_demo",
    "run_failover_demo",
]

#: The file that marks a directory as the demo's own (C{--dir}).
MARKER = ".rmqha-demo"
_STORES = ("master", "slave")
#: What a store holds (relative paths): the files a re-run may delete.
_STORE_FILE = re.compile(
    r"(lock|abort|checkpoint|commitlog/[0-9]{20}|consumequeue/[^/]+/[0-9]+/[0-9]{20}"
    r"|config/[A-Za-z]+\.json(\.bak|\.tmp)?|rmqha/[^/]+(/[^/]+)*)\Z"
)

_TOPICS = ("DemoOrders", "DemoPayments", "DemoAudit")


class DemoDirectoryError(ValueError):
    """
    C{--dir} names a directory the demo must not write into (the message
    says why, in one line).
    """


def _store_files(store: str) -> tuple[list[str], list[str]]:
    """
    The files and directories (deepest first) of an earlier demo's store.

    @raise DemoDirectoryError: something in it is not a store file (or is
        a symbolic link); nothing is deleted then.
    """
    files: list[str] = []
    directories: list[str] = []
    for parent, subdirs, names in os.walk(store, topdown=False):
        for name in names + subdirs:
            path = os.path.join(parent, name)
            relative = os.path.relpath(path, store).replace(os.sep, "/")
            if os.path.islink(path):
                raise DemoDirectoryError(f"{path} is a symbolic link, not the demo's; not deleting it")
            if name in subdirs:
                directories.append(path)
            elif _STORE_FILE.match(relative):
                files.append(path)
            else:
                raise DemoDirectoryError(
                    f"{path} is not a store file the demo wrote; not deleting it "
                    "(move it away or choose another --dir)"
                )
    directories.append(store)
    return files, directories


def prepare_directory(directory: str) -> int:
    """
    Make C{directory} ready for a demo run, deleting only what an earlier
    demo wrote there: create it (or take it if empty), lock it
    (L{rmqha._locks.lock_directory}) and mark it with L{MARKER}; in a
    marked directory, remove the two stores of the last run (C{master/}
    and C{slave/}, if they hold only store files).  Other files in it are
    left alone.

    @return: the lock's descriptor: the directory is the caller's until
        it closes it (or ends).
    @raise DemoDirectoryError: C{directory} is not a directory, or is not
        empty and not marked, or a store holds something else (nothing
        was changed).
    @raise rmqha._locks.InUseError: another demo runs in it (nothing was
        changed).
    """
    marker = os.path.join(directory, MARKER)
    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise DemoDirectoryError(f"--dir {directory} exists and is not a directory")
    if _holds_files(directory) and not os.path.isfile(marker):
        raise DemoDirectoryError(
            f"--dir {directory} is not empty and not an earlier demo's (no {MARKER} "
            "file); the demo writes only into a new or empty directory"
        )
    lock = _lock(directory)
    try:
        stores = [os.path.join(directory, n) for n in _STORES]
        for store in stores:
            if os.path.islink(store) or (os.path.lexists(store) and not os.path.isdir(store)):
                raise DemoDirectoryError(
                    f"{store} is not a directory the demo made; not deleting it"
                )
        # Every check before the first deletion: a refusal deletes nothing.
        found = [_store_files(s) for s in stores if os.path.lexists(s)]
        for files, directories in found:
            for path in files:
                os.unlink(path)
            for path in directories:
                os.rmdir(path)
        with open(marker, "w") as f:
            f.write(
                "Written by `rmqha demo`: a later `rmqha demo --dir` here replaces "
                "master/ and slave/ (store files only) and nothing else.\n"
            )
    except BaseException:
        os.close(lock)
        raise
    return lock


def _holds_files(directory: str) -> bool:
    """
    Whether C{directory} exists and holds anything but a lock file.
    """
    return os.path.isdir(directory) and bool(set(os.listdir(directory)) - {DIRECTORY_LOCK})


def _lock(directory: str) -> int:
    """
    Create C{directory} if needed and take its lock for this run.

    @raise rmqha._locks.InUseError: another process holds it (C{DIR is in
        use by another rmqha (pid N)}).
    """
    os.makedirs(directory, exist_ok=True)
    return lock_directory(directory)


def _mib(n: float) -> str:
    return f"{n / (1 << 20):8.1f} MiB"


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}" + ("" if n == 1 else "s")


#: The broker's name (C{brokerName}) the master and the slave register
#: under, and the client groups.
BROKER_NAME = "demo-broker"
PRODUCER_GROUP = "DemoProducers"
CONSUMER_GROUP = "DemoConsumers"
#: Messages per SEND_BATCH_MESSAGE, and batches awaiting their answers.
_BATCH = 64
_IN_FLIGHT = 8
#: Members of the consumer group (one process here; a group is usually
#: spread over processes and hosts).
_MEMBERS = 2


class _Tally:
    """
    What the demo's clients did: every message id the broker accepted,
    and how many times each was consumed, by which member.
    """

    def __init__(self, members: int) -> None:
        self.produced: list[str] = []
        self.consumed: dict[str, int] = {}
        self.by_member = [0] * members

    def handler(self, member: int) -> Callable[[list[ReceivedMessage]], None]:
        def handle(messages: list[ReceivedMessage]) -> None:
            self.by_member[member] += len(messages)
            for m in messages:
                self.consumed[m.msg_id] = self.consumed.get(m.msg_id, 0) + 1

        return handle

    def check(self) -> tuple[int, int, int]:
        """
        C{(consumed at least once, missing, duplicate deliveries)} of the
        ids produced (a message consumed 3 times is 2 duplicates).
        """
        once = missing = 0
        for message_id in self.produced:
            if self.consumed.get(message_id, 0):
                once += 1
            else:
                missing += 1
        duplicates = sum(n - 1 for n in self.consumed.values() if n > 1)
        return once, missing, duplicates


async def _produce(
    producer: Producer, count: int, body: bytes, tally: _Tally, progress: Callable[[], None]
) -> None:
    """
    Send C{count} messages of C{body} through C{producer}, in batches of
    L{_BATCH} (each batch one topic, the topics in turn), L{_IN_FLIGHT} at
    once; each accepted message's id goes to C{tally}.

    @raise rmqha.client.SendError: a batch failed (the first failure; no
        batch is sent after it).
    """
    slots = DeferredSemaphore(_IN_FLIGHT)
    failures: list[Exception] = []
    pending: list[Deferred[None]] = []

    async def one(topic: str, n: int) -> None:
        try:
            result = await producer.send_batch(
                [ClientMessage(topic, body, tags="demo") for _ in range(n)]
            )
            if result.status is not SendStatus.SEND_OK:
                raise RuntimeError(f"a batch to {topic} was answered {result.status.name}")
            tally.produced.extend(result.msg_id.split(","))
            progress()
        except Exception as e:
            failures.append(e)
        finally:
            slots.release()

    for i, start in enumerate(range(0, count, _BATCH)):
        await slots.acquire()
        if failures:
            slots.release()
            break
        pending = [d for d in pending if not d.called]
        topic = _TOPICS[i % len(_TOPICS)]
        pending.append(Deferred.fromCoroutine(one(topic, min(_BATCH, count - start))))
    await gatherResults(pending)
    if failures:
        raise failures[0]


async def _until(
    reactor: Any, condition: Callable[[], bool], what: str, timeout: float = 30.0
) -> None:
    """
    Wait for C{condition} (checked every 20 ms).

    @raise RuntimeError: not within C{timeout} seconds (naming C{what}).
    """
    deadline = reactor.seconds() + timeout
    while not condition():
        if reactor.seconds() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        await deferLater(reactor, 0.02, lambda: None)


async def _demo(
    reactor: Any, directory: str, count: int, live: int, out: IO[str], segment_size: int
) -> int:
    master_dir = os.path.join(directory, "master")
    slave_dir = os.path.join(directory, "slave")
    namesrv = FakeNameServer(reactor)
    namesrv_port = await namesrv.listen(reactor, "tcp:0:interface=127.0.0.1")
    namesrv_addr = f"127.0.0.1:{getattr(namesrv_port.getHost(), 'port')}"
    out.write(
        f"namesrv: {namesrv_addr} (rmqha.testing.FakeNameServer, in this process; a real "
        "deployment runs RocketMQ's NameServer, mqnamesrv)\n"
    )

    def broker(store: str, role: Role, **settings: Any) -> Broker:
        config = BrokerSettings(
            role=role, heartbeat_interval=1.0, listen="tcp:0:interface=127.0.0.1",
            namesrv=(namesrv_addr,), group=BROKER_NAME, broker_ip1="127.0.0.1", **settings,
        )

        def open_commitlog() -> CommitLog:
            # (Opened once the remoting port listens: msgIds name it, as
            # twistd rmqha's do.)
            return CommitLog.open(
                store, segment_size=segment_size, clock=reactor.seconds, consume_queues=True,
                store_host=store_host_for(config, _remoting_port(made)),
            )

        made = Broker(
            config, reactor=reactor, open_commitlog=open_commitlog, retry_policy=lambda attempt: 0.2
        )
        return made

    services: list[Any] = []  # (stopped in reverse at the end)
    tally = _Tally(_MEMBERS)
    try:
        master = broker(master_dir, Role.MASTER, ha_listen="tcp:0:interface=127.0.0.1")
        master.startService()
        services.append(master)
        for topic in _TOPICS:
            # (What mqadmin updateTopic does; a producer's first send would
            # also create them, autoCreateTopicEnable.)
            master.metadata.update_topic(TopicConfig(topic, 4, 4))
        address = await master.ha_address()
        await _until(
            reactor,
            lambda: 0 in namesrv.brokers(BROKER_NAME) and set(_TOPICS) <= namesrv.topic_names(),
            "the master to register with the NameServer",
        )
        out.write(
            f"master: store {master_dir}, remoting port {namesrv.brokers(BROKER_NAME)[0]}, "
            f"HA port 127.0.0.1:{address.port}; registered as {BROKER_NAME} (brokerId 0) with "
            f"topics {', '.join(_TOPICS)} (4 queues each)\n"
        )
        producer = Producer(reactor, namesrv_addr, PRODUCER_GROUP)
        producer.startService()
        services.append(producer)
        body = os.urandom(1024)
        started = last_shown = time.perf_counter()

        def backlog_progress() -> None:
            nonlocal last_shown
            now = time.perf_counter()
            if now - last_shown >= 1.0:
                last_shown = now
                out.write(f"  produced {len(tally.produced):,} of {count:,}\n")
                out.flush()

        await _produce(producer, count, body, tally, backlog_progress)
        elapsed = time.perf_counter() - started
        backlog = master.commitlog.max_offset
        out.write(
            f"producer: {count:,} messages of 1 KiB sent with rmqha.client's Producer "
            f"(SEND_BATCH_MESSAGE, {_BATCH} a batch) through the NameServer's route: "
            f"{_mib(backlog).strip()} stored on the master in {elapsed:.1f} s\n"
        )
        slave = broker(slave_dir, Role.SLAVE, broker_id=1)
        slave.startService()
        services.append(slave)
        members = []
        for n in range(_MEMBERS):
            consumer = PushConsumer(
                reactor, namesrv_addr, CONSUMER_GROUP, tally.handler(n),
                consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                consume_batch_size=32, client_id=f"127.0.0.1@demo-{n + 1}",
            )
            for topic in _TOPICS:
                consumer.subscribe(topic)
            members.append(consumer)
        for consumer in members:
            consumer.startService()
            services.append(consumer)
        out.write(
            f"slave:  store {slave_dir}, brokerId 1, following the master the NameServer "
            "names, from offset 0\n"
            f"consumers: group {CONSUMER_GROUP}, {_MEMBERS} PushConsumers sharing the "
            "12 queues, from the first offset\n"
        )
        out.flush()
        status = await _catch_up(reactor, master, producer, live, body, tally, out)
    except (SendError, RuntimeError) as e:
        out.write(f"the demo stopped: {e}\n")
        return 1
    finally:
        # The consumers first (they commit their offsets and unregister),
        # then the producer, the slave, the master.
        for service in reversed(services):
            await service.stopService()
        await maybeDeferred(namesrv_port.stopListening)
    return 0 if _report(master_dir, slave_dir, tally, out) and status == 0 else 1


def _report(master_dir: str, slave_dir: str, tally: _Tally, out: IO[str]) -> bool:
    """
    The demo's last checks, each written as one line: every message
    produced was consumed (by id; duplicates are counted, not failed:
    delivery is at least once), and the two stores' commit logs and
    consume queues are identical byte for byte.

    @return: whether all of them hold.
    """
    once, missing, duplicates = tally.check()
    shares = ", ".join(f"{n:,}" for n in tally.by_member)
    if not missing and not duplicates:
        verdict = " (every one exactly once)"
    elif not missing:
        # (Delivery is at least once, as RocketMQ's: a rebalance while a
        # member's heartbeat is on its way may hand a queue on before its
        # offset is committed. A duplicate is counted, a loss fails.)
        verdict = " (none lost; duplicates are what at-least-once delivery allows: docs/client.md)"
    else:
        verdict = ""
    out.write(
        f"consumed: {once:,} of the {len(tally.produced):,} messages produced ({shares} by "
        f"the {len(tally.by_member)} members); {missing:,} missing, {duplicates:,} consumed "
        f"twice or more{verdict}\n"
    )
    identical, segments, compared = compare_stores(master_dir, slave_dir)
    if identical:
        out.write(
            f"byte-for-byte comparison: IDENTICAL ({_count(segments, 'segment file')}, "
            f"{_mib(compared).strip()} compared)\n"
        )
    else:
        out.write("byte-for-byte comparison: the stores DIFFER\n")
    queues_identical, queue_files, queue_bytes = compare_stores(master_dir, slave_dir, "consumequeue")
    # (Messages were produced, so the brokers must have built queues.)
    queues_identical = queues_identical and (queue_files > 0 or not tally.produced)
    if queues_identical:
        out.write(
            f"consume queues: IDENTICAL on master and slave ({_count(queue_files, 'queue file')}, "
            f"{_mib(queue_bytes).strip()} compared)\n"
        )
    else:
        out.write(
            f"consume queues: DIFFER on master and slave ({_count(queue_files, 'queue file')} "
            "on the master)\n"
        )
    return identical and queues_identical and not missing


async def _catch_up(
    reactor: Any, master: Broker, producer: Producer, live: int, body: bytes, tally: _Tally,
    out: IO[str],
) -> int:
    """
    Keep producing C{live} messages, in eight steps a quarter of a second
    apart, while the slave catches up and the consumers consume; until
    the slave has acknowledged the master's every byte and every message
    produced was consumed (at most 300 s).  Progress is shown four times
    a second while the producer sends or the slave is behind, then once a
    second.

    @return: 0, or 1 when it timed out.
    """
    produced = 0
    per_tick = max(1, live // 8)
    first = time.perf_counter()
    last_time, last_bytes, last_consumed = first, 0, 0
    tick = 0
    while True:
        # The producer keeps sending while the slave catches up.
        batch = min(per_tick, live - produced)
        if batch:
            await _produce(producer, batch, body, tally, lambda: None)
        produced += batch
        await deferLater(reactor, 0.25, lambda: None)
        tick += 1
        target = master.commitlog.max_offset
        acked = max((s.ack_offset or 0 for s in master.slaves()), default=0)
        consumed = len(tally.consumed)
        done = produced >= live and acked == target and consumed >= len(tally.produced)
        now = time.perf_counter()
        if batch or acked < target or done or tick % 4 == 0:
            elapsed = now - last_time
            rate = (acked - last_bytes) / elapsed
            consume_rate = (consumed - last_consumed) / elapsed
            last_time, last_bytes, last_consumed = now, acked, consumed
            eta = 0.0 if acked >= target else (target - acked) / rate if rate > 0 else None
            out.write(
                f"  slave acked {_mib(acked)} of {_mib(target)} "
                f"({100 * acked / target if target else 100.0:5.1f}%)  {rate / 1e6:7.1f} MB/s  "
                f"ETA {'   --  ' if eta is None else f'{eta:5.1f} s'}"
                f"  | produced {len(tally.produced):7,}  consumed {consumed:7,} "
                f"({consume_rate:6,.0f}/s)\n"
            )
            out.flush()
        if done:
            break
        if now - first > 300:
            out.write(
                "within 300 s the slave did not catch up or the consumers did not consume "
                "every message\n"
            )
            return 1
    total = time.perf_counter() - first
    out.write(
        f"caught up: {_mib(master.commitlog.max_offset).strip()} replicated and "
        f"{len(tally.consumed):,} messages consumed in {total:.1f} s\n"
    )
    return 0


def run_demo(
    directory: str | None,
    count: int,
    live: int,
    out: IO[str],
    segment_size: int = 64 << 20,
) -> int:
    """
    Run the demo under the global reactor, in C{directory} (see
    L{prepare_directory}; kept afterwards) or, when it is C{None}, in a new
    temporary directory removed at the end.

    @raise DemoDirectoryError: C{directory} is not the demo's to write in.
    @return: the exit status: 0 when the stores end identical.
    """
    if directory is None:
        scratch = tempfile.mkdtemp(prefix="rmqha-demo-")
        out.write(f"stores in {scratch} (removed at the end; --dir DIR keeps them)\n")
        where = scratch
        lock = None
    else:
        lock = prepare_directory(directory)
        scratch, where = None, directory
    status: list[int] = []

    def main(reactor: Any) -> Deferred[None]:
        async def go() -> None:
            status.append(await _demo(reactor, where, count, live, out, segment_size))

        return ensureDeferred(go())

    try:
        react(main)
    except SystemExit as e:
        if e.code:
            return int(e.code)
    finally:
        if scratch is not None:
            # Made by mkdtemp above, so all of it is the demo's.
            shutil.rmtree(scratch, ignore_errors=True)
        if lock is not None:
            os.close(lock)
    return status[0] if status else 1


def run_failover_demo(
    directory: str | None,
    out: IO[str],
    kills: int = 1,
    segment_size: int = 4 << 20,
) -> int:
    """
    The failover demo (C{rmqha demo --failover}, docs/failover.md): one
    etcd member and three brokers (C{twistd -n rmqha} processes) on
    loopback, three HTTP producers putting SYNC messages to whoever is
    master (following the 503 master hint); the master is killed with
    SIGKILL C{kills} times and restarted, and the demo shows the new master
    taking over, every C{PUT_OK} on it, and the old master rejoining; it
    ends comparing the three stores byte for byte and checking each.

    In C{directory} (new or empty; kept) or, when it is C{None}, in a new
    temporary directory removed at the end.  Every process it starts is
    stopped at the end.

    @raise DemoDirectoryError: C{directory} is not new or empty, or etcd
        is not installed.
    @return: the exit status: 0 when no C{PUT_OK} was lost and the stores
        end identical and sound.
    """
    from rmqha._demo_launcher import (
        BrokerGroup, LocalEtcd, Producers, converge_and_check, etcd_binary, kill_masters,
        wait_in_sync,
    )

    if etcd_binary() is None:
        raise DemoDirectoryError(
            "--failover needs etcd (Debian: apt-get install etcd-server; "
            "python3 dev.py test installs it as root)"
        )
    if directory is None:
        scratch = where = tempfile.mkdtemp(prefix="rmqha-failover-demo-")
        out.write(f"stores in {scratch} (removed at the end; --dir DIR keeps them)\n")
        lock = None
    else:
        if os.path.lexists(directory) and (
            not os.path.isdir(directory) or _holds_files(directory)
        ):
            raise DemoDirectoryError(
                f"--dir {directory}: the failover demo writes only into a new or empty directory"
            )
        lock = _lock(directory)
        scratch, where = None, directory
    started = time.monotonic()

    def say(text: str) -> None:
        out.write(f"[{time.monotonic() - started:6.2f}] {text}\n")
        out.flush()

    try:
        with LocalEtcd(os.path.join(where, "etcd")) as etcd:
            say(f"etcd: one member at {etcd.endpoint}")
            with BrokerGroup(where, etcd.spec, 3, segment_size=segment_size) as group:
                say(
                    f"group {group.group}: a CA, a key pair per node and a group secret in "
                    f"{os.path.join(where, 'auth')} (rmqha certs init --group); every HA "
                    "connection proves both ends' node ids with the secret"
                )
                for node in group.nodes:
                    say(
                        f"{node.node_id}: twistd rmqha --coordinator etcd:... --node-id "
                        f"{node.node_id} --group-secret-file .../group.secret --http "
                        f"{node.http} (a slave until elected); log {group.log_path(node.index)}"
                    )
                master = group.wait_master()
                say(f"{group.nodes[master].node_id} elected master (epoch 1)")
                load = Producers(group, 3)
                say("3 HTTP producers put SYNC messages to the master, following its 503 hint")
                try:
                    time.sleep(2)
                    kills_seen = kill_masters(group, load, kills, say=say)
                    last = kills_seen[-1]
                    wait_in_sync(group, last["new"], 3)
                    old = group.nodes[last["old"]]
                    status = group.status(old.index) or {}
                    say(
                        f"{old.node_id} is back in the in-sync set, following "
                        f"{group.nodes[last['new']].node_id} (cut back "
                        f"{status.get('epoch_truncated_bytes', 0)} bytes it alone had)"
                    )
                    time.sleep(1)
                finally:
                    load.stop()
                puts = load.puts()
                say(
                    f"producers stopped: {sum(p.ok for p in puts)} PUT_OK, "
                    f"{sum(not p.ok for p in puts)} other answers (503 while there was no "
                    "master, or no answer from the dead one)"
                )
                end = converge_and_check(group, None)
        lost = sum(k["missing"] for k in kills_seen)
        identical = all(end["identical"].values())
        sound = all(end["check"].values())
        say(f"PUT_OK lost: {lost}")
        say(
            "byte-for-byte comparison of the three stores: "
            + ("IDENTICAL" if identical else f"DIFFER {end['identical']}")
        )
        say("rmqha store check: " + ("sound" if sound else f"FAILED {end['check_output']}"))
        return 0 if lost == 0 and identical and sound else 1
    finally:
        if scratch is not None:
            # Made by mkdtemp above, so all of it is the demo's.
            shutil.rmtree(scratch, ignore_errors=True)
        if lock is not None:
            os.close(lock)
