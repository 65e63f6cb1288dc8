# -*- test-case-name: tests.test_remoting_sync -*-
"""
A slave's metadata sync: RocketMQ 4.9.8's C{SlaveSynchronize.syncAll},
as C{BrokerController.handleSlaveSynchronize} schedules it -- 3 s after
the broker becomes a slave, then every 10 s -- copying the master's topic
config (GET_ALL_TOPIC_CONFIG 21), consumer offsets (GET_ALL_CONSUMER_OFFSET
43), delay offsets (GET_ALL_DELAY_OFFSET 45) and subscription groups
(GET_ALL_SUBSCRIPTIONGROUP_CONFIG 201) into the slave's
L{BrokerMetadata}, each applied and persisted as RocketMQ does
(L{BrokerMetadata.apply_master_topics} and its siblings).

The master's remoting address comes from L{MetadataSync.set_master_address}:
a setting (C{--master-remoting} / C{masterRemotingAddress}) or, as in
RocketMQ, the C{masterAddr} a NameServer hands back on registration.  While
none is known the ticks do nothing, as C{syncAll} does with a null
C{masterAddr}.

docs/remoting.md, "The slave's metadata sync", says what is applied, what
a promoted master keeps and where rmqha differs from RocketMQ.
"""

from __future__ import annotations

import enum
from typing import Any, Callable, Final

import attrs
from twisted.application.service import Service
from twisted.internet.defer import CancelledError, Deferred, ensureDeferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from rmqha.remoting._frames import RemotingCommand
from rmqha.remoting.codes import RequestCode, ResponseCode
from rmqha.remoting.metadata import BrokerMetadata, MetadataError
from rmqha.remoting.protocol import (
    ConnectionClosedError,
    RemotingClient,
    RemotingRequestError,
    RequestTimeoutError,
)
from rmqha.settings import master_description, parse_host_port

__all__ = [
    "FIRST_DELAY",
    "INTERVAL",
    "REQUEST_TIMEOUT",
    "RELOG_INTERVAL",
    "SyncTable",
    "SyncFailure",
    "SyncStatus",
    "MetadataSync",
    "remoting_client",
]

#: Seconds from becoming a slave to the first sync (BrokerController L1128-1138).
FIRST_DELAY: Final = 3.0
#: Seconds between syncs.
INTERVAL: Final = 10.0
#: Each request's deadline, as C{BrokerOuterAPI}'s C{invokeSync(addr, request, 3000)}.
REQUEST_TIMEOUT: Final = 3.0
#: A failure that goes on is logged again at most this often (seconds).
RELOG_INTERVAL: Final = 600.0


class SyncTable(enum.Enum):
    """
    The four steps of a sync, in C{syncAll}'s order, with their request
    codes.
    """

    TOPICS = ("topics", RequestCode.GET_ALL_TOPIC_CONFIG)
    CONSUMER_OFFSETS = ("consumer_offsets", RequestCode.GET_ALL_CONSUMER_OFFSET)
    DELAY_OFFSETS = ("delay_offsets", RequestCode.GET_ALL_DELAY_OFFSET)
    SUBSCRIPTION_GROUPS = ("subscription_groups", RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)

    @property
    def label(self) -> str:
        return self.value[0]

    @property
    def code(self) -> RequestCode:
        return self.value[1]


class _StepFailed(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@attrs.define
class SyncFailure:
    """
    One table's failure that goes on: its kind, what the last one said,
    how often since it began.
    """

    kind: str
    message: str
    since: float
    count: int = 1
    logged_at: float = 0.0


@attrs.frozen
class SyncStatus:
    """
    What /status and /metrics show of the sync.

    @ivar active: the broker is a slave and the sync is scheduled.
    @ivar master: the master's remoting address, or C{None}.
    @ivar last_success: when the last sync whose four steps all succeeded
        ended (clock seconds), or C{None}.
    @ivar last_attempt: when the last sync ended, whatever its outcome.
    @ivar syncs: syncs run; C{complete}: those whose four steps succeeded.
    @ivar failures: failed steps by (table, kind), since the start.
    @ivar failing: the tables failing now: their kind and message.
    """

    active: bool
    master: str | None
    last_success: float | None
    last_attempt: float | None
    syncs: int
    complete: int
    failures: dict[tuple[str, str], int]
    failing: dict[str, tuple[str, str]]

    def age(self, now: float) -> float | None:
        """Seconds since the last complete sync, or C{None}."""
        return None if self.last_success is None else max(0.0, now - self.last_success)

    def as_json(self, now: float) -> dict[str, Any]:
        age = self.age(now)
        return {
            "active": self.active,
            "master": self.master,
            "last_success": self.last_success,
            "last_success_age_seconds": None if age is None else round(age, 3),
            "last_attempt": self.last_attempt,
            "syncs": self.syncs,
            "complete_syncs": self.complete,
            "failures": [
                {"table": table, "kind": kind, "count": n}
                for (table, kind), n in sorted(self.failures.items())
            ],
            "failing": {table: {"kind": k, "error": m} for table, (k, m) in sorted(self.failing.items())},
        }


def remoting_client(reactor: Any, clock: IReactorTime | None = None) -> Callable[[str], RemotingClient]:
    """
    The default way to reach a master at C{host:port}: a plain TCP
    L{RemotingClient} (the remoting port of RocketMQ 4.9 is not TLS by
    default).
    """

    def build(address: str) -> RemotingClient:
        return RemotingClient(reactor, master_description(*parse_host_port(address, "address")), clock=clock)

    return build


class MetadataSync(Service):
    """
    Copies the master's metadata into C{metadata} while this broker is a
    slave (L{set_slave}) and knows its master (L{set_master_address}).

    A sync runs the four steps in turn over one L{RemotingClient}; a step
    that fails (no connection, no answer within C{timeout}, an answer
    other than SUCCESS, a body that is not the table's shape or is too
    big, a file that cannot be written) leaves that table as it was, is
    counted by table and kind, and is logged when it begins, at most every
    L{RELOG_INTERVAL} while it goes on, and when it ends; the other steps
    still run.  A tick while the previous sync still runs is skipped.
    """

    _log = Logger(namespace="rmqha.remoting.sync")

    def __init__(
        self,
        metadata: BrokerMetadata,
        clock: IReactorTime,
        client: Callable[[str], RemotingClient],
        *,
        first_delay: float = FIRST_DELAY,
        interval: float = INTERVAL,
        timeout: float = REQUEST_TIMEOUT,
        relog_interval: float = RELOG_INTERVAL,
    ) -> None:
        """
        @param client: builds the (not yet started) client of a master at
            C{host:port} (L{remoting_client}).
        """
        self.metadata = metadata
        self.clock = clock
        self._build_client = client
        self.first_delay = first_delay
        self.interval = interval
        self.timeout = timeout
        self.relog_interval = relog_interval
        self.master: str | None = None
        self._client: RemotingClient | None = None
        self._slave = False
        self._first: IDelayedCall | None = None
        self._loop: LoopingCall | None = None
        self._syncing: Deferred[None] | None = None
        self.last_success: float | None = None
        self.last_attempt: float | None = None
        self.syncs = 0
        self.complete = 0
        self.failures: dict[tuple[str, str], int] = {}
        self._failing: dict[SyncTable, SyncFailure] = {}

    # -- inputs ------------------------------------------------------------------

    def set_master_address(self, address: str | None) -> None:
        """
        The master's remoting address C{host:port}, or C{None} (none
        known: the ticks do nothing).  A new address replaces the old
        connection, as a new C{masterAddr} does in RocketMQ, and, once the
        periodic syncs run, is synced at once.

        @raise ValueError: not C{host:port}.
        """
        if address is not None:
            parse_host_port(address, "master remoting address")
        if address == self.master:
            return
        self.master = address
        if self._syncing is not None:
            self._syncing.cancel()
        self._drop_client()
        if address is not None:
            self._log.info("metadata sync: the master's remoting address is {address}", address=address)
            if self._loop is not None and self._loop.running:
                # (A new master -- a failover's --: synced now, not at the
                # next tick up to INTERVAL away. 4.9.8 waits for it. Its
                # consumer offsets are what this node serves if it is
                # elected next.)
                self._tick()

    def set_slave(self, slave: bool) -> None:
        """
        The broker became a slave (the first sync in C{first_delay}, then
        every C{interval}) or stopped being one (the sync stops; what was
        synced stays: RocketMQ's C{changeToMaster} keeps the tables).
        """
        if slave == self._slave:
            return
        self._slave = slave
        self._reschedule()

    # -- the schedule -------------------------------------------------------------

    @property
    def active(self) -> bool:
        return self._first is not None or self._loop is not None

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        self._reschedule()

    def stopService(self) -> Deferred[None]:
        super().stopService()  # type: ignore[no-untyped-call]
        return self._reschedule()

    def _reschedule(self) -> Deferred[None]:
        wanted = self.running and self._slave
        if wanted and not self.active:
            self._first = self.clock.callLater(self.first_delay, self._begin)
        elif not wanted:
            if self._first is not None:
                self._first.cancel()
                self._first = None
            if self._loop is not None:
                if self._loop.running:
                    self._loop.stop()
                self._loop = None
            if self._syncing is not None:
                # (Tables already applied stay; the rest is not fetched.)
                self._syncing.cancel()
            return self._drop_client()
        return succeed(None)

    def _begin(self) -> None:
        self._first = None
        loop = self._loop = LoopingCall(self._tick)
        loop.clock = self.clock
        loop.start(self.interval, now=True)

    def _tick(self) -> None:
        if self._syncing is not None or self.master is None:
            return
        d = self._syncing = ensureDeferred(self.sync_all())

        def done(result: object) -> None:
            if self._syncing is d:
                self._syncing = None
            if isinstance(result, Failure) and not result.check(CancelledError):
                self._log.failure("metadata sync failed", result)

        d.addBoth(done)

    def _drop_client(self) -> Deferred[None]:
        client, self._client = self._client, None
        if client is None or not client.running:
            return succeed(None)
        return client.stopService()

    # -- one sync ----------------------------------------------------------------

    async def sync_all(self) -> None:
        """
        One sync: the four steps in C{syncAll}'s order, each applied on
        its own.
        """
        master = self.master
        if master is None:
            return
        if self._client is None:
            self._client = self._build_client(master)
            self._client.startService()
        client = self._client
        ok = True
        for table in SyncTable:
            if self.master != master or self._client is not client:
                # Re-pointed meanwhile: the next tick syncs from the new one.
                return
            try:
                await self._step_once(client, table)
            except _StepFailed as e:
                ok = False
                self._failed(table, master, e.kind, str(e))
            else:
                self._recovered(table)
        self.syncs += 1
        now = self.clock.seconds()
        self.last_attempt = now
        if ok:
            self.complete += 1
            self.last_success = now

    async def _step_once(self, client: RemotingClient, table: SyncTable) -> None:
        request = RemotingCommand(code=int(table.code))
        d = client.request(request, self.timeout)
        try:
            response = await d
        except RequestTimeoutError as e:
            raise _StepFailed("timeout", str(e)) from None
        except ConnectionClosedError as e:
            raise _StepFailed("connection", str(e)) from None
        except RemotingRequestError as e:
            raise _StepFailed("connection", str(e)) from None
        if response.code != ResponseCode.SUCCESS:
            try:
                name = ResponseCode(response.code).name
            except ValueError:
                name = "code"
            raise _StepFailed(
                "refused", f"answered {name} ({response.code}): {response.remark or 'no remark'}"
            )
        try:
            text = (response.body or b"").decode("utf-8")
        except UnicodeDecodeError as e:
            raise _StepFailed("bad_body", f"the body's byte {e.start} is not UTF-8") from None
        m = self.metadata
        apply: Callable[[str], object] = {
            SyncTable.TOPICS: m.apply_master_topics,
            SyncTable.CONSUMER_OFFSETS: m.apply_master_consumer_offsets,
            SyncTable.DELAY_OFFSETS: m.apply_master_delay_offsets,
            SyncTable.SUBSCRIPTION_GROUPS: m.apply_master_groups,
        }[table]
        try:
            apply(text)
        except MetadataError as e:
            raise _StepFailed("bad_body", f"the body is refused: {e}") from None
        except OSError as e:
            raise _StepFailed("write", f"cannot write it: {e}") from None

    # -- failures, logged sparingly ---------------------------------------------------

    def _failed(self, table: SyncTable, master: str, kind: str, message: str) -> None:
        key = (table.label, kind)
        self.failures[key] = self.failures.get(key, 0) + 1
        now = self.clock.seconds()
        current = self._failing.get(table)
        text = f"{table.code.name} ({int(table.code)}) from {master}"
        if current is None:
            self._failing[table] = SyncFailure(kind, message, since=now, logged_at=now)
            self._log.warn(
                "metadata sync: {what} failed ({kind}): {error}; the slave's {table} stay as they "
                "are (logged again only if it goes on for {relog:g} s)",
                what=text, kind=kind, error=message, table=table.label.replace("_", " "),
                relog=self.relog_interval,
            )
            return
        # (Whatever the kind now: a master that is down fails by turns
        # with "connection" and "timeout", and is one failure going on.)
        current.count += 1
        current.kind, current.message = kind, message
        if now - current.logged_at >= self.relog_interval:
            current.logged_at = now
            self._log.warn(
                "metadata sync: {what} still fails ({kind}), {count} times in {seconds:.0f} s: {error}",
                what=text, kind=kind, count=current.count, seconds=now - current.since, error=message,
            )

    def _recovered(self, table: SyncTable) -> None:
        current = self._failing.pop(table, None)
        if current is not None:
            self._log.info(
                "metadata sync: {code} succeeds again after {count} failures ({kind})",
                code=table.code.name, count=current.count, kind=current.kind,
            )

    # -- what is shown --------------------------------------------------------------------

    def status(self) -> SyncStatus:
        return SyncStatus(
            active=self.active,
            master=self.master,
            last_success=self.last_success,
            last_attempt=self.last_attempt,
            syncs=self.syncs,
            complete=self.complete,
            failures=dict(self.failures),
            failing={t.label: (f.kind, f.message) for t, f in self._failing.items()},
        )
