"""
Tests for L{tools.soak} that start no process (the soak itself runs in
C{tests.integration.test_soak}).
"""

from __future__ import annotations

import io
import os
import sys
from types import SimpleNamespace

from twisted.trial.unittest import SynchronousTestCase

from tools import soak


class OutTests(SynchronousTestCase):
    """
    The soak never overwrites its results (issue 12, item 3), and says so
    before it spends minutes running.
    """

    def setUp(self) -> None:
        def no_run(*args: object, **kwargs: object) -> str:
            self.fail("the soak started")

        self.patch(soak, "tempfile", SimpleNamespace(mkdtemp=no_run))

    def test_refuses_existing_results(self) -> None:
        """
        An C{--out} holding a C{soak.json} is refused at once: one line
        naming it, exit 2, the file untouched.
        """
        out = self.mktemp()
        os.makedirs(out)
        with open(os.path.join(out, "soak.json"), "w") as f:
            f.write("mine")
        err = io.StringIO()
        self.patch(sys, "stderr", err)
        self.assertEqual(soak.main(["--minutes", "1", "--out", out]), 2)
        self.assertEqual(err.getvalue().count("\n"), 1)
        self.assertIn(f"{out}/soak.json exists; the soak does not overwrite", err.getvalue())
        self.assertRaises(ValueError, soak.run, 60, out)
        with open(os.path.join(out, "soak.json")) as f:
            self.assertEqual(f.read(), "mine")

    def test_refuses_a_file(self) -> None:
        """
        An C{--out} that is a file is refused.
        """
        out = self.mktemp()
        with open(out, "w") as f:
            f.write("mine")
        error = self.assertRaises(ValueError, soak.run, 60, out)
        self.assertIn("is not a directory", str(error))
