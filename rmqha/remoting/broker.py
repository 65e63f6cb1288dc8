# -*- test-case-name: tests.test_remoting_broker -*-
"""
A broker's remoting port: what a NameServer, a slave and an admin tool
ask a broker for now (docs/remoting.md, "The broker's remoting port").

L{broker_handler} is the table of request codes served, on a
L{Dispatcher} (every other code is answered REQUEST_CODE_NOT_SUPPORTED
by the protocol); L{RemotingPort} listens on C{--listen} (C{listenPort})
through the broker's listening helper and connection limits, as the HA
and admin HTTP ports do, and on RocketMQ's VIP port, its port less 2
(L{vip_endpoint}).

Each answer is built from the broker at the time of the request (its
L{BrokerMetadata}, its commit log), so a handler holds nothing of its
own but the encoded topic table of the last data version asked for.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from twisted.internet.interfaces import IAddress, IStreamServerEndpoint
from twisted.logger import Logger
from zope.interface import implementer

from rmqha._ports import Port, listen, listened_address
from rmqha.remoting._frames import RemotingCommand, java_hashmap_order, make_response
from rmqha.remoting.codes import VERSION_4_9_8, RequestCode, ResponseCode
from rmqha.remoting.metadata import (
    TOPIC_MAX_LENGTH,
    BrokerMetadata,
    DataVersion,
    MetadataError,
    MetadataFile,
    TopicConfig,
    TopicFilterType,
    dump_fastjson,
    parse_fastjson,
)
from rmqha.remoting.consumers import SERVED as CLIENT_CODES
from rmqha.remoting.consumers import ClientManager
from rmqha.remoting.offsets import SERVED as OFFSET_CODES
from rmqha.remoting.pulls import SERVED as PULL_CODES
from rmqha.remoting.pulls import PullHandlers
from rmqha.remoting.offsets import ConsumerOffsets
from rmqha.remoting.protocol import (
    Answer,
    Dispatcher,
    IConnectionObserver,
    IRemotingHandler,
    RemotingFactory,
    RemotingProtocol,
    format_peer,
)

if TYPE_CHECKING:
    from rmqha.broker import Broker

__all__ = [
    "SERVED",
    "SYSTEM_TOPICS",
    "BrokerRemoting",
    "broker_handler",
    "BrokerDispatcher",
    "RemotingPort",
    "NOT_ON_VIP",
    "vip_description",
    "vip_endpoint",
    "human_bytes",
    "format_runtime",
]

#: The request codes a broker's remoting port answers.
SERVED: Final = (
    RequestCode.UPDATE_AND_CREATE_TOPIC,
    RequestCode.GET_ALL_TOPIC_CONFIG,
    RequestCode.GET_BROKER_RUNTIME_INFO,
    RequestCode.GET_ALL_CONSUMER_OFFSET,
    RequestCode.GET_ALL_DELAY_OFFSET,
    RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
    RequestCode.QUERY_DATA_VERSION,
    *OFFSET_CODES,
    # Sends (rmqha.remoting.sends).
    RequestCode.SEND_MESSAGE,
    RequestCode.SEND_MESSAGE_V2,
    RequestCode.SEND_BATCH_MESSAGE,
    # Pulls and clients (rmqha.remoting.pulls, rmqha.remoting.consumers).
    *PULL_CODES,
    *CLIENT_CODES,
)

#: C{TopicValidator}'s system topics (4.9.8), which UPDATE_AND_CREATE_TOPIC
#: refuses, as do topics starting C{rmq_sys_}.
SYSTEM_TOPICS: Final = frozenset(
    {
        "TBW102",
        "SCHEDULE_TOPIC_XXXX",
        "BenchmarkTest",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRACE_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        "SELF_TEST_TOPIC",
        "OFFSET_MOVED_EVENT",
    }
)
_SYSTEM_TOPIC_PREFIX = "rmq_sys_"
_TOPIC_PATTERN = "^[%|a-zA-Z0-9_-]+$"
_TOPIC_CHARS = frozenset("%|abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_INT32 = (-(1 << 31), (1 << 31) - 1)


class _HeaderError(Exception):
    """
    A custom header field is missing or not of its type (Java's
    C{decodeCommandCustomHeader} throws, and the request is answered
    SYSTEM_ERROR).
    """


def _required(request: RemotingCommand, name: str) -> str:
    value = request.ext(name)
    if value is None:
        raise _HeaderError(f"the custom field <{name}> is null")
    return value


def _java_int(request: RemotingCommand, name: str, text: str) -> int:
    # Integer.parseInt: an optional sign and decimal digits, in range.
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not digits.isascii() or not digits.isdigit() or len(digits) > 11:
        raise _HeaderError(f"the custom field <{name}> is not an int: {text[:40]!r}")
    value = int(text)
    if not _INT32[0] <= value <= _INT32[1]:
        raise _HeaderError(f"the custom field <{name}> is not an int: {text[:40]!r}")
    return value


def human_bytes(count: int) -> str:
    """
    C{MixAll.humanReadableByteCount(count, false)}: C{"512 B"},
    C{"1.5 KiB"}, C{"2.0 GiB"}.
    """
    if count < 1024:
        return f"{count} B"
    exp = min(int(math.log(count) / math.log(1024)), 6)
    return f"{count / 1024 ** exp:.1f} {'KMGTPE'[exp - 1]}iB"


def format_runtime(millis: int) -> str:
    """
    C{StoreStatsService.getFormatRuntime}: C{"[ 0 days, 1 hours, 2
    minutes, 3 seconds ]"}.
    """
    millis = max(0, millis)
    day, hour, minute, second = 86_400_000, 3_600_000, 60_000, 1000
    return (
        f"[ {millis // day:,} days, {millis % day // hour} hours, "
        f"{millis % hour // minute} minutes, {millis % minute // second} seconds ]"
    )


class BrokerRemoting:
    """
    The requests a broker answers on its remoting port, each a method
    taking the request and the peer; L{handlers} maps codes to them.

    @ivar boot_millis: when the broker started, ms since the epoch (its
        C{bootTimestamp}).
    """

    _log = Logger(namespace="rmqha.remoting.broker")

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self.boot_millis = int(broker.reactor.seconds() * 1000)
        self._topics_cache: tuple[tuple[int, int, int], bytes] | None = None
        self._offsets = ConsumerOffsets(lambda: broker.metadata, lambda: broker.store.commitlog)
        from rmqha.remoting.sends import SendHandlers

        self._sends = SendHandlers(broker)
        #: The broker's clients (heartbeats) and its pulls.
        self.clients = ClientManager(lambda: broker.metadata, broker.reactor)
        self.pulls = PullHandlers(broker, self.clients)

    @property
    def metadata(self) -> BrokerMetadata:
        return self._broker.metadata

    def handlers(self) -> Mapping[int, Callable[[RemotingCommand, "IAddress | None"], Answer]]:
        return {
            RequestCode.UPDATE_AND_CREATE_TOPIC: self.update_and_create_topic,
            RequestCode.GET_ALL_TOPIC_CONFIG: self.get_all_topic_config,
            RequestCode.GET_BROKER_RUNTIME_INFO: self.get_broker_runtime_info,
            RequestCode.GET_ALL_CONSUMER_OFFSET: self.get_all_consumer_offset,
            RequestCode.GET_ALL_DELAY_OFFSET: self.get_all_delay_offset,
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: self.get_all_subscription_group,
            RequestCode.QUERY_DATA_VERSION: self.query_data_version,
            **self._offsets.handlers(),
            **self._sends.handlers(),
            **self.pulls.handlers(),
            **self.clients.handlers(),
        }

    # -- the tables ------------------------------------------------------------

    def get_all_topic_config(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
        """
        Code 21: C{TopicConfigSerializeWrapper} (C{topicConfigTable} and
        C{dataVersion}), compact fastjson as C{TopicConfigManager.encode}
        writes it.  The encoding is kept for its data version: a slave
        asking every 10 s costs one encoding per change.
        """
        metadata = self.metadata
        version = metadata.topics_version
        # (The count too: add_builtins adds topics without a new version.)
        key = (version.timestamp, version.counter, len(metadata.topics))
        if self._topics_cache is None or self._topics_cache[0] != key:
            self._topics_cache = (key, metadata.encode(MetadataFile.TOPICS).encode("utf-8"))
        return make_response(request, ResponseCode.SUCCESS, body=self._topics_cache[1])

    def get_all_consumer_offset(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
        """Code 43: C{{"offsetTable":{"topic@group":{0:120}}}}."""
        return self._table(request, MetadataFile.CONSUMER_OFFSETS)

    def get_all_delay_offset(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
        """Code 45: C{{"offsetTable":{1:0,2:15}}}."""
        return self._table(request, MetadataFile.DELAY_OFFSETS)

    def get_all_subscription_group(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
        """Code 201: C{SubscriptionGroupWrapper}."""
        return self._table(request, MetadataFile.SUBSCRIPTION_GROUPS)

    def _table(self, request: RemotingCommand, which: MetadataFile) -> RemotingCommand:
        return make_response(request, ResponseCode.SUCCESS, body=self.metadata.encode(which).encode("utf-8"))

    def query_data_version(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
        """
        Code 322, as a NameServer answers it (a genuine broker does not
        serve it): C{changed} says whether the body's C{DataVersion}
        differs from this broker's topic table's, and the body is the
        broker's; a request without a body is C{changed}.
        """
        ours = self.metadata.topics_version
        changed = True
        if request.body:
            try:
                theirs = DataVersion.from_json(
                    parse_fastjson(request.body.decode("utf-8", "strict"), max_depth=4)
                )
            except (MetadataError, UnicodeDecodeError) as e:
                return make_response(
                    request, ResponseCode.SYSTEM_ERROR, f"the body is not a DataVersion: {e}"
                )
            changed = not theirs.same(ours)
        return make_response(
            request,
            ResponseCode.SUCCESS,
            ext_fields={"changed": "true" if changed else "false"},
            body=dump_fastjson(ours.to_json()).encode("utf-8"),
        )

    # -- UPDATE_AND_CREATE_TOPIC -----------------------------------------------

    def update_and_create_topic(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
        """
        Code 17 (C{AdminBrokerProcessor.updateAndCreateTopic}): the topic of
        the C{CreateTopicRequestHeader} created or replaced, the topic
        table's data version moved on and C{config/topics.json} written
        before the answer.  A slave takes it too, as 4.9.8's does (its next
        sync from the master replaces the table).
        """
        try:
            topic = _required(request, "topic")
            _required(request, "defaultTopic")
            read = _java_int(request, "readQueueNums", _required(request, "readQueueNums"))
            write = _java_int(request, "writeQueueNums", _required(request, "writeQueueNums"))
            perm = _java_int(request, "perm", _required(request, "perm"))
            filter_type = _required(request, "topicFilterType")
            _required(request, "order")
            sys_flag_text = request.ext("topicSysFlag")
            sys_flag = 0 if sys_flag_text is None else _java_int(request, "topicSysFlag", sys_flag_text)
        except _HeaderError as e:
            return make_response(request, ResponseCode.SYSTEM_ERROR, str(e))
        refusal = _topic_refusal(topic)
        if refusal is not None:
            return make_response(request, ResponseCode.SYSTEM_ERROR, refusal)
        if filter_type not in (t.value for t in TopicFilterType):
            return make_response(
                request,
                ResponseCode.SYSTEM_ERROR,
                f"topicFilterType {filter_type[:40]!r} is not SINGLE_TAG or MULTI_TAG",
            )
        config = TopicConfig(
            topic_name=topic,
            read_queue_nums=read,
            write_queue_nums=write,
            perm=perm,
            topic_filter_type=filter_type,
            topic_sys_flag=sys_flag,
        )
        metadata = self.metadata
        try:
            metadata.update_topic(config, persist=False)
        except MetadataError as e:
            return make_response(request, ResponseCode.SYSTEM_ERROR, str(e))
        self._log.info(
            "topic {topic} created or updated by {peer} (read {read}, write {write}, perm {perm})",
            topic=topic,
            peer=format_peer(peer),
            read=read,
            write=write,
            perm=perm,
        )
        try:
            metadata.persist(MetadataFile.TOPICS)
        except OSError as e:
            self._log.error(
                "cannot write {path}: {error}", path=metadata.path(MetadataFile.TOPICS), error=e
            )
            return make_response(
                request,
                ResponseCode.SYSTEM_ERROR,
                f"topic {topic} is updated in memory but {metadata.path(MetadataFile.TOPICS)} "
                f"could not be written: {e}",
            )
        return make_response(request, ResponseCode.SUCCESS)

    # -- GET_BROKER_RUNTIME_INFO -----------------------------------------------

    def runtime_info(self) -> dict[str, str]:
        """
        The entries of C{prepareRuntimeInfo} rmqha knows, by their 4.9.8
        names (what C{mqadmin brokerStatus} prints).
        """
        broker = self._broker
        now = int(broker.reactor.seconds() * 1000)
        info = {
            "brokerVersionDesc": "V4_9_8",
            "brokerVersion": str(VERSION_4_9_8),
            "bootTimestamp": str(self.boot_millis),
            "runtime": format_runtime(now - self.boot_millis),
            "putMessageTimesTotal": str(broker.put_path.puts),
        }
        commitlog = broker.store.commitlog
        if commitlog is not None:
            info["commitLogMinOffset"] = str(commitlog.min_offset)
            info["commitLogMaxOffset"] = str(commitlog.max_offset)
            info["remainHowManyDataToFlush"] = human_bytes(
                max(0, commitlog.max_offset - commitlog.flushed_offset)
            )
            queues = commitlog.consume_queues
            if queues is not None:
                # (DefaultMessageStore.dispatchBehindBytes: the log's bytes
                # not yet in the consume queues.)
                info["dispatchBehindBytes"] = str(max(0, commitlog.max_offset - queues.dispatched))
            try:
                fs = os.statvfs(commitlog.store_dir)
            except OSError:
                pass
            else:
                total, free = fs.f_blocks * fs.f_frsize, fs.f_bavail * fs.f_frsize
                info["commitLogDirCapacity"] = f"Total : {human_bytes(total)}, Free : {human_bytes(free)}."
                if total > 0:
                    info["commitLogDiskRatio"] = repr((total - free) / total)
        return info

    def get_broker_runtime_info(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
        """
        Code 28: a C{KVTable} (C{{"table":{...}}}), the keys in the
        order of the Java C{HashMap} that holds them.
        """
        info = self.runtime_info()
        table: dict[str | int, Any] = {k: info[k] for k in java_hashmap_order(info)}
        body = dump_fastjson({"table": table}).encode("utf-8")
        return make_response(request, ResponseCode.SUCCESS, body=body)


def _topic_refusal(topic: str) -> str | None:
    """
    C{TopicValidator.validateTopic} and C{isSystemTopic}: the remark of
    4.9.8's refusal, or C{None}.
    """
    if not topic.strip():
        return "The specified topic is blank."
    if not set(topic) <= _TOPIC_CHARS:
        return f"The specified topic contains illegal characters, allowing only {_TOPIC_PATTERN}"
    if len(topic) > TOPIC_MAX_LENGTH:
        return "The specified topic is longer than topic max length."
    if topic in SYSTEM_TOPICS or topic.startswith(_SYSTEM_TOPIC_PREFIX):
        return f"The topic[{topic}] is conflict with system topic."
    return None


class BrokerDispatcher(Dispatcher):
    """
    The L{Dispatcher} of a broker's remoting port, telling its clients'
    manager of its connections.

    @ivar remoting: the L{BrokerRemoting} it serves.
    """

    def __init__(self, remoting: BrokerRemoting) -> None:
        super().__init__(remoting.handlers(), remoting.clients)
        self.remoting = remoting


def broker_handler(broker: Broker) -> BrokerDispatcher:
    """
    The L{Dispatcher} of a broker's remoting port.
    """
    return BrokerDispatcher(BrokerRemoting(broker))


#: The codes 4.9.8's second server, the VIP port, does not serve: of the
#: processors C{BrokerController.registerProcessor} registers, only
#: PULL_MESSAGE's is on the main port alone (the admin processor is both
#: servers' default).
NOT_ON_VIP: Final = frozenset({RequestCode.PULL_MESSAGE})

#: The VIP port is the remoting port's number less this
#: (C{fastConfig.setListenPort(nettyServerConfig.getListenPort() - 2)}).
VIP_PORT_OFFSET: Final = 2


@implementer(IRemotingHandler, IConnectionObserver)
class _VIPHandler:
    """
    The remoting port's handler as the VIP port serves it: every code but
    L{NOT_ON_VIP}.
    """

    def __init__(self, handler: IRemotingHandler) -> None:
        self._handler = handler

    def handles(self, code: int) -> bool:
        return code not in NOT_ON_VIP and bool(self._handler.handles(code))

    def handle(self, command: RemotingCommand, peer: IAddress | None) -> Answer:
        answer: Answer = self._handler.handle(command, peer)
        return answer

    def connection_made(self, protocol: RemotingProtocol) -> None:
        if IConnectionObserver.providedBy(self._handler):
            self._handler.connection_made(protocol)

    def connection_lost(self, protocol: RemotingProtocol) -> None:
        if IConnectionObserver.providedBy(self._handler):
            self._handler.connection_lost(protocol)


def _split_raw(description: str) -> list[str]:
    # On the colons a backslash does not escape; escapes are kept.
    parts, current, escaped = [], [], False
    for char in description:
        if escaped:
            current.append(char)
            escaped = False
        elif char == "\\":
            current.append(char)
            escaped = True
        elif char == ":":
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def _vip_number(port: int) -> int | None:
    if port == 0:
        return None
    if port <= VIP_PORT_OFFSET:
        raise ValueError(
            f"the VIP port (the remoting port less {VIP_PORT_OFFSET}, as RocketMQ derives it) "
            f"would be {port - VIP_PORT_OFFSET}: give a port above {VIP_PORT_OFFSET}"
        )
    return port - VIP_PORT_OFFSET


def vip_description(listen: str) -> str | None:
    """
    The endpoint description of the VIP port that goes with the remoting
    port C{listen}: the same, on its port less 2, for a C{tcp:}, C{tcp6:}
    or C{ssl:} description with a port number; C{None} for port 0 (there
    is no number to derive from until the system picks one) and for any
    other endpoint (C{unix:}, C{systemd:}...).

    @raise ValueError: port 1 or 2 (the VIP port would be -1 or 0).
    """
    parts = _split_raw(listen)
    if parts[0] not in ("tcp", "tcp6", "ssl"):
        return None
    for i, part in enumerate(parts[1:], 1):
        keyword = part.startswith("port=")
        if keyword or "=" not in part:
            text = part[len("port="):] if keyword else part
            if not text.isascii() or not text.isdigit():
                return None
            vip = _vip_number(int(text))
            if vip is None:
                return None
            parts[i] = f"port={vip}" if keyword else str(vip)
            return ":".join(parts)
    return None


def vip_endpoint(where: str | IStreamServerEndpoint) -> str | IStreamServerEndpoint | None:
    """
    The VIP port's endpoint for the remoting port's C{where}: from its
    description (L{vip_description}), or for a TLS endpoint of
    L{rmqha.tls.server_endpoint} the same TLS on its port less 2; C{None}
    for any other endpoint.

    @raise ValueError: as L{vip_description}.
    """
    if isinstance(where, str):
        return vip_description(where)
    from rmqha.tls import server_endpoint_on_port, server_endpoint_port

    port = server_endpoint_port(where)
    vip = None if port is None else _vip_number(port)
    if vip is None:
        return None
    return server_endpoint_on_port(where, vip, "the VIP port of --listen")


class RemotingPort(Port):
    """
    The broker's remoting port (C{--listen}), or its VIP port (C{vip}:
    the remoting port's own handler, less L{NOT_ON_VIP}), a L{Port} child
    of its L{rmqha.broker.Broker}: listened on before the store is opened,
    behind the connection limiter of its name (C{"remoting"}, C{"vip"}),
    started after the role.
    """

    def __init__(
        self,
        broker: Broker,
        where: str | IStreamServerEndpoint,
        vip: RemotingPort | None = None,
    ) -> None:
        """
        @param vip: the remoting port this is the VIP port of, whose
            handler it shares (one state for both, as RocketMQ's two
            servers share their processors).
        """
        self.broker = broker
        self.where = where
        self._main = vip
        self._handler: IRemotingHandler | None = None
        self.setName("vip" if vip is not None else "remoting")  # type: ignore[no-untyped-call]

    def handler(self) -> IRemotingHandler:
        """
        The handler its connections are served with (built once).
        """
        if self._handler is None:
            self._handler = (
                _VIPHandler(self._main.handler()) if self._main is not None else broker_handler(self.broker)
            )
        return self._handler

    def listened_port(self) -> int | None:
        """The port listened on, once listening (a port given as 0's), else C{None}."""
        if self.port is None or self.port._waitingForPort is None:
            return None
        got: list[int] = []
        listened_address(self.port).addCallbacks(
            lambda address: got.append(getattr(address, "port", 0)), lambda _: None
        )
        return got[0] if got else None

    def stopService(self) -> Any:
        # Held pulls and the client scan end with the port (the VIP port
        # shares the main port's).
        handler = self._handler
        if isinstance(handler, BrokerDispatcher):
            handler.remoting.pulls.stop()
            handler.remoting.clients.stop()
        return super().stopService()

    def listen(self, limited: Any) -> None:
        if self.port is not None:
            return
        name = str(self.name)
        factory = RemotingFactory(self.handler(), self.broker.reactor)
        factory.noisy = False
        self.port = listen(self.broker.reactor, name, self.where, limited(name, factory))
