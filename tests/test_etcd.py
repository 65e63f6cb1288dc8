"""
L{rmqha.coord.etcd} without etcd: the C{--coordinator} spec, the gateway's
JSON, and the client against scripted HTTP answers on L{StringTransport}s
(a hostile or broken server: oversized, stale, garbage, endless lines,
silence), on a L{MemoryReactorClock}.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer
from zope.interface.verify import verifyObject
from twisted.web.iweb import IAgentEndpointFactory

from rmqha import certs
from rmqha.coord.dcs import (
    ClusterView,
    DCSError,
    IDCS,
    InSync,
    Leader,
    Lease,
    LeaseLost,
    Member,
    encode,
)
from rmqha.coord.etcd import (
    MAX_LINE,
    EtcdDCS,
    LineSplitter,
    _Bad,
    parse_coordinator,
    prefix_range,
    view_from_range,
)
from rmqha.testing import StringEndpoint


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def header(term: int = 2, revision: int = 7, cluster: int = 11) -> dict[str, str]:
    return {"cluster_id": str(cluster), "member_id": "1", "revision": str(revision),
            "raft_term": str(term)}


def http(status: int, body: bytes, chunked: bool = False, length: int | None = None,
         end: bool = True) -> bytes:
    """
    An HTTP/1.1 answer; a chunked one stays open (a stream) unless C{end}.
    """
    reason = {200: b"OK", 404: b"Not Found", 500: b"Internal Server Error",
              503: b"Service Unavailable"}.get(status, b"X")
    head = b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n" % (status, reason)
    if chunked:
        return head + b"Transfer-Encoding: chunked\r\n\r\n" + (
            b"%x\r\n%s\r\n" % (len(body), body) if body else b""
        ) + (b"0\r\n\r\n" if end else b"")
    size = len(body) if length is None else length
    return head + b"Content-Length: %d\r\n\r\n" % size + body


class ParseCoordinatorTests(SynchronousTestCase):
    def test_endpoints(self) -> None:
        """
        C{etcd:} then comma-separated http URLs, normalised to
        scheme://host:port.
        """
        spec = parse_coordinator("etcd:http://127.0.0.1:2379, http://[::1]:2479/")
        self.assertEqual(spec.endpoints, ("http://127.0.0.1:2379", "http://[::1]:2479"))
        self.assertIsNone(spec.tls)
        self.assertEqual(str(spec), "etcd:http://127.0.0.1:2379,http://[::1]:2479")

    def test_tls_options(self) -> None:
        """
        https endpoints take tlsCa/tlsCert/tlsKey in the spec or as
        arguments (the spec's win).
        """
        spec = parse_coordinator(
            "etcd:https://e1:2379,https://e2:2379,tlsCa=/ca.pem,tlsCert=/c.pem", tls_key="/k.pem"
        )
        self.assertEqual(spec.endpoints, ("https://e1:2379", "https://e2:2379"))
        assert spec.tls is not None
        self.assertEqual((spec.tls.ca, spec.tls.cert, spec.tls.key), ("/ca.pem", "/c.pem", "/k.pem"))
        self.assertEqual(parse_coordinator("etcd:https://e1:1").tls.ca, None)  # type: ignore[union-attr]

    def test_bad_specs(self) -> None:
        """
        Each mistake is one ValueError line naming it.
        """
        for spec, words in [
            ("zk:http://h:1", "expected etcd:"),
            ("etcd:", "no endpoint"),
            ("etcd:h:1", "bad endpoint"),
            ("etcd:ftp://h:1", "expected http:// or https://"),
            ("etcd:http://h", "HOST:PORT"),
            ("etcd:http://h:99999", "bad endpoint"),
            ("etcd:http://h:1/v3", "no path"),
            ("etcd:http://h:1,https://g:1", "mixes"),
            ("etcd:http://h:1,http://h:1", "twice"),
            ("etcd:http://h:1,tlsCa=/x", "need https://"),
            ("etcd:https://h:1,tlsCert=/x", "go together"),
            ("etcd:http://h:1,color=red", "unknown option 'color'"),
        ]:
            with self.assertRaises(ValueError) as caught:
                parse_coordinator(spec)
            message = str(caught.exception)
            self.assertIn(words, message, spec)
            self.assertNotIn("\n", message)

    def test_credentials_never_shown(self) -> None:
        """
        A password in a URL is refused without being repeated.
        """
        with self.assertRaises(ValueError) as caught:
            parse_coordinator("etcd:http://root:s3cret@h:2379")
        self.assertNotIn("s3cret", str(caught.exception))
        self.assertIn("credentials", str(caught.exception))

    def test_bad_group(self) -> None:
        """
        A group becomes a key prefix: no slash, no spaces, not empty.
        """
        spec = parse_coordinator("etcd:http://h:1")
        for group in ("", "a/b", "a b"):
            self.assertRaises(ValueError, EtcdDCS, MemoryReactorClock(), spec, group)

    def test_unreadable_tls_file(self) -> None:
        """
        A missing CA file is a ValueError naming the spec option.
        """
        spec = parse_coordinator("etcd:https://h:1,tlsCa=/nonexistent/ca.pem")
        with self.assertRaises(ValueError) as caught:
            EtcdDCS(MemoryReactorClock(), spec, "g")
        self.assertIn("tlsCa /nonexistent/ca.pem", str(caught.exception))

    def test_tls_client_certificate(self) -> None:
        """
        With a CA and a client key pair the client is built (the files
        are read once, at the start).
        """
        directory = self.mktemp()
        import os

        os.makedirs(directory)
        ca = certs.make_ca()
        ca_path, _ = certs.write_pair(ca, directory, "ca")
        cert, key = certs.write_pair(certs.issue(ca, "node", ["node"], client=True), directory, "node")
        spec = parse_coordinator(f"etcd:https://127.0.0.1:1,tlsCa={ca_path},tlsCert={cert},tlsKey={key}")
        dcs = EtcdDCS(MemoryReactorClock(), spec, "g")
        self.assertEqual(dcs.endpoint, "etcd:https://127.0.0.1:1")


class JSONTests(SynchronousTestCase):
    def test_prefix_range(self) -> None:
        """
        The range end of a prefix is its last byte plus one.
        """
        self.assertEqual(prefix_range(b"/rmqha/c1/"), b"/rmqha/c10")
        self.assertEqual(prefix_range(b"a\xff"), b"b")

    def _kv(self, name: str, value: bytes, created: int = 3, modified: int = 4) -> dict[str, Any]:
        return {"key": b64(b"/rmqha/g/" + name.encode()), "value": b64(value),
                "create_revision": str(created), "mod_revision": str(modified), "version": "1"}

    def test_view(self) -> None:
        """
        A range answer becomes a ClusterView: the leader's revision is its
        create_revision, the others' their mod_revision, the leader's lease
        the key's; unknown keys are ignored.
        """
        leader = self._kv("leader", encode(Leader("a", 2, "h:1")), created=5, modified=6)
        leader["lease"] = "7587869893417263362"
        answer = {"header": header(revision=9), "kvs": [
            leader,
            self._kv("epoch", b"2", modified=5),
            self._kv("insync", encode(InSync(2, ("a", "b"))), modified=8),
            self._kv("members/b", encode(Member("b", "h:2")), modified=7),
            self._kv("future-key", b"whatever"),
        ], "count": "5"}
        view = view_from_range(b"/rmqha/g/", answer)
        self.assertEqual(view, ClusterView(
            leader=Leader("a", 2, "h:1"), epoch=2, epoch_revision=5,
            in_sync=InSync(2, ("a", "b")), members={"b": Member("b", "h:2")},
            switchover=None, revision=9,
        ))
        assert view.leader is not None and view.in_sync is not None
        self.assertEqual((view.leader.revision, view.in_sync.revision), (5, 8))
        self.assertEqual(view.leader.lease, 7587869893417263362)

    def test_unreadable_values_skipped_and_reported(self) -> None:
        """
        A value that is not what its key holds is skipped and reported
        (key, one-line reason, its mod_revision), the rest of the group
        read as usual; an answer that is itself broken (a key that is not
        base64) is still an error.
        """
        answer = {"header": header(revision=9), "kvs": [
            self._kv("leader", b"{not json", modified=5),
            self._kv("epoch", b"two", modified=6),
            self._kv("insync", encode(InSync(2, ("a",))), modified=7),
            self._kv("members/x", b"[]", modified=8),
            self._kv("members/b", encode(Member("b", "h:2")), modified=8),
        ]}
        view = view_from_range(b"/rmqha/g/", answer)
        self.assertEqual((view.leader, view.epoch, view.epoch_revision), (None, 0, 0))
        self.assertEqual(view.in_sync, InSync(2, ("a",)))
        self.assertEqual(view.members, {"b": Member("b", "h:2")})
        self.assertEqual(
            [(m.key, m.revision) for m in view.malformed],
            [("/rmqha/g/leader", 5), ("/rmqha/g/epoch", 6), ("/rmqha/g/members/x", 8)],
        )
        self.assertEqual(view.malformed_total, 3)
        self.assertIn("not JSON", view.malformed[0].reason)
        self.assertIn("not a decimal epoch", view.malformed[1].reason)
        self.assertIn("not a JSON object", view.malformed[2].reason)
        with self.assertRaises(_Bad) as caught:
            view_from_range(b"/rmqha/g/", {"header": header(), "kvs": [{"key": "!!", "value": ""}]})
        self.assertIn("a key", str(caught.exception))

    def test_lines(self) -> None:
        """
        Streamed objects are split on newlines whatever the chunking; a
        line longer than the limit is refused.
        """
        data = b'{"a":1}\n{"b":2}\n\n{"c":3}\n'
        splitter = LineSplitter(16)
        lines = [line for i in range(len(data)) for line in splitter.feed(data[i:i + 1])]
        self.assertEqual(lines, [b'{"a":1}', b'{"b":2}', b'{"c":3}'])
        self.assertRaises(_Bad, LineSplitter(16).feed, b"x" * 17)
        self.assertRaises(_Bad, LineSplitter(16).feed, b"x" * 17 + b"\n")


@implementer(IAgentEndpointFactory)
class _Endpoints:
    """
    One L{StringEndpoint} per port: C{refused} ports refuse connections.
    """

    def __init__(self, refused: tuple[int, ...] = ()) -> None:
        self.by_port: dict[int, StringEndpoint] = {}
        self.refused = refused

    def endpointForURI(self, uri: Any) -> StringEndpoint:
        return self.by_port.setdefault(uri.port, StringEndpoint(refuse=uri.port in self.refused))


class _Scripted(SynchronousTestCase):
    """
    An EtcdDCS whose connections are StringTransports this test answers.
    """

    def setUp(self) -> None:
        self.clock = MemoryReactorClock()
        self.endpoints = _Endpoints(refused=(1,))
        self.dcs = self.make("etcd:http://127.0.0.1:2379")

    def make(self, spec: str, **kwargs: Any) -> EtcdDCS:
        return EtcdDCS(self.clock, parse_coordinator(spec), "g",
                       endpoint_factory=self.endpoints, **kwargs)

    def tearDown(self) -> None:
        self.dcs.close()
        for endpoint in self.endpoints.by_port.values():
            for protocol, transport in endpoint.connected:
                if not transport.disconnecting:
                    transport.loseConnection()
        self.assertEqual([c for c in self.clock.getDelayedCalls() if c.active()], [])

    def pending(self, port: int = 2379) -> tuple[Any, StringTransport, dict[str, Any]]:
        """
        The connection with an unanswered request on C{port}, and the
        request's JSON body.
        """
        for protocol, transport in reversed(self.endpoints.by_port[port].connected):
            data = transport.value()
            if data:
                transport.clear()
                head, _, body = data.partition(b"\r\n\r\n")
                self.last_head = head
                return protocol, transport, json.loads(body)
        raise AssertionError(f"no request on port {port}")

    def answer(self, raw: bytes, port: int = 2379) -> dict[str, Any]:
        protocol, transport, body = self.pending(port)
        protocol.dataReceived(raw)
        return body

    def ok(self, obj: Any, port: int = 2379) -> dict[str, Any]:
        return self.answer(http(200, json.dumps(obj).encode()), port)



class ClientTests(_Scripted):
    """
    The client against scripted answers.
    """

    def test_provides_idcs(self) -> None:
        """
        EtcdDCS provides IDCS; its endpoint shows no credentials.
        """
        verifyObject(IDCS, self.dcs)
        self.assertEqual(self.dcs.endpoint, "etcd:http://127.0.0.1:2379")

    def test_load(self) -> None:
        """
        load() is one range over the group's prefix.
        """
        d = self.dcs.load()
        request = self.ok({"header": header(revision=3)})
        self.assertEqual(request, {"key": b64(b"/rmqha/g/"), "range_end": b64(b"/rmqha/g0")})
        self.assertIn(b"POST /v3/kv/range", self.last_head)
        self.assertEqual(self.successResultOf(d).revision, 3)

    def test_campaign_txn(self) -> None:
        """
        campaign() is one txn: leader absent, epoch and insync unchanged;
        puts the leader (on the lease), the epoch and the insync key.  No
        C{succeeded} in the answer means it lost.
        """
        seen = ClusterView(None, 4, 12, InSync(4, ("a",), revision=13), {}, None, 20)
        d = self.dcs.campaign(Leader("b", 0, "h:2"), Lease(99, 2), seen)
        txn = self.ok({"header": header(revision=21), "succeeded": True})
        self.assertEqual(txn["compare"], [
            {"key": b64(b"/rmqha/g/leader"), "target": "CREATE", "result": "EQUAL", "create_revision": "0"},
            {"key": b64(b"/rmqha/g/epoch"), "target": "MOD", "result": "EQUAL", "mod_revision": "12"},
            {"key": b64(b"/rmqha/g/insync"), "target": "MOD", "result": "EQUAL", "mod_revision": "13"},
        ])
        puts = [p["request_put"] for p in txn["success"]]
        self.assertEqual(puts[0]["lease"], "99")
        self.assertEqual(json.loads(base64.b64decode(puts[0]["value"]))["epoch"], 5)
        self.assertEqual(base64.b64decode(puts[1]["value"]), b"5")
        self.assertEqual(json.loads(base64.b64decode(puts[2]["value"])), {"epoch": 5, "members": ["b"]})
        won = self.successResultOf(d)
        self.assertEqual(won, Leader("b", 5, "h:2"))
        assert won is not None
        self.assertEqual(won.revision, 21)
        lost = self.dcs.campaign(Leader("b", 0, "h:2"), Lease(99, 2), seen)
        self.ok({"header": header(revision=22), "responses": [{"response_range": {}}]})
        self.assertIsNone(self.successResultOf(lost))

    def test_keepalive_without_ttl_is_lease_lost(self) -> None:
        """
        A keepalive answer without TTL means the lease is gone: LeaseLost.
        The first line is enough; the stream is closed after it.
        """
        d = self.dcs.keepalive(Lease(77, 2))
        protocol, transport, body = self.pending()
        self.assertEqual(body, {"ID": "77"})
        line = json.dumps({"result": {"header": header(), "ID": "77"}}).encode() + b"\n"
        protocol.dataReceived(http(200, line, chunked=True, end=False))
        self.failureResultOf(d, LeaseLost)
        self.assertEqual(transport.producerState, "stopped")
        ok = self.dcs.keepalive(Lease(77, 2))
        line = json.dumps({"result": {"header": header(), "ID": "77", "TTL": "2"}}).encode() + b"\n"
        self.answer(http(200, line, chunked=True, end=False))
        self.assertEqual(self.successResultOf(ok), 2)

    def test_put_on_dead_lease_is_lease_lost(self) -> None:
        """
        etcd's 404 code 5 on a put with a lease is LeaseLost, one line
        with etcd's message.
        """
        d = self.dcs.touch_member(Member("a", "h:1"), Lease(5, 2))
        body = b'{"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5}'
        self.answer(http(404, body, chunked=True))
        failure = self.failureResultOf(d, LeaseLost)
        self.assertEqual(
            str(failure.value),
            "etcd http://127.0.0.1:2379: /v3/kv/put: HTTP 404: etcdserver: requested lease not found (code 5)",
        )

    def test_oversized_answer_refused(self) -> None:
        """
        An answer over the limit is refused: by its Content-Length before
        reading, or when a chunked body passes it (the connection is cut).
        """
        dcs = self.make("etcd:http://127.0.0.1:2380", max_body=1000)
        d = dcs.load()
        self.answer(http(200, b"", length=10**9), port=2380)
        self.assertIn("larger than 1000", str(self.failureResultOf(d, DCSError).value))
        d = dcs.load()
        protocol, transport, _ = self.pending(2380)
        protocol.dataReceived(http(200, b" " * 600, chunked=True, end=False))
        protocol.dataReceived(b"%x\r\n%s\r\n" % (600, b" " * 600))
        self.assertIn("larger than 1000", str(self.failureResultOf(d, DCSError).value))
        self.assertEqual(transport.producerState, "stopped")
        dcs.close()

    def test_garbage_refused(self) -> None:
        """
        An answer that is not a JSON object is a DCSError quoting it.
        """
        for garbage in (b"<html>oops</html>", b"[1,2]", b"\xff\xfe"):
            d = self.dcs.load()
            self.answer(http(200, garbage))
            failure = self.failureResultOf(d, DCSError)
            self.assertIn("not a JSON object" if garbage == b"[1,2]" else "not JSON", str(failure.value))

    def test_stale_member_refused(self) -> None:
        """
        An answer whose raft_term is below one already seen comes from a
        stale member: refused.  So is one from another cluster.
        """
        d = self.dcs.load()
        self.ok({"header": header(term=5)})
        self.successResultOf(d)
        d = self.dcs.load()
        self.ok({"header": header(term=4)})
        self.assertIn("stale member: raft_term 4 below 5", str(self.failureResultOf(d, DCSError).value))
        d = self.dcs.load()
        self.ok({"header": header(term=6, cluster=12)})
        self.assertIn("cluster_id", str(self.failureResultOf(d, DCSError).value))

    def test_timeout(self) -> None:
        """
        A member that never answers costs the call its deadline, no more:
        a DCSError saying so, and the connection is dropped.
        """
        d = self.dcs.load()
        protocol, transport, _ = self.pending()
        self.clock.advance(0.99)
        self.assertNoResult(d)
        self.clock.advance(0.02)
        self.assertEqual(
            str(self.failureResultOf(d, DCSError).value),
            "etcd http://127.0.0.1:2379: /v3/kv/range: no answer within 1 s",
        )

    def test_rotation(self) -> None:
        """
        A refused connection moves a call to the next endpoint at once,
        and later calls start there.
        """
        dcs = self.make("etcd:http://127.0.0.1:1,http://127.0.0.1:2381")
        d = dcs.load()
        self.ok({"header": header()}, port=2381)
        self.successResultOf(d)
        d = dcs.load()
        self.ok({"header": header()}, port=2381)
        self.successResultOf(d)
        self.assertEqual(len(self.endpoints.by_port[1].connected), 0)
        dcs.close()

    def test_all_refused(self) -> None:
        """
        When no endpoint can be reached the call fails at once, bounded.
        """
        dcs = self.make("etcd:http://127.0.0.1:1")
        failure = self.failureResultOf(dcs.load(), DCSError)
        self.assertEqual(str(failure.value), "etcd http://127.0.0.1:1: /v3/kv/range: connection refused")
        dcs.close()

    def test_write_retried_only_when_unapplied(self) -> None:
        """
        A txn answered 503 (etcd: unavailable, not applied) is sent to the
        next endpoint; one answered 500 (maybe applied) is not.
        """
        dcs = self.make("etcd:http://127.0.0.1:2382,http://127.0.0.1:2383")
        leader = Leader("a", 1, "h:1", revision=5)
        d = dcs.resign(leader)
        self.answer(http(503, b'{"message":"etcdserver: no leader","code":14}'), port=2382)
        self.ok({"header": header(), "succeeded": True}, port=2383)
        self.assertTrue(self.successResultOf(d))
        d = dcs.resign(leader)
        self.answer(http(500, b'{"message":"context deadline exceeded","code":2}'), port=2383)
        failure = self.failureResultOf(d, DCSError)
        self.assertIn("HTTP 500: context deadline exceeded (code 2)", str(failure.value))
        self.assertEqual([t.value() for _, t in self.endpoints.by_port[2382].connected], [b""])
        dcs.close()


class WatchTests(_Scripted):
    """
    Watches against scripted streams.
    """

    def start(self) -> tuple[Any, list[str], list[str]]:
        events: list[str] = []
        errors: list[str] = []
        watch = self.dcs.watch(lambda: events.append("change"), lambda e: errors.append(str(e)))
        return watch, events, errors

    def stream(self, *objects: Any, status: int = 200) -> Any:
        protocol, transport, body = self.pending()
        self.assertIn(b"grpc-metadata-hasleader: true", self.last_head.lower())
        self.assertEqual(body["create_request"]["key"], b64(b"/rmqha/g/"))
        first = b"".join(json.dumps(o).encode() + b"\n" for o in objects)
        protocol.dataReceived(http(status, first, chunked=True, end=False))
        return protocol

    def test_created_and_events(self) -> None:
        """
        C{created} calls on_change once; a chunk with events calls it once
        more, however many events or lines it holds.
        """
        watch, events, errors = self.start()
        protocol = self.stream({"result": {"header": header(), "created": True}})
        self.assertEqual(events, ["change"])
        event = {"result": {"header": header(), "events": [{"kv": {}}, {"type": "DELETE", "kv": {}}]}}
        line = json.dumps(event).encode() + b"\n"
        protocol.dataReceived(b"%x\r\n%s\r\n" % (2 * len(line), line * 2))
        self.assertEqual(events, ["change", "change"])
        self.assertEqual(errors, [])
        watch.stop()

    def test_endless_line_restarts(self) -> None:
        """
        A line that never ends (over the limit) is an error; the watch
        restarts after 0.1 s with a new stream.
        """
        watch, events, errors = self.start()
        protocol = self.stream({"result": {"header": header(), "created": True}})
        chunk = b"x" * (MAX_LINE // 2)
        for _ in range(3):
            protocol.dataReceived(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        self.assertEqual(len(errors), 1)
        self.assertIn("longer than", errors[0])
        self.assertIn("/v3/watch", errors[0])
        self.clock.advance(0.1)
        self.stream({"result": {"header": header(), "created": True}})
        self.assertEqual(events, ["change", "change"])
        watch.stop()

    def test_canceled_and_errors_back_off(self) -> None:
        """
        A canceled watch (compacted), an in-band error and a stream end
        are each reported once, and the restarts back off 0.1, 0.2, 0.4 s.
        """
        watch, events, errors = self.start()
        self.stream({"result": {"header": header(), "created": True}, },
                    {"result": {"header": header(), "canceled": True, "compact_revision": "7"}})
        self.assertIn("canceled (compacted at revision 7)", errors[-1])
        self.clock.advance(0.1)
        self.stream({"error": {"grpc_code": 14, "http_code": 503, "message": "etcdserver: no leader"}})
        self.assertIn("etcdserver: no leader (code 14)", errors[-1])
        self.clock.advance(0.19)
        self.assertEqual(len(errors), 2)
        self.clock.advance(0.01)
        protocol = self.stream()
        protocol.dataReceived(b"0\r\n\r\n")
        self.assertIn("the watch stream ended", errors[-1])
        self.assertEqual(len(errors), 3)
        self.clock.advance(0.4)
        self.stream({"result": {"header": header(), "created": True}})
        watch.stop()

    def test_refused_http_status(self) -> None:
        """
        A watch answered with an HTTP error is reported with etcd's message.
        """
        watch, events, errors = self.start()
        protocol, transport, _ = self.pending()
        protocol.dataReceived(http(503, b'{"message":"etcdserver: no leader","code":14}'))
        self.assertEqual(errors, ["etcd http://127.0.0.1:2379: /v3/watch: HTTP 503: etcdserver: no leader (code 14)"])
        watch.stop()

    def test_stop_silences(self) -> None:
        """
        After stop() nothing is called back and no restart is pending,
        even for data already on its way.
        """
        watch, events, errors = self.start()
        protocol = self.stream({"result": {"header": header(), "created": True}})
        watch.stop()
        line = json.dumps({"result": {"header": header(), "events": [{}]}}).encode() + b"\n"
        protocol.dataReceived(b"%x\r\n%s\r\n" % (len(line), line))
        self.assertEqual((events, errors), (["change"], []))
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_silent_member_times_out(self) -> None:
        """
        A member that accepts the watch but never answers is given up
        after the request timeout, reported, and the watch restarts.
        """
        watch, events, errors = self.start()
        self.pending()
        self.clock.advance(1.0)
        self.assertEqual(len(errors), 1)
        self.assertIn("no answer within 1 s", errors[0])
        watch.stop()
