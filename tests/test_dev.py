"""
Tests for C{dev.py} (the quick-start script), with nothing installed or run.
"""

from __future__ import annotations

import importlib.util
import io
import os
import sys
from types import ModuleType

from twisted.trial.unittest import SynchronousTestCase

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_dev() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_rmqha_dev", os.path.join(ROOT, "dev.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class DevTests(SynchronousTestCase):
    """
    What C{python3 dev.py test} runs (issue 12, item 19).
    """

    def setUp(self) -> None:
        self.dev = load_dev()
        self.commands: list[list[str]] = []

        def run(argv: list[str]) -> int:
            self.commands.append(argv)
            return 0

        self.patch(self.dev, "run", run)
        self.patch(self.dev, "ensure_venv", lambda: None)
        self.patch(self.dev, "ensure_test_tools", lambda: None)

    def tools(self) -> list[str]:
        return [" ".join(argv[1:3]) for argv in self.commands]

    def test_whole_suite(self) -> None:
        """
        Without arguments: mypy, trial's discovery (a dry run: the suite
        runs once), then pytest listing skip reasons (C{-rs}); what
        C{.ci/run} relies on.
        """
        self.assertEqual(self.dev.main(["test"]), 0)
        self.assertEqual(self.tools(), ["-m mypy", "-m twisted.trial", "-m pytest"])
        self.assertIn("--dry-run", self.commands[1])
        self.assertIn("-rs", self.commands[-1])

    def test_selection_runs_only_pytest(self) -> None:
        """
        C{dev.py test -k X}: pytest alone, with the selection (and C{-rs}).
        """
        self.assertEqual(self.dev.main(["test", "-k", "recovery"]), 0)
        self.assertEqual(self.tools(), ["-m pytest"])
        self.assertEqual(self.commands[0][-2:], ["-k", "recovery"])
        self.assertIn("-rs", self.commands[0])

    def test_whole_suite_longest_files_first(self) -> None:
        """
        The whole suite runs each file on one worker, in collection order
        (C{--no-loadscope-reorder}: tests/conftest.py puts the longest
        files first), not in xdist's order by number of tests.
        """
        self.patch(self.dev.os, "environ", {"RMQHA_TEST_WORKERS": "3"})
        self.assertEqual(
            self.dev.parallel(), ["-n", "3", "--dist", "loadfile", "--no-loadscope-reorder"]
        )

    def test_bytecode_kept_outside_the_tree(self) -> None:
        """
        With C{PYTHONDONTWRITEBYTECODE} set, the commands write bytecode
        under .venv/pycache (compiled once, not in every process) and
        none next to the sources; a chosen prefix, or an environment
        without the variable, is left as it is.
        """
        env = self.dev.command_env({"PYTHONDONTWRITEBYTECODE": "1", "HOME": "/h"})
        self.assertEqual(
            env,
            {"HOME": "/h", "PYTHONPATH": self.dev.ROOT,
             "PYTHONPYCACHEPREFIX": os.path.join(self.dev.ROOT, ".venv", "pycache")},
        )
        env = self.dev.command_env({"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": "/c"})
        self.assertEqual(env["PYTHONDONTWRITEBYTECODE"], "1")
        self.assertEqual(env["PYTHONPYCACHEPREFIX"], "/c")
        self.assertEqual(self.dev.command_env({}), {"PYTHONPATH": self.dev.ROOT})

    def apt_get(
        self, present: tuple[str, ...] = (), status: int = 0
    ) -> tuple[ModuleType, io.StringIO, list[tuple[str, list[str], bool]]]:
        """
        C{ensure_test_tools} as root with apt-get and only C{present}
        tools; every command it runs is recorded with what was said
        before it and whether the policy-rc.d file existed then.
        """
        dev = load_dev()
        said = io.StringIO()
        calls: list[tuple[str, list[str], bool]] = []
        policy = self.mktemp()
        self.patch(dev, "POLICY_RC_D", policy)

        def call(argv: list[str], **kwargs: object) -> int:
            calls.append((said.getvalue(), argv, os.path.exists(policy)))
            return status if argv[0] == "apt-get" else 0

        def which(name: str) -> str | None:
            return f"/usr/bin/{name}" if name in ("apt-get", "systemctl", *present) else None

        self.patch(sys, "stdout", said)
        self.patch(dev.sys, "platform", "linux")
        self.patch(dev.os, "geteuid", lambda: 0)
        self.patch(dev.shutil, "which", which)
        self.patch(dev.subprocess, "call", call)
        dev.ensure_test_tools()
        self.assertFalse(os.path.exists(policy))
        return dev, said, calls

    def test_says_before_apt_get(self) -> None:
        """
        As root with tools missing, dev.py prints the apt-get command and
        why, before running it.
        """
        _, _, calls = self.apt_get(present=("etcd", "etcdctl", "promtool"))
        ((before, argv, policy),) = calls
        self.assertEqual(argv[:2], ["apt-get", "install"])
        self.assertIn("apt-get install", before)
        self.assertIn("iproute2 nftables", before)
        self.assertIn("test_netns.py", before)
        self.assertFalse(policy)

    def test_installs_etcd_without_starting_it(self) -> None:
        """
        etcd-server and etcd-client are installed for the failover tests,
        saying so first, with a temporary policy-rc.d so that Debian does
        not start a system etcd on 2379 (removed afterwards), and the unit
        disabled.
        """
        _, said, calls = self.apt_get(
            present=("ip", "tc", "nft", "promtool", "systemd-analyze", "systemd-sysusers")
        )
        (before, install, policy), (_, disable, _) = calls
        self.assertEqual(install[-2:], ["etcd-client", "etcd-server"])
        self.assertIn("etcd members", before)
        self.assertTrue(policy)
        self.assertEqual(disable, ["systemctl", "disable", "etcd"])

    def test_failed_install_says_so(self) -> None:
        """
        If apt-get fails (after an update), dev.py says the tests will be
        skipped, and leaves no policy-rc.d behind.
        """
        dev, said, calls = self.apt_get(status=100)
        packages = sorted({package for package, _ in dev.SYSTEM_TOOLS.values()})
        self.assertEqual(
            [argv[1:] for _, argv, _ in calls][:3],
            [calls[0][1][1:], ["update", "-q"], calls[0][1][1:]],
        )
        # Then one package at a time: each named as failed.
        self.assertEqual([argv[-1] for _, argv, _ in calls[3:]], packages)
        self.assertIn(f"could not install {' '.join(packages)}: the tests that need them "
                      "will be skipped", said.getvalue())
        # (No unit disabled: nothing was installed.)
        self.assertNotIn("systemctl", [argv[0] for _, argv, _ in calls])

    def test_one_package_failing_keeps_the_others(self) -> None:
        """
        When the packages together cannot be installed, each is tried on
        its own: the others are installed (and their units disabled), the
        one that failed is named.
        """
        dev = load_dev()
        said = io.StringIO()
        calls: list[list[str]] = []
        policy = self.mktemp()
        self.patch(dev, "POLICY_RC_D", policy)

        def call(argv: list[str], **kwargs: object) -> int:
            calls.append(argv)
            # (apt-get fails whenever systemd is among what it installs.)
            return 100 if argv[0] == "apt-get" and "systemd" in argv else 0

        def which(name: str) -> str | None:
            return f"/usr/bin/{name}" if name in ("apt-get", "systemctl") else None

        self.patch(sys, "stdout", said)
        self.patch(dev.sys, "platform", "linux")
        self.patch(dev.os, "geteuid", lambda: 0)
        self.patch(dev.shutil, "which", which)
        self.patch(dev.subprocess, "call", call)
        dev.ensure_test_tools()
        singles = [argv[-1] for argv in calls[3:] if argv[:2] == ["apt-get", "install"]]
        self.assertEqual(singles, sorted({p for p, _ in dev.SYSTEM_TOOLS.values()}))
        self.assertIn("could not install systemd: the tests that need it will be skipped",
                      said.getvalue())
        self.assertEqual(
            [argv for argv in calls if argv[0] == "systemctl"],
            [["systemctl", "disable", "etcd"], ["systemctl", "disable", "prometheus"]],
        )

    def test_nothing_missing(self) -> None:
        """
        With every tool present nothing runs and nothing is said.
        """
        _, said, calls = self.apt_get(
            present=(
                "ip", "tc", "nft", "etcd", "etcdctl", "promtool", "systemd-analyze",
                "systemd-sysusers",
            )
        )
        self.assertEqual((calls, said.getvalue()), ([], ""))

    def test_installs_promtool_without_starting_prometheus(self) -> None:
        """
        promtool comes from Debian's prometheus package, whose
        installation would start a Prometheus server on 9090: it is
        installed under the temporary policy-rc.d, saying why first, and
        its unit disabled, as etcd's is.
        """
        _, said, calls = self.apt_get(
            present=("ip", "tc", "nft", "systemd-analyze", "systemd-sysusers")
        )
        (before, install, policy), *disables = calls
        self.assertEqual(install[-3:], ["etcd-client", "etcd-server", "prometheus"])
        self.assertIn("alert rules with promtool", before)
        self.assertTrue(policy)
        self.assertEqual(
            [argv for _, argv, _ in disables],
            [["systemctl", "disable", "etcd"], ["systemctl", "disable", "prometheus"]],
        )
        _, _, calls = self.apt_get(
            present=("ip", "tc", "nft", "etcd", "etcdctl", "systemd-analyze", "systemd-sysusers")
        )
        (_, install, policy), (_, disable, _) = calls
        self.assertEqual((install[-1], policy), ("prometheus", True))
        self.assertEqual(disable, ["systemctl", "disable", "prometheus"])


class AcceleratorBuildTests(SynchronousTestCase):
    """
    C{dev.py} rebuilds the C accelerator (C{rmqha/store/_speedups.c}) in
    the checkout whenever it could be stale (issue 15).
    """

    def setUp(self) -> None:
        self.dev = load_dev()
        root = self.mktemp()
        os.makedirs(os.path.join(root, "rmqha", "store"))
        os.makedirs(os.path.join(root, ".venv", "bin"))
        for name in self.dev.BUILD_INPUTS:
            with open(os.path.join(root, name), "w") as f:
                f.write(f"contents of {name}\n")
        self.root = root
        self.patch(self.dev, "ROOT", root)
        self.patch(self.dev, "ACCELERATOR", os.path.join(root, "rmqha", "store", "_speedups"))
        self.patch(self.dev, "STAMP", os.path.join(root, ".venv", "stamp"))
        self.patch(self.dev, "PYTHON", sys.executable)
        self.installs: list[list[str]] = []
        self.patch(self.dev.subprocess, "run", lambda argv, **kw: self.installs.append(argv))
        self.patch(sys, "stdout", io.StringIO())

    def install(self) -> bool:
        """
        Run C{ensure_venv}; whether it (re)installed.
        """
        before = len(self.installs)
        self.dev.ensure_venv()
        return len(self.installs) > before

    def test_source_change_reinstalls(self) -> None:
        """
        Editing C{_speedups.c} (or setup.py) changes the install stamp, so
        the next run reinstalls, which compiles the module again in place.
        """
        self.patch(self.dev, "_accelerator_built", lambda: True)
        self.assertTrue(self.install())
        self.assertFalse(self.install())
        with open(os.path.join(self.root, "rmqha", "store", "_speedups.c"), "a") as f:
            f.write("/* changed */\n")
        self.assertTrue(self.install())
        self.assertFalse(self.install())

    def test_missing_build_reinstalls(self) -> None:
        """
        A checkout whose compiled module is gone (git clean) is built again
        where there is a compiler; without one, the pure-Python codec is
        used, dev.py says so in one line, and does not retry every run.
        """
        self.patch(self.dev, "_have_compiler", lambda: True)
        self.assertTrue(self.install())
        self.assertTrue(self.install())
        self.assertIn("was not built", sys.stdout.getvalue())
        open(self.dev.ACCELERATOR + ".cpython-311-x86_64-linux-gnu.so", "w").close()
        self.assertFalse(self.install())
        os.remove(self.dev.ACCELERATOR + ".cpython-311-x86_64-linux-gnu.so")
        self.patch(self.dev, "_have_compiler", lambda: False)
        self.assertFalse(self.install())


def _python_files(*directories: str) -> list[str]:
    found = []
    for directory in directories:
        for parent, _, names in os.walk(os.path.join(ROOT, directory)):
            found.extend(os.path.join(parent, n) for n in sorted(names) if n.endswith(".py"))
    return found


#: The developer harnesses: C{tools.X}, never C{rmqha.X} nor any module of
#: that name in the wheel.
_HARNESSES = (
    "bench", "soak", "fuzz", "abuse", "failover_cluster", "faultproxy", "etcd_cluster",
    "processes",
)


class LayoutTests(SynchronousTestCase):
    """
    What is shipped (C{rmqha/}) and what is a developer harness
    (C{tools/}), and the C{test-case-name} headers (issue 13).
    """

    def test_harnesses_live_in_tools(self) -> None:
        """
        bench, soak, fuzz, abuse and the real-process harnesses (failover
        cluster, fault proxy, etcd cluster, process helpers) are C{tools.X}
        modules, not C{rmqha.X};
        the wheel's package list leaves C{tools} out; nothing in C{rmqha}
        imports C{tools}.
        """
        import ast
        import importlib.util
        import tomllib

        from setuptools import find_namespace_packages

        for name in _HARNESSES:
            self.assertIsNotNone(importlib.util.find_spec(f"tools.{name}"), name)
            self.assertIsNone(importlib.util.find_spec(f"rmqha.{name}"), name)
        with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
            include = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]["include"]
        shipped = find_namespace_packages(ROOT, include=include)
        self.assertIn("rmqha", shipped)
        self.assertEqual([p for p in shipped if p.split(".")[0] in ("tools", "tests")], [])
        for path in _python_files("rmqha"):
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            for node in ast.walk(tree):
                names = (
                    [a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                    else []
                )
                for name in names:
                    self.assertNotEqual(name.split(".")[0], "tools", f"{path} imports {name}")

    def test_wheel_holds_no_harness(self) -> None:
        """
        The files the wheel would hold (every module of the packages
        pyproject's list finds, as setuptools finds them) include no
        harness: no C{tools} or C{tests} module, no module named after
        one (the benchmarks, the failover cluster, the fault proxy, the
        etcd cluster), and C{rmqha.testing} is in-memory fakes only: it
        starts no process and opens no socket or thread, and names none
        of the real-process helpers (issue 26, item 3).
        """
        import ast
        import tomllib

        from setuptools import find_namespace_packages

        with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
            include = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]["include"]
        modules = {}
        for package in find_namespace_packages(ROOT, include=include):
            directory = os.path.join(ROOT, *package.split("."))
            for name in sorted(os.listdir(directory)):
                if name.endswith(".py"):
                    modules[f"{package}.{name[:-3]}"] = os.path.join(directory, name)
        self.assertIn("rmqha.testing", modules)
        self.assertIn("rmqha._demo_launcher", modules)
        self.assertIn("twisted.plugins.rmqha_plugin", modules)
        for module in modules:
            top, leaf = module.split(".")[0], module.split(".")[-1]
            self.assertNotIn(top, ("tools", "tests"), module)
            self.assertNotIn(leaf, _HARNESSES, module)
        with open(modules["rmqha.testing"], encoding="utf-8") as f:
            tree = ast.parse(f.read())
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module)
        real = {"subprocess", "socket", "threading", "urllib", "rmqha._demo_launcher"}
        self.assertEqual(imported & real, set())
        self.assertEqual([m for m in imported if m.startswith("tools")], [])
        from rmqha import testing

        for name in (
            "EtcdCluster", "FaultProxy", "free_ports", "twistd_command",
            "twistd_slave_command", "etcd_binary",
        ):
            self.assertFalse(hasattr(testing, name), name)

    def test_test_case_names_exist(self) -> None:
        """
        Every C{test-case-name} header in C{rmqha/} and C{tools/} names
        test modules that exist (trial and editors run them).
        """
        headers = 0
        for path in _python_files("rmqha", "tools"):
            with open(path, encoding="utf-8") as f:
                first = f.readline()
            if "test-case-name:" not in first:
                continue
            headers += 1
            names = first.split("test-case-name:")[1].split("-*-")[0].strip()
            for name in names.split(","):
                module = os.path.join(ROOT, *name.strip().split(".")) + ".py"
                self.assertTrue(os.path.isfile(module), f"{path}: {name} does not exist")
        self.assertGreater(headers, 10)


class OptionalBuildTests(SynchronousTestCase):
    """
    setup.py's build of the C accelerator is optional (issue 15).
    """

    def test_failed_compile_is_one_line(self) -> None:
        """
        A compiler that fails (or is missing) costs one line on stderr
        naming the module and what failed, and the build goes on: rmqha
        installs with its pure-Python codec.
        """
        import runpy

        from setuptools import Distribution
        from setuptools.command.build_ext import build_ext

        import setuptools

        captured: dict[str, object] = {}
        self.patch(setuptools, "setup", lambda **kw: captured.update(kw))
        runpy.run_path(os.path.join(ROOT, "setup.py"), run_name="not_main")
        command_class = captured["cmdclass"]["build_ext"]  # type: ignore[index]
        (extension,) = captured["ext_modules"]  # type: ignore[misc]
        self.assertEqual(extension.name, "rmqha.store._speedups")

        def fail(self: object, ext: object) -> None:
            raise OSError("command 'cc' failed: No such file or directory")

        self.patch(build_ext, "build_extension", fail)
        command = command_class(Distribution())
        stderr = io.StringIO()
        self.patch(sys, "stderr", stderr)
        command.build_extension(extension)
        (line,) = stderr.getvalue().splitlines()
        self.assertIn("rmqha.store._speedups was not built", line)
        self.assertIn("No such file or directory", line)
        self.assertIn("pure-Python codec", line)
