# -*- test-case-name: tests.test_admin -*-
"""
C{GET /metrics}: the broker's figures as Prometheus text, read at scrape
time.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

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
from rmqha.admin.view import FailoverSource, PutFigures, broker_status
from rmqha.broker import Broker
from rmqha.ha.masterside import MasterSideStatus
from rmqha.ha.replica import ReplicaStatus
from rmqha.store.scrub import ScrubStatus
from rmqha.tls import certificate_expiry

__all__ = ["BrokerCollector", "MetricsResource"]


class BrokerCollector(Collector):
    """
    Reads the broker's figures at scrape time: one L{BrokerStatus}
    snapshot per scrape.
    """

    def __init__(
        self,
        broker: Broker,
        served: CommitLogServer | None = None,
        failover: FailoverSource | None = None,
    ) -> None:
        self._broker = broker
        self._served = served
        self._failover = failover
        # (The TLS files as loaded at start.)
        self._expiry = certificate_expiry(broker.settings.tls_files)

    def collect(self) -> Iterator[Metric]:
        view = broker_status(self._broker, self._failover)
        store = view.store
        for name, value, text in [
            ("rmqha_commitlog_min_offset", store.min_offset, "oldest offset held"),
            ("rmqha_commitlog_max_offset", store.max_offset, "offset one past the last byte"),
            ("rmqha_commitlog_flushed_offset", store.flushed_offset, "offset known to be on disk"),
        ]:
            yield GaugeMetricFamily(name, text, value=value)
        yield CounterMetricFamily(
            "rmqha_http_commitlog_bytes",
            "commit-log bytes sent by GET /commitlog/{segment} (--serve-commitlog)",
            value=self._served.bytes_served if self._served else 0,
        )
        yield from _scrub_metrics(view.scrub)
        yield _tls_expiry(self._expiry)
        if view.failover is not None:
            yield from _failover_metrics(view.failover.coordinator)
        if view.master is not None:
            yield from _master_metrics(view.puts, view.master)
        elif view.replica is not None:
            yield from _replica_metrics(view.replica)


def _master_metrics(puts: PutFigures, master: MasterSideStatus) -> Iterator[Metric]:
    """
    A master's figures: its puts and its slaves.
    """
    yield CounterMetricFamily("rmqha_puts", "messages put", value=puts.puts)
    statuses = CounterMetricFamily(
        "rmqha_put_results", "puts by PutMessageStatus", labels=["status"]
    )
    for put_status, count in puts.statuses.items():
        statuses.add_metric([put_status.value], count)
    yield statuses
    yield HistogramMetricFamily(
        "rmqha_replication_wait_seconds",
        "how long SYNC_MASTER puts waited for their slaves",
        buckets=list(puts.replication_wait),
        sum_value=puts.replication_wait_total,
    )
    yield CounterMetricFamily("rmqha_put_bytes", "record bytes put", value=puts.put_bytes)
    slaves = master.slaves
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
    yield _checksum_failures(master.checksum_failures)


def _replica_metrics(replica: ReplicaStatus) -> Iterator[Metric]:
    """
    A slave's figures: its connection to the master, divergences, checks.
    """
    yield GaugeMetricFamily(
        "rmqha_master_connected", "1 while connected to the master", value=int(replica.connected)
    )
    yield CounterMetricFamily(
        "rmqha_replicated_bytes", "commit-log bytes received from the master",
        value=replica.bytes_received,
    )
    yield CounterMetricFamily(
        "rmqha_master_connections", "connections made to the master",
        value=replica.connections_made,
    )
    halted = GaugeMetricFamily(
        "rmqha_divergence",
        "1 while replication is halted on a divergence of this kind",
        labels=["kind"],
    )
    found = CounterMetricFamily(
        "rmqha_divergences", "divergences found, by kind", labels=["kind"]
    )
    divergence = replica.divergence
    for kind, count in sorted(replica.divergences.items()):
        current = divergence is not None and divergence.kind == kind
        halted.add_metric([kind], int(current))
        found.add_metric([kind], count)
    yield halted
    yield found
    yield _checksum_failures(replica.checksum_failures)
    yield CounterMetricFamily(
        "rmqha_rejected_records",
        "replicated records that failed validation (cut, fetched again)",
        value=replica.rejected_records,
    )
    yield CounterMetricFamily(
        "rmqha_epoch_truncations",
        "times the log was cut back to the newest epoch shared with the master",
        value=replica.epoch_truncations,
    )
    yield CounterMetricFamily(
        "rmqha_epoch_truncated_bytes",
        "bytes those cuts moved to quarantine",
        value=replica.epoch_truncated_bytes,
    )
    yield GaugeMetricFamily(
        "rmqha_failed_checks",
        "checks of the master (control session) that could not finish, in a row",
        value=replica.failed_checks,
    )


def _failover_metrics(status: Mapping[str, Any]) -> Iterator[Metric]:
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


def _scrub_metrics(scrub: ScrubStatus) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "rmqha_corrupt_records",
        "records the background scrub found corrupt (on two reads), known now",
        value=scrub.corrupt_records,
    )
    yield CounterMetricFamily(
        "rmqha_scrubbed_bytes", "commit-log bytes the scrub read and checked",
        value=scrub.bytes_total,
    )
    yield CounterMetricFamily(
        "rmqha_scrub_passes", "scrub passes finished (every record checked once)",
        value=scrub.passes,
    )


def _tls_expiry(expiry: Mapping[str, tuple[str, float]]) -> GaugeMetricFamily:
    """
    When this broker's TLS certificate (C{--tls-cert}) and CA
    (C{--tls-ca}) expire: no sample for a file not set.
    """
    metric = GaugeMetricFamily(
        "rmqha_tls_certificate_expiry_timestamp_seconds",
        "when the certificate (--tls-cert, kind=certificate) or the CA (--tls-ca, kind=ca) "
        "this broker uses stops being valid: the earliest not-after in the file, Unix seconds",
        labels=["kind", "file"],
    )
    for kind, (path, not_after) in sorted(expiry.items()):
        metric.add_metric([kind, path], not_after)
    return metric


def _checksum_failures(count: int) -> CounterMetricFamily:
    return CounterMetricFamily(
        "rmqha_checksum_failures",
        "checked framing messages that failed their CRC (damaged on the way; dropped)",
        value=count,
    )


class MetricsResource(AdminResource):
    """
    C{GET /metrics}: L{BrokerCollector}'s figures as Prometheus text.
    """

    isLeaf = True

    def __init__(
        self,
        broker: Broker,
        commitlog: CommitLogServer | None = None,
        failover: FailoverSource | None = None,
    ) -> None:
        super().__init__()
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(BrokerCollector(broker, commitlog, failover))

    def render_GET(self, request: Request) -> bytes:
        request.setHeader(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")
        return generate_latest(self._registry)


