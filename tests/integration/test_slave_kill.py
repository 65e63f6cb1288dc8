"""
A slave run by twistd in its own process, killed with SIGKILL while the
master (in this process, the test reactor) keeps taking messages, and
restarted: each restart recovers the torn tail, the slave resumes, and the
logs end byte-identical.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

import pytest_twisted
from twisted.internet.task import deferLater

from rmqha.broker import Broker, Role
from rmqha.settings import BrokerSettings
from rmqha.store._record import Message
from rmqha.store.commitlog import CommitLog
from tools.processes import twistd_slave_command

from tests.integration._support import store_digest, until

SEGMENT = 4 * 1024 * 1024


def _start_slave(store: str, port: int, log: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        twistd_slave_command(
            store,
            f"tcp:host=127.0.0.1:port={port}",
            log,
            "--segment-size", str(SEGMENT),
            "--heartbeat-interval", "200",
        )
    )


@pytest_twisted.ensureDeferred
async def test_slave_killed_and_restarted(tmp_path: Any) -> None:
    """
    Three SIGKILLs of the slave process at growing offsets while messages
    keep arriving; after each restart the slave catches up, and at the end
    both logs are byte-identical.
    """
    from twisted.internet import reactor

    master_store = str(tmp_path / "master")
    slave_store = str(tmp_path / "slave")
    master = Broker(
        BrokerSettings(
            role=Role.MASTER,
            ha_listen="tcp:0:interface=127.0.0.1",
            heartbeat_interval=0.2,
            housekeeping_interval=3.0,
        ),
        reactor=reactor,
        open_commitlog=lambda: CommitLog.open(master_store, segment_size=SEGMENT, clock=reactor.seconds),
    )
    master.startService()
    slave: subprocess.Popen[bytes] | None = None
    producing = True
    try:
        port = (await master.ha_address()).port
        body = os.urandom(2000)

        async def produce() -> None:
            i = 0
            while producing:
                await master.put(Message("KillTopic", body, queue_id=i % 4))
                i += 1
                if i % 200 == 0:
                    await deferLater(reactor, 0.005, lambda: None)

        producer = produce()
        from twisted.internet.defer import ensureDeferred

        producing_done = ensureDeferred(producer)

        def acked() -> int:
            return max((s.ack_offset or 0 for s in master.slaves()), default=0)

        # Not acked() + 2 MiB at start: with no slave connected that is 0.
        target = 0
        for kill in range(3):
            slave = _start_slave(slave_store, port, str(tmp_path / f"slave{kill}.log"))
            target += 2 * 1024 * 1024
            await until(reactor, lambda: acked() >= target, f"the slave to pass {target}")
            slave.send_signal(signal.SIGKILL)
            slave.wait()
            await until(reactor, lambda: not master.slaves(), "the master to notice")
        producing = False
        await producing_done
        slave = _start_slave(slave_store, port, str(tmp_path / "slave-final.log"))
        end = master.commitlog.max_offset
        await until(reactor, lambda: acked() == end, "the slave to catch up")
        slave.send_signal(signal.SIGTERM)
        # twistd shuts down cleanly, then re-raises the signal so that its
        # exit status says what stopped it.
        assert slave.wait(timeout=30) in (0, -signal.SIGTERM)
        slave = None
        assert not os.path.exists(os.path.join(slave_store, "abort"))
        assert end > 6 * 1024 * 1024
    finally:
        producing = False
        if slave is not None:
            slave.kill()
            slave.wait()
        await master.stopService()
    assert store_digest(slave_store) == store_digest(master_store)
    with open(tmp_path / "slave1.log") as f:
        # A restart after SIGKILL knows the last shutdown was not clean.
        assert "last shutdown NOT clean" in f.read()
