"""
Tests for L{rmqha.demo.compare_stores}.
"""

from __future__ import annotations

import os

from twisted.trial.unittest import SynchronousTestCase

from rmqha.demo import compare_stores


class CompareStoresTests(SynchronousTestCase):
    """
    The demo's final check really compares bytes.
    """

    def make(self, files: dict[str, bytes]) -> str:
        root = self.mktemp()
        os.makedirs(os.path.join(root, "commitlog"))
        for name, data in files.items():
            with open(os.path.join(root, "commitlog", name), "wb") as f:
                f.write(data)
        return root

    def test_identical(self) -> None:
        """
        Same names and bytes: identical, with the count of bytes compared.
        """
        files = {"0" * 20: b"a" * 3000000, "1".zfill(20): b"b" * 10}
        self.assertEqual(compare_stores(self.make(files), self.make(files)), (True, 2, 3000010))

    def test_one_byte_differs(self) -> None:
        """
        One byte different past the first MiB: not identical.
        """
        a = b"a" * 3000000
        b = a[:2000000] + b"x" + a[2000001:]
        identical, _, _ = compare_stores(self.make({"0" * 20: a}), self.make({"0" * 20: b}))
        self.assertFalse(identical)

    def test_different_files(self) -> None:
        """
        A segment missing on one side: not identical.
        """
        self.assertFalse(
            compare_stores(self.make({"0" * 20: b"a"}), self.make({}))[0]
        )
