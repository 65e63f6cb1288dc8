# -*- test-case-name: tests.test_httpstore -*-
"""
A live broker as a pipeline store: C{rmqha+http://HOST:PORT} and
C{rmqha+https://HOST:PORT} read a broker's commit log through its admin
HTTP (C{--serve-commitlog}; docs/admin.md, "The commit log"):

    GET /commitlog               the segment files (L{HttpStore.segments})
    GET /commitlog/{name}        one byte range of one (L{SegmentReader.read_at})

Plain blocking stdlib HTTP (C{http.client}, C{ssl}): it runs in Spark's
Python workers, with no reactor.  Persistent connections per open
segment, one per read under way (the read-ahead's:
L{SegmentReader.blocks}), opened lazily (nothing of them is pickled),
closed with it.  Each read asks for exactly the bytes it
wants (one C{Range}) and accepts exactly those: an answer longer, shorter
or elsewhere than asked is an error, never a buffer.  The broker sends
bytes at and past its max offset as zeros, so a reader never sees a
record still being written.

Over TLS the client certificate, key and CA come from the data-source
options C{tlsCert}, C{tlsKey}, C{tlsCa} (file paths every executor must
have; the keys may arrive lower-cased), else the environment's
C{RMQHA_TLS_CERT}, C{RMQHA_TLS_KEY}, C{RMQHA_TLS_CA}; the broker's
certificate must name the host of the location.
"""

from __future__ import annotations

import errno
import http.client
import json
import os
import random
import socket
import ssl
import threading
import time
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

from rmqha.pipeline._store import (
    SEGMENT_NAME,
    Segment,
    SegmentReader,
    Store,
    PlanError,
)

__all__ = ["HttpStore", "TIMEOUT", "BUSY_RETRIES", "MAX_LISTING"]

#: Seconds a connection, or an answer's next bytes, may take.
TIMEOUT = 60.0
#: Times a read answered 503 (the broker's commit-log streams are all
#: busy) is tried again, waiting as its C{Retry-After} says or longer.
BUSY_RETRIES = 8
#: The largest C{GET /commitlog} answer read (some 80 bytes a segment).
MAX_LISTING = 8 << 20

#: The TLS files: data-source option, environment variable.
_TLS_OPTIONS = {
    "cert": ("tlsCert", "RMQHA_TLS_CERT"),
    "key": ("tlsKey", "RMQHA_TLS_KEY"),
    "ca": ("tlsCa", "RMQHA_TLS_CA"),
}


def _option(options: Mapping[str, str], name: str) -> str | None:
    for key, value in options.items():
        if key.lower() == name.lower() and value:
            return value
    return None


def _server_error(body: bytes) -> str:
    """
    The broker's one-line JSON C{error}, or the start of whatever it sent.
    """
    try:
        answer = json.loads(body)
        text = str(answer.get("error") or answer.get("status"))
    except (ValueError, AttributeError):
        text = body[:200].decode("utf-8", "replace").strip()
    return " ".join(text.split())


class HttpStore(Store):
    """
    The commit log of a live broker at C{rmqha+http(s)://HOST:PORT}.
    """

    def __init__(
        self,
        scheme: str,
        host: str,
        port: int,
        tls: Mapping[str, str | None] | None = None,
        *,
        timeout: float = TIMEOUT,
        busy_retries: int = BUSY_RETRIES,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """
        @param scheme: C{rmqha+http} or C{rmqha+https}.
        @param tls: with C{rmqha+https}, the C{cert}, C{key} and C{ca}
            file paths (each may be C{None}: no client certificate, the
            system's CAs).
        @param sleep: how to wait before retrying a busy broker.
        """
        self.scheme = scheme
        self.host = host
        self.port = port
        self.tls = dict(tls or {})
        self.timeout = timeout
        self.busy_retries = busy_retries
        self._sleep = sleep
        shown = f"[{host}]" if ":" in host else host
        self.uri = f"{scheme}://{shown}:{port}"
        self._context: ssl.SSLContext | None = None
        self._max_offset: int | None = None

    @classmethod
    def from_location(cls, location: str, options: Mapping[str, str]) -> "HttpStore":
        """
        The store at C{location} (C{rmqha+http(s)://HOST:PORT}, no path but
        C{/}), with TLS files from C{options} or the environment.

        @raise PlanError: naming the location or the option.
        """
        parts = urlsplit(location)
        scheme = parts.scheme.lower()
        if scheme not in ("rmqha+http", "rmqha+https"):
            raise PlanError(f"{location}: not an rmqha+http(s):// location")
        try:
            port = parts.port
        except ValueError:
            raise PlanError(f"{location}: the port is not a number from 1 to 65535") from None
        if not parts.hostname or port is None or port == 0:
            raise PlanError(f"{location}: give HOST:PORT of the broker's admin HTTP")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise PlanError(
                f"{location}: a live broker's location is {scheme}://HOST:PORT "
                f"(no path or query: {parts.path}{'?' if parts.query else ''}{parts.query})"
            )
        if parts.username or parts.password:
            raise PlanError(f"{location}: no user or password: TLS client certificates")
        tls: dict[str, str | None] = {}
        for what, (option, variable) in _TLS_OPTIONS.items():
            path = _option(options, option)
            if path is not None and scheme == "rmqha+http":
                raise PlanError(
                    f"{location}: the {option} option is for rmqha+https://, not plain HTTP"
                )
            if scheme == "rmqha+https":
                # The environment applies to TLS locations only.
                path = path or os.environ.get(variable) or None
            if path is not None:
                if not os.path.isfile(path):
                    raise PlanError(f"{option} {path}: no such file")
            tls[what] = path
        if bool(tls.get("cert")) != bool(tls.get("key")):
            raise PlanError(
                f"{location}: give tlsCert and tlsKey together (the client certificate and its key)"
            )
        return cls(scheme, parts.hostname, port, tls if scheme == "rmqha+https" else None)

    def __getstate__(self) -> dict[str, Any]:
        return {
            "scheme": self.scheme,
            "host": self.host,
            "port": self.port,
            "tls": self.tls,
            "timeout": self.timeout,
            "busy_retries": self.busy_retries,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["scheme"],
            state["host"],
            state["port"],
            state["tls"],
            timeout=state["timeout"],
            busy_retries=state["busy_retries"],
        )

    # -- connections ---------------------------------------------------------

    def _ssl_context(self) -> ssl.SSLContext:
        if self._context is None:
            cert, key, ca = self.tls.get("cert"), self.tls.get("key"), self.tls.get("ca")
            try:
                context = ssl.create_default_context(cafile=ca)
                if cert is not None:
                    context.load_cert_chain(cert, key)
            except OSError as e:
                # A missing file on this executor, or one that is not PEM.
                raise OSError(
                    e.errno or errno.EINVAL,
                    f"TLS files for {self.uri} (cert {cert}, key {key}, ca {ca}): "
                    f"{e.strerror or e}",
                    self.uri,
                ) from None
            self._context = context
        return self._context

    def _connect(self) -> http.client.HTTPConnection:
        if self.scheme == "rmqha+https":
            return http.client.HTTPSConnection(
                self.host, self.port, timeout=self.timeout, context=self._ssl_context()
            )
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def request(
        self,
        connection: http.client.HTTPConnection,
        path: str,
        headers: Mapping[str, str],
        location: str,
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """
        C{GET path} on C{connection} (a new one, once, if the kept-alive
        one was dropped; the broker's 503 retried as it asks); the
        connection used and the answer, headers read.

        @raise OSError: naming C{location}.
        """
        url = f"{self.uri}{path}"
        busy = 0
        reused = connection.sock is not None
        while True:
            try:
                connection.request("GET", path, headers=dict(headers))
                response = connection.getresponse()
            except (
                http.client.RemoteDisconnected,
                ConnectionResetError,
                BrokenPipeError,
                ssl.SSLEOFError,
                ssl.SSLZeroReturnError,
            ) as e:
                connection.close()
                if reused:
                    # The broker closed an idle kept-alive connection.
                    reused = False
                    continue
                raise OSError(e.errno or errno.ECONNRESET, f"{url}: {_reason(e)}", location) from None
            except ssl.SSLError as e:
                connection.close()
                hint = ""
                if not self.tls.get("cert"):
                    hint = " (no client certificate given: tlsCert/tlsKey options or RMQHA_TLS_CERT/RMQHA_TLS_KEY)"
                raise OSError(errno.EPROTO, f"{url}: TLS: {_reason(e)}{hint}", location) from None
            except (socket.timeout, TimeoutError):
                connection.close()
                raise OSError(
                    errno.ETIMEDOUT, f"{url}: no answer within {self.timeout:g} s", location
                ) from None
            except (OSError, http.client.HTTPException) as e:
                connection.close()
                raise OSError(
                    getattr(e, "errno", None) or errno.EIO, f"{url}: {_reason(e)}", location
                ) from None
            reused = True
            if response.status != 503 or busy >= self.busy_retries:
                return connection, response
            _read(response, 64 * 1024, url, location)  # drained: the connection is reused
            busy += 1
            self._sleep(_busy_delay(response.getheader("retry-after"), busy))

    def _get_json(self, path: str) -> Any:
        url = f"{self.uri}{path}"
        connection, response = self.request(self._connect(), path, {}, self.uri)
        try:
            body = _read(response, MAX_LISTING, url, self.uri)
        finally:
            connection.close()
        if response.status != 200:
            why = f"{url}: HTTP {response.status}: {_server_error(body)}"
            if response.status in (403, 404):
                raise PlanError(why)
            raise OSError(errno.EIO, why, self.uri)
        try:
            return json.loads(body)
        except ValueError:
            raise OSError(errno.EPROTO, f"{url}: the answer is not JSON", self.uri) from None

    # -- Store ---------------------------------------------------------------

    def segments(self) -> list[Segment]:
        answer = self._get_json("/commitlog")
        try:
            out = [
                Segment(int(s["offset"]), str(s["name"]), int(s["size"]))
                for s in answer["segments"]
            ]
        except (KeyError, TypeError, ValueError):
            raise OSError(
                errno.EPROTO, f"{self.uri}/commitlog: not a commit-log listing", self.uri
            ) from None
        for segment in out:
            if not SEGMENT_NAME.match(segment.name) or int(segment.name) != segment.base:
                raise OSError(
                    errno.EPROTO,
                    f"{self.uri}/commitlog: a segment named {segment.name[:40]!r} at "
                    f"offset {segment.base}",
                    self.uri,
                )
        if not out:
            raise PlanError(f"{self.uri}: the broker's commit log has no segment yet")
        max_offset = answer.get("max_offset")
        self._max_offset = max_offset if isinstance(max_offset, int) else None
        return sorted(out, key=lambda s: s.base)

    def max_offset(self) -> int | None:
        """
        Where whole records ended when the segments were listed, as the
        broker said (no segment read to find it).
        """
        if self._max_offset is None:
            self.segments()
        return self._max_offset

    def location(self, segment: Segment) -> str:
        return f"{self.uri}/commitlog/{segment.name}"

    def open(self, segment: Segment) -> SegmentReader:
        if not SEGMENT_NAME.match(segment.name):
            raise OSError(errno.ENOENT, f"not a segment name: {segment.name[:40]!r}", self.uri)
        return _HttpReader(self, segment)


def _reason(e: BaseException) -> str:
    text = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return " ".join(str(text).split())


def _busy_delay(retry_after: str | None, attempt: int) -> float:
    """
    Seconds before try C{attempt + 1} of a busy read: what C{Retry-After}
    says, or more as attempts go on (to 8 s), with jitter so executors
    spread out.
    """
    asked = 1.0
    if retry_after is not None and retry_after.strip().isdigit():
        asked = min(float(retry_after), 60.0)
    backoff = min(8.0, 0.5 * 2**attempt)
    jitter: float = random.random()
    return float(max(asked, backoff) * (1 + jitter / 4))


def _read(response: http.client.HTTPResponse, limit: int, url: str, location: str) -> bytes:
    """
    A whole (small) answer body, refused beyond C{limit} bytes.
    """
    length = response.getheader("content-length")
    if length is not None and (not length.isdigit() or int(length) > limit):
        raise OSError(errno.EPROTO, f"{url}: an answer of {length[:20]} bytes", location)
    try:
        data = response.read(limit + 1)
    except (OSError, http.client.HTTPException) as e:
        raise OSError(errno.EIO, f"{url}: {_reason(e)}", location) from None
    if len(data) > limit:
        raise OSError(errno.EPROTO, f"{url}: an answer over {limit} bytes", location)
    return data


class _HttpReader(SegmentReader):
    """
    One segment of a live broker, read a range at a time on persistent
    connections: one per read under way (the read-ahead's, L{prefetch}),
    kept for the next read, closed with the reader.
    """

    # Blocks of 8 MiB, one read ahead while one is decoded: at most 16 MiB
    # per reader, and one of the broker's commit-log streams at a time
    # (MAX_STREAMS for all readers together).  Larger blocks leave the decoder waiting
    # longer for the first one and the broker's stream idle longer.
    block_size = 8 * 1024 * 1024
    prefetch = 1

    def __init__(self, store: HttpStore, segment: Segment) -> None:
        self._store = store
        self.size = segment.size
        self.location = store.location(segment)
        self._path = f"/commitlog/{segment.name}"
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._closed = False

    def read_at(self, position: int, length: int) -> bytes:
        length = max(0, min(length, self.size - position))
        if length == 0 or position < 0:
            return b""
        with self._lock:
            connection = self._idle.pop() if self._idle else None
        if connection is None:
            connection = self._store._connect()
        try:
            connection, data = self._read(connection, position, length)
        except BaseException:
            connection.close()
            raise
        with self._lock:
            if self._closed:
                connection.close()
            else:
                self._idle.append(connection)
        return data

    def _read(
        self, connection: http.client.HTTPConnection, position: int, length: int
    ) -> tuple[http.client.HTTPConnection, bytes]:
        store = self._store
        url = f"{store.uri}{self._path}"
        last = position + length - 1
        connection, response = store.request(
            connection, self._path, {"Range": f"bytes={position}-{last}"}, self.location
        )
        try:
            return connection, self._body(url, response, position, length)
        except BaseException:
            connection.close()  # (the one the request used: maybe a new one)
            raise

    def _body(
        self, url: str, response: http.client.HTTPResponse, position: int, length: int
    ) -> bytes:
        """
        The answer to a read of C{length} bytes at C{position}: exactly
        those, or an C{OSError}.
        """
        store = self._store
        last = position + length - 1
        expected = f"bytes {position}-{last}/"
        if response.status != 206:
            body = _read(response, 64 * 1024, url, self.location) if response.status != 200 else b""
            shown = "" if response.status == 200 else f": {_server_error(body)}"
            code = errno.EAGAIN if response.status == 503 else errno.EIO
            raise OSError(
                code,
                f"{url} bytes {position}-{last}: HTTP {response.status}{shown}"
                + (f" (still busy after {store.busy_retries} retries)" if response.status == 503 else ""),
                self.location,
            )
        content_range = response.getheader("content-range") or ""
        content_length = response.getheader("content-length") or ""
        if not content_range.startswith(expected) or content_length != str(length):
            raise OSError(
                errno.EPROTO,
                f"{url}: asked bytes {position}-{last}, answered {content_range or 'no Content-Range'} "
                f"({content_length or 'no'} Content-Length)",
                self.location,
            )
        try:
            data = response.read(length)
        except (OSError, http.client.HTTPException) as e:
            raise OSError(errno.EIO, f"{url} bytes {position}-{last}: {_reason(e)}", self.location) from None
        if len(data) != length:
            raise OSError(
                errno.EIO,
                f"{url} bytes {position}-{last}: the answer ended after {len(data)} bytes",
                self.location,
            )
        return data

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
