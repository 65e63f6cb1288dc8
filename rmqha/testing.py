# -*- test-case-name: tests.test_testing -*-
"""
Public fakes for testing code that embeds rmqha, and for rmqha's own tests
(treq's C{treq.testing} is the model).

In memory, on a L{Clock}, no sockets:

    - L{connect_in_memory}: a master-side and a slave-side factory joined
      by one in-memory connection (C{twisted.test.iosim}), plain or TLS
      (rmqha's L{TLSFactory} on either side, on the same clock), with an
      optional fault on the wire; the L{MemoryConnection} it returns moves
      the bytes (L{MemoryConnection.flush}) and hangs up.
    - L{StringEndpoint}: a client endpoint whose connections are
      L{StringTransport}s, or that refuses them.

For real processes and sockets:

    - L{FaultProxy} (from L{rmqha.faultproxy}, a real-socket TCP proxy:
      delay, stall, reset, half-open, flipped bits) to put between a master
      and a slave.
    - L{twistd_command} and L{twistd_slave_command}: the argv of a
      C{twistd -n rmqha} process.
    - L{EtcdCluster}: one or three C{etcd} members on 127.0.0.1 (free
      ports, data under a temporary directory) for a coordinator to use;
      L{etcd_binary} says whether etcd is installed.
    - A whole failover group (C{twistd} nodes under an L{EtcdCluster},
      HTTP producers following the master hint, the acked-put and store
      checks): L{rmqha.failover_cluster}.

Example, a slave replicating a master's log in memory::

    clock = Clock()
    connection = connect_in_memory(
        MasterFactory(source, clock), SlaveFactory(replica, clock), clock
    )
    connection.slave.send_report()
    connection.flush()
    assert replica.max_offset == source.max_offset
    connection.hang_up()
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.interfaces import (
    IAddress,
    IProtocol,
    IProtocolFactory,
    IStreamClientEndpoint,
)
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.protocols.tls import TLSMemoryBIOProtocol
from twisted.test import iosim
from zope.interface import implementer

from rmqha._tlsbio import TLSFactory

from rmqha.faultproxy import FaultProxy, Faults

__all__ = [
    "EtcdCluster",
    "Fault",
    "FaultProxy",
    "Faults",
    "MASTER_ADDRESS",
    "MemoryConnection",
    "SLAVE_ADDRESS",
    "StringEndpoint",
    "connect_in_memory",
    "etcd_binary",
    "free_ports",
    "twistd_command",
    "twistd_slave_command",
]

#: Where the master listens and where the slave connects from, as each
#: side of an in-memory connection sees the other.
MASTER_ADDRESS = IPv4Address("TCP", "127.0.0.1", 10912)
SLAVE_ADDRESS = IPv4Address("TCP", "127.0.0.1", 50000)

#: C{fault(data, to_slave)}: what arrives of C{data} (bytes one side wrote,
#: C{to_slave} when the master wrote them).
Fault = Callable[[bytes, bool], bytes]


class MemoryConnection:
    """
    One in-memory connection between a master-side and a slave-side
    protocol, made by L{connect_in_memory}.

    @ivar master: the protocol the master-side factory built (under TLS,
        the one inside the TLS layer).
    @ivar slave: likewise on the slave side.
    @ivar server: the outermost master-side protocol (the TLS layer under
        TLS, else C{master}).
    @ivar client: likewise on the slave side.
    @ivar server_transport: the master side's L{iosim.FakeTransport}.
    @ivar client_transport: the slave side's transport.
    @ivar clock: the clock both sides (and TLS) run on.
    """

    def __init__(
        self,
        server: Any,
        client: Any,
        server_transport: iosim.FakeTransport,
        client_transport: iosim.FakeTransport,
        clock: Clock,
        fault: Fault | None,
        read_size: int | None,
    ) -> None:
        self.server, self.client = server, client
        self.master = _inner(server)
        self.slave = _inner(client)
        self.server_transport = server_transport
        self.client_transport = client_transport
        self.clock = clock
        self._fault = fault
        self._read_size = read_size
        self._pump = iosim.IOPump(
            client, server, client_transport, server_transport, False, clock=clock
        )

    @property
    def dropped(self) -> bool:
        """
        Whether either side has closed or aborted the connection.
        """
        return bool(self.server_transport.disconnecting or self.client_transport.disconnecting)

    def flush(self, limit: int = 100_000) -> None:
        """
        Until nothing moves: run the calls due on the clock (C{advance(0)}:
        TLS and the protocols write on the next turn), then deliver
        everything written, both ways, and a hang-up to the other side.

        With a fault (see L{connect_in_memory}), bytes go through it in
        reads of at most C{read_size}, and delivery stops as soon as either
        side drops the connection: what was in flight is lost, as on a
        reset; L{hang_up} then tells both sides.

        @param limit: how many rounds before giving up with
            C{AssertionError} (a conversation that never goes quiet).
        """
        for _ in range(limit):
            if self._fault is None and self._read_size is None:
                moved = self._pump.pump()
            else:
                moved = self._pump_faulty()
            if not moved:
                return
        raise AssertionError(f"the in-memory connection was still busy after {limit} rounds")

    def _pump_faulty(self) -> bool:
        if self.dropped:
            return False
        self.clock.advance(0)
        to_master = self.client_transport.getOutBuffer()
        to_slave = self.server_transport.getOutBuffer()
        # As iosim's pump: a pull producer gets its turn.
        self.client_transport._checkProducer()
        self.server_transport._checkProducer()
        fault = self._fault or (lambda data, to_slave: data)
        for data, to_slave_side in ((to_master, False), (to_slave, True)):
            if not data:
                continue
            receiver = self.client_transport if to_slave_side else self.server_transport
            piece = self._read_size or len(data)
            for i in range(0, len(data), piece):
                if self.dropped:
                    return False
                receiver.bufferReceived(fault(data[i : i + piece], to_slave_side))
        return bool(to_master or to_slave)

    def hang_up(self) -> None:
        """
        Close the connection from the slave's side and let both sides
        see it (then run the calls due on the clock).  Safe to call twice.
        """
        if self._fault is None and self._read_size is None:
            self.client_transport.loseConnection()
            self._pump.flush()
        else:
            for transport in (self.server_transport, self.client_transport):
                if not transport.disconnected:
                    transport.disconnected = True
                    transport.reportDisconnect()
        self.clock.advance(0)


def _inner(protocol: Any) -> Any:
    if isinstance(protocol, TLSMemoryBIOProtocol):
        return protocol.wrappedProtocol
    return protocol


def connect_in_memory(
    master: IProtocolFactory,
    slave: IProtocolFactory,
    clock: Clock,
    *,
    master_tls: Any = None,
    slave_tls: Any = None,
    fault: Fault | None = None,
    read_size: int | None = None,
    slave_transport: Callable[[IProtocol], iosim.FakeTransport] | None = None,
    master_address: IAddress = MASTER_ADDRESS,
    slave_address: IAddress = SLAVE_ADDRESS,
) -> MemoryConnection:
    """
    Connect a protocol from C{master} (the accepting side) to one from
    C{slave} (the dialling side) in memory; nothing moves until
    L{MemoryConnection.flush}.

    @param master: builds the master side, given C{slave_address}.
    @param slave: builds the slave side (a C{SlaveFactory}, or any client
        factory, e.g. C{Factory.forProtocol(ControlClient)}), given
        C{master_address}.
    @param clock: what both sides and TLS schedule on.
    @param master_tls: a server TLS connection creator (e.g.
        L{rmqha.tls.server_context}'s); the master side then speaks TLS.
    @param slave_tls: a client TLS connection creator (e.g.
        C{optionsForClientTLS(...)}); the slave side then speaks TLS.
        Either side may speak TLS without the other (a misconfiguration).
    @param fault: C{fault(data, to_slave)} returns what arrives of
        C{data}; see L{MemoryConnection.flush}.
    @param read_size: deliver in reads of at most this many bytes (with a
        fault: what one read of the faulty link carries).
    @param slave_transport: makes the slave side's transport from its
        outermost protocol (default: an L{iosim.FakeTransport} with the
        two addresses).
    """
    if master_tls is not None:
        master = TLSFactory(master_tls, False, master, clock=clock)
    if slave_tls is not None:
        slave = TLSFactory(slave_tls, True, slave, clock=clock)
    server = master.buildProtocol(slave_address)
    client = slave.buildProtocol(master_address)
    if server is None or client is None:
        raise ValueError("a factory refused to build a protocol")
    server_transport = iosim.FakeTransport(
        server, isServer=True, hostAddress=master_address, peerAddress=slave_address
    )
    if slave_transport is None:
        client_transport = iosim.FakeTransport(
            client, isServer=False, hostAddress=slave_address, peerAddress=master_address
        )
    else:
        client_transport = slave_transport(client)
    server.makeConnection(server_transport)
    client.makeConnection(client_transport)
    return MemoryConnection(
        server, client, server_transport, client_transport, clock, fault, read_size
    )


@implementer(IStreamClientEndpoint)
class StringEndpoint:
    """
    A client endpoint whose connections are C{StringTransport}s (kept in
    C{connected} with their protocols, newest last), or that refuses them
    while C{refuse} is set.  A C{ClientService} given one dials it as it
    would a real master.
    """

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.connected: list[tuple[Any, StringTransport]] = []

    def connect(self, factory: IProtocolFactory) -> Deferred[Any]:
        if self.refuse:
            return fail(ConnectionRefusedError())
        protocol = factory.buildProtocol(MASTER_ADDRESS)
        transport = StringTransport()
        assert protocol is not None
        protocol.makeConnection(transport)
        self.connected.append((protocol, transport))
        return succeed(protocol)


def free_ports(count: int) -> list[int]:
    """
    C{count} different TCP ports on 127.0.0.1, free a moment ago, for
    processes that must be told their ports in advance (C{twistd}
    children, JVMs, a server that comes back on the same port); an
    in-process listener binds port 0 instead.  The ports are held
    together while they are picked, so no two are the same (one at a
    time, the kernel may hand out a port it just gave).
    """
    import socket
    from contextlib import ExitStack

    with ExitStack() as stack:
        ports = []
        for _ in range(count):
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            ports.append(int(s.getsockname()[1]))
        return ports


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


def etcd_binary() -> str | None:
    """
    The C{etcd} executable (Debian's C{etcd-server}), or C{None}.
    """
    import os
    import shutil

    found = shutil.which("etcd")
    if found is None and os.access("/usr/bin/etcd", os.X_OK):
        found = "/usr/bin/etcd"
    return found


class EtcdCluster:
    """
    C{members} etcd members (1 or 3) on 127.0.0.1, on free ports, their
    data and logs under C{directory}: for tests, never port 2379.  The
    constructor starts them all and waits until each says it is healthy;
    L{stop_all} (also on leaving a C{with} block) ends every process it
    started, by PID.

    The methods block (subprocess, a short HTTP poll): call them from
    fixtures or between reactor turns, not from reactor callbacks that
    must stay fast.

    With C{tls} (a L{rmqha.tls.TLSFiles}: certificate, key, CA) the
    client URLs are C{https://} with that certificate (it must name
    127.0.0.1); with C{tls.ca}, etcd demands client certificates from that
    CA, and this helper's own checks present C{tls}'s pair, which must
    then allow client authentication too.  Peers talk plain HTTP.

    @ivar endpoints: each member's client URL, C{http://127.0.0.1:PORT}.
    """

    def __init__(
        self, directory: str, members: int = 1, timeout: float = 10.0,
        binary: str | None = None, tls: Any = None, args: tuple[str, ...] = (),
    ) -> None:
        """
        @param args: more arguments for every member (C{--auth-token-ttl 1}).
        """
        import os

        if members not in (1, 3):
            raise ValueError(f"EtcdCluster: members={members}: 1 or 3")
        found = binary or etcd_binary()
        if found is None:
            raise FileNotFoundError("etcd is not installed (Debian: apt-get install etcd-server)")
        self._binary = found
        self._directory = directory
        self._timeout = timeout
        self._tls = tls
        self._args = tuple(args)
        os.makedirs(directory, exist_ok=True)
        ports = free_ports(3 * members)
        self._client = ports[0:members]
        self._peer = ports[members:2 * members]
        self._metrics = ports[2 * members:]
        scheme = "http" if tls is None else "https"
        self.endpoints = [f"{scheme}://127.0.0.1:{p}" for p in self._client]
        self._initial = ",".join(
            f"m{i}=http://127.0.0.1:{p}" for i, p in enumerate(self._peer)
        )
        self._processes: list[Any] = [None] * members
        self._logs: list[Any] = [None] * members
        # The data directories this instance creates (and so may delete):
        # etcd preallocates 64 MB of WAL per member, far too much to leave.
        self._created = [
            self._data(i) for i in range(members) if not os.path.exists(self._data(i))
        ]
        try:
            for i in range(members):
                self.start(i, wait=False)
            self.wait_healthy()
        except BaseException:
            self.stop_all()
            raise

    @property
    def spec(self) -> str:
        """
        The C{--coordinator} for every member.
        """
        return "etcd:" + ",".join(self.endpoints)

    def __enter__(self) -> EtcdCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop_all()

    def _data(self, i: int) -> str:
        import os

        return os.path.join(self._directory, f"m{i}.etcd")

    def start(self, i: int, wait: bool = True) -> None:
        """
        Start member C{i} (again, on its data directory if it has one);
        with C{wait}, until it says it is healthy (which needs a quorum).
        """
        import os
        import subprocess

        if self.running(i):
            return
        name = f"m{i}"
        argv = [
            self._binary, "--name", name,
            "--data-dir", self._data(i),
            "--listen-client-urls", self.endpoints[i],
            "--advertise-client-urls", self.endpoints[i],
            "--listen-peer-urls", f"http://127.0.0.1:{self._peer[i]}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{self._peer[i]}",
            "--listen-metrics-urls", f"http://127.0.0.1:{self._metrics[i]}",
            "--initial-cluster", self._initial,
            "--initial-cluster-state", "new",
            "--initial-cluster-token", f"rmqha-test-{self._peer[0]}",
        ]
        if self._tls is not None:
            argv += ["--cert-file", self._tls.cert, "--key-file", self._tls.key]
            if self._tls.ca is not None:
                argv += ["--client-cert-auth", "--trusted-ca-file", self._tls.ca]
        argv += self._args
        if self._logs[i] is None:
            self._logs[i] = open(os.path.join(self._directory, f"{name}.log"), "ab")
        self._processes[i] = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=self._logs[i], stderr=subprocess.STDOUT
        )
        if wait:
            self.wait_healthy([i])

    def running(self, i: int) -> bool:
        process = self._processes[i]
        return process is not None and process.poll() is None

    def healthy(self, i: int) -> bool:
        """
        Whether member C{i} answers C{GET /health} with true (it has a
        leader).
        """
        try:
            return bool(self._ask(i, "/health").get("health") == "true")
        except (OSError, ValueError):
            return False

    def _ask(self, i: int, path: str, data: bytes | None = None) -> Any:
        """
        Member C{i}'s JSON answer to a GET (or a POST of C{data}).
        """
        import json
        import ssl
        import urllib.request

        context = None
        if self._tls is not None:
            context = ssl.create_default_context(cafile=self._tls.ca)
            context.load_cert_chain(self._tls.cert, self._tls.key)
        request = urllib.request.Request(
            self.endpoints[i] + path, data=data, method="GET" if data is None else "POST"
        )
        with urllib.request.urlopen(request, timeout=0.5, context=context) as answer:
            return json.load(answer)

    def wait_healthy(self, members: list[int] | None = None) -> None:
        """
        Wait until every running member in C{members} (default all) is
        healthy.

        @raise RuntimeError: one is not within the timeout, or died
            (naming its log).
        """
        import os
        import time

        indices = range(len(self.endpoints)) if members is None else members
        deadline = time.monotonic() + self._timeout
        for i in indices:
            while not self.healthy(i):
                log = os.path.join(self._directory, f"m{i}.log")
                if not self.running(i):
                    raise RuntimeError(f"etcd member {i} exited (see {log})")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"etcd member {i} not healthy after {self._timeout:g} s (see {log})")
                time.sleep(0.02)

    def kill(self, i: int) -> None:
        """
        SIGKILL member C{i} and reap it.
        """
        process = self._processes[i]
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def stop(self, i: int) -> None:
        """
        SIGTERM member C{i} (a leader hands over first), SIGKILL after 5 s.
        """
        import subprocess

        process = self._processes[i]
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def stop_all(self) -> None:
        """
        SIGKILL every member this started and reap it, close the logs, and
        delete the data directories this instance created (each holds
        64 MB of preallocated WAL; the logs stay).  SIGTERM to all at once
        would take seconds, as a leader waits to hand over to members that
        are leaving too.
        """
        import shutil

        for i in range(len(self._processes)):
            try:
                self.kill(i)
            except OSError:
                pass
        for i, log in enumerate(self._logs):
            if log is not None:
                log.close()
                self._logs[i] = None
        for data in self._created:
            shutil.rmtree(data, ignore_errors=True)
        self._created = []

    def etcdctl(
        self, *argv: str, user: str | None = None, password: str | None = None,
        stdin: str | None = None,
    ) -> str:
        """
        Run C{etcdctl argv} against the running members (as C{user}; the
        password goes through its environment, never its command line;
        C{stdin}, e.g. a new user's password with C{--interactive=false}).

        @return: what it printed.
        @raise RuntimeError: it failed (with what it said).
        """
        import os
        import shutil
        import subprocess

        binary = shutil.which("etcdctl") or "/usr/bin/etcdctl"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "ETCDCTL_API": "3",
            "ETCDCTL_ENDPOINTS": ",".join(
                e for i, e in enumerate(self.endpoints) if self.running(i)
            ),
            "ETCDCTL_DIAL_TIMEOUT": "2s",
        }
        if user is not None:
            env["ETCDCTL_USER"] = f"{user}:{password or ''}"
        if self._tls is not None:
            env["ETCDCTL_CACERT"] = self._tls.ca or ""
            env["ETCDCTL_CERT"] = self._tls.cert
            env["ETCDCTL_KEY"] = self._tls.key
        done = subprocess.run(
            [binary, *argv], input=stdin, env=env, capture_output=True, text=True,
            timeout=self._timeout,
        )
        if done.returncode != 0:
            said = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise RuntimeError(f"etcdctl {argv[0] if argv else ''}: {said}")
        return done.stdout

    def leader_index(self) -> int | None:
        """
        The index of the member that is the Raft leader, as the running
        members say (C{/v3/maintenance/status}); C{None} without one.
        """
        ids: dict[str, int] = {}
        leader = None
        for i in range(len(self.endpoints)):
            if not self.running(i):
                continue
            try:
                status = self._ask(i, "/v3/maintenance/status", b"{}")
            except (OSError, ValueError):
                continue
            ids[str(status.get("header", {}).get("member_id"))] = i
            leader = status.get("leader", leader)
        return None if leader is None else ids.get(str(leader))
