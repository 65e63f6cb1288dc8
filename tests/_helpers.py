"""
Shared helpers for the commit-log tests.

Expected values in these tests come from this module's own knowledge of the
RocketMQ 4.9 on-disk format (struct offsets, the 91-byte fixed overhead, the
BLANK rule), never from L{rmqha}: a test comparing the store with itself
could not fail.  L{rmqha.store.commitlog} is only used to build and open stores.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import struct
from typing import Any, Iterable, Mapping

from twisted.internet import tcp
from twisted.internet.interfaces import IProtocol
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from rmqha import _sockets
from rmqha.broker import Broker
from rmqha.ha.replica import Replica, ReplicaStatus
from rmqha.store import _record
from rmqha.store._record import Message, encode_record
from rmqha.store.commitlog import CommitLog
from rmqha.store.interfaces import IAppendedTo
from rmqha.ha.interfaces import IReplicaAcks

#: What the injected clock says: store timestamps are this many seconds...
STORE_SECONDS = 1700000000.0
#: ...which is this many milliseconds in STORETIMESTAMP.
STORE_TIMESTAMP = 1700000000000
#: CommitLog.open's default store host, and its offsetMsgId prefix
#: (4-byte address, int32 port, upper-case hex).
STORE_HOST = ("127.0.0.1", 10911)
STORE_HOST_HEX = "7F000001" + "00002A9F"

#: 0xDAA320A7 and 0xCBD43194 as Java ints.
MAGIC_V1 = struct.unpack(">i", bytes.fromhex("DAA320A7"))[0]
BLANK_MAGIC = struct.unpack(">i", bytes.fromhex("CBD43194"))[0]
#: TOTALSIZE .. BODYLENGTH plus the int8 topic and int16 properties lengths,
#: with IPv4 hosts.
FIXED_SIZE = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 8 + 4 + 1 + 2
assert FIXED_SIZE == 91


def replica_of(broker: Broker) -> Replica:
    """
    The L{Replica} a slave C{broker} runs (failing when it runs none).
    """
    side = broker.role_service
    assert isinstance(side, Replica), f"{broker.role.value} runs {side!r}, not a replica"
    return side


def replication_of(broker: Broker) -> ReplicaStatus:
    """
    C{broker}'s replication as a slave (L{Replica.status}); nothing
    counted while it runs no replica (a master, or standing by).
    """
    side = broker.role_service
    return side.status() if isinstance(side, Replica) else ReplicaStatus()


def fixed_clock() -> float:
    """
    The store clock for every test: time never moves.
    """
    return STORE_SECONDS


def properties_bytes(properties: Mapping[str, str] | None) -> bytes:
    """
    The PROPERTIES field for C{properties}, encoded by hand.
    """
    if not properties:
        return b""
    return "\x02".join(f"{k}\x01{v}" for k, v in properties.items()).encode()


def make_message(
    body: bytes = b"payload",
    topic: str = "TopicA",
    queue_id: int = 0,
    properties: Mapping[str, str] | None = None,
    **fields: int,
) -> Message:
    """
    A message with an IPv4 born host (the store's) and the given fields.
    """
    return Message(
        topic=topic,
        body=body,
        queue_id=queue_id,
        properties=dict(properties or {}),
        **fields,
    )


def record_size(message: Message) -> int:
    """
    TOTALSIZE of C{message}'s record with IPv4 hosts, by the 4.9 formula.
    """
    return (
        FIXED_SIZE
        + len(message.body)
        + len(message.topic.encode())
        + len(properties_bytes(message.properties))
    )


def replica_records(start: int, *sizes: int) -> bytes:
    """
    Valid records of exactly these TOTALSIZEs (each at least
    C{record_size(make_message(b""))}), chained from commit-log offset
    C{start}: what a master would send a replica.
    """
    out = b""
    offset = start
    empty = record_size(make_message(b""))
    for size in sizes:
        if size < empty:
            raise ValueError(f"a record is at least {empty} bytes, not {size}")
        message = make_message(bytes(range(256)) * (size // 256 + 1))
        message = make_message(message.body[: size - empty])
        out += encode_record(
            message,
            queue_offset=0,
            physical_offset=offset,
            store_timestamp=1_700_000_000_000,
            store_host=("127.0.0.1", 10911),
        )
        offset += size
    return out


def field_spans(message: Message) -> dict[str, range]:
    """
    Byte ranges, relative to the record start, of every field of
    C{message}'s record (IPv4 hosts).
    """
    body = len(message.body)
    topic = len(message.topic.encode())
    props = len(properties_bytes(message.properties))
    spans = {}
    position = 0
    for name, size in [
        ("TOTALSIZE", 4),
        ("MAGICCODE", 4),
        ("BODYCRC", 4),
        ("QUEUEID", 4),
        ("FLAG", 4),
        ("QUEUEOFFSET", 8),
        ("PHYSICALOFFSET", 8),
        ("SYSFLAG", 4),
        ("BORNTIMESTAMP", 8),
        ("BORNHOST", 8),
        ("STORETIMESTAMP", 8),
        ("STOREHOST", 8),
        ("RECONSUMETIMES", 4),
        ("PREPAREDTXOFFSET", 8),
        ("BODYLENGTH", 4),
        ("BODY", body),
        ("TOPICLENGTH", 1),
        ("TOPIC", topic),
        ("PROPERTIESLENGTH", 2),
        ("PROPERTIES", props),
    ]:
        spans[name] = range(position, position + size)
        position += size
    assert position == record_size(message)
    return spans


def plan_offsets(
    sizes: Iterable[int], segment_size: int, start: int = 0
) -> tuple[list[int], list[tuple[int, int]], int]:
    """
    Where RocketMQ's put path places records of C{sizes}: a record goes in
    the current segment only if it leaves at least 8 bytes for a BLANK;
    otherwise a BLANK covers the rest and the record starts the next
    segment.

    @return: the record offsets, the BLANKs as C{(offset, size)}, and the
        end offset.
    """
    offsets: list[int] = []
    blanks: list[tuple[int, int]] = []
    position = start
    for size in sizes:
        left = segment_size - position % segment_size
        if size + 8 > left:
            blanks.append((position, left))
            position += left
        offsets.append(position)
        position += size
    return offsets, blanks, position


def segment_file_name(start: int) -> str:
    """
    A segment's file name: its start offset in 20 zero-padded digits.
    """
    return "%020d" % start


def open_store(
    case: SynchronousTestCase, path: str | None = None, **options: object
) -> CommitLog:
    """
    Open a store (a fresh trial temp directory unless C{path} is given)
    with the fixed clock, closed when the test ends.
    """
    options.setdefault("clock", fixed_clock)
    log = CommitLog.open(case.mktemp() if path is None else path, **options)
    case.addCleanup(log.close)
    return log


def put_all(log: CommitLog, messages: Iterable[Message]) -> list:
    """
    Put every message; the L{AppendResult}s.
    """
    return [log.put(message) for message in messages]


def commitlog_dir(store_dir: str) -> str:
    return os.path.join(store_dir, "commitlog")


def segment_path(store_dir: str, start: int) -> str:
    return os.path.join(commitlog_dir(store_dir), segment_file_name(start))


def segment_files(store_dir: str) -> dict[str, bytes]:
    """
    File name -> contents of every file in C{<store>/commitlog}.
    """
    directory = commitlog_dir(store_dir)
    result = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            result[name] = f.read()
    return result


def file_bytes(store_dir: str, segment_size: int, start: int, end: int) -> bytes:
    """
    Commit-log bytes C{[start, end)} read straight from the segment files.
    """
    chunks = []
    position = start
    while position < end:
        base = position - position % segment_size
        stop = min(end, base + segment_size)
        with open(segment_path(store_dir, base), "rb") as f:
            f.seek(position - base)
            chunks.append(f.read(stop - position))
        position = stop
    return b"".join(chunks)


def disk(log: CommitLog, start: int, end: int) -> bytes:
    """
    C{log}'s bytes C{[start, end)} as its segment files hold them.
    """
    return file_bytes(log.store_dir, log.segment_size, start, end)


def header_fields(data: bytes, position: int = 0) -> dict[str, int]:
    """
    The integer fields of the record at C{data[position:]} (IPv4 hosts),
    decoded with C{struct} alone.
    """
    names = [
        "TOTALSIZE",
        "MAGICCODE",
        "BODYCRC",
        "QUEUEID",
        "FLAG",
        "QUEUEOFFSET",
        "PHYSICALOFFSET",
        "SYSFLAG",
        "BORNTIMESTAMP",
    ]
    values = struct.unpack_from(">iiiiiqqiq", data, position)
    fields = dict(zip(names, values))
    (fields["STORETIMESTAMP"],) = struct.unpack_from(">q", data, position + 56)
    (fields["BODYLENGTH"],) = struct.unpack_from(">i", data, position + 84)
    return fields


def disk_fields(log: CommitLog, offset: int) -> dict[str, int]:
    """
    The integer fields of the record at C{offset}, read from the files.
    """
    return header_fields(disk(log, offset, offset + 88))


def rewrite(path: str, position: int, data: bytes) -> None:
    """
    Overwrite C{data} at C{position} of the file at C{path}.
    """
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(data)


def zero_from(path: str, position: int) -> None:
    """
    Zero a fixed-size segment file from C{position} to its end: what a
    segment looks like when writing stopped at C{position}.
    """
    size = os.path.getsize(path)
    rewrite(path, position, bytes(size - position))


def xor_byte(path: str, position: int) -> None:
    """
    Flip every bit of the byte at C{position}.
    """
    with open(path, "r+b") as f:
        f.seek(position)
        (value,) = f.read(1)
        f.seek(position)
        f.write(bytes([value ^ 0xFF]))


def mark_unclean(store_dir: str) -> None:
    """
    Leave the C{abort} marker a crashed process leaves.
    """
    with open(os.path.join(store_dir, "abort"), "wb"):
        pass


def copy_store(case: SynchronousTestCase, store_dir: str) -> str:
    """
    Copy a store directory into a fresh temp directory.  Copying a store
    while it is open is how a crash is simulated: the copy keeps the
    C{abort} marker and whatever the mapped segments held.
    """
    target = case.mktemp()
    shutil.copytree(store_dir, target)
    return target


def tree_digest(root: str) -> dict[str, str]:
    """
    Relative path -> sha256 of every file under C{root} (directories map to
    C{"dir"}): equal digests mean nothing was created, removed or changed.
    """
    result = {}
    for directory, subdirs, files in os.walk(root):
        for name in subdirs:
            result[os.path.relpath(os.path.join(directory, name), root)] = "dir"
        for name in files:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            result[os.path.relpath(path, root)] = digest
    return result


class PurePath:
    """
    A test case mixin: each test runs on the pure-Python codec
    (C{RMQHA_PURE=1}'s path) whether or not the compiled one is built, and
    the codec in use is put back after it.  Put it first:
    C{class PureXTests(PurePath, test_x.XTests)}.
    """

    def setUp(self) -> None:
        saved = _record._accel
        _record._accel = None

        def restore() -> None:
            _record._accel = saved

        self.addCleanup(restore)  # type: ignore[attr-defined]
        super().setUp()  # type: ignore[misc]


@implementer(IReplicaAcks)
class StubAcks:
    """
    What a master's replicas acknowledged, as a test sets it: C{nodes}
    (failover node id to ack) and C{live} (the nodes, or fixed-role acks,
    whose links deliver acks).
    """

    def __init__(self) -> None:
        self.acks: list[int] = []
        self.nodes: dict[str, int] = {}
        self.live: list[int] = []
        self.live_node_ids: set[str] = set()

    def ack_offsets(self) -> list[int]:
        return list(self.acks)

    def node_acks(self) -> dict[str, int]:
        return dict(self.nodes)

    def live_count(self, past: int = -1) -> int:
        return sum(1 for ack in self.live if ack > past)

    def live_nodes(self) -> set[str]:
        return set(self.live_node_ids)


@implementer(IAppendedTo)
class StubAppended:
    """
    A store appended up to C{max_offset}.
    """

    def __init__(self, max_offset: int = 0) -> None:
        self.max_offset = max_offset


def settings_and_runtime(options: dict[str, Any], **defaults: Any) -> tuple[Any, dict[str, Any]]:
    """
    Split a test's L{Broker} keywords: the L{BrokerSettings} (built from
    C{defaults} updated with the settings among C{options}) and the
    runtime keywords left (C{run_in_thread=}, C{epochs=} ...).
    """
    import attrs

    from rmqha.settings import BrokerSettings

    names = attrs.fields_dict(BrokerSettings)
    settings = {**defaults, **{k: v for k, v in options.items() if k in names}}
    runtime = {k: v for k, v in options.items() if k not in names}
    return BrokerSettings(**settings), runtime


class LoggedEvents:
    """
    Every event logged through Twisted's global log publisher while
    C{case} runs (observer removed at its cleanup).
    """

    def __init__(self, case: SynchronousTestCase) -> None:
        from twisted.logger import globalLogPublisher

        self.events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.events.append)
        case.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def texts(self) -> list[str]:
        from twisted.logger import formatEvent

        return [formatEvent(e) for e in self.events]


class _PairConnection(tcp.Connection):
    """
    Twisted's TCP connection over one end of a socket pair (no TCP options
    to set there).
    """

    def setTcpNoDelay(self, enabled: bool) -> None:
        pass


def socket_pair_connection(
    case: SynchronousTestCase, protocol: IProtocol
) -> tuple[tcp.Connection, socket.socket]:
    """
    A connected, non-blocking socket pair: Twisted's TCP transport for
    C{protocol} on one end (no reactor runs: its writes queue until the
    test calls C{doWrite}), the other end for the test to read.  Both
    closed at cleanup.
    """
    mine, peer = socket.socketpair()
    mine.setblocking(False)
    peer.setblocking(False)
    case.addCleanup(mine.close)
    case.addCleanup(peer.close)
    transport = _PairConnection(mine, protocol, MemoryReactorClock())
    transport.connected = True
    return transport, peer


def record_sendfile(case: SynchronousTestCase) -> list[tuple[int, int, int]]:
    """
    Record every C{sendfile} L{rmqha._sockets} makes, as C{(fd, position,
    count)}, and make it.
    """
    calls: list[tuple[int, int, int]] = []
    real = _sockets._sendfile
    assert real is not None

    def recording(out: int, fd: int, position: int, count: int) -> int:
        calls.append((fd, position, count))
        return real(out, fd, position, count)

    case.patch(_sockets, "_sendfile", recording)
    return calls
