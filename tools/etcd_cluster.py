# -*- test-case-name: tests.test_etcd_cluster,tests.integration.test_etcd_dcs -*-
"""
L{EtcdCluster}: one or three C{etcd} members on 127.0.0.1 for tests,
benchmarks and tools (free ports, data under a temporary directory,
killed by PID), with TLS, C{etcdctl} and the Raft leader's index.  The
failover demo starts its single member with L{rmqha._demo_launcher.LocalEtcd}.
"""

from __future__ import annotations

from typing import Any

from tools.processes import etcd_binary, free_ports

__all__ = ["EtcdCluster", "etcd_binary"]


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
