"""
Crash consistency with real processes: a SYNC_MASTER (twistd, producing
over its admin HTTP interface) and a slave (twistd), the slave killed with
SIGKILL at random moments 20 times and the master 5 times, each restarted,
while messages keep coming.  At the end the slave's bytes equal the
master's, every put answered PUT_OK is on the slave with the body that was
sent, and both stores pass a full check (recovery cut only torn tails).
Again, shorter (6 and 2 kills), with both processes on the pure-Python
codec (C{RMQHA_PURE=1}).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import urllib.request
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater

from rmqha.store.commitlog import CommitLog, Record, verify_store
from tools.processes import free_ports, twistd_command


SEGMENT = 4 * 1024 * 1024



class _Cluster:
    def __init__(self, root: str, env: dict[str, str]) -> None:
        self.root = root
        self.env = env
        self.ha_port, self.http_port = free_ports(2)
        self.master: subprocess.Popen[bytes] | None = None
        self.slave: subprocess.Popen[bytes] | None = None
        self.starts = {"master": 0, "slave": 0}

    def start_master(self) -> None:
        self.starts["master"] += 1
        self.master = subprocess.Popen(
            twistd_command(
                os.path.join(self.root, "master"),
                os.path.join(self.root, f"master{self.starts['master']}.log"),
                "--role", "SYNC_MASTER", "--segment-size", str(SEGMENT),
                "--ha-listen", f"tcp:{self.ha_port}:interface=127.0.0.1",
                "--http", f"tcp:{self.http_port}:interface=127.0.0.1",
                "--heartbeat-interval", "200", "--slave-timeout", "1000",
            ),
            env=self.env,
        )

    def start_slave(self) -> None:
        self.starts["slave"] += 1
        self.slave = subprocess.Popen(
            twistd_command(
                os.path.join(self.root, "slave"),
                os.path.join(self.root, f"slave{self.starts['slave']}.log"),
                "--role", "slave", "--segment-size", str(SEGMENT),
                "--master", f"127.0.0.1:{self.ha_port}",
                "--heartbeat-interval", "200",
            ),
            env=self.env,
        )

    def kill(self, which: str) -> None:
        process = getattr(self, which)
        process.send_signal(signal.SIGKILL)
        process.wait()

    def stop(self) -> None:
        for process in (self.slave, self.master):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


@pytest.mark.parametrize(
    "codec, slave_kills, master_kills", [("compiled", 12, 3), ("pure", 6, 2)]
)
@pytest_twisted.ensureDeferred
async def test_kill_slave_and_master(
    tmp_path: Any, codec: str, slave_kills: int, master_kills: int
) -> None:
    """
    The whole cycle under load; see the module docstring.
    """
    from twisted.internet import reactor
    from twisted.internet.threads import deferToThread

    rng = random.Random(20261122)
    env = dict(os.environ)
    if codec == "pure":
        env["RMQHA_PURE"] = "1"
    else:
        env.pop("RMQHA_PURE", None)
    cluster = _Cluster(str(tmp_path), env)

    def http(method: str, path: str, body: bytes | None = None) -> Deferred[dict[str, Any]]:
        # A plain blocking client on a thread: simple, and independent of
        # the code under test.
        def call() -> dict[str, Any]:
            request = urllib.request.Request(
                f"http://127.0.0.1:{cluster.http_port}{path}", data=body, method=method
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                answer: dict[str, Any] = json.loads(response.read())
                return answer

        return deferToThread(call)
    acknowledged: dict[int, tuple[int, str]] = {}  # offset -> (next offset, body digest)
    statuses: dict[str, int] = {}
    producing = True
    master_up = False
    last_error: list[str] = []

    async def put(i: int) -> None:
        body = f"message {i} ".encode() * rng.randint(1, 40)
        answer = await http("POST", f"/topics/Crash/messages?queueId={i % 4}", body)
        statuses[answer["status"]] = statuses.get(answer["status"], 0) + 1
        if answer["status"] == "PUT_OK":
            acknowledged[answer["offset"]] = (
                answer["next_offset"], hashlib.sha256(body).hexdigest()
            )

    async def produce() -> None:
        i = 0
        while producing:
            if not master_up:
                await deferLater(reactor, 0.05, lambda: None)
                continue
            try:
                await put(i)
            except Exception:
                # The master was killed under this request.
                await deferLater(reactor, 0.05, lambda: None)
            i += 1

    async def master_answers() -> bool:
        try:
            status = await http("GET", "/status")
        except Exception as e:
            last_error[:] = [repr(e)]
            return False
        return bool(status.get("slaves"))

    async def wait_for(condition: Any, what: str, timeout: float = 60.0) -> None:
        waited = 0.0
        while not await condition():
            if waited > timeout:
                raise AssertionError(f"timed out waiting for {what}: {last_error}")
            await deferLater(reactor, 0.1, lambda: None)
            waited += 0.1

    cluster.start_master()
    cluster.start_slave()
    producer: Deferred[None] | None = None
    try:
        await wait_for(master_answers, "the master and its slave")
        master_up = True
        producer = Deferred.fromCoroutine(produce())
        kills = ["slave"] * slave_kills + ["master"] * master_kills
        rng.shuffle(kills)
        for which in kills:
            await deferLater(reactor, rng.uniform(0.1, 0.6), lambda: None)
            if which == "master":
                master_up = False
            cluster.kill(which)
            await deferLater(reactor, rng.uniform(0.0, 0.3), lambda: None)
            getattr(cluster, f"start_{which}")()
            await wait_for(master_answers, f"the cluster after killing the {which}")
            master_up = True
        producing = False
        await producer
        producer = None

        async def caught_up() -> bool:
            status = await http("GET", "/status")
            slaves = status.get("slaves") or []
            return bool(slaves) and slaves[0]["ack_offset"] == status["max_offset"]

        await wait_for(caught_up, "the slave to catch up")
    finally:
        producing = False
        cluster.stop()
    assert statuses.get("PUT_OK", 0) > 100, statuses
    if codec == "pure":
        for log in ("master1.log", "slave1.log"):
            with open(tmp_path / log) as f:
                assert "pure-Python codec" in f.read(), f"{log} does not name the pure codec"
    master_dir, slave_dir = str(tmp_path / "master"), str(tmp_path / "slave")
    for store in (master_dir, slave_dir):
        verify_store(store)  # raises at the first bad record
    with CommitLog.open(master_dir, read_only=True) as master, CommitLog.open(
        slave_dir, read_only=True
    ) as slave:
        assert slave.max_offset == master.max_offset
        position = slave.min_offset
        while position < slave.max_offset:
            chunk = slave.read(position, 1 << 20)
            assert chunk == master.read(position, len(chunk)), f"bytes differ near {position}"
            position += len(chunk)
        records = {r.offset: r for r in slave.records() if isinstance(r, Record)}
    for offset, (next_offset, digest) in acknowledged.items():
        record = records.get(offset)
        assert record is not None, f"PUT_OK record at {offset} is not on the slave"
        assert record.next_offset == next_offset
        assert hashlib.sha256(record.body).hexdigest() == digest
