"""
The benchmark command's argument checks (the benchmarks themselves are run
by hand: docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import io
import os

from twisted.trial.unittest import SynchronousTestCase

from tools import bench


class DirArgumentTests(SynchronousTestCase):
    def test_missing_dir_is_a_usage_error(self) -> None:
        """
        C{--dir} naming no directory is a usage error (exit 2) naming the
        path, before anything is created, not a traceback from mkdtemp.
        """
        missing = os.path.join(self.mktemp(), "nowhere")
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), self.assertRaises(SystemExit) as raised:
            bench.main(["store", "--dir", missing])
        self.assertEqual(raised.exception.code, 2)
        self.assertIn(f"{missing}: no such directory", stderr.getvalue())
        self.assertFalse(os.path.exists(missing))
