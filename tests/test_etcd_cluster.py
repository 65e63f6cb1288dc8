"""
Tests for the developer harness L{tools.etcd_cluster} that need no etcd.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase


class EtcdClusterTests(SynchronousTestCase):
    """
    L{tools.etcd_cluster.EtcdCluster}'s checks that need no etcd (the real
    members run in tests/integration/test_etcd_dcs.py).
    """

    def test_refuses_without_etcd(self) -> None:
        """
        Without an etcd binary it says which package to install, and
        starts nothing; only 1 or 3 members.
        """
        from tools import etcd_cluster

        self.patch(etcd_cluster, "etcd_binary", lambda: None)
        with self.assertRaises(FileNotFoundError) as caught:
            etcd_cluster.EtcdCluster(self.mktemp())
        self.assertIn("etcd-server", str(caught.exception))
        self.assertRaises(ValueError, etcd_cluster.EtcdCluster, self.mktemp(), members=2)

    def test_member_dies_at_start(self) -> None:
        """
        A member that exits at once (here: not etcd at all) is reported
        naming its log, and nothing is left running.
        """
        from tools.etcd_cluster import EtcdCluster

        with self.assertRaises(RuntimeError) as caught:
            EtcdCluster(self.mktemp(), binary="/bin/false", timeout=5)
        self.assertIn("exited", str(caught.exception))
        self.assertIn("m0.log", str(caught.exception))
