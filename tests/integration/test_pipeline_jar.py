"""
C{setup.py build_py} puts the rmqha data source's jar in the build (what
a wheel holds).  (A plain session with only that jar, on a standalone
cluster, in a process that cannot import rmqha:
L{tests.integration.test_pipeline_cluster}; a local session reads by
C{format("rmqha")} and SQL in L{tests.test_pipeline_spark}.)

Marked C{spark}; starts no JVM but javac's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from twisted.trial.unittest import SynchronousTestCase

from tests._spark import why_no_spark

pytestmark = pytest.mark.spark


def _why_not() -> str | None:
    why = why_no_spark()
    if why is None and (shutil.which("javac") is None or shutil.which("jar") is None):
        why = "no javac/jar: the jar cannot be built here"
    return why


class WheelTests(SynchronousTestCase):
    skip = _why_not()

    def test_setup_builds_the_jar_into_the_build(self) -> None:
        """
        C{setup.py build_py} (what a wheel is made from) holds the jar,
        with the DataSourceRegister entry, when javac and PySpark are here.
        """
        import zipfile

        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        build = os.path.abspath(self.mktemp())
        done = subprocess.run(
            [sys.executable, os.path.join(here, "setup.py"), "-q", "build_py", "--build-lib", build],
            capture_output=True, text=True, cwd=here, timeout=300,
        )
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        jar = os.path.join(build, "rmqha", "pipeline", "jvm", "rmqha-spark.jar")
        with zipfile.ZipFile(jar) as z:
            names = z.namelist()
            service = z.read("META-INF/services/org.apache.spark.sql.sources.DataSourceRegister")
        self.assertIn("rmqha/spark/CommitLogSource.class", names)
        self.assertEqual(service.split(), [b"rmqha.spark.CommitLogSource"])
