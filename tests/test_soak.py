"""
Tests for L{tools.soak} that start no process (the soak itself runs in
C{tests.integration.test_soak}).
"""

from __future__ import annotations

import io
import math
import os
import sys
from types import SimpleNamespace
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from tools import soak


class OutTests(SynchronousTestCase):
    """
    The soak never overwrites its results (issue 12, item 3), and says so
    before it spends minutes running.
    """

    def setUp(self) -> None:
        def no_run(*args: object, **kwargs: object) -> str:
            self.fail("the soak started")

        self.patch(soak, "tempfile", SimpleNamespace(mkdtemp=no_run))

    def test_refuses_existing_results(self) -> None:
        """
        An C{--out} holding a C{soak.json} is refused at once: one line
        naming it, exit 2, the file untouched.
        """
        out = self.mktemp()
        os.makedirs(out)
        with open(os.path.join(out, "soak.json"), "w") as f:
            f.write("mine")
        err = io.StringIO()
        self.patch(sys, "stderr", err)
        self.assertEqual(soak.main(["--minutes", "1", "--out", out]), 2)
        self.assertEqual(err.getvalue().count("\n"), 1)
        self.assertIn(f"{out}/soak.json exists; the soak does not overwrite", err.getvalue())
        self.assertRaises(ValueError, soak.run, 60, out)
        with open(os.path.join(out, "soak.json")) as f:
            self.assertEqual(f.read(), "mine")

    def test_refuses_a_file(self) -> None:
        """
        An C{--out} that is a file is refused.
        """
        out = self.mktemp()
        with open(out, "w") as f:
            f.write("mine")
        error = self.assertRaises(ValueError, soak.run, 60, out)
        self.assertIn("is not a directory", str(error))


def _samples(
    heap: list[float], mapped: list[float], lags: list[dict[str, int | None]] | None = None
) -> list[dict[str, Any]]:
    """
    Soak samples, one a second: the master's heap and mapped-file RSS (MiB)
    as given, the slaves' flat, 12 open files each, the lags as given
    (zero by default).
    """
    samples = []
    for i, (h, m) in enumerate(zip(heap, mapped)):
        sample: dict[str, Any] = {"t": float(i + 1)}
        for name in _NAMES:
            sample[f"{name}_rss_anon"] = int(h * MiB) if name == "master" else 37 * MiB
            sample[f"{name}_rss_file"] = int(m * MiB) if name == "master" else 18 * MiB
            sample[f"{name}_rss"] = sample[f"{name}_rss_anon"] + sample[f"{name}_rss_file"]
            sample[f"{name}_fds"] = 12
        sample["lag"] = lags[i] if lags else {"slave1": 0, "slave2": 0}
        samples.append(sample)
    return samples


MiB = 1 << 20
_NAMES = ["master", "slave1", "slave2"]


class VerdictTests(SynchronousTestCase):
    """
    The soak's verdict tells warm-up and a segment being filled from
    growth (issue 28: a 1-minute soak said "master RSS grows", 64 -> 89
    MiB in steps, which was the current segment's pages).
    """

    def test_warm_up_then_flat(self) -> None:
        """
        A series that climbs during its first half and is flat (with
        noise) after does not grow; one that climbs steadily does.
        """
        warm = [37.6 + min(i, 20) * 0.055 + (i % 3) * 0.01 for i in range(60)]
        self.assertFalse(soak.grows([v * MiB for v in warm], *soak.HEAP_ALLOWANCE))
        steady = [37.6 + i * 0.5 for i in range(60)]
        self.assertTrue(soak.grows([v * MiB for v in steady], *soak.HEAP_ALLOWANCE))
        # A slow leak over a longer run: 1 MiB a minute for 10 minutes.
        slow = [40 + i / 60 for i in range(600)]
        self.assertTrue(soak.grows([v * MiB for v in slow], *soak.HEAP_ALLOWANCE))
        # Under 10 samples: not judged.
        self.assertFalse(soak.grows([float(i) for i in range(9)], 1))
        # (The rules that were, and still hold.)
        self.assertFalse(soak.grows([100.0] * 50, 4))
        self.assertTrue(soak.grows([float(i) for i in range(50)], 4))
        self.assertFalse(soak.grows([float(i % 5) for i in range(50)], 4))

    def test_relative(self) -> None:
        """
        With a relative allowance, a rise must also exceed that share of
        where the line starts.
        """
        rising = [1000.0 + i for i in range(40)]  # rises 19 over the second half
        self.assertTrue(soak.grows(rising, 10))
        self.assertFalse(soak.grows(rising, 10, 0.1))

    def test_filling_segment(self) -> None:
        """
        The issue's run: the heap warms up by about 1 MiB and stays; the
        mapped-file RSS climbs in 4 MiB steps (the pre-faulter) as the
        64 MiB segment fills.  Nothing grows.
        """
        heap = [37.6 + min(i, 20) * 0.055 for i in range(90)]
        mapped = [26.5 + 4 * (i // 9) for i in range(90)]
        judged = soak.verdicts(_samples(heap, mapped), _NAMES, 64 * MiB)
        self.assertEqual(sorted(k for k, v in judged.items() if v), [])
        self.assertEqual(
            sorted(judged),
            sorted(
                [f"{n}_{s}" for n in _NAMES for s in ("heap", "mapped", "fds")]
                + ["slave1_lag", "slave2_lag"]
            ),
        )

    def test_saw_tooth(self) -> None:
        """
        Segments rolling: the mapped pages rise to a segment and drop back,
        again and again: not growth.
        """
        mapped = [26.5 + (i % 20) * 0.4 for i in range(120)]
        judged = soak.verdicts(_samples([38.0] * 120, mapped), _NAMES, 8 * MiB)
        self.assertFalse(judged["master_mapped"])

    def test_segments_kept_mapped(self) -> None:
        """
        Every full segment staying mapped (the leak docs/reliability.md
        tells of): the mapped pages climb past one segment and more.
        """
        mapped = [26.5 + i * 0.4 for i in range(120)]  # 48 MiB over 8 MiB segments
        judged = soak.verdicts(_samples([38.0] * 120, mapped), _NAMES, 8 * MiB)
        self.assertEqual([k for k, v in judged.items() if v], ["master_mapped"])

    def test_heap_leak(self) -> None:
        """
        A heap that keeps growing after warm-up is named.
        """
        heap = [38.0 + i * 0.2 for i in range(120)]
        judged = soak.verdicts(_samples(heap, [26.5] * 120), _NAMES, 64 * MiB)
        self.assertEqual([k for k, v in judged.items() if v], ["master_heap"])

    def test_lag(self) -> None:
        """
        A slave falling behind is named, its own lag judged (samples where
        its lag is unknown left out).
        """
        lags: list[dict[str, int | None]] = [
            {"slave1": 1119, "slave2": None if i % 7 == 0 else i * MiB} for i in range(60)
        ]
        judged = soak.verdicts(_samples([38.0] * 60, [26.5] * 60, lags), _NAMES, 64 * MiB)
        self.assertEqual([k for k, v in judged.items() if v], ["slave2_lag"])


class ChartTests(SynchronousTestCase):
    """
    What C{soak.png} draws (L{soak._figure}).
    """

    def _figure(self, samples: list[dict[str, Any]]) -> Any:
        import matplotlib.pyplot as plt

        fig = soak._figure(samples, _NAMES)
        self.addCleanup(plt.close, fig)
        return fig

    def test_series(self) -> None:
        """
        Four panels (heap, mapped files, open files, lag), each line the
        samples of its process; the slaves' identical lines still look
        different from each other and from the master's (colour, dash,
        marker), and their markers are staggered.
        """
        heap = [38.0 + i for i in range(30)]
        samples = _samples(heap, [26.5] * 30)
        heap_ax, mapped_ax, fds_ax, lag_ax = self._figure(samples).axes
        self.assertEqual(
            [ax.get_ylabel() for ax in (heap_ax, mapped_ax, fds_ax, lag_ax)],
            ["heap RSS (MiB)", "mapped-file RSS (MiB)", "open files", "lag (bytes)"],
        )
        for ax, key, scale in ((heap_ax, "rss_anon", MiB), (mapped_ax, "rss_file", MiB), (fds_ax, "fds", 1)):
            self.assertEqual([line.get_label() for line in ax.lines], _NAMES)
            for line, name in zip(ax.lines, _NAMES):
                self.assertEqual(list(line.get_xdata()), [s["t"] for s in samples])
                self.assertEqual(list(line.get_ydata()), [s[f"{name}_{key}"] / scale for s in samples])
            looks = {(ln.get_color(), ln.get_linestyle(), ln.get_marker()) for ln in ax.lines}
            self.assertEqual(len(looks), 3)
            # Every look differs from every other in each respect.
            for part in range(3):
                self.assertEqual(len({look[part] for look in looks}), 3)
            self.assertEqual(len({str(ln.get_markevery()) for ln in ax.lines}), 3)
        self.assertEqual([line.get_label() for line in lag_ax.lines], ["slave1", "slave2"])

    def test_lag_units(self) -> None:
        """
        The lag is drawn in the unit its largest value reaches (not 0.0010
        MiB), and an unknown lag is a gap, not a zero.
        """
        self.assertEqual(soak.lag_unit(0), ("bytes", 1))
        self.assertEqual(soak.lag_unit(1023), ("bytes", 1))
        self.assertEqual(soak.lag_unit(3357), ("KiB", 1024))
        self.assertEqual(soak.lag_unit(9 * MiB), ("MiB", MiB))
        self.assertEqual(soak.lag_unit(3 << 30), ("GiB", 1 << 30))
        lags: list[dict[str, int | None]] = [
            {"slave1": 1119, "slave2": None}, {"slave1": 2238, "slave2": 3357}
        ]
        lag_ax = self._figure(_samples([38.0] * 2, [26.5] * 2, lags)).axes[3]
        self.assertEqual(lag_ax.get_ylabel(), "lag (KiB)")
        one, two = (list(line.get_ydata()) for line in lag_ax.lines)
        self.assertEqual(one, [1119 / 1024, 2238 / 1024])
        self.assertTrue(math.isnan(two[0]))
        self.assertEqual(two[1], 3357 / 1024)

