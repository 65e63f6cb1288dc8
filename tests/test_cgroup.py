"""
Tests for L{rmqha._cgroup}: a container's CPU limit and what its cgroup
has used.
"""

from __future__ import annotations

import os

from twisted.trial.unittest import SynchronousTestCase

from rmqha import _cgroup
from rmqha._cgroup import CPULimit


class CPUQuotaTests(SynchronousTestCase):
    """
    L{_cgroup.cpu_quota} and L{_cgroup.cpu_limit}: a container's CPU limit, cgroup v2 or v1, the
    smallest along the process's cgroup path.
    """

    def tree(self, files: dict[str, str], cgroup: str) -> tuple[str, str]:
        root = self.mktemp()
        for path, text in files.items():
            full = os.path.join(root, "sys", path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as f:
                f.write(text)
        os.makedirs(root, exist_ok=True)
        proc = os.path.join(root, "cgroup")
        with open(proc, "w") as f:
            f.write(cgroup)
        return proc, os.path.join(root, "sys")

    def test_v2(self) -> None:
        proc, sys_fs = self.tree(
            {"cpu.max": "max 100000\n", "pod/cpu.max": "150000 100000\n",
             "pod/app/cpu.max": "max 100000\n"},
            "0::/pod/app\n",
        )
        self.assertEqual(_cgroup.cpu_quota(proc, sys_fs), 1.5)

    def test_v1(self) -> None:
        proc, sys_fs = self.tree(
            {"cpu,cpuacct/docker/x/cpu.cfs_quota_us": "50000\n",
             "cpu,cpuacct/docker/x/cpu.cfs_period_us": "100000\n",
             "cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
             "cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
            "4:memory:/docker/x\n3:cpu,cpuacct:/docker/x\n",
        )
        self.assertEqual(_cgroup.cpu_quota(proc, sys_fs), 0.5)

    def test_none(self) -> None:
        proc, sys_fs = self.tree({"cpu.max": "max 100000\n"}, "0::/\n")
        self.assertIsNone(_cgroup.cpu_quota(proc, sys_fs))
        self.assertIsNone(_cgroup.cpu_quota(os.path.join(sys_fs, "missing"), sys_fs))
        proc, sys_fs = self.tree({"cpu.max": "garbage\n"}, "0::/\nnonsense\n")
        self.assertIsNone(_cgroup.cpu_quota(proc, sys_fs))

    def test_limit_names_where_it_is_set(self) -> None:
        """
        L{_cgroup.cpu_limit} gives the directory of the smallest quota, and
        what that cgroup has used: v2's C{usage_usec}, v1's
        C{cpuacct.usage}; C{None} where it cannot be read.
        """
        proc, sys_fs = self.tree(
            {"pod/cpu.max": "150000 100000\n", "pod/app/cpu.max": "300000 100000\n",
             "pod/cpu.stat": "usage_usec 2500000\nuser_usec 2000000\n"},
            "0::/pod/app\n",
        )
        limit = _cgroup.cpu_limit(proc, sys_fs)
        pod = os.path.join(sys_fs, "pod")
        self.assertEqual(limit, CPULimit(1.5, pod, True, pod))
        assert limit is not None
        self.assertEqual(limit.used_seconds(), 2.5)
        proc, sys_fs = self.tree(
            {"cpu,cpuacct/x/cpu.cfs_quota_us": "50000\n",
             "cpu,cpuacct/x/cpu.cfs_period_us": "100000\n",
             "cpu,cpuacct/x/cpuacct.usage": "1500000000\n"},
            "3:cpu,cpuacct:/x\n",
        )
        limit = _cgroup.cpu_limit(proc, sys_fs)
        assert limit is not None
        self.assertEqual((limit.cpus, limit.v2, limit.used_seconds()), (0.5, False, 1.5))
        missing = os.path.join(sys_fs, "missing")
        self.assertIsNone(CPULimit(1.0, missing, True, missing).used_seconds())
        self.assertIsNone(CPULimit(1.0, missing, False, missing).used_seconds())

    def test_v1_cpuacct_apart(self) -> None:
        """
        With cgroup v1's C{cpuacct} mounted apart from C{cpu}, the use is
        read from its own hierarchy at the same path.
        """
        proc, sys_fs = self.tree(
            {"cpu/x/cpu.cfs_quota_us": "50000\n", "cpu/x/cpu.cfs_period_us": "100000\n",
             "cpuacct/x/cpuacct.usage": "2000000000\n"},
            "2:cpuacct:/x\n1:cpu:/x\n",
        )
        limit = _cgroup.cpu_limit(proc, sys_fs)
        assert limit is not None
        self.assertEqual(limit.directory, os.path.join(sys_fs, "cpu", "x"))
        self.assertEqual(limit.used_seconds(), 2.0)
