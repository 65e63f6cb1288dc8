"""
Moved to L{rmqha.store.service}; this shim is removed after issue 13's merge.
"""

from rmqha.store.service import *  # noqa: F401,F403
from rmqha.store.service import (  # noqa: F401
    DEFAULT_FLUSH_INTERVAL,
    DEFAULT_FLUSH_LEAST_BYTES,
    DEFAULT_FLUSH_THOROUGH_INTERVAL,
    CommitLogService,
)
