"""
Tests for L{tools.layout}: the measurements, and docs/architecture.md's
generated section, which must be what the generator writes now (issue 26,
item 9: the page had said C{broker.py} was 671 lines long after it had
grown by a third).
"""

from __future__ import annotations

import os
import shutil

from twisted.trial.unittest import SynchronousTestCase

from tools import layout

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_made: list[str] = []


def _checkout_section() -> str:
    """
    C{layout.docs_section(ROOT)}, generated once per test run (it parses
    every module: seconds): both tests of the checkout's section use it,
    and the idempotence test generates it a second time to compare.
    """
    if not _made:
        _made.append(layout.docs_section(ROOT))
    return _made[0]


class ArchitectureDocsTests(SynchronousTestCase):
    """
    The committed generated section of docs/architecture.md is current.
    """

    def test_generated_section_is_current(self) -> None:
        """
        The part of docs/architecture.md between the markers is exactly
        what C{python -m tools.layout --docs} writes for this checkout; if
        this fails, run that command and commit the result.
        """
        with open(os.path.join(ROOT, layout.DOCS), encoding="utf-8") as f:
            text = f.read()
        wanted = layout.splice(text, _checkout_section())
        self.assertTrue(
            wanted == text,
            "docs/architecture.md's generated section is stale: run python -m tools.layout --docs",
        )

    def test_generator_is_idempotent(self) -> None:
        """
        Generating twice gives the same text, and splicing a section into
        a text that already holds it changes nothing.
        """
        section = _checkout_section()
        self.assertEqual(layout.docs_section(ROOT), section)
        with open(os.path.join(ROOT, layout.DOCS), encoding="utf-8") as f:
            text = f.read()
        once = layout.splice(text, section)
        self.assertEqual(layout.splice(once, section), once)

    def test_check_and_docs_commands(self) -> None:
        """
        C{--check} exits 1 on a stale section and leaves the file alone;
        C{--docs} rewrites only the part between the markers, after which
        C{--check} exits 0.
        """
        root = self._tree({"rmqha/__init__.py": '"""The package."""\n'})
        path = os.path.join(root, layout.DOCS)
        before = f"# Title\n\nhand-written\n\n{layout.BEGIN}\nold\n{layout.END}\n\nafter\n"
        with open(path, "w", encoding="utf-8") as f:
            f.write(before)
        self.assertEqual(layout.main(["--root", root, "--check"]), 1)
        with open(path, encoding="utf-8") as f:
            self.assertEqual(f.read(), before)
        self.patch(layout.sys, "stdout", open(os.devnull, "w"))
        self.addCleanup(layout.sys.stdout.close)
        self.assertEqual(layout.main(["--root", root, "--docs"]), 0)
        with open(path, encoding="utf-8") as f:
            after = f.read()
        self.assertTrue(after.startswith(f"# Title\n\nhand-written\n\n{layout.BEGIN}\n"))
        self.assertTrue(after.endswith(f"{layout.END}\n\nafter\n"))
        self.assertIn("| `rmqha/__init__.py` | 1 | The package. |", after)
        self.assertEqual(layout.main(["--root", root, "--check"]), 0)

    def _tree(self, files: dict[str, str]) -> str:
        root = os.path.abspath(self.mktemp())
        os.makedirs(os.path.join(root, "docs"))
        for name, text in files.items():
            path = os.path.join(root, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        return root

    def test_moved_module_regenerates_where_it_is(self) -> None:
        """
        Nothing in the section names a module by hand: a harness moved from
        C{rmqha/} to C{tools/} is listed under C{tools/} after the move,
        with its imports, and no longer under C{rmqha/}.
        """
        root = self._tree(
            {
                "rmqha/__init__.py": '"""The package."""\n',
                "rmqha/core.py": '"""The core."""\n',
                "rmqha/harness.py": '"""A harness.\n\nMore."""\nfrom rmqha import core\n',
                "tools/__init__.py": '"""Tools."""\n',
            }
        )
        before = layout.docs_section(root)
        self.assertIn("| `rmqha/harness.py` | 4 | A harness. |", before)
        self.assertIn("| `rmqha.harness` | `rmqha`, `rmqha.core` |", before)
        shutil.move(os.path.join(root, "rmqha/harness.py"), os.path.join(root, "tools/harness.py"))
        after = layout.docs_section(root)
        self.assertNotIn("rmqha/harness.py", after)
        self.assertIn("| `tools/harness.py` | 4 | A harness. |", after)
        self.assertIn("| `tools` | `rmqha`, `rmqha.core` |", after)
        self.assertIn("None.", after)  # (no class of 300 lines)

    def test_cycles_reported(self) -> None:
        """
        An import cycle shows in the section with its members.
        """
        root = self._tree(
            {
                "rmqha/__init__.py": "",
                "rmqha/a.py": "from rmqha import b\n",
                "rmqha/b.py": "def f():\n    import rmqha.a\n",
            }
        )
        section = layout.docs_section(root)
        self.assertIn("**1 import cycle(s)**", section)
        self.assertIn("- `rmqha.a` ↔ `rmqha.b`", section)

    def test_splice_needs_both_markers_once(self) -> None:
        """
        A text without the markers, with one twice, or with them in the
        wrong order is refused, not silently appended to.
        """
        for text in (
            "no markers\n",
            f"{layout.BEGIN}\n",
            f"{layout.BEGIN}\n{layout.BEGIN}\n{layout.END}\n",
            f"{layout.END}\n{layout.BEGIN}\n",
        ):
            self.assertRaises(ValueError, layout.splice, text, "x\n")


class SummaryTests(SynchronousTestCase):
    """
    The figures and texts of the generated section.
    """

    def test_about(self) -> None:
        """
        Line counts under 100 stay as they are; larger ones keep two
        significant figures, with thousands separators.
        """
        self.assertEqual(
            [layout.about(n) for n in (0, 99, 100, 137, 671, 1404, 14542, 28272)],
            ["0", "99", "100", "140", "670", "1,400", "15,000", "28,000"],
        )

    def test_summary(self) -> None:
        """
        A docstring's summary is the first sentence of its first
        paragraph, on one line, with epytext markup as code and no table
        cell breaker.
        """
        self.assertEqual(
            layout.summary("\nThe L{Broker} and C{put}.  More here.\n\nNext paragraph.\n"),
            "The `Broker` and `put`.",
        )
        self.assertEqual(layout.summary("C{a|b}: the\nlist:\n"), "`a\\|b`: the list")
        self.assertEqual(layout.summary(None), "(no docstring)")
        self.assertTrue(layout.summary("word " * 100).endswith(" …"))
