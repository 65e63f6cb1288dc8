# -*- test-case-name: tests.test_admin -*-
"""
What every admin resource shares: answers in JSON, C{{"status": ...,
"error": ...}} for errors, and a method a resource does not serve
answered 405 (with C{Allow}) when HTTP defines it, 501 when not, 404
where nothing is served at all.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.python.reflect import prefixedMethodNames
from twisted.web.resource import Resource
from twisted.web.server import Request

__all__ = ["AdminResource", "NotFound", "json_answer", "error_answer", "finish_answer"]

#: Methods HTTP defines (RFC 9110, and PATCH): 405 where not served, 501
#: for any other.
_KNOWN_METHODS = frozenset(
    [b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"CONNECT", b"OPTIONS", b"TRACE", b"PATCH"]
)


def json_answer(request: Request, code: int, body: dict[str, Any]) -> bytes:
    """
    C{body} as the JSON answer, with C{code}.
    """
    request.setResponseCode(code)
    request.setHeader(b"content-type", b"application/json")
    return json.dumps(body).encode() + b"\n"


def error_answer(request: Request, code: int, status: str, error: str, **extra: Any) -> bytes:
    """
    An error answer: C{{"status": status, "error": error, **extra}}.
    """
    return json_answer(request, code, {"status": status, "error": error, **extra})


def finish_answer(request: Request, data: bytes) -> None:
    """
    Write C{data} (a L{json_answer}) as the whole answer of a request
    rendered with C{NOT_DONE_YET}, and finish it: with its
    C{Content-Length}, not chunked.
    """
    request.setHeader(b"content-length", b"%d" % len(data))
    request.write(data)
    request.finish()


#: Per resource class, the methods it serves (its C{render_*}): found once.
_SERVED: dict[type, list[bytes]] = {}


def _served(cls: type) -> list[bytes]:
    served = _SERVED.get(cls)
    if served is None:
        served = _SERVED[cls] = [
            name.encode("ascii")
            for name in prefixedMethodNames(cls, "render_")
            if name != "HEAD" or hasattr(cls, "render_GET")
        ]
    return served


class AdminResource(Resource):
    """
    A resource answering a method it does not serve with JSON: 405 (with
    C{Allow}) for a method HTTP defines, 501 for any other; 404 where
    nothing is served at all.
    """

    def __init__(self) -> None:
        Resource.__init__(self)

    def render(self, request: Request) -> bytes | int:
        method = request.method
        # (Walking the class's methods for every request cost ~5 % of a put.)
        allowed = _served(type(self))
        if method not in allowed:
            if method not in _KNOWN_METHODS:
                shown = method.decode("ascii", "replace")
                return error_answer(request, 501, "NOT_IMPLEMENTED", f"unknown method {shown!r}")
            path = request.path.decode("utf-8", "replace")
            if not allowed:
                return error_answer(request, 404, "NOT_FOUND", f"no resource at {path}")
            request.setHeader(b"allow", b", ".join(sorted(allowed)))
            return error_answer(
                request,
                405,
                "METHOD_NOT_ALLOWED",
                f"{method.decode('ascii')} is not allowed on {path} "
                f"(allowed: {', '.join(a.decode() for a in sorted(allowed))})",
            )
        result: bytes | int = Resource.render(self, request)
        return result


class NotFound(AdminResource):
    """
    Serves nothing: 404 for any method HTTP defines, 501 for others.
    """

    isLeaf = True

