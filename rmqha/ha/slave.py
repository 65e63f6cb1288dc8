# -*- test-case-name: tests.test_slave -*-
"""
The slave's side of RocketMQ's classic HA: a reconnecting client that
copies the master's commit log byte for byte.

On every connection the slave reports where its log ends (at once: a
RocketMQ 4.9.8 slave waits for its 5 s timer), then appends each frame at
exactly the offset the frame names.  A frame for any other offset means
the two logs disagree about where the slave is: the slave logs both
offsets and drops the connection, and L{ClientService} reconnects after a
back-off, so the slave reports again and the master restarts from there.

With a master that offered it (L{SlaveFactory.checked}, learnt from its
control INFO), the connection uses checked framing: a CRC-32 on every
frame and report, so a byte damaged on the way is never written or acked.

With a master taken for RocketMQ's (L{SlaveFactory.probe_first}), every
connection is also its own probe: it opens with PROBE (8 bytes of -1,
which a RocketMQ master takes for "no report yet" and waits on), waits
L{SlaveFactory.probe_wait} (0.5 s) for an answer, and goes on with its
real report on the same connection; an answer means the master speaks
the rmqha extension now, and the slave checks it again.  The first such
connection is the check's own probe, handed over (L{SlaveFactory.keep}).
"""

from __future__ import annotations

import fcntl
import os
import socket as _socket
import sys
import termios
import uuid
from typing import Any, Callable, cast

from twisted.application.internet import ClientService, backoffPolicy
from twisted.internet.interfaces import (
    IAddress,
    IDelayedCall,
    IHandshakeListener,
    INegotiated,
    IProtocol,
    IReactorTime,
    IStreamClientEndpoint,
)
from twisted.internet.defer import succeed
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from rmqha._busypoll import IExpectsBytes, busy_poll
from rmqha._timers import IdleTimer
from rmqha._files import write_atomically
from rmqha.ha._wire import (
    CHECKED_HELLO,
    CONTROL_PROBE,
    ChecksumError,
    MasterClosing,
    ProtocolError,
    TransferDecoder,
    encode_code,
    encode_identify,
    encode_report,
)
from rmqha.store.commitlog import CommitLog
from rmqha.store.errors import CorruptReplicaError, StoreDamagedError, StoreError
from rmqha.ha.auth import HANDSHAKE_TIMEOUT, AuthError, GroupAuth, SlaveHandshake
from rmqha.ha.config import DEFAULT_HA_CONFIG, PROBE_FIRST_TIMEOUT, HAConfig
from rmqha.ha.control import ControlClient
from rmqha._sockets import send_now, set_tcp_no_delay
from rmqha.tls import PLAIN_SLAVE_TLS_MASTER_HINT, describe_failure, looks_like_tls

__all__ = ["SlaveConnection", "SlaveFactory", "make_slave_service", "load_replica_id"]

#: The same record failing validation this many times in a row is taken
#: for the master's own corrupt copy (the slave then backs off).
REPEATED_REJECTIONS = 3

_log = Logger()

# Reads adapt between these sizes (see SlaveConnection._adapt_read_size).
_MIN_READ_SIZE = 64 * 1024
_MAX_READ_SIZE = 1024 * 1024

#: Frames are taken to be flowing (busy polling for the next) for this
#: long after a read, seconds.
_FRAMES_FLOWING = 0.001

#: Catching up (a socket read filled the largest read buffer: a MiB or
#: more was waiting), the socket wakes the reactor only once this many
#: bytes are in it (C{SO_RCVLOWAT}): fewer, larger reads, each with its
#: reactor turn, decoding pass, C{pwritev}, validation pass and report.
#: See SlaveConnection._batch_reads.
_BATCH_READS = 256 * 1024
#: ... until no read has come for this long (seconds): then every byte
#: wakes it again.  The most a frame can wait for the threshold.
_BATCH_IDLE = 0.001

#: While catching up on plain TCP, a read followed by more bytes already
#: in the socket is not acknowledged on its own (the next read's report
#: covers it), up to this many unreported bytes; see
#: SlaveConnection._more_queued.
_REPORT_AT_LEAST = 4 * 1024 * 1024

#: The frames of one read are appended as separate pieces (not joined)
#: when their bodies average at least this: joining copies the whole read,
#: while each piece costs one record read back (a few microseconds).
_PIECES_FROM = 64 * 1024


@implementer(IHandshakeListener, IExpectsBytes)
class SlaveConnection(Protocol):
    """
    One connection to the master.

    @ivar master_offset: the offset of the last frame header received (the
        master's position in its stream to us), for lag estimates.
    """

    _log = Logger()

    def __init__(self, factory: "SlaveFactory") -> None:
        self.factory = factory
        self.master_offset: int | None = None
        #: The master's node id, proven by group authentication (once it
        #: is over; C{None} without a group secret).
        self.master_id: str | None = None
        #: The last frame was a heartbeat at this slave's max offset: the
        #: master had nothing more to send (the classic protocol never
        #: says the master's max offset otherwise).
        self.caught_up = False
        #: This connection uses checked framing.
        self.checked = factory.checked
        self._decoder = TransferDecoder(checked=self.checked)
        auth = factory.auth
        #: Failover with a group secret: the handshake that starts the
        #: connection (L{rmqha.ha.auth}); the first report follows this
        #: node's proof.
        self._handshake = (
            SlaveHandshake(auth, factory.expected_master)
            if auth is not None and auth.secret is not None
            else None
        )
        self._handshake_timer: IDelayedCall | None = None
        self._hello_sent = False
        #: The probe in place (a master taken for RocketMQ's): C{"send"}
        #: (PROBE goes before the first report), C{"waiting"} (sent; the
        #: report waits for the master's silence), C{"silent"} (the
        #: master did not answer: classic, on this connection), or
        #: C{None} (no probe on this connection).  A connection handed
        #: over from the check's probe starts C{"silent"}.
        self._probe: str | None = None
        if factory.probe_first:
            self._probe = "silent" if factory.adopting else "send"
        self._probe_timer: IDelayedCall | None = None
        self._closed = False
        # The socket transport whose read size adapts (under TLS, the one
        # beneath the TLS layer), and the plaintext of this turn's read.
        self._socket: Any = None
        self._turn_bytes = 0
        self._turn_end: IDelayedCall | None = None
        self._tls = False
        self._handshake_done = False
        self._received = False
        self._suspicious = False
        # This connection ended on a record rejected again and again.
        self._backing_off = False
        self._reading_paused = False
        self._last_read = 0.0
        self._last_report = 0.0
        self._busy = busy_poll(None, self, 0)
        self._reported: int | None = None
        # Plain TCP: the last read filled the read buffer; FIONREAD's
        # answer (see _more_queued).
        self._filled = False
        self._queued = bytearray(4)
        # Catching up: reads batched by the socket's wake-up threshold,
        # until this timer (see _batch_reads); False: not possible here.
        self._batching: IDelayedCall | None = None
        self._can_batch = True
        config = factory.config
        clock = factory.clock
        self._report_timer = IdleTimer(
            clock, config.heartbeat_interval, lambda: self._last_report, self._report_idle
        )
        self._housekeeping = IdleTimer(
            clock, config.housekeeping_interval, lambda: self._last_read, self._silent
        )

    def connectionMade(self) -> None:
        self._tls = INegotiated.providedBy(self.transport)
        # (A TLS wrapper's bufferSize is not the socket's.)
        socket = getattr(self.transport, "transport", None) if self._tls else self.transport
        if hasattr(socket, "bufferSize"):
            self._socket = socket
        set_tcp_no_delay(self.transport)
        self._last_read = self._last_report = self.factory.clock.seconds()
        # Ask for a record cut short by the last connection whole again.
        self.factory.commitlog.discard_incomplete_record()
        self._report_timer.start()
        self._housekeeping.start()
        # While the master's frames come back to back, the reactor polls
        # for the next a moment before it sleeps (docs/sync.md, "Busy
        # polling").
        self._busy = busy_poll(self.factory.clock, self, self.factory.config.busy_poll)
        self.factory.connection = self
        self.factory.connections_made += 1

    def send_report(self) -> None:
        """
        Tell the master where this log's whole, validated records end: the
        first report asks for the bytes after it, every later one
        acknowledges everything before it.  Bytes of a record still
        arriving, or of one that failed validation, are never acknowledged.
        """
        if self._closed:
            return
        handshake = self._handshake
        if handshake is not None and not handshake.proved:
            # Group authentication first: the report follows the proof.
            if self._handshake_timer is None:
                send_now(self.transport, [handshake.hello()])
                self._handshake_timer = self.factory.clock.callLater(
                    HANDSHAKE_TIMEOUT, self._handshake_timed_out
                )
            return
        if self._probe == "send":
            # (Through the same send path as a report: TCP_NODELAY, now.)
            self._probe = "waiting"
            send_now(self.transport, [encode_code(CONTROL_PROBE)])
            self._probe_timer = self.factory.clock.callLater(
                self.factory.probe_wait, self._probe_unanswered
            )
            return
        if self._probe == "waiting":
            return  # (the real report follows the master's silence)
        offset = self.factory.commitlog.record_end
        report = encode_report(offset, self.checked)
        if not self._hello_sent:
            self._hello_sent = True
            if self.checked:
                report = encode_code(CHECKED_HELLO) + report
            if handshake is not None:
                # (The proof names this node: no IDENTIFY.)
                report = handshake.proof + report
            elif self.factory.identity is not None:
                # Only to a master whose INFO offered it (the broker sets it).
                report = encode_identify(self.factory.identity) + report
        send_now(self.transport, [report])
        if self._reported is None:
            self._log.info(
                "following master {master} from offset {offset} ({framing})",
                master=_address(self.transport.getPeer()),  # type: ignore[union-attr]
                offset=offset,
                framing="checked framing" if self.checked else "classic",
            )
        self._reported = offset
        self._last_report = self.factory.clock.seconds()

    def _probe_unanswered(self) -> None:
        """
        The master sent nothing for L{SlaveFactory.probe_wait} after PROBE: a
        RocketMQ master, waiting with its request offset at -1; the real
        report follows on this connection, and the master starts there.
        """
        self._probe_timer = None
        if self._probe == "waiting" and not self._closed:
            self._probe = "silent"
            self.send_report()

    def _stop_probe_timer(self) -> None:
        if self._probe_timer is not None and self._probe_timer.active():
            self._probe_timer.cancel()
        self._probe_timer = None

    def handshakeCompleted(self) -> None:
        self._handshake_done = True

    def _authenticate(self, data: bytes) -> bytes:
        """
        Feed the group authentication handshake: once the master's
        challenge holds, send the proof with the first report; once its
        verdict is here, the bytes after it (C{b""} until then, and when
        the connection is dropped).
        """
        handshake = self._handshake
        assert handshake is not None
        try:
            if handshake.feed(data):
                self.send_report()
        except AuthError as e:
            self._drop("group authentication failed: {error}", error=str(e))
            return b""
        except ProtocolError as e:
            if isinstance(e, ChecksumError):
                self.factory.checksum_failures += 1
            self._drop("group authentication: {error}", error=str(e))
            return b""
        if not handshake.done:
            return b""
        self._end_handshake()
        self.master_id = handshake.master_id
        return handshake.rest

    def _end_handshake(self) -> None:
        if self._handshake_timer is not None and self._handshake_timer.active():
            self._handshake_timer.cancel()
        self._handshake_timer = None

    def _handshake_timed_out(self) -> None:
        self._handshake_timer = None
        self._drop(
            "group authentication failed: the master did not finish it within {timeout:g} s",
            timeout=HANDSHAKE_TIMEOUT,
        )

    def dataReceived(self, data: bytes) -> None:
        if self._closed:
            return
        if not self._received and not self._tls and looks_like_tls(data):
            # (Counted as a connection that brought nothing: backs off.)
            self._drop("{hint}", hint=PLAIN_SLAVE_TLS_MASTER_HINT)
            return
        self._last_read = self.factory.clock.seconds()
        if self._probe == "waiting":
            # A RocketMQ master says nothing before a real report: this
            # one answered the probe, so it speaks the rmqha extension now
            # (upgraded, or stalled when the check took it for
            # RocketMQ's).  Not frames: check it again (the replica does,
            # on this connection's end), then replicate as it says.
            self._received = self._suspicious = True
            self._probe = None
            self._stop_probe_timer()
            self._log.info(
                "master {master} answered the rmqha probe on a replication "
                "connection: checking it again",
                master=_address(self.transport.getPeer()),  # type: ignore[union-attr]
            )
            self._closed = True
            self.transport.abortConnection()  # type: ignore[union-attr]
            return
        if self._handshake is not None and not self._handshake.done:
            # (Until the handshake is over, nothing came from the master:
            # a refused node backs off and checks its master again.)
            data = self._authenticate(data)
            if not data:
                return
        self._received = True
        if self._socket is not None:
            if self._tls:
                # TLS hands over a socket read in 32 KiB pieces: size the
                # next read by the whole of this one, at the end of the turn.
                self._turn_bytes += len(data)
                if self._turn_end is None:
                    self._turn_end = self.factory.clock.callLater(0, self._end_of_turn)
            else:
                self._filled = len(data) >= self._socket.bufferSize
                self._sized(len(data))
        commitlog = self.factory.commitlog
        # The frames of this read are decoded (each checked) first and
        # appended as one: one pwrite, one validation pass, one report per
        # read, and no read-back of a record cut by a frame boundary.
        bodies: list[bytes | memoryview] = []
        # (A bad frame stops decoding; the whole, checked frames before it
        # are appended first, as if they had come in a read of their own.)
        end, mismatch, failure = self._decode(data, bodies)
        if bodies and not self._append(bodies, end):
            return
        if mismatch is not None:
            self._suspicious = True
            self._drop(
                "master sent offset {offset}, this slave's max offset is {expected}",
                offset=mismatch,
                expected=commitlog.max_offset,
            )
            return
        if isinstance(failure, ChecksumError):
            self.factory.checksum_failures += 1
            self._drop("{error}; nothing of it was written", error=str(failure))
            return
        if isinstance(failure, MasterClosing):
            # The master's last words (its log damaged, or the bytes this
            # slave needs unreadable): shown as the problem; the retries
            # back off like connections that brought nothing.
            self.factory.closing_reason = failure.reason
            self._backing_off = True
            self._log.warn(
                "master {master} stopped replicating to this slave: {reason}",
                master=_address(self.transport.getPeer()),  # type: ignore[union-attr]
                reason=failure.reason,
            )
            self._closed = True
            self.transport.abortConnection()  # type: ignore[union-attr]
            return
        if failure is not None:
            if not self._decoder.confirmed:
                # The master did not take up checked framing after all (a
                # different master now?): check what it speaks again.
                self._suspicious = True
            self._drop("{error}", error=str(failure))
            return
        factory = self.factory
        if self.master_offset is not None:
            # A frame came: whatever the master said or did before is over.
            factory.closing_reason = None
            factory.closed_without_frame = 0
        if factory.rejected_offset is not None and commitlog.record_end > factory.rejected_offset:
            # The record that failed came good.
            factory.rejected_offset, factory.rejections_in_a_row = None, 0
        if commitlog.record_end != self._reported and not self._more_queued():
            self.send_report()
        self._apply_backpressure()

    def _more_queued(self) -> bool:
        """
        Whether this read's report may wait for the next read: on a plain
        TCP connection, after a read that filled the read buffer (the
        slave is catching up) when the socket already holds more bytes
        (so the reactor reads again at once, and that read's report
        covers both), while reading is not paused and less than
        L{_REPORT_AT_LEAST} is unreported.  On loopback a report's
        C{sendmsg} runs the master's TCP input and wakes it: 50-100 us of
        the slave's wall clock (little of it the slave's CPU time), once
        per 1 MiB read while catching up.  A read that did not fill the
        buffer (a caught-up slave, a SYNC_MASTER's frames) is reported at
        once, as is every read under TLS (whose layer buffers plaintext).
        """
        socket = self._socket
        reported = self._reported
        if (
            not self._filled
            or socket is None
            or self._tls
            or reported is None
            or self._reading_paused
            or self.factory.commitlog.record_end - reported >= _REPORT_AT_LEAST
        ):
            return False
        try:
            fcntl.ioctl(socket.socket.fileno(), termios.FIONREAD, self._queued, True)
        except (AttributeError, OSError):
            return False
        return int.from_bytes(self._queued, sys.byteorder) > 0

    def _decode(
        self, data: bytes, bodies: list[bytes | memoryview]
    ) -> tuple[int, int | None, ProtocolError | None]:
        """
        Feed C{data} to the decoder and collect the bodies of the frames it
        completes, in order, into C{bodies} (a body cut across reads as its
        pieces; heartbeats only set L{caught_up}).  Each frame must start where the one before it ended
        (the first: at this log's max offset, or anywhere in an empty log,
        which L{CommitLog.append_at} checks).

        @return: where the collected bodies end; the offset of a frame that
            started elsewhere (C{None}: none did); the L{ChecksumError} or
            L{ProtocolError} of a bad frame or header (C{None}: none).
            Decoding stops at a mismatch or a bad frame; C{bodies} holds
            the frames before it.
        """
        decoder = self._decoder
        commitlog = self.factory.commitlog
        end = commitlog.max_offset
        anywhere = not commitlog.has_data()
        try:
            decoder.feed(data)
            # (A frame cut across reads comes as the pieces of the reads
            # it arrived in: appended as they are, or joined with the rest.)
            while (frame := decoder.next_frame_pieces()) is not None:
                offset, pieces = frame
                self.master_offset = offset
                if offset != end:
                    if not anywhere:
                        return end, offset, None
                    end = offset
                if pieces:
                    anywhere = False
                    for piece in pieces:
                        bodies.append(piece)
                        end += len(piece)
                    self.caught_up = False
                else:
                    self.caught_up = True
        except ProtocolError as e:  # (ChecksumError too)
            return end, None, e
        return end, None, None

    def _append(self, bodies: list[bytes | memoryview], end: int) -> bool:
        """
        Append the bodies of consecutive frames, which end at C{end}: as
        one write (joined, when there are several).

        @return: whether they were appended (if not, the connection is
            dropped).
        """
        commitlog = self.factory.commitlog
        size = sum(len(body) for body in bodies)
        chunk: bytes | memoryview | list[bytes | memoryview]
        if len(bodies) == 1:
            chunk = bodies[0]
        elif size >= _PIECES_FROM * len(bodies):
            # Large frames (a master's catch-up frames): written as they
            # are, with one pwritev, instead of joined (a copy of the whole
            # read into fresh memory); one record per piece boundary is
            # read back for validation.
            chunk = bodies
        else:
            chunk = b"".join(bodies)
        # In an empty log, the first frame names where the log starts.
        start = end - size
        try:
            commitlog.append_at(start, chunk)
        except CorruptReplicaError as e:
            self._rejected(e)
            return False
        except StoreDamagedError as e:
            # This slave's own segment file changed under it: replication
            # halts (the replica observes the log); nothing to retry.
            self._backing_off = True
            self._drop("cannot append to the commit log: {error}", error=str(e))
            return False
        except StoreError as e:
            self._drop("cannot append to the commit log: {error}", error=str(e))
            return False
        except OSError as e:
            # The slave's disk is full, say: nothing the master can fix, so
            # back off (1 s -> 30 s) instead of re-fetching every second.
            self._backing_off = True
            what = e.filename or commitlog.commitlog_dir
            self._drop(
                "cannot append to the commit log at offset {offset}: {what}: {error}; "
                "replication resumes from there when it can",
                offset=commitlog.max_offset,
                what=what,
                error=e.strerror or str(e),
            )
            return False
        self.factory.bytes_received += size
        return True

    def _rejected(self, error: CorruptReplicaError) -> None:
        """
        A replicated record failed validation: drop, and fetch it again.
        The same record failing again and again is the master's own copy
        (over checked framing nothing else is possible): say so, and back
        off as for a connection that brought nothing, instead of fetching
        it every second.
        """
        factory = self.factory
        factory.rejected_records += 1
        if factory.rejected_offset == error.offset:
            factory.rejections_in_a_row += 1
        else:
            factory.rejected_offset, factory.rejections_in_a_row = error.offset, 1
        times = factory.rejections_in_a_row
        if times < REPEATED_REJECTIONS:
            self._drop("{error}, and will fetch it again", error=str(error))
            return
        self._backing_off = True
        how = " over checked framing" if self.checked else ""
        self._drop(
            "{error}: the master sent this record damaged {times} times in a row{how}, "
            "so its own copy is most likely corrupt (run `rmqha store check` on the "
            "master's store); fetching it again with a growing back-off",
            error=str(error),
            times=times,
            how=how,
        )

    def _end_of_turn(self) -> None:
        self._turn_end = None
        received, self._turn_bytes = self._turn_bytes, 0
        if not self._closed:
            self._sized(received)

    def _sized(self, received: int) -> None:
        """
        A socket read of C{received} bytes done: size the next
        (L{_adapt_read_size}); batch reads when this one filled the largest
        buffer (L{_batch_reads}), or put the end of batching off.
        """
        self._adapt_read_size(received)
        if self._batching is not None:
            self._batching.reset(_BATCH_IDLE)
        elif received >= _MAX_READ_SIZE - _MAX_READ_SIZE // 16:
            self._batch_reads()

    def _adapt_read_size(self, received: int) -> None:
        """
        Size the next C{recv} by this one: a read that filled the buffer
        doubles it (up to 1 MiB: fewer reads and appends per byte while
        catching up), one that used under an eighth halves it (down to
        Twisted's 64 KiB).  A large buffer is not free: CPython allocates
        it for every read, which costs a caught-up slave tens of
        microseconds per small frame, on the path of every SYNC_MASTER ack.
        """
        socket = self._socket
        size: int = socket.bufferSize
        # "Filled": TLS framing takes a little of a full read's bytes.
        if received >= size - size // 16:
            if size < _MAX_READ_SIZE:
                socket.bufferSize = min(size * 2, _MAX_READ_SIZE)
        elif received < size // 8 and size > _MIN_READ_SIZE:
            socket.bufferSize = max(size // 2, _MIN_READ_SIZE)

    def _batch_reads(self) -> None:
        """
        A socket read filled the largest buffer (a catch-up: a MiB or more
        was waiting; under TLS, the plaintext of one reactor turn's read):
        from now on the socket wakes the reactor only once
        L{_BATCH_READS} bytes are in it, until no read has come for
        L{_BATCH_IDLE} (L{_unbatch_reads}).  Without it a slave that keeps
        up with its master reads as soon as anything arrives: ~120 KB a
        read at 800 MB/s on loopback, each read paying a reactor turn,
        its decoding, C{pwritev}, validation and report in Python.  Off
        while not catching up, so a caught-up slave's reads (a
        SYNC_MASTER's frames) never wait; the end of a catch-up waits at
        most L{_BATCH_IDLE} once.  Busy polling stops while it is on
        (L{expecting}): the reactor sleeps until the threshold is met.
        """
        if not self._can_batch:
            return
        try:
            self._socket.socket.setsockopt(_socket.SOL_SOCKET, _socket.SO_RCVLOWAT, _BATCH_READS)
        except (AttributeError, OSError):
            # (No such option here, or not that kind of socket.)
            self._can_batch = False
            return
        self._batching = self.factory.clock.callLater(_BATCH_IDLE, self._unbatch_reads)

    def _unbatch_reads(self) -> None:
        """
        No read for L{_BATCH_IDLE}: every byte wakes the reactor again (and
        the kernel wakes it now for bytes under the threshold).
        """
        self._batching = None
        try:
            self._socket.socket.setsockopt(_socket.SOL_SOCKET, _socket.SO_RCVLOWAT, 1)
        except OSError:
            # (The socket closed meanwhile.)
            pass

    def _apply_backpressure(self) -> None:
        """
        Stop reading from the master while more than C{max_unflushed}
        received bytes are not on disk yet (TCP then holds the master's
        producer back); L{flushed} resumes.
        """
        factory = self.factory
        limit = factory.max_unflushed
        if limit is None or self._reading_paused or self._closed:
            return
        commitlog = factory.commitlog
        if commitlog.max_offset - commitlog.flushed_offset > limit:
            if commitlog.record_end != self._reported:
                # (A report left for the next read: that read waits now.)
                self.send_report()
            self._reading_paused = True
            self.transport.pauseProducing()  # type: ignore[union-attr]
            factory.request_flush()

    def flushed(self) -> None:
        """
        A flush finished: read again once below half the limit.
        """
        factory = self.factory
        limit = factory.max_unflushed
        if not self._reading_paused or self._closed or limit is None:
            return
        commitlog = factory.commitlog
        if commitlog.max_offset - commitlog.flushed_offset <= limit // 2:
            self._reading_paused = False
            self.transport.resumeProducing()  # type: ignore[union-attr]
        else:
            factory.request_flush()

    def _report_idle(self) -> bool:
        """
        Report at least every C{heartbeat_interval}, so the master knows
        this slave is alive when nothing flows.
        """
        self.send_report()
        return True

    def _silent(self) -> bool:
        """
        Drop a master that has sent nothing, not even a heartbeat, for
        C{housekeeping_interval} (4.9.8's slave watches its own writes and
        misses this).
        """
        silent = self.factory.clock.seconds() - self._last_read
        self._drop("nothing received from the master for {silent:.1f} s", silent=silent)
        return False

    def _drop(self, why: str, **fields: Any) -> None:
        """
        Log C{why}, a format string over C{fields} (the event keeps them;
        text from elsewhere goes in as a field), and abort the connection.
        """
        self._log.warn("dropping the connection to the master: " + why, **fields)
        self._closed = True
        self._stop_probe_timer()
        self._end_handshake()
        self.transport.abortConnection()  # type: ignore[union-attr]

    def expecting(self) -> bool:
        """
        Whether the master's next frame is expected within a moment: one
        came in the last L{_FRAMES_FLOWING} seconds
        (L{rmqha._busypoll.IExpectsBytes}).
        """
        if self._batching is not None:
            return False
        now: float = self.factory.clock.seconds()
        return now - self._last_read < _FRAMES_FLOWING

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._busy.stop()
        if self._batching is not None:
            self._batching.cancel()
            self._batching = None
        if self._turn_end is not None:
            self._turn_end.cancel()
            self._turn_end = None
        if not self._received:
            # Nothing came from the master: count it towards the back-off
            # (the TCP connect "succeeded", so ClientService would not).
            self.factory.fruitless_connections += 1
            if self._tls and not self._closed:
                self._log.warn(
                    "TLS connection to the master failed: {why}",
                    why=describe_failure(reason, self.transport, self._handshake_done),
                )
        elif self._backing_off:
            self.factory.fruitless_connections += 1
        else:
            self.factory.fruitless_connections = 0
        if not self._closed and self.master_offset is None:
            # The master closed it before a single frame (not even a
            # heartbeat), without saying why: counted, for the problem.
            self.factory.closed_by_master(self.factory.commitlog.record_end)
        if self._probe is not None and not self._suspicious:
            # A master taken for RocketMQ's, which did not answer this
            # connection's probe: the next connection probes again itself
            # (a separate check would be one more probe connection, given
            # up on while replication reconnects: two ERROR lines in a
            # RocketMQ master's log each time).
            pass
        elif not self._received or self._suspicious or not self.checked:
            # (Also a master that did not confirm checked framing; and,
            # after a classic connection to a master not probed on it,
            # the master is asked again whether it speaks the extension.)
            self.factory.suspect()
        self._closed = True
        self._stop_probe_timer()
        self._end_handshake()
        self._report_timer.stop()
        self._housekeeping.stop()
        if self.factory.connection is self:
            self.factory.connection = None


class SlaveFactory(Factory):
    """
    Builds L{SlaveConnection}s over one commit log.

    @ivar connection: the current connection, if any.
    """

    def __init__(
        self,
        commitlog: CommitLog,
        clock: IReactorTime,
        config: HAConfig = DEFAULT_HA_CONFIG,
        max_unflushed: int | None = None,
        request_flush: Callable[[], object] | None = None,
        on_suspect: Callable[[], None] | None = None,
        *,
        identity: str | None = None,
        auth: GroupAuth | None = None,
        expected_master: str | None = None,
    ) -> None:
        """
        @param identity: the replica id to declare with IDENTIFY (when the
            master offers it).
        @param auth: failover: how this node proves its id (with a group
            secret, every connection starts with the handshake).
        @param expected_master: failover: the node id the master must
            prove (the elected leader's); C{None}: any other member.
        @param max_unflushed: pause reading from the master while more
            received bytes than this are not flushed (C{None}: no limit,
            as with C{SYNC_FLUSH}, where every append is flushed).
        @param request_flush: starts a flush now (the store service's
            C{flush_now}).
        @param on_suspect: called when a connection ends before the master
            sent anything, on an offset mismatch (signs the logs may have
            diverged), or after a classic connection: the broker checks the
            master again.
        """
        self.commitlog = commitlog
        self.clock = clock
        self.config = config
        self.connection: SlaveConnection | None = None
        #: Commit-log bytes received and appended, over all connections.
        self.bytes_received = 0
        #: Connections made to the master.
        self.connections_made = 0
        #: Connections in a row that ended before the master sent anything
        #: (refused TLS, a master that drops us at once): they lengthen the
        #: reconnection back-off.
        self.fruitless_connections = 0
        self.max_unflushed = max_unflushed
        self._request_flush = request_flush
        self._on_suspect = on_suspect
        #: Ask for checked framing (the master offered it in its INFO).
        self.checked = False
        #: The replica id to declare with IDENTIFY (the master offered it).
        self.identity = identity
        #: Failover: how this node proves its id, or C{None}.
        self.auth = auth
        #: Failover: the node id the master must prove, or C{None}.
        self.expected_master = expected_master
        #: Frames that failed their CRC (checked framing): damaged on the
        #: way, never written.
        self.checksum_failures = 0
        #: Replicated records that failed validation, over all connections.
        self.rejected_records = 0
        #: The record that failed last, and how many times in a row.
        self.rejected_offset: int | None = None
        self.rejections_in_a_row = 0
        #: Why the last connection attempt failed (C{None}: it succeeded).
        self.connect_failure: str | None = None
        #: What the master said when it last closed a connection (CLOSING:
        #: its log damaged, the bytes needed unreadable); C{None} once a
        #: frame came since.
        self.closing_reason: str | None = None
        #: Connections in a row the master closed before sending a frame,
        #: without saying why, and the record end they were at.
        self.closed_without_frame = 0
        self.closed_at: int | None = None
        #: The master is taken for RocketMQ's, not known for sure: every
        #: connection opens with its own probe (the module's docstring).
        self.probe_first = False
        #: Seconds a connection's own probe waits for an answer before
        #: the real report follows (the check's first timeout).
        self.probe_wait = PROBE_FIRST_TIMEOUT
        #: The check's probe connection, kept open for the next
        #: connection (L{keep}); a connection being built on it.
        self.kept: ControlClient | None = None
        self.adopting = False

    def keep(self, client: ControlClient) -> None:
        """
        The check's probe found a silent master and kept its connection
        open: the next connection is made on it (no new connection; the
        probe already sent, the real report goes next).  A connection kept
        before and not used is closed.
        """
        self.drop_kept()
        self.kept = client

    def drop_kept(self) -> None:
        """
        Close the kept probe connection, if one is left unused.
        """
        kept, self.kept = self.kept, None
        if kept is not None:
            kept.close()

    def adopt_kept(self, protocolFactory: Any) -> Any | None:
        """
        A protocol from C{protocolFactory} (the connection service's
        wrapper of this factory) connected on the kept probe connection,
        or C{None} when there is none still open and silent.
        """
        kept, self.kept = self.kept, None
        if kept is None:
            return None
        if not kept.reusable or kept.transport is None:
            kept.close()
            return None
        self.adopting = True
        try:
            protocol = protocolFactory.buildProtocol(kept.transport.getPeer())
        finally:
            self.adopting = False
        if protocol is None:
            kept.close()
            return None
        connection = self.connection
        kept.hand_over(protocol)
        if kept.tls_handshake_done and self.connection is not connection:
            # (The TLS handshake was the probe's.)
            assert self.connection is not None
            self.connection.handshakeCompleted()
        return protocol

    def buildProtocol(self, addr: IAddress | None) -> SlaveConnection:
        return SlaveConnection(self)

    def closed_by_master(self, offset: int) -> None:
        """
        The master closed a connection before sending a frame, and without
        its last words (an older master, a classic one, or one that
        failed): count it at C{offset}, this log's record end.
        """
        if self.closed_at == offset:
            self.closed_without_frame += 1
        else:
            self.closed_at, self.closed_without_frame = offset, 1

    def suspect(self) -> None:
        if self._on_suspect is not None:
            self._on_suspect()

    def request_flush(self) -> None:
        if self._request_flush is not None:
            self._request_flush()

    def flushed(self) -> None:
        """
        Tell the connection a flush finished (a store flush observer).
        """
        if self.connection is not None:
            self.connection.flushed()


def load_replica_id(store_dir: str) -> str:
    """
    This replica's id, from C{<store_dir>/rmqha/replica-id}: created with
    a random UUID the first time, so it stays the same across restarts.

    @raise ValueError: the file holds no valid id (the text names it).
    """
    path = os.path.join(store_dir, "rmqha", "replica-id")
    try:
        with open(path, encoding="utf-8") as f:
            replica_id = f.read().strip()
    except FileNotFoundError:
        replica_id = str(uuid.uuid4())
        write_atomically(path, lambda f: f.write(replica_id + "\n"))
        return replica_id
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read the replica id: {e}") from None
    try:
        encode_identify(replica_id)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return replica_id
def _address(address: IAddress) -> str:
    host, port = getattr(address, "host", None), getattr(address, "port", None)
    if host is None or port is None:
        return str(address)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _send_first_report(protocol: IProtocol) -> None:
    # ClientService passes a proxy that forwards to the SlaveConnection.
    cast(SlaveConnection, protocol).send_report()


@implementer(IStreamClientEndpoint)
class _RememberingEndpoint:
    """
    An endpoint that keeps why its last connection attempt failed in
    C{factory.connect_failure} (C{None} when it succeeded), for the
    slave's retry log line and status.
    """

    def __init__(self, endpoint: IStreamClientEndpoint, factory: "SlaveFactory") -> None:
        self._endpoint = endpoint
        self._factory = factory

    def connect(self, protocolFactory: Any) -> Any:
        adopted = self._factory.adopt_kept(protocolFactory)
        if adopted is not None:
            self._factory.connect_failure = None
            return succeed(adopted)

        def connected(protocol: Any) -> Any:
            self._factory.connect_failure = None
            return protocol

        def failed(failure: Failure) -> Failure:
            self._factory.connect_failure = failure.getErrorMessage().rstrip(".")
            return failure

        return self._endpoint.connect(protocolFactory).addCallbacks(connected, failed)

    def __str__(self) -> str:
        return str(self._endpoint)


def make_slave_service(
    endpoint: IStreamClientEndpoint,
    factory: SlaveFactory,
    clock: IReactorTime,
    retry_policy: Callable[[int], float] | None = None,
    master: str | None = None,
) -> ClientService:
    """
    A service that keeps a connection to the master, reconnecting with
    exponential back-off (1 s, growing 1.5 times up to 30 s, with jitter),
    and sends the first report as soon as each connection is made.  A
    connection the master ends before sending anything counts as a failed
    attempt, so a refused TLS handshake backs off like a refused connect.
    A failed connection attempt is logged with its reason and the delay.

    @param master: how the logs name the master (default: the endpoint).
    """
    policy = retry_policy or backoffPolicy(initialDelay=1.0, maxDelay=30.0)
    remembering = _RememberingEndpoint(endpoint, factory)
    name = master or str(endpoint)

    def retry(attempt: int) -> float:
        # ClientService counts failed connects; connections the master
        # ended before sending anything count too.
        delay = policy(attempt + factory.fruitless_connections)
        if factory.connect_failure is not None:
            _log.warn(
                "cannot reach master {master}: {why}; retrying in {delay:.1f} s",
                master=name,
                why=factory.connect_failure,
                delay=delay,
            )
        return delay

    return ClientService(
        remembering,
        factory,
        retryPolicy=retry,
        clock=clock,
        prepareConnection=_send_first_report,
    )
