"""
pytest configuration for the trial-style tests.

C{SynchronousTestCase.mktemp} returns paths relative to the working
directory: trial runs in C{_trial_temp}, but pytest runs in the checkout,
so the tests would leave directories there.  Run them in a pytest temp
directory instead.
"""

import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _run_in_temp_dir(tmp_path_factory: pytest.TempPathFactory):
    previous = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("trial-cwd"))
    yield
    os.chdir(previous)
