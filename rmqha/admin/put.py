# -*- test-case-name: tests.test_admin -*-
"""
C{POST /topics/{topic}/messages}: the request body becomes one message
(query: C{queueId}, C{tags}, C{keys}), put on this broker; a slave's
refusal names the elected master in failover mode.
"""

from __future__ import annotations

from typing import Any

from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from rmqha.admin.view import FailoverSource
from rmqha.admin.resource import AdminResource, NotFound, error_answer, json_answer
from rmqha.broker import Broker, NotStoredError
from rmqha.ha.group import PutMessageResult, PutStatus
from rmqha.store._record import Message, MessageRejected

__all__ = ["Topics", "master_hint"]


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


class _Messages(AdminResource):
    isLeaf = True

    def __init__(self, broker: Broker, topic: str, failover: FailoverSource | None) -> None:
        super().__init__()
        self._broker = broker
        self._topic = topic
        self._failover = failover

    def render_POST(self, request: Request) -> bytes | int:
        try:
            message = self._message(request)
        except ValueError as e:
            return error_answer(request, 400, "BAD_REQUEST", str(e), stored=False)
        try:
            d = self._broker.put(message)
        except NotStoredError as e:
            # A slave (503), a full disk (507: retrying soon will not
            # help), another store failure (500): nothing was stored.
            code = 507 if e.disk_full else 500
            extra: dict[str, Any] = {}
            if e.status is PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH:
                code = 503  # (failover: not stored; retry shortly)
            if e.status is PutStatus.SERVICE_NOT_AVAILABLE:
                code = 503
                hint = master_hint(self._failover)
                if hint is not None:
                    # Failover mode: where to put instead.
                    extra["master"] = hint
            return error_answer(request, code, e.status.value, str(e), stored=False, **extra)
        except MessageRejected as e:
            return error_answer(request, 400, "MESSAGE_ILLEGAL", str(e), stored=False)

        def answer(result: PutMessageResult) -> None:
            if gone:
                return
            # Every outcome in which the message was stored is a 200.
            append = result.append
            request.write(
                json_answer(
                    request,
                    200,
                    {
                        "status": result.status.value,
                        "stored": True,
                        "offset": append.offset,
                        "next_offset": append.next_offset,
                        "msg_id": append.msg_id,
                        "queue_offset": append.queue_offset,
                    },
                )
            )
            request.finish()

        def failed(failure: Failure) -> None:
            if gone:
                return
            # After the append: the message is in the log.
            request.write(
                error_answer(request, 500, "UNKNOWN_ERROR", failure.getErrorMessage(), stored=True)
            )
            request.finish()

        gone = False

        def client_gone(_: Failure) -> None:
            # The client went away before the answer: stop waiting (the
            # message is stored whatever happens).
            nonlocal gone
            gone = True
            d.cancel()

        request.notifyFinish().addErrback(client_gone)
        d.addCallbacks(answer, failed)
        d.addErrback(lambda _: None if gone else _)
        return NOT_DONE_YET

    def _message(self, request: Request) -> Message:
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
        queue_id = 0
        if queue_text is not None:
            if not queue_text.isdigit() or int(queue_text) > 2**31 - 1:
                raise ValueError(f"queueId {queue_text!r} is not a queue number")
            queue_id = int(queue_text)
        properties = {}
        for name, key in ((b"tags", "TAGS"), (b"keys", "KEYS")):
            value = arg(name)
            if value:
                properties[key] = value
        assert request.content is not None
        body = request.content.read()
        return Message(self._topic, body, queue_id=queue_id, properties=properties)


class _Topic(AdminResource):
    def __init__(self, broker: Broker, topic: str, failover: FailoverSource | None) -> None:
        super().__init__()
        self._broker = broker
        self._topic = topic
        self._failover = failover

    def getChild(self, path: bytes, request: Request) -> Resource:
        if path == b"messages":
            return _Messages(self._broker, self._topic, self._failover)
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


