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

    def test_codec_target_catches_a_divergent_accelerator(self) -> None:
        """
        The C{codec} target fails when the compiled codec answers anything
        but what the pure one does (here: a hop that stops one record
        early), and passes with the real one.
        """
        from rmqha.store import _record

        real = _record._accel
        if real is None:
            self.skipTest("rmqha.store._speedups is not built or RMQHA_PURE is set")

        class Divergent:
            def __getattr__(self, name: str) -> object:
                return getattr(real, name)

            @staticmethod
            def walk_valid(*args: object) -> tuple[int, int, int]:
                stop, records, last = real.walk_valid(*args)
                return (stop, records - 1, last) if records else (stop, records, last)

        corpus = fuzz._Corpus(random.Random(3))
        rng = random.Random(5)
        for _ in range(50):
            fuzz._codec_case(rng, corpus)
        self.patch(_record, "_accel", Divergent())
        self.assertRaises(
            AssertionError,
            lambda: [fuzz._codec_case(rng, corpus) for _ in range(50)],
        )

    def test_auth_target_catches_a_handshake_that_accepts_forgeries(self) -> None:
        """
        The C{auth} target fails when a handshake accepts a proof it should
        not (here: MACs compared as always equal), and passes with the
        real comparison.
        """
        from rmqha.ha import auth

        corpus = fuzz._Corpus(random.Random(3))
        rng = random.Random(5)
        for _ in range(300):
            fuzz._auth_case(rng, corpus)
        self.patch(auth.hmac, "compare_digest", lambda a, b: True)
        self.assertRaises(
            AssertionError, lambda: [fuzz._auth_case(rng, corpus) for _ in range(300)]
        )


class RemotingTargetTests(SynchronousTestCase):
    def test_only_remoting(self) -> None:
        """
        C{only} runs just the named targets; the remoting ones are clean;
        an unknown name is refused.
        """
        result = fuzz.run(400, seed=2, only=["remoting", "remoting-protocol"])
        self.assertEqual(result["failures"], [])
        self.assertEqual(set(result["per_target"]), {"remoting", "remoting-protocol"})
        self.assertRaises(ValueError, fuzz.run, 1, 1, None, ["nope"])

    def test_pulls(self) -> None:
        """
        The C{pulls} target is clean, and catches a held pull that is
        never let go (here: its release broken).
        """
        result = fuzz.run(300, seed=2, only=["pulls"])
        self.assertEqual((result["failures"], set(result["per_target"])), ([], {"pulls"}))
        from rmqha.remoting.pulls import PullHandlers

        self.patch(PullHandlers, "_release", lambda self, held: False)
        result = fuzz.run(300, seed=2, only=["pulls"])
        self.assertTrue(any("stays held" in f for f in result["failures"]), result["failures"][:3])

    def test_remoting_target_catches_a_stray_exception(self) -> None:
        """
        The C{remoting} target fails when the decoder lets an error of
        another type out (here: a KeyError from the binary header).
        """
        from rmqha.remoting import _frames

        def broken(header: bytes, body: bytes) -> object:
            raise KeyError("stray")

        self.patch(_frames, "_command_from_binary", broken)
        corpus = fuzz._Corpus(random.Random(3))
        rng = random.Random(5)
        self.assertRaises(
            KeyError, lambda: [fuzz._remoting_case(rng, corpus) for _ in range(200)]
        )
