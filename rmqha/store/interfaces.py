# -*- test-case-name: tests.test_wiring -*-
"""
What the store offers the parts above it, as interfaces.
"""

from __future__ import annotations

from zope.interface import Attribute, Interface

__all__ = ["IAppendedTo"]


class IAppendedTo(Interface):
    """
    How far a store has appended (L{rmqha.store.commitlog.CommitLog}, and
    the L{rmqha.store.service.CommitLogService} that opens it).
    """

    max_offset = Attribute("The offset just past the last byte appended (int).")
