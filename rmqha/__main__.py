"""
C{python -m rmqha}: the same as the C{rmqha} command.
"""

import sys

from rmqha.cli import main

sys.exit(main())
