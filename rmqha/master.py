"""
Moved to L{rmqha.ha.master} (the control session and the digest to
L{rmqha.ha.control}, L{HAConfig} to L{rmqha.ha.config}); this re-export is
removed after issue 13's merge.
"""

from rmqha.ha.master import *  # noqa: F401,F403
from rmqha.ha.master import __all__ as __all__
from rmqha.ha.control import range_digest as _hash_files  # noqa: F401
