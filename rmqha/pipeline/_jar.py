# -*- test-case-name: tests.test_pipeline_spark -*-
"""
The JVM span reader's jar (L{rmqha.pipeline.source.read_store}'s fast
path): its Java sources are in C{rmqha/pipeline/jvm/src}; L{ensure_jar}
compiles them with C{javac} against the running PySpark's own jars into
C{rmqha/pipeline/jvm/rmqha-spark.jar} (git-ignored, never committed) the
first time a Spark session is made, and again whenever the sources change
(the jar holds the digest of the sources it was built from).  Without
C{javac} and C{jar}, or where the package directory cannot be written,
there is no jar and the Python data source reads every store.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import zipfile

__all__ = ["JAR", "READER_CLASS", "ensure_jar", "sources_digest"]

_HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jvm")
#: The Java sources.
SOURCES = os.path.join(_HERE, "src")
#: Where the jar is built.
JAR = os.path.join(_HERE, "rmqha-spark.jar")
#: The reader's DataSource V2 provider, the name given to C{spark.read.format}.
READER_CLASS = "rmqha.spark.CommitLogSpans"
#: The jar's entry holding the digest of the sources it was built from.
_STAMP = "rmqha-spark.sha256"


def _java_files() -> list[str]:
    found: list[str] = []
    for here, dirs, files in os.walk(SOURCES):
        dirs.sort()
        found.extend(os.path.join(here, name) for name in sorted(files) if name.endswith(".java"))
    return found


def sources_digest() -> str:
    """
    SHA-256 over the Java sources' paths and contents.
    """
    digest = hashlib.sha256()
    for path in _java_files():
        digest.update(os.path.relpath(path, SOURCES).encode() + b"\0")
        with open(path, "rb") as f:
            digest.update(f.read())
        digest.update(b"\0")
    return digest.hexdigest()


def _built_digest() -> str | None:
    try:
        with zipfile.ZipFile(JAR) as z:
            return z.read(_STAMP).decode().strip()
    except (OSError, KeyError, zipfile.BadZipFile):
        return None


def _spark_jars() -> str | None:
    try:
        import pyspark
    except ImportError:
        return None
    jars = os.path.join(os.path.dirname(os.path.abspath(pyspark.__file__)), "jars")
    return jars if os.path.isdir(jars) else None


def ensure_jar() -> tuple[str | None, str]:
    """
    The reader's jar, built or rebuilt if its sources changed: C{(path,
    "")}, or C{(None, why)} when there is none (the one line saying why
    the Python source reads every store).
    """
    digest = sources_digest()
    if os.path.isfile(JAR) and _built_digest() == digest:
        return JAR, ""
    javac, jar = shutil.which("javac"), shutil.which("jar")
    if javac is None or jar is None:
        return None, "no javac/jar on PATH (a JDK 17 builds it)"
    jars = _spark_jars()
    if jars is None:
        return None, "PySpark's jars were not found to compile it against"
    try:
        with tempfile.TemporaryDirectory(prefix="rmqha-jar-", dir=_HERE) as work:
            classes = os.path.join(work, "classes")
            os.mkdir(classes)
            with open(os.path.join(classes, _STAMP), "w") as f:
                f.write(digest + "\n")
            compiled = subprocess.run(
                [javac, "--release", "17", "-nowarn", "-cp", os.path.join(jars, "*"),
                 "-d", classes, *_java_files()],
                capture_output=True, text=True,
            )
            if compiled.returncode != 0:
                first = (compiled.stderr.strip().splitlines() or ["?"])[0]
                return None, f"javac failed: {first}"
            built = os.path.join(work, "rmqha-spark.jar")
            packed = subprocess.run(
                [jar, "cf", built, "-C", classes, "."], capture_output=True, text=True
            )
            if packed.returncode != 0:
                return None, f"jar failed: {(packed.stderr.strip().splitlines() or ['?'])[0]}"
            # Atomic: a concurrent build or a session reading it sees a whole jar.
            os.replace(built, JAR)
    except OSError as e:
        return None, f"it cannot be built in {_HERE}: {e.strerror or e}"
    return JAR, ""
