"""
Developer harnesses, run from a checkout and never shipped in the wheel
(pyproject's package list is C{rmqha*} and C{twisted.plugins}):

    python -m tools.bench ...   benchmarks (docs/benchmarks.md)
    python -m tools.soak ...    a master and two slaves under load for minutes
    python -m tools.fuzz ...    hostile input against every parser
    python -m tools.abuse ...   what one hostile peer costs a master

They import L{rmqha}; nothing in L{rmqha} imports them.
"""
