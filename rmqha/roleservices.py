# -*- test-case-name: tests.test_roles,tests.test_rolemachine,tests.test_epochs -*-
"""
What a broker's role machine (L{rmqha.ha.roles.RoleMachine}) builds and
does to change the role: the master side and the replica, built from the
broker's settings and parts, and a promotion's steps (the incomplete tail
dropped, the epoch recorded on disk first).
"""

from __future__ import annotations

from typing import Any, Callable

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.logger import Logger

from rmqha.ha.auth import GroupAuth
from rmqha.ha.config import MasterKind, Role
from rmqha.ha.epochs import EpochFile
from rmqha.ha.interfaces import IFence
from rmqha.ha.masterside import MasterSide
from rmqha.ha.replica import Replica
from rmqha.listening import BrokerPorts
from rmqha.puts import PutPath
from rmqha.settings import BrokerSettings
from rmqha.store.commitlog import CommitLog
from rmqha.store.service import CommitLogService

__all__ = ["RoleServices", "default_max_cut"]


def default_max_cut(slave_fallbehind_max: int) -> int:
    """
    The most bytes a failover slave's checks may cut from its log by
    default: twice C{haSlaveFallbehindMax} -- an in-sync member lags its
    master by at most that much, and a deposed master stores at most about
    as much again in its last lease (docs/failover.md, "Bounded cuts").
    """
    return 2 * slave_fallbehind_max


class RoleServices:
    """
    The L{rmqha.ha.roles.RoleHost} of a broker.

    @ivar epochs: the store's epoch file (failover), or C{None}.
    @ivar max_cut: failover: the most bytes a slave's checks may cut.
    """

    _log = Logger(namespace="rmqha.broker.Broker")

    def __init__(
        self,
        reactor: Any,
        settings: BrokerSettings,
        store: CommitLogService,
        ports: BrokerPorts,
        put_path: PutPath,
        *,
        retry_policy: Callable[[int], float] | None,
        epochs: EpochFile | None,
        group_auth: GroupAuth | None,
    ) -> None:
        if epochs is not None and settings.followed_kind is MasterKind.ROCKETMQ:
            raise ValueError(
                "master kind rocketmq and epochs (failover) do not go together: a "
                "RocketMQ master keeps no epochs"
            )
        self._reactor = reactor
        self._settings = settings
        self._store = store
        self._ports = ports
        self._put_path = put_path
        self._retry_policy = retry_policy
        self.epochs = epochs
        self.group_auth = group_auth
        self.max_cut = (
            settings.max_cut
            if settings.max_cut is not None
            else default_max_cut(settings.slave_fallbehind_max)
        )

    @property
    def _commitlog(self) -> CommitLog:
        commitlog = self._store.commitlog
        if commitlog is None:
            raise RuntimeError("the broker is not running")
        return commitlog

    def master_side(self, role: Role, fence: IFence) -> MasterSide:
        """
        A master's side for C{role}, built with C{fence}.
        """
        s = self._settings
        return MasterSide(
            self._reactor,
            s.ha_listen,
            self._store,
            sync=role is Role.SYNC_MASTER,
            config=s.ha_config,
            peer_policy=s.peer_policy,
            in_sync_replicas=s.in_sync_replicas,
            min_in_sync_replicas=s.min_in_sync_replicas,
            slave_fallbehind_max=s.slave_fallbehind_max,
            slave_timeout=s.slave_timeout,
            replication_wait=self._put_path.replication_wait,
            limited=self._ports.limited,
            held=self._ports.held,
            auth=self.group_auth,
            fence=fence,
            # A put's wait fires with its result, counted.
            finish=self._put_path.result,
        )

    def replica(
        self, endpoint: str | IStreamClientEndpoint, leader: tuple[str, int] | None
    ) -> Replica:
        """
        A slave's replication from C{endpoint} (failover: the elected
        C{leader}'s node id and epoch).
        """
        s = self._settings
        # A slave's consume queues follow all it holds.
        self._store.dispatch_limit = None
        self._store.dispatch_soon()
        return Replica(
            self._reactor,
            self._store,
            endpoint,
            config=s.ha_config,
            retry_policy=self._retry_policy,
            max_unflushed=s.max_unflushed,
            on_divergence=s.on_divergence,
            probe_timeout=s.probe_timeout,
            master_kind=s.followed_kind,
            replica_id=s.node_id,
            epochs=self.epochs,
            expected_leader=leader,
            max_cut=self.max_cut if self.epochs is not None else None,
            auth=self.group_auth,
        )

    def start_master_side(self, side: MasterSide) -> None:
        """
        Serve slaves from the open log.
        """
        side.open(self._commitlog, self.epochs)
        # Failover, SYNC_MASTER: consumers read only what the in-sync
        # replicas hold (HAService.visible_end).
        self._store.dispatch_limit = side.ha.visible_end
        side.ha.on_acked_end = self._store.dispatch_soon
        side.startService()

    def prepare_promotion(self, from_master: bool, epoch: int | None) -> Deferred[None]:
        """
        A promotion's steps before the master side starts: an incomplete
        record at the log's tail (one still arriving from the old master)
        is dropped, then the epoch recorded.
        """
        if not from_master:
            self._commitlog.discard_incomplete_record()
        return self._record_epoch(epoch)

    def _record_epoch(self, epoch: int | None) -> Deferred[None]:
        """
        Flush the log up to its max offset, then add C{(epoch, max offset)}
        to the epoch file (nothing for C{None}).  The entry must never
        name bytes a crash could lose (docs/failover.md).
        """
        if epoch is None:
            return succeed(None)
        epochs = self.epochs
        assert epochs is not None
        commitlog = self._commitlog
        start = commitlog.max_offset
        store = self._store

        def flushed(_: object, tries: int) -> Deferred[None] | None:
            if commitlog.flushed_offset < start:
                if tries == 0:
                    raise OSError(
                        f"cannot take epoch {epoch}: the commit log is flushed up to "
                        f"{commitlog.flushed_offset}, not to its max offset {start}"
                    )
                # (The flush that was running may have ended short of it.)
                return store.flush_now(thorough=True).addCallback(flushed, tries - 1)
            epochs.append(epoch, start)
            self._log.info(
                "epoch {epoch} starts at offset {start}", epoch=epoch, start=start
            )
            return None

        return store.flush_now(thorough=True).addCallback(flushed, 1)
