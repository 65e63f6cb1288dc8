"""
Helpers for tests and harnesses that start real processes: the argv of a
C{twistd -n rmqha} master or slave (L{twistd_command},
L{twistd_slave_command}), free ports to tell them (L{free_ports}), and
whether C{etcd} is installed (L{etcd_binary}).

L{twistd_command}, L{free_ports} and L{etcd_binary} are the failover
demo's own (L{rmqha._demo_launcher}, shipped for C{rmqha demo
--failover}), named here for tests and tools.
"""

from __future__ import annotations

from rmqha._demo_launcher import etcd_binary, free_ports, twistd_command

__all__ = ["etcd_binary", "free_ports", "twistd_command", "twistd_slave_command"]


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
