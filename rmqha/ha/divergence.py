# -*- test-case-name: tests.test_divergence -*-
"""
Telling whether a slave's log has diverged from its master's, with the
rmqha control extension (docs/protocol.md).

L{probe} opens a control session on the master's HA port with a hello a
genuine RocketMQ master cannot tell from a slave that has not reported
yet: it waits, silently, and L{probe} gives C{None} (classic only) after
a short wait.  The master's INFO also says whether it offers checked
framing, and its segment size.  What the master turned out to be is kept
in the store (L{read_master_kind}, L{write_master_kind}), so a slave that
once saw the extension never takes a silent master for a RocketMQ one.
L{find_divergence} then compares: the slave is I{behind} when its log ends
before the master's oldest segment, I{different} when the bytes they both
hold differ (the tail window is compared by digests, then narrowed to the
first differing byte), and I{ahead} when it holds more than the master.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import deque
from dataclasses import dataclass
from typing import Any

from twisted.internet import defer
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import (
    IHandshakeListener,
    IReactorTime,
    IStreamClientEndpoint,
)
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.protocols.tls import TLSMemoryBIOProtocol
from twisted.python.failure import Failure
from zope.interface import implementer

from rmqha._files import write_atomically
from rmqha.ha._wire import (
    CONTROL_DIGEST_SIZE,
    CONTROL_HELLO,
    CONTROL_INFO,
    CONTROL_INFO_SIZE,
    CONTROL_MAX_DIGEST_RANGE,
    CONTROL_PROBE,
    CONTROL_REFUSED,
    FEATURE_CHECKED_FRAMING,
    NotControlError,
    ProtocolError,
    decode_control_info,
    decode_digest_answer,
    encode_code,
    encode_digest_request,
)
from rmqha.commitlog import CommitLog
from rmqha.tls import PLAIN_SLAVE_TLS_MASTER_HINT, describe_failure, looks_like_tls

__all__ = [
    "MasterInfo",
    "Divergence",
    "ControlClient",
    "CheckFailed",
    "MasterUnreachable",
    "probe",
    "read_master_kind",
    "write_master_kind",
    "find_divergence",
]

_INFO_CODE = encode_code(CONTROL_INFO)
_REFUSED_CODE = encode_code(CONTROL_REFUSED)

#: How much of the common tail is compared on every check.
TAIL_WINDOW = 64 * 1024 * 1024
#: Seconds to wait for one DIGEST answer (16 MiB hashed on the master).
DIGEST_TIMEOUT = 30.0
#: Where a slave's store remembers what its master is.
MASTER_KIND_PATH = os.path.join("rmqha", "master-kind.json")
#: Master kinds: speaks the rmqha extension, or a RocketMQ master.
MASTER_KINDS = ("rmqha", "rocketmq")


@dataclass(frozen=True)
class MasterInfo:
    min_offset: int
    max_offset: int
    segment_size: int
    #: Feature bits (C{FEATURE_CHECKED_FRAMING}).
    features: int = 0

    @property
    def checked_framing(self) -> bool:
        return bool(self.features & FEATURE_CHECKED_FRAMING)


@dataclass(frozen=True)
class Divergence:
    """
    What a check found.

    @ivar kind: C{"ahead"}, C{"behind"} or C{"different"}.
    @ivar slave_offset: where the slave's whole records end.
    @ivar master_offset: the master's max offset (its min offset for
        C{"behind"}).
    @ivar first_difference: for C{"different"}, the first byte that differs.
    @ivar truncate_to: where the slave may be cut back to to resume (the
        master's max offset when ahead, the start of the record holding the
        first difference when different); C{None} when behind.
    """

    kind: str
    slave_offset: int
    master_offset: int
    first_difference: int | None = None
    truncate_to: int | None = None

    def describe(self) -> str:
        if self.kind == "behind":
            return (
                f"the slave's log ends at {self.slave_offset}, before the master's oldest "
                f"segment at {self.master_offset}: it can never catch up"
            )
        if self.kind == "ahead":
            return (
                f"the slave holds bytes up to {self.slave_offset}, past the master's max "
                f"offset {self.master_offset}: the master lost data"
            )
        return (
            f"the slave's bytes differ from the master's at offset {self.first_difference} "
            f"(the record at {self.truncate_to})"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "slave_offset": self.slave_offset,
            "master_offset": self.master_offset,
            "first_difference": self.first_difference,
            "truncate_to": self.truncate_to,
        }


class CheckFailed(Exception):
    """
    A control session could not answer (master unreachable, connection
    lost, a damaged message): neither "rmqha" nor "classic"; try again.
    """


class MasterUnreachable(CheckFailed):
    """
    No connection to the master at all (refused, timed out, no route).
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

    def __init__(self, clock: IReactorTime | None = None, hello: int = CONTROL_PROBE) -> None:
        """
        @param clock: times DIGEST answers out after L{DIGEST_TIMEOUT}
            (C{None}: no timeout).
        @param hello: the first 8 bytes sent: C{CONTROL_PROBE}, or
            C{CONTROL_HELLO} for an older rmqha master that refuses the
            probe.
        """
        self.info: Deferred[MasterInfo] = Deferred()
        self.clock = clock
        self.hello = hello
        self._buffer = bytearray()
        self._waiting: deque[Deferred[bytes | None]] = deque()
        self._closed = False
        self._handshake_done = False
        #: Nothing received yet.
        self.silent = True

    def connectionMade(self) -> None:
        self.transport.write(encode_code(self.hello))  # type: ignore[union-attr]

    def handshakeCompleted(self) -> None:
        self._handshake_done = True

    def dataReceived(self, data: bytes) -> None:
        self.silent = False
        self._buffer += data
        try:
            if not self.info.called:
                if looks_like_tls(self._buffer) and not isinstance(
                    self.transport, TLSMemoryBIOProtocol
                ):
                    # A TLS server's alert about our plain bytes (7 bytes:
                    # look before 8 have come).
                    raise ProtocolError(PLAIN_SLAVE_TLS_MASTER_HINT)
                if len(self._buffer) < 8:
                    return
                head = bytes(self._buffer[:8])
                if head == _REFUSED_CODE:
                    # An rmqha master that did not recognise our hello (an
                    # older one, or damaged on the way): try again, not
                    # classic.
                    raise _Refused("the master did not recognise the control hello")
                if head != _INFO_CODE:
                    # Not an rmqha master (a genuine RocketMQ one sends
                    # nothing at all to the probe).
                    raise NotControlError("the master does not speak rmqha control")
                if len(self._buffer) < CONTROL_INFO_SIZE:
                    return
                info = decode_control_info(self._buffer)
                del self._buffer[:CONTROL_INFO_SIZE]
                self.info.callback(MasterInfo(*info))
            while len(self._buffer) >= CONTROL_DIGEST_SIZE and self._waiting:
                start, _, digest = decode_digest_answer(self._buffer)
                del self._buffer[:CONTROL_DIGEST_SIZE]
                self._waiting.popleft().callback(None if start < 0 else digest)
        except ProtocolError as e:
            self._fail(e)

    def _fail(self, error: Exception) -> None:
        if not self.info.called:
            self.info.errback(Failure(error))
        failure = Failure(CheckFailed(f"control session: {error}"))
        while self._waiting:
            self._waiting.popleft().errback(failure)
        self.close()

    def digest(self, start: int, end: int) -> Deferred[bytes | None]:
        """
        The master's digest of C{[start, end)} (at most 16 MiB), or C{None}
        when it refuses the range.

        @raise CheckFailed: (asynchronously) the session closed, a damaged
            answer, or none within L{DIGEST_TIMEOUT}.
        """
        d: Deferred[bytes | None] = Deferred()
        if self._closed:
            d.errback(CheckFailed("control session: closed"))
            return d
        self._waiting.append(d)
        self.transport.write(encode_digest_request(start, end))  # type: ignore[union-attr]
        if self.clock is not None:
            d.addTimeout(DIGEST_TIMEOUT, self.clock, onTimeoutCancel=self._timed_out)
        return d

    def _timed_out(self, result: object, timeout: float) -> Failure:
        self.close()
        return Failure(CheckFailed(f"control session: no DIGEST answer within {timeout} s"))

    def close(self) -> None:
        if not self._closed and self.transport is not None:
            self.transport.loseConnection()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._closed = True
        if self.silent and isinstance(self.transport, TLSMemoryBIOProtocol):
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
        while self._waiting:
            self._waiting.popleft().errback(failure)


async def probe(
    clock: IReactorTime,
    endpoint: IStreamClientEndpoint,
    timeout: float = 3.0,
    first_timeout: float | None = None,
    hello: int = CONTROL_PROBE,
) -> tuple[ControlClient, MasterInfo] | None:
    """
    A control session with the master, or C{None} when the master does not
    speak the extension: it answered the hello with something other than
    INFO, or sent nothing for C{first_timeout} seconds (default
    C{timeout}) while keeping the connection open (a RocketMQ master,
    waiting for a first report).

    An rmqha master answers the probe at once; one that refuses it (older
    than the probe) is asked again with C{CONTROL_HELLO}.

    @param timeout: the most seconds to wait for the whole INFO.
    @raise MasterUnreachable: no connection (the text says why).
    @raise CheckFailed: no answer either way (the text says why).
    """
    try:
        client = await endpoint.connect(Factory.forProtocol(lambda: ControlClient(clock, hello)))
    except Exception as e:
        raise MasterUnreachable(str(e).rstrip(".") or type(e).__name__) from e
    assert isinstance(client, ControlClient)
    client.info.addTimeout(timeout, clock)
    quiet: Any = None
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
        return await probe(clock, endpoint, timeout, first_timeout, CONTROL_HELLO)
    except CheckFailed:
        client.close()
        raise
    except (defer.TimeoutError, CancelledError):
        client.close()
        if client.silent:
            return None
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


def read_master_kind(store_dir: str, master: str) -> str | None:
    """
    What the store remembers its master at C{master} to be (C{"rmqha"} or
    C{"rocketmq"}), or C{None}: nothing remembered, another master, or an
    unreadable file (it is then rewritten at the next answer).
    """
    try:
        with open(os.path.join(store_dir, MASTER_KIND_PATH), encoding="utf-8") as f:
            saved = json.load(f)
        kind = saved["kind"]
        if saved["master"] == master and kind in MASTER_KINDS:
            return str(kind)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def write_master_kind(store_dir: str, master: str, kind: str, seen: float) -> None:
    """
    Remember that the master at C{master} is C{kind} (tmp file, fsync,
    rename: a crash leaves the old file or the new one).

    @raise OSError: it could not be written (the tmp file is removed).
    """
    write_atomically(
        os.path.join(store_dir, MASTER_KIND_PATH),
        lambda f: json.dump({"kind": kind, "master": master, "seen": seen}, f),
    )


def _local_digest(commitlog: CommitLog, start: int, end: int) -> bytes:
    digest = hashlib.blake2b(digest_size=16)
    position = start
    while position < end:
        chunk = commitlog.read(position, end - position)
        if not chunk:
            break
        digest.update(chunk)
        position += len(chunk)
    return digest.digest()


async def _same(client: ControlClient, commitlog: CommitLog, start: int, end: int) -> bool:
    position = start
    while position < end:
        step = min(end, position + CONTROL_MAX_DIGEST_RANGE)
        theirs = await client.digest(position, step)
        if theirs != _local_digest(commitlog, position, step):
            return False
        position = step
    return True


async def find_divergence(
    commitlog: CommitLog,
    client: ControlClient,
    info: MasterInfo,
    window: int = TAIL_WINDOW,
    slave_end: int | None = None,
) -> Divergence | None:
    """
    Compare this slave's log with the master's; C{None} when the tail
    window agrees and the slave is neither ahead nor behind.

    @param slave_end: where the slave's records ended before C{info} was
        obtained (default: now).
    """
    if not commitlog.has_data():
        return None
    slave_min = commitlog.min_offset
    if slave_end is None:
        slave_end = commitlog.record_end
    if slave_end < info.min_offset:
        return Divergence("behind", slave_end, info.min_offset)
    low = max(slave_min, info.min_offset)
    high = min(slave_end, info.max_offset)
    if high > low:
        start = max(low, high - window)
        if not await _same(client, commitlog, start, high):
            # [lo, hi) differs; step back a window at a time while the one
            # before differs too, so the first difference is in [lo, hi).
            lo, hi = start, high
            while lo > low and not await _same(client, commitlog, max(low, lo - window), lo):
                lo, hi = max(low, lo - window), lo
            # Bisect to one byte: [.., lo) agrees, the difference is in [lo, hi).
            while hi - lo > 1:
                middle = (lo + hi) // 2
                if await _same(client, commitlog, lo, middle):
                    lo = middle
                else:
                    hi = middle
            return Divergence(
                "different",
                slave_end,
                info.max_offset,
                lo,
                commitlog.record_start_at_or_before(lo),
            )
    if slave_end > info.max_offset:
        return Divergence("ahead", slave_end, info.max_offset, None, info.max_offset)
    return None
