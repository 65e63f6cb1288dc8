# -*- test-case-name: tests.test_tls -*-
"""
TLS and mutual TLS for the HA port.

RocketMQ's HA port has neither: whoever reaches it can copy the commit log
or fake acknowledgements.  Here a master listens with
L{server_endpoint} (C{ssl:PORT[:interface=…]} plus PEM files, optionally
demanding client certificates from a CA and names from an allowlist, see
L{PeerPolicy}); a slave dials with L{client_endpoint}, verifying the
master's certificate against a CA and its name with service_identity.

Twisted's C{ssl:} server string cannot require client certificates, so the
server side is built here from L{CertificateOptions}; keys and certificates
are passed as C{cryptography} objects (pyOpenSSL deprecates its own).

Why a handshake failed is kept per connection (L{describe_failure}), so a
slave logs one line naming the reason: wrong name, unknown CA, expired,
no client certificate, refused by the master.  A listening port logs each
handshake that fails as one warning naming the peer, the port and the
reason (L{ServerTLSFactory}, L{describe_refusal}).

Every listening port negotiates ALPN as Twisted does (the application
protocols the port's factory offers, a C{Site}'s C{http/1.1}), except that
when it offers none, or none the client offers, no protocol is selected
and the handshake goes on (OpenSSL's C{s_server} and Python's C{ssl} do
the same): Twisted's callback answers an empty name, which OpenSSL turns
into an "internal error" alert to every client that offers ALPN.
"""

from __future__ import annotations

import ipaddress
import weakref
from dataclasses import dataclass
from typing import Any, NamedTuple

from cryptography import x509
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_private_key,
)
from cryptography.x509.oid import NameOID
from OpenSSL import SSL
from service_identity.exceptions import VerificationError
from service_identity.hazmat import DNS_ID, IPAddress_ID, verify_service_identity
from service_identity.pyopenssl import extract_patterns
from twisted.internet import ssl
from twisted.internet.abstract import isIPAddress, isIPv6Address
from twisted.internet import defer
from twisted.internet.protocol import connectionDone
from twisted.internet.endpoints import HostnameEndpoint, SSL4ServerEndpoint
from twisted.internet.interfaces import (
    IListeningPort,
    IOpenSSLClientConnectionCreator,
    IProtocolFactory,
    IProtocolNegotiationFactory,
    IReactorTCP,
    IReactorTime,
    IStreamClientEndpoint,
)
from twisted.logger import Logger
from twisted.protocols.tls import TLSMemoryBIOProtocol
from twisted.python.failure import Failure
from zope.interface import implementer

from rmqha._tlsbio import TLSFactory, TLSProtocol

__all__ = [
    "TLSError",
    "TLSFiles",
    "PeerPolicy",
    "server_endpoint",
    "server_endpoint_port",
    "server_endpoint_on_port",
    "parse_ssl_listen",
    "client_endpoint",
    "certificate_names",
    "certificate_expiry",
    "describe_failure",
    "describe_refusal",
    "ServerTLSFactory",
    "split_description",
    "ExposureWarning",
    "exposure_warning",
    "admin_exposure_warning",
    "commitlog_exposure_warning",
    "plain_master_warning",
]


class TLSError(ValueError):
    """
    A TLS setting is wrong: a file cannot be read or is not what it should
    be, or settings contradict each other.  The message names the setting.
    """


@dataclass(frozen=True)
class TLSFiles:
    """
    PEM files, with the flag each came from (for error messages).

    @ivar cert: this side's certificate, optionally followed by its chain.
    @ivar key: the private key of C{cert}.
    @ivar ca: the CA certificate(s) the peer's certificate must chain to.
    """

    cert: str | None = None
    key: str | None = None
    ca: str | None = None

    def certificate_chain(self) -> list[x509.Certificate]:
        assert self.cert is not None
        return _load_certificates(self.cert, "--tls-cert")

    def private_key(self) -> Any:
        assert self.key is not None
        data = _read(self.key, "--tls-key")
        try:
            return load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as e:
            raise TLSError(
                f"--tls-key {self.key}: not an unencrypted PEM private key ({e})"
            ) from None

    def trust_root(self) -> Any:
        assert self.ca is not None
        certificates = _load_certificates(self.ca, "--tls-ca")
        return ssl.trustRootFromCertificates(
            [ssl.Certificate.loadPEM(c.public_bytes(Encoding.PEM)) for c in certificates]
        )

    def key_pair(self) -> tuple[Any, x509.Certificate, list[x509.Certificate]]:
        """
        The private key, the certificate and its chain, checked to belong
        together.
        """
        if (self.cert is None) != (self.key is None):
            raise TLSError("--tls-cert and --tls-key go together: give both or neither")
        chain = self.certificate_chain()
        key = self.private_key()
        if _spki(key.public_key()) != _spki(chain[0].public_key()):
            raise TLSError(f"--tls-key {self.key} is not the key of --tls-cert {self.cert}")
        return key, chain[0], chain[1:]


def _spki(public_key: Any) -> bytes:
    return bytes(public_key.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo))


def _read(path: str, flag: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise TLSError(f"{flag} {path}: {e.strerror}") from None


def _load_certificates(path: str, flag: str) -> list[x509.Certificate]:
    data = _read(path, flag)
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError:
        certificates = []
    if not certificates:
        raise TLSError(f"{flag} {path}: no PEM certificate in it")
    return certificates


def certificate_names(certificate: x509.Certificate) -> list[str]:
    """
    The names a certificate is for: its DNS subject alternative names, or,
    when it has none, its common name.
    """
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        names = list(san.value.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        names = []
    if not names:
        names = [
            str(attribute.value)
            for attribute in certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        ]
    return names


def certificate_expiry(files: TLSFiles) -> dict[str, tuple[str, float]]:
    """
    When the certificates this broker uses stop being valid, for
    C{/metrics}: C{{"certificate": (path, t), "ca": (path, t)}} for the
    C{--tls-cert} and C{--tls-ca} files that are set and readable, C{t}
    the earliest not-after time in the file (a chain or a CA bundle stops
    working at its first expiry), in Unix seconds.  Read once, at start,
    like the files themselves: a file replaced on disk counts after a
    restart.
    """
    found = {}
    for kind, path, flag in (("certificate", files.cert, "--tls-cert"), ("ca", files.ca, "--tls-ca")):
        if path is None:
            continue
        try:
            certificates = _load_certificates(path, flag)
        except TLSError:
            continue
        found[kind] = (path, min(c.not_valid_after_utc.timestamp() for c in certificates))
    return found


@dataclass(frozen=True)
class PeerPolicy:
    """
    What a master asks of a slave's certificate.

    @ivar require_client_cert: refuse a slave without a certificate signed
        by the CA (OpenSSL refuses it during the handshake).
    @ivar allowed_peers: when set, one of the certificate's names
        (L{certificate_names}) must be in it.
    """

    require_client_cert: bool = False
    allowed_peers: frozenset[str] | None = None
    #: The setting C{allowed_peers} came from, for refusals.
    allowlist_flag: str = "--tls-allowed-peers"

    def __post_init__(self) -> None:
        if self.allowed_peers is not None and not self.require_client_cert:
            raise TLSError("--tls-allowed-peers needs --tls-require-client-cert")

    def check(self, certificate: x509.Certificate | None) -> tuple[str | None, str | None]:
        """
        @return: C{(identity, refusal)}: the name this peer is known by (its
            first allowed name, else its first name), and why it is refused
            (C{None} when it is not).
        """
        if certificate is None:
            if self.require_client_cert:
                return None, "it presented no client certificate"
            return None, None
        names = certificate_names(certificate)
        if self.allowed_peers is not None:
            allowed = [n for n in names if n in self.allowed_peers]
            if not allowed:
                return (names[0] if names else None), (
                    f"its certificate names {', '.join(names) or 'nothing'}, none of "
                    f"them in {self.allowlist_flag}"
                )
            return allowed[0], None
        return (names[0] if names else None), None


def split_description(description: str) -> tuple[str, list[str], dict[str, str]]:
    """
    A Twisted endpoint description as C{(type, positional, keywords)},
    honouring backslash escapes (C{interface=\\:\\:1}).
    """
    parts: list[str] = []
    current = []
    escaped = False
    for char in description:
        if escaped:
            current.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == ":":
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    kind, args = parts[0], parts[1:]
    positional = [a for a in args if "=" not in a]
    keywords = dict(a.split("=", 1) for a in args if "=" in a)
    return kind, positional, keywords


def server_context(files: TLSFiles, policy: PeerPolicy) -> ssl.CertificateOptions:
    """
    A listening port's TLS settings: its key pair, TLS 1.2 at least, and,
    when C{policy} requires it, client certificates from C{files.ca}; ALPN
    that never fails a handshake, and why a client's certificate failed
    verification kept for L{describe_refusal} (L{_ServerOptions}).
    """
    if files.cert is None or files.key is None:
        raise TLSError("a TLS master needs --tls-cert and --tls-key")
    key, certificate, chain = files.key_pair()
    options: dict[str, Any] = {}
    if policy.require_client_cert:
        if files.ca is None:
            raise TLSError("--tls-require-client-cert needs --tls-ca (the slaves' CA)")
        options["trustRoot"] = files.trust_root()
    elif files.ca is not None:
        # An optional client certificate authenticates nothing: whoever
        # wants the log would simply not send one.
        raise TLSError(
            "--tls-ca on a master checks slaves' certificates: add "
            "--tls-require-client-cert (an optional certificate proves nothing)"
        )
    # cryptography objects work at runtime (the stubs say pyOpenSSL's, which
    # pyOpenSSL itself now deprecates).
    return _ServerOptions(
        privateKey=key,
        certificate=certificate,  # type: ignore[arg-type]
        extraCertChain=chain or None,  # type: ignore[arg-type]
        raiseMinimumTo=ssl.TLSVersion.TLSv1_2,
        **options,
    )


class _ServerOptions(ssl.CertificateOptions):
    """
    L{ssl.CertificateOptions} for a listening port, with two changes:

        - ALPN selects the first of the port factory's protocols
          (L{IProtocolNegotiationFactory}, through any wrapping factory
          that passes them on) that the client offers, or nothing,
          without failing the handshake (L{_select_protocol});
        - each connection records why the client's certificate failed
          verification, in words (OpenSSL's error only says "certificate
          verify failed").
    """

    _alpn_context: Any = None

    def getContext(self) -> SSL.Context:
        context = super().getContext()
        if context is not self._alpn_context:
            # (Twisted set its own callback when it made the context.)
            context.set_alpn_select_callback(_select_protocol)
            self._alpn_context = context
        return context

    def serverConnectionForTLS(self, tlsProtocol: TLSMemoryBIOProtocol) -> SSL.Connection:
        connection = super().serverConnectionForTLS(tlsProtocol)
        mode = connection.get_context().get_verify_mode()
        if mode & SSL.VERIFY_PEER:
            protocol = weakref.ref(tlsProtocol)

            def verify(conn: SSL.Connection, cert: Any, errno: int, depth: int, ok: int) -> bool:
                if not ok:
                    target = protocol()
                    if target is not None and target not in _verify_errors:
                        try:
                            why = _chain_error(errno, cert.to_cryptography(), "the client's")
                        except Exception:
                            why = f"the client's certificate failed verification (OpenSSL error {errno})"
                        _verify_errors[target] = why
                return bool(ok)

            connection.set_verify(mode, verify)
        return connection


def _select_protocol(connection: SSL.Connection, offered: list[bytes]) -> Any:
    """
    The ALPN choice of a listening port: the first protocol its factory
    offers that the client offers too, else none (the handshake goes on,
    and the application speaks its own protocol).
    """
    tls_protocol = connection.get_app_data()
    negotiating = IProtocolNegotiationFactory(tls_protocol.factory.wrappedFactory, None)
    if negotiating is not None:
        for name in negotiating.acceptableProtocols():
            if name in offered:
                return name
    return SSL.NO_OVERLAPPING_PROTOCOLS


def parse_ssl_listen(description: str, flag: str = "--ha-listen") -> tuple[int, str, int]:
    """
    C{ssl:PORT[:interface=…][:backlog=…]} as C{(port, interface, backlog)}.

    @param flag: the option the description came from, for messages.
    @raise TLSError: the description is not of that form (key files in it
        are refused: they come from C{--tls-cert}/C{--tls-key}).
    """
    kind, positional, keywords = split_description(description)
    if kind != "ssl":
        raise TLSError(
            f"{flag} {description!r}: TLS settings need an ssl:PORT endpoint"
        )
    unknown = sorted(set(keywords) - {"port", "interface", "backlog"})
    if unknown:
        raise TLSError(
            f"{flag} {description!r}: {', '.join(unknown)} cannot be given "
            "here; use --tls-cert, --tls-key and --tls-ca"
        )
    port_text = keywords.get("port") or (positional[0] if positional else "")
    if not port_text.isdigit() or int(port_text) > 65535 or len(positional) > 1:
        raise TLSError(f"{flag} {description!r}: not ssl:PORT[:interface=ADDRESS]")
    backlog = keywords.get("backlog", "50")
    if not backlog.isdigit():
        raise TLSError(f"{flag} {description!r}: backlog {backlog!r} is not a number")
    return int(port_text), keywords.get("interface", ""), int(backlog)


def server_endpoint(
    reactor: IReactorTCP,
    description: str,
    files: TLSFiles,
    policy: PeerPolicy,
    flag: str = "--ha-listen",
) -> SSL4ServerEndpoint:
    """
    A listening endpoint for C{ssl:PORT[:interface=…][:backlog=…]} with the
    key pair (and client-certificate policy) from settings: the master's
    HA port, or the admin HTTP port (C{flag="--http"}).

    @raise TLSError: the description is not of that form, or a file or
        setting is wrong.
    """
    port, interface, backlog = parse_ssl_listen(description, flag)
    return _TLSServerEndpoint(
        reactor,
        port,
        server_context(files, policy),
        backlog=backlog,
        interface=interface,
        name=_PORT_NAMES.get(flag, f"the port of {flag}"),
    )


def server_endpoint_port(endpoint: object) -> int | None:
    """
    The port number an endpoint of L{server_endpoint} listens on; C{None}
    for any other endpoint.
    """
    return endpoint._tls_listen[0] if isinstance(endpoint, _TLSServerEndpoint) else None


def server_endpoint_on_port(endpoint: object, port: int, name: str) -> SSL4ServerEndpoint | None:
    """
    An endpoint of L{server_endpoint} like C{endpoint} (the same key pair,
    client-certificate policy, interface and backlog) on C{port}, named
    C{name} in log lines; C{None} when C{endpoint} is not one.
    """
    if not isinstance(endpoint, _TLSServerEndpoint):
        return None
    _, context, backlog, interface = endpoint._tls_listen
    return _TLSServerEndpoint(
        endpoint._tls_reactor, port, context, backlog=backlog, interface=interface, name=name
    )


#: The listening ports by the flag their description came from, in log
#: lines.
_PORT_NAMES = {"--ha-listen": "the HA port", "--http": "the admin HTTP port"}


class _TLSServerEndpoint(SSL4ServerEndpoint):
    """
    C{ssl:PORT} listening with rmqha's TLS layer (L{TLSFactory}) instead of
    the one C{reactor.listenSSL} builds; otherwise the same.
    """

    def __init__(
        self,
        reactor: IReactorTCP,
        port: int,
        context: ssl.CertificateOptions,
        backlog: int = 50,
        interface: str = "",
        name: str = "the HA port",
    ) -> None:
        SSL4ServerEndpoint.__init__(
            self, reactor, port, context, backlog=backlog, interface=interface
        )
        self._tls_reactor: Any = reactor
        self._tls_listen = (port, context, backlog, interface)
        self._tls_name = name

    def listen(self, protocolFactory: IProtocolFactory) -> "defer.Deferred[IListeningPort]":
        return defer.execute(self._listen, protocolFactory)

    def _listen(self, protocolFactory: IProtocolFactory) -> IListeningPort:
        port, context, backlog, interface = self._tls_listen
        factory = ServerTLSFactory(
            context, protocolFactory, clock=self._tls_reactor, name=self._tls_name
        )
        listening: IListeningPort = self._tls_reactor.listenTCP(port, factory, backlog, interface)
        # (What reactor.listenSSL marks its ports with.)
        listening._type = "TLS"  # type: ignore[attr-defined]
        return listening


class _ServerTLSProtocol(TLSProtocol):
    """
    L{TLSProtocol} on a listening port: a handshake that fails is
    reported to the factory (L{ServerTLSFactory.handshake_failed}).
    """

    factory: "ServerTLSFactory"

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        # (Twisted's private state: the TLS error that ended the connection
        # and whether the handshake was done; read defensively, pinned by
        # tests/test_private_internals.py.)
        failure = getattr(self, "_reason", None) or reason
        if not getattr(self, "_handshakeDone", True) and failure.check(SSL.Error):
            self.factory.handshake_failed(self, failure)
        TLSProtocol.connectionLost(self, reason)


class ServerTLSFactory(TLSFactory):
    """
    rmqha's TLS layer on a listening port: a handshake that fails is one
    warning naming the peer's address, the port and the reason in words
    (L{describe_refusal}); the application protocol is told only that its
    connection was lost.

    At most L{LOG_BURST} such lines per L{LOG_WINDOW} seconds per port
    (a flood of bad clients must not fill the disk); the next line after
    a window with more says how many went unlogged.

    @ivar handshake_failures: handshakes that failed so far.
    """

    protocol = _ServerTLSProtocol
    _log = Logger()
    LOG_BURST = 10
    LOG_WINDOW = 10.0

    def __init__(
        self,
        creator: Any,
        wrapped: IProtocolFactory,
        clock: IReactorTime,
        name: str = "the HA port",
    ) -> None:
        """
        @param creator: the server's TLS settings (L{server_context}).
        @param name: the port in log lines (C{"the HA port"}).
        """
        super().__init__(creator, False, wrapped, clock=clock)
        self.name = name
        self.handshake_failures = 0
        self._log_clock = clock
        self._window_start: float | None = None
        self._logged = 0
        self._unlogged = 0

    def handshake_failed(self, protocol: TLSMemoryBIOProtocol, reason: Failure) -> None:
        self.handshake_failures += 1
        now = self._log_clock.seconds()
        if self._window_start is None or now - self._window_start >= self.LOG_WINDOW:
            self._window_start, self._logged = now, 0
        if self._logged >= self.LOG_BURST:
            self._unlogged += 1
            return
        self._logged += 1
        peer = getattr(protocol.transport, "getPeer", lambda: None)()
        host = str(getattr(peer, "host", peer))
        port = getattr(peer, "port", None)
        shown = f"[{host}]" if ":" in host else host
        unlogged, self._unlogged = self._unlogged, 0
        self._log.warn(
            "TLS handshake from {peer} on {port} failed: {why}"
            + (" ({unlogged} more failed on this port and were not logged)" if unlogged else ""),
            peer=shown if port is None else f"{shown}:{port}",
            port=self.name,
            why=describe_refusal(reason, protocol),
            unlogged=unlogged,
        )


# Why each connection's certificate verification failed, kept until the
# connection is gone: OpenSSL itself only says "certificate verify failed".
_verify_errors: "weakref.WeakKeyDictionary[object, str]" = weakref.WeakKeyDictionary()

_VERIFY_REASONS = {
    7: "has a bad signature",
    23: "has been revoked",
    24: "is signed by a certificate that is not a CA",
}


@implementer(IOpenSSLClientConnectionCreator)
class _VerifyingCreator:
    """
    Client TLS that verifies the server's certificate chain (OpenSSL) and
    its name (service_identity), recording why verification failed:
    OpenSSL's own error only says "certificate verify failed".

    Twisted's L{ssl.optionsForClientTLS} makes the context and sends the
    server name; its per-connection verify callback is replaced by one
    doing the same name check plus the recording (pyOpenSSL keeps one
    callback per connection).
    """

    def __init__(self, inner: IOpenSSLClientConnectionCreator, name: str) -> None:
        self._inner = inner
        self._name = name
        if isIPAddress(name) or isIPv6Address(name):
            self._service_id: Any = IPAddress_ID(name)
        else:
            self._service_id = DNS_ID(name)

    def clientConnectionForTLS(self, tlsProtocol: Any) -> SSL.Connection:
        connection = self._inner.clientConnectionForTLS(tlsProtocol)
        protocol = weakref.ref(tlsProtocol)
        service_id = self._service_id
        name = self._name

        def record(why: str) -> None:
            target = protocol()
            if target is not None and target not in _verify_errors:
                _verify_errors[target] = why

        def verify(conn: SSL.Connection, cert: Any, errno: int, depth: int, ok: int) -> bool:
            try:
                certificate = cert.to_cryptography()
                if not ok:
                    record(_chain_error(errno, certificate))
                    return False
                if depth != 0:
                    return True
                try:
                    verify_service_identity(extract_patterns(cert), [service_id], [])
                except VerificationError:
                    names = certificate_names(certificate)
                    record(
                        f"the master's certificate is not for {name} (it is for "
                        f"{', '.join(names) or 'no name'}); see --tls-server-name"
                    )
                    target = protocol()
                    if target is not None:
                        target.failVerification(Failure())
                    return False
                return True
            except Exception:
                # An exception escaping an OpenSSL callback is lost; refuse.
                record("verifying the master's certificate failed unexpectedly")
                return False

        connection.set_verify(SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT, verify)
        return connection


def _chain_error(errno: int, certificate: x509.Certificate, whose: str = "the master's") -> str:
    """
    Why OpenSSL's verification of a peer's chain failed, in words.

    @param whose: C{"the master's"} (a slave verifying its master) or
        C{"the client's"} (a port verifying a client).
    """
    if errno in (9, 10):
        state = "has expired" if errno == 10 else "is not valid yet"
        return (
            f"{whose} certificate ({certificate.subject.rfc4514_string()}) "
            f"{state}: valid {certificate.not_valid_before_utc:%Y-%m-%d %H:%M} to "
            f"{certificate.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
        )
    if errno in (18, 19):
        return (
            f"{whose} certificate chain ends at "
            f"{certificate.subject.rfc4514_string()}, which is not in --tls-ca"
        )
    if errno in (2, 20, 21):
        return (
            f"{whose} certificate (issuer {certificate.issuer.rfc4514_string()}) "
            "is not signed by a CA in --tls-ca"
        )
    if errno == 26:
        use = "server" if whose == "the master's" else "client"
        reason = f"is not meant for a TLS {use} (extended key usage)"
    else:
        reason = _VERIFY_REASONS.get(errno, f"failed verification (OpenSSL error {errno})")
    return f"{whose} certificate ({certificate.subject.rfc4514_string()}) {reason}"


def client_endpoint(
    reactor: Any, host: str, port: int, files: TLSFiles, server_name: str | None = None
) -> IStreamClientEndpoint:
    """
    A slave's endpoint to a TLS master at C{host:port}: the master's
    certificate must chain to C{files.ca} and name C{server_name} (default
    C{host}; an IP address is matched against IP subject alternative
    names); C{files.cert}/C{files.key}, when given, are this slave's
    certificate.
    """
    if files.ca is None:
        raise TLSError("TLS to the master needs --tls-ca (the master's CA)")
    options: dict[str, Any] = {"raiseMinimumTo": ssl.TLSVersion.TLSv1_2}
    if files.cert is not None or files.key is not None:
        key, certificate, chain = files.key_pair()
        options.update(privateKey=key, certificate=certificate, extraCertChain=chain or None)
    name = server_name or host
    creator = ssl.optionsForClientTLS(
        name, trustRoot=files.trust_root(), extraCertificateOptions=options
    )
    shown = f"[{host}]" if ":" in host else host
    return _DescribedEndpoint(
        _TLSClientEndpoint(
            _VerifyingCreator(creator, name), HostnameEndpoint(reactor, host, port), reactor
        ),
        f"tls:{shown}:{port} (verifying {name})",
    )


def _wrapped_protocol(protocol: Any) -> Any:
    return protocol.wrappedProtocol


@implementer(IStreamClientEndpoint)
class _TLSClientEndpoint:
    """
    Twisted's C{wrapClientTLS}, with rmqha's TLS layer (L{TLSFactory}).
    """

    def __init__(
        self,
        creator: IOpenSSLClientConnectionCreator,
        endpoint: IStreamClientEndpoint,
        clock: Any,
    ) -> None:
        self._creator = creator
        self._endpoint = endpoint
        self._clock = clock

    def connect(self, protocolFactory: IProtocolFactory) -> Any:
        factory = TLSFactory(self._creator, True, protocolFactory, clock=self._clock)
        return self._endpoint.connect(factory).addCallback(_wrapped_protocol)


@implementer(IStreamClientEndpoint)
class _DescribedEndpoint:
    """
    An endpoint that says what it connects to (C{/status} shows it).
    """

    def __init__(self, endpoint: IStreamClientEndpoint, description: str) -> None:
        self._endpoint = endpoint
        self.description = description

    def connect(self, protocolFactory: Any) -> Any:
        return self._endpoint.connect(protocolFactory)

    def __str__(self) -> str:
        return self.description


def describe_failure(reason: Failure, transport: object, handshake_done: bool) -> str:
    """
    One line saying why a TLS connection to the master ended before it
    carried anything.
    """
    recorded = _verify_errors.get(transport)
    if recorded is not None:
        return recorded
    if reason.check(SSL.Error):
        text = str(reason.value).lower()
        if "certificate required" in text:
            return "the master requires a client certificate (give --tls-cert and --tls-key)"
        if "unknown ca" in text:
            return "the master refused this slave's certificate: not signed by a CA it trusts"
        if "certificate expired" in text:
            return "the master refused this slave's certificate: it has expired"
        if "bad certificate" in text or "certificate unknown" in text:
            return "the master refused this slave's certificate"
        if "wrong version number" in text or "packet length too long" in text:
            return "the master does not speak TLS on this port (plain TCP?)"
        return f"TLS failed: {reason.value}"
    if handshake_done:
        return (
            "the master closed the connection after the TLS handshake without "
            "sending anything (is this slave's name in its --tls-allowed-peers? "
            f"the master's log says why): {reason.getErrorMessage()}"
        )
    return (
        "the TLS handshake did not complete (is the master serving TLS on "
        f"this port?): {reason.getErrorMessage()}"
    )


#: A listening port's handshake failures as OpenSSL words them (lower
#: case), and what they mean; the first match wins.
_REFUSALS = (
    (("peer did not return a certificate", "certificate required"),
     "the client presented no certificate (this port requires one signed by --tls-ca)"),
    (("http request", "https proxy request"),
     "the client spoke plain HTTP to this TLS port (use https://)"),
    (("wrong version number", "packet length too long", "unknown protocol", "record layer"),
     "the client does not speak TLS (plain TCP?)"),
    (("unsupported protocol", "no protocols available", "protocol version"),
     "the client offers no TLS version this port accepts (TLS 1.2 or later)"),
    (("no shared cipher", "no suitable signature algorithm"),
     "the client offers no cipher this port accepts"),
    (("alert unknown ca",),
     "the client refused this broker's certificate: it does not trust the CA that signed it"),
    (("alert certificate expired",),
     "the client refused this broker's certificate as expired"),
    (("alert bad certificate", "alert certificate unknown", "alert unsupported certificate"),
     "the client refused this broker's certificate"),
    (("no application protocol",),
     "the client and this port have no application protocol in common (ALPN)"),
    (("alert",), "the client ended the handshake with an alert"),
)


def describe_refusal(reason: Failure, transport: object) -> str:
    """
    Why a client's TLS handshake with a listening port failed, in words,
    followed by OpenSSL's own words: C{"the client's certificate (issuer
    O=other) is not signed by a CA in --tls-ca (certificate verify
    failed)"}.

    @param transport: the connection's TLS protocol (what verification
        failures are recorded under).
    """
    openssl = _openssl_words(reason)
    recorded = _verify_errors.get(transport)
    if recorded is not None:
        words = recorded
    else:
        text = openssl.lower()
        words = "TLS failed"
        for needles, meaning in _REFUSALS:
            if any(needle in text for needle in needles):
                words = meaning
                break
    return f"{words} ({openssl})" if openssl else words


def _openssl_words(reason: Failure) -> str:
    """
    The reasons in an C{SSL.Error} (a list of C{(library, function,
    reason)}), joined; its text when it is not such a list.
    """
    args = getattr(reason.value, "args", ())
    if args and isinstance(args[0], list):
        words = [str(entry[-1]) for entry in args[0] if isinstance(entry, tuple) and entry]
        if words:
            return "; ".join(words)
    return str(reason.value)


_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def _is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _plain_exposure(description: str) -> str | None:
    """
    Where a listening endpoint description serves plain TCP beyond
    loopback (an interface, or "all interfaces"), else C{None}.
    """
    kind, positional, keywords = split_description(description)
    if kind not in ("tcp", "tcp6") and not kind.isdigit():
        return None
    interface = keywords.get("interface", "")
    if interface and _is_loopback(interface):
        return None
    return interface or ("all interfaces" if kind != "tcp6" else "all IPv6 interfaces")


class ExposureWarning(NamedTuple):
    """
    A warning about traffic in the clear, as a log event: a
    C{twisted.logger} format string and its fields, so the event keeps
    them (C{log.warn(w.format, **w.fields)}); C{str()} is the text.
    """

    format: str
    fields: dict[str, str]

    def __str__(self) -> str:
        return self.format.format(**self.fields)


def exposure_warning(description: str) -> ExposureWarning | None:
    """
    For a master's listening endpoint description: a warning when it is
    plain TCP on an interface other than loopback (the commit log is then
    open to anyone who reaches the port), else C{None}.
    """
    where = _plain_exposure(description)
    if where is None:
        return None
    return ExposureWarning(
        "the HA port {description} is plain TCP on {where}: anyone who reaches "
        "it can copy the whole commit log and fake acknowledgements; use "
        "--ha-listen ssl:PORT with --tls-cert/--tls-key/--tls-ca and "
        "--tls-require-client-cert (docs/tls.md), or bind it to loopback",
        {"description": description, "where": where},
    )


def admin_exposure_warning(description: str) -> ExposureWarning | None:
    """
    For the admin HTTP port's endpoint description: a warning when it is
    plain TCP on an interface other than loopback, else C{None}.
    """
    where = _plain_exposure(description)
    if where is None:
        return None
    return ExposureWarning(
        "the admin HTTP port {description} is plain TCP on {where} without "
        "authentication: anyone who reaches it can put messages and read the "
        "broker's status; use --http ssl:PORT with --tls-cert/--tls-key/--tls-ca "
        "(client certificates required; docs/admin.md), or bind it to loopback",
        {"description": description, "where": where},
    )


def commitlog_exposure_warning(description: str) -> ExposureWarning | None:
    """
    For the admin HTTP port serving the commit log (C{--serve-commitlog}):
    a warning when it is plain TCP on an interface other than loopback.
    """
    where = _plain_exposure(description)
    if where is None:
        return None
    return ExposureWarning(
        "--serve-commitlog on the admin HTTP port {description}, plain TCP on "
        "{where}: every message body in the commit log is readable by anyone "
        "who reaches it; use --http ssl:PORT (client certificates required; "
        "docs/admin.md), or bind it to loopback",
        {"description": description, "where": where},
    )


def plain_master_warning(host: str) -> ExposureWarning | None:
    """
    For a slave following C{host} over plain TCP: a warning unless it is
    loopback.
    """
    if _is_loopback(host):
        return None
    return ExposureWarning(
        "replicating from {host} over plain TCP: the commit log crosses the "
        "network unencrypted and the master is not authenticated; give "
        "--tls-ca (docs/tls.md)",
        {"host": host},
    )


#: What a plain slave says when its master answers with a TLS record.
PLAIN_SLAVE_TLS_MASTER_HINT = (
    "the master seems to speak TLS (it answered with a TLS record): give this "
    "slave --tls-ca with the master's CA to follow it over TLS (docs/tls.md)"
)


def looks_like_tls(data: bytes | bytearray) -> bool:
    """
    Whether C{data}, the first bytes a plain connection received, start a
    TLS record (an alert or a handshake, version 3.x): a TLS server
    answering bytes that were not a TLS hello.
    """
    return len(data) >= 2 and data[0] in (0x15, 0x16) and data[1] == 0x03
