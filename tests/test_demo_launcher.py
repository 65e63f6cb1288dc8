"""
Tests for the failover demo's launcher (L{rmqha._demo_launcher}) and the
test harness built on it (L{tools.failover_cluster}), where no process
starts: the argv each gives a node and how a local etcd fails.
"""

from __future__ import annotations

import os
import signal

from twisted.trial.unittest import SynchronousTestCase

from rmqha import _demo_launcher
from rmqha._demo_launcher import BrokerGroup, LocalEtcd
from tools.failover_cluster import FailoverCluster


class LocalEtcdTests(SynchronousTestCase):
    """
    The demo's single etcd member, without etcd.
    """

    def test_refuses_without_etcd(self) -> None:
        """
        Without an etcd binary it names the package to install.
        """
        self.patch(_demo_launcher, "etcd_binary", lambda: None)
        with self.assertRaises(FileNotFoundError) as caught:
            LocalEtcd(self.mktemp())
        self.assertIn("etcd-server", str(caught.exception))

    def test_member_dies_at_start(self) -> None:
        """
        A member that exits at once (here: not etcd at all) is reported
        naming its log, and its data directory is not left behind.
        """
        self.patch(_demo_launcher, "etcd_binary", lambda: "/bin/false")
        directory = self.mktemp()
        with self.assertRaises(RuntimeError) as caught:
            LocalEtcd(directory, timeout=5)
        self.assertIn("exited", str(caught.exception))
        self.assertIn(os.path.join(directory, "m0.log"), str(caught.exception))
        self.assertFalse(os.path.exists(os.path.join(directory, "m0.etcd")))


class CommandTests(SynchronousTestCase):
    """
    The argv of a node: the demo's group and the tests' variants of it.
    """

    def test_demo_group(self) -> None:
        """
        The demo's nodes are C{twistd rmqha} on 127.0.0.1 under the
        coordinator, proving their ids with the group secret, as the
        caller's user.
        """
        group = BrokerGroup(self.mktemp(), "etcd:http://127.0.0.1:1", 3, start=False)
        argv = group.command(1)
        self.assertIn("rmqha", argv)
        self.assertEqual(argv[argv.index("--node-id") + 1], "n1")
        self.assertEqual(argv[argv.index("--coordinator") + 1], "etcd:http://127.0.0.1:1")
        secret = argv[argv.index("--group-secret-file") + 1]
        self.assertTrue(os.path.isfile(secret))
        self.assertEqual(group.nodes[1].host, "127.0.0.1")
        self.assertNotIn("setpriv", argv)
        self.assertEqual([n.process for n in group.nodes], [None, None, None])

    def test_test_variants(self) -> None:
        """
        L{FailoverCluster} puts a node on its own address, under
        C{setpriv} with its uid, and adds the extra flags after the
        demo's; C{auth="insecure"} replaces the secret; a bad C{auth} is
        refused.
        """
        uid = os.getuid()
        cluster = FailoverCluster(
            self.mktemp(), "etcd:http://127.0.0.1:1", 2,
            hosts=["127.0.0.11", "127.0.0.12"], users=[None, uid],
            options=["--housekeeping-interval", "20000"], auth="insecure", start=False,
        )
        plain, wrapped = cluster.command(0), cluster.command(1)
        self.assertNotIn("setpriv", plain)
        self.assertEqual(wrapped[:2], ["setpriv", f"--reuid={uid}"])
        self.assertIn("--insecure-group", plain)
        self.assertNotIn("--group-secret-file", plain)
        self.assertEqual(plain[-2:], ["--housekeeping-interval", "20000"])
        self.assertEqual(cluster.nodes[1].http, f"127.0.0.12:{cluster.nodes[1].http_port}")
        self.assertRaises(
            ValueError, FailoverCluster, self.mktemp(), "etcd:", auth="none", start=False
        )


class _Exited:
    """
    A node's process that has exited with C{code}.
    """

    def __init__(self, code: int) -> None:
        self.returncode = code

    def poll(self) -> int | None:
        return self.returncode


class _Running:
    """
    A node's process still running.
    """

    returncode = None

    def poll(self) -> int | None:
        return None


class PortTakenTests(SynchronousTestCase):
    """
    A node whose port another process took between L{free_ports} picking
    it and the node binding it is started again on new ports; any other
    failure is the node's own.
    """

    def group(
        self, outcomes: list[tuple[str, str, object]], nodes: int = 1
    ) -> tuple[BrokerGroup, list[list[str]]]:
        """
        A group of C{nodes} nodes whose starts write (to the node's stderr
        file, to its log) and return each of C{outcomes} in turn; the argv
        of each.
        """
        group = BrokerGroup(self.mktemp(), "etcd:http://127.0.0.1:1", nodes, start=False)
        argvs: list[list[str]] = []

        def popen(i: int, extra: object, err: object) -> object:
            argvs.append(group.command(i))
            said, logged, process = outcomes.pop(0)
            with open(group.err_path(i), "a") as f:
                f.write(said)
            with open(group.log_path(i), "a") as f:
                f.write(logged)
            return process

        self.patch(group, "_popen", popen)
        return group, argvs

    def test_port_taken_then_started(self) -> None:
        in_use = (
            "twistd rmqha: cannot listen on tcp:30674:interface=127.0.0.1 (--ha-listen): "
            "Address already in use\n"
        )
        group, argvs = self.group([
            (in_use, "", _Exited(1)),
            ("", "2026-11-28T01:27:14+0000 [-] MasterFactory starting\n", _Running()),
        ])
        first = (group.nodes[0].ha_port, group.nodes[0].http_port)
        group.start(0)
        self.assertEqual(len(argvs), 2)
        self.assertNotEqual((group.nodes[0].ha_port, group.nodes[0].http_port), first)
        listen = argvs[1][argvs[1].index("--ha-listen") + 1]
        self.assertEqual(listen, f"tcp:{group.nodes[0].ha_port}:interface=127.0.0.1")
        self.assertEqual(group.nodes[0].starts, 2)

    def test_gives_up(self) -> None:
        """
        After L{_demo_launcher.PORT_TRIES} starts the node is left as it
        is (its waiters report it).
        """
        in_use = "twistd rmqha: cannot listen on tcp:1 (--http): Address already in use\n"
        group, argvs = self.group([(in_use, "", _Exited(1))] * _demo_launcher.PORT_TRIES)
        group.start(0)
        self.assertEqual(len(argvs), _demo_launcher.PORT_TRIES)

    def test_other_failures_are_the_nodes(self) -> None:
        """
        A node that exits for another reason, or runs, is started once.
        """
        group, argvs = self.group([("twistd rmqha: --store-dir is required\n", "", _Exited(1))])
        group.start(0)
        self.assertEqual(len(argvs), 1)
        group, argvs = self.group([("", "a line\n", _Running())])
        group.start(0)
        self.assertEqual(len(argvs), 1)

    def test_start_many_at_once(self) -> None:
        """
        L{BrokerGroup.start_many} starts every node before it watches any,
        and starts again only the one whose port was taken.
        """
        in_use = "twistd rmqha: cannot listen on tcp:1 (--ha-listen): Address already in use\n"
        group, argvs = self.group(
            [(in_use, "", _Exited(1)), ("", "up\n", _Running()), ("", "up\n", _Running())], nodes=2
        )
        group.start_many([0, 1])
        started = [argv[argv.index("--node-id") + 1] for argv in argvs]
        self.assertEqual(started, ["n0", "n1", "n0"])

    def test_tls_listen_follows_the_port(self) -> None:
        """
        With TLS, the node's ssl C{--ha-listen} is made from its port when
        it starts, so a new port reaches it too.
        """
        cluster = FailoverCluster(self.mktemp(), "etcd:http://127.0.0.1:1", 1, auth="tls", start=False)
        cluster.nodes[0].ha_port = 12345
        argv = cluster.command(0)
        listens = [argv[i + 1] for i, a in enumerate(argv) if a == "--ha-listen"]
        self.assertEqual(listens[-1], "ssl:12345:interface=127.0.0.1")


class _SlowToExit:
    """
    A node's process that exits only when waited for after a SIGTERM (as
    a real one takes a while to shut down): the signals it got.
    """

    def __init__(self) -> None:
        self.signals: list[int] = []
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, signum: int) -> None:
        self.signals.append(signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
        self.returncode = -signal.SIGKILL

    def wait(self, timeout: float | None = None) -> int | None:
        if signal.SIGTERM in self.signals and self.returncode is None:
            self.returncode = 0
        return self.returncode


class StopTests(SynchronousTestCase):
    """
    Stopping the nodes.
    """

    def test_stop_all_terminates_once(self) -> None:
        """
        L{BrokerGroup.stop_all} sends each running node one SIGTERM (after
        a SIGCONT) and waits for it; a second SIGTERM while twistd shuts
        down makes it log C{ReactorNotRunning} as critical.
        """
        group = BrokerGroup(self.mktemp(), "etcd:http://127.0.0.1:1", 2, start=False)
        processes = [_SlowToExit(), _SlowToExit()]
        for node, process in zip(group.nodes, processes):
            node.process = process  # type: ignore[assignment]
        group.stop_all()
        self.assertEqual([p.signals for p in processes], [[signal.SIGCONT, signal.SIGTERM]] * 2)
        self.assertEqual([p.returncode for p in processes], [0, 0])


class FreePortsTests(SynchronousTestCase):
    """
    L{_demo_launcher.free_ports}: distinct ports, below the ephemeral
    range when there is room (what a test's outgoing connections cannot
    take before a child binds them).
    """

    def test_below_the_ephemeral_range(self) -> None:
        self.patch(_demo_launcher, "_ephemeral_low", lambda: 32768)
        ports = _demo_launcher.free_ports(8)
        self.assertEqual(len(set(ports)), 8)
        for port in ports:
            self.assertTrue(_demo_launcher._PICK_FROM <= port < 32768, ports)

    def test_without_room_from_port_zero(self) -> None:
        """
        An ephemeral range that starts too low (or cannot be read) leaves
        the choice to the kernel.
        """
        import socket

        held = socket.socket()
        self.addCleanup(held.close)
        held.bind(("127.0.0.1", 0))
        ephemeral = held.getsockname()[1]
        self.patch(_demo_launcher, "_ephemeral_low", lambda: 0)
        ports = _demo_launcher.free_ports(3)
        self.assertEqual(len(set(ports)), 3)
        self.assertNotIn(ephemeral, ports)

    def test_ephemeral_low(self) -> None:
        path = self.mktemp()
        with open(path, "w") as f:
            f.write("32768\t60999\n")
        self.assertEqual(_demo_launcher._ephemeral_low(path), 32768)
        self.assertEqual(_demo_launcher._ephemeral_low(path + ".missing"), 0)
        with open(path, "w") as f:
            f.write("garbage")
        self.assertEqual(_demo_launcher._ephemeral_low(path), 0)
