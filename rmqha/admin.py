# -*- test-case-name: tests.test_admin -*-
"""
The admin HTTP interface (twisted.web), served on C{--http ENDPOINT}:

    GET  /status                      JSON: offsets, and each slave or the master
    GET  /metrics                     the same figures as Prometheus text
    POST /topics/{topic}/messages     the request body becomes one message
                                      (query: queueId, tags, keys)

Errors are JSON C{{"status": ..., "error": ...}} with a 4xx/5xx code.
"""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from rmqha.broker import Broker, NotMasterError
from rmqha.commitlog import Message, MessageRejected
from rmqha.group import PutMessageResult

__all__ = ["AdminRoot", "status"]


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
            }
            for s in sorted(broker.slaves(), key=lambda s: s.peer)
        ]
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
        # What the master is (rmqha, rocketmq, or null while unknown), and
        # why replication is not running, if it is not (docs/protocol.md).
        result["master_kind"] = broker.master_kind
        result["problem"] = broker.problem
    return result


def _json(request: Request, code: int, body: dict[str, Any]) -> bytes:
    request.setResponseCode(code)
    request.setHeader(b"content-type", b"application/json")
    return json.dumps(body).encode() + b"\n"


def _error(request: Request, code: int, status: str, error: str) -> bytes:
    return _json(request, code, {"status": status, "error": error})


class _Status(Resource):
    isLeaf = True

    def __init__(self, broker: Broker) -> None:
        super().__init__()
        self._broker = broker

    def render_GET(self, request: Request) -> bytes:
        return _json(request, 200, status(self._broker))


class _BrokerCollector(Collector):
    """
    Reads the broker's figures at scrape time.
    """

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    def collect(self):
        broker = self._broker
        commitlog = broker.commitlog
        for name, value, text in [
            ("rmqha_commitlog_min_offset", commitlog.min_offset, "oldest offset held"),
            ("rmqha_commitlog_max_offset", commitlog.max_offset, "offset one past the last byte"),
            ("rmqha_commitlog_flushed_offset", commitlog.flushed_offset, "offset known to be on disk"),
        ]:
            yield GaugeMetricFamily(name, text, value=value)
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
            yield GaugeMetricFamily(
                "rmqha_failed_checks",
                "checks of the master (control session) that could not finish, in a row",
                value=broker.failed_checks,
            )


def _checksum_failures(factory: Any) -> CounterMetricFamily:
    return CounterMetricFamily(
        "rmqha_checksum_failures",
        "checked-framing messages that failed their CRC (damaged on the way; dropped)",
        value=factory.checksum_failures if factory is not None else 0,
    )


class _Metrics(Resource):
    isLeaf = True

    def __init__(self, broker: Broker) -> None:
        super().__init__()
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(_BrokerCollector(broker))

    def render_GET(self, request: Request) -> bytes:
        request.setHeader(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")
        return generate_latest(self._registry)


class _Messages(Resource):
    isLeaf = True

    def __init__(self, broker: Broker, topic: str) -> None:
        super().__init__()
        self._broker = broker
        self._topic = topic

    def render_POST(self, request: Request) -> bytes | int:
        try:
            message = self._message(request)
        except ValueError as e:
            return _error(request, 400, "BAD_REQUEST", str(e))
        try:
            d = self._broker.put(message)
        except NotMasterError as e:
            return _error(request, 503, "SERVICE_NOT_AVAILABLE", str(e))
        except MessageRejected as e:
            return _error(request, 400, "MESSAGE_ILLEGAL", str(e))

        def answer(result: PutMessageResult) -> None:
            # Every outcome in which the message was stored is a 200.
            append = result.append
            request.write(
                _json(
                    request,
                    200,
                    {
                        "status": result.status.value,
                        "offset": append.offset,
                        "next_offset": append.next_offset,
                        "msg_id": append.msg_id,
                        "queue_offset": append.queue_offset,
                    },
                )
            )
            request.finish()

        def failed(failure: Failure) -> None:
            request.write(_error(request, 500, "UNKNOWN_ERROR", failure.getErrorMessage()))
            request.finish()

        d.addCallbacks(answer, failed)
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


class _Topic(Resource):
    def __init__(self, broker: Broker, topic: str) -> None:
        super().__init__()
        self._broker = broker
        self._topic = topic

    def getChild(self, path: bytes, request: Request) -> Resource:
        if path == b"messages":
            return _Messages(self._broker, self._topic)
        return _NotFound()


class _Topics(Resource):
    def __init__(self, broker: Broker) -> None:
        super().__init__()
        self._broker = broker

    def getChild(self, path: bytes, request: Request) -> Resource:
        try:
            topic = path.decode("utf-8")
        except UnicodeDecodeError:
            return _NotFound()
        return _Topic(self._broker, topic)


class _NotFound(Resource):
    isLeaf = True

    def render(self, request: Request) -> bytes:
        return _error(request, 404, "NOT_FOUND", f"no resource at {request.path.decode('utf-8', 'replace')}")


class AdminRoot(Resource):
    """
    The admin interface's root resource, for a C{twisted.web.server.Site}.
    """

    def __init__(self, broker: Broker) -> None:
        super().__init__()
        self.putChild(b"status", _Status(broker))
        self.putChild(b"metrics", _Metrics(broker))
        self.putChild(b"topics", _Topics(broker))

    def getChild(self, path: bytes, request: Request) -> Resource:
        return _NotFound()
