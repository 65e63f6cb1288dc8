# -*- test-case-name: tests.test_fuzz -*-
"""
C{python -m tools.fuzz [--cases N] [--seed S] [--target NAME]...}: hostile input against
every parser a peer or a disk can reach.

Each case draws a target and an input, random or a mutation of a valid
one (bit flips, byte changes, truncation, insertion, huge or negative
sizes and offsets), and checks that the target either accepts it or
refuses it with its documented error:

- C{report}: the master's L{ReportDecoder} on a byte stream in random
  chunks, classic or checked framing (L{ProtocolError} only);
- C{transfer}: the slave's L{TransferDecoder} on frame streams, classic
  or checked (L{ProtocolError} only; buffered bytes never exceed one
  frame);
- C{record}: L{parse_record} on mutated records, strict and not
  (L{RecordError} only);
- C{codec}: the compiled codec (C{rmqha.store._speedups}) against the
  pure-Python one on mutated logs: L{walk_valid}, L{walk_headers},
  L{check_record} and L{ReplicaValidator.advance} (random chunks) give the
  same answers and the same errors (skipped when it is not built or
  C{RMQHA_PURE} is set);
- C{auth}: both sides of the group authentication handshake
  (L{rmqha.ha.auth}) on mutated conversations in random chunks
  (L{ProtocolError} only; a side accepts only the exact messages of the
  valid conversation, and holds at most one message and one chunk);
- C{remoting}: the remoting L{FrameDecoder} on mutated streams of JSON
  and binary frames in random chunks (L{RemotingError} only; it holds at
  most what it was given; a command it returns encodes again and decodes
  to itself);
- C{remoting-protocol}: a whole L{RemotingProtocol} fed mutated frames: it
  serves what is whole, and closes the connection with exactly one log
  line for anything malformed, never raising;
- C{sends}: a broker's remoting port (an ASYNC_MASTER over a real commit
  log) fed SEND_MESSAGE, SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE requests
  with hostile header values and batch bodies: every request is answered
  with one of the codes a send documents (docs/remoting.md, "Producing"),
  a SUCCESS carries a msgId per stored message, nothing is logged as a
  handler failure;
- C{pulls}: a broker's remoting port (a master over a real commit log
  with consume queues and a few messages) fed PULL_MESSAGE, the queue
  offset requests, HEART_BEAT, UNREGISTER_CLIENT and
  GET_CONSUMER_LIST_BY_GROUP with hostile header values and heartbeat
  bodies: every request is answered once (a held pull by its timeout),
  with a documented code, nothing is logged as a handler failure, and
  nothing stays held once its connection closes;
- C{slave}: a whole L{SlaveConnection} over a real commit log fed mutated
  frames: it may append good records and must drop the connection with one
  log line for anything else, never acknowledging a record that differs
  from the original; with checked framing, never acknowledging a single
  byte that differs.

Memory is sampled (RSS) before and after; the last line is JSON with the
counts, and the exit status is 1 if any case misbehaved.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from typing import Any, Callable

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import LogLevel, globalLogPublisher

from rmqha.store import _record
from rmqha.store._record import (
    Message,
    crc32,
    RecordError,
    ReplicaValidator,
    check_record,
    encode_record,
    parse_record,
    read_header,
    walk_headers,
    walk_valid,
)
from rmqha.ha._wire import (
    CHECKED_ACK,
    ProtocolError,
    ReportDecoder,
    TransferDecoder,
    encode_checked_header,
    encode_code,
    encode_header,
    encode_report,
)
from rmqha.store.commitlog import CommitLog
from rmqha.ha.auth import GroupAuth, MasterHandshake, SlaveHandshake
from rmqha.ha.slave import SlaveFactory
from rmqha.remoting._frames import FrameDecoder, RemotingCommand, RemotingError, encode, make_response
from rmqha.remoting.codes import LanguageCode, SerializeType
from rmqha.remoting.protocol import Dispatcher, RemotingProtocol
from tools._help import plain

__all__ = ["main", "run"]

_SEGMENT = 64 * 1024


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _mutate(rng: random.Random, data: bytes) -> bytes:
    """
    One to four random mutations of C{data}.
    """
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(7)
        if not buf:
            buf += rng.randbytes(rng.randint(1, 16))
            continue
        i = rng.randrange(len(buf))
        if kind == 0:
            buf[i] ^= 1 << rng.randrange(8)
        elif kind == 1:
            buf[i] = rng.randrange(256)
        elif kind == 2:
            del buf[i:]
        elif kind == 3:
            buf[i:i] = rng.randbytes(rng.randint(1, 32))
        elif kind == 4 and i + 4 <= len(buf):
            # A size or offset field made huge or negative.
            buf[i : i + 4] = rng.choice([b"\x7f\xff\xff\xff", b"\xff\xff\xff\xff", b"\x80\0\0\0"])
        elif kind == 5:
            del buf[i : i + rng.randint(1, 64)]
        else:
            buf += rng.randbytes(rng.randint(1, 64))
    return bytes(buf)


def _chunks(rng: random.Random, data: bytes) -> list[bytes]:
    out, i = [], 0
    while i < len(data):
        n = rng.choice([1, 7, 12, 100, 4096, len(data)])
        out.append(data[i : i + n])
        i += n
    return out


def _run_inline(work: Callable[[], None]) -> Deferred[None]:
    """The store's disk work, run at once (no threads under the fuzzer)."""
    work()
    return succeed(None)


class _Corpus:
    """
    Valid records and frames to mutate.
    """

    def __init__(self, rng: random.Random) -> None:
        self.records: list[bytes] = []
        offset = 0
        for i in range(24):
            body = rng.randbytes(rng.choice([0, 1, 50, 300, 1000]))
            properties = {"TAGS": f"t{i}"} if i % 2 else {}
            record = encode_record(
                Message(f"Topic{i % 3}", body, queue_id=i % 4, properties=properties),
                queue_offset=i,
                physical_offset=offset,
                store_timestamp=1_700_000_000_000,
                store_host=("127.0.0.1", 10911),
            )
            self.records.append(record)
            offset += len(record)
        self.log = b"".join(self.records)


def _frames(checked: bool, frames: list[tuple[int, bytes]]) -> bytes:
    """
    A master's stream of C{frames}, classic or checked.
    """
    if not checked:
        return b"".join(encode_header(o, len(b)) + b for o, b in frames)
    return encode_code(CHECKED_ACK) + b"".join(encode_checked_header(o, b) + b for o, b in frames)


def _report_case(rng: random.Random, corpus: _Corpus) -> None:
    checked = rng.random() < 0.5
    stream = (
        rng.randbytes(rng.randint(0, 64))
        if rng.random() < 0.5
        else _mutate(
            rng, b"".join(encode_report(rng.randrange(1 << 40), checked) for _ in range(4))
        )
    )
    decoder = ReportDecoder(checked)
    for chunk in _chunks(rng, stream):
        try:
            decoder.feed(chunk)
        except ProtocolError:
            return


def _transfer_case(rng: random.Random, corpus: _Corpus) -> None:
    checked = rng.random() < 0.5
    frames = _frames(
        checked, [(0, corpus.log[:300]), (300, corpus.log[300:900]), (900, b"")]
    )
    stream = rng.randbytes(rng.randint(0, 200)) if rng.random() < 0.3 else _mutate(rng, frames)
    decoder = TransferDecoder(checked=checked)
    for chunk in _chunks(rng, stream):
        try:
            decoder.feed(chunk)
            while decoder.next_frame() is not None:
                pass
        except ProtocolError:
            return
        if decoder.buffered > len(stream):
            raise AssertionError("the decoder holds more than it was given")


_AUTH_SECRET = b"fuzzing the group secret, 32 B.."


def _auth_case(rng: random.Random, corpus: _Corpus) -> None:
    """
    One side of the handshake fed a mutated (or random) stream from the
    other: it refuses with a L{ProtocolError} or waits, and accepts only
    if the bytes it consumed are the valid conversation's.
    """
    master_auth = GroupAuth("g", "master-" + str(rng.randrange(100)), _AUTH_SECRET)
    slave_auth = GroupAuth("g", "slave-" + str(rng.randrange(100)), _AUTH_SECRET)
    master_nonce, slave_nonce = rng.randbytes(32), rng.randbytes(32)
    reference_master = MasterHandshake(master_auth, nonce=master_nonce)
    reference_slave = SlaveHandshake(slave_auth, nonce=slave_nonce)
    challenge = reference_master.feed(reference_slave.hello())
    reference_slave.feed(challenge)
    accepted = reference_master.feed(reference_slave.proof)
    to_master_side = rng.random() < 0.5
    messages = (
        [reference_slave.hello(), reference_slave.proof]
        if to_master_side
        else [challenge, accepted]
    )
    valid = b"".join(messages)
    draw = rng.random()
    if draw < 0.2:
        stream = rng.randbytes(rng.randint(0, 400))
    elif draw < 0.6:
        stream = _mutate(rng, valid)
    else:
        # A forger's: a message changed past its code and sealed again
        # with a good CRC (which the random mutations rarely keep).
        i = rng.randrange(len(messages))
        message = messages[i]
        if len(message) > 12:
            body = _mutate(rng, message[8:-4])
            message = message[:8] + body + crc32(message[:8] + body).to_bytes(4, "big")
        messages[i] = message
        stream = b"".join(messages)
    side: Any = (
        MasterHandshake(master_auth, nonce=master_nonce)
        if to_master_side
        else SlaveHandshake(slave_auth, nonce=slave_nonce)
    )
    if not to_master_side:
        side.hello()
    fed = 0
    for chunk in _chunks(rng, stream):
        try:
            side.feed(chunk)
        except ProtocolError:
            return
        fed += len(chunk)
        if side.done:
            consumed = fed - len(side.rest)
            if stream[:consumed] != valid:
                raise AssertionError("a handshake accepted bytes that are not the valid ones")
            return
        if len(side._buffer) > 333 + len(chunk):
            raise AssertionError(f"the handshake holds {len(side._buffer)} bytes")


def _record_case(rng: random.Random, corpus: _Corpus) -> None:
    record = _mutate(rng, rng.choice(corpus.records))
    for strict in (False, True):
        try:
            parse_record(record, 0, len(record), 0, strict=strict, check_crc=rng.random() < 0.5)
        except RecordError:
            pass


class _SlaveTarget:
    """
    A slave connection over a real commit log, reset for each case.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.lines: list[str] = []
        globalLogPublisher.addObserver(self._observe)  # type: ignore[arg-type]

    def _observe(self, event: dict[str, Any]) -> None:
        if event.get("log_level") in (LogLevel.warn, LogLevel.error, LogLevel.critical):
            self.lines.append(str(event.get("log_format")))

    def close(self) -> None:
        globalLogPublisher.removeObserver(self._observe)  # type: ignore[arg-type]

    def case(self, rng: random.Random, corpus: _Corpus) -> None:
        store = os.path.join(self.directory, "slave")
        shutil.rmtree(store, ignore_errors=True)
        log = CommitLog.open(store, segment_size=_SEGMENT)
        try:
            clock = Clock()
            factory = SlaveFactory(log, clock)
            factory.checked = checked = rng.random() < 0.5
            connection = factory.buildProtocol(None)
            transport = StringTransport()
            connection.makeConnection(transport)
            connection.send_report()
            del self.lines[:]
            cut = rng.randrange(len(corpus.log))
            frames = _frames(checked, [(0, corpus.log[:cut]), (cut, corpus.log[cut:])])
            stream = _mutate(rng, frames)
            for chunk in _chunks(rng, stream):
                connection.dataReceived(chunk)
                if transport.disconnecting:
                    break
            dropped = transport.disconnecting
            drop_lines = [line for line in self.lines if "dropping" in line]
            if dropped and len(drop_lines) != 1:
                raise AssertionError(f"a dropped peer logged {len(drop_lines)} lines")
            # Whatever was acknowledged is whole records passing every
            # check the slave makes (size, magic, offset, fields, body CRC);
            # a mutation those cannot see (a header field the CRC does not
            # cover) is not the slave's to catch.
            report = 12 if checked else 8
            sent = transport.value()
            acked = int.from_bytes(sent[-report:][:8], "big") if sent else 0
            # (The corpus fits in one segment, so one read returns it all.)
            if checked and acked and log.read(0, acked) != corpus.log[:acked]:
                # Checked framing: not one damaged byte is acknowledged.
                raise AssertionError("acknowledged bytes differ from the master's")
            # (An empty slave may have started at any segment boundary.)
            position = log.min_offset if log.has_data() else acked
            while position < acked:
                data = log.read(position, acked - position)
                record = parse_record(data, 0, len(data), position, check_crc=True)
                position += record.size
            if position != acked:
                raise AssertionError(f"acknowledged offset {acked} is not a record end")
            connection.connectionLost()
            for call in clock.getDelayedCalls():
                call.cancel()
        finally:
            log.close()


def _remoting_frames(rng: random.Random) -> bytes:
    """
    A valid stream of one to four remoting frames, JSON or binary.
    """
    frames = []
    for _ in range(rng.randint(1, 4)):
        ext = {
            rng.choice(["topic", "queueId", "bname", "a", "properties", "\u00e9"]): rng.choice(
                ["TopicTest", "0", "broker-a", "", "k\x01v\x02", "\u4e2d" * 3]
            )
            for _ in range(rng.randint(0, 5))
        }
        command = RemotingCommand(
            code=rng.choice([10, 11, 21, 30, 103, 310, 9999]),
            language=rng.choice(list(LanguageCode)),
            opaque=rng.randrange(1 << 31),
            flag=rng.choice([0, 1, 2]),
            remark=rng.choice([None, "", "error text"]),
            ext_fields=rng.choice([None, ext]),
            body=rng.randbytes(rng.choice([0, 3, 100])),
            serialize_type=rng.choice(list(SerializeType)),
        )
        frames.append(encode(command))
    return b"".join(frames)


def _remoting_case(rng: random.Random, corpus: _Corpus) -> None:
    stream = rng.randbytes(rng.randint(0, 64)) if rng.random() < 0.1 else _mutate(rng, _remoting_frames(rng))
    decoder = FrameDecoder(max_frame_size=rng.choice([1 << 24, 4096]))
    fed = 0
    for chunk in _chunks(rng, stream):
        fed += len(chunk)
        try:
            decoder.feed(chunk)
            while (command := decoder.next_command()) is not None:
                again = FrameDecoder()
                again.feed(encode(command))
                back = again.next_command()
                if back != command:
                    raise AssertionError(
                        f"a decoded command does not survive encoding: {command!r:.300} "
                        f"comes back as {back!r:.300}"
                    )
        except RemotingError:
            return
        if decoder.buffered > fed:
            raise AssertionError("the remoting decoder holds more than it was given")


class _RemotingProtocolTarget:
    """
    A remoting connection fed mutated frames, counting its log lines.
    """

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.handler = Dispatcher(
            {code: self._serve for code in (10, 11, 21, 30, 103, 310)}
        )
        globalLogPublisher.addObserver(self._observe)  # type: ignore[arg-type]

    @staticmethod
    def _serve(command: RemotingCommand, peer: Any) -> RemotingCommand:
        return make_response(command, 0, ext_fields=command.ext_fields, body=command.body)

    def _observe(self, event: dict[str, Any]) -> None:
        if event.get("log_level") in (LogLevel.warn, LogLevel.error, LogLevel.critical):
            self.lines.append(str(event.get("log_format")))

    def close(self) -> None:
        globalLogPublisher.removeObserver(self._observe)  # type: ignore[arg-type]

    def case(self, rng: random.Random, corpus: _Corpus) -> None:
        clock = Clock()
        protocol = RemotingProtocol(self.handler, clock, max_pending=4)
        transport = StringTransport()
        protocol.makeConnection(transport)
        waiting = [protocol.request(RemotingCommand(code=30)) for _ in range(rng.randint(0, 3))]
        del self.lines[:]
        for chunk in _chunks(rng, _mutate(rng, _remoting_frames(rng))):
            protocol.dataReceived(chunk)
        clock.advance(0)
        malformed = [line for line in self.lines if "malformed" in line]
        if len(malformed) != (1 if transport.disconnecting else 0) or len(self.lines) != len(malformed):
            raise AssertionError(f"unexpected log lines {self.lines!r}")
        answers = FrameDecoder()
        answers.feed(transport.value())
        while answers.next_command() is not None:
            pass
        protocol.connectionLost()
        for d in waiting:
            d.addErrback(lambda failure: None)
        if clock.getDelayedCalls():
            raise AssertionError("the remoting protocol left calls on the clock")


class _SendsTarget:
    """
    An ASYNC_MASTER's remoting port (built at its first case), fed hostile
    sends.
    """

    _CODES = frozenset({0, 1, 13, 14, 16, 17})
    _TOPICS = ["TopicTest", "Fresh1", "Fresh2", "%RETRY%G1", "SCHEDULE_TOPIC_XXXX", "", " ", "a b", "t" * 128, "TBW102"]
    _INTS = ["0", "1", "-1", "3", "4", "99", "2147483647", "-2147483648", "2147483648", "x", "", " 1", "1.5"]
    _PROPS = [
        "", "WAIT\x01true", "UNIQ_KEY\x01AB\x02TAGS\x01T", "DELAY\x013", "DELAY\x01x", "TRAN_MSG\x01true",
        "k\x01a\x01b", "\x01\x02\x02", "K\x01" + "v" * 40000, "\u00e9\x01\u4e2d",
    ]

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.lines: list[str] = []
        self.broker: Any = None
        self.factory: Any = None

    def _observe(self, event: dict[str, Any]) -> None:
        if event.get("log_level") in (LogLevel.error, LogLevel.critical):
            self.lines.append(str(event.get("log_format")))

    def _start(self) -> None:
        from twisted.internet.testing import MemoryReactorClock

        from rmqha.broker import Broker
        from rmqha.remoting.metadata import SubscriptionGroupConfig, TopicConfig
        from rmqha.settings import BrokerSettings

        reactor = MemoryReactorClock()
        store = os.path.join(self.directory, "sends")
        self.broker = Broker(
            BrokerSettings(ha_listen="tcp:0", listen="tcp:0"),
            reactor=reactor,
            open_commitlog=lambda: CommitLog.open(store, segment_size=1 << 20),
        )
        self.broker.startService()
        self.broker.metadata.update_topic(TopicConfig("TopicTest", 4, 4), persist=False)
        self.broker.metadata.update_group(SubscriptionGroupConfig("G1", retry_max_times=2), persist=False)
        (self.factory,) = [f for _, f, *_ in reactor.tcpServers if getattr(f, "name", None) == "remoting"]
        globalLogPublisher.addObserver(self._observe)  # type: ignore[arg-type]

    def close(self) -> None:
        if self.broker is not None:
            globalLogPublisher.removeObserver(self._observe)  # type: ignore[arg-type]
            self.broker.stopService()

    def _batch(self, rng: random.Random) -> bytes:
        from rmqha.remoting.sends import encode_batch_item

        items = b"".join(
            encode_batch_item(rng.randrange(-5, 5), rng.randbytes(rng.choice([0, 1, 30])), rng.choice(
                [b"", b"UNIQ_KEY\x01U", b"k\x01v\x02", b"\xff\xfe"]))
            for _ in range(rng.randint(1, 4))
        )
        return _mutate(rng, items) if rng.random() < 0.5 else items

    def case(self, rng: random.Random, corpus: _Corpus) -> None:
        if self.broker is None:
            self._start()
        code = rng.choice([10, 310, 320])

        def pick(valid: list[str], hostile: list[str]) -> str:
            # Mostly valid values, so that most sends reach the put.
            return rng.choice(hostile if rng.random() < 0.1 else valid)

        values = {
            "group": "PG",
            "topic": pick(["TopicTest", "TopicTest", "Fresh1", "Fresh2", "%RETRY%G1"], self._TOPICS),
            "default": pick(["TBW102"], ["TopicTest", "Nope"]),
            "nums": pick(["4", "8", "1"], self._INTS),
            "queue": pick(["0", "1", "-1", "3"], self._INTS),
            "sys": pick(["0", "1", "2"], ["4", "8", "-1", "x"]),
            "born": pick(["1700000000000"], ["-1", "9223372036854775808", "x"]),
            "flag": pick(["0", "7"], self._INTS),
            "props": rng.choice(self._PROPS),
            "reconsume": pick(["0", "1", "2", "5"], self._INTS),
            "unit": pick(["false"], ["true", "yes"]),
            "batch": "true" if code == 320 else pick(["false"], ["true"]),
            "max": pick(["3", "16"], self._INTS),
        }
        names = (
            ["producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
             "bornTimestamp", "flag", "properties", "reconsumeTimes", "unitMode", "batch", "maxReconsumeTimes"]
            if code == 10 else list("abcdefghijkml")
        )
        ext = dict(zip(names, values.values()))
        if rng.random() < 0.1:
            for name in rng.sample(names, rng.randint(1, 2)):
                del ext[name]
        body = self._batch(rng) if values["batch"] == "true" else rng.randbytes(rng.choice([0, 10]))
        request = RemotingCommand(code=code, opaque=rng.randrange(1 << 31), ext_fields=ext, body=body)
        protocol = self.factory.buildProtocol(None)
        transport = StringTransport()
        protocol.makeConnection(transport)
        del self.lines[:]
        try:
            protocol.dataReceived(encode(request))
        finally:
            protocol.connectionLost(None)
        answers = FrameDecoder()
        answers.feed(transport.value())
        answer = answers.next_command()
        if answer is None or answers.next_command() is not None:
            raise AssertionError(f"not one answer to {request!r:.300}")
        if answer.code not in self._CODES or self.lines:
            raise AssertionError(f"{answer.code} {answer.remark!r:.200} {self.lines!r:.200} to {request!r:.300}")
        if answer.code == 0 and not answer.ext("msgId"):
            raise AssertionError(f"SUCCESS without a msgId to {request!r:.300}")


class _PullsTarget:
    """
    A master's remoting port with consume queues (built at its first case),
    fed hostile pulls, offset requests and heartbeats.
    """

    _CODES = frozenset({0, 1, 2, 16, 17, 19, 20, 21, 24, 25, 26})
    _INTS = ["0", "1", "-1", "3", "99", "2147483647", "-2147483648", "2147483648", "x", "", "1.5"]
    _LONGS = ["0", "2", "5", "-1", "9223372036854775807", "9223372036854775808", "x", ""]
    _SUBS = ["*", "A", "A || B", "||", "", "A||" * 50, "\u00e9"]

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.lines: list[str] = []
        self.broker: Any = None
        self.factory: Any = None
        self.reactor: Any = None

    def _observe(self, event: dict[str, Any]) -> None:
        if event.get("log_level") in (LogLevel.error, LogLevel.critical):
            self.lines.append(str(event.get("log_format")))

    def _start(self) -> None:
        from twisted.internet.defer import succeed
        from twisted.internet.testing import MemoryReactorClock

        from rmqha.broker import Broker
        from rmqha.remoting.metadata import SubscriptionGroupConfig, TopicConfig
        from rmqha.settings import BrokerSettings
        from rmqha.store._record import Message

        store = os.path.join(self.directory, "pulls")
        log = CommitLog.open(store, segment_size=1 << 20)
        for n in range(5):
            log.put(Message("TopicTest", b"m%d" % n, queue_id=n % 2, properties={"TAGS": "AB"[n % 2]}))
        log.close()
        self.reactor = MemoryReactorClock()
        self.broker = Broker(
            BrokerSettings(ha_listen="tcp:0", listen="tcp:0"),
            reactor=self.reactor,
            open_commitlog=lambda: CommitLog.open(store, segment_size=1 << 20, consume_queues=True),
            run_in_thread=_run_inline,
        )
        self.broker.startService()
        self.broker.metadata.update_topic(TopicConfig("TopicTest", 2, 2), persist=False)
        self.broker.metadata.update_group(SubscriptionGroupConfig("G1"), persist=False)
        (self.factory,) = [f for _, f, *_ in self.reactor.tcpServers if getattr(f, "name", None) == "remoting"]
        globalLogPublisher.addObserver(self._observe)  # type: ignore[arg-type]

    def close(self) -> None:
        if self.broker is not None:
            globalLogPublisher.removeObserver(self._observe)  # type: ignore[arg-type]
            self.broker.stopService()

    def _heartbeat(self, rng: random.Random) -> bytes:
        sub = (
            '{"classFilterMode":false,"codeSet":[65],"expressionType":"TAG","subString":"A",'
            '"subVersion":5,"tagsSet":["A"],"topic":"TopicTest"}'
        )
        body = (
            '{"clientID":"10.0.0.5@1","consumerDataSet":[{"consumeFromWhere":"CONSUME_FROM_LAST_OFFSET",'
            '"consumeType":"CONSUME_PASSIVELY","groupName":"' + rng.choice(["G1", "G2", "", "a b"]) + '",'
            '"messageModel":"' + rng.choice(["CLUSTERING", "BROADCASTING"]) + '","subscriptionDataSet":['
            + ",".join([sub] * rng.choice([0, 1, 2])) + '],"unitMode":false}],"producerDataSet":[{"groupName":"PG"}]}'
        ).encode()
        return _mutate(rng, body) if rng.random() < 0.3 else body

    def case(self, rng: random.Random, corpus: _Corpus) -> None:
        if self.broker is None:
            self._start()

        def pick(valid: list[str], hostile: list[str]) -> str:
            return rng.choice(hostile if rng.random() < 0.15 else valid)

        code = rng.choice([11, 11, 11, 29, 30, 31, 32, 33, 34, 35, 38])
        body = b""
        if code == 11:
            ext = {
                "consumerGroup": pick(["G1", "G1", "G2"], ["", "a b", "%RETRY%G1"]),
                "topic": pick(["TopicTest"], ["Nope", "", "SCHEDULE_TOPIC_XXXX"]),
                "queueId": pick(["0", "1"], self._INTS),
                # (2 and 3 are the queues' ends: such pulls are held.)
                "queueOffset": pick(["0", "1", "2", "3", "2", "3", "9"], self._LONGS),
                "maxMsgNums": pick(["32", "1"], self._INTS),
                "sysFlag": pick(["6", "7", "2", "3", "4", "0"], self._INTS),
                "commitOffset": pick(["0", "1"], self._LONGS),
                "suspendTimeoutMillis": pick(["15000", "0", "100"], self._LONGS),
                "subVersion": pick(["0", "5", "6"], self._LONGS),
            }
            if int(ext["sysFlag"]) & 4 if ext["sysFlag"].isdigit() else rng.random() < 0.5:
                ext["subscription"] = rng.choice(self._SUBS)
                ext["expressionType"] = pick(["TAG"], ["SQL92", ""])
        elif code == 34:
            ext = {}
            body = self._heartbeat(rng)
        elif code == 35:
            ext = {"clientID": "10.0.0.5@1", "consumerGroup": pick(["G1"], ["", "Nope"])}
        elif code == 38:
            ext = {"consumerGroup": pick(["G1", "G2"], ["", "x" * 300])}
        elif code == 33:
            ext = {"offset": pick(["0", "1", "100"], self._LONGS)}
        else:
            ext = {"topic": pick(["TopicTest"], ["Nope", ""]), "queueId": pick(["0", "1"], self._INTS)}
            if code == 29:
                ext["timestamp"] = pick(["0", "1700000000000"], self._LONGS)
        if rng.random() < 0.1 and ext:
            del ext[rng.choice(list(ext))]
        request = RemotingCommand(code=code, opaque=rng.randrange(1 << 31), ext_fields=ext, body=body)
        protocol = self.factory.buildProtocol(None)
        transport = StringTransport()
        protocol.makeConnection(transport)
        pulls = self.factory.wrappedFactory.handler.remoting.pulls
        close_first = rng.random() < 0.3
        del self.lines[:]
        try:
            protocol.dataReceived(encode(request))
            held = pulls.held_count()
            if close_first:
                protocol.connectionLost(None)
                if pulls.held_count():
                    raise AssertionError(f"a pull stays held after its connection closed: {request!r:.300}")
            self.reactor.advance(16)  # (past any hold)
        finally:
            if not close_first:
                protocol.connectionLost(None)
        answers = FrameDecoder()
        answers.feed(transport.value())
        got = []
        while (answer := answers.next_command()) is not None:
            if answer.is_response:
                got.append(answer)
        if len(got) != (0 if close_first and held else 1):
            raise AssertionError(f"{len(got)} answers to {request!r:.300} (held: {held})")
        if got and got[0].code not in self._CODES or self.lines:
            raise AssertionError(f"{got[0].code} {got[0].remark!r:.200} {self.lines!r:.200} to {request!r:.300}")
        if pulls.held_count():
            raise AssertionError(f"a pull stays held after its answer or close: {request!r:.300}")


def _codec_answers(
    data: bytes, pos: int, checks: tuple[bool, bool], cuts: list[int]
) -> list[Any]:
    """
    What the codec's accelerated functions answer (or raise) on C{data}.
    """

    def outcome(call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception as e:
            return (type(e).__name__, str(e))

    check_crc, strict = checks
    answers = [
        outcome(lambda: walk_valid(data, pos, len(data), pos, check_crc=check_crc, strict=strict)),
        outcome(lambda: walk_headers(data, pos, len(data))),
    ]
    if pos + 8 <= len(data):
        total, magic = read_header(data, pos)
        if total >= 0:
            answers.append(outcome(lambda: check_record(data, pos, pos, total, magic)))
    validator = ReplicaValidator(_SEGMENT, lambda o, n: data[o : o + n])

    def feed() -> list[int]:
        end, ends, at = 0, [], 0
        for cut in cuts:
            chunk = memoryview(data)[at : at + cut]
            end = validator.advance(end, at + len(chunk), at, chunk)
            ends.append(end)
            at += len(chunk)
        return ends

    answers.append(outcome(feed))
    return answers


def _codec_case(rng: random.Random, corpus: _Corpus) -> None:
    compiled = _record._accel
    if compiled is None:
        return
    data = _mutate(rng, corpus.log)
    pos = rng.choice([0, 0, rng.randrange(len(data) + 1)])
    checks = (rng.random() < 0.5, rng.random() < 0.5)
    cuts = [len(c) for c in _chunks(rng, data)]
    try:
        _record._accel = None
        pure = _codec_answers(data, pos, checks, cuts)
    finally:
        _record._accel = compiled
    if _codec_answers(data, pos, checks, cuts) != pure:
        raise AssertionError("the compiled codec answers differently from the pure one")


def run(
    cases: int,
    seed: int,
    progress: Callable[[str], None] | None = None,
    only: list[str] | None = None,
) -> dict[str, Any]:
    """
    Run C{cases} cases (of the targets named in C{only}, default all); the
    counts per target and any failures.
    """
    rng = random.Random(seed)
    corpus = _Corpus(rng)
    directory = tempfile.mkdtemp(prefix="rmqha-fuzz-")
    slave = _SlaveTarget(directory)
    remoting = _RemotingProtocolTarget()
    sends = _SendsTarget(directory)
    pulls = _PullsTarget(directory)
    targets: list[tuple[str, Callable[[random.Random, _Corpus], None], float]] = [
        ("report", _report_case, 0.3),
        ("transfer", _transfer_case, 0.3),
        ("record", _record_case, 0.33),
        ("codec", _codec_case, 0.05),
        ("auth", _auth_case, 0.05),
        ("slave", slave.case, 0.02),
        ("remoting", _remoting_case, 0.15),
        ("remoting-protocol", remoting.case, 0.02),
        ("sends", sends.case, 0.01),
        ("pulls", pulls.case, 0.01),
    ]
    if only:
        unknown = set(only) - {name for name, _, _ in targets}
        if unknown:
            for made in (slave, remoting, sends, pulls):
                made.close()
            shutil.rmtree(directory, ignore_errors=True)  # (nothing left behind)
            raise ValueError(f"unknown fuzz target(s): {', '.join(sorted(unknown))}")
        targets = [t for t in targets if t[0] in only]
    counts = {name: 0 for name, _, _ in targets}
    failures: list[str] = []
    rss_before = _rss()
    started = time.perf_counter()
    try:
        for i in range(cases):
            name, target, _ = rng.choices(targets, weights=[w for _, _, w in targets])[0]
            counts[name] += 1
            try:
                target(rng, corpus)
            except Exception as e:  # anything but the documented errors
                if len(failures) < 20:
                    failures.append(f"case {i} ({name}): {type(e).__name__}: {e}")
            if progress is not None and i and i % 100_000 == 0:
                progress(f"{i:,} cases, {len(failures)} failures, RSS {_rss() >> 20} MiB")
    finally:
        slave.close()
        remoting.close()
        sends.close()
        pulls.close()
        shutil.rmtree(directory, ignore_errors=True)
    return {
        "cases": cases,
        "seed": seed,
        "codec": "compiled" if _record._accel is not None else "pure Python",
        "seconds": round(time.perf_counter() - started, 1),
        "per_target": counts,
        "failures": failures,
        "rss_before_mib": rss_before >> 20,
        "rss_after_mib": _rss() >> 20,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.fuzz", description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--cases", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--target", action="append", metavar="NAME",
        help="run only this target (repeatable; default: all)",
    )
    args = parser.parse_args(argv)
    try:
        result = run(
            args.cases, args.seed, lambda text: print(text, file=sys.stderr, flush=True), args.target
        )
    except ValueError as e:
        parser.error(str(e))
    print(json.dumps(result))
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
