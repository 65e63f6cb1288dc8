"""
Moved to L{rmqha.ha.divergence}; this re-export is removed after issue 13's merge.
"""

from rmqha.ha.divergence import *  # noqa: F401,F403
from rmqha.ha.divergence import __all__ as __all__
from rmqha.ha.divergence import (  # noqa: F401
    DIGEST_TIMEOUT as DIGEST_TIMEOUT,
    MASTER_KIND_PATH as MASTER_KIND_PATH,
)
