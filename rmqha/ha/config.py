# -*- test-case-name: tests.test_tap,tests.test_settings,tests.test_roles -*-
"""
The HA settings and their defaults, each written once: L{rmqha.settings}
declares them as the defaults of L{rmqha.settings.BrokerSettings} (the
command line, C{broker.conf} and embedders).

RocketMQ's names are given with each (C{MessageStoreConfig}).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from rmqha.ha._wire import MAX_BODY_SIZE

__all__ = [
    "Role",
    "OnDivergence",
    "MasterKind",
    "HAConfig",
    "DEFAULT_HA_CONFIG",
    "DEFAULT_BUSY_POLL",
    "MAX_BUSY_POLL",
    "DEFAULT_HA_LISTEN",
    "DEFAULT_MAX_UNFLUSHED",
    "DEFAULT_IN_SYNC_REPLICAS",
    "DEFAULT_MIN_IN_SYNC_REPLICAS",
    "DEFAULT_SLAVE_TIMEOUT",
    "DEFAULT_SLAVE_FALLBEHIND_MAX",
    "DEFAULT_SYNC_FLUSH_TIMEOUT",
    "DEFAULT_PROBE_TIMEOUT",
    "DEFAULT_ON_DIVERGENCE",
    "DEFAULT_MASTER_KIND",
    "PROBE_FIRST_TIMEOUT",
]


class Role(enum.Enum):
    """
    RocketMQ's C{brokerRole}.
    """

    ASYNC_MASTER = "ASYNC_MASTER"
    SYNC_MASTER = "SYNC_MASTER"
    SLAVE = "SLAVE"
    #: "master" means ASYNC_MASTER, as in RocketMQ's default.
    MASTER = "ASYNC_MASTER"

    @property
    def is_master(self) -> bool:
        return self is not Role.SLAVE


class OnDivergence(enum.StrEnum):
    """
    What a slave does when its log has diverged from its master's
    (docs/reliability.md); "off" (no checks) is C{None}.
    """

    #: Stop replicating; an operator decides.
    HALT = "halt"
    #: Cut the log back to the last common offset (quarantining the cut).
    TRUNCATE = "truncate"
    #: Move the store aside (never deleted) and start afresh.
    REBOOTSTRAP = "rebootstrap"


class MasterKind(enum.StrEnum):
    """
    What a slave takes its master for (C{--master-kind}).
    """

    #: Probe; a master once seen speaking the extension stays rmqha.
    AUTO = "auto"
    #: Never replicate classically.
    RMQHA = "rmqha"
    #: No probe: classic replication at once.
    ROCKETMQ = "rocketmq"


#: rmqha's C{haBusyPoll}, seconds: long enough for a loopback or LAN
#: round trip's reply (200 us: docs/sync.md, "Busy polling").
DEFAULT_BUSY_POLL = 200e-6
#: The longest busy-poll window a setting may ask for, seconds.
MAX_BUSY_POLL = 0.01


@dataclass(frozen=True)
class HAConfig:
    """
    RocketMQ's HA settings (C{MessageStoreConfig}), in seconds and bytes.
    """

    #: C{haTransferBatchSize}: the most body bytes in one frame.
    transfer_batch_size: int = 32 * 1024
    #: C{haSendHeartbeatInterval}: heartbeat after this much silence.
    heartbeat_interval: float = 5.0
    #: C{haHousekeepingInterval}: drop a peer silent for this long.
    housekeeping_interval: float = 20.0
    #: C{syncFromLastFile}: an empty slave gets only the last segment
    #: (4.9's rule) instead of the whole log.
    sync_from_last_file: bool = False
    #: rmqha's: seconds the reactor polls without sleeping before it sleeps
    #: while a SYNC put waits for its ack (master) or frames come back to
    #: back (slave); 0: off (L{rmqha._busypoll}).
    busy_poll: float = DEFAULT_BUSY_POLL

    def __post_init__(self) -> None:
        if not 0 < self.transfer_batch_size <= MAX_BODY_SIZE:
            raise ValueError(
                f"haTransferBatchSize {self.transfer_batch_size} must be between 1 "
                f"and {MAX_BODY_SIZE} (what a RocketMQ slave accepts)"
            )
        if self.heartbeat_interval <= 0:
            raise ValueError(
                f"haSendHeartbeatInterval {self.heartbeat_interval} must be positive"
            )
        if not 0 <= self.busy_poll <= MAX_BUSY_POLL:
            raise ValueError(
                f"haBusyPoll {round(self.busy_poll * 1e6)} us must be between 0 and "
                f"{round(MAX_BUSY_POLL * 1e6)}"
            )
        if self.housekeeping_interval <= 0:
            raise ValueError(
                f"haHousekeepingInterval {self.housekeeping_interval} must be positive"
            )


#: RocketMQ's defaults (frozen, so one instance can be shared).
DEFAULT_HA_CONFIG = HAConfig()

#: The master's HA port (RocketMQ: C{listenPort} + 1).
DEFAULT_HA_LISTEN = "tcp:10912"
#: A slave stops reading while this much received data is not on disk.
DEFAULT_MAX_UNFLUSHED = 256 * 1024 * 1024
#: C{inSyncReplicas}: copies (the master's included) a SYNC_MASTER put
#: waits for; 2 is 4.x's SYNC_MASTER.
DEFAULT_IN_SYNC_REPLICAS = 2
#: C{minInSyncReplicas}: fewer in-sync copies fail a put at once.
DEFAULT_MIN_IN_SYNC_REPLICAS = 1
#: C{slaveTimeout}, seconds.
DEFAULT_SLAVE_TIMEOUT = 3.0
#: C{haSlaveFallbehindMax}: a slave this far behind is not in sync.
DEFAULT_SLAVE_FALLBEHIND_MAX = 256 * 1024 * 1024
#: C{syncFlushTimeout}, seconds.
DEFAULT_SYNC_FLUSH_TIMEOUT = 5.0
#: A slave's most seconds to wait for its master's control answer.
DEFAULT_PROBE_TIMEOUT = 3.0
DEFAULT_ON_DIVERGENCE: OnDivergence | None = OnDivergence.HALT
DEFAULT_MASTER_KIND = MasterKind.AUTO
#: Seconds a slave waits for the first byte of its master's answer to the
#: probe (an rmqha master answers at once; a RocketMQ master never does)
#: before taking the master for RocketMQ's, unless it spoke the extension
#: before.  The whole answer may take up to the probe timeout.
PROBE_FIRST_TIMEOUT = 0.5
