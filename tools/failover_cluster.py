# -*- test-case-name: tests.test_demo_launcher,tests.integration.test_failover -*-
"""
A failover group of real processes, for the failover tests
(tests/integration/test_failover*.py and their scenarios) and the failover
benchmark (C{python -m tools.bench failover}): L{FailoverCluster} is the
demo's L{BrokerGroup} (L{rmqha._demo_launcher}, shipped for
C{rmqha demo --failover}) with what only tests need: each node on its own
address and under its own uid (the partition and cut tests), TLS or no
authentication between nodes, and more C{twistd rmqha} flags.  The
producers, the kill loop and the checks the failover guarantees are
stated in (docs/failover.md, "How it is tested") are the demo's, named
here too.

    with EtcdCluster(tmp) as etcd, FailoverCluster(tmp, etcd.spec) as group:
        master = group.wait_master()
        with Producers(group, 3) as load:
            group.kill(master)
            new = group.wait_master(exclude=[master])
            ...
        assert group.missing_acked(new, load.acked()) == []
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

from rmqha._demo_launcher import (
    TOPIC,
    BrokerGroup,
    Node as _Node,
    Producers,
    Put,
    converge_and_check,
    kill_masters,
    wait_in_sync,
    windows,
)

__all__ = [
    "FailoverCluster", "Node", "Producers", "Put", "TOPIC",
    "converge_and_check", "kill_masters", "wait_in_sync", "windows",
]


@dataclass
class Node(_Node):
    """
    One C{twistd -n rmqha} node of a L{FailoverCluster}.

    @ivar host: the address it listens on and advertises (127.0.0.1, or
        its own loopback address such as 127.0.0.11 for a partition test).
    @ivar user: run as this uid (and gid), or as the caller.
    """

    user: int | None = None


class FailoverCluster(BrokerGroup):
    """
    A L{BrokerGroup} with test-only choices.

    @param hosts: each node's address (default 127.0.0.1 for all).
    @param users: each node's uid (default: this process's); such a node
        runs under C{setpriv}, with its store, log and secret owned by it.
    @param options: more C{twistd rmqha} flags for every node.
    @param auth: how the nodes prove their ids to each other
        (docs/failover.md, "Who counts"): C{"secret"} (the default: a group
        secret, C{--group-secret-file}), C{"tls"} (TLS on the HA port with
        client certificates naming the node ids) or C{"insecure"}
        (C{--insecure-group}).  The files are made with
        L{rmqha.certs.init_group} under C{directory/auth}.
    """

    nodes: list[Node]  # type: ignore[assignment]

    def __init__(
        self,
        directory: str,
        spec: str,
        nodes: int = 3,
        *,
        group: str = "g",
        segment_size: int = 1 << 20,
        lease_ttl: int = 2,
        hosts: Sequence[str] | None = None,
        users: Sequence[int | None] | None = None,
        options: Sequence[str] = (),
        start: bool = True,
        auth: str = "secret",
    ) -> None:
        if auth not in ("secret", "tls", "insecure"):
            raise ValueError(f"auth {auth!r} is not secret, tls or insecure")
        self.auth = auth
        self.options = list(options)
        self._hosts = hosts
        self._users = users
        super().__init__(
            directory, spec, nodes,
            group=group, segment_size=segment_size, lease_ttl=lease_ttl, start=start,
        )

    def __enter__(self) -> FailoverCluster:
        return self

    def _node(self, i: int, ha_port: int, http_port: int) -> Node:
        return Node(
            i,
            f"n{i}",
            os.path.join(self.directory, f"n{i}"),
            self._hosts[i] if self._hosts else "127.0.0.1",
            ha_port,
            http_port,
            user=self._users[i] if self._users else None,
        )

    def _write_auth(self) -> list[list[str]]:
        """
        The group's CA, key pairs and secret (L{rmqha.certs.init_group}),
        and each node's flags.  A node running as another user gets its
        own copy of the secret and its key, owned by that user (they must
        not be readable by others).
        """
        from rmqha.certs import init_group

        if self.auth == "insecure":
            return [["--insecure-group"] for _ in self.nodes]
        where = os.path.join(self.directory, "auth")
        written = init_group(where, self.group, [n.node_id for n in self.nodes])
        flags = []
        for node in self.nodes:
            cert, key = written.nodes[node.node_id]
            secret = written.secret
            if node.user is not None:
                secret = os.path.join(where, f"{node.node_id}.secret")
                with open(written.secret, "rb") as f:
                    data = f.read()
                fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                for path in (secret, key):
                    os.chown(path, node.user, node.user)
            if self.auth == "secret":
                flags.append(["--group-secret-file", secret])
            else:
                # (The ssl --ha-listen, with the node's port: command.)
                flags.append([
                    "--tls-cert", cert, "--tls-key", key, "--tls-ca", written.ca,
                    "--tls-require-client-cert",
                ])
        return flags

    def command(self, i: int) -> list[str]:
        """
        The argv that starts node C{i}: the demo's, then C{options}
        (with TLS, its C{--ha-listen ssl:...} comes after the plain one,
        and wins), under C{setpriv} for a node with its own uid.
        """
        node = self.nodes[i]
        argv = super().command(i)
        if self.auth == "tls":
            argv += ["--ha-listen", f"ssl:{node.ha_port}:interface={node.host}"]
        argv += self.options
        user = node.user
        if user is not None:
            argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
        return argv

    def _prepare(self, i: int) -> None:
        """
        The store directory, and for a node with its own uid, its store,
        log and stderr files owned by that uid.
        """
        super()._prepare(i)
        node = self.nodes[i]
        if node.user is not None:
            for path in (node.store, self.log_path(i), self.err_path(i)):
                if not os.path.exists(path):
                    open(path, "a").close()
                os.chown(path, node.user, node.user)

