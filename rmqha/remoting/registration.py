# -*- test-case-name: tests.test_registration -*-
"""
A broker's registration with its NameServers, as RocketMQ 4.9.8's
C{BrokerController.registerBrokerAll} and C{BrokerOuterAPI}: REGISTER_BROKER
with the topic table (C{TopicConfigSerializeWrapper}, its DataVersion
included) to every NameServer at start and every 30 s, each request with
its own deadline, one NameServer down never holding up the others;
UNREGISTER_BROKER to each on a clean stop; at once again when the role
changes (L{NameServerRegistration.role_changed}), and when a master's
topic table changes (L{NameServerRegistration.topics_changed}: one round
for a burst of changes in one reactor turn).

The first NameServer to answer gives the master's addresses: its
C{masterAddr} (what a slave syncs its metadata from) and its
C{haServerAddr}, which a slave started without C{--master} follows
(C{updateMasterHAServerAddrPeriodically}): L{NameServerRegistration}
calls C{on_master_ha} each time it changes.

Each NameServer is reached over one long-lived connection
(L{RemotingClient}, reconnecting): a NameServer drops a broker whose
registering connection closes.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from typing import Any, Final

import attrs
from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime, IStreamClientEndpoint
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from rmqha.remoting._frames import (
    CustomHeaderError,
    RemotingCommand,
    header_from_ext_fields,
    header_to_ext_fields,
)
from rmqha.remoting.codes import RequestCode, ResponseCode
from rmqha.remoting.metadata import TopicTable
from rmqha.remoting.namesrv import (
    RegisterBodyError,
    RegisterBrokerBody,
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    RegisterBrokerResult,
    UnregisterBrokerRequestHeader,
    body_crc32,
    decode_kv_table,
    encode_register_body,
)
from rmqha.remoting.protocol import RemotingClient

__all__ = [
    "BrokerIdentity",
    "NameServerRegistration",
    "NameServerStatus",
    "REGISTER_INTERVAL",
    "REGISTER_TIMEOUT",
    "UNREGISTER_TIMEOUT",
    "default_broker_name",
    "for_broker",
    "local_address",
    "port_of",
    "start_for_broker",
]

#: C{registerNameServerPeriod}: seconds between registrations.
REGISTER_INTERVAL: Final = 30.0
#: A slave that follows the NameServers' master but was named none yet
#: registers again after this many seconds, doubling up to the interval:
#: started before its master, it finds it within seconds, not 30.
SEEK_MASTER_FIRST: Final = 1.0
#: C{registerBrokerTimeoutMills}: each REGISTER_BROKER's deadline.
REGISTER_TIMEOUT: Final = 6.0
#: C{BrokerOuterAPI.unregisterBroker}'s deadline.
UNREGISTER_TIMEOUT: Final = 3.0


def default_broker_name() -> str:
    """C{BrokerConfig.brokerName}'s default: the local host name."""
    return socket.gethostname() or "DEFAULT_BROKER"


def local_address() -> str:
    """
    C{brokerIP1}'s default, roughly C{RemotingUtil.getLocalAddress}: the
    address the host name resolves to, else 127.0.0.1.
    """
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


@attrs.frozen
class BrokerIdentity:
    """
    Who registers: C{brokerClusterName}, C{brokerName}, C{brokerId} (0: the
    master), C{brokerAddr} (brokerIP1:listenPort) and C{haServerAddr}
    (brokerIP2:haListenPort).
    """

    cluster_name: str
    broker_name: str
    broker_id: int
    broker_addr: str
    ha_server_addr: str


def _describe(failure: Failure) -> str:
    return f"{type(failure.value).__name__}: {failure.value}"


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


@attrs.frozen
class NameServerStatus:
    """
    What /status and /metrics show of the registration with one
    NameServer.

    @ivar namesrv: the NameServer (C{host:port} as given).
    @ivar registered: the last REGISTER_BROKER to it succeeded and the
        connection it went over is still open (a NameServer forgets a
        broker whose connection closes), while registering runs.
    @ivar last_success: when it last answered SUCCESS (clock seconds), or
        C{None}.
    @ivar last_error: why the last failed request failed, one line, and
        C{last_error_at} when (kept after a later success).
    @ivar broker_id: the brokerId of the last successful registration.
    @ivar master_addr: the C{masterAddr} its last answer gave (C{None}: a
        master, or no live master known to it).
    @ivar ha_server_addr: the C{haServerAddr} of the same answer.
    @ivar registrations: REGISTER_BROKER answered SUCCESS;
        C{failures}: those that failed (no connection, no answer within
        the deadline, an error answer).
    """

    namesrv: str
    registered: bool
    last_success: float | None
    last_error: str | None
    last_error_at: float | None
    broker_id: int | None
    master_addr: str | None
    ha_server_addr: str | None
    registrations: int
    failures: int

    def age(self, now: float) -> float | None:
        """Seconds since the last successful registration, or C{None}."""
        return None if self.last_success is None else max(0.0, now - self.last_success)

    def as_json(self, now: float) -> dict[str, Any]:
        age = self.age(now)
        return {
            "namesrv": self.namesrv,
            "registered": self.registered,
            "broker_id": self.broker_id,
            "last_success": self.last_success,
            "last_success_age_seconds": None if age is None else round(age, 3),
            "master_addr": self.master_addr,
            "ha_server_addr": self.ha_server_addr,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
            "registrations": self.registrations,
            "failures": self.failures,
        }


@attrs.define
class _State:
    """One NameServer's registration, as it goes (L{NameServerStatus})."""

    ok: bool = False
    #: The client's connection count when it last answered SUCCESS.
    connection: int = 0
    last_success: float | None = None
    last_error: str | None = None
    last_error_at: float | None = None
    broker_id: int | None = None
    master_addr: str | None = None
    ha_server_addr: str | None = None
    registrations: int = 0
    failures: int = 0


class NameServerRegistration(Service):
    """
    Registers a broker with every NameServer while it runs.

    @ivar identity: who registers (its C{broker_id} changes with the role).
    @ivar master_addr: the master's remoting address from the newest
        answer (C{None} for a master, or while the NameServer knows none).
    @ivar master_ha_addr: the newest master HA address a NameServer gave.
    @ivar last_result: the newest answer taken, or C{None}.
    @ivar registrations: how many rounds got at least one answer.
    @ivar topic_rounds: rounds run at once for a topic table change
        (L{topics_changed}).
    """

    _log = Logger()

    def __init__(
        self,
        reactor: Any,
        namesrv: Sequence[str | IStreamClientEndpoint],
        identity: BrokerIdentity,
        topics: Callable[[], TopicTable],
        *,
        clock: IReactorTime | None = None,
        interval: float = REGISTER_INTERVAL,
        timeout: float = REGISTER_TIMEOUT,
        compressed: bool = False,
        on_master_ha: Callable[[str], object] | None = None,
        on_master_addr: Callable[[str | None], object] | None = None,
        retry_policy: Callable[[int], float] | None = None,
    ) -> None:
        """
        @param namesrv: each NameServer: C{host:port} or a client endpoint.
        @param topics: the topic table to register, read at each round
            (the broker's C{metadata.table(MetadataFile.TOPICS)}).
        @param compressed: send the body compressed (C{compressedRegister}).
        @param on_master_ha: called with the master's C{haServerAddr} each
            time a NameServer's answer gives a new one.
        @param on_master_addr: called with the C{masterAddr} of every answer
            taken (C{None} included), as C{SlaveSynchronize.setMasterAddr}.
        """
        from rmqha.settings import master_description, parse_host_port

        if not namesrv:
            raise ValueError("no NameServer to register with")
        self.clock: IReactorTime = clock if clock is not None else reactor
        self.identity = identity
        self.topics = topics
        self.interval = interval
        self.timeout = timeout
        self.compressed = compressed
        self.on_master_ha = on_master_ha
        self.on_master_addr = on_master_addr
        self.master_addr: str | None = None
        self.master_ha_addr: str | None = None
        self.last_result: RegisterBrokerResult | None = None
        self.registrations = 0
        self.topic_rounds = 0
        self.clients: list[RemotingClient] = []
        for address in namesrv:
            endpoint = (
                master_description(*parse_host_port(address, "NameServer address"))
                if isinstance(address, str)
                else address
            )
            client = RemotingClient(reactor, endpoint, clock=self.clock, retry_policy=retry_policy)
            if isinstance(address, str):
                client.name = address
            self.clients.append(client)
        self._loop: LoopingCall | None = None
        #: The next early round of a slave seeking its master, and its delay.
        self._seek: IDelayedCall | None = None
        self._seek_delay = SEEK_MASTER_FIRST
        #: Each client's registration as it goes.
        self._states: dict[RemotingClient, _State] = {c: _State() for c in self.clients}
        #: The round a topic change asked for, on the next turn.
        self._kick: IDelayedCall | None = None

    # -- the service ---------------------------------------------------------

    def startService(self) -> None:
        Service.startService(self)
        for client in self.clients:
            client.startService()
        loop = LoopingCall(self._round)
        loop.clock = self.clock
        self._loop = loop
        loop.start(self.interval, now=True)

    def _round(self) -> None:
        # (Failures are logged per NameServer; the loop never stops.)
        self.register()

    def stopService(self) -> Deferred[None]:
        """
        Stop registering, unregister from every NameServer (each within
        L{UNREGISTER_TIMEOUT}), then close the connections.
        """
        Service.stopService(self)
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        for pending in (self._seek, self._kick):
            if pending is not None and pending.active():
                pending.cancel()
        self._seek = self._kick = None
        d: Deferred[Any] = self.unregister()

        def close(_: object) -> Deferred[Any]:
            return DeferredList([c.stopService() for c in self.clients], consumeErrors=True)

        return d.addBoth(close).addCallback(lambda _: None)

    # -- registering -------------------------------------------------------------

    def role_changed(self, broker_id: int) -> Deferred[list[RegisterBrokerResult]]:
        """
        The broker's role changed: register at once as C{broker_id} (0 for
        a master), not after the next period.
        """
        self.identity = attrs.evolve(self.identity, broker_id=broker_id)
        if not self.running:
            return succeed([])
        return self.register()

    def topics_changed(self) -> None:
        """
        The topic table changed (a master's: C{UPDATE_AND_CREATE_TOPIC},
        any topic update): register with every NameServer at once, as
        4.9.8 does after creating or updating a topic, with the new
        DataVersion, so that clients find the topic without waiting for
        the period.  The round runs on the next reactor turn: a burst of
        changes in one turn is one round.
        """
        if not self.running or (self._kick is not None and self._kick.active()):
            return

        def kick() -> None:
            self._kick = None
            if self.running:
                self.topic_rounds += 1
                self.register()

        self._kick = self.clock.callLater(0, kick)

    def status(self) -> tuple[NameServerStatus, ...]:
        """
        Each NameServer's registration, in the order they were given.
        """
        shown = []
        for client in self.clients:
            st = self._states.setdefault(client, _State())
            shown.append(
                NameServerStatus(
                    namesrv=str(client.name),
                    registered=bool(self.running)
                    and st.ok
                    and client.connections == st.connection
                    and client.connected,
                    last_success=st.last_success,
                    last_error=st.last_error,
                    last_error_at=st.last_error_at,
                    broker_id=st.broker_id,
                    master_addr=st.master_addr,
                    ha_server_addr=st.ha_server_addr,
                    registrations=st.registrations,
                    failures=st.failures,
                )
            )
        return tuple(shown)

    def _register_command(self) -> RemotingCommand:
        i = self.identity
        body = encode_register_body(RegisterBrokerBody(self.topics()), compressed=self.compressed)
        header = RegisterBrokerRequestHeader(
            broker_name=i.broker_name,
            broker_addr=i.broker_addr,
            cluster_name=i.cluster_name,
            ha_server_addr=i.ha_server_addr,
            broker_id=i.broker_id,
            compressed=self.compressed,
            body_crc32=body_crc32(body),
        )
        return RemotingCommand(
            RequestCode.REGISTER_BROKER, ext_fields=header_to_ext_fields(header), body=body
        )

    def register(self) -> Deferred[list[RegisterBrokerResult]]:
        """
        One round: REGISTER_BROKER to every NameServer at once, each within
        C{timeout}; a failure is logged and does not affect the others.
        The first answer (in the order they arrive) gives the master's
        addresses.

        @return: fires with the answers, in the order they arrived.
        """
        command = self._register_command()
        broker_id = self.identity.broker_id
        results: list[RegisterBrokerResult] = []

        def answered(response: RemotingCommand, client: RemotingClient) -> None:
            if response.code != ResponseCode.SUCCESS:
                raise RuntimeError(f"answered code {response.code}: {response.remark}")
            try:
                header = header_from_ext_fields(RegisterBrokerResponseHeader, response.ext_fields)
                kv = decode_kv_table(response.body)
            except (CustomHeaderError, RegisterBodyError) as e:
                raise RuntimeError(f"answered something unreadable: {e}") from None
            results.append(RegisterBrokerResult(header.ha_server_addr, header.master_addr, kv))
            st = self._states.setdefault(client, _State())
            st.ok = True
            st.connection = client.connections
            st.last_success = self.clock.seconds()
            st.broker_id = broker_id
            st.master_addr = header.master_addr
            st.ha_server_addr = header.ha_server_addr
            st.registrations += 1

        def failed(failure: Failure, client: RemotingClient) -> None:
            st = self._states.setdefault(client, _State())
            st.ok = False
            st.last_error = _one_line(_describe(failure))
            st.last_error_at = self.clock.seconds()
            st.failures += 1
            self._log.warn(
                "registering broker {name} (id {id}) with NameServer {ns} failed: {why}",
                name=self.identity.broker_name,
                id=self.identity.broker_id,
                ns=client.name,
                why=_describe(failure),
            )

        waits = [
            client.request(command, self.timeout)
            .addCallback(answered, client)
            .addErrback(failed, client)
            for client in self.clients
        ]

        def done(_: object) -> list[RegisterBrokerResult]:
            if results:
                self.registrations += 1
                self._take(results[0])
            self._seek_master()
            return results

        return DeferredList(waits, consumeErrors=True).addCallback(done)

    def _seek_master(self) -> None:
        """
        A slave following the NameServers' master (C{on_master_ha}) that
        was named none yet registers again soon: after
        L{SEEK_MASTER_FIRST} s, doubling up to the interval.
        """
        if (
            self.on_master_ha is None
            or self.master_ha_addr is not None
            or not self.running
            or (self._seek is not None and self._seek.active())
        ):
            return
        delay, self._seek_delay = self._seek_delay, min(self._seek_delay * 2, self.interval)
        if delay >= self.interval:
            return  # (the periodic round is as soon)

        def again() -> None:
            self._seek = None
            if self.running and self.master_ha_addr is None:
                self.register()

        self._seek = self.clock.callLater(delay, again)

    def _take(self, result: RegisterBrokerResult) -> None:
        # As BrokerController.doRegisterBrokerAll: the HA address only when
        # one is given; the master's address always (null for a master).
        self.last_result = result
        self.master_addr = result.master_addr
        if self.on_master_addr is not None:
            try:
                self.on_master_addr(result.master_addr)
            except Exception:
                self._log.failure(
                    "taking the master's address {addr} failed", addr=result.master_addr
                )
        ha = result.ha_server_addr
        if ha is not None and ha != self.master_ha_addr:
            self._log.info(
                "the NameServer names {ha} as the master's HA address (was {old})",
                ha=ha,
                old=self.master_ha_addr,
            )
            self.master_ha_addr = ha
            if self.on_master_ha is not None:
                try:
                    self.on_master_ha(ha)
                except Exception:
                    self._log.failure("following the master at {ha} failed", ha=ha)

    def unregister(self) -> Deferred[list[Any]]:
        """
        UNREGISTER_BROKER to every NameServer, each within
        L{UNREGISTER_TIMEOUT}; failures are logged.
        """
        i = self.identity
        header = UnregisterBrokerRequestHeader(i.broker_name, i.broker_addr, i.cluster_name, i.broker_id)
        command = RemotingCommand(
            RequestCode.UNREGISTER_BROKER, ext_fields=header_to_ext_fields(header)
        )

        def failed(failure: Failure, client: RemotingClient) -> None:
            self._log.warn(
                "unregistering broker {name} from NameServer {ns} failed: {why}",
                name=i.broker_name,
                ns=client.name,
                why=_describe(failure),
            )

        def checked(response: RemotingCommand) -> None:
            if response.code != ResponseCode.SUCCESS:
                raise RuntimeError(f"answered code {response.code}: {response.remark}")

        waits: list[Deferred[Any]] = []
        for client in self.clients:
            # (Registered no more, whatever the answer.)
            self._states.setdefault(client, _State()).ok = False
            # (The client may be stopped already: nothing is sent then.)
            if not client.running:
                continue
            waits.append(
                client.request(command, UNREGISTER_TIMEOUT)
                .addCallback(checked)
                .addErrback(failed, client)
            )
        return DeferredList(waits, consumeErrors=True)



def port_of(description: object, default: int) -> int:
    """
    The port of a server endpoint description (C{tcp:10911},
    C{ssl:10912:privateKey=...}, C{tcp:port=10911}), else C{default}
    (an endpoint object, or none given).
    """
    if not isinstance(description, str):
        return default
    for part in description.split(":")[1:]:
        value = part[len("port="):] if part.startswith("port=") else part
        if value.isdigit():
            return int(value)
    return default



def for_broker(broker: Any, reactor: Any) -> NameServerRegistration:
    """
    The registration of a L{rmqha.broker.Broker} with its C{--namesrv}:
    C{brokerAddr} is C{brokerIP1:} the C{--listen} port (10911 without
    one), C{haServerAddr} C{brokerIP2:} the C{--ha-listen} port (a
    failover node's C{--advertise}); a fixed master registers as 0, a
    slave or failover node with C{--broker-id} (the role changes it:
    L{rmqha.broker.Broker}); the topic table is the broker's
    C{metadata}'s.  A slave without C{--master} follows the master's HA
    address the answers give (C{Broker.follow_namesrv_master}); the
    answers' C{masterAddr} goes to the broker's metadata sync
    (C{Broker.namesrv_master_addr}) unless C{--master-remoting} names it.
    """
    from rmqha.remoting.metadata import DataVersion, MetadataFile

    s = broker.settings
    assert s.namesrv is not None
    ip1 = s.broker_ip1 or local_address()
    ip2 = s.broker_ip2 or ip1
    if s.failover and s.advertise:
        ha_server_addr = s.advertise
    else:
        ha_server_addr = f"{ip2}:{port_of(s.ha_listen, 10912)}"
    identity = BrokerIdentity(
        cluster_name=s.cluster,
        broker_name=s.group or default_broker_name(),
        broker_id=0 if s.role.is_master and not s.failover else s.broker_id,
        broker_addr=f"{ip1}:{port_of(s.listen, 10911)}",
        ha_server_addr=ha_server_addr,
    )

    def topics() -> TopicTable:
        try:
            table: TopicTable = broker.metadata.table(MetadataFile.TOPICS)
        except RuntimeError:
            # (Not running: its metadata is not loaded.)
            return TopicTable(DataVersion(timestamp=0), {})
        return table

    follows = not s.failover and not s.role.is_master and s.master_address is None
    return NameServerRegistration(
        reactor,
        s.namesrv,
        identity,
        topics,
        on_master_ha=broker.follow_namesrv_master if follows else None,
        on_master_addr=broker.namesrv_master_addr if s.master_remoting is None else None,
    )


def store_host_for(settings: Any, listened_port: int | None = None) -> tuple[str, int]:
    """
    The STOREHOST a broker writes (and every msgId carries): C{--store-host}
    if given; else, with C{--listen}, C{brokerIP1:} the remoting port
    (C{listened_port} when it was given as 0), as RocketMQ's
    C{AbstractSendMessageProcessor.storeHost}; else 127.0.0.1:10911.
    """
    if settings.store_host is not None:
        host: tuple[str, int] = settings.store_host
        return host
    if settings.listen is None:
        return ("127.0.0.1", 10911)
    ip1 = settings.broker_ip1 or local_address()
    try:
        ipaddress.ip_address(ip1)
    except ValueError:
        try:
            ip1 = socket.gethostbyname(ip1)
        except OSError:
            pass  # (the store refuses it, naming it)
    return (ip1, listened_port or port_of(settings.listen, 10911))


def _with_port(address: str, port: int) -> str:
    host, _, _ = address.rpartition(":")
    return f"{host}:{port}"


def start_for_broker(broker: Any) -> None:
    """
    Start a running broker's registration.  A port given as 0 (the
    remoting port's, a master's HA port's) is registered as the port it
    got, once it listens.
    """
    from rmqha._ports import listened_address

    registration: NameServerRegistration | None = broker.registration
    if registration is None:
        return
    waits: list[Deferred[Any]] = []
    identity = registration.identity
    remoting = broker.namedServices.get("remoting")
    remoting_port = getattr(remoting, "port", None)
    if identity.broker_addr.endswith(":0") and remoting_port is not None:

        def remoting_listened(address: Any) -> None:
            registration.identity = attrs.evolve(
                registration.identity,
                broker_addr=_with_port(registration.identity.broker_addr, address.port),
            )

        waits.append(listened_address(remoting_port).addCallback(remoting_listened))
    if identity.ha_server_addr.endswith(":0") and broker.role.is_master and broker.ha_service is not None:

        def ha_listened(address: Any) -> None:
            registration.identity = attrs.evolve(
                registration.identity,
                ha_server_addr=_with_port(registration.identity.ha_server_addr, address.port),
            )

        waits.append(broker.ha_address().addCallback(ha_listened))
    if not waits:
        registration.startService()
        return

    def start(_: object) -> None:
        if broker.running:
            registration.startService()

    DeferredList(waits, consumeErrors=True).addBoth(start)
