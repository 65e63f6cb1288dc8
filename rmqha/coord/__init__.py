"""
Automatic failover: a coordinator (a DCS, "distributed configuration
store": etcd v3 today) elects one master per group (docs/failover.md).
"""
