"""
Moved to L{rmqha.store.scrub}; this shim is removed after issue 13's merge.
"""

from rmqha.store.scrub import *  # noqa: F401,F403
from rmqha.store.scrub import (  # noqa: F401
    DEFAULT_SCRUB_RATE,
    ScrubService,
    check_chunk,
    parse_scrub_rate,
)
