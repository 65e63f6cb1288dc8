"""
The HA side: the replication wire format (L{rmqha.ha._wire}), the master's
connections (L{rmqha.ha.master}), the slave's (L{rmqha.ha.slave}), the
control extension and divergence checks (L{rmqha.ha.divergence}), and the
SYNC_MASTER quorum (L{rmqha.ha.group}).  docs/architecture.md has the map.
"""
