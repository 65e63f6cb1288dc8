"""
Tests for L{rmqha.remoting._frames}: RocketMQ's remoting frames, JSON and
binary headers, the stream decoder's limits and errors, custom headers.
"""

from __future__ import annotations

import dataclasses
import json
import random
import struct

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from rmqha.remoting._frames import (
    MAX_FRAME_SIZE,
    BinaryHeaderError,
    CustomHeaderError,
    ExtOrder,
    FrameDecoder,
    FrameLengthError,
    FrameTooLargeError,
    HeaderFieldError,
    HeaderLengthError,
    Int32,
    JSONHeaderError,
    RemotingCommand,
    RemotingError,
    UnknownSerializeTypeError,
    decode_frame,
    encode,
    header_from_ext_fields,
    header_to_ext_fields,
    java_hashmap_order,
    make_response,
)
from rmqha.remoting.codes import LanguageCode, RequestCode, ResponseCode, SerializeType

_PROFILE = settings(deadline=None, derandomize=True, max_examples=100)

# The reference's example bytes (rocketmq-remoting-anchors.md 1.7):
# GET_MAX_OFFSET, opaque 7, and its reply.
_REQUEST_JSON = bytes.fromhex("000000a7000000a3") + (
    b'{"code":30,"extFields":{"bname":"broker-a","queueId":"0","topic":"TopicTest"},'
    b'"flag":0,"language":"JAVA","opaque":7,"serializeTypeCurrentRPC":"JSON","version":409}'
)
_REPLY_JSON = bytes.fromhex("0000007f0000007b") + (
    b'{"code":0,"extFields":{"offset":"42"},"flag":1,"language":"JAVA","opaque":7,'
    b'"serializeTypeCurrentRPC":"JSON","version":409}'
)
_REQUEST_BINARY = bytes.fromhex(
    "0000004e0100004a" "001e" "00" "0199" "00000007" "00000000" "00000000" "00000035"
) + (
    b"\x00\x05topic\x00\x00\x00\x09TopicTest"
    b"\x00\x07queueId\x00\x00\x00\x010"
    b"\x00\x05bname\x00\x00\x00\x08broker-a"
)
_REQUEST = RemotingCommand(
    code=RequestCode.GET_MAX_OFFSET,
    opaque=7,
    ext_fields={"topic": "TopicTest", "queueId": "0", "bname": "broker-a"},
)


def _decode_all(data: bytes, decoder: FrameDecoder | None = None) -> list[RemotingCommand]:
    decoder = decoder or FrameDecoder()
    decoder.feed(data)
    out = []
    while (command := decoder.next_command()) is not None:
        out.append(command)
    return out


class ReferenceExampleTests(SynchronousTestCase):
    """
    The example frames of the reference, byte for byte, both ways.
    """

    def test_json_request_encodes(self) -> None:
        """
        The GET_MAX_OFFSET request encodes to the reference's 171 bytes
        (extFields sorted as the example writes them).
        """
        self.assertEqual(encode(_REQUEST, ext_order=ExtOrder.SORTED), _REQUEST_JSON)
        self.assertEqual(len(_REQUEST_JSON), 171)

    def test_json_request_decodes(self) -> None:
        """
        The reference's JSON request decodes to the command, and encodes
        back to the same bytes.
        """
        (command,) = _decode_all(_REQUEST_JSON)
        self.assertEqual(command, _REQUEST)
        self.assertFalse(command.is_response)
        self.assertEqual(encode(command, ext_order=ExtOrder.INSERTION), _REQUEST_JSON)

    def test_json_reply(self) -> None:
        """
        The reply made for the request is the reference's 131 bytes, and
        they decode to it.
        """
        reply = make_response(_REQUEST, ResponseCode.SUCCESS, ext_fields={"offset": "42"})
        self.assertEqual(encode(reply), _REPLY_JSON)
        (decoded,) = _decode_all(_REPLY_JSON)
        self.assertEqual(decoded, reply)
        self.assertTrue(decoded.is_response)

    def test_binary_request(self) -> None:
        """
        The binary example (82 bytes) decodes to the same command and
        encodes back to the same bytes in its extFields order.
        """
        (command,) = _decode_all(_REQUEST_BINARY)
        self.assertEqual(command, attr_evolve(_REQUEST, serialize_type=SerializeType.ROCKETMQ))
        self.assertEqual(encode(command, ext_order=ExtOrder.INSERTION), _REQUEST_BINARY)
        self.assertEqual(
            encode(_REQUEST, SerializeType.ROCKETMQ, ExtOrder.INSERTION), _REQUEST_BINARY
        )

    def test_binary_reply(self) -> None:
        """
        The binary reply: code 0, flag 1, remark length 0, ext offset=42;
        a reply goes out in its request's serialize type.
        """
        request = decode_frame(_REQUEST_BINARY)
        reply = make_response(request, ResponseCode.SUCCESS, ext_fields={"offset": "42"})
        data = encode(reply)
        self.assertEqual(
            data[8:],
            bytes.fromhex("0000" "00" "0199" "00000007" "00000001" "00000000" "0000000e")
            + b"\x00\x06offset\x00\x00\x00\x0242",
        )
        self.assertEqual(data[4], 1)

    def test_java_hashmap_order(self) -> None:
        """
        By default extFields go out in the order Java's HashMap iterates
        them (fastjson sorts bean properties, not map keys).
        """
        data = encode(_REQUEST)
        self.assertEqual(
            data[8:],
            b'{"code":30,"extFields":{"queueId":"0","bname":"broker-a","topic":"TopicTest"},'
            b'"flag":0,"language":"JAVA","opaque":7,"serializeTypeCurrentRPC":"JSON","version":409}',
        )
        self.assertEqual(len(data), 171)


def attr_evolve(command: RemotingCommand, **changes: object) -> RemotingCommand:
    import attrs

    return attrs.evolve(command, **changes)  # type: ignore[misc]


class FastjsonEscapeTests(SynchronousTestCase):
    """
    Strings are escaped as fastjson escapes them.
    """

    def test_escapes(self) -> None:
        """
        Short escapes for quote, backslash, \\b \\t \\n \\f \\r; upper-case
        \\uXXXX for other control characters (a send's property separators
        \\x01 \\x02), DEL..U+009F, U+2028/9; slash and other text as is.
        """
        text = 'a"b\\c\b\t\n\f\r\x01\x02\x1f\x7f\x85\u2028\u2029 /é中'
        data = encode(RemotingCommand(code=1, remark=text))
        self.assertIn(
            b'"remark":"a\\"b\\\\c\\b\\t\\n\\f\\r\\u0001\\u0002\\u001F\\u007F\\u0085'
            b'\\u2028\\u2029 /' + "é中".encode() + b'"',
            data,
        )
        self.assertEqual(decode_frame(data).remark, text)


class JavaHashMapOrderTests(SynchronousTestCase):
    """
    L{java_hashmap_order} reproduces Java's iteration order.
    """

    def test_known_order(self) -> None:
        """
        Keys come out by bucket (of 16): from String.hashCode, "queueId"
        is in bucket 1, "bname" 5, "topic" 9, whatever the insertion order.
        """
        for keys in (["topic", "queueId", "bname"], ["bname", "topic", "queueId"]):
            self.assertEqual(java_hashmap_order(keys), ["queueId", "bname", "topic"])

    def test_same_bucket_keeps_insertion(self) -> None:
        """
        Keys sharing a bucket stay in insertion order ("Aa" and "BB" have
        the same String.hashCode).
        """
        self.assertEqual(java_hashmap_order(["BB", "Aa"]), ["BB", "Aa"])
        self.assertEqual(java_hashmap_order(["Aa", "BB"]), ["Aa", "BB"])

    def test_resizes(self) -> None:
        """
        With 13 keys the map has 32 buckets: "a".."m" (hashes 97..109) sit
        in buckets 1..13 of 32, in that order.
        """
        keys = [chr(c) for c in range(ord("m"), ord("a") - 1, -1)]
        self.assertEqual(java_hashmap_order(keys), sorted(keys))


_texts = st.text(max_size=20)
_ext = st.dictionaries(_texts, _texts, max_size=6)
_commands = st.builds(
    RemotingCommand,
    code=st.integers(-(1 << 15), (1 << 15) - 1),
    language=st.sampled_from(LanguageCode),
    version=st.integers(-(1 << 15), (1 << 15) - 1),
    opaque=st.integers(-(1 << 31), (1 << 31) - 1),
    flag=st.integers(-(1 << 31), (1 << 31) - 1),
    remark=st.none() | _texts,
    ext_fields=st.none() | _ext,
    body=st.binary(max_size=64),
    serialize_type=st.sampled_from(SerializeType),
)


def _binary_view(command: RemotingCommand) -> RemotingCommand:
    """
    What survives the binary header: empty strings are null.
    """
    ext = {k: v for k, v in (command.ext_fields or {}).items() if k and v}
    return attr_evolve(command, remark=command.remark or None, ext_fields=ext or None)


class RoundTripTests(SynchronousTestCase):
    """
    Encoding then decoding gives the command back.
    """

    @_PROFILE
    @given(_commands)
    def test_round_trip(self, command: RemotingCommand) -> None:
        """
        Any command round-trips (binary: empty strings read as null, as
        in Java), and encoding the decoded command gives the same bytes.
        """
        data = encode(command)
        (decoded,) = _decode_all(data)
        expected = _binary_view(command) if command.serialize_type is SerializeType.ROCKETMQ else command
        self.assertEqual(decoded, expected)
        self.assertEqual(dict(decoded.ext_fields or {}), dict(expected.ext_fields or {}))
        self.assertEqual(encode(decoded), data)

    @_PROFILE
    @given(st.lists(_commands, max_size=5), st.randoms(use_true_random=False))
    def test_chunking_is_irrelevant(self, commands: list[RemotingCommand], rng: random.Random) -> None:
        """
        Feeding a stream one byte at a time, in random chunks or all at
        once gives the same commands.
        """
        stream = b"".join(encode(c) for c in commands)
        whole = _decode_all(stream)
        self.assertEqual(len(whole), len(commands))
        decoder = FrameDecoder()
        bytewise = []
        for i in range(len(stream)):
            bytewise += _decode_all(stream[i : i + 1], decoder)
        self.assertEqual(bytewise, whole)
        decoder, chunked, at = FrameDecoder(), [], 0
        while at < len(stream):
            n = rng.randint(1, 40)
            chunked += _decode_all(stream[at : at + n], decoder)
            at += n
        self.assertEqual(chunked, whole)
        self.assertEqual(decoder.buffered, 0)

    def test_large_body(self) -> None:
        """
        A body of a few MiB passes whole.
        """
        command = RemotingCommand(code=103, body=bytes(range(256)) * 20000)
        self.assertEqual(_decode_all(encode(command)), [command])

    def test_unicode(self) -> None:
        """
        Non-ASCII text is UTF-8 as is (fastjson does not escape it);
        quotes and control characters are escaped.
        """
        command = RemotingCommand(code=1, remark='é "q" \n', ext_fields={"k\u00e9": "v\u4e2d"})
        data = encode(command)
        self.assertIn('"remark":"é \\"q\\" \\n"'.encode(), data)
        self.assertEqual(_decode_all(data), [command])


def _frame(header: bytes, body: bytes = b"", kind: int = 0, length: int | None = None) -> bytes:
    total = 4 + len(header) + len(body) if length is None else length
    return struct.pack(">iI", total, kind << 24 | len(header)) + header + body


def _binary(remark: bytes = b"", ext: bytes = b"", ext_length: int | None = None) -> bytes:
    return (
        struct.pack(">hbhiii", 10, 0, 409, 1, 0, len(remark))
        + remark
        + struct.pack(">i", len(ext) if ext_length is None else ext_length)
        + ext
    )


class MalformedTests(SynchronousTestCase):
    """
    Every malformed frame is a named L{RemotingError}, and the decoder
    stays failed.
    """

    def assertRefused(self, data: bytes, error: type[RemotingError], text: str, **kw: int) -> None:
        decoder = FrameDecoder(**kw)
        e = self.assertRaises(error, _decode_all, data, decoder)
        self.assertIn(text, str(e))
        self.assertIsInstance(e, RemotingError)
        # Stays failed: a later call raises the same error, holding nothing.
        self.assertRaises(error, decoder.next_command)
        self.assertRaises(error, decoder.feed, b"x")
        self.assertEqual(decoder.buffered, 0)

    def test_short_length(self) -> None:
        """
        A length below 4, negative included.
        """
        self.assertRefused(struct.pack(">i", 3), FrameLengthError, "frame length 3 is below 4")
        self.assertRefused(struct.pack(">i", -1), FrameLengthError, "frame length -1")

    def test_huge_length_refused_before_buffering(self) -> None:
        """
        A declared length above 16 MiB - 4 is refused as soon as its 4
        bytes are here (a gRPC client's "PRI " reads as 1347569952 + 4).
        """
        decoder = FrameDecoder()
        decoder.feed(b"PRI")
        self.assertIsNone(decoder.next_command())
        decoder.feed(b" ")
        e = self.assertRaises(FrameTooLargeError, decoder.next_command)
        self.assertIn("frame length 1347569952 is above the limit of 16777212", str(e))
        self.assertEqual(decoder.buffered, 0)

    def test_limit_is_netty_s(self) -> None:
        """
        16 777 212 is accepted (waiting for the bytes), 16 777 213 is not;
        the limit is configurable.
        """
        decoder = FrameDecoder()
        decoder.feed(struct.pack(">ii", MAX_FRAME_SIZE - 4, 100))
        self.assertIsNone(decoder.next_command())
        self.assertRefused(struct.pack(">i", MAX_FRAME_SIZE - 3), FrameTooLargeError, "16777213")
        self.assertRefused(
            _frame(b"{}", b"x" * 100), FrameTooLargeError, "above the limit of 60", max_frame_size=64
        )

    def test_header_limit(self) -> None:
        """
        A header above the header limit is refused from its first 8 bytes.
        """
        self.assertRefused(
            struct.pack(">ii", 5000, 4000), FrameTooLargeError, "header length 4000", max_header_size=1000
        )

    def test_unknown_serialize_type(self) -> None:
        """
        A header type byte other than 0 and 1.
        """
        self.assertRefused(_frame(b"{}", kind=2), UnknownSerializeTypeError, "type 2")
        self.assertRefused(_frame(b"{}", kind=0x80), UnknownSerializeTypeError, "type 128")

    def test_header_past_frame(self) -> None:
        """
        A header length reaching past the frame, found from the first 8
        bytes.
        """
        self.assertRefused(
            struct.pack(">ii", 10, 7), HeaderLengthError, "header length 7 reaches past the frame"
        )

    def test_bad_json(self) -> None:
        """
        Not JSON, not UTF-8, not an object, NaN, deep nesting, huge numbers.
        """
        for header, text in [
            (b"{", "does not parse"),
            (b"\xff{}", "not UTF-8"),
            (b"[1]", "JSON header is an array, not an object"),
            (b'{"code":NaN}', "does not parse"),
            (b"[" * 100000 + b"]" * 100000, "nests too deeply"),
            (b'{"code":' + b"9" * 5000 + b"}", "does not parse"),
            (b"", "does not parse"),
        ]:
            self.assertRefused(_frame(header), JSONHeaderError, text)

    def test_wrong_field_types(self) -> None:
        """
        Integer fields must be JSON integers in Java's int range; remark a
        string; extFields an object of strings or numbers.
        """
        for header, text in [
            (b'{"code":"30"}', """'code' is string "30", not an integer"""),
            (b'{"code":true}', "'code' is boolean true, not an integer"),
            (b'{"opaque":1.5}', "'opaque' is number 1.5, not an integer"),
            (b'{"flag":2147483648}', "'flag' 2147483648 is outside"),
            (b'{"remark":3}', "'remark' is number 3, not a string"),
            (b'{"extFields":[]}', "'extFields' is an array, not an object"),
            (b'{"extFields":{"a":{}}}', "extFields value of 'a' is an object, not a string"),
            (b'{"language":[]}', "'language' is an array, not a language name"),
        ]:
            self.assertRefused(_frame(header), HeaderFieldError, text)

    def test_lenient_json(self) -> None:
        """
        As fastjson reads them: numbers and booleans in extFields become
        their text (rocketmq-client-cpp sends numbers), nulls are absent,
        missing fields take Java's defaults, unknown keys are ignored, an
        unknown language is OTHER.
        """
        (command,) = _decode_all(
            _frame(
                b'{"extFields":{"queueId":3,"sysFlag":-1,"x":1.50,"b":true,"n":null},'
                b'"language":"NODE_JS","other":[1]}'
            )
        )
        self.assertEqual(
            command,
            RemotingCommand(
                code=0,
                version=0,
                language=LanguageCode.OTHER,
                ext_fields={"queueId": "3", "sysFlag": "-1", "x": "1.50", "b": "true"},
            ),
        )
        self.assertIs(type((command.ext_fields or {})["x"]), str)

    def test_bad_binary(self) -> None:
        """
        Binary headers cut short, lengths past the end, negative lengths,
        bytes after the ext fields, text that is not UTF-8.
        """
        entry = b"\x00\x01k\x00\x00\x00\x01v"
        for header, text in [
            (_binary()[:20], "shorter than its 21-byte fixed part"),
            (struct.pack(">hbhiii", 1, 0, 0, 0, 0, 50) + b"\0" * 4, "remark length 50"),
            (struct.pack(">hbhiii", 1, 0, 0, 0, 0, -1) + b"\0" * 4, "remark length -1"),
            (_binary(ext=entry, ext_length=100), "ext length 100 does not match the 8 bytes"),
            (_binary(ext=entry, ext_length=-1), "ext length -1"),
            (_binary(ext=entry + b"junk", ext_length=8), "ext length 8 does not match the 12"),
            (_binary(ext=b"\x00\x09k\x00\x00\x00\x01v"), "name length 9"),
            (_binary(ext=b"\xff\xffk\x00\x00\x00\x01v"), "name length -1"),
            (_binary(ext=b"\x00\x01k\x00\x00\x00\x09v"), "value length 9"),
            (_binary(ext=b"\x00\x01k\x00\x00"), "name length 1"),
            (_binary(ext=b"\x00"), "cut short"),
            (_binary(remark=b"\xc3"), "remark is not UTF-8"),
            (_binary(ext=b"\x00\x01\xff\x00\x00\x00\x01v"), "ext field name is not UTF-8"),
            (_binary(ext=b"\x00\x01k\x00\x00\x00\x01\xff"), "ext field 'k' is not UTF-8"),
        ]:
            self.assertRefused(_frame(header, kind=1), BinaryHeaderError, text)

    def test_binary_nulls(self) -> None:
        """
        Zero-length binary strings are null: no remark, absent ext entries.
        """
        ext = b"\x00\x00\x00\x00\x00\x01v" + b"\x00\x01k\x00\x00\x00\x00" + b"\x00\x01a\x00\x00\x00\x01b"
        (command,) = _decode_all(_frame(_binary(ext=ext), kind=1))
        self.assertIsNone(command.remark)
        self.assertEqual(command.ext_fields, {"a": "b"})
        (command,) = _decode_all(_frame(_binary(ext=b"\x00\x00\x00\x00\x00\x01v"), kind=1))
        self.assertIsNone(command.ext_fields)

    def test_decode_frame_length_mismatch(self) -> None:
        """
        L{decode_frame} takes exactly one frame.
        """
        self.assertRaises(FrameLengthError, decode_frame, _REQUEST_JSON + b"x")
        self.assertRaises(FrameLengthError, decode_frame, b"\0\0\0\4")

    @_PROFILE
    @given(st.binary(max_size=300))
    def test_garbage(self, data: bytes) -> None:
        """
        Random bytes give commands, wait, or raise a L{RemotingError};
        never anything else, never holding more than they gave.
        """
        decoder = FrameDecoder()
        try:
            _decode_all(data, decoder)
        except RemotingError:
            pass
        self.assertLessEqual(decoder.buffered, len(data))


class EncodeTests(SynchronousTestCase):
    """
    L{encode} refuses what Java's types cannot hold.
    """

    def test_ranges(self) -> None:
        """
        An opaque outside int32, a binary code or version outside int16.
        """
        self.assertRaises(ValueError, encode, RemotingCommand(code=1, opaque=1 << 31))
        self.assertRaises(
            ValueError, encode, RemotingCommand(code=40000), SerializeType.ROCKETMQ
        )
        self.assertRaises(
            ValueError, encode, RemotingCommand(code=1, version=1 << 15), SerializeType.ROCKETMQ
        )

    def test_no_ext_fields(self) -> None:
        """
        C{None} extFields and remark are omitted from JSON (HEART_BEAT).
        """
        data = encode(RemotingCommand(code=34, opaque=0))
        self.assertEqual(
            data[8:],
            b'{"code":34,"flag":0,"language":"JAVA","opaque":0,'
            b'"serializeTypeCurrentRPC":"JSON","version":409}',
        )


@dataclasses.dataclass
class _GetMaxOffsetHeader:
    topic: str
    queue_id: Int32 = dataclasses.field(metadata={"wire": "queueId"})
    bname: str | None = None
    committed: bool = False
    ratio: float | None = None
    offset: int | None = None


class CustomHeaderTests(SynchronousTestCase):
    """
    Custom headers to and from extFields, as makeCustomHeaderToNet and
    decodeCommandCustomHeader do.
    """

    def test_to_ext_fields(self) -> None:
        """
        Fields by wire name as text, booleans "true"/"false", None skipped.
        """
        header = _GetMaxOffsetHeader("TopicTest", 0, "broker-a", ratio=0.5)
        self.assertEqual(
            header_to_ext_fields(header),
            {"topic": "TopicTest", "queueId": "0", "bname": "broker-a", "committed": "false", "ratio": "0.5"},
        )
        self.assertRaises(ValueError, header_to_ext_fields, _GetMaxOffsetHeader("t", 1 << 31))

    def test_from_ext_fields(self) -> None:
        """
        Values parse as Java parses them; round trip.
        """
        header = _GetMaxOffsetHeader("T", -5, None, True, 1.5, 1 << 40)
        self.assertEqual(header_from_ext_fields(_GetMaxOffsetHeader, header_to_ext_fields(header)), header)
        parsed = header_from_ext_fields(
            _GetMaxOffsetHeader, {"topic": "T", "queueId": "+7", "committed": "TRUE", "ratio": "1e3"}
        )
        self.assertEqual(parsed, _GetMaxOffsetHeader("T", 7, None, True, 1000.0))
        self.assertFalse(
            header_from_ext_fields(_GetMaxOffsetHeader, {"topic": "T", "queueId": "1", "committed": "yes"}).committed
        )

    def test_errors_name_the_field(self) -> None:
        """
        A missing required field, an unparsable or out-of-range number.
        """
        for ext, text in [
            ({"queueId": "1"}, "custom header field 'topic' is missing"),
            ({"topic": "T", "queueId": "1_0"}, "'queueId' is '1_0', not an integer"),
            ({"topic": "T", "queueId": " 1"}, "'queueId' is ' 1', not an integer"),
            ({"topic": "T", "queueId": "2147483648"}, "'queueId' 2147483648 is outside"),
            ({"topic": "T", "queueId": "1", "offset": "9223372036854775808"}, "'offset' 9223372036854775808"),
            ({"topic": "T", "queueId": "1", "ratio": "1_0"}, "'ratio' is '1_0', not a number"),
        ]:
            e = self.assertRaises(CustomHeaderError, header_from_ext_fields, _GetMaxOffsetHeader, ext)
            self.assertIn(text, str(e))
        self.assertRaises(CustomHeaderError, header_from_ext_fields, _GetMaxOffsetHeader, None)

    def test_through_a_frame(self) -> None:
        """
        A header sent in a request comes out of the decoded frame.
        """
        header = _GetMaxOffsetHeader("TopicTest", 3, "broker-a")
        command = RemotingCommand(code=30, ext_fields=header_to_ext_fields(header))
        for kind in SerializeType:
            (decoded,) = _decode_all(encode(command, kind))
            self.assertEqual(header_from_ext_fields(_GetMaxOffsetHeader, decoded.ext_fields), header)


class CodesTests(SynchronousTestCase):
    """
    The numbers of L{rmqha.remoting.codes} are RocketMQ 4.9.8's.
    """

    def test_codes(self) -> None:
        """
        A sample of request and response codes (RequestCode.java,
        ResponseCode.java), the language bytes in declaration order, the
        serialize type bytes.
        """
        self.assertEqual(
            [
                RequestCode.GET_ALL_TOPIC_CONFIG,
                RequestCode.GET_ALL_CONSUMER_OFFSET,
                RequestCode.GET_ALL_DELAY_OFFSET,
                RequestCode.REGISTER_BROKER,
                RequestCode.UNREGISTER_BROKER,
                RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
                RequestCode.QUERY_DATA_VERSION,
                RequestCode.GET_BROKER_RUNTIME_INFO,
                RequestCode.UPDATE_AND_CREATE_TOPIC,
            ],
            [21, 43, 45, 103, 104, 201, 322, 28, 17],
        )
        self.assertEqual(
            [ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR, ResponseCode.SYSTEM_BUSY,
             ResponseCode.REQUEST_CODE_NOT_SUPPORTED, ResponseCode.TOPIC_NOT_EXIST,
             ResponseCode.PULL_NOT_FOUND, ResponseCode.FLOW_CONTROL],
            [0, 1, 2, 3, 17, 19, 215],
        )
        self.assertEqual(
            [c.name for c in LanguageCode],
            "JAVA CPP DOTNET PYTHON DELPHI ERLANG RUBY OTHER HTTP GO PHP OMS RUST".split(),
        )
        self.assertEqual([int(c) for c in LanguageCode], list(range(13)))
        self.assertEqual((SerializeType.JSON, SerializeType.ROCKETMQ), (0, 1))
