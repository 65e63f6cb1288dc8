# -*- test-case-name: tests.test_admin -*-
"""
C{GET /metrics}: the broker's figures as Prometheus text, read at scrape
time.
"""

from __future__ import annotations

from typing import Any, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from twisted.web.server import Request

from rmqha.admin.commitlog import CommitLogServer
from rmqha.admin.resource import AdminResource
from rmqha.broker import Broker

__all__ = ["BrokerCollector", "MetricsResource"]


class BrokerCollector(Collector):
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


class MetricsResource(AdminResource):
    isLeaf = True

    def __init__(self, broker: Broker, commitlog: CommitLogServer | None = None) -> None:
        super().__init__()
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(BrokerCollector(broker, commitlog))

    def render_GET(self, request: Request) -> bytes:
        request.setHeader(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")
        return generate_latest(self._registry)


