"""
Tests for C{dev.py} (the quick-start script), with nothing installed or run.
"""

from __future__ import annotations

import importlib.util
import io
import os
import sys
from types import ModuleType

from twisted.trial.unittest import SynchronousTestCase

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_dev() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_rmqha_dev", os.path.join(ROOT, "dev.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class DevTests(SynchronousTestCase):
    """
    What C{python3 dev.py test} runs (issue 12, item 19).
    """

    def setUp(self) -> None:
        self.dev = load_dev()
        self.commands: list[list[str]] = []

        def run(argv: list[str]) -> int:
            self.commands.append(argv)
            return 0

        self.patch(self.dev, "run", run)
        self.patch(self.dev, "ensure_venv", lambda: None)
        self.patch(self.dev, "ensure_network_tools", lambda: None)

    def tools(self) -> list[str]:
        return [" ".join(argv[1:3]) for argv in self.commands]

    def test_whole_suite(self) -> None:
        """
        Without arguments: mypy, trial, then pytest listing skip reasons
        (C{-rs}); what C{.ci/run} relies on.
        """
        self.assertEqual(self.dev.main(["test"]), 0)
        self.assertEqual(self.tools(), ["-m mypy", "-m twisted.trial", "-m pytest"])
        self.assertIn("-rs", self.commands[-1])

    def test_selection_runs_only_pytest(self) -> None:
        """
        C{dev.py test -k X}: pytest alone, with the selection (and C{-rs}).
        """
        self.assertEqual(self.dev.main(["test", "-k", "recovery"]), 0)
        self.assertEqual(self.tools(), ["-m pytest"])
        self.assertEqual(self.commands[0][-2:], ["-k", "recovery"])
        self.assertIn("-rs", self.commands[0])

    def test_says_before_apt_get(self) -> None:
        """
        As root with tools missing, dev.py prints the apt-get command and
        why, before running it.
        """
        dev = load_dev()
        said = io.StringIO()
        calls: list[tuple[str, list[str]]] = []

        def call(argv: list[str], **kwargs: object) -> int:
            calls.append((said.getvalue(), argv))
            return 0

        self.patch(sys, "stdout", said)
        self.patch(dev.sys, "platform", "linux")
        self.patch(dev.os, "geteuid", lambda: 0)
        self.patch(dev.shutil, "which", lambda name: "/usr/bin/apt-get" if name == "apt-get" else None)
        self.patch(dev.subprocess, "call", call)
        dev.ensure_network_tools()
        ((before, argv),) = calls
        self.assertEqual(argv[:2], ["apt-get", "install"])
        self.assertIn("apt-get install", before)
        self.assertIn("iproute2 nftables", before)
        self.assertIn("test_netns.py", before)
