"""
A quick run of C{python -m tools.abuse} against this code: every scenario
stays within the bounds of issue 12 (section C), and the run leaves no
process and no file behind.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from tools import abuse


def test_quick_run_within_bounds(tmp_path: Any, monkeypatch: Any) -> None:
    """
    All four scenarios, shortened (C{--quick}): /status answers within 1 s
    under 200 pipelined DIGEST requests; an unread flood of refused
    requests grows the master by less than 50 MiB; a POST declaring 2 GiB
    is refused before 1 MiB of it is taken and nothing reaches the
    master's TMPDIR; idle connections past the cap are closed and a put
    still succeeds.  Afterwards every master has exited and the run's
    directory is gone.
    """
    masters: list[Any] = []
    class Recorded(abuse._Master):
        def __init__(self, *args: Any) -> None:
            masters.append(self)
            super().__init__(*args)

    # The run's directory is made in tmp_path, so that we see it go.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(abuse, "_Master", Recorded)
    result = abuse.run(list(abuse.SCENARIOS), [abuse._this_checkout()], abuse.QUICK)
    (run,) = result["runs"]
    s = run["scenarios"]
    assert s["digest"]["status_worst_s"] < 1.0, s["digest"]
    assert s["digest"]["status_failed"] == 0, s["digest"]
    assert s["flood"]["rss_growth_mib"] < 50, s["flood"]
    assert s["flood"]["sent_bytes"] < abuse.QUICK.flood_bytes, s["flood"]
    assert s["post"]["sent_bytes"] < 1 << 20, s["post"]
    assert s["post"]["tmpdir_bytes"] == 0, s["post"]
    assert "413" in s["post"]["answer"], s["post"]
    assert s["conns"]["closed_or_reset"] > 0, s["conns"]
    assert s["conns"]["put_answer"].startswith("200"), s["conns"]
    assert s["conns"]["status_worst_s"] < 1.0, s["conns"]
    assert len(masters) == 4
    assert all(m.process.returncode is not None for m in masters)
    assert masters[0].directory.startswith(str(tmp_path))
    assert os.listdir(tmp_path) == []
