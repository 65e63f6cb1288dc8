"""
Moved to L{rmqha.ha.slave}; this re-export is removed after issue 13's merge.
"""

from rmqha.ha.slave import *  # noqa: F401,F403
from rmqha.ha.slave import __all__ as __all__
from rmqha.ha.slave import (  # noqa: F401
    _log as _log,
)
