"""
The pipeline reading a store from an S3-compatible object store: a real
server (moto's, from PyPI) on 127.0.0.1, a free port, for this module.

Pins down: C{s3://bucket/prefix/store} URIs read through C{pyarrow.fs}
give the same rows as the local files (plain reader and the Spark data
source), C{verify} compares a local master against a slave backed up to
S3 (consistent, and a flipped byte proven), credentials come from the
environment (or the URI), and a wrong bucket or prefix is one line naming
the location.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from typing import Any, Iterator

import pytest

pytest.importorskip("pyarrow")
# moto is imported where the server starts: importing it costs each
# pytest-xdist worker ~1 s of CPU at collection, and one worker runs this.
if importlib.util.find_spec("moto") is None:
    pytest.skip("moto is not installed (pip install 'rmqha[test]')", allow_module_level=True)

from rmqha.pipeline.scan import plan, scan  # noqa: E402
from rmqha.pipeline.stores import ArrowStore, PlanError, resolve  # noqa: E402
from rmqha.store.commitlog import CommitLog  # noqa: E402

from tests._helpers import make_message  # noqa: E402
from tests._spark import why_no_spark  # noqa: E402
from tests.test_pipeline import arrow_rows, store_rows  # noqa: E402

BUCKET = "backups"
SEGMENT = 64 * 1024


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, Any]]:
    """
    A moto S3 server on 127.0.0.1 and a bucket in it; yields the query
    string that points pyarrow at it and the fake credentials.
    """
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    query = f"endpoint_override={host}:{port}&scheme=http&region=us-east-1"
    from pyarrow import fs

    admin = fs.S3FileSystem(
        access_key="testing", secret_key="testing", endpoint_override=f"{host}:{port}",
        scheme="http", region="us-east-1", allow_bucket_creation=True,
    )
    admin.create_dir(BUCKET)
    try:
        yield {"query": query, "fs": admin, "credentials": "testing:testing"}
    finally:
        server.stop()


def make_store(path: str, count: int, seed: int) -> str:
    import random

    rng = random.Random(seed)
    with CommitLog.open(path, segment_size=SEGMENT) as log:
        for i in range(count):
            log.put(
                make_message(
                    os.urandom(rng.randrange(0, 700)),
                    topic=rng.choice(["orders", "payments"]),
                    queue_id=rng.randrange(4),
                    properties={"KEYS": f"k{i}"},
                )
            )
    return path


def upload(s3: dict[str, Any], local: str, prefix: str) -> str:
    """
    Copy a store's segment files to C{s3://BUCKET/prefix/commitlog/};
    return the store's URI (credentials in the environment).
    """
    from pyarrow import fs

    fs.copy_files(
        os.path.join(local, "commitlog"), f"{BUCKET}/{prefix}/commitlog",
        destination_filesystem=s3["fs"],
    )
    return f"s3://{BUCKET}/{prefix}?{s3['query']}"


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_plain_reader_rows_equal_local(s3: dict[str, Any], tmp_path: Any, aws_env: None) -> None:
    """
    The plain reader over the S3 copy gives the local store's rows, at a
    split size that cuts segments at record starts found over S3.
    """
    local = make_store(str(tmp_path / "store"), 300, seed=1)
    uri = upload(s3, local, "plain")
    store = resolve(uri)
    assert isinstance(store, ArrowStore)
    assert [s.name for s in store.segments()] == sorted(
        os.listdir(os.path.join(local, "commitlog"))
    )
    spans = plan(uri, split_bytes=10_000)
    assert len(spans) > len(store.segments())  # sub-ranges: cut points searched over S3
    assert arrow_rows(scan(uri, split_bytes=10_000)) == store_rows(local)
    assert arrow_rows(scan(uri)) == arrow_rows(scan(local))


def test_pickled_store_opens_on_arrival(s3: dict[str, Any], tmp_path: Any, aws_env: None) -> None:
    """
    A store travels to an executor as its URI only (no open filesystem, no
    secret beyond what the URI holds) and works there.
    """
    import pickle

    local = make_store(str(tmp_path / "store"), 20, seed=2)
    uri = upload(s3, local, "pickled")
    store = resolve(uri)
    segment = store.segments()[0]
    again = pickle.loads(pickle.dumps(store))
    assert set(store.__getstate__()) == {"uri", "directory"}  # no filesystem object
    with again.open(segment) as reader, open(
        os.path.join(local, "commitlog", segment.name), "rb"
    ) as f:
        assert reader.read_at(100, 5000) == f.read()[100:5100]


def test_wrong_locations_are_one_line(s3: dict[str, Any], tmp_path: Any, aws_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """
    A prefix holding no commit log, a missing bucket and a URI naming
    no bucket each fail with one line naming the location.
    """
    query = s3["query"]
    with pytest.raises(PlanError) as raised:
        resolve(f"s3://{BUCKET}/nothing-here?{query}").segments()
    assert "nothing-here" in str(raised.value) and "\n" not in str(raised.value)
    with pytest.raises((OSError, PlanError)) as raised_os:
        resolve(f"s3://no-such-bucket/store?{query}").segments()
    assert "no-such-bucket" in str(raised_os.value) and "\n" not in str(raised_os.value)
    with pytest.raises(PlanError) as raised:
        resolve("s3://").segments()
    assert "s3://" in str(raised.value)


@pytest.mark.spark
@pytest.mark.skipif(why_no_spark() is not None, reason=str(why_no_spark()))
def test_spark_reads_and_verifies_s3(s3: dict[str, Any], tmp_path: Any) -> None:
    """
    The data source reads the S3 copy (credentials in the URI: the shared
    local session's workers do not see this test's environment), and
    verify compares a local master with its S3 backup: consistent; then a
    flipped byte in the backup is proven at its offset.
    """
    from rmqha.pipeline.jobs import verify
    from tests._spark import spark
    from tests.test_pipeline_spark import df_rows, store_rows as store_rows_ms

    local = make_store(str(tmp_path / "store"), 300, seed=3)
    upload(s3, local, "spark")
    uri = f"s3://{s3['credentials']}@{BUCKET}/spark?{s3['query']}"
    df = spark().read.format("rocketmq-commitlog").option("splitBytes", "16k").load(uri)
    assert df_rows(df) == store_rows_ms(local)
    assert verify(spark(), local, uri).consistent

    damaged = str(tmp_path / "damaged")
    shutil.copytree(local, damaged)
    first = os.path.join(damaged, "commitlog", sorted(os.listdir(os.path.join(damaged, "commitlog")))[0])
    with open(first, "r+b") as f:
        f.seek(5000)
        byte = f.read(1)[0]
        f.seek(5000)
        f.write(bytes([byte ^ 0xFF]))
    upload(s3, damaged, "damaged")
    result = verify(spark(), local, f"s3://{s3['credentials']}@{BUCKET}/damaged?{s3['query']}")
    assert not result.consistent
    assert result.divergent_offset == 5000
