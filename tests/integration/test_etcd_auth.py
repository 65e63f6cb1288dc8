"""
L{EtcdDCS} against real etcd members with etcd's auth enabled
(pytest-twisted): the L{IDCS} contract as a user whose role covers only
the groups' prefix, a user without that permission, a wrong password, a
token that expires or is revoked (renewed without the caller noticing),
and C{rmqha cluster status} over TLS with a client certificate and a
user.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from typing import Any, Iterator

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater

import rmqha as rmqha_package
from rmqha import certs
from rmqha.coord.dcs import DCSError, Leader, Lease, Member
from rmqha.coord.etcd import EtcdDCS, parse_coordinator
from tools.etcd_cluster import EtcdCluster
from tools.processes import etcd_binary
from rmqha.tls import TLSFiles

from tests._dcs_contract import DCSContractMixin, Scenario
from tests.integration.test_etcd_dcs import put_raw

pytestmark = pytest.mark.skipif(
    etcd_binary() is None,
    reason="etcd is not installed (python3 dev.py test installs etcd-server when run as root)",
)

_groups = itertools.count(1)

#: Every contract group is named authc<n>: the node user's role covers
#: the prefix /rmqha/authc (docs/failover.md would give one role per group).
_PREFIX = "/rmqha/authc"
_TOKEN_TTL = 1


def _reactor() -> Any:
    from twisted.internet import reactor

    return reactor


def _secured(cluster: EtcdCluster, directory: str, *, only_node: bool = False) -> dict[str, str]:
    """
    Set up auth on C{cluster} as docs/failover.md says (root, a read-write
    role on the prefix for the node user, a read role for the monitor, a
    user of another group; C{only_node}: root and node), enable it; the
    password files by user.
    """
    users = {"root": "root-pw", "node": "node-pw", "monitor": "mon-pw", "other": "other-pw"}
    if only_node:
        users = {"root": "root-pw", "node": "node-pw"}
    files = {}
    for user, password in users.items():
        cluster.etcdctl("user", "add", user, "--interactive=false", stdin=password + "\n")
        path = os.path.join(directory, f"{user}.password")
        with open(path, "w") as f:
            f.write(password + "\n")
        os.chmod(path, 0o600)
        files[user] = path
    cluster.etcdctl("user", "grant-role", "root", "root")
    for role, kind, prefix, user in [
        ("rmqha-authc", "readwrite", _PREFIX, "node"),
        ("rmqha-authc-read", "read", _PREFIX, "monitor"),
        ("rmqha-elsewhere", "readwrite", "/rmqha/elsewhere/", "other"),
    ][: 1 if only_node else 3]:
        cluster.etcdctl("role", "add", role)
        cluster.etcdctl("role", "grant-permission", role, "--prefix=true", kind, prefix)
        cluster.etcdctl("user", "grant-role", user, role)
    cluster.etcdctl("auth", "enable")
    return files


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EtcdCluster, dict[str, str]]]:
    directory = str(tmp_path_factory.mktemp("etcd-auth"))
    with EtcdCluster(directory, 1, args=("--auth-token-ttl", str(_TOKEN_TTL))) as cluster:
        yield cluster, _secured(cluster, directory)


@pytest.fixture
def clients() -> Iterator[list[EtcdDCS]]:
    made: list[EtcdDCS] = []
    yield made
    for dcs in made:
        pytest_twisted.blockon(dcs.close())


def _as(
    cluster: EtcdCluster, files: dict[str, str], user: str, made: list[EtcdDCS],
    group: str | None = None,
) -> EtcdDCS:
    spec = f"{cluster.spec},user={user},passwordFile={files[user]}"
    dcs = EtcdDCS(_reactor(), parse_coordinator(spec), group or f"authc{next(_groups)}", environ={})
    made.append(dcs)
    return dcs


class TestEtcdContractWithAuth(DCSContractMixin):
    """
    The IDCS contract (tests/_dcs_contract.py) as the node user, whose
    role allows only the groups' prefix.
    """

    lists_groups = False

    @pytest.fixture(autouse=True)
    def _cluster(self, secured: tuple[EtcdCluster, dict[str, str]], clients: list[EtcdDCS]) -> None:
        self.cluster, self.files = secured
        self.clients = clients
        self.group = f"authc{next(_groups)}"

    def make_dcs(self) -> EtcdDCS:
        return _as(self.cluster, self.files, "node", self.clients, self.group)

    def expire(self, lease: Lease) -> Deferred[None]:
        return self.clients[0].revoke(lease)

    def run_scenario(self, scenario: Scenario) -> Deferred[None]:
        return Deferred.fromCoroutine(scenario())

    async def pause(self, seconds: float) -> None:
        await deferLater(_reactor(), seconds, lambda: None)

    async def put_raw(self, dcs: EtcdDCS, name: str, value: bytes) -> None:
        await put_raw(dcs, name, value)


@pytest_twisted.ensureDeferred
async def test_refusals_are_one_line(
    secured: tuple[EtcdCluster, dict[str, str]], clients: list[EtcdDCS]
) -> None:
    """
    What each refusal looks like, as etcd 3.4 says it: a user without
    permission on the prefix (403, permission denied), a read-only user
    writing (the same), a wrong password (400, authentication failed),
    no user at all (400, user name is empty): each one line naming the
    endpoint, the route and etcd's reason, never a password; the read-only
    user can read.
    """
    cluster, files = secured
    endpoint = cluster.endpoints[0]
    group = f"authc{next(_groups)}"
    other = _as(cluster, files, "other", clients, group)
    with pytest.raises(DCSError) as refused:
        await other.load()
    assert str(refused.value) == (
        f"etcd {endpoint}: /v3/kv/range: HTTP 403: etcdserver: permission denied (code 7) "
        "(user other)"
    )
    monitor = _as(cluster, files, "monitor", clients, group)
    assert (await monitor.load()).members == {}
    lease = await monitor.grant(5)  # (leases need no permission)
    with pytest.raises(DCSError) as refused:
        await monitor.touch_member(Member("m", "127.0.0.1:1"), lease)
    assert "/v3/kv/put: HTTP 403: etcdserver: permission denied (code 7) (user monitor)" in str(
        refused.value
    )
    wrong = os.path.join(os.path.dirname(files["node"]), "wrong.password")
    with open(wrong, "w") as f:
        f.write("not-the-password\n")
    spec = parse_coordinator(f"{cluster.spec},user=node,passwordFile={wrong}")
    bad = EtcdDCS(_reactor(), spec, group, environ={})
    clients.append(bad)
    with pytest.raises(DCSError) as refused:
        await bad.load()
    assert str(refused.value) == (
        f"etcd {endpoint}: /v3/auth/authenticate: HTTP 400: etcdserver: authentication "
        "failed, invalid user ID or password (code 3) (user node)"
    )
    anonymous = EtcdDCS(_reactor(), parse_coordinator(cluster.spec), group)
    clients.append(anonymous)
    with pytest.raises(DCSError) as refused:
        await anonymous.load()
    assert "HTTP 400: etcdserver: user name is empty (code 3); etcd wants a user" in str(refused.value)


@pytest_twisted.ensureDeferred
async def test_expired_token_renewed(
    secured: tuple[EtcdCluster, dict[str, str]], clients: list[EtcdDCS]
) -> None:
    """
    etcd drops a simple token left unused for --auth-token-ttl: the next
    call, a campaign txn, takes a new one and succeeds; a watch made
    before keeps running and sees the change.
    """
    cluster, files = secured
    reactor = _reactor()
    dcs = _as(cluster, files, "node", clients)
    changes: list[int] = []
    errors: list[DCSError] = []
    watch = dcs.watch(lambda: changes.append(1), errors.append)
    lease = await dcs.grant(10)
    view = await dcs.load()
    first = dcs._token
    assert first is not None
    await deferLater(reactor, _TOKEN_TTL + 1.5, lambda: None)
    started = len(changes)
    leader = await dcs.campaign(Leader("a", 0, "127.0.0.1:1"), lease, view)
    assert leader is not None and leader.epoch == 1
    assert dcs._token is not None and dcs._token != first
    await dcs.touch_member(Member("a", "127.0.0.1:1"), lease)
    assert list((await dcs.load()).members) == ["a"]
    deadline = reactor.seconds() + 5
    while len(changes) <= started:
        assert reactor.seconds() < deadline, "the watch saw no change"
        await deferLater(reactor, 0.05, lambda: None)
    watch.stop()
    assert errors == []


@pytest_twisted.ensureDeferred
async def test_revoked_token_renewed(tmp_path: Any, clients: list[EtcdDCS]) -> None:
    """
    `etcdctl auth disable` drops every token: calls go on without one
    (etcd says auth is off); `auth enable` again: the next call takes a
    new token; a watch restarted meanwhile is created with it.  No call
    fails.
    """
    with EtcdCluster(str(tmp_path / "etcd")) as cluster:
        files = _secured(cluster, str(tmp_path))
        reactor = _reactor()
        dcs = _as(cluster, files, "node", clients)
        lease = await dcs.grant(30)
        await dcs.touch_member(Member("a", "127.0.0.1:1"), lease)
        assert dcs._token is not None
        cluster.etcdctl("auth", "disable", user="root", password="root-pw")
        await dcs.touch_member(Member("a", "127.0.0.1:2"), lease)
        assert dcs._token is None
        cluster.etcdctl("auth", "enable")
        assert (await dcs.load()).members["a"].ha == "127.0.0.1:2"
        assert dcs._token is not None
        changes: list[int] = []
        errors: list[DCSError] = []
        watch = dcs.watch(lambda: changes.append(1), errors.append)
        deadline = reactor.seconds() + 5
        while not changes:
            assert reactor.seconds() < deadline, "the watch did not start"
            await deferLater(reactor, 0.05, lambda: None)
        watch.stop()
        assert errors == []
        for made in clients:
            await made.close()
        clients.clear()


@pytest_twisted.ensureDeferred
async def test_cluster_commands_over_tls_with_a_user(tmp_path: Any, clients: list[EtcdDCS]) -> None:
    """
    `rmqha cluster status` and `rmqha cluster switchover` take the
    brokers' spec: https with tlsCa, a client certificate, user= and
    passwordFile= (or RMQHA_ETCD_PASSWORD).  Without a user, etcd's
    refusal says to give one; a client certificate with a CommonName,
    which etcd 3.4's gateway refuses once auth is on, is one line saying
    so.
    """
    directory = str(tmp_path / "pki")
    os.makedirs(directory)
    ca = certs.make_ca()
    ca_path, _ = certs.write_pair(ca, directory, "ca")
    server = certs.issue(ca, "etcd", ["localhost"], ["127.0.0.1"], server=True, client=True)
    server_cert, server_key = certs.write_pair(server, directory, "etcd")
    # (etcd's gateway refuses a client certificate with a CommonName once
    # its auth is on: the name is only a SAN.)
    node_cert, node_key = certs.write_pair(
        certs.issue(ca, "", ["ops"], client=True), directory, "ops"
    )
    named_cert, named_key = certs.write_pair(
        certs.issue(ca, "ops", ["ops"], client=True), directory, "named"
    )
    with EtcdCluster(str(tmp_path / "etcd"), 1, tls=TLSFiles(server_cert, server_key, ca_path)) as cluster:
        files = _secured(cluster, directory, only_node=True)
        leader = {"node_id": "a", "epoch": 1, "ha": "127.0.0.1:10911", "http": None}
        member = {"node_id": "a", "ha": "127.0.0.1:10911", "role": "master", "epoch": 1}
        for key, value in [("leader", leader), ("epoch", 1), ("members/a", member)]:
            cluster.etcdctl(
                "put", f"{_PREFIX}1/{key}", json.dumps(value), user="root", password="root-pw"
            )
        tls = f"tlsCa={ca_path},tlsCert={node_cert},tlsKey={node_key}"
        spec = f"{cluster.spec},{tls},user=node,passwordFile={files['node']}"

        def rmqha(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
            # (Blocks the reactor for a moment: nothing else runs on it.)
            environ = {k: v for k, v in os.environ.items() if k != "RMQHA_ETCD_PASSWORD"}
            # (This checkout's rmqha, whatever the working directory.)
            environ["PYTHONPATH"] = os.path.dirname(os.path.dirname(rmqha_package.__file__))
            return subprocess.run(
                [sys.executable, "-m", "rmqha", "cluster", *argv, "--group", "authc1"],
                capture_output=True, text=True, timeout=30, env={**environ, **(env or {})},
            )

        # (No node runs: nobody rewrites a's member key while status
        # watches it, so a is NOT REPORTING and the status exits 1 --
        # having read the group through TLS and the user.)
        done = rmqha("status", "--coordinator", spec, "--json")
        assert (done.returncode, done.stderr) == (1, "")
        state = json.loads(done.stdout)
        assert state["master"]["node_id"] == "a" and state["epoch"] == 1
        assert state["master"]["reporting"] is False
        done = rmqha(
            "status", "--coordinator", f"{cluster.spec},{tls},user=node",
            env={"RMQHA_ETCD_PASSWORD": "node-pw"},
        )
        assert (done.returncode, done.stderr) == (1, "")
        assert "master a (127.0.0.1:10911; NOT REPORTING for 1 s" in done.stdout
        assert done.stdout.splitlines()[-1].split() == [
            "a", "master", "1", "0", "0", "no", "NOT", "REPORTING", "for", "1", "s"
        ]
        done = rmqha("switchover", "--coordinator", spec, "--to", "zz")
        assert done.returncode == 1
        assert done.stderr.strip().splitlines() == [
            "rmqha: error: zz is not a live member (members: a)"
        ]

        anonymous = EtcdDCS(_reactor(), parse_coordinator(f"{cluster.spec},{tls}"), "authc1")
        clients.append(anonymous)
        with pytest.raises(DCSError) as refused:
            await anonymous.load()
        assert str(refused.value).endswith(
            "/v3/kv/range: HTTP 403: etcdserver: permission denied (code 7); etcd wants a "
            "user: add user=NAME,passwordFile=PATH to --coordinator"
        )
        named = f"tlsCa={ca_path},tlsCert={named_cert},tlsKey={named_key}"
        spec = f"{cluster.spec},{named},user=node,passwordFile={files['node']}"
        with_name = EtcdDCS(_reactor(), parse_coordinator(spec), "authc1")
        clients.append(with_name)
        with pytest.raises(DCSError) as refused:
            await with_name.load()
        assert str(refused.value) == (
            f"etcd {cluster.endpoints[0]}: /v3/auth/authenticate: HTTP 400: not JSON: CommonName "
            "of client sending a request against gateway will be ignored and not used as "
            "expected; with etcd's auth enabled, the client certificate must have no "
            "CommonName (docs/failover.md)"
        )
        for made in clients:
            await made.close()
        clients.clear()
