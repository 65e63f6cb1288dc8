# -*- test-case-name: tests.test_tools_help -*-
"""
The harnesses' C{--help}: their docstrings without the epytext markup.
"""

from __future__ import annotations

import re

__all__ = ["plain"]


def plain(text: str | None) -> str:
    """
    C{text} (a docstring) without its epytext markup: C{C{...}},
    C{L{...}}, C{I{...}}, C{B{...}}, C{U{...}} give their words.
    """
    return re.sub(r"\b[BCILU]\{([^{}]*)\}", r"\1", text or "")
