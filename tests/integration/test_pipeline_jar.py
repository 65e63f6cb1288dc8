"""
The rmqha data source's jar outside rmqha's Python: a brand-new Spark
session made with nothing but C{SparkSession.builder} and C{spark.jars}
(the jar C{rmqha pipeline jar} prints), in a process that cannot import
rmqha, reads a store with C{spark.read.format("rmqha")} and with SQL's
C{CREATE TABLE ... USING rmqha}; and C{setup.py build_py} puts the jar in
the build (what a wheel holds).

Marked C{spark}: one JVM start for the module.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from twisted.trial.unittest import SynchronousTestCase

from tests._spark import why_no_spark
from tests.test_pipeline import random_store, store_rows

pytestmark = pytest.mark.spark

_SESSION = r"""
import sys
sys.modules["rmqha"] = None  # rmqha's Python is not used: the jar alone
from pyspark.sql import SparkSession

jar, path = sys.argv[1:]
spark = (SparkSession.builder.master("local[1]").config("spark.jars", jar)
         .config("spark.ui.enabled", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
df = spark.read.format("rmqha").option("splitBytes", "20k").load(path)
print("rows", df.count(), df.rdd.getNumPartitions())
print("orders", df.filter("topic = 'orders'").count())
spark.sql(f"CREATE TABLE commitlog USING rmqha LOCATION '{path}'")
print("sql", spark.sql("SELECT count(*) FROM commitlog WHERE queue_id IN (0, 1)").first()[0])
spark.stop()
"""


def _why_not() -> str | None:
    why = why_no_spark()
    if why is None and (shutil.which("javac") is None or shutil.which("jar") is None):
        why = "no javac/jar: the jar cannot be built here"
    return why


class PlainSessionTests(SynchronousTestCase):
    skip = _why_not()

    def test_plain_session_reads_by_short_name(self) -> None:
        """
        C{rmqha pipeline jar} prints the jar; a session given only that
        reads the store by C{format("rmqha")} and by SQL, the same rows as
        the store holds.
        """
        path = os.path.abspath(random_store(self, 120, 16 * 1024, seed=40))
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = {**os.environ, "PYTHONPATH": here, "SPARK_LOCAL_IP": "127.0.0.1"}
        printed = subprocess.run(
            [sys.executable, "-m", "rmqha.cli", "pipeline", "jar"],
            capture_output=True, text=True, env=env, check=True,
        ).stdout.split()
        self.assertEqual(len(printed), 1)
        jar = printed[0]
        self.assertTrue(jar.endswith(".jar") and os.path.isfile(jar), jar)
        env.pop("PYTHONPATH")
        session = subprocess.run(
            [sys.executable, "-c", _SESSION, jar, path],
            capture_output=True, text=True, env=env,
            timeout=300,
        )
        self.assertEqual(session.returncode, 0, session.stderr[-3000:])
        rows = store_rows(path)
        lines = dict(line.split(" ", 1) for line in session.stdout.splitlines() if " " in line)
        count, partitions = (int(n) for n in lines["rows"].split())
        self.assertEqual(count, len(rows))
        self.assertGreater(partitions, 2)
        self.assertEqual(int(lines["orders"]), sum(r["topic"] == "orders" for r in rows))
        self.assertEqual(int(lines["sql"]), sum(r["queue_id"] in (0, 1) for r in rows))

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
