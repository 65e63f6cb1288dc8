# -*- test-case-name: tests.integration.test_soak -*-
"""
C{python -m tools.soak --minutes N [--out DIR]}: a master and two slaves
(C{twistd rmqha} processes on loopback) under steady load for N minutes,
sampling every second each process's resident memory (its heap and its
mapped files apart) and open files, and each slave's lag; then
C{soak.json} (every sample, and a verdict per series) and C{soak.png}
(the series over time) in C{--out}.

Verdicts (docs/reliability.md, "Soak"):

  - heap (anonymous RSS), open files, lag: a series "grows" when the
    least-squares line over the second half of the run (the first half is
    warm-up) rises across that half by more than an allowance (heap: 4 MiB
    and 10 %; open files: 4; lag: 8 MiB);
  - mapped files (file-backed RSS): the written pages of the segment being
    filled count here, so it rises by design up to the segment size and
    drops at the roll; it "grows" when its range (max - min) exceeds one
    segment plus the pages pre-faulted ahead of the put position plus
    8 MiB.

The exit status is 1 if anything grows or a process died.

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
import uuid
from typing import Any

from rmqha.store._prefault import AHEAD
from tools._help import plain
from tools.processes import free_ports, twistd_command

__all__ = ["main", "run", "grows", "beyond", "verdicts", "check_out"]

_OUTPUTS = ("soak.json", "soak.png")



def _rss(pid: int) -> dict[str, int]:
    """
    The resident set of process C{pid} in bytes, from C{/proc/PID/status}:
    C{"anon"} (the heap: Python's objects, the allocator's arenas, the
    C library's) and C{"file"} (pages of mapped files: the libraries, and
    the store's mapped segments, C{RssFile} + C{RssShmem}).
    """
    fields: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("RssAnon", "RssFile", "RssShmem"):
                fields[name] = int(value.split()[0]) * 1024
    return {"anon": fields["RssAnon"], "file": fields["RssFile"] + fields["RssShmem"]}


def _open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _get(port: int, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


#: The heap's allowance (L{grows}): 4 MiB and 10 %.
HEAP_ALLOWANCE = (4 << 20, 0.10)
#: Open files' allowance (L{grows}).
FDS_ALLOWANCE = 4
#: A slave's lag's allowance (L{grows}), bytes.
LAG_ALLOWANCE = 8 << 20
#: What the mapped-file RSS may range over beyond one segment (L{beyond}):
#: the pages pre-faulted ahead of the put position (up to 2 x C{AHEAD},
#: rmqha/store/_prefault.py) and 8 MiB.
MAPPED_SLACK = 2 * AHEAD + (8 << 20)


def grows(values: list[float], absolute: float, relative: float = 0.0) -> bool:
    """
    Whether C{values} (one a second) grow after their warm-up: whether the
    least-squares line through their second half rises across that half
    by more than C{absolute} and (when given) C{relative} of where the
    line starts.  The first half is warm-up (caches, allocator arenas and
    buffers filling up to their bound), whatever it does; fewer than 10
    values are not judged.
    """
    if len(values) < 10:
        return False
    half = values[len(values) // 2 :]
    n = len(half)
    mean_x = (n - 1) / 2
    mean_y = sum(half) / n
    slope = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(half)) / sum(
        (x - mean_x) ** 2 for x in range(n)
    )
    rise = slope * (n - 1)
    start = mean_y - slope * mean_x
    return rise > absolute and (not relative or rise > relative * start)


def beyond(values: list[float], bound: float) -> bool:
    """
    Whether C{values} range (max - min) over more than C{bound}: for a
    series that rises and falls by design (a segment's mapped pages),
    where a trend means nothing but the range has a known bound.
    """
    return bool(values) and max(values) - min(values) > bound


def verdicts(samples: list[dict[str, Any]], names: list[str], segment_size: int) -> dict[str, bool]:
    """
    The soak's verdict per series of C{samples} (processes C{names}, the
    first the master, with segments of C{segment_size} bytes): C{True}
    where it grows (L{grows}, L{beyond}).
    """
    found = {}
    for name in names:
        found[f"{name}_heap"] = grows([s[f"{name}_rss_anon"] for s in samples], *HEAP_ALLOWANCE)
        found[f"{name}_mapped"] = beyond(
            [s[f"{name}_rss_file"] for s in samples], segment_size + MAPPED_SLACK
        )
        found[f"{name}_fds"] = grows([s[f"{name}_fds"] for s in samples], FDS_ALLOWANCE)
    for name in names[1:]:
        lags = [s["lag"][name] for s in samples if s["lag"].get(name) is not None]
        found[f"{name}_lag"] = grows(lags, LAG_ALLOWANCE)
    return found


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
    ids: dict[str, str] = {}
    max_offset = 0
    try:
        start(
            "master", "--role", "master",
            "--ha-listen", f"tcp:{ha}:interface=127.0.0.1",
            "--http", f"tcp:{http}:interface=127.0.0.1",
        )
        for name in ("slave1", "slave2"):
            # A known replica id (a slave keeps the one in its store), so
            # that /status says which slave each lag is.
            ids[name] = str(uuid.uuid4())
            os.makedirs(os.path.join(root, name, "rmqha"))
            with open(os.path.join(root, name, "rmqha", "replica-id"), "w") as id_file:
                id_file.write(ids[name] + "\n")
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
                rss = _rss(process.pid)
                sample[f"{name}_rss"] = rss["anon"] + rss["file"]
                sample[f"{name}_rss_anon"] = rss["anon"]
                sample[f"{name}_rss_file"] = rss["file"]
                sample[f"{name}_fds"] = _open_files(process.pid)
            status = _get(http, "/status")
            max_offset = status["max_offset"]
            lags = {s.get("replica_id"): s["lag_bytes"] for s in status.get("slaves", [])}
            sample["lag"] = {name: lags.get(ids[name]) for name in ids}
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
    judged = verdicts(samples, list(processes), segment_size)
    summary = {
        "seconds": seconds,
        "messages": sent["ok"],
        "errors": sent["errors"],
        "segments_filled": max_offset // segment_size,
        "grows": judged,
        "ok": not any(judged.values()),
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


#: Each process's line style: its own colour, dash and marker, so that
#: two processes with the same values (the slaves, often) are both seen.
_STYLES = {
    "master": {"color": "tab:blue", "linestyle": "-", "marker": "o"},
    "slave1": {"color": "tab:orange", "linestyle": "--", "marker": "^"},
    "slave2": {"color": "tab:green", "linestyle": ":", "marker": "v"},
}

_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def lag_unit(peak: float) -> tuple[str, int]:
    """
    The unit the lag is drawn in for a largest lag of C{peak} bytes: the
    largest of GiB, MiB and KiB that C{peak} reaches, else bytes.
    """
    for unit, size in _UNITS:
        if peak >= size:
            return unit, size
    return "bytes", 1


def _chart(samples: list[dict[str, Any]], names: list[str]) -> bytes:
    """
    L{_figure} as PNG.
    """
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = _figure(samples, names)
    png = io.BytesIO()
    fig.savefig(png, format="png")
    plt.close(fig)
    return png.getvalue()


def _figure(samples: list[dict[str, Any]], names: list[str]) -> Any:
    """
    The soak's series over time, one panel each: heap and mapped-file
    RSS (MiB) and open files per process, lag per slave (in L{lag_unit};
    a sample without a known lag is a gap, not a zero).  Each process has
    its own style (L{_STYLES}), markers staggered between processes.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t"] for s in samples]
    lags = [v for s in samples for v in s["lag"].values() if v is not None]
    unit, size = lag_unit(max(lags, default=0))
    every = max(len(names), len(samples) // 15)
    fig, (heap, mapped, fds, lag) = plt.subplots(4, 1, figsize=(10, 10), dpi=100, sharex=True)
    for i, name in enumerate(names):
        style = {
            **_STYLES.get(name, {}), "label": name, "markersize": 4,
            "markevery": (i * every // len(names), every),
        }
        heap.plot(t, [s[f"{name}_rss_anon"] / (1 << 20) for s in samples], **style)
        mapped.plot(t, [s[f"{name}_rss_file"] / (1 << 20) for s in samples], **style)
        fds.plot(t, [s[f"{name}_fds"] for s in samples], **style)
        if i:
            values = [s["lag"].get(name) for s in samples]
            lag.plot(t, [float("nan") if v is None else v / size for v in values], **style)
    heap.set_ylabel("heap RSS (MiB)")
    mapped.set_ylabel("mapped-file RSS (MiB)")
    fds.set_ylabel("open files")
    lag.set_ylabel(f"lag ({unit})")
    lag.set_xlabel("seconds")
    for ax in (heap, mapped, fds, lag):
        # (Outside the panel: never over a line.)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.soak",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="how long (default 10)")
    parser.add_argument("--rate", type=int, default=500, help="messages per second (default 500)")
    parser.add_argument(
        "--segment-size", type=int, default=64 << 20,
        help="the commit log's segment size in bytes (default 64 MiB)",
    )
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
