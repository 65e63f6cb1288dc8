"""
The consumer's decode of a pulled body (L{rmqha.client._consume.decode_messages}):
the compiled decoder (C{_speedups.pull_decode}) against its pure-Python
twin (L{_decode_one}), the same messages on random valid and hostile
bodies; a malformed record refused by name and offset, and the list cut
there; messages whose properties, hosts and ids are decoded only when read.
"""

from __future__ import annotations

import dataclasses
import struct
import zlib
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from rmqha.client._codec import MessageQueue
from rmqha.client._consume import (
    ReceivedMessage,
    Subscription,
    _decode_one,
    decode_messages,
)
from rmqha.store import _record
from rmqha.store._record import Message, RecordError, encode_record
from tests.test_record import HOSTS, INT64, decoder_inputs, messages
from tests.test_speedups import codec

EQUAL = settings(
    deadline=None,
    derandomize=True,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
QUEUE = MessageQueue("T", "broker-a", 1)


def compiled() -> Any:
    accel = _record._accel
    if getattr(accel, "pull_decode", None) is None:
        raise SkipTest("no compiled accelerator (or RMQHA_PURE=1)")
    return accel


def record(
    pos: int,
    topic: str = "T",
    body: bytes = b"hello",
    queue_id: int = 1,
    properties: dict[str, str] | None = None,
    sysflag: int = 0,
    store_host: tuple[str, int] = ("10.0.0.1", 10911),
    born_host: tuple[str, int] | None = None,
    queue_offset: int = 0,
) -> bytes:
    return encode_record(
        Message(topic, body, queue_id=queue_id, properties=properties or {}, sysflag=sysflag,
                born_host=born_host),
        queue_offset=queue_offset, physical_offset=pos, store_timestamp=1700000000000, store_host=store_host,
    )


def body_of(*specs: dict[str, Any]) -> bytes:
    out = b""
    for spec in specs:
        out += record(len(out), **spec)
    return out


def both(body: bytes, queue: MessageQueue = QUEUE, **kw: Any) -> tuple[list[ReceivedMessage], list[ReceivedMessage]]:
    accel = compiled()
    with codec(accel):
        fast = decode_messages(body, queue, **kw)
    with codec(None):
        pure = decode_messages(body, queue, **kw)
    return fast, pure


@st.composite
def pull_bodies(draw: st.DrawFn) -> bytes:
    """Records back to back, as a pull's body: plain ones mostly, any message sometimes."""
    out = bytearray()
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.booleans()):
            message = Message(
                draw(st.sampled_from(["T", "T", "U", "%RETRY%G"])),
                draw(st.binary(max_size=40)),
                queue_id=draw(st.sampled_from([1, 1, 2])),
                properties=draw(st.dictionaries(st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "é", "a"]),
                                                st.sampled_from(["A", "B", "x y", "标签"]), max_size=3)),
                sysflag=draw(st.sampled_from([0, 0, 1, 2])),
                born_host=draw(st.none() | HOSTS),
            )
            if message.sysflag & 1 and draw(st.booleans()):
                message = dataclasses.replace(message, body=zlib.compress(message.body))
        else:
            message = draw(messages(max_body=64, max_properties=3))
        out += encode_record(message, queue_offset=draw(INT64), physical_offset=draw(st.integers(0, 2**40)),
                             store_timestamp=draw(INT64), store_host=draw(HOSTS))
    if draw(st.booleans()) and out:
        for _ in range(draw(st.integers(1, 3))):
            out[draw(st.integers(0, len(out) - 1))] = draw(st.integers(0, 255))
    return bytes(out + draw(st.binary(max_size=draw(st.sampled_from([0, 0, 100])))))


class AgreementTests(SynchronousTestCase):
    """The compiled decoder and the pure-Python one give the same messages."""

    def assertSame(self, fast: list[ReceivedMessage], pure: list[ReceivedMessage]) -> None:
        self.assertEqual(fast, pure)  # (every field, the lazy ones decoded)
        self.assertEqual([m.__dict__ for m in fast], [m.__dict__ for m in pure])

    @settings(EQUAL, max_examples=40)
    @given(
        body=pull_bodies(),
        extra=st.none() | st.just(("3", "9")),
        tags=st.none() | st.sampled_from([frozenset({"A"}), frozenset({"B", "标签"})]),
    )
    def test_bodies(self, body: bytes, extra: tuple[str, str] | None, tags: frozenset[str] | None) -> None:
        fast, pure = both(body, extra=extra, tags=tags)
        self.assertSame(fast, pure)

    @EQUAL
    @given(inputs=decoder_inputs())
    def test_hostile(self, inputs: tuple[bytes, int, int, int]) -> None:
        buf, pos, end, _ = inputs
        for body in (buf, buf[pos:end], record(0) + buf[pos:end]):
            fast, pure = both(body)
            self.assertSame(fast, pure)

    def test_compiled_takes_plain_records(self) -> None:
        """A body of plain records is decoded in one compiled call."""
        accel = compiled()
        body = body_of(*[{"queue_offset": i, "properties": {"TAGS": "A"}} for i in range(5)])
        out: list[ReceivedMessage] = []
        self.assertEqual(accel.pull_decode(body, 0, ReceivedMessage, QUEUE, b"T", 1, None, None, out), len(body))
        self.assertEqual([m.queue_offset for m in out], [0, 1, 2, 3, 4])
        self.assertIs(out[0].queue, QUEUE)

    def test_compiled_leaves_the_rest(self) -> None:
        """
        It stops at what it leaves to Python (compressed, IPv6, another
        queue, non-ASCII properties with tags), and at a bad record.
        """
        accel = compiled()
        for spec, tags in [
            ({"sysflag": 1, "body": zlib.compress(b"z")}, None),
            ({"store_host": ("2001:db8::1", 9)}, None),
            ({"born_host": ("2001:db8::1", 9)}, None),
            ({"queue_id": 2}, None),
            ({"topic": "U"}, None),
            ({"properties": {"TAGS": "标签"}}, frozenset({"A"})),
        ]:
            first = record(0, properties={"TAGS": "A"})
            body = first + record(len(first), **spec) + first
            out: list[ReceivedMessage] = []
            self.assertEqual(
                accel.pull_decode(body, 0, ReceivedMessage, QUEUE, b"T", 1, None, tags, out), len(first), spec
            )
            self.assertEqual(len(out), 1)
            fast, pure = both(body, tags=tags)
            self.assertEqual(fast, pure)
            self.assertEqual(len(fast), 3 if tags is None else 2, spec)


class MalformedTests(SynchronousTestCase):
    """A record that does not decode: named, and the list ends there (as Java's)."""

    def test_named_by_offset(self) -> None:
        good = record(0)
        bad = bytearray(record(len(good)))
        struct.pack_into(">i", bad, 84, 5000)  # BODYLENGTH past the record
        with self.assertRaises(RecordError) as e:
            _decode_one(good + bytes(bad), len(good), QUEUE, None, None)
        self.assertEqual(e.exception.offset, len(good))
        self.assertIn(f"bad record at offset {len(good)}: body length 5000", str(e.exception))
        for accel in (_record._accel, None):
            with codec(accel):
                got = decode_messages(good + bytes(bad) + good, QUEUE)
            self.assertEqual([m.commit_log_offset for m in got], [0])

    def test_torn_tail(self) -> None:
        """A body cut inside a record: the whole records before it."""
        body = body_of({}, {"queue_offset": 1})
        for accel in (_record._accel, None):
            with codec(accel):
                self.assertEqual([m.queue_offset for m in decode_messages(body[:-3], QUEUE)], [0])
        with self.assertRaises(RecordError) as e:
            _decode_one(body[:-3], len(record(0)), QUEUE, None, None)
        self.assertIn("runs past the body", str(e.exception))


class LazyTests(SynchronousTestCase):
    """Properties, hosts and ids are decoded when first read, and kept."""

    def test_lazy_fields(self) -> None:
        body = body_of({"properties": {"UNIQ_KEY": "U1", "TAGS": "A", "MIN_OFFSET": "x"}})
        for accel in (_record._accel, None):
            with codec(accel):
                (m,) = decode_messages(body, QUEUE, extra=("2", "7"))
            for name in ("properties", "msg_id", "offset_msg_id", "born_host", "store_host"):
                self.assertNotIn(name, m.__dict__)
            self.assertEqual(m.properties, {"UNIQ_KEY": "U1", "TAGS": "A", "MIN_OFFSET": "2", "MAX_OFFSET": "7"})
            self.assertIs(m.properties, m.properties)
            self.assertEqual((m.tags, m.msg_id, m.store_host), ("A", "U1", "10.0.0.1:10911"))
            self.assertEqual(m.offset_msg_id, "0A00000100002A9F0000000000000000")
            eager = ReceivedMessage(**{f.name: getattr(m, f.name) for f in dataclasses.fields(m)})
            self.assertEqual(m, eager)
            self.assertEqual(dataclasses.replace(m, topic="X").properties, m.properties)
            with self.assertRaises(AttributeError):
                m.nothing  # type: ignore[attr-defined]
            with self.assertRaises(dataclasses.FrozenInstanceError):
                m.topic = "Y"  # type: ignore[misc]

    def test_ipv6_hosts(self) -> None:
        body = body_of({"store_host": ("2001:db8::1", 9), "born_host": ("2001:db8::2", 8)})
        (m,) = decode_messages(body, QUEUE)
        self.assertEqual((m.born_host, m.store_host), ("[2001:db8::2]:8", "[2001:db8::1]:9"))
        self.assertEqual(m.offset_msg_id, "20010DB8000000000000000000000001000000090000000000000000")
        self.assertEqual(m.msg_id, m.offset_msg_id)

    def test_tags_filter(self) -> None:
        """Only the messages whose TAGS the subscription names (none without TAGS)."""
        body = body_of(*[{"queue_offset": i, "properties": {"TAGS": t} if t else {}}
                         for i, t in enumerate(["A", "B", None, "A"])])
        sub = Subscription.build("T", "A || C", 1)
        for accel in (_record._accel, None):
            with codec(accel):
                got = decode_messages(body, QUEUE, tags=frozenset(sub.tags))
            self.assertEqual([m.queue_offset for m in got], [0, 3])
