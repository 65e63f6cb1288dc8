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

    @settings(max_examples=150, deadline=None)
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
        general = _outcome(lambda: _generic(code, ext))
        # (On the pure-Python codec and on the compiled one.)
        pure, compiled = _both(lambda: _outcome(lambda: read_send_header(code, ext)))
        self.assertEqual(pure, ("returned", general))
        self.assertEqual(compiled, pure)

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


# -- the compiled frame pieces and their pure twins ----------------------------

try:
    from rmqha.store import _speedups  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - the build tells why
    _speedups = None

from rmqha.remoting import sends  # noqa: E402
from rmqha.remoting.codes import LanguageCode, SerializeType  # noqa: E402
from rmqha.store import _record  # noqa: E402
from tests._helpers import PurePath  # noqa: E402


def _both(call: Any) -> tuple[Any, Any]:
    """
    What C{call} gives (or the type and text of what it raises) on the
    pure-Python codec, then on the compiled one.
    """

    def outcome() -> Any:
        try:
            return ("returned", call())
        except Exception as e:
            return ("raised", type(e).__name__, str(e))

    saved = _record._accel
    try:
        _record._accel = None
        pure = outcome()
        _record._accel = _speedups
        compiled = outcome()
    finally:
        _record._accel = saved
    return pure, compiled


_ANY_TEXT = st.text(max_size=12)
_JSON_STRINGS = st.builds(
    lambda text, ascii: json.dumps(text, ensure_ascii=ascii), _ANY_TEXT, st.booleans()
) | st.sampled_from(['"\\u0001"', '"\\ud800"', '"\\uD83D\\uDE00"', '"a\\/b"', '"\\x"', '"\x01"', '"é"'])
_JSON_NUMBERS = st.one_of(
    st.integers(-(1 << 70), 1 << 70).map(str),
    st.sampled_from(["2147483647", "2147483648", "-2147483648", "-2147483649", "-0", "01", "1.5", "1e3", "-"]),
)
_JSON_SCALARS = st.one_of(_JSON_STRINGS, _JSON_NUMBERS, st.sampled_from(["true", "false", "null", "NaN", "nul"]))
_JSON_VALUES = st.one_of(_JSON_SCALARS, st.sampled_from(["[]", "[1]", "{}", '{"a":"b"}']))
_EXT_OBJECTS = st.lists(st.tuples(_JSON_STRINGS, _JSON_VALUES), max_size=5).map(
    lambda items: "{" + ",".join(f"{k}:{v}" for k, v in items) + "}"
)
_KEYS = st.sampled_from(
    ["code", "language", "version", "opaque", "flag", "remark", "extFields", "serializeTypeCurrentRPC", "x", "co\\u0064e"]
)
_SPACE = st.sampled_from(["", "", " ", "\n\t ", "\x0b"])


@st.composite
def _json_headers(draw: Any) -> bytes:
    """
    JSON headers: mostly what a client writes (strings, int32s), with
    every other kind of member, escapes, white space, duplicate keys and
    damage mixed in.
    """
    members = []
    for key in draw(st.lists(_KEYS, max_size=9)):
        if key == "extFields":
            value = draw(_EXT_OBJECTS | _JSON_VALUES)
        elif key in ("language", "remark"):
            value = draw(_JSON_STRINGS | _JSON_VALUES)
        else:
            value = draw(_JSON_NUMBERS | _JSON_VALUES)
        members.append(f'{draw(_SPACE)}"{key}"{draw(_SPACE)}:{draw(_SPACE)}{value}{draw(_SPACE)}')
    text = draw(_SPACE) + "{" + ",".join(members) + "}" + draw(_SPACE)
    data = text.encode("utf-8", "surrogatepass")
    if data and draw(st.integers(0, 9)) == 0:
        at = draw(st.integers(0, len(data) - 1))
        data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1 :]
    return data


_SURROGATE_FREE = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_CLIENT_COMMANDS = st.builds(
    RemotingCommand,
    code=st.integers(-(1 << 31), (1 << 31) - 1),
    language=st.sampled_from(LanguageCode),
    version=st.integers(-(1 << 31), (1 << 31) - 1),
    opaque=st.integers(-(1 << 31), (1 << 31) - 1),
    flag=st.integers(-(1 << 31), (1 << 31) - 1),
    remark=st.none() | _SURROGATE_FREE,
    ext_fields=st.none() | st.dictionaries(_SURROGATE_FREE, _SURROGATE_FREE, max_size=14),
)
_EQUAL = settings(max_examples=100, deadline=None, derandomize=True)


class CompiledFrameTests(SynchronousTestCase):
    """
    The compiled C{json_command}, C{json_header} and C{send_header_v2}
    answer what their pure-Python twins answer, or hand the input back
    (C{None}) to the general code; decoding, encoding and reading a send
    header give the same result or the same refusal on both codecs.
    """

    def setUp(self) -> None:
        if _speedups is None:
            from twisted.trial.unittest import SkipTest

            raise SkipTest("rmqha.store._speedups is not built (see docs/development.md)")

    @_EQUAL
    @given(_json_headers())
    def test_json_command_agrees(self, header: bytes) -> None:
        compiled = _speedups.json_command(header)
        if compiled is not None:
            self.assertEqual(compiled, _frames.json_command(header))
            self.assertEqual([type(v) for v in compiled[6] or {}], [str] * len(compiled[6] or {}))
        pure, fast = _both(lambda: _frames._command_from_json(header, b"body"))
        self.assertEqual(pure, fast)

    @_EQUAL
    @given(_CLIENT_COMMANDS)
    def test_client_headers_compiled(self, command: RemotingCommand) -> None:
        """
        Every JSON header rmqha (or a Java client) writes, surrogates
        aside, is read by the compiled reader, to the same command.
        """
        frame = encode(command, SerializeType.JSON)
        header = frame[8:]
        compiled = _speedups.json_command(header)
        self.assertIsNotNone(compiled)
        self.assertEqual(compiled, _frames.json_command(header))
        pure, fast = _both(lambda: decode_frame(frame))
        self.assertEqual(pure, fast)
        self.assertEqual(fast, ("returned", command))

    @_EQUAL
    @given(
        _CLIENT_COMMANDS,
        st.none() | st.text(max_size=6),
        st.sampled_from([0, ResponseCode.SUCCESS, True, LanguageCode.JAVA]),
    )
    def test_json_header_agrees(self, command: RemotingCommand, remark: str | None, code: int) -> None:
        """
        The same header bytes on both codecs (the fastjson escapes,
        U+0080..U+009F, U+2028/9, an IntEnum code, a bool code); text
        that cannot be UTF-8 (a lone surrogate) fails the same way.
        """
        import attrs

        for changed in (command, attrs.evolve(command, remark=remark, code=code)):
            pure, fast = _both(lambda: encode(changed, SerializeType.JSON))
            self.assertEqual(pure, fast)

    def test_json_header_compiled(self) -> None:
        """
        The answer to a send is written by the compiled writer.
        """
        answer = RemotingCommand(
            code=ResponseCode.SUCCESS, opaque=7, flag=1,
            ext_fields={"MSG_REGION": "DefaultRegion", "TRACE_ON": "true", "msgId": "7F", "queueId": "1", "queueOffset": "0"},
        )
        order = _frames._java_order(tuple(answer.ext_fields or {}))
        written = _speedups.json_header(
            answer.code, answer.ext_fields, order, answer.flag, "JAVA", answer.opaque, None, answer.version
        )
        self.assertEqual(written, _frames._json_header_pure(answer, _frames.ExtOrder.JAVA_HASHMAP))

    @_EQUAL
    @given(
        numbers=st.dictionaries(st.sampled_from("defghjl"), _NUMBERS),
        texts=st.dictionaries(st.sampled_from("abcikmn"), _TEXTS | st.sampled_from(["TRUE", "tRuE", "\u0130"])),
        drop=st.sets(st.sampled_from("abcdefghijklmn")),
    )
    def test_send_header_v2_agrees(self, numbers: dict[str, str], texts: dict[str, str], drop: set[str]) -> None:
        ext = {
            "a": "PG", "b": "T", "c": "TBW102", "d": "4", "e": "1", "f": "0",
            "g": "1700000000123", "h": "0", **numbers, **texts,
        }
        for key in drop:
            ext.pop(key, None)
        compiled = _speedups.send_header_v2(ext)
        if compiled is not None:
            self.assertEqual(compiled, sends.send_header_v2(ext))
        self.assertEqual(
            *_both(lambda: sends.read_send_header(RequestCode.SEND_MESSAGE_V2, ext))
        )

    def test_send_header_v2_compiled(self) -> None:
        """
        What a client sends is read by the compiled reader; a mapping
        that is not a dict, or a value that is not a str, is handed back.
        """
        ext = {
            "a": "PG", "b": "T", "c": "TBW102", "d": "4", "e": "3", "f": "0",
            "g": "1700000000123", "h": "7", "i": "WAIT\x01true", "j": "2", "k": "false",
            "l": "16", "m": "TRUE", "n": "broker-a",
        }
        self.assertEqual(
            _speedups.send_header_v2(ext),
            ("PG", "T", "TBW102", 4, 3, 0, 1700000000123, 7, "WAIT\x01true", 2, False, True, 16, "broker-a"),
        )
        self.assertEqual(_speedups.send_header_v2(ext), sends.send_header_v2(ext))
        self.assertIsNone(_speedups.send_header_v2(dict(ext, d=_frames._JSONFloat("4"))))

        class Mapping(dict[str, str]):
            pass

        self.assertIsNone(_speedups.send_header_v2(Mapping(ext)))
        header = sends.read_send_header(RequestCode.SEND_MESSAGE_V2, ext)
        self.assertEqual(header, _generic(RequestCode.SEND_MESSAGE_V2, ext))
        self.assertEqual(hash(header), hash(_generic(RequestCode.SEND_MESSAGE_V2, ext)))


class PureJSONHeaderTests(PurePath, JSONHeaderTests):
    """L{JSONHeaderTests} on the pure-Python path."""
