"""
Tests for L{rmqha.remoting.protocol}: requests and responses matched by
opaque, oneway, unknown codes, malformed frames, deadlines, lost
connections, and the reconnecting client.
"""

from __future__ import annotations

from typing import Any

import attrs
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IAddress
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from rmqha.remoting._frames import FrameDecoder, RemotingCommand, encode, make_response
from rmqha.remoting.codes import RequestCode, ResponseCode, SerializeType
from rmqha.remoting.protocol import (
    NO_HANDLER,
    ConnectionClosedError,
    Dispatcher,
    RemotingClient,
    RemotingFactory,
    RemotingProtocol,
    RequestTimeoutError,
    TooManyPendingError,
)
from rmqha.testing import StringEndpoint, connect_in_memory

from tests._helpers import LoggedEvents

_PEER = "192.0.2.7:40000"


def _written(transport: StringTransport) -> list[RemotingCommand]:
    decoder = FrameDecoder()
    decoder.feed(transport.value())
    out = []
    while (command := decoder.next_command()) is not None:
        out.append(command)
    transport.clear()
    return out


class _Case(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.log = LoggedEvents(self)
        self.served: list[RemotingCommand] = []
        self.handling: list[Deferred[RemotingCommand | None]] = []

        def max_offset(command: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
            self.served.append(command)
            return make_response(command, ResponseCode.SUCCESS, ext_fields={"offset": "42"})

        def slow(command: RemotingCommand, peer: IAddress | None) -> Deferred[RemotingCommand | None]:
            self.served.append(command)
            d: Deferred[RemotingCommand | None] = Deferred()
            self.handling.append(d)
            return d

        def broken(command: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
            raise KeyError("no such topic")

        def silent(command: RemotingCommand, peer: IAddress | None) -> None:
            self.served.append(command)
            return None

        self.handler = Dispatcher(
            {
                RequestCode.GET_MAX_OFFSET: max_offset,
                RequestCode.PULL_MESSAGE: slow,
                RequestCode.GET_ALL_TOPIC_CONFIG: broken,
                RequestCode.UPDATE_CONSUMER_OFFSET: silent,
            }
        )
        self.protocol = self.connect()

    def connect(self, **options: Any) -> RemotingProtocol:
        protocol = RemotingProtocol(self.handler, self.clock, **options)
        self.transport = StringTransport(peerAddress=_peer())
        protocol.makeConnection(self.transport)
        return protocol

    def tearDown(self) -> None:
        self.assertEqual(self.clock.getDelayedCalls(), [])


def _peer() -> IAddress:
    from twisted.internet.address import IPv4Address

    return IPv4Address("TCP", "192.0.2.7", 40000)


def _request(code: int = RequestCode.GET_MAX_OFFSET, opaque: int = 5, **kw: Any) -> RemotingCommand:
    return RemotingCommand(code=code, opaque=opaque, ext_fields={"topic": "T", "queueId": "0"}, **kw)


class ServingTests(_Case):
    """
    Requests from the peer.
    """

    def test_answered_with_opaque(self) -> None:
        """
        A request is served by its code's handler; the answer carries the
        request's opaque and flag bit 0.
        """
        self.protocol.dataReceived(encode(_request(opaque=77)))
        (answer,) = _written(self.transport)
        self.assertEqual(answer.code, ResponseCode.SUCCESS)
        self.assertEqual((answer.opaque, answer.flag), (77, 1))
        self.assertEqual(answer.ext_fields, {"offset": "42"})
        self.assertEqual(self.served[0].opaque, 77)

    def test_answer_in_request_serialize_type(self) -> None:
        """
        A binary request is answered in binary, whatever the handler set.
        """
        self.protocol.dataReceived(encode(_request(), SerializeType.ROCKETMQ))
        self.assertEqual(self.transport.value()[4], 1)
        (answer,) = _written(self.transport)
        self.assertEqual(answer.serialize_type, SerializeType.ROCKETMQ)

    def test_unknown_code(self) -> None:
        """
        A code no handler takes is answered REQUEST_CODE_NOT_SUPPORTED
        with RocketMQ's remark, even a oneway request.
        """
        self.protocol.dataReceived(encode(_request(code=999, opaque=3)))
        self.protocol.dataReceived(encode(_request(code=998, opaque=4, flag=2)))
        first, second = _written(self.transport)
        self.assertEqual(first.code, ResponseCode.REQUEST_CODE_NOT_SUPPORTED)
        self.assertEqual(first.remark, " request type 999 not supported")
        self.assertEqual((first.opaque, first.flag), (3, 1))
        self.assertEqual((second.opaque, second.remark), (4, " request type 998 not supported"))

    def test_oneway_not_answered(self) -> None:
        """
        A oneway request is served and gets no answer.
        """
        self.protocol.dataReceived(encode(_request(flag=2)))
        self.assertEqual(len(self.served), 1)
        self.assertEqual(self.transport.value(), b"")

    def test_none_not_answered(self) -> None:
        """
        A handler answering None sends nothing (long polling).
        """
        self.protocol.dataReceived(encode(_request(code=RequestCode.UPDATE_CONSUMER_OFFSET)))
        self.assertEqual(len(self.served), 1)
        self.assertEqual(self.transport.value(), b"")

    def test_handler_error(self) -> None:
        """
        A handler's exception is answered SYSTEM_ERROR naming it, and
        logged.
        """
        self.protocol.dataReceived(encode(_request(code=RequestCode.GET_ALL_TOPIC_CONFIG)))
        (answer,) = _written(self.transport)
        self.assertEqual(answer.code, ResponseCode.SYSTEM_ERROR)
        self.assertEqual(answer.remark, "KeyError: 'no such topic'")
        self.assertEqual(len(self.flushLoggedErrors(KeyError)), 1)

    def test_handler_answers_garbage(self) -> None:
        """
        A handler answering something that is not a command is a
        SYSTEM_ERROR too, not an exception out of dataReceived.
        """
        self.protocol = self.connect()
        self.protocol.dataReceived(encode(_request(code=RequestCode.PULL_MESSAGE)))
        self.handling[0].callback("not a command")  # type: ignore[arg-type]
        (answer,) = _written(self.transport)
        self.assertEqual(answer.code, ResponseCode.SYSTEM_ERROR)
        self.assertEqual(answer.remark, "TypeError: the handler answered str, not a RemotingCommand")
        self.assertEqual(len(self.flushLoggedErrors(TypeError)), 1)

    def test_deferred_answer(self) -> None:
        """
        A Deferred answer goes out when it fires; a failed one is
        SYSTEM_ERROR.
        """
        self.protocol.dataReceived(encode(_request(code=RequestCode.PULL_MESSAGE, opaque=1)))
        self.protocol.dataReceived(encode(_request(code=RequestCode.PULL_MESSAGE, opaque=2)))
        self.assertEqual(self.transport.value(), b"")
        self.handling[1].callback(make_response(self.served[1], ResponseCode.PULL_NOT_FOUND))
        self.handling[0].errback(ValueError("store closed"))
        late, failed = _written(self.transport)
        self.assertEqual((late.opaque, late.code), (2, ResponseCode.PULL_NOT_FOUND))
        self.assertEqual((failed.opaque, failed.code), (1, ResponseCode.SYSTEM_ERROR))
        self.flushLoggedErrors(ValueError)

    def test_in_flight_bounded(self) -> None:
        """
        Beyond C{max_in_flight} requests being served, the next is
        answered SYSTEM_BUSY at once.
        """
        self.protocol = self.connect(max_in_flight=1)
        self.protocol.dataReceived(encode(_request(code=RequestCode.PULL_MESSAGE, opaque=1)))
        self.protocol.dataReceived(encode(_request(code=RequestCode.PULL_MESSAGE, opaque=2)))
        (busy,) = _written(self.transport)
        self.assertEqual((busy.opaque, busy.code), (2, ResponseCode.SYSTEM_BUSY))
        self.assertIn("[OVERLOAD]", busy.remark or "")
        self.handling[0].callback(None)
        self.protocol.dataReceived(encode(_request(code=RequestCode.PULL_MESSAGE, opaque=3)))
        self.assertEqual(len(self.served), 2)

    def test_lost_connection_cancels_serving(self) -> None:
        """
        Requests still being served when the connection goes are
        cancelled and answer nothing.
        """
        self.protocol.dataReceived(encode(_request(code=RequestCode.PULL_MESSAGE)))
        self.protocol.connectionLost(Failure(ConnectionError("gone")))
        self.assertTrue(self.handling[0].called)
        self.assertEqual(self.transport.value(), b"")
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_malformed_closes(self) -> None:
        """
        A malformed frame closes the connection with one log line naming
        the peer and the error; what follows is ignored, and requests
        before it were served.
        """
        frame = encode(_request())
        self.protocol.dataReceived(frame + b"\x00\x00\x00\x02junk" + frame)
        self.assertTrue(self.transport.disconnecting)
        self.assertEqual(len(self.served), 1)
        lines = [t for t in self.log.texts() if "malformed" in t]
        self.assertEqual(
            lines,
            [
                f"remoting peer {_PEER} sent a malformed frame: frame length 2 is below 4 "
                "(the header length field); closing the connection"
            ],
        )
        self.protocol.dataReceived(frame)
        self.assertEqual(len(self.served), 1)

    def test_oversize_closes(self) -> None:
        """
        A frame declaring more than the limit closes the connection from
        its first 4 bytes.
        """
        self.protocol = self.connect(max_frame_size=1024)
        self.protocol.dataReceived(b"\x00\x00\x10\x00")
        self.assertTrue(self.transport.disconnecting)


class RequestingTests(_Case):
    """
    Our requests and their responses.
    """

    def respond(self, request: RemotingCommand, code: int = 0, **kw: Any) -> None:
        self.protocol.dataReceived(encode(make_response(request, code, **kw)))

    def test_matched_by_opaque(self) -> None:
        """
        A request goes out with the connection's next opaque; its response
        completes it from the next turn of the clock.
        """
        d = self.protocol.request(_request(opaque=999))
        (sent,) = _written(self.transport)
        self.assertEqual((sent.opaque, sent.flag), (0, 0))
        self.respond(sent, ext_fields={"offset": "42"})
        self.assertNoResult(d)
        self.clock.advance(0)
        self.assertEqual(self.successResultOf(d).ext_fields, {"offset": "42"})
        self.assertEqual(self.protocol.pending, 0)

    def test_out_of_order(self) -> None:
        """
        Responses in another order than the requests complete their own.
        """
        first = self.protocol.request(_request())
        second = self.protocol.request(_request())
        a, b = _written(self.transport)
        self.assertEqual((a.opaque, b.opaque), (0, 1))
        self.respond(b, remark="second")
        self.respond(a, remark="first")
        self.clock.advance(0)
        self.assertEqual(self.successResultOf(first).remark, "first")
        self.assertEqual(self.successResultOf(second).remark, "second")

    def test_timeout_and_late_response(self) -> None:
        """
        A deadline fails the request with RequestTimeoutError; the late
        response is logged and dropped.
        """
        d = self.protocol.request(_request(), timeout=3)
        (sent,) = _written(self.transport)
        self.clock.advance(2.9)
        self.assertNoResult(d)
        self.clock.advance(0.1)
        failure = self.failureResultOf(d, RequestTimeoutError)
        self.assertEqual(
            str(failure.value), f"no response to GET_MAX_OFFSET (30) from {_PEER} within 3 s"
        )
        self.assertEqual(self.protocol.pending, 0)
        self.respond(sent)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertTrue(any("which no request waits for" in t for t in self.log.texts()))
        self.assertFalse(self.transport.disconnecting)

    def test_cancel(self) -> None:
        """
        Cancelling withdraws the request.
        """
        d = self.protocol.request(_request())
        d.cancel()
        self.failureResultOf(d)
        self.assertEqual(self.protocol.pending, 0)

    def test_cancelled_after_arrival(self) -> None:
        """
        A request cancelled (or timed out) after its response arrived but
        before it was delivered stays cancelled, without an error.
        """
        d = self.protocol.request(_request())
        (sent,) = _written(self.transport)
        self.respond(sent)
        d.cancel()
        self.clock.advance(0)
        self.failureResultOf(d)
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_oneway(self) -> None:
        """
        A oneway request goes out with flag bit 1 and waits for nothing.
        """
        self.protocol.send_oneway(_request(code=RequestCode.UPDATE_CONSUMER_OFFSET))
        (sent,) = _written(self.transport)
        self.assertTrue(sent.is_oneway)
        self.assertFalse(sent.is_response)
        self.assertEqual(self.protocol.pending, 0)

    def test_pending_bounded(self) -> None:
        """
        Beyond C{max_pending} waiting requests, the next fails at once.
        """
        self.protocol = self.connect(max_pending=2)
        waiting = [self.protocol.request(_request()) for _ in range(2)]
        self.failureResultOf(self.protocol.request(_request()), TooManyPendingError)
        self.assertEqual(len(_written(self.transport)), 2)
        self.protocol.connectionLost(Failure(ConnectionError()))
        for d in waiting:
            self.failureResultOf(d, ConnectionClosedError)

    def test_connection_lost(self) -> None:
        """
        A lost connection fails every pending request, naming it; later
        requests fail at once.
        """
        d = self.protocol.request(_request())
        self.protocol.connectionLost(Failure(ConnectionError("reset")))
        failure = self.failureResultOf(d, ConnectionClosedError)
        self.assertEqual(
            str(failure.value),
            f"connection to {_PEER} closed while GET_MAX_OFFSET (30) (opaque 0) "
            "waited for its response",
        )
        self.failureResultOf(self.protocol.request(_request()), ConnectionClosedError)
        self.assertRaises(ConnectionClosedError, self.protocol.send_oneway, _request())

    def test_response_then_connection_lost(self) -> None:
        """
        A response that arrived before the connection was lost is still
        delivered (on the next turn); the requests still waiting fail.
        """
        answered = self.protocol.request(_request())
        waiting = self.protocol.request(_request())
        sent, _ = _written(self.transport)
        self.respond(sent, remark="made it")
        self.protocol.connectionLost(Failure(ConnectionError()))
        self.failureResultOf(waiting, ConnectionClosedError)
        self.assertNoResult(answered)
        self.clock.advance(0)
        self.assertEqual(self.successResultOf(answered).remark, "made it")

    def test_opaque_wraps(self) -> None:
        """
        Opaques stay in Java's int range, skipping ones still pending.
        """
        self.protocol._next_opaque = (1 << 31) - 1
        waiting = [self.protocol.request(_request()) for _ in range(2)]
        self.protocol._next_opaque = (1 << 31) - 1
        waiting.append(self.protocol.request(_request()))
        opaques = [c.opaque for c in _written(self.transport)]
        self.assertEqual(opaques, [(1 << 31) - 1, 0, 1])
        self.protocol.connectionLost(Failure(ConnectionError()))
        for d in waiting:
            self.failureResultOf(d, ConnectionClosedError)


class LoopbackTests(SynchronousTestCase):
    """
    Two protocols talking in memory.
    """

    def test_both_ways(self) -> None:
        """
        Each side's request is served by the other's handler.
        """
        clock = Clock()

        def answer(command: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
            return make_response(command, ResponseCode.SUCCESS, body=b"from " + str(peer).encode()[:20])

        handler = Dispatcher({RequestCode.GET_ALL_TOPIC_CONFIG: answer})
        connection = connect_in_memory(
            RemotingFactory(handler, clock), RemotingFactory(handler, clock), clock
        )
        to_server = connection.slave.request(RemotingCommand(code=21))
        to_client = connection.master.request(RemotingCommand(code=21), timeout=1)
        unknown = connection.slave.request(RemotingCommand(code=12345, serialize_type=SerializeType.ROCKETMQ))
        connection.flush()
        self.assertTrue(self.successResultOf(to_server).body.startswith(b"from IPv4Address"))
        self.assertEqual(self.successResultOf(to_client).code, ResponseCode.SUCCESS)
        self.assertEqual(self.successResultOf(unknown).code, ResponseCode.REQUEST_CODE_NOT_SUPPORTED)
        self.assertEqual(clock.getDelayedCalls(), [])


class ClientTests(SynchronousTestCase):
    """
    L{RemotingClient}: deadlines, reconnection, failures.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.endpoint = StringEndpoint()
        self.client = RemotingClient(
            None, self.endpoint, NO_HANDLER, clock=self.clock, retry_policy=lambda n: 1.0
        )

    def tearDown(self) -> None:
        if self.client.running:
            self.client.stopService()
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_request(self) -> None:
        """
        A request goes over the connection the client made; its response
        completes it.
        """
        self.client.startService()
        d = self.client.request(_request(), timeout=3)
        protocol, transport = self.endpoint.connected[-1]
        (sent,) = _written(transport)
        protocol.dataReceived(encode(make_response(sent, 0)))
        self.clock.advance(0)
        self.assertEqual(self.successResultOf(d).code, 0)

    def test_timeout(self) -> None:
        """
        The deadline runs on the injected clock; the request is withdrawn.
        """
        self.client.startService()
        d = self.client.request(_request(), timeout=3)
        self.clock.advance(3)
        failure = self.failureResultOf(d, RequestTimeoutError)
        self.assertIn("GET_MAX_OFFSET (30) from", str(failure.value))
        protocol, _ = self.endpoint.connected[-1]
        self.assertEqual(protocol.pending, 0)

    def test_refused(self) -> None:
        """
        A request fails when the next connection attempt fails, saying
        so; a stopped client refuses requests.
        """
        self.endpoint.refuse = True
        self.client.startService()
        d = self.client.request(_request(), timeout=3)
        self.clock.advance(1.0)
        failure = self.failureResultOf(d, ConnectionClosedError)
        self.assertIn("cannot connect to", str(failure.value))
        self.client.stopService()
        d, oneway = self.client.request(_request(), timeout=3), self.client.oneway(_request())
        self.clock.advance(0)
        self.failureResultOf(d, ConnectionClosedError)
        self.failureResultOf(oneway, ConnectionClosedError)

    def test_refusal_after_unwinding(self) -> None:
        """
        A refused connection fails the request with one line naming the
        address, from a clock turn of its own, not from inside
        ClientService (which refuses to be re-entered): the errback may
        send the next request, and stop the client.
        """
        import inspect

        client = RemotingClient(
            None, StringEndpoint(refuse=True), clock=self.clock,
            retry_policy=lambda n: 1.0, name="192.0.2.1:10911",
        )
        client.startService()
        failures: list[Failure] = []
        stacks: list[list[str]] = []
        stopped: list[object] = []

        def failed(failure: Failure, again: bool) -> None:
            failures.append(failure)
            stacks.append([frame.filename for frame in inspect.stack()])
            if again:
                client.request(_request(), timeout=3).addErrback(failed, False)
            else:
                client.stopService().addBoth(stopped.append)

        client.request(_request(), timeout=3).addErrback(failed, True)
        self.clock.advance(1)
        self.clock.advance(1)
        self.assertEqual(len(failures), 2)
        self.assertEqual(stopped, [None])
        self.assertFalse(client.running)
        for failure in failures:
            self.assertIsInstance(failure.value, ConnectionClosedError)
            self.assertTrue(
                str(failure.value).startswith(
                    "cannot connect to 192.0.2.1:10911 for GET_MAX_OFFSET (30): ConnectionRefusedError"
                ),
                str(failure.value),
            )
            self.assertNotIn("\n", str(failure.value))
        for stack in stacks:
            self.assertEqual([f for f in stack if f.endswith("_client_service.py")], [])

    def test_refusal_and_deadline_in_one_turn(self) -> None:
        """
        A refusal found before the deadline is what the request fails
        with, even when both fall due in one advance of the clock (whose
        next turn is then the deadline's time); a deadline before the
        refusal is a timeout, and the late refusal changes nothing.
        """
        self.endpoint.refuse = True
        self.client.startService()  # (refused at once; retried after 1 s)
        d = self.client.request(_request(), timeout=3)
        self.clock.advance(3)
        self.assertIn("cannot connect to", str(self.failureResultOf(d, ConnectionClosedError).value))

        slow = RemotingClient(None, self.endpoint, clock=self.clock, retry_policy=lambda n: 5.0)
        slow.startService()
        d = slow.request(_request(), timeout=3)
        self.clock.advance(3)
        failure = self.failureResultOf(d, RequestTimeoutError)
        self.assertIn("within 3 s", str(failure.value))
        self.clock.advance(2)
        slow.stopService()

    def test_stopped_while_connecting(self) -> None:
        """
        A request waiting for a connection when the client stops fails
        with ConnectionClosedError saying so (not ClientService's
        CancelledError), from a clock turn of its own.
        """

        class Hanging:
            def connect(self, factory: object) -> Deferred[Any]:
                return Deferred()

        client = RemotingClient(None, Hanging(), clock=self.clock, name="192.0.2.1:10911")  # type: ignore[arg-type]
        client.startService()
        d = client.request(_request(), timeout=3)
        client.stopService()
        self.assertNoResult(d)
        self.clock.advance(0)
        failure = self.failureResultOf(d, ConnectionClosedError)
        self.assertEqual(
            str(failure.value), "the client of 192.0.2.1:10911 stopped before GET_MAX_OFFSET (30) was sent"
        )

    def test_reconnects(self) -> None:
        """
        After the connection is lost, pending requests fail and the next
        request goes over a new connection.
        """
        self.client.startService()
        d = self.client.request(_request(), timeout=30)
        protocol, transport = self.endpoint.connected[-1]
        protocol.connectionLost(Failure(ConnectionError("reset")))
        self.clock.advance(0)
        self.failureResultOf(d, ConnectionClosedError)
        self.clock.advance(1.0)
        self.assertEqual(len(self.endpoint.connected), 2)
        d = self.client.request(_request(), timeout=30)
        protocol, transport = self.endpoint.connected[-1]
        (sent,) = _written(transport)
        protocol.dataReceived(encode(make_response(sent, 0)))
        self.clock.advance(0)
        self.successResultOf(d)

    def test_oneway(self) -> None:
        """
        A oneway request is written with flag bit 1.
        """
        self.client.startService()
        self.successResultOf(self.client.oneway(_request()))
        _, transport = self.endpoint.connected[-1]
        (sent,) = _written(transport)
        self.assertTrue(sent.is_oneway)

    def test_endpoint_string(self) -> None:
        """
        An endpoint description is parsed as the HA port's are.
        """
        from twisted.internet.testing import MemoryReactorClock

        reactor = MemoryReactorClock()
        client = RemotingClient(reactor, "tcp:192.0.2.1:10911")
        client.startService()
        self.assertEqual(reactor.tcpClients[0][:2], ("192.0.2.1", 10911))
        client.stopService()


class TLSTests(SynchronousTestCase):
    """
    The protocol under rmqha's TLS layer, as a TLS remoting port and
    client would run it.
    """

    def test_request_over_tls(self) -> None:
        """
        A request and its response cross an in-memory TLS connection
        (the server side as on a listening port, the client verifying the
        server's certificate).
        """
        from twisted.internet import ssl

        from rmqha.tls import PeerPolicy, ServerTLSFactory, TLSFiles, _VerifyingCreator, server_context
        from tests.test_tls import PKI

        clock = Clock()
        pki = PKI(self.mktemp())
        server_files = pki.master()
        handler = Dispatcher(
            {RequestCode.GET_MAX_OFFSET: lambda c, p: make_response(c, 0, ext_fields={"offset": "7"})}
        )
        port = ServerTLSFactory(
            server_context(TLSFiles(server_files.cert, server_files.key, None), PeerPolicy()), RemotingFactory(handler, clock), clock
        )
        creator = _VerifyingCreator(
            ssl.optionsForClientTLS("master", trustRoot=server_files.trust_root()), "master"
        )
        connection = connect_in_memory(port, RemotingFactory(NO_HANDLER, clock), clock, slave_tls=creator)
        d = connection.slave.request(_request(), timeout=5)
        connection.flush()
        self.assertEqual(self.successResultOf(d).ext_fields, {"offset": "7"})
        connection.hang_up()
        connection.flush()
        for call in clock.getDelayedCalls():
            call.cancel()


class BackpressureTests(_Case):
    """
    The peer's requests are not read while our answers cannot be written.
    """

    def test_paused_while_writes_back_up(self) -> None:
        """
        The protocol is the transport's push producer: paused by the
        transport (its write buffer is full), it stops the transport
        reading; resumed, it reads again; twice either way is once.
        """
        self.assertTrue(self.transport.streaming)
        producer = self.transport.producer
        self.assertIs(producer, self.protocol.read_pause)
        producer.pauseProducing()
        producer.pauseProducing()
        self.assertEqual(self.transport.producerState, "paused")
        producer.resumeProducing()
        self.assertEqual(self.transport.producerState, "producing")
        producer.resumeProducing()
        self.assertEqual(self.transport.producerState, "producing")
        producer.stopProducing()
        self.protocol.connectionLost(Failure(ConnectionError()))
        self.assertIsNone(self.protocol.read_pause)
