# -*- test-case-name: tests.test_master -*-
"""
The master's accept side of RocketMQ's classic HA: one L{MasterConnection}
per slave, built by L{MasterFactory}.

A connection waits for the slave's first 8-byte report, which says where
its commit log ends, and from there streams the master's commit log as
12-byte headers plus bytes (or, for an rmqha slave that asks, as checked
framing: a CRC-32 on every frame and report, docs/protocol.md).  A
connection whose first value is an rmqha control hello is a control
session instead (L{rmqha.ha.divergence}): one DIGEST at a time, hashed in a
worker thread and paced per peer host, reading paused while an answer is
pending or unread (docs/protocol.md).  The connection is the push producer
registered on its transport: it writes while the transport accepts and
stops when the transport pauses it, so a slow slave costs the master no
memory beyond the transport's buffer.  With nothing left to send it waits
for L{MasterFactory.notify_appended} (no polling) and sends a heartbeat
after C{heartbeat_interval} of silence.  Every later report is the
slave's acknowledgement (its max offset).  In a failover group with a
group secret, a slave first proves its node id (AUTH_HELLO): the
connection hands that handshake to an L{Authentication} of its own until
it is over.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, cast

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.interfaces import (
    IAddress,
    IConsumer,
    IDelayedCall,
    IHandshakeListener,
    INegotiated,
    IPushProducer,
    IReactorThreads,
    IReactorTime,
)
from twisted.internet.protocol import Protocol, ServerFactory, connectionDone
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from rmqha._sockets import send_file_now, send_now, sends_files, set_tcp_no_delay
from rmqha._timers import IdleTimer
from rmqha.store.commitlog import CommitLog
from rmqha.store.errors import StoreDamagedError, StoreError
from rmqha.ha._wire import (
    AUTH_REFUSED,
    CHECKED_ACK,
    CONTROL_REFUSED,
    IDENTIFY,
    ChecksumError,
    Greeting,
    ProtocolError,
    ReportDecoder,
    decode_identify,
    checked_header,
    encode_checked_header,
    encode_closing,
    encode_code,
    encode_header,
    sniff_greeting,
)
from rmqha.ha.auth import HANDSHAKE_TIMEOUT, AuthError, GroupAuth, MasterHandshake
from rmqha.ha.config import DEFAULT_HA_CONFIG, HAConfig
from rmqha.ha.epochs import EpochFile
from rmqha.ha.control import DIGEST_BYTES_PER_SECOND, ControlSession, PeerBudget
from rmqha.ha.group import HAService
from rmqha.ha.replicas import EarlyFrames, Replicas
from rmqha.tls import PeerPolicy, certificate_names

__all__ = ["HAConfig", "DEFAULT_HA_CONFIG", "MasterFactory", "MasterConnection", "SlaveStatus"]


@dataclass(frozen=True)
class SlaveStatus:
    """
    One slave connection, as C{/status} shows it.
    """

    peer: str
    ack_offset: int | None
    lag_bytes: int | None
    bytes_per_s: float
    connected_since: float
    #: C{"tcp"} or C{"tls"}.
    transport: str = "tcp"
    #: The name from the slave's verified TLS certificate, if it sent one.
    identity: str | None = None
    #: C{"classic"} or C{"checked"} (CRC-32 on every frame and report).
    framing: str = "classic"
    #: The replica id the slave declared, if any (or, authenticated, the
    #: node id it proved).
    replica_id: str | None = None
    #: Failover: the slave proved its node id (C{replica_id}) as the group
    #: requires (the group secret, or a verified certificate naming it).
    authenticated: bool = False
    #: Seconds since the slave last held everything the master's log held
    #: (0 while it has acknowledged the log's end; C{None} before its
    #: first ack): L{MasterConnection.lag_seconds}.
    lag_seconds: float | None = None


class _State(enum.Enum):
    HANDSHAKING = "TLS handshake"
    AUTHENTICATING = "group authentication"
    CONTROL = "rmqha control session"
    AWAITING_REPORT = "awaiting first report"
    TRANSFERRING = "transferring"
    CLOSED = "closed"


#: How far back acknowledgements are kept to compute a transfer rate.
_RATE_WINDOW = 10.0

#: Catch-up frames: the body size of frames to a slave on checked framing
#: (an rmqha slave) that is at least this far behind.  Per frame the master
#: pays a read, a header and a send in Python, so a backlog in 32 KiB
#: frames (C{haTransferBatchSize}) costs it 8x the Python of 256 KiB ones;
#: larger ones (1 MiB) cost more than they save (fresh buffers fault their
#: pages in, and most frames are then cut across the slave's reads).  Well
#: inside the protocol's 4 MiB frame limit; classic framing (a RocketMQ
#: slave) keeps C{haTransferBatchSize}.
CATCH_UP_BATCH_SIZE = 256 * 1024
#: At most this many body bytes of catch-up frames go straight to the
#: socket in one L{Transfer.produce}; the next ones on the reactor's next
#: turn (C{callLater(0)}), so that one slave catching up cannot hold the
#: reactor.  (They used to be queued behind, through Twisted's buffer: a
#: copy of a 256 KiB frame, a write turn and two C{epoll_ctl} per MiB.)
_DIRECT_BUDGET = 4 * CATCH_UP_BATCH_SIZE

#: Early frames: while the puts an ack released run their callbacks (a
#: producer's next put each), what they have appended goes to a slave as
#: soon as it is at least this many bytes and at least half of what the
#: slave still has to acknowledge, instead of all at the end of the
#: release.  Otherwise N producers move in one convoy: the master runs
#: N puts while the slave idles, then the slave works while the master
#: idles.  In two or three groups each side works while the other does
#: (SYNC at 32 producers +18 % median, docs/benchmarks.md).  Small enough
#: that 32 producers of 1 KiB split, large enough that a frame's costs
#: (a read, a send, an ack) stay a small share per put.
EARLY_BYTES = 12 * 1024


def _peer_name(address: IAddress | None) -> str:
    host = getattr(address, "host", None)
    port = getattr(address, "port", None)
    if host is None:
        return str(address)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

_IDENTIFY_CODE = encode_code(IDENTIFY)
_AUTH_REFUSED = encode_code(AUTH_REFUSED)


class Transfer:
    """
    The commit log streamed to one slave from an offset, as frames (the
    magic-wormhole C{outbound.py} split: the connection parses and
    decides, this object writes).  It writes while the transport accepts
    and there is data; a write can pause it from inside
    C{transport.write} (the loop checks after each frame); with nothing
    left it waits for L{data_available} (no polling), and after
    C{heartbeat_interval} without a write it sends a heartbeat.  Its
    connection is the push producer registered on the transport and
    forwards C{pause} and C{resume} here.

    @ivar next_offset: where the next frame starts.
    @ivar paused: the transport paused its producer.
    """

    def __init__(self, connection: "MasterConnection", start: int, paused: bool) -> None:
        self.connection = connection
        self.factory = connection.factory
        self.next_offset = start
        self.paused = paused
        self._open = True
        self._producing = False
        # Frames go out with send_now while the slave keeps up.
        self._direct = True
        # The next catch-up frames, on the reactor's next turn.
        self._next_turn: IDelayedCall | None = None
        self._last_write = connection.connected_since
        self._heartbeat = IdleTimer(
            self.factory.clock,
            self.factory.config.heartbeat_interval,
            lambda: self._last_write,
            self._send_heartbeat,
        )

    def start(self) -> None:
        self._heartbeat.start()
        self.produce()

    def stop(self) -> None:
        self._open = False
        self.paused = True
        self._heartbeat.stop()
        if self._next_turn is not None:
            self._next_turn.cancel()
            self._next_turn = None

    def _turn(self) -> None:
        self._next_turn = None
        if not self.paused:
            self.produce()

    def resume(self) -> None:
        self.paused = False
        self.produce()

    def data_available(self) -> None:
        """
        The commit log grew: send it unless paused or already sending.
        """
        if not self.paused:
            self.produce()

    def early_at(self, acked: int | None) -> int | None:
        """
        The log's end from which the puts being released (see
        L{MasterFactory.release_waiters}) are worth sending now: at least
        L{EARLY_BYTES}, and at least half of what the slave (last
        acknowledging C{acked}) still has to acknowledge, so that the
        slave works while the master's puts run.  C{None} while paused.
        """
        if self.paused or not self._open:
            return None
        offset = self.next_offset
        in_flight = offset - (acked if acked is not None else 0)
        return offset + max(EARLY_BYTES, (in_flight + 1) // 2)

    def produce(self) -> None:
        """
        Write frames while the transport accepts them and there is data.
        """
        if self._producing or not self._open:
            return
        self._producing = True
        try:
            commitlog = self.factory.commitlog
            batch = self.factory.config.transfer_batch_size
            catch_up = max(batch, CATCH_UP_BATCH_SIZE) if self.connection.checked else 0
            budget = _DIRECT_BUDGET
            transport: Any = self.connection.transport
            # Only a SYNC_MASTER's puts wait for the frame: an ASYNC one
            # keeps queueing, so that a turn's puts leave in one send.
            ha = self.factory.ha
            direct = self._direct and ha is not None and ha.sync
            offset = self.next_offset
            # (Nothing below appends: sending runs no callback.)
            end = commitlog.max_offset
            wrote = False
            while not self.paused and self._open and offset < end:
                behind = catch_up and end - offset >= catch_up
                if behind and budget <= 0 and not direct:
                    # This turn's share sent: the next frames on the
                    # reactor's next turn (not queued through Twisted's
                    # buffer: a copy, a write turn, two epoll_ctl).
                    if self._next_turn is None:
                        self._next_turn = self.factory.clock.callLater(0, self._turn)
                    break
                if behind and budget > 0 and sends_files(transport):
                    # A full frame, nothing to gather, straight to the
                    # socket: its body from the file (no copy into the
                    # socket, and none into this process: its CRC for the
                    # header is computed in the mapping).
                    sent = self._send_from_file(commitlog, offset, catch_up)
                    if sent is None:
                        return
                    if not sent:
                        break
                    budget -= sent
                    offset += sent
                    self.next_offset = offset
                    wrote = True
                    continue
                try:
                    data = commitlog.read(offset, catch_up if behind else batch)
                except StoreError as e:
                    self._unreadable(offset, e)
                    return
                if not data:
                    break
                chunks = [self._frame_header(offset, data), data]
                if behind and budget > 0:
                    # (TLS, or the socket full: through Twisted's buffer.)
                    budget -= len(data)
                    send_now(transport, chunks)
                elif direct:
                    # A frame the socket did not take whole: the slave is
                    # behind, so queue (Twisted's buffer, pausing this
                    # producer) until the transfer has caught up again.
                    direct = self._direct = send_now(transport, chunks)
                else:
                    transport.writeSequence(chunks)
                offset += len(data)
                self.next_offset = offset
                wrote = True
            if wrote:
                self._last_write = self.factory.clock.seconds()
            if offset >= end:
                self._direct = True
        finally:
            self._producing = False

    def _send_from_file(self, commitlog: CommitLog, offset: int, limit: int) -> int | None:
        """
        Send the frame of up to C{limit} bytes from C{offset} with its body
        from the segment file (L{send_file_now}).

        @return: the body's size (0: nothing there, nothing sent); C{None}
            if the log could not be read (the slave was refused, or, a
            frame begun, the connection dropped).
        """
        try:
            fd, position, size, crc = commitlog.file_span(offset, limit)
        except (StoreError, OSError) as e:
            self._unreadable(offset, e)
            return None
        if not size:
            return 0
        header = checked_header(offset, size, crc)
        try:
            send_file_now(
                self.connection.transport,
                header,
                fd,
                position,
                size,
                lambda start: commitlog.read(offset + start, size - start),
            )
        except StoreError as e:
            # Part of the frame is on the socket: no last words can follow
            # it.  The next connection's read meets the error first.
            self.connection.drop(
                "cannot read the commit log at offset {offset}: {error}",
                offset=offset,
                error=str(e),
            )
            return None
        return size

    def _unreadable(self, offset: int, error: Exception) -> None:
        # (A segment file missing, cut short or damaged: the error names
        # it.  One line, and an rmqha slave is told, instead of a
        # traceback per reconnect.)
        self.connection.refuse(
            "cannot read the commit log at offset {offset}: {error}",
            offset=offset,
            error=str(error),
        )

    def _frame_header(self, offset: int, body: bytes | memoryview) -> bytes:
        if self.connection.checked:
            return encode_checked_header(offset, body)
        return encode_header(offset, len(body))

    def _send_heartbeat(self) -> bool:
        """
        After C{heartbeat_interval} without a write, send a heartbeat (an
        empty frame at the next offset): it keeps the slave's read-idle
        timer from firing and makes it re-check its offset.  Not while
        paused: the transport is full of data then.
        """
        if not self.paused and self._open:
            send_now(self.connection.transport, [self._frame_header(self.next_offset, b"")])
            self._last_write = self.factory.clock.seconds()
        return True


class Authentication:
    """
    One slave's group authentication handshake (failover,
    L{rmqha.ha.auth}), from its AUTH_HELLO on: the L{MasterHandshake} fed
    what the slave sends, its answers written, and the timer that drops
    the connection unless the slave has proved its node id within
    C{HANDSHAKE_TIMEOUT}.  Its connection feeds it (L{feed}) until the
    slave has, then reads what follows as a new greeting (L{rest}), and
    stops it (L{stop}) when it closes.

    @ivar rest: the bytes after the slave's proof, once it is over.
    """

    _log = Logger()

    def __init__(self, connection: "MasterConnection", auth: GroupAuth) -> None:
        self._connection = connection
        self._handshake = MasterHandshake(auth)
        self._timer: IDelayedCall | None = connection.factory.clock.callLater(
            HANDSHAKE_TIMEOUT, self._timed_out
        )
        self.rest = b""

    def feed(self, data: bytes) -> str | None:
        """
        Feed the handshake what the slave sent: the node id it proved once
        the handshake is over, C{None} until then (and when the connection
        is dropped: a wrong proof or a damaged message).
        """
        handshake = self._handshake
        connection = self._connection
        try:
            answer = handshake.feed(data)
        except AuthError as e:
            connection.drop(
                "group authentication failed: {error}",
                last_words=_AUTH_REFUSED,
                error=str(e),
            )
            return None
        except ProtocolError as e:
            if isinstance(e, ChecksumError):
                connection.factory.checksum_failures += 1
            connection.drop("group authentication: {error}", error=str(e))
            return None
        if answer:
            connection.transport.write(answer)  # type: ignore[union-attr]
        if not handshake.done:
            return None
        self.stop()
        self.rest = handshake.rest or b""
        self._log.info(
            "slave {peer} proved it is node {node} (group secret)",
            peer=connection.peer,
            node=handshake.slave_id,
        )
        return handshake.slave_id

    def stop(self) -> None:
        """
        The handshake is over, or its connection dropped: no more timeout.
        """
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()

    def lost(self) -> None:
        """
        The slave closed the connection before proving its node id.
        """
        self.stop()
        # (A slave with another secret gives up at our challenge.)
        self._log.warn(
            "slave {peer} closed the connection during group authentication "
            "(declared node id: {claimed}): another group secret or group name?",
            peer=self._connection.peer,
            claimed=self._handshake.claimed_id or "none yet",
        )

    def _timed_out(self) -> None:
        self._timer = None
        self._connection.drop(
            "group authentication failed: not finished within {timeout:g} s "
            "(declared node id: {claimed})",
            last_words=_AUTH_REFUSED,
            timeout=HANDSHAKE_TIMEOUT,
            claimed=self._handshake.claimed_id or "none yet",
        )


@implementer(IPushProducer, IHandshakeListener)
class MasterConnection(Protocol):
    """
    One slave, from the master's side.

    @ivar ack_offset: the slave's last report after the first (its max
        offset), or C{None} before it has acknowledged anything.
    """

    _log = Logger()

    def __init__(self, factory: "MasterFactory", address: IAddress | None) -> None:
        self.factory = factory
        self.peer = _peer_name(address)
        #: The peer's host (what per-peer bounds are kept by).
        self.peer_host = str(getattr(address, "host", address))
        self.ack_offset: int | None = None
        self.connected_since = 0.0
        #: The slave's certificate name, once its TLS handshake is checked.
        self.identity: str | None = None
        #: Every name its verified certificate carries.
        self.certificate_names: tuple[str, ...] = ()
        #: The slave proved its node id (L{replica_id}) with the group
        #: secret (failover, L{rmqha.ha.auth}).
        self.authenticated = False
        # The group authentication handshake, while it runs.
        self._authentication: Authentication | None = None
        self.tls = False
        #: The slave asked for checked framing.
        self.checked = False
        #: The replica id the slave declared (IDENTIFY; unauthenticated),
        #: or the node id it proved (L{authenticated}).
        self.replica_id: str | None = None
        #: Failover mode: its node id was refused (logged once).
        self.refused_node = False
        self._state = _State.AWAITING_REPORT
        # The first bytes, until the greeting says what the peer is.
        self._head: bytearray | None = bytearray()
        #: What serves a control session's requests, if this is one.
        self._session: ControlSession | None = None
        #: The frames to the slave, once its first report has come.
        self._transfer: Transfer | None = None
        self._reports = ReportDecoder()
        self._paused = False
        self._last_read = 0.0
        config = factory.config
        clock = factory.clock
        self._housekeeping = IdleTimer(
            clock, config.housekeeping_interval, lambda: self._last_read, self._silent
        )
        self._acks: deque[tuple[float, int]] = deque()
        # Since when an ack has been owed (the master's log ended past the
        # last ack), or None: see delivers_acks.
        self._owed_since: float | None = None
        # Replication lag in time (lag_seconds): when the slave last held
        # all the master's log then held, and the log's end at its last ack
        # and when that ack came.
        self._caught_up_at: float | None = None
        self._end_at_last_ack = 0
        self._last_ack_at = 0.0

    # -- Protocol ----------------------------------------------------------

    def connectionMade(self) -> None:
        clock = self.factory.clock
        self.connected_since = self._last_read = clock.seconds()
        set_tcp_no_delay(self.transport)
        # (INegotiated, not the class: a connection limiter's wrapper
        # between us and TLS carries the TLS transport's interfaces.)
        if INegotiated.providedBy(self.transport):
            # Nothing is read or sent until the handshake is done and the
            # slave's certificate has passed the peer policy.
            self.tls = True
            self._state = _State.HANDSHAKING
        IConsumer(self.transport).registerProducer(self, True)
        self.factory.connections.add(self)
        self._housekeeping.start()
        if not self.tls:
            # (Under TLS a peer counts as connected once its handshake is
            # done: a failed one is the TLS layer's warning, not ours.)
            self._log.info("slave {peer} connected", peer=self.peer)

    def handshakeCompleted(self) -> None:
        """
        TLS is up (OpenSSL has checked any client certificate against the
        CA): apply the peer policy before the first report is read.
        """
        if self._state is not _State.HANDSHAKING:
            return
        x509 = self.transport.getPeerCertificate()  # type: ignore[union-attr]
        certificate = x509.to_cryptography() if x509 is not None else None
        identity, refusal = self.factory.peer_policy.check(certificate)
        self.identity = identity
        if certificate is not None:
            self.certificate_names = tuple(certificate_names(certificate))
        if refusal is not None:
            self.drop("refused after the TLS handshake: {refusal}", refusal=refusal)
            return
        self._state = _State.AWAITING_REPORT
        self._log.info(
            "slave {peer} connected, verified by TLS as {identity}",
            peer=self.peer,
            identity=identity or "(no client certificate)",
        )

    def dataReceived(self, data: bytes) -> None:
        if self._state is _State.CLOSED:
            return
        if self._state is _State.HANDSHAKING:
            # TLSMemoryBIOProtocol delivers nothing before the handshake;
            # should it ever, nothing is served to an unchecked peer.
            self.drop("data arrived before the TLS handshake completed")
            return
        self._last_read = self.factory.clock.seconds()
        if self._session is not None:
            self._session.feed(data)
            return
        if self._authentication is not None:
            data = self._authenticate(data)
            if not data:
                return
        if self._head is not None:
            data = self._greeting(data)
            if not data:
                return
        try:
            offset = self._reports.feed(data)
        except ChecksumError as e:
            self.factory.checksum_failures += 1
            self.drop("{error}", error=str(e))
            return
        except ProtocolError as e:
            self.drop("{error}", error=str(e))
            return
        if offset is None:
            return
        if self._state is _State.AWAITING_REPORT:
            self._start(offset)
        else:
            self._acknowledged(offset)
        # The firing rule (docs/sync.md): the puts this ack completes fire
        # now, at the end of this dataReceived, with its parsing done.
        self.factory.release_waiters()

    # -- the rmqha control extension (docs/protocol.md) ----------------------

    def _greeting(self, data: bytes) -> bytes:
        """
        Until the peer's greeting is known (L{sniff_greeting}): a classic
        or checked slave (its report bytes are returned for the report
        decoder), an IDENTIFY first, or a control session (served by a
        L{ControlSession} from now on).
        """
        assert self._head is not None
        self._head += data
        sniffed = sniff_greeting(self._head)
        if sniffed is None:
            return b""
        greeting, code = sniffed
        if greeting is Greeting.IDENTIFY and self.replica_id is None:
            if not self._identify():
                return b""
            return self._greeting(b"")
        head, self._head = bytes(self._head), None
        auth = self.factory.auth
        if greeting is Greeting.AUTH:
            if auth is None or auth.secret is None:
                refusal = "has no group secret for"
            elif self.authenticated or self.replica_id is not None:
                refusal = "takes only first on a connection"
            else:
                self._state = _State.AUTHENTICATING
                self._authentication = Authentication(self, auth)
                rest = self._authenticate(head)
                return self._greeting(rest) if rest else b""
            # (Not AUTH_REFUSED: the slave then tells "takes no group
            # authentication" from "refused this node".)
            self.drop(
                "it asks for group authentication, which this master {reason}",
                last_words=encode_code(CONTROL_REFUSED),
                reason=refusal,
            )
            return b""
        if greeting is Greeting.CLASSIC:
            return head
        if greeting is Greeting.CHECKED:
            # An rmqha slave that learnt from our INFO that we offer it.
            self.checked = True
            self._reports = ReportDecoder(checked=True)
            self.transport.write(encode_code(CHECKED_ACK))  # type: ignore[union-attr]
            return head[8:]
        if greeting is Greeting.CONTROL:
            self._state = _State.CONTROL
            # Not a slave: not in the status or the quorum.
            self.factory.connections.discard(self)
            # (Served always, but on a master with a group secret only to a
            # member that proved its id: the others get INFO, which says so.)
            trusted = auth is None or auth.secret is None or self.authenticated
            self._session = ControlSession(self, paused=self._paused, trusted=trusted)
            self._session.start(head[8:])
            return b""
        # RocketMQ slaves never send a negative value: this is an rmqha
        # peer's code, damaged on the way or unknown to us (or a second
        # IDENTIFY; an AUTH_HELLO out of place is refused above).
        self.drop(
            "the first value {code} is negative and no code this master knows",
            last_words=encode_code(CONTROL_REFUSED),
            code=code,
        )
        return b""

    def _identify(self) -> bool:
        """
        The slave's IDENTIFY at the head of the stream: take its replica
        id once it is whole (C{True}), or wait for more (C{False}; also
        when it was bad and the connection is dropped).
        """
        assert self._head is not None
        try:
            found = decode_identify(self._head)
        except ProtocolError as e:
            if isinstance(e, ChecksumError):
                self.factory.checksum_failures += 1
            self.drop("{error}", error=str(e))
            return False
        if found is None:
            return False
        self.replica_id, used = found
        del self._head[:used]
        self._log.info(
            "slave {peer} declares replica id {replica_id} (unauthenticated)",
            peer=self.peer,
            replica_id=self.replica_id,
        )
        return True

    # -- group authentication (failover, rmqha.ha.auth) ---------------------

    def _authenticate(self, data: bytes) -> bytes:
        """
        Feed L{Authentication}: once the slave has proved its node id, the
        bytes after its proof, a new greeting; C{b""} until then.
        """
        authentication = self._authentication
        assert authentication is not None
        node = authentication.feed(data)
        if node is None:
            return b""
        self._authentication = None
        self.authenticated = True
        self.replica_id = node
        self._state = _State.AWAITING_REPORT
        self._head = bytearray()
        return authentication.rest

    @property
    def replica(self) -> str:
        """
        Which replica this is, for the quorum: the node id it proved, else
        the TLS certificate's name, else the id the slave declared, else
        its address (a classic slave: every connection its own replica).
        An unproven id is never the same replica as a proven one, so a
        peer declaring a member's id cannot replace that member.
        """
        if self.authenticated:
            return f"node {self.replica_id}"
        if self.identity is not None:
            return f"certificate {self.identity}"
        if self.replica_id is not None:
            return f"declared id {self.replica_id}"
        return f"address {self.peer}"

    @property
    def failover_node(self) -> str | None:
        """
        The failover node this replica is (docs/failover.md, "Who counts"),
        or C{None}: a classic slave (a genuine RocketMQ one), or an id not
        proven the way the group requires (L{MasterFactory.auth}):

          - group secret: the node id the slave proved in the handshake;
          - TLS client certificates: the id it declared, if its verified
            certificate names it (both, when both are required);
          - neither (C{--insecure-group}, or no failover): the id it
            declared, when it has no TLS certificate or its certificate
            names the same node.
        """
        declared = self.replica_id
        if declared is None:
            return None
        auth = self.factory.auth
        if auth is None:
            if self.identity is not None and self.identity != declared:
                return None
            return declared
        if auth.secret is not None and not self.authenticated:
            return None
        if auth.certificates and declared not in self.certificate_names:
            return None
        return declared

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self._state is _State.AUTHENTICATING and self._authentication is not None:
            self._authentication.lost()
        elif self._state is _State.HANDSHAKING:
            # Never connected as a slave: a failed handshake is the TLS
            # layer's warning (rmqha.tls.ServerTLSFactory).
            pass
        elif self._state is not _State.CLOSED:
            self._log.info(
                "slave {peer} disconnected: {reason}",
                peer=self.peer,
                reason=reason.getErrorMessage(),
            )
        self._state = _State.CLOSED
        self._paused = True
        if self._transfer is not None:
            self._transfer.stop()
        self._housekeeping.stop()
        self.factory.connections.discard(self)
        if self._session is not None:
            self._session.stop()
        if self.ack_offset is not None:
            self.factory.acks_changed()
        node = self.failover_node
        if node is not None and self.factory.ha is not None:
            if not self.factory.replicas.serves(node):
                self.factory.ha.replica_gone(node)
        if self.transport is not None:
            IConsumer(self.transport).unregisterProducer()

    def heard_from(self) -> None:
        """
        The peer's silence counts from now (a control session answered it).
        """
        self._last_read = self.factory.clock.seconds()

    @property
    def replicating(self) -> bool:
        """
        The first report has come and the connection is not closed.
        """
        return self._state is _State.TRANSFERRING

    # -- reports -----------------------------------------------------------

    def _start(self, offset: int) -> None:
        """
        The first report: where the slave's log ends, so where to start.
        """
        commitlog = self.factory.commitlog
        if offset == 0:
            if self.factory.config.sync_from_last_file:
                # 4.9's rule: only the master's last segment.
                end = commitlog.max_offset
                start = end - end % commitlog.segment_size
            else:
                # The whole log (what users asked for, RocketMQ #3661).
                start = commitlog.min_offset
        else:
            start = offset
        damage = commitlog.damage
        if damage is not None:
            self.refuse("the master's commit log is damaged: {error}", error=str(damage))
            return
        if start > commitlog.max_offset:
            self.drop(
                "slave is at offset {start}, ahead of the master's max offset {max_offset}",
                start=start,
                max_offset=commitlog.max_offset,
            )
            return
        if start < commitlog.min_offset:
            self.drop(
                "slave is at offset {start}, behind the master's oldest "
                "segment (min offset {min_offset})",
                start=start,
                min_offset=commitlog.min_offset,
            )
            return
        # One connection per replica counts: a newer one replaces the old
        # (a slave that reconnected before its old connection timed out,
        # or a second connection claiming to be the same replica).
        self.factory.replace_older(self)
        # The first report is what the slave holds: 0 for an empty one,
        # which is connected and counts (from 0) for in-sync decisions.
        self._record_ack(offset)
        self._state = _State.TRANSFERRING
        self.factory.replicas.changed()
        self._log.info(
            "slave {peer} reported offset {offset}; transfer starts at {start}",
            peer=self.peer,
            offset=offset,
            start=start,
        )
        self._transfer = Transfer(self, start, self._paused)
        self._transfer.start()

    def _acknowledged(self, offset: int) -> None:
        max_offset = self.factory.commitlog.max_offset
        if offset > max_offset:
            # RocketMQ #3015: a fake or diverged slave must not count as
            # having replicated what the master does not even have.
            self.drop(
                "slave acknowledged offset {offset}, beyond the master's max "
                "offset {max_offset}",
                offset=offset,
                max_offset=max_offset,
            )
            return
        self._record_ack(offset)

    def _record_ack(self, offset: int) -> None:
        now = self.factory.clock.seconds()
        max_offset = self.factory.commitlog.max_offset
        # (Kafka's last-caught-up time: an ack reaching the log's end as it
        # was at the previous ack means the slave held, then, all of it.)
        if offset >= max_offset:
            self._caught_up_at = now
        elif self.ack_offset is not None and offset >= self._end_at_last_ack:
            self._caught_up_at = max(self._caught_up_at or 0.0, self._last_ack_at)
        elif self._caught_up_at is None:
            # Behind from its first ack: at least since it connected.
            self._caught_up_at = self.connected_since
        self._end_at_last_ack, self._last_ack_at = max_offset, now
        self.ack_offset = offset
        # (An ack short of the log's end owes the rest from now: a link
        # that keeps acking, however far behind, delivers acks.)
        self._owed_since = None if offset >= self.factory.commitlog.max_offset else now
        self.factory.acks_changed(self)
        acks = self._acks
        acks.append((now, offset))
        while len(acks) > 2 and now - acks[1][0] >= _RATE_WINDOW:
            acks.popleft()

    def delivers_acks(self, now: float, max_offset: int, timeout: float) -> bool:
        """
        Whether this replica's link delivers acks: it is replicating and
        has acknowledged the log's end (C{max_offset}), or has been owing
        an ack for at most C{timeout} seconds.  A link cut without a reset
        (a partition, a paused peer) stays open for minutes until the
        housekeeping timeout; it stops counting as connected once an ack
        has been owed for C{timeout} (docs/sync.md, "Who counts as
        connected").
        """
        ack = self.ack_offset
        if ack is None or self._state is not _State.TRANSFERRING:
            return False
        if ack >= max_offset:
            self._owed_since = None
            return True
        owed = self._owed_since
        if owed is None:
            self._owed_since = now
            return True
        return now - owed <= timeout

    def delivers_until(self, now: float, timeout: float) -> float:
        """
        Asked just after L{delivers_acks} answered C{True} at C{now}: the
        moment this link stops delivering acks unless it acknowledges (or
        stops) first -- C{timeout} after the ack it owes was first owed,
        or, owing none, after C{now} (it will owe one from a later
        moment, so this is early, never late).
        """
        owed = self._owed_since
        return (now if owed is None else owed) + timeout

    def lag_seconds(self, now: float, max_offset: int) -> float | None:
        """
        Replication lag in time: 0 while the slave has acknowledged
        C{max_offset}, the log's end; otherwise the seconds since it last
        held everything the log then held: since the log grew past its
        ack of the end, or since an ack reaching the end as it was at its
        previous ack (Kafka's time since the replica was last caught up),
        or, behind from its first ack, since it connected.
        C{None} before its first ack.
        """
        if self.ack_offset is None or self._caught_up_at is None:
            return None
        if self.ack_offset >= max_offset:
            return 0.0
        return max(0.0, now - self._caught_up_at)

    # -- IPushProducer -----------------------------------------------------

    def pauseProducing(self) -> None:
        self._paused = True
        if self._transfer is not None:
            self._transfer.paused = True
        if self._session is not None:
            # The peer does not read its answers: stop reading requests.
            self._session.pause()

    def resumeProducing(self) -> None:
        if self._state is _State.CLOSED:
            return
        self._paused = False
        if self._session is not None:
            self._session.resume()
        elif self._transfer is not None:
            self._transfer.resume()

    def stopProducing(self) -> None:
        self._paused = True
        if self._transfer is not None:
            self._transfer.paused = True

    def data_available(self) -> None:
        """
        The commit log grew: send it unless paused or already sending.
        """
        if self._owed_since is None:
            # (An ack is owed from now: see delivers_acks.)
            self._owed_since = now = self.factory.clock.seconds()
            if self.ack_offset is not None:
                # It had acknowledged the log's end: it held all the log
                # until now (lag_seconds).
                self._caught_up_at = now
        if self._transfer is not None:
            self._transfer.data_available()

    def early_at(self) -> int | None:
        """
        See L{Transfer.early_at}; C{None} before transferring.
        """
        if self._transfer is None:
            return None
        return self._transfer.early_at(self.ack_offset)

    @property
    def next_offset(self) -> int | None:
        """
        Where the next frame starts (once transferring).
        """
        return self._transfer.next_offset if self._transfer is not None else None

    # -- timers ------------------------------------------------------------

    def _silent(self) -> bool:
        silent = self.factory.clock.seconds() - self._last_read
        self.drop("nothing received for {silent:.1f} s", silent=silent)
        return False

    # -- status ------------------------------------------------------------

    def status(self) -> SlaveStatus:
        max_offset = self.factory.commitlog.max_offset
        acks = self._acks
        rate = 0.0
        if len(acks) >= 2 and acks[-1][0] > acks[0][0]:
            rate = (acks[-1][1] - acks[0][1]) / (acks[-1][0] - acks[0][0])
        return SlaveStatus(
            peer=self.peer,
            ack_offset=self.ack_offset,
            lag_bytes=None if self.ack_offset is None else max_offset - self.ack_offset,
            bytes_per_s=rate,
            connected_since=self.connected_since,
            transport="tls" if self.tls else "tcp",
            identity=self.identity,
            framing="checked" if self.checked else "classic",
            replica_id=self.replica_id,
            authenticated=self.factory.auth is not None and self.failover_node is not None,
            lag_seconds=self.lag_seconds(self.factory.clock.seconds(), max_offset),
        )

    def refuse(self, why: str, **fields: Any) -> None:
        """
        L{drop}, telling an rmqha slave (checked framing) why first: the
        text of C{why} over C{fields} as its last words (CLOSING,
        docs/protocol.md), which the slave shows as its problem.  A
        classic slave (RocketMQ's) sees the connection close.
        """
        last_words = encode_closing(why.format(**fields)) if self.checked else None
        self.drop(why, last_words=last_words, **fields)

    def drop(self, why: str, last_words: bytes | None = None, **fields: Any) -> None:
        """
        Log C{why} and close the connection: at once, discarding anything
        not sent yet, or after sending C{last_words}.

        @param why: a log format string over C{fields} (the event keeps
            them: C{drop("... {offset} ...", offset=offset)}); text from
            elsewhere goes in as a field, never into C{why}.
        """
        self._log.warn("dropping slave {peer}: " + why, peer=self.peer, **fields)
        self._state = _State.CLOSED
        self.factory.replicas.changed()
        self._paused = True
        if self._authentication is not None:
            self._authentication.stop()
        if self._transfer is not None:
            self._transfer.stop()
        if last_words is None:
            self.transport.abortConnection()  # type: ignore[union-attr]
        else:
            self.transport.write(last_words)  # type: ignore[union-attr]
            self.transport.loseConnection()  # type: ignore[union-attr]


def _default_run_in_thread(clock: object) -> Callable[[Callable[[], Any]], Deferred[Any]]:
    if IReactorThreads.providedBy(clock):
        reactor: Any = clock
        return lambda f: deferToThreadPool(reactor, reactor.getThreadPool(), f)
    return lambda f: maybeDeferred(f)


class MasterFactory(ServerFactory):
    """
    Builds a L{MasterConnection} per accepted slave; shares the commit log,
    the clock and the settings among them.
    """

    _log = Logger()

    def __init__(
        self,
        commitlog: CommitLog,
        clock: IReactorTime,
        config: HAConfig = DEFAULT_HA_CONFIG,
        peer_policy: PeerPolicy = PeerPolicy(),
        run_in_thread: Callable[[Callable[[], Any]], Deferred[Any]] | None = None,
        digest_rate: float = DIGEST_BYTES_PER_SECOND,
        ha: HAService | None = None,
        auth: GroupAuth | None = None,
        *,
        replicas: Replicas | None = None,
        early: EarlyFrames | None = None,
        epochs: EpochFile | None = None,
    ) -> None:
        """
        @param peer_policy: what a slave's TLS certificate must satisfy
            (applies to TLS connections).
        @param auth: failover: how slaves prove their node ids
            (L{failover_node}); with a group secret, the handshake
            AUTH_HELLO starts is served, and control requests are served
            only to peers that completed it.  C{None}: ids are only
            declared (C{--insecure-group}, or no failover).
        @param run_in_thread: runs a DIGEST's hashing and returns a
            Deferred of its result; defaults to the reactor's thread pool
            (inline for a clock without threads, as in tests).
        @param digest_rate: bytes hashed per second per peer address for
            DIGEST answers (and the burst).
        @param ha: the quorum the slaves' acks feed (none: acks are only
            shown); it must read C{replicas}.
        @param replicas: the connections and their acks (default: a
            registry of this factory's own, with no fence).
        @param early: when appends are sent (default: this factory's own
            policy); C{ha}'s waiting puts must be released with it.
        @param epochs: the master's epoch file (failover), which control
            sessions offer and answer EPOCHS from; C{None}: no epochs.
        """
        if auth is not None and auth.certificates and not peer_policy.require_client_cert:
            raise ValueError(
                "group authentication by TLS client certificates needs a peer policy "
                "that requires them (--tls-require-client-cert)"
            )
        self.commitlog = commitlog
        self.clock = clock
        self.config = config
        self.peer_policy = peer_policy
        #: How slaves prove their node ids (failover), or C{None}.
        self.auth = auth
        if run_in_thread is None:
            run_in_thread = _default_run_in_thread(clock)
        self.run_in_thread = run_in_thread
        #: The bytes of DIGEST hashing each peer host may cause per second.
        self.digest_budget = PeerBudget(clock, digest_rate)
        if replicas is None:
            if ha is not None:
                raise ValueError("a master factory feeding an HA service needs its replicas")
            replicas = Replicas(clock, commitlog, auth=auth)
        elif ha is not None and ha.acks is not replicas:
            raise ValueError("the HA service must read the factory's replicas")
        #: The connections and their acks.
        self.replicas = replicas
        # (The registry sees them through its Protocol; they are ours.)
        self.connections = cast("set[MasterConnection]", replicas.connections)
        #: When appends are sent to the slaves.
        self.early = early if early is not None else EarlyFrames(clock, replicas, commitlog)
        #: Reports and control requests that failed their CRC (checked
        #: framing): damaged on the way, never counted as acks.
        self.checksum_failures = 0
        #: What a slave's ack moving (or an acking slave going) tells.
        self.ha = ha
        #: The master's epoch file (failover), which control sessions
        #: offer and answer EPOCHS from; C{None}: no epochs.
        self.epochs = epochs
        # Dropping the slaves of a damaged log (store_damaged), pending.
        self._halting: IDelayedCall | None = None

    def buildProtocol(self, addr: IAddress | None) -> MasterConnection:
        return MasterConnection(self, addr)

    def notify_appended(self, end: int | None = None) -> None:
        """
        Call after appending to the commit log (to C{end}, if known): the
        slaves are sent it as the early-frames policy says
        (L{rmqha.ha.replicas.EarlyFrames}).
        """
        self.early.appended(end)

    def acks_changed(self, connection: MasterConnection | None = None) -> None:
        """
        A slave acknowledged (C{connection}) or went away (none).
        """
        self.replicas.changed()
        ha = self.ha
        if ha is None:
            return
        if connection is not None and ha.in_sync is not None:
            node = self.counted_node(connection)
            if node is not None and connection.ack_offset is not None:
                ha.replica_acked(node, connection.ack_offset)
        ha.acks_changed()

    def counted_node(self, connection: MasterConnection) -> str | None:
        """
        Failover mode: the node C{connection}'s acks count for, if any
        (L{Replicas.counted_node}).
        """
        return self.replicas.counted_node(connection)

    def release_waiters(self) -> None:
        """
        Fire the puts the slaves' acks now cover (a connection calls this
        at the end of its C{dataReceived}).  What their callbacks append
        (a producer's next put) is sent to the slaves in one go as the
        last of them appends, or when they are done, still in this reactor
        turn (L{rmqha.ha.replicas.EarlyFrames.release}).
        """
        if self.ha is not None:
            self.early.release(self.ha.release)

    def replace_older(self, connection: MasterConnection) -> None:
        """
        C{connection} is replicating: drop any other connection of the
        same replica, so each replica counts once in the quorum.
        """
        self.replicas.replace_older(connection)

    def disconnect_all(self, why: str) -> None:
        """
        Drop every slave connection (the master is stopping).
        """
        for connection in list(self.connections):
            connection.drop("{reason}", reason=why)

    def slaves(self) -> list[SlaveStatus]:
        """
        The status of every connected slave.
        """
        return [c.status() for c in self.connections]

    def stopFactory(self) -> None:
        self.early.stop()
        if self._halting is not None and self._halting.active():
            self._halting.cancel()
        self._halting = None

    def store_damaged(self, damage: StoreDamagedError) -> None:
        """
        The commit log found a segment file changed under it (a
        L{CommitLog.observe_damage} observer): replication stops for every
        slave, on the reactor's next turn (this runs inside whatever found
        it, a put among them), each told why (checked framing); slaves
        connecting later are refused the same way (L{MasterConnection}).
        """
        if self._halting is None:
            self._halting = self.clock.callLater(0, self._halt_replication, str(damage))

    def _halt_replication(self, error: str) -> None:
        self._halting = None
        for connection in list(self.connections):
            connection.refuse("the master's commit log is damaged: {error}", error=error)

