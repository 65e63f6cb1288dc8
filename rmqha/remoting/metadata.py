# -*- test-case-name: tests.test_remoting_metadata -*-
"""
A broker's metadata in RocketMQ 4.9's own files: the topic table, the
subscription groups, the consumer offsets and the delay-level offsets,
kept under C{<store>/config/} as a genuine broker keeps them, so a genuine
4.9 broker started on an rmqha store keeps rmqha's tables and rmqha keeps
a genuine broker's (docs/remoting.md, "Metadata files").

Three layers, the lower ones with no I/O:

  - L{parse_fastjson} / L{dump_fastjson}: the JSON dialect fastjson
    1.2.69 (the version 4.9.8 ships) writes and reads: unquoted integer
    map keys (C{{0:120}}), tab-indented pretty printing with no space
    after a colon, bean fields in alphabetical order, null fields left
    out; the reader also takes what fastjson's default parser takes
    (quoted or unquoted keys, single quotes, stray commas).
  - Typed records (L{TopicConfig}, L{SubscriptionGroupConfig},
    L{DataVersion}) and the four tables (L{TopicTable}, L{GroupTable},
    L{ConsumerOffsetTable}, L{DelayOffsetTable}), each decoded from and
    encoded to the shape of its file, every field a newer RocketMQ wrote
    kept for the next rewrite.
  - L{BrokerMetadata}: the four tables of one store, their update
    methods, bounded sizes, and the files: loaded with RocketMQ's C{.bak}
    fallback and written as C{MixAll.string2File} writes them (old file
    copied to C{.bak}, new one renamed into place), atomically.
    L{MetadataFlusher} persists what changed on RocketMQ's schedule.
"""

from __future__ import annotations

import enum
import json
import os
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar, Union

from twisted.application.service import Service
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from rmqha._files import write_atomically
from rmqha._javahash import java_string_hash

__all__ = [
    "MetadataError",
    "MetadataFormatError",
    "MetadataLimitError",
    "MetadataFileError",
    "parse_fastjson",
    "dump_fastjson",
    "PERM_PRIORITY",
    "PERM_READ",
    "PERM_WRITE",
    "PERM_INHERIT",
    "DataVersion",
    "TopicConfig",
    "SubscriptionGroupConfig",
    "TopicTable",
    "GroupTable",
    "ConsumerOffsetTable",
    "DelayOffsetTable",
    "MetadataLimits",
    "MetadataFile",
    "TopicFilterType",
    "CONFIG_DIR",
    "decode_table",
    "load_file",
    "save_file",
    "validate_topic_name",
    "validate_group_name",
    "builtin_topics",
    "builtin_groups",
    "BrokerMetadata",
    "MetadataFlusher",
]

_log = Logger(namespace="rmqha.remoting.metadata")

#: C{<store>/config/}, where RocketMQ 4.9 keeps these files
#: (C{BrokerPathConfigHelper}, C{StorePathConfigHelper.getDelayOffsetStorePath}).
CONFIG_DIR = "config"

# PermName's bits (common/constant/PermName.java).
PERM_PRIORITY = 8
PERM_READ = 4
PERM_WRITE = 2
PERM_INHERIT = 1

_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)


class MetadataError(ValueError):
    """
    Metadata that rmqha refuses; the message is one line naming the bad
    thing (a file, a field, a name, a limit).
    """


class MetadataFormatError(MetadataError):
    """
    Text that is not the JSON fastjson reads, or JSON of the wrong shape.
    """


class MetadataLimitError(MetadataError):
    """
    A table would grow past its L{MetadataLimits} bound, or a name or a
    number from a client is out of RocketMQ's range.
    """


class MetadataFileError(MetadataError):
    """
    A metadata file and its C{.bak} are both unusable (so loading would
    silently forget the table), or a file is too big to read.
    """


# ---------------------------------------------------------------------------
# fastjson's dialect

JSONValue = Any
"""A decoded value: C{dict} (keys C{str}, or C{int} where the text had an
unquoted integer key), C{list}, C{str}, C{int}, C{float}, C{bool}, C{None}."""

_WS_RUN = re.compile(r"[ \t\n\r\f\b]*")
_INT_PAIR = re.compile(r"(-?[0-9]+)[ \t\n\r]*:[ \t\n\r]*(-?[0-9]+)")
_FLAT_INT_MAP = re.compile(
    r"\{[ \t\n\r]*(?:-?[0-9]+[ \t\n\r]*:[ \t\n\r]*-?[0-9]+[ \t\n\r]*"
    r"(?:,[ \t\n\r]*-?[0-9]+[ \t\n\r]*:[ \t\n\r]*-?[0-9]+[ \t\n\r]*)*)?\}"
)
_scanstring: Callable[[str, int, bool], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_IDENT = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_PLAIN = {'"': re.compile(r'[^"\\\x00-\x1f]*'), "'": re.compile(r"[^'\\\x00-\x1f]*")}
_ESCAPES = {
    '"': '"', "'": "'", "\\": "\\", "/": "/",
    "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "0": "\0",
}


class _Parser:
    """
    A recursive-descent reader of what fastjson 1.2.69's default parser
    accepts in these files (C{Feature.AllowUnQuotedFieldNames},
    C{AllowSingleQuotes}, C{AllowArbitraryCommas} are on by default).
    """

    def __init__(self, text: str, max_depth: int) -> None:
        self.text = text
        self.pos = 0
        self.max_depth = max_depth

    def fail(self, what: str) -> MetadataFormatError:
        line = self.text.count("\n", 0, self.pos) + 1
        column = self.pos - (self.text.rfind("\n", 0, self.pos) + 1) + 1
        return MetadataFormatError(f"line {line} column {column}: {what}")

    def skip(self) -> None:
        m = _WS_RUN.match(self.text, self.pos)
        assert m is not None
        self.pos = m.end()

    def peek(self) -> str:
        self.skip()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def document(self) -> JSONValue:
        value = self.value(0)
        if self.peek():
            raise self.fail("unexpected text after the JSON value")
        return value

    def value(self, depth: int) -> JSONValue:
        c = self.peek()
        if c == "{":
            # Fast path for the bulk of an offsets file: {0:120,1:118}.
            m = _FLAT_INT_MAP.match(self.text, self.pos)
            if m is not None:
                self.pos = m.end()
                return {int(k): int(v) for k, v in _INT_PAIR.findall(m.group())}
            return self.object(depth + 1)
        if c == "[":
            return self.array(depth + 1)
        if c and c in "\"'":
            return self.string(c)
        if c == "-" or c.isdigit():
            return self.number()
        m = _IDENT.match(self.text, self.pos)
        if m is not None:
            word = m.group()
            if word in ("true", "false", "null"):
                self.pos = m.end()
                return {"true": True, "false": False, "null": None}[word]
        if not c:
            raise self.fail("unexpected end of text")
        raise self.fail(f"unexpected {c!r}")

    def number(self) -> int | float:
        m = _NUMBER.match(self.text, self.pos)
        if m is None:
            raise self.fail("bad number")
        self.pos = m.end()
        token = m.group()
        if self.text[self.pos : self.pos + 1] in ("L", "S", "B"):
            # fastjson's WriteClassName suffixes (1L): read, never written here.
            self.pos += 1
        if "." in token or "e" in token or "E" in token:
            return float(token)
        return int(token)

    def string(self, quote: str) -> str:
        if quote == '"':
            # Standard JSON strings through the json module's C scanner;
            # fastjson's extra escapes (\\x41, \\') take the slow path.
            try:
                value, end = _scanstring(self.text, self.pos + 1, True)
            except ValueError:
                pass
            else:
                self.pos = end
                return str(value)
        text, plain = self.text, _PLAIN[quote]
        start = self.pos
        self.pos += 1
        parts: list[str] = []
        while True:
            m = plain.match(text, self.pos)
            assert m is not None
            parts.append(m.group())
            self.pos = m.end()
            if self.pos >= len(text):
                raise self.fail("unterminated string")
            c = text[self.pos]
            if c == quote:
                self.pos += 1
                joined = "".join(parts)
                if "\\u" in text[start : self.pos]:
                    # \\uD83D\\uDE00 is one character; a lone half stays.
                    joined = joined.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
                return joined
            if c != "\\":
                raise self.fail(f"control character {c!r} in a string")
            self.pos += 1
            e = text[self.pos : self.pos + 1]
            if e in _ESCAPES:
                parts.append(_ESCAPES[e])
                self.pos += 1
            elif e == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[self.pos + 1 : self.pos + 5]):
                parts.append(chr(int(text[self.pos + 1 : self.pos + 5], 16)))
                self.pos += 5
            elif e == "x" and re.fullmatch(r"[0-9a-fA-F]{2}", text[self.pos + 1 : self.pos + 3]):
                parts.append(chr(int(text[self.pos + 1 : self.pos + 3], 16)))
                self.pos += 3
            else:
                raise self.fail(f"bad escape {e!r} in a string")

    def key(self) -> str | int:
        c = self.peek()
        if c and c in "\"'":
            return self.string(c)
        if c == "-" or c.isdigit():
            number = self.number()
            if not isinstance(number, int):
                raise self.fail("a map key that is not an integer")
            return number
        m = _IDENT.match(self.text, self.pos)
        if m is not None:
            self.pos = m.end()
            return m.group()
        raise self.fail("expected a key" if c else "unexpected end of text")

    def object(self, depth: int) -> dict[str | int, JSONValue]:
        if depth > self.max_depth:
            raise self.fail(f"nested deeper than {self.max_depth}")
        self.pos += 1
        result: dict[str | int, JSONValue] = {}
        while True:
            c = self.peek()
            if c == ",":
                self.pos += 1
                continue
            if c == "}":
                self.pos += 1
                return result
            k = self.key()
            if self.peek() != ":":
                raise self.fail("expected ':' after a key")
            self.pos += 1
            result[k] = self.value(depth)
            c = self.peek()
            if not c or c not in ",}":
                raise self.fail("expected ',' or '}'" if c else "unexpected end of text")

    def array(self, depth: int) -> list[JSONValue]:
        if depth > self.max_depth:
            raise self.fail(f"nested deeper than {self.max_depth}")
        self.pos += 1
        result: list[JSONValue] = []
        while True:
            c = self.peek()
            if c == ",":
                self.pos += 1
                continue
            if c == "]":
                self.pos += 1
                return result
            result.append(self.value(depth))
            c = self.peek()
            if not c or c not in ",]":
                raise self.fail("expected ',' or ']'" if c else "unexpected end of text")


def parse_fastjson(text: str, *, max_depth: int = 32) -> JSONValue:
    """
    Read JSON as fastjson writes it and reads it: integer map keys with or
    without quotes (C{{0:120}} and C{{"0":120}}; an unquoted one comes back
    as an C{int} key, a quoted one as a C{str}), keys as bare identifiers,
    single-quoted strings, stray commas in objects and arrays; a repeated
    key keeps its last value, as fastjson's map does.

    @raise MetadataFormatError: C{text} is not such JSON, or it nests
        deeper than C{max_depth}; the message gives the line and column.
    """
    return _Parser(text, max_depth).document()


_NEEDS_ESCAPE = re.compile('[\x00-\x1f"\\\\\x7f-\x9f\u2028\u2029\ud800-\udfff]')


def _quote(s: str) -> str:
    if _NEEDS_ESCAPE.search(s) is None:
        return '"' + s + '"'
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif o < 0x20:
            short = {8: "\\b", 9: "\\t", 10: "\\n", 12: "\\f", 13: "\\r"}.get(o)
            out.append(short if short else "\\u%04X" % o)
        elif 0x7F <= o < 0xA0 or o in (0x2028, 0x2029) or 0xD800 <= o <= 0xDFFF:
            # (a lone surrogate, which UTF-8 cannot hold, escaped too)
            out.append("\\u%04X" % o)
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _dump(value: JSONValue, pretty: bool, indent: int, out: list[str]) -> None:
    if value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif value is None:
        out.append("null")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        out.append(repr(value))
    elif isinstance(value, str):
        out.append(_quote(value))
    elif isinstance(value, dict) and value and all(type(k) is int and type(v) is int for k, v in value.items()):
        # The bulk of an offsets file, formatted by the general case below.
        out.append("{" + ",".join(f"{k}:{v}" for k, v in value.items()))
        out.append("\n" + "\t" * indent + "}" if pretty else "}")
    elif isinstance(value, dict):
        # MapSerializer (and, for string keys, JavaBeanSerializer, which
        # prints the same): a new line before a string key, none before
        # an integer key; a closing new line unless the map is empty.
        out.append("{")
        first = True
        written = 0
        for k, v in value.items():
            if v is None:
                continue
            if not first:
                out.append(",")
            first = False
            written += 1
            if isinstance(k, str):
                if pretty:
                    out.append("\n" + "\t" * (indent + 1))
                out.append(_quote(k))
            else:
                out.append(str(k))
            out.append(":")
            _dump(v, pretty, indent + 1, out)
        if pretty and written:
            out.append("\n" + "\t" * indent)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        # ListSerializer: every item on its own line when pretty.
        if not value:
            out.append("[]")
            return
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            if pretty:
                out.append("\n" + "\t" * (indent + 1))
            _dump(item, pretty, indent + 1, out)
        if pretty:
            out.append("\n" + "\t" * indent)
        out.append("]")
    else:
        raise TypeError(f"cannot write {type(value).__name__} as JSON")


def dump_fastjson(value: JSONValue, *, pretty: bool = False) -> str:
    """
    Write C{value} as C{JSON.toJSONString(value, pretty)} does in fastjson
    1.2.69: compact, or one tab per level with no space after a colon;
    C{int} map keys unquoted, C{str} keys quoted; C{None} values in maps
    left out; keys in C{value}'s order (L{TopicTable} and the others order
    them as a genuine broker's tables iterate).
    """
    out: list[str] = []
    _dump(value, pretty, 0, out)
    return "".join(out)


# --- iteration order of java.util.concurrent.ConcurrentHashMap -------------


def _java_string_hash(s: str) -> int:
    return java_string_hash(s) & 0xFFFFFFFF


K = TypeVar("K", str, int)


def _chm_order(keys: Iterable[K], initial: int) -> list[K]:
    """
    C{keys} in the order a C{java.util.concurrent.ConcurrentHashMap} whose
    table starts with C{initial} buckets iterates them after they were put
    in the given order: by bucket (the spread Java hash, masked), a bucket
    in insertion order, and each doubling of the table (at 3/4 full)
    splitting a bucket as C{ConcurrentHashMap.transfer} does (the nodes
    before the last run of one destination reversed).  Buckets turned
    into trees (8 keys in one bucket) are not modelled.
    """
    ks = list(keys)
    final = initial
    while len(ks) >= final - (final >> 2):
        final <<= 1
    if ks and isinstance(ks[0], int) and min(ks) >= 0 and max(ks) < final:
        # Small non-negative ints hash to themselves, one to a bucket.
        return sorted(ks)
    n = initial
    bins: list[list[tuple[int, K]]] = [[] for _ in range(n)]
    count = 0
    for k in ks:
        h = _java_string_hash(k) if isinstance(k, str) else k & 0xFFFFFFFF
        h = (h ^ (h >> 16)) & 0x7FFFFFFF
        bins[h & (n - 1)].append((h, k))
        count += 1
        while count >= n - (n >> 2):
            grown: list[list[tuple[int, K]]] = [[] for _ in range(2 * n)]
            for i, b in enumerate(bins):
                if not b:
                    continue
                run_bit, last = b[0][0] & n, 0
                for j in range(1, len(b)):
                    if b[j][0] & n != run_bit:
                        run_bit, last = b[j][0] & n, j
                lo = [node for node in reversed(b[:last]) if not node[0] & n]
                hi = [node for node in reversed(b[:last]) if node[0] & n]
                (hi if run_bit else lo).extend(b[last:])
                grown[i], grown[i + n] = lo, hi
            bins, n = grown, 2 * n
    return [k for b in bins for _, k in b]


# Bucket counts the genuine tables start with: TopicConfigManager's and
# SubscriptionGroupManager's are new ConcurrentHashMap(1024) (2048 buckets)
# and load into it; ScheduleMessageService's is (32) (64 buckets); the
# consumer-offset table and its per-key maps are the ones fastjson makes
# when it reads consumerOffset.json (new ConcurrentHashMap(), 16 buckets).
_TOPICS_BUCKETS = 2048
_GROUPS_BUCKETS = 2048
_DELAY_BUCKETS = 64
_OFFSETS_BUCKETS = 16


# ---------------------------------------------------------------------------
# records


def _take_int(obj: Mapping[Any, JSONValue], key: str, default: int, where: str, bounds: tuple[int, int]) -> int:
    v = obj.get(key, default)
    if v is None:
        return default
    if isinstance(v, str):
        try:
            v = int(v)  # fastjson reads "6" into an int field too
        except ValueError:
            raise MetadataFormatError(f"{where}: {key} is {v!r}, not an integer") from None
    if isinstance(v, bool) or not isinstance(v, int):
        raise MetadataFormatError(f"{where}: {key} is {v!r}, not an integer")
    if not bounds[0] <= v <= bounds[1]:
        raise MetadataFormatError(f"{where}: {key} {v} is out of range")
    return v


def _take_bool(obj: Mapping[Any, JSONValue], key: str, default: bool, where: str) -> bool:
    v = obj.get(key, default)
    if v is None:
        return default
    if isinstance(v, str) and v in ("true", "false"):
        return v == "true"
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise MetadataFormatError(f"{where}: {key} is {v!r}, not true or false")


def _take_str(obj: Mapping[Any, JSONValue], key: str, default: str | None, where: str) -> str | None:
    v = obj.get(key, default)
    if v is None or isinstance(v, str):
        return v
    raise MetadataFormatError(f"{where}: {key} is {v!r}, not a string")


def _object(v: JSONValue, where: str) -> dict[Any, JSONValue]:
    if not isinstance(v, dict):
        raise MetadataFormatError(f"{where} is not a JSON object")
    return v


def _member(obj: Mapping[Any, JSONValue], key: str) -> JSONValue:
    # A missing or null member is an empty one (fastjson leaves nulls out).
    v = obj.get(key)
    return {} if v is None else v


def _extra(obj: Mapping[Any, JSONValue], known: Iterable[str]) -> dict[str, JSONValue]:
    known = set(known)
    return {str(k): v for k, v in obj.items() if k not in known}


def _bean(fields: Mapping[str, JSONValue], extra: Mapping[str, JSONValue]) -> dict[str | int, JSONValue]:
    # fastjson writes a bean's properties in alphabetical order; fields
    # of a newer RocketMQ that rmqha does not know go in their place.
    merged: dict[str, JSONValue] = dict(extra)
    merged.update(fields)
    return {k: merged[k] for k in sorted(merged)}


@dataclass(frozen=True)
class DataVersion:
    """
    C{common/DataVersion}: a table's version, compared whole (a NameServer
    takes a broker's topics again, and a slave replaces its tables, only
    when it differs).  C{extra} keeps fields of a newer RocketMQ (5.x adds
    C{stateVersion}).
    """

    timestamp: int
    counter: int = 0
    extra: Mapping[str, JSONValue] = field(default_factory=dict, compare=False)

    def next_version(self, now_millis: int) -> DataVersion:
        """
        The version after a change, as C{DataVersion.nextVersion}: the
        current time in milliseconds and the counter plus one.
        """
        return replace(self, timestamp=now_millis, counter=self.counter + 1)

    def same(self, other: DataVersion) -> bool:
        """C{DataVersion.equals}: timestamp and counter both equal."""
        return (self.timestamp, self.counter) == (other.timestamp, other.counter)

    def to_json(self) -> dict[str | int, JSONValue]:
        return _bean({"counter": self.counter, "timestamp": self.timestamp}, self.extra)

    @classmethod
    def from_json(cls, v: JSONValue, where: str = "dataVersion") -> DataVersion:
        obj = _object(v, where)
        return cls(
            timestamp=_take_int(obj, "timestamp", 0, where, _INT64),
            counter=_take_int(obj, "counter", 0, where, _INT64),
            extra=_extra(obj, ("timestamp", "counter")),
        )


class TopicFilterType(str, enum.Enum):
    """C{common/TopicFilterType}, written by its name."""

    SINGLE_TAG = "SINGLE_TAG"
    MULTI_TAG = "MULTI_TAG"


_FILTER_TYPES = frozenset(t.value for t in TopicFilterType)


@dataclass(frozen=True)
class TopicConfig:
    """
    C{common/TopicConfig} with 4.9.8's defaults: 16 read and 16 write
    queues, perm 6 (read and write), C{SINGLE_TAG}, sysFlag 0, not order.
    """

    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = PERM_READ | PERM_WRITE
    topic_filter_type: str = TopicFilterType.SINGLE_TAG.value
    topic_sys_flag: int = 0
    order: bool = False
    extra: Mapping[str, JSONValue] = field(default_factory=dict, compare=False)

    _FIELDS = ("order", "perm", "readQueueNums", "topicFilterType", "topicName", "topicSysFlag", "writeQueueNums")

    def to_json(self) -> dict[str | int, JSONValue]:
        return _bean(
            {
                "order": self.order,
                "perm": self.perm,
                "readQueueNums": self.read_queue_nums,
                "topicFilterType": self.topic_filter_type,
                "topicName": self.topic_name,
                "topicSysFlag": self.topic_sys_flag,
                "writeQueueNums": self.write_queue_nums,
            },
            self.extra,
        )

    @classmethod
    def from_json(cls, v: JSONValue, key: str) -> TopicConfig:
        """
        One entry of C{topicConfigTable}; C{key} is its map key, the name
        when the entry has none (fastjson leaves a null C{topicName} out).
        """
        where = f"topic {key!r}"
        obj = _object(v, where)
        filter_type = _take_str(obj, "topicFilterType", TopicFilterType.SINGLE_TAG.value, where)
        if filter_type not in _FILTER_TYPES:
            raise MetadataFormatError(f"{where}: topicFilterType {filter_type!r} is not SINGLE_TAG or MULTI_TAG")
        return cls(
            topic_name=_take_str(obj, "topicName", key, where) or key,
            read_queue_nums=_take_int(obj, "readQueueNums", 16, where, _INT32),
            write_queue_nums=_take_int(obj, "writeQueueNums", 16, where, _INT32),
            perm=_take_int(obj, "perm", PERM_READ | PERM_WRITE, where, _INT32),
            topic_filter_type=str(filter_type),
            topic_sys_flag=_take_int(obj, "topicSysFlag", 0, where, _INT32),
            order=_take_bool(obj, "order", False, where),
            extra=_extra(obj, cls._FIELDS),
        )


@dataclass(frozen=True)
class SubscriptionGroupConfig:
    """
    C{common/subscription/SubscriptionGroupConfig} with 4.9.8's defaults.
    """

    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True
    extra: Mapping[str, JSONValue] = field(default_factory=dict, compare=False)

    _FIELDS = (
        "brokerId", "consumeBroadcastEnable", "consumeEnable", "consumeFromMinEnable", "groupName",
        "notifyConsumerIdsChangedEnable", "retryMaxTimes", "retryQueueNums", "whichBrokerWhenConsumeSlowly",
    )

    def to_json(self) -> dict[str | int, JSONValue]:
        return _bean(
            {
                "brokerId": self.broker_id,
                "consumeBroadcastEnable": self.consume_broadcast_enable,
                "consumeEnable": self.consume_enable,
                "consumeFromMinEnable": self.consume_from_min_enable,
                "groupName": self.group_name,
                "notifyConsumerIdsChangedEnable": self.notify_consumer_ids_changed_enable,
                "retryMaxTimes": self.retry_max_times,
                "retryQueueNums": self.retry_queue_nums,
                "whichBrokerWhenConsumeSlowly": self.which_broker_when_consume_slowly,
            },
            self.extra,
        )

    @classmethod
    def from_json(cls, v: JSONValue, key: str) -> SubscriptionGroupConfig:
        where = f"subscription group {key!r}"
        obj = _object(v, where)
        return cls(
            group_name=_take_str(obj, "groupName", key, where) or key,
            consume_enable=_take_bool(obj, "consumeEnable", True, where),
            consume_from_min_enable=_take_bool(obj, "consumeFromMinEnable", True, where),
            consume_broadcast_enable=_take_bool(obj, "consumeBroadcastEnable", True, where),
            retry_queue_nums=_take_int(obj, "retryQueueNums", 1, where, _INT32),
            retry_max_times=_take_int(obj, "retryMaxTimes", 16, where, _INT32),
            broker_id=_take_int(obj, "brokerId", 0, where, _INT64),
            which_broker_when_consume_slowly=_take_int(obj, "whichBrokerWhenConsumeSlowly", 1, where, _INT64),
            notify_consumer_ids_changed_enable=_take_bool(obj, "notifyConsumerIdsChangedEnable", True, where),
            extra=_extra(obj, cls._FIELDS),
        )


# ---------------------------------------------------------------------------
# what a genuine broker adds to its tables at start


def builtin_topics(
    cluster_name: str,
    broker_name: str,
    *,
    auto_create_topic_enable: bool = True,
    default_topic_queue_nums: int = 8,
    cluster_topic_enable: bool = True,
    broker_topic_enable: bool = True,
    trace_topic_enable: bool = False,
    msg_trace_topic_name: str = "RMQ_SYS_TRACE_TOPIC",
) -> dict[str, TopicConfig]:
    """
    The topics C{TopicConfigManager}'s constructor puts in the table before
    C{topics.json} is loaded over them, for the given C{BrokerConfig}
    values (keyword defaults are 4.9.8's): C{TBW102} is the template a
    producer's unknown topic is created from.
    """
    topics = [TopicConfig("SELF_TEST_TOPIC", 1, 1)]
    if auto_create_topic_enable:
        topics.append(
            TopicConfig("TBW102", default_topic_queue_nums, default_topic_queue_nums, PERM_INHERIT | PERM_READ | PERM_WRITE)
        )
    topics.append(TopicConfig("BenchmarkTest", 1024, 1024))
    rw = PERM_READ | PERM_WRITE
    topics.append(TopicConfig(cluster_name, perm=PERM_INHERIT | (rw if cluster_topic_enable else 0)))
    topics.append(TopicConfig(broker_name, 1, 1, PERM_INHERIT | (rw if broker_topic_enable else 0)))
    topics.append(TopicConfig("OFFSET_MOVED_EVENT", 1, 1))
    topics.append(TopicConfig("SCHEDULE_TOPIC_XXXX", 18, 18))
    if trace_topic_enable:
        topics.append(TopicConfig(msg_trace_topic_name, 1, 1))
    topics.append(TopicConfig(f"{cluster_name}_REPLY_TOPIC", 1, 1))
    return {t.topic_name: t for t in topics}


def builtin_groups() -> dict[str, SubscriptionGroupConfig]:
    """
    The groups C{SubscriptionGroupManager.init} puts in the table before
    C{subscriptionGroup.json} is loaded over them (all with the defaults).
    """
    names = (
        "TOOLS_CONSUMER", "FILTERSRV_CONSUMER", "SELF_TEST_C_GROUP", "CID_ONS-HTTP-PROXY",
        "CID_ONSAPI_PULL", "CID_ONSAPI_PERMISSION", "CID_ONSAPI_OWNER",
    )
    return {name: SubscriptionGroupConfig(name) for name in names}


# ---------------------------------------------------------------------------
# limits and names


@dataclass(frozen=True)
class MetadataLimits:
    """
    How big the tables may grow, so that a hostile client (or master)
    cannot exhaust memory or disk through them.  The defaults are far
    above a real cluster's (a NameServer registration overflows its
    16 MiB frame near 60 000 topics).
    """

    max_topics: int = 65_536
    max_groups: int = 65_536
    #: C{topic@group} keys in the consumer-offset table
    max_offset_keys: int = 262_144
    #: queue entries summed over all C{topic@group} keys
    max_offset_entries: int = 2_000_000
    #: delay levels (RocketMQ's default C{messageDelayLevel} has 18)
    max_delay_levels: int = 1_024
    #: a topic's read or write queue count from a client
    max_queue_nums: int = 65_535
    #: bytes of one file or synced body
    max_text_bytes: int = 256 << 20
    #: nesting of the JSON
    max_depth: int = 32


_NAME_CHARS = re.compile(r"[%|a-zA-Z0-9_-]+")
TOPIC_MAX_LENGTH = 127  # TopicValidator.TOPIC_MAX_LENGTH
GROUP_MAX_LENGTH = 255  # Validators.CHARACTER_MAX_LENGTH


def validate_topic_name(name: str) -> None:
    """
    RocketMQ's rule for a topic a client names (C{TopicValidator}): 1 to
    127 characters of C{%|a-zA-Z0-9_-}.

    @raise MetadataLimitError: it breaks the rule.
    """
    if not name or len(name) > TOPIC_MAX_LENGTH or not _NAME_CHARS.fullmatch(name):
        raise MetadataLimitError(
            f"topic {name[:140]!r} is not 1-{TOPIC_MAX_LENGTH} characters of %|a-zA-Z0-9_-"
        )


def validate_group_name(name: str) -> None:
    """
    RocketMQ's rule for a consumer group (C{Validators.checkGroup}): 1 to
    255 characters of C{%|a-zA-Z0-9_-}.

    @raise MetadataLimitError: it breaks the rule.
    """
    if not name or len(name) > GROUP_MAX_LENGTH or not _NAME_CHARS.fullmatch(name):
        raise MetadataLimitError(
            f"group {name[:260]!r} is not 1-{GROUP_MAX_LENGTH} characters of %|a-zA-Z0-9_-"
        )


def _cap(count: int, limit: int, what: str) -> None:
    if count > limit:
        raise MetadataLimitError(f"{what}: {count} is more than the limit of {limit}")


# ---------------------------------------------------------------------------
# tables, each the shape of its file


@dataclass(frozen=True)
class TopicTable:
    """
    C{config/topics.json} and the GET_ALL_TOPIC_CONFIG body
    (C{TopicConfigSerializeWrapper}).
    """

    data_version: DataVersion
    topics: Mapping[str, TopicConfig]
    extra: Mapping[str, JSONValue] = field(default_factory=dict, compare=False)

    def to_json(self) -> dict[str | int, JSONValue]:
        table = {name: self.topics[name].to_json() for name in _chm_order(self.topics, _TOPICS_BUCKETS)}
        return _bean({"dataVersion": self.data_version.to_json(), "topicConfigTable": table}, self.extra)

    @classmethod
    def from_json(cls, v: JSONValue, limits: MetadataLimits) -> TopicTable:
        obj = _object(v, "the topic table")
        table = _object(_member(obj, "topicConfigTable"), "topicConfigTable")
        _cap(len(table), limits.max_topics, "topics")
        return cls(
            data_version=DataVersion.from_json(_member(obj, "dataVersion")),
            topics={str(k): TopicConfig.from_json(t, str(k)) for k, t in table.items()},
            extra=_extra(obj, ("dataVersion", "topicConfigTable")),
        )


@dataclass(frozen=True)
class GroupTable:
    """
    C{config/subscriptionGroup.json} and the GET_ALL_SUBSCRIPTIONGROUP_CONFIG
    body (C{SubscriptionGroupManager} / C{SubscriptionGroupWrapper}).
    """

    data_version: DataVersion
    groups: Mapping[str, SubscriptionGroupConfig]
    extra: Mapping[str, JSONValue] = field(default_factory=dict, compare=False)

    def to_json(self) -> dict[str | int, JSONValue]:
        table = {name: self.groups[name].to_json() for name in _chm_order(self.groups, _GROUPS_BUCKETS)}
        return _bean({"dataVersion": self.data_version.to_json(), "subscriptionGroupTable": table}, self.extra)

    @classmethod
    def from_json(cls, v: JSONValue, limits: MetadataLimits) -> GroupTable:
        obj = _object(v, "the subscription group table")
        table = _object(_member(obj, "subscriptionGroupTable"), "subscriptionGroupTable")
        _cap(len(table), limits.max_groups, "subscription groups")
        return cls(
            data_version=DataVersion.from_json(_member(obj, "dataVersion")),
            groups={str(k): SubscriptionGroupConfig.from_json(g, str(k)) for k, g in table.items()},
            extra=_extra(obj, ("dataVersion", "subscriptionGroupTable")),
        )


def _offset_map(v: JSONValue, where: str, max_entries: int) -> dict[int, int]:
    obj = _object(v, where)
    _cap(len(obj), max_entries, f"{where} entries")
    result: dict[int, int] = {}
    for k, offset in obj.items():
        try:
            key = int(k)  # fastjson reads {"0":1} and {0:1} alike
        except ValueError:
            raise MetadataFormatError(f"{where}: key {k!r} is not an integer") from None
        if not _INT32[0] <= key <= _INT32[1]:
            raise MetadataFormatError(f"{where}: key {key} is out of range")
        if isinstance(offset, bool) or not isinstance(offset, int) or not _INT64[0] <= offset <= _INT64[1]:
            raise MetadataFormatError(f"{where}: offset {offset!r} of {key} is not a 64-bit integer")
        result[key] = offset
    return result


@dataclass(frozen=True)
class ConsumerOffsetTable:
    """
    C{config/consumerOffset.json} and the GET_ALL_CONSUMER_OFFSET body:
    C{topic@group} → queue id → the next offset to consume.
    """

    offsets: Mapping[str, Mapping[int, int]]
    extra: Mapping[str, JSONValue] = field(default_factory=dict, compare=False)

    def to_json(self) -> dict[str | int, JSONValue]:
        table: dict[str | int, JSONValue] = {}
        for key in _chm_order(self.offsets, _OFFSETS_BUCKETS):
            queues = self.offsets[key]
            table[key] = {q: queues[q] for q in _chm_order(queues, _OFFSETS_BUCKETS)}
        return _bean({"offsetTable": table}, self.extra)

    @classmethod
    def from_json(cls, v: JSONValue, limits: MetadataLimits) -> ConsumerOffsetTable:
        obj = _object(v, "the consumer offset table")
        table = _object(_member(obj, "offsetTable"), "offsetTable")
        _cap(len(table), limits.max_offset_keys, "consumer offset keys")
        offsets: dict[str, dict[int, int]] = {}
        entries = 0
        for k, queues in table.items():
            offsets[str(k)] = m = _offset_map(queues, f"offsets of {str(k)!r}", limits.max_offset_entries)
            entries += len(m)
            _cap(entries, limits.max_offset_entries, "consumer offset entries")
        return cls(offsets=offsets, extra=_extra(obj, ("offsetTable",)))


@dataclass(frozen=True)
class DelayOffsetTable:
    """
    C{config/delayOffset.json} and the GET_ALL_DELAY_OFFSET body
    (C{DelayOffsetSerializeWrapper}): delay level → offset reached in
    queue level−1 of C{SCHEDULE_TOPIC_XXXX}.
    """

    offsets: Mapping[int, int]
    extra: Mapping[str, JSONValue] = field(default_factory=dict, compare=False)

    def to_json(self) -> dict[str | int, JSONValue]:
        table: dict[str | int, JSONValue] = {
            level: self.offsets[level] for level in _chm_order(self.offsets, _DELAY_BUCKETS)
        }
        return _bean({"offsetTable": table}, self.extra)

    @classmethod
    def from_json(cls, v: JSONValue, limits: MetadataLimits) -> DelayOffsetTable:
        obj = _object(v, "the delay offset table")
        offsets = _offset_map(_member(obj, "offsetTable"), "delay offsets", limits.max_delay_levels)
        return cls(offsets=offsets, extra=_extra(obj, ("offsetTable",)))


_Table = Union[TopicTable, GroupTable, ConsumerOffsetTable, DelayOffsetTable]


class MetadataFile(enum.Enum):
    """
    The four files, named as 4.9.8 names them under C{<store>/config/}.
    """

    TOPICS = "topics.json"
    SUBSCRIPTION_GROUPS = "subscriptionGroup.json"
    CONSUMER_OFFSETS = "consumerOffset.json"
    DELAY_OFFSETS = "delayOffset.json"


_DECODERS: dict[MetadataFile, Callable[[JSONValue, MetadataLimits], _Table]] = {
    MetadataFile.TOPICS: TopicTable.from_json,
    MetadataFile.SUBSCRIPTION_GROUPS: GroupTable.from_json,
    MetadataFile.CONSUMER_OFFSETS: ConsumerOffsetTable.from_json,
    MetadataFile.DELAY_OFFSETS: DelayOffsetTable.from_json,
}


#: The member that holds each table; a master's answer always has it.
_TABLE_MEMBERS: dict[MetadataFile, str] = {
    MetadataFile.TOPICS: "topicConfigTable",
    MetadataFile.SUBSCRIPTION_GROUPS: "subscriptionGroupTable",
    MetadataFile.CONSUMER_OFFSETS: "offsetTable",
    MetadataFile.DELAY_OFFSETS: "offsetTable",
}


def decode_table(
    which: MetadataFile, text: str, limits: MetadataLimits = MetadataLimits(), *, answer: bool = False
) -> _Table:
    """
    Decode one file's text, or the body of the request code that carries
    the same table.

    @param answer: C{text} is a master's answer (the slave's sync), not a
        file: the table's member must be there.  fastjson leaves a null
        member out of a file, and a file without it loads as empty, but a
        genuine master always sends its table (an empty one as C{{}}); a
        body without it would otherwise empty this broker's table.

    @raise MetadataFormatError: not fastjson JSON, or not the table's shape.
    @raise MetadataLimitError: bigger than C{limits} allow.
    """
    if len(text) > limits.max_text_bytes:
        raise MetadataLimitError(f"{which.value}: {len(text)} characters is more than {limits.max_text_bytes}")
    value = parse_fastjson(text, max_depth=limits.max_depth)
    if answer:
        member = _TABLE_MEMBERS[which]
        if not isinstance(value, dict) or value.get(member) is None:
            raise MetadataFormatError(f"{which.value}: the answer has no {member}")
    return _DECODERS[which](value, limits)


# ---------------------------------------------------------------------------
# the files


def _read_text(path: str, limits: MetadataLimits) -> str | None:
    """The file's text; C{None} if it is missing or empty (as file2String)."""
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return None
    if size > limits.max_text_bytes:
        raise MetadataFileError(f"{path}: {size} bytes is more than the limit of {limits.max_text_bytes}")
    with open(path, "rb") as f:
        data = f.read(limits.max_text_bytes + 1)
    if not data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MetadataFormatError(f"byte {e.start} is not UTF-8") from None


def load_file(path: str, which: MetadataFile, limits: MetadataLimits) -> _Table | None:
    """
    Load C{path} as C{ConfigManager.load} does: if it is missing, empty or
    unparsable, load C{path.bak} instead, saying so in the log.

    @return: the table, or C{None} when neither file exists or has content
        (a new store: RocketMQ starts with its built-in tables).
    @raise MetadataFileError: C{path} is unusable and C{path.bak} is
        missing, empty or unusable too (RocketMQ would start with empty
        tables, forgetting every topic and offset; rmqha refuses to start
        instead), or a file is bigger than C{limits.max_text_bytes}.
    """
    return _load_file(path, which, limits)[0]


def _load_file(path: str, which: MetadataFile, limits: MetadataLimits) -> tuple[_Table | None, bool]:
    """L{load_file}, and whether the table came from the C{.bak}."""
    bak = path + ".bak"
    problem: str | None = None
    try:
        text = _read_text(path, limits)
        if text is not None:
            return decode_table(which, text, limits), False
        why = "missing" if not os.path.exists(path) else "empty"
    except MetadataFileError:
        raise
    except (MetadataError, OSError) as e:
        problem = str(e)
        why = f"unusable ({problem})"
    try:
        text = _read_text(bak, limits)
        table = decode_table(which, text, limits) if text is not None else None
    except MetadataFileError:
        raise
    except (MetadataError, OSError) as e:
        raise MetadataFileError(f"{path} is {why} and {bak} is unusable: {e}") from None
    if table is None:
        if problem is not None:
            raise MetadataFileError(f"{path} is {why} and there is no {bak} to fall back on")
        return None, False
    _log.warn("{path} is {why}: loaded {bak} instead", path=path, why=why, bak=bak)
    return table, True


def save_file(path: str, text: str, *, keep_backup: bool = True) -> None:
    """
    Replace C{path} with C{text} as C{MixAll.string2File} does, but
    crash-safe: the old content (when C{keep_backup}, and it is non-empty
    UTF-8) goes to C{path.bak} first, then the new content replaces
    C{path}; each write is a temporary file, fsynced and renamed
    (L{write_atomically}), so a crash at any point leaves C{path} or
    C{path.bak} whole.  C{keep_backup=False} is for an old file known to be
    unusable: it must not replace a good C{.bak}.
    """
    if keep_backup:
        try:
            with open(path, "rb") as f:
                old_text = f.read().decode("utf-8")
        except (FileNotFoundError, UnicodeDecodeError):
            old_text = ""
        if old_text:
            write_atomically(path + ".bak", lambda f: f.write(old_text))
    write_atomically(path, lambda f: f.write(text))


# ---------------------------------------------------------------------------
# one store's metadata


def _now_millis(clock: IReactorTime) -> int:
    return int(clock.seconds() * 1000)


class BrokerMetadata:
    """
    The four metadata tables of one store, and their files under
    C{<store>/config/}.

    Topic and subscription-group changes bump the table's L{DataVersion}
    and are written at once, as RocketMQ's managers do; consumer and delay
    offsets are only marked dirty, for L{persist_dirty} (L{MetadataFlusher}
    calls it every 5 s and 10 s, as a genuine broker flushes them).

    Every update from the outside (a client's request, a master's body)
    is bounded by L{MetadataLimits}; a refusal is a L{MetadataLimitError}
    and changes nothing.
    """

    def __init__(
        self,
        store_dir: str,
        clock: IReactorTime,
        limits: MetadataLimits = MetadataLimits(),
    ) -> None:
        self.store_dir = store_dir
        self.limits = limits
        self._clock = clock
        now = _now_millis(clock)
        self._topics: dict[str, TopicConfig] = {}
        self._topics_version = DataVersion(timestamp=now)
        self._topics_extra: Mapping[str, JSONValue] = {}
        self._groups: dict[str, SubscriptionGroupConfig] = {}
        self._groups_version = DataVersion(timestamp=now)
        self._groups_extra: Mapping[str, JSONValue] = {}
        self._offsets: dict[str, dict[int, int]] = {}
        self._offset_entries = 0
        self._offsets_extra: Mapping[str, JSONValue] = {}
        self._delay: dict[int, int] = {}
        self._delay_extra: Mapping[str, JSONValue] = {}
        self._dirty: set[MetadataFile] = set()
        # Files found unusable at load (their .bak was used): not copied
        # over that .bak at the next save.
        self._unusable: set[MetadataFile] = set()
        #: Called with the topic table's data version after every change
        #: of the table (an update, a deletion, built-in topics added, a
        #: master's table adopted): the broker registers with its
        #: NameServers at once.
        self.topic_listeners: list[Callable[[DataVersion], object]] = []

    # -- files ---------------------------------------------------------------

    def path(self, which: MetadataFile) -> str:
        """Where C{which} lives: C{<store>/config/<name>}."""
        return os.path.join(self.store_dir, CONFIG_DIR, which.value)

    @classmethod
    def load(
        cls,
        store_dir: str,
        clock: IReactorTime,
        limits: MetadataLimits = MetadataLimits(),
    ) -> BrokerMetadata:
        """
        The metadata of C{store_dir}: each file read (or its C{.bak}, see
        L{load_file}); a table whose files do not exist starts empty.

        @raise MetadataFileError: a file and its backup are both unusable.
        """
        self = cls(store_dir, clock, limits)
        for which in MetadataFile:
            table, from_backup = _load_file(self.path(which), which, limits)
            if from_backup:
                self._unusable.add(which)
            if table is not None:
                self._adopt(table)
        return self

    def _adopt(self, table: _Table) -> None:
        if isinstance(table, TopicTable):
            self._topics = dict(table.topics)
            self._topics_version = table.data_version
            self._topics_extra = table.extra
        elif isinstance(table, GroupTable):
            self._groups = dict(table.groups)
            self._groups_version = table.data_version
            self._groups_extra = table.extra
        elif isinstance(table, ConsumerOffsetTable):
            self._offsets = {k: dict(v) for k, v in table.offsets.items()}
            self._offset_entries = sum(len(v) for v in self._offsets.values())
            self._offsets_extra = table.extra
        else:
            self._delay = dict(table.offsets)
            self._delay_extra = table.extra

    def table(self, which: MetadataFile) -> _Table:
        """A snapshot of one table, in the shape of its file."""
        if which is MetadataFile.TOPICS:
            return TopicTable(self._topics_version, dict(self._topics), self._topics_extra)
        if which is MetadataFile.SUBSCRIPTION_GROUPS:
            return GroupTable(self._groups_version, dict(self._groups), self._groups_extra)
        if which is MetadataFile.CONSUMER_OFFSETS:
            return ConsumerOffsetTable({k: dict(v) for k, v in self._offsets.items()}, self._offsets_extra)
        return DelayOffsetTable(dict(self._delay), self._delay_extra)

    def encode(self, which: MetadataFile, *, pretty: bool = False) -> str:
        """
        One table as fastjson text: compact, as the bodies of codes 21, 43,
        45 and 201 are, or pretty, as the files are.
        """
        return dump_fastjson(self.table(which).to_json(), pretty=pretty)

    def persist(self, which: MetadataFile) -> None:
        """
        Write one table to its file now (L{save_file}).

        @raise OSError: it could not be written; the table stays dirty.
        """
        self._dirty.add(which)
        save_file(self.path(which), self.encode(which, pretty=True), keep_backup=which not in self._unusable)
        self._unusable.discard(which)
        self._dirty.discard(which)

    def persist_dirty(self, only: Iterable[MetadataFile] | None = None) -> list[MetadataFile]:
        """
        Write the tables changed since they were last written (of C{only},
        if given).

        @return: those written.
        """
        chosen = [w for w in MetadataFile if w in self._dirty and (only is None or w in set(only))]
        for which in chosen:
            self.persist(which)
        return chosen

    @property
    def dirty(self) -> frozenset[MetadataFile]:
        """The tables changed in memory and not yet written."""
        return frozenset(self._dirty)

    def add_builtins(
        self,
        topics: Mapping[str, TopicConfig],
        groups: Mapping[str, SubscriptionGroupConfig],
    ) -> None:
        """
        Add the built-in topics and groups (L{builtin_topics},
        L{builtin_groups}) the tables lack, as a genuine broker has them
        before its files load over them: an entry of the file wins, the
        data versions stay, nothing is written until the next change.
        """
        added = [name for name in topics if name not in self._topics]
        for name, topic in topics.items():
            self._topics.setdefault(name, topic)
        for name, group in groups.items():
            self._groups.setdefault(name, group)
        if added:
            self._tell_topic_listeners()

    # -- topics --------------------------------------------------------------

    @property
    def topics(self) -> Mapping[str, TopicConfig]:
        return dict(self._topics)

    @property
    def topics_version(self) -> DataVersion:
        return self._topics_version

    def topic(self, name: str) -> TopicConfig | None:
        """One topic's config, or C{None} (no copy of the table: a send's lookup)."""
        return self._topics.get(name)

    def group(self, name: str) -> SubscriptionGroupConfig | None:
        """One subscription group's config, or C{None}."""
        return self._groups.get(name)

    def update_topic(self, config: TopicConfig, *, persist: bool = True) -> DataVersion:
        """
        Create or replace a topic, as C{TopicConfigManager.updateTopicConfig}
        (UPDATE_AND_CREATE_TOPIC): the data version moves on and the file is
        written at once.

        @raise MetadataLimitError: a bad name, queue count or perm, or a new
            topic beyond C{limits.max_topics}.
        """
        validate_topic_name(config.topic_name)
        for what, n in (("readQueueNums", config.read_queue_nums), ("writeQueueNums", config.write_queue_nums)):
            if not 0 <= n <= self.limits.max_queue_nums:
                raise MetadataLimitError(
                    f"topic {config.topic_name!r}: {what} {n} is not 0-{self.limits.max_queue_nums}"
                )
        if not 0 <= config.perm <= 15:
            raise MetadataLimitError(f"topic {config.topic_name!r}: perm {config.perm} is not 0-15")
        if config.topic_filter_type not in _FILTER_TYPES:
            raise MetadataLimitError(
                f"topic {config.topic_name!r}: topicFilterType {config.topic_filter_type!r} "
                "is not SINGLE_TAG or MULTI_TAG"
            )
        if config.topic_name not in self._topics:
            _cap(len(self._topics) + 1, self.limits.max_topics, "topics")
        self._topics[config.topic_name] = config
        return self._topics_changed(persist)

    def delete_topic(self, name: str, *, persist: bool = True) -> bool:
        """Remove a topic (C{deleteTopicConfig}); C{False} if unknown."""
        if self._topics.pop(name, None) is None:
            return False
        self._topics_changed(persist)
        return True

    def _topics_changed(self, persist: bool) -> DataVersion:
        self._topics_version = self._topics_version.next_version(_now_millis(self._clock))
        self._dirty.add(MetadataFile.TOPICS)
        try:
            if persist:
                self.persist(MetadataFile.TOPICS)
        finally:
            # (Changed in memory, written or not.)
            self._tell_topic_listeners()
        return self._topics_version

    def _tell_topic_listeners(self) -> None:
        for listener in list(self.topic_listeners):
            try:
                listener(self._topics_version)
            except Exception:
                _log.failure("a listener of the topic table failed")

    # -- subscription groups -------------------------------------------------

    @property
    def groups(self) -> Mapping[str, SubscriptionGroupConfig]:
        return dict(self._groups)

    @property
    def groups_version(self) -> DataVersion:
        return self._groups_version

    def update_group(self, config: SubscriptionGroupConfig, *, persist: bool = True) -> DataVersion:
        """
        Create or replace a subscription group, as
        C{SubscriptionGroupManager.updateSubscriptionGroupConfig}.

        @raise MetadataLimitError: a bad name, or a new group beyond
            C{limits.max_groups}.
        """
        validate_group_name(config.group_name)
        if config.group_name not in self._groups:
            _cap(len(self._groups) + 1, self.limits.max_groups, "subscription groups")
        self._groups[config.group_name] = config
        return self._groups_changed(persist)

    def delete_group(self, name: str, *, persist: bool = True) -> bool:
        """Remove a subscription group; C{False} if unknown."""
        if self._groups.pop(name, None) is None:
            return False
        self._groups_changed(persist)
        return True

    def _groups_changed(self, persist: bool) -> DataVersion:
        self._groups_version = self._groups_version.next_version(_now_millis(self._clock))
        self._dirty.add(MetadataFile.SUBSCRIPTION_GROUPS)
        if persist:
            self.persist(MetadataFile.SUBSCRIPTION_GROUPS)
        return self._groups_version

    # -- consumer offsets ----------------------------------------------------

    @property
    def consumer_offsets(self) -> Mapping[str, Mapping[int, int]]:
        return {k: dict(v) for k, v in self._offsets.items()}

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """
        Store a consumer's next offset (C{ConsumerOffsetManager.commitOffset}:
        it overwrites, a lower value included).  Written by the next
        L{persist_dirty}.

        @raise MetadataLimitError: a bad name, queue id or offset, or a new
            key or queue beyond C{limits}.
        """
        validate_topic_name(topic)
        validate_group_name(group)
        if not 0 <= queue_id <= _INT32[1]:
            raise MetadataLimitError(f"queue id {queue_id} of topic {topic!r} is not 0-{_INT32[1]}")
        if not _INT64[0] <= offset <= _INT64[1]:
            raise MetadataLimitError(f"offset {offset} of {topic!r} queue {queue_id} is not a 64-bit integer")
        key = f"{topic}@{group}"
        queues = self._offsets.get(key)
        if queues is None:
            _cap(len(self._offsets) + 1, self.limits.max_offset_keys, "consumer offset keys")
        if queues is None or queue_id not in queues:
            _cap(self._offset_entries + 1, self.limits.max_offset_entries, "consumer offset entries")
            self._offset_entries += 1
        self._offsets.setdefault(key, {})[queue_id] = offset
        self._dirty.add(MetadataFile.CONSUMER_OFFSETS)

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The stored offset, or -1 (C{ConsumerOffsetManager.queryOffset})."""
        return self._offsets.get(f"{topic}@{group}", {}).get(queue_id, -1)

    # -- delay offsets -------------------------------------------------------

    @property
    def delay_offsets(self) -> Mapping[int, int]:
        return dict(self._delay)

    def update_delay_offset(self, level: int, offset: int) -> None:
        """
        Record how far delay level C{level} has delivered; written by the
        next L{persist_dirty}.

        @raise MetadataLimitError: a new level beyond C{limits}.
        """
        if not 1 <= level <= _INT32[1] or not _INT64[0] <= offset <= _INT64[1]:
            raise MetadataLimitError(f"delay level {level} offset {offset} is out of range")
        if level not in self._delay:
            _cap(len(self._delay) + 1, self.limits.max_delay_levels, "delay levels")
        self._delay[level] = offset
        self._dirty.add(MetadataFile.DELAY_OFFSETS)

    # -- what a slave's sync applies (SlaveSynchronize) ------------------------

    def apply_master_topics(self, text: str) -> bool:
        """
        A master's GET_ALL_TOPIC_CONFIG body, as C{syncTopicConfig}: if its
        data version differs from ours, adopt it and replace the whole table
        (topics the master lacks are dropped), and persist.

        @return: whether anything changed.
        @raise MetadataError: the body is bad or too big; nothing changes.
        """
        table = decode_table(MetadataFile.TOPICS, text, self.limits, answer=True)
        assert isinstance(table, TopicTable)
        if table.data_version.same(self._topics_version):
            return False
        self._adopt(table)
        try:
            self.persist(MetadataFile.TOPICS)
        finally:
            self._tell_topic_listeners()
        return True

    def apply_master_groups(self, text: str) -> bool:
        """
        A master's GET_ALL_SUBSCRIPTIONGROUP_CONFIG body, as
        C{syncSubscriptionGroupConfig}: like L{apply_master_topics}.
        """
        table = decode_table(MetadataFile.SUBSCRIPTION_GROUPS, text, self.limits, answer=True)
        assert isinstance(table, GroupTable)
        if table.data_version.same(self._groups_version):
            return False
        self._adopt(table)
        self.persist(MetadataFile.SUBSCRIPTION_GROUPS)
        return True

    def apply_master_consumer_offsets(self, text: str) -> None:
        """
        A master's GET_ALL_CONSUMER_OFFSET body, as C{syncConsumerOffset}:
        each C{topic@group} of the master replaces ours (C{putAll}); keys
        only this broker has stay.  Persisted at once.

        @raise MetadataError: the body is bad, or the merge would exceed
            C{limits}; nothing changes.
        """
        table = decode_table(MetadataFile.CONSUMER_OFFSETS, text, self.limits, answer=True)
        assert isinstance(table, ConsumerOffsetTable)
        merged = {k: v for k, v in self._offsets.items()}
        merged.update({k: dict(v) for k, v in table.offsets.items()})
        _cap(len(merged), self.limits.max_offset_keys, "consumer offset keys")
        _cap(sum(len(v) for v in merged.values()), self.limits.max_offset_entries, "consumer offset entries")
        self._adopt(ConsumerOffsetTable(merged, self._offsets_extra or table.extra))
        self.persist(MetadataFile.CONSUMER_OFFSETS)

    def apply_master_delay_offsets(self, text: str) -> None:
        """
        A master's GET_ALL_DELAY_OFFSET body, as C{syncDelayOffset}: the
        table becomes the master's and is persisted (RocketMQ writes the
        body to delayOffset.json as it came; rmqha checks it first and
        writes it as the master writes its own file).

        @raise MetadataError: the body is bad or too big; nothing changes.
        """
        table = decode_table(MetadataFile.DELAY_OFFSETS, text, self.limits, answer=True)
        self._adopt(table)
        self.persist(MetadataFile.DELAY_OFFSETS)


class MetadataFlusher(Service):
    """
    Writes a L{BrokerMetadata}'s offsets as a genuine broker does: the
    consumer offsets every C{consumer_offsets_interval} seconds
    (C{flushConsumerOffsetInterval}, 5 s), the delay offsets every
    C{delay_offsets_interval} (C{flushDelayOffsetInterval}, 10 s), and
    whatever is dirty when the service stops.  A failed write is logged
    and retried at the next tick.
    """

    def __init__(
        self,
        metadata: BrokerMetadata,
        clock: IReactorTime,
        consumer_offsets_interval: float = 5.0,
        delay_offsets_interval: float = 10.0,
    ) -> None:
        self._metadata = metadata
        self._loops: list[LoopingCall] = []
        for which, interval in (
            ((MetadataFile.CONSUMER_OFFSETS,), consumer_offsets_interval),
            ((MetadataFile.DELAY_OFFSETS,), delay_offsets_interval),
        ):
            loop = LoopingCall(self._flush, which)
            loop.clock = clock
            self._loops.append(loop)
        self._intervals = (consumer_offsets_interval, delay_offsets_interval)

    def _flush(self, which: Sequence[MetadataFile] | None) -> None:
        try:
            self._metadata.persist_dirty(which)
        except OSError as e:
            _log.error("cannot write broker metadata under {dir}: {error}", dir=self._metadata.store_dir, error=e)

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        for loop, interval in zip(self._loops, self._intervals):
            loop.start(interval, now=False)

    def stopService(self) -> None:
        for loop in self._loops:
            if loop.running:
                loop.stop()
        self._flush(None)
        super().stopService()  # type: ignore[no-untyped-call]
