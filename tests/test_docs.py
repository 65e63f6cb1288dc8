"""
The Python examples in the README run as written.
"""

from __future__ import annotations

import os
import re

from twisted.trial.unittest import SynchronousTestCase

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python_blocks(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.DOTALL)


class ReadmeTests(SynchronousTestCase):
    """
    README.md's code is exercised, so it cannot drift from the API.
    """

    def test_python_examples_run(self) -> None:
        """
        Each ```python block runs in a fresh directory without error (the
        examples write a store named STORE there).
        """
        blocks = python_blocks(os.path.join(ROOT, "README.md"))
        self.assertTrue(blocks, "README.md has no Python example")
        previous = os.getcwd()
        workdir = os.path.abspath(self.mktemp())
        os.makedirs(workdir)
        os.chdir(workdir)
        self.addCleanup(os.chdir, previous)
        for block in blocks:
            exec(compile(block, "README.md", "exec"), {"print": lambda *a: None})
        self.assertTrue(os.path.isdir(os.path.join(workdir, "STORE", "commitlog")))
