"""
Tests for the admin port's batch put (C{POST /topics/{topic}/batch},
L{rmqha.admin.put}) and for what the single put was trimmed of, on
brokers running over a L{MemoryReactorClock} (no sockets).
"""

from __future__ import annotations

import base64
import json
import struct
from io import BytesIO
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.web.resource import getChildForRequest
from twisted.web.server import NOT_DONE_YET
from twisted.web.test.requesthelper import DummyRequest

from rmqha.admin import AdminRoot, make_site
from rmqha.admin.put import MAX_BATCH_MESSAGES
from rmqha.broker import Broker, Role

from tests.test_admin import AdminTestCase, _CertifiedTransport, response

JSON = b"application/json"
BINARY = b"application/x-rmqha-batch"


def binary(*bodies: bytes) -> bytes:
    return b"".join(struct.pack(">I", len(b)) + b for b in bodies)


def render_batch(
    broker: Broker,
    body: bytes,
    content_type: bytes | None = JSON,
    topic: bytes = b"Orders",
    **query: str,
) -> DummyRequest:
    """
    C{POST /topics/{topic}/batch} rendered on C{broker}'s admin root (the
    request, finished or still waiting).
    """
    path = b"/topics/" + topic + b"/batch"
    req = DummyRequest(path.lstrip(b"/").split(b"/"))
    req.method = b"POST"
    req.uri = req.path = path
    req.args = {k.encode(): [v.encode()] for k, v in query.items()}
    req.content = BytesIO(body)
    if content_type is not None:
        req.requestHeaders.setRawHeaders(b"content-type", [content_type])
    result = getChildForRequest(AdminRoot(broker), req).render(req)
    if result is not NOT_DONE_YET:
        req.write(result)
        req.finish()
    return req


def answer_of(req: DummyRequest) -> tuple[int, dict[str, Any]]:
    assert req.finished, "the response was not finished"
    return req.responseCode or 200, json.loads(b"".join(req.written))


class BatchTests(AdminTestCase):
    """
    A batch on an ASYNC_MASTER: formats, verdicts, limits.
    """

    def setUp(self) -> None:
        self.broker_ = self.broker(Role.MASTER)

    def post(self, body: bytes, content_type: bytes | None = JSON, **query: str) -> tuple[int, dict]:
        return answer_of(render_batch(self.broker_, body, content_type, **query))

    def records(self) -> list[Any]:
        return list(self.broker_.commitlog.records())

    def test_json(self) -> None:
        """
        A JSON batch stores its messages in order, text bodies as UTF-8 and
        C{body_base64} decoded, the query's queueId/tags/keys for every
        message unless one gives its own; one verdict each, as the single
        put answers (offset, next offset, msg_id, queue offset).
        """
        code, answer = self.post(
            json.dumps(
                {
                    "messages": [
                        {"body": "héllo"},
                        {"body_base64": base64.b64encode(b"\x00\xff").decode()},
                        {"body": "own", "queueId": 5, "tags": "TagB", "keys": ""},
                    ]
                }
            ).encode(),
            queueId="2",
            tags="TagA",
            keys="k1",
        )
        self.assertEqual(code, 200, answer)
        self.assertEqual((answer["status"], answer["messages"], answer["stored"]), ("PUT_OK", 3, 3))
        records = self.records()
        self.assertEqual(
            [(r.body, r.queue_id, r.properties) for r in records],
            [
                ("héllo".encode(), 2, {"TAGS": "TagA", "KEYS": "k1"}),
                (b"\x00\xff", 2, {"TAGS": "TagA", "KEYS": "k1"}),
                (b"own", 5, {"TAGS": "TagB"}),
            ],
        )
        self.assertEqual(
            answer["results"],
            [
                {
                    "status": "PUT_OK",
                    "stored": True,
                    "offset": r.offset,
                    "next_offset": r.offset + r.size,
                    "msg_id": r.msg_id,
                    "queue_offset": r.queue_offset,
                }
                for r in records
            ],
        )
        self.assertEqual([r["queue_offset"] for r in answer["results"]], [0, 1, 0])

    def test_binary(self) -> None:
        """
        A length-prefixed binary batch (a 4-byte big-endian length, then
        the body, per message; empty bodies too) stores each body with the
        query's queueId and properties.
        """
        bodies = [b"a", b"", b"\r\n" * 300]
        code, answer = self.post(binary(*bodies), BINARY + b"; charset=x", queueId="1", keys="k")
        self.assertEqual(code, 200, answer)
        self.assertEqual(answer["stored"], 3)
        self.assertEqual(
            [(r.body, r.queue_id, r.properties) for r in self.records()],
            [(b, 1, {"KEYS": "k"}) for b in bodies],
        )

    def test_partial_failure(self) -> None:
        """
        A message the store refuses is named in its own verdict (400's
        MESSAGE_ILLEGAL, C{stored: false}, the reason); the others are put
        as if alone. The answer's code is that refusal's, its error names
        the message, C{stored} counts what was stored.
        """
        code, answer = self.post(
            json.dumps(
                {"messages": [{"body": "a"}, {"body": "b", "tags": "x\u0001y"}, {"body": "c"}]}
            ).encode()
        )
        self.assertEqual(code, 400)
        self.assertEqual((answer["status"], answer["stored"]), ("MESSAGE_ILLEGAL", 2))
        self.assertTrue(answer["error"].startswith("message 1: property 'TAGS'"), answer["error"])
        self.assertEqual(
            [(r["status"], r["stored"]) for r in answer["results"]],
            [("PUT_OK", True), ("MESSAGE_ILLEGAL", False), ("PUT_OK", True)],
        )
        self.assertIn("separators", answer["results"][1]["error"])
        self.assertEqual([r.body for r in self.records()], [b"a", b"c"])

    def test_bad_requests_store_nothing(self) -> None:
        """
        A batch that cannot be read is refused whole, 400 with one line
        naming the message and what is wrong; nothing is stored.
        """
        cases = [
            (b"{not json", JSON, "not JSON"),
            (b"[]", JSON, '"messages" list'),
            (b'{"messages": [{"body": "a"}, 7]}', JSON, "message 1: not a JSON object"),
            (b'{"messages": [{"body": "a", "tag": "x"}]}', JSON, "message 0: unknown field 'tag'"),
            (b'{"messages": [{}]}', JSON, 'message 0: give one of "body"'),
            (b'{"messages": [{"body": "a", "body_base64": "YQ=="}]}', JSON, "message 0: give one"),
            (b'{"messages": [{"body_base64": "%%%"}]}', JSON, "message 0: \"body_base64\" is not base64"),
            (b'{"messages": [{"body": 1}]}', JSON, 'message 0: "body" is not a string'),
            (b'{"messages": [{"body": "\\ud800"}]}', JSON, 'message 0: "body" is not valid Unicode'),
            (b'{"messages": [{"body": "a", "queueId": -1}]}', JSON, "message 0: queueId -1"),
            (b'{"messages": [{"body": "a", "queueId": "1"}]}', JSON, "message 0: queueId '1'"),
            (b'{"messages": [{"body": "a", "keys": 3}]}', JSON, "message 0: keys is not a string"),
            (b'{"messages": []}', JSON, "the batch has no messages"),
            (binary(b"ok") + b"\x00\x00\x00\x09abc", BINARY, "message 1: its length says 9 bytes, 3 remain"),
            (binary(b"ok") + b"\x00\x00", BINARY, "message 1: 2 bytes left where a 4-byte length"),
            (b"", BINARY, "the batch has no messages"),
        ]
        for body, kind, needle in cases:
            code, answer = self.post(body, kind)
            self.assertEqual((code, answer["status"]), (400, "BAD_REQUEST"), body)
            self.assertIn(needle, answer["error"])
            self.assertNotIn("\n", answer["error"])
            self.assertIs(answer["stored"], False)
        code, answer = self.post(b'{"messages": [{"body": "a"}]}', JSON, queueId="q")
        self.assertEqual((code, answer["error"]), (400, "queueId 'q' is not a queue number"))
        self.assertEqual(self.records(), [])

    def test_content_type(self) -> None:
        """
        A batch without a batch's Content-Type (curl's form default, none)
        is 415, naming the types taken; nothing is stored.
        """
        for kind, shown in [
            (b"application/x-www-form-urlencoded", "application/x-www-form-urlencoded"),
            (None, "none"),
        ]:
            code, answer = self.post(binary(b"a"), kind)
            self.assertEqual((code, answer["status"]), (415, "UNSUPPORTED_MEDIA_TYPE"))
            self.assertEqual(
                answer["error"],
                "a batch's Content-Type is application/json or application/x-rmqha-batch, "
                f"not {shown}",
            )
        self.assertEqual(self.records(), [])

    def test_message_count_limit(self) -> None:
        """
        More than C{MAX_BATCH_MESSAGES} messages, in either format, is 413
        naming the limit; exactly that many are taken.
        """
        over = MAX_BATCH_MESSAGES + 1
        for body, kind in [
            (binary(*[b""] * over), BINARY),
            (json.dumps({"messages": [{"body": ""}] * over}).encode(), JSON),
        ]:
            code, answer = self.post(body, kind)
            self.assertEqual((code, answer["status"]), (413, "REQUEST_TOO_LARGE"))
            self.assertIn(f"the limit is {MAX_BATCH_MESSAGES} (MAX_BATCH_MESSAGES)", answer["error"])
        self.assertEqual(self.records(), [])
        code, answer = self.post(binary(*[b""] * MAX_BATCH_MESSAGES), BINARY)
        self.assertEqual((code, answer["stored"]), (200, MAX_BATCH_MESSAGES))

    def test_request_size_limit(self) -> None:
        """
        The request body's limit holds for a batch as for a single put:
        413 naming it before a byte of the body is read.
        """
        site = make_site(self.broker_, max_body=1000)
        channel = site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000))
        transport = StringTransport()
        channel.makeConnection(transport)
        self.addCleanup(channel.connectionLost, Failure(ConnectionDone()))
        channel.dataReceived(
            b"POST /topics/Orders/batch HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1001\r\n\r\n"
        )
        code, _, body = response(transport)
        self.assertEqual(code, 413)
        self.assertEqual(
            json.loads(body)["error"], "the request body is 1001 bytes; the limit is 1000"
        )


class BatchRefusedTests(AdminTestCase):
    def test_slave(self) -> None:
        """
        On a slave every message is refused as a single put is (503
        SERVICE_NOT_AVAILABLE naming the master): nothing stored.
        """
        broker = self.broker(Role.SLAVE)
        code, answer = answer_of(render_batch(broker, binary(b"a", b"b"), BINARY))
        self.assertEqual((code, answer["status"], answer["stored"]), (503, "SERVICE_NOT_AVAILABLE", 0))
        self.assertEqual(
            answer["error"],
            "message 0: this node is a slave; the master is at 127.0.0.1:10912 (its HA address)",
        )
        self.assertEqual([r["stored"] for r in answer["results"]], [False, False])
        self.assertEqual(broker.commitlog.max_offset, 0)


class SyncBatchTests(AdminTestCase):
    """
    On a SYNC_MASTER each message of a batch waits for its own ack, as a
    single put does, and the answer comes when every one is decided.
    """

    def setUp(self) -> None:
        self.broker_ = self.broker(Role.SYNC_MASTER)
        factory = self.broker_.master_factory
        assert factory is not None
        self.slave = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40001))
        self.slave.makeConnection(StringTransport())
        self.slave.dataReceived(struct.pack(">q", 0))

    def ack(self, offset: int) -> None:
        self.slave.dataReceived(struct.pack(">q", offset))

    def test_each_message_waits_for_its_ack(self) -> None:
        """
        Acked up to the first message's end: the answer still waits; acked
        to the last's: 200, every message PUT_OK.
        """
        req = render_batch(self.broker_, binary(b"a", b"b", b"c"), BINARY)
        self.assertFalse(req.finished)
        first, *_, last = list(self.broker_.commitlog.records())
        self.ack(first.offset + first.size)
        self.assertFalse(req.finished)
        self.ack(last.offset + last.size)
        code, answer = answer_of(req)
        self.assertEqual((code, answer["status"], answer["stored"]), (200, "PUT_OK", 3))

    def test_timeouts_per_message(self) -> None:
        """
        Only the first message acked within slaveTimeout: it is PUT_OK,
        the others FLUSH_SLAVE_TIMEOUT (stored: a 200, as for a single put),
        the answer's status the first that is not PUT_OK.
        """
        req = render_batch(self.broker_, binary(b"a", b"b", b"c"), BINARY)
        first = next(iter(self.broker_.commitlog.records()))
        self.ack(first.offset + first.size)
        self.broker_.reactor.advance(3.5)  # type: ignore[attr-defined]
        code, answer = answer_of(req)
        self.assertEqual((code, answer["status"], answer["stored"]), (200, "FLUSH_SLAVE_TIMEOUT", 3))
        self.assertEqual(
            [r["status"] for r in answer["results"]],
            ["PUT_OK", "FLUSH_SLAVE_TIMEOUT", "FLUSH_SLAVE_TIMEOUT"],
        )
        self.assertNotIn("error", answer)

    def test_client_gone(self) -> None:
        """
        A client going away withdraws every message's wait; nothing is
        written to it; the messages stay stored.
        """
        req = render_batch(self.broker_, binary(b"a", b"b"), BINARY)
        side = self.broker_.role_service
        self.assertEqual(side.ha.group.waiting, 2)  # type: ignore[union-attr]
        req.processingFailed(Failure(ConnectionDone("the client went away")))
        self.assertEqual(side.ha.group.waiting, 0)  # type: ignore[union-attr]
        self.assertEqual(req.written, [])
        self.assertEqual(len(list(self.broker_.commitlog.records())), 2)

    def test_slave_not_available(self) -> None:
        """
        With the slave gone, each message is decided at once as a single
        put is: stored, C{SLAVE_NOT_AVAILABLE} (a 200).
        """
        self.slave.connectionLost(Failure(ConnectionDone()))
        code, answer = answer_of(render_batch(self.broker_, binary(b"a", b"b"), BINARY))
        self.assertEqual((code, answer["status"], answer["stored"]), (200, "SLAVE_NOT_AVAILABLE", 2))
        self.assertEqual([r["status"] for r in answer["results"]], ["SLAVE_NOT_AVAILABLE"] * 2)

    def test_waited_answer_has_a_length(self) -> None:
        """
        An answer written after the wait (a single put's, a batch's) has a
        Content-Length, not chunked framing.
        """
        site = make_site(self.broker_)
        channel = site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000))
        for path, kind, body in [
            (b"/topics/Orders/messages", b"text/plain", b"one"),
            (b"/topics/Orders/batch", BINARY, binary(b"two")),
        ]:
            transport = StringTransport()
            channel = site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000))
            channel.makeConnection(transport)
            channel.dataReceived(
                b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (path, kind, len(body), body)
            )
            self.assertEqual(transport.value(), b"")
            self.ack(self.broker_.commitlog.max_offset)
            code, headers, answer = response(transport)
            self.assertEqual(code, 200, answer)
            self.assertNotIn("transfer-encoding", headers)
            self.assertEqual(int(headers["content-length"]), len(answer))
            channel.connectionLost(Failure(ConnectionDone()))


class SiteTests(AdminTestCase):
    """
    Through the admin C{Site}: authentication and bodies.
    """

    def setUp(self) -> None:
        self.broker_ = self.broker(Role.MASTER)

    def exchange(self, data: bytes, transport: StringTransport | None = None, **kwargs: Any) -> tuple[int, dict]:
        site = make_site(self.broker_, **kwargs)
        channel = site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000))
        transport = transport or StringTransport()
        channel.makeConnection(transport)
        self.addCleanup(channel.connectionLost, Failure(ConnectionDone()))
        channel.dataReceived(data)
        code, _, body = response(transport)
        return code, json.loads(body)

    def test_authenticated_as_a_single_put(self) -> None:
        """
        With C{--http-allowed-peers}, a batch from a client certificate not
        allowed is 403 and nothing is stored; an allowed one's is put.
        """
        from OpenSSL import crypto

        from rmqha import certs
        from rmqha.tls import PeerPolicy

        ca = certs.make_ca()
        policy = PeerPolicy(require_client_cert=True, allowed_peers=frozenset({"producer"}))
        body = binary(b"a")
        request = (
            b"POST /topics/Orders/batch HTTP/1.1\r\nHost: x\r\nContent-Type: "
            b"application/x-rmqha-batch\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        for name, expected in [("ops", 403), ("producer", 200)]:
            certificate = crypto.X509.from_cryptography(
                certs.issue(ca, name, [name], client=True).certificate
            )
            code, answer = self.exchange(
                request, _CertifiedTransport(certificate), peer_policy=policy
            )
            self.assertEqual(code, expected, answer)
            if expected == 403:
                self.assertEqual(self.broker_.commitlog.max_offset, 0)
        self.assertEqual([r.body for r in self.broker_.commitlog.records()], [b"a"])

    def test_form_body_is_the_message(self) -> None:
        """
        A single put's body sent with curl's default form type is the
        message as sent: not parsed into query parameters (which would
        choose its queue and tags).
        """
        body = b"queueId=5&tags=x"
        code, answer = self.exchange(
            b"POST /topics/Orders/messages HTTP/1.1\r\nHost: x\r\nContent-Type: "
            b"application/x-www-form-urlencoded\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        self.assertEqual(code, 200, answer)
        (record,) = self.broker_.commitlog.records()
        self.assertEqual((record.body, record.queue_id, record.properties), (body, 0, {}))
