# -*- test-case-name: tests.test_units -*-
"""
Parsing operator-facing values: sizes (C{64m}, C{1g}, C{1073741824}) and
rates in bytes per second (C{64m}, C{32MiB/s}, C{off}).
"""

from __future__ import annotations

import re

__all__ = ["parse_size", "parse_rate"]

_SIZE = re.compile(r"\s*([0-9]+)\s*([kmgt]?)(i?b)?\s*\Z", re.IGNORECASE)
_FACTORS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str | int, name: str = "size") -> int:
    """
    A byte count: a plain integer, or one with a binary suffix
    (C{k}/C{m}/C{g}/C{t}, optionally followed by C{b} or C{ib}: C{64m},
    C{64MiB} and C{67108864} are the same).

    @param name: what the value is, for the error message.
    @raise ValueError: naming C{name} and the value.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"{name} {text} is negative")
        return text
    match = _SIZE.match(str(text))
    if match is None:
        raise ValueError(
            f"{name} {text!r} is not a size (examples: 4096, 64k, 1g, 1GiB)"
        )
    return int(match.group(1)) * _FACTORS[match.group(2).lower()]


def parse_rate(text: str | int, name: str = "rate") -> int:
    """
    Bytes per second: a size (L{parse_size}), optionally followed by C{/s};
    C{0} or C{off} is 0 (whatever it paces is off).

    @param name: what the value is, for the error message.
    @raise ValueError: naming C{name} and the value.
    """
    if isinstance(text, str):
        value = text.strip()
        if value.lower() == "off":
            return 0
        if value.lower().endswith("/s"):
            value = value[:-2]
        try:
            return parse_size(value, name)
        except ValueError:
            raise ValueError(
                f"{text!r} is not a rate in bytes per second (examples: 32MiB, "
                "64m, 0 or off to disable)"
            ) from None
    return parse_size(text, name)
