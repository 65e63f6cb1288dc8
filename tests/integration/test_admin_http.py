"""
The admin HTTP port over real loopback sockets (pytest-twisted): served
over TLS with client certificates from the brokers' PKI, and a huge
declared body refused before it is read.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure

from rmqha import certs
from rmqha.broker import Broker, Role
from rmqha.tls import PeerPolicy, TLSFiles, server_endpoint

from tests.integration._support import make_broker

SEGMENT = 1024 * 1024


class _Exchange(Protocol):
    """
    Sends C{request} once connected; C{done} fires with every byte
    received when the connection closes.
    """

    def __init__(self, request: bytes) -> None:
        self.request = request
        self.received = b""
        self.done: Deferred[bytes] = Deferred()

    def connectionMade(self) -> None:
        self.transport.write(self.request)  # type: ignore[union-attr]

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        self.done.callback(self.received)


async def _exchange(endpoint: Any, request: bytes) -> bytes:
    protocol = _Exchange(request)
    try:
        await endpoint.connect(Factory.forProtocol(lambda: protocol))
    except Exception:
        return b""
    return await protocol.done


def _answer(data: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = data.partition(b"\r\n\r\n")
    code = int(head.split()[1])
    if b"transfer-encoding: chunked" in head.lower():
        size, _, rest = body.partition(b"\r\n")
        body = rest[: int(size, 16)]
    return code, json.loads(body)


def _pki(directory: str) -> dict[str, TLSFiles]:
    os.makedirs(directory)
    ca = certs.make_ca()
    ca_path, _ = certs.write_pair(ca, directory, "ca")

    def pair(stem: str, issued: certs.Issued) -> TLSFiles:
        cert, key = certs.write_pair(issued, directory, stem)
        return TLSFiles(cert, key, ca_path)

    return {
        "master": pair("master", certs.issue(ca, "master", ["master", "localhost"],
                                             ["127.0.0.1"], server=True)),
        "ops": pair("ops", certs.issue(ca, "ops", ["ops"], client=True)),
        "slave-1": pair("slave-1", certs.issue(ca, "slave-1", ["slave-1"], client=True)),
    }


def _client(reactor: Any, port: int, files: TLSFiles) -> Any:
    from twisted.internet.endpoints import TCP4ClientEndpoint, wrapClientTLS
    from twisted.internet.ssl import PrivateCertificate, optionsForClientTLS

    client_certificate = None
    if files.cert is not None and files.key is not None:
        with open(files.cert) as c, open(files.key) as k:
            client_certificate = PrivateCertificate.loadPEM(c.read() + k.read())
    options = optionsForClientTLS(
        "localhost", trustRoot=files.trust_root(), clientCertificate=client_certificate
    )
    return wrapClientTLS(options, TCP4ClientEndpoint(reactor, "127.0.0.1", port))


class _Coordinator:
    def status(self) -> dict[str, Any]:
        return {"coordinator": "etcd:https://10.0.0.1:2379", "coordinator_error": None}


STATUS = b"GET /status HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"


@pytest_twisted.ensureDeferred
async def test_admin_over_tls(tmp_path: Any) -> None:
    """
    C{--http ssl:…}: a client with a certificate from the CA and an allowed
    name gets C{/status}; one whose name is not in C{--http-allowed-peers}
    gets 403 JSON before anything is served; one without a certificate is
    refused in the handshake (no HTTP answer at all).  The client it
    verified sees where the coordinator is (hidden from others:
    tests/test_admin.py).
    """
    from twisted.internet import reactor

    pki = _pki(str(tmp_path / "pki"))
    policy = PeerPolicy(
        require_client_cert=True,
        allowed_peers=frozenset({"ops"}),
        allowlist_flag="--http-allowed-peers",
    )
    broker: Broker = make_broker(
        reactor,
        str(tmp_path / "master"),
        Role.MASTER,
        SEGMENT,
        ha_listen="tcp:0:interface=127.0.0.1",
        http=server_endpoint(
            reactor, "ssl:0:interface=127.0.0.1", pki["master"], policy, "--http"
        ),
        http_peer_policy=policy,
        failover=_Coordinator(),
    )
    broker.startService()
    try:
        port = (await broker.getServiceNamed("http").address()).port
        code, answer = _answer(await _exchange(_client(reactor, port, pki["ops"]), STATUS))
        assert (code, answer["role"]) == (200, "ASYNC_MASTER")
        assert answer["failover"]["coordinator"] == "etcd:https://10.0.0.1:2379"
        code, answer = _answer(await _exchange(_client(reactor, port, pki["slave-1"]), STATUS))
        assert (code, answer["status"]) == (403, "FORBIDDEN")
        assert "slave-1, none of them in --http-allowed-peers" in answer["error"]
        anonymous = TLSFiles(ca=pki["ops"].ca)
        data = await _exchange(_client(reactor, port, anonymous), STATUS)
        assert b"HTTP/1.1" not in data
    finally:
        await broker.stopService()


@pytest_twisted.ensureDeferred
async def test_huge_body_refused_over_tcp(tmp_path: Any) -> None:
    """
    A real client declaring a 2 GiB body gets 413 JSON and the
    connection closed as soon as its headers are in; nothing is stored.
    """
    from twisted.internet import reactor
    from twisted.internet.endpoints import TCP4ClientEndpoint

    broker: Broker = make_broker(
        reactor,
        str(tmp_path / "master"),
        Role.MASTER,
        SEGMENT,
        ha_listen="tcp:0:interface=127.0.0.1",
        http="tcp:0:interface=127.0.0.1",
    )
    broker.startService()
    try:
        port = (await broker.getServiceNamed("http").address()).port
        request = (
            b"POST /topics/Orders/messages HTTP/1.1\r\nHost: x\r\n"
            b"Content-Length: 2147483648\r\n\r\n" + b"x" * 4096
        )
        data = await _exchange(TCP4ClientEndpoint(reactor, "127.0.0.1", port), request)
        code, answer = _answer(data)
        assert (code, answer["status"]) == (413, "REQUEST_TOO_LARGE")
        assert broker.commitlog.max_offset == 0
    finally:
        await broker.stopService()


def _python_https(port: int, files: TLSFiles, path: str) -> tuple[str | None, int, bytes]:
    """
    C{GET path} with Python's default TLS client context offering ALPN
    (C{h2}, C{http/1.1}) as browsers do: C{(selected protocol, status,
    body)}.  Blocking: run in a thread.
    """
    import socket
    import ssl

    context = ssl.create_default_context(cafile=files.ca)
    assert files.cert is not None and files.key is not None
    context.load_cert_chain(files.cert, files.key)
    context.set_alpn_protocols(["h2", "http/1.1"])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            selected = tls.selected_alpn_protocol()
            if path:
                tls.sendall(
                    f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
                )
            data = b""
            while path:
                chunk = tls.recv(65536)
                if not chunk:
                    break
                data += chunk
    if not path:
        return selected, 0, b""
    head, _, body = data.partition(b"\r\n\r\n")
    return selected, int(head.split()[1]), body


@pytest_twisted.ensureDeferred
async def test_clients_offering_alpn(tmp_path: Any) -> None:
    """
    Clients that offer ALPN, as curl, browsers, Prometheus and Python's
    C{ssl} do by default, are served on every TLS port: the admin port
    answers Python's default context (C{h2}, C{http/1.1} offered:
    C{http/1.1} selected) and curl with its default options (where curl
    is installed) with 200; the HA port, which offers no protocol,
    completes a handshake selecting none.  Nothing is logged as a failed
    handshake.
    """
    import shutil

    from twisted.internet import reactor, threads, utils
    from twisted.logger import formatEvent, globalLogPublisher

    pki = _pki(str(tmp_path / "pki"))
    events: list[str] = []

    def observe(event: dict[str, Any]) -> None:
        events.append(formatEvent(event))

    http_policy = PeerPolicy(
        require_client_cert=True,
        allowed_peers=frozenset({"ops"}),
        allowlist_flag="--http-allowed-peers",
    )
    ha_policy = PeerPolicy(require_client_cert=True)
    broker: Broker = make_broker(
        reactor,
        str(tmp_path / "master"),
        Role.MASTER,
        SEGMENT,
        ha_listen=server_endpoint(reactor, "ssl:0:interface=127.0.0.1", pki["master"], ha_policy),
        http=server_endpoint(
            reactor, "ssl:0:interface=127.0.0.1", pki["master"], http_policy, "--http"
        ),
        http_peer_policy=http_policy,
    )
    globalLogPublisher.addObserver(observe)
    broker.startService()
    try:
        port = (await broker.getServiceNamed("http").address()).port
        ha_port = (await broker.ha_address()).port
        selected, code, body = await threads.deferToThread(
            _python_https, port, pki["ops"], "/status"
        )
        assert (selected, code, json.loads(body)["role"]) == ("http/1.1", 200, "ASYNC_MASTER")
        curl = shutil.which("curl")
        if curl is not None:
            ops = pki["ops"]
            out, err, status = await utils.getProcessOutputAndValue(
                curl,
                [
                    "-sS", "-o", "/dev/null", "-w", "%{http_code} %{http_version}",
                    "--cacert", str(ops.ca), "--cert", str(ops.cert), "--key", str(ops.key),
                    f"https://127.0.0.1:{port}/status",
                ],
            )
            assert (status, out, err) == (0, b"200 1.1", b"")
        selected, _, _ = await threads.deferToThread(_python_https, ha_port, pki["slave-1"], "")
        assert selected is None
        assert not [e for e in events if "TLS handshake from" in e], events
    finally:
        globalLogPublisher.removeObserver(observe)
        await broker.stopService()
