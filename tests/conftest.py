"""
pytest configuration for the trial-style tests.

C{SynchronousTestCase.mktemp} returns paths relative to the working
directory: trial runs in C{_trial_temp}, but pytest runs in the checkout,
so the tests would leave directories there.  Run them in a pytest temp
directory instead, deleted at the end of a session in which no test
failed (like a passing test's C{tmp_path}: pyproject.toml), kept otherwise.
"""

import os
import shutil

import pytest


@pytest.fixture(autouse=True, scope="session")
def _run_in_temp_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    previous = os.getcwd()
    directory = tmp_path_factory.mktemp("trial-cwd")
    os.chdir(directory)
    yield
    os.chdir(previous)
    if request.session.testsfailed == 0:
        shutil.rmtree(directory, ignore_errors=True)


#: The test files that keep a worker longest (worker seconds of a
#: 3-worker run, docs/development.md, "Tests"), longest first.  The whole
#: suite runs each file on one worker (C{--dist loadfile}) in collection
#: order (C{--no-loadscope-reorder}: xdist's default order is by number of
#: tests, which put the Spark cluster's 8 tests, the longest file, last);
#: these go first, so the files left at the end are short ones and the
#: workers finish together.  Any other file keeps its place after them.
LONGEST_FIRST = (
    "integration/test_pipeline_cluster.py",
    "test_pipeline_spark.py",
    "integration/test_failover.py",
    "integration/test_failover_faults.py",
    "integration/test_crash_consistency.py",
    "test_speedups.py",
    "test_verify_fuzz.py",
    "integration/test_produce_consume.py",
    "integration/test_http_store.py",
    "test_layout.py",
    "integration/test_rocketmq_ha_interop.py",
    "integration/test_demo.py",
    "integration/test_etcd_auth.py",
    "integration/test_abuse_tool.py",
    "integration/test_pipeline_s3.py",
    "integration/test_pipeline_jar.py",
    "integration/test_listen_errors.py",
    "integration/test_store_faults.py",
    "integration/test_slave_kill.py",
    "integration/test_remoting_failover.py",
    "integration/test_soak.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rank = {os.path.join(here, *name.split("/")): i for i, name in enumerate(LONGEST_FIRST)}
    # (A stable sort: every other file, and the tests within a file, keep
    # their order.)
    items.sort(key=lambda item: rank.get(str(item.path), len(rank)))
