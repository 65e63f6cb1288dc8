"""
A segment file changed under running brokers (issue 25, item 8), with real
processes: a master (twistd) and its slave (twistd) on loopback, taking
puts over the admin HTTP port, and another process (this test) truncating
or removing the live segment file.

The processes must live: no SIGBUS, no traceback in their logs.  Puts
answer UNKNOWN_ERROR naming the file, both /status say what is wrong, the
slave is told by its master (CLOSING); the damaged master restarted is
refused with one line naming the file.  A slave's own live segment cut:
it halts, saying so.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.error
import urllib.request
from typing import Any

import pytest
import pytest_twisted

import rmqha
from tools.processes import free_ports, twistd_command

SEGMENT = 4 * 1024 * 1024


class _Pair:
    """
    A master and a slave, each C{twistd -n rmqha} with its admin port.
    """

    def __init__(self, root: str) -> None:
        self.root = root
        self.ha, self.master_http, self.slave_http = free_ports(3)
        self.master: subprocess.Popen[bytes] | None = None
        self.slave: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # This checkout's rmqha in the children, whatever the working
        # directory (the test session's is a temporary one).
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(rmqha.__file__)))
        self.master = subprocess.Popen(
            twistd_command(
                self.store("master"), self.log("master"),
                "--role", "ASYNC_MASTER", "--segment-size", str(SEGMENT),
                "--ha-listen", f"tcp:{self.ha}:interface=127.0.0.1",
                "--http", f"tcp:{self.master_http}:interface=127.0.0.1",
                "--heartbeat-interval", "200",
            ),
            env=env,
        )
        self.slave = subprocess.Popen(
            twistd_command(
                self.store("slave"), self.log("slave"),
                "--role", "slave", "--segment-size", str(SEGMENT),
                "--master", f"127.0.0.1:{self.ha}",
                "--http", f"tcp:{self.slave_http}:interface=127.0.0.1",
                "--heartbeat-interval", "200",
            ),
            env=env,
        )

    def store(self, which: str) -> str:
        return os.path.join(self.root, which)

    def log(self, which: str) -> str:
        return os.path.join(self.root, f"{which}.log")

    def segment(self, which: str) -> str:
        return os.path.join(self.store(which), "commitlog", "%020d" % 0)

    def stop(self) -> dict[str, int | None]:
        """
        SIGTERM both, as an operator would; their exit statuses (twistd,
        stopped cleanly by a signal, exits by that signal again).
        """
        codes: dict[str, int | None] = {}
        for name, process in (("slave", self.slave), ("master", self.master)):
            if process is None:
                continue
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            codes[name] = process.returncode
        return codes

    def read_log(self, which: str) -> str:
        with open(self.log(which)) as f:
            return f.read()


def _http(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
    """
    One request, blocking (run on a thread): the status code and the JSON.
    """
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


async def _ask(port: int, method: str, path: str, body: bytes | None = None) -> tuple[Any, Any]:
    """
    L{_http} on a thread; C{(None, why)} when the port does not answer.
    """
    from twisted.internet.threads import deferToThread

    try:
        return await deferToThread(_http, port, method, path, body)
    except OSError as e:
        return None, repr(e)


async def _status_until(port: int, test: Any, what: str, timeout: float = 20.0) -> Any:
    """
    C{GET /status} every 50 ms until C{test} accepts it (returned).
    """
    from twisted.internet import reactor
    from twisted.internet.task import deferLater

    answer: Any = None
    for _ in range(int(timeout / 0.05)):
        code, answer = await _ask(port, "GET", "/status")
        if code == 200 and test(answer):
            return answer
        await deferLater(reactor, 0.05, lambda: None)
    raise AssertionError(f"timed out waiting for {what}: {answer}")


async def _put_and_catch_up(pair: _Pair, count: int) -> None:
    """
    C{count} puts (PUT_OK each), then wait for the slave's ack of them.
    """
    await _status_until(pair.master_http, lambda s: s.get("slaves"), "the slave")
    for i in range(count):
        code, answer = await _ask(
            pair.master_http, "POST", f"/topics/Faults/messages?queueId={i % 4}", b"m" * 500
        )
        assert (code, answer["status"]) == (200, "PUT_OK"), answer
    end = answer["next_offset"]
    await _status_until(
        pair.master_http,
        lambda s: s["slaves"] and s["slaves"][0]["ack_offset"] == end,
        "the slave to catch up",
    )


@pytest.mark.parametrize("fault", ["truncate", "remove"])
@pytest_twisted.ensureDeferred
async def test_master_segment_changed(tmp_path: Any, fault: str) -> None:
    """
    The master's live segment truncated to nothing (the next put writes
    past its end: the SIGBUS the guard absorbs) or removed (found by the
    0.5 s look at the files); see the module docstring.
    """
    pair = _Pair(str(tmp_path))
    pair.start()
    try:
        await _put_and_catch_up(pair, 20)
        segment = pair.segment("master")
        if fault == "truncate":
            os.truncate(segment, 0)
            what = "was truncated to 0 bytes"
        else:
            os.unlink(segment)
            what = "was removed"
            # Puts go to the removed file until the look at the files.
            await _status_until(pair.master_http, lambda s: s.get("problem"), "the problem")
        code, answer = await _ask(pair.master_http, "POST", "/topics/Faults/messages", b"x" * 500)
        assert code == 500, answer
        assert answer["status"] == "UNKNOWN_ERROR" and answer["stored"] is False, answer
        assert f"{segment}: {what}" in answer["error"], answer
        assert "\n" not in answer["error"]
        assert pair.master is not None and pair.master.poll() is None, "the master died"

        await _status_until(
            pair.master_http, lambda s: what in (s.get("problem") or ""),
            "the master's /status problem",
        )
        await _status_until(
            pair.slave_http,
            lambda s: segment in (s.get("problem") or "")
            and "stopped replicating" in s["problem"],
            "the slave's /status problem",
        )
        assert pair.slave is not None and pair.slave.poll() is None, "the slave died"
    finally:
        codes = pair.stop()
    assert codes == {"slave": -signal.SIGTERM, "master": -signal.SIGTERM}, codes
    master_log, slave_log = pair.read_log("master"), pair.read_log("slave")
    for log in (master_log, slave_log):
        assert "Traceback" not in log, log[-3000:]
        assert "Unhandled" not in log, log[-3000:]
    assert master_log.count("the commit log is damaged:") == 1, master_log[-3000:]
    # The damaged master kept its abort marker: the next open recovers.
    assert os.path.exists(os.path.join(pair.store("master"), "abort"))
    if fault == "truncate":
        # Restarted, the existing recovery refuses the short file, naming
        # it, in one line, and leaves it as it is.
        done = subprocess.run(
            twistd_command(
                pair.store("master"), pair.log("master-restart"),
                "--role", "ASYNC_MASTER", "--segment-size", str(SEGMENT),
                "--ha-listen", f"tcp:{pair.ha}:interface=127.0.0.1",
            ),
            capture_output=True, text=True, timeout=60,
            env=dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(rmqha.__file__))),
        )
        with open(pair.log("master-restart")) as f:
            said = f.read() + done.stdout + done.stderr
        assert done.returncode == 1, said
        (line,) = [line for line in said.splitlines() if "cannot open the store" in line]
        assert segment in line and "was truncated to 0 bytes" in line, line
        assert "Traceback" not in said, said
        assert os.path.getsize(segment) == 0


@pytest_twisted.ensureDeferred
async def test_slave_segment_cut(tmp_path: Any) -> None:
    """
    The slave's own live segment truncated: its next append is refused,
    replication halts with the reason in /status, the master keeps
    taking puts, nobody dies, no traceback.
    """
    pair = _Pair(str(tmp_path))
    pair.start()
    try:
        await _put_and_catch_up(pair, 10)
        segment = pair.segment("slave")
        os.truncate(segment, 100)
        code, answer = await _ask(pair.master_http, "POST", "/topics/Faults/messages", b"y" * 500)
        assert (code, answer["status"]) == (200, "PUT_OK"), answer
        status = await _status_until(
            pair.slave_http,
            lambda s: f"{segment}: was truncated to 100 bytes" in (s.get("problem") or ""),
            "the slave's /status problem",
        )
        assert "replication halted" in status["problem"], status
        assert os.path.getsize(segment) == 100
        assert pair.slave is not None and pair.slave.poll() is None, "the slave died"
    finally:
        codes = pair.stop()
    assert codes == {"slave": -signal.SIGTERM, "master": -signal.SIGTERM}, codes
    for which in ("master", "slave"):
        log = pair.read_log(which)
        assert "Traceback" not in log, log[-3000:]
    assert "replication halted" in pair.read_log("slave")
