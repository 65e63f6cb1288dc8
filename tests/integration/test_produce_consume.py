"""
Issue 30's "Prove it", end to end with real processes: a failover group
of two C{twistd rmqha} nodes under etcd (one SYNC_MASTER elected, the
other its slave), registered with a L{FakeNameServer} in this process;
rmqha.client's L{Producer} in this process (pytest-twisted, the global
reactor) finds the master through the NameServer and sends 100,000
messages in batches of 32; a consumer group of L{PushConsumer}s, each in
its own process (L{tests.integration._consumer_proc}) so that a kill is a
real SIGKILL, consumes them.

1. Both members consume, each message exactly once in the group while
   the group is stable (checked by queue offset and by the number and
   checksum in each body).
2. One member is killed (SIGKILL: no commit, no UNREGISTER_CLIENT): its
   connections close, the broker tells the survivor, which takes the
   dead member's queues from the group's committed offsets, never past a
   message it did not consume (duplicates counted); a new member joins
   and takes its share from the survivor's commits.
3. Production paused, the slave caught up: the consume queues on master
   and slave are byte-identical.
4. The master is killed with SIGKILL under load: the slave is elected,
   registers as brokerId 0 at once, the old master comes back as its
   slave (a two-node group takes SYNC puts only with both), the producer
   keeps producing to the new master, the consumers continue on it, and
   every message the brokers hold is consumed: none skipped (duplicates
   counted and printed), every acknowledged one where it was
   acknowledged.
   No "phantom read": a consumer never reads a message of a batch in
   flight at the kill that the failover then loses (the master serves
   only what its in-sync replicas hold, L{HAService.visible_end}; before
   that, the new master wrote another message at the place such a
   message had been read, and a consumer's offset could run ahead of the
   new master's queue).
5. Once each queue's owner consumed up to its end, the consumers stop
   cleanly: the committed offsets are the queues' ends, on the master
   that leads -- also after a second failover (under load a late lease
   renewal makes one now and then; C{RMQHA_E2E_SECOND_FAILOVER=3} makes
   one: L{SECOND_FAILOVER}).  The brokers stop; the consume queues are identical again and
   C{rmqha store check} (commit log and consume queues) passes on both
   stores.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections import Counter
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred, DeferredList, ensureDeferred
from twisted.internet.protocol import ProcessProtocol
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.python.failure import Failure

from rmqha.client import Message, Producer, SendError, SendStatus
from rmqha.remoting._frames import header_to_ext_fields
from rmqha.remoting.codes import RequestCode, ResponseCode
from rmqha.remoting.headers import GetMaxOffsetRequestHeader
from rmqha.remoting.offsets import QueryConsumerOffsetRequestHeader
from rmqha.remoting.protocol import RemotingClient
from rmqha.testing import FakeNameServer
from tests.integration._consumer_proc import body
from tests.integration._support import (
    ask,
    consume_queue_digest,
    failover_role,
    metadata_syncs,
    namesrv_options,
    topic_fields,
    until,
)
from tools.etcd_cluster import EtcdCluster
from tools.failover_cluster import FailoverCluster
from tools.processes import etcd_binary

#: Set to seconds (e.g. 3) to make the group fail over a second time: the
#: new master is stopped (SIGSTOP) that long once the old one, restarted
#: as its slave, is in sync, so its lease expires and the old one leads
#: again -- what a late lease renewal does now and then under load.
SECOND_FAILOVER = "RMQHA_E2E_SECOND_FAILOVER"

pytestmark = pytest.mark.failover

TOPIC = "E2ETopic"
GROUP = "E2EGroup"
QUEUES = 4
TOTAL = 100_000
BATCH = 32
#: Batches in flight at once.
IN_FLIGHT = 8
#: Where the phases end: the consumer killed after C{KILL_CONSUMER_AT}
#: messages sent, production paused at C{PAUSE_AT} for the consume queues'
#: comparison, the master killed after C{KILL_MASTER_AT}.
KILL_CONSUMER_AT = 20_000
PAUSE_AT = 50_000
KILL_MASTER_AT = 65_000
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Member(ProcessProtocol):
    """
    One consumer process and what it reported (see
    L{tests.integration._consumer_proc}).

    @ivar messages: C{(queue, offset, seq, ok)} in the order consumed.
    @ivar takes: C{(queue, offset, len(messages) then)} for each queue taken.
    @ivar owned: the queues it holds now.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._buffer = b""
        self.messages: list[tuple[int, int, int, int]] = []
        self.takes: list[tuple[int, int, int]] = []
        self.owned: set[int] = set()
        #: When each (queue, offset, seq) first arrived (monotonic).
        self.seen_at: dict[tuple[int, int, int], float] = {}
        self.ended: Deferred[int | None] = Deferred()
        self.exit_code: int | None = None

    def outReceived(self, data: bytes) -> None:
        *lines, self._buffer = (self._buffer + data).split(b"\n")
        for line in lines:
            kind, *fields = line.split()
            if kind == b"m":
                q, offset, seq, ok = map(int, fields)
                self.messages.append((q, offset, seq, ok))
                self.seen_at.setdefault((q, offset, seq), time.monotonic())
            elif kind == b"take":
                q, offset = map(int, fields)
                self.takes.append((q, offset, len(self.messages)))
                self.owned.add(q)
            elif kind == b"drop":
                self.owned.discard(int(fields[0]))

    def processEnded(self, reason: Failure) -> None:
        self.exit_code = getattr(reason.value, "exitCode", None)
        self.ended.callback(self.exit_code)

    def go(self) -> None:
        """Start the consumer (the process waits for a line)."""
        assert self.transport is not None
        self.transport.write(b"go\n")

    def signal(self, name: str) -> None:
        assert self.transport is not None
        self.transport.signalProcess(name)


def spawn(reactor: Any, tmp: str, namesrv: str, name: str) -> Member:
    member = Member(name)
    argv = [
        sys.executable, "-m", "tests.integration._consumer_proc",
        namesrv, GROUP, TOPIC, f"127.0.0.1@{name}", os.path.join(tmp, f"consumer-{name}.log"),
    ]
    env = dict(os.environ, PYTHONPATH=ROOT)
    reactor.spawnProcess(member, sys.executable, argv, env=env, path=ROOT, childFDs={0: "w", 1: "r", 2: 2})
    return member


class Production:
    """
    Sends messages C{0, 1, ...} (bodies from L{body}) in batches of
    L{BATCH}, L{IN_FLIGHT} at once, until a batch is SEND_OK: a failed send
    or a status that is not SEND_OK (stored, the SYNC promise not kept) is
    sent again after 50 ms, so the store may hold a message twice.

    @ivar acked: seq -> (queue, offset) where its SEND_OK put it.
    """

    def __init__(self, reactor: Any, producer: Producer) -> None:
        self.reactor = reactor
        self.producer = producer
        self.next = 0
        self.acked: dict[int, tuple[int, int]] = {}
        self.resent: Counter[str] = Counter()
        self.first_failure: float | None = None
        self.last_failure: float | None = None

    async def run(self, upto: int, deadline: float = 60.0) -> None:
        give_up = time.monotonic() + deadline
        workers = [ensureDeferred(self._worker(upto, give_up)) for _ in range(IN_FLIGHT)]
        for result in await DeferredList(workers, consumeErrors=True):
            if not result[0]:
                result[1].raiseException()

    async def _worker(self, upto: int, give_up: float) -> None:
        while self.next < upto:
            seqs = range(self.next, min(self.next + BATCH, upto))
            self.next = seqs.stop
            batch = [Message(TOPIC, body(seq)) for seq in seqs]
            while True:
                try:
                    result = await self.producer.send_batch(batch)
                except SendError as e:
                    why = type(e).__name__
                else:
                    if result.status is SendStatus.SEND_OK:
                        assert result.queue is not None
                        for i, seq in enumerate(seqs):
                            self.acked[seq] = (result.queue.queue_id, result.queue_offset + i)
                        break
                    why = result.status.name
                self.resent[why] += 1
                now = time.monotonic()
                if self.first_failure is None:
                    self.first_failure = now
                self.last_failure = now
                if now > give_up:
                    info = self.producer.routes.table.get(TOPIC)
                    raise AssertionError(
                        f"batch from {seqs.start} not SEND_OK before the deadline: {why}; the producer's route "
                        f"{info.route.broker_datas if info is not None else None}"
                    )
                await deferLater(self.reactor, 0.05, lambda: None)


@pytest_twisted.ensureDeferred
async def test_produce_consume_failover(tmp_path: Any) -> None:
    from twisted.internet import reactor

    if etcd_binary() is None:
        pytest.skip("etcd is not installed (python3 dev.py test installs etcd-server as root)")
    began = time.monotonic()
    tmp = str(tmp_path)
    namesrv = FakeNameServer(reactor)
    port = await namesrv.listen(reactor, "tcp:0:interface=127.0.0.1")
    ns = f"127.0.0.1:{port.getHost().port}"
    clients: list[RemotingClient] = []
    producer = Producer(reactor, ns, "E2EProducer", poll_interval=1.0)
    notes: list[str] = []
    members: list[Member] = []

    def note(text: str) -> None:
        notes.append(f"{time.monotonic() - began:6.2f}s cpu {time.process_time():5.2f}s {text}")

    def client(address: str) -> RemotingClient:
        made = RemotingClient(reactor, f"tcp:{address}", retry_policy=lambda _: 0.1)
        clients.append(made)
        made.startService()
        return made

    try:
        # The consumers' processes first: they import while the brokers
        # start, and start consuming when told (L{Member.go}).
        members[:] = [spawn(reactor, tmp, ns, name) for name in "abc"]
        a, b, c = members
        with EtcdCluster(os.path.join(tmp, "etcd")) as etcd, FailoverCluster(
            tmp, etcd.spec, nodes=2, start=False, options=namesrv_options(port.getHost().port)
        ) as group:
            # Both nodes at once; the election decides.  (Each registers
            # as its --broker-id while a slave, as 0 when master.)
            for i in (0, 1):
                group.start(i, "--broker-id", str(i + 1))

            def master_now() -> int | None:
                roles = [failover_role(group, i) for i in (0, 1)]
                return roles.index(True) if roles.count(True) == 1 else None

            await until(reactor, lambda: master_now() is not None, "a master to be elected", 30)
            old = master_now()
            assert old is not None
            new = 1 - old

            def in_sync() -> bool:
                return len(((group.status(old) or {}).get("failover") or {}).get("in_sync") or []) == 2

            await until(reactor, in_sync, "the slave to enter the in-sync set", 30)
            await until(reactor, lambda: set(namesrv.brokers("g")) == {0, new + 1}, "both to register", 10)
            old_addr, new_addr = namesrv.brokers("g")[0], namesrv.brokers("g")[new + 1]
            note(f"n{old} elected ({old_addr}), n{new} its slave ({new_addr})")
            response = await ask(client(old_addr), RequestCode.UPDATE_AND_CREATE_TOPIC, topic_fields(TOPIC, QUEUES))
            assert response.code == ResponseCode.SUCCESS, response.remark
            syncs_before_topic = metadata_syncs(group, new)
            await until(reactor, lambda: TOPIC in namesrv.topic_names(), "the topic's route", 10)

            # -- a stable group of two ------------------------------------------
            def shared(*pair: Member) -> bool:
                return all(len(m.owned) == QUEUES // 2 for m in pair) and set().union(
                    *(m.owned for m in pair)
                ) == set(range(QUEUES))

            # (One after the other: a member that starts while another's
            # first rebalance still runs can hold a queue the other also
            # takes, until the next rebalance, as in RocketMQ.)
            a.go()
            await until(reactor, lambda: a.owned == set(range(QUEUES)), "a to take the queues", 20)
            b.go()
            await until(reactor, lambda: shared(a, b), "a and b to share the queues", 20)
            note(f"a holds {sorted(a.owned)}, b {sorted(b.owned)}")
            producer.startService()
            production = Production(reactor, producer)

            # -- one member killed --------------------------------------------
            first = ensureDeferred(production.run(PAUSE_AT))
            await until(
                reactor,
                lambda: production.next >= KILL_CONSUMER_AT and len(b.messages) >= 2000,
                "b to consume",
                30,
            )
            b_queues = set(b.owned)
            took_before = len(a.takes)
            b.signal("KILL")
            await b.ended
            killed_at = len(b.messages)
            note(f"b killed after {killed_at} messages; {production.next} sent")
            await until(reactor, lambda: a.owned == set(range(QUEUES)), "a to take b's queues", 10)
            # Until then, each message exactly once in the group.
            boundary = a.takes[took_before][2]
            before = [m[:2] for m in a.messages[:boundary]] + [m[:2] for m in b.messages]
            twice = sorted(place for place, n in Counter(before).items() if n > 1)
            assert not twice, f"consumed twice while the group was stable: {twice[:10]}"
            # a resumed b's queues from the committed offsets: never past
            # what b consumed.
            resumed = {}
            for q, offset, _ in a.takes[took_before:]:
                consumed = [o for (qq, o, _, _) in b.messages if qq == q]
                last = max(consumed, default=-1)
                assert offset <= last + 1, (q, offset, last)
                resumed[q] = (offset, last + 1)
            assert set(resumed) == b_queues
            note(f"a took b's queues at (committed, b's next) {resumed}")
            c.go()
            await until(reactor, lambda: shared(a, c), "a and c to share the queues", 20)
            note(f"c joined: a holds {sorted(a.owned)}, c {sorted(c.owned)}")
            await first

            # -- paused: the consume queues on both nodes -------------------------
            def caught_up() -> bool:
                ends = [(group.status(i) or {}).get("max_offset") for i in (old, new)]
                return ends[0] is not None and ends[0] == ends[1]

            await until(reactor, caught_up, "the slave to catch up", 20)
            stores = [group.nodes[i].store for i in (old, new)]
            await until(
                reactor,
                lambda: consume_queue_digest(stores[0]) == consume_queue_digest(stores[1]),
                "identical consume queues on master and slave",
                10,
            )
            queue_files = consume_queue_digest(stores[0])
            assert {p.split(os.sep)[0] for p in queue_files} >= {TOPIC}
            note(f"{len(queue_files)} consume queue files identical on master and slave")

            # -- the master killed under load ------------------------------------
            await until(
                reactor, lambda: metadata_syncs(group, new) > syncs_before_topic, "the slave's metadata sync", 30
            )
            second = ensureDeferred(production.run(TOTAL, deadline=90))
            await until(reactor, lambda: production.next >= KILL_MASTER_AT, "production to go on", 30)
            registered = len(namesrv.registrations)
            group.kill(old)
            killed = time.monotonic()
            note(f"n{old} killed with SIGKILL; {production.next} sent, {len(production.acked)} acked")
            await until(reactor, lambda: failover_role(group, new) is True, f"n{new} to be elected", 30)
            await until(reactor, lambda: namesrv.brokers("g").get(0) == new_addr, f"n{new} to register as 0", 5)
            note(f"n{new} elected and registered as brokerId 0, {time.monotonic() - killed:.2f} s after the kill")
            since = {(r.header.broker_addr, r.header.broker_id) for r in namesrv.registrations[registered:]}
            assert (new_addr, 0) in since
            # A two-node group takes SYNC puts with both: the old master
            # comes back, as the new one's slave.
            group.start(old, "--broker-id", str(old + 1))
            restarted = time.monotonic()
            pause = float(os.environ.get(SECOND_FAILOVER, "0") or 0)
            if pause > 0:
                # (On demand: the failover a late lease renewal makes under
                # load, made here by stopping the new master once the old
                # one, its slave now, is in sync.)
                def both_in_sync() -> bool:
                    return len(((group.status(new) or {}).get("failover") or {}).get("in_sync") or []) == 2

                await until(reactor, both_in_sync, "the old master to enter the in-sync set", 30)
                group.signal(new, signal.SIGSTOP)
                await deferLater(reactor, pause, lambda: None)
                group.signal(new, signal.SIGCONT)
                note(f"n{new} stopped (SIGSTOP) for {pause:g} s to fail over again")
            await second
            note(
                f"{TOTAL} acked; sends failed or not SEND_OK {dict(production.resent)} from "
                f"{(production.first_failure or killed) - killed:+.2f} s to "
                f"{(production.last_failure or killed) - killed:+.2f} s after the kill"
            )

            # -- every message consumed ----------------------------------------
            # (Under a loaded suite the group may fail over once more: a
            # lease renewal late on a busy machine elects the old master,
            # back in sync by now. The checks ask whichever node leads,
            # at the address it registered as brokerId 0.)
            def leader() -> tuple[int, str] | None:
                i = master_now()
                addr = namesrv.brokers("g").get(0)
                if i is None or addr is None:
                    return None
                mine = {
                    r.header.broker_addr for r in namesrv.registrations
                    if r.header.broker_id in (0, i + 1) and (i == new) == (r.header.broker_addr == new_addr)
                }
                return (i, addr) if addr in mine else None

            await until(reactor, lambda: leader() is not None, "a master registered as brokerId 0", 30)
            lead, lead_addr = leader() or (new, new_addr)
            if lead != new:
                note(f"failed over again: n{lead} leads now ({lead_addr})")
                try:  # (evidence only: why n{new} stepped down)
                    with open(group.log_path(new)) as log:
                        lines = [
                            line.strip()[:200] for line in log
                            if any(k in line.lower() for k in ("lease", "leader", "step", "elect", "in-sync", "coordinator"))
                        ]
                    note(f"n{new}'s coordinator lines: " + " | ".join(lines[-12:]))
                except OSError as e:
                    note(f"n{new}'s log could not be read: {e}")
            master = client(lead_addr)
            ends = {}
            for q in range(QUEUES):
                response = await ask(
                    master, RequestCode.GET_MAX_OFFSET, header_to_ext_fields(GetMaxOffsetRequestHeader(TOPIC, q))
                )
                assert response.code == ResponseCode.SUCCESS, response.remark
                ends[q] = int(response.ext_fields["offset"])
            expected = {(q, o) for q in range(QUEUES) for o in range(ends[q])}

            def seen() -> set[tuple[int, int]]:
                return {m[:2] for member in members for m in member.messages}

            try:
                await until(reactor, lambda: seen() >= expected, "every stored message to be consumed", 30)
            except AssertionError:
                missing = sorted(expected - seen())
                elsewhere = sorted(
                    (member.name, q, offset, seq, production.acked.get(seq))
                    for member in members
                    for (q, offset, seq, _) in member.messages
                    if production.acked.get(seq, (q, offset)) != (q, offset)
                )
                raise AssertionError(
                    f"{len(missing)} stored messages never consumed (queue, offset): {missing[:10]}; "
                    f"consumed where they were not acknowledged (member, queue, offset, seq, acked at): "
                    f"{elsewhere[:10]}"
                ) from None
            everything = [(member.name, *m) for member in members for m in member.messages]
            assert all(ok for (*_, ok) in everything), "a body that does not check out"
            assert {(q, o) for (_, q, o, _, _) in everything} == expected, "consumed past the queues' ends"
            # The message read at each place: one, the acknowledged one
            # where there is one (two: a phantom read, the first one lost
            # with the old master).
            acked_at = {place: seq for seq, place in production.acked.items()}
            read_at: dict[tuple[int, int], set[int]] = {}
            for _, q, offset, seq, _ in everything:
                read_at.setdefault((q, offset), set()).add(seq)
            phantoms = sorted(
                (place, sorted(seqs), acked_at.get(place)) for place, seqs in read_at.items() if len(seqs) > 1
            )
            if phantoms:
                # (Evidence: when each reading of the first places arrived,
                # relative to the kill and to the old master's restart.)
                for (q, offset), seqs, _ in phantoms[:4]:
                    for member in members:
                        for seq in seqs:
                            at = member.seen_at.get((q, offset, seq))
                            if at is not None:
                                note(
                                    f"({q}, {offset}) read as {seq} by {member.name} "
                                    f"{at - killed:+.3f} s after the kill, {at - restarted:+.3f} s after the restart"
                                )
            assert not phantoms, f"(queue, offset), read as, acknowledged: {phantoms[:10]}"
            by_place = {place: seqs.pop() for place, seqs in read_at.items()}
            assert all(by_place[place] == seq for place, seq in acked_at.items())
            assert len(production.acked) == TOTAL
            stored_twice = sum(n - 1 for n in Counter(by_place.values()).values())
            readers: dict[tuple[int, int, int], list[str]] = {}
            for name, q, offset, seq, _ in everything:
                readers.setdefault((q, offset, seq), []).append(name)
            again = Counter(
                ("".join(sorted(set(names))), q) for (q, _, _), names in readers.items() for _ in names[1:]
            )
            note(
                f"consumed {len(everything)}: {len(by_place)} stored messages ({stored_twice} stored twice "
                f"by resends), {sum(again.values())} redelivered (by members, queue: {dict(again)}); "
                f"a {len(a.messages)}, b {len(b.messages)}, c {len(c.messages)}"
            )

            # -- clean stops: offsets committed, stores checked ---------------------
            # Each queue's owner consumed up to its end since it took it: a
            # member that held another's queue for a while (a failover: the
            # new master listed the group before every member's heartbeat
            # reached it) may have consumed the queue's tail first, and the
            # owner, who never let go, consumes it again from its own offset.
            def owners_done() -> bool:
                for q in range(QUEUES):
                    for m in (a, c):
                        if q not in m.owned or ends[q] == 0:
                            continue
                        since = max((i for (qq, _, i) in m.takes if qq == q), default=0)
                        if not any(mm[:2] == (q, ends[q] - 1) for mm in m.messages[since:]):
                            return False
                return True

            await until(reactor, owners_done, "each queue's owner to consume up to its end", 60)
            for m in (a, c):
                m.signal("TERM")
            await DeferredList([a.ended, c.ended])
            note("consumers stopped")
            assert (a.exit_code, c.exit_code) == (0, 0)
            committed = {}
            for q in range(QUEUES):
                header = QueryConsumerOffsetRequestHeader(GROUP, TOPIC, q)
                response = await ask(master, RequestCode.QUERY_CONSUMER_OFFSET, header_to_ext_fields(header))
                assert response.code == ResponseCode.SUCCESS, response.remark
                committed[q] = int(response.ext_fields["offset"])
            # The queues' ends, on the master that leads (after a second
            # failover too: the members heartbeat a promoted master at
            # once, docs/client.md, "Heartbeats").
            if committed != ends:
                # (The evidence: where the consumers' routes, queues and
                # commits went.)
                note(f"committed offsets not the queues' ends: {committed} != {ends}")
                for m in members:
                    try:
                        with open(os.path.join(tmp, f"consumer-{m.name}.log")) as log:
                            lines = [
                                line.strip()[:200] for line in log
                                if any(k in line for k in ("route of topic E2ETopic", "commit", "E2ETopic@g", "SUBSCRIPTION"))
                            ]
                    except OSError as e:
                        lines = [f"(unreadable: {e})"]
                    note(f"{m.name}: " + " | ".join(lines[-20:]))
            assert committed == ends, (committed, ends)
            await until(reactor, caught_up, "the old master to catch up as a slave", 20)
            note("caught up")
            # (On a thread: the brokers unregister from the NameServer,
            # which answers from this reactor.)
            await deferToThread(group.stop_all)
            note("stopped")
            assert consume_queue_digest(stores[0]) == consume_queue_digest(stores[1])
            checks = await DeferredList([deferToThread(group.store_check, i) for i in (old, new)])
            for (_, check) in checks:
                assert check.returncode == 0, check.stdout + check.stderr
            note(f"stopped; consume queues identical; store check passed on both; {time.monotonic() - began:.1f} s")
    finally:
        # (Evidence, for a failure: the NameServer's view at the end and
        # every registration, with its time.)
        note(
            f"NameServer at the end: g {dict(namesrv.brokers('g'))}; registrations (addr, id): "
            + " ".join(f"{r.header.broker_addr}/{r.header.broker_id}" for r in namesrv.registrations[-40:])
        )
        print("\n".join(notes))
        for m in members:
            if m.exit_code is None and m.transport is not None and not m.ended.called:
                m.signal("KILL")
                await m.ended
        if producer.running:
            await producer.stopService()
        for made in clients:
            if made.running:
                await made.stopService()
        await port.stopListening()
