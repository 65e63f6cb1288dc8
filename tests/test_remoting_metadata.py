"""
L{rmqha.remoting.metadata}: RocketMQ 4.9's C{config/*.json} read and
written as a genuine broker does.

The files under C{tests/fixtures/metadata/} were written by fastjson
1.2.69 (the version 4.9.8 ships) from a Java transcription of 4.9.8's
metadata classes (C{tests/fixtures/RocketMQMetadataFixture.java}).
"""

from __future__ import annotations

import os
from typing import Any, Callable

from twisted.internet.task import Clock
from twisted.logger import ILogObserver, LogEvent, formatEvent, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import provider

from rmqha.remoting import metadata as md
from rmqha.remoting.metadata import (
    BrokerMetadata,
    ConsumerOffsetTable,
    DataVersion,
    DelayOffsetTable,
    GroupTable,
    MetadataFile,
    MetadataFileError,
    MetadataFlusher,
    MetadataFormatError,
    MetadataLimitError,
    MetadataLimits,
    SubscriptionGroupConfig,
    TopicConfig,
    TopicTable,
    builtin_groups,
    builtin_topics,
    decode_table,
    dump_fastjson,
    load_file,
    parse_fastjson,
    save_file,
)

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "metadata")


def fixture(name: str) -> str:
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as f:
        return f.read()


def read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


class ParserTests(SynchronousTestCase):
    def test_integer_keys_quoted_or_not(self) -> None:
        """
        fastjson's unquoted integer map keys are read (as C{int} keys, so a
        rewrite leaves them unquoted), and quoted ones as strings.
        """
        value = parse_fastjson('{"offsetTable":{"T@g":{0:120,1:118,-1:5},"x":{"0":7}}}')
        self.assertEqual(value, {"offsetTable": {"T@g": {0: 120, 1: 118, -1: 5}, "x": {"0": 7}}})
        self.assertEqual(dump_fastjson(value), '{"offsetTable":{"T@g":{0:120,1:118,-1:5},"x":{"0":7}}}')

    def test_fastjson_leniencies(self) -> None:
        """
        What fastjson's default parser also takes: bare identifier keys,
        single quotes, stray commas, C{\\x} escapes, a C{L} suffix; a
        repeated key keeps its last value.
        """
        value = parse_fastjson("{,counter:1L,,'a':'it\\'s \\x41',\"a\":'b', list:[1,,2,],}")
        self.assertEqual(value, {"counter": 1, "a": "b", "list": [1, 2]})

    def test_malformed_text_is_a_named_error(self) -> None:
        """
        Broken text is a L{MetadataFormatError} giving line and column,
        never another exception.
        """
        cases = ['{"a":1', '{"a" 1}', "{a:1} x", '{"a":"\x01"}', "{1.5:2}", "[1 2]", "", '{"a":tru}', '"\\q"']
        for text in cases:
            e = self.assertRaises(MetadataFormatError, parse_fastjson, text)
            self.assertIn("line 1 column", str(e))

    def test_depth_is_bounded(self) -> None:
        """
        Deep nesting is refused by a limit, not by Python's recursion
        limit.
        """
        e = self.assertRaises(MetadataFormatError, parse_fastjson, "[" * 100_000, max_depth=32)
        self.assertIn("nested deeper than 32", str(e))
        self.assertEqual(parse_fastjson("[" * 32 + "]" * 32, max_depth=32), [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]])

    def test_truncated_and_mutated_files(self) -> None:
        """
        Prefixes of genuine files, and random character mutations of them, either load or raise a L{MetadataError}: no
        other exception escapes the reader.
        """
        import random

        for which, name in ((MetadataFile.CONSUMER_OFFSETS, "consumerOffset.json"), (MetadataFile.TOPICS, "topics.body")):
            text = fixture(name)
            for end in range(0, len(text), 5):
                try:
                    decode_table(which, text[:end])
                except md.MetadataError:
                    pass
            rng = random.Random(29)
            alphabet = '{}[]:,"\'0123456789-abtnu@ \n\x00\u00e9'
            for _ in range(300):
                chars = list(text)
                for _ in range(rng.randrange(1, 4)):
                    chars[rng.randrange(len(chars))] = rng.choice(alphabet)
                try:
                    decode_table(which, "".join(chars))
                except md.MetadataError:
                    pass

    def test_surrogates(self) -> None:
        """
        A C{\\u} surrogate pair is one character; a lone half is written
        escaped, so the file stays valid UTF-8.
        """
        value = parse_fastjson('"\\ud83d\\ude00 \\ud800"')
        self.assertEqual(value, "\U0001F600 \ud800")
        self.assertEqual(dump_fastjson(value), '"\U0001F600 \\uD800"')

    def test_pretty_format(self) -> None:
        """
        Pretty output is fastjson's: a tab per level, no space after a
        colon, no new line before an integer key, an empty map as C{{}},
        null fields left out, fastjson's escapes.
        """
        text = dump_fastjson(
            {"a": {"b": 1, "n": None}, "o": {0: 1, 2: 3}, "e": {}, "s": "\x01\x7f\u2028é\"", "l": [1, "x"]},
            pretty=True,
        )
        self.assertEqual(
            text,
            '{\n\t"a":{\n\t\t"b":1\n\t},\n\t"o":{0:1,2:3\n\t},\n\t"e":{},\n'
            '\t"s":"\\u0001\\u007F\\u2028é\\"",\n\t"l":[\n\t\t1,\n\t\t"x"\n\t]\n}',
        )


class GenuineFilesTests(SynchronousTestCase):
    def test_topics(self) -> None:
        """
        A genuine topics.json loads with every field, the built-in topics
        included.
        """
        table = decode_table(MetadataFile.TOPICS, fixture("topics.json"))
        assert isinstance(table, TopicTable)
        self.assertEqual(table.data_version, DataVersion(timestamp=1700000123456, counter=3))
        self.assertEqual(table.topics["TBW102"], TopicConfig("TBW102", 8, 8, perm=7))
        self.assertEqual(table.topics["BenchmarkTest"].read_queue_nums, 1024)
        self.assertEqual(
            table.topics["OrderTopic"],
            TopicConfig("OrderTopic", 2, 2, 6, topic_filter_type="MULTI_TAG", topic_sys_flag=1, order=True),
        )
        self.assertEqual(len(table.topics), 10)

    def test_subscription_groups(self) -> None:
        """A genuine subscriptionGroup.json loads with every field."""
        table = decode_table(MetadataFile.SUBSCRIPTION_GROUPS, fixture("subscriptionGroup.json"))
        assert isinstance(table, GroupTable)
        self.assertEqual(table.data_version, DataVersion(timestamp=1700000234567, counter=2))
        self.assertEqual(table.groups["TOOLS_CONSUMER"], SubscriptionGroupConfig("TOOLS_CONSUMER"))
        self.assertEqual(
            table.groups["please_rename_unique_group_name_4"],
            SubscriptionGroupConfig(
                "please_rename_unique_group_name_4",
                consume_broadcast_enable=False,
                retry_max_times=3,
                broker_id=1,
                which_broker_when_consume_slowly=2,
            ),
        )
        self.assertEqual(len(table.groups), 8)

    def test_offsets(self) -> None:
        """
        Genuine consumerOffset.json and delayOffset.json, with their
        unquoted integer keys, load; a 64-bit offset keeps every digit.
        """
        offsets = decode_table(MetadataFile.CONSUMER_OFFSETS, fixture("consumerOffset.json"))
        assert isinstance(offsets, ConsumerOffsetTable)
        self.assertEqual(offsets.offsets["TopicTest@please_rename_unique_group_name_4"], {0: 9007199254740993, 31: 5})
        self.assertEqual(offsets.offsets["Topic7@group1"], {q: 7000 + q for q in range(8)})
        self.assertEqual(offsets.offsets["Topic10@group1"], {})
        self.assertEqual(len(offsets.offsets), 22)
        delay = decode_table(MetadataFile.DELAY_OFFSETS, fixture("delayOffset.json"))
        self.assertEqual(delay, DelayOffsetTable({1: 12, 3: 0, 18: 4}))

    def test_rewritten_byte_for_byte(self) -> None:
        """
        Each genuine file, and the compact body of the request code that
        carries its table (21, 201, 43, 45), is written back exactly as
        fastjson wrote it: same indentation, key order (a
        ConcurrentHashMap's) and quoting.
        """
        for which in MetadataFile:
            base = which.value[: -len(".json")]
            for name, pretty in ((base + ".json", True), (base + ".body", False)):
                text = fixture(name)
                self.assertEqual(dump_fastjson(decode_table(which, text).to_json(), pretty=pretty), text, name)

    def test_missing_fields_take_rocketmq_defaults(self) -> None:
        """
        Entries without some fields (fastjson leaves nulls out; older
        writers had fewer) get 4.9.8's defaults; the name comes from the
        key.
        """
        topics = decode_table(MetadataFile.TOPICS, '{"topicConfigTable":{"A":{}}}')
        assert isinstance(topics, TopicTable)
        self.assertEqual(topics.topics["A"], TopicConfig("A", 16, 16, 6, "SINGLE_TAG", 0, False))
        self.assertEqual(topics.data_version, DataVersion(0, 0))
        groups = decode_table(MetadataFile.SUBSCRIPTION_GROUPS, "{subscriptionGroupTable:{G:{}}}")
        assert isinstance(groups, GroupTable)
        self.assertEqual(groups.groups["G"], SubscriptionGroupConfig("G", True, True, True, 1, 16, 0, 1, True))

    def test_wrong_shapes_are_named(self) -> None:
        """
        A field of the wrong type is an error naming the entry and field.
        """
        e = self.assertRaises(
            MetadataFormatError, decode_table, MetadataFile.TOPICS, '{"topicConfigTable":{"A":{"perm":"rw"}}}'
        )
        self.assertEqual(str(e), "topic 'A': perm is 'rw', not an integer")
        e = self.assertRaises(
            MetadataFormatError, decode_table, MetadataFile.CONSUMER_OFFSETS, '{"offsetTable":{"T@g":{x:1}}}'
        )
        self.assertEqual(str(e), "offsets of 'T@g': key 'x' is not an integer")
        e = self.assertRaises(MetadataFormatError, decode_table, MetadataFile.DELAY_OFFSETS, "[]")
        self.assertEqual(str(e), "the delay offset table is not a JSON object")


class RecordTests(SynchronousTestCase):
    def test_defaults(self) -> None:
        """The records' defaults are RocketMQ 4.9.8's."""
        t = TopicConfig("T")
        self.assertEqual(
            (t.read_queue_nums, t.write_queue_nums, t.perm, t.topic_filter_type, t.topic_sys_flag, t.order),
            (16, 16, 6, "SINGLE_TAG", 0, False),
        )
        g = SubscriptionGroupConfig("G")
        self.assertEqual(
            (g.consume_enable, g.consume_from_min_enable, g.consume_broadcast_enable, g.retry_queue_nums,
             g.retry_max_times, g.broker_id, g.which_broker_when_consume_slowly,
             g.notify_consumer_ids_changed_enable),
            (True, True, True, 1, 16, 0, 1, True),
        )

    def test_next_version(self) -> None:
        """
        C{next_version} is DataVersion.nextVersion: now, counter plus one;
        versions compare by timestamp and counter.
        """
        v = DataVersion(timestamp=5, counter=41)
        self.assertEqual(v.next_version(1234), DataVersion(timestamp=1234, counter=42))
        self.assertTrue(v.same(DataVersion(5, 41, extra={"stateVersion": 3})))
        self.assertFalse(v.same(DataVersion(5, 42)))


class BuiltinTests(SynchronousTestCase):
    def test_builtin_topics_and_groups(self) -> None:
        """
        The built-in topics and groups are 4.9.8's for the default
        BrokerConfig (those in the genuine fixture, written from the
        managers' constructors); the options change them as there.
        """
        genuine = decode_table(MetadataFile.TOPICS, fixture("topics.json"))
        assert isinstance(genuine, TopicTable)
        expected = {k: v for k, v in genuine.topics.items() if k not in ("TopicTest", "OrderTopic")}
        self.assertEqual(builtin_topics("DefaultCluster", "broker-a"), expected)
        groups = decode_table(MetadataFile.SUBSCRIPTION_GROUPS, fixture("subscriptionGroup.json"))
        assert isinstance(groups, GroupTable)
        self.assertEqual(builtin_groups(), {k: v for k, v in groups.groups.items() if k.isupper() or "-" in k})
        other = builtin_topics("C", "b", auto_create_topic_enable=False, cluster_topic_enable=False,
                               broker_topic_enable=False, trace_topic_enable=True)
        self.assertNotIn("TBW102", other)
        self.assertEqual((other["C"].perm, other["b"].perm), (1, 1))
        self.assertIn("RMQ_SYS_TRACE_TOPIC", other)
        self.assertIn("C_REPLY_TOPIC", other)

    def test_add_builtins(self) -> None:
        """
        Built-ins fill what the files lack; a file's entry wins; versions
        stay and nothing is written.
        """
        store = self.mktemp()
        write(os.path.join(store, "config", "topics.json"),
              '{"dataVersion":{"counter":4,"timestamp":9},"topicConfigTable":{"TBW102":{"perm":6}}}')
        m = BrokerMetadata.load(store, Clock())
        m.add_builtins(builtin_topics("DefaultCluster", "broker-a"), builtin_groups())
        self.assertEqual(m.topics["TBW102"].perm, 6)
        self.assertEqual(m.topics["SCHEDULE_TOPIC_XXXX"].read_queue_nums, 18)
        self.assertIn("TOOLS_CONSUMER", m.groups)
        self.assertEqual(m.topics_version, DataVersion(9, 4))
        self.assertEqual(m.dirty, frozenset())


class _Logged:
    def __init__(self, test: SynchronousTestCase) -> None:
        self.lines: list[str] = []

        @provider(ILogObserver)
        def observe(event: LogEvent) -> None:
            if event.get("log_namespace") == "rmqha.remoting.metadata":
                self.lines.append(formatEvent(event))

        globalLogPublisher.addObserver(observe)
        test.addCleanup(globalLogPublisher.removeObserver, observe)


class FileTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.store = self.mktemp()
        self.clock = Clock()
        self.clock.advance(1_700_000_000)

    def path(self, which: MetadataFile) -> str:
        return os.path.join(self.store, "config", which.value)

    def test_paths(self) -> None:
        """The files are where 4.9.8 keeps them: <store>/config/<name>."""
        m = BrokerMetadata(self.store, self.clock)
        self.assertEqual(
            sorted(os.path.relpath(m.path(w), self.store) for w in MetadataFile),
            ["config/consumerOffset.json", "config/delayOffset.json", "config/subscriptionGroup.json",
             "config/topics.json"],
        )

    def test_round_trip(self) -> None:
        """
        What a broker changed is what a new one loads from the files; the
        files are what a genuine broker would write for those tables.
        """
        m = BrokerMetadata(self.store, self.clock)
        v1 = m.update_topic(TopicConfig("TopicTest", 4, 4))
        self.clock.advance(1)
        v2 = m.update_topic(TopicConfig("Other", 2, 2, 2, order=True))
        self.assertEqual((v1.counter, v2.counter, v2.timestamp), (1, 2, 1_700_000_001_000))
        m.update_group(SubscriptionGroupConfig("G1", retry_max_times=5))
        m.commit_offset("G1", "TopicTest", 0, 120)
        m.commit_offset("G1", "TopicTest", 3, 118)
        m.update_delay_offset(2, 15)
        self.assertEqual(m.dirty, {MetadataFile.CONSUMER_OFFSETS, MetadataFile.DELAY_OFFSETS})
        self.assertEqual(m.persist_dirty(), [MetadataFile.CONSUMER_OFFSETS, MetadataFile.DELAY_OFFSETS])
        self.assertEqual(m.dirty, frozenset())

        n = BrokerMetadata.load(self.store, self.clock)
        self.assertEqual(n.topics, m.topics)
        self.assertEqual(n.topics_version, v2)
        self.assertEqual(n.groups, m.groups)
        self.assertEqual(n.groups_version, m.groups_version)
        self.assertEqual(n.consumer_offsets, {"TopicTest@G1": {0: 120, 3: 118}})
        self.assertEqual(n.query_offset("G1", "TopicTest", 3), 118)
        self.assertEqual(n.query_offset("G1", "TopicTest", 1), -1)
        self.assertEqual(n.delay_offsets, {2: 15})
        self.assertEqual(read(self.path(MetadataFile.CONSUMER_OFFSETS)), '{\n\t"offsetTable":{\n\t\t"TopicTest@G1":{0:120,3:118\n\t\t}\n\t}\n}')
        self.assertEqual(read(self.path(MetadataFile.DELAY_OFFSETS)), '{\n\t"offsetTable":{2:15\n\t}\n}')

    def test_genuine_store_loaded_and_kept(self) -> None:
        """
        A genuine broker's config/ loads whole; rewriting a table that did
        not change leaves its file byte for byte as fastjson wrote it.
        """
        for which in MetadataFile:
            write(self.path(which), fixture(which.value))
        m = BrokerMetadata.load(self.store, self.clock)
        self.assertEqual(len(m.topics), 10)
        for which in MetadataFile:
            m.persist(which)
            self.assertEqual(read(self.path(which)), fixture(which.value))

    def test_new_store_starts_empty(self) -> None:
        """No files at all (a new store): empty tables, no error, no log."""
        logged = _Logged(self)
        m = BrokerMetadata.load(self.store, self.clock)
        self.assertEqual((m.topics, m.groups, m.consumer_offsets, m.delay_offsets), ({}, {}, {}, {}))
        self.assertEqual(m.topics_version, DataVersion(1_700_000_000_000, 0))
        self.assertEqual(logged.lines, [])

    def test_unknown_fields_kept(self) -> None:
        """
        Fields a newer RocketMQ writes (5.x's attributes, stateVersion, a
        new top-level table) survive rmqha's rewrite, in fastjson's
        alphabetical place.
        """
        write(
            self.path(MetadataFile.TOPICS),
            '{"dataVersion":{"counter":1,"stateVersion":7,"timestamp":2},"topicConfigTable":{"A":'
            '{"attributes":{"+message.type":"NORMAL"},"order":false,"perm":6,"readQueueNums":1,'
            '"topicFilterType":"SINGLE_TAG","topicName":"A","topicSysFlag":0,"writeQueueNums":1}},'
            '"zNew":[1]}',
        )
        write(
            self.path(MetadataFile.SUBSCRIPTION_GROUPS),
            '{"forbiddenTable":{},"subscriptionGroupTable":{"G":{"groupName":"G","groupRetryPolicy":'
            '{"type":"CUSTOMIZED"},"subscriptionDataSet":[]}}}',
        )
        m = BrokerMetadata.load(self.store, self.clock)
        m.update_topic(TopicConfig("B", 1, 1))
        m.update_group(SubscriptionGroupConfig("H"))
        topics = parse_fastjson(read(self.path(MetadataFile.TOPICS)))
        self.assertEqual(list(topics), ["dataVersion", "topicConfigTable", "zNew"])
        self.assertEqual(topics["zNew"], [1])
        self.assertEqual(topics["dataVersion"]["stateVersion"], 7)
        self.assertEqual(topics["dataVersion"]["counter"], 2)
        self.assertEqual(list(topics["topicConfigTable"]["A"])[:2], ["attributes", "order"])
        self.assertEqual(topics["topicConfigTable"]["A"]["attributes"], {"+message.type": "NORMAL"})
        groups = parse_fastjson(read(self.path(MetadataFile.SUBSCRIPTION_GROUPS)))
        self.assertEqual(groups["forbiddenTable"], {})
        self.assertEqual(groups["subscriptionGroupTable"]["G"]["groupRetryPolicy"], {"type": "CUSTOMIZED"})
        self.assertEqual(groups["subscriptionGroupTable"]["G"]["subscriptionDataSet"], [])

    def test_backup_fallback(self) -> None:
        """
        A missing, empty or unparsable file falls back to its .bak, as
        ConfigManager.load does, and says so in one log line.
        """
        path = self.path(MetadataFile.DELAY_OFFSETS)
        write(path + ".bak", '{"offsetTable":{1:5}}')
        for content in (None, "", '{"offsetTable":{1:'):
            if content is None:
                if os.path.exists(path):
                    os.unlink(path)
            else:
                write(path, content)
            logged = _Logged(self)
            self.assertEqual(load_file(path, MetadataFile.DELAY_OFFSETS, MetadataLimits()), DelayOffsetTable({1: 5}))
            self.assertEqual(len(logged.lines), 1)
            self.assertIn(f"loaded {path}.bak instead", logged.lines[0])

    def test_unusable_file_not_copied_over_good_bak(self) -> None:
        """
        After a load that fell back to the .bak, the next save does not
        copy the unusable file over that good .bak; later saves do keep
        the previous content as usual.
        """
        path = self.path(MetadataFile.DELAY_OFFSETS)
        write(path, "{broken")
        write(path + ".bak", '{"offsetTable":{1:5}}')
        m = BrokerMetadata.load(self.store, self.clock)
        m.update_delay_offset(1, 6)
        m.persist_dirty()
        self.assertEqual(read(path + ".bak"), '{"offsetTable":{1:5}}')
        m.update_delay_offset(1, 7)
        m.persist_dirty()
        self.assertEqual(parse_fastjson(read(path + ".bak")), {"offsetTable": {1: 6}})

    def test_no_usable_file_is_an_error(self) -> None:
        """
        An unparsable file without a usable .bak stops the load with one
        line naming the file, instead of an empty table (which would drop
        every topic or offset at the next save).
        """
        path = self.path(MetadataFile.TOPICS)
        write(path, "{garbage")
        e = self.assertRaises(MetadataFileError, BrokerMetadata.load, self.store, self.clock)
        self.assertEqual(str(e), f"{path} is unusable (line 1 column 9: expected ':' after a key) and there is no {path}.bak to fall back on")
        write(path + ".bak", "[")
        e = self.assertRaises(MetadataFileError, BrokerMetadata.load, self.store, self.clock)
        self.assertIn(f"and {path}.bak is unusable: line 1 column 2", str(e))
        self.assertNotIn("\n", str(e))

    def test_save_keeps_previous_as_bak(self) -> None:
        """
        Saving copies the previous content to .bak (MixAll.string2File),
        and leaves no temporary file.
        """
        path = self.path(MetadataFile.TOPICS)
        save_file(path, "one")
        self.assertFalse(os.path.exists(path + ".bak"))
        save_file(path, "two")
        self.assertEqual((read(path), read(path + ".bak")), ("two", "one"))
        self.assertEqual(sorted(os.listdir(os.path.dirname(path))), ["topics.json", "topics.json.bak"])

    def test_crash_at_either_rename_leaves_a_loadable_file(self) -> None:
        """
        If the write stops at either rename (the .bak's or the file's), the
        file and its .bak still load, no temporary file is left, and the
        table stays dirty for the next try.
        """
        m = BrokerMetadata(self.store, self.clock)
        m.commit_offset("G", "T", 0, 1)
        m.persist_dirty()
        m.commit_offset("G", "T", 0, 2)
        m.persist_dirty()
        real = os.replace
        for fail_at in (1, 2):
            calls = []

            def replace(src: str, dst: str, fail_at: int = fail_at) -> None:
                calls.append(dst)
                if len(calls) == fail_at:
                    raise OSError(5, "Input/output error")
                real(src, dst)

            self.patch(md.os, "replace", replace)
            m.commit_offset("G", "T", 0, 3 + fail_at)
            self.assertRaises(OSError, m.persist_dirty)
            self.patch(md.os, "replace", real)
            self.assertIn(MetadataFile.CONSUMER_OFFSETS, m.dirty)
            path = self.path(MetadataFile.CONSUMER_OFFSETS)
            self.assertEqual(BrokerMetadata.load(self.store, self.clock).query_offset("G", "T", 0), 2)
            os.unlink(path)  # a crash between delete and rename (RocketMQ's own window)
            self.assertIn(BrokerMetadata.load(self.store, self.clock).query_offset("G", "T", 0), (1, 2))
            self.assertEqual([n for n in os.listdir(os.path.dirname(path)) if n.endswith(".tmp")], [])
            m.persist_dirty()
            self.assertEqual(BrokerMetadata.load(self.store, self.clock).query_offset("G", "T", 0), 3 + fail_at)
            m.commit_offset("G", "T", 0, 2)
            m.persist_dirty()


class LimitTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.store = self.mktemp()
        self.clock = Clock()
        self.limits = MetadataLimits(max_topics=2, max_groups=1, max_offset_keys=2, max_offset_entries=3,
                                     max_delay_levels=2, max_queue_nums=8)
        self.m = BrokerMetadata(self.store, self.clock, self.limits)

    def refused(self, call: Callable[..., Any], *args: Any) -> str:
        return str(self.assertRaises(MetadataLimitError, call, *args))

    def test_table_caps(self) -> None:
        """
        No table grows past its limit: a refused update says which limit
        and changes nothing; replacing an existing entry is still allowed.
        """
        self.m.update_topic(TopicConfig("A", 1, 1))
        self.m.update_topic(TopicConfig("B", 1, 1))
        version = self.m.topics_version
        self.assertEqual(self.refused(self.m.update_topic, TopicConfig("C", 1, 1)), "topics: 3 is more than the limit of 2")
        self.assertEqual((sorted(self.m.topics), self.m.topics_version), (["A", "B"], version))
        self.m.update_topic(TopicConfig("B", 2, 2))
        self.m.update_group(SubscriptionGroupConfig("G"))
        self.assertIn("subscription groups: 2", self.refused(self.m.update_group, SubscriptionGroupConfig("H")))
        self.m.commit_offset("G", "A", 0, 1)
        self.m.commit_offset("G", "A", 1, 1)
        self.m.commit_offset("G", "B", 0, 1)
        self.assertIn("consumer offset entries: 4", self.refused(self.m.commit_offset, "G", "B", 1, 1))
        self.assertIn("consumer offset keys: 3", self.refused(self.m.commit_offset, "H", "A", 0, 1))
        self.m.commit_offset("G", "A", 1, 9)
        self.assertEqual(self.m.consumer_offsets, {"A@G": {0: 1, 1: 9}, "B@G": {0: 1}})
        self.m.update_delay_offset(1, 0)
        self.m.update_delay_offset(2, 0)
        self.assertIn("delay levels: 3", self.refused(self.m.update_delay_offset, 3, 0))

    def test_client_values_checked(self) -> None:
        """
        Names and numbers from a client follow RocketMQ's rules (topic 1-127
        characters of %|a-zA-Z0-9_-, groups 1-255, queue ids 0-2^31-1).
        """
        self.assertIn("is not 1-127 characters", self.refused(self.m.update_topic, TopicConfig("a b")))
        self.assertIn("is not 1-127 characters", self.refused(self.m.update_topic, TopicConfig("x" * 128, 1, 1)))
        self.assertEqual(
            self.refused(self.m.update_topic, TopicConfig("T", 9, 1)), "topic 'T': readQueueNums 9 is not 0-8"
        )
        self.assertIn("perm 16", self.refused(self.m.update_topic, TopicConfig("T", 1, 1, perm=16)))
        self.assertIn("topicFilterType", self.refused(self.m.update_topic, TopicConfig("T", 1, 1, topic_filter_type="X")))
        self.assertIn("group 'a@b'", self.refused(self.m.commit_offset, "a@b", "T", 0, 1))
        self.assertIn("queue id -1", self.refused(self.m.commit_offset, "G", "T", -1, 1))
        self.assertIn("offset 9223372036854775808", self.refused(self.m.commit_offset, "G", "T", 0, 1 << 63))
        self.assertEqual(self.m.topics, {})

    def test_files_and_bodies_capped(self) -> None:
        """
        A file or a master's body bigger than the limits is refused with a
        named error, before the table changes.
        """
        body = '{"topicConfigTable":{"A":{},"B":{},"C":{}}}'
        self.assertEqual(str(self.assertRaises(MetadataLimitError, self.m.apply_master_topics, body)),
                         "topics: 3 is more than the limit of 2")
        self.assertEqual(self.m.topics, {})
        small = MetadataLimits(max_text_bytes=10)
        path = os.path.join(self.store, "config", "topics.json")
        write(path, body)
        e = self.assertRaises(MetadataFileError, BrokerMetadata.load, self.store, self.clock, small)
        self.assertEqual(str(e), f"{path}: {len(body)} bytes is more than the limit of 10")
        offsets = '{"offsetTable":{"A@G":{0:1,1:1},"B@G":{0:1,1:1}}}'
        self.assertIn("consumer offset entries: 4", str(
            self.assertRaises(MetadataLimitError, self.m.apply_master_consumer_offsets, offsets)))


class SyncApplyTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.store = self.mktemp()
        self.clock = Clock()
        self.m = BrokerMetadata(self.store, self.clock)

    def test_topics_replaced_when_version_differs(self) -> None:
        """
        A master's topic table replaces the slave's whole (a topic the
        master lacks goes) when its DataVersion differs, and is persisted;
        the same version changes nothing.
        """
        self.m.update_topic(TopicConfig("OnlyHere", 1, 1))
        body = fixture("topics.body")
        self.assertTrue(self.m.apply_master_topics(body))
        self.assertNotIn("OnlyHere", self.m.topics)
        self.assertEqual(self.m.topics_version, DataVersion(1700000123456, 3))
        self.assertEqual(read(os.path.join(self.store, "config", "topics.json")), fixture("topics.json"))
        self.assertFalse(self.m.apply_master_topics(body))

    def test_answer_without_its_table_refused(self) -> None:
        """
        A master's answer without the table's member (a genuine master
        always sends it, an empty one as C{{}}) is refused, naming it, and
        this broker's table stays; a file without it still loads as empty
        (fastjson leaves null members out of files).
        """
        self.m.update_topic(TopicConfig("Kept", 1, 1))
        self.m.commit_offset("G", "Kept", 0, 7)
        cases = [
            (self.m.apply_master_topics, '{"dataVersion":{"counter":9,"timestamp":1}}', "topicConfigTable"),
            (self.m.apply_master_groups, '{"dataVersion":{"counter":9,"timestamp":1}}', "subscriptionGroupTable"),
            (self.m.apply_master_consumer_offsets, "{}", "offsetTable"),
            (self.m.apply_master_delay_offsets, '{"offsetTable":null}', "offsetTable"),
        ]
        for apply, body, member in cases:
            e = self.assertRaises(MetadataFormatError, apply, body)
            self.assertIn(f"the answer has no {member}", str(e))
        self.assertIn("Kept", self.m.topics)
        self.assertEqual(self.m.consumer_offsets["Kept@G"], {0: 7})
        self.assertTrue(self.m.apply_master_topics('{"dataVersion":{"counter":9,"timestamp":1},"topicConfigTable":{}}'))
        self.assertEqual(self.m.topics, {})
        self.assertIsInstance(decode_table(MetadataFile.TOPICS, "{}"), TopicTable)

    def test_groups_replaced(self) -> None:
        """Subscription groups are synced like topics."""
        self.assertTrue(self.m.apply_master_groups(fixture("subscriptionGroup.body")))
        self.assertEqual(len(self.m.groups), 8)
        self.assertFalse(self.m.apply_master_groups(fixture("subscriptionGroup.body")))

    def test_offsets_merged(self) -> None:
        """
        A master's consumer offsets replace each topic@group it has; keys
        only the slave has stay (putAll); the file is written.
        """
        self.m.commit_offset("mine", "T", 0, 5)
        self.m.commit_offset("please_rename_unique_group_name_4", "TopicTest", 7, 5)
        self.m.apply_master_consumer_offsets(fixture("consumerOffset.body"))
        offsets = self.m.consumer_offsets
        self.assertEqual(offsets["T@mine"], {0: 5})
        self.assertEqual(offsets["TopicTest@please_rename_unique_group_name_4"], {0: 9007199254740993, 31: 5})
        self.assertEqual(len(offsets), 23)
        self.assertEqual(self.m.dirty, frozenset())
        self.m.apply_master_delay_offsets(fixture("delayOffset.body"))
        self.assertEqual(read(os.path.join(self.store, "config", "delayOffset.json")), fixture("delayOffset.json"))

    def test_bad_body_changes_nothing(self) -> None:
        """A malformed body from a master is an error and changes nothing."""
        self.m.commit_offset("G", "T", 0, 5)
        self.assertRaises(MetadataFormatError, self.m.apply_master_consumer_offsets, '{"offsetTable":{"T@G":{0:')
        self.assertRaises(MetadataFormatError, self.m.apply_master_topics, '{"topicConfigTable":[]}')
        self.assertEqual(self.m.consumer_offsets, {"T@G": {0: 5}})
        self.assertFalse(os.path.exists(os.path.join(self.store, "config", "topics.json")))


class FlusherTests(SynchronousTestCase):
    def test_schedule(self) -> None:
        """
        Consumer offsets are written every 5 s and delay offsets every
        10 s, only when changed, and everything dirty at stop; no timer
        stays behind.
        """
        clock = Clock()
        store = self.mktemp()
        m = BrokerMetadata(store, clock)
        flusher = MetadataFlusher(m, clock)
        flusher.startService()
        m.commit_offset("G", "T", 0, 1)
        m.update_delay_offset(1, 1)
        offsets = os.path.join(store, "config", "consumerOffset.json")
        delay = os.path.join(store, "config", "delayOffset.json")
        clock.advance(4.9)
        self.assertFalse(os.path.exists(offsets))
        clock.advance(0.1)
        self.assertTrue(os.path.exists(offsets))
        self.assertFalse(os.path.exists(delay))
        clock.advance(5)
        self.assertTrue(os.path.exists(delay))
        m.commit_offset("G", "T", 0, 2)
        flusher.stopService()
        self.assertEqual(BrokerMetadata.load(store, clock).query_offset("G", "T", 0), 2)
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_write_failure_logged_and_retried(self) -> None:
        """A failed periodic write is logged, kept dirty and retried."""
        clock = Clock()
        m = BrokerMetadata(self.mktemp(), clock)
        flusher = MetadataFlusher(m, clock)
        flusher.startService()
        m.commit_offset("G", "T", 0, 1)
        real = os.replace

        def fail(src: str, dst: str) -> None:
            raise OSError(28, "No space left on device")

        self.patch(md.os, "replace", fail)
        logged = _Logged(self)
        clock.advance(5)
        self.assertEqual(len(logged.lines), 1)
        self.assertIn("No space left on device", logged.lines[0])
        self.assertEqual(m.dirty, {MetadataFile.CONSUMER_OFFSETS})
        self.patch(md.os, "replace", real)
        clock.advance(5)
        self.assertEqual(m.dirty, frozenset())
        flusher.stopService()
