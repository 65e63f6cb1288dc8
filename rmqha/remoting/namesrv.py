# -*- test-case-name: tests.test_remoting_namesrv -*-
"""
What a broker and a NameServer exchange (RocketMQ 4.9.8's
C{common/protocol/header/namesrv/} and C{body/RegisterBrokerBody}): the
custom headers of REGISTER_BROKER (103), UNREGISTER_BROKER (104) and
GET_ROUTEINFO_BY_TOPIC (105), the C{RegisterBrokerBody} in both its
encodings, and the C{RegisterBrokerResult} a broker reads back.

Used by the broker's registration (L{rmqha.remoting.registration}) and
by the NameServer fake of L{rmqha.testing}.
"""

from __future__ import annotations

import dataclasses
import struct
import zlib
from collections.abc import Mapping, Sequence
from typing import Final

from rmqha.remoting._frames import Int32
from rmqha.remoting.metadata import (
    DataVersion,
    JSONValue,
    MetadataError,
    MetadataFormatError,
    MetadataLimits,
    TopicConfig,
    TopicFilterType,
    TopicTable,
    dump_fastjson,
    parse_fastjson,
)

__all__ = [
    "MASTER_ID",
    "RegisterBrokerRequestHeader",
    "RegisterBrokerResponseHeader",
    "UnregisterBrokerRequestHeader",
    "GetRouteInfoRequestHeader",
    "RegisterBrokerBody",
    "RegisterBrokerResult",
    "RegisterBodyError",
    "body_crc32",
    "encode_register_body",
    "decode_register_body",
    "parse_namesrv_addr",
]

#: C{MixAll.MASTER_ID}: the brokerId of a master.
MASTER_ID: Final = 0

#: The most bytes a compressed RegisterBrokerBody may inflate to (the
#: frame limit: an uncompressed body could be no bigger).
MAX_INFLATED: Final = 16 * 1024 * 1024


def _wire(name: str) -> dict[str, str]:
    return {"wire": name}


@dataclasses.dataclass(frozen=True)
class RegisterBrokerRequestHeader:
    """
    C{RegisterBrokerRequestHeader}: who registers, and how the body is
    encoded (C{compressed}) and checked (C{bodyCrc32}, 0: unchecked).
    """

    broker_name: str = dataclasses.field(metadata=_wire("brokerName"))
    broker_addr: str = dataclasses.field(metadata=_wire("brokerAddr"))
    cluster_name: str = dataclasses.field(metadata=_wire("clusterName"))
    ha_server_addr: str = dataclasses.field(metadata=_wire("haServerAddr"))
    broker_id: int = dataclasses.field(metadata=_wire("brokerId"))
    compressed: bool = False
    body_crc32: Int32 = dataclasses.field(default=0, metadata=_wire("bodyCrc32"))


@dataclasses.dataclass(frozen=True)
class RegisterBrokerResponseHeader:
    """
    C{RegisterBrokerResponseHeader}: a slave's master's HA and remoting
    addresses (both absent for a master, or while no master is registered).
    """

    ha_server_addr: str | None = dataclasses.field(default=None, metadata=_wire("haServerAddr"))
    master_addr: str | None = dataclasses.field(default=None, metadata=_wire("masterAddr"))


@dataclasses.dataclass(frozen=True)
class UnregisterBrokerRequestHeader:
    """C{UnRegisterBrokerRequestHeader}."""

    broker_name: str = dataclasses.field(metadata=_wire("brokerName"))
    broker_addr: str = dataclasses.field(metadata=_wire("brokerAddr"))
    cluster_name: str = dataclasses.field(metadata=_wire("clusterName"))
    broker_id: int = dataclasses.field(metadata=_wire("brokerId"))


@dataclasses.dataclass(frozen=True)
class GetRouteInfoRequestHeader:
    """C{GetRouteInfoRequestHeader}."""

    topic: str
    accept_standard_json_only: bool | None = dataclasses.field(
        default=None, metadata=_wire("acceptStandardJsonOnly")
    )


@dataclasses.dataclass(frozen=True)
class RegisterBrokerBody:
    """
    C{RegisterBrokerBody}: the broker's topic table
    (C{TopicConfigSerializeWrapper}) and its filter servers.
    """

    topics: TopicTable
    filter_servers: Sequence[str] = ()


@dataclasses.dataclass(frozen=True)
class RegisterBrokerResult:
    """
    What one NameServer answered a registration: C{RegisterBrokerResult}.

    @ivar ha_server_addr: the master's HA address (a slave's answer).
    @ivar master_addr: the master's remoting address (a slave's answer).
    @ivar kv_table: the C{ORDER_TOPIC_CONFIG} namespace (topic →
        C{"broker-a:4;..."}), empty when the NameServer has none.
    """

    ha_server_addr: str | None = None
    master_addr: str | None = None
    kv_table: Mapping[str, str] = dataclasses.field(default_factory=dict)


class RegisterBodyError(ValueError):
    """
    A RegisterBrokerBody (or a KVTable) that cannot be read, naming why.
    """


def body_crc32(body: bytes) -> int:
    """C{UtilAll.crc32}: CRC-32 of the body, its top bit cleared."""
    return zlib.crc32(body) & 0x7FFFFFFF


def encode_register_body(body: RegisterBrokerBody, *, compressed: bool = False) -> bytes:
    """
    The body as C{RegisterBrokerBody.encode(compressed)} writes it: fastjson
    by default; with C{compressed} (C{compressedRegister=true}) a zlib
    stream of: int32 length + the DataVersion JSON, int32 topic count, per
    topic int32 length + C{"name readQ writeQ perm filterType"} (sysFlag
    and order are not carried), int32 length + the filter server list JSON.
    """
    if not compressed:
        doc: dict[str | int, JSONValue] = {
            "filterServerList": list(body.filter_servers),
            "topicConfigSerializeWrapper": body.topics.to_json(),
        }
        return dump_fastjson(doc).encode("utf-8")
    parts: list[bytes] = []

    def chunk(data: bytes) -> None:
        parts.append(struct.pack(">i", len(data)))
        parts.append(data)

    chunk(dump_fastjson(body.topics.data_version.to_json()).encode("utf-8"))
    parts.append(struct.pack(">i", len(body.topics.topics)))
    for t in body.topics.topics.values():
        chunk(
            f"{t.topic_name} {t.read_queue_nums} {t.write_queue_nums} {t.perm} "
            f"{t.topic_filter_type}".encode("utf-8")
        )
    chunk(dump_fastjson(list(body.filter_servers)).encode("utf-8"))
    return zlib.compress(b"".join(parts), 9)


def _filter_servers(v: JSONValue, where: str) -> list[str]:
    if v is None:
        return []
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise RegisterBodyError(f"{where}: filterServerList is not a list of strings")
    return list(v)


def decode_register_body(
    data: bytes, compressed: bool, limits: MetadataLimits = MetadataLimits()
) -> RegisterBrokerBody:
    """
    Read a RegisterBrokerBody in either encoding (what a NameServer does
    with C{RegisterBrokerBody.decode(data, compressed)}), bounded: at most
    L{MAX_INFLATED} bytes inflated, C{limits.max_topics} topics.

    @raise RegisterBodyError: naming what is wrong.
    """
    try:
        if not compressed:
            doc = parse_fastjson(data.decode("utf-8"))
            if not isinstance(doc, dict):
                raise RegisterBodyError("the RegisterBrokerBody is not a JSON object")
            wrapper = doc.get("topicConfigSerializeWrapper")
            if wrapper is None:
                wrapper = {"dataVersion": {"counter": 0, "timestamp": 0}, "topicConfigTable": {}}
            return RegisterBrokerBody(
                TopicTable.from_json(wrapper, limits),
                _filter_servers(doc.get("filterServerList"), "the RegisterBrokerBody"),
            )
        return _decode_compressed(data, limits)
    except UnicodeDecodeError as e:
        raise RegisterBodyError(f"the RegisterBrokerBody is not UTF-8: {e}") from None
    except MetadataError as e:
        raise RegisterBodyError(f"the RegisterBrokerBody: {e}") from None


def _decode_compressed(data: bytes, limits: MetadataLimits) -> RegisterBrokerBody:
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(data, MAX_INFLATED)
    except zlib.error as e:
        raise RegisterBodyError(f"the compressed RegisterBrokerBody does not inflate: {e}") from None
    if inflater.unconsumed_tail:
        raise RegisterBodyError(
            f"the compressed RegisterBrokerBody inflates to more than {MAX_INFLATED} bytes"
        )
    at = 0

    def take(n: int, what: str) -> bytes:
        nonlocal at
        if n < 0 or at + n > len(raw):
            raise RegisterBodyError(
                f"the compressed RegisterBrokerBody ends inside {what} (at byte {at})"
            )
        piece = raw[at : at + n]
        at += n
        return piece

    def length(what: str) -> int:
        value: int = struct.unpack(">i", take(4, what))[0]
        return value

    version = DataVersion.from_json(
        parse_fastjson(take(length("the DataVersion"), "the DataVersion").decode("utf-8"))
    )
    count = length("the topic count")
    if not 0 <= count <= limits.max_topics:
        raise RegisterBodyError(
            f"the compressed RegisterBrokerBody names {count} topics (at most {limits.max_topics})"
        )
    topics: dict[str, TopicConfig] = {}
    for i in range(count):
        text = take(length(f"topic {i}"), f"topic {i}").decode("utf-8")
        fields = text.split(" ")
        if (
            len(fields) != 5
            or not all(f.lstrip("-").isdigit() for f in fields[1:4])
            or fields[4] not in {t.value for t in TopicFilterType}
        ):
            raise RegisterBodyError(
                f"topic {i} of the compressed RegisterBrokerBody is {text!r:.80}, not "
                "'name readQueueNums writeQueueNums perm filterType'"
            )
        topics[fields[0]] = TopicConfig(
            topic_name=fields[0],
            read_queue_nums=int(fields[1]),
            write_queue_nums=int(fields[2]),
            perm=int(fields[3]),
            topic_filter_type=fields[4],
        )
    servers_text = take(length("the filter server list"), "the filter server list")
    servers = _filter_servers(parse_fastjson(servers_text.decode("utf-8")), "the RegisterBrokerBody")
    return RegisterBrokerBody(TopicTable(version, topics), servers)


def decode_kv_table(data: bytes) -> dict[str, str]:
    """
    A C{KVTable} body (C{{"table":{...}}}); empty for no body.

    @raise RegisterBodyError: not such a table.
    """
    if not data:
        return {}
    try:
        doc = parse_fastjson(data.decode("utf-8"))
    except (UnicodeDecodeError, MetadataFormatError) as e:
        raise RegisterBodyError(f"the KVTable body does not parse: {e}") from None
    table = doc.get("table") if isinstance(doc, dict) else None
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise RegisterBodyError("the KVTable body's table is not an object")
    return {str(k): str(v) for k, v in table.items()}


def parse_namesrv_addr(text: str) -> tuple[str, ...]:
    """
    C{namesrvAddr}: C{H:P[;H:P...]} as RocketMQ splits it (on C{;}),
    each checked to be C{host:port}.

    @raise ValueError: an empty list, or an address that is not C{host:port}.
    """
    from rmqha.settings import parse_host_port

    addresses = tuple(a.strip() for a in text.split(";") if a.strip())
    if not addresses:
        raise ValueError(f"{text!r} names no NameServer (give HOST:PORT[;HOST:PORT...])")
    for address in addresses:
        parse_host_port(address, "NameServer address")
    return addresses
