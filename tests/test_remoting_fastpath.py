"""
Tests for the send path's fast paths (docs/benchmarks.md, "Remoting
sends"): each reads or writes what the general path does, and the I/O
choices a SYNC send's round trip depends on.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IAddress
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase

from rmqha.remoting import _frames, protocol
from rmqha.remoting._frames import (
    CustomHeaderError,
    FrameDecoder,
    RemotingCommand,
    decode_frame,
    encode,
    header_from_ext_fields,
)
from rmqha.remoting.codes import RequestCode, ResponseCode
from rmqha.remoting.protocol import Dispatcher, RemotingProtocol
from rmqha.remoting.sends import (
    SendMessageRequestHeader,
    SendMessageRequestHeaderV2,
    read_send_header,
)

_NUMBERS = st.one_of(
    st.integers(0, 1 << 64).map(str),
    st.integers(-(1 << 40), -1).map(str),
    st.sampled_from(["", "+5", "007", "1.5", "0x10", " 1", "\u0663", "\u00b2", "2147483647", "2147483648"]),
)
_TEXTS = st.one_of(st.text(max_size=8), st.sampled_from(["true", "TRUE", "false", "yes"]))


def _generic(code: int, ext: dict[str, str] | None) -> Any:
    if code == RequestCode.SEND_MESSAGE:
        return header_from_ext_fields(SendMessageRequestHeader, ext)
    return header_from_ext_fields(SendMessageRequestHeaderV2, ext).to_v1()


def _outcome(read: Any) -> Any:
    try:
        return read()
    except CustomHeaderError as e:
        return ("refused", str(e))


class ReadSendHeaderTests(SynchronousTestCase):
    """
    L{read_send_header} reads every send header as
    L{header_from_ext_fields} does: the same header, or the same refusal.
    """

    @settings(max_examples=300, deadline=None)
    @given(
        code=st.sampled_from([RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE]),
        numbers=st.dictionaries(st.sampled_from("defghjl"), _NUMBERS),
        texts=st.dictionaries(st.sampled_from("abcikmn"), _TEXTS),
        drop=st.sets(st.sampled_from("abcdefghijklmn")),
    )
    def test_v2_agrees(self, code: int, numbers: dict[str, str], texts: dict[str, str], drop: set[str]) -> None:
        ext = {
            "a": "PG", "b": "T", "c": "TBW102", "d": "4", "e": "1", "f": "0",
            "g": "1700000000123", "h": "0", **numbers, **texts,
        }
        for key in drop:
            ext.pop(key, None)
        self.assertEqual(
            _outcome(lambda: read_send_header(code, ext)), _outcome(lambda: _generic(code, ext))
        )

    def test_plain_header(self) -> None:
        """
        What a client sends is read in one go to the header the general
        path reads, optional fields present or not.
        """
        ext = {
            "a": "PG", "b": "T", "c": "TBW102", "d": "4", "e": "3", "f": "0",
            "g": "1700000000123", "h": "7", "i": "WAIT\x01true", "j": "2", "k": "false",
            "l": "16", "m": "true", "n": "broker-a",
        }
        header = read_send_header(RequestCode.SEND_BATCH_MESSAGE, ext)
        self.assertEqual(header, _generic(RequestCode.SEND_BATCH_MESSAGE, ext))
        self.assertEqual((header.queue_id, header.batch, header.max_reconsume_times), (3, True, 16))
        short = {k: v for k, v in ext.items() if k in "abcdefgh"}
        self.assertEqual(
            read_send_header(RequestCode.SEND_MESSAGE_V2, short),
            _generic(RequestCode.SEND_MESSAGE_V2, short),
        )

    def test_v1_and_missing(self) -> None:
        """
        Code 10 and a V2 header without extFields take the general path,
        with its refusals.
        """
        ext = {
            "producerGroup": "PG", "topic": "T", "defaultTopic": "TBW102",
            "defaultTopicQueueNums": "4", "queueId": "1", "sysFlag": "0",
            "bornTimestamp": "1", "flag": "0",
        }
        self.assertEqual(
            read_send_header(RequestCode.SEND_MESSAGE, ext), _generic(RequestCode.SEND_MESSAGE, ext)
        )
        with self.assertRaisesRegex(CustomHeaderError, "'a' is missing"):
            read_send_header(RequestCode.SEND_MESSAGE_V2, None)

    def test_int_range_named(self) -> None:
        """
        Plain digits past an Int32 field's range are refused, naming it.
        """
        with self.assertRaisesRegex(CustomHeaderError, r"'queueId' 2147483648 is outside"):
            header_from_ext_fields(
                SendMessageRequestHeader,
                {
                    "producerGroup": "PG", "topic": "T", "defaultTopic": "TBW102",
                    "defaultTopicQueueNums": "4", "queueId": "2147483648", "sysFlag": "0",
                    "bornTimestamp": "1", "flag": "0",
                },
            )


class JSONHeaderTests(SynchronousTestCase):
    """
    JSON headers are read by one decoder, made once.
    """

    def test_no_decoder_per_header(self) -> None:
        made = []
        original = json.JSONDecoder.__init__

        def counting(self: Any, *args: Any, **kwargs: Any) -> None:
            made.append(1)
            original(self, *args, **kwargs)

        self.patch(json.JSONDecoder, "__init__", counting)
        frame = encode(RemotingCommand(code=310, opaque=3, ext_fields={"a": "x", "d": "4"}))
        for _ in range(3):
            self.assertEqual(decode_frame(frame).ext_fields, {"a": "x", "d": "4"})
        self.assertEqual(made, [])

    def test_ext_values_other_than_strings(self) -> None:
        """
        extFields of strings only are kept as parsed; numbers, booleans
        and nulls still become their text (or go).
        """
        header = b'{"code":310,"extFields":{"a":"x","d":4,"e":1.50,"k":true,"n":null},"opaque":1}'
        frame = (4 + len(header)).to_bytes(4, "big") + len(header).to_bytes(4, "big") + header
        command = decode_frame(frame)
        self.assertEqual(command.ext_fields, {"a": "x", "d": "4", "e": "1.50", "k": "true"})
        self.assertTrue(all(type(v) is str for v in (command.ext_fields or {}).values()))

    def test_prefix_checked_once_whole(self) -> None:
        """
        A frame that arrives whole and one that arrives a byte at a time
        decode alike; a bad prefix is refused either way.
        """
        frame = encode(RemotingCommand(code=310, opaque=9, ext_fields={"a": "x"}, body=b"body"))
        whole, split = FrameDecoder(), FrameDecoder()
        whole.feed(frame + frame)
        commands = [whole.next_command(), whole.next_command(), whole.next_command()]
        for byte in frame:
            split.feed(bytes([byte]))
            got = split.next_command()
        self.assertEqual(commands[:2], [got, got])
        self.assertIsNone(commands[2])
        bad = FrameDecoder()
        bad.feed((20).to_bytes(4, "big") + (7 << 24 | 4).to_bytes(4, "big"))
        self.assertRaises(_frames.UnknownSerializeTypeError, bad.next_command)


class _NoDelayTransport(StringTransport):
    no_delay: bool | None = None

    def setTcpNoDelay(self, enabled: bool) -> None:
        self.no_delay = enabled


class SendingTests(SynchronousTestCase):
    """
    How the protocol writes: TCP_NODELAY, and answers released outside
    C{dataReceived} written at once (L{rmqha._sockets.send_now}).
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.later: list[Deferred[RemotingCommand | None]] = []

        def now(command: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
            return RemotingCommand(code=ResponseCode.SUCCESS, opaque=command.opaque, flag=1)

        def later(command: RemotingCommand, peer: IAddress | None) -> Deferred[RemotingCommand | None]:
            d: Deferred[RemotingCommand | None] = Deferred()
            self.later.append(d)
            return d

        self.protocol = RemotingProtocol(
            Dispatcher({RequestCode.GET_MAX_OFFSET: now, RequestCode.SEND_MESSAGE_V2: later}), self.clock
        )
        self.transport = _NoDelayTransport()
        self.protocol.makeConnection(self.transport)
        self.sent_now: list[list[bytes]] = []
        real = protocol.send_now

        def recording(transport: Any, chunks: list[bytes]) -> bool:
            self.sent_now.append(list(chunks))
            return real(transport, chunks)

        self.patch(protocol, "send_now", recording)

    def test_no_delay(self) -> None:
        self.assertIs(self.transport.no_delay, True)

    def test_answer_released_later_sent_at_once(self) -> None:
        """
        An answer that is ready inside C{dataReceived} is written as
        Twisted writes (with the others of that read); one released later
        (a send's replicas) goes out at once, with the request's opaque,
        the request's body not held meanwhile.
        """
        self.protocol.dataReceived(
            encode(RemotingCommand(code=RequestCode.GET_MAX_OFFSET, opaque=1))
            + encode(RemotingCommand(code=RequestCode.SEND_MESSAGE_V2, opaque=2, ext_fields={"a": "x"}, body=b"x" * 100))
        )
        self.assertEqual(self.sent_now, [])
        self.assertEqual(decode_frame(self.transport.value()).opaque, 1)
        self.transport.clear()
        (d,) = self.later
        d.callback(RemotingCommand(code=ResponseCode.SUCCESS, opaque=2, flag=1))
        (chunks,) = self.sent_now
        answer = decode_frame(b"".join(chunks))
        self.assertEqual((answer.code, answer.opaque, answer.is_response), (ResponseCode.SUCCESS, 2, True))
        self.assertEqual(self.transport.value(), b"".join(chunks))

    def test_answers_released_together_written_together(self) -> None:
        """
        Answers released while others of the connection are still being
        served (one report releasing a pipelining client's sends) are
        written as Twisted writes, to leave together; the last one,
        alone by then, goes out at once behind them, in order.
        """
        self.protocol.dataReceived(
            b"".join(
                encode(RemotingCommand(code=RequestCode.SEND_MESSAGE_V2, opaque=n, ext_fields={"a": "x"}))
                for n in (1, 2, 3)
            )
        )
        for n, d in zip((1, 2, 3), self.later):
            d.callback(RemotingCommand(code=ResponseCode.SUCCESS, opaque=n, flag=1))
        self.assertEqual(len(self.sent_now), 1)
        decoder = FrameDecoder()
        decoder.feed(self.transport.value())
        self.assertEqual(
            [c.opaque for c in iter(decoder.next_command, None)], [1, 2, 3]
        )

    def test_lone_request_sent_at_once(self) -> None:
        """
        A request of ours with none other pending is written at once; one
        sent while another waits (pipelined) is written as Twisted writes.
        """
        first = self.protocol.request(RemotingCommand(code=RequestCode.GET_MAX_OFFSET))
        self.assertEqual(len(self.sent_now), 1)
        second = self.protocol.request(RemotingCommand(code=RequestCode.GET_MAX_OFFSET))
        self.assertEqual(len(self.sent_now), 1)
        decoder = FrameDecoder()
        decoder.feed(self.transport.value())
        self.assertEqual([c.opaque for c in iter(decoder.next_command, None)], [0, 1])
        for d in (first, second):
            d.cancel()
            self.failureResultOf(d)


class ClientConnectedTests(SynchronousTestCase):
    """
    L{rmqha.remoting.protocol.RemotingClient} sends on its open connection
    without asking C{ClientService} for it; without one it waits for
    C{ClientService} as before.
    """

    def test_open_connection_used_directly(self) -> None:
        from tests.test_remoting_protocol import StringEndpoint, _written

        from rmqha.remoting._frames import make_response
        from rmqha.remoting.protocol import NO_HANDLER, RemotingClient

        clock = Clock()
        endpoint = StringEndpoint()
        client = RemotingClient(None, endpoint, NO_HANDLER, clock=clock, retry_policy=lambda n: 1.0)
        client.startService()
        self.addCleanup(client.stopService)
        asked: list[int] = []
        when_connected = client._service.whenConnected

        def counting(*args: Any, **kwargs: Any) -> Any:
            asked.append(1)
            return when_connected(*args, **kwargs)

        self.patch(client._service, "whenConnected", counting)
        for n in range(3):
            d = client.request(RemotingCommand(code=RequestCode.GET_MAX_OFFSET), timeout=5)
            protocol, transport = endpoint.connected[-1]
            (sent,) = _written(transport)
            transport.clear()
            protocol.dataReceived(encode(make_response(sent, ResponseCode.SUCCESS)))
            clock.advance(0)
            self.assertEqual(self.successResultOf(d).code, ResponseCode.SUCCESS)
        # (The endpoint connects at once, at the start.)
        self.assertEqual(asked, [])
        self.assertEqual(len(endpoint.connected), 1)
