# -*- test-case-name: tests.test_admin,tests.test_admin_view,tests.test_admin_commitlog -*-
"""
The admin HTTP interface (twisted.web), served on C{--http ENDPOINT}:

    GET  /status                      JSON: offsets, and each slave or the master
                                      (in failover mode, where etcd is only for
                                      a verified client certificate)
    GET  /metrics                     the same figures as Prometheus text
    POST /topics/{topic}/messages     the request body becomes one message
                                      (query: queueId, tags, keys)
    POST /topics/{topic}/batch        many messages (JSON, or length-prefixed
                                      binary), one verdict each
    GET  /commitlog                   with --serve-commitlog RATE: the
                                      segment files and the max offset
    GET  /commitlog/{segment}         a segment's bytes (one Range), read-only,
                                      paced at RATE for all readers together

Every answer, errors included, is JSON C{{"status": ..., "error": ...}}
with a 4xx/5xx code; see docs/admin.md for the statuses and limits.

Its rooms:

    L{rmqha.admin.channel}    the HTTP layer, bounded for unauthenticated peers
    L{rmqha.admin.resource}   JSON answers and errors shared by the resources
    L{rmqha.admin.view}       the read-only status view model (/status's JSON)
    L{rmqha.admin.metrics}    the Prometheus collector (/metrics)
    L{rmqha.admin.put}        the put endpoints (/topics/{topic}/messages, /batch)
    L{rmqha.admin.commitlog}  commit-log serving (/commitlog)
    L{rmqha.admin.service}    L{AdminRoot}, L{make_site}, L{AdminService}
"""

from rmqha.admin.channel import HEADER_TIMEOUT, IDLE_TIMEOUT, MAX_REQUEST_BODY
from rmqha.admin.put import master_hint
from rmqha.admin.service import AdminRoot, AdminService, certificate_verified, make_site
from rmqha.admin.view import hide_coordinator, status

__all__ = [
    "AdminService",
    "AdminRoot",
    "status",
    "make_site",
    "master_hint",
    "hide_coordinator",
    "certificate_verified",
    "MAX_REQUEST_BODY",
    "HEADER_TIMEOUT",
    "IDLE_TIMEOUT",
]
