"""
L{EtcdDCS} against real etcd members on 127.0.0.1 (pytest-twisted): the
L{IDCS} contract on one member, then what only a real cluster shows: a
lease running out, an unreachable endpoint listed first, the etcd leader
killed (1 of 3), and quorum lost (2 of 3).
"""

from __future__ import annotations

import itertools
from typing import Any, Iterator

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater

from rmqha import certs
from rmqha.coord.dcs import DCSError, Leader, Lease, Member
from rmqha.coord.etcd import EtcdDCS, _b64, parse_coordinator
from tools.etcd_cluster import EtcdCluster
from tools.processes import etcd_binary, free_ports
from rmqha.tls import TLSFiles

from tests._dcs_contract import DCSContractMixin, Scenario, elect
from tests.integration._support import until

pytestmark = pytest.mark.skipif(
    etcd_binary() is None,
    reason="etcd is not installed (python3 dev.py test installs etcd-server when run as root)",
)

_groups = itertools.count(1)


def _reactor() -> Any:
    from twisted.internet import reactor

    return reactor


@pytest.fixture(scope="module")
def etcd1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    with EtcdCluster(str(tmp_path_factory.mktemp("etcd1")), 1) as cluster:
        yield cluster


@pytest.fixture
def etcd3(tmp_path: Any) -> Iterator[EtcdCluster]:
    with EtcdCluster(str(tmp_path / "etcd3"), 3) as cluster:
        yield cluster


@pytest.fixture
def clients() -> Iterator[list[EtcdDCS]]:
    made: list[EtcdDCS] = []
    yield made
    for dcs in made:
        pytest_twisted.blockon(dcs.close())


async def put_raw(dcs: EtcdDCS, name: str, value: bytes) -> None:
    """
    Put C{value} as it is under C{name} in C{dcs}'s group, through the
    client's own request path (its credentials included).
    """
    request = {"key": _b64(dcs.key(name)), "value": _b64(value)}
    await dcs._call("/v3/kv/put", request, retry=False)


def _dcs(spec: str, made: list[EtcdDCS], group: str | None = None, **kwargs: Any) -> EtcdDCS:
    dcs = EtcdDCS(_reactor(), parse_coordinator(spec), group or f"t{next(_groups)}", **kwargs)
    made.append(dcs)
    return dcs


class TestEtcdContract(DCSContractMixin):
    """
    The IDCS contract (tests/_dcs_contract.py) on one etcd member, each
    test on its own group.
    """

    @pytest.fixture(autouse=True)
    def _cluster(self, etcd1: EtcdCluster, clients: list[EtcdDCS]) -> None:
        self.cluster = etcd1
        self.clients = clients
        self.group = f"contract{next(_groups)}"

    def make_dcs(self) -> EtcdDCS:
        return _dcs(self.cluster.spec, self.clients, self.group)

    def expire(self, lease: Lease) -> Deferred[None]:
        # Revoking deletes the attached keys as expiry does;
        # test_lease_runs_out waits for a real expiry once.
        return self.clients[0].revoke(lease)

    def run_scenario(self, scenario: Scenario) -> Deferred[None]:
        # pytest-twisted runs tests in the reactor's greenlet and waits
        # for a Deferred they return.
        return Deferred.fromCoroutine(scenario())

    async def pause(self, seconds: float) -> None:
        await deferLater(_reactor(), seconds, lambda: None)

    async def put_raw(self, dcs: EtcdDCS, name: str, value: bytes) -> None:
        await put_raw(dcs, name, value)


@pytest_twisted.ensureDeferred
async def test_lease_runs_out(etcd1: EtcdCluster, clients: list[EtcdDCS]) -> None:
    """
    A leader that stops renewing loses its key within TTL + etcd's 0.5 s
    check, and a watch of another node sees it go.
    """
    reactor = _reactor()
    a = _dcs(etcd1.spec, clients)
    b = _dcs(etcd1.spec, clients, a.group)
    changes: list[int] = []
    watch = b.watch(lambda: changes.append(1), lambda e: None)
    await until(reactor, lambda: bool(changes), "the watch started", 5)
    lease = await a.grant(2)
    view = await a.load()
    assert await a.campaign(Leader("a", 0, "127.0.0.1:1"), lease, view) is not None
    await a.touch_member(Member("a", "127.0.0.1:1"), lease)
    started = reactor.seconds()
    seen: list[Any] = []

    async def gone() -> bool:
        seen.append((await b.load()).leader)
        return seen[-1] is None

    while not await gone():
        assert reactor.seconds() - started < 5.0, "the leader key outlived its lease"
        await deferLater(reactor, 0.1, lambda: None)
    assert reactor.seconds() - started >= 1.5
    assert (await b.load()).members == {}
    assert len(changes) >= 3  # started, put leader/member, and the expiry
    watch.stop()


@pytest_twisted.ensureDeferred
async def test_unreachable_endpoint_first(etcd1: EtcdCluster, clients: list[EtcdDCS]) -> None:
    """
    A dead endpoint listed first costs one refused connection: calls and
    watches go on to the next endpoint within the deadline.
    """
    reactor = _reactor()
    (dead,) = free_ports(1)
    dcs = _dcs(f"etcd:http://127.0.0.1:{dead},{etcd1.endpoints[0]}", clients)
    started = reactor.seconds()
    view = await dcs.load()
    assert view.leader is None
    assert reactor.seconds() - started < 1.0
    lease = await dcs.grant(5)
    assert await dcs.keepalive(lease) > 0
    changes: list[int] = []
    errors: list[DCSError] = []
    watch = dcs.watch(lambda: changes.append(1), errors.append)
    await until(reactor, lambda: bool(changes), "the watch started", 5)
    watch.stop()
    assert all("connection refused" in str(e) for e in errors), errors


@pytest_twisted.ensureDeferred
async def test_etcd_leader_killed(etcd3: EtcdCluster, clients: list[EtcdDCS]) -> None:
    """
    With the etcd leader killed (1 of 3), every call fails within its
    deadline or succeeds, and calls succeed again within seconds; the
    lease and the leader key survive.
    """
    reactor = _reactor()
    dcs = _dcs(etcd3.spec, clients)
    leader, lease = await elect(dcs, "a")
    index = etcd3.leader_index()
    assert index is not None
    etcd3.kill(index)
    started = reactor.seconds()
    while True:
        before = reactor.seconds()
        try:
            view = await dcs.load()
            assert await dcs.keepalive(lease) > 0
            break
        except DCSError:
            assert reactor.seconds() - before < 2 * 1.0 + 0.5
        assert reactor.seconds() - started < 10, "no answer 10 s after the etcd leader died"
        await deferLater(reactor, 0.1, lambda: None)
    assert view.leader == leader


@pytest_twisted.ensureDeferred
async def test_quorum_lost(etcd3: EtcdCluster, clients: list[EtcdDCS]) -> None:
    """
    With 2 of 3 members dead, the survivor being the etcd leader (the
    worst case): reads fail with a DCSError within their deadline (etcd
    itself would take 7 s); keepalives, which the etcd leader answers on
    its own, fail once it steps down (about one election timeout, 1 s);
    the watch reports an error within ~5 s (hasleader) though its member
    still runs.
    """
    reactor = _reactor()
    leader = etcd3.leader_index()
    assert leader is not None
    order = [leader] + [i for i in range(3) if i != leader]
    dcs = _dcs("etcd:" + ",".join(etcd3.endpoints[i] for i in order), clients)
    lease = await dcs.grant(5)
    changes: list[int] = []
    errors: list[DCSError] = []
    watch = dcs.watch(lambda: changes.append(1), errors.append)
    await until(reactor, lambda: bool(changes), "the watch started", 5)
    assert dcs._current == 0
    for i in order[1:]:
        etcd3.kill(i)
    lost = reactor.seconds()
    started = reactor.seconds()
    with pytest.raises(DCSError):
        await dcs.load()
    assert reactor.seconds() - started < 1.0 + 0.3
    while True:
        started = reactor.seconds()
        try:
            await dcs.keepalive(lease)
        except DCSError:
            assert reactor.seconds() - started < 1.0 + 0.3
            break
        assert reactor.seconds() - lost < 3.0, "keepalives still answered 3 s after quorum loss"
        await deferLater(reactor, 0.1, lambda: None)
    await until(reactor, lambda: bool(errors), "the watch noticed the quorum loss", 7)
    assert reactor.seconds() - lost < 6.5
    assert "/v3/watch" in str(errors[0])
    watch.stop()


@pytest_twisted.ensureDeferred
async def test_mutual_tls(tmp_path: Any, clients: list[EtcdDCS]) -> None:
    """
    Over https with a client certificate (etcd --client-cert-auth): the
    client verifies etcd's certificate against tlsCa and presents its
    own; without a client certificate etcd refuses, as a DCSError.
    """
    directory = str(tmp_path / "pki")
    import os

    os.makedirs(directory)
    ca = certs.make_ca()
    ca_path, _ = certs.write_pair(ca, directory, "ca")
    server = certs.issue(ca, "etcd", ["localhost"], ["127.0.0.1"], server=True, client=True)
    server_cert, server_key = certs.write_pair(server, directory, "etcd")
    node_cert, node_key = certs.write_pair(
        certs.issue(ca, "node", ["node"], client=True), directory, "node"
    )
    with EtcdCluster(str(tmp_path / "etcd"), 1, tls=TLSFiles(server_cert, server_key, ca_path)) as cluster:
        assert cluster.endpoints[0].startswith("https://127.0.0.1:")
        spec = f"{cluster.spec},tlsCa={ca_path},tlsCert={node_cert},tlsKey={node_key}"
        dcs = _dcs(spec, clients)
        lease = await dcs.grant(5)
        assert await dcs.keepalive(lease) > 0
        assert (await dcs.load()).leader is None
        anonymous = _dcs(f"{cluster.spec},tlsCa={ca_path}", clients)
        with pytest.raises(DCSError) as refused:
            await anonymous.load()
        assert "\n" not in str(refused.value)
        for dcs in clients:
            await dcs.close()
        clients.clear()


def test_cluster_deletes_only_the_data_it_created(tmp_path: Any) -> None:
    """
    Leaving an L{EtcdCluster} deletes the member data directories it
    created (64 MB of preallocated WAL each) and keeps its logs; a data
    directory that was there before is left alone.
    """
    import os
    import shutil

    with EtcdCluster(str(tmp_path / "fresh")) as cluster:
        assert cluster.healthy(0)
        assert os.path.isdir(tmp_path / "fresh" / "m0.etcd" / "member")
    assert not os.path.exists(tmp_path / "fresh" / "m0.etcd")
    assert os.path.getsize(tmp_path / "fresh" / "m0.log") > 0

    (tmp_path / "theirs" / "m0.etcd").mkdir(parents=True)
    with EtcdCluster(str(tmp_path / "theirs")):
        pass
    assert os.path.isdir(tmp_path / "theirs" / "m0.etcd" / "member")
    shutil.rmtree(tmp_path / "theirs")  # (this test's: 64 MB of WAL)
