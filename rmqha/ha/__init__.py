"""
The HA side: the wire format and greeting sniffer (L{rmqha.ha._wire}),
settings and defaults (L{rmqha.ha.config}), the master's connections
(L{rmqha.ha.master}) and its role service (L{rmqha.ha.masterside}), the
SYNC_MASTER quorum (L{rmqha.ha.group}), the control extension
(L{rmqha.ha.control}), the divergence algorithm (L{rmqha.ha.divergence}),
the slave's connection (L{rmqha.ha.slave}) and its lifecycle
(L{rmqha.ha.replica}).  docs/architecture.md has the map.
"""
