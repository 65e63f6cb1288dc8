"""
What every L{IDCS} must do, as tests any implementation's test class
inherits (L{DCSContractMixin}): etcd in tests/integration/test_etcd_dcs.py,
the in-memory one in tests/test_dcs_memory.py.

Each scenario is a coroutine; the subclass says how it runs (trial's
C{successResultOf} on a L{Clock}, or pytest-twisted's C{blockon} on the
real reactor) and how time passes, so the same assertions hold for both.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Coroutine

from rmqha.coord.dcs import (
    MAX_MALFORMED,
    DCSError,
    IDCS,
    InSync,
    Leader,
    Lease,
    LeaseLost,
    Member,
    Switchover,
)

Scenario = Callable[[], Coroutine[Any, Any, None]]


async def elect(dcs: Any, node: str) -> tuple[Leader, Lease]:
    """
    C{node} takes a 5 s lease and wins an election on C{dcs}.
    """
    lease = await dcs.grant(5)
    view = await dcs.load()
    leader = await dcs.campaign(Leader(node, 0, f"127.0.0.1:{len(node)}"), lease, view)
    assert leader is not None, f"{node} was not elected from {view}"
    return leader, lease


class DCSContractMixin:
    """
    Subclasses provide:

        - C{make_dcs()}: a new client (another node) on the group of the
          running test, empty at the test's start; several calls in one
          test share that group;
        - C{expire(lease)}: make C{lease} expire as if its TTL ran out
          (may return an awaitable);
        - C{run_scenario(scenario)}: run the coroutine function to its end, failing
          the test on an exception; the test returns what it returns (a
          L{Deferred} pytest-twisted waits for, or C{None});
        - C{pause(seconds)} (async): let that much time pass;
        - C{put_raw(dcs, name, value)} (async): write C{value} as it is
          under C{name} in C{dcs}'s group (no lease), as an operator or a
          bug could.
    """

    #: Whether this client may read all of C{/rmqha/} (C{groups()}).
    lists_groups = True

    def make_dcs(self) -> Any:
        raise NotImplementedError

    def expire(self, lease: Lease) -> Any:
        raise NotImplementedError

    def run_scenario(self, scenario: Scenario) -> Any:
        raise NotImplementedError

    async def pause(self, seconds: float) -> None:
        raise NotImplementedError

    async def put_raw(self, dcs: Any, name: str, value: bytes) -> None:
        raise NotImplementedError

    # -- helpers ---------------------------------------------------------

    async def _expire(self, lease: Lease) -> None:
        result = self.expire(lease)
        if inspect.isawaitable(result):
            await result

    async def eventually(self, condition: Callable[[], bool], what: str,
                         timeout: float = 5.0) -> None:
        waited = 0.0
        while not condition():
            if waited >= timeout:
                raise AssertionError(f"not within {timeout} s: {what}")
            await self.pause(0.05)
            waited += 0.05

    async def _elected(self, dcs: Any, node: str) -> tuple[Leader, Lease]:
        return await elect(dcs, node)

    # -- the contract ----------------------------------------------------

    def test_provides_idcs(self) -> Any:
        """
        The implementation says it provides L{IDCS}, names its group and
        its endpoint.
        """
        dcs = self.make_dcs()
        assert IDCS.providedBy(dcs)
        assert dcs.group and isinstance(dcs.group, str)
        assert isinstance(dcs.endpoint, str)

    def test_empty_group(self) -> Any:
        """
        A group nobody wrote to loads as nothing: no leader, epoch 0, no
        in-sync set, no members, no switchover.
        """
        async def scenario() -> None:
            view = await self.make_dcs().load()
            assert view.leader is None and view.epoch == 0 and view.epoch_revision == 0
            assert view.in_sync is None and view.members == {} and view.switchover is None

        return self.run_scenario(scenario)

    def test_grant_and_keepalive(self) -> Any:
        """
        A lease is granted with at least the asked TTL; a keepalive fires
        with the TTL left, positive and at most the granted one.
        """
        async def scenario() -> None:
            dcs = self.make_dcs()
            lease = await dcs.grant(3)
            assert lease.ttl >= 3
            left = await dcs.keepalive(lease)
            assert 0 < left <= lease.ttl

        return self.run_scenario(scenario)

    def test_campaign_once_wins(self) -> Any:
        """
        Of two nodes campaigning from the same view, the first wins (epoch
        1, a fencing revision, itself the in-sync set) and the second gets
        C{None}; both then load the winner.
        """
        async def scenario() -> None:
            a, b = self.make_dcs(), self.make_dcs()
            lease_a, lease_b = await a.grant(5), await b.grant(5)
            view = await a.load()
            won = await a.campaign(Leader("a", 0, "127.0.0.1:1", "127.0.0.1:8"), lease_a, view)
            assert won is not None
            assert (won.node_id, won.epoch, won.ha, won.http) == ("a", 1, "127.0.0.1:1", "127.0.0.1:8")
            assert won.revision > 0
            lost = await b.campaign(Leader("b", 0, "127.0.0.1:2"), lease_b, view)
            assert lost is None
            seen = await b.load()
            assert seen.leader == won and seen.leader.revision == won.revision
            # The key is on a's lease: which incarnation holds it.
            assert won.lease == seen.leader.lease == lease_a.id
            assert seen.epoch == 1 and seen.epoch_revision > 0
            assert seen.in_sync is not None
            assert (seen.in_sync.epoch, seen.in_sync.members) == (1, ("a",))
            # A view taken after the election does not help either.
            assert await b.campaign(Leader("b", 0, "127.0.0.1:2"), lease_b, seen) is None

        return self.run_scenario(scenario)

    def test_epoch_increments_across_elections(self) -> Any:
        """
        Every election bumps the epoch by one and gives a higher fencing
        revision.
        """
        async def scenario() -> None:
            a, b = self.make_dcs(), self.make_dcs()
            first, _ = await self._elected(a, "a")
            assert await a.resign(first) is True
            second, _ = await self._elected(b, "b")
            assert second.epoch == 2 and second.revision > first.revision
            view = await a.load()
            assert view.epoch == 2 and view.leader == second
            assert view.in_sync is not None and view.in_sync.epoch == 2

        return self.run_scenario(scenario)

    def test_campaign_fails_if_epoch_moved(self) -> Any:
        """
        A campaign from a view older than the last election fails even
        when nobody leads now: the epoch key moved.
        """
        async def scenario() -> None:
            a, b = self.make_dcs(), self.make_dcs()
            old = await b.load()
            first, _ = await self._elected(a, "a")
            assert await a.resign(first) is True
            lease = await b.grant(5)
            assert await b.campaign(Leader("b", 0, "127.0.0.1:2"), lease, old) is None
            view = await b.load()
            assert view.leader is None and view.epoch == 1

        return self.run_scenario(scenario)

    def test_publish_in_sync_only_for_the_leader(self) -> Any:
        """
        The leader's in-sync set is written (with a revision); once another
        node leads, the old leader's write is refused (C{None}) and the new
        one's set stays.
        """
        async def scenario() -> None:
            a, b = self.make_dcs(), self.make_dcs()
            first, _ = await self._elected(a, "a")
            written = await a.publish_in_sync(InSync(1, ("a", "b")), first)
            assert written is not None and written.members == ("a", "b")
            assert written.revision > 0
            view = await b.load()
            assert view.in_sync == InSync(1, ("a", "b"))
            assert view.in_sync.revision == written.revision
            assert await a.resign(first) is True
            await self._elected(b, "b")
            assert await a.publish_in_sync(InSync(1, ("a", "b")), first) is None
            view = await b.load()
            assert view.in_sync == InSync(2, ("b",))

        return self.run_scenario(scenario)

    def test_resign_only_own(self) -> Any:
        """
        Resigning deletes the leader key only for the leadership that holds
        it (same revision); the lease stays usable.
        """
        async def scenario() -> None:
            a = self.make_dcs()
            mine, lease = await self._elected(a, "a")
            other = Leader("a", mine.epoch, mine.ha, mine.http, revision=mine.revision + 1000)
            assert await a.resign(other) is False
            assert (await a.load()).leader == mine
            assert await a.resign(mine) is True
            assert (await a.load()).leader is None
            assert await a.resign(mine) is False
            assert await a.keepalive(lease) > 0

        return self.run_scenario(scenario)

    def test_members(self) -> Any:
        """
        Each node's member key holds what it last said.
        """
        async def scenario() -> None:
            a, b = self.make_dcs(), self.make_dcs()
            lease_a, lease_b = await a.grant(5), await b.grant(5)
            await a.touch_member(Member("a", "127.0.0.1:1", offset=10), lease_a)
            await b.touch_member(Member("b", "127.0.0.1:2", role="slave", epoch=3), lease_b)
            await a.touch_member(Member("a", "127.0.0.1:1", role="master", offset=20), lease_a)
            view = await b.load()
            assert view.members == {
                "a": Member("a", "127.0.0.1:1", role="master", offset=20),
                "b": Member("b", "127.0.0.1:2", role="slave", epoch=3),
            }

        return self.run_scenario(scenario)

    def test_groups(self) -> Any:
        """
        C{groups()} names the groups with a key under C{/rmqha/}: this
        one once a node is in it; a client that may read only its groups'
        keys gets a L{DCSError} (C{cluster status} then names none).
        """
        async def scenario() -> None:
            a = self.make_dcs()
            lease = await a.grant(5)
            await a.touch_member(Member("a", "127.0.0.1:1"), lease)
            if not self.lists_groups:
                try:
                    await a.groups()
                except DCSError:
                    return
                raise AssertionError("groups() listed what this client may not read")
            groups = await a.groups()
            assert a.group in groups and groups == sorted(set(groups)), groups

        return self.run_scenario(scenario)

    def test_lease_expiry_deletes_leader_and_member(self) -> Any:
        """
        When the leader's lease expires its leader and member keys go; the
        epoch and the in-sync set stay (the next election needs them).
        """
        async def scenario() -> None:
            a, b = self.make_dcs(), self.make_dcs()
            leader, lease = await self._elected(a, "a")
            lease_b = await b.grant(30)
            await a.touch_member(Member("a", "127.0.0.1:1"), lease)
            await b.touch_member(Member("b", "127.0.0.1:2"), lease_b)
            await self._expire(lease)
            view = await b.load()
            assert view.leader is None
            assert list(view.members) == ["b"]
            assert view.epoch == 1 and view.in_sync is not None

        return self.run_scenario(scenario)

    def test_revoked_lease_is_lost(self) -> Any:
        """
        After a revoke, a keepalive fails with L{LeaseLost} (a
        L{DCSError}), and revoking again is not an error.
        """
        async def scenario() -> None:
            dcs = self.make_dcs()
            lease = await dcs.grant(5)
            await dcs.revoke(lease)
            try:
                await dcs.keepalive(lease)
            except LeaseLost as e:
                assert isinstance(e, DCSError)
            else:
                raise AssertionError("keepalive on a revoked lease did not fail")
            await dcs.revoke(lease)

        return self.run_scenario(scenario)

    def test_switchover_rules(self) -> Any:
        """
        A switchover is accepted only when it names the current leader and
        none is pending; clearing it needs its revision.
        """
        async def scenario() -> None:
            a, b = self.make_dcs(), self.make_dcs()
            assert await b.request_switchover(Switchover("b", "a")) is False  # no leader
            await self._elected(a, "a")
            assert await b.request_switchover(Switchover("a", "b")) is False  # b does not lead
            assert await b.request_switchover(Switchover("b", "a", 5.0)) is True
            assert await b.request_switchover(Switchover("c", "a")) is False  # one pending
            pending = (await a.load()).switchover
            assert pending == Switchover("b", "a", 5.0) and pending.revision > 0
            stale = Switchover("b", "a", 5.0, revision=pending.revision - 1)
            await a.clear_switchover(stale)
            assert (await a.load()).switchover == pending
            await a.clear_switchover(pending)
            assert (await a.load()).switchover is None

        return self.run_scenario(scenario)

    def test_watch_sees_changes(self) -> Any:
        """
        A watch calls back once it starts and after a change under the
        group; after C{stop()} nothing more.
        """
        async def scenario() -> None:
            a, b = self.make_dcs(), self.make_dcs()
            changes: list[int] = []
            errors: list[DCSError] = []
            watch = a.watch(lambda: changes.append(1), errors.append)
            await self.eventually(lambda: len(changes) >= 1, "the watch started")
            started = len(changes)
            lease = await b.grant(5)
            await b.touch_member(Member("b", "127.0.0.1:2"), lease)
            await self.eventually(lambda: len(changes) > started, "the change was seen")
            watch.stop()
            seen = len(changes)
            await b.touch_member(Member("b", "127.0.0.1:2", offset=1), lease)
            await self.pause(0.2)
            assert len(changes) == seen
            assert errors == []

        return self.run_scenario(scenario)

    # -- malformed keys (docs/failover.md, "Malformed keys") ---------------

    def test_malformed_keys_skipped_and_reported(self) -> None:
        """
        A value that is not what its key holds does not fail the read: the
        key is skipped (a member absent, no switchover) and reported by
        its whole key with a one-line reason; the other keys read as usual.
        """
        async def scenario() -> None:
            a = self.make_dcs()
            lease = await a.grant(5)
            await a.touch_member(Member("a", "127.0.0.1:1"), lease)
            await self.put_raw(a, "members/x", b"{not json")
            await self.put_raw(a, "members/y", b"\xff\xfe")
            await self.put_raw(a, "members/w", b'{"node_id":"w","ha":"h:1","offset":"12"}')
            await self.put_raw(a, "members/v", b'{"node_id":"v","ha":"h:1","color":"red"}')
            await self.put_raw(a, "switchover", b"[]")
            view = await a.load()
            assert view.members == {"a": Member("a", "127.0.0.1:1")}, view.members
            assert view.switchover is None
            group = f"/rmqha/{a.group}/"
            assert [m.key for m in view.malformed] == [
                group + "switchover", group + "members/v", group + "members/w",
                group + "members/x", group + "members/y",
            ], view.malformed
            assert view.malformed_total == 5
            reasons = [m.reason for m in view.malformed]
            assert "not a JSON object" in reasons[0]
            assert "unknown field" in reasons[1] and "color" in reasons[1]
            assert "offset is not a non-negative integer" in reasons[2]
            assert "not JSON" in reasons[3]
            assert "not JSON" in reasons[4]
            assert all("\n" not in r and len(r) < 200 for r in reasons)
            assert all(m.revision > 0 for m in view.malformed)
            # (A member key must hold that member.)
            await self.put_raw(a, "members/y", b'{"node_id":"z","ha":"h:1"}')
            view = await a.load()
            bad = [m for m in view.malformed if m.name == "members/y"]
            assert bad and "not 'y'" in bad[0].reason, view.malformed

        return self.run_scenario(scenario)

    def test_malformed_keys_bounded(self) -> None:
        """
        At most MAX_MALFORMED keys are listed, the group's own keys first
        (a malformed leader is never crowded out by members); the total
        counts them all.
        """
        async def scenario() -> None:
            a = self.make_dcs()
            for i in range(MAX_MALFORMED + 2):
                await self.put_raw(a, f"members/n{i:02d}", b"junk")
            await self.put_raw(a, "leader", b"junk")
            view = await a.load()
            assert len(view.malformed) == MAX_MALFORMED
            assert view.malformed_total == MAX_MALFORMED + 3
            assert view.malformed[0].name == "leader"
            assert view.malformed_key("leader") is view.malformed[0]

        return self.run_scenario(scenario)

    def test_malformed_leader_blocks_campaign(self) -> None:
        """
        A malformed leader key reads as no leader, reported; a campaign
        from that view fails (the key exists), so it must be deleted, or
        its lease expire, before anyone can lead.
        """
        async def scenario() -> None:
            a = self.make_dcs()
            lease = await a.grant(5)
            await self.put_raw(a, "leader", b'{"node_id":"q"}')
            view = await a.load()
            assert view.leader is None and view.malformed_key("leader") is not None
            assert "no epoch" in view.malformed_key("leader").reason
            assert await a.campaign(Leader("a", 0, "127.0.0.1:1"), lease, view) is None

        return self.run_scenario(scenario)

    def test_malformed_epoch_never_restarts_the_count(self) -> None:
        """
        An epoch key that is not a decimal number reads as epoch 0 and is
        reported; a campaign from that view fails, so no epoch is handed
        out twice.
        """
        async def scenario() -> None:
            a = self.make_dcs()
            first, lease = await self._elected(a, "a")
            assert await a.resign(first) is True
            for junk in (b"two", b"-3", b" 2", b"1_0", b""):
                await self.put_raw(a, "epoch", junk)
                view = await a.load()
                assert view.epoch == 0 and view.epoch_revision == 0, junk
                bad = view.malformed_key("epoch")
                assert bad is not None and "not a decimal epoch" in bad.reason, junk
                assert await a.campaign(Leader("a", 0, "127.0.0.1:1"), lease, view) is None

        return self.run_scenario(scenario)

    def test_campaign_replaces_malformed_in_sync(self) -> None:
        """
        A malformed insync key reads as no in-sync set, reported with its
        revision; a campaign from that view (an unclean election, for the
        coordinator) replaces it with the winner alone.
        """
        async def scenario() -> None:
            a = self.make_dcs()
            first, lease = await self._elected(a, "a")
            assert await a.resign(first) is True
            await self.put_raw(a, "insync", b'{"epoch":1,"members":"a"}')
            view = await a.load()
            assert view.in_sync is None and view.epoch == 1
            bad = view.malformed_key("insync")
            assert bad is not None and "members is not a list of strings" in bad.reason
            assert view.in_sync_revision == bad.revision > 0
            won = await a.campaign(Leader("a", 0, "127.0.0.1:1"), lease, view)
            assert won is not None and won.epoch == 2
            view = await a.load()
            assert view.in_sync == InSync(2, ("a",)) and view.malformed == ()

        return self.run_scenario(scenario)
