# -*- test-case-name: tests.test_divergence,tests.test_master,tests.test_slave_probe -*-
"""
The rmqha control extension (docs/protocol.md), both ends.

The slave's end: L{probe} opens a control session on the master's HA port
with a hello a genuine RocketMQ master cannot tell from a slave that has
not reported yet (it waits, silently, and L{probe} gives C{None}: classic
only); an rmqha master answers with its INFO (offsets, segment size,
features).  L{ControlClient.digest} then asks for the digest of a range,
L{ControlClient.epochs} for the master's epoch list (failover).

The master's end: L{ControlSession}, which a L{rmqha.ha.master.MasterConnection}
becomes when the peer's greeting is a control hello.  Issue 12's bounds
live here: one DIGEST at a time per session, hashed in a worker thread,
paced per peer host (L{PeerBudget}), reading paused while an answer is
pending or unread, and a bounded request buffer.

Both ends hash with the one L{range_digest}.
"""

from __future__ import annotations

import hashlib
import os
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol as TypingProtocol

from twisted.internet import defer
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import (
    IDelayedCall,
    IHandshakeListener,
    INegotiated,
    IProtocol,
    IReactorTime,
    IStreamClientEndpoint,
    ITransport,
)
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from rmqha.store._segments import segment_name
from rmqha.store.commitlog import CommitLog
from rmqha.store.errors import SegmentReadError
from rmqha.ha._wire import (
    CONTROL_DIGEST,
    CONTROL_DIGEST_SIZE,
    CONTROL_EPOCHS,
    CONTROL_HELLO,
    CONTROL_INFO,
    CONTROL_INFO_SIZE,
    CONTROL_MAX_DIGEST_RANGE,
    CONTROL_PROBE,
    CONTROL_REFUSED,
    CONTROL_REQUEST_SIZE,
    FEATURE_CHECKED_FRAMING,
    FEATURE_EPOCHS,
    FEATURE_GROUP_AUTH,
    FEATURE_IDENTIFY,
    NOT_MASTER,
    ChecksumError,
    EpochsAnswer,
    MasterClosing,
    NotControlError,
    ProtocolError,
    decode_closing,
    decode_control_info,
    decode_control_request,
    decode_digest_answer,
    decode_epochs_answer,
    decode_not_master,
    encode_closing,
    encode_code,
    encode_control_info,
    encode_digest_answer,
    encode_digest_request,
    encode_epochs_answer,
    encode_epochs_request,
    is_closing,
)
from rmqha.ha.auth import AuthError, GroupAuth, NotMasterAnswer, SlaveHandshake
from rmqha.tls import (
    PLAIN_SLAVE_TLS_MASTER_HINT,
    certificate_names,
    describe_failure,
    looks_like_tls,
)


class _Connection(TypingProtocol):
    """
    What a L{ControlSession} needs of the master's connection it serves
    (L{rmqha.ha.master.MasterConnection}; named structurally, so this
    module does not import the master's).
    """

    factory: Any
    transport: ITransport | None
    peer: str
    peer_host: str

    def drop(self, why: str, last_words: bytes | None = None, **fields: Any) -> None: ...

    def heard_from(self) -> None: ...

__all__ = [
    "MasterInfo",
    "ControlClient",
    "ControlSession",
    "AuthFailed",
    "CheckFailed",
    "MasterUnreachable",
    "PeerBudget",
    "probe",
    "SilentMaster",
    "range_digest",
    "read_range_digest",
    "log_digest",
    "DIGEST_TIMEOUT",
    "DIGEST_BYTES_PER_SECOND",
]

_INFO_CODE = encode_code(CONTROL_INFO)
_REFUSED_CODE = encode_code(CONTROL_REFUSED)
_NOT_MASTER_CODE = encode_code(NOT_MASTER)
#: Seconds to wait for one DIGEST answer (16 MiB hashed on the master).
DIGEST_TIMEOUT = 30.0
#: The features a master offers in its INFO (and FEATURE_EPOCHS when it
#: keeps an epoch file).
FEATURES = FEATURE_CHECKED_FRAMING | FEATURE_IDENTIFY

#: A DIGEST answer refusing the range.
_REFUSED_DIGEST = encode_digest_answer(-1, -1, bytes(16))
#: Control request bytes a session may hold unanswered: what one read
#: brings while reading is paused, with room to spare; more means a peer
#: that ignores back-pressure.
_CONTROL_BUFFER_LIMIT = 256 * 1024
#: Bytes hashed per second per peer address for DIGEST answers (and the
#: burst allowed): a slave's divergence check hashes at most 64 MiB.
DIGEST_BYTES_PER_SECOND = 64 * 1024 * 1024
#: The most bytes a worker thread reads at once while hashing.
_HASH_CHUNK = 1024 * 1024


def _digestible(commitlog: CommitLog, start: int, end: int) -> bool:
    """
    C{[start, end)} is a range a DIGEST request may ask for.
    """
    return (
        commitlog.min_offset <= start <= end <= commitlog.max_offset
        and end - start <= CONTROL_MAX_DIGEST_RANGE
    )


def range_digest(directory: str, segment_size: int, start: int, end: int) -> bytes | None:
    """
    The blake2b-128 digest of the commit log's bytes C{[start, end)}, read
    from the segment files with descriptors of its own (so the master can
    run it in a worker thread: the store's descriptors are opened and
    closed on the reactor thread).  C{None} when a file is gone or short
    (the log moved on).  The ONE digest both ends of a DIGEST compute.
    """
    try:
        return read_range_digest(directory, segment_size, start, end)
    except SegmentReadError:
        return None


def read_range_digest(directory: str, segment_size: int, start: int, end: int) -> bytes:
    """
    L{range_digest}, saying which file could not be read and why.

    @raise SegmentReadError: a segment file is missing, ends too early or
        cannot be read (the text names it).
    """
    digest = hashlib.blake2b(digest_size=16)
    position = start
    while position < end:
        segment = position - position % segment_size
        stop = min(end, segment + segment_size)
        path = os.path.join(directory, segment_name(segment))
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise SegmentReadError(path, "is missing") from None
        except OSError as e:
            raise SegmentReadError(path, f"cannot be opened: {e.strerror}") from None
        try:
            while position < stop:
                chunk = os.pread(fd, min(_HASH_CHUNK, stop - position), position - segment)
                if not chunk:
                    raise SegmentReadError(
                        path, f"ends at position {position - segment}, before {stop - segment}"
                    )
                digest.update(chunk)
                position += len(chunk)
        except OSError as e:
            raise SegmentReadError(
                path, f"cannot be read at position {position - segment}: {e.strerror}"
            ) from None
        finally:
            os.close(fd)
    return digest.digest()


def log_digest(commitlog: CommitLog, start: int, end: int) -> bytes | None:
    """
    L{range_digest} of C{commitlog}'s bytes C{[start, end)}.
    """
    return range_digest(commitlog.commitlog_dir, commitlog.segment_size, start, end)


class PeerBudget:
    """
    A token bucket per peer address: how many bytes of work (DIGEST
    hashing) each host may cause per second.  A request larger than what
    is left is not refused but scheduled: L{reserve} says how long to wait,
    and the debt makes the next request wait longer.  Hosts whose bucket
    is full again are forgotten, so the table holds only busy peers.
    """

    def __init__(self, clock: IReactorTime, rate: float, burst: float | None = None) -> None:
        if rate <= 0:
            raise ValueError(f"rate {rate} must be positive")
        self._clock = clock
        self.rate = rate
        self.burst = rate if burst is None else burst
        #: host -> (tokens, when): tokens may be negative (a debt).
        self._buckets: dict[str, tuple[float, float]] = {}

    def reserve(self, host: str, amount: float) -> float:
        """
        Charge C{amount} to C{host}: the seconds to wait before doing it.
        """
        now = self._clock.seconds()
        tokens, then = self._buckets.get(host, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.rate) - amount
        self._buckets[host] = (tokens, now)
        if len(self._buckets) > 1024:
            self._forget_idle(now)
        return 0.0 if tokens >= 0 else -tokens / self.rate

    def _forget_idle(self, now: float) -> None:
        for host, (tokens, then) in list(self._buckets.items()):
            if tokens + (now - then) * self.rate >= self.burst:
                del self._buckets[host]


@dataclass(frozen=True)
class MasterInfo:
    min_offset: int
    max_offset: int
    segment_size: int
    #: Feature bits (C{FEATURE_CHECKED_FRAMING}).
    features: int = 0
    #: The node ids the master proved on this session: the one its group
    #: authentication proved, or (TLS client certificates) the names its
    #: verified certificate carries (both: those two agreeing); empty
    #: when it proved none.
    node_ids: frozenset[str] = frozenset()

    @property
    def checked_framing(self) -> bool:
        return bool(self.features & FEATURE_CHECKED_FRAMING)

    @property
    def epochs(self) -> bool:
        """
        The master keeps an epoch file and answers EPOCHS.
        """
        return bool(self.features & FEATURE_EPOCHS)



class CheckFailed(Exception):
    """
    A control session could not answer (master unreachable, connection
    lost, a damaged message): neither "rmqha" nor "classic"; try again.
    """


class MasterUnreachable(CheckFailed):
    """
    No connection to the master at all (refused, timed out, no route).
    """


class NotTheMaster(CheckFailed):
    """
    The peer is a failover node that is not the master now (it answered
    C{NOT_MASTER}, with its reason).
    """


class AuthFailed(CheckFailed):
    """
    The master did not prove it is the group member it must be, or refused
    this node's proof (group authentication, L{rmqha.ha.auth}).
    """


class _Refused(ProtocolError):
    """
    An rmqha master answered the hello with CONTROL_REFUSED.
    """


@implementer(IHandshakeListener)
class ControlClient(Protocol):
    """
    The slave's end of a control session.

    @ivar info: fires with the master's L{MasterInfo}; fails with
        L{NotControlError} for a classic master.
    """

    def __init__(
        self,
        clock: IReactorTime | None = None,
        hello: int = CONTROL_PROBE,
        auth: GroupAuth | None = None,
        expected_master: str | None = None,
    ) -> None:
        """
        @param clock: times DIGEST answers out after L{DIGEST_TIMEOUT}
            (C{None}: no timeout).
        @param hello: the first 8 bytes sent: C{CONTROL_PROBE}, or
            C{CONTROL_HELLO} for an older rmqha master that refuses the
            probe.
        @param auth: failover: how the master must prove its node id;
            with a group secret the session starts with the handshake
            (L{SlaveHandshake}), and the hello follows this node's proof.
        @param expected_master: the node id the master must prove (the
            elected leader's), or C{None}: any other member.
        """
        self.info: Deferred[MasterInfo] = Deferred()
        self.clock = clock
        self.hello = hello
        self._auth = auth
        self._handshake = (
            SlaveHandshake(auth, expected_master)
            if auth is not None and auth.secret is not None
            else None
        )
        # The first bytes received, while they may be a TLS record.
        self._early = b""
        self._buffer = bytearray()
        #: Answers awaited, in request order: the request's code and who
        #: waits (C{None}: withdrawn).
        self._waiting: deque[tuple[int, Deferred[Any] | None]] = deque()
        self._closed = False
        self._handshake_done = False
        #: Nothing received yet.
        self.silent = True
        #: The protocol this connection was handed over to (L{hand_over}):
        #: it gets everything the transport delivers from then on.
        self._successor: IProtocol | None = None

    def connectionMade(self) -> None:
        if self._handshake is not None:
            self.transport.write(self._handshake.hello())  # type: ignore[union-attr]
        else:
            self.transport.write(encode_code(self.hello))  # type: ignore[union-attr]

    def handshakeCompleted(self) -> None:
        self._handshake_done = True
        if self._successor is not None:
            # (ClientService's proxy forwards it to the slave connection.)
            completed = getattr(self._successor, "handshakeCompleted", None)
            if completed is not None:
                completed()

    @property
    def tls_handshake_done(self) -> bool:
        """
        The TLS handshake of this connection finished (C{False} on plain
        TCP).
        """
        return self._handshake_done

    @property
    def reusable(self) -> bool:
        """
        The master has sent nothing on this probe and the connection is
        open: a RocketMQ master is still waiting for this slave's first
        real report (L{hand_over}).
        """
        return (
            self.silent
            and not self._closed
            and self._successor is None
            and self.transport is not None
            and not getattr(self.transport, "disconnecting", False)
        )

    def hand_over(self, protocol: IProtocol) -> None:
        """
        Make C{protocol} the owner of this connection: it is connected to
        this transport now (C{makeConnection}) and gets whatever the
        transport delivers from then on, its end included.  A RocketMQ
        master took the probe's -1 for "no report yet" and waits, so the
        next 8 bytes sent are taken as the slave's request offset: the
        slave goes on as a classic slave on the probe's own connection,
        and the master sees no connection closed unanswered.

        @raise RuntimeError: the connection is not L{reusable}.
        """
        if not self.reusable:
            raise RuntimeError("the probe connection cannot be handed over")
        self._successor = protocol
        protocol.makeConnection(self.transport)  # type: ignore[arg-type]

    @property
    def authenticating(self) -> bool:
        """
        The group authentication handshake has not finished yet.
        """
        return self._handshake is not None and not self._handshake.done

    def _authenticate(self, data: bytes) -> bytes:
        """
        Feed the handshake: send the proof and the hello once the master's
        challenge holds; the bytes after the master's verdict once it is
        over (C{b""} until then).

        @raise ProtocolError: a TLS answer to plain bytes.
        @raise AuthError: the master did not prove its id, or refused ours.
        """
        handshake = self._handshake
        assert handshake is not None
        if not handshake.proved and not INegotiated.providedBy(self.transport):
            self._early = (self._early + data)[:2]
            if looks_like_tls(self._early):
                raise ProtocolError(PLAIN_SLAVE_TLS_MASTER_HINT)
        if handshake.feed(data):
            self.transport.write(  # type: ignore[union-attr]
                handshake.proof + encode_code(self.hello)
            )
        return handshake.rest if handshake.done else b""

    def _proven_ids(self) -> frozenset[str]:
        """
        See L{MasterInfo.node_ids}.
        """
        ids: set[str] | None = None
        if self._handshake is not None and self._handshake.master_id is not None:
            ids = {self._handshake.master_id}
        if INegotiated.providedBy(self.transport) and (
            self._auth is None or self._auth.certificates
        ):
            x509: Any = self.transport.getPeerCertificate()
            names = set(certificate_names(x509.to_cryptography())) if x509 is not None else set()
            ids = names if ids is None else ids & names
        return frozenset(ids or ())

    def dataReceived(self, data: bytes) -> None:
        if self._successor is not None:
            self._successor.dataReceived(data)
            return
        self.silent = False
        try:
            if self.authenticating:
                data = self._authenticate(data)
                if not data:
                    return
            self._buffer += data
            if not self.info.called:
                if looks_like_tls(self._buffer) and not INegotiated.providedBy(self.transport):
                    # A TLS server's alert about our plain bytes (7 bytes:
                    # look before 8 have come).
                    raise ProtocolError(PLAIN_SLAVE_TLS_MASTER_HINT)
                if len(self._buffer) < 8:
                    return
                head = bytes(self._buffer[:8])
                if self._closing():
                    return
                if head == _REFUSED_CODE:
                    # An rmqha master that did not recognise our hello (an
                    # older one, or damaged on the way): try again, not
                    # classic.
                    raise _Refused("the master did not recognise the control hello")
                if head == _NOT_MASTER_CODE:
                    found = decode_not_master(self._buffer)
                    if found is not None:
                        self._buffer.clear()
                        self._fail(NotTheMaster(found[0]))
                    return
                if head != _INFO_CODE:
                    # Not an rmqha master (a genuine RocketMQ one sends
                    # nothing at all to the probe).
                    raise NotControlError("the master does not speak rmqha control")
                if len(self._buffer) < CONTROL_INFO_SIZE:
                    return
                info = decode_control_info(self._buffer)
                del self._buffer[:CONTROL_INFO_SIZE]
                self.info.callback(MasterInfo(*info, node_ids=self._proven_ids()))
            while self._waiting:
                code, waiter = self._waiting[0]
                answer: object
                if self._closing():
                    break
                if code == CONTROL_EPOCHS:
                    decoded = decode_epochs_answer(self._buffer)
                    if decoded is None:
                        break
                    answer, size = decoded
                else:
                    if len(self._buffer) < CONTROL_DIGEST_SIZE:
                        break
                    start, _, digest = decode_digest_answer(self._buffer)
                    answer, size = (None if start < 0 else digest), CONTROL_DIGEST_SIZE
                del self._buffer[:size]
                self._waiting.popleft()
                if waiter is not None:
                    waiter.callback(answer)
            if not self._waiting and self._buffer and not self._closing():
                raise ProtocolError(
                    f"the master sent {len(self._buffer)} bytes nobody asked for"
                )
        except ProtocolError as e:
            self._fail(e)

    def _closing(self) -> bool:
        """
        Whether the next bytes are the master's CLOSING (its last words:
        its log is damaged, or cannot be read for a DIGEST) still arriving.

        @raise MasterClosing: it is whole: the text says why.
        """
        if len(self._buffer) < 8 or not is_closing(self._buffer):
            return False
        found = decode_closing(self._buffer)
        if found is None:
            return True
        raise MasterClosing(found[0])

    def _fail(self, error: Exception) -> None:
        if not self.info.called:
            self.info.errback(Failure(error))
        failure = Failure(CheckFailed(f"control session: {error}"))
        self._fail_waiters(failure)
        self.close()

    def _fail_waiters(self, failure: Failure) -> None:
        while self._waiting:
            _, waiter = self._waiting.popleft()
            if waiter is not None:
                waiter.errback(failure)

    def _ask(self, code: int, request: bytes, what: str) -> Deferred[Any]:
        """
        Send C{request}; the answer (to the request with C{code}) fires
        the result, after L{DIGEST_TIMEOUT} at most.
        """

        def withdraw(d: Deferred[Any]) -> None:
            # Answers come in order: the slot stays, its answer is skipped.
            for i, (kind, waiting) in enumerate(self._waiting):
                if waiting is d:
                    self._waiting[i] = (kind, None)
                    break

        d: Deferred[Any] = Deferred(withdraw)
        if self._closed:
            d.errback(CheckFailed("control session: closed"))
            return d
        self._waiting.append((code, d))
        self.transport.write(request)  # type: ignore[union-attr]
        if self.clock is not None:

            def timed_out(result: object, timeout: float) -> Failure:
                self.close()
                return Failure(
                    CheckFailed(f"control session: no {what} answer within {timeout} s")
                )

            d.addTimeout(DIGEST_TIMEOUT, self.clock, onTimeoutCancel=timed_out)
        return d

    def digest(self, start: int, end: int) -> Deferred[bytes | None]:
        """
        The master's digest of C{[start, end)} (at most 16 MiB), or C{None}
        when it refuses the range.

        @raise CheckFailed: (asynchronously) the session closed, a damaged
            answer, or none within L{DIGEST_TIMEOUT}.
        """

        return self._ask(CONTROL_DIGEST, encode_digest_request(start, end), "DIGEST")

    def epochs(self) -> Deferred[EpochsAnswer]:
        """
        The master's current epoch, max offset and epoch list (ask only a
        master whose INFO offered C{FEATURE_EPOCHS}).

        @raise CheckFailed: (asynchronously) the session closed, a damaged
            or impossible answer, or none within L{DIGEST_TIMEOUT}.
        """
        return self._ask(CONTROL_EPOCHS, encode_epochs_request(), "EPOCHS")

    def close(self) -> None:
        if not self._closed and self.transport is not None:
            self.transport.loseConnection()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._closed = True
        if self._successor is not None:
            self._successor.connectionLost(reason)
            return
        if self.silent and INegotiated.providedBy(self.transport):
            why = "TLS connection to the master failed: " + describe_failure(
                reason, self.transport, self._handshake_done
            )
        elif self.silent:
            # Neither an rmqha master (it answers) nor a RocketMQ one (it
            # waits) closes a probe unanswered; a TLS server reading plain
            # bytes does (OpenSSL sends no alert first).
            why = (
                f"the master closed the connection without answering "
                f"({reason.getErrorMessage().rstrip('.')}): if it serves TLS, "
                "give this slave --tls-ca with the master's CA (docs/tls.md)"
            )
        else:
            why = f"control session lost: {reason.getErrorMessage()}"
        failure = Failure(CheckFailed(why))
        if not self.info.called:
            self.info.errback(failure)
        self._fail_waiters(failure)


@dataclass(frozen=True)
class SilentMaster:
    """
    L{probe}'s verdict on a master that sent nothing to the probe within
    its first timeout, the connection kept open (C{keep=True}): a RocketMQ
    master, waiting for this slave's first real report.  C{client}'s
    connection is L{ControlClient.reusable}: hand it over to the
    replication connection (L{ControlClient.hand_over}), or close it.
    """

    client: ControlClient


async def probe(
    clock: IReactorTime,
    endpoint: IStreamClientEndpoint,
    timeout: float = 3.0,
    first_timeout: float | None = None,
    hello: int = CONTROL_PROBE,
    auth: GroupAuth | None = None,
    expected_master: str | None = None,
    keep: bool = False,
) -> tuple[ControlClient, MasterInfo] | SilentMaster | None:
    """
    A control session with the master, or C{None} when the master does not
    speak the extension: it answered the hello with something other than
    INFO, or sent nothing for C{first_timeout} seconds (default
    C{timeout}) while keeping the connection open (a RocketMQ master,
    waiting for a first report).  With C{keep}, that silence gives a
    L{SilentMaster} holding the connection, open, instead of C{None}: a
    RocketMQ master then never sees a connection closed unanswered (it
    logs two ERROR lines for each).

    An rmqha master answers the probe at once; one that refuses it (older
    than the probe) is asked again with C{CONTROL_HELLO}.

    @param timeout: the most seconds to wait for the whole INFO (and the
        group authentication before it).
    @param auth: failover: how the master must prove its node id (with a
        group secret: the handshake first, see L{ControlClient}).
    @param expected_master: the node id it must prove, if one.
    @raise MasterUnreachable: no connection (the text says why).
    @raise AuthFailed: the master did not prove its id, or refused ours.
    @raise CheckFailed: no answer either way (the text says why).
    """
    try:
        client = await endpoint.connect(
            Factory.forProtocol(lambda: ControlClient(clock, hello, auth, expected_master))
        )
    except Exception as e:
        raise MasterUnreachable(str(e).rstrip(".") or type(e).__name__) from e
    assert isinstance(client, ControlClient)
    client.info.addTimeout(timeout, clock)
    quiet: IDelayedCall | None = None
    if first_timeout is not None and first_timeout < timeout:

        def give_up_if_silent() -> None:
            if client.silent:
                client.info.cancel()

        quiet = clock.callLater(first_timeout, give_up_if_silent)
    try:
        info = await client.info
    except NotControlError:
        return None
    except _Refused:
        if hello == CONTROL_HELLO:
            raise CheckFailed("control session: the master refused the control hello") from None
        return await probe(
            clock, endpoint, timeout, first_timeout, CONTROL_HELLO, auth, expected_master, keep
        )
    except NotMasterAnswer as e:
        client.close()
        raise NotTheMaster(str(e)) from None
    except AuthError as e:
        client.close()
        raise AuthFailed(f"group authentication: {e}") from None
    except CheckFailed:
        client.close()
        raise
    except (defer.TimeoutError, CancelledError):
        if keep and client.reusable:
            return SilentMaster(client)
        client.close()
        if client.silent:
            return None
        if client.authenticating:
            raise AuthFailed(
                f"group authentication: the master did not finish it within {timeout} s"
            ) from None
        raise CheckFailed(f"no whole control INFO within {timeout} s") from None
    except ProtocolError as e:
        client.close()
        raise CheckFailed(str(e)) from e
    except Exception as e:
        client.close()
        raise CheckFailed(f"control session failed: {e}") from e
    finally:
        if quiet is not None and quiet.active():
            quiet.cancel()
    return client, info




class ControlSession:
    """
    The master's end of one control session, on the transport of the
    L{MasterConnection} whose peer sent a control hello.  The connection
    stays the transport's producer and forwards C{pause}/C{resume} here:
    a peer that does not read its answers pauses the session, and a paused
    session stops reading requests.
    """

    _log = Logger()

    def __init__(self, connection: _Connection, paused: bool = False, trusted: bool = True) -> None:
        """
        @param trusted: the peer may ask for digests and epochs; C{False}
            (a master requiring group authentication, a peer that did not
            complete it): INFO is answered (its C{FEATURE_GROUP_AUTH} tells
            the peer why), and the first request closes the session.
        """
        self.connection = connection
        self.trusted = trusted
        self.factory = connection.factory
        self._requests = bytearray()
        # A DIGEST is outstanding (waiting for its budget or being
        # hashed); the timer of the wait; reading from the peer.
        self._digesting = False
        self._digest_wait: IDelayedCall | None = None
        self._reading_on = True
        self._paused = paused
        self._open = True

    def start(self, rest: bytes) -> None:
        """
        Answer the hello with INFO, then serve C{rest} (what came after it).
        """
        commitlog = self.factory.commitlog
        features = FEATURES | (FEATURE_EPOCHS if self.factory.epochs is not None else 0)
        auth = self.factory.auth
        if auth is not None and auth.secret is not None:
            features |= FEATURE_GROUP_AUTH
        self.connection.transport.write(  # type: ignore[union-attr]
            encode_control_info(
                commitlog.min_offset, commitlog.max_offset, commitlog.segment_size, features
            )
        )
        damage = commitlog.damage
        if damage is not None:
            # (INFO first: the slave knows it speaks to an rmqha master.)
            self._close_telling("the master's commit log is damaged: {error}", error=str(damage))
            return
        self.feed(rest)

    def _close_telling(self, why: str, **fields: Any) -> None:
        """
        End the session with one line (C{why} over C{fields}), telling the
        slave why first (CLOSING).
        """
        self._open = False
        self.connection.drop(
            "control session: " + why, last_words=encode_closing(why.format(**fields)), **fields
        )

    def feed(self, data: bytes) -> None:
        self._requests += data
        if len(self._requests) > _CONTROL_BUFFER_LIMIT:
            self.connection.drop(
                "control session: {waiting} bytes of requests waiting "
                "(the limit is {limit}); the peer does not wait for answers",
                waiting=len(self._requests),
                limit=_CONTROL_BUFFER_LIMIT,
            )
            return
        self._serve()

    def pause(self) -> None:
        self._paused = True
        self._reading(False)

    def resume(self) -> None:
        self._paused = False
        self._serve()

    def stop(self) -> None:
        """
        The connection is gone: forget the wait for the budget.
        """
        self._open = False
        self._paused = True
        if self._digest_wait is not None and self._digest_wait.active():
            self._digest_wait.cancel()
        self._digest_wait = None

    def _serve(self) -> None:
        """
        Answer the buffered requests while the peer reads answers (not
        paused) and no digest is outstanding: one DIGEST at a time, hashed
        off the reactor thread, paced per peer host by
        L{MasterFactory.digest_budget}.  Reading stops whenever requests
        cannot be served.
        """
        connection = self.connection
        while (
            self._open
            and not self._paused
            and not self._digesting
            and len(self._requests) >= CONTROL_REQUEST_SIZE
        ):
            if not self.trusted:
                connection.drop(
                    "control session: a request from a peer that did not prove its "
                    "node id (this master requires group authentication)"
                )
                return
            try:
                code, start, end = decode_control_request(self._requests)
            except ProtocolError as e:
                if isinstance(e, ChecksumError):
                    self.factory.checksum_failures += 1
                connection.drop("control session: {error}", error=str(e))
                return
            del self._requests[:CONTROL_REQUEST_SIZE]
            if code == CONTROL_EPOCHS:
                epochs = self.factory.epochs
                if epochs is None:
                    connection.drop("control session: EPOCHS asked of a master without epochs")
                    return
                # Cheap (at most MAX_EPOCH_ENTRIES, in memory): inline, in order.
                connection.transport.write(  # type: ignore[union-attr]
                    encode_epochs_answer(
                        epochs.last_epoch, self.factory.commitlog.max_offset, epochs.entries
                    )
                )
                continue
            if not _digestible(self.factory.commitlog, start, end):
                # Cheap to refuse: answered inline, in order.
                connection.transport.write(_REFUSED_DIGEST)  # type: ignore[union-attr]
                continue
            self._digesting = True
            delay = self.factory.digest_budget.reserve(connection.peer_host, end - start)
            if delay > 0:
                self._digest_wait = self.factory.clock.callLater(delay, self._hash, start, end)
            else:
                self._hash(start, end)
        if self._open:
            self._reading(not self._paused and not self._digesting)

    def _reading(self, on: bool) -> None:
        """
        Read from the peer or stop reading (the transport as a producer of
        received bytes); idempotent.
        """
        transport = self.connection.transport
        if on == self._reading_on or transport is None:
            return
        self._reading_on = on
        if on:
            transport.resumeProducing()  # type: ignore[attr-defined]
        else:
            transport.pauseProducing()  # type: ignore[attr-defined]

    def _hash(self, start: int, end: int) -> None:
        """
        Hash C{[start, end)} in a worker thread; answer when it is done.
        """
        self._digest_wait = None
        if not self._open:
            return
        commitlog = self.factory.commitlog
        if not _digestible(commitlog, start, end):
            self._digested(None, start, end)
            return
        directory, size = commitlog.commitlog_dir, commitlog.segment_size
        d = self.factory.run_in_thread(lambda: read_range_digest(directory, size, start, end))
        d.addErrback(self._hash_failed, start, end)
        d.addCallback(self._digested, start, end)

    def _hash_failed(self, failure: Failure, start: int, end: int) -> None:
        if failure.check(SegmentReadError) and self._open:
            commitlog = self.factory.commitlog
            # A file the log holds changed: the store refuses writes too.
            commitlog.check()
            if _digestible(commitlog, start, end):
                # The log holds those bytes and they cannot be read: not a
                # refusal (which the slave would take for different bytes).
                self._close_telling(
                    "cannot read the commit log in [{start}, {end}): {error}",
                    start=start,
                    end=end,
                    error=failure.getErrorMessage(),
                )
            return None  # (the log moved on: refused, below)
        self._log.failure(
            "hashing [{start}, {end}) for {peer}",
            failure,
            start=start,
            end=end,
            peer=self.connection.peer,
        )
        return None

    def _digested(self, digest: bytes | None, start: int, end: int) -> None:
        if not self._open:
            return
        self._digesting = False
        # The peer waited for us: its silence counts from this answer.
        self.connection.heard_from()
        # Read through the files while the log went on: the range must
        # still be in the log (not cut off by a deleted segment) for the
        # bytes hashed to be the log's.
        if digest is None or not _digestible(self.factory.commitlog, start, end):
            answer = _REFUSED_DIGEST
        else:
            answer = encode_digest_answer(start, end, digest)
        self.connection.transport.write(answer)  # type: ignore[union-attr]
        self._serve()
