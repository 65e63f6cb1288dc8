# -*- test-case-name: tests.test_demo_launcher,tests.integration.test_demo -*-
"""
The failover demo's launcher (C{rmqha demo --failover}, L{rmqha.demo}):
one local C{etcd} member (L{LocalEtcd}), a group of C{twistd -n rmqha}
broker processes on 127.0.0.1 (L{BrokerGroup}), HTTP producers that
follow the master hint (L{Producers}), the kill-and-restart loop
(L{kill_masters}) and the end checks the demo shows
(L{converge_and_check}).

It is the demo's and ships with it, so that an installed rmqha runs the
demo; nothing in the broker uses it.  Like a demo, it blocks
(subprocesses, C{urllib} with a timeout on every request, one thread per
producer) and measures with C{time.monotonic} in one process, so every
timestamp it records is on the same clock.

The failover tests and benchmark build on it from a checkout:
C{tools.failover_cluster} (nodes on their own addresses and uids, TLS or
no authentication, extra flags) and C{tools.etcd_cluster} (three members,
TLS, C{etcdctl}).

    with LocalEtcd(tmp) as etcd, BrokerGroup(tmp, etcd.spec) as group:
        master = group.wait_master()
        with Producers(group, 3) as load:
            group.kill(master)
            new = group.wait_master(exclude=[master])
            ...
        assert group.missing_acked(new, load.acked()) == []
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from rmqha.store._record import Blank, RecordError, parse_record

__all__ = [
    "BrokerGroup", "LocalEtcd", "Node", "Producers", "Put", "TOPIC",
    "converge_and_check", "etcd_binary", "free_ports", "kill_masters", "twistd_command",
    "wait_in_sync", "windows",
]

def free_ports(count: int) -> list[int]:
    """
    C{count} different TCP ports on 127.0.0.1, free a moment ago, for
    processes that must be told their ports in advance (C{twistd}
    children, JVMs, a server that comes back on the same port); an
    in-process listener binds port 0 instead.  The ports are held
    together while they are picked, so no two are the same.

    They are picked at random below the kernel's ephemeral range
    (C{ip_local_port_range}) when there is room there: a port from that
    range (what binding port 0 gives) is also what any outgoing
    connection on the machine may take before the child binds it, or
    while it is down between two starts; one below it only another
    explicit bind can.  Without that room (or the file), from port 0.
    """
    import random
    import socket
    from contextlib import ExitStack

    low = _ephemeral_low()
    with ExitStack() as stack:
        ports: list[int] = []
        tries = 0
        while len(ports) < count:
            s = stack.enter_context(socket.socket())
            if low > _PICK_FROM + 1000 and tries < 50 * count:
                tries += 1
                port = random.randrange(_PICK_FROM, low)
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            else:
                s.bind(("127.0.0.1", 0))
            ports.append(int(s.getsockname()[1]))
        return ports


#: How long L{BrokerGroup.start} watches a node it started for a port
#: taken under it (L{BrokerGroup._lost_its_port}), seconds.
START_WAIT = 15.0
#: Starts L{BrokerGroup.start} makes of a node whose port was taken.
PORT_TRIES = 3


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read_from(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return ""


#: Where L{free_ports} picks from, up to the ephemeral range.
_PICK_FROM = 20000


def _ephemeral_low(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    """
    The first port of the kernel's ephemeral range, or 0 (unknown).
    """
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


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


class LocalEtcd:
    """
    One C{etcd} member on 127.0.0.1 for the demo's coordinator: free
    ports (never 2379), data and log under C{directory}.  The constructor
    starts it and waits until it says it is healthy; L{stop} (also on
    leaving a C{with} block) kills it by PID and deletes its data (64 MB
    of preallocated WAL; the log stays).

    @ivar endpoint: its client URL, C{http://127.0.0.1:PORT}.
    """

    def __init__(self, directory: str, timeout: float = 10.0) -> None:
        found = etcd_binary()
        if found is None:
            raise FileNotFoundError("etcd is not installed (Debian: apt-get install etcd-server)")
        os.makedirs(directory, exist_ok=True)
        client, peer, metrics = free_ports(3)
        self.endpoint = f"http://127.0.0.1:{client}"
        self._data = os.path.join(directory, "m0.etcd")
        self.log_path = os.path.join(directory, "m0.log")
        argv = [
            found, "--name", "m0",
            "--data-dir", self._data,
            "--listen-client-urls", self.endpoint,
            "--advertise-client-urls", self.endpoint,
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--listen-metrics-urls", f"http://127.0.0.1:{metrics}",
            "--initial-cluster", f"m0=http://127.0.0.1:{peer}",
            "--initial-cluster-state", "new",
            "--initial-cluster-token", f"rmqha-demo-{peer}",
        ]
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        try:
            self._wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise

    @property
    def spec(self) -> str:
        """
        The C{--coordinator} for the brokers.
        """
        return "etcd:" + self.endpoint

    def __enter__(self) -> LocalEtcd:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(self.endpoint + "/health", timeout=0.5) as answer:
                    if json.load(answer).get("health") == "true":
                        return
            except (OSError, ValueError):
                pass
            if self._process.poll() is not None:
                raise RuntimeError(f"etcd exited (see {self.log_path})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd not healthy after {timeout:g} s (see {self.log_path})")
            time.sleep(0.02)

    def stop(self) -> None:
        """
        SIGKILL the member, reap it and delete its data directory.
        """
        import shutil

        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        shutil.rmtree(self._data, ignore_errors=True)

#: The topic the producers put on.
TOPIC = "FailoverTopic"


@dataclass
class Node:
    """
    One C{twistd -n rmqha} node of a L{BrokerGroup}.

    @ivar host: the address it listens on and advertises.
    """

    index: int
    node_id: str
    store: str
    host: str
    ha_port: int
    http_port: int
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def http(self) -> str:
        """
        HOST:PORT of its admin HTTP, as it advertises it.
        """
        return f"{self.host}:{self.http_port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class BrokerGroup:
    """
    C{nodes} rmqha nodes of one group under the coordinator C{spec}, each
    in its own C{twistd} process with its own store under C{directory},
    on 127.0.0.1, started by the constructor (as slaves: the election
    decides); L{close} (also on leaving a C{with} block) ends every
    process it started, by PID.

    The nodes prove their ids to each other with a group secret
    (docs/failover.md, "Who counts"), made with L{rmqha.certs.init_group}
    under C{directory/auth} with a CA and a key pair per node.
    """

    def __init__(
        self,
        directory: str,
        spec: str,
        nodes: int = 3,
        *,
        group: str = "g",
        segment_size: int = 1 << 20,
        lease_ttl: int = 2,
        start: bool = True,
    ) -> None:
        self.directory = directory
        self.spec = spec
        self.group = group
        self.segment_size = segment_size
        self.lease_ttl = lease_ttl
        ports = free_ports(2 * nodes)
        self.nodes = [self._node(i, ports[2 * i], ports[2 * i + 1]) for i in range(nodes)]
        #: Node index -> its authentication flags.
        self._auth_flags = self._write_auth()
        if start:
            try:
                self.start_many([node.index for node in self.nodes])
            except BaseException:
                self.close()
                raise

    def __enter__(self) -> BrokerGroup:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _node(self, i: int, ha_port: int, http_port: int) -> Node:
        return Node(i, f"n{i}", os.path.join(self.directory, f"n{i}"), "127.0.0.1", ha_port, http_port)

    def _write_auth(self) -> list[list[str]]:
        """
        The group's CA, key pairs and secret (L{rmqha.certs.init_group}),
        and each node's flags.
        """
        from rmqha.certs import init_group

        written = init_group(
            os.path.join(self.directory, "auth"), self.group, [n.node_id for n in self.nodes]
        )
        return [["--group-secret-file", written.secret] for _ in self.nodes]

    def log_path(self, i: int) -> str:
        return os.path.join(self.directory, f"n{i}.log")

    def err_path(self, i: int) -> str:
        """
        Where node C{i}'s stdout and stderr go: what C{twistd} says before
        its log is open (a usage error).
        """
        return os.path.join(self.directory, f"n{i}.err")

    def command(self, i: int) -> list[str]:
        """
        The argv that starts node C{i}.
        """
        node = self.nodes[i]
        return twistd_command(
            node.store, self.log_path(i),
            "--coordinator", self.spec,
            "--group", self.group,
            "--node-id", node.node_id,
            "--role", "SYNC_MASTER",
            "--advertise", f"{node.host}:{node.ha_port}",
            "--ha-listen", f"tcp:{node.ha_port}:interface={node.host}",
            "--http", f"tcp:{node.http_port}:interface={node.host}",
            "--advertise-http", node.http,
            "--lease-ttl", str(self.lease_ttl),
            "--segment-size", str(self.segment_size),
            "--heartbeat-interval", "500",
            "--housekeeping-interval", "3000",
            *self._auth_flags[i],
        )

    def start(self, i: int, *extra: str) -> None:
        """
        Start node C{i} (again, on its store), with C{extra} flags this
        time only.  A port of its taken between L{free_ports} picking it
        and the node binding it (another process on the machine picked it
        too) is not the node's failure: the node is started again on new
        ports, up to L{PORT_TRIES} times (see L{_lost_its_port}).
        """
        self.start_many([i], extra)

    def start_many(self, indices: Sequence[int], extra: Sequence[str] = ()) -> None:
        """
        L{start} each of C{indices} that is not running, all at once (the
        watch for a port taken under one runs while the others start).
        """
        pending = [i for i in indices if not self.nodes[i].running]
        for attempt in range(PORT_TRIES):
            marks: dict[int, tuple[int, int]] = {}
            for i in pending:
                node = self.nodes[i]
                self._prepare(i)
                marks[i] = (_size(self.log_path(i)), _size(self.err_path(i)))
                with open(self.err_path(i), "ab") as err:
                    node.process = self._popen(i, extra, err)
                node.starts += 1
            if attempt == PORT_TRIES - 1:
                return
            pending = [i for i in pending if self._lost_its_port(i, *marks[i])]
            if not pending:
                return
            for i in pending:
                self.nodes[i].ha_port, self.nodes[i].http_port = free_ports(2)

    def _prepare(self, i: int) -> None:
        """
        What node C{i}'s start needs on disk: its store directory.
        """
        os.makedirs(self.nodes[i].store, exist_ok=True)

    def _lost_its_port(self, i: int, log_at: int, err_at: int) -> bool:
        """
        Whether node C{i}, just started, exited because a port it was told
        was in use: it is watched until its log grows past C{log_at} (a
        node opens its log once its ports are bound:
        L{rmqha.assemble}), it exits, or L{START_WAIT} passes (then it is
        left to start in its own time, as before this check).
        """
        process = self.nodes[i].process
        assert process is not None
        deadline = time.monotonic() + START_WAIT
        while time.monotonic() < deadline:
            if process.poll() is not None:
                said = _read_from(self.err_path(i), err_at)
                return "cannot listen on" in said and "in use" in said
            if _size(self.log_path(i)) > log_at:
                return False
            time.sleep(0.05)
        return False

    def _popen(self, i: int, extra: Sequence[str], err: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self.command(i) + list(extra),
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
            env=dict(os.environ, PYTHONPATH=_root() + os.pathsep + os.environ.get("PYTHONPATH", "")),
        )

    def kill(self, i: int) -> None:
        """
        SIGKILL node C{i} and reap it.
        """
        self.signal(i, signal.SIGKILL)
        process = self.nodes[i].process
        if process is not None:
            process.wait()

    def signal(self, i: int, signum: int) -> None:
        process = self.nodes[i].process
        if process is not None and process.poll() is None:
            process.send_signal(signum)

    def stop(self, i: int, timeout: float = 20.0) -> int | None:
        """
        SIGTERM node C{i} (a clean stop), SIGKILL after C{timeout}; its
        exit status.
        """
        process = self.nodes[i].process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)
            process.terminate()
        return self._reap(process, timeout)

    @staticmethod
    def _reap(process: subprocess.Popen[bytes], timeout: float) -> int | None:
        """
        Wait for a signalled node's exit, SIGKILL it after C{timeout}.
        """
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        return process.returncode

    def stop_all(self, timeout: float = 20.0) -> None:
        """
        Stop every node cleanly (all at once: one SIGTERM each), then wait
        for each, SIGKILL after C{timeout}.
        """
        for node in self.nodes:
            if node.running:
                self.signal(node.index, signal.SIGCONT)
                self.signal(node.index, signal.SIGTERM)
        for node in self.nodes:
            if node.process is not None:
                # (Not stop(): a second SIGTERM while the first shuts the
                # node down makes twistd log ReactorNotRunning as critical.)
                self._reap(node.process, timeout)

    def close(self) -> None:
        """
        SIGKILL every node still running and reap it.
        """
        for node in self.nodes:
            try:
                self.kill(node.index)
            except OSError:
                pass

    # -- what the nodes say ----------------------------------------------------

    def status(self, i: int, timeout: float = 1.0) -> dict[str, Any] | None:
        """
        Node C{i}'s C{GET /status}, or C{None} when it does not answer.
        """
        node = self.nodes[i]
        if not node.running:
            return None
        try:
            with urllib.request.urlopen(f"http://{node.http}/status", timeout=timeout) as answer:
                result: dict[str, Any] = json.load(answer)
                return result
        except (OSError, ValueError):
            return None

    def masters(self, skip: Iterable[int] = ()) -> list[int]:
        """
        The nodes (but those in C{skip}, not asked) whose C{/status} says
        they are the elected master.
        """
        found = []
        skipped = set(skip)
        for node in self.nodes:
            if node.index in skipped:
                continue
            status = self.status(node.index)
            if status is not None and (status.get("failover") or {}).get("is_master"):
                found.append(node.index)
        return found

    def wait_master(
        self, timeout: float = 30.0, exclude: Iterable[int] = (), poll: float = 0.02
    ) -> int:
        """
        Wait until exactly one node (not in C{exclude}) says it is the
        master, and return it.

        @raise AssertionError: none within C{timeout} (the nodes' states
            and log names in the message).
        """
        excluded = set(exclude)
        deadline = time.monotonic() + timeout
        while True:
            # (Not asking the excluded: a partitioned node would hold each
            # poll up for the request timeout.)
            found = self.masters(skip=excluded)
            if len(found) == 1:
                return found[0]
            if time.monotonic() > deadline:
                notes = {
                    n.node_id: (self.status(n.index) or {}).get("failover") for n in self.nodes
                }
                raise AssertionError(
                    f"no single master within {timeout:g} s (found {found}); "
                    f"nodes: {notes}; logs: {self.directory}/n*.log"
                )
            time.sleep(poll)

    def wait_converged(self, timeout: float = 60.0) -> int:
        """
        Wait until every node is running, one is master, every other
        follows it and all hold the same max offset; return the master.
        """
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            statuses = [self.status(n.index) for n in self.nodes]
            last = statuses
            masters = [
                i for i, s in enumerate(statuses)
                if s is not None and (s.get("failover") or {}).get("is_master")
            ]
            if None not in statuses and len(masters) == 1:
                ends = {s["max_offset"] for s in statuses if s is not None}
                master = statuses[masters[0]]
                assert master is not None
                acked = [s.get("ack_offset") for s in master.get("slaves", [])]
                if (
                    len(ends) == 1
                    and len(acked) == len(self.nodes) - 1
                    and all(a == master["max_offset"] for a in acked)
                ):
                    return masters[0]
            time.sleep(0.1)
        raise AssertionError(f"the group did not converge within {timeout:g} s: {last}")

    # -- what the stores hold -----------------------------------------------------

    def missing_acked(self, i: int, puts: Iterable[Put]) -> list[Put]:
        """
        The puts (answered C{PUT_OK}) that node C{i}'s commit log does not
        hold where they were acknowledged: the record at the put's offset,
        read from the segment file (the node may be running), must carry
        the put's key and body.
        """
        missing = []
        directory = os.path.join(self.nodes[i].store, "commitlog")
        handles: dict[int, Any] = {}
        try:
            for put in puts:
                assert put.offset is not None and put.next_offset is not None
                base = put.offset - put.offset % self.segment_size
                handle = handles.get(base)
                if handle is None:
                    try:
                        handle = handles[base] = open(os.path.join(directory, f"{base:020d}"), "rb")
                    except FileNotFoundError:
                        missing.append(put)
                        continue
                handle.seek(put.offset - base)
                raw = handle.read(put.next_offset - put.offset)
                try:
                    record = parse_record(raw, 0, len(raw), put.offset)
                except RecordError:
                    missing.append(put)
                    continue
                if (
                    isinstance(record, Blank)
                    or record.keys != put.key
                    or record.body != put.body
                ):
                    missing.append(put)
        finally:
            for handle in handles.values():
                handle.close()
        return missing

    def store_check(self, i: int) -> subprocess.CompletedProcess[str]:
        """
        C{rmqha store check} on node C{i}'s store (stop it first).
        """
        return subprocess.run(
            [sys.executable, "-m", "rmqha", "store", "check", self.nodes[i].store],
            capture_output=True, text=True, timeout=300,
            env=dict(os.environ, PYTHONPATH=_root()),
        )


def _root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Put:
    """
    One put as a producer saw it (times: C{time.monotonic()}).

    @ivar node: the index of the node that answered (or was asked, when
        none answered).
    @ivar status: the answer's C{status} (C{PUT_OK}, C{SERVICE_NOT_AVAILABLE},
        ...) or C{NO_ANSWER} (refused, reset or timed out).
    """

    key: str
    body: bytes
    node: int
    sent: float
    answered: float = 0.0
    code: int = 0
    status: str = "NO_ANSWER"
    offset: int | None = None
    next_offset: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == "PUT_OK"


@dataclass
class _Producer:
    name: str
    target: int
    puts: list[Put] = field(default_factory=list)


class Producers:
    """
    C{count} producer threads putting to a L{BrokerGroup}'s master
    over its admin HTTP, each on its own: it puts to the node it thinks
    is the master, follows a 503's C{master} hint, and tries the next
    node when one does not answer.  Every put is recorded (L{Put}); a
    request never waits longer than C{timeout}.  Bodies carry the put's
    key, unique in the run.

    Started by the constructor; L{stop} (also on leaving a C{with} block)
    ends them.
    """

    def __init__(
        self,
        cluster: BrokerGroup,
        count: int = 3,
        body_size: int = 512,
        timeout: float = 5.0,
        pause: float = 0.0,
    ) -> None:
        self._cluster = cluster
        self._body_size = body_size
        self._timeout = timeout
        self._pause = pause
        self._stopping = threading.Event()
        self._by_http = {node.http: node.index for node in cluster.nodes}
        self._producers = [_Producer(f"p{k}", k % len(cluster.nodes)) for k in range(count)]
        self._threads = [
            threading.Thread(target=self._run, args=(p,), name=f"producer-{p.name}", daemon=True)
            for p in self._producers
        ]
        for thread in self._threads:
            thread.start()

    def __enter__(self) -> Producers:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join(self._timeout + 5)

    def puts(self) -> list[Put]:
        """
        Every put so far, in the order they were answered.
        """
        out = [put for p in self._producers for put in list(p.puts) if put.answered]
        out.sort(key=lambda put: put.answered)
        return out

    def acked(self) -> list[Put]:
        return [put for put in self.puts() if put.ok]

    def _run(self, producer: _Producer) -> None:
        nodes = self._cluster.nodes
        sequence = 0
        while not self._stopping.is_set():
            sequence += 1
            key = f"{producer.name}-{sequence}"
            body = (key + ":").encode().ljust(self._body_size, b"x")
            node = nodes[producer.target]
            put = Put(key, body, node.index, time.monotonic())
            producer.puts.append(put)
            hint = self._put(node, put)
            if put.ok:
                if self._pause:
                    self._stopping.wait(self._pause)
                continue
            if hint is not None and hint in self._by_http:
                producer.target = self._by_http[hint]
            else:
                producer.target = (producer.target + 1) % len(nodes)
            # Not a busy loop against a group without a master.
            self._stopping.wait(0.02)

    def _put(self, node: Node, put: Put) -> str | None:
        """
        POST C{put} to C{node}; fill in the answer; the master hint.
        """
        url = f"http://{node.http}/topics/{TOPIC}/messages?keys={put.key}"
        request = urllib.request.Request(url, data=put.body, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as answer:
                put.code = answer.status
                body = json.load(answer)
        except urllib.error.HTTPError as e:
            put.code = e.code
            try:
                body = json.loads(e.read())
            except (OSError, ValueError):
                body = {}
        except (OSError, ValueError):
            put.answered = time.monotonic()
            return None
        put.answered = time.monotonic()
        put.status = str(body.get("status", "NO_ANSWER"))
        put.offset = body.get("offset")
        put.next_offset = body.get("next_offset")
        master = body.get("master")
        return master.get("http") if isinstance(master, dict) else None


def windows(puts: Sequence[Put], old: int, new: int, after: float) -> dict[str, float | None]:
    """
    What producers saw of one failover from node C{old} to node C{new}
    (killed or cut off at C{after}): the last C{PUT_OK} answered by the
    old master, the first by the new one, and the gap between them.
    """
    last_old = max((p.answered for p in puts if p.ok and p.node == old), default=None)
    first_new = min(
        (p.answered for p in puts if p.ok and p.node == new and p.answered > after), default=None
    )
    gap = None if last_old is None or first_new is None else first_new - last_old
    return {"last_old": last_old, "first_new": first_new, "unavailable": gap}


def wait_in_sync(cluster: BrokerGroup, master: int, members: int, timeout: float = 60.0) -> None:
    """
    Wait until C{master}'s C{/status} lists C{members} nodes (itself
    included) in its in-sync set as published in etcd (C{in_sync_published}:
    who may be elected after it; the set its puts wait for, C{in_sync},
    counts a replica that caught up before the set naming it is
    published, and a master killed in between leaves no one eligible, as
    it must).
    """
    deadline = time.monotonic() + timeout
    while True:
        failover = (cluster.status(master) or {}).get("failover") or {}
        in_sync = failover.get("in_sync_published") or []
        if len(in_sync) >= members:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{cluster.nodes[master].node_id}'s in-sync set is {in_sync} after {timeout:g} s"
            )
        time.sleep(0.05)


def kill_masters(
    cluster: BrokerGroup,
    load: Producers,
    kills: int,
    report: Any = None,
    timeout: float = 30.0,
    say: Any = None,
) -> list[dict[str, Any]]:
    """
    C{kills} times: wait until every node is in the master's in-sync set,
    SIGKILL the master, wait for a new one and for its first C{PUT_OK},
    check that it holds every C{PUT_OK} ever answered, and restart the
    killed node (it rejoins as a slave).

    @param report: called with each kill's figures as they are known.
    @param say: called with a line of text at each step (the demo's
        progress).
    @return: each kill's figures: C{old}, C{new} (node indices),
        C{election} (kill -> a new master says so in C{/status}),
        C{unavailable} (last C{PUT_OK} from the old master -> first from
        the new one, as the producers saw them), C{acked} (every C{PUT_OK}
        so far) and C{missing} (those the new master lacks: must be 0).
    """
    results = []
    master = cluster.wait_master(timeout)
    name = [node.node_id for node in cluster.nodes]

    def tell(text: str) -> None:
        if say is not None:
            say(text)

    for kill in range(kills):
        wait_in_sync(cluster, master, len(cluster.nodes), timeout * 2)
        tell(f"{name[master]} is master; in-sync set: every node")
        # Puts on the master as it is now, so that there is a last PUT_OK.
        before = len(load.acked())
        deadline = time.monotonic() + timeout
        while len(load.acked()) < before + 10 and time.monotonic() < deadline:
            time.sleep(0.01)
        killed_at = time.monotonic()
        cluster.kill(master)
        tell(f"kill -9 {name[master]} (the master), {len(load.acked())} PUT_OK so far")
        new = cluster.wait_master(timeout, exclude=[master])
        elected_at = time.monotonic()
        tell(f"+{elected_at - killed_at:.2f} s: {name[new]} elected master (its lease ran out)")
        while True:
            seen = windows(load.puts(), master, new, killed_at)
            if seen["first_new"] is not None:
                break
            if time.monotonic() - killed_at > timeout:
                raise AssertionError(
                    f"no PUT_OK from the new master {cluster.nodes[new].node_id} "
                    f"within {timeout:g} s of the kill"
                )
            time.sleep(0.01)
        acked = load.acked()
        missing = cluster.missing_acked(new, acked)
        first_new = seen["first_new"]
        assert first_new is not None
        tell(
            f"+{first_new - killed_at:.2f} s: first PUT_OK from {name[new]}; producers had no "
            f"master for {seen['unavailable'] or 0:.2f} s"
        )
        tell(
            f"{len(acked) - len(missing)} of {len(acked)} PUT_OK are in {name[new]}'s log "
            f"({len(missing)} missing)"
        )
        figures = {
            "kill": kill + 1,
            "old": master,
            "new": new,
            "election": elected_at - killed_at,
            "unavailable": seen["unavailable"],
            "acked": len(acked),
            "missing": len(missing),
            "missing_keys": [put.key for put in missing[:10]],
        }
        results.append(figures)
        if report is not None:
            report(figures)
        cluster.start(master)
        tell(f"{name[master]} restarted: it rejoins as a slave of {name[new]}")
        master = new
    return results


def converge_and_check(
    cluster: BrokerGroup, load: Producers | None, timeout: float = 60.0
) -> dict[str, Any]:
    """
    Stop the producers, wait until every node holds the master's log,
    stop every node cleanly, then compare each store with the master's
    byte for byte and run C{rmqha store check} on each.

    @return: C{master} (index), C{identical} and C{check} (node id ->
        bool), C{check_output} (node id -> text of a failed check).
    """
    from rmqha._files import compare_stores

    if load is not None:
        load.stop()
    master = cluster.wait_converged(timeout)
    cluster.stop_all()
    identical = {}
    checks = {}
    outputs = {}
    for node in cluster.nodes:
        identical[node.node_id] = compare_stores(cluster.nodes[master].store, node.store)[0]
        done = cluster.store_check(node.index)
        checks[node.node_id] = done.returncode == 0
        if done.returncode:
            outputs[node.node_id] = (done.stdout + done.stderr)[-2000:]
    return {"master": master, "identical": identical, "check": checks, "check_output": outputs}
