"""
The build's two optional pieces; everything else is declared in
pyproject.toml.

- The C accelerator C{rmqha.store._speedups} (the commit-log codec's hot
  loops; see docs/architecture.md).  Without a C compiler, the Python
  headers or zlib's, the build says so in one line and the install goes
  on with the pure-Python codec (C{rmqha.store._record}, the reference),
  which is what C{RMQHA_PURE=1} selects anyway.
- The JVM data source's jar (C{rmqha/pipeline/jvm/rmqha-spark.jar},
  C{format("rmqha")}: docs/pipeline.md), built when the build environment
  has C{javac}, C{jar} and PySpark (C{pip install --no-build-isolation},
  or a build environment with PySpark); otherwise it is built on first
  use, as C{rmqha pipeline jar} or a Spark session of rmqha's does.
"""

import importlib.util
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py


class OptionalBuildExt(build_ext):
    """
    build_ext that turns a failed compile into one line on stderr.
    """

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # no compiler at all (DistutilsPlatformError...)
            self._skip(e)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as e:  # CompileError, LinkError, a missing header
            self._skip(e)

    def _skip(self, error: Exception) -> None:
        reason = str(error).strip().splitlines()[-1:] or [type(error).__name__]
        print(
            "rmqha: the C accelerator rmqha.store._speedups was not built "
            f"({reason[0]}); the pure-Python codec will be used",
            file=sys.stderr,
        )


class BuildPyWithJar(build_py):
    """
    build_py, then the JVM data source's jar into the build, when it can
    be built here (one line on stderr when not).
    """

    def run(self) -> None:
        super().run()
        here = os.path.dirname(os.path.abspath(__file__))
        spec = importlib.util.spec_from_file_location(
            "_rmqha_jar", os.path.join(here, "rmqha", "pipeline", "_jar.py")
        )
        assert spec is not None and spec.loader is not None
        jar = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(jar)
        target = os.path.join(self.build_lib, "rmqha", "pipeline", "jvm", "rmqha-spark.jar")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        built, why = jar.build_jar(target)
        if built is None:
            print(
                f"rmqha: the data source's jar is not in this build ({why}); "
                "it is built on first use ('rmqha pipeline jar')",
                file=sys.stderr,
            )


setup(
    ext_modules=[
        Extension(
            "rmqha.store._speedups",
            sources=["rmqha/store/_speedups.c"],
            libraries=["z"],
            optional=True,
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt, "build_py": BuildPyWithJar},
)
