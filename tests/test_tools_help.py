"""
Tests for L{tools._help}: the harnesses' C{--help} shows their docstrings
without epytext markup (issue 28: C{python -m tools.soak --help} showed
C{C{...}}).
"""

from __future__ import annotations

import importlib
import io
import re
import sys

from twisted.trial.unittest import SynchronousTestCase

from tools._help import plain


class PlainTests(SynchronousTestCase):
    """
    L{plain} gives the words of the markup, nothing else changed.
    """

    def test_markup(self) -> None:
        """
        C{C{}}, C{L{}}, C{I{}}, C{B{}}, C{U{}} give their contents; braces
        that are no markup (a dict, a lowercase letter's) stay.
        """
        self.assertEqual(
            plain("run C{python -m x} (L{run}, I{not}, B{bold}, U{https://a})"),
            "run python -m x (run, not, bold, https://a)",
        )
        self.assertEqual(plain("{'a': 1} f{x} ABC{y}"), "{'a': 1} f{x} ABC{y}")
        self.assertEqual(plain(None), "")


class HelpTests(SynchronousTestCase):
    """
    Every harness whose C{--help} shows its docstring shows it plain.
    """

    def test_no_markup(self) -> None:
        """
        C{--help} of soak, fuzz, abuse and layout: exit 0, their usage, no
        C{X{...}} markup.
        """
        for name in ("soak", "fuzz", "abuse", "layout"):
            module = importlib.import_module(f"tools.{name}")
            out = io.StringIO()
            self.patch(sys, "stdout", out)
            error = self.assertRaises(SystemExit, module.main, ["--help"])
            self.assertEqual(error.code, 0, name)
            text = out.getvalue()
            self.assertIn(f"python -m tools.{name}", text)
            self.assertIsNone(re.search(r"\b[BCILU]\{", text), f"{name}: {text}")
