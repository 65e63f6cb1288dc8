"""
Tests for C{stats.png} (L{rmqha.pipeline.jobs._chart}): it is a function of
C{stats.json}'s series, so these need no Spark: they check that what is
drawn is exactly the series, no more and no less (issue 28: a line drawn
across hours with no data, and a point the series lacks).
"""

from __future__ import annotations

import datetime
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from rmqha.pipeline import jobs

_PATTERNS = {"minute": "%Y-%m-%dT%H:%MZ", "hour": "%Y-%m-%dT%H:00Z", "day": "%Y-%m-%d"}
_WIDTHS = {"minute": 1 / 1440, "hour": 1 / 24, "day": 1.0}


def _result(bucket: str, series: list[tuple[str, str, int]]) -> dict[str, Any]:
    """
    A C{stats.json} result holding C{series} (topic, time, messages).
    """
    totals: dict[str, int] = {}
    for topic, _, n in series:
        totals[topic] = totals.get(topic, 0) + n
    return {
        "store": "file:/tmp/store",
        "messages": sum(totals.values()),
        "bucket": bucket,
        "topics": [{"topic": t, "messages": n} for t, n in totals.items()],
        "series": [{"topic": t, "time": time, "messages": n} for t, time, n in series],
    }


def _drawn(result: dict[str, Any]) -> list[tuple[str, list[tuple[str, int]]]]:
    """
    What the figure of C{result} really draws, read back from its
    artists: per panel, its title and its bars as (bucket start written as
    in C{stats.json}, height), each checked to span exactly one bucket.
    """
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    fig = jobs._chart_figure(result)
    try:
        bucket = result["bucket"]
        panels = []
        for ax in fig.axes:
            bars = []
            for patch in ax.patches:
                start = mdates.num2date(patch.get_x(), tz=datetime.timezone.utc)
                assert abs(patch.get_width() - _WIDTHS[bucket]) < 1e-9, patch.get_width()
                bars.append((start.strftime(_PATTERNS[bucket]), round(patch.get_height())))
            # No line at all: nothing joins two buckets.
            assert [line for line in ax.lines if len(line.get_xdata())] == [], ax.lines
            panels.append((ax.get_title(loc="left"), bars))
        return panels
    finally:
        plt.close(fig)


class ChartTests(SynchronousTestCase):
    """
    C{stats.png} draws one bar per row of the series, at its true time.
    """

    def test_gap(self) -> None:
        """
        Hours without a row get no bar and no line across them; a topic
        gets no point at a time only another topic has; each bar stands at
        its own hour on a true time axis (the gap is as wide as the hours
        it spans).
        """
        result = _result("hour", [
            ("A", "2026-11-23T00:00Z", 5),
            ("A", "2026-11-23T01:00Z", 7),
            ("A", "2026-11-23T05:00Z", 3),
            ("B", "2026-11-23T02:00Z", 4),
        ])
        expected = [
            ("A", [("2026-11-23T00:00Z", 5), ("2026-11-23T01:00Z", 7), ("2026-11-23T05:00Z", 3)]),
            ("B", [("2026-11-23T02:00Z", 4)]),
        ]
        self.assertEqual(jobs._chart_panels(result), expected)
        self.assertEqual(_drawn(result), expected)

    def test_buckets(self) -> None:
        """
        Minute and day buckets too, and a garbage year below 1000 (written
        without its leading zero), are drawn where they are.
        """
        minutes = [("T", "2026-11-23T02:35Z", 2), ("T", "2026-11-23T03:10Z", 9)]
        self.assertEqual(_drawn(_result("minute", minutes)), [("T", [(t, n) for _, t, n in minutes])])
        days = [("T", "470-12-30", 1), ("T", "2026-11-20", 6), ("T", "2026-11-23", 8)]
        self.assertEqual(_drawn(_result("day", days)), [("T", [(t, n) for _, t, n in days])])

    def test_other_topics(self) -> None:
        """
        Past twelve topics the rest are summed per bucket into one last
        panel: only at buckets where one of them has a row.  (What is
        drawn is what L{jobs._chart_panels} says: L{test_gap}.)
        """
        series = [(f"t{i:02}", "2026-11-23T00:00Z", 100 - i) for i in range(14)]
        series.append(("t13", "2026-11-23T03:00Z", 1))
        panels = jobs._chart_panels(_result("hour", series))
        self.assertEqual(len(panels), 13)
        self.assertEqual(panels[0], ("t00", [("2026-11-23T00:00Z", 100)]))
        self.assertEqual(
            panels[-1],
            ("2 other topics", [("2026-11-23T00:00Z", 88 + 87), ("2026-11-23T03:00Z", 1)]),
        )

    def test_empty(self) -> None:
        """
        An empty store's chart is one empty panel, still a PNG.
        """
        result = _result("minute", [])
        self.assertEqual(_drawn(result), [("", [])])
        self.assertEqual(jobs._chart(result)[:8], b"\x89PNG\r\n\x1a\n")

    def test_bad_time(self) -> None:
        """
        A time that is no bucket start is named.
        """
        error = self.assertRaises(ValueError, jobs._bucket_start, "yesterday")
        self.assertEqual(str(error), "stats.json time 'yesterday' is not a bucket start")
