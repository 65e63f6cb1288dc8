"""
Divergence handling with real brokers over loopback: a slave ahead of its
master, one holding different bytes, and one behind the master's oldest
segment, under each C{--on-divergence} mode.
"""

from __future__ import annotations

import glob
import os
import shutil
from typing import Any

import pytest_twisted

from rmqha.admin import status
from rmqha.broker import Broker, Role
from rmqha.store._record import Message
from rmqha.store.commitlog import CommitLog

from tests._helpers import replication_of
from tests.integration._support import make_broker, store_digest, until

SEGMENT = 256 * 1024


def _fill(store: str, count: int, body: bytes = b"m") -> None:
    with CommitLog.open(store, segment_size=SEGMENT) as log:
        for i in range(count):
            log.put(Message("DivTopic", body * (300 + i % 5), queue_id=i % 2))


def _broker(reactor: Any, store: str, role: Role, **kwargs: Any) -> Broker:
    return make_broker(reactor, store, role, SEGMENT, heartbeat_interval=0.2, housekeeping_interval=3.0, **kwargs)


async def _run(reactor: Any, tmp_path: Any, mode: str) -> tuple[Broker, Broker]:
    master = _broker(reactor, str(tmp_path / "master"), Role.MASTER,
                     ha_listen="tcp:0:interface=127.0.0.1")
    master.startService()
    port = (await master.ha_address()).port
    slave = _broker(reactor, str(tmp_path / "slave"), Role.SLAVE,
                    master_endpoint=f"tcp:host=127.0.0.1:port={port}", on_divergence=mode)
    slave.startService()
    return master, slave


def _prepare_ahead(tmp_path: Any) -> None:
    """
    The slave has the master's log and five records more (the master lost
    them).
    """
    _fill(str(tmp_path / "master"), 800)
    shutil.copytree(str(tmp_path / "master"), str(tmp_path / "slave"))
    _fill(str(tmp_path / "slave"), 5, b"s")


def _prepare_different(tmp_path: Any) -> None:
    """
    The same first 700 records; then each took other records of the same
    lengths (a master that lost its tail and took new messages).
    """
    _fill(str(tmp_path / "master"), 700)
    shutil.copytree(str(tmp_path / "master"), str(tmp_path / "slave"))
    _fill(str(tmp_path / "master"), 100)
    _fill(str(tmp_path / "slave"), 100, b"X")


@pytest_twisted.ensureDeferred
async def test_ahead_halt(tmp_path: Any) -> None:
    """
    halt: replication does not start; the slave's log is untouched; the
    status and the metrics say what diverged.
    """
    from twisted.internet import reactor

    _prepare_ahead(tmp_path)
    before = store_digest(str(tmp_path / "slave"))
    master, slave = await _run(reactor, tmp_path, "halt")
    try:
        await until(reactor, lambda: replication_of(slave).divergence is not None, "the check")
        divergence = replication_of(slave).divergence
        assert divergence is not None
        assert divergence.kind == "ahead"
        assert divergence.truncate_to == master.commitlog.max_offset
        assert slave.ha_service is not None and not slave.ha_service.running
        assert status(slave)["divergence"]["kind"] == "ahead"
        assert master.slaves() == []
    finally:
        await slave.stopService()
        await master.stopService()
    assert store_digest(str(tmp_path / "slave")) == before


@pytest_twisted.ensureDeferred
async def test_ahead_truncate(tmp_path: Any) -> None:
    """
    truncate: the slave is cut back to the master's max offset and
    replicates what the master takes next; the stores end identical.
    """
    from twisted.internet import reactor

    _prepare_ahead(tmp_path)
    master, slave = await _run(reactor, tmp_path, "truncate")
    try:
        await until(
            reactor,
            lambda: any(s.ack_offset is not None for s in master.slaves()),
            "replication to resume",
        )
        for i in range(50):
            await master.put(Message("DivTopic", b"n" * 200))
        end = master.commitlog.max_offset
        await until(reactor, lambda: slave.commitlog.record_end == end, "the slave to catch up")
        assert replication_of(slave).divergences["ahead"] == 1
    finally:
        await slave.stopService()
        await master.stopService()
    assert store_digest(str(tmp_path / "slave")) == store_digest(str(tmp_path / "master"))


@pytest_twisted.ensureDeferred
async def test_different_truncate(tmp_path: Any) -> None:
    """
    truncate on different bytes: cut back to the first differing record,
    then the master's records are copied; the stores end identical.
    """
    from twisted.internet import reactor

    _prepare_different(tmp_path)
    master, slave = await _run(reactor, tmp_path, "truncate")
    try:
        end = master.commitlog.max_offset
        # (The slave's log was as long as the master's: wait for the cut to
        # be done -- its quarantine copy runs in a thread -- before waiting
        # for the slave to hold the master's end again.)
        await until(
            reactor,
            lambda: replication_of(slave).divergences["different"] == 1 and replication_of(slave).divergence is None,
            "the check and the cut",
        )
        await until(reactor, lambda: slave.commitlog.record_end == end, "the slave to catch up")
    finally:
        await slave.stopService()
        await master.stopService()
    assert store_digest(str(tmp_path / "slave")) == store_digest(str(tmp_path / "master"))


@pytest_twisted.ensureDeferred
async def test_behind_rebootstrap(tmp_path: Any) -> None:
    """
    rebootstrap on a slave behind the master's oldest segment: the old
    store is moved aside (kept), a new one replicates from the master's
    oldest segment, and ends identical.
    """
    from twisted.internet import reactor

    _fill(str(tmp_path / "master"), 1500)
    master_dir = str(tmp_path / "master")
    # The master's first two segments are gone (retention).
    for name in sorted(os.listdir(os.path.join(master_dir, "commitlog")))[:2]:
        os.unlink(os.path.join(master_dir, "commitlog", name))
    with CommitLog.open(master_dir, segment_size=SEGMENT) as log:
        oldest = log.min_offset
    assert oldest == 2 * SEGMENT
    _fill(str(tmp_path / "slave"), 100)
    master, slave = await _run(reactor, tmp_path, "rebootstrap")
    try:
        end = master.commitlog.max_offset
        await until(reactor, lambda: replication_of(slave).divergences["behind"] == 1, "the check")
        # (The slave reopens its store in a thread while it moves the old
        # one aside: no commit log to ask meanwhile, not yet filled.)
        await until(
            reactor,
            lambda: slave.store.commitlog is not None and slave.commitlog.record_end == end,
            "the new store to fill",
        )
        assert slave.commitlog.min_offset == oldest
    finally:
        await slave.stopService()
        await master.stopService()
    (aside,) = glob.glob(str(tmp_path / "slave.diverged-*"))
    with CommitLog.open(aside, read_only=True) as old:
        assert old.min_offset == 0 and old.max_offset > 0
    assert store_digest(str(tmp_path / "slave")) == store_digest(master_dir)
