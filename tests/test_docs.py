"""
The examples in the README run as written: its Python, and its twistd
command lines.
"""

from __future__ import annotations

import io
import os
import re
import shlex

from twisted.trial.unittest import SkipTest, SynchronousTestCase

from rmqha.store import _segments
from rmqha.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python_blocks(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.DOTALL)


def shell_commands(path: str) -> list[list[str]]:
    """
    The commands of every ```sh block (continuation lines joined, comments
    dropped), split as the shell would.
    """
    with open(path, encoding="utf-8") as f:
        blocks = re.findall(r"```sh\n(.*?)```", f.read(), re.DOTALL)
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv:
                commands.append(argv)
    return commands


class ReadmeTests(SynchronousTestCase):
    """
    README.md's code is exercised, so it cannot drift from the API.
    """

    def test_python_examples_run(self) -> None:
        """
        Each ```python block runs in a fresh directory without error (the
        examples write a store named STORE there).
        """
        blocks = python_blocks(os.path.join(ROOT, "README.md"))
        self.assertTrue(blocks, "README.md has no Python example")
        # The example uses the default segment size, which preallocates
        # 1 GiB; tests use small segments.
        self.patch(_segments, "DEFAULT_SEGMENT_SIZE", 64 * 1024)
        previous = os.getcwd()
        workdir = os.path.abspath(self.mktemp())
        os.makedirs(workdir)
        os.chdir(workdir)
        self.addCleanup(os.chdir, previous)
        for block in blocks:
            exec(compile(block, "README.md", "exec"), {"print": lambda *a: None})
        commitlog_dir = os.path.join(workdir, "STORE", "commitlog")
        self.assertTrue(os.path.isdir(commitlog_dir))
        sizes = {os.path.getsize(os.path.join(commitlog_dir, n)) for n in os.listdir(commitlog_dir)}
        self.assertEqual(sizes, {64 * 1024})

    def test_twistd_examples(self) -> None:
        """
        Every twistd command line in the README parses as one, names its
        own pidfile (two brokers in one directory must not share
        twistd.pid), and binds what it listens on to 127.0.0.1; lines that
        run at the same time use different pidfiles and stores.
        """
        from twisted.scripts.twistd import ServerOptions

        previous = os.getcwd()
        workdir = os.path.abspath(self.mktemp())
        os.makedirs(workdir)
        os.chdir(workdir)
        self.addCleanup(os.chdir, previous)
        commands = shell_commands(os.path.join(ROOT, "README.md"))
        for argv in commands:
            if os.path.basename(argv[0]) == "rmqha" and argv[1:3] == ["certs", "init"]:
                # The TLS lines' files, as the README makes them.
                self.assertEqual(main(argv[1:], stdout=io.StringIO()), 0)
        lines = [argv for argv in commands if os.path.basename(argv[0]) == "twistd"]
        self.assertGreaterEqual(len(lines), 4)
        pidfiles: dict[str, str] = {}
        for argv in lines:
            text = " ".join(argv)
            self.assertIn("--pidfile", argv, text)
            rmqha = argv.index("rmqha")
            pidfile = argv[argv.index("--pidfile") + 1]
            self.assertLess(argv.index("--pidfile"), rmqha, text)
            for flag in ("--ha-listen", "--http"):
                if flag in argv:
                    self.assertIn("interface=127.0.0.1", argv[argv.index(flag) + 1], text)
            if "--config" in argv:
                continue  # (broker.conf is the reader's)
            options = ServerOptions()
            options.parseOptions(argv[1:])
            store = options.subOptions.settings.store_dir
            # One pidfile per store: M.pid is M's, whichever role runs it.
            self.assertEqual(pidfiles.setdefault(pidfile, store), store, text)
        self.assertEqual(len(set(pidfiles.values())), len(pidfiles))


class RepositoryTests(SynchronousTestCase):
    """
    Test output stays out of the repository (issue 12, item 18: 70 files
    under C{__main__/D/runTest/}, 15 private keys among them, had been
    committed from a C{SynchronousTestCase.mktemp()} run as a script).
    """

    def test_no_test_output_committed(self) -> None:
        """
        No tracked file is under C{__main__/} or C{_trial_temp*/}, and no
        private key is tracked outside C{tests/fixtures/}; C{.gitignore}
        ignores both directories.
        """
        import shutil
        import subprocess

        if shutil.which("git") is None or not os.path.exists(os.path.join(ROOT, ".git")):
            raise SkipTest("not a git checkout (an sdist or installed copy)")
        tracked = subprocess.run(
            ["git", "-C", ROOT, "ls-files"], capture_output=True, text=True, check=True
        ).stdout.splitlines()
        bad = [
            path for path in tracked
            if path.startswith(("__main__/", "_trial_temp"))
            or (path.endswith(".key") and not path.startswith("tests/fixtures/"))
        ]
        self.assertEqual(bad, [])
        with open(os.path.join(ROOT, ".gitignore")) as f:
            ignored = f.read().split()
        self.assertIn("/__main__/", ignored)
        self.assertIn("_trial_temp*", ignored)
