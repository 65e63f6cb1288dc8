"""
What the failover tests share (tests/integration/test_failover*.py): etcd
clusters on free loopback ports, skipped with the reason where etcd is not
installed, the nodes' lease TTL, and the end-of-test check.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from tools.etcd_cluster import EtcdCluster
from tools.failover_cluster import FailoverCluster, Producers, converge_and_check
from tools.processes import etcd_binary

__all__ = ["TTL", "assert_end", "etcd", "etcd3"]

#: The nodes' lease TTL (the default).
TTL = 2.0


@pytest.fixture
def etcd(tmp_path: Any) -> Iterator[EtcdCluster]:
    if etcd_binary() is None:
        pytest.skip("etcd is not installed (python3 dev.py test installs etcd-server as root)")
    with EtcdCluster(str(tmp_path / "etcd")) as cluster:
        yield cluster


@pytest.fixture
def etcd3(tmp_path: Any) -> Iterator[EtcdCluster]:
    if etcd_binary() is None:
        pytest.skip("etcd is not installed (python3 dev.py test installs etcd-server as root)")
    with EtcdCluster(str(tmp_path / "etcd"), members=3) as cluster:
        yield cluster


def assert_end(group: FailoverCluster, load: Producers | None) -> None:
    end = converge_and_check(group, load)
    assert all(end["identical"].values()), end
    assert all(end["check"].values()), end
