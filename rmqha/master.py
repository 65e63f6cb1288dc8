"""
Moved to L{rmqha.ha.master}; this re-export is removed after issue 13's merge.
"""

from rmqha.ha.master import *  # noqa: F401,F403
from rmqha.ha.master import __all__ as __all__
from rmqha.ha.master import (  # noqa: F401
    _hash_files as _hash_files,
)
