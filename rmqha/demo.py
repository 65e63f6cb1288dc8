# -*- test-case-name: tests.test_demo -*-
"""
The quick-start demo (C{rmqha demo}): a master and a slave on loopback in
one process, over real sockets.  C{rmqha demo --failover}: automatic
failover, three broker processes and one etcd member (L{run_failover_demo}),
started by the demo's launcher, L{rmqha._demo_launcher}.

The master takes a backlog of messages first, then the slave starts empty
and catches up while the master keeps taking messages; progress is shown
as the slave's acknowledged bytes, percentage, rate and ETA.  The demo
ends with a byte-for-byte comparison of the two stores' segment files.

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
from typing import IO, Any

from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.task import deferLater, react

from rmqha._files import compare_stores
from rmqha._locks import DIRECTORY_LOCK, lock_directory
from rmqha.broker import Broker
from rmqha.ha.config import Role
from rmqha.store._record import Message
from rmqha.store.commitlog import CommitLog
from rmqha.settings import BrokerSettings

__all__ = [
    "DemoDirectoryError", "MARKER", "compare_stores", "prepare_directory", "run_demo",
    "run_failover_demo",
]

#: The file that marks a directory as the demo's own (C{--dir}).
MARKER = ".rmqha-demo"
_STORES = ("master", "slave")
#: What a store holds (relative paths): the files a re-run may delete.
_STORE_FILE = re.compile(r"(lock|abort|commitlog/[0-9]{20}|rmqha/[^/]+(/[^/]+)*)\Z")

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


async def _demo(
    reactor: Any, directory: str, count: int, live: int, out: IO[str], segment_size: int
) -> int:
    master_dir = os.path.join(directory, "master")
    slave_dir = os.path.join(directory, "slave")

    def broker(store: str, role: Role, **settings: Any) -> Broker:
        return Broker(
            BrokerSettings(role=role, heartbeat_interval=1.0, **settings),
            reactor=reactor,
            open_commitlog=lambda: CommitLog.open(
                store, segment_size=segment_size, clock=reactor.seconds, consume_queues=True
            ),
            retry_policy=lambda attempt: 0.2,
        )

    master = broker(master_dir, Role.MASTER, ha_listen="tcp:0:interface=127.0.0.1")
    master.startService()
    address = await master.ha_address()
    out.write(f"master: store {master_dir}, HA port 127.0.0.1:{address.port}\n")
    body = os.urandom(1024)
    started = time.perf_counter()
    for i in range(count):
        await master.put(Message(_TOPICS[i % 3], body, queue_id=i % 4, properties={"TAGS": "demo"}))
        if i % 5000 == 4999:
            await deferLater(reactor, 0, lambda: None)
    elapsed = time.perf_counter() - started
    backlog = master.commitlog.max_offset
    out.write(
        f"master: {count} messages of 1 KiB stored ({_mib(backlog).strip()}) in "
        f"{elapsed:.1f} s\n"
    )
    slave = broker(slave_dir, Role.SLAVE, master_endpoint=f"tcp:host=127.0.0.1:port={address.port}")
    slave.startService()
    out.write(f"slave:  store {slave_dir}, following the master from offset 0\n")
    out.flush()

    produced = 0
    per_tick = max(1, live // 8)
    first = time.perf_counter()
    last_time, last_bytes = first, 0
    while True:
        # The master keeps taking messages while the slave catches up.
        batch = min(per_tick, live - produced)
        for i in range(batch):
            await master.put(Message(_TOPICS[i % 3], body, queue_id=i % 4))
        produced += batch
        await deferLater(reactor, 0.25, lambda: None)
        target = master.commitlog.max_offset
        acked = max((s.ack_offset or 0 for s in master.slaves()), default=0)
        now = time.perf_counter()
        rate = (acked - last_bytes) / (now - last_time) if now > last_time else 0.0
        last_time, last_bytes = now, acked
        eta = (target - acked) / rate if rate > 0 else float("inf")
        out.write(
            f"  slave acked {_mib(acked)} of {_mib(target)} "
            f"({100 * acked / target:5.1f}%)  {rate / 1e6:7.1f} MB/s  "
            f"ETA {'--' if eta == float('inf') else f'{eta:5.1f} s'}\n"
        )
        out.flush()
        if produced >= live and acked == target:
            break
        if now - first > 300:
            out.write("the slave did not catch up within 300 s\n")
            break
    total = time.perf_counter() - first
    out.write(f"caught up: {_mib(master.commitlog.max_offset).strip()} replicated in {total:.1f} s\n")
    await slave.stopService()
    await master.stopService()
    identical, segments, compared = compare_stores(master_dir, slave_dir)
    if identical:
        out.write(
            f"byte-for-byte comparison: IDENTICAL ({segments} segment files, "
            f"{_mib(compared).strip()} compared)\n"
        )
        return 0
    out.write("byte-for-byte comparison: the stores DIFFER\n")
    return 1


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
