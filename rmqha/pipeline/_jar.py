# -*- test-case-name: tests.test_pipeline_spark -*-
"""
The jar of the JVM data source C{rmqha} (C{spark.read.format("rmqha")},
SQL's C{USING rmqha}; L{rmqha.pipeline.source.read_store}'s fast path):
its Java sources are in C{rmqha/pipeline/jvm/src}, the files it holds as
they are (the DataSourceRegister entry naming the short name) in
C{rmqha/pipeline/jvm/resources}.  L{ensure_jar} compiles them with
C{javac} against the running PySpark's own jars into
C{rmqha/pipeline/jvm/rmqha-spark.jar} (git-ignored, never committed) the
first time a Spark session is made or C{rmqha pipeline jar} asks, and
again whenever the sources or resources change (the jar holds their
digest); C{setup.py} builds it into a wheel when it can (L{build_jar}).
Without C{javac} and C{jar}, or where the package directory cannot be
written, there is no jar and the Python data source reads every store.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from typing import IO

__all__ = ["JAR", "READER_CLASS", "SHORT_NAME", "build_jar", "ensure_jar", "main", "sources_digest"]

_HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jvm")
#: The Java sources.
SOURCES = os.path.join(_HERE, "src")
#: Files put in the jar as they are (the DataSourceRegister service entry
#: that makes C{format("rmqha")} and C{USING rmqha} find the source).
RESOURCES = os.path.join(_HERE, "resources")
#: Where the jar is built.
JAR = os.path.join(_HERE, "rmqha-spark.jar")
#: The reader's DataSource V2 provider (registered as L{SHORT_NAME}).
READER_CLASS = "rmqha.spark.CommitLogSource"
#: Its name for C{spark.read.format} and SQL's C{USING}.
SHORT_NAME = "rmqha"
#: The jar's entry holding the digest of the sources it was built from.
_STAMP = "rmqha-spark.sha256"


def _files(top: str, suffix: str = "") -> list[str]:
    found: list[str] = []
    for here, dirs, files in os.walk(top):
        dirs.sort()
        found.extend(os.path.join(here, name) for name in sorted(files) if name.endswith(suffix))
    return found


def _java_files() -> list[str]:
    return _files(SOURCES, ".java")


def sources_digest() -> str:
    """
    SHA-256 over the Java sources' and the resources' paths and contents.
    """
    digest = hashlib.sha256()
    for top, paths in ((SOURCES, _java_files()), (RESOURCES, _files(RESOURCES))):
        for path in paths:
            digest.update(os.path.relpath(path, os.path.dirname(top)).encode() + b"\0")
            with open(path, "rb") as f:
                digest.update(f.read())
            digest.update(b"\0")
    return digest.hexdigest()


def _built_digest(jar: str) -> str | None:
    try:
        with zipfile.ZipFile(jar) as z:
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
    if os.path.isfile(JAR) and _built_digest(JAR) == digest:
        return JAR, ""
    return build_jar(JAR, digest)


def build_jar(target: str, digest: str | None = None) -> tuple[str | None, str]:
    """
    Compile the sources and pack them with the resources into the jar
    C{target} (replaced atomically): C{(target, "")}, or C{(None, why)}.
    Also what C{setup.py} calls to put the jar in a wheel.
    """
    digest = digest or sources_digest()
    javac, jar = shutil.which("javac"), shutil.which("jar")
    if javac is None or jar is None:
        return None, "no javac/jar on PATH (a JDK 17 builds it)"
    jars = _spark_jars()
    if jars is None:
        return None, "PySpark's jars were not found to compile it against"
    try:
        with tempfile.TemporaryDirectory(
            prefix="rmqha-jar-", dir=os.path.dirname(os.path.abspath(target))
        ) as work:
            classes = os.path.join(work, "classes")
            os.mkdir(classes)
            with open(os.path.join(classes, _STAMP), "w") as f:
                f.write(digest + "\n")
            if os.path.isdir(RESOURCES):
                shutil.copytree(RESOURCES, classes, dirs_exist_ok=True)
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
            os.replace(built, target)
    except OSError as e:
        return None, f"it cannot be built in {os.path.dirname(target)}: {e.strerror or e}"
    return target, ""


def main(out: IO[str]) -> int:
    """
    C{rmqha pipeline jar}: print the jar's path (building it if needed),
    for C{spark-submit --jars $(rmqha pipeline jar)}; exit status 0, or 2
    and one line on stderr saying why there is none.
    """
    jar, why = ensure_jar()
    if jar is None:
        print(f"rmqha pipeline: error: no jar: {why}", file=sys.stderr)
        return 2
    out.write(jar + "\n")
    return 0
