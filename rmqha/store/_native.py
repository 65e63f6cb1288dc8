# -*- test-case-name: tests.test_pipeline_spark -*-
"""
The compiled codec, C{rmqha.store._speedups}: imported as any extension
module, or -- when rmqha itself was imported from a zip, as a Spark
cluster's executors import the package the driver ships
(L{rmqha.pipeline.source.package_zip}) -- loaded from that zip.

Python's zip importer does not load extension modules, so the executors
would run the pure-Python codec (4.5-5x slower).  The zip holds the
driver's compiled module and a manifest of its SHA-256 (L{MANIFEST});
L{load} takes the member named for this interpreter's extension suffix
(the same Python version and platform as the driver's: another finds none
and runs the pure codec), checks its digest, writes it into a private
temporary directory (mode 0700, this process's own), loads it from there
with C{ExtensionFileLoader} and removes the directory at once (the loaded
library stays mapped).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import sys
import tempfile
import zipimport
import zipfile
from typing import Any

__all__ = ["load", "MANIFEST", "MODULE"]

#: The compiled codec's module name.
MODULE = "rmqha.store._speedups"
#: The zip member listing each shipped compiled module's SHA-256 and name
#: (C{sha256sum}'s format), written by the zip's maker.
MANIFEST = "rmqha/store/_speedups.sha256"


def load() -> Any:
    """
    The compiled codec, or C{None} when there is none for this
    interpreter (not built, or shipped for another platform, or its
    digest does not match the manifest's).
    """
    try:
        from rmqha.store import _speedups  # type: ignore[attr-defined]
    except ImportError:
        return _from_zip()
    return _speedups


def _from_zip() -> Any:
    import rmqha.store as package

    loader = getattr(package.__spec__, "loader", None)
    if not isinstance(loader, zipimport.zipimporter):
        return None
    try:
        with zipfile.ZipFile(loader.archive) as z:
            digests = _manifest(z.read(MANIFEST).decode("ascii"))
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                member = f"rmqha/store/_speedups{suffix}"
                if member in digests:
                    data = z.read(member)
                    break
            else:
                return None
    except (OSError, KeyError, UnicodeDecodeError, zipfile.BadZipFile):
        return None
    if hashlib.sha256(data).hexdigest() != digests[member]:
        return None
    directory = tempfile.mkdtemp(prefix="rmqha-speedups-")
    try:
        path = os.path.join(directory, os.path.basename(member))
        with open(path, "xb") as f:
            f.write(data)
        extension = importlib.machinery.ExtensionFileLoader(MODULE, path)
        spec = importlib.util.spec_from_file_location(MODULE, path, loader=extension)
        if spec is None:  # pragma: no cover (a file location always has a spec)
            return None
        module = importlib.util.module_from_spec(spec)
        try:
            extension.exec_module(module)
        except ImportError:  # another libc, a missing symbol: the pure codec
            return None
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    sys.modules[MODULE] = module
    package._speedups = module  # type: ignore[attr-defined]
    return module


def _manifest(text: str) -> dict[str, str]:
    """
    C{sha256sum} lines (C{DIGEST  NAME}) as a dict of name to digest.
    """
    digests = {}
    for line in text.splitlines():
        digest, _, name = line.partition("  ")
        if name:
            digests[name] = digest
    return digests
