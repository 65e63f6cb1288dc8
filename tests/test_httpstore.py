"""
Tests for L{rmqha.pipeline.httpstore}: locations, options and pickling,
and what a reader accepts from a broker, over a fake connection that
answers canned HTTP (no sockets; the real broker is in
tests/integration/test_http_store.py).
"""

from __future__ import annotations

import errno
import http.client
import json
import os
import pickle
from io import BytesIO
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from rmqha.pipeline.httpstore import BUSY_RETRIES, HttpStore
from rmqha.pipeline.stores import Segment, PlanError, resolve

NAME = "%020d" % 0


def answer(code: int, body: bytes = b"", **headers: str) -> bytes:
    """
    A raw HTTP/1.1 answer; C{Content-Length} is the body's unless given.
    """
    head = [f"HTTP/1.1 {code} X"]
    headers.setdefault("content_length", str(len(body)))
    for name, value in headers.items():
        head.append(f"{name.replace('_', '-')}: {value}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def ranged(data: bytes, first: int, last: int, size: int = 1000) -> bytes:
    return answer(206, data, content_range=f"bytes {first}-{last}/{size}")


class _Socket:
    def __init__(self, raw: bytes) -> None:
        self._file = BytesIO(raw)

    def makefile(self, mode: str) -> BytesIO:
        return self._file


class FakeConnection:
    """
    Stands for C{http.client.HTTPConnection}: each request takes the next
    canned answer (raw bytes, or an exception to raise).
    """

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.sock: Any = None
        self.closed = 0

    def request(self, method: str, path: str, headers: dict[str, str]) -> None:
        self.requests.append((method, path, headers))
        self.sock = object()

    def getresponse(self) -> http.client.HTTPResponse:
        item = self.answers.pop(0)
        if isinstance(item, BaseException):
            raise item
        response = http.client.HTTPResponse(_Socket(item))  # type: ignore[arg-type]
        response.begin()
        return response

    def close(self) -> None:
        self.closed += 1
        self.sock = None


class LocationTests(SynchronousTestCase):
    """
    L{HttpStore.from_location}, through L{resolve}: the location, the TLS
    options, one-line errors.
    """

    def test_forms(self) -> None:
        """
        C{rmqha+http(s)://HOST:PORT} with or without a trailing slash; the
        URI is normalised (scheme lower-cased, no slash).
        """
        for location, uri in [
            ("rmqha+http://127.0.0.1:8080", "rmqha+http://127.0.0.1:8080"),
            ("RMQHA+HTTP://Broker-1:8080/", "rmqha+http://broker-1:8080"),
            ("rmqha+https://[::1]:8443", "rmqha+https://[::1]:8443"),
        ]:
            store = resolve(location)
            self.assertIsInstance(store, HttpStore)
            self.assertEqual(store.uri, uri)

    def test_refused(self) -> None:
        """
        A path, a query, no port, a bad port, a user: each a one-line
        L{PlanError} naming the location.
        """
        for location, needle in [
            ("rmqha+http://h:1/store", "no path or query: /store"),
            ("rmqha+http://h:1/?x=1", "no path or query"),
            ("rmqha+http://h", "HOST:PORT"),
            ("rmqha+http://h:99999", "port"),
            ("rmqha+http://u:p@h:1", "no user or password"),
        ]:
            e = self.assertRaises(PlanError, resolve, location)
            self.assertIn(location, str(e))
            self.assertIn(needle, str(e))
            self.assertNotIn("\n", str(e))

    def test_tls_options(self) -> None:
        """
        C{tlsCert}/C{tlsKey}/C{tlsCa}, in any case, else C{RMQHA_TLS_*};
        a missing file, a certificate without its key, or TLS files for
        plain HTTP are one-line errors naming the option (the environment
        applies to TLS locations only).
        """
        cert, key, ca = (self.mktemp() for _ in range(3))
        for path in (cert, key, ca):
            open(path, "w").close()
        store = resolve("rmqha+https://h:1", {"tlscert": cert, "TLSKEY": key, "tlsCa": ca})
        assert isinstance(store, HttpStore)
        self.assertEqual(store.tls, {"cert": cert, "key": key, "ca": ca})
        self.patch(os, "environ", {"RMQHA_TLS_CA": ca})
        store = resolve("rmqha+https://h:1")
        assert isinstance(store, HttpStore)
        self.assertEqual(store.tls, {"cert": None, "key": None, "ca": ca})
        self.assertEqual(resolve("rmqha+http://h:1").tls, {})  # type: ignore[attr-defined]
        e = self.assertRaises(PlanError, resolve, "rmqha+http://h:1", {"tlsCa": ca})
        self.assertIn("the tlsCa option is for rmqha+https://", str(e))
        self.patch(os, "environ", {})
        missing = self.mktemp()
        e = self.assertRaises(PlanError, resolve, "rmqha+https://h:1", {"tlsCa": missing})
        self.assertEqual(str(e), f"tlsCa {missing}: no such file")
        e = self.assertRaises(PlanError, resolve, "rmqha+https://h:1", {"tlsCert": cert})
        self.assertIn("tlsCert and tlsKey together", str(e))

    def test_pickle(self) -> None:
        """
        A store pickles to its location and options only: an open
        connection or TLS context stays behind.
        """
        store = resolve("rmqha+http://h:1")
        assert isinstance(store, HttpStore)
        store._context = object()  # type: ignore[assignment]
        copy = pickle.loads(pickle.dumps(store))
        self.assertEqual((copy.uri, copy.tls, copy.timeout), (store.uri, store.tls, store.timeout))
        self.assertIsNone(copy._context)


class ReaderTests(SynchronousTestCase):
    """
    L{HttpStore.segments} and C{read_at}: exactly what was asked, or an
    C{OSError} naming the location.
    """

    def store(self, *answers: Any) -> tuple[HttpStore, list[FakeConnection], list[float]]:
        sleeps: list[float] = []
        store = HttpStore("rmqha+http", "h", 1, sleep=sleeps.append)
        connections: list[FakeConnection] = []
        queue = list(answers)

        def connect() -> FakeConnection:
            connection = FakeConnection(queue)
            connections.append(connection)
            return connection

        self.patch(store, "_connect", connect)
        return store, connections, sleeps

    def test_segments(self) -> None:
        """
        The listing becomes L{Segment}s in offset order.
        """
        listing = {
            "status": "OK",
            "segments": [
                {"name": "%020d" % 1000, "offset": 1000, "size": 1000},
                {"name": NAME, "offset": 0, "size": 1000},
            ],
        }
        store, connections, _ = self.store(answer(200, json.dumps(listing).encode()))
        self.assertEqual(
            store.segments(),
            [Segment(0, NAME, 1000), Segment(1000, "%020d" % 1000, 1000)],
        )
        self.assertEqual(connections[0].requests[0][1], "/commitlog")

    def test_segments_errors(self) -> None:
        """
        404 and 403 are L{PlanError}s with the broker's error;
        another status, or an answer that is not a listing, an C{OSError};
        each one line naming the URL.
        """
        store, _, _ = self.store(
            answer(404, b'{"status": "NOT_FOUND", "error": "not served: use --serve-commitlog"}\n')
        )
        e = self.assertRaises(PlanError, store.segments)
        self.assertEqual(
            str(e), "rmqha+http://h:1/commitlog: HTTP 404: not served: use --serve-commitlog"
        )
        store, _, _ = self.store(answer(500, b"boom\n"))
        failure = self.assertRaises(OSError, store.segments)
        self.assertEqual(failure.strerror, "rmqha+http://h:1/commitlog: HTTP 500: boom")
        store, _, _ = self.store(answer(200, b'{"segments": [{"name": "../x", "offset": 0, "size": 1}]}'))
        failure = self.assertRaises(OSError, store.segments)
        self.assertIn("a segment named '../x'", str(failure))

    def test_read_exact(self) -> None:
        """
        One C{Range} for exactly the bytes asked (cut at the segment's end;
        nothing asked past it), on one connection kept for the next read.
        """
        store, connections, _ = self.store(
            ranged(b"a" * 10, 100, 109), ranged(b"b" * 5, 995, 999)
        )
        with store.open(Segment(0, NAME, 1000)) as reader:
            self.assertEqual(reader.read_at(100, 10), b"a" * 10)
            self.assertEqual(reader.read_at(995, 100), b"b" * 5)
            self.assertEqual(reader.read_at(1000, 100), b"")
        (connection,) = connections
        self.assertEqual(
            [r[2]["Range"] for r in connection.requests], ["bytes=100-109", "bytes=995-999"]
        )
        self.assertEqual(connection.closed, 1)

    def test_read_ahead(self) -> None:
        """
        A live broker's segment is read ahead a block at a time
        (C{prefetch}): exactly the ranges of the blocks, in order, on a
        read-ahead thread's kept-alive connection, closed with the reader;
        a block the broker answers wrongly is an error on that block.
        """
        store, connections, _ = self.store(
            ranged(b"a" * 10, 0, 9, 25), ranged(b"b" * 10, 10, 19, 25), ranged(b"c" * 5, 20, 24, 25)
        )
        with store.open(Segment(0, NAME, 25)) as reader:
            self.assertGreaterEqual(reader.prefetch, 1)
            self.assertEqual(list(reader.blocks(0, 25, 10)), [b"a" * 10, b"b" * 10, b"c" * 5])
        (connection,) = connections
        self.assertEqual(
            [r[2]["Range"] for r in connection.requests],
            ["bytes=0-9", "bytes=10-19", "bytes=20-24"],
        )
        self.assertEqual(connection.closed, 1)
        store, connections, _ = self.store(
            ranged(b"a" * 10, 0, 9, 25), ranged(b"b" * 10, 0, 9, 25), ranged(b"c" * 5, 20, 24, 25)
        )
        with store.open(Segment(0, NAME, 25)) as reader:
            blocks = reader.blocks(0, 25, 10)
            self.assertEqual(next(blocks), b"a" * 10)
            e = self.assertRaises(OSError, next, blocks)
        self.assertIn("asked bytes 10-19, answered bytes 0-9/25", str(e))
        self.assertTrue(all(c.closed for c in connections))

    def test_read_refuses_other_bytes(self) -> None:
        """
        An answer longer than asked, for other bytes, a 200, or cut short:
        an C{OSError} naming the segment's location, never a buffer.
        """
        for bad, needle in [
            (answer(206, b"a" * 20, content_range="bytes 100-119/1000"), "asked bytes 100-109"),
            (answer(206, b"a" * 10, content_range="bytes 0-9/1000"), "answered bytes 0-9/1000"),
            (answer(200, b"a" * 1000), "HTTP 200"),
            (answer(206, b"a" * 5, content_range="bytes 100-109/1000", content_length="10"),
             "ended after"),
        ]:
            store, connections, _ = self.store(bad)
            with store.open(Segment(0, NAME, 1000)) as reader:
                e = self.assertRaises(OSError, reader.read_at, 100, 10)
            self.assertEqual(e.filename, f"rmqha+http://h:1/commitlog/{NAME}")
            self.assertIn(needle, e.strerror)
            self.assertNotIn("\n", str(e))

    def test_busy(self) -> None:
        """
        503: tried again after at least C{Retry-After} seconds, up to
        L{BUSY_RETRIES} times, then an C{OSError} saying it stayed busy.
        """
        busy = answer(503, b'{"status": "BUSY", "error": "4 streams"}', retry_after="3")
        store, _, sleeps = self.store(busy, busy, ranged(b"a" * 10, 0, 9))
        with store.open(Segment(0, NAME, 1000)) as reader:
            self.assertEqual(reader.read_at(0, 10), b"a" * 10)
        self.assertEqual(len(sleeps), 2)
        self.assertTrue(all(s >= 3 for s in sleeps), sleeps)
        store, _, sleeps = self.store(*[busy] * (BUSY_RETRIES + 1))
        with store.open(Segment(0, NAME, 1000)) as reader:
            e = self.assertRaises(OSError, reader.read_at, 0, 10)
        self.assertEqual(e.errno, errno.EAGAIN)
        self.assertIn(f"HTTP 503: 4 streams (still busy after {BUSY_RETRIES} retries)", str(e))
        self.assertEqual(len(sleeps), BUSY_RETRIES)

    def test_reconnect_once(self) -> None:
        """
        A kept-alive connection the broker dropped is reconnected once; a
        fresh one that fails is an error.
        """
        dropped = http.client.RemoteDisconnected("Remote end closed connection")
        store, connections, _ = self.store(
            ranged(b"a" * 10, 0, 9), dropped, ranged(b"b" * 10, 10, 19), dropped, dropped
        )
        with store.open(Segment(0, NAME, 1000)) as reader:
            self.assertEqual(reader.read_at(0, 10), b"a" * 10)
            self.assertEqual(reader.read_at(10, 10), b"b" * 10)
            e = self.assertRaises(OSError, reader.read_at, 20, 10)
        self.assertIn("Remote end closed connection", str(e))
        self.assertEqual(e.filename, f"rmqha+http://h:1/commitlog/{NAME}")
