"""
One member of a consumer group in its own process, for
C{test_produce_consume.py}: an L{rmqha.client.PushConsumer} on the global
reactor, subscribed to one topic, reporting on stdout what it does, so
that the test can kill it for real (SIGKILL) and still know what it
consumed.

    python -m tests.integration._consumer_proc NAMESRV GROUP TOPIC CLIENT_ID LOG

Each line is one event, written (unbuffered) before the handler returns,
so a message whose offset the consumer may have committed has always
been reported:

- C{m QUEUE OFFSET SEQ OK}: a message of C{TOPIC} consumed; C{SEQ} is
  the number at the start of its body (L{body}), C{OK} 1 when the body
  checks out against its checksum, else 0;
- C{take QUEUE OFFSET}: the consumer took queue C{QUEUE} of C{TOPIC},
  starting at C{OFFSET} (its group's committed offset, or 0), written
  before any of its messages (the consumer's C{queue_listener} hears of
  a queue before its pulls start);
- C{drop QUEUE}: it let go of the queue (a rebalance, or the stop).

The consumer starts when a line arrives on stdin (the process can be
started early, its imports out of the way).  SIGTERM stops it cleanly (its offsets committed, the client
unregistered) and then the process.
"""

from __future__ import annotations

import os
import sys
import zlib

#: A body's layout: C{SEQ:FILLER:CRC}, C{SEQ} 8 digits, C{CRC} the CRC-32
#: of C{SEQ:FILLER} in 8 hex digits.
_FILLER = b"abcdefghijklmnopqrstuvwxyz0123456789" * 3


def body(seq: int) -> bytes:
    """
    The body of message C{seq}: its number, filler that varies with it,
    and a checksum of both (about 130 bytes).
    """
    head = b"%08d:%s" % (seq, _FILLER[seq % 36 :] + _FILLER[: seq % 36])
    return b"%s:%08x" % (head, zlib.crc32(head))


def check(data: bytes) -> int | None:
    """
    The number of a body L{body} made, or C{None} if it does not check out.
    """
    head, _, crc = data.rpartition(b":")
    try:
        if zlib.crc32(head) != int(crc, 16):
            return None
        return int(head[:8])
    except ValueError:
        return None


def main(namesrv: str, group: str, topic: str, client_id: str, log: str) -> None:
    from twisted.internet import reactor
    from twisted.logger import globalLogBeginner, textFileLogObserver

    from rmqha.client import ConsumeFromWhere, PushConsumer, QueueChange, ReceivedMessage

    out = sys.stdout.fileno()

    def write(text: str) -> None:
        data = text.encode("ascii")
        while data:
            data = data[os.write(out, data) :]

    def changed(change: QueueChange) -> None:
        if change.topic != topic:
            return
        lines = [f"drop {q.queue_id}\n" for q in sorted(change.revoked, key=lambda q: q.queue_id)]
        lines += [f"take {q.queue_id} {offset}\n" for q, offset in sorted(change.assigned.items(), key=lambda i: i[0].queue_id)]
        write("".join(lines))

    logfile = open(log, "a")
    globalLogBeginner.beginLoggingTo([textFileLogObserver(logfile)], redirectStandardIO=False)

    def handle(messages: list[ReceivedMessage]) -> None:
        lines = []
        for m in messages:
            if m.topic != topic:
                continue
            seq = check(m.body)
            lines.append(f"m {m.queue.queue_id} {m.queue_offset} {-1 if seq is None else seq} {int(seq is not None)}\n")
        write("".join(lines))

    consumer = PushConsumer(
        reactor,
        namesrv,
        group,
        handle,
        client_id=client_id,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        # (The default pollNameServerInterval, 30 s: a pull that fails
        # looks the route up at once, and finds the promoted master.)
        queue_listener=changed,
    )
    consumer.subscribe(topic)
    sys.stdin.readline()
    consumer.startService()
    reactor.addSystemEventTrigger("before", "shutdown", consumer.stopService)
    reactor.run()


if __name__ == "__main__":
    main(*sys.argv[1:6])
