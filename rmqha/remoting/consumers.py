# -*- test-case-name: tests.test_remoting_pulls -*-
"""
A broker's clients, as 4.9.8's C{ConsumerManager}, C{ProducerManager},
C{ClientManageProcessor} and C{ClientHousekeepingService} keep them
(docs/remoting.md, "Consuming"): HEART_BEAT (34), UNREGISTER_CLIENT (35),
GET_CONSUMER_LIST_BY_GROUP (38), and NOTIFY_CONSUMER_IDS_CHANGED (40)
sent to a group's clients when its membership changes.

Each client is kept with the connection it last heartbeat over; the
connection's end or 120 s without a heartbeat removes it.  Everything a
stranger can make the broker keep is bounded (L{ClientLimits}); a
heartbeat past a bound is refused, naming it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Final

from twisted.internet.interfaces import IAddress, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from rmqha.remoting._frames import (
    CustomHeaderError,
    RemotingCommand,
    header_from_ext_fields,
    header_to_ext_fields,
    make_response,
)
from rmqha.remoting.codes import RequestCode, ResponseCode
from rmqha.remoting.headers import (
    GetConsumerListByGroupRequestHeader,
    NotifyConsumerIdsChangedRequestHeader,
    UnregisterClientRequestHeader,
)
from rmqha.remoting.metadata import (
    PERM_READ,
    PERM_WRITE,
    BrokerMetadata,
    MetadataError,
    MetadataFile,
    SubscriptionGroupConfig,
    TopicConfig,
    dump_fastjson,
    parse_fastjson,
)
from rmqha.remoting.protocol import Answer, RemotingProtocol, format_peer

__all__ = [
    "SERVED",
    "CHANNEL_EXPIRED_MILLIS",
    "ClientLimits",
    "SubscriptionData",
    "ConsumerData",
    "HeartbeatData",
    "HeartbeatError",
    "parse_heartbeat",
    "ConsumerGroup",
    "ClientManager",
    "retry_topic",
]

#: The request codes L{ClientManager} answers.
SERVED: Final = (
    RequestCode.HEART_BEAT,
    RequestCode.UNREGISTER_CLIENT,
    RequestCode.GET_CONSUMER_LIST_BY_GROUP,
)

#: C{ConsumerManager.CHANNEL_EXPIRED_TIMEOUT}: a client silent this long
#: is dropped (scanned every 10 s, C{ClientHousekeepingService}).
CHANNEL_EXPIRED_MILLIS: Final = 120_000
SCAN_INTERVAL: Final = 10.0
_RETRY_PREFIX = "%RETRY%"


def retry_topic(group: str) -> str:
    """C{MixAll.getRetryTopic}."""
    return _RETRY_PREFIX + group


@dataclasses.dataclass(frozen=True)
class ClientLimits:
    """
    What the broker keeps for clients, at most (RocketMQ keeps anything).

    @ivar clients: client IDs (consumers and producers) in all.
    @ivar groups: consumer groups and producer groups, each.
    @ivar subscriptions: topics one consumer group subscribes.
    @ivar tags: tags (and tag codes) in one subscription.
    """

    clients: int = 10_000
    groups: int = 10_000
    subscriptions: int = 1_000
    tags: int = 1_000


@dataclasses.dataclass(frozen=True)
class SubscriptionData:
    """C{SubscriptionData} of a heartbeat (or of a pull's own)."""

    topic: str
    sub_string: str
    tags: frozenset[str]
    codes: frozenset[int]
    sub_version: int
    expression_type: str = "TAG"
    class_filter_mode: bool = False

    @classmethod
    def build(cls, topic: str, expression: str | None, expression_type: str | None, sub_version: int) -> SubscriptionData:
        """
        C{FilterAPI.build} for a TAG expression: C{"*"} or empty takes
        everything, C{"A || B"} the tags A and B (codes by Java's
        C{String.hashCode}).
        """
        from rmqha._javahash import java_string_hash

        kind = expression_type or "TAG"
        if expression is None or expression.strip() in ("", "*"):
            return cls(topic, "*", frozenset(), frozenset(), sub_version, kind)
        tags = frozenset(t.strip() for t in expression.split("||") if t.strip())
        return cls(topic, expression, tags, frozenset(java_string_hash(t) for t in tags), sub_version, kind)

    @property
    def takes_all(self) -> bool:
        """Every unit matches (C{"*"}, or class-filter mode)."""
        return self.class_filter_mode or self.sub_string == "*"

    def matches_code(self, tags_code: int) -> bool:
        """
        C{ExpressionMessageFilter.isMatchedByConsumeQueue} for TAG: every
        unit for C{"*"} (and in class-filter mode), else the unit's tag code
        (as an int, Java's C{intValue}) must be in C{codeSet}.
        """
        if self.takes_all:
            return True
        code = tags_code & 0xFFFFFFFF
        code = code - (1 << 32) if code & 0x80000000 else code
        return code in self.codes


@dataclasses.dataclass(frozen=True)
class ConsumerData:
    group_name: str
    consume_type: str
    message_model: str
    consume_from_where: str
    subscriptions: tuple[SubscriptionData, ...]
    unit_mode: bool = False


@dataclasses.dataclass(frozen=True)
class HeartbeatData:
    client_id: str
    consumers: tuple[ConsumerData, ...]
    producer_groups: tuple[str, ...]


class HeartbeatError(ValueError):
    """A HEART_BEAT body that is not a C{HeartbeatData} (the text says where)."""


def _list(doc: Mapping[Any, Any], key: str, where: str) -> list[Any]:
    value = doc.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise HeartbeatError(f"{where}.{key} is not a list")
    return value


def _str(doc: Mapping[Any, Any], key: str, where: str, default: str | None = None) -> str:
    value = doc.get(key, default)
    if not isinstance(value, str):
        raise HeartbeatError(f"{where}.{key} is not a string")
    return value


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise HeartbeatError(f"{where} is not an integer")
    return value


def parse_heartbeat(body: bytes, limits: ClientLimits = ClientLimits()) -> HeartbeatData:
    """
    A HEART_BEAT body (C{HeartbeatData} as fastjson writes it, or as any
    JSON writer does).

    @raise HeartbeatError: naming the field, or the bound exceeded.
    """
    try:
        doc = parse_fastjson(body.decode("utf-8"), max_depth=8)
    except (UnicodeDecodeError, MetadataError) as e:
        raise HeartbeatError(f"the heartbeat body does not parse: {e}") from None
    if not isinstance(doc, dict):
        raise HeartbeatError("the heartbeat body is not an object")
    client_id = _str(doc, "clientID", "heartbeat")
    consumers = []
    for i, c in enumerate(_list(doc, "consumerDataSet", "heartbeat")):
        where = f"heartbeat.consumerDataSet[{i}]"
        if not isinstance(c, dict):
            raise HeartbeatError(f"{where} is not an object")
        subs = []
        raw_subs = _list(c, "subscriptionDataSet", where)
        if len(raw_subs) > limits.subscriptions:
            raise HeartbeatError(
                f"{where} subscribes {len(raw_subs)} topics: more than the broker keeps "
                f"for one consumer group ({limits.subscriptions}, subscriptions)"
            )
        for j, s in enumerate(raw_subs):
            sw = f"{where}.subscriptionDataSet[{j}]"
            if not isinstance(s, dict):
                raise HeartbeatError(f"{sw} is not an object")
            tags = _list(s, "tagsSet", sw)
            codes = _list(s, "codeSet", sw)
            if len(tags) > limits.tags or len(codes) > limits.tags:
                raise HeartbeatError(f"{sw} has more than {limits.tags} tags (the broker's bound, tags)")
            if not all(isinstance(t, str) for t in tags):
                raise HeartbeatError(f"{sw}.tagsSet holds a non-string")
            subs.append(
                SubscriptionData(
                    topic=_str(s, "topic", sw),
                    sub_string=_str(s, "subString", sw, "*"),
                    tags=frozenset(tags),
                    codes=frozenset(_int(x, f"{sw}.codeSet") for x in codes),
                    sub_version=_int(s.get("subVersion", 0), f"{sw}.subVersion"),
                    expression_type=_str(s, "expressionType", sw, "TAG"),
                    class_filter_mode=bool(s.get("classFilterMode", False)),
                )
            )
        consumers.append(
            ConsumerData(
                group_name=_str(c, "groupName", where),
                consume_type=_str(c, "consumeType", where, "CONSUME_PASSIVELY"),
                message_model=_str(c, "messageModel", where, "CLUSTERING"),
                consume_from_where=_str(c, "consumeFromWhere", where, "CONSUME_FROM_LAST_OFFSET"),
                subscriptions=tuple(subs),
                unit_mode=bool(c.get("unitMode", False)),
            )
        )
    producers = []
    for i, p in enumerate(_list(doc, "producerDataSet", "heartbeat")):
        if not isinstance(p, dict):
            raise HeartbeatError(f"heartbeat.producerDataSet[{i}] is not an object")
        producers.append(_str(p, "groupName", f"heartbeat.producerDataSet[{i}]"))
    if len(consumers) > limits.groups or len(producers) > limits.groups:
        raise HeartbeatError(f"the heartbeat names more than {limits.groups} groups (the broker's bound, groups)")
    return HeartbeatData(client_id, tuple(consumers), tuple(producers))


@dataclasses.dataclass
class _Client:
    """C{ClientChannelInfo}: a client's connection and last heartbeat."""

    client_id: str
    protocol: RemotingProtocol
    last_update: float
    version: int
    language: str


@dataclasses.dataclass
class ConsumerGroup:
    """
    C{ConsumerGroupInfo}: a group's clients (by connection) and the
    subscriptions of its last heartbeats.
    """

    name: str
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    clients: dict[RemotingProtocol, _Client] = dataclasses.field(default_factory=dict)
    subscriptions: dict[str, SubscriptionData] = dataclasses.field(default_factory=dict)

    def client_ids(self) -> list[str]:
        return [c.client_id for c in self.clients.values()]

    def subscription(self, topic: str) -> SubscriptionData | None:
        return self.subscriptions.get(topic)


class ClientManager:
    """
    The clients of one broker's remoting port: consumer groups (with
    their subscriptions, which pulls without their own read), producer
    groups, and the connections they came over.

    @param metadata: the broker's metadata at the time of a request.
    @param clock: heartbeat times and the expiry scan.
    """

    _log = Logger(namespace="rmqha.remoting.consumers")

    def __init__(
        self,
        metadata: Callable[[], BrokerMetadata],
        clock: IReactorTime,
        limits: ClientLimits = ClientLimits(),
        expiry_millis: int = CHANNEL_EXPIRED_MILLIS,
    ) -> None:
        self._metadata = metadata
        self._clock = clock
        self.limits = limits
        self.expiry = expiry_millis / 1000
        self.consumers: dict[str, ConsumerGroup] = {}
        self.producers: dict[str, dict[RemotingProtocol, _Client]] = {}
        self._scan: LoopingCall | None = None
        self._connections: dict[int, RemotingProtocol] = {}

    def handlers(self) -> Mapping[int, Callable[[RemotingCommand, "IAddress | None"], Answer]]:
        return {
            RequestCode.HEART_BEAT: self.heart_beat,
            RequestCode.UNREGISTER_CLIENT: self.unregister_client,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self.get_consumer_list_by_group,
        }

    # -- connections -------------------------------------------------------------

    def _protocol_of(self, peer: IAddress | None) -> RemotingProtocol | None:
        return self._connections.get(id(peer)) if peer is not None else None

    def connection_made(self, protocol: RemotingProtocol) -> None:
        self._connections[id(protocol.peer)] = protocol
        if self._scan is None:
            self._scan = LoopingCall(self.scan_not_active)
            self._scan.clock = self._clock
            self._scan.start(SCAN_INTERVAL, now=False)

    def connection_lost(self, protocol: RemotingProtocol) -> None:
        """
        C{doChannelCloseEvent}: every group the connection's clients were
        in forgets them; the others in a consumer group are told.
        """
        if self._connections.get(id(protocol.peer)) is protocol:
            del self._connections[id(protocol.peer)]
        self._remove_protocol(protocol, "its connection closed")
        if not self._connections and self._scan is not None:
            if self._scan.running:
                self._scan.stop()
            self._scan = None

    def _remove_protocol(self, protocol: RemotingProtocol, why: str) -> None:
        for name in list(self.consumers):
            group = self.consumers[name]
            client = group.clients.pop(protocol, None)
            if client is None:
                continue
            self._log.info(
                "consumer {client} of group {group} ({peer}) removed: {why}",
                client=client.client_id, group=name, peer=format_peer(protocol.peer), why=why,
            )
            if not group.clients:
                del self.consumers[name]
            else:
                self._notify(name)
        for name in list(self.producers):
            members = self.producers[name]
            if members.pop(protocol, None) is not None and not members:
                del self.producers[name]

    def stop(self) -> None:
        """Stop the expiry scan (the broker stops)."""
        if self._scan is not None and self._scan.running:
            self._scan.stop()
        self._scan = None

    def scan_not_active(self) -> None:
        """
        C{scanNotActiveChannel}: clients whose last heartbeat is older than
        120 s are removed and their connections closed.
        """
        now = self._clock.seconds()
        stale: set[RemotingProtocol] = set()
        for group in self.consumers.values():
            stale.update(p for p, c in group.clients.items() if now - c.last_update > self.expiry)
        for members in self.producers.values():
            stale.update(p for p, c in members.items() if now - c.last_update > self.expiry)
        for protocol in stale:
            self._remove_protocol(protocol, f"no heartbeat for {self.expiry:g} s")
            if protocol.transport is not None:
                protocol.transport.loseConnection()

    def client_count(self) -> int:
        seen = {p for g in self.consumers.values() for p in g.clients}
        seen.update(p for m in self.producers.values() for p in m)
        return len(seen)

    # -- the requests --------------------------------------------------------------

    def heart_beat(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
        """
        Code 34 (C{ClientManageProcessor.heartBeat}): each consumer group
        is found or created (C{autoCreateSubscriptionGroup}), its
        C{%RETRY%} topic created, the client and its subscriptions kept
        with this connection; a new member or a changed subscription tells
        the group's clients (NOTIFY_CONSUMER_IDS_CHANGED).  Producer groups
        are kept likewise.  SUCCESS, no body.
        """
        protocol = self._protocol_of(peer)
        try:
            data = parse_heartbeat(request.body, self.limits)
        except HeartbeatError as e:
            return make_response(request, ResponseCode.SYSTEM_ERROR, str(e))
        if protocol is None:
            return make_response(request, ResponseCode.SYSTEM_ERROR, "the heartbeat's connection is not known")
        known = any(protocol in g.clients for g in self.consumers.values()) or any(
            protocol in m for m in self.producers.values()
        )
        if not known and self.client_count() >= self.limits.clients:
            return make_response(
                request,
                ResponseCode.SYSTEM_ERROR,
                f"the broker keeps {self.limits.clients} clients already (its bound, clients)",
            )
        new_groups = {c.group_name for c in data.consumers if c.group_name not in self.consumers}
        if len(self.consumers) + len(new_groups) > self.limits.groups:
            return make_response(
                request,
                ResponseCode.SYSTEM_ERROR,
                f"the broker keeps {self.limits.groups} consumer groups already (its bound, groups)",
            )
        new_producers = {g for g in data.producer_groups if g not in self.producers}
        if len(self.producers) + len(new_producers) > self.limits.groups:
            return make_response(
                request,
                ResponseCode.SYSTEM_ERROR,
                f"the broker keeps {self.limits.groups} producer groups already (its bound, groups)",
            )
        now = self._clock.seconds()
        metadata = self._metadata()
        for consumer in data.consumers:
            try:
                config = self.find_group(metadata, consumer.group_name)
                self._retry_topic(metadata, consumer.group_name, config)
            except MetadataError as e:
                return make_response(request, ResponseCode.SYSTEM_ERROR, str(e))
            client = _Client(data.client_id, protocol, now, request.version, request.language.name)
            if self.register_consumer(consumer, client) and config.notify_consumer_ids_changed_enable:
                self._notify(consumer.group_name)
        for name in data.producer_groups:
            self.producers.setdefault(name, {})[protocol] = _Client(
                data.client_id, protocol, now, request.version, request.language.name
            )
        return make_response(request, ResponseCode.SUCCESS)

    def register_consumer(self, consumer: ConsumerData, client: _Client) -> bool:
        """
        C{ConsumerManager.registerConsumer}: whether the group's membership
        or subscriptions changed (a new connection, a topic subscribed or
        dropped).
        """
        group = self.consumers.get(consumer.group_name)
        if group is None:
            group = self.consumers[consumer.group_name] = ConsumerGroup(consumer.group_name)
        group.consume_type = consumer.consume_type
        group.message_model = consumer.message_model
        group.consume_from_where = consumer.consume_from_where
        old = group.clients.get(client.protocol)
        # (A new client ID on a known connection is kept, not a change.)
        changed = old is None
        if old is None:
            self._log.info(
                "new consumer {client} in group {group} ({peer})",
                client=client.client_id, group=group.name, peer=format_peer(client.protocol.peer),
            )
        group.clients[client.protocol] = client
        # updateSubscription: new topics or newer versions taken, topics
        # the heartbeat no longer names dropped.
        topics = {s.topic for s in consumer.subscriptions}
        for sub in consumer.subscriptions:
            have = group.subscriptions.get(sub.topic)
            if have is None:
                changed = True
                group.subscriptions[sub.topic] = sub
            elif sub.sub_version > have.sub_version:
                group.subscriptions[sub.topic] = sub
        for topic in list(group.subscriptions):
            if topic not in topics:
                del group.subscriptions[topic]
                changed = True
        return changed

    def find_group(self, metadata: BrokerMetadata, name: str) -> SubscriptionGroupConfig:
        """
        C{findSubscriptionGroupConfig} with C{autoCreateSubscriptionGroup}
        (4.9.8's default): an unknown group is made with the defaults and
        written to C{subscriptionGroup.json}.

        @raise MetadataError: a name outside RocketMQ's rules, or the
            table's cap reached (naming it).
        """
        config = metadata.group(name)
        if config is None:
            config = SubscriptionGroupConfig(name)
            metadata.update_group(config, persist=False)
            try:
                metadata.persist(MetadataFile.SUBSCRIPTION_GROUPS)
            except OSError as e:
                self._log.error(
                    "cannot write {path}: {error}", path=metadata.path(MetadataFile.SUBSCRIPTION_GROUPS), error=e
                )
        return config

    def _retry_topic(self, metadata: BrokerMetadata, group: str, config: SubscriptionGroupConfig) -> None:
        """C{createTopicInSendMessageBackMethod}: C{%RETRY%group}, read-write."""
        name = retry_topic(group)
        if metadata.topic(name) is not None:
            return
        queues = max(config.retry_queue_nums, 0)
        metadata.update_topic(TopicConfig(name, queues, queues, PERM_READ | PERM_WRITE), persist=False)
        try:
            metadata.persist(MetadataFile.TOPICS)
        except OSError as e:
            self._log.error("cannot write {path}: {error}", path=metadata.path(MetadataFile.TOPICS), error=e)

    def _notify(self, group_name: str) -> None:
        """
        C{DefaultConsumerIdsChangeListener} on CHANGE: a oneway
        NOTIFY_CONSUMER_IDS_CHANGED to every client of the group.
        """
        group = self.consumers.get(group_name)
        config = self._metadata().group(group_name)
        if group is None or (config is not None and not config.notify_consumer_ids_changed_enable):
            return
        ext = header_to_ext_fields(NotifyConsumerIdsChangedRequestHeader(group_name))
        for protocol in list(group.clients):
            if not protocol.is_open:
                continue
            try:
                protocol.send_oneway(RemotingCommand(code=RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, ext_fields=ext))
            except Exception as e:  # (a connection closing meanwhile)
                self._log.warn(
                    "cannot tell {peer} of group {group}'s change: {error}",
                    peer=format_peer(protocol.peer), group=group_name, error=e,
                )

    def unregister_client(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
        """
        Code 35: the client leaves the consumer and producer groups named
        (the others in the consumer group are told).
        """
        try:
            header = header_from_ext_fields(UnregisterClientRequestHeader, request.ext_fields)
        except CustomHeaderError as e:
            return make_response(request, ResponseCode.SYSTEM_ERROR, str(e))
        protocol = self._protocol_of(peer)
        if header.consumer_group:
            group = self.consumers.get(header.consumer_group)
            if group is not None and protocol is not None and group.clients.pop(protocol, None) is not None:
                if not group.clients:
                    del self.consumers[header.consumer_group]
                else:
                    self._notify(header.consumer_group)
        if header.producer_group and protocol is not None:
            members = self.producers.get(header.producer_group)
            if members is not None and members.pop(protocol, None) is not None and not members:
                del self.producers[header.producer_group]
        return make_response(request, ResponseCode.SUCCESS)

    def get_consumer_list_by_group(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
        """
        Code 38: C{{"consumerIdList":[...]}}; SYSTEM_ERROR when the group
        has no client (C{ConsumerManageProcessor.getConsumerListByGroup}).
        """
        try:
            header = header_from_ext_fields(GetConsumerListByGroupRequestHeader, request.ext_fields)
        except CustomHeaderError as e:
            return make_response(request, ResponseCode.SYSTEM_ERROR, str(e))
        group = self.consumers.get(header.consumer_group)
        ids = group.client_ids() if group is not None else []
        if not ids:
            return make_response(request, ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {header.consumer_group}")
        body = dump_fastjson({"consumerIdList": list(ids)})
        return make_response(request, ResponseCode.SUCCESS, body=body.encode("utf-8"))
