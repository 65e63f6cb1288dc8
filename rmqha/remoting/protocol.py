# -*- test-case-name: tests.test_remoting_protocol -*-
"""
RocketMQ's remoting protocol over Twisted: a L{RemotingProtocol} on the
codec of L{rmqha.remoting._frames}, and a L{RemotingClient} that keeps a
connection to one address.

Both ends of a remoting connection send requests (a broker asks its
clients too), so one protocol does both, as C{NettyRemotingAbstract}
does:

- a request goes to the L{IRemotingHandler} the protocol was built with;
  a code it does not take is answered REQUEST_CODE_NOT_SUPPORTED, even a
  oneway one; what it answers goes back with the request's opaque and
  serialize type and flag bit 0 set; a oneway request gets no answer, nor
  does a request the handler answers with C{None} (long polling);
- a response (flag bit 0) completes the pending request with its opaque;
  one that matches none is logged and dropped;
- while the transport cannot write our answers out as fast as the peer
  asks, the peer's requests are not read (the protocol is the
  transport's push producer of answers, L{_ReadPause});
- a malformed frame closes the connection with one log line naming the
  peer and what is wrong; a lost connection fails every pending request
  with L{ConnectionClosedError}.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, TypeAlias

import attrs
from twisted.application.internet import ClientService, backoffPolicy
from twisted.application.service import Service
from twisted.internet.defer import CancelledError, Deferred, fail, succeed
from twisted.internet.endpoints import clientFromString
from twisted.internet.interfaces import (
    IAddress,
    IPushProducer,
    IReactorTime,
    IStreamClientEndpoint,
)
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import Interface, implementer

from rmqha._sockets import send_now, set_tcp_no_delay
from rmqha.remoting._frames import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    MAX_FRAME_SIZE,
    MAX_HEADER_SIZE,
    FrameDecoder,
    RemotingCommand,
    RemotingError,
    encode,
    make_response,
    response_to,
)
from rmqha.remoting.codes import RequestCode, ResponseCode, SerializeType

__all__ = [
    "IRemotingHandler",
    "IConnectionObserver",
    "Answer",
    "Dispatcher",
    "NO_HANDLER",
    "RemotingRequestError",
    "ConnectionClosedError",
    "TooManyPendingError",
    "RequestTimeoutError",
    "RemotingProtocol",
    "RemotingFactory",
    "RemotingClient",
    "format_peer",
    "one_line",
]

#: What a handler answers: a response, nothing (no answer is sent), or a
#: Deferred of either.
Answer: TypeAlias = "RemotingCommand | None | Deferred[RemotingCommand | None]"

#: Requests of ours waiting for a response, per connection.
MAX_PENDING: Final = 1024
#: Requests of the peer being handled at once, per connection; more are
#: answered SYSTEM_BUSY, as a Java server with a full executor does.
MAX_IN_FLIGHT: Final = 256
_OPAQUE_LIMIT = 1 << 31


class IRemotingHandler(Interface):
    """
    What serves the requests arriving on remoting connections.
    """

    def handles(code: int) -> bool:
        """
        Whether requests with C{code} are served here (any other is
        answered REQUEST_CODE_NOT_SUPPORTED without calling L{handle}).
        """

    def handle(command: RemotingCommand, peer: IAddress | None) -> Answer:
        """
        Serve one request from C{peer}: the response, C{None} for no
        response, or a Deferred of either.  The protocol sets the
        response's opaque, flag bit 0 and serialize type; an exception or
        a failed Deferred is answered SYSTEM_ERROR.
        """


class IConnectionObserver(Interface):
    """
    A handler that also wants to know the connections it serves (a broker
    keeps its clients' connections to send them requests, and drops what
    a closed connection held).
    """

    def connection_made(protocol: RemotingProtocol) -> None:
        """C{protocol} is connected (its C{peer} is set)."""

    def connection_lost(protocol: RemotingProtocol) -> None:
        """C{protocol}'s connection ended."""


_Serve: TypeAlias = Callable[[RemotingCommand, "IAddress | None"], Answer]


@implementer(IRemotingHandler, IConnectionObserver)
class Dispatcher:
    """
    An L{IRemotingHandler} serving each code with its own function, and
    telling C{connections} (an L{IConnectionObserver}) of its connections.
    """

    def __init__(self, handlers: Mapping[int, _Serve], connections: Any = None) -> None:
        self._handlers = dict(handlers)
        self.connections = connections

    def connection_made(self, protocol: RemotingProtocol) -> None:
        if self.connections is not None:
            self.connections.connection_made(protocol)

    def connection_lost(self, protocol: RemotingProtocol) -> None:
        if self.connections is not None:
            self.connections.connection_lost(protocol)

    def handles(self, code: int) -> bool:
        return code in self._handlers

    def handle(self, command: RemotingCommand, peer: IAddress | None) -> Answer:
        return self._handlers[command.code](command, peer)


#: Serves nothing: every request is answered REQUEST_CODE_NOT_SUPPORTED.
NO_HANDLER: Final = Dispatcher({})


class RemotingRequestError(Exception):
    """
    A request of ours got no response.
    """


class ConnectionClosedError(RemotingRequestError):
    """
    The connection closed (or was never there) before the response came.
    """


class TooManyPendingError(RemotingRequestError):
    """
    Too many requests are already waiting on the connection.
    """


class RequestTimeoutError(RemotingRequestError):
    """
    The response did not come in time; a late one is dropped.
    """


def format_peer(peer: IAddress | None) -> str:
    """
    C{host:port} of an address, or what it says of itself.
    """
    host, port = getattr(peer, "host", None), getattr(peer, "port", None)
    if host is None or port is None:
        return str(peer)
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def _code_name(code: int) -> str:
    try:
        return f"{RequestCode(code).name} ({code})"
    except ValueError:
        return f"code {code}"


def _describe(failure: Failure) -> str:
    return f"{type(failure.value).__name__}: {failure.value}"


def one_line(text: str, limit: int = 500) -> str:
    """
    C{text} with its line breaks (any run of white space) made one
    space, cut at C{limit} characters.
    """
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "\u2026"


def add_deadline(
    d: "Deferred[RemotingCommand]", timeout: float, clock: IReactorTime, what: str
) -> "Deferred[RemotingCommand]":
    """
    Fail C{d} with L{RequestTimeoutError} (cancelling what it waits on)
    unless it fires within C{timeout} seconds on C{clock}.
    """

    def timed_out(result: Any, seconds: float) -> Any:
        if isinstance(result, Failure) and result.check(CancelledError):
            raise RequestTimeoutError(f"no response to {what} within {seconds:g} s")
        return result

    return d.addTimeout(timeout, clock, onTimeoutCancel=timed_out)


@implementer(IPushProducer)
class _ReadPause:
    """
    Registered with a connection's transport as its producer: when the
    transport cannot write out what we answered as fast as the peer asks,
    it pauses us, and we stop reading the peer's requests until it has
    caught up.  A peer that sends requests and never reads the answers
    then fills its own socket buffers, not our memory.
    """

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self.paused = False

    def pauseProducing(self) -> None:
        if not self.paused:
            self.paused = True
            self._transport.pauseProducing()

    def resumeProducing(self) -> None:
        if self.paused:
            self.paused = False
            self._transport.resumeProducing()

    def stopProducing(self) -> None:
        self.paused = False


@attrs.define
class _Pending:
    deferred: "Deferred[RemotingCommand]"
    code: int


class RemotingProtocol(Protocol):
    """
    One remoting connection, either side.
    """

    _log = Logger()

    def __init__(
        self,
        handler: IRemotingHandler,
        clock: IReactorTime,
        *,
        max_frame_size: int = MAX_FRAME_SIZE,
        max_header_size: int = MAX_HEADER_SIZE,
        max_pending: int = MAX_PENDING,
        max_in_flight: int = MAX_IN_FLIGHT,
        serialize_type: SerializeType = SerializeType.JSON,
    ) -> None:
        """
        @param clock: where responses are delivered from (the next turn,
            never inside C{dataReceived}) and request deadlines run.
        @param serialize_type: how requests of ours and our error answers
            are encoded (RocketMQ's default: JSON).
        """
        self.handler = handler
        self.clock = clock
        self.serialize_type = serialize_type
        self.max_pending = max_pending
        self.max_in_flight = max_in_flight
        self._decoder = FrameDecoder(max_frame_size, max_header_size)
        self._pending: dict[int, _Pending] = {}
        self._in_flight: set[Deferred[RemotingCommand | None]] = set()
        self._next_opaque = 0
        self._open = False
        self.peer: IAddress | None = None
        self.read_pause: _ReadPause | None = None
        # Inside dataReceived: what is written then goes out together on
        # the reactor's next turn; otherwise at once (L{_send}).
        self._receiving = False

    # -- Protocol --------------------------------------------------------------

    def connectionMade(self) -> None:
        self._open = True
        transport = self.transport
        self.peer = transport.getPeer() if transport is not None else None
        # (As RocketMQ's Netty server and client set on every channel.)
        set_tcp_no_delay(transport)
        if transport is not None and hasattr(transport, "registerProducer"):
            self.read_pause = _ReadPause(transport)
            transport.registerProducer(self.read_pause, True)
        if IConnectionObserver.providedBy(self.handler):
            self.handler.connection_made(self)

    def dataReceived(self, data: bytes) -> None:
        if not self._open:
            return
        self._receiving = True
        try:
            self._decoder.feed(data)
            while self._open and (command := self._decoder.next_command()) is not None:
                if command.is_response:
                    self._received_response(command)
                else:
                    self._received_request(command)
        except RemotingError as e:
            self._log.warn(
                "remoting peer {peer} sent a malformed frame: {error}; closing the connection",
                peer=format_peer(self.peer),
                error=e,
            )
            self._open = False
            if self.transport is not None:
                self.transport.loseConnection()
        finally:
            self._receiving = False

    def _send(self, data: bytes, alone: bool) -> None:
        """
        Write one encoded frame.  A frame that is C{alone} (no other
        request of the same direction under way on this connection) and
        not written from inside L{dataReceived} goes out at once
        (L{send_now}: the answer a slave's report released, a lone request
        of ours), saving the reactor turn a SYNC send's round trip would
        otherwise wait for.  Any other is written as Twisted writes, so
        that the frames of one turn (the answers to requests read
        together, pipelined requests, the answers one report releases)
        leave together on the next.
        """
        assert self.transport is not None
        if alone and not self._receiving:
            send_now(self.transport, [data])
        else:
            self.transport.write(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._open = False
        # (The closed transport has let go of its producer.)
        self.read_pause = None
        pending, self._pending = self._pending, {}
        for opaque, waiter in pending.items():
            waiter.deferred.errback(
                ConnectionClosedError(
                    f"connection to {format_peer(self.peer)} closed while "
                    f"{_code_name(waiter.code)} (opaque {opaque}) waited for its response"
                )
            )
        for handling in list(self._in_flight):
            handling.cancel()
        if IConnectionObserver.providedBy(self.handler):
            self.handler.connection_lost(self)
        # Responses that arrived before the end are still delivered, on
        # the next turn as always.

    @property
    def is_open(self) -> bool:
        """
        Between C{connectionMade} and the end of the connection (or a
        malformed frame, after which it is closing).
        """
        return self._open

    # -- requests of ours ------------------------------------------------------

    @property
    def pending(self) -> int:
        """
        How many requests of ours wait for a response.
        """
        return len(self._pending)

    def _opaque(self) -> int:
        while True:
            opaque = self._next_opaque
            self._next_opaque = (opaque + 1) % _OPAQUE_LIMIT
            if opaque not in self._pending:
                return opaque

    def request(
        self, command: RemotingCommand, timeout: float | None = None
    ) -> "Deferred[RemotingCommand]":
        """
        Send C{command} as a request (with an opaque of this connection's)
        and wait for its response.  Cancelling stops the waiting; a late
        response is then dropped.

        @param timeout: fail with L{RequestTimeoutError} after this many
            seconds on the protocol's clock.
        @return: fires with the response, whatever its code; fails with
            L{ConnectionClosedError}, L{TooManyPendingError} or
            L{RequestTimeoutError}.
        """
        if not self._open or self.transport is None:
            return fail(
                ConnectionClosedError(
                    f"no connection to {format_peer(self.peer)} for {_code_name(command.code)}"
                )
            )
        if len(self._pending) >= self.max_pending:
            return fail(
                TooManyPendingError(
                    f"{len(self._pending)} requests already wait for {format_peer(self.peer)}; "
                    f"{_code_name(command.code)} not sent"
                )
            )
        opaque = self._opaque()
        # (attrs.evolve, written out: it costs several times this.)
        outgoing = RemotingCommand(
            code=command.code,
            language=command.language,
            version=command.version,
            opaque=opaque,
            flag=command.flag & ~(FLAG_RESPONSE | FLAG_ONEWAY),
            remark=command.remark,
            ext_fields=command.ext_fields,
            body=command.body,
            serialize_type=command.serialize_type,
        )
        data = encode(outgoing, self.serialize_type)

        def withdraw(d: Deferred[RemotingCommand]) -> None:
            self._pending.pop(opaque, None)

        d: Deferred[RemotingCommand] = Deferred(canceller=withdraw)
        alone = not self._pending
        self._pending[opaque] = _Pending(d, command.code)
        self._send(data, alone)
        if timeout is not None:
            add_deadline(d, timeout, self.clock, f"{_code_name(command.code)} from {format_peer(self.peer)}")
        return d

    def send_oneway(self, command: RemotingCommand) -> None:
        """
        Send C{command} as a oneway request: flag bit 1, nothing awaited.

        @raise ConnectionClosedError: the connection is closed.
        """
        if not self._open or self.transport is None:
            raise ConnectionClosedError(
                f"no connection to {format_peer(self.peer)} for {_code_name(command.code)}"
            )
        outgoing = attrs.evolve(
            command, opaque=self._opaque(), flag=(command.flag | FLAG_ONEWAY) & ~FLAG_RESPONSE
        )
        self._send(encode(outgoing, self.serialize_type), not self._pending)

    def _received_response(self, response: RemotingCommand) -> None:
        waiter = self._pending.pop(response.opaque, None)
        if waiter is None:
            self._log.info(
                "remoting peer {peer} answered opaque {opaque} (code {code}), which no "
                "request waits for (timed out or never sent): dropped",
                peer=format_peer(self.peer),
                opaque=response.opaque,
                code=response.code,
            )
            return

        def deliver() -> None:
            # Cancelled (or timed out) since it arrived: too late.
            if not waiter.deferred.called:
                waiter.deferred.callback(response)

        # From the next turn, so that a callback cannot re-enter the protocol.
        self.clock.callLater(0, deliver)

    # -- requests of the peer --------------------------------------------------

    def _received_request(self, request: RemotingCommand) -> None:
        if not self.handler.handles(request.code):
            # Answered even when oneway, in the server's default type, as
            # NettyRemotingAbstract.processRequestCommand does.
            self._write(
                attrs.evolve(
                    make_response(
                        request,
                        ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                        f" request type {request.code} not supported",
                    ),
                    serialize_type=self.serialize_type,
                )
            )
            return
        if len(self._in_flight) >= self.max_in_flight:
            if not request.is_oneway:
                self._write(
                    make_response(
                        request,
                        ResponseCode.SYSTEM_BUSY,
                        "[OVERLOAD]system busy, start flow control for a while",
                    )
                )
            return
        # (maybeDeferred, written out: a send's answer is a Deferred, a
        # refusal a command, and this runs once a request.)
        answer: Answer | Failure
        try:
            answer = self.handler.handle(request, self.peer)
        except Exception:
            answer = Failure()
        code, opaque, flag, serialize_type = request.code, request.opaque, request.flag, request.serialize_type
        if not isinstance(answer, Deferred):
            self._answer(answer, code, opaque, flag, serialize_type)
            return
        if answer.called:
            answer.addBoth(self._answer, code, opaque, flag, serialize_type)
            return
        handling: Deferred[RemotingCommand | None] = answer
        self._in_flight.add(handling)
        # The answer needs the request's code, opaque, flag and serialize
        # type, not its body: a request waiting for its answer (a send
        # waiting for its replicas) holds no body.
        handling.addBoth(self._answer_later, handling, code, opaque, flag, serialize_type)

    def _answer_later(
        self,
        result: object,
        handling: "Deferred[RemotingCommand | None]",
        code: int,
        opaque: int,
        flag: int,
        serialize_type: SerializeType,
    ) -> None:
        self._in_flight.discard(handling)
        self._answer(result, code, opaque, flag, serialize_type, not self._in_flight)

    def _answer(
        self,
        result: object,
        code: int,
        opaque: int,
        flag: int,
        serialize_type: SerializeType,
        alone: bool = False,
    ) -> None:
        """
        Write the handler's answer C{result} to the request of C{code},
        C{opaque}, C{flag} and C{serialize_type} (L{IRemotingHandler.handle}).
        """
        if result is not None and not isinstance(result, (RemotingCommand, Failure)):
            result = Failure(
                TypeError(f"the handler answered {type(result).__name__}, not a RemotingCommand")
            )
        if isinstance(result, Failure):
            if result.check(CancelledError) and not self._open:
                return
            self._log.failure(
                "serving {code} from {peer} failed",
                result,
                code=_code_name(code),
                peer=format_peer(self.peer),
            )
            result = response_to(opaque, serialize_type, ResponseCode.SYSTEM_ERROR, _describe(result))
        if result is None or flag & FLAG_ONEWAY:
            return
        if (
            result.opaque != opaque
            or not result.flag & FLAG_RESPONSE
            or result.serialize_type is not serialize_type
        ):
            # (make_response's answers need none of it.)
            result = attrs.evolve(
                result,
                opaque=opaque,
                flag=result.flag | FLAG_RESPONSE,
                serialize_type=serialize_type,
            )
        self._write(result, alone)

    def _write(self, response: RemotingCommand, alone: bool = False) -> None:
        if not self._open or self.transport is None:
            return
        try:
            data = encode(response)
        except ValueError as e:
            self._log.error(
                "answer to {peer} (opaque {opaque}) cannot be encoded: {error}",
                peer=format_peer(self.peer),
                opaque=response.opaque,
                error=e,
            )
            data = encode(
                attrs.evolve(
                    response,
                    code=ResponseCode.SYSTEM_ERROR,
                    remark=f"answer cannot be encoded: {e}",
                    ext_fields=None,
                    body=b"",
                )
            )
        self._send(data, alone)


class RemotingFactory(Factory):
    """
    Builds L{RemotingProtocol}s sharing one handler, clock and limits.
    """

    def __init__(self, handler: IRemotingHandler, clock: IReactorTime, **options: Any) -> None:
        self.handler = handler
        self.clock = clock
        self.options = options

    def buildProtocol(self, addr: IAddress | None) -> RemotingProtocol:
        protocol = RemotingProtocol(self.handler, self.clock, **self.options)
        protocol.factory = self
        return protocol


class _ClientFactory(RemotingFactory):
    """
    A L{RemotingClient}'s factory: it counts the connections it built and
    keeps the newest (L{RemotingClient.connected}).
    """

    newest: RemotingProtocol | None = None
    built = 0

    def buildProtocol(self, addr: IAddress | None) -> RemotingProtocol:
        protocol = super().buildProtocol(addr)
        self.newest = protocol
        self.built += 1
        return protocol


class RemotingClient(Service):
    """
    A remoting connection to one address, kept open (reconnecting with
    back-off through L{ClientService}) while the service runs.
    """

    _log = Logger()

    def __init__(
        self,
        reactor: Any,
        endpoint: str | IStreamClientEndpoint,
        handler: IRemotingHandler = NO_HANDLER,
        *,
        clock: IReactorTime | None = None,
        retry_policy: Callable[[int], float] | None = None,
        name: str | None = None,
        **options: Any,
    ) -> None:
        """
        @param endpoint: a client endpoint description (C{tcp:host:port},
            C{tls:host:port:...}) or an endpoint, e.g.
            L{rmqha.tls.client_endpoint}'s.
        @param handler: serves the requests the peer sends us.
        @param name: the address as errors name it (C{host:port}; by
            default the endpoint's description).
        @param clock: request deadlines and reconnection delays (default:
            C{reactor}).
        @param options: L{RemotingProtocol} limits.
        """
        self.clock: IReactorTime = clock if clock is not None else reactor
        self.endpoint = (
            clientFromString(reactor, endpoint) if isinstance(endpoint, str) else endpoint
        )
        self.name = name or (endpoint if isinstance(endpoint, str) else str(endpoint))
        self.factory = _ClientFactory(handler, self.clock, **options)
        self._service = ClientService(
            self.endpoint,
            self.factory,
            retryPolicy=retry_policy or backoffPolicy(initialDelay=1.0, maxDelay=30.0),
            clock=self.clock,
        )

    @property
    def connections(self) -> int:
        """How many connections were made (the newest is the current one)."""
        return self.factory.built

    @property
    def connected(self) -> bool:
        """Whether the newest connection is open."""
        newest = self.factory.newest
        return newest is not None and newest.is_open

    def startService(self) -> None:
        Service.startService(self)
        self._service.startService()

    def stopService(self) -> "Deferred[None]":
        Service.stopService(self)
        return self._service.stopService()

    def _through_connection(
        self, what: str, send: Callable[[RemotingProtocol], "Deferred[Any] | None"]
    ) -> "Deferred[Any]":
        """
        C{send(protocol)} over the connection, once there is one; fails
        with L{ConnectionClosedError} naming the address if the next
        attempt to connect fails (or the client stops first).

        Every failure is delivered from a clock turn of its own
        (L{_after_unwinding}), never from inside L{ClientService}, which
        finds a connection refused (or a request sent at once failed)
        inside its state machine and refuses to be re-entered: a caller
        may stop the client or send its next request from its errback.
        Cancelling (a deadline, say) fails it with L{CancelledError} --
        unless its failure was already known, which is then what it
        fails with.
        """
        cancelled = False

        def connected(protocol: RemotingProtocol) -> "Deferred[Any] | None":
            return send(protocol)

        def not_connected(failure: Failure) -> Failure:
            if failure.check(CancelledError):
                if cancelled:
                    return failure
                # (ClientService cancels its waiters when it stops.)
                return Failure(
                    ConnectionClosedError(f"the client of {self.name} stopped before {what} was sent")
                )
            return Failure(
                ConnectionClosedError(
                    f"cannot connect to {self.name} for {what}: {one_line(_describe(failure))}"
                )
            )

        def unwound(failure: Failure) -> "Failure | Deferred[Any]":
            if cancelled and failure.check(CancelledError):
                return failure
            return self._after_unwinding(failure)

        if self.running:
            newest = self.factory.newest
            if newest is not None and newest.is_open:
                # The open connection whenConnected would give at once,
                # without a pass through ClientService's state machine.
                waiting: Deferred[Any] = succeed(newest)
            else:
                waiting = self._service.whenConnected(failAfterFailures=1)
            waiting.addCallbacks(connected, not_connected)
        else:
            waiting = fail(ConnectionClosedError(f"the client of {self.name} is stopped; {what} not sent"))
        waiting.addErrback(unwound)

        def cancel(_: object) -> None:
            nonlocal cancelled
            cancelled = True
            waiting.cancel()

        result: Deferred[Any] = Deferred(canceller=cancel)
        waiting.chainDeferred(result)
        return result

    def _after_unwinding(self, failure: Failure) -> "Deferred[Any]":
        """
        A L{Deferred} failing with C{failure} on the clock's next turn,
        after the call stack that found it has unwound.  Cancelling it
        fails it at once with C{failure}: a deadline falling due in the
        turn the failure waits for (a L{Clock} advanced past both runs
        them in that order) finds the failure known first, and it is what
        the request fails with.
        """

        def known_first(d: Deferred[Any]) -> None:
            call.cancel()
            d.errback(failure)

        later: Deferred[Any] = Deferred(canceller=known_first)
        call = self.clock.callLater(0, later.errback, failure)
        return later

    def request(self, command: RemotingCommand, timeout: float) -> "Deferred[RemotingCommand]":
        """
        Send a request and wait for its response, connecting first if
        need be; the connection attempt counts against C{timeout} too.

        @return: fires with the response; fails with
            L{RequestTimeoutError}, L{ConnectionClosedError} (no
            connection, naming the address; or it closed before the
            response) or L{TooManyPendingError}, always from a clock turn
            of its own (L{_through_connection}), and with whichever of a
            refused connection and the deadline came first.
        """
        what = _code_name(command.code)
        d: Deferred[RemotingCommand] = self._through_connection(
            what, lambda protocol: protocol.request(command)
        )
        return add_deadline(d, timeout, self.clock, f"{what} from {self.name}")

    def oneway(self, command: RemotingCommand) -> "Deferred[None]":
        """
        Send a oneway request, connecting first if need be.

        @return: fires once it is written; fails with
            L{ConnectionClosedError} if no connection could be made, from
            a clock turn of its own.
        """

        def send(protocol: RemotingProtocol) -> None:
            protocol.send_oneway(command)

        return self._through_connection(_code_name(command.code), send)
