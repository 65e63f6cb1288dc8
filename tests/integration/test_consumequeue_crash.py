"""
Consume queues survive C{kill -9} during dispatch, with a real process: a
child runs a L{CommitLogService} on a real reactor (dispatch one bounded
step per reactor turn, the queues synced every 100 ms) while it puts
messages, and is killed with SIGKILL at random moments, four times, the
first while it builds the queues of an old store at open.  Each restart
recovers the queues; at the end they match the log (C{store check}'s
verification) and are byte-identical to queues rmqha builds from scratch
from the same log.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time

import rmqha
from rmqha.store.commitlog import CommitLog, Message
from rmqha.store.consumequeue import verify_consume_queues

from tests.integration._support import consume_queue_digest

SEGMENT = 256 * 1024
UNITS = 64

CHILD = r"""
import sys
from twisted.internet import reactor
from twisted.internet.task import LoopingCall
from rmqha.store.commitlog import CommitLog, Message
from rmqha.store.service import CommitLogService

store, segment, units = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
service = CommitLogService(
    lambda: CommitLog.open(
        store, segment_size=segment, consume_queue_units=units, consume_queues=True
    ),
    reactor, dispatch_step=2048, consume_queue_flush_interval=0.1,
)
print("opening", flush=True)
service.startService()
n = [0]

def put():
    log = service.commitlog
    for _ in range(50):
        i = n[0] = n[0] + 1
        log.put(Message(topic="T%d" % (i % 3), body=b"x" * (i % 300), queue_id=i % 4,
                        properties={"TAGS": "tag%d" % (i % 5)} if i % 2 else {}))

print("ready", flush=True)
LoopingCall(put).start(0.002)
reactor.run()
"""


def test_kill_during_dispatch(tmp_path: object) -> None:
    store = os.path.join(str(tmp_path), "store")
    # An old store: 30,000 records (3.5 MB) and no consume queues yet.
    with CommitLog.open(
        store, segment_size=SEGMENT, consume_queue_units=UNITS, consume_queues=True
    ) as log:
        for i in range(30000):
            log.put(Message(topic="T%d" % (i % 3), body=b"y" * (i % 50), queue_id=i % 4))
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(rmqha.__file__)))
    rng = random.Random(30)

    def run(round: int, during_build: bool) -> bytes:
        with open(os.path.join(str(tmp_path), f"child{round}.log"), "wb") as errors:
            child = subprocess.Popen(
                [sys.executable, "-c", CHILD, store, str(SEGMENT), str(UNITS)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=errors,
            )
        assert child.stdout is not None
        try:
            assert child.stdout.readline() == b"opening\n"
            if during_build:
                time.sleep(rng.uniform(0.0, 0.03))
            else:
                assert child.stdout.readline() == b"ready\n"
                time.sleep(rng.uniform(0.1, 0.3))
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
            rest = child.stdout.read()
            child.stdout.close()
        return rest

    # Killed while it builds the old store's queues at open (before it
    # says "ready"); a kill that came too late is tried again.
    for attempt in range(10):
        shutil.rmtree(os.path.join(store, "consumequeue"), ignore_errors=True)
        if os.path.exists(os.path.join(store, "rmqha", "cq-dispatched")):
            os.remove(os.path.join(store, "rmqha", "cq-dispatched"))
        if run(0, during_build=True) == b"":
            break
    else:
        raise AssertionError("no kill landed during the build at open in 10 tries")
    assert os.path.isdir(os.path.join(store, "consumequeue"))
    # Then while it takes puts and dispatches them.
    for round in range(1, 4):
        run(round, during_build=False)
    with CommitLog.open(store, consume_queues=True) as log:
        assert log.consume_queues is not None
        assert log.consume_queues.dispatched == log.max_offset
        assert log.max_offset > 3_000_000
    with CommitLog.open(store, read_only=True) as log:
        assert verify_consume_queues(log) == []
    rebuilt = os.path.join(str(tmp_path), "rebuilt")
    shutil.copytree(store, rebuilt)
    shutil.rmtree(os.path.join(rebuilt, "consumequeue"))
    os.remove(os.path.join(rebuilt, "rmqha", "cq-dispatched"))
    with CommitLog.open(rebuilt, consume_queue_units=UNITS, consume_queues=True):
        pass
    assert consume_queue_digest(rebuilt) == consume_queue_digest(store)
