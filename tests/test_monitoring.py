"""
Monitoring (docs/operations.md, "Monitoring"): what C{/metrics} says of a
master's slaves (labelled by replica, bounded), the build and the store's
disk; the Prometheus alert rules (C{promtool check rules} and C{promtool
test rules}, each rule shown to fire and not to fire); and that every
query of the rules and of the Grafana dashboard names a metric a real
C{/metrics} exports.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
from typing import Any, Iterable

from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.address import IPv4Address
from twisted.internet.defer import succeed
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.trial.unittest import SynchronousTestCase

import rmqha
from rmqha.admin import AdminRoot
from rmqha.admin.metrics import MAX_SLAVE_SERIES
from rmqha.broker import Broker, Role
from rmqha.ha._wire import encode_identify
from rmqha.ha.group import PutStatus
from rmqha.settings import BrokerSettings
from rmqha.store import _record
from rmqha.store.commitlog import CommitLog

from tests._helpers import fixed_clock
from tests.test_admin import AdminTestCase, request
from tests.test_coordinator import _Group

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RULES = os.path.join(ROOT, "deploy", "prometheus", "rmqha-rules.yml")
RULE_TESTS = os.path.join(ROOT, "deploy", "prometheus", "rmqha-rules.test.yml")
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "rmqha.json")

#: Metrics the rules and the dashboard may name that the brokers sampled
#: here do not export: the TLS certificates' expiry (a broker with TLS
#: ports; another part of issue 28 adds it).
ELSEWHERE = {"rmqha_tls_certificate_expiry_timestamp_seconds"}


def scrape(root: AdminRoot) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """
    C{GET /metrics} of C{root}, parsed: sample name and sorted labels to
    value.
    """
    code, data, _ = request(root, b"GET", b"/metrics")
    assert code == 200, code
    samples = {}
    for family in text_string_to_metric_families(data.decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def series(samples: dict[tuple[str, Any], float], name: str) -> dict[str, float]:
    """
    The samples of C{name}, by their C{replica} label.
    """
    return {dict(labels)["replica"]: v for (n, labels), v in samples.items() if n == name}


def started_broker(case: SynchronousTestCase, role: Role, **settings: Any) -> Broker:
    """
    A broker of C{role} on a L{MemoryReactorClock} (flushes run inline),
    stopped at the end of C{case}.
    """
    reactor = MemoryReactorClock()
    reactor.advance(1700000000)
    store = case.mktemp()
    broker = Broker(
        BrokerSettings(role=role, ha_listen="tcp:0", **settings),
        reactor=reactor,
        open_commitlog=lambda: CommitLog.open(store, segment_size=64 * 1024, clock=fixed_clock),
        run_in_thread=lambda f: succeed(f()),
    )
    broker.startService()
    case.addCleanup(broker.stopService)
    return broker


class SlaveSeriesTests(AdminTestCase):
    """
    A master's per-slave series: labelled by the replica, one per replica,
    at most L{MAX_SLAVE_SERIES}, gone with the connection.
    """

    def setUp(self) -> None:
        self.master = started_broker(self, Role.MASTER)
        self.root = AdminRoot(self.master)

    def lose(self, connection: Any) -> None:
        """
        Close C{connection} (once).
        """
        if not getattr(connection, "_test_lost", False):
            connection._test_lost = True
            connection.connectionLost()

    def connect(self, port: int, replica_id: str | None = None, ack: int | None = 0) -> Any:
        factory = self.master.master_factory
        assert factory is not None
        connection = factory.buildProtocol(IPv4Address("TCP", "10.0.0.7", port))
        connection.makeConnection(StringTransport())
        self.addCleanup(self.lose, connection)
        if replica_id is not None:
            connection.dataReceived(encode_identify(replica_id))
        if ack is not None:
            connection.dataReceived(ack.to_bytes(8, "big"))
        return connection

    def test_replica_label_survives_reconnection(self) -> None:
        """
        A slave's series carry C{replica}, the id it declared, not its
        ephemeral port: a reconnection from another port continues the
        same series.  The address is C{rmqha_slave_info}'s C{peer}; a
        classic slave, which declares nothing, is labelled by its address.
        """
        first = self.connect(40001, "4f0c2a9e")
        samples = scrape(self.root)
        self.assertEqual(series(samples, "rmqha_slave_ack_offset"), {"4f0c2a9e": 0})
        self.assertEqual(
            samples[("rmqha_slave_info", (
                ("authenticated", "false"), ("framing", "classic"), ("identity", ""),
                ("peer", "10.0.0.7:40001"), ("replica", "4f0c2a9e"), ("transport", "tcp"),
            ))],
            1,
        )
        self.assertFalse(any("peer" in dict(labels) for (n, labels) in samples if n != "rmqha_slave_info"))
        self.lose(first)
        self.assertEqual(series(scrape(self.root), "rmqha_slave_ack_offset"), {})
        self.connect(40002, "4f0c2a9e")
        self.connect(40003)
        samples = scrape(self.root)
        self.assertEqual(
            series(samples, "rmqha_slave_lag_bytes"), {"4f0c2a9e": 0, "10.0.0.7:40003": 0}
        )
        peers = {dict(labels)["peer"] for (n, labels) in samples if n == "rmqha_slave_info"}
        self.assertEqual(peers, {"10.0.0.7:40002", "10.0.0.7:40003"})

    def test_bounded(self) -> None:
        """
        However many connections declare however many ids, C{/metrics}
        lists at most L{MAX_SLAVE_SERIES} replicas, one connection each
        (the oldest that acknowledged), and counts the rest in
        C{rmqha_slaves_unlisted}.
        """
        self.connect(39999, "r000", ack=None)  # (not acknowledged yet)
        self.connect(40000, "r000")
        self.master.reactor.advance(1)
        for n in range(MAX_SLAVE_SERIES + 8):
            self.connect(40001 + n, f"r{n:03}")
        samples = scrape(self.root)
        listed = series(samples, "rmqha_slave_bytes_per_second")
        self.assertEqual(sorted(listed), [f"r{n:03}" for n in range(MAX_SLAVE_SERIES)])
        self.assertEqual(samples[("rmqha_slaves_connected", ())], MAX_SLAVE_SERIES + 10)
        self.assertEqual(samples[("rmqha_slaves_unlisted", ())], 10)
        (peer,) = [
            dict(labels)["peer"] for (n, labels) in samples
            if n == "rmqha_slave_info" and dict(labels)["replica"] == "r000"
        ]
        self.assertEqual(peer, "10.0.0.7:40000")
        self.assertLessEqual(len(samples), 120 + 6 * MAX_SLAVE_SERIES)

    def test_lag_seconds(self) -> None:
        """
        C{rmqha_slave_lag_seconds}: 0 while the slave has acknowledged the
        log's end; then the time since it last held all the log then held
        -- from the first put after its ack of the end (not from that
        ack: an idle slave is not behind), moved on by an ack of what the
        log held at its previous ack, back to 0 by an ack of the end.
        """
        reactor = self.master.reactor
        self.assertIs(self.successResultOf(self.master.put(_message())).status, PutStatus.PUT_OK)
        first_end = self.master.commitlog.max_offset
        slave = self.connect(40001, "s", ack=first_end)
        lag = lambda: series(scrape(self.root), "rmqha_slave_lag_seconds")["s"]  # noqa: E731
        self.assertEqual(lag(), 0)
        reactor.advance(4)  # (idle)
        self.successResultOf(self.master.put(_message()))
        reactor.advance(1)
        self.successResultOf(self.master.put(_message()))
        third_end = self.master.commitlog.max_offset
        reactor.advance(5)
        self.assertEqual(lag(), 6)
        slave.dataReceived(first_end.to_bytes(8, "big"))  # (a heartbeat: no news)
        reactor.advance(1)
        self.assertEqual(lag(), 7)
        self.successResultOf(self.master.put(_message()))
        slave.dataReceived(third_end.to_bytes(8, "big"))  # (the end at its last ack)
        reactor.advance(1)
        self.assertEqual(lag(), 2)
        slave.dataReceived(self.master.commitlog.max_offset.to_bytes(8, "big"))
        self.assertEqual(lag(), 0)

    def test_behind_since_connected(self) -> None:
        """
        A slave behind from its first ack lags at least since it connected.
        """
        self.successResultOf(self.master.put(_message()))
        self.connect(40001, "s", ack=0)
        self.master.reactor.advance(3)
        self.assertEqual(series(scrape(self.root), "rmqha_slave_lag_seconds"), {"s": 3})


def _message() -> Any:
    from rmqha.store._record import Message

    return Message("MonitoringTopic", b"m" * 50)


class BrokerFiguresTests(AdminTestCase):
    """
    C{rmqha_build_info}, the store's file system, and the in-sync figures.
    """

    def test_build_info(self) -> None:
        """
        C{rmqha_build_info} is 1, labelled with rmqha's, Python's and
        Twisted's versions and the codec in use.
        """
        import twisted

        samples = scrape(AdminRoot(self.broker(Role.SLAVE)))
        (labels,) = [dict(labels) for (n, labels) in samples if n == "rmqha_build_info"]
        self.assertEqual(
            labels,
            {
                "version": rmqha.__version__,
                "python_version": platform.python_version(),
                "python_implementation": platform.python_implementation(),
                "twisted_version": twisted.__version__,
                "codec": "compiled" if _record._accel is not None else "pure",
            },
        )
        self.assertEqual(samples[("rmqha_is_master", ())], 0)

    def test_store_filesystem(self) -> None:
        """
        The store's file system: its size and the bytes still writable,
        as C{statvfs} of the store's directory says (f_bavail, f_blocks,
        in f_frsize units).
        """
        from rmqha.admin import view

        broker = self.broker(Role.MASTER)
        asked: list[str] = []

        class Stat:
            f_frsize, f_blocks, f_bavail = 4096, 1000, 250

        def statvfs(path: str) -> Stat:
            asked.append(path)
            return Stat()

        # (Not the real file system's: other processes write to it meanwhile.)
        self.patch(view.os, "statvfs", statvfs)
        samples = scrape(AdminRoot(broker))
        self.assertEqual(asked, [broker.commitlog.store_dir])
        self.assertEqual(samples[("rmqha_store_filesystem_size_bytes", ())], 4096 * 1000)
        self.assertEqual(samples[("rmqha_store_filesystem_free_bytes", ())], 4096 * 250)
        self.assertEqual(samples[("rmqha_is_master", ())], 1)

    def test_in_sync_replicas(self) -> None:
        """
        A SYNC_MASTER with minInSyncReplicas 2 counts itself alone until a
        slave acknowledges the log's end; an ASYNC_MASTER's floor is 1.
        """
        broker = started_broker(self, Role.SYNC_MASTER, in_sync_replicas=2, min_in_sync_replicas=2)
        root = AdminRoot(broker)
        samples = scrape(root)
        self.assertEqual(
            (samples[("rmqha_in_sync_replicas", ())], samples[("rmqha_min_in_sync_replicas", ())]),
            (1, 2),
        )
        factory = broker.master_factory
        assert factory is not None
        slave = factory.buildProtocol(IPv4Address("TCP", "10.0.0.7", 40001))
        slave.makeConnection(StringTransport())
        self.addCleanup(slave.connectionLost)
        slave.dataReceived((0).to_bytes(8, "big"))
        self.assertEqual(scrape(root)[("rmqha_in_sync_replicas", ())], 2)
        asynchronous = scrape(AdminRoot(self.broker(Role.MASTER)))
        self.assertEqual(asynchronous[("rmqha_min_in_sync_replicas", ())], 1)


class ExportedNamesTests(_Group):
    """
    Every metric the alert rules and the dashboard name is one a real
    C{/metrics} exports: sampled from a failover group (in memory) after a
    failover, its new master with a slave connected and a put taken.
    """

    def exported(self) -> set[str]:
        for name in "abc":
            self.node(name)
        self.elapse(2)
        old = self.master()
        assert old is not None
        self.assertEqual(old.coordinator.counts["epoch_changes"], 0)
        self.crash(old)
        self.elapse(4)
        new = self.master()
        assert new is not None and new is not old
        self.assertEqual(new.coordinator.counts["epoch_changes"], 1)
        put = self.put(new.broker)
        self.elapse(0.5)
        self.assertIs(self.successResultOf(put).status, PutStatus.PUT_OK)
        slave = next(n for n in self.nodes.values() if n is not old and n is not new)
        names: set[str] = set()
        for node in (new, slave):
            samples = scrape(AdminRoot(node.broker, failover=node.coordinator))
            names |= {name for name, _ in samples}
        master = scrape(AdminRoot(new.broker, failover=new.coordinator))
        self.assertEqual(series(master, "rmqha_slave_ack_offset"), {slave.id: new.broker.commitlog.max_offset})
        self.assertEqual(
            master[("rmqha_failover_events_total", (("event", "epoch_changes"),))], 1
        )
        return names

    def test_rules_and_dashboard_name_exported_metrics(self) -> None:
        exported = self.exported()
        for where, exprs in [("the alert rules", rule_exprs()), ("the dashboard", dashboard_exprs())]:
            named: set[str] = set()
            for expr in exprs:
                found = metric_names(expr)
                self.assertTrue(found, f"{where}: no metric found in {expr!r}")
                named |= found
            missing = sorted(named - exported - ELSEWHERE)
            self.assertEqual(missing, [], f"{where} name metrics /metrics does not export")


def rule_exprs() -> list[str]:
    """
    The C{expr} of every rule in L{RULES} (each on one line).
    """
    with open(RULES) as f:
        text = f.read()
    exprs = re.findall(r"^\s+expr:\s*(.+)$", text, re.M)
    for expr in exprs:
        assert not expr.startswith(("|", ">")), f"{RULES}: keep each expr on one line: {expr}"
    return exprs


def dashboard_exprs() -> list[str]:
    """
    Every query of L{DASHBOARD}: its panels' targets and its variables'.
    """
    with open(DASHBOARD) as f:
        dashboard = json.load(f)
    exprs = []

    def panels(items: Iterable[dict[str, Any]]) -> Iterable[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    for panel in panels(dashboard["panels"]):
        exprs += [target["expr"] for target in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            text = query["query"] if isinstance(query, dict) else query
            inner = re.fullmatch(r"label_values\((.+),\s*\w+\)", text)
            exprs.append(inner.group(1) if inner else text)
    return exprs


#: PromQL words that are not metric names (keywords; functions are
#: recognised by their parenthesis).
_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
             "group_right", "offset", "bool", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """
    The metric names a PromQL expression selects: its identifiers that
    are not functions, keywords, label names, strings, durations or
    Grafana variables.
    """
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        before = text[m.start() - 1] if m.start() else " "
        if before.isdigit() or before in ".$":
            continue
        if text[m.end():].lstrip().startswith("(") or m.group() in _KEYWORDS:
            continue
        names.add(m.group())
    return names


class DashboardTests(SynchronousTestCase):
    def test_shape(self) -> None:
        """
        The dashboard is one Grafana JSON model: unique panel ids, within
        the 24-column grid, every query on the C{datasource} variable.
        """
        with open(DASHBOARD) as f:
            dashboard = json.load(f)
        self.assertEqual(dashboard["uid"], "rmqha")
        panels = dashboard["panels"]
        ids = [p["id"] for p in panels]
        self.assertEqual(len(ids), len(set(ids)))
        for panel in panels:
            grid = panel["gridPos"]
            self.assertLessEqual(grid["x"] + grid["w"], 24, panel["title"])
            if panel["type"] == "row":
                continue
            self.assertTrue(panel["targets"], panel["title"])
            for target in [panel, *panel["targets"]]:
                self.assertEqual(target["datasource"]["uid"], "${datasource}", panel["title"])
        variables = [v["name"] for v in dashboard["templating"]["list"]]
        self.assertEqual(variables, ["datasource", "job", "instance"])


class MetricNamesTests(SynchronousTestCase):
    def test_metric_names(self) -> None:
        """
        L{metric_names} finds the selectors, not functions, labels,
        strings, durations or variables.
        """
        self.assertEqual(
            metric_names(
                'histogram_quantile(0.99, sum by (instance, le) (rate('
                'rmqha_replication_wait_seconds_bucket{job=~"$job"}[$__rate_interval])))'
            ),
            {"rmqha_replication_wait_seconds_bucket"},
        )
        self.assertEqual(
            metric_names("rmqha_a / on (instance) rmqha_b < 0.10 and up == 1e3"),
            {"rmqha_a", "rmqha_b", "up"},
        )


PROMTOOL = shutil.which("promtool")
_NO_PROMTOOL = (
    "promtool is not installed (Debian's prometheus package; python3 dev.py test "
    "installs it as root)"
)


class AlertRuleTests(SynchronousTestCase):
    """
    The rules pass C{promtool check rules}, and their unit tests (every
    rule firing, and not firing) pass C{promtool test rules}.
    """

    if PROMTOOL is None:
        skip = _NO_PROMTOOL

    def promtool(self, *args: str) -> subprocess.CompletedProcess[str]:
        assert PROMTOOL is not None
        # (One stream: promtool writes its failures to stderr, the rest to
        # stdout, unbuffered.)
        return subprocess.run(
            [PROMTOOL, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, timeout=60, cwd=ROOT,
        )

    def test_check(self) -> None:
        done = self.promtool("check", "rules", RULES)
        self.assertEqual(done.returncode, 0, done.stdout)
        self.assertIn(f"SUCCESS: {len(rule_exprs())} rules found", done.stdout)

    def test_rules_tested_both_ways(self) -> None:
        """
        C{promtool test rules} passes -- and fails for every rule when all
        exprs are replaced by one that never fires, and again by one that
        always does: each rule is tested firing and not firing.
        """
        with open(RULES) as f:
            rules = f.read()
        alerts = re.findall(r"^\s+- alert:\s*(\w+)$", rules, re.M)
        self.assertEqual(len(alerts), len(rule_exprs()))
        every = " or ".join(f"{name} >= -1e300" for name in sorted(
            set().union(*map(metric_names, rule_exprs()))
        ))
        work = tempfile.mkdtemp(prefix="rmqha-rules-")
        self.addCleanup(shutil.rmtree, work)
        tests = []
        for kind, expr in [("never", "vector(1) > 2"), ("always", every)]:
            os.mkdir(os.path.join(work, kind))
            with open(os.path.join(work, kind, "rmqha-rules.yml"), "w") as f:
                f.write(re.sub(r"^(\s+expr:).+$", lambda m: f"{m.group(1)} {expr}", rules, flags=re.M))
            shutil.copy(RULE_TESTS, os.path.join(work, kind))
            tests.append(os.path.join(work, kind, "rmqha-rules.test.yml"))
        done = self.promtool("test", "rules", RULE_TESTS, *tests)
        # One section per test file, in order: the real one passes.
        sections = re.split(r"^Unit Testing:\s+", done.stdout, flags=re.M)[1:]
        self.assertEqual(len(sections), 3, done.stdout)
        self.assertIn("SUCCESS", sections[0], sections[0])
        for kind, section in zip(("never", "always"), sections[1:]):
            failed = set(re.findall(r"alertname: (\w+),", section))
            self.assertEqual(sorted(set(alerts) - failed), [], f"rules not tested {kind} firing")
