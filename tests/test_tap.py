"""
Tests for the twistd plugin and L{rmqha.tap}.
"""

from __future__ import annotations

import os

from twisted.application.service import IServiceMaker
from twisted.plugin import getPlugins
from twisted.python.usage import UsageError
from twisted.trial.unittest import SynchronousTestCase

from rmqha.commitlog import FlushDiskType
from rmqha.storeservice import CommitLogService
from rmqha.tap import Options, makeService


class PluginTests(SynchronousTestCase):
    """
    twistd finds the C{rmqha} plugin.
    """

    def test_discovered(self) -> None:
        """
        C{getPlugins(IServiceMaker)} (what C{twistd} uses) yields a maker
        named C{rmqha} whose options are L{rmqha.tap.Options}.
        """
        makers = {m.tapname: m for m in getPlugins(IServiceMaker)}
        self.assertIn("rmqha", makers)
        self.assertIs(makers["rmqha"].options, Options)


class OptionsTests(SynchronousTestCase):
    """
    L{Options} validates values and names the bad one.
    """

    def parse(self, *argv: str) -> Options:
        options = Options()
        options.parseOptions(list(argv))
        return options

    def test_defaults(self) -> None:
        """
        Only C{--store-dir} is needed; flushing defaults to RocketMQ's
        ASYNC_FLUSH every 500 ms, the store host to 127.0.0.1:10911.
        """
        options = self.parse("--store-dir", "s")
        self.assertEqual(options["flush-disk-type"], FlushDiskType.ASYNC_FLUSH)
        self.assertEqual(options["flush-interval"], 0.5)
        self.assertEqual(options["store-host"], ("127.0.0.1", 10911))
        self.assertIsNone(options["segment-size"])

    def test_values(self) -> None:
        """
        Sizes take suffixes, the flush type is case-insensitive, an IPv6
        store host is written C{[addr]:port}.
        """
        options = self.parse(
            "--store-dir", "s", "--segment-size", "64m",
            "--flush-disk-type", "sync_flush", "--flush-interval", "200",
            "--store-host", "[::1]:10911",
        )
        self.assertEqual(options["segment-size"], 64 << 20)
        self.assertEqual(options["flush-disk-type"], FlushDiskType.SYNC_FLUSH)
        self.assertEqual(options["flush-interval"], 0.2)
        self.assertEqual(options["store-host"], ("::1", 10911))

    def test_errors_name_the_option(self) -> None:
        """
        Each bad value is a L{UsageError} that names its option.
        """
        cases = [
            ((), "--store-dir"),
            (("--segment-size", "12q"), "--segment-size"),
            (("--segment-size", "10"), "--segment-size"),
            (("--flush-disk-type", "SOMETIMES"), "--flush-disk-type"),
            (("--flush-interval", "0"), "--flush-interval"),
            (("--flush-interval", "fast"), "--flush-interval"),
            (("--store-host", "nohost"), "--store-host"),
            (("--store-host", "h:99999"), "--store-host"),
        ]
        for extra, name in cases:
            argv = extra if extra == () else ("--store-dir", "s", *extra)
            e = self.assertRaises(UsageError, self.parse, *argv)
            self.assertIn(name, str(e), argv)

    def test_make_service(self) -> None:
        """
        The service tree holds a L{CommitLogService} named C{store}, which
        does not touch the store until started.
        """
        store = self.mktemp()
        service = makeService(self.parse("--store-dir", store))
        child = service.getServiceNamed("store")
        self.assertIsInstance(child, CommitLogService)
        self.assertIsNone(child.commitlog)

    def test_store_error_is_one_line_exit(self) -> None:
        """
        A store that cannot be opened stops twistd with a one-line message
        naming the problem (SystemExit), not a traceback.
        """
        store = self.mktemp()
        os.makedirs(os.path.join(store, "commitlog"))
        with open(os.path.join(store, "commitlog", "junk"), "w"):
            pass
        service = makeService(self.parse("--store-dir", store))
        e = self.assertRaises(SystemExit, service.startService)
        self.assertIn("cannot open the store", str(e.code))
        self.assertIn("junk", str(e.code))
        self.assertNotIn("\n", str(e.code))
