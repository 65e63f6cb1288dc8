# -*- test-case-name: tests.test_tap -*-
"""
C{twistd rmqha}: options and the service tree.

For now the service holds the commit log open with its flush policy and
closes it cleanly on SIGTERM; replication (C{--role master|slave}) is
built on this.
"""

from __future__ import annotations

import os

from twisted.application.service import IService, MultiService
from twisted.python import usage

from rmqha._units import parse_size
from rmqha.commitlog import (
    CommitLog,
    FlushDiskType,
    MAX_SEGMENT_SIZE,
    MIN_SEGMENT_SIZE,
    StoreError,
)
from rmqha.storeservice import DEFAULT_FLUSH_INTERVAL, CommitLogService

__all__ = ["Options", "makeService"]


def parse_host_port(text: str, what: str) -> tuple[str, int]:
    """
    C{host:port} (C{[v6]:port} for IPv6) as a pair.

    @raise ValueError: naming C{what}.
    """
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what} {text!r} is not HOST:PORT")
    return host, int(port)


class Options(usage.Options):
    """
    C{twistd rmqha} command line.
    """

    synopsis = "--store-dir DIR [options]"
    longdesc = (
        "Runs an rmqha broker store: a RocketMQ 4.9-compatible commit log "
        "under --store-dir, flushed per --flush-disk-type and closed cleanly "
        "on SIGTERM."
    )

    optParameters = [
        ["store-dir", None, None, "store root (RocketMQ storePathRootDir)"],
        [
            "commitlog-dir",
            None,
            None,
            "commit log directory (RocketMQ storePathCommitLog; "
            "default STORE_DIR/commitlog)",
        ],
        [
            "segment-size",
            None,
            None,
            "segment file size for a new store, e.g. 1g, 64m "
            "(mappedFileSizeCommitLog; default 1g; an existing store's files "
            "decide)",
        ],
        [
            "flush-disk-type",
            None,
            "ASYNC_FLUSH",
            "ASYNC_FLUSH (periodic, off the reactor thread) or SYNC_FLUSH",
        ],
        [
            "flush-interval",
            None,
            str(int(DEFAULT_FLUSH_INTERVAL * 1000)),
            "ms between async flushes (flushIntervalCommitLog)",
        ],
        [
            "store-host",
            None,
            "127.0.0.1:10911",
            "HOST:PORT written as STOREHOST in every record (brokerIP1:listenPort)",
        ],
    ]

    def postOptions(self) -> None:
        if not self["store-dir"]:
            raise usage.UsageError("--store-dir is required")
        try:
            if self["segment-size"] is not None:
                size = parse_size(self["segment-size"], "--segment-size")
                if not MIN_SEGMENT_SIZE <= size <= MAX_SEGMENT_SIZE:
                    raise ValueError(
                        f"--segment-size {size} must be between "
                        f"{MIN_SEGMENT_SIZE} and {MAX_SEGMENT_SIZE}"
                    )
                self["segment-size"] = size
            try:
                self["flush-disk-type"] = FlushDiskType(
                    self["flush-disk-type"].upper()
                )
            except ValueError:
                raise ValueError(
                    f"--flush-disk-type {self['flush-disk-type']!r} is not "
                    "ASYNC_FLUSH or SYNC_FLUSH"
                ) from None
            interval = self["flush-interval"]
            if not str(interval).isdigit() or int(interval) <= 0:
                raise ValueError(
                    f"--flush-interval {interval!r} is not a positive number of ms"
                )
            self["flush-interval"] = int(interval) / 1000
            self["store-host"] = parse_host_port(self["store-host"], "--store-host")
        except ValueError as e:
            raise usage.UsageError(str(e)) from None


def makeService(options: Options) -> IService:
    """
    The service tree for C{options}.
    """
    from twisted.internet import reactor

    store_dir = os.path.abspath(options["store-dir"])

    def open_commitlog() -> CommitLog:
        try:
            return CommitLog.open(
                store_dir,
                segment_size=options["segment-size"],
                commitlog_dir=options["commitlog-dir"],
                store_host=options["store-host"],
                flush_disk_type=options["flush-disk-type"],
                clock=reactor.seconds,
            )
        except (StoreError, ValueError, OSError) as e:
            # An operator's problem, not a bug: one line, exit status 1.
            raise SystemExit(f"twistd rmqha: cannot open the store: {e}") from None

    top = MultiService()
    store = CommitLogService(
        open_commitlog, reactor, flush_interval=options["flush-interval"]
    )
    store.setName("store")
    store.setServiceParent(top)
    return top

