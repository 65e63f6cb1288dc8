# -*- test-case-name: tests.test_client_producer -*-
"""
A RocketMQ producer on Twisted: L{Producer}, a service that sends
messages (SEND_MESSAGE_V2, 310) and batches (SEND_BATCH_MESSAGE, 320) to
the masters the NameServers name, as 4.9.8's C{DefaultMQProducer} does in
SYNC mode: round-robin queue selection, up to 3 attempts on another
broker for the failures the Java client retries, one deadline (3 s) for
the whole send, bodies of 4 KiB or more zlib-compressed.

Each broker is reached over one kept connection (a L{RemotingClient});
at most C{max_in_flight} sends wait for one broker's answers and at most
C{max_waiting} more wait for their turn, beyond which a send fails at
once with L{ProducerBusyError}: nothing grows without bound.
"""

from __future__ import annotations

import dataclasses
import random
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from twisted.application.service import Service
from twisted.internet.defer import (
    CancelledError,
    Deferred,
    DeferredList,
    DeferredSemaphore,
    TimeoutError,
    fail,
)
from twisted.internet.interfaces import IReactorTime, IStreamClientEndpoint
from twisted.logger import Logger
from twisted.python.failure import Failure

from rmqha.client._codec import (
    AUTO_CREATE_TOPIC_KEY,
    COMPRESS_OVER,
    MAX_MESSAGE_SIZE,
    Message,
    MessageQueue,
    SendError,
    SendMessageRequestHeaderV2,
    SendReplyError,
    SendResult,
    SendStatus,
    UniqueIdFactory,
    check_message,
    compress_body,
    encode_batch,
    properties_string,
    send_result,
)
from rmqha.client._routes import (
    API_TIMEOUT,
    CLIENT_LANGUAGE,
    MAX_TOPICS,
    POLL_NAMESRV_INTERVAL,
    NameServers,
    NoRouteError,
    PublishInfo,
    TopicRoutes,
    WatchedEndpoint,
    watched_client,
    within,
)
from rmqha.remoting._frames import RemotingCommand, header_to_ext_fields
from rmqha.remoting.codes import RequestCode, ResponseCode
from rmqha.remoting.protocol import RemotingClient, RemotingRequestError

__all__ = [
    "Producer",
    "ProducerBusyError",
    "SendFailedError",
    "DEFAULT_RETRY_CODES",
    "QueueSelector",
]

#: C{DefaultMQProducer.retryResponseCodes}: broker answers a send is
#: retried on (on another broker where there is one).
DEFAULT_RETRY_CODES: Final = frozenset(
    {
        ResponseCode.TOPIC_NOT_EXIST,
        ResponseCode.SERVICE_NOT_AVAILABLE,
        ResponseCode.SYSTEM_ERROR,
        ResponseCode.NO_PERMISSION,
        ResponseCode.NO_BUYER_ID,
        ResponseCode.NOT_IN_CURRENT_UNIT,
    }
)
#: C{DefaultMQProducer.sendMsgTimeout}: seconds for a whole send, retries
#: included.
SEND_TIMEOUT: Final = 3.0
#: Sends awaiting one broker's answers at once.
MAX_IN_FLIGHT: Final = 256
#: Sends waiting for one of those places.
MAX_WAITING: Final = 4096
#: Sends under way at once, all brokers and route lookups together.
MAX_SENDS: Final = 65_536
#: C{MixAll.DEFAULT_PRODUCER_GROUP}.
DEFAULT_PRODUCER_GROUP: Final = "DEFAULT_PRODUCER"

#: Picks the queue of a send from the topic's writable queues
#: (C{MessageQueueSelector}); such a send is attempted once.
QueueSelector = Callable[[Sequence[MessageQueue]], MessageQueue]


class ProducerBusyError(SendError):
    """Too many sends already wait for the broker: back off and try again."""


class SendFailedError(SendError):
    """
    Every attempt of a send failed, or its time ran out.

    @ivar code: the last broker's response code, if the last failure was
        an answer (else C{None}: no connection, a timeout).
    @ivar brokers: the broker of each attempt.
    """

    def __init__(self, text: str, code: int | None, brokers: Sequence[str]) -> None:
        super().__init__(text)
        self.code = code
        self.brokers = tuple(brokers)


def _local_ip() -> bytes:
    try:
        return socket.inet_aton(socket.gethostbyname(socket.gethostname()))
    except OSError:
        return b"\x7f\x00\x00\x01"


@dataclasses.dataclass
class _BrokerLink:
    client: RemotingClient
    slots: DeferredSemaphore
    endpoint: WatchedEndpoint


@dataclasses.dataclass(frozen=True)
class _Outgoing:
    """One send, ready to go to any queue: its body and header fields."""

    topic: str
    body: bytes
    sys_flag: int
    flag: int
    properties: str
    unique_id: str
    batch: bool


class Producer(Service):
    """
    A producer of one producer group, started and stopped as a service.

        producer = Producer(reactor, "127.0.0.1:9876", "my-group")
        producer.startService()
        result = await producer.send("TopicTest", b"hello", tags="TagA")

    L{send} and L{send_batch} return Deferreds of a L{SendResult} (status
    SEND_OK, or FLUSH_DISK_TIMEOUT / FLUSH_SLAVE_TIMEOUT /
    SLAVE_NOT_AVAILABLE: stored, a SYNC guarantee not met in time).  They
    fail with L{SendReplyError} (a broker refused, with a code not
    retried), L{SendFailedError} (all attempts failed, or the time ran
    out), L{rmqha.client.NoRouteError}, L{ProducerBusyError} or
    C{ValueError} (a message Java would refuse too).
    """

    _log = Logger()

    def __init__(
        self,
        reactor: Any,
        namesrv: str | Sequence[str | IStreamClientEndpoint],
        group: str = DEFAULT_PRODUCER_GROUP,
        *,
        clock: IReactorTime | None = None,
        endpoint_for: Callable[[str], str | IStreamClientEndpoint] | None = None,
        send_timeout: float = SEND_TIMEOUT,
        retry_times: int = 2,
        retry_codes: Iterable[int] = DEFAULT_RETRY_CODES,
        retry_another_broker_when_not_store_ok: bool = False,
        compress_over: int = COMPRESS_OVER,
        max_message_size: int = MAX_MESSAGE_SIZE,
        create_topic_key: str = AUTO_CREATE_TOPIC_KEY,
        default_topic_queue_nums: int = 4,
        auto_create_topic: bool = True,
        max_in_flight: int = MAX_IN_FLIGHT,
        max_waiting: int = MAX_WAITING,
        max_sends: int = MAX_SENDS,
        poll_interval: float = POLL_NAMESRV_INTERVAL,
        api_timeout: float = API_TIMEOUT,
        max_topics: int = MAX_TOPICS,
        unique_ids: UniqueIdFactory | None = None,
        rng: random.Random | None = None,
    ) -> None:
        """
        @param namesrv: C{namesrvAddr} (C{host:port;host:port}), or a list
            of addresses or client endpoints.
        @param endpoint_for: the client endpoint (or its description) of
            a broker address C{host:port} (default: plain TCP).
        @param retry_times: C{retryTimesWhenSendFailed}: attempts after
            the first.
        @param retry_another_broker_when_not_store_ok: also retry a send
            that was stored without its SYNC guarantee (the Java default:
            no); the last result is returned if no attempt does better.
        @param auto_create_topic: send to a topic the NameServers do not
            know along C{create_topic_key}'s route (the broker creates it).
        @param max_in_flight: sends awaiting one broker's answers at once.
        @param max_waiting: sends queued behind those, per broker.
        @param max_sends: sends under way at once in all (route lookups
            included); more fail at once with L{ProducerBusyError}.
        """
        from rmqha.remoting.namesrv import parse_namesrv_addr
        from rmqha.settings import master_description, parse_host_port

        if isinstance(namesrv, str):
            namesrv = parse_namesrv_addr(namesrv)
        if retry_times < 0:
            raise ValueError(f"retry_times is {retry_times}, not 0 or more")
        if send_timeout <= 0:
            raise ValueError(f"send_timeout is {send_timeout}, not above 0")
        if max_in_flight < 1 or max_waiting < 0:
            raise ValueError(f"max_in_flight {max_in_flight} / max_waiting {max_waiting}: need 1+ / 0+")
        self.reactor = reactor
        self.clock: IReactorTime = clock if clock is not None else reactor
        self.group = group
        self.send_timeout = send_timeout
        self.retry_times = retry_times
        self.retry_codes = frozenset(retry_codes)
        self.retry_another_broker_when_not_store_ok = retry_another_broker_when_not_store_ok
        self.compress_over = compress_over
        self.max_message_size = max_message_size
        self.create_topic_key = create_topic_key
        self.default_topic_queue_nums = default_topic_queue_nums
        self.max_in_flight = max_in_flight
        self.max_waiting = max_waiting
        self.max_sends = max_sends
        self.unique_ids = unique_ids if unique_ids is not None else UniqueIdFactory(_local_ip())
        self.endpoint_for: Callable[[str], str | IStreamClientEndpoint] = endpoint_for or (
            lambda addr: master_description(*parse_host_port(addr, "broker address"))
        )
        rng = rng if rng is not None else random.Random()
        self.routes = TopicRoutes(
            NameServers(reactor, namesrv, self.clock, rng=rng),
            self.clock,
            rng=rng,
            api_timeout=api_timeout,
            poll_interval=poll_interval,
            create_topic_key=create_topic_key,
            default_topic_queue_nums=default_topic_queue_nums,
            auto_create_topic=auto_create_topic,
            max_topics=max_topics,
            on_change=self._routes_changed,
        )
        self.brokers: dict[str, _BrokerLink] = {}
        self._sends: set[Deferred[SendResult]] = set()

    # -- the service ---------------------------------------------------------

    def startService(self) -> None:
        Service.startService(self)
        self.routes.start()

    def stopService(self) -> "Deferred[Any]":
        """
        Stop: sends still going fail (L{SendFailedError} naming the stop),
        routes stop refreshing, connections close.
        """
        Service.stopService(self)
        for d in list(self._sends):
            d.cancel()
        links, self.brokers = list(self.brokers.values()), {}
        stops = [self.routes.stop()] + [link.client.stopService() for link in links]
        return DeferredList(stops).addCallback(lambda _: None)

    def _routes_changed(self) -> None:
        # cleanOfflineBroker: connections to addresses no route names go.
        named = self.routes.addresses()
        for addr in [a for a in self.brokers if a not in named]:
            # (Sends still awaiting it fail with ConnectionClosedError and
            # are retried on the brokers the routes name now.)
            self.brokers.pop(addr).client.stopService()

    def _link(self, addr: str) -> _BrokerLink:
        link = self.brokers.get(addr)
        if link is None:
            client, watched = watched_client(self.reactor, self.endpoint_for(addr), addr, self.clock)
            link = _BrokerLink(client, DeferredSemaphore(self.max_in_flight), watched)
            self.brokers[addr] = link
            client.startService()
        return link

    # -- sending ---------------------------------------------------------------

    def send(
        self,
        topic: str,
        body: bytes,
        *,
        tags: str | None = None,
        keys: str | Sequence[str] | None = None,
        properties: Mapping[str, str] | None = None,
        flag: int = 0,
        delay_level: int = 0,
        wait_store_msg_ok: bool = True,
        queue: MessageQueue | None = None,
        selector: QueueSelector | None = None,
        timeout: float | None = None,
    ) -> "Deferred[SendResult]":
        """
        Send one message (SEND_MESSAGE_V2).

        @param delay_level: C{DELAY} (1-18 on a default broker): delivered
            after that level's delay.
        @param queue: send to this queue, once (C{send(msg, mq)}).
        @param selector: picks the queue from the topic's writable ones,
            once (C{send(msg, selector, arg)}).
        @param timeout: for the whole send, retries included (default
            C{send_timeout}).
        """
        message = Message(
            topic,
            body,
            tags=tags,
            keys=keys,
            flag=flag,
            properties=dict(properties or {}),
            wait_store_msg_ok=wait_store_msg_ok,
            delay_level=delay_level,
        )
        return self.send_message(message, queue=queue, selector=selector, timeout=timeout)

    def send_message(
        self,
        message: Message,
        *,
        queue: MessageQueue | None = None,
        selector: QueueSelector | None = None,
        timeout: float | None = None,
    ) -> "Deferred[SendResult]":
        """L{send} with a L{Message}."""
        unique_id = message.unique_id or self.unique_ids.create(self.clock.seconds())
        try:
            check_message(message, self.max_message_size)
            props = properties_string(dataclasses.replace(message, unique_id=unique_id).property_map())
        except ValueError as e:
            return fail(e)
        body, sys_flag = compress_body(message.body, self.compress_over)
        outgoing = _Outgoing(message.topic, body, sys_flag, message.flag, props, unique_id, False)
        return self._start(outgoing, queue, selector, timeout)

    def send_batch(
        self,
        messages: Sequence[Message],
        *,
        queue: MessageQueue | None = None,
        selector: QueueSelector | None = None,
        timeout: float | None = None,
    ) -> "Deferred[SendResult]":
        """
        Send messages of one topic as one SEND_BATCH_MESSAGE (320), as
        C{DefaultMQProducer.send(Collection)}: each its own C{UNIQ_KEY},
        bodies not compressed, one queue for all.  The result's C{msg_id}
        and C{offset_msg_id} list the items', comma-joined.

        @raise ValueError: (as a failed Deferred) no message, topics or
            C{wait_store_msg_ok} that differ, a retry topic, a message Java
            refuses.
        """
        try:
            if not messages:
                raise ValueError("a batch needs at least one message")
            first = messages[0]
            for m in messages:
                check_message(m, self.max_message_size)
                if m.topic != first.topic:
                    raise ValueError(
                        f"a batch goes to one topic: {m.topic!r} is not {first.topic!r}"
                    )
                if m.wait_store_msg_ok != first.wait_store_msg_ok:
                    raise ValueError("the messages of a batch differ in wait_store_msg_ok")
                if m.delay_level > 0:
                    raise ValueError("a batch cannot carry delayed messages")
                if m.topic.startswith("%RETRY%"):
                    raise ValueError(f"retry topic {m.topic!r} cannot take batches")
        except ValueError as e:
            return fail(e)
        ids = []
        items = []
        try:
            for m in messages:
                unique_id = m.unique_id or self.unique_ids.create(self.clock.seconds())
                ids.append(unique_id)
                props = dataclasses.replace(m, unique_id=unique_id).property_map()
                items.append((m.body, m.flag, properties_string(props)))
            body = encode_batch(items)
        except ValueError as e:
            return fail(e)
        if len(body) > self.max_message_size:
            return fail(
                ValueError(
                    f"the batch to topic {first.topic!r} is {len(body)} bytes (at most {self.max_message_size})"
                )
            )
        # MessageBatch: no properties of its own but WAIT.
        batch_props = properties_string({"WAIT": "true" if first.wait_store_msg_ok else "false"})
        outgoing = _Outgoing(first.topic, body, 0, 0, batch_props, ",".join(ids), True)
        return self._start(outgoing, queue, selector, timeout)

    def _start(
        self,
        outgoing: _Outgoing,
        queue: MessageQueue | None,
        selector: QueueSelector | None,
        timeout: float | None,
    ) -> "Deferred[SendResult]":
        if not self.running:
            return fail(SendFailedError(f"the producer is stopped; nothing sent to topic {outgoing.topic!r}", None, ()))
        if len(self._sends) >= self.max_sends:
            return fail(
                ProducerBusyError(
                    f"{len(self._sends)} sends are under way (at most {self.max_sends}); "
                    f"send to topic {outgoing.topic!r} refused"
                )
            )
        d = Deferred.fromCoroutine(
            self._send(outgoing, queue, selector, self.send_timeout if timeout is None else timeout)
        )
        if not d.called:
            self._sends.add(d)
            d.addBoth(self._sent, d, outgoing.topic)
        return d

    def _sent(self, result: Any, d: "Deferred[SendResult]", topic: str) -> Any:
        self._sends.discard(d)
        if isinstance(result, Failure) and result.check(CancelledError) and not self.running:
            return Failure(SendFailedError(f"send to topic {topic!r} stopped with the producer", None, ()))
        return result

    async def _send(
        self,
        out: _Outgoing,
        queue: MessageQueue | None,
        selector: QueueSelector | None,
        timeout: float,
    ) -> SendResult:
        start = self.clock.seconds()

        def left() -> float:
            return timeout - (self.clock.seconds() - start)

        info = await self.routes.find(out.topic, left())
        if queue is not None or selector is not None:
            # sendSelectImpl / send(msg, mq): one attempt, no retry.
            mq = queue if queue is not None else selector(info.queues)  # type: ignore[misc]
            if mq.topic != out.topic:
                raise ValueError(f"queue {mq} is not a queue of topic {out.topic!r}")
            try:
                return await self._attempt(out, mq, info, left())
            except RemotingRequestError as e:
                raise SendFailedError(f"send to topic {out.topic!r} on queue {mq} failed: {e}", None, (mq.broker_name,)) from None

        attempts = 1 + self.retry_times
        brokers: list[str] = []
        last: MessageQueue | None = None
        result: SendResult | None = None
        error: Exception | None = None
        timed_out = False
        for n in range(attempts):
            if not info.ok():
                break
            mq = info.select(last.broker_name if last is not None else None)
            last = mq
            if left() <= 0:
                timed_out = True
                break
            brokers.append(mq.broker_name)
            again = n + 1 < attempts
            try:
                result = await self._attempt(out, mq, info, left())
            except SendReplyError as e:
                error = e
                if e.code not in self.retry_codes and e.code != -1:
                    if result is not None:
                        return result
                    raise
            except (RemotingRequestError, SendError) as e:
                if isinstance(e, ProducerBusyError):
                    raise
                error = e
                if not self.running:
                    break
            else:
                if result.status is SendStatus.SEND_OK or not self.retry_another_broker_when_not_store_ok:
                    return result
                continue
            if again:
                self._log.info(
                    "send to topic {topic} on {broker} failed: {error}; sending again",
                    topic=out.topic,
                    broker=mq.broker_name,
                    error=error,
                )
                try:
                    info = await self._after_failure(out.topic, info, left())
                except NoRouteError as e:
                    error = e  # (the next attempt, if time is left, goes along the route there was)
        if result is not None:
            return result
        what = f"send to topic {out.topic!r}"
        tried = f"{len(brokers)} attempt{'s' if len(brokers) != 1 else ''} ({', '.join(brokers) or 'none'})"
        code = error.code if isinstance(error, SendReplyError) else None
        if not self.running:
            raise SendFailedError(f"{what} stopped with the producer after {tried}: {error}", code, brokers)
        if timed_out or error is None:
            raise SendFailedError(
                f"{what} ran out of its {timeout:g} s after {tried}" + (f"; last: {error}" if error else ""),
                code,
                brokers,
            )
        raise SendFailedError(f"{what} failed after {tried}: {error}", code, brokers)

    async def _after_failure(self, topic: str, info: PublishInfo, remaining: float) -> PublishInfo:
        """
        Refresh the topic's route before the next attempt (a broker may
        have failed over), waiting at most a third of the time left; the
        lookup goes on in the background past that.  A route that names
        no master now (the broker failing over) is waited for, backing
        off (L{TopicRoutes.find}), within the time left.

        @raise NoRouteError: no usable route came in time.
        """
        start = self.clock.seconds()
        try:
            await within(self.routes.refresh(topic), remaining / 3, self.clock)
        except TimeoutError:
            pass
        fresh = self.routes.table.get(topic)
        if fresh is not None and fresh.ok():
            return fresh
        return await self.routes.find(topic, remaining - (self.clock.seconds() - start))

    async def _attempt(self, out: _Outgoing, mq: MessageQueue, info: PublishInfo, remaining: float) -> SendResult:
        """C{sendKernelImpl}: one request to the master of C{mq}'s broker."""
        # (The route kept now first: it may have changed since the send began.)
        current = self.routes.table.get(out.topic)
        addr = (current.route.master_addr(mq.broker_name) if current is not None else None) or (
            info.route.master_addr(mq.broker_name)
        )
        if addr is None:
            raise SendError(f"broker {mq.broker_name!r} of topic {out.topic!r} has no master in the route")
        if remaining <= 0:
            raise SendFailedError(f"send to topic {out.topic!r} ran out of time before {mq.broker_name}", None, ())
        link = self._link(addr)
        where = f"{mq.broker_name} ({addr})"
        if link.endpoint.failure is not None:
            raise SendError(f"broker {where} is unreachable (last connection attempt: {link.endpoint.failure})")
        if not link.slots.tokens and len(link.slots.waiting) >= self.max_waiting:
            raise ProducerBusyError(
                f"{self.max_in_flight} sends await broker {where} and {len(link.slots.waiting)} more "
                f"wait; send to topic {out.topic!r} refused"
            )
        deadline = self.clock.seconds() + remaining
        try:
            slot = link.slots.acquire()
            # (A free place is taken at once: no deadline to set and cancel.)
            await (slot if slot.called else within(slot, remaining, self.clock))
        except TimeoutError:
            raise SendFailedError(
                f"send to topic {out.topic!r} waited {remaining:g} s for a place among the "
                f"{self.max_in_flight} sends awaiting broker {where}",
                None,
                (mq.broker_name,),
            ) from None
        try:
            # (sendKernelImpl's header, as createSendMessageRequestHeaderV2
            # renames it.)
            header = SendMessageRequestHeaderV2(
                a=self.group,
                b=out.topic,
                c=self.create_topic_key,
                d=self.default_topic_queue_nums,
                e=mq.queue_id,
                f=out.sys_flag,
                g=round(self.clock.seconds() * 1000),
                h=out.flag,
                i=out.properties,
                j=0,
                k=False,
                m=out.batch,
                n=mq.broker_name,
            )
            command = RemotingCommand(
                RequestCode.SEND_BATCH_MESSAGE if out.batch else RequestCode.SEND_MESSAGE_V2,
                language=CLIENT_LANGUAGE,
                ext_fields=header_to_ext_fields(header),
                body=out.body,
            )
            response: RemotingCommand = await link.client.request(
                command, max(deadline - self.clock.seconds(), 0.0)
            )
        finally:
            link.slots.release()
        return send_result(response, mq, out.unique_id, where)
