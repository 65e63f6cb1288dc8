"""
One local SparkSession for the whole test run (pytest or trial): starting
Spark costs seconds, so every Spark test shares it.  Tests that need it
skip, saying why, when PySpark or Java is missing.
"""

from __future__ import annotations

import atexit
import shutil
from typing import Any

_session: Any = None

#: The shared session's JVM options: the C1 compiler only.  The tests'
#: data are small and the JVM lives a few minutes on two shared cores:
#: C2's compiler threads cost more CPU than its faster code saves.
#: (spark_session still adds its parallel collector:
#: test_pipeline_spark.JvmReaderTests.test_session_jvm_collector.)
JVM_OPTIONS = "-XX:TieredStopAtLevel=1"


def why_no_spark() -> str | None:
    """
    Why Spark tests cannot run here, or C{None}.
    """
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError:
        return "PySpark is not installed (pip install 'rmqha[spark]')"
    import os

    if shutil.which("java") is None and "JAVA_HOME" not in os.environ:
        return "Spark needs Java 17"
    return None


def spark() -> Any:
    """
    The shared C{local[2]} session, started on first use, stopped at exit.
    """
    global _session
    if _session is None:
        from rmqha.pipeline.source import spark_session

        _session = spark_session(
            "local[2]", app_name="rmqha tests",
            conf={"spark.driver.extraJavaOptions": JVM_OPTIONS},
        )
        atexit.register(_session.stop)
    return _session
