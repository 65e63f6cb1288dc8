# -*- test-case-name: tests.test_client_producer -*-
"""
Where a topic's messages go: GET_ROUTEINFO_BY_TOPIC (105) from the
NameServers, one at a time with failover (L{NameServers}, as 4.9.8's
C{NettyRemotingClient.getAndCreateNameserverChannel}), and the routes a
client keeps, refreshed every 30 s (L{TopicRoutes}, as
C{MQClientInstance.updateTopicRouteInfoFromNameServer} and
C{DefaultMQProducerImpl.tryToFindTopicPublishInfo}).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, Final

import attrs
from twisted.internet.defer import CancelledError, Deferred, DeferredList, TimeoutError, succeed
from twisted.internet.endpoints import clientFromString
from twisted.internet.interfaces import (
    IDelayedCall,
    IProtocol,
    IProtocolFactory,
    IReactorTime,
    IStreamClientEndpoint,
)
from twisted.internet.task import LoopingCall, deferLater
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from rmqha.client._codec import (
    AUTO_CREATE_TOPIC_KEY,
    MessageQueue,
    RouteError,
    SendError,
    TopicRoute,
    default_route_for,
    parse_route,
    publish_queues,
)
from rmqha.remoting._frames import RemotingCommand, header_to_ext_fields
from rmqha.remoting.codes import LanguageCode, RequestCode, ResponseCode
from rmqha.remoting.metadata import PERM_WRITE
from rmqha.remoting.namesrv import GetRouteInfoRequestHeader
from rmqha.remoting.protocol import NO_HANDLER, IRemotingHandler, RemotingClient, RemotingRequestError

__all__ = [
    "NameServers",
    "TopicRoutes",
    "PublishInfo",
    "NoRouteError",
    "NameServerError",
    "WatchedEndpoint",
    "watched_client",
    "reconnect_policy",
    "backoff_delay",
]

#: C{ClientConfig.pollNameServerInterval}: seconds between route refreshes.
POLL_NAMESRV_INTERVAL: Final = 30.0
#: C{ClientConfig.mqClientApiTimeout}: a NameServer request's deadline.
API_TIMEOUT: Final = 3.0
#: Topics whose routes are kept at most (the least recently used go first).
MAX_TOPICS: Final = 10_000

#: What rmqha's client says it is in its requests.
CLIENT_LANGUAGE: Final = LanguageCode.PYTHON
#: Seconds between lookups of one topic asked for after a failure
#: (L{TopicRoutes.refresh_soon}): 100 queues failing together make one.
REFRESH_MIN_INTERVAL: Final = 1.0
#: A send's lookups of a topic without a usable route: the first wait and
#: the longest (L{backoff_delay}).
NO_ROUTE_BACKOFF: Final = (0.1, 1.0)


def backoff_delay(failures: int, first: float, cap: float, rng: random.Random) -> float:
    """
    The wait after the C{failures}-th failure in a row (1, 2, ...):
    C{first} doubling up to C{cap}, less a random part of up to half, so
    that waiters that failed together do not come back together.
    """
    full: float = min(cap, first * 2.0 ** min(max(failures, 1) - 1, 32))
    return full * (1.0 - 0.5 * rng.random())


def masterless(route: TopicRoute) -> list[str]:
    """The brokers of C{route} with writable queues but no master (brokerId 0): failing over."""
    return sorted(
        {qd.broker_name for qd in route.queue_datas if qd.perm & PERM_WRITE and route.master_addr(qd.broker_name) is None}
    )


def reconnect_policy(attempt: int) -> float:
    """
    Seconds before connection attempt C{attempt} (1, 2, ...) after a lost
    connection or a failed attempt: the first after 0.1 s (a Java client
    connects again at its next request; the pause keeps a peer that
    accepts and drops every connection from making a busy loop), then
    0.5 s doubling to 5 s.
    """
    return 0.1 if attempt <= 1 else min(0.5 * 2 ** (attempt - 2), 5.0)


def watched_client(
    reactor: Any,
    endpoint: "str | IStreamClientEndpoint",
    name: str,
    clock: IReactorTime,
    handler: IRemotingHandler = NO_HANDLER,
    retry_policy: Callable[[int], float] | None = None,
) -> "tuple[RemotingClient, WatchedEndpoint]":
    """
    A kept remoting connection to C{endpoint} (a client endpoint
    description or object), named C{name} in its errors, reconnecting by
    L{reconnect_policy}, through a L{WatchedEndpoint} that remembers how
    its last attempt went; not started.
    """
    watched = WatchedEndpoint(clientFromString(reactor, endpoint) if isinstance(endpoint, str) else endpoint)
    client = RemotingClient(
        reactor, watched, handler, clock=clock, retry_policy=retry_policy or reconnect_policy, name=name
    )
    return client, watched


class NameServerError(SendError):
    """No NameServer answered (each tried once, within the deadline)."""


class NoRouteError(SendError):
    """The NameServers know no writable route for the topic."""


def follow(d: "Deferred[Any]") -> "Deferred[Any]":
    """
    A new Deferred with C{d}'s result (C{d} keeps it): for waiters sharing
    one operation, each cancellable without cancelling the others.  For a
    C{d} that does not fail (a failure would reach the first follower
    only).
    """
    out: Deferred[Any] = Deferred()

    def relay(result: Any) -> Any:
        if not out.called:
            if isinstance(result, Failure):
                out.errback(result)
                return None
            out.callback(result)
        return result

    d.addBoth(relay)
    return out


def within(d: "Deferred[Any]", seconds: float, clock: IReactorTime) -> "Deferred[Any]":
    """C{d}, failed with L{TimeoutError} unless it fires within C{seconds}."""
    return d.addTimeout(max(seconds, 0.0), clock)


@implementer(IStreamClientEndpoint)
class WatchedEndpoint:
    """
    An endpoint that remembers whether its last connection attempt failed:
    requests to it then fail at once (and go to another NameServer or
    broker) instead of waiting for the next attempt of the back-off, as
    the Java client's connect fails at once.
    """

    def __init__(self, endpoint: IStreamClientEndpoint) -> None:
        self.endpoint = endpoint
        self.failure: str | None = None

    def connect(self, factory: IProtocolFactory) -> "Deferred[IProtocol]":
        def connected(protocol: IProtocol) -> IProtocol:
            self.failure = None
            return protocol

        def failed(failure: Failure) -> Failure:
            self.failure = f"{type(failure.value).__name__}: {failure.value}"
            return failure

        d: Deferred[IProtocol] = self.endpoint.connect(factory)
        return d.addCallbacks(connected, failed)


class NameServers:
    """
    The NameServers, asked one at a time: the chosen one (a random one
    first) while it answers; after a connection failure or a timeout the
    next, round robin, each at most once per request.  A NameServer's
    connection (a L{RemotingClient}) is opened the first time it is
    chosen and kept.
    """

    def __init__(
        self,
        reactor: Any,
        addresses: Sequence[str | IStreamClientEndpoint],
        clock: IReactorTime,
        *,
        rng: random.Random,
        retry_policy: Callable[[int], float] | None = None,
    ) -> None:
        from rmqha.settings import master_description, parse_host_port

        if not addresses:
            raise ValueError("no NameServer address given")
        self.clock = clock
        self.clients: list[RemotingClient] = []
        self.endpoints: list[WatchedEndpoint] = []
        for address in addresses:
            endpoint = (
                master_description(*parse_host_port(address, "NameServer address"))
                if isinstance(address, str)
                else address
            )
            client, watched = watched_client(
                reactor, endpoint, address if isinstance(address, str) else str(endpoint), clock,
                retry_policy=retry_policy,
            )
            self.clients.append(client)
            self.endpoints.append(watched)
        self.chosen = rng.randrange(len(self.clients))
        self.running = False

    @property
    def names(self) -> str:
        return ";".join(str(c.name) for c in self.clients)

    def start(self) -> None:
        self.running = True

    def stop(self) -> "Deferred[Any]":
        self.running = False
        return DeferredList([c.stopService() for c in self.clients if c.running])

    async def request(self, command: RemotingCommand, timeout: float, what: str) -> RemotingCommand:
        """
        C{command}'s response from a NameServer.

        @raise NameServerError: none answered within C{timeout}; the text
            names each one tried and why.
        """
        deadline = self.clock.seconds() + timeout
        errors: list[str] = []
        for _ in range(len(self.clients)):
            remaining = deadline - self.clock.seconds()
            if remaining <= 0 or not self.running:
                break
            index = self.chosen
            client = self.clients[index]
            if not client.running:
                client.startService()
            failure = self.endpoints[index].failure
            if failure is not None:
                errors.append(f"{client.name}: unreachable ({failure})")
                self.chosen = (index + 1) % len(self.clients)
                continue
            try:
                response: RemotingCommand = await client.request(command, remaining)
                return response
            except RemotingRequestError as e:
                errors.append(f"{client.name}: {e}")
                if self.chosen == index:
                    self.chosen = (index + 1) % len(self.clients)
        if not self.running:
            errors.append("the client is stopped")
        raise NameServerError(f"no NameServer answered {what}: " + "; ".join(errors or ["no time left"]))


@attrs.define
class PublishInfo:
    """
    C{TopicPublishInfo}: a topic's route, the queues it is sent to, and
    the round-robin index over them (C{sendWhichQueue}).

    @ivar from_default: made from C{TBW102}'s route (the topic is not
        known to the NameServers yet).
    """

    topic: str
    route: TopicRoute
    queues: list[MessageQueue]
    index: int
    from_default: bool = False

    def ok(self) -> bool:
        return bool(self.queues)

    def select(self, last_broker: str | None) -> MessageQueue:
        """
        C{selectOneMessageQueue(lastBrokerName)}: the next queue, round
        robin, skipping the broker of the last failed attempt if any other
        broker has a queue.
        """
        n = len(self.queues)
        if last_broker is not None:
            for _ in range(n):
                self.index += 1
                mq = self.queues[abs(self.index) % n]
                if mq.broker_name != last_broker:
                    return mq
        self.index += 1
        return self.queues[abs(self.index) % n]


class TopicRoutes:
    """
    The routes a client keeps: each topic's L{PublishInfo}, looked up when
    first wanted and refreshed every L{POLL_NAMESRV_INTERVAL} seconds and
    after failed sends.  Lookups of one topic share one request.  A
    refresh that fails (or finds the topic gone) keeps the route there
    is, as 4.9.8 does.
    """

    _log = Logger()

    def __init__(
        self,
        namesrv: NameServers,
        clock: IReactorTime,
        *,
        rng: random.Random,
        api_timeout: float = API_TIMEOUT,
        poll_interval: float = POLL_NAMESRV_INTERVAL,
        create_topic_key: str = AUTO_CREATE_TOPIC_KEY,
        default_topic_queue_nums: int = 4,
        auto_create_topic: bool = True,
        max_topics: int = MAX_TOPICS,
        on_change: Callable[[], object] = lambda: None,
    ) -> None:
        """
        @param auto_create_topic: for a topic the NameServers do not know,
            send along C{create_topic_key}'s route (the brokers that may
            create topics), its queues cut to C{default_topic_queue_nums},
            as the Java producer does.  Off: such a send fails at once.
        @param on_change: called after a route changed (the producer drops
            connections to brokers no route names any more).
        """
        self.namesrv = namesrv
        self.clock = clock
        self.rng = rng
        self.api_timeout = api_timeout
        self.poll_interval = poll_interval
        self.create_topic_key = create_topic_key
        self.default_topic_queue_nums = default_topic_queue_nums
        self.auto_create_topic = auto_create_topic
        self.max_topics = max_topics
        self.on_change = on_change
        self.table: dict[str, PublishInfo] = {}
        #: The last error of each topic's lookups (cleared by a route).
        self.errors: dict[str, str] = {}
        self._lookups: dict[tuple[str, bool], Deferred[None]] = {}
        #: When each topic's last lookup began (L{refresh_soon}).
        self._asked: dict[str, float] = {}
        #: Topics whose last lookup no NameServer answered.
        self._unanswered: dict[str, None] = {}
        #: Topics sends found no usable route for, for now (L{find}).
        self._no_route: dict[str, _NoRoute] = {}
        #: The lookups L{refresh_soon} put off to the end of the interval.
        self._soon: dict[str, IDelayedCall] = {}
        self._loop: LoopingCall | None = None
        self._round: Deferred[None] | None = None

    # -- lifecycle --------------------------------------------------------------

    def start(self) -> None:
        self.namesrv.start()
        loop = LoopingCall(self._refresh_all)
        loop.clock = self.clock
        self._loop = loop
        loop.start(self.poll_interval, now=False)

    def stop(self) -> "Deferred[Any]":
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        for call in self._soon.values():
            if call.active():
                call.cancel()
        self._soon.clear()
        for d in list(self._lookups.values()):
            d.cancel()
        return self.namesrv.stop()

    def _refresh_all(self) -> None:
        if self._round is not None:
            return  # the previous round is still going

        async def run() -> None:
            for topic in list(self.table):
                if self._loop is None:
                    return  # stopped
                await self.refresh(topic)

        def done(_: object) -> None:
            self._round = None

        self._round = Deferred.fromCoroutine(run())
        self._round.addBoth(done)

    # -- lookups ----------------------------------------------------------------

    def addresses(self) -> set[str]:
        """Every broker address a kept route names."""
        return {a for info in self.table.values() for a in info.route.addresses()}

    def refresh(self, topic: str, default: bool = False) -> "Deferred[None]":
        """
        Look C{topic}'s route up now (with C{default}: C{TBW102}'s, for
        C{topic}); a lookup already going is shared.  Never fails: an
        error is kept in L{errors}.  Cancel the result to stop waiting
        (the lookup goes on).
        """
        key = (topic, default)
        d = self._lookups.get(key)
        if d is None:
            if not default:
                self._asked.pop(topic, None)
                self._asked[topic] = self.clock.seconds()
                _cap(self._asked, self.max_topics)
            d = Deferred.fromCoroutine(self._lookup(topic, default))

            def done(result: object) -> None:
                self._lookups.pop(key, None)
                if isinstance(result, Failure) and not result.check(CancelledError):
                    self._log.failure("route lookup of {topic} failed", result, topic=topic)

            d.addBoth(done)
            if not d.called:
                self._lookups[key] = d
        return follow(d)

    def refresh_soon(self, topic: str) -> "Deferred[None]":
        """
        L{refresh} after a failure that may mean the route changed (a
        broker unreachable, a slave's refusal): a lookup under way is
        shared, and none begins within L{REFRESH_MIN_INTERVAL} of the
        last one (the result then fires at once): however many requests
        fail together, the NameServers are asked once a second at most.
        """
        asked = self._asked.get(topic)
        if (
            (topic, False) not in self._lookups
            and asked is not None
            and self.clock.seconds() - asked < REFRESH_MIN_INTERVAL
        ):
            # (One lookup at the end of the interval, then, for whatever
            # failed meanwhile: the last failure is never left unlooked.)
            if topic not in self._soon and self._loop is not None:
                self._soon[topic] = self.clock.callLater(
                    asked + REFRESH_MIN_INTERVAL - self.clock.seconds(), self._refresh_later, topic
                )
            return succeed(None)
        return self.refresh(topic)

    def _refresh_later(self, topic: str) -> None:
        del self._soon[topic]
        self.refresh(topic)

    async def _lookup(self, topic: str, default: bool) -> None:
        asked = self.create_topic_key if default else topic
        command = RemotingCommand(
            RequestCode.GET_ROUTEINFO_BY_TOPIC,
            language=CLIENT_LANGUAGE,
            ext_fields=header_to_ext_fields(GetRouteInfoRequestHeader(asked)),
        )
        try:
            response = await self.namesrv.request(
                command, self.api_timeout, f"GET_ROUTEINFO_BY_TOPIC (105) for topic {asked!r}"
            )
        except NameServerError as e:
            self.errors[topic] = str(e)
            self._unanswered[topic] = None
            _cap(self._unanswered, self.max_topics)
            return
        self._unanswered.pop(topic, None)
        if response.code != ResponseCode.SUCCESS or not response.body:
            try:
                name = f"{ResponseCode(response.code).name} ({response.code})"
            except ValueError:
                name = f"code {response.code}"
            self.errors[topic] = f"NameServer answered {name} for topic {asked!r}" + (
                f": {' '.join(response.remark.split())[:200]}" if response.remark else ""
            )
            return
        try:
            route = parse_route(response.body)
        except RouteError as e:
            self.errors[topic] = f"NameServer's route for topic {asked!r} is unreadable: {e}"
            return
        if default:
            route = default_route_for(route, self.default_topic_queue_nums)
        self._take(topic, route, default)

    def _take(self, topic: str, route: TopicRoute, default: bool) -> None:
        old = self.table.get(topic)
        if default and old is not None and not old.from_default:
            return  # the topic's own route came in meanwhile: it wins
        self.table.pop(topic, None)
        if old is not None and old.route == route and old.from_default == default:
            self.table[topic] = old
            self.errors.pop(topic, None)
            if old.ok():
                self._no_route.pop(topic, None)
            return
        info = PublishInfo(
            topic,
            route,
            publish_queues(topic, route),
            old.index if old is not None else self.rng.randrange(1 << 16),
            default,
        )
        self.table[topic] = info
        self.errors.pop(topic, None)
        if info.ok():
            self._no_route.pop(topic, None)  # (the back-off starts again from its first wait)
        while len(self.table) > self.max_topics:
            evicted = next(iter(self.table))
            del self.table[evicted]
            self.errors.pop(evicted, None)
        self._log.info(
            "route of topic {topic}{via}: {queues} queues on {brokers}",
            topic=topic,
            via=f" (via {self.create_topic_key})" if default else "",
            queues=len(info.queues),
            brokers=", ".join(f"{b.broker_name} {dict(b.addrs)}" for b in route.broker_datas) or "no broker",
        )
        self.on_change()

    async def find(self, topic: str, timeout: float) -> PublishInfo:
        """
        C{tryToFindTopicPublishInfo}: the topic's route with at least one
        queue, looked up if need be (then C{TBW102}'s if the NameServers
        do not know the topic and auto-creation is on).

        While there is no usable route for a reason that passes (no
        NameServer answers; the topic's brokers have writable queues but
        no master: failing over), it is looked up again after a back-off
        (L{NO_ROUTE_BACKOFF}, L{backoff_delay}) until one comes or
        C{timeout} runs out.  The back-off is the topic's, shared by every
        send waiting for it, and starts again from its first wait once a
        route is usable.

        @raise NoRouteError: naming the topic and what the NameServers said.
        """
        info = self.table.get(topic)
        if info is not None and info.ok():
            self.table[topic] = self.table.pop(topic)  # recently used
            return info
        deadline = self.clock.seconds() + timeout
        while True:
            state = self._no_route.get(topic)
            if state is not None and state.not_before > self.clock.seconds():
                wait = state.not_before - self.clock.seconds()
                if self.clock.seconds() + wait >= deadline:
                    raise NoRouteError(
                        f"no route to topic {topic!r} within {timeout:g} s ({state.failures} lookups in a row "
                        f"found none; the next is due in {wait:.2g} s): {state.why}"
                    )
                await deferLater(self.clock, wait, lambda: None)
                info = self.table.get(topic)
                if info is not None and info.ok():
                    return info
            info = await self._find_once(topic, timeout, deadline)
            if info is not None and info.ok():
                return info
            why, passing = self._why_none(topic, info)
            if not passing:
                self._no_route.pop(topic, None)
                raise NoRouteError(f"no route to topic {topic!r}: {why}")
            self._count_no_route(topic, why)

    def _why_none(self, topic: str, info: PublishInfo | None) -> tuple[str, bool]:
        """Why C{topic} has no usable route, and whether that should pass (see L{find})."""
        if info is None:
            # (Errors of topics without a route are not kept: no growth
            # with every unknown name tried.)
            unanswered = topic in self._unanswered
            self._unanswered.pop(topic, None)
            return self.errors.pop(topic, None) or "no route", unanswered
        waiting = masterless(info.route)
        if waiting:
            return (
                f"broker{'s' if len(waiting) > 1 else ''} {', '.join(waiting)} "
                f"{'have' if len(waiting) > 1 else 'has'} no master in the route (failing over?)"
            ), True
        return self.errors.get(topic) or "no writable queue on a broker with a master", False

    def _count_no_route(self, topic: str, why: str) -> None:
        """One more lookup of C{topic} found no usable route: the next waits longer (counted once per lookup,
        however many sends shared it)."""
        asked = self._asked.get(topic, self.clock.seconds())
        state = self._no_route.pop(topic, None) or _NoRoute()
        if state.counted != asked:
            state.failures += 1
            state.counted = asked
            first, cap = NO_ROUTE_BACKOFF
            state.not_before = asked + backoff_delay(state.failures, first, cap, self.rng)
        state.why = why
        self._no_route[topic] = state
        _cap(self._no_route, self.max_topics)

    async def _find_once(self, topic: str, timeout: float, deadline: float) -> PublishInfo | None:
        """One lookup of C{topic} (and of C{TBW102} for it, if need be), within C{deadline}."""
        try:
            await within(self.refresh(topic), deadline - self.clock.seconds(), self.clock)
            info = self.table.get(topic)
            # (As 4.9.8: TBW102 only for a topic the NameServers gave no
            # route; a route without writable queues is final.)
            if (info is None or (info.from_default and not info.ok())) and self.auto_create_topic:
                first = self.errors.get(topic)
                remaining = deadline - self.clock.seconds()
                await within(self.refresh(topic, default=True), remaining, self.clock)
                info = self.table.get(topic)
                if first and topic in self.errors and first != self.errors[topic]:
                    self.errors[topic] = f"{first}; {self.errors[topic]}"
        except TimeoutError:
            raise NoRouteError(
                f"no route to topic {topic!r} within {timeout:g} s from NameServers {self.namesrv.names}"
            ) from None
        return info


@attrs.define
class _NoRoute:
    """A topic's lookups that found no usable route, in a row (L{TopicRoutes.find})."""

    failures: int = 0
    not_before: float = 0.0
    counted: float | None = None
    why: str = ""


def _cap(table: dict[str, Any], size: int) -> None:
    """Drop the oldest entries of C{table} beyond C{size}."""
    while len(table) > size:
        del table[next(iter(table))]
