# -*- test-case-name: tests.test_admin,tests.test_admin_commitlog -*-
"""
The admin interface put together: L{AdminRoot} (the resources, and
C{GET /status}), L{make_site} (the one C{Site} the broker serves) and
L{AdminService} (its port, a child of the broker).
"""

from __future__ import annotations

from typing import Any

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from rmqha._ports import Port, listen
from rmqha.admin.channel import HEADER_TIMEOUT, IDLE_TIMEOUT, MAX_REQUEST_BODY, AdminSite
from rmqha.admin.commitlog import CommitLogOff, CommitLogResource, CommitLogServer
from rmqha.admin.metrics import MetricsResource
from rmqha.admin.put import Topics
from rmqha.admin.resource import AdminResource, NotFound, json_answer
from rmqha.admin.view import FailoverSource, hide_coordinator, status
from rmqha.broker import Broker
from rmqha.tls import PeerPolicy, admin_exposure_warning, commitlog_exposure_warning

__all__ = ["AdminRoot", "AdminService", "make_site", "certificate_verified"]


def certificate_verified(request: Request) -> bool:
    """
    Whether C{request} came over TLS from a client whose certificate the
    admin port verified: the port requires client certificates from its
    CA (L{PeerPolicy.require_client_cert}), and the certificate passes
    C{--http-allowed-peers} when that is set.
    """
    channel = getattr(request, "channel", None)
    policy = getattr(channel, "peer_policy", None)
    if not isinstance(policy, PeerPolicy) or not policy.require_client_cert:
        return False
    get_certificate = getattr(getattr(channel, "transport", None), "getPeerCertificate", None)
    x509 = get_certificate() if get_certificate is not None else None
    if x509 is None:
        return False
    _, refusal = policy.check(x509.to_cryptography())
    return refusal is None


class StatusResource(AdminResource):
    """
    C{GET /status}: the status view as JSON, the coordinator hidden from a
    caller without a verified client certificate.
    """

    isLeaf = True

    def __init__(
        self,
        broker: Broker,
        commitlog: CommitLogServer | None = None,
        failover: FailoverSource | None = None,
    ) -> None:
        super().__init__()
        self._broker = broker
        self._commitlog = commitlog
        self._failover = failover

    def render_GET(self, request: Request) -> bytes:
        result = status(self._broker, self._failover)
        failover = result.get("failover")
        if failover is not None and not certificate_verified(request):
            result["failover"] = hide_coordinator(failover)
        # Bytes/s GET /commitlog/{segment} is paced at (0: not served).
        result["serve_commitlog"] = self._commitlog.rate if self._commitlog else 0
        return json_answer(request, 200, result)


class AdminRoot(AdminResource):
    """
    The admin interface's root resource, for a C{twisted.web.server.Site}.
    """

    def __init__(
        self,
        broker: Broker,
        commitlog: CommitLogServer | None = None,
        failover: FailoverSource | None = None,
    ) -> None:
        """
        @param commitlog: serve the commit log's segment files (read-only,
            paced) under C{/commitlog}; C{None}: not served (404).
        @param failover: the broker's failover coordinator, if any (its
            status is shown; a slave's refusals name the elected master).
        """
        super().__init__()
        self.putChild(b"status", StatusResource(broker, commitlog, failover))
        self.putChild(b"metrics", MetricsResource(broker, commitlog, failover))
        self.putChild(b"topics", Topics(broker, failover))
        self.putChild(
            b"commitlog",
            CommitLogResource(broker, commitlog) if commitlog is not None else CommitLogOff(),
        )

    def getChild(self, path: bytes, request: Request) -> Resource:
        return NotFound()


def make_site(
    broker: Broker,
    *,
    reactor: IReactorTime | None = None,
    max_body: int = MAX_REQUEST_BODY,
    header_timeout: float | None = HEADER_TIMEOUT,
    idle_timeout: float | None = IDLE_TIMEOUT,
    peer_policy: PeerPolicy | None = None,
    serve_commitlog: int = 0,
    failover: FailoverSource | None = None,
    access_log: str | None = None,
) -> Site:
    """
    The admin interface of C{broker} as the factory its HTTP port serves
    (the one place it is built; wrap it to limit connections).

    @param reactor: the clock for timeouts (default: the broker's reactor).
    @param max_body: the largest request body read, in bytes.
    @param header_timeout: seconds for a request line and headers to
        arrive, however slowly; C{None} for no limit.
    @param idle_timeout: seconds of silence that close a connection.
    @param peer_policy: served over TLS with client certificates, the
        names a client certificate must carry (C{allowed_peers}); checked
        before a request's body is read (403).
    @param serve_commitlog: bytes per second at which C{/commitlog}
        serves segment files to all readers together; 0: not served.
    @param failover: the broker's failover coordinator, if any.
    @param access_log: a file to write a line per request to (Combined
        Log Format), rotated (L{AdminSite}); C{None}, no request is logged
        (an access log of every put would dwarf the broker's own lines).
    """
    clock = reactor if reactor is not None else broker.reactor
    served = CommitLogServer(serve_commitlog, clock) if serve_commitlog > 0 else None
    return AdminSite(
        AdminRoot(broker, served, failover),
        clock,
        max_body,
        header_timeout,
        idle_timeout,
        peer_policy,
        access_log=access_log,
    )


class AdminService(Port):
    """
    The admin interface of a broker on its own port: set it as a child of
    the broker (C{AdminService(broker, "tcp:8080").setServiceParent(broker)}),
    which listens on it with the HA port, before opening the store.
    """

    _log = Logger()

    def __init__(
        self,
        broker: Broker,
        where: Any,
        peer_policy: PeerPolicy | None = None,
        serve_commitlog: int = 0,
        failover: FailoverSource | None = None,
        access_log: str | None = None,
    ) -> None:
        """
        @param failover: the broker's failover coordinator, if any
            (L{make_site}).
        @param access_log: the access log's path (L{make_site}), or C{None}.
        @param where: a Twisted server endpoint description (plain TCP
            beyond loopback is warned about), or an endpoint
            (L{rmqha.tls.server_endpoint} for TLS requiring client
            certificates).
        @param peer_policy: the names an admin client's TLS certificate
            must carry (L{make_site}).
        @param serve_commitlog: bytes/s for C{/commitlog} (L{make_site}).
        """
        self.broker = broker
        self.where = where
        self.peer_policy = peer_policy
        self.serve_commitlog = serve_commitlog
        self.failover = failover
        self.access_log = access_log
        self.setName("http")  # type: ignore[no-untyped-call]

    def listen(self, limited: Any) -> None:
        if self.port is not None:
            return
        if isinstance(self.where, str):
            warning = admin_exposure_warning(self.where)
            if warning is not None:
                self._log.warn(warning.format, **warning.fields)
            if self.serve_commitlog:
                warning = commitlog_exposure_warning(self.where)
                if warning is not None:
                    self._log.warn(warning.format, **warning.fields)
        site = make_site(
            self.broker,
            peer_policy=self.peer_policy,
            serve_commitlog=self.serve_commitlog,
            failover=self.failover,
            access_log=self.access_log,
        )
        self.port = listen(self.broker.reactor, "http", self.where, limited("HTTP", site))
