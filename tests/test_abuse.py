"""
Tests for L{tools.abuse} that start no process (the scenarios themselves
run in C{tests.integration.test_abuse_tool}).
"""

from __future__ import annotations

import io
import os
import sys

from twisted.trial.unittest import SynchronousTestCase

from tools import abuse


class ArgumentTests(SynchronousTestCase):
    """
    Bad arguments are refused in one line, exit status 2, before any
    master starts.
    """

    def setUp(self) -> None:
        def no_run(*args: object, **kwargs: object) -> dict[str, object]:
            self.fail("the measurement started")

        self.patch(abuse, "run", no_run)
        self.err = io.StringIO()
        self.patch(sys, "stderr", self.err)

    def refused(self, argv: list[str]) -> str:
        self.assertEqual(abuse.main(argv), 2)
        text = self.err.getvalue()
        self.assertEqual(text.count("\n"), 1, text)
        self.assertTrue(text.startswith("python -m tools.abuse: error: "), text)
        return text

    def test_unknown_scenario(self) -> None:
        """
        A scenario that does not exist is named, with the ones that do.
        """
        text = self.refused(["--scenarios", "digest,slowloris"])
        self.assertIn("unknown scenario 'slowloris' (choose from digest, flood, conns, post)", text)

    def test_no_scenario(self) -> None:
        """
        C{--scenarios} naming nothing is refused.
        """
        self.assertIn("--scenarios names no scenario", self.refused(["--scenarios", " , "]))

    def test_not_a_checkout(self) -> None:
        """
        A C{--checkout} without rmqha in it is refused, naming what is
        missing.
        """
        directory = self.mktemp()
        os.makedirs(directory)
        text = self.refused(["--checkout", directory])
        self.assertIn(f"--checkout {directory} is not a checkout of rmqha (no rmqha/__init__.py)",
                      text)

    def test_unknown_option(self) -> None:
        """
        An unknown option is one line too, not argparse's usage block.
        """
        self.assertIn("unrecognized arguments: --minutes", self.refused(["--minutes", "3"]))

    def test_good_arguments(self) -> None:
        """
        Good arguments reach L{abuse.run}: the scenarios in the order
        given, the other checkout first and this code last, the quick
        sizes.
        """
        calls = []

        def fake_run(scenarios: list[str], checkouts: list[str], sizes: abuse.Sizes,
                     progress: object = None) -> dict[str, object]:
            calls.append((scenarios, checkouts, sizes))
            return {"runs": []}

        self.patch(abuse, "run", fake_run)
        out = io.StringIO()
        self.patch(sys, "stdout", out)
        here = os.path.dirname(os.path.dirname(os.path.abspath(abuse.__file__)))
        self.assertEqual(
            abuse.main(["--scenarios", "post,digest", "--checkout", here, "--quick", "--json"]), 0
        )
        self.assertEqual(calls, [(["post", "digest"], [here, here], abuse.QUICK)])
        self.assertEqual(out.getvalue(), '{"runs": []}\n')


class TableTests(SynchronousTestCase):
    """
    The readable table.
    """

    def test_columns_per_checkout(self) -> None:
        """
        One row per measurement, one column per checkout (named by its
        directory and commit); a measurement one checkout lacks is blank.
        """
        result = {
            "runs": [
                {"checkout": "/w/base", "commit": "1004f6b",
                 "scenarios": {"flood": {"sent_bytes": 300, "rss_growth_mib": 898.0}}},
                {"checkout": "/w/main", "commit": None,
                 "scenarios": {"flood": {"sent_bytes": 4}}},
            ]
        }
        lines = abuse.table(result).splitlines()
        self.assertEqual(lines[0].split(), ["measurement", "base", "(1004f6b)", "main"])
        self.assertEqual(lines[2].split(), ["flood.sent_bytes", "300", "4"])
        self.assertEqual(lines[3].split(), ["flood.rss_growth_mib", "898.0"])
