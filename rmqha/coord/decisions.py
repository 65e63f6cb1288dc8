# -*- test-case-name: tests.test_coordinator -*-
"""
One failover decision at a time: a coordinator's changes (a watch event, a
tick of its loop, a role change settling) ask for a decision, and one
asked for while another runs is made once that one ends.

L{Decisions} runs the decision the coordinator
(L{rmqha.coord.node.Coordinator}) gave it when it was built, while the
coordinator says it may decide.
"""

from __future__ import annotations

from typing import Any, Callable, Coroutine

from twisted.internet.defer import ensureDeferred
from twisted.logger import Logger
from twisted.python.failure import Failure


class Decisions:
    """
    Serializes a coordinator's decisions; a decision that fails is logged.
    """

    _log = Logger()

    def __init__(
        self, decide: Callable[[], Coroutine[Any, Any, None]], may_decide: Callable[[], bool]
    ) -> None:
        """
        @param decide: makes one decision.
        @param may_decide: whether a decision may be made now (the
            coordinator runs and takes part).
        """
        self._decide = decide
        self._may_decide = may_decide
        self._busy = False
        self._again = False

    def request(self) -> None:
        """
        Decide now, or once the decision under way ends.
        """
        if not self._may_decide():
            return
        if self._busy:
            self._again = True
            return
        self._busy = True
        d = ensureDeferred(self._decide())

        def done(result: object) -> None:
            self._busy = False
            if isinstance(result, Failure):
                self._log.failure("failover decision failed", result)
            if self._again and self._may_decide():
                self._again = False
                self.request()

        d.addBoth(done)

    def again(self) -> None:
        """
        Decide once more when the decision under way ends (it changed the
        group, or lost a race).
        """
        self._again = True
