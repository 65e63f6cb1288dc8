"""
Real sockets on 127.0.0.1 (pytest-twisted, the global reactor): a master
and a slave L{Broker} in this process register with a FakeNameServer
listening on port 0; the slave, started without --master, finds its
master through it, replicates byte-identically and syncs the master's
topics from the remoting address the NameServer names; both unregister
at stop.
"""

from __future__ import annotations

import os
from typing import Any

import pytest_twisted

from rmqha.broker import Broker, Role
from rmqha.remoting.metadata import TopicConfig
from rmqha.store._record import Message
from rmqha.testing import FakeNameServer

from tests.integration._support import make_broker, store_digest, until

SEGMENT = 256 * 1024


@pytest_twisted.ensureDeferred
async def test_slave_finds_master_through_namesrv(tmp_path: Any) -> None:
    from twisted.internet import reactor

    namesrv = FakeNameServer(reactor)
    port = await namesrv.listen(reactor, "tcp:0:interface=127.0.0.1")
    address = f"127.0.0.1:{port.getHost().port}"
    # (Both on one host: their listenPort is the same, so the slave gets
    # another brokerIP1, or the NameServer would take it for the master
    # re-registering under another id.)
    common: dict[str, Any] = dict(namesrv=(address,), group="broker-a")
    master: Broker = make_broker(
        reactor, str(tmp_path / "master"), Role.MASTER, SEGMENT,
        ha_listen="tcp:0:interface=127.0.0.1", listen="tcp:0:interface=127.0.0.1",
        broker_ip1="127.0.0.1", **common,
    )
    slave: Broker | None = None
    master.startService()
    try:
        master.metadata.update_topic(TopicConfig("NsTopic", 4, 4))
        for i in range(300):
            await master.put(Message("NsTopic", os.urandom(1000), queue_id=i % 4))
        ha_port = (await master.ha_address()).port
        await until(reactor, lambda: 0 in namesrv.brokers("broker-a"), "the master to register", 10)
        assert namesrv.registrations[-1].header.ha_server_addr == f"127.0.0.1:{ha_port}"
        remoting_addr = namesrv.brokers("broker-a")[0]
        assert remoting_addr != "127.0.0.1:0"
        slave = make_broker(
            reactor, str(tmp_path / "slave"), Role.SLAVE, SEGMENT, broker_id=1, broker_ip1="127.0.0.2", **common
        )
        slave.startService()
        await until(
            reactor,
            lambda: slave.store.commitlog is not None
            and slave.commitlog.max_offset == master.commitlog.max_offset,
            "the slave to catch up through the NameServer",
            20,
        )
        assert slave.master_endpoint == f"tcp:host=127.0.0.1:port={ha_port}"
        assert namesrv.brokers("broker-a") == {0: remoting_addr, 1: "127.0.0.2:10911"}
        assert slave.registration is not None and slave.registration.master_addr == remoting_addr
        # The slave's metadata sync goes to the master's remoting port the
        # NameServer named (3 s after it became a slave, as 4.9.8).
        assert slave.metadata_sync is not None and slave.metadata_sync.master == remoting_addr
        await until(reactor, lambda: "NsTopic" in slave.metadata.topics, "the slave to sync the topics", 10)
    finally:
        if slave is not None:
            await slave.stopService()
        await master.stopService()
        await port.stopListening()
    assert store_digest(str(tmp_path / "slave")) == store_digest(str(tmp_path / "master"))
    assert namesrv.brokers("broker-a") == {}
    assert len(namesrv.unregistrations) == 2


@pytest_twisted.ensureDeferred
async def test_twistd_brokers_through_namesrv(tmp_path: Any) -> None:
    """
    Two C{twistd rmqha} processes with --namesrv: the master (HA port 0)
    registers the port it got; the slave, started without --master, finds
    it through the NameServer and copies the master's log byte-identically;
    both unregister when stopped (SIGTERM).
    """
    import signal
    import subprocess

    from twisted.internet import reactor

    from rmqha.store.commitlog import CommitLog
    from tools.processes import twistd_command

    master_store, slave_store = str(tmp_path / "master"), str(tmp_path / "slave")
    log = CommitLog.open(master_store, segment_size=SEGMENT)
    for i in range(400):
        log.put(Message("NsTopic", os.urandom(1000), queue_id=i % 4))
    log.close()
    namesrv = FakeNameServer(reactor)
    port = await namesrv.listen(reactor, "tcp:0:interface=127.0.0.1")
    common = ["--namesrv", f"127.0.0.1:{port.getHost().port}", "--group", "broker-a"]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        processes.append(subprocess.Popen(twistd_command(
            master_store, str(tmp_path / "master.log"), "--role", "master",
            "--ha-listen", "tcp:0:interface=127.0.0.1", "--broker-ip1", "127.0.0.1", *common,
        )))
        # (Both at once: the slave, named no master at first, registers
        # again after 1, 2, 4 ... s until it is.)
        processes.append(subprocess.Popen(twistd_command(
            slave_store, str(tmp_path / "slave.log"), "--role", "slave", "--segment-size", "256k",
            "--broker-id", "1", "--broker-ip1", "127.0.0.2", *common,
        )))
        await until(reactor, lambda: 0 in namesrv.brokers("broker-a"), "the master to register", 30)
        await until(reactor, lambda: 1 in namesrv.brokers("broker-a"), "the slave to register", 30)
        await until(
            reactor,
            lambda: os.path.isdir(os.path.join(slave_store, "commitlog"))
            and store_digest(slave_store) == store_digest(master_store),
            "the slave to copy the master's log",
            30,
        )
    finally:
        for process in reversed(processes):
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
        await port.stopListening()
    assert namesrv.brokers("broker-a") == {}
    assert len(namesrv.unregistrations) == 2
    with open(str(tmp_path / "slave.log")) as f:
        slave_log = f.read()
    assert "following the master the NameServers name: 127.0.0.1:" in slave_log
