"""
Moved to L{rmqha.store.commitlog}; this shim is removed after issue 13's merge.
"""

from rmqha.store.commitlog import *  # noqa: F401,F403
from rmqha.store.commitlog import (  # noqa: F401
    DEFAULT_SEGMENT_SIZE,
    MAX_SEGMENT_SIZE,
    MIN_SEGMENT_SIZE,
    AppendResult,
    CommitLog,
    CorruptRecordError,
    CorruptReplicaError,
    CorruptStoreError,
    Damage,
    FlushDiskType,
    FlushPlan,
    Message,
    MessageRejected,
    OffsetMismatchError,
    OffsetOutOfRangeError,
    ReadOnlyStoreError,
    Record,
    RecordError,
    RecoveryReport,
    RepairReport,
    SegmentCreateError,
    StoreError,
    StoreLockedError,
    VerifyReport,
    repair_store,
    segment_name,
    verify_store,
)
