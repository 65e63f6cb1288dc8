"""
Moved to L{rmqha.ha.divergence} (the algorithm) and L{rmqha.ha.control}
(the control client and the probe); this re-export is removed after issue
13's merge.
"""

from rmqha.ha.divergence import *  # noqa: F401,F403
from rmqha.ha.divergence import (  # noqa: F401
    MASTER_KIND_PATH as MASTER_KIND_PATH,
    find_divergence as find_divergence,
)
from rmqha.ha.control import (  # noqa: F401
    DIGEST_TIMEOUT as DIGEST_TIMEOUT,
    CheckFailed as CheckFailed,
    ControlClient as ControlClient,
    MasterInfo as MasterInfo,
    MasterUnreachable as MasterUnreachable,
    probe as probe,
)
