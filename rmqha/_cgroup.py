# -*- test-case-name: tests.test_cgroup -*-
"""
A container's CPU limit: the CPU quota of this process's cgroup (v2
C{cpu.max}, v1 C{cpu.cfs_quota_us}/C{cpu.cfs_period_us}) and what the
cgroup where it is set has used.  Busy polling stays off under two CPUs
(L{rmqha._busypoll}); the pre-faulting counts a quota's spare CPU, not
only the host's idle CPUs (L{rmqha.store._prefault}).  A leaf: imports no
other rmqha module.
"""

from __future__ import annotations

import os
from typing import NamedTuple

__all__ = ["CPULimit", "cpu_limit", "cpu_quota"]


class CPULimit(NamedTuple):
    """
    The smallest CPU quota along this process's cgroup path.
    """

    #: In CPUs (a quota of 150000 per 100000 us: 1.5).
    cpus: float
    #: The cgroup directory that sets it.
    directory: str
    #: cgroup v2 (else v1).
    v2: bool
    #: Where its use is counted: the same directory, but with cgroup v1's
    #: C{cpuacct} mounted apart from C{cpu}, that hierarchy's.
    usage_directory: str

    def used_seconds(self) -> float | None:
        """
        The CPU seconds that cgroup has used (v2 C{cpu.stat}'s
        C{usage_usec}; v1 C{cpuacct.usage}), or C{None} when it cannot be
        read.
        """
        try:
            if self.v2:
                with open(os.path.join(self.usage_directory, "cpu.stat")) as f:
                    for line in f:
                        key, _, value = line.partition(" ")
                        if key == "usage_usec":
                            return int(value) / 1e6
                return None
            with open(os.path.join(self.usage_directory, "cpuacct.usage")) as f:
                return int(f.read()) / 1e9
        except (OSError, ValueError):
            return None


def cpu_limit(proc: str = "/proc/self/cgroup", sys_fs: str = "/sys/fs/cgroup") -> CPULimit | None:
    """
    The CPU quota of this process's cgroup and its ancestors: the
    smallest found, C{None} when there is none or it cannot be read.
    """
    try:
        with open(proc) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found: list[CPULimit] = []
    for line in lines:
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        if not path.startswith("/"):
            continue
        if controllers == "":
            directory, v2 = sys_fs, True
            accounting = directory
        elif "cpu" in controllers.split(","):
            directory, v2 = os.path.join(sys_fs, controllers), False
            if not os.path.isdir(directory):
                directory = os.path.join(sys_fs, "cpu")
            accounting = (
                directory if "cpuacct" in controllers.split(",") else os.path.join(sys_fs, "cpuacct")
            )
        else:
            continue
        parts = [p for p in path.split("/") if p and p != ".."]
        for depth in range(len(parts), -1, -1):
            at = os.path.join(directory, *parts[:depth])
            quota = _quota_at(at, v2)
            if quota is not None:
                found.append(CPULimit(quota, at, v2, os.path.join(accounting, *parts[:depth])))
    return min(found, key=lambda limit: limit.cpus) if found else None


def cpu_quota(proc: str = "/proc/self/cgroup", sys_fs: str = "/sys/fs/cgroup") -> float | None:
    """
    The CPU quota of this process's cgroup and its ancestors, in CPUs
    (L{cpu_limit}'s): the smallest found, C{None} when there is none or it
    cannot be read.
    """
    limit = cpu_limit(proc, sys_fs)
    return None if limit is None else limit.cpus


def _quota_at(directory: str, v2: bool) -> float | None:
    try:
        if v2:
            with open(os.path.join(directory, "cpu.max")) as f:
                quota, period = (f.read().split() + ["100000"])[:2]
            if quota == "max":
                return None
            return int(quota) / int(period)
        with open(os.path.join(directory, "cpu.cfs_quota_us")) as f:
            quota_us = int(f.read())
        with open(os.path.join(directory, "cpu.cfs_period_us")) as f:
            period_us = int(f.read())
    except (OSError, ValueError, ZeroDivisionError):
        return None
    if quota_us <= 0 or period_us <= 0:
        return None
    return quota_us / period_us
