# -*- test-case-name: tests.test_remoting_frames -*-
"""
RocketMQ's remoting frames, bytes in and commands out, with no I/O and no
Twisted (the remoting counterpart of L{rmqha.ha._wire}).

One frame, every field big-endian::

    +----------------+----------------------------+----------------+--------+
    | length  int32  | type int8 | headerLen int24 | header         | body   |
    +----------------+----------------------------+----------------+--------+

C{length} counts everything after itself (4 + headerLen + body).  The
header is JSON (type 0, what every 4.9.8 process sends unless told
otherwise) or RocketMQ's binary layout (type 1)::

    code int16 | language int8 | version int16 | opaque int32 | flag int32 |
    remark (int32 length, UTF-8) | ext (int32 length, then repeated
    int16 keyLength, key, int32 valueLength, value)

Both carry one L{RemotingCommand}.  L{encode} writes what Java's
C{RemotingCommand.fastEncodeHeader} writes for the same command;
L{FrameDecoder} cuts a byte stream into commands, checking every size
before it buffers for it, and refuses anything malformed with a
L{RemotingError} subclass naming what is wrong.  docs/remoting.md lists
where it is stricter than RocketMQ and why.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import re
import struct
import typing
from collections.abc import Mapping
from typing import Any, Final, TypeVar

import attrs

from rmqha._javahash import java_string_hash
from rmqha.remoting.codes import VERSION_4_9_8, LanguageCode, SerializeType
from rmqha.store import _record as _codec

__all__ = [
    "MAX_FRAME_SIZE",
    "MAX_HEADER_SIZE",
    "FLAG_RESPONSE",
    "FLAG_ONEWAY",
    "Int32",
    "ExtOrder",
    "RemotingError",
    "FrameLengthError",
    "FrameTooLargeError",
    "UnknownSerializeTypeError",
    "HeaderLengthError",
    "JSONHeaderError",
    "BinaryHeaderError",
    "HeaderFieldError",
    "CustomHeaderError",
    "RemotingCommand",
    "make_response",
    "response_to",
    "encode",
    "decode_frame",
    "FrameDecoder",
    "java_hashmap_order",
    "header_to_ext_fields",
    "header_from_ext_fields",
]

#: The largest whole frame (its 4-byte length field included) a RocketMQ
#: process accepts: C{NettyDecoder}'s C{LengthFieldBasedFrameDecoder(16777216,
#: 0, 4, 0, 4)}, so the largest length field is 16 777 212.
MAX_FRAME_SIZE: Final = 16 * 1024 * 1024
#: The largest header rmqha decodes (RocketMQ has no limit of its own but the
#: frame's).  Headers are a few hundred bytes; this bounds what a hostile
#: JSON header can cost once parsed into Python objects.
MAX_HEADER_SIZE: Final = 1024 * 1024
#: C{flag} bit 0: the command is a response.
FLAG_RESPONSE: Final = 1
#: C{flag} bit 1: the request wants no response.
FLAG_ONEWAY: Final = 2

_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT16 = (-(1 << 15), (1 << 15) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)
_PREFIX = struct.Struct(">ii")
_FIXED = struct.Struct(">hbhiii")  # code, language, version, opaque, flag, remark length
_FIXED_SIZE = _FIXED.size + 4  # ... and the ext length
_SHORT = struct.Struct(">h")
_INT = struct.Struct(">i")


class _Int32Marker:
    def __repr__(self) -> str:
        return "Int32"


#: A custom header field that is a Java C{int} (range-checked when decoded
#: and encoded); a plain C{int} field is a Java C{long}.
Int32 = typing.Annotated[int, _Int32Marker()]


class ExtOrder(enum.Enum):
    """
    The order L{encode} writes C{extFields} in.  Readers do not care; it
    matters only for byte-for-byte comparisons with Java.
    """

    #: The iteration order of the Java C{HashMap} Java's encoder walks,
    #: filled in the mapping's order (see L{java_hashmap_order}).
    JAVA_HASHMAP = "hashmap"
    #: Sorted by key.
    SORTED = "sorted"
    #: The mapping's own order.
    INSERTION = "insertion"


class RemotingError(ValueError):
    """
    A peer sent a frame the remoting protocol does not allow; the text says
    what.  Every decoding error is one of its subclasses.
    """


class FrameLengthError(RemotingError):
    """
    A frame's length field is smaller than the 4 bytes of its own header
    length field (negative included).
    """


class FrameTooLargeError(RemotingError):
    """
    A frame's length field, or its header length, is above the limit: the
    frame is refused before any of it is buffered.
    """


class UnknownSerializeTypeError(RemotingError):
    """
    A frame's header type byte is neither 0 (JSON) nor 1 (ROCKETMQ).
    """


class HeaderLengthError(RemotingError):
    """
    A frame's header length reaches past the frame.
    """


class JSONHeaderError(RemotingError):
    """
    A JSON header is not UTF-8 JSON text, or not an object.
    """


class BinaryHeaderError(RemotingError):
    """
    A ROCKETMQ binary header is cut short, has a length reaching past its
    end or bytes after its ext fields, or text that is not UTF-8.
    """


class HeaderFieldError(RemotingError):
    """
    A header field holds a value of the wrong type or out of range.
    """


class CustomHeaderError(RemotingError):
    """
    C{extFields} do not make the custom header asked for: a required field
    is missing, or a value does not parse as its field's type.
    """


def _check_int(name: str, value: int, bounds: tuple[int, int]) -> None:
    if not bounds[0] <= value <= bounds[1]:
        raise ValueError(f"{name} {value} is outside {bounds[0]}..{bounds[1]}")


@attrs.frozen
class RemotingCommand:
    """
    One request or response, as RocketMQ's C{RemotingCommand} holds it.

    @ivar code: the request code in a request, the response code in a
        response.
    @ivar opaque: the request's id; a response carries its request's.
    @ivar flag: bit 0 response, bit 1 oneway.
    @ivar remark: text (usually why a request failed), or C{None}.
    @ivar ext_fields: the custom header as strings, or C{None} (which JSON
        omits and binary cannot tell from empty).
    @ivar serialize_type: how the command came in; L{encode} writes it so
        by default, and a response goes out the way its request came in.
    """

    code: int
    language: LanguageCode = LanguageCode.JAVA
    version: int = VERSION_4_9_8
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: Mapping[str, str] | None = None
    body: bytes = b""
    serialize_type: SerializeType = SerializeType.JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def ext(self, name: str) -> str | None:
        """
        One C{extFields} value, or C{None}.
        """
        return None if self.ext_fields is None else self.ext_fields.get(name)


def make_response(
    request: RemotingCommand,
    code: int,
    remark: str | None = None,
    ext_fields: Mapping[str, str] | None = None,
    body: bytes = b"",
) -> RemotingCommand:
    """
    The response to C{request}: its opaque and serialize type, flag bit 0
    set, rmqha's language and version (as C{NettyRemotingAbstract} does).
    """
    return RemotingCommand(
        code, LanguageCode.JAVA, VERSION_4_9_8, request.opaque, FLAG_RESPONSE, remark, ext_fields, body,
        request.serialize_type,
    )


def response_to(
    opaque: int,
    serialize_type: SerializeType,
    code: int,
    remark: str | None = None,
    ext_fields: Mapping[str, str] | None = None,
    body: bytes = b"",
) -> RemotingCommand:
    """
    L{make_response} to the request of C{opaque} and C{serialize_type},
    for who keeps only those of a request.
    """
    return RemotingCommand(
        code, LanguageCode.JAVA, VERSION_4_9_8, opaque, FLAG_RESPONSE, remark, ext_fields, body, serialize_type
    )


@functools.lru_cache(maxsize=4096)  # (keys repeat: header and property names)
def _java_string_hash(text: str) -> int:
    # (Unsigned: the bits Java's HashMap spreads.)
    return java_string_hash(text) & 0xFFFFFFFF


def java_hashmap_order(keys: typing.Iterable[str]) -> list[str]:
    """
    C{keys} in the order a Java C{HashMap<String, String>} filled with them
    in this order iterates them: by bucket (C{hash ^ hash >>> 16} masked
    by the capacity, 16 doubled while the size exceeds 3/4 of it), and by
    insertion within a bucket (resizes keep that order).  Buckets of 8 or
    more keys become trees in Java and may iterate otherwise; 3-key maps
    never get there.
    """
    return list(_java_order(tuple(keys)))


@functools.lru_cache(maxsize=1024)  # (the same few key sets, message after message)
def _java_order(keys: tuple[str, ...]) -> tuple[str, ...]:
    ordered = list(dict.fromkeys(keys))
    capacity = 16
    while len(ordered) > capacity * 3 // 4:
        capacity *= 2
    mask = capacity - 1

    def bucket(key: str) -> int:
        h = _java_string_hash(key)
        return (h ^ (h >> 16)) & mask

    return tuple(sorted(ordered, key=bucket))  # stable: insertion order within a bucket


def _ordered_items(ext: Mapping[str, str], order: ExtOrder) -> list[tuple[str, str]]:
    if order is ExtOrder.SORTED:
        return sorted(ext.items())
    if order is ExtOrder.JAVA_HASHMAP:
        return [(k, ext[k]) for k in _java_order(tuple(ext))]
    return list(ext.items())


# fastjson's escapes (SerializeWriter.writeStringWithDoubleQuote, default
# features): the short forms for " \\ \b \t \n \f \r, \uXXXX in upper case
# for the other control characters, DEL to U+009F, U+2028 and U+2029; the
# rest as is.
_ESCAPES = {c: f"\\u{c:04X}" for c in [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029]}
_ESCAPES.update(
    {ord(c): "\\" + e for c, e in zip('"\\\b\t\n\f\r', '"\\btnfr')}
)


def _json_string(text: str) -> str:
    return '"' + text.translate(_ESCAPES) + '"'


@functools.lru_cache(maxsize=1024)  # (names repeat: header fields)
def _json_name(text: str) -> str:
    return _json_string(text)


#: Each language's name (C{Enum.name} is a property, slow on a hot path).
_LANGUAGE_NAMES: Final = {language: language.name for language in LanguageCode}


def _json_header(command: RemotingCommand, order: ExtOrder) -> bytes:
    accel = _codec._accel  # the compiled codec, or None (RMQHA_PURE=1)
    if accel is not None and order is ExtOrder.JAVA_HASHMAP:
        ext = command.ext_fields
        header: bytes | None = accel.json_header(
            command.code,
            ext,
            None if ext is None else _java_order(tuple(ext)),
            command.flag,
            _LANGUAGE_NAMES.get(command.language),
            command.opaque,
            command.remark,
            command.version,
        )
        if header is not None:
            return header
    return _json_header_pure(command, order)


def _json_header_pure(command: RemotingCommand, order: ExtOrder) -> bytes:
    # (The reference: the compiled json_header writes the same bytes or
    # hands the command back here.)
    # fastjson's defaults: bean properties sorted, nulls omitted, enums by
    # name, and serializeTypeCurrentRPC because it has a public getter.
    parts = [f'{{"code":{command.code}']
    if command.ext_fields is not None:
        ext = command.ext_fields
        ordered = _java_order(tuple(ext)) if order is ExtOrder.JAVA_HASHMAP else [
            k for k, _ in _ordered_items(ext, order)
        ]
        items = ",".join(
            [f'{_json_name(k)}:"{ext[k].translate(_ESCAPES)}"' for k in ordered]
        )
        parts.append(f',"extFields":{{{items}}}')
    parts.append(f',"flag":{command.flag},"language":"{command.language.name}"')
    parts.append(f',"opaque":{command.opaque}')
    if command.remark is not None:
        parts.append(f',"remark":{_json_string(command.remark)}')
    parts.append(f',"serializeTypeCurrentRPC":"JSON","version":{command.version}}}')
    return "".join(parts).encode("utf-8")


def _binary_header(command: RemotingCommand, order: ExtOrder) -> bytes:
    _check_int("code", command.code, _INT16)
    _check_int("version", command.version, _INT16)
    remark = command.remark.encode("utf-8") if command.remark else b""
    ext = bytearray()
    if command.ext_fields:
        for key, value in _ordered_items(command.ext_fields, order):
            if not key or not value:
                continue  # a zero-length string reads as null: absent
            k = key.encode("utf-8")
            if len(k) > _INT16[1]:
                raise ValueError(f"ext field name of {len(k)} bytes is too long for an int16")
            v = value.encode("utf-8")
            ext += _SHORT.pack(len(k)) + k + _INT.pack(len(v)) + v
    return (
        _FIXED.pack(
            command.code,
            int(command.language),
            command.version,
            command.opaque,
            command.flag,
            len(remark),
        )
        + remark
        + _INT.pack(len(ext))
        + bytes(ext)
    )


def encode(
    command: RemotingCommand,
    serialize_type: SerializeType | None = None,
    ext_order: ExtOrder = ExtOrder.JAVA_HASHMAP,
) -> bytes:
    """
    The frame carrying C{command}, as Java's C{fastEncodeHeader} writes it.

    @param serialize_type: the header's encoding (default: the command's).
    @param ext_order: the order of C{extFields} (default: Java's).
    @raise ValueError: a field does not fit its Java type.
    """
    low, high = _INT32
    if not (
        low <= command.code <= high
        and low <= command.version <= high
        and low <= command.opaque <= high
        and low <= command.flag <= high
    ):
        _check_int("code", command.code, _INT32)
        _check_int("version", command.version, _INT32)
        _check_int("opaque", command.opaque, _INT32)
        _check_int("flag", command.flag, _INT32)
    kind = command.serialize_type if serialize_type is None else serialize_type
    header = (
        _binary_header(command, ext_order)
        if kind is SerializeType.ROCKETMQ
        else _json_header(command, ext_order)
    )
    if len(header) > 0xFFFFFF:
        raise ValueError(f"header of {len(header)} bytes does not fit 24 bits")
    length = 4 + len(header) + len(command.body)
    _check_int("frame length", length, _INT32)
    return _PREFIX.pack(length, kind << 24 | len(header)) + header + command.body


# -- decoding ------------------------------------------------------------------


def _json_kind(value: Any) -> str:
    """
    A parsed JSON value in words, for errors: C{string "30"}, C{number 1.5},
    C{an array}...
    """
    if isinstance(value, _JSONFloat):
        return f"number {str(value)[:40]}"
    if isinstance(value, str):
        return f"string {json.dumps(value[:40])}"
    if value is True or value is False:
        return f"boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"number {str(value)[:40]}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "null"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _json_int(obj: Mapping[str, Any], name: str, default: int, bounds: tuple[int, int]) -> int:
    value = obj.get(name)
    if value is None:
        return default
    if type(value) is not int:
        raise HeaderFieldError(
            f"header field {name!r} is {_json_kind(value)}, not an integer"
        )
    if not bounds[0] <= value <= bounds[1]:
        raise HeaderFieldError(f"header field {name!r} {value} is outside {bounds[0]}..{bounds[1]}")
    return value


def _language(value: Any) -> LanguageCode:
    # Java reads an unknown name as null; rmqha keeps OTHER, which a reply
    # never depends on.
    if value is None:
        return LanguageCode.JAVA
    if isinstance(value, str):
        return LanguageCode.__members__.get(value, LanguageCode.OTHER)
    if type(value) is int:
        try:
            return LanguageCode(value)
        except ValueError:
            return LanguageCode.OTHER
    raise HeaderFieldError(
        f"header field 'language' is {_json_kind(value)}, not a language name"
    )


def _ext_value(key: str, value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if value is None:
        return None
    if value is True or value is False:
        return "true" if value else "false"
    if type(value) is int:
        return str(value)
    # (Floats arrive as their JSON text: see parse_float below.)
    raise HeaderFieldError(
        f"extFields value of {key!r} is {_json_kind(value)}, not a string or number"
    )


def _decode_json_header(header: bytes) -> dict[str, Any]:
    try:
        obj = _JSON_DECODER.decode(header.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise JSONHeaderError(f"JSON header is not UTF-8 (byte {e.start})") from None
    except RecursionError:
        raise JSONHeaderError("JSON header nests too deeply") from None
    except ValueError as e:
        raise JSONHeaderError(f"JSON header does not parse: {e}") from None
    if not isinstance(obj, dict):
        raise JSONHeaderError(f"JSON header is {_json_kind(obj)}, not an object")
    return obj


class _JSONFloat(str):
    """
    A JSON number with a fraction or exponent, kept as its text (an
    extFields value becomes exactly that text; anywhere else it is refused
    as not an integer).
    """


# (One decoder for every header: json.loads with arguments builds a new
# decoder and scanner per call.)
_JSON_DECODER: Final = json.JSONDecoder(parse_float=_JSONFloat, parse_constant=_reject_constant)


def _command_from_json(header: bytes, body: bytes) -> RemotingCommand:
    accel = _codec._accel  # the compiled codec, or None (RMQHA_PURE=1)
    if accel is not None:
        # (A header of strings and int32s, what every client writes: read
        # in one go.  Anything else, errors included, is read below.)
        fast = accel.json_command(header)
        if fast is not None:
            code, language, version, opaque, flag, remark, ext = fast
            return RemotingCommand(
                code,
                LanguageCode.JAVA if language is None else _LANGUAGES.get(language, LanguageCode.OTHER),
                version,
                opaque,
                flag,
                remark,
                ext,
                body,
                SerializeType.JSON,
            )
    return _command_from_json_pure(header, body)


_LANGUAGES: Final = LanguageCode.__members__


def json_command(header: bytes) -> tuple[int, str | None, int, int, int, str | None, dict[str, str] | None] | None:
    """
    The pure-Python twin of the compiled C{json_command} (its reference,
    for tests): a JSON header's C{(code, language name or None, version,
    opaque, flag, remark, extFields)} when the header is an object whose
    C{code}, C{version}, C{opaque} and C{flag} are JSON integers in the
    int32 range (or null), C{language} and C{remark} strings (or null),
    C{extFields} an object of strings (or null); C{None} otherwise.  The
    compiled one answers the same or C{None} (it leaves a few rare valid
    headers to the general reader: surrogate escapes, integers of more
    than 18 digits, members it does not read that are arrays, objects or
    floats).
    """
    try:
        obj = _decode_json_header(header)
    except RemotingError:
        return None
    ints = []
    for name in ("code", "version", "opaque", "flag"):
        value = obj.get(name)
        if value is not None and (type(value) is not int or not _INT32[0] <= value <= _INT32[1]):
            return None
        ints.append(0 if value is None else value)
    language, remark, ext = obj.get("language"), obj.get("remark"), obj.get("extFields")
    if any(v is not None and type(v) is not str for v in (language, remark)):
        return None
    if ext is not None and (type(ext) is not dict or any(type(v) is not str for v in ext.values())):
        return None
    return ints[0], language, ints[1], ints[2], ints[3], remark, ext


def _command_from_json_pure(header: bytes, body: bytes) -> RemotingCommand:
    obj = _decode_json_header(header)
    remark = obj.get("remark")
    if remark is not None and (not isinstance(remark, str) or isinstance(remark, _JSONFloat)):
        raise HeaderFieldError(
            f"header field 'remark' is {_json_kind(remark)}, not a string"
        )
    raw_ext = obj.get("extFields")
    ext: dict[str, str] | None = None
    if raw_ext is not None:
        if not isinstance(raw_ext, dict):
            raise HeaderFieldError(
                f"header field 'extFields' is {_json_kind(raw_ext)}, not an object"
            )
        ext = raw_ext
        for value in raw_ext.values():
            if type(value) is not str:  # (a _JSONFloat is not: the loop below)
                ext = {}
                for key, value in raw_ext.items():
                    text = _ext_value(key, value)
                    if text is not None:
                        ext[key] = str(text)
                break
    return RemotingCommand(
        code=_json_int(obj, "code", 0, _INT32),
        language=_language(obj.get("language")),
        version=_json_int(obj, "version", 0, _INT32),
        opaque=_json_int(obj, "opaque", 0, _INT32),
        flag=_json_int(obj, "flag", 0, _INT32),
        remark=None if remark is None else str(remark),
        ext_fields=ext,
        body=body,
        serialize_type=SerializeType.JSON,
    )


def _utf8(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BinaryHeaderError(f"{what} is not UTF-8 (byte {e.start})") from None


def _command_from_binary(header: bytes, body: bytes) -> RemotingCommand:
    size = len(header)
    if size < _FIXED_SIZE:
        raise BinaryHeaderError(
            f"binary header of {size} bytes is shorter than its {_FIXED_SIZE}-byte fixed part"
        )
    code, language, version, opaque, flag, remark_length = _FIXED.unpack_from(header, 0)
    at = _FIXED.size
    if not 0 <= remark_length <= size - at - 4:
        raise BinaryHeaderError(
            f"binary header remark length {remark_length} reaches past the header "
            f"({size - at - 4} bytes left)"
        )
    # A zero-length string is null (RocketMQSerializable.readStr).
    remark = _utf8(header[at : at + remark_length], "remark") if remark_length else None
    at += remark_length
    (ext_length,) = _INT.unpack_from(header, at)
    at += 4
    if ext_length != size - at:
        raise BinaryHeaderError(
            f"binary header ext length {ext_length} does not match the {size - at} bytes left"
        )
    ext: dict[str, str] | None = None
    if ext_length:
        ext = {}
        while at < size:
            if at + 2 > size:
                raise BinaryHeaderError(f"ext field at header byte {at} is cut short")
            (key_length,) = _SHORT.unpack_from(header, at)
            at += 2
            if not 0 <= key_length <= size - at - 4:
                raise BinaryHeaderError(
                    f"ext field name length {key_length} at header byte {at - 2} "
                    f"reaches past the header"
                )
            key = header[at : at + key_length]
            at += key_length
            (value_length,) = _INT.unpack_from(header, at)
            at += 4
            if not 0 <= value_length <= size - at:
                raise BinaryHeaderError(
                    f"ext field value length {value_length} at header byte {at - 4} "
                    f"reaches past the header"
                )
            value = header[at : at + value_length]
            at += value_length
            if key_length and value_length:  # null keys and values: absent
                name = _utf8(key, "ext field name")
                ext[name] = _utf8(value, f"ext field {name!r}")
    try:
        lang = LanguageCode(language & 0xFF)
    except ValueError:
        lang = LanguageCode.OTHER
    return RemotingCommand(
        code=code,
        language=lang,
        version=version,
        opaque=opaque,
        flag=flag,
        remark=remark,
        ext_fields=ext or None,  # all entries null: none, as encode writes it
        body=body,
        serialize_type=SerializeType.ROCKETMQ,
    )


def _check_prefix(
    length: int, max_frame_size: int
) -> None:
    if length < 4:
        raise FrameLengthError(f"frame length {length} is below 4 (the header length field)")
    if length > max_frame_size - 4:
        raise FrameTooLargeError(
            f"frame length {length} is above the limit of {max_frame_size - 4} "
            f"(frames of at most {max_frame_size} bytes)"
        )


_SERIALIZE_TYPES: Final = (SerializeType.JSON, SerializeType.ROCKETMQ)


def _check_header_field(length: int, second: int, max_header_size: int) -> tuple[SerializeType, int]:
    kind = (second >> 24) & 0xFF
    header_length = second & 0xFFFFFF
    if kind not in (0, 1):
        raise UnknownSerializeTypeError(
            f"frame header type {kind} is neither 0 (JSON) nor 1 (ROCKETMQ)"
        )
    if header_length > length - 4:
        raise HeaderLengthError(
            f"frame header length {header_length} reaches past the frame "
            f"({length - 4} bytes after the header length field)"
        )
    if header_length > max_header_size:
        raise FrameTooLargeError(
            f"frame header length {header_length} is above the limit of {max_header_size}"
        )
    return _SERIALIZE_TYPES[kind], header_length


def decode_frame(
    frame: bytes, max_frame_size: int = MAX_FRAME_SIZE, max_header_size: int = MAX_HEADER_SIZE
) -> RemotingCommand:
    """
    The command in one whole frame (its length field included, nothing
    after it).

    @raise RemotingError: the frame is malformed.
    """
    if len(frame) < 8:
        raise FrameLengthError(f"a frame of {len(frame)} bytes is shorter than 8")
    length, second = _PREFIX.unpack_from(frame, 0)
    _check_prefix(length, max_frame_size)
    if length != len(frame) - 4:
        raise FrameLengthError(f"frame length {length} does not match its {len(frame) - 4} bytes")
    return _decode(frame[8:], length, second, max_header_size)


def _decode(rest: bytes, length: int, second: int, max_header_size: int) -> RemotingCommand:
    kind, header_length = _check_header_field(length, second, max_header_size)
    return _decode_checked(rest, kind, header_length)


def _decode_checked(rest: bytes, kind: SerializeType, header_length: int) -> RemotingCommand:
    header, body = rest[:header_length], rest[header_length:]
    if kind is SerializeType.JSON:
        return _command_from_json(header, body)
    return _command_from_binary(header, body)


class FrameDecoder:
    """
    Commands out of a byte stream, one at a time (Twisted's
    C{IntNStringReceiver} loop without the protocol).

    The length field is checked as soon as its 4 bytes are here and the
    header type and length as soon as theirs are, so a frame declaring more
    than the limit is refused before a byte of it is buffered; the decoder
    holds at most one frame's bytes plus the last read.  After an error it
    raises that error again on every call: the stream cannot be resynced.
    """

    def __init__(
        self, max_frame_size: int = MAX_FRAME_SIZE, max_header_size: int = MAX_HEADER_SIZE
    ) -> None:
        if not 8 <= max_frame_size <= (1 << 31) + 3:
            raise ValueError(f"max frame size {max_frame_size} is outside 8..{(1 << 31) + 3}")
        if not 0 <= max_header_size <= 0xFFFFFF:
            raise ValueError(f"max header size {max_header_size} is outside 0..{0xFFFFFF}")
        self.max_frame_size = max_frame_size
        self.max_header_size = max_header_size
        self._buffer = bytearray()
        self._offset = 0
        self._checked = False  # the pending frame's prefix has been checked
        self._error: RemotingError | None = None

    @property
    def buffered(self) -> int:
        """
        Bytes received and not yet returned as commands.
        """
        return len(self._buffer) - self._offset

    def feed(self, data: bytes) -> None:
        """
        Add received bytes; take commands with L{next_command}.

        @raise RemotingError: an earlier call found the stream malformed.
        """
        if self._error is not None:
            raise self._error
        self._buffer += data

    def next_command(self) -> RemotingCommand | None:
        """
        The next whole command, or C{None} until more bytes arrive.

        @raise RemotingError: the stream is malformed.
        """
        if self._error is not None:
            raise self._error
        try:
            return self._next()
        except RemotingError as e:
            self._error = e
            self._buffer = bytearray()
            self._offset = 0
            raise

    def _next(self) -> RemotingCommand | None:
        buffer, offset = self._buffer, self._offset
        available = len(buffer) - offset
        if available >= 8 and not self._checked:
            # (The common case: the whole prefix here; checked once.)
            length, second = _PREFIX.unpack_from(buffer, offset)
            _check_prefix(length, self.max_frame_size)
            kind, header_length = _check_header_field(length, second, self.max_header_size)
            if available < 4 + length:
                self._checked = True
                self._compact()
                return None
            with memoryview(buffer) as view:  # one copy, not two
                rest = bytes(view[offset + 8 : offset + 4 + length])
            self._offset = offset + 4 + length
            return _decode_checked(rest, kind, header_length)
        if available >= 4 and not self._checked:
            length = int.from_bytes(buffer[offset : offset + 4], "big", signed=True)
            _check_prefix(length, self.max_frame_size)
            if available >= 8:
                second = int.from_bytes(buffer[offset + 4 : offset + 8], "big")
                _check_header_field(length, second, self.max_header_size)
                self._checked = True
        if not self._checked:
            self._compact()
            return None
        length, second = _PREFIX.unpack_from(buffer, offset)
        if available < 4 + length:
            self._compact()
            return None
        with memoryview(buffer) as view:  # one copy, not two
            rest = bytes(view[offset + 8 : offset + 4 + length])
        self._offset = offset + 4 + length
        self._checked = False
        return _decode(rest, length, second, self.max_header_size)

    def _compact(self) -> None:
        if self._offset:
            del self._buffer[: self._offset]
            self._offset = 0


# -- custom headers ----------------------------------------------------------

_H = TypeVar("_H")
_INTEGER = re.compile(r"[+-]?[0-9]+\Z")
_DOUBLE = re.compile(
    r"[+-]?(NaN|Infinity|([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?)[fFdD]?\Z"
)


def _wire_name(field: dataclasses.Field[Any]) -> str:
    return str(field.metadata.get("wire", field.name))


def _field_kind(hint: Any) -> tuple[type, bool, bool]:
    """
    (base type, optional, int32) of a custom header field's annotation.
    """
    optional = False
    int32 = False
    if typing.get_origin(hint) is typing.Union or type(hint).__name__ == "UnionType":
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        if len(args) != 1:
            raise TypeError(f"unsupported custom header field type {hint!r}")
        hint = args[0]
    if typing.get_origin(hint) is typing.Annotated:
        base, *extras = typing.get_args(hint)
        int32 = any(isinstance(e, _Int32Marker) for e in extras)
        hint = base
    if hint not in (str, int, bool, float):
        raise TypeError(f"unsupported custom header field type {hint!r}")
    return hint, optional, int32


#: Per field: the field, its base type, optional, Int32, its wire name.
_HeaderFields = list[tuple[dataclasses.Field[Any], type, bool, bool, str]]
# (get_type_hints is slow: each class's fields are read once.)
_header_fields_cache: dict[type, _HeaderFields] = {}


def _header_fields(cls: type) -> _HeaderFields:
    fields = _header_fields_cache.get(cls)
    if fields is not None:
        return fields
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = [(f, *_field_kind(hints[f.name]), _wire_name(f)) for f in dataclasses.fields(cls)]
    if len(_header_fields_cache) < 256:
        _header_fields_cache[cls] = fields
    return fields


def _java_text(value: Any) -> str:
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def header_to_ext_fields(header: Any) -> dict[str, str]:
    """
    A custom header (a dataclass instance) as C{extFields}, as Java's
    C{makeCustomHeaderToNet} writes it: every field by its wire name
    (metadata C{"wire"}, default the field's name) as text, booleans as
    C{"true"}/C{"false"}, C{None} skipped.

    @raise ValueError: an L{Int32} field is outside Java's int range.
    """
    ext: dict[str, str] = {}
    for field, _, _, int32, wire in _header_fields(type(header)):
        value = getattr(header, field.name)
        if value is None:
            continue
        if int32:
            _check_int(field.name, value, _INT32)
        ext[wire] = _java_text(value)
    return ext


def _parse(name: str, text: str, kind: type, int32: bool) -> Any:
    if kind is str:
        return text
    if kind is bool:
        # Java's Boolean.parseBoolean: "true" in any case, anything else false.
        return text.lower() == "true"
    if kind is int:
        if not _INTEGER.match(text):
            raise CustomHeaderError(f"custom header field {name!r} is {text!r:.40}, not an integer")
        value = int(text)
        bounds = _INT32 if int32 else _INT64
        if not bounds[0] <= value <= bounds[1]:
            raise CustomHeaderError(
                f"custom header field {name!r} {value} is outside {bounds[0]}..{bounds[1]}"
            )
        return value
    if not _DOUBLE.match(text):
        raise CustomHeaderError(f"custom header field {name!r} is {text!r:.40}, not a number")
    return float(text.rstrip("fFdD").replace("Infinity", "inf"))


#: How a field of a custom header is read (L{_read_specs}).
_REQUIRED, _DEFAULTED, _NULLABLE = range(3)
_ReadSpec = tuple[str, str, type, bool, tuple[int, int], int]
_read_specs_cache: dict[type, list[_ReadSpec]] = {}


def _read_specs(cls: type) -> list[_ReadSpec]:
    """
    Per field of C{cls}: its name, wire name, base type, Int32, bounds,
    and what its absence means (L{_REQUIRED}, L{_DEFAULTED}, L{_NULLABLE}).
    """
    specs = _read_specs_cache.get(cls)
    if specs is not None:
        return specs
    specs = []
    for field, kind, optional, int32, name in _header_fields(cls):
        has_default = (
            field.default is not dataclasses.MISSING
            or field.default_factory is not dataclasses.MISSING
        )
        missing = _DEFAULTED if has_default else _NULLABLE if optional else _REQUIRED
        specs.append((field.name, name, kind, int32, _INT32 if int32 else _INT64, missing))
    if len(_read_specs_cache) < 256:
        _read_specs_cache[cls] = specs
    return specs


def header_from_ext_fields(cls: type[_H], ext: Mapping[str, str] | None) -> _H:
    """
    The custom header C{cls} (a dataclass) read from C{extFields}: values
    parsed as Java's C{decodeCommandCustomHeader} parses them.  A field
    whose type is not optional and that has no default is required.

    @raise CustomHeaderError: a required field is missing, or a value does
        not parse (Java only logs that one; rmqha names the field).
    """
    ext = ext or {}
    values: dict[str, Any] = {}
    for attr, name, kind, int32, bounds, missing in _read_specs(cls):
        text = ext.get(name)
        if text is None:
            if missing == _DEFAULTED:
                continue
            if missing == _NULLABLE:
                values[attr] = None
                continue
            raise CustomHeaderError(f"custom header field {name!r} is missing")
        if kind is str:
            values[attr] = text
        elif kind is int and text.isascii() and text.isdigit():
            # (The common case, [0-9]+, without the pattern: _parse's rule.)
            value = int(text)
            if value > bounds[1]:
                raise CustomHeaderError(
                    f"custom header field {name!r} {value} is outside {bounds[0]}..{bounds[1]}"
                )
            values[attr] = value
        else:
            values[attr] = _parse(name, text, kind, int32)
    return cls(**values)
