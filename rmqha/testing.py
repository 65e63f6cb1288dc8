"""
Helpers for tests and benchmarks that run rmqha for real.
"""

from __future__ import annotations

import sys

__all__ = ["twistd_command", "twistd_slave_command"]


def twistd_command(store_dir: str, log_file: str, *options: str) -> list[str]:
    """
    The argv of a C{twistd -n rmqha} process using this Python, on
    C{store_dir}, logging to C{log_file}, with no pid file; C{options} are
    further C{twistd rmqha} flags (the role among them).
    """
    return [
        sys.executable, "-c", "from twisted.scripts.twistd import run; run()",
        "-n", "--pidfile", "", "--logfile", log_file,
        "rmqha", "--store-dir", store_dir, *options,
    ]


def twistd_slave_command(
    store_dir: str, master_endpoint: str, log_file: str, *options: str
) -> list[str]:
    """
    The argv of a C{twistd -n rmqha --role slave} process using this
    Python, following C{master_endpoint} (a Twisted client endpoint
    description) into C{store_dir}, logging to C{log_file}, with no pid
    file.  C{options} are further C{twistd rmqha} flags.
    """
    return twistd_command(
        store_dir, log_file, "--role", "slave", "--master-endpoint", master_endpoint, *options
    )
