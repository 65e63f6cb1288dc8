"""
Moved to L{rmqha.ha.group}; this re-export is removed after issue 13's merge.
"""

from rmqha.ha.group import *  # noqa: F401,F403
from rmqha.ha.group import __all__ as __all__
from rmqha.ha.group import (  # noqa: F401
    timed_out_as as timed_out_as,
)
