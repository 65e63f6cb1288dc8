# -*- test-case-name: tests.test_admin -*-
"""
What C{GET /status} answers.
"""

from __future__ import annotations

from typing import Any

from rmqha.broker import Broker

__all__ = ["status", "hide_coordinator"]


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

