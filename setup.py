"""
The build's one piece of code: the optional C accelerator
C{rmqha.store._speedups} (the commit-log codec's hot loops; see
docs/architecture.md).  Everything else is declared in pyproject.toml.

The extension is optional: without a C compiler, the Python headers or
zlib's, the build says so in one line and the install goes on with the
pure-Python codec (C{rmqha.store._record}, the reference), which is what
C{RMQHA_PURE=1} selects anyway.
"""

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


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


setup(
    ext_modules=[
        Extension(
            "rmqha.store._speedups",
            sources=["rmqha/store/_speedups.c"],
            libraries=["z"],
            optional=True,
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
