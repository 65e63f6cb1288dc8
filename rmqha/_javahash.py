"""
Java's C{String.hashCode}, the one definition rmqha uses (tag hash codes in
consume queues and subscriptions, Java C{HashMap} and
C{ConcurrentHashMap} iteration orders).
"""

from __future__ import annotations

import functools

__all__ = ["java_string_hash"]


@functools.lru_cache(maxsize=1 << 16)
def java_string_hash(text: str) -> int:
    """
    Java's C{String.hashCode} (over UTF-16 code units, lone surrogates
    included), as a signed int32.
    """
    h = 0
    data = text.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h
