"""
Benchmarks (commands, not tests): C{python -m rmqha.bench store}.

C{store} measures the put path (1 KiB bodies by default, ASYNC_FLUSH: the
real L{CommitLogService} flushes on a thread while the reactor thread puts)
and the transfer read path (C{CommitLog.read} in C{haTransferBatchSize}
chunks, from page cache).  Each figure is the median of C{--runs} runs; the
last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.task import deferLater, react

from rmqha._record import Message
from rmqha.commitlog import CommitLog
from rmqha.storeservice import CommitLogService

__all__ = ["main", "machine_info"]


def machine_info() -> dict[str, Any]:
    """
    What the figures were measured on.
    """
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(
            os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30), 1
        ),
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def _messages(body_size: int, n: int = 16384) -> list[Message]:
    # n is a multiple of every batch size used (powers of two up to 4096),
    # so batches never wrap around the end of the list.
    body = os.urandom(body_size)
    return [
        Message(
            "BenchTopic",
            body,
            queue_id=i % 8,
            properties={
                "UNIQ_KEY": f"7F000001000100000000{i:012X}",
                "TAGS": "TagA",
                "WAIT": "true",
            },
        )
        for i in range(n)
    ]


async def _put_run(
    reactor: Any,
    directory: str,
    count: int,
    messages: list[Message],
    segment_size: int,
    batch_size: int,
) -> dict[str, float]:
    service = CommitLogService(
        lambda: CommitLog.open(
            directory, segment_size=segment_size, clock=reactor.seconds
        ),
        reactor,
    )
    service.startService()
    commitlog = service.commitlog
    assert commitlog is not None
    put, put_batch = commitlog.put, commitlog.put_batch
    n = len(messages)
    turn = 4096  # puts between two reactor turns
    started = time.perf_counter()
    done = 0
    while done < count:
        if batch_size == 1:
            for i in range(done, min(done + turn, count)):
                put(messages[i % n])
        else:
            for i in range(done, min(done + turn, count), batch_size):
                put_batch(messages[i % n : i % n + min(batch_size, count - i)])
        done += turn
        # Let the reactor run the flush loop, as a broker's would.
        await deferLater(reactor, 0, lambda: None)
    elapsed = time.perf_counter() - started
    written = commitlog.max_offset
    await service.stopService()
    return {
        "msgs_per_s": count / elapsed,
        "mb_per_s": written / elapsed / 1e6,
        "seconds": elapsed,
        "bytes": written,
    }


def _read_run(directory: str, chunk: int) -> dict[str, float]:
    with CommitLog.open(directory, read_only=True) as commitlog:
        offset, end = commitlog.min_offset, commitlog.max_offset
        read = commitlog.read
        total = 0
        started = time.perf_counter()
        while offset < end:
            data = read(offset, chunk)
            total += len(data)
            offset += len(data)
        elapsed = time.perf_counter() - started
    return {"gb_per_s": total / elapsed / 1e9, "bytes": total, "seconds": elapsed}


async def _store(reactor: Any, args: argparse.Namespace) -> dict[str, Any]:
    messages = _messages(args.body_size)
    root = tempfile.mkdtemp(prefix="rmqha-bench-", dir=args.dir)
    puts, reads = [], []
    try:
        for run in range(args.runs):
            directory = os.path.join(root, f"run{run}")
            result = await _put_run(
                reactor, directory, args.count, messages, args.segment_size, args.batch
            )
            puts.append(result)
            _progress(
                f"put run {run + 1}/{args.runs}: {result['msgs_per_s']:,.0f} msgs/s, "
                f"{result['mb_per_s']:,.0f} MB/s"
            )
            # Reads from page cache: read once to warm it, then measure.
            _read_run(directory, args.chunk)
            result = _read_run(directory, args.chunk)
            reads.append(result)
            _progress(
                f"read run {run + 1}/{args.runs}: {result['gb_per_s']:.2f} GB/s "
                f"({args.chunk}-byte reads)"
            )
            shutil.rmtree(directory)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "benchmark": "store",
        "machine": machine_info(),
        "count": args.count,
        "body_size": args.body_size,
        "batch": args.batch,
        "runs": args.runs,
        "put_msgs_per_s": statistics.median(r["msgs_per_s"] for r in puts),
        "put_mb_per_s": statistics.median(r["mb_per_s"] for r in puts),
        "put_runs_msgs_per_s": [round(r["msgs_per_s"]) for r in puts],
        "read_gb_per_s": statistics.median(r["gb_per_s"] for r in reads),
        "read_runs_gb_per_s": [round(r["gb_per_s"], 2) for r in reads],
        "read_chunk": args.chunk,
    }


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rmqha.bench")
    commands = parser.add_subparsers(dest="benchmark", required=True)
    store = commands.add_parser("store", help="put and transfer-read throughput")
    store.add_argument("--count", type=int, default=400_000, help="puts per run")
    store.add_argument("--body-size", type=int, default=1024)
    store.add_argument(
        "--batch", type=int, default=1, help="messages per put_batch (1: single puts)"
    )
    store.add_argument("--runs", type=int, default=5)
    store.add_argument("--segment-size", type=int, default=1 << 30)
    store.add_argument("--chunk", type=int, default=32768, help="read size (haTransferBatchSize)")
    store.add_argument("--dir", default=None, help="where to create the stores")
    args = parser.parse_args(argv)

    def run(reactor: Any) -> Deferred[None]:
        async def go() -> None:
            result = await _store(reactor, args)
            print(
                f"put:  {result['put_msgs_per_s']:,.0f} msgs/s, "
                f"{result['put_mb_per_s']:,.0f} MB/s (median of {args.runs})"
            )
            print(
                f"read: {result['read_gb_per_s']:.2f} GB/s (median of {args.runs})"
            )
            print(json.dumps(result))

        return ensureDeferred(go())

    react(run)


if __name__ == "__main__":
    main()
