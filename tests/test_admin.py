"""
Tests for L{rmqha.admin}: the admin HTTP resources, on brokers running
over a L{MemoryReactorClock} (no sockets).
"""

from __future__ import annotations

import json
from io import BytesIO

from twisted.internet.address import IPv4Address
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import getChildForRequest
from twisted.web.server import NOT_DONE_YET
from twisted.web.test.requesthelper import DummyRequest

from rmqha.admin import AdminRoot
from rmqha.broker import Broker, Role
from rmqha.commitlog import CommitLog

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
    def broker(self, role: Role) -> Broker:
        reactor = MemoryReactorClock()
        reactor.advance(1700000000)
        store = self.mktemp()
        broker = Broker(
            reactor,
            lambda: CommitLog.open(store, segment_size=64 * 1024, clock=fixed_clock),
            role,
            ha_listen="tcp:0",
            master_endpoint="tcp:host=127.0.0.1:port=10912" if role is Role.SLAVE else None,
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


class SlaveAdminTests(AdminTestCase):
    """
    The admin interface of a slave.
    """

    def test_status_and_refused_put(self) -> None:
        """
        A slave's status names its master and whether it is connected; a
        put is refused with 503 SERVICE_NOT_AVAILABLE.
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
        code, data, _ = request(root, b"GET", b"/metrics")
        self.assertIn("rmqha_master_connected 0.0", data.decode())
        self.assertIn("rmqha_checksum_failures_total 0.0", data.decode())
        self.assertIn("rmqha_failed_checks 0.0", data.decode())
        self.assertIn("rmqha_rejected_records_total 0.0", data.decode())


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
            reactor,
            lambda: CommitLog.open(store, segment_size=SEGMENT, clock=fixed_clock),
            Role.MASTER,
            ha_listen="tcp:0",
            scrub_rate=4 * 1024 * 1024,
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
