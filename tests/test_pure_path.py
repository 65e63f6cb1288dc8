"""
The crash-recovery, replica-validation and hostile-input (fuzz) suites
again, on the pure-Python codec (C{RMQHA_PURE=1}'s path): the default run
takes the compiled one where it is built, and the guarantees must hold on
both (docs/architecture.md, "the compiled accelerator").  The codec's own
tests run on both in L{tests.test_speedups}; the real-process crash test
in L{tests.integration.test_crash_consistency}.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from rmqha.store import _record
from tests import (
    test_checked_framing,
    test_commitlog,
    test_consumequeue,
    test_recovery,
    test_slave,
)
from tests._helpers import PurePath
from tools import fuzz


class PureTornTailTests(PurePath, test_recovery.TornTailTests):
    """L{test_recovery.TornTailTests} on the pure-Python path."""


class PureSegmentsPastTheEndTests(PurePath, test_recovery.SegmentsPastTheEndTests):
    """L{test_recovery.SegmentsPastTheEndTests} on the pure-Python path."""


class PureUnfinishedSegmentTests(PurePath, test_recovery.UnfinishedSegmentTests):
    """L{test_recovery.UnfinishedSegmentTests} on the pure-Python path."""


class PureWalkStartTests(PurePath, test_recovery.WalkStartTests):
    """L{test_recovery.WalkStartTests} on the pure-Python path."""


class PureReadOnlyRecoveryTests(PurePath, test_recovery.ReadOnlyRecoveryTests):
    """L{test_recovery.ReadOnlyRecoveryTests} on the pure-Python path."""


class PureReplicaTailTests(PurePath, test_recovery.ReplicaTailTests):
    """L{test_recovery.ReplicaTailTests} on the pure-Python path."""


class PureFastVerifyTests(PurePath, test_consumequeue.FastVerifyTests):
    """L{test_consumequeue.FastVerifyTests} on the pure-Python path."""


class PurePutTests(PurePath, test_commitlog.PutTests):
    """L{test_commitlog.PutTests} on the pure-Python path."""


class PureBatchPutTests(PurePath, test_commitlog.BatchPutTests):
    """L{test_commitlog.BatchPutTests} on the pure-Python path."""


class PureReplicaAppendTests(PurePath, test_commitlog.ReplicaAppendTests):
    """L{test_commitlog.ReplicaAppendTests} on the pure-Python path."""


class PureReplicaValidationTests(PurePath, test_commitlog.ReplicaValidationTests):
    """L{test_commitlog.ReplicaValidationTests} on the pure-Python path."""


class PureTruncateReplicaTests(PurePath, test_commitlog.TruncateReplicaTests):
    """L{test_commitlog.TruncateReplicaTests} on the pure-Python path."""


class PureRecordsAndOpeningTests(PurePath, test_commitlog.RecordsAndOpeningTests):
    """L{test_commitlog.RecordsAndOpeningTests} on the pure-Python path."""


class PureSlaveFrameTests(PurePath, test_slave.FrameTests):
    """L{test_slave.FrameTests} on the pure-Python path."""


class PureCheckedSlaveTests(PurePath, test_checked_framing.SlaveTests):
    """L{test_checked_framing.SlaveTests} on the pure-Python path."""


class PureCheckedConversationTests(PurePath, test_checked_framing.ConversationTests):
    """L{test_checked_framing.ConversationTests} on the pure-Python path."""


class PurePathTests(PurePath, SynchronousTestCase):
    def test_codec_switched(self) -> None:
        """
        Inside these tests no compiled codec is in use (so that the
        classes above do test the pure path).
        """
        self.assertIsNone(_record._accel)

    def test_fuzz_short_run_clean(self) -> None:
        """
        Hostile input on the pure path: two thousand fuzz cases over every
        target, no failure (the compiled codec's own target is skipped
        here: there is nothing to compare the pure codec with).
        """
        result = fuzz.run(2000, seed=11)
        self.assertEqual(result["failures"], [])
        self.assertEqual(result["codec"], "pure Python")
        self.assertTrue(all(result["per_target"].values()))
