# -*- test-case-name: tests.test_tap,tests.test_settings -*-
"""
C{twistd rmqha}: options and the service tree.

    twistd -n rmqha --role master --store-dir DIR [--ha-listen tcp:10912]
    twistd -n rmqha --role slave --master HOST:PORT --store-dir DIR

Settings come from RocketMQ's defaults, then C{--config broker.conf}, then
the command line, each overriding the one before.  A bad value is a usage
error naming the flag or the C{broker.conf} key it came from.

C{--log-file PATH} (with C{--log-rotate-size}, C{--log-keep}) is the
process's, not the broker's: twistd's log, rotated by size
(L{rmqha.logfile}).

This module only turns the command line and the broker.conf into a
L{BrokerSettings} (L{rmqha.settings}, where every setting, its flag and
its key are declared, and whence the options below are generated);
L{rmqha.assemble} builds the service tree from it.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.application.service import IService
from twisted.logger import Logger
from twisted.python import usage
from twisted.python.logfile import LogFile

from rmqha._units import parse_size
from rmqha.assemble import Fatal, build_service, check_files, group_auth
from rmqha.ha.auth import GroupAuth, load_group_secret
from rmqha.logfile import (
    DEFAULT_LOG_KEEP,
    DEFAULT_LOG_ROTATE_SIZE,
    LogFileSettings,
    check_twistd_logging,
    hand_to_twistd,
    open_log_file,
)
from rmqha.settings import (
    GROUP_SECRET_ENV,
    BrokerSettings,
    check_keys,
    declarations,
    parse_host_port,
)

__all__ = ["Fatal", "Options", "makeService", "parse_host_port", "read_properties"]


def read_properties(path: str) -> dict[str, str]:
    """
    A Java properties file (RocketMQ's C{broker.conf}): C{key=value},
    C{key: value} or C{key value} lines, C{#} and C{!} comments, a trailing
    backslash continuing a line.

    @raise ValueError: the file cannot be read.
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"--config {path}: {e.strerror}") from None
    result: dict[str, str] = {}
    logical = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not logical and (not line or line[0] in "#!"):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            logical += line[:-1]
            continue
        logical += line
        key, value = logical, ""
        for i, char in enumerate(logical):
            if char in "=:" or char.isspace():
                key = logical[:i].strip()
                value = logical[i + 1 :].strip()
                if char.isspace() and value[:1] in ("=", ":"):
                    value = value[1:].strip()
                break
        result[key] = value
        logical = ""
    return result


class Options(usage.Options):
    """
    C{twistd rmqha} command line.

    @ivar settings: the L{BrokerSettings}, once parsed.
    @ivar group_secret: failover: the group secret read from its file, or
        C{None}.
    @ivar warnings: what was wrong but ignored (unknown broker.conf keys),
        also logged.
    """

    _log = Logger()

    synopsis = "--role master|SYNC_MASTER|slave --store-dir DIR [options]"
    longdesc = (
        "Runs an rmqha broker: a RocketMQ 4.9-compatible commit log under "
        "--store-dir replicated with RocketMQ's classic HA protocol. A master "
        "serves slaves on --ha-listen; a slave follows --master (or any "
        "Twisted client endpoint given as --master-endpoint). SIGTERM shuts "
        "down cleanly. Settings may come from a RocketMQ broker.conf "
        "(--config); flags override it."
    )

    optFlags = [[d.flag, None, d.help_line] for d in declarations() if d.switch and d.flag]
    optParameters = (
        [["config", None, None, "a RocketMQ broker.conf to read settings from"]]
        + [[d.flag, None, None, d.help_line] for d in declarations() if not d.switch and d.flag]
        + [
            [
                "log-file",
                None,
                None,
                "log to this file, rotated by size (instead of twistd's --logfile, which "
                "keeps every rotated file)",
            ],
            [
                "log-rotate-size",
                None,
                None,
                "with --log-file: rotate it to FILE.1 at this size, e.g. 10m (10m)",
            ],
            [
                "log-keep",
                None,
                None,
                f"with --log-file: rotated files kept, FILE.1..FILE.N ({DEFAULT_LOG_KEEP})",
            ],
        ]
    )

    def parseOptions(self, options: list[str] | None = None) -> None:
        try:
            usage.Options.parseOptions(self, options)
        except usage.UsageError as e:
            if self.parent is None:
                raise
            # Under twistd, which would print its own and our whole usage
            # (some 70 lines) around the one that matters.
            raise Fatal(f"twistd rmqha: {e}; see twistd rmqha --help") from None

    def postOptions(self) -> None:
        try:
            path = self["config"]
            conf = read_properties(path) if path else {}
            self.warnings = check_keys(conf, path) if path else []
            for warning in self.warnings:
                self._log.warn("{warning}", warning=warning)
            flags = {d.flag: self.get(d.flag) for d in declarations() if d.flag}
            settings = BrokerSettings.from_sources(flags, conf, path, os.environ)
            if not settings.store_dir:
                raise ValueError("--store-dir (or storePathRootDir) is required")
            check_files(settings)
            self.group_secret = self._group_secret(settings, conf)
            self.log_file = self._log_file()
        except ValueError as e:
            raise usage.UsageError(str(e)) from None
        self.settings = settings

    def _log_file(self) -> LogFile | None:
        """
        C{--log-file}: the file opened now (a bad path is a usage error),
        and, under twistd, handed to it as its log.
        """
        path = self["log-file"]
        if path is None:
            for flag in ("log-rotate-size", "log-keep"):
                if self[flag] is not None:
                    raise ValueError(f"--{flag} needs --log-file")
            return None
        size, keep = DEFAULT_LOG_ROTATE_SIZE, DEFAULT_LOG_KEEP
        if self["log-rotate-size"] is not None:
            size = parse_size(self["log-rotate-size"], "--log-rotate-size")
        if self["log-keep"] is not None:
            text = self["log-keep"].strip()
            if not text.isdigit():
                raise ValueError(f"--log-keep {self['log-keep']!r} is not a number of files")
            keep = int(text)
        settings = LogFileSettings(path, size, keep)
        if self.parent is not None:
            check_twistd_logging(self.parent)  # (before the file is created)
        log_file = open_log_file(settings)
        if self.parent is not None:
            hand_to_twistd(self.parent, log_file)
        return log_file

    def _group_secret(self, settings: BrokerSettings, conf: dict[str, str]) -> bytes | None:
        """
        Failover: the group secret, read now, so that a bad file is a
        usage error naming where its path came from.
        """
        path = settings.group_secret_file
        if not settings.failover or path is None:
            return None
        if self["group-secret-file"] is not None:
            source = "--group-secret-file"
        elif "groupSecretFile" in conf:
            source = f"groupSecretFile in {self['config']}"
        else:
            source = GROUP_SECRET_ENV
        return load_group_secret(path, source)

    def group_auth(self, settings: BrokerSettings) -> GroupAuth | None:
        """
        Failover: how this node and its peers prove their node ids, or
        C{None} (C{--insecure-group}).
        """
        return group_auth(settings, self.group_secret)


def makeService(options: Options) -> IService:
    """
    The service tree for C{options} (L{rmqha.assemble.build_service}).
    Under twistd (C{options} are its subcommand's: they have a C{parent})
    the ports are listened on here, before twistd starts logging, so that
    a port in use is one line and nothing else; elsewhere (tests, an
    embedder) when the tree starts.
    """
    return build_service(
        options.settings,
        group_secret=options.group_secret,
        one_line_errors=True,
        listen_now=options.parent is not None,
    )
