"""
A failover group of real processes, for the failover tests, the failover
benchmark (C{python -m tools.bench failover}) and the failover demo
(C{rmqha demo --failover}): N C{twistd -n rmqha} nodes under a coordinator
(an L{rmqha.testing.EtcdCluster}), HTTP producers that follow the master
hint, and the checks the failover guarantees are stated in
(docs/failover.md, "How it is tested").

This is a harness, not broker code: it blocks (subprocesses, C{urllib}
with a timeout on every request, one thread per producer) and measures
with C{time.monotonic} in one process, so every timestamp it records is
on the same clock.

    with EtcdCluster(tmp) as etcd, FailoverCluster(tmp, etcd.spec) as group:
        master = group.wait_master()
        with Producers(group, 3) as load:
            group.kill(master)
            new = group.wait_master(exclude=master)
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
from rmqha.testing import free_ports, twistd_command

__all__ = [
    "FailoverCluster", "Node", "Producers", "Put", "TOPIC",
    "converge_and_check", "kill_masters", "wait_in_sync", "windows",
]

#: The topic the producers put on.
TOPIC = "FailoverTopic"


@dataclass
class Node:
    """
    One C{twistd -n rmqha} node of a L{FailoverCluster}.

    @ivar host: the address it listens on and advertises (127.0.0.1, or
        its own loopback address such as 127.0.0.11 for a partition test).
    @ivar user: run as this uid (and gid), or as the caller.
    """

    index: int
    node_id: str
    store: str
    host: str
    ha_port: int
    http_port: int
    user: int | None = None
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


class FailoverCluster:
    """
    C{nodes} rmqha nodes of one group under the coordinator C{spec}, each
    in its own process with its own store under C{directory}, started by
    the constructor (as slaves: the election decides); L{close} (also on
    leaving a C{with} block) ends every process it started, by PID.

    @param hosts: each node's address (default 127.0.0.1 for all).
    @param users: each node's uid (default: this process's).
    @param options: more C{twistd rmqha} flags for every node.
    @param auth: how the nodes prove their ids to each other
        (docs/failover.md, "Who counts"): C{"secret"} (the default: a group
        secret, C{--group-secret-file}), C{"tls"} (TLS on the HA port with
        client certificates naming the node ids) or C{"insecure"}
        (C{--insecure-group}).  The files are made with
        L{rmqha.certs.init_group} under C{directory/auth}.
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
        hosts: Sequence[str] | None = None,
        users: Sequence[int | None] | None = None,
        options: Sequence[str] = (),
        start: bool = True,
        auth: str = "secret",
    ) -> None:
        if auth not in ("secret", "tls", "insecure"):
            raise ValueError(f"auth {auth!r} is not secret, tls or insecure")
        self.directory = directory
        self.spec = spec
        self.group = group
        self.auth = auth
        self.segment_size = segment_size
        self.lease_ttl = lease_ttl
        self.options = list(options)
        ports = free_ports(2 * nodes)
        self.nodes = [
            Node(
                i,
                f"n{i}",
                os.path.join(directory, f"n{i}"),
                hosts[i] if hosts else "127.0.0.1",
                ports[2 * i],
                ports[2 * i + 1],
                users[i] if users else None,
            )
            for i in range(nodes)
        ]
        self._logs: list[Any] = [None] * nodes
        #: Node index -> its authentication flags.
        self._auth_flags = self._write_auth()
        if start:
            try:
                for node in self.nodes:
                    self.start(node.index)
            except BaseException:
                self.close()
                raise

    def __enter__(self) -> FailoverCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

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
                flags.append([
                    "--ha-listen", f"ssl:{node.ha_port}:interface={node.host}",
                    "--tls-cert", cert, "--tls-key", key, "--tls-ca", written.ca,
                    "--tls-require-client-cert",
                ])
        return flags

    def log_path(self, i: int) -> str:
        return os.path.join(self.directory, f"n{i}.log")

    def command(self, i: int) -> list[str]:
        """
        The argv that starts node C{i}.
        """
        node = self.nodes[i]
        argv = twistd_command(
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
            # (With TLS, its --ha-listen ssl:... comes after, and wins.)
            *self._auth_flags[i],
            *self.options,
        )
        if node.user is not None:
            argv = [
                "setpriv", f"--reuid={node.user}", f"--regid={node.user}", "--clear-groups",
                *argv,
            ]
        return argv

    def start(self, i: int, *extra: str) -> None:
        """
        Start node C{i} (again, on its store), with C{extra} flags this
        time only.
        """
        node = self.nodes[i]
        if node.running:
            return
        os.makedirs(node.store, exist_ok=True)
        if node.user is not None:
            for path in (node.store, self.log_path(i)):
                if not os.path.exists(path):
                    open(path, "a").close()
                os.chown(path, node.user, node.user)
        # What twistd says before its log is open (a usage error).
        with open(os.path.join(self.directory, f"n{i}.err"), "ab") as err:
            if node.user is not None:
                os.chown(err.name, node.user, node.user)
            node.process = self._popen(i, extra, err)
        node.starts += 1

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
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return process.returncode

    def stop_all(self) -> None:
        """
        Stop every node cleanly (all at once), then wait for each.
        """
        for node in self.nodes:
            if node.running:
                self.signal(node.index, signal.SIGCONT)
                self.signal(node.index, signal.SIGTERM)
        for node in self.nodes:
            self.stop(node.index)

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
    C{count} producer threads putting to a L{FailoverCluster}'s master
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
        cluster: FailoverCluster,
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


def wait_in_sync(cluster: FailoverCluster, master: int, members: int, timeout: float = 60.0) -> None:
    """
    Wait until C{master}'s C{/status} lists C{members} nodes (itself
    included) in its in-sync set.
    """
    deadline = time.monotonic() + timeout
    while True:
        status = cluster.status(master) or {}
        in_sync = (status.get("failover") or {}).get("in_sync") or []
        if len(in_sync) >= members:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{cluster.nodes[master].node_id}'s in-sync set is {in_sync} after {timeout:g} s"
            )
        time.sleep(0.05)


def kill_masters(
    cluster: FailoverCluster,
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
    cluster: FailoverCluster, load: Producers | None, timeout: float = 60.0
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
