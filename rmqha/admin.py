# -*- test-case-name: tests.test_admin -*-
"""
The admin HTTP interface (twisted.web), served on C{--http ENDPOINT}:

    GET  /status                      JSON: offsets, and each slave or the master
                                      (in failover mode, where etcd is only for
                                      a verified client certificate)
    GET  /metrics                     the same figures as Prometheus text
    POST /topics/{topic}/messages     the request body becomes one message
                                      (query: queueId, tags, keys)
    GET  /commitlog                   with --serve-commitlog RATE: the
                                      segment files and the max offset
    GET  /commitlog/{segment}         a segment's bytes (one Range), read-only,
                                      paced at RATE for all readers together

Every answer, errors included, is JSON C{{"status": ..., "error": ...}}
with a 4xx/5xx code; see docs/admin.md for the statuses and limits.

The HTTP layer is bounded for a peer nobody has authenticated (the port
may be reachable by anyone): a body over L{MAX_REQUEST_BODY} is refused
by its C{Content-Length} before a byte of it is read, a chunked body is
cut off as it passes the limit, bodies are kept in memory (never a temp
file), and the request line and headers must arrive within
L{HEADER_TIMEOUT} seconds however slowly they trickle.  L{make_site} builds
the one C{Site} the broker serves (a connection limiter may wrap it).
"""

from __future__ import annotations

import json
from io import BytesIO
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.python.reflect import prefixedMethodNames
from twisted.web.http import RESPONSES, HTTPChannel
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from rmqha._commitlog_http import (
    RETRY_AFTER,
    CommitLogServer,
    RangeNotSatisfiable,
    SegmentStream,
    parse_range,
)
from rmqha.store._record import DEFAULT_MAX_MESSAGE_SIZE
from rmqha._ports import Port, listen
from rmqha.broker import Broker, NotStoredError
from rmqha.store._record import Message, MessageRejected
from rmqha.ha.group import PutMessageResult, PutStatus
from rmqha.tls import PeerPolicy, admin_exposure_warning, commitlog_exposure_warning

__all__ = [
    "AdminService",
    "AdminRoot",
    "status",
    "make_site",
    "MAX_REQUEST_BODY",
    "HEADER_TIMEOUT",
    "IDLE_TIMEOUT",
]

#: The largest request body read: RocketMQ's maxMessageSize (4 MiB) plus
#: room, so that a body a little too large is still read and refused by
#: the store with the limit named (400 MESSAGE_ILLEGAL), and anything
#: larger is refused unread (413).
MAX_REQUEST_BODY = DEFAULT_MAX_MESSAGE_SIZE + 64 * 1024
#: Seconds in which a request line and its headers must arrive, counted
#: from the connection (or the previous answer): trickling them a byte at
#: a time does not extend it.
HEADER_TIMEOUT = 10.0
#: Seconds a connection may stay silent (between requests, or in a body).
IDLE_TIMEOUT = 60.0

#: Methods HTTP defines (RFC 9110, and PATCH): 405 where not served, 501
#: for any other.
_KNOWN_METHODS = frozenset(
    [b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"CONNECT", b"OPTIONS", b"TRACE", b"PATCH"]
)



def status(broker: Broker) -> dict[str, Any]:
    """
    What C{GET /status} answers.
    """
    commitlog = broker.commitlog
    result: dict[str, Any] = {
        "role": broker.role.value,
        "min_offset": commitlog.min_offset,
        "max_offset": commitlog.max_offset,
        "flushed_offset": commitlog.flushed_offset,
        # The background scrub and what it found (docs/store.md, "Scrub").
        "scrub": broker.scrub.status(),
    }
    if broker.role.is_master:
        result["slaves"] = [
            {
                "peer": s.peer,
                "ack_offset": s.ack_offset,
                "lag_bytes": s.lag_bytes,
                "bytes_per_s": round(s.bytes_per_s, 1),
                "connected_since": s.connected_since,
                "transport": s.transport,
                "identity": s.identity,
                "framing": s.framing,
                "replica_id": s.replica_id,
                # Failover: it proved replica_id as the group requires
                # (the group secret, or a certificate naming it).
                "authenticated": s.authenticated,
            }
            for s in sorted(broker.slaves(), key=lambda s: s.peer)
        ]
        # Why every put is refused (a segment file changed under the
        # store: docs/store.md), or null.
        result["problem"] = broker.problem
    else:
        factory = broker.slave_factory
        connection = factory.connection if factory else None
        result["master"] = broker.master_endpoint
        result["connected"] = connection is not None
        result["lag_bytes"] = 0 if connection is not None and connection.caught_up else None
        # Checked framing: CRC-32 on every frame and report (docs/protocol.md).
        result["framing"] = "checked" if factory is not None and factory.checked else "classic"
        # Replication is halted on this, when set (docs/reliability.md).
        result["divergence"] = broker.divergence.as_dict() if broker.divergence else None
        # Checks of the master that could not finish, in a row (retried).
        result["failed_checks"] = broker.failed_checks
        # Failover: cuts back to the newest epoch shared with the master
        # (docs/failover.md), and the bytes they moved to quarantine.
        result["epoch_truncations"] = broker.epoch_truncations
        result["epoch_truncated_bytes"] = broker.epoch_truncated_bytes
        # What the master is (rmqha, rocketmq, or null while unknown), and
        # why replication is not running, if it is not (docs/protocol.md).
        result["master_kind"] = broker.master_kind
        result["problem"] = broker.problem
    if broker.coordinator is not None:
        # Failover mode (docs/failover.md): the group, its master, epochs,
        # the in-sync set and the last election.
        failover = broker.coordinator.status()
        # How members prove their node ids to each other (docs/failover.md,
        # "Who counts"); "none" with --insecure-group, which start warns of.
        auth = broker.group_auth
        failover["auth"] = auth.mode if auth is not None else "none (--insecure-group)"
        result["failover"] = failover
    return result


def hide_coordinator(failover: dict[str, Any]) -> dict[str, Any]:
    """
    C{failover} (L{status}'s) as a caller without a verified client
    certificate sees it: where the coordinator is, and its errors (which
    name it), are hidden; whether it answers is not.
    """
    shown = dict(failover)
    kind = str(failover.get("coordinator") or "").partition(":")[0] or "coordinator"
    shown["coordinator"] = f"{kind} (hidden)"
    if failover.get("coordinator_error") is not None:
        shown["coordinator_error"] = "(hidden: the coordinator does not answer; see the log)"
    return shown


def certificate_verified(request: Request) -> bool:
    """
    Whether C{request} came over TLS from a client whose certificate the
    admin port verified: the port requires client certificates from its
    CA (L{PeerPolicy.require_client_cert}), and the certificate passes
    C{--http-allowed-peers} when that is set.
    """
    channel = getattr(request, "channel", None)
    policy = getattr(channel, "peer_policy", None)
    if not isinstance(policy, PeerPolicy) or not policy.require_client_cert:
        return False
    get_certificate = getattr(getattr(channel, "transport", None), "getPeerCertificate", None)
    x509 = get_certificate() if get_certificate is not None else None
    if x509 is None:
        return False
    _, refusal = policy.check(x509.to_cryptography())
    return refusal is None


def master_hint(broker: Broker) -> dict[str, Any] | None:
    """
    Failover mode: where the elected master is, for a client that asked
    a slave.
    """
    coordinator = broker.coordinator
    if coordinator is None:
        return None
    master = coordinator.status().get("master")
    if not master or master.get("node_id") == coordinator.settings.node_id:
        return None
    return {"node_id": master["node_id"], "http": master["http"], "epoch": master["epoch"]}


def _json(request: Request, code: int, body: dict[str, Any]) -> bytes:
    request.setResponseCode(code)
    request.setHeader(b"content-type", b"application/json")
    return json.dumps(body).encode() + b"\n"


def _error(request: Request, code: int, status: str, error: str, **extra: Any) -> bytes:
    return _json(request, code, {"status": status, "error": error, **extra})


def _raw_error(code: int, status: str, error: str) -> bytes:
    """
    A whole HTTP/1.1 answer closing the connection, for errors found
    before there is a request to answer through (the channel's own).
    """
    body = json.dumps({"status": status, "error": error}).encode() + b"\n"
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n"
        % (code, RESPONSES.get(code, b"Error"), len(body))
    ) + body


class _AdminResource(Resource):
    """
    A resource answering a method it does not serve with JSON: 405 (with
    C{Allow}) for a method HTTP defines, 501 for any other; 404 where
    nothing is served at all.
    """

    def __init__(self) -> None:
        Resource.__init__(self)

    def render(self, request: Request) -> bytes | int:
        method = request.method
        allowed = [
            name.encode("ascii")
            for name in prefixedMethodNames(type(self), "render_")
            if name != "HEAD" or hasattr(self, "render_GET")
        ]
        if method not in allowed:
            if method not in _KNOWN_METHODS:
                shown = method.decode("ascii", "replace")
                return _error(request, 501, "NOT_IMPLEMENTED", f"unknown method {shown!r}")
            path = request.path.decode("utf-8", "replace")
            if not allowed:
                return _error(request, 404, "NOT_FOUND", f"no resource at {path}")
            request.setHeader(b"allow", b", ".join(sorted(allowed)))
            return _error(
                request,
                405,
                "METHOD_NOT_ALLOWED",
                f"{method.decode('ascii')} is not allowed on {path} "
                f"(allowed: {', '.join(a.decode() for a in sorted(allowed))})",
            )
        result: bytes | int = Resource.render(self, request)
        return result


class _Status(_AdminResource):
    isLeaf = True

    def __init__(self, broker: Broker, commitlog: CommitLogServer | None = None) -> None:
        super().__init__()
        self._broker = broker
        self._commitlog = commitlog

    def render_GET(self, request: Request) -> bytes:
        result = status(self._broker)
        failover = result.get("failover")
        if failover is not None and not certificate_verified(request):
            result["failover"] = hide_coordinator(failover)
        # Bytes/s GET /commitlog/{segment} is paced at (0: not served).
        result["serve_commitlog"] = self._commitlog.rate if self._commitlog else 0
        return _json(request, 200, result)


class _BrokerCollector(Collector):
    """
    Reads the broker's figures at scrape time.
    """

    def __init__(self, broker: Broker, served: CommitLogServer | None = None) -> None:
        self._broker = broker
        self._served = served

    def collect(self) -> Iterator[Metric]:
        broker = self._broker
        commitlog = broker.commitlog
        for name, value, text in [
            ("rmqha_commitlog_min_offset", commitlog.min_offset, "oldest offset held"),
            ("rmqha_commitlog_max_offset", commitlog.max_offset, "offset one past the last byte"),
            ("rmqha_commitlog_flushed_offset", commitlog.flushed_offset, "offset known to be on disk"),
        ]:
            yield GaugeMetricFamily(name, text, value=value)
        yield CounterMetricFamily(
            "rmqha_http_commitlog_bytes",
            "commit-log bytes sent by GET /commitlog/{segment} (--serve-commitlog)",
            value=self._served.bytes_served if self._served else 0,
        )
        yield from _scrub_metrics(broker)
        if broker.coordinator is not None:
            yield from _failover_metrics(broker.coordinator.status())
        if broker.role.is_master:
            yield CounterMetricFamily("rmqha_puts", "messages put", value=broker.puts)
            statuses = CounterMetricFamily(
                "rmqha_put_results", "puts by PutMessageStatus", labels=["status"]
            )
            for put_status, count in broker.put_statuses.items():
                statuses.add_metric([put_status.value], count)
            yield statuses
            waits = broker.replication_wait
            yield HistogramMetricFamily(
                "rmqha_replication_wait_seconds",
                "how long SYNC_MASTER puts waited for their slaves",
                buckets=waits.cumulative(),
                sum_value=waits.total,
            )
            yield CounterMetricFamily("rmqha_put_bytes", "record bytes put", value=broker.put_bytes)
            slaves = broker.slaves()
            yield GaugeMetricFamily("rmqha_slaves_connected", "connected slaves", value=len(slaves))
            ack = GaugeMetricFamily("rmqha_slave_ack_offset", "slave's acknowledged offset", labels=["peer"])
            lag = GaugeMetricFamily("rmqha_slave_lag_bytes", "master max offset minus slave ack", labels=["peer"])
            rate = GaugeMetricFamily("rmqha_slave_bytes_per_second", "slave ack rate", labels=["peer"])
            for s in slaves:
                if s.ack_offset is not None and s.lag_bytes is not None:
                    ack.add_metric([s.peer], s.ack_offset)
                    lag.add_metric([s.peer], s.lag_bytes)
                rate.add_metric([s.peer], s.bytes_per_s)
            yield ack
            yield lag
            yield rate
            yield _checksum_failures(broker.master_factory)
        else:
            factory = broker.slave_factory
            connected = factory is not None and factory.connection is not None
            yield GaugeMetricFamily("rmqha_master_connected", "1 while connected to the master", value=int(connected))
            yield CounterMetricFamily(
                "rmqha_replicated_bytes", "commit-log bytes received from the master",
                value=factory.bytes_received if factory else 0,
            )
            yield CounterMetricFamily(
                "rmqha_master_connections", "connections made to the master",
                value=factory.connections_made if factory else 0,
            )
            halted = GaugeMetricFamily(
                "rmqha_divergence",
                "1 while replication is halted on a divergence of this kind",
                labels=["kind"],
            )
            found = CounterMetricFamily(
                "rmqha_divergences", "divergences found, by kind", labels=["kind"]
            )
            for kind, count in sorted(broker.divergences.items()):
                current = broker.divergence is not None and broker.divergence.kind == kind
                halted.add_metric([kind], int(current))
                found.add_metric([kind], count)
            yield halted
            yield found
            yield _checksum_failures(factory)
            yield CounterMetricFamily(
                "rmqha_rejected_records",
                "replicated records that failed validation (cut, fetched again)",
                value=factory.rejected_records if factory else 0,
            )
            yield CounterMetricFamily(
                "rmqha_epoch_truncations",
                "times the log was cut back to the newest epoch shared with the master",
                value=broker.epoch_truncations,
            )
            yield CounterMetricFamily(
                "rmqha_epoch_truncated_bytes",
                "bytes those cuts moved to quarantine",
                value=broker.epoch_truncated_bytes,
            )
            yield GaugeMetricFamily(
                "rmqha_failed_checks",
                "checks of the master (control session) that could not finish, in a row",
                value=broker.failed_checks,
            )


def _failover_metrics(status: dict[str, Any]) -> Iterator[Metric]:
    """
    Failover mode's figures (docs/failover.md).
    """
    yield GaugeMetricFamily(
        "rmqha_failover_is_master", "1 while this node is the elected master",
        value=int(status["is_master"]),
    )
    yield GaugeMetricFamily(
        "rmqha_failover_epoch", "the group's epoch as last read", value=status["epoch"] or 0
    )
    yield GaugeMetricFamily(
        "rmqha_failover_in_sync_members", "members of the in-sync set (the master included)",
        value=len(status["in_sync"] or ()),
    )
    yield GaugeMetricFamily(
        "rmqha_failover_lease_valid_seconds",
        "seconds this node's lease is known good for (0: none)",
        value=status["lease_valid_for"],
    )
    yield GaugeMetricFamily(
        "rmqha_failover_coordinator_up", "1 while the coordinator answers",
        value=int(status["coordinator_error"] is None),
    )
    events = CounterMetricFamily(
        "rmqha_failover_events", "elections won, step-downs, leases lost", labels=["event"]
    )
    for event, count in sorted(status["counts"].items()):
        events.add_metric([event], count)
    yield events


def _scrub_metrics(broker: Broker) -> Iterator[Metric]:
    scrub = broker.scrub
    yield GaugeMetricFamily(
        "rmqha_corrupt_records",
        "records the background scrub found corrupt (on two reads), known now",
        value=scrub.corrupt_count,
    )
    yield CounterMetricFamily(
        "rmqha_scrubbed_bytes", "commit-log bytes the scrub read and checked",
        value=scrub.bytes_total,
    )
    yield CounterMetricFamily(
        "rmqha_scrub_passes", "scrub passes finished (every record checked once)",
        value=scrub.passes,
    )


def _checksum_failures(factory: Any) -> CounterMetricFamily:
    return CounterMetricFamily(
        "rmqha_checksum_failures",
        "checked framing messages that failed their CRC (damaged on the way; dropped)",
        value=factory.checksum_failures if factory is not None else 0,
    )


class _Metrics(_AdminResource):
    isLeaf = True

    def __init__(self, broker: Broker, commitlog: CommitLogServer | None = None) -> None:
        super().__init__()
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(_BrokerCollector(broker, commitlog))

    def render_GET(self, request: Request) -> bytes:
        request.setHeader(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")
        return generate_latest(self._registry)


class _Messages(_AdminResource):
    isLeaf = True

    def __init__(self, broker: Broker, topic: str) -> None:
        super().__init__()
        self._broker = broker
        self._topic = topic

    def render_POST(self, request: Request) -> bytes | int:
        try:
            message = self._message(request)
        except ValueError as e:
            return _error(request, 400, "BAD_REQUEST", str(e), stored=False)
        try:
            d = self._broker.put(message)
        except NotStoredError as e:
            # A slave (503), a full disk (507: retrying soon will not
            # help), another store failure (500): nothing was stored.
            code = 507 if e.disk_full else 500
            extra: dict[str, Any] = {}
            if e.status is PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH:
                code = 503  # (failover: not stored; retry shortly)
            if e.status is PutStatus.SERVICE_NOT_AVAILABLE:
                code = 503
                hint = master_hint(self._broker)
                if hint is not None:
                    # Failover mode: where to put instead.
                    extra["master"] = hint
            return _error(request, code, e.status.value, str(e), stored=False, **extra)
        except MessageRejected as e:
            return _error(request, 400, "MESSAGE_ILLEGAL", str(e), stored=False)

        def answer(result: PutMessageResult) -> None:
            if gone:
                return
            # Every outcome in which the message was stored is a 200.
            append = result.append
            request.write(
                _json(
                    request,
                    200,
                    {
                        "status": result.status.value,
                        "stored": True,
                        "offset": append.offset,
                        "next_offset": append.next_offset,
                        "msg_id": append.msg_id,
                        "queue_offset": append.queue_offset,
                    },
                )
            )
            request.finish()

        def failed(failure: Failure) -> None:
            if gone:
                return
            # After the append: the message is in the log.
            request.write(
                _error(request, 500, "UNKNOWN_ERROR", failure.getErrorMessage(), stored=True)
            )
            request.finish()

        gone = False

        def client_gone(_: Failure) -> None:
            # The client went away before the answer: stop waiting (the
            # message is stored whatever happens).
            nonlocal gone
            gone = True
            d.cancel()

        request.notifyFinish().addErrback(client_gone)
        d.addCallbacks(answer, failed)
        d.addErrback(lambda _: None if gone else _)
        return NOT_DONE_YET

    def _message(self, request: Request) -> Message:
        args: dict[bytes, list[bytes]] = request.args or {}

        def arg(name: bytes) -> str | None:
            values = args.get(name)
            if not values:
                return None
            try:
                return values[-1].decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"query parameter {name.decode()} is not UTF-8") from None

        queue_text = arg(b"queueId")
        queue_id = 0
        if queue_text is not None:
            if not queue_text.isdigit() or int(queue_text) > 2**31 - 1:
                raise ValueError(f"queueId {queue_text!r} is not a queue number")
            queue_id = int(queue_text)
        properties = {}
        for name, key in ((b"tags", "TAGS"), (b"keys", "KEYS")):
            value = arg(name)
            if value:
                properties[key] = value
        assert request.content is not None
        body = request.content.read()
        return Message(self._topic, body, queue_id=queue_id, properties=properties)


class _Topic(_AdminResource):
    def __init__(self, broker: Broker, topic: str) -> None:
        super().__init__()
        self._broker = broker
        self._topic = topic

    def getChild(self, path: bytes, request: Request) -> Resource:
        if path == b"messages":
            return _Messages(self._broker, self._topic)
        return _NotFound()


class _Topics(_AdminResource):
    def __init__(self, broker: Broker) -> None:
        super().__init__()
        self._broker = broker

    def getChild(self, path: bytes, request: Request) -> Resource:
        try:
            topic = path.decode("utf-8")
        except UnicodeDecodeError:
            return _NotFound()
        return _Topic(self._broker, topic)


class _NotFound(_AdminResource):
    """
    Serves nothing: 404 for any method HTTP defines, 501 for others.
    """

    isLeaf = True


# -- the commit log, read-only (--serve-commitlog) -----------------------------

#: What /commitlog answers when the commit log is not served.
COMMITLOG_NOT_SERVED = (
    "the commit log is not served here: start the broker with "
    "--serve-commitlog RATE (serveCommitLog=RATE in its config file), e.g. 64m "
    "bytes/s (docs/admin.md)"
)


class _CommitLogOff(_AdminResource):
    """
    /commitlog and below when not served: 404 saying how to serve it.
    """

    isLeaf = True

    def render(self, request: Request) -> bytes | int:
        return _error(request, 404, "NOT_FOUND", COMMITLOG_NOT_SERVED)


class _CommitLog(_AdminResource):
    """
    C{GET /commitlog}: the segment files, and the max offset (where whole
    records end now; a reader takes nothing past it).
    """

    def __init__(self, broker: Broker, server: CommitLogServer) -> None:
        super().__init__()
        self._broker = broker
        self._server = server

    def getChild(self, path: bytes, request: Request) -> Resource:
        if path == b"":
            return self
        if request.postpath:
            return _NotFound()
        return _SegmentFile(self._broker, self._server, path)

    def render_GET(self, request: Request) -> bytes:
        commitlog = self._broker.commitlog
        size = commitlog.segment_size
        return _json(
            request,
            200,
            {
                "status": "OK",
                "role": self._broker.role.value,
                "segment_size": size,
                "min_offset": commitlog.min_offset,
                "max_offset": commitlog.record_end,
                "segments": [
                    {"name": name, "offset": start, "size": size}
                    for name, start, _ in commitlog.segments
                ],
            },
        )


class _SegmentFile(_AdminResource):
    """
    C{GET}/C{HEAD /commitlog/{name}}: one segment file's bytes, the whole
    file (200) or one C{Range} (206), zeros at and past the max offset
    the request saw.  Only a name the store lists is served.
    """

    isLeaf = True

    def __init__(self, broker: Broker, server: CommitLogServer, name: bytes) -> None:
        super().__init__()
        self._broker = broker
        self._server = server
        self._name = name.decode("ascii", "replace")

    def _prepare(self, request: Request) -> tuple[bytes | None, tuple[int, int, int, int]]:
        """
        The error to answer, or (segment start offset, first byte, end, max
        offset) with the headers set.
        """
        commitlog = self._broker.commitlog
        found = [start for name, start, _ in commitlog.segments if name == self._name]
        if not found:
            shown = self._name[:40]
            return _error(
                request, 404, "NOT_FOUND", f"no commit-log segment {shown!r} here"
            ), (0, 0, 0, 0)
        size = commitlog.segment_size
        try:
            wanted = parse_range(request.getHeader(b"range"), size)
        except RangeNotSatisfiable as e:
            request.setHeader(b"content-range", b"bytes */%d" % size)
            return _error(request, 416, "RANGE_NOT_SATISFIABLE", str(e)), (0, 0, 0, 0)
        start, end = (0, size) if wanted is None else wanted
        max_offset = commitlog.record_end
        request.setHeader(b"accept-ranges", b"bytes")
        request.setHeader(b"content-type", b"application/octet-stream")
        request.setHeader(b"x-rmqha-max-offset", b"%d" % max_offset)
        request.setHeader(b"content-length", b"%d" % (end - start))
        if wanted is not None:
            request.setResponseCode(206)
            request.setHeader(b"content-range", b"bytes %d-%d/%d" % (start, end - 1, size))
        return None, (found[0], start, end, max_offset)

    def render_HEAD(self, request: Request) -> bytes:
        error, _ = self._prepare(request)
        return error if error is not None else b""

    def render_GET(self, request: Request) -> bytes | int:
        server = self._server
        if server.streams >= server.max_streams:
            request.setHeader(b"retry-after", b"%d" % RETRY_AFTER)
            return _error(
                request,
                503,
                "BUSY",
                f"{server.max_streams} commit-log streams are being served; "
                f"retry in {RETRY_AFTER} s",
            )
        error, (base, start, end, max_offset) = self._prepare(request)
        if error is not None:
            return error
        SegmentStream(
            server, self._broker.commitlog, request, base, start, end, max_offset
        ).start()
        return NOT_DONE_YET


class AdminRoot(_AdminResource):
    """
    The admin interface's root resource, for a C{twisted.web.server.Site}.
    """

    def __init__(self, broker: Broker, commitlog: CommitLogServer | None = None) -> None:
        """
        @param commitlog: serve the commit log's segment files (read-only,
            paced) under C{/commitlog}; C{None}: not served (404).
        """
        super().__init__()
        self.putChild(b"status", _Status(broker, commitlog))
        self.putChild(b"metrics", _Metrics(broker, commitlog))
        self.putChild(b"topics", _Topics(broker))
        self.putChild(
            b"commitlog",
            _CommitLog(broker, commitlog) if commitlog is not None else _CommitLogOff(),
        )

    def getChild(self, path: bytes, request: Request) -> Resource:
        return _NotFound()


# -- the HTTP layer: bounded for unauthenticated peers ------------------------


class _AdminRequest(Request):
    """
    A request whose body is kept in memory and counted as it arrives (the
    channel has refused anything declared larger than its limit), and
    whose unexpected failures answer JSON, not an HTML traceback page.
    """

    _body_size = 0

    def gotLength(self, length: int | None) -> None:
        # Twisted spools bodies of 100 kB or more to a temporary file; ours
        # are bounded by the channel, so memory it is.
        self.content = BytesIO()

    def handleContentChunk(self, data: bytes) -> None:
        channel: Any = self.channel
        if channel is None or getattr(channel, "refused", False):
            return
        self._body_size += len(data)
        limit = getattr(channel, "max_body", None)
        if limit is not None and self._body_size > limit:
            channel.refuse(
                413,
                "REQUEST_TOO_LARGE",
                f"the request body exceeds the limit of {limit} bytes",
            )
            return
        assert self.content is not None
        self.content.write(data)

    def processingFailed(self, reason: Failure) -> None:
        self._log.failure("admin request {uri} failed", reason, uri=self.uri)
        body = json.dumps(
            {"status": "UNKNOWN_ERROR", "error": "internal error (logged)"}
        ).encode() + b"\n"
        self.setResponseCode(500)
        self.setHeader(b"content-type", b"application/json")  # type: ignore[no-untyped-call]
        self.setHeader(b"content-length", b"%d" % len(body))  # type: ignore[no-untyped-call]
        self.write(body)  # type: ignore[no-untyped-call]
        self.finish()  # type: ignore[no-untyped-call]


class _AdminChannel(HTTPChannel):
    """
    HTTP/1.1 with the admin port's limits: bodies by L{max_body}, request
    heads by L{header_timeout} (total, not idle), and every error it
    answers itself in JSON.

    @ivar refused: this connection was answered with an error and is
        closing; what it still sends is ignored.
    """

    _log = Logger()
    max_body = MAX_REQUEST_BODY
    header_timeout: float | None = HEADER_TIMEOUT
    refused = False
    #: What a TLS client's certificate must satisfy (its allowlist).
    peer_policy: PeerPolicy | None = None
    _peer_allowed = False
    _header_call: IDelayedCall | None = None

    def connectionMade(self) -> None:
        HTTPChannel.connectionMade(self)
        self._await_headers()

    def dataReceived(self, data: bytes) -> None:
        if not self.refused:
            HTTPChannel.dataReceived(self, data)

    def _await_headers(self) -> None:
        self._stop_header_timer()
        if self.header_timeout:
            self._header_call = self.callLater(  # type: ignore[no-untyped-call]
                self.header_timeout, self._headers_too_slow
            )

    def _stop_header_timer(self) -> None:
        if self._header_call is not None:
            if self._header_call.active():
                self._header_call.cancel()
            self._header_call = None

    def _headers_too_slow(self) -> None:
        self._header_call = None
        if not self.requests and not self._buffer:
            # Not a byte of a request: a quiet (kept-alive) connection is
            # closed without an answer nobody asked for.
            self._close()
            return
        self._log.info(
            "admin HTTP: no complete request head from {peer} within {timeout} s",
            peer=self._peer(),
            timeout=self.header_timeout,
        )
        self.refuse(
            408,
            "REQUEST_TIMEOUT",
            f"the request line and headers did not arrive within {self.header_timeout:g} s",
        )

    def headerReceived(self, line: bytes) -> bool:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and len(value.strip()) > 18:
            # Twisted would int() thousands of digits (a ValueError past
            # 4300); no body this long is taken anyway.
            self.refuse(
                413,
                "REQUEST_TOO_LARGE",
                f"the request body is over {self.max_body} bytes (a "
                f"{len(value.strip())}-digit Content-Length)",
            )
            return False
        ok: bool = HTTPChannel.headerReceived(self, line)
        return ok

    def allHeadersReceived(self) -> None:
        self._stop_header_timer()
        refusal = self._peer_refusal()
        if refusal is not None:
            self._log.warn(
                "admin HTTP: refused {peer}: {why}",
                peer=self._peer(),
                why=refusal,
            )
            self.refuse(403, "FORBIDDEN", f"this client is not allowed here: {refusal}")
            return
        if self.length is not None and self.length > self.max_body:
            # Before a byte of the body is read (and before "100 Continue").
            self.refuse(
                413,
                "REQUEST_TOO_LARGE",
                f"the request body is {self.length} bytes; the limit is {self.max_body}",
            )
            return
        HTTPChannel.allHeadersReceived(self)

    def _peer(self) -> str:
        address = self.transport.getPeer() if self.transport is not None else None
        host, port = getattr(address, "host", None), getattr(address, "port", None)
        return f"{host}:{port}" if host is not None else str(address)

    def _peer_refusal(self) -> str | None:
        """
        Why the TLS client certificate is refused by C{--http-allowed-peers}
        (checked once per connection, before any body is read), if it is.
        """
        policy = self.peer_policy
        if policy is None or policy.allowed_peers is None or self._peer_allowed:
            return None
        get_certificate = getattr(self.transport, "getPeerCertificate", None)
        x509 = get_certificate() if get_certificate is not None else None
        certificate = x509.to_cryptography() if x509 is not None else None
        _, refusal = policy.check(certificate)
        self._peer_allowed = refusal is None
        return refusal

    def allContentReceived(self) -> None:
        if not self.refused:
            HTTPChannel.allContentReceived(self)

    def requestDone(self, request: Any) -> None:
        if self.persistent:
            # Armed before the next request's buffered bytes are parsed.
            self._await_headers()
        HTTPChannel.requestDone(self, request)

    def lineLengthExceeded(self, line: bytes) -> None:
        self.refuse(
            400, "BAD_REQUEST", f"a request or header line is longer than {self.MAX_LENGTH} bytes"
        )

    def _respondToBadRequestAndDisconnect(self) -> None:
        if self._receivedHeaderSize > self.totalHeadersSize:
            why = f"the request line and headers exceed {self.totalHeadersSize} bytes"
        else:
            why = "malformed HTTP request"
        self.refuse(400, "BAD_REQUEST", why)

    def refuse(self, code: int, status: str, error: str) -> None:
        """
        Answer C{code} with a JSON error and close the connection, reading
        nothing more (and aborting it if the peer does not let it close).
        """
        if self.refused:
            return
        assert self.transport is not None
        self.transport.write(_raw_error(code, status, error))
        self._close()

    def _close(self) -> None:
        self.refused = True
        self._stop_header_timer()
        self.loseConnection()  # type: ignore[no-untyped-call]
        if self.abortTimeout is not None and self._abortingCall is None:
            self._abortingCall = self.callLater(  # type: ignore[no-untyped-call]
                self.abortTimeout, self.forceAbortClient
            )

    def connectionLost(self, reason: Failure) -> None:  # type: ignore[override]
        self._stop_header_timer()
        HTTPChannel.connectionLost(self, reason)


class _AdminSite(Site):
    """
    The admin C{Site}: L{_AdminChannel}s (HTTP/1.1 only) making
    L{_AdminRequest}s.
    """

    protocol = _AdminChannel  # type: ignore[assignment]
    requestFactory = _AdminRequest

    def __init__(
        self,
        resource: Resource,
        reactor: IReactorTime | None,
        max_body: int,
        header_timeout: float | None,
        idle_timeout: float | None,
        peer_policy: PeerPolicy | None,
    ) -> None:
        Site.__init__(self, resource, timeout=idle_timeout, reactor=reactor)
        self.max_body = max_body
        self.header_timeout = header_timeout
        self.peer_policy = peer_policy
        self.noisy = False

    def buildProtocol(self, addr: Any) -> Any:
        channel = Site.buildProtocol(self, addr)
        channel.max_body = self.max_body
        channel.header_timeout = self.header_timeout
        channel.peer_policy = self.peer_policy
        return channel


def make_site(
    broker: Broker,
    *,
    reactor: IReactorTime | None = None,
    max_body: int = MAX_REQUEST_BODY,
    header_timeout: float | None = HEADER_TIMEOUT,
    idle_timeout: float | None = IDLE_TIMEOUT,
    peer_policy: PeerPolicy | None = None,
    serve_commitlog: int = 0,
) -> Site:
    """
    The admin interface of C{broker} as the factory its HTTP port serves
    (the one place it is built; wrap it to limit connections).

    @param reactor: the clock for timeouts (default: the broker's reactor).
    @param max_body: the largest request body read, in bytes.
    @param header_timeout: seconds for a request line and headers to
        arrive, however slowly; C{None} for no limit.
    @param idle_timeout: seconds of silence that close a connection.
    @param peer_policy: served over TLS with client certificates, the
        names a client certificate must carry (C{allowed_peers}); checked
        before a request's body is read (403).
    @param serve_commitlog: bytes per second at which C{/commitlog}
        serves segment files to all readers together; 0: not served.
    """
    clock = reactor if reactor is not None else broker.reactor
    served = CommitLogServer(serve_commitlog, clock) if serve_commitlog > 0 else None
    return _AdminSite(
        AdminRoot(broker, served),
        clock,
        max_body,
        header_timeout,
        idle_timeout,
        peer_policy,
    )


class AdminService(Port):
    """
    The admin interface of a broker on its own port: set it as a child of
    the broker (C{AdminService(broker, "tcp:8080").setServiceParent(broker)}),
    which listens on it with the HA port, before opening the store.
    """

    _log = Logger()

    def __init__(
        self,
        broker: Broker,
        where: Any,
        peer_policy: PeerPolicy | None = None,
        serve_commitlog: int = 0,
    ) -> None:
        """
        @param where: a Twisted server endpoint description (plain TCP
            beyond loopback is warned about), or an endpoint
            (L{rmqha.tls.server_endpoint} for TLS requiring client
            certificates).
        @param peer_policy: the names an admin client's TLS certificate
            must carry (L{make_site}).
        @param serve_commitlog: bytes/s for C{/commitlog} (L{make_site}).
        """
        self.broker = broker
        self.where = where
        self.peer_policy = peer_policy
        self.serve_commitlog = serve_commitlog
        self.setName("http")  # type: ignore[no-untyped-call]

    def listen(self, limited: Any) -> None:
        if self.port is not None:
            return
        if isinstance(self.where, str):
            warning = admin_exposure_warning(self.where)
            if warning is not None:
                self._log.warn(warning.format, **warning.fields)
            if self.serve_commitlog:
                warning = commitlog_exposure_warning(self.where)
                if warning is not None:
                    self._log.warn(warning.format, **warning.fields)
        site = make_site(
            self.broker, peer_policy=self.peer_policy, serve_commitlog=self.serve_commitlog
        )
        self.port = listen(self.broker.reactor, "http", self.where, limited("HTTP", site))
