# -*- test-case-name: tests.test_pipeline -*-
"""
The C{rocketmq-commitlog} PySpark data source, L{read_store} (which reads
a local store with the JVM span reader instead, several times faster
under Spark: docs/pipeline.md, "Which reader"), and a SparkSession helper.

    spark = spark_session()                 # local[*], or what spark-submit set
    df = spark.read.format("rocketmq-commitlog").load("/data/store")
    df = spark.read.format("rocketmq-commitlog").load("s3://bucket/backups/store")
    df = spark.read.format("rocketmq-commitlog").load("rmqha+https://broker-a:8080")

One row per message record (L{rmqha.pipeline.scan.SCHEMA_DDL}); BLANK
fillers and bytes after the last whole record are not rows.  Options:

    bodies       true (default) | false: leave C{body} null (still filling
                 C{body_size} and C{crc_ok}), much less to move
    topics       a,b,c: only these topics (skipped before decoding)
    startOffset  only records at or after this commit-log offset
    endOffset    only records before this offset
    splitBytes   partition size (default 128m): large segments are cut
                 into pieces of about this size, consecutive small ones
                 packed into one partition up to it

A schema given to the reader selects columns (Spark passes a Python data
source no other column pruning, and its JVM turns every column it gets
into rows, needed or not):

    spark.read.format("rocketmq-commitlog").schema("size int, body binary").load(...)

Each column named must be one of the rows' (L{SCHEMA_DDL}) with its type;
columns not asked for are not built, and bodies are not copied unless
C{body} is among them.

Offsets and topics are applied while planning and reading, not filtered
after decoding.  Where a store can be (a path, any C{pyarrow.fs} URI, a
live broker) and the options a live broker over TLS takes:
L{rmqha.pipeline.stores}.  A relative path is made absolute where the
reader is planned (on the driver).  Every executor needs PySpark and
pyarrow, and read access to the store; L{spark_session} ships rmqha
itself to a cluster.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Sequence
from urllib.parse import urlsplit

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from rmqha._units import parse_size
from rmqha.pipeline.scan import (
    DEFAULT_SPLIT_BYTES,
    SCHEMA_DDL,
    Span,
    arrow_schema,
    plan,
    project,
    read_span,
)
from rmqha.pipeline.stores import LocalStore, PlanError, Store, resolve

__all__ = [
    "CommitLogDataSource",
    "spark_session",
    "package_zip",
    "read_store",
    "jvm_reader",
    "FORMAT",
    "OptionError",
]

#: The format name to give C{spark.read.format}.
FORMAT = "rocketmq-commitlog"


class OptionError(ValueError):
    """
    A data source option is wrong (the message names it).
    """


class SpanPartition(InputPartition):
    """
    Consecutive L{Span}s (one, or several small segments) as one Spark
    input partition: each task costs Spark tens of milliseconds besides
    the reading, so a partition holds about C{splitBytes} even when the
    segments are smaller (docs/benchmarks.md, "Where the time goes: Spark").
    """

    def __init__(self, spans: Sequence[Span]) -> None:
        super().__init__(tuple(spans))
        self.spans = tuple(spans)


def pack(spans: Sequence[Span], limit: int) -> list[SpanPartition]:
    """
    C{spans} in order, grouped into partitions of at most C{limit} bytes
    (a span larger than C{limit} alone).
    """
    partitions: list[SpanPartition] = []
    group: list[Span] = []
    size = 0
    for span in spans:
        length = span.end - span.start
        if group and size + length > limit:
            partitions.append(SpanPartition(group))
            group, size = [], 0
        group.append(span)
        size += length
    if group:
        partitions.append(SpanPartition(group))
    return partitions


def _offset(options: dict[str, str], name: str) -> int | None:
    text = options.get(name)
    if text is None:
        return None
    if not text.strip().isdigit():
        raise OptionError(f"option {name}={text!r} is not a non-negative offset")
    return int(text)


def _read_options(options: dict[str, str]) -> dict[str, Any]:
    lowered = {k.lower(): v for k, v in options.items()}
    path = lowered.get("path")
    if not path:
        raise OptionError("give the store: .load(STORE_DIR or URI)")
    bodies_text = lowered.get("bodies", "true").strip().lower()
    if bodies_text not in ("true", "false"):
        raise OptionError(f"option bodies={lowered['bodies']!r} is not true or false")
    topics = lowered.get("topics")
    topic_list = None
    if topics is not None:
        topic_list = [t.strip() for t in topics.split(",") if t.strip()]
        if not topic_list:
            raise OptionError(f"option topics={topics!r} names no topic")
    split = DEFAULT_SPLIT_BYTES
    if "splitbytes" in lowered:
        try:
            split = parse_size(lowered["splitbytes"], "option splitBytes")
        except ValueError as e:
            raise OptionError(str(e)) from None
        if split <= 0:
            raise OptionError(f"option splitBytes={lowered['splitbytes']!r} must be positive")
    start = _offset(lowered, "startoffset")
    end = _offset(lowered, "endoffset")
    if start is not None and end is not None and end < start:
        raise OptionError(f"option endOffset {end} is before startOffset {start}")
    try:
        store = resolve(path, options)
    except PlanError as e:
        raise OptionError(str(e)) from None
    return {
        "path": path,
        "store": store,
        "bodies": bodies_text == "true",
        "topics": topic_list,
        "split": split,
        "start": start,
        "end": end,
    }


class CommitLogDataSource(DataSource):
    """
    C{spark.read.format("rocketmq-commitlog").load(STORE_DIR)}.
    """

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: Any) -> "CommitLogReader":
        options = _read_options(dict(self.options))
        options["columns"] = _columns(schema)
        return CommitLogReader(options)


def _columns(schema: Any) -> list[str] | None:
    """
    The columns that the schema the reader is given asks for: C{None}
    for the whole row (L{SCHEMA_DDL}); a list for a schema given with
    C{spark.read.schema(...)}, the one way to prune a Python data source's
    columns (Spark's JVM turns every column of every batch into rows,
    needed or not).

    @raise OptionError: a column that is not one of the rows', or that is
        declared with another type.
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    names = [field.name for field in schema.fields]
    try:
        ours = project(names)
    except PlanError as e:
        raise OptionError(f"schema: {e}") from None
    for given, field in zip(to_arrow_schema(schema, timezone="UTC"), ours):
        if not given.equals(field):
            raise OptionError(
                f"schema: column {field.name} is {field.type}"
                f"{'' if field.nullable else ' not null'} in the commit log's rows, "
                f"not {given.type}{'' if given.nullable else ' not null'}"
            )
    return None if names == arrow_schema().names else names


class CommitLogReader(DataSourceReader):
    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options

    def partitions(self) -> list[SpanPartition]:
        o = self.options
        return pack(plan(o["store"], o["split"], o["start"], o["end"]), o["split"])

    def read(self, partition: InputPartition) -> Iterator[Any]:
        o = self.options
        assert isinstance(partition, SpanPartition)
        for span in partition.spans:
            yield from read_span(span, o["bodies"], o["topics"], columns=o["columns"])


def jvm_reader(spark: Any) -> bool:
    """
    Whether the JVM data source C{rmqha} (L{rmqha.pipeline._jar}) is on the
    classpath of C{spark}'s driver (L{spark_session} puts it there when it
    could build it); a Spark Connect session has no JVM here: C{False}.
    """
    from rmqha.pipeline._jar import READER_CLASS

    context = getattr(spark, "sparkContext", None)
    jvm = getattr(context, "_jvm", None)
    if jvm is None:
        return False
    known: dict[str, bool] = context.__dict__.setdefault("_rmqha_jvm_reader", {})
    if READER_CLASS not in known:
        try:
            loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
            jvm.java.lang.Class.forName(READER_CLASS, False, loader)
            known[READER_CLASS] = True
        except Exception:  # py4j's error: the class is not there
            known[READER_CLASS] = False
    return known[READER_CLASS]


def _jvm_store(store: Store) -> bool:
    """
    Whether the JVM data source reads C{store}: a local one (mapped), or a
    live broker's (its byte ranges, L{rmqha.pipeline.httpstore}'s protocol).
    """
    from rmqha.pipeline.httpstore import HttpStore

    return isinstance(store, (LocalStore, HttpStore))


def _jvm_location(store: Store) -> str:
    """
    The location the JVM data source is given for C{store} (L{_jvm_store}).
    """
    return store.root if isinstance(store, LocalStore) else store.load_location


def read_store(
    spark: Any, store: "Store | str", columns: Sequence[str] | None = None, **options: str
) -> Any:
    """
    The store's records as a DataFrame (L{SCHEMA_DDL}, or C{columns} only),
    with the C{rocketmq-commitlog} options (module docstring) and the
    store's own (TLS files for a live broker).  The one way the pipeline's
    jobs read a store.

    A local store (a path, a C{file:} URI) or a live broker
    (C{rmqha+http(s)://}) is read by the JVM data source
    C{format("rmqha")} when the session has its jar (L{jvm_reader}):
    planned on the driver's JVM and decoded in the executors' JVMs, with
    no Python worker and no rows shipped from Python to the JVM: several
    times faster (docs/pipeline.md, "Which reader").  Every other store
    (C{s3://}, C{gs://}), or a session without the jar, is
    read by the Python data source.

    @raise OptionError: a bad option or column (the message names it).
    """
    try:
        # A relative path made absolute here, on the driver: executors run elsewhere.
        location = resolve(store, options).load_location
    except PlanError as e:
        raise OptionError(str(e)) from None
    given = {**options, "path": location}
    o = _read_options(given)
    if columns is not None:
        try:
            project(columns)
        except PlanError as e:
            raise OptionError(f"columns: {e}") from None
    if _jvm_store(o["store"]) and jvm_reader(spark):
        from rmqha.pipeline._jar import SHORT_NAME

        # The JVM source plans on the driver itself, with the same rules
        # and options (docs/pipeline.md, "The data source").
        jvm = spark.read.format(SHORT_NAME)
        for key, value in options.items():
            jvm = jvm.option(key, value)
        df = jvm.load(_jvm_location(o["store"]))
        return df if columns is None else df.select(*columns)
    from rmqha.pipeline.scan import schema_ddl

    reader = spark.read.format(FORMAT)
    if columns is not None:
        reader = reader.schema(schema_ddl(columns))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(given["path"])


def _java_home() -> str | None:
    java = shutil.which("java")
    if java is None:
        return None
    # /usr/lib/jvm/X/bin/java, usually behind /usr/bin/java symlinks.
    return os.path.dirname(os.path.dirname(os.path.realpath(java)))


#: The garbage collector of a local master's JVM (L{spark_session}).
_LOCAL_GC = "-XX:+UseParallelGC"
#: A JVM option that picks a collector (C{-XX:+UseG1GC}, ...).
_CHOSEN_GC = re.compile(r"-XX:[+-]Use\w*GC\b")


def spark_session(
    master: str | None = None,
    app_name: str = "rmqha",
    conf: Mapping[str, str] | None = None,
    py_files: Sequence[str] = (),
    quiet: bool = False,
    console_progress: bool = False,
) -> Any:
    """
    A SparkSession with the C{rocketmq-commitlog} source registered.

    @param master: a Spark master URL; default C{local[*]}, unless this
        process was started by C{spark-submit} (its C{--master} applies).
    @param conf: Spark settings (C{--conf KEY=VALUE}), applied last.
    @param py_files: C{.py}/C{.zip}/C{.egg} files every task needs
        (C{--py-files}): local paths or URIs.

    Every master gets this Python for its executors and for planning the
    data source (C{PYSPARK_PYTHON}, unless the environment or
    C{spark.pyspark.python} chose one): PySpark would start C{python3}
    from C{PATH}, which may lack rmqha.  A master that is not local also
    gets the rmqha package itself (L{package_zip}), so an executor whose
    Python has PySpark and pyarrow but not rmqha runs the data source.
    The JVM span reader's jar (L{rmqha.pipeline._jar}, built on first use)
    goes on C{spark.jars}, after any given; without it, one line on
    stderr says why.  A local master's JVM runs the parallel (throughput)
    collector unless C{spark.driver.extraJavaOptions} names one.

    @param quiet: Spark says nothing on stderr but fatal errors (the
        jobs without C{--verbose}): when this call starts the driver's JVM,
        it gets L{_QUIET_LOG4J} (unless C{spark.driver.extraJavaOptions}
        names a log4j configuration), and the lines the JVM prints itself,
        not through log4j (L{_JVM_NOISE}), are left out of its stderr;
        a JVM already running (C{spark-submit}, a session made before) is
        set to log fatal errors only.  Otherwise Spark logs its warnings.
    @param console_progress: Spark's own progress bar on stderr
        (C{spark.ui.showConsoleProgress}; the jobs' C{--verbose}).
    """
    from pyspark.sql import SparkSession

    settings = dict(conf or {})
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    if master is None and not submitted:
        master = "local[*]"
    local = master is not None and master.startswith("local")
    if local:
        # Keep a local driver on loopback.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # PySpark reads the executors' Python from the environment when the
    # context starts; the conf, as in spark-submit, wins over it.
    chosen = settings.get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = chosen or sys.executable
    settings.setdefault("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
    os.environ.setdefault(
        "PYSPARK_DRIVER_PYTHON", settings.get("spark.pyspark.driver.python", sys.executable)
    )
    if "JAVA_HOME" not in os.environ:
        home = _java_home()
        if home is None:
            raise RuntimeError("Spark needs Java 17: no java on PATH and no JAVA_HOME")
        os.environ["JAVA_HOME"] = home
    for path in py_files:
        if not urlsplit(path).scheme and not os.path.isfile(path):
            raise ValueError(f"--py-files {path}: no such file")
    fresh = not submitted and not _jvm_started()
    if quiet and fresh:
        options = settings.get("spark.driver.extraJavaOptions", "")
        if "log4j.configurationFile" not in options:
            settings["spark.driver.extraJavaOptions"] = (
                f"{options} -Dlog4j.configurationFile=file:{_QUIET_LOG4J}".strip()
            )
    builder = (
        SparkSession.builder.appName(app_name)
        .config("spark.ui.showConsoleProgress", "true" if console_progress else "false")
        .config("spark.ui.enabled", "false")
    )
    if master is not None:
        builder = builder.master(master)
        if local:
            builder = builder.config("spark.sql.shuffle.partitions", "8")
            # The throughput collector for the one JVM a local master runs
            # (docs/pipeline.md, "Which reader": 10-15 % less JVM CPU per
            # scan with bodies than G1), unless the user chose a collector.
            options = settings.get("spark.driver.extraJavaOptions", "")
            if not _CHOSEN_GC.search(options):
                settings["spark.driver.extraJavaOptions"] = f"{options} {_LOCAL_GC}".strip()
    for key, value in settings.items():
        builder = builder.config(key, value)
    jar = _reader_jar()
    if jar is not None:
        jars = [j for j in settings.get("spark.jars", "").split(",") if j]
        builder = builder.config("spark.jars", ",".join([*jars, jar]))
    with _filtered_stderr(quiet and fresh):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("FATAL" if quiet else "WARN")
    if not (spark.sparkContext.master or "").startswith("local"):
        spark.sparkContext.addPyFile(package_zip())
    for path in py_files:
        spark.sparkContext.addPyFile(path if urlsplit(path).scheme else os.path.abspath(path))
    spark.dataSource.register(CommitLogDataSource)
    return spark


#: The log4j2 settings of a quiet driver JVM (L{spark_session}).
_QUIET_LOG4J = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2-quiet.properties")
#: What the JVM and the libraries in it print on stderr themselves, not
#: through log4j: left out when quiet.  (Spark 4 starts the JVM with the
#: incubating vector module, and DataSketches -- stats' percentiles --
#: says it cannot use off-heap memory on Java 17.)
_JVM_NOISE = re.compile(
    rb"WARNING: Using incubator modules: "
    rb"|Warning: Java versions > Java 11 can only operate in restricted mode"
)


def _jvm_started() -> bool:
    """
    Whether this process already has Spark's JVM (a session made before).
    """
    from pyspark import SparkContext

    return SparkContext._gateway is not None


@contextmanager
def _filtered_stderr(active: bool) -> Iterator[None]:
    """
    While active, file descriptor 2 is a pipe, so that a process started
    meanwhile (the driver's JVM, and the Python workers it starts later)
    writes its stderr there: a daemon thread copies each line to the real
    stderr, leaving out L{_JVM_NOISE}.  This process's own stderr is
    restored on leaving.
    """
    if not active:
        yield
        return
    import threading

    sys.stderr.flush()
    try:
        real = os.dup(2)  # (kept open: the copying thread writes to it)
    except OSError:  # no stderr at all: nothing to keep quiet
        yield
        return
    read_end, write_end = os.pipe()
    threading.Thread(
        target=_copy_lines, args=(read_end, real), name="rmqha JVM stderr", daemon=True
    ).start()
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(real, 2)


def _copy_lines(source: int, target: int) -> None:
    with os.fdopen(source, "rb") as lines:
        for line in lines:
            if not _JVM_NOISE.match(line):
                os.write(target, line)


_jar_said = False


def _reader_jar() -> str | None:
    """
    The JVM span reader's jar (built if needed), or C{None} and one line
    on stderr, once per process, saying why local stores are read the
    slower way.
    """
    global _jar_said
    from rmqha.pipeline._jar import ensure_jar

    jar, why = ensure_jar()
    if jar is None and not _jar_said:
        _jar_said = True
        print(
            f"rmqha pipeline: no JVM span reader ({why}): local stores are read by the "
            "Python data source, several times slower under Spark",
            file=sys.stderr,
        )
    return jar


_package_zip: str | None = None


def _compiled_codec() -> str | None:
    """
    The compiled codec's file this interpreter loaded, if any (not with
    C{RMQHA_PURE}: then the executors run the pure codec too).
    """
    from rmqha.store import _record

    accel = _record._accel
    where = getattr(accel, "__file__", None)
    return os.path.abspath(where) if where and os.path.isfile(where) else None


def package_zip() -> str:
    """
    The running rmqha package (its files only: no C{__pycache__}) as a
    zip for C{addPyFile}, made once per process in a temporary directory
    removed at exit.  The compiled codec goes in when this interpreter
    has one (the module built for its extension suffix, with the
    manifest of its SHA-256, L{rmqha.store._native.MANIFEST}): executors
    with the same Python version and platform load it from the zip
    (L{rmqha.store._native}), others run the pure-Python codec.
    """
    global _package_zip
    if _package_zip is None:
        import atexit
        import tempfile
        import zipfile

        import rmqha

        package = os.path.dirname(os.path.abspath(rmqha.__file__))
        top = os.path.dirname(package)
        directory = tempfile.mkdtemp(prefix="rmqha-ship-")
        atexit.register(shutil.rmtree, directory, True)
        path = os.path.join(directory, "rmqha-package.zip")
        compiled = _compiled_codec()
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
            for here, dirs, files in os.walk(package):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                for name in sorted(files):
                    if name.endswith((".pyc", ".pyo", ".so", ".jar")):
                        continue  # (the JVM span reader's jar: on spark.jars)
                    full = os.path.join(here, name)
                    z.write(full, os.path.relpath(full, top))
            if compiled is not None:
                import hashlib

                from rmqha.store._native import MANIFEST

                with open(compiled, "rb") as f:
                    data = f.read()
                member = f"rmqha/store/{os.path.basename(compiled)}"
                z.writestr(member, data)
                z.writestr(MANIFEST, f"{hashlib.sha256(data).hexdigest()}  {member}\n")
        _package_zip = path
    return _package_zip
