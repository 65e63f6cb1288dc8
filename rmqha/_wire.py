"""
Moved to L{rmqha.ha._wire}; this re-export is removed after issue 13's merge.
"""

from rmqha.ha._wire import *  # noqa: F401,F403
from rmqha.ha._wire import __all__ as __all__
