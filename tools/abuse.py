# -*- test-case-name: tests.test_abuse,tests.integration.test_abuse_tool -*-
"""
C{python -m tools.abuse [--scenarios digest,flood,conns,post] [--checkout DIR]
[--quick] [--json]}: what one unauthenticated peer can cost an rmqha master
(issue 12, section C; docs/reliability.md, "Bounded under abuse").

Each scenario gets a master of its own: C{twistd rmqha --role master} on
127.0.0.1 (ports picked by the system and read from its log), its
open-files limit set to 1024 soft and hard, C{TMPDIR} pointing into the
run's directory, over a store of one 64 MiB segment filled with ~64 MiB of
messages.  Then, from this process, over loopback only:

- C{digest}: a control session sends its hello and 1,000 pipelined DIGEST
  requests of 16 MiB ranges (~28 KB) while C{/status} is fetched every
  50 ms for 10 s: the slowest answer.
- C{flood}: a control session sends cheap refused DIGEST requests
  (reversed ranges) and never reads, with small socket buffers, until
  300 MB, 60 s, or 5 s without progress: the bytes sent, and the master's
  RSS growth (C{VmRSS}) while it holds them and after the session closes.
- C{conns}: 2,000 idle connections to the HA port, then the slowest
  C{/status} over 5 s and the time of one C{POST} put; the master's view
  (the descriptors it added) and how many connections were closed or reset
  (by the master, or by its kernel when it stopped accepting).
- C{post}: a C{POST} declaring a 2 GiB body, streaming up to 512 MiB: the
  bytes sent before the master refused or closed, its RSS growth, and the
  bytes it wrote under its C{TMPDIR}.

With C{--checkout DIR} every scenario runs twice in one invocation: on a
master from DIR (another checkout of rmqha, e.g. a C{git worktree} of an
older commit; C{PYTHONPATH=DIR}), then on one from this code.
C{--quick} shortens every scenario (fewer requests, bytes and seconds).

Prints a table, then the results as one JSON line (C{--json}: the JSON
only).  Everything lives in a new temporary directory, removed at the end;
nothing else is deleted.  Bad arguments: one line, exit status 2.
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import os
import re
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from rmqha.ha._wire import CONTROL_HELLO, encode_code, encode_digest_request
from rmqha.cli import _Parser, _UsageError, fill
from rmqha.store.commitlog import CommitLog
from tools._help import plain
from tools.processes import twistd_command

__all__ = ["main", "run", "SCENARIOS", "Sizes", "FULL", "QUICK"]

SCENARIOS = ("digest", "flood", "conns", "post")
#: The master's open-files limit, soft and hard (the common default).
MASTER_FD_LIMIT = 1024
_MIB = 1 << 20
#: The body of each generated message; a record is ~4.2 KB.
_BODY = 4000
_RECORD = 4200  # a little over, so that the store stays one segment


@dataclass(frozen=True)
class Sizes:
    """
    How much each scenario does.
    """

    store_bytes: int = 64 * _MIB
    digest_requests: int = 1000
    digest_seconds: float = 10.0
    flood_bytes: int = 300_000_000
    flood_seconds: float = 60.0
    connections: int = 2000
    conns_seconds: float = 5.0
    post_bytes: int = 512 * _MIB
    post_seconds: float = 60.0
    #: The longest one C{/status} or put may take before it counts as failed.
    request_timeout: float = 60.0
    #: Seconds without the master taking a byte that end a flood or a post.
    stall_seconds: float = 5.0


FULL = Sizes()
QUICK = Sizes(
    store_bytes=16 * _MIB,
    digest_requests=200,
    digest_seconds=3.0,
    flood_bytes=30_000_000,
    flood_seconds=6.0,
    connections=300,
    conns_seconds=2.0,
    post_bytes=64 * _MIB,
    post_seconds=6.0,
    request_timeout=10.0,
    stall_seconds=2.0,
)


def _this_checkout() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _memory(pid: int) -> dict[str, int]:
    """
    C{VmRSS} and C{RssAnon} of C{pid}, in bytes.
    """
    values = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "RssAnon"):
                values[name] = int(rest.split()[0]) * 1024
    return values


def _mib(n: float) -> float:
    return round(n / _MIB, 1)


class _Master:
    """
    One C{twistd rmqha --role master} process from C{checkout}, in
    C{directory} (created here), with its store filled.
    """

    _LISTENING = re.compile(r"\] (\w+)(?: \(\w+\))? starting on (\d+)")

    def __init__(self, checkout: str, directory: str, sizes: Sizes) -> None:
        self.directory = directory
        self.tmpdir = os.path.join(directory, "tmp")
        self.log = os.path.join(directory, "master.log")
        os.makedirs(self.tmpdir)
        store = os.path.join(directory, "store")
        with CommitLog.open(store, segment_size=64 * _MIB) as commitlog:
            fill(commitlog, sizes.store_bytes // _RECORD, _BODY, ["Abuse"])
            commitlog.flush()
            self.size = commitlog.max_offset
        env = dict(os.environ, PYTHONPATH=checkout, TMPDIR=self.tmpdir)
        env.pop("PYTHONSTARTUP", None)

        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (MASTER_FD_LIMIT, MASTER_FD_LIMIT))

        with open(os.path.join(directory, "master.out"), "wb") as out:
            self.process = subprocess.Popen(
                twistd_command(
                    store, self.log, "--role", "master",
                    "--ha-listen", "tcp:0:interface=127.0.0.1",
                    "--http", "tcp:0:interface=127.0.0.1",
                ),
                # Not this checkout's directory: "" on sys.path would win over DIR.
                cwd=directory, env=env, stdout=out, stderr=subprocess.STDOUT,
                preexec_fn=limit,
            )
        self.pid = self.process.pid
        self.ha, self.http = self._ports(60.0)

    def _ports(self, timeout: float) -> tuple[int, int]:
        deadline = time.monotonic() + timeout
        ha = http = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the master exited with status {self.process.returncode}: {self.tail()}"
                )
            if ha is None or http is None:
                try:
                    with open(self.log) as f:
                        for name, port in self._LISTENING.findall(f.read()):
                            if name == "MasterFactory":
                                ha = int(port)
                            elif "Site" in name:
                                http = int(port)
                except FileNotFoundError:
                    pass
            elif _status_seconds(http, 5.0)[1]:
                return ha, http
            time.sleep(0.1)
        raise RuntimeError(f"the master did not answer /status within {timeout:.0f} s: {self.tail()}")

    def tail(self) -> str:
        try:
            with open(self.log) as f:
                return " | ".join(f.read().splitlines()[-3:])
        except OSError:
            return "(no log)"

    def memory(self) -> dict[str, int]:
        return _memory(self.pid)

    def open_files(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def temp_bytes(self) -> int:
        """
        Bytes in files under the master's C{TMPDIR}, the ones it has
        already unlinked but holds open included.
        """
        total = 0
        for parent, _, names in os.walk(self.tmpdir):
            for name in names:
                try:
                    total += os.lstat(os.path.join(parent, name)).st_size
                except OSError:
                    pass
        prefix = self.tmpdir + os.sep
        for fd in os.listdir(f"/proc/{self.pid}/fd"):
            try:
                target = os.readlink(f"/proc/{self.pid}/fd/{fd}")
                if target.startswith(prefix) and target.endswith(" (deleted)"):
                    total += os.stat(f"/proc/{self.pid}/fd/{fd}").st_size
            except OSError:
                pass
        return total

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _status_seconds(port: int, timeout: float) -> tuple[float, bool]:
    """
    How long one C{GET /status} took, and whether it was answered 200.
    """
    started = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", "/status")
        response = connection.getresponse()
        response.read()
        ok = response.status == 200
    except (OSError, http.client.HTTPException):
        ok = False
    finally:
        connection.close()
    return time.monotonic() - started, ok


def _probe(port: int, seconds: float, timeout: float) -> dict[str, Any]:
    """
    C{/status} every 50 ms for C{seconds}: the slowest, how many, how many
    failed (a failure counts with the time it took).
    """
    worst, count, failed = 0.0, 0, 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        elapsed, ok = _status_seconds(port, timeout)
        worst = max(worst, elapsed)
        count += 1
        failed += not ok
        time.sleep(0.05)
    return {"status_worst_s": round(worst, 3), "status_requests": count, "status_failed": failed}


def _connect(port: int, rcvbuf: int = 0, sndbuf: int = 0, timeout: float = 5.0) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # Buffer sizes before connecting, so the window is small from the start.
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    if sndbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    s.settimeout(timeout)
    s.connect(("127.0.0.1", port))
    return s


def _readable(s: socket.socket) -> bool:
    # poll, not select: descriptors past 1024 in the conns scenario.
    poller = select.poll()
    poller.register(s, select.POLLIN)
    return bool(poller.poll(0))


def _drain(s: socket.socket) -> tuple[int, bool]:
    """
    The bytes readable now without waiting, and whether the peer closed.
    """
    received = 0
    while _readable(s):
        try:
            data = s.recv(1 << 16)
        except OSError:
            return received, True
        if not data:
            return received, True
        received += len(data)
    return received, False


def _digest(master: _Master, sizes: Sizes) -> dict[str, Any]:
    span = min(16 * _MIB, master.size)
    s = _connect(master.ha)
    try:
        s.sendall(
            encode_code(CONTROL_HELLO) + encode_digest_request(0, span) * sizes.digest_requests
        )
        result = {"requests": sizes.digest_requests, "request_bytes": 28 * sizes.digest_requests}
        result.update(_probe(master.http, sizes.digest_seconds, sizes.request_timeout))
        received, _ = _drain(s)
        # 36 bytes of INFO, then 44 per answer.
        result["answered_in_window"] = max(received - 36, 0) // 44
    finally:
        s.close()
    return result


def _flood(master: _Master, sizes: Sizes) -> dict[str, Any]:
    before = master.memory()
    # Small buffers both ways: what is sent is close to what the master took.
    s = _connect(master.ha, rcvbuf=4096, sndbuf=64 * 1024, timeout=sizes.stall_seconds)
    chunk = encode_digest_request(10, 5) * 4096
    sent, stopped = 0, "limit"
    deadline = time.monotonic() + sizes.flood_seconds
    try:
        s.sendall(encode_code(CONTROL_HELLO))
        while sent < sizes.flood_bytes:
            if time.monotonic() > deadline:
                stopped = "time"
                break
            try:
                s.sendall(chunk)
            except socket.timeout:
                stopped = "blocked"  # the master stopped taking bytes
                break
            except OSError:
                stopped = "closed"
                break
            sent += len(chunk)
        time.sleep(2)
        held = master.memory()
    finally:
        s.close()
    time.sleep(2)
    after = master.memory()
    return {
        "sent_bytes": sent,
        "stopped": stopped,
        "rss_growth_mib": _mib(held["VmRSS"] - before["VmRSS"]),
        "anon_growth_mib": _mib(held["RssAnon"] - before["RssAnon"]),
        "rss_after_close_mib": _mib(after["VmRSS"] - before["VmRSS"]),
    }


def _put_seconds(port: int, timeout: float) -> tuple[float, str]:
    started = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("POST", "/topics/Abuse/messages", body=b"x" * 1000)
        response = connection.getresponse()
        answer = f"{response.status} {response.read()[:40].decode(errors='replace')}"
    except (OSError, http.client.HTTPException) as e:
        answer = f"failed: {e.__class__.__name__}"
    finally:
        connection.close()
    return time.monotonic() - started, answer


def _conns(master: _Master, sizes: Sizes) -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = sizes.connections + 256
    if soft < wanted and (hard == resource.RLIM_INFINITY or hard >= wanted):
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    count = min(sizes.connections, soft - 256)
    files_before = master.open_files()
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            try:
                sockets.append(_connect(master.ha, timeout=2.0))
            except OSError:
                break  # the backlog is full: the master accepts no more
        time.sleep(1)
        closed = sum(_drain(s)[1] for s in sockets)
        result: dict[str, Any] = {
            "attempted": count,
            "opened": len(sockets),
            "closed_or_reset": closed,
            "master_fds_added": master.open_files() - files_before,
        }
        result.update(_probe(master.http, sizes.conns_seconds, sizes.request_timeout))
        seconds, answer = _put_seconds(master.http, sizes.request_timeout)
        result["put_s"] = round(seconds, 3)
        result["put_answer"] = answer
    finally:
        for s in sockets:
            s.close()
    return result


def _post(master: _Master, sizes: Sizes) -> dict[str, Any]:
    before = master.memory()
    peak = {"rss": before["VmRSS"], "temp": 0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                peak["rss"] = max(peak["rss"], master.memory()["VmRSS"])
                peak["temp"] = max(peak["temp"], master.temp_bytes())
            except OSError:
                pass
            stop.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    s = _connect(master.http, sndbuf=64 * 1024, timeout=sizes.stall_seconds)
    chunk = b"x" * _MIB
    sent, stopped, answer = 0, "limit", ""
    deadline = time.monotonic() + sizes.post_seconds
    try:
        s.sendall(
            b"POST /topics/Abuse/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Length: 2147483648\r\n\r\n"
        )
        while sent < sizes.post_bytes:
            if time.monotonic() > deadline:
                stopped = "time"
                break
            if _readable(s):
                stopped = "answered"  # the master said something: it refused
                break
            try:
                s.sendall(chunk)
            except socket.timeout:
                stopped = "blocked"
                break
            except OSError:
                stopped = "closed"
                break
            sent += len(chunk)
        time.sleep(1)
        try:
            s.settimeout(1)
            answer = s.recv(200).split(b"\r\n", 1)[0].decode(errors="replace")
        except OSError as e:
            answer = f"no answer ({e.__class__.__name__})"
    finally:
        s.close()
        stop.set()
        sampler.join()
    return {
        "declared_bytes": 2 << 30,
        "sent_bytes": sent,
        "stopped": stopped,
        "answer": answer,
        "rss_growth_mib": _mib(peak["rss"] - before["VmRSS"]),
        "tmpdir_bytes": peak["temp"],
    }


_RUNNERS: dict[str, Callable[[_Master, Sizes], dict[str, Any]]] = {
    "digest": _digest,
    "flood": _flood,
    "conns": _conns,
    "post": _post,
}


def _commit(checkout: str) -> str | None:
    try:
        return subprocess.run(
            ["git", "-C", checkout, "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def run(
    scenarios: list[str],
    checkouts: list[str],
    sizes: Sizes = FULL,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """
    Each scenario against a master from each checkout, in turn; the
    results.  Everything happens in a new temporary directory, removed at
    the end.
    """
    root = tempfile.mkdtemp(prefix="rmqha-abuse-")
    runs = []
    try:
        for i, checkout in enumerate(checkouts):
            results: dict[str, Any] = {}
            for scenario in scenarios:
                if progress is not None:
                    progress(f"{scenario} on {checkout}")
                directory = os.path.join(root, f"{i}-{scenario}")
                master = None
                try:
                    master = _Master(checkout, directory, sizes)
                    results[scenario] = _RUNNERS[scenario](master, sizes)
                    if master.process.poll() is not None:
                        results[scenario]["master_exited"] = master.process.returncode
                finally:
                    if master is not None:
                        master.stop()
                    shutil.rmtree(directory, ignore_errors=True)
            runs.append({"checkout": checkout, "commit": _commit(checkout), "scenarios": results})
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": os.cpu_count(),
        "master_fd_limit": MASTER_FD_LIMIT,
        "quick": sizes == QUICK,
        "runs": runs,
    }


def table(result: dict[str, Any]) -> str:
    """
    The results as a text table: one row per measurement, one column per
    checkout.
    """
    runs = result["runs"]
    headers = ["measurement"] + [
        f"{os.path.basename(r['checkout'].rstrip('/')) or r['checkout']}"
        + (f" ({r['commit']})" if r["commit"] else "")
        for r in runs
    ]
    rows: list[list[str]] = []
    for scenario in SCENARIOS:
        keys: list[str] = []
        for r in runs:
            for key in r["scenarios"].get(scenario, {}):
                if key not in keys:
                    keys.append(key)
        for key in keys:
            rows.append(
                [f"{scenario}.{key}"]
                + [str(r["scenarios"].get(scenario, {}).get(key, "")) for r in runs]
            )
    widths = [max(len(row[c]) for row in [headers, *rows]) for c in range(len(headers))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
             for row in [headers, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _scenarios(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("--scenarios names no scenario")
    for name in names:
        if name not in SCENARIOS:
            raise argparse.ArgumentTypeError(
                f"unknown scenario {name!r} (choose from {', '.join(SCENARIOS)})"
            )
    return list(dict.fromkeys(names))


def _checkout(text: str) -> str:
    path = os.path.abspath(text)
    for needed in ("rmqha/__init__.py", "twisted/plugins/rmqha_plugin.py"):
        if not os.path.isfile(os.path.join(path, needed)):
            raise argparse.ArgumentTypeError(
                f"--checkout {text} is not a checkout of rmqha (no {needed})"
            )
    return path


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m tools.abuse", description=plain(__doc__),
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", type=_scenarios, default=list(SCENARIOS),
                        help=f"comma-separated, from {','.join(SCENARIOS)} (default: all)")
    parser.add_argument("--checkout", type=_checkout, metavar="DIR",
                        help="also measure a master run from this checkout of rmqha, first")
    parser.add_argument("--quick", action="store_true", help="shortened scenarios")
    parser.add_argument("--json", action="store_true", help="print the JSON only")
    try:
        args = parser.parse_args(argv)
    except _UsageError as e:
        print(e, file=sys.stderr)
        return 2
    checkouts = ([args.checkout] if args.checkout else []) + [_this_checkout()]
    result = run(
        args.scenarios, checkouts, QUICK if args.quick else FULL,
        lambda text: print(text, file=sys.stderr, flush=True),
    )
    if not args.json:
        print(table(result))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
