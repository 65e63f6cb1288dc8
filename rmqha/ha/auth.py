# -*- test-case-name: tests.test_group_auth -*-
"""
Group authentication for failover (docs/failover.md, "Who counts"): how
the members of a group prove their node ids to each other on the HA port,
with no I/O and no Twisted.

Two modes (L{GroupAuth}):

  - B{a shared group secret}: every HA connection between members, each
    replication connection and each control session, starts with a mutual
    HMAC-SHA256 challenge-response (L{SlaveHandshake}, L{MasterHandshake};
    the messages are in L{rmqha.ha._wire}, their bytes in docs/protocol.md).
    Each side sends a fresh random nonce and proves it holds the secret
    with a MAC over both nonces, both node ids and the group's name, under
    a label of its own (so neither side's MAC is ever valid as the other's,
    and no message of one connection is valid in another);
  - B{TLS client certificates} that name the node ids: the TLS layer
    proves them (L{rmqha.tls}).

What the secret proves: that the peer is a member of the group, at the
handshake.  It binds no bytes after it: on plain TCP, an attacker on the
network path can still change the stream afterwards (TLS protects against
that), and any holder of the secret can claim any member's id (a
certificate names one node).
"""

from __future__ import annotations

import enum
import hmac
import os
import stat
from dataclasses import dataclass, field
from hashlib import sha256

from rmqha.ha._wire import (
    AUTH_ACCEPTED,
    AUTH_CHALLENGE,
    AUTH_NONCE_SIZE,
    AUTH_REFUSED,
    CONTROL_REFUSED,
    NOT_MASTER,
    ProtocolError,
    decode_auth_challenge,
    decode_auth_hello,
    decode_auth_proof,
    decode_not_master,
    encode_auth_challenge,
    encode_auth_hello,
    encode_auth_proof,
    encode_code,
)

__all__ = [
    "AuthError",
    "NotMasterAnswer",
    "GroupAuth",
    "HANDSHAKE_TIMEOUT",
    "MAX_SECRET_SIZE",
    "MIN_SECRET_SIZE",
    "MasterHandshake",
    "SlaveHandshake",
    "auth_mac",
    "load_group_secret",
]

#: Seconds either side of an HA connection gives the other to finish the
#: handshake (on the injected clock).
HANDSHAKE_TIMEOUT = 5.0
#: Bounds of a group secret, in bytes (surrounding whitespace stripped).
MIN_SECRET_SIZE = 16
MAX_SECRET_SIZE = 1024
#: The most bytes of a secret file read (the secret and whitespace).
_MAX_SECRET_FILE = 4096

#: Domain separation: a master's MAC and a slave's MAC are over different
#: labels, so neither can be replayed as the other.
_PROTOCOL = b"rmqha group auth v1"
MASTER_LABEL = b"master"
SLAVE_LABEL = b"slave"

_ACCEPTED = encode_code(AUTH_ACCEPTED)
_REFUSED = encode_code(AUTH_REFUSED)
_NOT_TAKEN = encode_code(CONTROL_REFUSED)
_CHALLENGE = encode_code(AUTH_CHALLENGE)
_NOT_MASTER = encode_code(NOT_MASTER)


class AuthError(ProtocolError):
    """
    The peer did not prove it is the group member it should be; the text
    says why, in one line.
    """


class NotMasterAnswer(AuthError):
    """
    The peer is a failover node that is not the master now: it answered
    the hello with C{NOT_MASTER} and its reason (the text).
    """


@dataclass(frozen=True)
class GroupAuth:
    """
    How this node proves its id and checks its peers' (failover mode).

    @ivar group: the group's name, bound into every MAC.
    @ivar node_id: this node's id.
    @ivar secret: the group's shared secret: every HA connection between
        members starts with the HMAC handshake.
    @ivar certificates: TLS client certificates are required and name the
        node ids (a master counts a replica whose verified certificate names
        the id it declares; a slave follows a master whose certificate
        names the elected node id).
    """

    group: str
    node_id: str
    secret: bytes | None = field(default=None, repr=False)
    certificates: bool = False

    def __post_init__(self) -> None:
        encode_auth_hello(self.node_id, bytes(AUTH_NONCE_SIZE))  # (the id rules)
        if not self.group:
            raise ValueError("group authentication needs the group's name")
        if self.secret is None and not self.certificates:
            raise ValueError(
                "group authentication needs a group secret or TLS client certificates"
            )
        if self.secret is not None and not MIN_SECRET_SIZE <= len(self.secret) <= MAX_SECRET_SIZE:
            raise ValueError(
                f"a group secret of {len(self.secret)} bytes; it must be "
                f"{MIN_SECRET_SIZE} to {MAX_SECRET_SIZE}"
            )

    @property
    def mode(self) -> str:
        """
        How ids are proven, for C{/status} and logs.
        """
        modes = []
        if self.secret is not None:
            modes.append("group secret")
        if self.certificates:
            modes.append("TLS client certificates")
        return " and ".join(modes)


def load_group_secret(path: str, what: str = "--group-secret-file") -> bytes:
    """
    The group secret in the file C{path}: its bytes, surrounding
    whitespace (a trailing newline) stripped.

    @param what: where the path came from, for messages.
    @raise ValueError: one line naming C{what} and the file: it cannot be
        read, is not a regular file, is readable or writable by others, or
        holds fewer than L{MIN_SECRET_SIZE} or more than L{MAX_SECRET_SIZE}
        bytes.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as e:
        raise ValueError(f"{what} {path}: {e.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{what} {path}: not a regular file")
        if info.st_mode & 0o006:
            raise ValueError(
                f"{what} {path}: readable or writable by others (mode "
                f"{stat.S_IMODE(info.st_mode):04o}); chmod 600 it (and replace the "
                "secret if others may have read it)"
            )
        # (Read one byte past the limit: a huge file is not read whole.)
        data = os.read(fd, _MAX_SECRET_FILE + 1)
    except OSError as e:
        raise ValueError(f"{what} {path}: {e.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > _MAX_SECRET_FILE:
        raise ValueError(
            f"{what} {path}: larger than {_MAX_SECRET_FILE} bytes; a group secret is "
            f"{MIN_SECRET_SIZE} to {MAX_SECRET_SIZE} bytes"
        )
    data = data.strip()
    if not MIN_SECRET_SIZE <= len(data) <= MAX_SECRET_SIZE:
        raise ValueError(
            f"{what} {path}: {len(data)} bytes of secret; it must hold "
            f"{MIN_SECRET_SIZE} to {MAX_SECRET_SIZE} (rmqha certs init --group writes one)"
        )
    return data


def auth_mac(
    secret: bytes,
    label: bytes,
    group: str,
    slave_nonce: bytes,
    master_nonce: bytes,
    slave_id: str,
    master_id: str,
) -> bytes:
    """
    HMAC-SHA256 under C{secret} of the protocol name, C{label} (whose MAC
    this is), the group, both nonces and both ids, each preceded by its
    length as a C{uint16} (docs/protocol.md gives an example).
    """
    transcript = b"".join(
        len(part).to_bytes(2, "big") + part
        for part in (
            _PROTOCOL,
            label,
            group.encode("utf-8"),
            slave_nonce,
            master_nonce,
            slave_id.encode("utf-8"),
            master_id.encode("utf-8"),
        )
    )
    return hmac.new(secret, transcript, sha256).digest()


class _Step(enum.Enum):
    #: Master: waiting for AUTH_HELLO; slave: for AUTH_CHALLENGE.
    FIRST = "first message"
    #: Master: waiting for AUTH_PROOF; slave: for the master's verdict.
    SECOND = "second message"
    DONE = "done"


class MasterHandshake:
    """
    The master's side of the handshake on one connection whose first bytes
    are an AUTH_HELLO: feed it what arrives, send what it returns; once
    L{done}, the slave's node id is L{slave_id} and L{rest} holds what the
    slave sent after its proof.  At most one message is buffered (301
    bytes before the hello is whole; one read while waiting for the 44
    bytes of the proof).
    """

    def __init__(self, auth: GroupAuth, nonce: bytes | None = None) -> None:
        """
        @param nonce: this side's nonce (default: 32 fresh random bytes;
            tests give their own).
        """
        if auth.secret is None:
            raise ValueError("the HMAC handshake needs the group secret")
        self._auth = auth
        self._secret = auth.secret
        self._nonce = os.urandom(AUTH_NONCE_SIZE) if nonce is None else nonce
        self._buffer = bytearray()
        self._step = _Step.FIRST
        self._slave_nonce = b""
        self._claimed = ""
        #: The slave's node id, proven (once L{done}).
        self.slave_id: str | None = None
        #: The bytes after the slave's proof (once L{done}).
        self.rest = b""

    @property
    def done(self) -> bool:
        return self._step is _Step.DONE

    @property
    def claimed_id(self) -> str | None:
        """
        The node id the slave's hello declares (not proven yet), if it came.
        """
        return self._claimed or None

    def feed(self, data: bytes) -> bytes:
        """
        Take received bytes.

        @return: what to send the slave now: the challenge once the hello
            is whole, C{AUTH_ACCEPTED} once the proof holds (or nothing).
        @raise AuthError: the slave's hello or proof does not hold (send
            C{AUTH_REFUSED} and close).
        @raise ProtocolError: a damaged or impossible message (close).
        """
        if self._step is _Step.DONE:
            raise RuntimeError("the handshake is over")
        self._buffer += data
        out = b""
        auth = self._auth
        if self._step is _Step.FIRST:
            found = decode_auth_hello(self._buffer)
            if found is None:
                return b""
            hello, used = found
            del self._buffer[:used]
            self._claimed = hello.node_id
            if hello.node_id == auth.node_id:
                raise AuthError(f"the peer declares this node's own id {hello.node_id}")
            self._slave_nonce = hello.nonce
            self._step = _Step.SECOND
            out = encode_auth_challenge(
                auth.node_id, self._nonce, self._mac(MASTER_LABEL)
            )
        found_proof = decode_auth_proof(self._buffer)
        if found_proof is None:
            return out
        mac, used = found_proof
        if not hmac.compare_digest(mac, self._mac(SLAVE_LABEL)):
            raise AuthError(
                f"the proof of node {self._claimed} does not hold (another group "
                "secret or group name, or a replayed message)"
            )
        self.slave_id = self._claimed
        self.rest = bytes(self._buffer[used:])
        self._buffer = bytearray()
        self._step = _Step.DONE
        return out + _ACCEPTED

    def _mac(self, label: bytes) -> bytes:
        return auth_mac(
            self._secret,
            label,
            self._auth.group,
            self._slave_nonce,
            self._nonce,
            self._claimed,
            self._auth.node_id,
        )


class SlaveHandshake:
    """
    The slave's side of the handshake on one connection: send L{hello}
    first; feed it what arrives.  Once the master's challenge holds (its
    MAC, and its id is the one expected), L{proof} is what to send, at
    once followed by what the slave sends first on that connection; once
    the master's verdict is here, L{done}, L{master_id} is the master's
    proven node id and L{rest} what came after the verdict.
    """

    def __init__(
        self, auth: GroupAuth, expected_master: str | None = None, nonce: bytes | None = None
    ) -> None:
        """
        @param expected_master: the node id the master must prove (the
            elected leader's), or C{None}: any other member.
        @param nonce: this side's nonce (default: 32 fresh random bytes).
        """
        if auth.secret is None:
            raise ValueError("the HMAC handshake needs the group secret")
        self._auth = auth
        self._secret = auth.secret
        self._expected = expected_master
        self._nonce = os.urandom(AUTH_NONCE_SIZE) if nonce is None else nonce
        self._buffer = bytearray()
        self._step = _Step.FIRST
        #: The master's node id, once its challenge holds.
        self.master_id: str | None = None
        #: The bytes to send once the challenge holds (then L{proved}).
        self.proof = b""
        #: The bytes after the master's verdict (once L{done}).
        self.rest = b""

    def hello(self) -> bytes:
        return encode_auth_hello(self._auth.node_id, self._nonce)

    @property
    def proved(self) -> bool:
        """
        The master's challenge holds: L{proof} is ready to be sent.
        """
        return self._step is not _Step.FIRST

    @property
    def done(self) -> bool:
        return self._step is _Step.DONE

    def feed(self, data: bytes) -> bool:
        """
        Take received bytes.

        @return: whether the master's challenge held with these bytes
            (send L{proof} now).
        @raise AuthError: the master refused this node, takes no group
            authentication, or its challenge does not hold.
        @raise ProtocolError: a damaged or impossible message.
        """
        if self._step is _Step.DONE:
            raise RuntimeError("the handshake is over")
        self._buffer += data
        proved_now = False
        if self._step is _Step.FIRST:
            if len(self._buffer) < 8:
                return False
            head = bytes(self._buffer[:8])
            if head == _REFUSED:
                raise AuthError("the master refused this node's hello (its log says why)")
            if head == _NOT_MASTER:
                found_not_master = decode_not_master(self._buffer)
                if found_not_master is None:
                    return False
                raise NotMasterAnswer(found_not_master[0])
            if head == _NOT_TAKEN:
                raise AuthError(
                    "the master does not take group authentication (it has no group "
                    "secret: an older rmqha, or started with --insecure-group)"
                )
            if head != _CHALLENGE:
                raise AuthError(
                    f"the master answered the group authentication hello with {head.hex()}, "
                    "not AUTH_CHALLENGE"
                )
            found = decode_auth_challenge(self._buffer)
            if found is None:
                return False
            challenge, used = found
            del self._buffer[:used]
            auth = self._auth
            mac = auth_mac(
                self._secret, MASTER_LABEL, auth.group, self._nonce, challenge.nonce,
                auth.node_id, challenge.node_id,
            )
            if not hmac.compare_digest(challenge.mac, mac):
                raise AuthError(
                    f"the master, declaring node id {challenge.node_id}, cannot prove it is a "
                    f"member of group {auth.group} (another group secret or group name, "
                    "or an impostor)"
                )
            if challenge.node_id == auth.node_id:
                raise AuthError(f"the master declares this node's own id {auth.node_id}")
            if self._expected is not None and challenge.node_id != self._expected:
                raise AuthError(
                    f"the master proved it is node {challenge.node_id}, not "
                    f"{self._expected}, the elected leader: not followed"
                )
            self.master_id = challenge.node_id
            self.proof = encode_auth_proof(
                auth_mac(
                    self._secret, SLAVE_LABEL, auth.group, self._nonce, challenge.nonce,
                    auth.node_id, challenge.node_id,
                )
            )
            self._step = _Step.SECOND
            proved_now = True
        if len(self._buffer) < 8:
            return proved_now
        verdict = bytes(self._buffer[:8])
        if verdict == _REFUSED:
            raise AuthError(
                "the master refused this node's proof (another group secret or group "
                "name? the master's log says why)"
            )
        if verdict != _ACCEPTED:
            raise AuthError(
                f"the master answered this node's proof with {verdict.hex()}, not AUTH_ACCEPTED"
            )
        self.rest = bytes(self._buffer[8:])
        self._buffer = bytearray()
        self._step = _Step.DONE
        return proved_now
