# -*- test-case-name: tests.test_commitlog,tests.test_storeservice -*-
"""
Flush planning: what an C{fdatasync} of the commit log must cover
(L{FlushPlan}), and what counts as flushed once it ran.

A part the commit log owns (composition, not a mixin): the flushed offset
and the count of plans in flight are its own state; it shares the log's
list of segments (the same list object, never replaced), reports files it
cannot open to the log's L{DamageWatch}, and asks the log's C{check} (given
at construction) before a flush counts.
"""

from __future__ import annotations

from typing import Callable

from rmqha.store._damage import DamageWatch, open_failure
from rmqha.store._segments import FlushPlan, _Segment
from rmqha.store.errors import StoreDamagedError

__all__ = ["Flusher"]


class Flusher:
    """
    The flush state of one commit log.

    @ivar flushed: everything before this offset is on disk.
    """

    def __init__(
        self,
        segments: list[_Segment],
        watch: DamageWatch,
        check: Callable[[], StoreDamagedError | None],
    ) -> None:
        self._segments = segments
        self._watch = watch
        self._check = check
        self.flushed = segments[-1].end if segments else 0
        self._in_flight = 0

    def plan(self, least_bytes: int = 0) -> FlushPlan | None:
        """
        See L{rmqha.store.commitlog.CommitLog.flush_plan}.
        """
        segments = self._segments
        target = segments[-1].end if segments else 0
        dirty = target - self.flushed
        if dirty <= 0 or dirty < least_bytes:
            return None
        fds = []
        for segment in segments:
            if segment.end > self.flushed and segment.wrote > 0:
                try:
                    fds.append(segment.ensure_fd())
                except OSError as e:
                    # (Nothing to sync there: the log is damaged, and the
                    # flushed offset stays where it is: done.)
                    self._watch.damaged(segment, open_failure(e))
        self._in_flight += 1
        return FlushPlan(target, fds)

    def done(self, plan: FlushPlan) -> None:
        """
        Record that C{plan} was executed.
        """
        self._in_flight -= 1
        # On disk only if it went to the files the log holds: looked at
        # after the sync (an fstat each), before it counts.
        if self._check() is None and plan.target > self.flushed:
            self.flushed = plan.target
        if self._in_flight == 0:
            # Descriptors of full, flushed segments are not needed again.
            for segment in self._segments[:-1]:
                if segment.end <= self.flushed:
                    segment.close_fd()

    def abandoned(self, plan: FlushPlan) -> None:
        """
        Record that C{plan} failed and was not executed.
        """
        self._in_flight -= 1

    def flush(self) -> int:
        """
        Flush synchronously.

        @return: the flushed offset.
        """
        plan = self.plan()
        if plan is not None:
            try:
                plan.execute()
            except BaseException:
                self.abandoned(plan)
                raise
            self.done(plan)
        return self.flushed
