# -*- test-case-name: tests.test_admin,tests.test_admin_batch -*-
"""
Puts over HTTP: C{POST /topics/{topic}/messages} (the request body becomes
one message; query: C{queueId}, C{tags}, C{keys}) and C{POST
/topics/{topic}/batch} (many messages, one verdict each), put on this
broker; a slave's refusal names the elected master in failover mode.

Both put each message with L{put_verdict} (its refusal as the HTTP
answer a single put gives, or its wait) and wait with one L{_Answer}, so
that a message of a batch ends exactly as it would alone.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from typing import Any, Callable, Sequence

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from rmqha.admin.view import FailoverSource
from rmqha.admin.resource import (
    AdminResource,
    NotFound,
    error_answer,
    finish_answer,
    json_answer,
)
from rmqha.broker import Broker, NotStoredError
from rmqha.ha.group import PutMessageResult, PutStatus
from rmqha.store._record import Message, MessageRejected

__all__ = [
    "Topics",
    "master_hint",
    "put_verdict",
    "MAX_BATCH_MESSAGES",
    "BATCH_BINARY_TYPE",
]

#: The most messages one C{POST /topics/{topic}/batch} may carry (RocketMQ
#: bounds a batch by its bytes only: the request body's limit holds too).
MAX_BATCH_MESSAGES = 1024
#: The length-prefixed binary batch: each message a 4-byte big-endian
#: length and its body.
BATCH_BINARY_TYPE = b"application/x-rmqha-batch"
_LENGTH = struct.Struct(">I")
_JSON_TYPE = b"application/json"
#: A message's fields in a JSON batch.
_JSON_FIELDS = frozenset(["body", "body_base64", "queueId", "tags", "keys"])

#: One message's outcome: the HTTP code a single put answers and its JSON.
Verdict = tuple[int, dict[str, Any]]


def master_hint(coordinator: FailoverSource | None) -> dict[str, Any] | None:
    """
    Failover mode: where the elected master is, for a client that asked
    a slave (none without a C{coordinator}).
    """
    if coordinator is None:
        return None
    failover = coordinator.status()
    master = failover.get("master")
    if not master or master.get("node_id") == failover.get("node_id"):
        return None
    return {"node_id": master["node_id"], "http": master["http"], "epoch": master["epoch"]}


#: Each status's name (an enum's C{value} is a descriptor call: per message).
_STATUS_TEXT = {status: status.value for status in PutStatus}


def _stored(result: PutMessageResult) -> Verdict:
    # Every outcome in which the message was stored is a 200.
    append = result.append
    offset = append.offset
    return 200, {
        "status": _STATUS_TEXT[result.status],
        "stored": True,
        "offset": offset,
        "next_offset": offset + append.size,
        "msg_id": append.msg_id,
        "queue_offset": append.queue_offset,
    }


def _failed_after_append(failure: Failure) -> Verdict:
    # After the append: the message is in the log.
    return 500, {"status": "UNKNOWN_ERROR", "error": failure.getErrorMessage(), "stored": True}


def put_verdict(
    broker: Broker, message: Message, failover: FailoverSource | None
) -> Verdict | Deferred[PutMessageResult]:
    """
    Put C{message} on C{broker}: the verdict at once when nothing was
    stored (a slave, 503 naming the master; a full disk, 507; another store
    failure, 500; a message over a limit, 400), else the put's wait (the
    replicas', the disk's), for L{_Answer.wait}.
    """
    try:
        d = broker.put(message)
    except NotStoredError as e:
        # A slave (503), a full disk (507: retrying soon will not help),
        # another store failure (500): nothing was stored.
        code = 507 if e.disk_full else 500
        answer: dict[str, Any] = {"status": e.status.value, "error": str(e), "stored": False}
        if e.status is PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH:
            code = 503  # (failover: not stored; retry shortly)
        if e.status is PutStatus.SERVICE_NOT_AVAILABLE:
            code = 503
            hint = master_hint(failover)
            if hint is not None:
                # Failover mode: where to put instead.
                answer["master"] = hint
        return code, answer
    except MessageRejected as e:
        return 400, {"status": "MESSAGE_ILLEGAL", "error": str(e), "stored": False}
    return d


class _Answer:
    """
    The answer to a request whose puts wait: each put's verdict in its
    place once its wait is over, then the answer made and written; if the
    client goes away first, every wait is withdrawn (the messages are
    stored whatever happens) and nothing is written.
    """

    def __init__(
        self,
        request: Request,
        verdicts: list[Verdict | None],
        make: Callable[[Request, list[Verdict | None]], bytes],
    ) -> None:
        self._request = request
        self._verdicts = verdicts
        self._make = make
        self._waits: list[Deferred[PutMessageResult]] = []
        self._left = 0
        self._gone = False
        self._holding = True

    def wait(self, i: int, d: Deferred[PutMessageResult]) -> None:
        """
        Put the verdict of C{d}, a put's wait, at C{i}.
        """
        self._left += 1
        self._waits.append(d)
        # (One callback per put: a batch's messages each have one.)
        d.addCallbacks(self._stored, self._failed, callbackArgs=(i,), errbackArgs=(i,))

    def render(self) -> bytes | int:
        """
        What the resource's render returns: the answer, if every verdict
        is in (an ASYNC_MASTER's puts), else C{NOT_DONE_YET}.
        """
        self._holding = False
        if self._left == 0:
            return self._make(self._request, self._verdicts)
        self._request.notifyFinish().addErrback(self._client_gone)
        return NOT_DONE_YET

    def _stored(self, result: PutMessageResult, i: int) -> None:
        self._verdicts[i] = _stored(result)
        self._one_less()

    def _failed(self, failure: Failure, i: int) -> None:
        if self._gone:
            return
        self._verdicts[i] = _failed_after_append(failure)
        self._one_less()

    def _one_less(self) -> None:
        self._left -= 1
        if self._left == 0 and not self._holding and not self._gone:
            finish_answer(self._request, self._make(self._request, self._verdicts))

    def _client_gone(self, _: Failure) -> None:
        self._gone = True
        for d in self._waits:
            d.cancel()


class _Messages(AdminResource):
    isLeaf = True

    def __init__(self, broker: Broker, topic: str, failover: FailoverSource | None) -> None:
        super().__init__()
        self._broker = broker
        self._topic = topic
        self._failover = failover

    def render_POST(self, request: Request) -> bytes | int:
        try:
            queue_id, properties = _query(request)
        except ValueError as e:
            return error_answer(request, 400, "BAD_REQUEST", str(e), stored=False)
        assert request.content is not None
        message = Message(
            self._topic, request.content.read(), queue_id=queue_id, properties=properties
        )
        verdict = put_verdict(self._broker, message, self._failover)
        if not isinstance(verdict, Deferred):
            return json_answer(request, *verdict)
        answer = _Answer(request, [None], _single_answer)
        answer.wait(0, verdict)
        return answer.render()


def _single_answer(request: Request, verdicts: list[Verdict | None]) -> bytes:
    (verdict,) = verdicts
    assert verdict is not None
    return json_answer(request, *verdict)


def _query(request: Request) -> tuple[int, dict[str, str]]:
    """
    The query's C{queueId} (0 if none) and properties (C{tags}: C{TAGS},
    C{keys}: C{KEYS}).

    @raise ValueError: one naming the bad parameter.
    """
    args: dict[bytes, list[bytes]] = request.args or {}

    def arg(name: bytes) -> str | None:
        values = args.get(name)
        if not values:
            return None
        try:
            return values[-1].decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"query parameter {name.decode()} is not UTF-8") from None

    queue_text = arg(b"queueId")
    queue_id = 0 if queue_text is None else _queue_id(queue_text)
    properties = {}
    for name, key in ((b"tags", "TAGS"), (b"keys", "KEYS")):
        value = arg(name)
        if value:
            properties[key] = value
    return queue_id, properties


def _queue_id(text: str) -> int:
    if not text.isdigit() or int(text) > 2**31 - 1:
        raise ValueError(f"queueId {text!r} is not a queue number")
    return int(text)


def _too_many(count: int) -> ValueError:
    return _TooLarge(
        f"the batch has {count} messages or more; the limit is {MAX_BATCH_MESSAGES} "
        "(MAX_BATCH_MESSAGES)"
    )


class _TooLarge(ValueError):
    """
    A batch over L{MAX_BATCH_MESSAGES} (413).
    """


def _binary_bodies(data: bytes) -> list[bytes]:
    """
    The bodies of a length-prefixed binary batch.

    @raise ValueError: naming the message whose length runs past the end.
    """
    bodies: list[bytes] = []
    at = 0
    end = len(data)
    length_at = _LENGTH.unpack_from
    while at < end:
        if end - at < 4:
            raise ValueError(
                f"message {len(bodies)}: {end - at} bytes left where a 4-byte length belongs"
            )
        (length,) = length_at(data, at)
        at += 4
        if length > end - at:
            raise ValueError(
                f"message {len(bodies)}: its length says {length} bytes, {end - at} remain"
            )
        bodies.append(data[at : at + length])
        at += length
        if len(bodies) > MAX_BATCH_MESSAGES:
            raise _too_many(len(bodies))
    return bodies


def _json_messages(
    data: bytes, topic: str, queue_id: int, properties: dict[str, str]
) -> list[Message]:
    """
    The messages of a JSON batch: C{{"messages": [{"body": TEXT} or
    {"body_base64": B64}, with C{queueId}, C{tags}, C{keys} overriding the
    query's, ...]}}.

    @raise ValueError: one line naming the message and the field.
    """
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"the body is not JSON: {e}") from None
    items = document.get("messages") if isinstance(document, dict) else None
    if not isinstance(items, list):
        raise ValueError('the body must be a JSON object with a "messages" list')
    if len(items) > MAX_BATCH_MESSAGES:
        raise _too_many(len(items))
    messages = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"message {i}: not a JSON object")
        unknown = item.keys() - _JSON_FIELDS
        if unknown:
            raise ValueError(
                f"message {i}: unknown field {sorted(unknown)[0]!r} (fields: body or "
                "body_base64, queueId, tags, keys)"
            )
        text, coded = item.get("body"), item.get("body_base64")
        if (text is None) == (coded is None):
            raise ValueError(f'message {i}: give one of "body" (text) and "body_base64"')
        if text is not None:
            if not isinstance(text, str):
                raise ValueError(f'message {i}: "body" is not a string')
            try:
                body = text.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(
                    f'message {i}: "body" is not valid Unicode (a lone surrogate): '
                    'send such bytes as "body_base64"'
                ) from None
        else:
            if not isinstance(coded, str):
                raise ValueError(f'message {i}: "body_base64" is not a string')
            try:
                body = base64.b64decode(coded, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError(f'message {i}: "body_base64" is not base64') from None
        queue = item.get("queueId", queue_id)
        if type(queue) is not int or not 0 <= queue <= 2**31 - 1:
            raise ValueError(f"message {i}: queueId {queue!r} is not a queue number")
        own = properties
        for name, key in (("tags", "TAGS"), ("keys", "KEYS")):
            value = item.get(name)
            if value is None:
                continue
            if not isinstance(value, str):
                raise ValueError(f"message {i}: {name} is not a string")
            if own is properties:
                own = dict(properties)
            if value:
                own[key] = value
            else:
                own.pop(key, None)
        messages.append(Message(topic, body, queue_id=queue, properties=own))
    return messages


class _Batch(AdminResource):
    """
    C{POST /topics/{topic}/batch}: every message put as a single put
    would be, in order; one verdict each.
    """

    isLeaf = True

    def __init__(self, broker: Broker, topic: str, failover: FailoverSource | None) -> None:
        super().__init__()
        self._broker = broker
        self._topic = topic
        self._failover = failover

    def render_POST(self, request: Request) -> bytes | int:
        kind = (request.getHeader(b"content-type") or b"").split(b";")[0].strip().lower()
        if kind not in (_JSON_TYPE, BATCH_BINARY_TYPE):
            shown = kind.decode("latin-1") or "none"
            return error_answer(
                request,
                415,
                "UNSUPPORTED_MEDIA_TYPE",
                f"a batch's Content-Type is application/json or "
                f"{BATCH_BINARY_TYPE.decode()}, not {shown}",
                stored=False,
            )
        assert request.content is not None
        data = request.content.read()
        try:
            queue_id, properties = _query(request)
            if kind == _JSON_TYPE:
                messages = _json_messages(data, self._topic, queue_id, properties)
            else:
                messages = [
                    Message(self._topic, body, queue_id=queue_id, properties=properties)
                    for body in _binary_bodies(data)
                ]
        except _TooLarge as e:
            return error_answer(request, 413, "REQUEST_TOO_LARGE", str(e), stored=False)
        except ValueError as e:
            return error_answer(request, 400, "BAD_REQUEST", str(e), stored=False)
        if not messages:
            return error_answer(
                request, 400, "BAD_REQUEST", "the batch has no messages", stored=False
            )
        verdicts: list[Verdict | None] = [None] * len(messages)
        answer = _Answer(request, verdicts, _batch_answer)
        for i, message in enumerate(messages):
            verdict = put_verdict(self._broker, message, self._failover)
            if isinstance(verdict, Deferred):
                answer.wait(i, verdict)
            else:
                verdicts[i] = verdict
        return answer.render()


def _batch_answer(request: Request, verdicts: Sequence[Verdict | None]) -> bytes:
    """
    A batch's answer: each message's verdict in order under C{results};
    the code and C{status} of the first message a single put would not
    have answered 200 (with its C{error}, naming the message, and any
    C{master} hint), or 200 and the first status other than C{PUT_OK}
    (else C{PUT_OK}) when every message was stored; C{stored}, how many
    were.
    """
    results = []
    first: tuple[int, int, dict[str, Any]] | None = None
    status = "PUT_OK"
    stored = 0
    for i, verdict in enumerate(verdicts):
        assert verdict is not None
        code, result = verdict
        results.append(result)
        if result["stored"]:
            stored += 1
        if code != 200 and first is None:
            first = (i, code, result)
        if status == "PUT_OK":
            status = result["status"]
    answer: dict[str, Any] = {"status": status, "messages": len(results), "stored": stored}
    code = 200
    if first is not None:
        i, code, result = first
        answer["status"] = result["status"]
        answer["error"] = f"message {i}: {result['error']}"
        if "master" in result:
            answer["master"] = result["master"]
    answer["results"] = results
    return json_answer(request, code, answer)


class _Topic(AdminResource):
    def __init__(self, broker: Broker, topic: str, failover: FailoverSource | None) -> None:
        super().__init__()
        self._broker = broker
        self._topic = topic
        self._failover = failover

    def getChild(self, path: bytes, request: Request) -> Resource:
        if path == b"messages":
            return _Messages(self._broker, self._topic, self._failover)
        if path == b"batch":
            return _Batch(self._broker, self._topic, self._failover)
        return NotFound()


class Topics(AdminResource):
    def __init__(self, broker: Broker, failover: FailoverSource | None = None) -> None:
        super().__init__()
        self._broker = broker
        self._failover = failover

    def getChild(self, path: bytes, request: Request) -> Resource:
        try:
            topic = path.decode("utf-8")
        except UnicodeDecodeError:
            return NotFound()
        return _Topic(self._broker, topic, self._failover)
