"""
Developer harnesses, run from a checkout and never shipped in the wheel
(pyproject's package list is C{rmqha*} and C{twisted.plugins}):

    python -m tools.bench ...   benchmarks (docs/benchmarks.md)
    python -m tools.soak ...    a master and two slaves under load for minutes
    python -m tools.fuzz ...    hostile input against every parser
    python -m tools.abuse ...   what one hostile peer costs a master

and the real-process harnesses tests and benchmarks import:
L{tools.failover_cluster} (a failover group of C{twistd} nodes),
L{tools.etcd_cluster} (etcd members), L{tools.faultproxy} (a
fault-injecting TCP proxy) and L{tools.processes} (C{twistd} command
lines, free ports).

They import L{rmqha}; nothing in L{rmqha} imports them.
"""
