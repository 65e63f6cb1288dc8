#!/usr/bin/env python3
"""
The quick start: works on a fresh machine with Python 3.11+ and nothing
else installed (standard library only), installing what it needs into
./.venv on first use and whenever pyproject.toml, setup.py or the C
accelerator's source changes (the install compiles it in place).

    python3 dev.py demo [ARGS]   the main job (see README); ARGS go to rmqha demo
    python3 dev.py demo --failover   automatic failover: one etcd, three brokers
    python3 dev.py test          the whole test suite: mypy, trial, pytest
    python3 dev.py test ARGS     only pytest, with ARGS (e.g. -k recovery -x)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import venv

ROOT = os.path.dirname(os.path.abspath(__file__))
VENV = os.path.join(ROOT, ".venv")
BIN = os.path.join(VENV, "Scripts" if os.name == "nt" else "bin")
PYTHON = os.path.join(BIN, "python")
STAMP = os.path.join(VENV, ".rmqha-installed")


def _say(message: str) -> None:
    print(f"[dev.py] {message}", flush=True)


#: What the install is built from: a change to any of them reinstalls (and
#: so recompiles the C accelerator in place, next to its source).
BUILD_INPUTS = ("pyproject.toml", "setup.py", os.path.join("rmqha", "store", "_speedups.c"))
ACCELERATOR = os.path.join(ROOT, "rmqha", "store", "_speedups")


def _requirements_hash() -> str:
    digest = hashlib.sha256()
    for name in BUILD_INPUTS:
        with open(os.path.join(ROOT, name), "rb") as f:
            digest.update(name.encode() + b"\0" + f.read())
    return digest.hexdigest()


def _accelerator_built() -> bool:
    """
    Whether the compiled codec (rmqha/store/_speedups.c) is built in the
    checkout, where the tests import it from (PYTHONPATH=the checkout).
    """
    directory = os.path.dirname(ACCELERATOR)
    prefix = os.path.basename(ACCELERATOR) + "."
    return any(
        name.startswith(prefix) and name.endswith((".so", ".pyd"))
        for name in os.listdir(directory)
    )


def _have_compiler() -> bool:
    return any(shutil.which(cc) for cc in (os.environ.get("CC", "cc"), "cc", "gcc"))


def ensure_venv() -> None:
    """
    Create ./.venv and install rmqha with its test and spark extras (the
    pipeline's tests need PySpark, and Java 17 on the machine), unless already done
    for this pyproject.toml.  The install is editable in setuptools'
    "compat" mode: the checkout itself is on sys.path, which is what lets
    twistd find twisted/plugins/rmqha_plugin.py (the default editable mode
    hides it).
    """
    if sys.version_info < (3, 11):
        sys.exit(f"dev.py: Python 3.11 or later is needed, this is {sys.version.split()[0]}")
    wanted = _requirements_hash()
    if os.path.exists(STAMP):
        with open(STAMP) as f:
            # A checkout cleaned of its build (git clean) is built again.
            if f.read().strip() == wanted and (_accelerator_built() or not _have_compiler()):
                return
    if not os.path.exists(PYTHON):
        _say(f"creating {VENV}")
        venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
    _say("installing rmqha with its test and Spark dependencies (first run: a few minutes)")
    subprocess.run(
        [PYTHON, "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True
    )
    subprocess.run(
        [
            PYTHON,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--config-settings",
            "editable_mode=compat",
            "-e",
            f"{ROOT}[test,spark]",
        ],
        check=True,
        # setuptools warns that compat mode is transitional; it is what
        # twistd needs today (see docs/development.md), so keep it quiet.
        env=dict(os.environ, PYTHONWARNINGS="ignore"),
    )
    if not _accelerator_built():
        _say(
            "the C accelerator (rmqha/store/_speedups.c) was not built: no C compiler, "
            "Python headers or zlib headers; the pure-Python codec is used"
        )
    with open(STAMP, "w") as f:
        f.write(wanted + "\n")


#: The system tools some tests need: tool -> (Debian package, the tests).
SYSTEM_TOOLS = {
    "ip": ("iproute2", "tests/integration/test_netns.py shapes traffic with ip, tc and nft"),
    "tc": ("iproute2", "tests/integration/test_netns.py shapes traffic with ip, tc and nft"),
    "nft": ("nftables", "tests/integration/test_netns.py shapes traffic with ip, tc and nft"),
    "etcd": ("etcd-server", "the failover tests start their own etcd members"),
    "etcdctl": ("etcd-client", "the failover tests start their own etcd members"),
    "promtool": ("prometheus", "tests/test_monitoring.py checks and unit-tests the alert rules with promtool"),
    "systemd-analyze": ("systemd", "tests/integration/test_deploy.py verifies the systemd unit"),
    "systemd-sysusers": ("systemd", "tests/integration/test_deploy.py verifies the systemd unit"),
}
#: Packages whose installation would start a system service, and its unit.
SERVICES = {"etcd-server": "etcd", "prometheus": "prometheus"}
POLICY_RC_D = "/usr/sbin/policy-rc.d"


def ensure_test_tools() -> None:
    """
    Some tests need system tools (L{SYSTEM_TOOLS}).  As root on a machine
    with apt-get, install the packages that are missing, saying so first;
    anywhere else those tests skip, saying why.

    Debian's etcd-server would start a system etcd on port 2379, and its
    prometheus (for promtool) a Prometheus server on 9090: while
    installing, a temporary policy-rc.d (only if there is none) keeps
    package scripts from starting services, and their units
    (L{SERVICES}) are disabled afterwards; the tests start their own etcd
    members on free ports and run no Prometheus server.
    """
    if sys.platform != "linux" or os.geteuid() != 0 or shutil.which("apt-get") is None:
        return
    missing = {tool: SYSTEM_TOOLS[tool] for tool in SYSTEM_TOOLS if shutil.which(tool) is None}
    packages = sorted({package for package, _ in missing.values()})
    if not packages:
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
    reasons = sorted({why for _, why in missing.values()})
    # Said before it happens: this changes the machine, not just ./.venv.
    _say(
        f"running as root: {' '.join(install)} (and apt-get update if that fails): "
        f"{'; '.join(reasons)} ({', '.join(sorted(missing))} missing)"
    )

    def quietly(argv: list[str]) -> int:
        return subprocess.call(
            argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    services = [SERVICES[package] for package in packages if package in SERVICES]
    policy = bool(services) and not os.path.exists(POLICY_RC_D)
    if policy:
        with open(POLICY_RC_D, "w") as f:
            f.write("#!/bin/sh\n# dev.py: no service starts while it installs packages\nexit 101\n")
        os.chmod(POLICY_RC_D, 0o755)
    failed: list[str] = []
    try:
        status = quietly(install)
        if status:
            # A fresh machine may have no package lists yet.
            quietly(["apt-get", "update", "-q"])
            status = quietly(install)
        if status and len(packages) > 1:
            # One package that cannot be installed must not keep the
            # others out (and their tests skipped): one at a time.
            failed = [p for p in packages if quietly([*install[:-len(packages)], p])]
        elif status:
            failed = packages
    finally:
        if policy:
            os.remove(POLICY_RC_D)
    if failed:
        _say(
            f"could not install {' '.join(failed)}: the tests that need "
            f"{'it' if len(failed) == 1 else 'them'} will be skipped"
        )
    if services and shutil.which("systemctl") is not None:
        for package, unit in SERVICES.items():
            if package in packages and package not in failed:
                quietly(["systemctl", "disable", unit])


#: Where the commands' Python processes keep their bytecode when the
#: environment says not to write it next to the sources (L{command_env}).
PYCACHE = os.path.join(VENV, "pycache")


def command_env(environ: dict[str, str]) -> dict[str, str]:
    """
    The environment of the commands dev.py runs: the checkout on
    C{PYTHONPATH}.  Where C{PYTHONDONTWRITEBYTECODE} is set (and no
    C{PYTHONPYCACHEPREFIX}), bytecode goes to C{.venv/pycache} instead of
    nowhere: the tree stays free of C{__pycache__}, and each module is
    compiled once, not in every process that imports it -- the suite
    starts hundreds (twistd nodes, CLI runs), each compiling rmqha's
    modules for ~0.2 CPU-seconds otherwise.
    """
    env = dict(environ, PYTHONPATH=ROOT)
    if env.get("PYTHONDONTWRITEBYTECODE") and not env.get("PYTHONPYCACHEPREFIX"):
        del env["PYTHONDONTWRITEBYTECODE"]
        env["PYTHONPYCACHEPREFIX"] = PYCACHE
    return env


def run(argv: list[str]) -> int:
    os.chdir(ROOT)
    return subprocess.call(argv, env=command_env(dict(os.environ)))


def main(args: list[str]) -> int:
    if not args or args[0] not in ("demo", "test"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    command, rest = args[0], args[1:]
    ensure_venv()
    if command == "demo":
        if "--failover" in rest:
            # It runs etcd: installed as for the tests (as root, saying so).
            ensure_test_tools()
        return run([PYTHON, "-m", "rmqha", "demo", *rest])
    if rest:
        # A selection (-k X, a file, -x ...) is pytest's alone: mypy and
        # trial would run everything regardless.
        ensure_test_tools()
        return run(pytest_command(rest))
    ensure_test_tools()
    # mypy; then trial's discovery (every test module imports and every
    # test is found under trial too: a 2-second dry run, not a second run
    # of the suite); then the suite once, under pytest, which runs the
    # trial-style tests as they are and whose summary line closes the
    # output.
    status = run([PYTHON, "-m", "mypy"])
    if status:
        _say("mypy found type errors; the tests run anyway")
    trial = run([PYTHON, "-m", "twisted.trial", "--dry-run", "--reporter=text", "tests"])
    if trial:
        _say("twisted.trial could not discover every test; pytest runs anyway")
    pytest_status = run(pytest_command(parallel()))
    return pytest_status or trial or status


def parallel() -> list[str]:
    """
    The whole suite's pytest-xdist options: one worker per core plus one,
    at most 3 (2 cores: 3 workers), each test file on one worker (a file's
    module-scoped etcd members, Spark sessions and stores stay together),
    the files in collection order, which puts the longest first
    (C{tests/conftest.py}, C{LONGEST_FIRST}; xdist's own order, by number of
    tests, left the Spark cluster's few long tests for the end).
    Much of the suite's time is spent waiting (elections, leases, real
    processes starting, a soak's minutes): a third worker fills two
    cores' idle time (docs/development.md).  C{RMQHA_TEST_WORKERS=0} runs
    it in one process, C{RMQHA_TEST_WORKERS=N} on N workers.
    """
    workers = os.environ.get("RMQHA_TEST_WORKERS")
    count = int(workers) if workers else min(3, (os.cpu_count() or 1) + 1)
    if count <= 1:
        return []
    return ["-n", str(count), "--dist", "loadfile", "--no-loadscope-reorder"]


def pytest_command(args: list[str]) -> list[str]:
    """
    pytest, quiet, with the reason of every skipped test listed (C{-rs}).
    """
    return [PYTHON, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *args]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
