"""
Tests for L{rmqha.admin}: the admin HTTP resources, on brokers running
over a L{MemoryReactorClock} (no sockets).
"""

from __future__ import annotations

import errno
import json
import os
import struct
import tempfile
from io import BytesIO
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.logger import formatEvent, globalLogPublisher
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import getChildForRequest
from twisted.web.server import NOT_DONE_YET
from twisted.web.test.requesthelper import DummyRequest

from rmqha.store import _queues, _segments
from rmqha.admin import HEADER_TIMEOUT, MAX_REQUEST_BODY, AdminRoot, AdminService, make_site
from rmqha.broker import Broker, NotStoredError, Role
from rmqha.settings import BrokerSettings
from rmqha.store._record import Message
from rmqha.store.commitlog import CommitLog
from rmqha.ha.group import PutStatus

from tests._helpers import fixed_clock


def request(root: AdminRoot, method: bytes, path: bytes, body: bytes = b"",
            args: dict[bytes, list[bytes]] | None = None) -> tuple[int, bytes, DummyRequest]:
    """
    Render C{method path} on C{root}; the response code and body.
    """
    req = DummyRequest(path.lstrip(b"/").split(b"/"))
    req.method = method
    req.uri = req.path = path
    req.args = args or {}
    req.content = BytesIO(body)
    resource = getChildForRequest(root, req)
    result = resource.render(req)
    if result is not NOT_DONE_YET:
        req.write(result)
        req.finish()
    assert req.finished, "the response was not finished"
    return req.responseCode or 200, b"".join(req.written), req


class AdminTestCase(SynchronousTestCase):
    def broker(self, role: Role, segment_size: int = 64 * 1024) -> Broker:
        reactor = MemoryReactorClock()
        reactor.advance(1700000000)
        store = self.mktemp()
        broker = Broker(
            BrokerSettings(
                role=role,
                ha_listen="tcp:0",
                master_endpoint="tcp:host=127.0.0.1:port=10912" if role is Role.SLAVE else None,
            ),
            reactor=reactor,
            open_commitlog=lambda: CommitLog.open(store, segment_size=segment_size, clock=fixed_clock),
        )
        broker.startService()
        self.addCleanup(broker.stopService)
        return broker


class MasterAdminTests(AdminTestCase):
    """
    The admin interface of a master.
    """

    def setUp(self) -> None:
        self.broker_ = self.broker(Role.MASTER)
        self.root = AdminRoot(self.broker_)

    def produce(self, body: bytes, **query: str) -> tuple[int, dict]:
        code, data, _ = self.request_post(body, **query)
        return code, json.loads(data)

    def request_post(self, body: bytes, topic: bytes = b"Orders", **query: str):  # type: ignore[no-untyped-def]
        args = {k.encode(): [v.encode()] for k, v in query.items()}
        return request(self.root, b"POST", b"/topics/" + topic + b"/messages", body, args)

    def test_produce(self) -> None:
        """
        POST /topics/{topic}/messages stores the body as one message with
        queueId, tags and keys, and answers PUT_OK with the record's
        physical offset, the next offset and the message id.
        """
        code, answer = self.produce(b"hello", queueId="3", tags="TagA", keys="k1 k2")
        self.assertEqual(code, 200)
        self.assertEqual(answer["status"], "PUT_OK")
        self.assertEqual(answer["offset"], 0)
        (record,) = list(self.broker_.commitlog.records())
        self.assertEqual(answer["next_offset"], record.size)
        self.assertEqual(answer["msg_id"], record.msg_id)
        self.assertEqual((record.topic, record.body, record.queue_id), ("Orders", b"hello", 3))
        self.assertEqual(record.properties, {"TAGS": "TagA", "KEYS": "k1 k2"})
        code, second = self.produce(b"again")
        self.assertEqual(second["offset"], answer["next_offset"])

    def test_bad_input_is_4xx_json(self) -> None:
        """
        A bad queueId, an illegal topic or an oversized body: 400 with a
        JSON error naming the problem, and nothing stored.
        """
        for body, topic, query, needle in [
            (b"x", b"Orders", {"queueId": "-1"}, "queueId"),
            (b"x", b"Orders", {"queueId": "q"}, "queueId"),
            (b"x", b"bad%20topic!", {}, "topic"),
            (b"x" * (4 * 1024 * 1024 + 1), b"Orders", {}, "maxMessageSize"),
        ]:
            code, data, _ = self.request_post(body, topic, **query)
            answer = json.loads(data)
            self.assertEqual(code, 400, answer)
            self.assertIn(needle, answer["error"])
        self.assertEqual(self.broker_.commitlog.max_offset, 0)

    def test_status(self) -> None:
        """
        GET /status: role and offsets, and the connected slaves with their
        ack, lag, rate and connection time.
        """
        self.produce(b"a" * 100)
        factory = self.broker_.master_factory
        assert factory is not None
        connection = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40001))
        connection.makeConnection(StringTransport())
        self.addCleanup(connection.connectionLost)
        connection.dataReceived((0).to_bytes(8, "big"))
        connection.dataReceived((50).to_bytes(8, "big"))
        code, data, _ = request(self.root, b"GET", b"/status")
        answer = json.loads(data)
        end = self.broker_.commitlog.max_offset
        self.assertEqual(code, 200)
        self.assertEqual(
            {k: answer[k] for k in ("role", "min_offset", "max_offset", "flushed_offset")},
            {"role": "ASYNC_MASTER", "min_offset": 0, "max_offset": end, "flushed_offset": 0},
        )
        (slave,) = answer["slaves"]
        self.assertEqual(slave["peer"], "127.0.0.1:40001")
        self.assertEqual(slave["ack_offset"], 50)
        self.assertEqual(slave["lag_bytes"], end - 50)
        self.assertEqual(slave["connected_since"], 1700000000)
        self.assertEqual((slave["transport"], slave["identity"]), ("tcp", None))
        self.assertEqual(slave["framing"], "classic")

    def test_metrics(self) -> None:
        """
        GET /metrics: Prometheus text with the offsets, puts and slaves.
        """
        self.produce(b"a" * 100)
        code, data, req = request(self.root, b"GET", b"/metrics")
        text = data.decode()
        self.assertEqual(code, 200)
        self.assertIn("text/plain", req.responseHeaders.getRawHeaders(b"content-type")[0].decode())
        end = self.broker_.commitlog.max_offset
        self.assertIn(f"rmqha_commitlog_max_offset {float(end)}", text)
        self.assertIn("rmqha_puts_total 1.0", text)
        self.assertIn("rmqha_slaves_connected 0.0", text)
        self.assertIn('rmqha_put_results_total{status="PUT_OK"} 1.0', text)
        self.assertIn('rmqha_replication_wait_seconds_bucket{le="+Inf"} 0.0', text)
        self.assertIn("rmqha_checksum_failures_total 0.0", text)

    def test_not_found(self) -> None:
        """
        Unknown paths are a 404 JSON error.
        """
        for path in (b"/nowhere", b"/topics/Orders/other"):
            code, data, _ = request(self.root, b"GET", path)
            self.assertEqual(code, 404)
            self.assertEqual(json.loads(data)["status"], "NOT_FOUND")


class ClientGoneTests(AdminTestCase):
    def test_post_cancels_its_wait(self) -> None:
        """
        A SYNC_MASTER POST waiting for its slave's ack, whose client goes
        away (C{request.notifyFinish()} errbacks), withdraws its wait:
        no put is left waiting and nothing is written to the gone request.
        """
        broker = self.broker(Role.SYNC_MASTER)
        factory = broker.master_factory
        assert factory is not None
        slave = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40001))
        slave.makeConnection(StringTransport())
        slave.dataReceived(struct.pack(">q", 0))
        req = DummyRequest([b"topics", b"Orders", b"messages"])
        req.method = b"POST"
        req.uri = req.path = b"/topics/Orders/messages"
        req.args = {}
        req.content = BytesIO(b"waiting")
        resource = getChildForRequest(AdminRoot(broker), req)
        self.assertIs(resource.render(req), NOT_DONE_YET)
        side = broker.role_service
        self.assertEqual(side.ha.group.waiting, 1)  # type: ignore[union-attr]
        req.processingFailed(Failure(ConnectionDone("the client went away")))
        self.assertEqual(side.ha.group.waiting, 0)  # type: ignore[union-attr]
        self.assertEqual(req.written, [])
        self.assertEqual(len(list(broker.commitlog.records())), 1)  # stored


class SlaveAdminTests(AdminTestCase):
    """
    The admin interface of a slave.
    """

    def test_status_and_refused_put(self) -> None:
        """
        A slave's status names its master and whether it is connected; a
        put is refused with 503 SERVICE_NOT_AVAILABLE naming the master.
        """
        root = AdminRoot(self.broker(Role.SLAVE))
        code, data, _ = request(root, b"GET", b"/status")
        answer = json.loads(data)
        self.assertEqual(answer["role"], "SLAVE")
        self.assertEqual(answer["master"], "tcp:host=127.0.0.1:port=10912")
        self.assertFalse(answer["connected"])
        self.assertIsNone(answer["lag_bytes"])
        self.assertEqual(answer["framing"], "classic")
        self.assertEqual(answer["failed_checks"], 0)
        self.assertIsNone(answer["divergence"])
        code, data, _ = request(root, b"POST", b"/topics/Orders/messages", b"x")
        self.assertEqual(code, 503)
        self.assertEqual(json.loads(data)["status"], "SERVICE_NOT_AVAILABLE")
        # (It names the master it was given, as HOST:PORT.)
        self.assertIn(
            "this node is a slave; the master is at 127.0.0.1:10912 (its HA address)",
            json.loads(data)["error"],
        )
        code, data, _ = request(root, b"GET", b"/metrics")
        self.assertIn("rmqha_master_connected 0.0", data.decode())
        self.assertIn("rmqha_checksum_failures_total 0.0", data.decode())
        self.assertIn("rmqha_failed_checks 0.0", data.decode())
        self.assertIn("rmqha_rejected_records_total 0.0", data.decode())


class DiskFullTests(AdminTestCase):
    """
    A put the store cannot take (the disk is full, an I/O error) answers
    JSON saying it was not stored, leaves no litter, and the next put
    lands where this one would have.
    """

    def setUp(self) -> None:
        self.broker_ = self.broker(Role.MASTER)
        self.root = AdminRoot(self.broker_)

    def post(self, body: bytes) -> tuple[int, dict]:
        code, data, _ = request(self.root, b"POST", b"/topics/Orders/messages", body)
        return code, json.loads(data)

    def disk_full(self) -> Any:
        def full(fd: int, size: int) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        return self.patch(_segments, "_allocate", full)

    def store_files(self) -> list[str]:
        root = self.broker_.commitlog.store_dir
        return sorted(
            os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs
        )

    def test_first_segment(self) -> None:
        """
        With no room for the first segment: 507, status
        CREATE_MAPEDFILE_FAILED, C{stored: false}, "disk full" in the
        error; no segment file is left, and once there is room the next
        put is stored at offset 0.
        """
        full = self.disk_full()
        before = self.store_files()
        code, answer = self.post(b"hello")
        self.assertEqual(code, 507, answer)
        self.assertEqual(answer["status"], "CREATE_MAPEDFILE_FAILED")
        self.assertIs(answer["stored"], False)
        self.assertIn("disk full", answer["error"])
        self.assertIn("00000000000000000000", answer["error"])
        self.assertEqual(self.store_files(), before)
        self.assertEqual(self.broker_.commitlog.max_offset, 0)
        self.assertEqual(self.broker_.put_path.put_statuses[PutStatus.CREATE_MAPEDFILE_FAILED], 1)
        full.restore()
        code, answer = self.post(b"hello")
        self.assertEqual((code, answer["status"], answer["offset"]), (200, "PUT_OK", 0))
        self.assertIs(answer["stored"], True)

    def test_roll_keeps_the_log_consistent(self) -> None:
        """
        A full disk when a put needs the next segment, the queue-table
        snapshot failing too: 507 and nothing stored, no C{*.tmp} or
        half-made segment left; the next put lands at the next segment's
        start and the store reopens with every record.
        """
        log = self.broker_.commitlog
        first = log.put(Message("Orders", b"x" * 1000))
        while log.max_offset + first.size + 8 <= log.segment_size:
            log.put(Message("Orders", b"x" * 1000))
        stored = len(list(log.records()))
        segment_end = log.segment_size

        class FullJSON:
            @staticmethod
            def dump(value: object, f: Any) -> None:
                f.write('{"offset": ')  # a partial snapshot, then no room
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            loads = staticmethod(json.loads)
            load = staticmethod(json.load)

        patches = [self.patch(_queues, "json", FullJSON), self.disk_full()]
        before = self.store_files()
        for _ in range(2):
            code, answer = self.post(b"x" * 1000)
            self.assertEqual(code, 507, answer)
            self.assertEqual(answer["status"], "CREATE_MAPEDFILE_FAILED")
            self.assertIs(answer["stored"], False)
            self.assertEqual(self.store_files(), before)
            self.assertFalse([f for f in self.store_files() if f.endswith(".tmp")])
        for patch in patches:
            patch.restore()
        code, answer = self.post(b"after")
        self.assertEqual((code, answer["offset"]), (200, segment_end))
        store_dir = log.store_dir
        self.successResultOf(self.broker_.stopService())
        with CommitLog.open(store_dir, segment_size=64 * 1024, clock=fixed_clock) as reopened:
            records = list(reopened.records())
        self.assertEqual(len(records), stored + 1)
        self.assertEqual((records[-1].offset, records[-1].body), (segment_end, b"after"))

    def test_other_io_error(self) -> None:
        """
        Another store failure: 500 UNKNOWN_ERROR naming it, C{stored:
        false}; the embedding API raises L{NotStoredError} with the status.
        """

        def broken(message: Message) -> None:
            raise OSError(errno.EIO, os.strerror(errno.EIO), "/store/commitlog/0")

        self.patch(self.broker_.commitlog, "put", broken)
        code, answer = self.post(b"x")
        self.assertEqual((code, answer["status"], answer["stored"]), (500, "UNKNOWN_ERROR", False))
        self.assertIn("/store/commitlog/0: Input/output error", answer["error"])
        error = self.assertRaises(NotStoredError, self.broker_.put, Message("Orders", b"x"))
        self.assertEqual(error.status, PutStatus.UNKNOWN_ERROR)
        self.assertFalse(error.disk_full)


def response(transport: StringTransport) -> tuple[int, dict[str, str], bytes]:
    """
    The first HTTP response written to C{transport}: code, headers (lower
    case), body.
    """
    head, _, rest = transport.value().partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    code = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                return code, headers, body
            body, rest = body + rest[:size], rest[size + 2 :]
    length = int(headers.get("content-length", len(rest)))
    return code, headers, rest[:length]


class HTTPLayerTests(AdminTestCase):
    """
    The admin C{Site} from L{make_site}: limits that hold before a
    request reaches a resource, and JSON for every error.
    """

    def setUp(self) -> None:
        self.broker_ = self.broker(Role.MASTER, segment_size=1024 * 1024)
        self.clock = Clock()
        # Runs last: every connection closed, nothing may stay scheduled.
        self.addCleanup(lambda: self.assertEqual(self.clock.getDelayedCalls(), []))

    def connect(self, **kwargs: Any) -> tuple[Any, StringTransport]:
        site = make_site(self.broker_, reactor=self.clock, **kwargs)
        channel = site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000))
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 40000))
        channel.makeConnection(transport)

        self.addCleanup(channel.connectionLost, Failure(ConnectionDone()))
        return channel, transport

    def assertJSONError(self, transport: StringTransport, code: int, status: str) -> dict:
        got, headers, body = response(transport)
        self.assertEqual(got, code, body)
        self.assertEqual(headers["content-type"], "application/json")
        answer = json.loads(body)
        self.assertEqual(answer["status"], status)
        return answer

    def test_huge_content_length_refused_unread(self) -> None:
        """
        A 2 GiB Content-Length is answered 413 JSON as soon as the headers
        are in, with no "100 Continue", no body buffer or temp file made,
        and the connection closing; bytes that follow are not read.
        """
        channel, transport = self.connect()
        channel.dataReceived(
            b"POST /topics/Orders/messages HTTP/1.1\r\nHost: x\r\n"
            b"Expect: 100-continue\r\nContent-Length: 2147483648\r\n\r\n"
        )
        self.assertNotIn(b"100 Continue", transport.value())
        answer = self.assertJSONError(transport, 413, "REQUEST_TOO_LARGE")
        self.assertIn("2147483648", answer["error"])
        self.assertIn(str(MAX_REQUEST_BODY), answer["error"])
        self.assertTrue(transport.disconnecting)
        (req,) = channel.requests
        self.assertIsNone(req.content)
        written = transport.value()
        channel.dataReceived(b"x" * 65536)
        self.assertIsNone(req.content)
        self.assertEqual(transport.value(), written)
        self.assertEqual(self.broker_.commitlog.max_offset, 0)
        # A Content-Length too long for int() (Twisted would raise).
        channel, transport = self.connect()
        channel.dataReceived(
            b"POST /topics/Orders/messages HTTP/1.1\r\nContent-Length: "
            + b"9" * 5000 + b"\r\nHost: x\r\n\r\n"
        )
        self.assertJSONError(transport, 413, "REQUEST_TOO_LARGE")

    def test_chunked_body_cut_off(self) -> None:
        """
        A chunked body is refused with 413 JSON as it passes the limit:
        no more than the limit is kept, nothing is stored, and a final
        chunk in the same read does not get the request processed.
        """
        channel, transport = self.connect(max_body=1000)
        chunk = b"%x\r\n%s\r\n" % (600, b"y" * 600)
        channel.dataReceived(
            b"POST /topics/Orders/messages HTTP/1.1\r\nHost: x\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + chunk
        )
        self.assertEqual(transport.value(), b"")
        channel.dataReceived(chunk + b"0\r\n\r\n")
        self.assertJSONError(transport, 413, "REQUEST_TOO_LARGE")
        self.assertEqual(transport.value().count(b"HTTP/1.1"), 1)
        self.assertTrue(transport.disconnecting)
        self.assertLessEqual(len(channel.requests[0].content.getvalue()), 1000)
        self.assertEqual(self.broker_.commitlog.max_offset, 0)

    def test_bodies_in_memory(self) -> None:
        """
        Bodies within the limit, chunked or not, are stored; a large one
        is kept in memory, not spooled to a temporary file.
        """
        self.patch(tempfile, "TemporaryFile", lambda *a, **k: self.fail("temp file"))
        channel, transport = self.connect()
        body = b"z" * 200_000
        channel.dataReceived(
            b"POST /topics/Orders/messages HTTP/1.1\r\nHost: x\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        code, _, data = response(transport)
        self.assertEqual(code, 200, data)
        transport.clear()
        channel.dataReceived(
            b"POST /topics/Orders/messages HTTP/1.1\r\nHost: x\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        )
        code, _, data = response(transport)
        self.assertEqual((code, json.loads(data)["stored"]), (200, True))
        bodies = [r.body for r in self.broker_.commitlog.records()]
        self.assertEqual(bodies, [body, b"hello"])

    def test_slow_headers_cut_off(self) -> None:
        """
        Headers trickled a byte a second (each byte resetting the idle
        timeout) are cut off HEADER_TIMEOUT seconds after the connection,
        with 408 JSON.
        """
        channel, transport = self.connect()
        head = b"GET /status HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100
        for byte in head[: int(HEADER_TIMEOUT) - 1]:
            channel.dataReceived(bytes([byte]))
            self.clock.advance(1)
        self.assertEqual(transport.value(), b"")
        channel.dataReceived(b"T")
        self.clock.advance(1)
        self.assertJSONError(transport, 408, "REQUEST_TIMEOUT")
        self.assertTrue(transport.disconnecting)

    def test_header_deadline_per_request(self) -> None:
        """
        The deadline is per request: a connection answering quick
        requests is not cut off, and the deadline starts again after
        each answer; a kept-alive connection gone quiet past it is closed
        without an answer, one in the middle of a request line gets 408.
        """
        channel, transport = self.connect()
        for _ in range(3):
            self.clock.advance(HEADER_TIMEOUT - 1)
            channel.dataReceived(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
            self.assertEqual(response(transport)[0], 200)
            transport.clear()
        self.clock.advance(HEADER_TIMEOUT)
        self.assertEqual(transport.value(), b"")
        self.assertTrue(transport.disconnecting)
        channel, transport = self.connect()
        channel.dataReceived(b"GET /sta")
        self.clock.advance(HEADER_TIMEOUT)
        self.assertJSONError(transport, 408, "REQUEST_TIMEOUT")

    def test_method_errors_are_json(self) -> None:
        """
        A method a resource does not serve is 405 JSON with C{Allow}; an
        unknown method 501 JSON; a path that is only a prefix 404 JSON; a
        malformed request 400 JSON.
        """
        for line, code, status, allow in [
            (b"DELETE /status", 405, "METHOD_NOT_ALLOWED", "GET, HEAD"),
            (b"GET /topics/Orders/messages", 405, "METHOD_NOT_ALLOWED", "POST"),
            (b"HEAD /topics/Orders/messages", 405, "METHOD_NOT_ALLOWED", "POST"),
            (b"BREW /status", 501, "NOT_IMPLEMENTED", None),
            (b"BREW /nowhere", 501, "NOT_IMPLEMENTED", None),
            (b"GET /topics", 404, "NOT_FOUND", None),
            (b"PUT /nowhere", 404, "NOT_FOUND", None),
        ]:
            channel, transport = self.connect()
            channel.dataReceived(line + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            got, headers, body = response(transport)
            self.assertEqual(got, code, line)
            self.assertEqual(headers["content-type"], "application/json", line)
            if line.startswith(b"HEAD"):
                continue
            self.assertEqual(json.loads(body)["status"], status, line)
            self.assertEqual(headers.get("allow"), allow, line)
        channel, transport = self.connect()
        channel.dataReceived(b"nonsense\r\n\r\n")
        self.assertJSONError(transport, 400, "BAD_REQUEST")
        channel, transport = self.connect()
        channel.dataReceived(b"GET /status HTTP/1.1\r\n" + b"X-Big: " + b"b" * 20000 + b"\r\n")
        self.assertJSONError(transport, 400, "BAD_REQUEST")

    def test_unexpected_failure_is_json(self) -> None:
        """
        An exception escaping a resource answers 500 JSON, not Twisted's
        HTML page (and is logged).
        """

        def boom(message: Message) -> None:
            raise RuntimeError("boom")

        self.patch(self.broker_, "put", boom)
        channel, transport = self.connect()
        channel.dataReceived(
            b"POST /topics/Orders/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx"
        )
        self.assertJSONError(transport, 500, "UNKNOWN_ERROR")
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)


class ExposureTests(SynchronousTestCase):
    """
    The admin port warns when it is plain TCP beyond loopback.
    """

    def start(self, http: str) -> list[str]:
        events: list[str] = []
        observer = lambda event: events.append(formatEvent(event))  # noqa: E731
        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)
        store = self.mktemp()
        broker = Broker(
            BrokerSettings(role=Role.MASTER, ha_listen="tcp:0:interface=127.0.0.1"),
            reactor=MemoryReactorClock(),
            open_commitlog=lambda: CommitLog.open(store, segment_size=64 * 1024, clock=fixed_clock),
        )
        AdminService(broker, http).setServiceParent(broker)
        broker.startService()
        self.addCleanup(broker.stopService)
        return [e for e in events if "admin HTTP port" in e]

    def test_plain_beyond_loopback_warns(self) -> None:
        """
        C{tcp:PORT} (all interfaces) or a non-loopback interface logs a
        warning naming the port and what to do; loopback does not.
        """
        (warning,) = self.start("tcp:0")
        self.assertIn("plain TCP on all interfaces", warning)
        self.assertIn("--http ssl:PORT", warning)
        (warning,) = self.start("tcp:0:interface=10.1.2.3")
        self.assertIn("10.1.2.3", warning)
        self.assertEqual(self.start("tcp:0:interface=127.0.0.1"), [])
class BusyPollAdminTests(AdminTestCase):
    """
    The reactor's busy polling in /metrics (docs/sync.md, "Busy polling").
    """

    def test_windows_and_seconds(self) -> None:
        import weakref

        from rmqha import _busypoll

        broker = self.broker(Role.SLAVE)
        root = AdminRoot(broker)
        _, data, _ = request(root, b"GET", b"/metrics")
        text = data.decode()
        self.assertIn('rmqha_busy_poll_windows_total{outcome="events"} 0.0', text)
        self.assertIn("rmqha_busy_poll_seconds_total 0.0", text)
        polling = _busypoll.BusyPoll(None)
        polling.windows_with_events, polling.windows_without_events, polling.poll_seconds = 7, 2, 0.25
        wrapped: weakref.WeakKeyDictionary[object, _busypoll.BusyPoll] = (
            weakref.WeakKeyDictionary({broker.reactor: polling})
        )
        self.patch(_busypoll, "_wrapped", wrapped)
        _, data, _ = request(root, b"GET", b"/metrics")
        text = data.decode()
        self.assertIn('rmqha_busy_poll_windows_total{outcome="events"} 7.0', text)
        self.assertIn('rmqha_busy_poll_windows_total{outcome="none"} 2.0', text)
        self.assertIn("rmqha_busy_poll_seconds_total 0.25", text)


class PrefaultAdminTests(AdminTestCase):
    """
    The pre-faulting ahead of the puts in /status and /metrics
    (docs/store.md).
    """

    def test_figures(self) -> None:
        """
        Asks made and not made for lack of a spare CPU, and the thread's
        CPU, in both; zeros and C{null} where the log has none.
        """
        from rmqha.store._prefault import PrefaultFigures

        broker = self.broker(Role.ASYNC_MASTER)
        root = AdminRoot(broker)
        commitlog = broker.commitlog
        assert commitlog is not None
        self.patch(commitlog, "prefault_figures", lambda: None)
        _, data, _ = request(root, b"GET", b"/status")
        self.assertIsNone(json.loads(data)["prefault"])
        _, data, _ = request(root, b"GET", b"/metrics")
        text = data.decode()
        self.assertIn('rmqha_prefault_asks_total{outcome="made"} 0.0', text)
        self.assertIn("rmqha_prefault_cpu_seconds_total 0.0", text)
        self.patch(commitlog, "prefault_figures", lambda: PrefaultFigures(3, 5, 0.25))
        _, data, _ = request(root, b"GET", b"/status")
        self.assertEqual(
            json.loads(data)["prefault"],
            {"asks": 3, "skipped_no_spare_cpu": 5, "cpu_seconds": 0.25},
        )
        _, data, _ = request(root, b"GET", b"/metrics")
        text = data.decode()
        self.assertIn('rmqha_prefault_asks_total{outcome="made"} 3.0', text)
        self.assertIn('rmqha_prefault_asks_total{outcome="no_spare_cpu"} 5.0', text)
        self.assertIn("rmqha_prefault_cpu_seconds_total 0.25", text)


class ScrubAdminTests(AdminTestCase):
    """
    The scrub's figures in /status and /metrics.
    """

    def test_slave_has_scrub(self) -> None:
        """
        A slave scrubs too: its /status has the C{scrub} object and its
        /metrics the scrub's figures.
        """
        root = AdminRoot(self.broker(Role.SLAVE))
        _, data, _ = request(root, b"GET", b"/status")
        scrub = json.loads(data)["scrub"]
        self.assertTrue(scrub["enabled"])
        self.assertEqual((scrub["corrupt_records"], scrub["corrupt"]), (0, []))
        _, data, _ = request(root, b"GET", b"/metrics")
        self.assertIn("rmqha_corrupt_records 0.0", data.decode())
        self.assertIn("rmqha_scrubbed_bytes_total 0.0", data.decode())

    def test_corrupt_record_shown(self) -> None:
        """
        A record the background scrub found corrupt in an old segment is
        in /status's C{scrub} object (offset, segment, reason; count,
        passes, rate) and counted by C{rmqha_corrupt_records}; the bytes
        read are C{rmqha_scrubbed_bytes_total}.
        """
        from tests._helpers import segment_path, xor_byte
        from tests.test_scrub import COUNT, SEGMENT, _body_position, _fill

        store = self.mktemp()
        offsets, _ = _fill(store, COUNT)
        xor_byte(segment_path(store, 0), _body_position(offsets[2]))
        reactor = MemoryReactorClock()
        reactor.advance(1700000000)
        broker = Broker(
            BrokerSettings(role=Role.MASTER, ha_listen="tcp:0", scrub_rate=4 * 1024 * 1024),
            reactor=reactor,
            open_commitlog=lambda: CommitLog.open(store, segment_size=SEGMENT, clock=fixed_clock),
        )
        broker.startService()
        self.addCleanup(broker.stopService)
        for _ in range(40):
            reactor.advance(0.05)
        root = AdminRoot(broker)
        code, data, _ = request(root, b"GET", b"/status")
        scrub = json.loads(data)["scrub"]
        self.assertEqual(code, 200)
        self.assertEqual((scrub["enabled"], scrub["rate"]), (True, 4 * 1024 * 1024))
        self.assertEqual(scrub["passes"], 1)
        self.assertEqual(scrub["corrupt_records"], 1)
        (record,) = scrub["corrupt"]
        self.assertEqual(record["offset"], offsets[2])
        self.assertEqual(record["segment"], "00000000000000000000")
        self.assertIn("body CRC mismatch", record["reason"])
        self.assertEqual(record["resumed_at"], offsets[3])
        code, data, _ = request(root, b"GET", b"/metrics")
        text = data.decode()
        self.assertIn("rmqha_corrupt_records 1.0", text)
        self.assertIn("rmqha_scrub_passes_total 1.0", text)
        self.assertIn(f"rmqha_scrubbed_bytes_total {float(broker.scrub.bytes_total)}", text)
        self.assertGreater(broker.scrub.bytes_total, offsets[-1])


class _Coordinator:
    """
    What /status asks of a broker's coordinator: its status.
    """

    def status(self) -> dict[str, Any]:
        return {
            "group": "g",
            "node_id": "a",
            "coordinator": "etcd:https://10.0.0.1:2379,https://10.0.0.2:2379",
            "coordinator_error": "etcd https://10.0.0.1:2379: /v3/kv/range: HTTP 403: "
            "etcdserver: permission denied (code 7) (user node-a)",
            "master": None,
        }


class _CertifiedTransport(StringTransport):
    """
    A connection whose TLS layer verified this client certificate.
    """

    def __init__(self, certificate: Any) -> None:
        super().__init__(peerAddress=IPv4Address("TCP", "127.0.0.1", 40000))
        self._certificate = certificate

    def getPeerCertificate(self) -> Any:
        return self._certificate


class CoordinatorHiddenTests(AdminTestCase):
    """
    /status names the coordinator (etcd's URLs) only to a caller the
    admin port authenticated by its client certificate.
    """

    def setUp(self) -> None:
        from OpenSSL import crypto

        from rmqha import certs
        from rmqha.tls import PeerPolicy

        self.broker_ = self.broker(Role.MASTER, segment_size=1024 * 1024)
        self.coordinator = _Coordinator()
        self.clock = Clock()
        ca = certs.make_ca()
        self.certificate = crypto.X509.from_cryptography(
            certs.issue(ca, "ops", ["ops"], client=True).certificate
        )
        self.policy = PeerPolicy(require_client_cert=True)

    def status(self, transport: StringTransport, **kwargs: Any) -> dict[str, Any]:
        site = make_site(
            self.broker_, reactor=self.clock, failover=self.coordinator, **kwargs
        )
        channel = site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000))
        channel.makeConnection(transport)
        channel.dataReceived(b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        code, _, body = response(transport)
        self.assertEqual(code, 200, body)
        channel.connectionLost(Failure(ConnectionDone()))
        failover: dict[str, Any] = json.loads(body)["failover"]
        # (How the group authenticates is the broker's: not what is hidden.)
        failover.pop("auth", None)
        return failover

    def test_hidden_without_a_verified_certificate(self) -> None:
        """
        Over plain HTTP (and from the resource without a connection), and
        over TLS on a port that does not require client certificates, the
        coordinator shows as "etcd (hidden)" and its error is hidden too:
        no URL, no user.
        """
        plain = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 40000))
        answers = [
            self.status(plain, peer_policy=self.policy),
            self.status(_CertifiedTransport(self.certificate)),
            json.loads(
                request(AdminRoot(self.broker_, None, self.coordinator), b"GET", b"/status")[1]
            )["failover"],
        ]
        for failover in answers:
            self.assertEqual(failover["coordinator"], "etcd (hidden)")
            self.assertEqual(
                failover["coordinator_error"],
                "(hidden: the coordinator does not answer; see the log)",
            )
            self.assertNotIn("10.0.0", json.dumps(failover))
            self.assertNotIn("node-a", json.dumps(failover))
            self.assertEqual((failover["group"], failover["node_id"]), ("g", "a"))

    def test_shown_to_a_verified_client(self) -> None:
        """
        A client whose certificate the port verified (it requires them)
        sees where the coordinator is and what it last said.
        """
        failover = self.status(_CertifiedTransport(self.certificate), peer_policy=self.policy)
        self.assertEqual(failover, _Coordinator().status())


class TLSExpiryMetricsTests(AdminTestCase):
    """
    When the broker's certificate and CA expire, in /metrics.
    """

    def test_certificate_and_ca_expiry(self) -> None:
        """
        C{rmqha_tls_certificate_expiry_timestamp_seconds} has one sample
        for C{--tls-cert} (kind certificate) and one for C{--tls-ca} (kind
        ca), each the file's not-after time in Unix seconds, with the
        file's path; a broker without TLS files has none.
        """
        import attrs

        from rmqha import certs

        name = "rmqha_tls_certificate_expiry_timestamp_seconds"
        plain = self.broker(Role.MASTER)
        _, data, _ = request(AdminRoot(plain), b"GET", b"/metrics")
        self.assertIn(f"# TYPE {name} gauge", data.decode())
        self.assertNotIn(name + "{", data.decode())

        d = self.mktemp()
        written = certs.init(d, "master", ["s1"])
        issued = certs.issue_from(d, "m2", days=40)
        broker = self.broker(Role.MASTER)
        from rmqha.tls import PeerPolicy, TLSFiles, server_endpoint

        files = TLSFiles(issued.cert, issued.key, written.ca)
        broker.settings = attrs.evolve(
            broker.settings,
            ha_listen=server_endpoint(
                MemoryReactorClock(), "ssl:0", files, PeerPolicy(require_client_cert=True)
            ),
            tls_cert=files.cert,
            tls_key=files.key,
            tls_ca=files.ca,
            tls_require_client_cert=True,
        )
        _, data, _ = request(AdminRoot(broker), b"GET", b"/metrics")
        samples = [
            (labels, float(value))
            for labels, value in (
                line.rsplit(" ", 1) for line in data.decode().splitlines()
                if line.startswith(name + "{")
            )
        ]
        self.assertEqual(
            samples,
            [
                (f'{name}{{file="{written.ca}",kind="ca"}}',
                 issued.ca.not_valid_after_utc.timestamp()),
                (f'{name}{{file="{issued.cert}",kind="certificate"}}',
                 issued.certificate.not_valid_after_utc.timestamp()),
            ],
        )


class MetadataSyncAdminTests(AdminTestCase):
    """
    The slave's metadata sync in /status and /metrics.
    """

    def test_last_sync_and_failures(self) -> None:
        """
        /status shows the last complete sync, its age and the failing
        steps; /metrics the same as series labelled by table and kind.
        """
        from rmqha.remoting.codes import RequestCode, ResponseCode
        from rmqha.remoting._frames import make_response
        from rmqha.remoting.metadata import BrokerMetadata, TopicConfig
        from rmqha.remoting.protocol import RemotingClient
        from rmqha.remoting.sync import MetadataSync
        from tests.test_remoting_sync import _FakeMaster, _MasterEndpoint

        broker = self.broker(Role.SLAVE)
        clock = broker.reactor
        root = AdminRoot(broker)
        self.assertNotIn("metadata_sync", json.loads(request(root, b"GET", b"/status")[1]))
        master = _FakeMaster(BrokerMetadata(self.mktemp(), clock))
        master.metadata.update_topic(TopicConfig("Orders"))
        endpoint = _MasterEndpoint(master, clock)
        sync = MetadataSync(
            BrokerMetadata(self.mktemp(), clock), clock,
            lambda address: RemotingClient(None, endpoint, clock=clock),
        )
        sync.set_master_address("192.0.2.1:10911")
        broker.attach_metadata_sync(sync)

        def advance(seconds: float) -> None:
            for _ in range(int(seconds * 2)):
                clock.advance(0.5)
                for _ in range(4):
                    for connection in endpoint.connections:
                        connection.flush()

        advance(3)
        synced_at = clock.seconds()
        master.answer[RequestCode.GET_ALL_DELAY_OFFSET] = lambda c: make_response(
            c, ResponseCode.SYSTEM_ERROR, "disk on fire"
        )
        advance(12)
        shown = json.loads(request(root, b"GET", b"/status")[1])["metadata_sync"]
        self.assertEqual(shown["master"], "192.0.2.1:10911")
        self.assertTrue(shown["active"])
        self.assertEqual(shown["last_success"], synced_at)
        self.assertEqual(shown["last_success_age_seconds"], 12)
        self.assertEqual((shown["syncs"], shown["complete_syncs"]), (2, 1))
        self.assertEqual(
            shown["failures"], [{"table": "delay_offsets", "kind": "refused", "count": 1}]
        )
        self.assertIn("disk on fire", shown["failing"]["delay_offsets"]["error"])
        text = request(root, b"GET", b"/metrics")[1].decode()
        self.assertIn("rmqha_metadata_sync_active 1.0", text)
        self.assertIn("rmqha_metadata_sync_last_success_timestamp_seconds 1.700000003e+09", text)
        self.assertEqual(synced_at, 1_700_000_003)
        self.assertIn("rmqha_metadata_sync_last_success_age_seconds 12.0", text)
        self.assertIn('rmqha_metadata_sync_failures_total{kind="refused",table="delay_offsets"} 1.0', text)
        self.assertIn("rmqha_metadata_sync_runs_total 2.0", text)
