# -*- test-case-name: tests.test_etcd -*-
"""
L{IDCS} on etcd v3, through its JSON gateway (etcd 3.4's C{/v3/*} routes),
with L{twisted.web.client.Agent}: no gRPC, no new dependency.

C{--coordinator etcd:http://H:P[,http://H:P…]} (L{parse_coordinator});
C{https://} endpoints take C{tlsCa=PATH} (else the platform's trust
store), C{tlsCert=PATH} and C{tlsKey=PATH} (a client certificate) as
further comma-separated items; C{user=NAME} with C{passwordFile=PATH} (or
C{RMQHA_ETCD_PASSWORD} in the environment) authenticates to etcd's auth.

How it talks to etcd (docs/failover.md, "The coordinator: etcd"):

    - Unary calls are POSTs on one persistent connection pool, each with
      a deadline (L{DEFAULT_TIMEOUT}, below the shortest lease TTL).
      Within it, a call moves to the next endpoint when one cannot be
      reached or answers 5xx: a write only when it surely was not applied
      (connection refused, 502/503/504), a read or a keepalive on any
      failure.  A call that ran out of time is never repeated.
    - Every answer is bounded (L{MAX_BODY}), must be one JSON object, and
      its C{header.raft_term} must not go below one already seen (a stale
      member, as Patroni checks), nor its C{cluster_id} change.
    - Leases: keepalive is one POST whose streamed answer's first line is
      read; no C{TTL} in it means the lease is gone (L{LeaseLost}), as is
      a put on a dead lease (404, code 5).
    - With a user, every request carries the token from
      C{/v3/auth/authenticate} in its C{Authorization} header (one
      authentication at a time, shared by the calls waiting for it, within
      their deadlines).  A token etcd no longer takes (expired, revoked,
      auth re-enabled) is replaced and the request sent again once: etcd
      refused it before applying anything.  A refused authentication (a
      wrong password) fails calls at once for L{AUTH_RETRY} seconds.
    - A watch is its own connection, a streamed POST with
      C{Grpc-Metadata-hasleader: true} (without it a member that lost
      quorum keeps the stream open and silent forever), split into lines
      of at most L{MAX_LINE} bytes; on any failure it reports and restarts
      after a back-off from 0.1 s doubling to 1 s.

The gateway's JSON: keys and values base64, int64 fields as strings,
false/zero fields omitted, a failed transaction has no C{succeeded}.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

from twisted.internet import error as ierror
from twisted.internet import ssl
from twisted.internet.defer import CancelledError, Deferred, fail, succeed
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import client
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import (
    UNKNOWN_LENGTH,
    IAgentEndpointFactory,
    IBodyProducer,
    IPolicyForHTTPS,
    IResponse,
)
from zope.interface import implementer

from rmqha.coord.dcs import (
    ROOT,
    ClusterView,
    DCSError,
    IDCS,
    InSync,
    IWatch,
    Leader,
    Lease,
    LeaseLost,
    Member,
    StoredKey,
    Switchover,
    encode,
    group_names,
    in_sync_members,
    read_group,
)
from rmqha.tls import TLSError, TLSFiles

__all__ = [
    "AUTH_RETRY",
    "DEFAULT_TIMEOUT",
    "PASSWORD_ENV",
    "MAX_BODY",
    "MAX_LINE",
    "CoordinatorSpec",
    "EtcdDCS",
    "parse_coordinator",
    "prefix_range",
    "read_credentials",
]

#: Seconds a unary call may take, every try included: below the 2 s
#: minimum lease TTL, so a failed renewal is known while the lease lives.
DEFAULT_TIMEOUT = 1.0
#: The largest answer read from etcd (a bogus server must not exhaust
#: memory); a group's whole prefix is a few KiB.
MAX_BODY = 4 * 1024 * 1024
#: The longest line of a streamed answer (watch, keepalive).
MAX_LINE = 1024 * 1024
#: A restarting watch waits this long first, doubling up to L{WATCH_BACKOFF_MAX}.
WATCH_BACKOFF = 0.1
WATCH_BACKOFF_MAX = 1.0

#: After etcd refused this client's user or password, calls fail at once
#: for this many seconds before authenticating again (no storm of
#: password checks, which etcd makes expensive on purpose).
AUTH_RETRY = 1.0
#: The environment variable holding the password when the spec has no
#: C{passwordFile=}.
PASSWORD_ENV = "RMQHA_ETCD_PASSWORD"
#: The longest password read (etcd's own limit is far above any real one).
MAX_PASSWORD = 1024
#: The longest token accepted from etcd (a JWT is a few hundred bytes).
MAX_TOKEN = 8192

_TLS_OPTIONS = {"tlsCa": "ca", "tlsCert": "cert", "tlsKey": "key"}
_OPTIONS = (*_TLS_OPTIONS, "user", "passwordFile")
_AUTH_PATH = "/v3/auth/authenticate"


# -- The coordinator spec -------------------------------------------------


@dataclass(frozen=True)
class CoordinatorSpec:
    """
    A parsed C{--coordinator}: the kind of service and its endpoints
    (C{scheme://host:port}, no credentials), with the TLS files for
    C{https://} ones (C{tls.ca} None: the platform's trust store).
    """

    kind: str
    endpoints: tuple[str, ...]
    tls: TLSFiles | None = None
    #: etcd's user name (C{user=}); its password comes from
    #: C{password_file} or the environment (L{read_credentials}).
    user: str | None = None
    password_file: str | None = None

    def __str__(self) -> str:
        # (No user, no file: this is what messages and /status show.)
        return f"{self.kind}:{','.join(self.endpoints)}"


def parse_coordinator(
    spec: str,
    tls_ca: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    user: str | None = None,
    password_file: str | None = None,
) -> CoordinatorSpec:
    """
    C{etcd:URL[,URL…][,tlsCa=PATH][,tlsCert=PATH][,tlsKey=PATH][,user=NAME]
    [,passwordFile=PATH]}, each URL C{http://host:port} or
    C{https://host:port} (all the same scheme); the keyword arguments give
    the options too (the spec's win).  Nothing is read here: the files are
    read when the client is made.

    @raise ValueError: one line naming what is wrong (credentials in a
        URL, or a password given as an option, are never repeated).
    """
    kind, sep, rest = spec.partition(":")
    if not sep or kind != "etcd":
        raise ValueError(
            f"--coordinator {_shown(spec)}: expected etcd:http://HOST:PORT[,http://HOST:PORT...]"
        )
    files = {"ca": tls_ca, "cert": tls_cert, "key": tls_key}
    endpoints: list[str] = []
    for item in rest.split(","):
        item = item.strip()
        if not item:
            continue
        name, eq, value = item.partition("=")
        if eq and "://" not in name:
            if name.lower() == "password":
                raise ValueError(
                    "--coordinator: a password is never given in the spec: use "
                    f"passwordFile=PATH or {PASSWORD_ENV} in the environment"
                )
            if name not in _OPTIONS or not value:
                raise ValueError(
                    f"--coordinator: unknown option {name!r} (known: tlsCa=PATH, tlsCert=PATH, "
                    "tlsKey=PATH, user=NAME, passwordFile=PATH)"
                )
            if name == "user":
                user = value
            elif name == "passwordFile":
                password_file = value
            else:
                files[_TLS_OPTIONS[name]] = value
            continue
        endpoints.append(_endpoint(item))
    if user is not None and (
        len(user) > 256 or any(c.isspace() or not c.isprintable() for c in user)
    ):
        raise ValueError("--coordinator: user= must be a name without spaces or control characters")
    if password_file is not None and user is None:
        raise ValueError("--coordinator: passwordFile= needs user=NAME")
    if not endpoints:
        raise ValueError(f"--coordinator {_shown(spec)}: no endpoint (etcd:http://HOST:PORT)")
    schemes = {e.split(":", 1)[0] for e in endpoints}
    if len(schemes) > 1:
        raise ValueError(f"--coordinator {_shown(spec)}: mixes http:// and https:// endpoints")
    if len(set(endpoints)) != len(endpoints):
        raise ValueError(f"--coordinator {_shown(spec)}: an endpoint is listed twice")
    tls = None
    if schemes == {"https"}:
        if (files["cert"] is None) != (files["key"] is None):
            raise ValueError("--coordinator: tlsCert and tlsKey go together: give both or neither")
        tls = TLSFiles(cert=files["cert"], key=files["key"], ca=files["ca"])
    elif any(v is not None for v in files.values()):
        raise ValueError("--coordinator: tlsCa/tlsCert/tlsKey need https:// endpoints")
    return CoordinatorSpec("etcd", tuple(endpoints), tls, user, password_file)


@dataclass(frozen=True)
class Credentials:
    """
    An etcd user and its password (never shown: not in C{repr}).
    """

    user: str
    password: str = field(repr=False)


def read_credentials(
    spec: CoordinatorSpec, environ: Mapping[str, str] | None = None
) -> Credentials | None:
    """
    The user of C{spec} and its password: the content of
    C{spec.password_file} (one line; a final line break is dropped), else
    L{PASSWORD_ENV} from C{environ} (default: the process's).  C{None}
    without a user.

    @raise ValueError: one line naming the option: the file cannot be
        read, is empty, too long or not UTF-8; or there is no password.
    """
    if spec.user is None:
        return None
    if spec.password_file is not None:
        source = f"passwordFile {spec.password_file}"
        try:
            with open(spec.password_file, "rb") as f:
                data = f.read(MAX_PASSWORD + 3)
        except OSError as e:
            raise ValueError(f"--coordinator: {source}: {e.strerror or e}") from None
        if data.endswith(b"\n"):
            data = data[:-2] if data.endswith(b"\r\n") else data[:-1]
    else:
        source = PASSWORD_ENV
        text = (os.environ if environ is None else environ).get(PASSWORD_ENV)
        if not text:
            raise ValueError(
                f"--coordinator: user={spec.user} needs passwordFile=PATH "
                f"(or {PASSWORD_ENV} in the environment)"
            )
        data = text.encode("utf-8", "surrogateescape")
    if not data:
        raise ValueError(f"--coordinator: {source}: the password is empty")
    if len(data) > MAX_PASSWORD or b"\n" in data:
        raise ValueError(
            f"--coordinator: {source}: expected one line of at most {MAX_PASSWORD} bytes"
        )
    try:
        password = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"--coordinator: {source}: the password is not UTF-8 text") from None
    return Credentials(spec.user, password)


def _shown(text: str) -> str:
    """
    C{text} for an error message, without any C{user:password@} or
    C{password=} value.
    """
    out = []
    for part in text.split(","):
        scheme, sep, rest = part.partition("://")
        if sep and "@" in rest.split("/", 1)[0]:
            part = f"{scheme}://***@{rest.split('@', 1)[1]}"
        elif "password" in part.partition("=")[0].lower() and "=" in part:
            part = f"{part.partition('=')[0]}=***"
        out.append(part)
    return ",".join(out)[:200]


def _endpoint(url: str) -> str:
    shown = _shown(url)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise ValueError(f"--coordinator: bad endpoint {shown}: {e}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"--coordinator: bad endpoint {shown}: expected http:// or https://")
    if parts.username is not None or parts.password is not None:
        raise ValueError(
            f"--coordinator: endpoint {shown}: credentials in the URL are not supported "
            "(use user=NAME with passwordFile=PATH, or a client certificate: tlsCert=, tlsKey=)"
        )
    if not parts.hostname or port is None:
        raise ValueError(f"--coordinator: bad endpoint {shown}: expected {parts.scheme}://HOST:PORT")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"--coordinator: bad endpoint {shown}: no path or query expected")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}:{port}"


# -- The gateway's JSON (no I/O) ------------------------------------------


class _Bad(Exception):
    """
    An answer that cannot be used; the message says why (one line).
    """


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(value: object, what: str) -> bytes:
    if not isinstance(value, str):
        raise _Bad(f"{what} is not a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise _Bad(f"{what} is not valid base64") from None


def _int(value: object, what: str) -> int:
    """
    An int64 field: a decimal string (or a number), absent = 0.
    """
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _Bad(f"{what} is not an integer")
    try:
        return int(value)
    except ValueError:
        raise _Bad(f"{what} is not an integer") from None


def prefix_range(prefix: bytes) -> bytes:
    """
    The C{range_end} covering every key that starts with C{prefix}: its
    last byte plus one (C{/rmqha/g/} → C{/rmqha/g0}).
    """
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return b"\x00"
    return stripped[:-1] + bytes([stripped[-1] + 1])


def parse_answer(body: bytes) -> dict[str, Any]:
    """
    The first JSON object of an answer (the gateway may follow an error
    with trailer text).
    """
    try:
        text = body.decode("utf-8")
        value, _ = json.JSONDecoder().raw_decode(text.lstrip())
    except (UnicodeDecodeError, ValueError):
        raise _Bad(f"not JSON: {_clip(body)}") from None
    if not isinstance(value, dict):
        raise _Bad(f"not a JSON object: {_clip(body)}")
    return value


def error_text(answer: dict[str, Any]) -> str:
    """
    etcd's one-line reason from an error answer (unary or in-band).
    """
    inner = answer.get("error")
    if isinstance(inner, dict):
        answer = inner
    message = answer.get("message") or answer.get("error") or "no message"
    code = answer.get("code", answer.get("grpc_code"))
    text = _clip(str(message).encode())
    return f"{text} (code {code})" if code is not None else text


def _clip(data: bytes, size: int = 160) -> str:
    text = data[:size].decode("utf-8", "replace")
    text = " ".join(text.split())
    return text + ("…" if len(data) > size else "")


def _compare(key: bytes, target: str, value: int | bytes) -> dict[str, Any]:
    field = {"CREATE": "create_revision", "MOD": "mod_revision", "VALUE": "value"}[target]
    shown = _b64(value) if isinstance(value, bytes) else str(value)
    return {"key": _b64(key), "target": target, "result": "EQUAL", field: shown}


def _put(key: bytes, value: bytes, lease: Lease | None = None) -> dict[str, Any]:
    request: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
    if lease is not None:
        request["lease"] = str(lease.id)
    return {"request_put": request}


def _delete(key: bytes) -> dict[str, Any]:
    return {"request_delete_range": {"key": _b64(key)}}


def view_from_range(prefix: bytes, answer: dict[str, Any]) -> ClusterView:
    """
    A L{ClusterView} from a range answer over C{prefix}: a key whose value
    cannot be read is skipped and reported (L{read_group}).

    @raise _Bad: the answer itself is broken (a key that is not base64,
        outside the prefix, a revision that is not a number).
    """
    header = answer.get("header")
    revision = _int(header.get("revision") if isinstance(header, dict) else None, "header.revision")
    kvs = answer.get("kvs", [])
    if not isinstance(kvs, list):
        raise _Bad("kvs is not a list")
    keys: list[StoredKey] = []
    for kv in kvs:
        if not isinstance(kv, dict):
            raise _Bad("a kvs entry is not an object")
        key = _unb64(kv.get("key"), "a key")
        shown = key.decode("utf-8", "replace")
        if not key.startswith(prefix):
            raise _Bad(f"key {shown} is outside {prefix.decode()}")
        keys.append(StoredKey(
            name=key[len(prefix):].decode("utf-8", "replace"),
            value=_unb64(kv.get("value", ""), f"key {shown}'s value"),
            create_revision=_int(kv.get("create_revision"), f"key {shown}'s create_revision"),
            mod_revision=_int(kv.get("mod_revision"), f"key {shown}'s mod_revision"),
            lease=_int(kv.get("lease"), f"key {shown}'s lease"),
        ))
    return read_group(prefix.decode("utf-8", "replace"), keys, revision)


class LineSplitter:
    """
    Splits a stream into newline-terminated lines, none longer than
    C{max_line} bytes (sans-IO: bytes in, lines out).
    """

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self._max = max_line
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        """
        @raise _Bad: a line is longer than C{max_line}.
        """
        buffer = self._buffer + data
        lines = buffer.split(b"\n")
        self._buffer = lines.pop()
        if len(self._buffer) > self._max or any(len(line) > self._max for line in lines):
            self._buffer = b""
            raise _Bad(f"a streamed line is longer than {self._max} bytes")
        return [line for line in lines if line.strip()]


# -- HTTP plumbing -------------------------------------------------------


@implementer(IBodyProducer)
class _Bytes:
    """
    A request body that is already in memory.
    """

    def __init__(self, data: bytes) -> None:
        self._data = data
        self.length = len(data)

    def startProducing(self, consumer: Any) -> Deferred[None]:
        consumer.write(self._data)
        return succeed(None)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


class _Collect(Protocol):
    """
    Reads a whole answer of at most C{limit} bytes; a longer one is cut
    off (the connection is aborted) and fails.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._chunks: list[bytes] = []
        self._size = 0
        self.done: Deferred[bytes] = Deferred(lambda d: self._abort())

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.stopProducing()  # type: ignore[attr-defined]

    def dataReceived(self, data: bytes) -> None:
        if self.done.called:
            return
        self._size += len(data)
        if self._size > self._limit:
            self._abort()
            self.done.errback(_Bad(f"answer larger than {self._limit} bytes"))
            return
        self._chunks.append(data)

    def connectionLost(self, reason: Failure = ierror.ConnectionDone()) -> None:  # type: ignore[assignment]
        if self.done.called:
            return
        if reason.check(client.ResponseDone, PotentialDataLoss):
            self.done.callback(b"".join(self._chunks))
        else:
            self.done.errback(reason)


class _FirstLine(Protocol):
    """
    Reads the first line of a streamed answer, then closes the stream.
    """

    def __init__(self, limit: int) -> None:
        self._splitter = LineSplitter(limit)
        self.done: Deferred[bytes] = Deferred(lambda d: self._abort())

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.stopProducing()  # type: ignore[attr-defined]

    def dataReceived(self, data: bytes) -> None:
        if self.done.called:
            return
        try:
            lines = self._splitter.feed(data)
        except _Bad as e:
            self._abort()
            self.done.errback(e)
            return
        if lines:
            self._abort()
            self.done.callback(lines[0])

    def connectionLost(self, reason: Failure = ierror.ConnectionDone()) -> None:  # type: ignore[assignment]
        if self.done.called:
            return
        self.done.errback(_Bad("the stream ended before its first line"))


@implementer(IPolicyForHTTPS)
class _TLSPolicy:
    """
    Client TLS to etcd: the server's certificate must chain to the CA
    (else the platform's trust store) and name the endpoint's host; a
    client certificate when given.
    """

    def __init__(self, files: TLSFiles) -> None:
        try:
            self._trust = files.trust_root() if files.ca is not None else ssl.platformTrust()
            self._extra: dict[str, Any] = {"raiseMinimumTo": ssl.TLSVersion.TLSv1_2}
            if files.cert is not None:
                key, certificate, chain = files.key_pair()
                self._extra.update(
                    privateKey=key, certificate=certificate, extraCertChain=chain or None
                )
        except TLSError as e:
            text = str(e)
            for option, flag in (("tlsCa", "--tls-ca"), ("tlsCert", "--tls-cert"), ("tlsKey", "--tls-key")):
                text = text.replace(flag, option)
            raise ValueError(f"--coordinator: {text}") from None

    def creatorForNetloc(self, hostname: bytes, port: int) -> Any:
        return ssl.optionsForClientTLS(
            hostname.decode("ascii"), trustRoot=self._trust, extraCertificateOptions=self._extra
        )


def _why(failure: Failure) -> str:
    """
    One line for a failed HTTP exchange.
    """
    value = failure.value
    if isinstance(value, (client.ResponseNeverReceived, client.ResponseFailed,
                          client.RequestTransmissionFailed)):
        reasons = getattr(value, "reasons", [])
        inner = reasons[0].value if reasons else value
        return f"connection lost ({_clip(str(inner).encode()) or type(inner).__name__})"
    if isinstance(value, ierror.ConnectionRefusedError):
        return "connection refused"
    return _clip(str(value).encode()) or type(value).__name__


_UNSENT = (ierror.ConnectError, ierror.ConnectingCancelledError)
_UNSENT_STATUS = (502, 503, 504)


#: etcd's reasons for refusing a token, as its own client tells them
#: (clientv3 shouldRefreshToken): the request was not applied, and a new
#: token may be taken.  (A watch says them in its cancel_reason.)
_TOKEN_REJECTED = (
    "etcdserver: invalid auth token",
    "etcdserver: user name is empty",
    "etcdserver: revision of auth store is old",
)
_AUTH_NOT_ENABLED = "etcdserver: authentication is not enabled"
_TOKEN = re.compile(r"[!-~]{1,%d}" % MAX_TOKEN)


def _token_rejected(reason: str) -> bool:
    return any(text in reason for text in _TOKEN_REJECTED)


class _Failed(Exception):
    """
    One try failed: C{why} (one line), C{unsent} when the request surely
    had no effect, C{final} when no other endpoint should be asked;
    C{status} and C{reason}: etcd's HTTP status and message, when it
    answered with an error.
    """

    def __init__(self, why: str, unsent: bool = False, final: bool = False,
                 lease_lost: bool = False, status: int | None = None,
                 reason: str = "") -> None:
        super().__init__(why)
        self.why = why
        self.unsent = unsent
        self.final = final
        self.lease_lost = lease_lost
        self.status = status
        self.reason = reason

    @property
    def token_rejected(self) -> bool:
        """
        etcd refused the request's token (or its lack of one), before
        applying anything.
        """
        return _token_rejected(self.reason)


class _Refused(DCSError):
    """
    etcd answered a call with an HTTP error (C{status}, its C{reason}).
    """

    def __init__(self, message: str, status: int | None, reason: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


# -- The client ----------------------------------------------------------


@implementer(IDCS)
class EtcdDCS:
    """
    One group's keys (C{/rmqha/<group>/}) in etcd.

    @param reactor: the reactor (TCP, clock).
    @param spec: where etcd is (L{parse_coordinator}).
    @param timeout: the deadline of each unary call, tries included.
    @param endpoint_factory: for tests: an L{IAgentEndpointFactory} used
        instead of TCP/TLS.
    @param environ: where L{PASSWORD_ENV} is looked up (default: the
        process's environment).

    @raise ValueError: a file of the spec (TLS, password) cannot be read
        (one line naming the option).
    """

    log = Logger()

    def __init__(
        self,
        reactor: Any,
        spec: CoordinatorSpec,
        group: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_body: int = MAX_BODY,
        max_line: int = MAX_LINE,
        endpoint_factory: IAgentEndpointFactory | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        if not group or "/" in group or any(c.isspace() or ord(c) < 32 for c in group):
            raise ValueError(f"--group {group!r}: expected a name without '/' or spaces")
        if not spec.endpoints:
            raise ValueError("--coordinator: no endpoint")
        if not 0 < timeout:
            raise ValueError(f"etcd request timeout {timeout!r}: must be positive")
        self.group = group
        self.endpoint = str(spec)
        self._reactor = reactor
        self._endpoints = spec.endpoints
        self._current = 0
        self._timeout = timeout
        self._max_body = max_body
        self._max_line = max_line
        self._prefix = f"{ROOT}{group}/".encode()
        self._raft_term = 0
        self._cluster_id: int | None = None
        self._watches: set[_Watch] = set()
        self._credentials = read_credentials(spec, environ)
        # The token requests carry (None: none), valid while _token_known;
        # the authentication under way and the calls waiting for it; until
        # when a refused authentication is not tried again, and why.
        self._token: str | None = None
        self._token_known = False
        self._auth: Deferred[str | None] | None = None
        self._auth_waiters: list[Deferred[str | None]] = []
        self._refused: tuple[float, str] | None = None
        self._closed = False
        if self._credentials is not None and spec.tls is None:
            self.log.warn(
                "etcd user {user} over plain http://: the password and the token travel "
                "unencrypted (use https:// endpoints)",
                user=self._credentials.user,
            )
        self._pool = client.HTTPConnectionPool(reactor, persistent=True)
        self._pool.maxPersistentPerHost = 4
        if endpoint_factory is not None:
            self._agent = client.Agent.usingEndpointFactory(reactor, endpoint_factory, self._pool)
            self._stream_agent = client.Agent.usingEndpointFactory(
                reactor, endpoint_factory, client.HTTPConnectionPool(reactor, persistent=False)
            )
        else:
            policy: Any = (
                _TLSPolicy(spec.tls) if spec.tls is not None
                else client.BrowserLikePolicyForHTTPS()
            )
            # Half the deadline to connect: a member that swallows SYNs
            # leaves the other half for the next endpoint.
            self._agent = client.Agent(
                reactor, policy, connectTimeout=timeout / 2, pool=self._pool
            )
            # A watch holds its connection for as long as it lives: never
            # one from (or back into) the pool.
            self._stream_agent = client.Agent(
                reactor, policy, connectTimeout=timeout / 2,
                pool=client.HTTPConnectionPool(reactor, persistent=False),
            )

    def __repr__(self) -> str:
        return f"<EtcdDCS {self.group} on {self.endpoint}>"

    def key(self, name: str) -> bytes:
        """
        The full key of C{name} (C{leader}, C{members/<id>}, …).
        """
        return self._prefix + name.encode()

    def close(self) -> Deferred[None]:
        """
        Stop every watch and close the pooled connections.
        """
        self._closed = True
        for watch in list(self._watches):
            watch.stop()
        if self._auth is not None:
            self._auth.cancel()
        return self._pool.closeCachedConnections()  # type: ignore[no-any-return]

    # -- IDCS --------------------------------------------------------------

    def grant(self, ttl: int) -> Deferred[Lease]:
        async def run() -> Lease:
            url, answer = await self._call("/v3/lease/grant", {"TTL": int(ttl)}, retry=True)
            if answer.get("error"):
                raise DCSError(f"etcd {url}: lease grant refused: {_clip(str(answer['error']).encode())}")
            try:
                return Lease(_int(answer.get("ID"), "ID"), _int(answer.get("TTL"), "TTL"))
            except _Bad as e:
                raise DCSError(f"etcd {url}: /v3/lease/grant: {e}") from None

        return Deferred.fromCoroutine(run())

    def keepalive(self, lease: Lease) -> Deferred[int]:
        async def run() -> int:
            url, answer = await self._call(
                "/v3/lease/keepalive", {"ID": str(lease.id)}, retry=True, stream=True
            )
            result = answer.get("result")
            if not isinstance(result, dict):
                raise DCSError(f"etcd {url}: /v3/lease/keepalive: no result in the answer")
            ttl = _int_or_dcs(url, "/v3/lease/keepalive", result.get("TTL"), "TTL")
            if ttl <= 0:
                raise LeaseLost(f"etcd {url}: lease {lease.id:x} expired or revoked")
            return ttl

        return Deferred.fromCoroutine(run())

    def revoke(self, lease: Lease) -> Deferred[None]:
        async def run() -> None:
            try:
                await self._call("/v3/lease/revoke", {"ID": str(lease.id)}, retry=True)
            except LeaseLost:
                pass  # gone already

        return Deferred.fromCoroutine(run())

    def load(self) -> Deferred[ClusterView]:
        async def run() -> ClusterView:
            url, answer = await self._call(
                "/v3/kv/range",
                {"key": _b64(self._prefix), "range_end": _b64(prefix_range(self._prefix))},
                retry=True,
            )
            try:
                return view_from_range(self._prefix, answer)
            except _Bad as e:
                raise DCSError(f"etcd {url}: {e}") from None

        return Deferred.fromCoroutine(run())

    def groups(self) -> Deferred[list[str]]:
        async def run() -> list[str]:
            root = ROOT.encode()
            url, answer = await self._call(
                "/v3/kv/range",
                {"key": _b64(root), "range_end": _b64(prefix_range(root)), "keys_only": True},
                retry=True,
            )
            kvs = answer.get("kvs", [])
            try:
                if not isinstance(kvs, list) or not all(isinstance(kv, dict) for kv in kvs):
                    raise _Bad("kvs is not a list of objects")
                keys = [_unb64(kv.get("key"), "a key").decode("utf-8", "replace") for kv in kvs]
            except _Bad as e:
                raise DCSError(f"etcd {url}: {e}") from None
            return group_names(keys)

        return Deferred.fromCoroutine(run())

    def campaign(
        self, leader: Leader, lease: Lease, seen: ClusterView, carried: tuple[str, ...] = ()
    ) -> Deferred[Leader | None]:
        epoch = seen.epoch + 1
        mine = replace(leader, epoch=epoch, revision=0)
        in_sync = InSync(epoch=epoch, members=in_sync_members(leader.node_id, carried))
        txn = {
            "compare": [
                _compare(self.key("leader"), "CREATE", 0),
                _compare(self.key("epoch"), "MOD", seen.epoch_revision),
                _compare(self.key("insync"), "MOD", seen.in_sync_revision),
            ],
            "success": [
                _put(self.key("leader"), encode(mine), lease),
                _put(self.key("epoch"), str(epoch).encode()),
                _put(self.key("insync"), encode(in_sync)),
            ],
        }

        async def run() -> Leader | None:
            revision = await self._txn(txn)
            return None if revision is None else replace(mine, revision=revision, lease=lease.id)

        return Deferred.fromCoroutine(run())

    def publish_in_sync(self, in_sync: InSync, leader: Leader) -> Deferred[InSync | None]:
        if leader.revision <= 0:
            return fail(DCSError(f"publish_in_sync for {leader.node_id}: no leader revision"))
        txn = {
            "compare": [_compare(self.key("leader"), "CREATE", leader.revision)],
            "success": [_put(self.key("insync"), encode(in_sync))],
        }

        async def run() -> InSync | None:
            revision = await self._txn(txn)
            return None if revision is None else replace(in_sync, revision=revision)

        return Deferred.fromCoroutine(run())

    def touch_member(self, member: Member, lease: Lease) -> Deferred[None]:
        async def run() -> None:
            put = _put(self.key(f"members/{member.node_id}"), encode(member), lease)
            await self._call("/v3/kv/put", put["request_put"], retry=True)

        return Deferred.fromCoroutine(run())

    def resign(self, leader: Leader) -> Deferred[bool]:
        if leader.revision <= 0:
            return succeed(False)
        txn = {
            "compare": [_compare(self.key("leader"), "CREATE", leader.revision)],
            "success": [_delete(self.key("leader"))],
        }

        async def run() -> bool:
            return await self._txn(txn) is not None

        return Deferred.fromCoroutine(run())

    def request_switchover(self, switchover: Switchover) -> Deferred[bool]:
        async def run() -> bool:
            # The switchover names the leader by node id; the txn pins the
            # leader key read here by its create_revision.
            view = await self.load()
            if view.leader is None or view.leader.node_id != switchover.leader:
                return False
            if view.switchover is not None:
                return False
            txn = {
                "compare": [
                    _compare(self.key("leader"), "CREATE", view.leader.revision),
                    _compare(self.key("switchover"), "CREATE", 0),
                ],
                "success": [_put(self.key("switchover"), encode(switchover))],
            }
            return await self._txn(txn) is not None

        return Deferred.fromCoroutine(run())

    def clear_switchover(self, switchover: Switchover) -> Deferred[None]:
        txn = {
            "compare": [_compare(self.key("switchover"), "MOD", switchover.revision)],
            "success": [_delete(self.key("switchover"))],
        }

        async def run() -> None:
            await self._txn(txn)

        return Deferred.fromCoroutine(run())

    def watch(self, on_change: Callable[[], None], on_error: Callable[[DCSError], None]) -> IWatch:
        watch = _Watch(self, on_change, on_error)
        self._watches.add(watch)
        watch.start()
        return watch

    # -- Requests ----------------------------------------------------------

    async def _txn(self, txn: dict[str, Any]) -> int | None:
        """
        Run C{txn}; its revision if it succeeded, else C{None}.
        """
        url, answer = await self._call("/v3/kv/txn", txn, retry=False)
        if answer.get("succeeded") is not True:
            return None
        header = answer.get("header")
        return _int_or_dcs(
            url, "/v3/kv/txn", header.get("revision") if isinstance(header, dict) else None,
            "header.revision",
        )

    async def _call(
        self, path: str, body: dict[str, Any], *, retry: bool, stream: bool = False,
        deadline: float | None = None, authenticated: bool = True,
    ) -> tuple[str, dict[str, Any]]:
        """
        POST C{body} to C{path}, moving along the endpoints within the
        deadline; C{retry} when asking again after an unknown outcome is
        harmless.  With a user (and C{authenticated}), the request carries
        the token, and one etcd refused is replaced and the request sent
        again once (it was not applied).  Fires with the endpoint that
        answered and its answer.
        """
        payload = json.dumps(body, separators=(",", ":")).encode()
        if deadline is None:
            deadline = self._reactor.seconds() + self._timeout
        token = await self._token_within(deadline) if authenticated else None
        renewed = False
        tried = 0
        # Each endpoint at most once per call: asking the same member again
        # at once would only repeat its failure.
        while True:
            index = self._current
            url = self._endpoints[index]
            if self._closed:
                # (close() cancelled what was under way: nothing new.)
                raise DCSError(f"etcd {url}: {path}: the client is closed")
            try:
                return url, await self._within(
                    Deferred.fromCoroutine(
                        self._try(url, path, payload, stream, token, quote=authenticated)
                    ),
                    deadline,
                )
            except _Failed as e:
                failed = e
            if failed.lease_lost:
                raise LeaseLost(f"etcd {url}: {path}: {failed.why}")
            if (
                failed.token_rejected and authenticated and not renewed
                and self._credentials is not None
            ):
                # etcd refused the token before applying anything: a new
                # one, and the same request to the same member, once.
                renewed = True
                self._forget_token(token)
                token = await self._token_within(deadline)
                continue
            tried += 1
            if self._current == index:
                self._current = (index + 1) % len(self._endpoints)
            out_of_time = self._reactor.seconds() >= deadline
            last = tried == len(self._endpoints)
            if failed.final or last or out_of_time or not (failed.unsent or retry):
                raise self._error(url, path, failed)
            self.log.info(
                "etcd {url}: {path}: {why}; trying {next}",
                url=url, path=path, why=failed.why, next=self._endpoints[self._current],
            )

    async def _within(self, attempt: Deferred[Any], deadline: float) -> Any:
        """
        C{attempt}'s result, or L{_Failed} (final) once C{deadline} passes
        (it is then cancelled).
        """
        expired: list[bool] = []

        def expire() -> None:
            expired.append(True)
            attempt.cancel()

        timer = self._reactor.callLater(max(0.0, deadline - self._reactor.seconds()), expire)
        try:
            return await attempt
        except Exception:
            if expired:
                raise _Failed(f"no answer within {self._timeout:g} s", final=True) from None
            raise
        finally:
            if timer.active():
                timer.cancel()

    def _error(self, url: str, path: str, failed: _Failed) -> DCSError:
        """
        The one-line error for a call that failed: with what etcd said of
        its user, or a hint when etcd wants one and none is set.
        """
        why = failed.why
        if failed.status is not None and (
            failed.status in (401, 403) or failed.token_rejected or path == _AUTH_PATH
        ):
            if self._credentials is not None:
                why += f" (user {self._credentials.user})"
            else:
                # (Over the gateway etcd knows no other identity: a client
                # certificate's CommonName is refused once auth is on.)
                why += (
                    "; etcd wants a user: add user=NAME,passwordFile=PATH to --coordinator"
                )
        message = f"etcd {url}: {path}: {why}"
        if failed.status is not None:
            return _Refused(message, failed.status, failed.reason)
        return DCSError(message)

    # -- Authentication -----------------------------------------------------

    async def _token_within(self, deadline: float) -> str | None:
        """
        The token to send (C{None}: none), authenticating first if there
        is none yet, by C{deadline}.

        @raise DCSError: etcd refused the user, or did not answer in time.
        """
        if self._credentials is None or self._token_known:
            return self._token
        try:
            token: str | None = await self._within(self._next_token(deadline), deadline)
        except _Failed as e:
            url = self._endpoints[self._current]
            raise DCSError(f"etcd {url}: {_AUTH_PATH}: {e.why}") from None
        return token

    def _next_token(self, deadline: float) -> Deferred[str | None]:
        """
        Wait for the authentication under way, or start one (with
        C{deadline}); cancelling the wait leaves it running for the others.
        """
        refused = self._refused
        if refused is not None:
            if self._reactor.seconds() < refused[0]:
                return fail(DCSError(refused[1]))
            self._refused = None

        def withdraw(waiter: Deferred[str | None]) -> None:
            if waiter in self._auth_waiters:
                self._auth_waiters.remove(waiter)

        waiter: Deferred[str | None] = Deferred(withdraw)
        self._auth_waiters.append(waiter)
        if self._auth is None:
            self._auth = Deferred.fromCoroutine(self._authenticate(deadline))
            self._auth.addBoth(self._authenticated)
        return waiter

    async def _authenticate(self, deadline: float) -> str | None:
        credentials = self._credentials
        assert credentials is not None
        try:
            url, answer = await self._call(
                _AUTH_PATH,
                {"name": credentials.user, "password": credentials.password},
                retry=True, deadline=deadline, authenticated=False,
            )
        except _Refused as e:
            if _AUTH_NOT_ENABLED in e.reason:
                # As etcd's own client: no token while auth is off (set a
                # user before `etcdctl auth enable`; once it is enabled,
                # "user name is empty" brings a token).
                return None
            if e.status is not None and 400 <= e.status < 500:
                self._refused = (self._reactor.seconds() + AUTH_RETRY, str(e))
            raise
        token = answer.get("token")
        if not isinstance(token, str) or not _TOKEN.fullmatch(token):
            raise DCSError(f"etcd {url}: {_AUTH_PATH}: the answer has no usable token")
        return token

    def _authenticated(self, result: str | None | Failure) -> None:
        self._auth = None
        waiters, self._auth_waiters = self._auth_waiters, []
        if isinstance(result, Failure):
            if result.check(CancelledError):
                result = Failure(DCSError("etcd: the client was closed while authenticating"))
            for waiter in waiters:
                waiter.errback(result)
            return
        self._token, self._token_known = result, True
        if result is not None:
            self.log.info(
                "etcd: authenticated as {user}", user=self._credentials.user  # type: ignore[union-attr]
            )
        for waiter in waiters:
            waiter.callback(result)

    def _forget_token(self, token: str | None) -> None:
        """
        etcd refused C{token}: the next request authenticates again
        (unless another call did already).
        """
        if self._token_known and self._token == token:
            self._token, self._token_known = None, False

    async def _try(
        self, url: str, path: str, payload: bytes, stream: bool, token: str | None,
        quote: bool = True,
    ) -> dict[str, Any]:
        """
        One request to one member.  C{quote}: an answer that is not JSON
        may be quoted in the error (not for an authentication: it could
        hold the token).
        """
        headers = Headers({b"content-type": [b"application/json"]})
        if token is not None:
            headers.addRawHeader(b"authorization", token.encode("ascii"))
        try:
            response: IResponse = await self._agent.request(
                b"POST", (url + path).encode("ascii"), headers, _Bytes(payload)
            )
        except _UNSENT as e:
            raise _Failed(_why(Failure(e)), unsent=True) from None
        except Exception as e:
            raise _Failed(_why(Failure(e))) from None
        limit = self._max_line if stream and response.code == 200 else self._max_body
        reader: _Collect | _FirstLine = (
            _FirstLine(limit) if stream and response.code == 200 else _Collect(limit)
        )
        if response.length is not UNKNOWN_LENGTH and response.length > self._max_body:
            _discard(response)
            raise _Failed(f"answer of {response.length} bytes is larger than {self._max_body}")
        response.deliverBody(reader)
        try:
            body = await reader.done
        except _Bad as e:
            raise _Failed(str(e)) from None
        except Exception as e:
            raise _Failed(_why(Failure(e))) from None
        try:
            answer = parse_answer(body)
        except _Bad as e:
            if response.code == 200:
                raise _Failed(
                    str(e) if quote else "the answer is not a JSON object (not quoted)"
                ) from None
            text = str(e)
            if "CommonName of client" in text:
                text += (
                    "; with etcd's auth enabled, the client certificate must have no "
                    "CommonName (docs/failover.md)"
                )
            raise _Failed(
                f"HTTP {response.code}: {text}", final=400 <= response.code < 500
            ) from None
        if response.code != 200:
            reason = error_text(answer)
            lost = response.code == 404 and answer.get("code") == 5
            raise _Failed(
                f"HTTP {response.code}: {reason}",
                unsent=response.code in _UNSENT_STATUS,
                final=400 <= response.code < 500,
                lease_lost=lost,
                status=response.code,
                reason=reason,
            )
        if stream and "error" in answer:
            reason = error_text(answer)
            raise _Failed(
                f"error: {reason}", unsent=True,
                status=200 if _token_rejected(reason) else None, reason=reason,
            )
        header = answer.get("result", answer) if stream else answer
        self._check_header(header.get("header") if isinstance(header, dict) else None)
        return answer

    def _check_header(self, header: object) -> None:
        """
        Refuse an answer from a stale member (raft_term below one seen) or
        from another cluster.
        """
        if not isinstance(header, dict):
            raise _Failed("the answer has no header")
        try:
            term = _int(header.get("raft_term"), "header.raft_term")
            cluster = _int(header.get("cluster_id"), "header.cluster_id")
        except _Bad as e:
            raise _Failed(str(e)) from None
        if self._cluster_id is not None and cluster != self._cluster_id:
            raise _Failed(
                f"cluster_id {cluster:x} is not the cluster first seen ({self._cluster_id:x})"
            )
        if term < self._raft_term:
            raise _Failed(f"stale member: raft_term {term} below {self._raft_term} already seen")
        self._cluster_id = cluster
        self._raft_term = term


def _int_or_dcs(url: str, path: str, value: object, what: str) -> int:
    try:
        return _int(value, what)
    except _Bad as e:
        raise DCSError(f"etcd {url}: {path}: {e}") from None


# -- Watches -------------------------------------------------------------


class _Discard(Protocol):
    """
    An answer not wanted: L{_discard} closes its connection at once.
    """

    def dataReceived(self, data: bytes) -> None:
        pass


def _discard(response: IResponse) -> None:
    protocol = _Discard()
    # deliverBody resumes the transport after connectionMade: stop it after.
    response.deliverBody(protocol)
    if protocol.transport is not None:
        protocol.transport.stopProducing()  # type: ignore[attr-defined]


class _WatchStream(Protocol):
    """
    The body of one watch stream: lines to its L{_Watch}.
    """

    def __init__(self, watch: _Watch, generation: int, max_line: int) -> None:
        self._watch = watch
        self._generation = generation
        self._splitter = LineSplitter(max_line)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.stopProducing()  # type: ignore[attr-defined]

    def dataReceived(self, data: bytes) -> None:
        try:
            lines = self._splitter.feed(data)
        except _Bad as e:
            self._watch.failed(str(e), self._generation)
            return
        self._watch.lines(lines, self._generation)

    def connectionLost(self, reason: Failure = ierror.ConnectionDone()) -> None:  # type: ignore[assignment]
        if reason.check(client.ResponseDone, PotentialDataLoss):
            self._watch.failed("the watch stream ended", self._generation)
        else:
            self._watch.failed(_why(reason), self._generation)


@implementer(IWatch)
class _Watch:
    """
    One watch over a group's prefix, restarted after every failure until
    L{stop}.  Each stream has a generation; whatever an older stream
    still delivers is ignored.
    """

    log = Logger()

    def __init__(
        self, dcs: EtcdDCS, on_change: Callable[[], None], on_error: Callable[[DCSError], None]
    ) -> None:
        self._dcs = dcs
        self._on_change = on_change
        self._on_error = on_error
        self._backoff = WATCH_BACKOFF
        self._stopped = False
        self._request: Deferred[Any] | None = None
        self._close: Callable[[], None] | None = None
        self._restart: IDelayedCall | None = None
        self._url = ""
        self._generation = 0
        # The token the current stream was sent with, and whether one was
        # already replaced since a stream was last created.
        self._token: str | None = None
        self._renewed = False

    def start(self) -> None:
        dcs = self._dcs
        self._restart = None
        self._generation += 1
        generation = self._generation
        self._url = dcs._endpoints[dcs._current]
        request = Deferred.fromCoroutine(self._open(self._url))
        self._request = request
        expired: list[bool] = []

        def expire() -> None:
            expired.append(True)
            request.cancel()

        timer = dcs._reactor.callLater(dcs._timeout, expire)

        def answered_in_time(result: Any) -> Any:
            if timer.active():
                timer.cancel()
            return result

        request.addBoth(answered_in_time)

        def answered(response: IResponse) -> None:
            self._request = None
            if generation != self._generation or self._stopped:
                _discard(response)
                return
            if response.code != 200:
                collect = _Collect(dcs._max_body)
                self._close = collect.done.cancel
                response.deliverBody(collect)

                def refused(data: bytes) -> None:
                    try:
                        text = error_text(parse_answer(data))
                    except _Bad as e:
                        text = str(e)
                    if self._token_refused(text, generation):
                        return
                    self.failed(f"HTTP {response.code}: {text}", generation)

                def unread(failure: Failure) -> None:
                    if not failure.check(CancelledError):
                        self.failed(f"HTTP {response.code}", generation)

                collect.done.addCallbacks(refused, unread)
                return
            stream = _WatchStream(self, generation, dcs._max_line)
            self._close = stream.close
            response.deliverBody(stream)

        def broken(failure: Failure) -> None:
            if generation == self._generation:
                self._request = None
            if expired:
                self.failed(f"no answer within {dcs._timeout:g} s", generation)
            elif generation == self._generation and not self._stopped:
                if failure.check(DCSError):
                    # (The authentication failed: its own one line.)
                    self.failed("", generation, error=DCSError(str(failure.value)))
                else:
                    self.failed(_why(failure), generation)

        request.addCallbacks(answered, broken)

    async def _open(self, url: str) -> IResponse:
        """
        Send the watch request (with a token, authenticating first if
        needed): the answer's headers.
        """
        dcs = self._dcs
        self._token = None
        token = await dcs._token_within(dcs._reactor.seconds() + dcs._timeout)
        self._token = token
        body = {
            "create_request": {
                "key": _b64(dcs._prefix),
                "range_end": _b64(prefix_range(dcs._prefix)),
            }
        }
        headers = Headers({
            b"content-type": [b"application/json"],
            # Without it a member that lost quorum keeps the watch open
            # and silent forever (failover-anchors D.3).
            b"grpc-metadata-hasleader": [b"true"],
        })
        if token is not None:
            headers.addRawHeader(b"authorization", token.encode("ascii"))
        response: IResponse = await dcs._stream_agent.request(
            b"POST", (url + "/v3/watch").encode("ascii"), headers,
            _Bytes(json.dumps(body).encode()),
        )
        return response

    def _token_refused(self, reason: str, generation: int) -> bool:
        """
        etcd refused this stream's token (C{reason}): take a new one and
        start again at once, without reporting, once per stream created.
        """
        if not _token_rejected(reason) or self._dcs._credentials is None:
            return False
        self._dcs._forget_token(self._token)
        if self._renewed:
            return False
        self._renewed = True
        if self._stopped or generation != self._generation:
            return True
        self._generation += 1
        self._close_stream()
        self._restart = self._dcs._reactor.callLater(0, self.start)
        return True

    def lines(self, lines: list[bytes], generation: int) -> None:
        changed = False
        for line in lines:
            if self._stopped or generation != self._generation:
                return
            try:
                answer = parse_answer(line)
                if "error" in answer:
                    raise _Bad(f"error: {error_text(answer)}")
                result = answer.get("result")
                if not isinstance(result, dict):
                    raise _Bad("a watch answer without result")
                self._dcs._check_header(result.get("header"))
            except (_Bad, _Failed) as e:
                self.failed(str(e), generation)
                return
            if result.get("canceled"):
                compacted = result.get("compact_revision")
                reason = result.get("cancel_reason")
                if self._token_refused(str(reason or ""), generation):
                    return
                self.failed(
                    "the watch was canceled"
                    + (f" (compacted at revision {compacted})" if compacted else "")
                    + (f": {_clip(str(reason).encode())}" if reason else ""),
                    generation,
                )
                return
            if result.get("created"):
                self._backoff = WATCH_BACKOFF
                self._renewed = False
                changed = True
            if result.get("events"):
                changed = True
        if changed and not self._stopped and generation == self._generation:
            self._call(self._on_change)

    def failed(self, why: str, generation: int, error: DCSError | None = None) -> None:
        """
        Stream C{generation} is over: report (C{why}, or C{error} as it
        is), and start another after a back-off.
        """
        if self._stopped or generation != self._generation:
            return
        self._generation += 1
        self._close_stream()
        dcs = self._dcs
        endpoints = dcs._endpoints
        if endpoints[dcs._current] == self._url:
            dcs._current = (dcs._current + 1) % len(endpoints)
        delay = self._backoff
        self._backoff = min(self._backoff * 2, WATCH_BACKOFF_MAX)
        self._restart = dcs._reactor.callLater(delay, self.start)
        if error is None:
            error = DCSError(f"etcd {self._url}: /v3/watch: {why}")
        self._call(self._on_error, error)

    def _close_stream(self) -> None:
        close, self._close = self._close, None
        request, self._request = self._request, None
        if request is not None:
            request.cancel()
        if close is not None:
            close()

    def _call(self, callback: Callable[..., None], *args: Any) -> None:
        try:
            callback(*args)
        except Exception:
            self.log.failure("a watch callback failed")

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._generation += 1
        self._dcs._watches.discard(self)
        if self._restart is not None and self._restart.active():
            self._restart.cancel()
        self._restart = None
        self._close_stream()
