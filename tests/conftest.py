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
