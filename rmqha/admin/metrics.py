# -*- test-case-name: tests.test_admin -*-
"""
C{GET /metrics}: the broker's figures as Prometheus text, read at scrape
time.

Label sets are bounded: a master's per-slave series are labelled by the
replica (its id, stable across reconnections; docs/admin.md), at most
L{MAX_SLAVE_SERIES} of them, whatever connects; a gone slave's series
end with its connection (the collector reads the connections at each
scrape and keeps nothing).
"""

from __future__ import annotations

import platform
from typing import Any, Iterable, Iterator, Mapping

import twisted

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from twisted.web.server import Request

import rmqha
from rmqha._busypoll import BusyPoll
from rmqha._busypoll import figures as busy_poll_figures
from rmqha.admin.commitlog import CommitLogServer
from rmqha.admin.resource import AdminResource
from rmqha.admin.view import DiskSpace, FailoverSource, PutFigures, broker_status
from rmqha.broker import Broker
from rmqha.ha.master import SlaveStatus
from rmqha.ha.masterside import MasterSideStatus
from rmqha.ha.replica import ReplicaStatus
from rmqha.remoting.registration import NameServerStatus
from rmqha.remoting.sync import SyncStatus
from rmqha.store import _record
from rmqha.store._prefault import PrefaultFigures
from rmqha.store.scrub import ScrubStatus
from rmqha.tls import certificate_expiry

__all__ = ["BrokerCollector", "MetricsResource", "MAX_SLAVE_SERIES", "build_info", "slave_label"]

#: At most this many replicas get per-slave series on a master (the rest
#: are counted by C{rmqha_slaves_unlisted}): peers that connect many times,
#: or declare many ids, cannot grow C{/metrics} past it.
MAX_SLAVE_SERIES = 32


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
        yield build_info()
        yield GaugeMetricFamily(
            "rmqha_is_master", "1 while this broker's role is a master's",
            value=int(view.role.is_master),
        )
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
        yield from _prefault_metrics(store.prefault)
        yield from _busy_poll_metrics(busy_poll_figures(self._broker.reactor))
        yield _tls_expiry(self._expiry)
        yield from _disk_metrics(view.disk)
        if view.failover is not None:
            yield from _failover_metrics(view.failover.coordinator)
        if view.metadata_sync is not None:
            yield from _metadata_sync_metrics(view.metadata_sync, view.taken_at)
        if view.namesrv is not None:
            yield from _namesrv_metrics(view.namesrv, view.taken_at)
        if view.master is not None:
            yield from _master_metrics(view.puts, view.master)
        elif view.replica is not None:
            yield from _replica_metrics(view.replica)


def _busy_poll_metrics(polling: BusyPoll | None) -> Iterator[Metric]:
    """
    The reactor's busy polling (docs/sync.md, "Busy polling"): windows
    that got events and windows that did not, and the time they took.
    """
    spins = CounterMetricFamily(
        "rmqha_busy_poll_windows",
        "busy-poll windows (the reactor polling before it sleeps), by whether "
        "events came within them",
        labels=["outcome"],
    )
    spins.add_metric(["events"], polling.windows_with_events if polling else 0)
    spins.add_metric(["none"], polling.windows_without_events if polling else 0)
    yield spins
    yield CounterMetricFamily(
        "rmqha_busy_poll_seconds",
        "time the reactor spent polling in busy-poll windows",
        value=polling.poll_seconds if polling else 0.0,
    )


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
    yield GaugeMetricFamily(
        "rmqha_in_sync_replicas",
        "copies a put would count now, the master's included",
        value=master.in_sync_replicas,
    )
    yield GaugeMetricFamily(
        "rmqha_min_in_sync_replicas",
        "copies every PUT_OK needs (minInSyncReplicas on a SYNC_MASTER, 1 on an ASYNC one)",
        value=master.min_in_sync_replicas,
    )
    slaves = master.slaves
    yield GaugeMetricFamily("rmqha_slaves_connected", "connected slaves", value=len(slaves))
    listed = listed_slaves(slaves)
    yield GaugeMetricFamily(
        "rmqha_slaves_unlisted",
        "connected slaves without per-slave series (another connection of the same "
        f"replica, or past {MAX_SLAVE_SERIES} replicas)",
        value=len(slaves) - len(listed),
    )
    info = GaugeMetricFamily(
        "rmqha_slave_info",
        "1 per listed slave: its connection's address and how it is connected",
        labels=["replica", "peer", "transport", "framing", "identity", "authenticated"],
    )
    ack = GaugeMetricFamily("rmqha_slave_ack_offset", "slave's acknowledged offset", labels=["replica"])
    lag = GaugeMetricFamily("rmqha_slave_lag_bytes", "master max offset minus slave ack", labels=["replica"])
    lag_seconds = GaugeMetricFamily(
        "rmqha_slave_lag_seconds",
        "seconds since the slave last held all the master's log then held (0: caught up)",
        labels=["replica"],
    )
    rate = GaugeMetricFamily("rmqha_slave_bytes_per_second", "slave ack rate", labels=["replica"])
    for replica, s in listed:
        info.add_metric(
            [replica, s.peer, s.transport, s.framing, s.identity or "",
             "true" if s.authenticated else "false"],
            1,
        )
        if s.ack_offset is not None and s.lag_bytes is not None:
            ack.add_metric([replica], s.ack_offset)
            lag.add_metric([replica], s.lag_bytes)
        if s.lag_seconds is not None:
            lag_seconds.add_metric([replica], s.lag_seconds)
        rate.add_metric([replica], s.bytes_per_s)
    yield info
    yield ack
    yield lag
    yield lag_seconds
    yield rate
    yield _checksum_failures(master.checksum_failures)


def slave_label(slave: SlaveStatus) -> str:
    """
    The C{replica} label of a slave's series: the replica id it declared
    or proved (stable: it lives in the slave's store), else the name in
    its TLS certificate, else -- a RocketMQ slave, which says nothing of
    itself -- its address.
    """
    return slave.replica_id or slave.identity or slave.peer


def listed_slaves(slaves: Iterable[SlaveStatus]) -> list[tuple[str, SlaveStatus]]:
    """
    The slaves that get per-slave series, with their label, by label: one
    connection per label -- the proven one, else one that has
    acknowledged, else the oldest -- and at most L{MAX_SLAVE_SERIES}
    labels, chosen in the same order (a replica that proved its id, then
    those replicating longest).
    """

    def rank(s: SlaveStatus) -> tuple[bool, bool, float, str]:
        return (not s.authenticated, s.ack_offset is None, s.connected_since, s.peer)

    best: dict[str, SlaveStatus] = {}
    for s in sorted(slaves, key=rank):
        best.setdefault(slave_label(s), s)
    kept = sorted(best.items(), key=lambda item: rank(item[1]))[:MAX_SLAVE_SERIES]
    return sorted(kept, key=lambda item: item[0])


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
    info = GaugeMetricFamily(
        "rmqha_failover_info", "1: this node's group and node id", labels=["group", "node_id"]
    )
    info.add_metric([str(status["group"]), str(status["node_id"])], 1)
    yield info
    yield GaugeMetricFamily(
        "rmqha_failover_has_master",
        "1 while the coordinator names a master of the group (as this node last read it)",
        value=int(status["master"] is not None),
    )
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
        "rmqha_failover_events",
        "elections won, step-downs, leases lost, campaigns lost, epoch changes seen",
        labels=["event"],
    )
    for event, count in sorted(status["counts"].items()):
        events.add_metric([event], count)
    yield events


def _metadata_sync_metrics(sync: SyncStatus, now: float) -> Iterator[Metric]:
    """
    The slave's metadata sync (docs/remoting.md, "The slave's metadata
    sync"): no last-success samples before the first complete sync.
    """
    yield GaugeMetricFamily(
        "rmqha_metadata_sync_active", "1 while this slave copies its master's metadata",
        value=int(sync.active),
    )
    last = GaugeMetricFamily(
        "rmqha_metadata_sync_last_success_timestamp_seconds",
        "when the last sync whose four steps all succeeded ended, Unix seconds",
    )
    age = GaugeMetricFamily(
        "rmqha_metadata_sync_last_success_age_seconds",
        "seconds since the last sync whose four steps all succeeded",
    )
    if sync.last_success is not None:
        last.add_metric([], sync.last_success)
        age.add_metric([], sync.age(now) or 0.0)
    yield last
    yield age
    yield CounterMetricFamily("rmqha_metadata_sync_runs", "syncs run", value=sync.syncs)
    failures = CounterMetricFamily(
        "rmqha_metadata_sync_failures",
        "failed sync steps by table and kind (connection, timeout, refused, bad_body, write)",
        labels=["table", "kind"],
    )
    for (table, kind), count in sorted(sync.failures.items()):
        failures.add_metric([table, kind], count)
    yield failures


def _namesrv_metrics(namesrv: Iterable[NameServerStatus], now: float) -> Iterator[Metric]:
    """
    The registration with each NameServer (docs/remoting.md,
    "NameServers"), labelled by the NameServer as given (C{--namesrv}:
    as many series as NameServers); no last-success or info samples
    before its first successful registration.
    """
    registered = GaugeMetricFamily(
        "rmqha_namesrv_registered",
        "1 while the last registration with the NameServer succeeded and its connection is open",
        labels=["namesrv"],
    )
    last = GaugeMetricFamily(
        "rmqha_namesrv_registration_last_success_timestamp_seconds",
        "when the NameServer last answered REGISTER_BROKER with SUCCESS, Unix seconds",
        labels=["namesrv"],
    )
    age = GaugeMetricFamily(
        "rmqha_namesrv_registration_last_success_age_seconds",
        "seconds since the NameServer last answered REGISTER_BROKER with SUCCESS",
        labels=["namesrv"],
    )
    runs = CounterMetricFamily(
        "rmqha_namesrv_registrations", "REGISTER_BROKER answered SUCCESS", labels=["namesrv"]
    )
    failures = CounterMetricFamily(
        "rmqha_namesrv_registration_failures",
        "REGISTER_BROKER failed: no connection, no answer within 6 s, an error answer",
        labels=["namesrv"],
    )
    info = GaugeMetricFamily(
        "rmqha_namesrv_registration_info",
        "1: the brokerId of the last successful registration and the master's addresses "
        "its answer gave (empty: none)",
        labels=["namesrv", "broker_id", "master_addr", "ha_server_addr"],
    )
    for n in namesrv:
        registered.add_metric([n.namesrv], int(n.registered))
        runs.add_metric([n.namesrv], n.registrations)
        failures.add_metric([n.namesrv], n.failures)
        if n.last_success is not None:
            last.add_metric([n.namesrv], n.last_success)
            age.add_metric([n.namesrv], n.age(now) or 0.0)
            info.add_metric(
                [n.namesrv, str(n.broker_id), n.master_addr or "", n.ha_server_addr or ""], 1
            )
    yield registered
    yield last
    yield age
    yield runs
    yield failures
    yield info


def _prefault_metrics(prefault: PrefaultFigures | None) -> Iterator[Metric]:
    """
    The pre-faulting of the pages ahead of the puts (docs/store.md): asks
    made and not made for lack of a spare CPU, and its thread's CPU (zeros
    where there is none).
    """
    asks = CounterMetricFamily(
        "rmqha_prefault_asks",
        "asks to fault in the pages ahead of the puts, by whether they were made "
        "(made) or not for lack of a spare CPU (no_spare_cpu: the puts faulted their own)",
        labels=["outcome"],
    )
    asks.add_metric(["made"], prefault.asks if prefault else 0)
    asks.add_metric(["no_spare_cpu"], prefault.skipped if prefault else 0)
    yield asks
    yield CounterMetricFamily(
        "rmqha_prefault_cpu_seconds",
        "CPU time the pre-faulting thread has used",
        value=prefault.cpu_seconds if prefault else 0.0,
    )


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


def _disk_metrics(disk: DiskSpace | None) -> Iterator[Metric]:
    if disk is None:
        return
    yield GaugeMetricFamily(
        "rmqha_store_filesystem_free_bytes",
        "bytes the broker may still write on the store's file system",
        value=disk.free_bytes,
    )
    yield GaugeMetricFamily(
        "rmqha_store_filesystem_size_bytes", "size of the store's file system",
        value=disk.size_bytes,
    )


def build_info() -> GaugeMetricFamily:
    """
    C{rmqha_build_info}: 1, labelled with what runs -- rmqha's version,
    Python's and Twisted's, and the record codec (C{compiled}, or
    C{pure}: not built, or C{RMQHA_PURE=1}; 4.5-5x slower).
    """
    info = GaugeMetricFamily(
        "rmqha_build_info",
        "1: the versions running and the record codec in use",
        labels=["version", "python_version", "python_implementation", "twisted_version", "codec"],
    )
    info.add_metric(
        [
            rmqha.__version__,
            platform.python_version(),
            platform.python_implementation(),
            twisted.__version__,
            "compiled" if _record._accel is not None else "pure",
        ],
        1,
    )
    return info


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


