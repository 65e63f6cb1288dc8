# -*- test-case-name: tests.integration.test_soak -*-
"""
C{python -m tools.soak --minutes N [--out DIR]}: a master and two slaves
(C{twistd rmqha} processes on loopback) under steady load for N minutes,
sampling every second each process's RSS and open files, and each slave's
lag; then C{soak.json} (every sample, and a verdict per series) and
C{soak.png} (the three series over time) in C{--out}.

A series "grows" when the mean of its last fifth exceeds the mean of its
second fifth (the first is warm-up) by more than its allowance (RSS: 16 MiB
and 20 %; open files: 4; lag: 8 MiB).  The exit status is 1 if anything
grows or a process died.

The stores live in a new temporary directory, removed at the end (nothing
else is deleted).  C{--out} may exist, but not with a C{soak.json} or
C{soak.png} in it: the soak checks that before it starts (one line, exit
status 2) and never overwrites either.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any

from tools.processes import free_ports, twistd_command

__all__ = ["main", "run", "grows", "check_out"]

_OUTPUTS = ("soak.json", "soak.png")



def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _get(port: int, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


def grows(values: list[float], absolute: float, relative: float = 0.0) -> bool:
    """
    Whether the last fifth of C{values} is above the second fifth by more
    than C{absolute} and (when given) C{relative} of it.
    """
    if len(values) < 10:
        return False
    fifth = len(values) // 5
    early = sum(values[fifth : 2 * fifth]) / fifth
    late = sum(values[-fifth:]) / fifth
    return late - early > absolute and (not relative or late > early * (1 + relative))


def run(
    seconds: float, out: str, rate: int = 500, body_size: int = 1024, segment_size: int = 64 << 20
) -> dict[str, Any]:
    """
    The soak itself; returns the summary (also written to C{out}).

    @raise ValueError: C{out} is not usable (L{check_out}), before anything
        starts.
    """
    check_out(out)
    root = tempfile.mkdtemp(prefix="rmqha-soak-")
    ha, http = free_ports(2)
    processes: dict[str, subprocess.Popen[bytes]] = {}
    stop = threading.Event()
    sent = {"ok": 0, "errors": 0}

    def start(name: str, *options: str) -> None:
        processes[name] = subprocess.Popen(
            twistd_command(
                os.path.join(root, name), os.path.join(root, f"{name}.log"),
                "--segment-size", str(segment_size), *options,
            )
        )

    def produce() -> None:
        body = os.urandom(body_size)
        interval = 1.0 / rate
        next_at = time.monotonic()
        while not stop.is_set():
            request = urllib.request.Request(
                f"http://127.0.0.1:{http}/topics/Soak/messages", data=body, method="POST"
            )
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    response.read()
                sent["ok"] += 1
            except OSError:
                sent["errors"] += 1
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                next_at = time.monotonic()

    samples: list[dict[str, Any]] = []
    try:
        start(
            "master", "--role", "master",
            "--ha-listen", f"tcp:{ha}:interface=127.0.0.1",
            "--http", f"tcp:{http}:interface=127.0.0.1",
        )
        for name in ("slave1", "slave2"):
            start(name, "--role", "slave", "--master", f"127.0.0.1:{ha}")
        deadline = time.monotonic() + 30
        while True:
            try:
                if len(_get(http, "/status").get("slaves", [])) == 2:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the master and two slaves did not come up within 30 s")
            time.sleep(0.2)
        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            time.sleep(1.0)
            sample: dict[str, Any] = {"t": round(time.monotonic() - started, 1)}
            for name, process in processes.items():
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited with status {process.returncode}")
                sample[f"{name}_rss"] = _rss(process.pid)
                sample[f"{name}_fds"] = _open_files(process.pid)
            status = _get(http, "/status")
            lags = sorted(s["lag_bytes"] or 0 for s in status.get("slaves", []))
            sample["lag"] = lags
            samples.append(sample)
        stop.set()
        producer.join()
    finally:
        stop.set()
        for process in processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        shutil.rmtree(root, ignore_errors=True)
    verdicts = {}
    for name in processes:
        verdicts[f"{name}_rss"] = grows([s[f"{name}_rss"] for s in samples], 16 << 20, 0.2)
        verdicts[f"{name}_fds"] = grows([s[f"{name}_fds"] for s in samples], 4)
    verdicts["lag"] = grows([max(s["lag"] or [0]) for s in samples], 8 << 20)
    summary = {
        "seconds": seconds,
        "messages": sent["ok"],
        "errors": sent["errors"],
        "grows": verdicts,
        "ok": not any(verdicts.values()),
        "samples": samples,
    }
    files = {
        "soak.json": (json.dumps(summary) + "\n").encode(),
        "soak.png": _chart(samples, list(processes)),
    }
    os.makedirs(out, exist_ok=True)
    for name, data in files.items():
        # "x": a file that appeared during the run is not replaced.
        with open(os.path.join(out, name), "xb") as f:
            f.write(data)
    return summary


def check_out(out: str) -> None:
    """
    Whether the soak may write its results into C{out}: a directory (or
    nothing yet) without a C{soak.json} or C{soak.png}.

    @raise ValueError: the reason, in one line.
    """
    if os.path.lexists(out) and not os.path.isdir(out):
        raise ValueError(f"--out {out} exists and is not a directory")
    existing = [os.path.join(out, n) for n in _OUTPUTS if os.path.lexists(os.path.join(out, n))]
    if existing:
        raise ValueError(
            f"{' and '.join(existing)} exist{'s' if len(existing) == 1 else ''}; "
            "the soak does not overwrite (choose another --out)"
        )


def _chart(samples: list[dict[str, Any]], names: list[str]) -> bytes:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t"] for s in samples]
    fig, (rss, fds, lag) = plt.subplots(3, 1, figsize=(10, 8), dpi=100, sharex=True)
    for name in names:
        rss.plot(t, [s[f"{name}_rss"] / (1 << 20) for s in samples], label=name)
        fds.plot(t, [s[f"{name}_fds"] for s in samples], label=name)
    for i in range(2):
        lag.plot(t, [(s["lag"][i] if len(s["lag"]) > i else 0) / (1 << 20) for s in samples],
                 label=f"slave {i + 1}")
    rss.set_ylabel("RSS (MiB)")
    fds.set_ylabel("open files")
    lag.set_ylabel("lag (MiB)")
    lag.set_xlabel("seconds")
    for ax in (rss, fds, lag):
        ax.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png")
    plt.close(fig)
    return png.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=500, help="messages per second")
    parser.add_argument("--segment-size", type=int, default=64 << 20)
    parser.add_argument("--out", default="soak-out", help="where soak.json and soak.png go")
    args = parser.parse_args(argv)
    try:
        check_out(args.out)
    except ValueError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    summary = run(args.minutes * 60, args.out, args.rate, segment_size=args.segment_size)
    print(json.dumps({k: v for k, v in summary.items() if k != "samples"}))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
