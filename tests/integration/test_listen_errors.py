"""
A broker run by twistd that cannot listen on its ports stops at once with
one line, before it touches its store.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import Any, Iterator

import pytest

from tools.processes import twistd_command


@pytest.fixture
def busy_port() -> Iterator[int]:
    """
    A loopback port something else is listening on.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def run_twistd(tmp_path: Any, *options: str) -> tuple[int, str, str]:
    store = str(tmp_path / "store")
    log = str(tmp_path / "twistd.log")
    done = subprocess.run(
        twistd_command(store, log, *options), capture_output=True, text=True, timeout=60
    )
    # (A port in use stops twistd before it opens its log file.)
    text = done.stdout + done.stderr
    if os.path.exists(log):
        with open(log) as f:
            text = f.read() + text
    return done.returncode, text, store


@pytest.mark.parametrize("role", ["master", "slave", "remoting"])
def test_port_in_use_exits_with_one_line(tmp_path: Any, busy_port: int, role: str) -> None:
    """
    The HA port (a master), the admin port (a slave, given as a bare
    port) or the remoting port (C{--listen}) in use: twistd exits non-zero with one line naming the endpoint,
    the flag and the error, no traceback, and the store directory was
    never created (so no abort marker either).
    """
    if role == "master":
        flags = ("--ha-listen", f"tcp:{busy_port}:interface=127.0.0.1")
        expected = (
            f"twistd rmqha: cannot listen on tcp:{busy_port}:interface=127.0.0.1 "
            "(--ha-listen): Address already in use"
        )
    elif role == "remoting":
        flags = ("--ha-listen", "tcp:0", "--listen", f"tcp:{busy_port}:interface=127.0.0.1")
        expected = (
            f"twistd rmqha: cannot listen on tcp:{busy_port}:interface=127.0.0.1 "
            "(--listen): Address already in use"
        )
    else:
        flags = ("--role", "slave", "--master", "127.0.0.1:1", "--http", str(busy_port))
        expected = (
            f"twistd rmqha: cannot listen on tcp:{busy_port} (--http): Address already in use"
        )
    code, text, store = run_twistd(tmp_path, *flags)
    assert code != 0, text
    assert [line for line in text.splitlines() if "cannot listen" in line] == [
        line for line in text.splitlines() if line.endswith(expected)
    ], text
    assert expected in text
    assert "Traceback" not in text, text
    assert not os.path.exists(store)


def test_failover_node_ha_port_in_use(tmp_path: Any, busy_port: int) -> None:
    """
    A failover node listens on its HA port only once elected, but a port
    in use is named at start, in one line, before the store is touched.
    """
    expected = (
        f"twistd rmqha: cannot listen on tcp:{busy_port}:interface=127.0.0.1 "
        "(--ha-listen): Address already in use"
    )
    from rmqha.certs import write_secret

    code, text, store = run_twistd(
        tmp_path,
        "--coordinator", "etcd:http://127.0.0.1:1", "--group", "g", "--node-id", "a",
        "--advertise", f"127.0.0.1:{busy_port}",
        "--ha-listen", f"tcp:{busy_port}:interface=127.0.0.1",
        "--group-secret-file", write_secret(str(tmp_path / "group.secret")),
    )
    assert code != 0, text
    assert expected in text, text
    assert "Traceback" not in text, text
    assert not os.path.exists(store)


def test_daemon_reports_the_line(tmp_path: Any, busy_port: int) -> None:
    """
    Daemonizing (no C{-n}), the parent twistd prints the same line from
    the child's status pipe — not "An error has occurred: ''" — exits
    non-zero, and no daemon is left running (its pid file is gone).
    """
    store = str(tmp_path / "store")
    pidfile = str(tmp_path / "twistd.pid")
    done = subprocess.run(
        [
            sys.executable, "-c", "from twisted.scripts.twistd import run; run()",
            "--pidfile", pidfile, "--logfile", str(tmp_path / "twistd.log"),
            "rmqha", "--store-dir", store,
            "--ha-listen", f"tcp:{busy_port}:interface=127.0.0.1",
        ],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode != 0
    assert (
        f"twistd rmqha: cannot listen on tcp:{busy_port}:interface=127.0.0.1 (--ha-listen)"
        in done.stderr
    ), done.stderr
    # The parent exits once the child has reported; the child then removes
    # its pid file on its way out (a moment later on a loaded machine).
    deadline = time.monotonic() + 20
    while os.path.exists(pidfile) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(pidfile)
    assert not os.path.exists(store)


def test_nodaemon_output_is_the_one_line(tmp_path: Any, busy_port: int) -> None:
    """
    C{twistd -n rmqha} logging to the terminal: a port in use is all it
    prints -- one line on stderr, not after twistd's "starting up" and
    "reactor class" lines (the ports are listened on in C{makeService},
    before twistd starts logging) -- exit status 1, nothing of the store.
    """
    store = str(tmp_path / "store")
    done = subprocess.run(
        [
            sys.executable, "-c", "from twisted.scripts.twistd import run; run()",
            "-n", "--pidfile", "", "rmqha", "--store-dir", store,
            "--ha-listen", f"tcp:{busy_port}:interface=127.0.0.1",
        ],
        capture_output=True, text=True, timeout=60, cwd=str(tmp_path),
    )
    assert (done.returncode, done.stdout, done.stderr) == (
        1,
        "",
        f"twistd rmqha: cannot listen on tcp:{busy_port}:interface=127.0.0.1 (--ha-listen): "
        "Address already in use\n",
    )
    assert not os.path.exists(store)
