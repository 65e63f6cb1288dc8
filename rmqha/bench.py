"""
C{python -m rmqha.bench ...}: the benchmarks of C{tools/bench.py}
(C{python -m rmqha.bench failover --kills 20}, as issue 16 names it).

The benchmarks are developer tools that live in the checkout's C{tools/},
not in the installed package: this module forwards to them when run from
a checkout (or with the checkout on C{PYTHONPATH}), and says so otherwise.
"""

from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.isfile(os.path.join(root, "tools", "bench.py")):
        raise SystemExit(
            "python -m rmqha.bench: the benchmarks live in a source checkout's tools/bench.py; "
            "run this from a checkout (git clone ...; python -m rmqha.bench ...)"
        )
    if root not in sys.path:
        sys.path.insert(0, root)
    # (Run, not imported: the package never imports tools/, which is not
    # shipped; tests/test_dev.py holds that rule.)
    runpy.run_module("tools.bench", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
