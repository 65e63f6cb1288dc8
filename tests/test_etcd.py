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
    AUTH_RETRY,
    MAX_LINE,
    PASSWORD_ENV,
    Credentials,
    EtcdDCS,
    LineSplitter,
    _Bad,
    parse_coordinator,
    prefix_range,
    read_credentials,
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

    def test_values_type_checked(self) -> None:
        """
        decode() checks every field of every key's dataclass by its
        declared type (a new field's type must be known here), and takes
        what encode() writes.
        """
        from dataclasses import fields

        from rmqha.coord.dcs import _FIELD_CHECKS, Switchover, decode

        for value in (
            Leader("a", 2, "h:1", "h:2"), InSync(3, ("a", "b")),
            Member("a", "h:1", None, "master", 4, 5, "ok", False), Switchover("b", "a", 1.5),
        ):
            kind = type(value)
            for spec in fields(kind):
                if spec.name not in ("revision", "lease"):
                    self.assertIn(str(spec.type), _FIELD_CHECKS, (kind, spec.name))
            self.assertEqual(decode(kind, encode(value), 9), value)
        for data, words in [
            (b'{"node_id":"a","epoch":true,"ha":"h"}', "epoch is not a non-negative integer"),
            (b'{"node_id":"a","epoch":-1,"ha":"h"}', "epoch is not a non-negative integer"),
            (b'{"node_id":"a","epoch":1.5,"ha":"h"}', "epoch is not a non-negative integer"),
            (b'{"node_id":"a","epoch":1}', "no ha"),
            (b'{"node_id":"a","epoch":1,"ha":"h","revision":5}', "unknown field 'revision'"),
            (b'{"node_id":"a","epoch":1,"ha":"h","http":7}', "http is not a string or null"),
        ]:
            with self.assertRaises(DCSError) as caught:
                decode(Leader, data, 1)
            self.assertIn(words, str(caught.exception))

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


class CredentialTests(SynchronousTestCase):
    """
    C{user=} and C{passwordFile=} in the spec, and where the password is
    read from (never the command line, never shown).
    """

    def password_file(self, data: bytes) -> str:
        path = self.mktemp()
        with open(path, "wb") as f:
            f.write(data)
        return path

    def test_spec_options(self) -> None:
        """
        C{user=NAME} and C{passwordFile=PATH} are spec options (or keyword
        arguments); the spec's text, and so every message, shows neither.
        """
        spec = parse_coordinator("etcd:https://e1:2379,user=node-a,passwordFile=/etc/p,tlsCa=/ca")
        self.assertEqual((spec.user, spec.password_file), ("node-a", "/etc/p"))
        self.assertEqual(str(spec), "etcd:https://e1:2379")
        spec = parse_coordinator("etcd:http://e1:2379", user="u", password_file="/p")
        self.assertEqual((spec.user, spec.password_file), ("u", "/p"))

    def test_bad_credential_options(self) -> None:
        """
        A password file without a user, a user name with a space, and a
        password given in the spec are refused with one line that never
        repeats the password; so are credentials in a URL (shown as ***).
        """
        for spec, words in [
            ("etcd:http://h:1,passwordFile=/p", "passwordFile= needs user=NAME"),
            ("etcd:http://h:1,user=a b", "user= must be a name"),
            ("etcd:http://h:1,user=a,password=s3cret", "never given in the spec"),
            ("etcd:http://h:1,Password=s3cret", "never given in the spec"),
            ("etcd:http://root:s3cret@h:1", "***@h:1"),
            ("zk:http://h:1,password=s3cret", "password=***"),
        ]:
            with self.assertRaises(ValueError) as caught:
                parse_coordinator(spec)
            message = str(caught.exception)
            self.assertIn(words, message, spec)
            self.assertNotIn("s3cret", message)
            self.assertNotIn("\n", message)

    def test_password_file(self) -> None:
        """
        The password is the file's content, one final line break dropped
        (LF or CRLF); spaces inside it are kept; C{repr} never shows it.
        """
        for data, password in [(b"pw\n", "pw"), (b"p w\r\n", "p w"), (b" pw", " pw")]:
            path = self.password_file(data)
            spec = parse_coordinator(f"etcd:http://h:1,user=u,passwordFile={path}")
            credentials = read_credentials(spec, environ={})
            assert credentials is not None
            self.assertEqual((credentials.user, credentials.password), ("u", password))
            self.assertNotIn(password.strip(), repr(credentials))

    def test_password_from_environment(self) -> None:
        """
        Without C{passwordFile=}, the password comes from
        RMQHA_ETCD_PASSWORD; the file wins when both are given; no user,
        no credentials.
        """
        spec = parse_coordinator("etcd:http://h:1,user=u")
        credentials = read_credentials(spec, environ={PASSWORD_ENV: "from-env"})
        self.assertEqual(credentials, Credentials("u", "from-env"))
        path = self.password_file(b"from-file")
        spec = parse_coordinator(f"etcd:http://h:1,user=u,passwordFile={path}")
        credentials = read_credentials(spec, environ={PASSWORD_ENV: "from-env"})
        assert credentials is not None
        self.assertEqual(credentials.password, "from-file")
        self.assertIsNone(read_credentials(parse_coordinator("etcd:http://h:1"), {PASSWORD_ENV: "x"}))

    def test_unusable_passwords(self) -> None:
        """
        A missing, empty, multi-line, oversized or non-UTF-8 password file,
        or a user with no password anywhere: one line naming the option,
        never the password; EtcdDCS refuses the same way when it is made.
        """
        directory = self.mktemp()
        import os

        os.makedirs(directory)
        cases = [
            (f"{directory}/missing", "passwordFile {path}: No such file or directory"),
            (directory, "passwordFile {path}: Is a directory"),
            (self.password_file(b""), "passwordFile {path}: the password is empty"),
            (self.password_file(b"\n"), "passwordFile {path}: the password is empty"),
            (self.password_file(b"s3cret\nmore\n"), "passwordFile {path}: expected one line"),
            (self.password_file(b"s3cret" * 200), "expected one line of at most 1024 bytes"),
            (self.password_file(b"s3cret\xff"), "passwordFile {path}: the password is not UTF-8"),
        ]
        for path, words in cases:
            spec = parse_coordinator(f"etcd:http://h:1,user=u,passwordFile={path}")
            for make in (
                lambda: read_credentials(spec, environ={}),
                lambda: EtcdDCS(MemoryReactorClock(), spec, "g", environ={}),
            ):
                with self.assertRaises(ValueError) as caught:
                    make()
                message = str(caught.exception)
                self.assertIn(words.format(path=path), message)
                self.assertTrue(message.startswith("--coordinator: "), message)
                self.assertNotIn("s3cret", message)
                self.assertNotIn("\n", message)
        with self.assertRaises(ValueError) as caught:
            read_credentials(parse_coordinator("etcd:http://h:1,user=u"), environ={PASSWORD_ENV: ""})
        self.assertEqual(
            str(caught.exception),
            "--coordinator: user=u needs passwordFile=PATH (or RMQHA_ETCD_PASSWORD in the environment)",
        )


def _auth_ok(token: str = "tok.1") -> bytes:
    return http(200, json.dumps({"header": header(), "token": token}).encode())


_INVALID_TOKEN = http(
    401, b'{"error":"etcdserver: invalid auth token","message":"etcdserver: invalid auth token","code":16}'
)


class _AuthScripted(_Scripted):
    """
    A client with a user (its password from the environment); nothing it
    logs may show the password or a token.
    """

    def setUp(self) -> None:
        super().setUp()
        self.logged: list[str] = []
        from twisted.logger import formatEvent, globalLogPublisher

        def observe(event: dict[str, Any]) -> None:
            self.logged.append(formatEvent(event))

        globalLogPublisher.addObserver(observe)
        self.addCleanup(globalLogPublisher.removeObserver, observe)
        self.dcs.close()
        self.dcs = self.make(
            "etcd:http://127.0.0.1:2379,user=node-a", environ={PASSWORD_ENV: "s3cret"}
        )

    def tearDown(self) -> None:
        super().tearDown()
        for line in self.logged:
            self.assertNotIn("s3cret", line)
            self.assertNotIn("tok.", line)

    def authorization(self) -> bytes | None:
        for line in self.last_head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"authorization":
                return value.strip()
        return None

    def authenticate(self, token: str = "tok.1") -> None:
        """
        Answer the authentication the client must be making now.
        """
        body = self.answer(_auth_ok(token))
        self.assertIn(b"POST /v3/auth/authenticate", self.last_head)
        self.assertEqual(body, {"name": "node-a", "password": "s3cret"})
        self.assertIsNone(self.authorization())


class AuthTests(_AuthScripted):
    """
    etcd's auth: a token from /v3/auth/authenticate on every request,
    renewed when etcd refuses it, against scripted answers.
    """

    def test_token_on_every_request(self) -> None:
        """
        The first call authenticates, then sends its request with the
        token in C{Authorization}; later calls (unary and keepalive) reuse
        it without authenticating again.
        """
        d = self.dcs.load()
        self.authenticate()
        self.ok({"header": header()})
        self.assertIn(b"POST /v3/kv/range", self.last_head)
        self.assertEqual(self.authorization(), b"tok.1")
        self.successResultOf(d)
        d = self.dcs.resign(Leader("a", 1, "h:1", revision=5))
        self.ok({"header": header(), "succeeded": True})
        self.assertIn(b"POST /v3/kv/txn", self.last_head)
        self.assertEqual(self.authorization(), b"tok.1")
        self.assertTrue(self.successResultOf(d))
        ok = self.dcs.keepalive(Lease(77, 2))
        line = json.dumps({"result": {"header": header(), "ID": "77", "TTL": "2"}}).encode() + b"\n"
        self.answer(http(200, line, chunked=True, end=False))
        self.assertEqual(self.authorization(), b"tok.1")
        self.assertEqual(self.successResultOf(ok), 2)

    def test_concurrent_calls_share_one_authentication(self) -> None:
        """
        Calls made while an authentication is under way wait for it: one
        authentication, then each call with the token.
        """
        first, second = self.dcs.load(), self.dcs.grant(2)
        self.authenticate()
        self.assertEqual(
            sum(b"/v3/auth/authenticate" in t.value() for _, t in self.endpoints.by_port[2379].connected), 0
        )
        heads = []
        for _ in range(2):
            protocol, transport, body = self.pending()
            heads.append(self.last_head)
            self.assertEqual(self.authorization(), b"tok.1")
            answer = {"header": header(), "ID": "9", "TTL": "2"} if "TTL" in body else {"header": header()}
            protocol.dataReceived(http(200, json.dumps(answer).encode()))
        self.successResultOf(first)
        self.assertEqual(self.successResultOf(second), Lease(9, 2))

    def test_expired_token_renewed_and_request_sent_again(self) -> None:
        """
        etcd answers 401 "invalid auth token" (the token expired, was
        revoked, or auth was re-enabled): the client authenticates again
        and sends the same request once more, within the same call; a
        txn too, since etcd refused it before applying anything.
        """
        d = self.dcs.load()
        self.authenticate()
        self.ok({"header": header()})
        self.successResultOf(d)
        d = self.dcs.resign(Leader("a", 1, "h:1", revision=5))
        first = self.answer(_INVALID_TOKEN)
        self.assertEqual(self.authorization(), b"tok.1")
        self.authenticate("tok.2")
        again = self.ok({"header": header(), "succeeded": True})
        self.assertIn(b"POST /v3/kv/txn", self.last_head)
        self.assertEqual((again, self.authorization()), (first, b"tok.2"))
        self.assertTrue(self.successResultOf(d))
        self.assertTrue(any("authenticated as node-a" in line for line in self.logged))

    def test_token_renewed_once_per_call(self) -> None:
        """
        A token refused again right after a new one was taken is an
        error, not a loop: two requests and one authentication per call.
        """
        d = self.dcs.resign(Leader("a", 1, "h:1", revision=5))
        self.authenticate()
        self.answer(_INVALID_TOKEN)
        self.authenticate("tok.2")
        self.answer(_INVALID_TOKEN)
        failure = self.failureResultOf(d, DCSError)
        self.assertEqual(
            str(failure.value),
            "etcd http://127.0.0.1:2379: /v3/kv/txn: HTTP 401: etcdserver: invalid auth token "
            "(code 16) (user node-a)",
        )
        self.assertEqual(
            [t.value() for _, t in self.endpoints.by_port[2379].connected if t.value()], []
        )

    def test_unknown_outcome_still_not_sent_again(self) -> None:
        """
        With a user, a txn whose outcome is unknown (HTTP 500) is still
        never sent again, and the token is kept.
        """
        d = self.dcs.resign(Leader("a", 1, "h:1", revision=5))
        self.authenticate()
        self.answer(http(500, b'{"message":"context deadline exceeded","code":2}'))
        self.assertIn("HTTP 500", str(self.failureResultOf(d, DCSError).value))
        d = self.dcs.load()
        self.ok({"header": header()})
        self.assertEqual(self.authorization(), b"tok.1")
        self.successResultOf(d)

    def test_wrong_password(self) -> None:
        """
        etcd refusing the user or password is one line naming the
        endpoint, the route, etcd's reason and the user (never the
        password); calls in the next AUTH_RETRY seconds fail at once
        without asking etcd (no storm of password checks); after that,
        the next call authenticates again.
        """
        d = self.dcs.load()
        self.answer(http(400, b'{"error":"etcdserver: authentication failed, invalid user ID or password",'
                              b'"message":"etcdserver: authentication failed, invalid user ID or password","code":3}'))
        message = (
            "etcd http://127.0.0.1:2379: /v3/auth/authenticate: HTTP 400: etcdserver: "
            "authentication failed, invalid user ID or password (code 3) (user node-a)"
        )
        self.assertEqual(str(self.failureResultOf(d, DCSError).value), message)
        self.clock.advance(AUTH_RETRY - 0.1)
        for call in (self.dcs.load(), self.dcs.grant(2)):
            self.assertEqual(str(self.failureResultOf(call, DCSError).value), message)
        errors: list[str] = []
        watch = self.dcs.watch(lambda: None, lambda e: errors.append(str(e)))
        self.assertEqual(errors, [message])
        watch.stop()
        self.assertEqual(
            [t.value() for _, t in self.endpoints.by_port[2379].connected if t.value()], []
        )
        self.clock.advance(0.1)
        d = self.dcs.load()
        self.authenticate()
        self.ok({"header": header()})
        self.successResultOf(d)

    def test_permission_denied(self) -> None:
        """
        A user without permission on the group's prefix: 403 is one line
        naming the user, with no new authentication.
        """
        d = self.dcs.load()
        self.authenticate()
        self.answer(http(403, b'{"error":"etcdserver: permission denied","message":"etcdserver: permission denied","code":7}'))
        self.assertEqual(
            str(self.failureResultOf(d, DCSError).value),
            "etcd http://127.0.0.1:2379: /v3/kv/range: HTTP 403: etcdserver: permission denied "
            "(code 7) (user node-a)",
        )
        d = self.dcs.load()
        self.ok({"header": header()})
        self.assertEqual(self.authorization(), b"tok.1")
        self.successResultOf(d)

    def test_auth_not_enabled_then_enabled(self) -> None:
        """
        A user set while etcd's auth is off (412, as etcd's own client):
        requests go without a token; once auth is enabled ("user name is
        empty"), the client authenticates and sends the request again.
        """
        d = self.dcs.load()
        self.answer(http(412, b'{"error":"etcdserver: authentication is not enabled",'
                              b'"message":"etcdserver: authentication is not enabled","code":9}'))
        self.ok({"header": header()})
        self.assertIsNone(self.authorization())
        self.successResultOf(d)
        d = self.dcs.load()
        self.answer(http(400, b'{"error":"etcdserver: user name is empty","message":"etcdserver: user name is empty","code":3}'))
        self.assertIsNone(self.authorization())
        self.authenticate()
        self.ok({"header": header()})
        self.assertEqual(self.authorization(), b"tok.1")
        self.successResultOf(d)

    def test_no_user_but_etcd_wants_one(self) -> None:
        """
        Without a user, etcd's "user name is empty" is one line saying
        how to give one.
        """
        dcs = self.make("etcd:http://127.0.0.1:2384")
        d = dcs.load()
        self.answer(http(400, b'{"error":"etcdserver: user name is empty","message":"etcdserver: user name is empty","code":3}'), port=2384)
        self.assertEqual(
            str(self.failureResultOf(d, DCSError).value),
            "etcd http://127.0.0.1:2384: /v3/kv/range: HTTP 400: etcdserver: user name is empty "
            "(code 3); etcd wants a user: add user=NAME,passwordFile=PATH to --coordinator",
        )
        dcs.close()

    def test_authentication_within_the_deadline(self) -> None:
        """
        An authentication that is not answered costs the call its one
        deadline, not one more: the call fails at 1 s, naming the route.
        """
        d = self.dcs.load()
        self.pending()
        self.clock.advance(0.99)
        self.assertNoResult(d)
        self.clock.advance(0.02)
        self.assertEqual(
            str(self.failureResultOf(d, DCSError).value),
            "etcd http://127.0.0.1:2379: /v3/auth/authenticate: no answer within 1 s",
        )

    def test_bad_token_answer_not_quoted(self) -> None:
        """
        An authentication answer that is not JSON, or whose token is not
        a short printable string, is an error that quotes nothing of it.
        """
        d = self.dcs.load()
        self.answer(http(200, b"tok.secret-ish garbage"))
        message = str(self.failureResultOf(d, DCSError).value)
        self.assertIn("/v3/auth/authenticate: the answer is not a JSON object (not quoted)", message)
        self.assertNotIn("garbage", message)
        d = self.dcs.load()
        self.answer(http(200, json.dumps({"header": header(), "token": "tok.1\r\nX: y"}).encode()))
        self.assertIn("the answer has no usable token", str(self.failureResultOf(d, DCSError).value))

    def test_close_while_authenticating(self) -> None:
        """
        Closing the client during an authentication ends it: the waiting
        call fails with a DCSError, no other endpoint is tried and no
        timer is left.
        """
        self.dcs.close()
        self.dcs = self.make(
            "etcd:http://127.0.0.1:2379,http://127.0.0.1:2385,user=node-a",
            environ={PASSWORD_ENV: "s3cret"},
        )
        d = self.dcs.load()
        self.pending()
        self.dcs.close()
        self.failureResultOf(d, DCSError)
        self.assertNotIn(2385, self.endpoints.by_port)


class AuthWatchTests(_AuthScripted):
    """
    Watches with a user.
    """

    def created(self) -> bytes:
        return json.dumps({"result": {"header": header(), "created": True}}).encode() + b"\n"

    def refused(self) -> bytes:
        return json.dumps({"result": {
            "header": header(), "watch_id": "-1", "created": True, "canceled": True,
            "cancel_reason": "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token",
        }}).encode() + b"\n"

    def test_watch_carries_the_token_and_renews_it(self) -> None:
        """
        The watch request carries the token; a watch etcd cancels at once
        for its token is started again with a new one at once, without an
        error reported; a second refusal in a row is reported.
        """
        events: list[str] = []
        errors: list[str] = []
        watch = self.dcs.watch(lambda: events.append("change"), lambda e: errors.append(str(e)))
        self.authenticate()
        protocol, transport, body = self.pending()
        self.assertIn(b"POST /v3/watch", self.last_head)
        self.assertEqual(self.authorization(), b"tok.1")
        protocol.dataReceived(http(200, self.refused(), chunked=True, end=False))
        self.assertEqual((events, errors), ([], []))
        self.clock.advance(0)
        self.authenticate("tok.2")
        protocol, transport, body = self.pending()
        self.assertEqual(self.authorization(), b"tok.2")
        protocol.dataReceived(http(200, self.refused(), chunked=True, end=False))
        self.assertEqual(len(errors), 1)
        self.assertIn("/v3/watch: the watch was canceled: rpc error: code = Unauthenticated", errors[0])
        self.clock.advance(0.1)
        self.authenticate("tok.3")
        protocol, transport, body = self.pending()
        protocol.dataReceived(http(200, self.created(), chunked=True, end=False))
        self.assertEqual(events, ["change"])
        watch.stop()

    def test_permission_denied_watch_reported(self) -> None:
        """
        A watch canceled for permission (a user without the prefix) is
        reported at once, with etcd's reason.
        """
        errors: list[str] = []
        watch = self.dcs.watch(lambda: None, lambda e: errors.append(str(e)))
        self.authenticate()
        protocol, _, _ = self.pending()
        protocol.dataReceived(http(200, json.dumps({"result": {
            "header": header(), "watch_id": "-1", "created": True, "canceled": True,
            "cancel_reason": "rpc error: code = PermissionDenied desc = etcdserver: permission denied",
        }}).encode() + b"\n", chunked=True, end=False))
        self.assertEqual(len(errors), 1)
        self.assertIn("etcdserver: permission denied", errors[0])
        watch.stop()
