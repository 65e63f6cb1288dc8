# -*- test-case-name: tests.test_demo -*-
"""
The quick-start demo (C{rmqha demo}): a master and a slave on loopback in
one process, over real sockets.

The master takes a backlog of messages first, then the slave starts empty
and catches up while the master keeps taking messages; progress is shown
as the slave's acknowledged bytes, percentage, rate and ETA.  The demo
ends with a byte-for-byte comparison of the two stores' segment files.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import IO, Any

from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.task import deferLater, react

from rmqha.broker import Broker, Role
from rmqha.commitlog import CommitLog, Message
from rmqha.master import HAConfig

__all__ = ["run_demo", "compare_stores"]

_TOPICS = ("DemoOrders", "DemoPayments", "DemoAudit")


def compare_stores(a: str, b: str) -> tuple[bool, int, int]:
    """
    Compare two stores' segment files byte for byte.

    @return: C{(identical, segment count, bytes compared)}.
    """
    dir_a, dir_b = os.path.join(a, "commitlog"), os.path.join(b, "commitlog")
    names = sorted(os.listdir(dir_a))
    if names != sorted(os.listdir(dir_b)):
        return False, len(names), 0
    compared = 0
    for name in names:
        with open(os.path.join(dir_a, name), "rb") as fa, open(os.path.join(dir_b, name), "rb") as fb:
            while True:
                chunk_a, chunk_b = fa.read(1 << 20), fb.read(1 << 20)
                if chunk_a != chunk_b:
                    return False, len(names), compared
                if not chunk_a:
                    break
                compared += len(chunk_a)
    return True, len(names), compared


def _mib(n: float) -> str:
    return f"{n / (1 << 20):8.1f} MiB"


async def _demo(reactor: Any, directory: str, count: int, live: int, out: IO[str]) -> int:
    segment_size = 64 << 20
    master_dir = os.path.join(directory, "master")
    slave_dir = os.path.join(directory, "slave")

    def broker(store: str, role: Role, **kwargs: Any) -> Broker:
        return Broker(
            reactor,
            lambda: CommitLog.open(store, segment_size=segment_size, clock=reactor.seconds),
            role,
            config=HAConfig(heartbeat_interval=1.0),
            retry_policy=lambda attempt: 0.2,
            **kwargs,
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


def run_demo(directory: str, count: int, live: int, out: IO[str]) -> int:
    """
    Run the demo in C{directory} (replaced if it exists) under the global
    reactor.

    @return: the exit status: 0 when the stores end identical.
    """
    if os.path.exists(directory):
        shutil.rmtree(directory)
    status: list[int] = []

    def main(reactor: Any) -> Deferred[None]:
        async def go() -> None:
            status.append(await _demo(reactor, directory, count, live, out))

        return ensureDeferred(go())

    try:
        react(main)
    except SystemExit as e:
        if e.code:
            return int(e.code)
    return status[0] if status else 1
