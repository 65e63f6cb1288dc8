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


#: The test files that start the shared local SparkSession (tests/_spark.py,
#: ~15-20 s of a worker: the JVM, the jar's build): pytest-xdist runs them
#: as one unit on one worker, so one session starts, not one per worker.
LOCAL_SPARK_FILES = frozenset({
    "tests/test_pipeline_spark.py",
    "tests/test_verify_fuzz.py",
    "tests/integration/test_http_store.py",
    "tests/integration/test_pipeline_cluster.py",
    "tests/integration/test_pipeline_s3.py",
})

try:
    from xdist.scheduler import LoadFileScheduling
except ImportError:  # no pytest-xdist: one process, nothing to schedule
    pass
else:

    class _OneSparkWorker(LoadFileScheduling):
        """
        C{--dist loadfile} (dev.py's), but with L{LOCAL_SPARK_FILES} as
        one file.
        """

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "the local Spark session" if path in LOCAL_SPARK_FILES else path

    def pytest_xdist_make_scheduler(config, log):  # type: ignore[no-untyped-def]
        if config.getvalue("dist") != "loadfile":
            return None
        return _OneSparkWorker(config, log)
