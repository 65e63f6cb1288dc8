"""
The NameServer requests' headers and bodies (rmqha.remoting.namesrv).
"""

from __future__ import annotations

import struct
import zlib

from twisted.trial.unittest import SynchronousTestCase

from rmqha.remoting._frames import header_from_ext_fields, header_to_ext_fields
from rmqha.remoting.metadata import DataVersion, MetadataLimits, TopicConfig, TopicTable
from rmqha.remoting.namesrv import (
    RegisterBodyError,
    RegisterBrokerBody,
    RegisterBrokerRequestHeader,
    body_crc32,
    decode_kv_table,
    decode_register_body,
    encode_register_body,
    parse_namesrv_addr,
)

_TABLE = TopicTable(
    DataVersion(timestamp=1700000000000, counter=3),
    {"TopicTest": TopicConfig("TopicTest", 4, 4)},
)


class RegisterBodyTests(SynchronousTestCase):
    def test_json_as_the_reference(self) -> None:
        """
        The default body is RegisterBrokerBody's fastjson (the reference's
        example, byte for byte) and reads back.
        """
        data = encode_register_body(RegisterBrokerBody(_TABLE))
        self.assertEqual(
            data,
            b'{"filterServerList":[],"topicConfigSerializeWrapper":{"dataVersion":'
            b'{"counter":3,"timestamp":1700000000000},"topicConfigTable":{"TopicTest":'
            b'{"order":false,"perm":6,"readQueueNums":4,"topicFilterType":"SINGLE_TAG",'
            b'"topicName":"TopicTest","topicSysFlag":0,"writeQueueNums":4}}}}',
        )
        self.assertEqual(decode_register_body(data, False).topics, _TABLE)

    def test_compressed(self) -> None:
        """
        compressedRegister's encoding: zlib of length-prefixed DataVersion,
        count, 'name r w perm filter' per topic, filter servers; reads back
        (without sysFlag and order, which it does not carry).
        """
        table = TopicTable(
            _TABLE.data_version, {"A": TopicConfig("A", 2, 3, 4, topic_sys_flag=1, order=True)}
        )
        data = encode_register_body(RegisterBrokerBody(table, ["f:1"]), compressed=True)
        raw = zlib.decompress(data)
        self.assertEqual(raw[:4], struct.pack(">i", len(b'{"counter":3,"timestamp":1700000000000}')))
        self.assertIn(b"A 2 3 4 SINGLE_TAG", raw)
        body = decode_register_body(data, True)
        self.assertEqual(body.topics.topics["A"], TopicConfig("A", 2, 3, 4))
        self.assertEqual(body.topics.data_version, _TABLE.data_version)
        self.assertEqual(list(body.filter_servers), ["f:1"])

    def test_bad_bodies_named(self) -> None:
        for data, compressed, words in [
            (b"not json", False, "RegisterBrokerBody"),
            (b"\x00\x01", True, "does not inflate"),
            (zlib.compress(struct.pack(">i", 100)), True, "ends inside the DataVersion"),
            (zlib.compress(struct.pack(">i", 2) + b"{}" + struct.pack(">i", 9)), True, "9 topics"),
            (
                zlib.compress(struct.pack(">i", 2) + b"{}" + struct.pack(">i", 1) + struct.pack(">i", 1) + b"x"),
                True,
                "not 'name",
            ),
        ]:
            with self.assertRaises(RegisterBodyError) as e:
                decode_register_body(data, compressed, MetadataLimits(max_topics=5))
            self.assertIn(words, str(e.exception))

    def test_inflation_bounded(self) -> None:
        bomb = zlib.compress(b"\x00" * (17 * 1024 * 1024))
        with self.assertRaises(RegisterBodyError) as e:
            decode_register_body(bomb, True)
        self.assertIn("more than", str(e.exception))

    def test_crc32_as_utilall(self) -> None:
        self.assertEqual(body_crc32(b"123456789"), 0xCBF43926 & 0x7FFFFFFF)

    def test_header_ext_fields(self) -> None:
        header = RegisterBrokerRequestHeader("b", "h:1", "C", "h:2", 1, body_crc32=5)
        ext = header_to_ext_fields(header)
        self.assertEqual(
            ext,
            {
                "brokerName": "b", "brokerAddr": "h:1", "clusterName": "C", "haServerAddr": "h:2",
                "brokerId": "1", "compressed": "false", "bodyCrc32": "5",
            },
        )
        self.assertEqual(header_from_ext_fields(RegisterBrokerRequestHeader, ext), header)

    def test_kv_table(self) -> None:
        self.assertEqual(decode_kv_table(b""), {})
        self.assertEqual(decode_kv_table(b'{"table":{"T":"b:4"}}'), {"T": "b:4"})
        with self.assertRaises(RegisterBodyError):
            decode_kv_table(b"{")

    def test_namesrv_addr(self) -> None:
        self.assertEqual(parse_namesrv_addr("a:1; b:2;"), ("a:1", "b:2"))
        for bad in ("", ";", "a", "a:1;b"):
            self.assertRaises(ValueError, parse_namesrv_addr, bad)
