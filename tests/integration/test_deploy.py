"""
The deployment files under deploy/ are real: the systemd unit passes
C{systemd-analyze verify} (and its security review) once instantiated, and
its C{ExecStart} command starts a broker that a SIGTERM stops cleanly; the
sysusers file makes the user; the Containerfile copies files that exist
and its command line parses, and, where a container builder works, the
image builds and runs the demo.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SYSTEMD = os.path.join(ROOT, "deploy", "systemd")
UNIT = os.path.join(SYSTEMD, "rmqha@.service")
CONTAINERFILE = os.path.join(ROOT, "deploy", "Containerfile")
#: Where the unit expects the install (the README's, into a venv).
INSTALLED_TWISTD = "/opt/rmqha/bin/twistd"


def unit_settings(path: str = UNIT) -> dict[str, list[str]]:
    """
    Every C{Key=value} of a unit file (all sections), values in order.
    """
    settings: dict[str, list[str]] = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line[0] in "#;[":
                continue
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def instantiate(directory: str, twistd: str) -> str:
    """
    C{rmqha@test.service} in C{directory}: the template with its
    C{ExecStart} executable replaced by C{twistd} (systemd-analyze checks
    that it exists).
    """
    with open(UNIT) as f:
        text = f.read()
    assert INSTALLED_TWISTD in text
    path = os.path.join(directory, "rmqha@test.service")
    with open(path, "w") as f:
        f.write(text.replace(INSTALLED_TWISTD, twistd))
    return path


def this_twistd() -> str:
    """
    The C{twistd} script of the Python running the tests.
    """
    found = os.path.join(os.path.dirname(sys.executable), "twistd")
    if not os.access(found, os.X_OK):
        pytest.skip(f"no twistd script next to {sys.executable}")
    return found


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        pytest.skip("systemd-analyze is not installed (Debian: systemd)")
    return found


def test_unit_verifies(tmp_path: Any) -> None:
    """
    The instantiated unit passes C{systemd-analyze verify} without a
    warning (an unknown key or a bad value is only a warning there), and
    its security review rates it at most 2.0 ("OK"); its file limit lets
    every port take its default connections with the store's reserve.
    """
    analyze = systemd_analyze()
    path = instantiate(str(tmp_path), this_twistd())
    done = subprocess.run(
        [analyze, "verify", "--man=no", path], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stderr, done.stdout) == (0, "", "")
    done = subprocess.run(
        [analyze, "security", "--offline=yes", "--no-pager", path],
        capture_output=True, text=True, timeout=60,
    )
    match = re.search(r"Overall exposure level for rmqha@test\.service: ([0-9.]+)", done.stdout)
    assert match is not None, done.stdout + done.stderr
    assert float(match.group(1)) <= 2.0, done.stdout
    from rmqha._limits import DEFAULT_MAX_CONNECTIONS, FD_RESERVE

    settings = unit_settings()
    (limit,) = settings["LimitNOFILE"]
    assert int(limit) >= 2 * DEFAULT_MAX_CONNECTIONS + FD_RESERVE
    for key, value in [
        ("ProtectSystem", "strict"),
        ("NoNewPrivileges", "yes"),
        ("PrivateTmp", "yes"),
        ("ProtectHome", "yes"),
        ("User", "rmqha"),
        ("Restart", "on-failure"),
        ("KillSignal", "SIGTERM"),
    ]:
        assert settings[key] == [value], key
    assert settings["ReadWritePaths"] == ["/var/lib/rmqha /var/log/rmqha"]


def test_unit_verify_catches_a_bad_key(tmp_path: Any) -> None:
    """
    The check above can fail: a misspelt hardening key is reported.
    """
    analyze = systemd_analyze()
    path = instantiate(str(tmp_path), this_twistd())
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace("NoNewPrivileges=", "NoNewPrivilege="))
    done = subprocess.run(
        [analyze, "verify", "--man=no", path], capture_output=True, text=True, timeout=60
    )
    assert "Unknown key 'NoNewPrivilege'" in done.stderr


def test_sysusers_makes_the_user(tmp_path: Any) -> None:
    """
    The sysusers file creates the unit's user (in a scratch root).
    """
    sysusers = shutil.which("systemd-sysusers")
    if sysusers is None:
        pytest.skip("systemd-sysusers is not installed (Debian: systemd)")
    os.makedirs(tmp_path / "etc")
    subprocess.run(
        [sysusers, f"--root={tmp_path}", os.path.join(SYSTEMD, "rmqha.sysusers.conf")],
        check=True, capture_output=True, timeout=60,
    )
    users = {line.split(":")[0]: line.split(":") for line in (tmp_path / "etc/passwd").read_text().splitlines()}
    assert users["rmqha"][5] == "/var/lib/rmqha"


def exec_start(instance: str, root: str, rmqha_opts: str) -> list[str]:
    """
    The unit's C{ExecStart} as systemd would run it for C{instance} (C{%i}
    expanded, C{$RMQHA_OPTS} split into words), with C{/etc/rmqha},
    C{/var/log/rmqha} and C{/var/lib/rmqha} moved under C{root} and the
    installed twistd replaced by this Python's.
    """
    (line,) = unit_settings()["ExecStart"]
    line = line.replace("%i", instance)
    for directory in ("/etc/rmqha", "/var/log/rmqha", "/var/lib/rmqha"):
        line = line.replace(directory, root + directory)
    argv: list[str] = []
    for word in shlex.split(line):
        argv.extend(shlex.split(rmqha_opts) if word == "$RMQHA_OPTS" else [word])
    assert argv[0] == INSTALLED_TWISTD
    return [sys.executable, "-c", "from twisted.scripts.twistd import run; run()", *argv[1:]]


def env_file_opts(path: str) -> str:
    with open(path) as f:
        for line in f:
            if line.startswith("RMQHA_OPTS="):
                return line.partition("=")[2].strip()
    raise AssertionError(f"{path} sets no RMQHA_OPTS")


def test_unit_command_starts_and_stops(tmp_path: Any) -> None:
    """
    The unit's own command line, on the example broker.conf and .env
    (loopback port 0 and small segments for the test), starts a broker:
    its log file shows the start-up line with the ports it bound, /status
    answers on that HTTP port; SIGTERM stops it within the unit's
    TimeoutStopSec, cleanly (the store closed: no abort marker).
    """
    root = str(tmp_path)
    for directory in ("etc/rmqha", "var/log/rmqha", "var/lib/rmqha"):
        os.makedirs(os.path.join(root, directory))
    with open(os.path.join(SYSTEMD, "broker-a.conf")) as f:
        conf = f.read().replace("/var/lib/rmqha", root + "/var/lib/rmqha")
    with open(os.path.join(root, "etc/rmqha/test.conf"), "w") as f:
        f.write(conf + "mappedFileSizeCommitLog=65536\n")
    opts = env_file_opts(os.path.join(SYSTEMD, "broker-a.env"))
    assert "tcp:8080:interface=127.0.0.1" in opts
    opts = opts.replace("tcp:8080:", "tcp:0:") + " --ha-listen tcp:0:interface=127.0.0.1"
    log = os.path.join(root, "var/log/rmqha/test.log")
    process = subprocess.Popen(
        exec_start("test", root, opts),
        cwd=os.path.join(root, "var/lib/rmqha"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        line = None
        deadline = time.monotonic() + 60
        while line is None and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.1)
            if os.path.exists(log):
                with open(log) as f:
                    line = next((x for x in f if " started: " in x), None)
        assert line is not None, (process.poll(), open(log).read() if os.path.exists(log) else "")
        store = root + "/var/lib/rmqha/broker-a"
        assert f"started: role SYNC_MASTER; store {store} " in line
        assert "in-sync replicas 2 (min 1)" in line
        match = re.search(r"HTTP 127\.0\.0\.1:(\d+)", line)
        assert match is not None and re.search(r"HA 127\.0\.0\.1:\d+", line), line
        with urllib.request.urlopen(f"http://127.0.0.1:{match.group(1)}/status", timeout=10) as r:
            assert json.load(r)["role"] == "SYNC_MASTER"
        assert os.path.exists(os.path.join(store, "abort"))  # (open)
        process.send_signal(signal.SIGTERM)
        (timeout,) = unit_settings()["TimeoutStopSec"]
        code = process.wait(timeout=int(timeout))
        output = process.stdout.read().decode() if process.stdout else ""
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
    with open(log) as f:
        text = f.read()
    # Twisted's twistd ends by the signal that stopped it, once shut down
    # (systemd counts a SIGTERM death as a clean stop: no restart).
    assert code in (0, -signal.SIGTERM), text + output
    assert "Received SIGTERM, shutting down." in text
    assert "Traceback" not in text
    assert output == ""  # (everything went to the log file)
    assert not os.path.exists(os.path.join(store, "abort"))


# -- the container image --------------------------------------------------------


def containerfile() -> list[tuple[str, str]]:
    """
    The Containerfile's instructions, continuation lines joined: (name,
    arguments).
    """
    with open(CONTAINERFILE) as f:
        text = f.read().replace("\\\n", " ")
    steps = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, rest = line.partition(" ")
            steps.append((name.upper(), rest.strip()))
    return steps


def test_containerfile_copies_what_exists() -> None:
    """
    Every file the build copies from the checkout exists; the install is
    a pip install of the checkout; the image runs as a non-root user with
    the store on a volume, exposes the HA and HTTP ports, and checks
    health on /status of that HTTP port.
    """
    steps = containerfile()
    copies = [rest for name, rest in steps if name == "COPY" and "--from=" not in rest]
    assert copies
    for rest in copies:
        *sources, _ = shlex.split(rest)
        for source in sources:
            assert os.path.exists(os.path.join(ROOT, source)), source
    runs = " ".join(rest for name, rest in steps if name == "RUN")
    assert "/opt/rmqha/bin/pip install --no-cache-dir ." in runs
    assert [rest for name, rest in steps if name == "USER"][-1] == "rmqha"
    assert ("VOLUME", '["/var/lib/rmqha"]') in steps
    (expose,) = [rest.split() for name, rest in steps if name == "EXPOSE"]
    cmd = json.loads(next(rest for name, rest in steps if name == "CMD"))
    assert cmd[cmd.index("--ha-listen") + 1] in expose
    http = cmd[cmd.index("--http") + 1]
    assert http in expose
    assert cmd[cmd.index("--store-dir") + 1].startswith("/var/lib/rmqha/")
    (health,) = [rest for name, rest in steps if name == "HEALTHCHECK"]
    assert f"http://127.0.0.1:{http}/status" in health
    probe = json.loads(health.partition("CMD ")[2])
    assert probe[:2] == ["/opt/rmqha/bin/python", "-c"]
    compile(probe[2], "HEALTHCHECK", "exec")


def test_containerfile_command_parses(tmp_path: Any) -> None:
    """
    The image's ENTRYPOINT and CMD are one twistd command line that
    twistd's own option parsing takes, and whose service builds.
    """
    from twisted.scripts._twistd_unix import ServerOptions

    from rmqha.tap import makeService

    steps = dict(containerfile())
    argv = json.loads(steps["ENTRYPOINT"]) + json.loads(steps["CMD"])
    assert argv[0] == INSTALLED_TWISTD
    config = ServerOptions()
    config.parseOptions(argv[1:])
    assert (config["nodaemon"], config["pidfile"], config["logfile"]) == (1, "", "-")
    assert config.subCommand == "rmqha"
    settings = config.subOptions.settings
    assert settings.store_dir == "/var/lib/rmqha/store"
    assert (settings.ha_listen, settings.http) == ("tcp:10912", "tcp:8080")
    makeService(config.subOptions)  # (built, not started: nothing is opened)


def container_builder() -> str:
    """
    A container builder that works here (podman, or docker with its
    daemon), or a skip saying why not.
    """
    for name in ("podman", "docker"):
        found = shutil.which(name)
        if found is None:
            continue
        done = subprocess.run([found, "info"], capture_output=True, text=True, timeout=60)
        if done.returncode == 0:
            return found
    pytest.skip("no working container builder here (podman, or docker with a running daemon)")


@pytest.mark.slow
def test_container_builds_and_runs_the_demo() -> None:
    """
    Where a builder works: the image builds from the checkout and runs
    the demo as its smoke test (a master and a slave, caught up, compared
    byte for byte).
    """
    builder = container_builder()
    tag = "rmqha-test:latest"
    subprocess.run(
        [builder, "build", *(["--format", "docker"] if builder.endswith("podman") else []),
         "-f", CONTAINERFILE, "-t", tag, ROOT],
        check=True, timeout=1800,
    )
    done = subprocess.run(
        [builder, "run", "--rm", "--entrypoint", "/opt/rmqha/bin/rmqha", tag,
         "demo", "--count", "20000", "--live", "2000", "--segment-size", "4m"],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
