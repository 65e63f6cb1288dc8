# -*- test-case-name: tests.test_client_consumer -*-
"""
RocketMQ consumers on Twisted, as 4.9.8's Java client consumes in
CLUSTERING mode:

- L{PullConsumer}: the queues of a topic, C{pull(queue, offset)} with
  RocketMQ's statuses, offsets queried and committed by the caller
  (C{DefaultMQPullConsumer}); pulls follow the broker's
  C{suggestWhichBrokerId} (C{PullAPIWrapper}).
- L{PushConsumer}: subscribe to topics with a tag expression and give a
  handler; the consumer sends heartbeats, rebalances the group's queues
  among its members (C{AllocateMessageQueueAveragely}), long-polls each
  of its queues, hands messages to the handler with bounded concurrency,
  and commits per queue the smallest offset not yet consumed
  (C{DefaultMQPushConsumer} with C{ConsumeMessageConcurrentlyService}).
  Delivery is at least once: after a crash, a failover or a rebalance,
  messages consumed but not yet committed come again.  Offsets go to
  masters only (kept here while a broker has none; L{NoMasterError});
  a failed request looks the route up at once; a C{queue_listener} and
  L{PushConsumer.when_balanced} tell which queues a member holds.

A failed handler (an exception, or L{ConsumeStatus.RECONSUME_LATER}) has
its messages handed over again on this consumer after a delay that grows
as RocketMQ's retry levels do (10 s, 30 s, 1 min, ... 2 h); the queue's
offset is not committed past them meanwhile.  4.9.8 sends them back to
the broker instead (CONSUMER_SEND_MSG_BACK, for the schedule service to
redeliver); see docs/client.md, "Consuming".
"""

from __future__ import annotations

import dataclasses
import enum
import os
import random
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from twisted.application.service import Service
from twisted.internet.defer import (
    CancelledError,
    Deferred,
    DeferredList,
    DeferredSemaphore,
    TimeoutError,
    fail,
    maybeDeferred,
)
from twisted.internet.interfaces import IAddress, IDelayedCall, IReactorTime, IStreamClientEndpoint
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from rmqha.client._codec import MessageQueue
from rmqha.remoting.headers import FLAG_COMMIT_OFFSET, FLAG_SUBSCRIPTION, FLAG_SUSPEND
from rmqha.client._consume import (
    MASTER_ID,
    PROPERTY_RETRY_TOPIC,
    ConsumeFromWhere,
    GetConsumerListByGroupRequestHeader,
    GetMaxOffsetRequestHeader,
    NotifyConsumerIdsChangedRequestHeader,
    OffsetResponseHeader,
    ProcessQueue,
    PullMessageRequestHeader,
    PullReplyError,
    PullResult,
    PullStatus,
    ReceivedMessage,
    SearchOffsetRequestHeader,
    Subscription,
    UnregisterClientRequestHeader,
    allocate_averagely,
    consumer_id_list,
    heartbeat_body,
    pull_result,
    retry_topic,
    subscribe_queues,
)
from rmqha.client._routes import (
    API_TIMEOUT,
    CLIENT_LANGUAGE,
    POLL_NAMESRV_INTERVAL,
    NameServers,
    TopicRoutes,
    WatchedEndpoint,
    backoff_delay,
    follow,
    watched_client,
    within,
)
from rmqha.remoting._frames import CustomHeaderError, RemotingCommand, header_from_ext_fields, header_to_ext_fields
from rmqha.remoting.codes import RequestCode, ResponseCode
from rmqha.remoting.offsets import (
    QueryConsumerOffsetRequestHeader,
    QueryConsumerOffsetResponseHeader,
    UpdateConsumerOffsetRequestHeader,
)
from rmqha.remoting.protocol import NO_HANDLER, Dispatcher, IRemotingHandler, RemotingClient, RemotingRequestError

__all__ = [
    "ConsumeStatus",
    "ConsumeFromWhere",
    "ConsumerError",
    "NoMasterError",
    "PullConsumer",
    "PushConsumer",
    "QueueChange",
    "QueueListener",
    "RETRY_DELAYS",
]

#: C{DefaultMQPushConsumer.pullThresholdForQueue}: messages cached per
#: queue before its pulls wait.
PULL_THRESHOLD_FOR_QUEUE: Final = 1000
#: C{pullThresholdSizeForQueue} (100 MiB): body bytes cached per queue.
PULL_THRESHOLD_SIZE_FOR_QUEUE: Final = 100 * 1024 * 1024
#: C{consumeConcurrentlyMaxSpan}: the widest offset span cached per queue.
CONSUME_CONCURRENTLY_MAX_SPAN: Final = 2000
#: C{PULL_TIME_DELAY_MILLS_WHEN_FLOW_CONTROL}: seconds before a pull held
#: back by the bounds is tried again.
FLOW_CONTROL_DELAY: Final = 0.05
#: C{PULL_TIME_DELAY_MILLS_WHEN_EXCEPTION}: seconds after a failed pull
#: (the broker answered a code that is not a pull status), and the longest
#: wait after pulls that failed as a moved broker makes them fail.
PULL_EXCEPTION_DELAY: Final = 3.0
#: The first wait after a pull that failed as a moved broker makes it
#: fail (L{ROUTE_SUSPECT_CODES}, no connection, a timeout, a broker not in
#: the route); it doubles to L{PULL_EXCEPTION_DELAY} (L{backoff_delay}).
PULL_RETRY_FIRST_DELAY: Final = 0.2
#: The first wait before a rebalance round is tried again after one that
#: could not finish (no route, no member list, a start offset unknown);
#: it doubles to the rebalance interval.
REBALANCE_RETRY_FIRST_DELAY: Final = 1.0
#: Codes a broker answers a request that should have gone elsewhere
#: with: the topic unknown there, a slave's refusal, no permission (a
#: broker being demoted).  The topic's route is looked up again at once.
ROUTE_SUSPECT_CODES: Final = frozenset(
    {
        ResponseCode.TOPIC_NOT_EXIST,
        ResponseCode.SERVICE_NOT_AVAILABLE,
        ResponseCode.NO_PERMISSION,
        # (An rmqha failover node that serves no reads now: standing by, or
        # a slave not yet checked against its master; docs/remoting.md.)
        ResponseCode.SYSTEM_BUSY,
    }
)
#: C{BROKER_SUSPEND_MAX_TIME_MILLIS}: how long the broker holds a pull.
SUSPEND_TIMEOUT: Final = 15.0
#: C{CONSUMER_TIMEOUT_MILLIS_WHEN_SUSPEND}: a held pull's deadline.
PULL_TIMEOUT: Final = 30.0
#: C{heartbeatBrokerInterval}, the rebalance period, C{persistConsumerOffsetInterval}.
HEARTBEAT_INTERVAL: Final = 30.0
REBALANCE_INTERVAL: Final = 20.0
PERSIST_INTERVAL: Final = 5.0
#: Seconds after OFFSET_ILLEGAL before the queue's offset is corrected
#: and the queue let go (C{DefaultMQPushConsumerImpl}: 10 s).
OFFSET_ILLEGAL_DELAY: Final = 10.0
#: RocketMQ's delay levels from level 3 on (C{messageDelayLevel}): the
#: wait before the n-th local retry of a failed message, the last kept.
RETRY_DELAYS: Final = (10.0, 30.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 420.0, 480.0,
                       540.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0)
#: Pull answers of a broker that lacks this consumer's heartbeat (or its
#: newest subscription): a heartbeat goes at once.
_NOT_SUBSCRIBED: Final = (ResponseCode.SUBSCRIPTION_NOT_EXIST, ResponseCode.SUBSCRIPTION_NOT_LATEST)


class ConsumeStatus(enum.Enum):
    """C{ConsumeConcurrentlyStatus}: what a handler answers."""

    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


#: A push consumer's handler: the messages (C{consume_batch_size}, 1 by
#: default) of one queue; success is C{None}, C{True} or
#: L{ConsumeStatus.CONSUME_SUCCESS} (or a Deferred of one); anything else,
#: an exception or a failed Deferred asks for them again later.
Handler = Callable[[list[ReceivedMessage]], Any]


class ConsumerError(Exception):
    """A consumer request that failed: one line naming the queue or group and why."""


class NoMasterError(ConsumerError):
    """
    An offset not committed: the route names no master (brokerId 0) for
    the queue's broker, even after a fresh lookup.  Offsets go to masters
    only: a slave's offset table is replaced by its next sync from the
    master.

    @ivar broker_name: the broker.
    """

    def __init__(self, text: str, broker_name: str) -> None:
        super().__init__(text)
        self.broker_name = broker_name


@dataclasses.dataclass(frozen=True)
class QueueChange:
    """
    What a L{PushConsumer} tells its C{queue_listener} when the queues of
    one topic it consumes change (C{MessageQueueListener}).

    @ivar topic: the topic.
    @ivar assigned: the queues taken, each with the offset its pulls
        start from; the listener hears of them before their pulls start.
    @ivar revoked: the queues let go (their offsets committed first if a
        master could take them); handlers still running on them finish.
    @ivar owned: the topic's queues this consumer consumes now.
    """

    topic: str
    assigned: Mapping[MessageQueue, int]
    revoked: frozenset[MessageQueue]
    owned: frozenset[MessageQueue]


#: A push consumer's C{queue_listener}: called on the reactor, its result
#: ignored (an exception is logged).
QueueListener = Callable[[QueueChange], object]


def _route_suspect(error: Exception) -> bool:
    """Whether a failed request suggests the route moved (see L{ROUTE_SUSPECT_CODES})."""
    if isinstance(error, PullReplyError):
        return error.code in ROUTE_SUSPECT_CODES
    return isinstance(error, (RemotingRequestError, ConsumerError, TimeoutError))


def _local_ip() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


@dataclasses.dataclass
class _Link:
    client: RemotingClient
    endpoint: WatchedEndpoint


class _Client:
    """
    What both consumers share: NameServer routes, one kept connection per
    broker address, the broker suggested for each queue's pulls
    (C{PullAPIWrapper.pullFromWhichNodeTable}), and the requests.
    """

    _log = Logger()

    def __init__(
        self,
        reactor: Any,
        namesrv: str | Sequence[str | IStreamClientEndpoint],
        group: str,
        *,
        clock: IReactorTime | None,
        endpoint_for: Callable[[str], str | IStreamClientEndpoint] | None,
        handler: IRemotingHandler,
        api_timeout: float,
        poll_interval: float,
        rng: random.Random | None,
        after_route_change: Callable[[], object] = lambda: None,
    ) -> None:
        """
        @param after_route_change: called after a kept route changed (a
            master promoted, a broker added or restarted at a new address:
            the push consumer heartbeats).
        """
        from rmqha.remoting.namesrv import parse_namesrv_addr
        from rmqha.settings import master_description, parse_host_port

        if isinstance(namesrv, str):
            namesrv = parse_namesrv_addr(namesrv)
        self.reactor = reactor
        self.clock: IReactorTime = clock if clock is not None else reactor
        self.group = group
        self.api_timeout = api_timeout
        self.handler = handler
        self.endpoint_for: Callable[[str], str | IStreamClientEndpoint] = endpoint_for or (
            lambda addr: master_description(*parse_host_port(addr, "broker address"))
        )
        self.rng = rng if rng is not None else random.Random()
        self.routes = TopicRoutes(
            NameServers(reactor, namesrv, self.clock, rng=self.rng),
            self.clock,
            rng=self.rng,
            api_timeout=api_timeout,
            poll_interval=poll_interval,
            auto_create_topic=False,
            on_change=self._routes_changed,
        )
        self.links: dict[str, _Link] = {}
        #: C{pullFromWhichNodeTable}: the brokerId each queue pulls from next.
        self.suggested: dict[MessageQueue, int] = {}
        self.after_route_change = after_route_change

    def start(self) -> None:
        self.routes.start()

    def stop(self) -> "Deferred[Any]":
        links, self.links = list(self.links.values()), {}
        stops = [self.routes.stop()] + [link.client.stopService() for link in links]
        return DeferredList(stops).addCallback(lambda _: None)

    def _routes_changed(self) -> None:
        named = self.routes.addresses()
        for addr in [a for a in self.links if a not in named]:
            self.links.pop(addr).client.stopService()
        self.after_route_change()

    def link(self, addr: str) -> _Link:
        link = self.links.get(addr)
        if link is None:
            client, watched = watched_client(self.reactor, self.endpoint_for(addr), addr, self.clock, self.handler)
            link = self.links[addr] = _Link(client, watched)
            client.startService()
        return link

    # -- routes ------------------------------------------------------------------

    async def queues(self, topic: str) -> list[MessageQueue]:
        """C{fetchSubscribeMessageQueues}: the readable queues of C{topic}."""
        info = self.routes.table.get(topic)
        if info is None:
            await within(self.routes.refresh(topic), self.api_timeout, self.clock)
            info = self.routes.table.get(topic)
        if info is None:
            why = self.routes.errors.get(topic) or "no route"
            raise ConsumerError(f"no route to topic {topic!r}: {why}")
        return subscribe_queues(topic, info.route)

    def broker_addrs(self, topic: str, broker_name: str) -> Mapping[int, str]:
        """The addresses by brokerId of C{broker_name} (C{brokerAddrTable})."""
        info = self.routes.table.get(topic)
        candidates = [info] if info is not None else []
        candidates += [i for i in self.routes.table.values() if i is not info]
        for i in candidates:
            for b in i.route.broker_datas:
                if b.broker_name == broker_name and b.addrs:
                    return b.addrs
        return {}

    def find_in_subscribe(
        self, topic: str, broker_name: str, broker_id: int, only_this: bool = False
    ) -> tuple[str, bool] | None:
        """
        C{findBrokerAddressInSubscribe}: the address of C{broker_id}, else
        of C{broker_id + 1} for a slave, else (unless C{only_this}) any
        (the lowest id); and whether it is a slave's.
        """
        addrs = self.broker_addrs(topic, broker_name)
        if not addrs:
            return None
        slave = broker_id != MASTER_ID
        addr = addrs.get(broker_id)
        if addr is None and slave:
            addr = addrs.get(broker_id + 1)
        if addr is None:
            if only_this:
                return None
            first = min(addrs)
            addr, slave = addrs[first], first != MASTER_ID
        return addr, slave

    async def _addr(self, mq: MessageQueue, broker_id: int, only_this: bool = False) -> tuple[str, bool]:
        found = self.find_in_subscribe(mq.topic, mq.broker_name, broker_id, only_this)
        if found is None:
            await within(self.routes.refresh_soon(mq.topic), self.api_timeout, self.clock)
            found = self.find_in_subscribe(mq.topic, mq.broker_name, broker_id, only_this)
        if found is None:
            raise ConsumerError(f"broker {mq.broker_name!r} of queue {mq} is not in the route")
        return found

    async def master_addr(self, mq: MessageQueue) -> str | None:
        """
        The address of the master (brokerId 0) of C{mq}'s broker; if the
        route names none, after one more lookup (L{TopicRoutes.refresh_soon});
        C{None} if it still names none.
        """
        addr = self.broker_addrs(mq.topic, mq.broker_name).get(MASTER_ID)
        if addr is None:
            try:
                await within(self.routes.refresh_soon(mq.topic), self.api_timeout, self.clock)
            except TimeoutError:
                return None
            addr = self.broker_addrs(mq.topic, mq.broker_name).get(MASTER_ID)
        return addr

    def describe_broker(self, mq: MessageQueue) -> str:
        """C{name} and the addresses the route names for it (by brokerId)."""
        addrs = self.broker_addrs(mq.topic, mq.broker_name)
        listed = ", ".join(f"{i}: {a}" for i, a in sorted(addrs.items())) or "none"
        return f"{mq.broker_name} (addresses by brokerId: {listed})"

    def route_failed(self, topic: str) -> None:
        """A request failed as a moved broker makes it fail: look the topic's route up now (at most once a
        second, L{TopicRoutes.refresh_soon}); the next request finds what it says."""
        if self.routes.namesrv.running:
            self.routes.refresh_soon(topic)

    async def request(self, addr: str, command: RemotingCommand, timeout: float) -> RemotingCommand:
        link = self.link(addr)
        if link.endpoint.failure is not None:
            raise ConsumerError(f"broker {addr} is unreachable (last connection attempt: {link.endpoint.failure})")
        response: RemotingCommand = await link.client.request(command, timeout)
        return response

    def _command(self, code: int, header: Any, body: bytes = b"") -> RemotingCommand:
        return RemotingCommand(code, language=CLIENT_LANGUAGE, ext_fields=header_to_ext_fields(header), body=body)

    # -- requests ----------------------------------------------------------------

    async def pull(
        self,
        mq: MessageQueue,
        offset: int,
        max_nums: int,
        subscription: Subscription | None,
        *,
        suspend: float | None,
        commit_offset: int,
        timeout: float,
        post_subscription: bool,
    ) -> PullResult:
        """
        C{pullKernelImpl}: one PULL_MESSAGE to the broker suggested for the
        queue (the master first), the commit flag cleared for a slave; the
        reply's suggestion is kept for the next pull.
        """
        addr, slave = await self._addr(mq, self.suggested.get(mq, MASTER_ID))
        flag = 0
        if commit_offset > 0 and not slave:
            flag |= FLAG_COMMIT_OFFSET
        if suspend is not None:
            flag |= FLAG_SUSPEND
        sub_string = None
        if post_subscription and subscription is not None:
            flag |= FLAG_SUBSCRIPTION
            sub_string = subscription.expression
        header = PullMessageRequestHeader(
            consumer_group=self.group,
            topic=mq.topic,
            queue_id=mq.queue_id,
            queue_offset=offset,
            max_msg_nums=max_nums,
            sys_flag=flag,
            commit_offset=commit_offset if flag & FLAG_COMMIT_OFFSET else 0,
            suspend_timeout_millis=round((suspend or 0) * 1000),
            subscription=sub_string,
            sub_version=subscription.sub_version if subscription is not None else 0,
            expression_type="TAG",
            bname=mq.broker_name,
        )
        try:
            response = await self.request(addr, self._command(RequestCode.PULL_MESSAGE, header), timeout)
            result = pull_result(response, mq, subscription, f"{mq.broker_name} ({addr})")
        except (RemotingRequestError, ConsumerError, PullReplyError, TimeoutError) as e:
            if _route_suspect(e):
                # (The broker suggested may be the one gone: the next pull
                # asks the master the route names then.)
                self.suggested.pop(mq, None)
                self.route_failed(mq.topic)
            raise
        self.suggested[mq] = result.suggest_which_broker_id
        return result

    async def query_offset(self, mq: MessageQueue) -> int:
        """
        C{RemoteBrokerOffsetStore.readOffset(READ_FROM_STORE)}: the group's
        committed offset, from the master; if the route names none even
        after a fresh lookup, or it does not answer, from a slave (lowest
        brokerId first): a slave's table is the master's as of its last
        sync, and an older offset only means messages consumed again.
        -1 when the broker has none (any error code), -2 when no broker
        answered.
        """
        header = QueryConsumerOffsetRequestHeader(self.group, mq.topic, mq.queue_id, mq.broker_name)
        command = self._command(RequestCode.QUERY_CONSUMER_OFFSET, header)
        master = await self.master_addr(mq)
        addrs = [master] if master is not None else []
        addrs += [a for i, a in sorted(self.broker_addrs(mq.topic, mq.broker_name).items()) if a not in addrs]
        errors = [] if addrs else [f"broker {mq.broker_name!r} is not in the route"]
        for addr in addrs:
            try:
                response = await self.request(addr, command, self.api_timeout)
            except (RemotingRequestError, ConsumerError, TimeoutError) as e:
                errors.append(str(e))
                self.route_failed(mq.topic)
                continue
            if response.code != ResponseCode.SUCCESS:
                if response.code in ROUTE_SUSPECT_CODES:
                    self.route_failed(mq.topic)
                return -1
            try:
                return header_from_ext_fields(QueryConsumerOffsetResponseHeader, response.ext_fields).offset
            except CustomHeaderError:
                return -1
        self._log.warn("offset of {group} on {queue} not read: {error}", group=self.group, queue=mq,
                       error="; ".join(errors))
        return -2

    async def commit_offset(self, mq: MessageQueue, offset: int) -> None:
        """
        C{updateConsumeOffsetToBroker}: a oneway UPDATE_CONSUMER_OFFSET to
        the master (brokerId 0), never to a slave: a slave's offset table
        is replaced by its next sync from the master, so a commit there
        is lost.  If the route names no master, it is looked up once more
        first (as Java does; Java then commits to a slave).

        @raise NoMasterError: the route names no master.
        @raise ConsumerError: no connection to it.
        """
        addr = await self.master_addr(mq)
        if addr is None:
            raise NoMasterError(
                f"offset {offset} of {self.group} on {mq} not committed: the route names no master "
                f"for broker {self.describe_broker(mq)}",
                mq.broker_name,
            )
        try:
            header = UpdateConsumerOffsetRequestHeader(self.group, mq.topic, mq.queue_id, offset, mq.broker_name)
            await self.link(addr).client.oneway(self._command(RequestCode.UPDATE_CONSUMER_OFFSET, header))
        except (RemotingRequestError, TimeoutError) as e:
            self.route_failed(mq.topic)
            raise ConsumerError(f"offset {offset} of {self.group} on {mq} not committed: {e}") from None

    async def _offset_request(self, mq: MessageQueue, code: int, header: Any, what: str) -> int:
        try:
            addr, _ = await self._addr(mq, MASTER_ID)
            response = await self.request(addr, self._command(code, header), self.api_timeout)
        except (RemotingRequestError, ConsumerError, TimeoutError) as e:
            self.route_failed(mq.topic)
            raise ConsumerError(f"{what} of {mq} failed: {e}") from None
        if response.code != ResponseCode.SUCCESS:
            if response.code in ROUTE_SUSPECT_CODES:
                self.route_failed(mq.topic)
            raise PullReplyError(f"{what} for {mq}", addr, response.code, response.remark)
        try:
            return header_from_ext_fields(OffsetResponseHeader, response.ext_fields).offset
        except CustomHeaderError as e:
            raise PullReplyError(f"{what} for {mq}", addr, -1, f"unreadable header: {e}") from None

    async def max_offset(self, mq: MessageQueue) -> int:
        """GET_MAX_OFFSET (30): the queue's next offset to be written."""
        header = GetMaxOffsetRequestHeader(mq.topic, mq.queue_id, mq.broker_name)
        return await self._offset_request(mq, RequestCode.GET_MAX_OFFSET, header, "GET_MAX_OFFSET")

    async def min_offset(self, mq: MessageQueue) -> int:
        """GET_MIN_OFFSET (31): the queue's first offset still stored."""
        header = GetMaxOffsetRequestHeader(mq.topic, mq.queue_id, mq.broker_name)
        return await self._offset_request(mq, RequestCode.GET_MIN_OFFSET, header, "GET_MIN_OFFSET")

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """SEARCH_OFFSET_BY_TIMESTAMP (29)."""
        header = SearchOffsetRequestHeader(mq.topic, mq.queue_id, timestamp_ms, mq.broker_name)
        return await self._offset_request(
            mq, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, header, "SEARCH_OFFSET_BY_TIMESTAMP"
        )

    async def consumer_ids(self, topic: str) -> list[str] | None:
        """
        C{findConsumerIdList}: GET_CONSUMER_LIST_BY_GROUP to one broker of
        the topic (a random one, its master if it has one); C{None} on
        any failure (the rebalance of the topic waits for the next round),
        C{[]} when the broker answers that it has no member's heartbeat
        (SYSTEM_ERROR, "no consumer for this group").
        """
        info = self.routes.table.get(topic)
        if info is None or not info.route.broker_datas:
            return None
        brokers = info.route.broker_datas
        b = brokers[self.rng.randrange(len(brokers))]
        addr = b.addrs.get(MASTER_ID) or (b.addrs[min(b.addrs)] if b.addrs else None)
        if addr is None:
            return None
        header = GetConsumerListByGroupRequestHeader(self.group)
        try:
            response = await self.request(
                addr, self._command(RequestCode.GET_CONSUMER_LIST_BY_GROUP, header), self.api_timeout
            )
            if response.code != ResponseCode.SUCCESS:
                raise PullReplyError("GET_CONSUMER_LIST_BY_GROUP", addr, response.code, response.remark)
            return consumer_id_list(response.body)
        except (RemotingRequestError, ConsumerError, PullReplyError, ValueError) as e:
            self._log.warn("consumers of group {group} not listed: {error}", group=self.group, error=e)
            return [] if isinstance(e, PullReplyError) and e.code == ResponseCode.SYSTEM_ERROR else None


class PullConsumer(Service):
    """
    A pull consumer of one group (C{DefaultMQPullConsumer}): the caller
    chooses queues and offsets and commits offsets.

        consumer = PullConsumer(reactor, "127.0.0.1:9876", "my-group")
        consumer.startService()
        queues = await consumer.queues("TopicTest")
        result = await consumer.pull(queues[0], 0, 32)

    L{pull} follows the broker's C{suggestWhichBrokerId}: the next pull of
    the queue goes to the broker id suggested (a slave, when the master
    is behind and C{slaveReadEnable} is on).
    """

    def __init__(
        self,
        reactor: Any,
        namesrv: str | Sequence[str | IStreamClientEndpoint],
        group: str,
        *,
        clock: IReactorTime | None = None,
        endpoint_for: Callable[[str], str | IStreamClientEndpoint] | None = None,
        api_timeout: float = API_TIMEOUT,
        poll_interval: float = POLL_NAMESRV_INTERVAL,
        rng: random.Random | None = None,
    ) -> None:
        self.group = group
        self.client = _Client(
            reactor,
            namesrv,
            group,
            clock=clock,
            endpoint_for=endpoint_for,
            handler=NO_HANDLER,
            api_timeout=api_timeout,
            poll_interval=poll_interval,
            rng=rng,
        )

    def startService(self) -> None:
        Service.startService(self)
        self.client.start()

    def stopService(self) -> "Deferred[Any]":
        Service.stopService(self)
        return self.client.stop()

    def queues(self, topic: str) -> "Deferred[list[MessageQueue]]":
        """C{fetchSubscribeMessageQueues}: the topic's readable queues, sorted."""
        return Deferred.fromCoroutine(self.client.queues(topic))

    def pull(
        self,
        queue: MessageQueue,
        offset: int,
        max_nums: int = 32,
        expression: str = "*",
        *,
        block: bool = False,
        timeout: float | None = None,
    ) -> "Deferred[PullResult]":
        """
        C{pull} (C{block}: C{pullBlockIfNotFound}, the broker holds the
        request up to 20 s for a message to come, deadline 30 s).  The
        subscription goes with the request (flag 0x4): a pull consumer
        sends no heartbeat.

        @raise PullReplyError: a code that is not a pull status.
        @raise ConsumerError: the queue's broker is not in the route.
        """
        sub = Subscription.build(queue.topic, expression, 0)
        return Deferred.fromCoroutine(
            self.client.pull(
                queue,
                offset,
                max_nums,
                sub,
                suspend=20.0 if block else None,
                commit_offset=0,
                timeout=timeout if timeout is not None else (PULL_TIMEOUT if block else 10.0),
                post_subscription=True,
            )
        )

    def query_offset(self, queue: MessageQueue) -> "Deferred[int]":
        """The group's committed offset (-1: none, -2: no broker answered)."""
        return Deferred.fromCoroutine(self.client.query_offset(queue))

    def commit_offset(self, queue: MessageQueue, offset: int) -> "Deferred[None]":
        """C{updateConsumeOffset} + C{persist}: a oneway UPDATE_CONSUMER_OFFSET."""
        return Deferred.fromCoroutine(self.client.commit_offset(queue, offset))

    def max_offset(self, queue: MessageQueue) -> "Deferred[int]":
        return Deferred.fromCoroutine(self.client.max_offset(queue))

    def min_offset(self, queue: MessageQueue) -> "Deferred[int]":
        return Deferred.fromCoroutine(self.client.min_offset(queue))

    def search_offset(self, queue: MessageQueue, timestamp: float) -> "Deferred[int]":
        """The first offset stored at or after C{timestamp} (seconds)."""
        return Deferred.fromCoroutine(self.client.search_offset(queue, round(timestamp * 1000)))


@dataclasses.dataclass(eq=False)
class _Assigned:
    """One queue this consumer consumes (C{PullRequest} + C{ProcessQueue})."""

    mq: MessageQueue
    pq: ProcessQueue
    next_offset: int
    pulling: "Deferred[None] | None" = None
    timer: IDelayedCall | None = None
    retries: set[IDelayedCall] = dataclasses.field(default_factory=set)
    #: Pulls that failed in a row (the back-off's count).
    failures: int = 0


class PushConsumer(Service):
    """
    A push consumer of one group, CLUSTERING (each message to one member
    of the group), started and stopped as a service.

        async def handle(messages):
            for m in messages:
                print(m.topic, m.tags, m.body)

        consumer = PushConsumer(reactor, "127.0.0.1:9876", "my-group", handle)
        consumer.subscribe("TopicTest", "TagA || TagB")
        consumer.startService()

    See docs/client.md, "Consuming".
    """

    _log = Logger()

    def __init__(
        self,
        reactor: Any,
        namesrv: str | Sequence[str | IStreamClientEndpoint],
        group: str,
        handler: Handler,
        *,
        clock: IReactorTime | None = None,
        endpoint_for: Callable[[str], str | IStreamClientEndpoint] | None = None,
        consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
        consume_timestamp: float | None = None,
        pull_batch_size: int = 32,
        consume_batch_size: int = 1,
        max_concurrency: int = 20,
        pull_threshold_for_queue: int = PULL_THRESHOLD_FOR_QUEUE,
        pull_threshold_size_for_queue: int = PULL_THRESHOLD_SIZE_FOR_QUEUE,
        consume_concurrently_max_span: int = CONSUME_CONCURRENTLY_MAX_SPAN,
        retry_delays: Sequence[float] = RETRY_DELAYS,
        post_subscription_when_pull: bool = False,
        stop_timeout: float = 10.0,
        heartbeat_interval: float = HEARTBEAT_INTERVAL,
        rebalance_interval: float = REBALANCE_INTERVAL,
        persist_interval: float = PERSIST_INTERVAL,
        api_timeout: float = API_TIMEOUT,
        poll_interval: float = POLL_NAMESRV_INTERVAL,
        client_id: str | None = None,
        rng: random.Random | None = None,
        queue_listener: QueueListener | None = None,
    ) -> None:
        """
        @param handler: called with each batch of messages (see L{Handler}).
        @param consume_from_where: where a queue the group never committed
            starts: its end (LAST_OFFSET, the default), its start, or the
            first message stored at C{consume_timestamp}.
        @param consume_timestamp: seconds since the epoch (default: 30
            minutes before the start, as Java).
        @param max_concurrency: handlers running at once, all queues
            (C{consumeThreadMax}).
        @param retry_delays: seconds before the n-th retry of a failed
            batch (the last one repeats).
        @param post_subscription_when_pull: send the subscription with
            every pull (flag 0x4); by default the broker uses the
            heartbeat's, as Java.
        @param stop_timeout: how long L{stopService} waits for running
            handlers before it commits what is done.
        @param client_id: C{clientID} (default C{ip@pid#nanoTime}, Java's).
        @param queue_listener: told of each change of the queues this
            consumer consumes, per topic (a L{QueueChange}): after each
            rebalance that changed them, a queue let go after
            OFFSET_ILLEGAL, and at stop (C{MessageQueueListener}).
        """
        if max_concurrency < 1 or consume_batch_size < 1 or not 1 <= pull_batch_size <= 1024:
            raise ValueError(
                f"max_concurrency {max_concurrency}, consume_batch_size {consume_batch_size}, "
                f"pull_batch_size {pull_batch_size}: need 1+, 1+, 1-1024"
            )
        if not retry_delays:
            raise ValueError("retry_delays is empty")
        self.group = group
        self.handler = handler
        self.client = _Client(
            reactor,
            namesrv,
            group,
            clock=clock,
            endpoint_for=endpoint_for,
            handler=Dispatcher({RequestCode.NOTIFY_CONSUMER_IDS_CHANGED: self._notified}),
            api_timeout=api_timeout,
            poll_interval=poll_interval,
            rng=rng,
            after_route_change=self.heartbeat_now,
        )
        self.clock = self.client.clock
        self.consume_from_where = consume_from_where
        self.consume_timestamp = consume_timestamp
        self.pull_batch_size = pull_batch_size
        self.consume_batch_size = consume_batch_size
        self.pull_threshold_for_queue = pull_threshold_for_queue
        self.pull_threshold_size_for_queue = pull_threshold_size_for_queue
        self.consume_concurrently_max_span = consume_concurrently_max_span
        self.retry_delays = tuple(retry_delays)
        self.post_subscription_when_pull = post_subscription_when_pull
        self.stop_timeout = stop_timeout
        self.heartbeat_interval = heartbeat_interval
        self.rebalance_interval = rebalance_interval
        self.persist_interval = persist_interval
        self.client_id = client_id or f"{_local_ip()}@{os.getpid()}#{time.monotonic_ns()}"
        self.subscriptions: dict[str, Subscription] = {}
        #: The queues this consumer consumes now.
        self.assigned: dict[MessageQueue, _Assigned] = {}
        #: C{RemoteBrokerOffsetStore.offsetTable}: the offset to commit per queue.
        self.offsets: dict[MessageQueue, int] = {}
        #: Pulls put off by the bounds (C{queueFlowControlTimes}...).
        self.flow_controlled = 0
        self._slots = DeferredSemaphore(max_concurrency)
        self._handlers: set[Deferred[None]] = set()
        self._loops: list[LoopingCall] = []
        self._starting: Deferred[None] | None = None
        self._rebalancing: Deferred[bool] | None = None
        self._rebalance_again = False
        self._beating: Deferred[None] | None = None
        self._beat_again = False
        self._stopping = False
        self._later: set[IDelayedCall] = set()
        self._stopped: Deferred[None] | None = None
        self.queue_listener = queue_listener
        #: Rebalance rounds begun; rounds in a row that could not complete;
        #: the round tried again after a back-off.
        self._rounds = 0
        self._rebalance_failures = 0
        self._rebalance_retry: IDelayedCall | None = None
        #: L{when_balanced}'s waiters, each with the rounds begun before it.
        self._balanced: list[tuple[Deferred[frozenset[MessageQueue]], int]] = []
        #: Brokers the route names no master for, and the queues whose
        #: offsets wait here for one (warned about).
        self._masterless: dict[str, set[MessageQueue]] = {}

    # -- subscriptions -----------------------------------------------------------

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """
        Consume C{topic}'s messages whose tag the expression names
        (C{"*"}: all; C{"A || B"}).  Before L{startService}; the group's
        retry topic is subscribed too, as Java does.
        """
        from rmqha.remoting.metadata import validate_topic_name

        if self.running:
            raise RuntimeError("subscribe before starting the consumer")
        validate_topic_name(topic)
        version = round(self.clock.seconds() * 1000)
        self.subscriptions[topic] = Subscription.build(topic, expression, version)
        self.subscriptions.setdefault(retry_topic(self.group), Subscription.build(retry_topic(self.group), "*", version))

    # -- the service -------------------------------------------------------------

    def startService(self) -> None:
        if not [t for t in self.subscriptions if t != retry_topic(self.group)]:
            raise RuntimeError(f"consumer group {self.group!r} subscribes to no topic")
        Service.startService(self)
        self._stopping = False
        if self.consume_timestamp is None:
            self.consume_timestamp = self.clock.seconds() - 30 * 60
        self.client.start()
        self._starting = Deferred.fromCoroutine(self._start())
        self._starting.addErrback(self._log_failure, "start")

    def _log_failure(self, failure: Failure, what: str) -> None:
        if not failure.check(CancelledError):
            self._log.failure("consumer group {group}: {what} failed", failure, group=self.group, what=what)

    async def _start(self) -> None:
        for topic in self.subscriptions:
            await self.client.routes.refresh(topic)
            if not self.running:
                return
        await self.heartbeat()
        if not self.running:
            return
        for period, call in (
            (self.heartbeat_interval, self._heartbeat_round),
            (self.rebalance_interval, self.rebalance_now),
            (self.persist_interval, self._persist_round),
        ):
            loop = LoopingCall(call)
            loop.clock = self.clock
            loop.start(period, now=False)
            self._loops.append(loop)
        self.rebalance_now()

    def stopService(self) -> "Deferred[None]":
        """
        Stop: no more pulls; wait (at most C{stop_timeout}) for the
        handlers running; commit every queue's offset; UNREGISTER_CLIENT
        at every broker; close the connections.  Messages pulled and not
        consumed are delivered again to whoever consumes their queue next.
        """
        if self._stopped is not None and not self._stopped.called:
            return follow(self._stopped)  # (a stop under way: the same one)
        Service.stopService(self)
        self._stopped = Deferred.fromCoroutine(self._stop())
        return follow(self._stopped)

    async def _stop(self) -> None:
        self._stopping = True
        if self._starting is not None and not self._starting.called:
            self._starting.cancel()
        for loop in self._loops:
            if loop.running:
                loop.stop()
        self._loops = []
        if self._rebalancing is not None:
            self._rebalancing.cancel()
        if self._rebalance_retry is not None and self._rebalance_retry.active():
            self._rebalance_retry.cancel()
        self._rebalance_retry = None
        waiters, self._balanced = self._balanced, []
        for d, _ in waiters:
            d.errback(ConsumerError(f"consumer group {self.group!r} stopped before a rebalance completed"))
        for call in list(self._later):
            if call.active():
                call.cancel()
        self._later.clear()
        for a in self.assigned.values():
            self._halt(a)
        if self._handlers:
            waiting = DeferredList([follow(d) for d in self._handlers], consumeErrors=True)
            try:
                await within(waiting, self.stop_timeout, self.clock)
            except TimeoutError:
                self._log.warn(
                    "consumer group {group}: {n} handlers still running after {t:g} s; their messages "
                    "are not committed",
                    group=self.group,
                    n=len(self._handlers),
                    t=self.stop_timeout,
                )
        # The final commits go to the masters the NameServers name now: a
        # route kept from before a failover would send them to a node that
        # is a slave since, whose next sync from its master drops them.
        topics = sorted({q.topic for q in self.assigned})
        if topics and self.client.routes.namesrv.running:
            try:
                await within(
                    DeferredList([self.client.routes.refresh(t) for t in topics], consumeErrors=True),
                    self.client.api_timeout,
                    self.clock,
                )
            except TimeoutError:
                pass  # (the routes kept: as before)
        await self._persist_all(final=True)
        await self._unregister()
        for a in self.assigned.values():
            a.pq.dropped = True
        owned, self.assigned = self.assigned, {}
        for topic in sorted({q.topic for q in owned}):
            self._tell(topic, {}, [q for q in owned if q.topic == topic])
        await self.client.stop()

    def _halt(self, a: _Assigned) -> None:
        """Stop a queue's pulls and retries (its handlers run on)."""
        if a.timer is not None and a.timer.active():
            a.timer.cancel()
        a.timer = None
        for call in a.retries:
            if call.active():
                call.cancel()
        a.retries.clear()
        if a.pulling is not None:
            a.pulling.cancel()

    # -- heartbeats --------------------------------------------------------------

    def heartbeat_body(self) -> bytes:
        return heartbeat_body(
            self.client_id, self.group, list(self.subscriptions.values()), self.consume_from_where
        )

    def _heartbeat_round(self) -> None:
        self.heartbeat_now()

    def heartbeat_now(self) -> None:
        """
        A heartbeat round now (or once more after the one under way), once
        started: every 30 s, and at once after a route change (a master
        promoted, a broker restarted at a new address) and when a broker
        answers that it does not know this consumer or its subscription
        (SUBSCRIPTION_NOT_EXIST, SUBSCRIPTION_NOT_LATEST) -- 4.9.8 waits
        for the next 30 s round.
        """
        if not self._loops or self._stopping:
            return
        if self._beating is not None:
            self._beat_again = True
            return
        d = Deferred.fromCoroutine(self.heartbeat())
        if d.called:
            d.addErrback(self._log_failure, "heartbeat")
            return
        self._beating = d

        def done(result: object) -> object:
            self._beating = None
            if self._beat_again:
                self._beat_again = False
                self.heartbeat_now()
            return result

        d.addBoth(done).addErrback(self._log_failure, "heartbeat")

    async def heartbeat(self) -> None:
        """C{sendHeartbeatToAllBroker}: HEART_BEAT (34) to every broker
        address of the subscribed topics, slaves too."""
        body = self.heartbeat_body()
        command = RemotingCommand(RequestCode.HEART_BEAT, language=CLIENT_LANGUAGE, body=body)
        addrs = sorted(self.client.routes.addresses())
        results = await DeferredList(
            [Deferred.fromCoroutine(self.client.request(a, command, self.client.api_timeout)) for a in addrs],
            consumeErrors=True,
        )
        for addr, (ok, result) in zip(addrs, results):
            if isinstance(result, Failure):
                self._log.warn("heartbeat to {addr} failed: {error}", addr=addr, error=result.value)
            elif result.code != ResponseCode.SUCCESS:
                self._log.warn("heartbeat to {addr} answered {code}: {remark}", addr=addr, code=result.code,
                               remark=result.remark)

    async def _unregister(self) -> None:
        header = UnregisterClientRequestHeader(self.client_id, None, self.group)
        command = RemotingCommand(
            RequestCode.UNREGISTER_CLIENT, language=CLIENT_LANGUAGE, ext_fields=header_to_ext_fields(header)
        )
        addrs = sorted(self.client.routes.addresses())
        await DeferredList(
            [Deferred.fromCoroutine(self.client.request(a, command, self.client.api_timeout)) for a in addrs],
            consumeErrors=True,
        )

    # -- rebalancing -------------------------------------------------------------

    def _notified(self, request: RemotingCommand, peer: IAddress | None) -> None:
        """NOTIFY_CONSUMER_IDS_CHANGED (40) from a broker: rebalance now."""
        try:
            header = header_from_ext_fields(NotifyConsumerIdsChangedRequestHeader, request.ext_fields)
        except CustomHeaderError:
            return None
        if header.consumer_group == self.group:
            self.rebalance_now()
        return None

    def rebalance_now(self) -> None:
        """Rebalance (now, or after the round under way)."""
        if not self.running or self._stopping:
            return
        if self._rebalancing is not None:
            self._rebalance_again = True
            return
        if self._rebalance_retry is not None and self._rebalance_retry.active():
            self._rebalance_retry.cancel()
        self._rebalance_retry = None
        self._rounds += 1
        number = self._rounds
        d = Deferred.fromCoroutine(self._rebalance())

        def ended(result: "bool | Failure") -> None:
            self._rebalancing = None
            if isinstance(result, Failure):
                self._log_failure(result, "rebalance")
            self._round_done(result is True, number)
            self._again_if_asked()

        if not d.called:
            self._rebalancing = d
        d.addBoth(ended)

    def _round_done(self, complete: bool, number: int) -> None:
        """
        A rebalance round ended: a complete one fires the L{when_balanced}
        waiters that asked before it began and resets the back-off; one
        that could not finish is tried again after a back-off (1 s doubling
        to the rebalance interval), never in a tight loop.
        """
        if self._stopping:
            return
        if complete:
            self._rebalance_failures = 0
            waiters, self._balanced = self._balanced, []
            for d, after in waiters:
                if after < number:
                    d.callback(self.owned)
                else:
                    self._balanced.append((d, after))
            return
        self._rebalance_failures += 1
        if self._rebalance_retry is None or not self._rebalance_retry.active():
            delay = backoff_delay(
                self._rebalance_failures, REBALANCE_RETRY_FIRST_DELAY, max(self.rebalance_interval, 1.0),
                self.client.rng,
            )
            self._rebalance_retry = self.clock.callLater(delay, self.rebalance_now)

    def _again_if_asked(self) -> None:
        if self._rebalance_again:
            self._rebalance_again = False
            self.rebalance_now()

    @property
    def owned(self) -> frozenset[MessageQueue]:
        """The queues this consumer consumes now (all topics)."""
        return frozenset(self.assigned)

    def when_balanced(self) -> "Deferred[frozenset[MessageQueue]]":
        """
        Fire with L{owned} after the next rebalance round that begins
        after this call and completes: every subscribed topic's route
        found (the group's retry topic may have none), the group's member
        list had with this consumer in it, and every queue allocated to it
        taken (its start offset known).  A round is asked for now (after
        the one under way, if any; after the first, if the consumer is
        still starting).  Rounds that cannot complete are tried again,
        backing off.

        Fails with L{ConsumerError} if the consumer is not running or
        stops first.  Cancel it to stop waiting.
        """
        if not self.running or self._stopping:
            return fail(ConsumerError(f"consumer group {self.group!r} is not running; no rebalance to wait for"))

        def withdraw(d: "Deferred[frozenset[MessageQueue]]") -> None:
            self._balanced = [w for w in self._balanced if w[0] is not d]

        d: Deferred[frozenset[MessageQueue]] = Deferred(canceller=withdraw)
        # (A round under way began before this call: a later one counts.)
        self._balanced.append((d, self._rounds))
        if self._loops:
            self.rebalance_now()
        return d

    async def _rebalance(self) -> bool:
        """One round over every subscribed topic; whether it completed (see L{when_balanced})."""
        complete = True
        for topic in sorted(self.subscriptions):
            info = self.client.routes.table.get(topic)
            if info is None:
                # (The routes kept are refreshed every 30 s; one the
                # NameServers did not know yet is asked for here.)
                await self.client.routes.refresh_soon(topic)
                if self._stopping:
                    return False
                info = self.client.routes.table.get(topic)
            if info is None:
                if topic != retry_topic(self.group):
                    complete = False
                continue
            mq_all = subscribe_queues(topic, info.route)
            cids = await self.client.consumer_ids(topic)
            if cids is not None and self.client_id not in cids and not self._stopping:
                # (The broker asked does not know this consumer yet -- a
                # master just promoted --: a heartbeat, and one more try.)
                await self.heartbeat()
                if not self._stopping:
                    cids = await self.client.consumer_ids(topic)
            if self._stopping:
                return False
            if cids is None or self.client_id not in cids:
                # (Not listed yet: the broker has not had our heartbeat.)
                complete = False
                continue
            mine = allocate_averagely(self.group, self.client_id, mq_all, cids)
            if not await self._reassign(topic, set(mine)):
                complete = False
            if self._stopping:
                return False
        return complete

    async def _reassign(self, topic: str, mine: set[MessageQueue]) -> bool:
        """
        C{updateProcessQueueTableInRebalance}: let go of the queues no
        longer ours (committed first), take the new ones from their start
        offsets (asked for together), tell the listener, then start their
        pulls.  Whether every queue of C{mine} is taken.
        """
        revoked = []
        for mq in [q for q in self.assigned if q.topic == topic and q not in mine]:
            a = self.assigned[mq]
            a.pq.dropped = True
            self._halt(a)
            # removeUnnecessaryMessageQueue: commit, then let go.
            await self._persist(mq)
            self.offsets.pop(mq, None)
            if self.assigned.get(mq) is a:
                del self.assigned[mq]
                revoked.append(mq)
            self._log.info("consumer {cid} let go of {queue}", cid=self.client_id, queue=mq)
            if self._stopping:
                return False
        new = sorted(mine - set(self.assigned), key=lambda q: (q.broker_name, q.queue_id))
        for mq in new:
            self.offsets.pop(mq, None)  # removeDirtyOffset
        starts = await DeferredList([Deferred.fromCoroutine(self._pull_from_where(mq)) for mq in new],
                                    consumeErrors=True)
        if self._stopping:
            return False
        complete = True
        taken: dict[MessageQueue, _Assigned] = {}
        for mq, (ok, offset) in zip(new, starts):
            if not ok or offset < 0:
                complete = False
                continue
            if mq in self.assigned:
                continue
            a = _Assigned(mq, ProcessQueue(), offset)
            self.assigned[mq] = taken[mq] = a
            self._log.info("consumer {cid} takes {queue} from offset {offset}", cid=self.client_id, queue=mq,
                           offset=offset)
        self._tell(topic, {mq: a.next_offset for mq, a in taken.items()}, revoked)
        for a in taken.values():
            self._schedule_pull(a, 0)
        return complete

    def _tell(self, topic: str, assigned: Mapping[MessageQueue, int], revoked: Sequence[MessageQueue]) -> None:
        """Tell the C{queue_listener} of a change of C{topic}'s queues, if there is one."""
        if self.queue_listener is None or not (assigned or revoked):
            return
        change = QueueChange(
            topic, dict(assigned), frozenset(revoked), frozenset(q for q in self.assigned if q.topic == topic)
        )
        try:
            self.queue_listener(change)
        except Exception:
            self._log.failure("queue listener of {group} failed on {change}", group=self.group, change=change)

    async def _pull_from_where(self, mq: MessageQueue) -> int:
        """C{RebalancePushImpl.computePullFromWhere}; -1: not this round."""
        last = await self.client.query_offset(mq)
        if last >= 0:
            return last
        if last == -2:
            return -1
        retry = mq.topic.startswith("%RETRY%")
        try:
            if self.consume_from_where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
                return 0
            if self.consume_from_where is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET:
                return 0 if retry else await self.client.max_offset(mq)
            if retry:
                return await self.client.max_offset(mq)
            assert self.consume_timestamp is not None
            return await self.client.search_offset(mq, round(self.consume_timestamp * 1000))
        except (ConsumerError, PullReplyError, TimeoutError) as e:
            self._log.warn("start offset of {queue} unknown: {error}", queue=mq, error=e)
            return -1

    # -- pulling -----------------------------------------------------------------

    def _schedule_pull(self, a: _Assigned, delay: float) -> None:
        if a.pq.dropped or self._stopping or (a.timer is not None and a.timer.active()):
            return
        a.timer = self.clock.callLater(delay, self._pull, a)

    def _pull(self, a: _Assigned) -> None:
        a.timer = None
        if a.pq.dropped or self._stopping or a.pulling is not None:
            return
        pq = a.pq
        if (
            pq.msg_count > self.pull_threshold_for_queue
            or pq.msg_size > self.pull_threshold_size_for_queue
            or pq.max_span > self.consume_concurrently_max_span
        ):
            self.flow_controlled += 1
            self._schedule_pull(a, FLOW_CONTROL_DELAY)
            return
        d = Deferred.fromCoroutine(self._pull_once(a))
        if d.called:
            d.addErrback(self._pull_failed, a)
            return
        a.pulling = d

        def done(result: object) -> object:
            a.pulling = None
            return result

        d.addBoth(done).addErrback(self._pull_failed, a)

    def _pull_failed(self, failure: Failure, a: _Assigned) -> None:
        if failure.check(CancelledError) or a.pq.dropped or self._stopping:
            return
        self._log.failure("pull of {queue} failed", failure, queue=a.mq)
        self._schedule_pull(a, PULL_EXCEPTION_DELAY)

    async def _pull_once(self, a: _Assigned) -> None:
        mq = a.mq
        try:
            result = await self.client.pull(
                mq,
                a.next_offset,
                self.pull_batch_size,
                self.subscriptions.get(mq.topic),
                suspend=SUSPEND_TIMEOUT,
                commit_offset=self.offsets.get(mq, 0),
                timeout=PULL_TIMEOUT,
                post_subscription=self.post_subscription_when_pull,
            )
        except (RemotingRequestError, ConsumerError, PullReplyError, TimeoutError) as e:
            if not a.pq.dropped and not self._stopping:
                a.failures += 1
                if _route_suspect(e):
                    # (The route was looked up again at once; the pull
                    # goes again soon, backing off to 3 s.)
                    delay = backoff_delay(a.failures, PULL_RETRY_FIRST_DELAY, PULL_EXCEPTION_DELAY, self.client.rng)
                else:
                    delay = PULL_EXCEPTION_DELAY
                if a.failures == 1:
                    self._log.warn("pull of {queue} at {offset} failed: {error}; trying again in {delay:.2g} s",
                                   queue=mq, offset=a.next_offset, error=e, delay=delay)
                if isinstance(e, PullReplyError) and e.code in _NOT_SUBSCRIBED:
                    self.heartbeat_now()
                self._schedule_pull(a, delay)
            return
        if a.failures:
            self._log.info("pulls of {queue} go on after {n} failed", queue=mq, n=a.failures)
            a.failures = 0
        if a.pq.dropped or self._stopping:
            return
        if result.status is PullStatus.FOUND:
            a.next_offset = result.next_begin_offset
            if result.messages:
                messages = [self._reset_retry(m) for m in result.messages]
                a.pq.put(messages)
                self._submit(a, messages)
            self._schedule_pull(a, 0)
        elif result.status in (PullStatus.NO_NEW_MSG, PullStatus.NO_MATCHED_MSG):
            a.next_offset = result.next_begin_offset
            if a.pq.msg_count == 0:  # correctTagsOffset
                self._update_offset(mq, result.next_begin_offset, increase_only=True)
            self._schedule_pull(a, 0)
        else:  # OFFSET_ILLEGAL
            self._log.warn(
                "offset {offset} of {queue} is illegal; the broker says {next}", offset=a.next_offset, queue=mq,
                next=result.next_begin_offset,
            )
            a.next_offset = result.next_begin_offset
            a.pq.dropped = True
            call = self.clock.callLater(OFFSET_ILLEGAL_DELAY, self._offset_illegal, a)
            self._later.add(call)

    def _offset_illegal(self, a: _Assigned) -> None:
        """10 s after OFFSET_ILLEGAL: take the broker's offset, commit it, let the queue go (the next
        rebalance takes it again from there)."""
        self._later = {c for c in self._later if c.active()}
        self._update_offset(a.mq, a.next_offset, increase_only=False)

        async def persist_and_remove() -> None:
            await self._persist(a.mq)
            if self.assigned.get(a.mq) is a:
                del self.assigned[a.mq]
                self._tell(a.mq.topic, {}, [a.mq])

        Deferred.fromCoroutine(persist_and_remove()).addErrback(self._log_failure, "offset correction")

    def _reset_retry(self, m: ReceivedMessage) -> ReceivedMessage:
        """C{resetRetryAndNamespace}: a message of the retry topic shows its original topic."""
        # (The topic first: a message's properties are decoded when read.)
        if m.topic != retry_topic(self.group):
            return m
        original = m.properties.get(PROPERTY_RETRY_TOPIC)
        return m if original is None else dataclasses.replace(m, topic=original)

    # -- consuming ---------------------------------------------------------------

    def _submit(self, a: _Assigned, messages: Sequence[ReceivedMessage]) -> None:
        for i in range(0, len(messages), self.consume_batch_size):
            self._consume(a, list(messages[i : i + self.consume_batch_size]))

    def _consume(self, a: _Assigned, batch: list[ReceivedMessage]) -> None:
        self._slots.acquire().addCallback(self._run_handler, a, batch)

    def _run_handler(self, _: object, a: _Assigned, batch: list[ReceivedMessage]) -> None:
        if a.pq.dropped or self._stopping:
            self._slots.release()
            return
        # (Known as running before it runs: a handler may stop the
        # consumer, and the stop then waits for it to return.)
        running: Deferred[None] = Deferred()
        self._handlers.add(running)

        def finished(_: object) -> None:
            self._handlers.discard(running)
            running.callback(None)

        d: Deferred[Any] = maybeDeferred(self.handler, list(batch))
        d.addBoth(self._handled, a, batch).addBoth(finished)

    def _handled(self, result: object, a: _Assigned, batch: list[ReceivedMessage]) -> None:
        self._slots.release()
        if isinstance(result, Failure):
            self._log.failure("handler of {group} failed on {queue}", result, group=self.group, queue=a.mq)
            ok = False
        else:
            ok = result is None or result is True or result is ConsumeStatus.CONSUME_SUCCESS
        if ok:
            offset = a.pq.remove(batch)
            if offset >= 0 and not a.pq.dropped:
                self._update_offset(a.mq, offset, increase_only=True)
            return
        if a.pq.dropped or self._stopping:
            return
        times = batch[0].reconsume_times
        delay = self.retry_delays[min(times, len(self.retry_delays) - 1)]
        again = [dataclasses.replace(m, reconsume_times=m.reconsume_times + 1) for m in batch]
        self._log.info(
            "{n} messages of {queue} from offset {offset} consumed again in {delay:g} s (retry {times})",
            n=len(batch), queue=a.mq, offset=batch[0].queue_offset, delay=delay, times=times + 1,
        )

        def retry() -> None:
            a.retries.discard(call)
            self._consume(a, again)

        call = self.clock.callLater(delay, retry)
        a.retries.add(call)

    # -- offsets -----------------------------------------------------------------

    def _update_offset(self, mq: MessageQueue, offset: int, increase_only: bool) -> None:
        """C{RemoteBrokerOffsetStore.updateOffset}."""
        old = self.offsets.get(mq)
        if old is None or not increase_only or offset > old:
            self.offsets[mq] = offset

    async def _persist(self, mq: MessageQueue) -> None:
        """Commit C{mq}'s offset now (a queue let go): to its master; if there is none, the offset is not
        committed (said in one line) and the next owner starts from the last one committed."""
        offset = self.offsets.get(mq)
        if offset is None:
            return
        try:
            await self.client.commit_offset(mq, offset)
        except (ConsumerError, TimeoutError) as e:
            self._log.warn("{error}", error=e)

    def _persist_round(self) -> None:
        Deferred.fromCoroutine(self._persist_all()).addErrback(self._log_failure, "offset commit")

    async def _persist_all(self, final: bool = False) -> None:
        """
        C{persistAll}: commit the offset of every queue consumed now
        (oneway), to each broker's master only.  A broker the route names
        no master for (after one more lookup) keeps its queues' offsets
        here until the next round: one warning line when that begins (per
        broker, naming the queues new to it), one line when its offsets go
        again.  C{final} (the stop): what cannot be committed is said in
        one line per broker, offsets included.
        """
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in list(self.assigned):
            if mq in self.offsets:
                by_broker.setdefault(mq.broker_name, []).append(mq)
        await DeferredList(
            [Deferred.fromCoroutine(self._persist_broker(name, queues, final)) for name, queues in by_broker.items()],
            consumeErrors=True,
        )

    async def _persist_broker(self, name: str, queues: list[MessageQueue], final: bool) -> None:
        master = await self.client.master_addr(queues[0])
        waiting = self._masterless.setdefault(name, set())
        if master is None:
            new = [q for q in queues if q not in waiting]
            waiting.update(queues)
            listed = ", ".join(f"{q.topic}:{q.queue_id} at {self.offsets.get(q)}" for q in (queues if final else new))
            if final:
                self._log.warn(
                    "consumer group {group} stops with offsets not committed: the route names no master for "
                    "broker {broker}; the next owners start from the last ones committed. Not committed: {queues}",
                    group=self.group, broker=self.client.describe_broker(queues[0]), queues=listed,
                )
            elif new:
                self._log.warn(
                    "offsets of consumer group {group} kept here, committed once the route names a master for "
                    "broker {broker} (tried every {interval:g} s): {queues}",
                    group=self.group, broker=self.client.describe_broker(queues[0]), interval=self.persist_interval,
                    queues=listed,
                )
            return
        if waiting:
            self._log.info("broker {broker} has a master again ({addr}): offsets of {n} queues committed",
                           broker=name, addr=master, n=len(queues))
        self._masterless.pop(name, None)
        for mq in queues:
            offset = self.offsets.get(mq)
            if offset is None:
                continue
            try:
                await self.client.commit_offset(mq, offset)
            except (ConsumerError, TimeoutError) as e:
                self._log.warn("{error}", error=e)
                return  # (the others to this broker would fail alike; the next round tries again)
