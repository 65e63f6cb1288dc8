"""
A live broker as a pipeline store over real loopback sockets
(pytest-twisted): a master and its slave serving their commit logs
(C{--serve-commitlog}), read by L{HttpStore} (blocking stdlib HTTP, run in
a thread so the reactor keeps serving), plain and over TLS with client
certificates.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.threads import deferToThread

from rmqha.broker import Broker, Role
from rmqha.pipeline.httpstore import HttpStore
from rmqha.pipeline.stores import Store, PlanError, resolve
from rmqha.store._record import Message
from rmqha.tls import PeerPolicy, server_endpoint

from tests.integration._support import make_broker, until
from tests.integration.test_admin_http import _pki

SEGMENT = 256 * 1024
RATE = 64 << 20


def _read_all(store: Store) -> dict[str, bytes]:
    """
    Every segment of C{store}, read in 100000-byte ranges (not aligned to
    anything), on one reader each.
    """
    out = {}
    for segment in store.segments():
        with store.open(segment) as reader:
            assert reader.size == segment.size
            parts = []
            for position in range(0, segment.size, 100000):
                parts.append(reader.read_at(position, 100000))
            assert reader.read_at(segment.size, 10) == b""
            out[segment.name] = b"".join(parts)
    return out


def _files(store_dir: str) -> dict[str, bytes]:
    directory = os.path.join(store_dir, "commitlog")
    out = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            out[name] = f.read()
    return out


@pytest_twisted.ensureDeferred
async def test_master_and_slave_over_http(tmp_path: Any) -> None:
    """
    A master taking puts and its slave, each serving its commit log: the
    store at C{rmqha+http://127.0.0.1:PORT} lists the segments and reads
    them byte-identical to the files (the master's and the slave's equal);
    a broker not serving it is a one-line error saying how to serve it.
    """
    from twisted.internet import reactor

    master: Broker = make_broker(
        reactor, str(tmp_path / "master"), Role.MASTER, SEGMENT,
        ha_listen="tcp:0:interface=127.0.0.1",
        http="tcp:0:interface=127.0.0.1", serve_commitlog=RATE,
    )
    master.startService()
    slave: Broker | None = None
    try:
        address = await master.ha_address()
        slave = make_broker(
            reactor, str(tmp_path / "slave"), Role.SLAVE, SEGMENT,
            master_endpoint=f"tcp:host=127.0.0.1:port={address.port}",
            http="tcp:0:interface=127.0.0.1", serve_commitlog=RATE,
        )
        slave.startService()
        body = os.urandom(3000)
        for i in range(300):
            await master.put(Message("Orders", body, queue_id=i % 4))
        await until(
            reactor,
            lambda: slave is not None
            and slave.commitlog.max_offset == master.commitlog.max_offset,
            "the slave to catch up",
        )
        master.commitlog.flush()
        slave.commitlog.flush()
        master_port = (await master.getServiceNamed("http").address()).port
        slave_port = (await slave.getServiceNamed("http").address()).port
        store = resolve(f"rmqha+http://127.0.0.1:{master_port}/")
        assert isinstance(store, HttpStore)
        assert store.uri == f"rmqha+http://127.0.0.1:{master_port}"
        got = await deferToThread(_read_all, store)
        assert len(got) >= 3
        assert got == _files(str(tmp_path / "master"))
        got_slave = await deferToThread(_read_all, resolve(f"rmqha+http://127.0.0.1:{slave_port}"))
        assert got_slave == got
    finally:
        if slave is not None:
            await slave.stopService()
        await master.stopService()

    plain: Broker = make_broker(
        reactor, str(tmp_path / "plain"), Role.MASTER, SEGMENT,
        ha_listen="tcp:0:interface=127.0.0.1", http="tcp:0:interface=127.0.0.1",
    )
    plain.startService()
    try:
        port = (await plain.getServiceNamed("http").address()).port
        with pytest.raises(PlanError) as e:
            await deferToThread(resolve(f"rmqha+http://127.0.0.1:{port}").segments)
        assert "/commitlog: HTTP 404: " in str(e.value)
        assert "--serve-commitlog RATE" in str(e.value)
        assert "\n" not in str(e.value)
    finally:
        await plain.stopService()


@pytest_twisted.ensureDeferred
async def test_over_tls_with_client_certificates(tmp_path: Any) -> None:
    """
    C{rmqha+https://localhost:PORT} with C{tlsCert}/C{tlsKey}/C{tlsCa}
    options (keys lower-cased as Spark may pass them) reads the segments
    byte-identical; a certificate not in C{--http-allowed-peers} gets the
    403 as a one-line error; no client certificate is a one-line error.
    """
    from twisted.internet import reactor

    pki = _pki(str(tmp_path / "pki"))
    policy = PeerPolicy(
        require_client_cert=True,
        allowed_peers=frozenset({"ops"}),
        allowlist_flag="--http-allowed-peers",
    )
    master: Broker = make_broker(
        reactor, str(tmp_path / "master"), Role.MASTER, SEGMENT,
        ha_listen="tcp:0:interface=127.0.0.1",
        http=server_endpoint(reactor, "ssl:0:interface=127.0.0.1", pki["master"], policy, "--http"),
        http_peer_policy=policy, serve_commitlog=RATE,
    )
    master.startService()
    try:
        for i in range(100):
            await master.put(Message("Orders", b"x" * 3000))
        master.commitlog.flush()
        port = (await master.getServiceNamed("http").address()).port
        location = f"rmqha+https://localhost:{port}"
        ops = pki["ops"]
        store = resolve(location, {"tlscert": ops.cert, "tlskey": ops.key, "tlsCa": ops.ca})
        got = await deferToThread(_read_all, store)
        assert got == _files(str(tmp_path / "master"))

        other = pki["slave-1"]
        store = resolve(location, {"tlsCert": other.cert, "tlsKey": other.key, "tlsCa": other.ca})
        with pytest.raises(PlanError) as e:
            await deferToThread(store.segments)
        assert "/commitlog: HTTP 403: this client is not allowed here" in str(e.value)
        assert "\n" not in str(e.value)

        anonymous = resolve(location, {"tlsCa": ops.ca})
        with pytest.raises(OSError) as failure:
            await deferToThread(anonymous.segments)
        assert f"{location}/commitlog" in str(failure.value)
        assert "no client certificate given" in str(failure.value)
        assert "\n" not in str(failure.value)
        await _jvm_over_tls(location, ops, other)
    finally:
        await master.stopService()


async def _jvm_over_tls(location: str, ops: Any, other: Any) -> None:
    """
    The JVM data source (Java's TLS, the PEM files as given) reads the
    broker over TLS with a client certificate, rows equal to the Python
    reader's; a certificate the broker does not allow is its one line.
    """
    from tests._spark import spark, why_no_spark

    if why_no_spark() is not None:
        return
    from rmqha.pipeline.source import jvm_reader, read_store
    from tests.test_pipeline_spark import df_rows

    def read(files: Any) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
        options = {"tlsCert": files.cert, "tlsKey": files.key, "tlsCa": files.ca}
        assert jvm_reader(spark())
        jvm = read_store(spark(), location, **options)
        assert "rmqha commit log" in jvm._jdf.queryExecution().executedPlan().toString()
        python = spark().read.format("rocketmq-commitlog")
        for key, value in options.items():
            python = python.option(key, value)
        return df_rows(jvm), df_rows(python.load(location))

    jvm, python = await deferToThread(read, ops)
    assert len(jvm) == 100
    assert jvm == python
    with pytest.raises(Exception) as refused:
        await deferToThread(read, other)
    assert "/commitlog: HTTP 403: this client is not allowed here" in str(refused.value)


def _whole_and_contiguous(rows: list[dict[str, object]]) -> None:
    """
    Every row a whole record with a good CRC, each at the end of the one
    before (or at a segment's start): none caught half written, none lost
    or repeated.
    """
    assert all(r["crc_ok"] for r in rows)
    position = 0
    for r in rows:
        if r["offset"] != position:  # the next segment
            assert int(r["offset"]) % SEGMENT == 0  # type: ignore[call-overload]
            assert int(r["offset"]) > position  # type: ignore[call-overload]
        position = int(r["offset"]) + int(r["size"])  # type: ignore[call-overload]


def _jvm_rows(location: str) -> list[dict[str, object]]:
    from rmqha.pipeline.source import read_store
    from tests._spark import spark
    from tests.test_pipeline_spark import df_rows

    df = read_store(spark(), location, splitBytes="100k")
    assert "rmqha commit log" in df._jdf.queryExecution().executedPlan().toString()
    return df_rows(df)


def _start_stream(location: str, directory: str) -> Any:
    """
    C{readStream.format("rmqha")} of a live broker into Parquet files
    under C{directory}, in batches of at most 64 KiB.
    """
    from tests._spark import spark

    return (
        spark().readStream.format("rmqha").option("maxBytesPerTrigger", "64k")
        .option("splitBytes", "100k").load(location)
        .writeStream.format("parquet").option("path", os.path.join(directory, "out"))
        .option("checkpointLocation", os.path.join(directory, "checkpoint")).start()
    )


def _sink_rows(directory: str) -> list[dict[str, object]]:
    from tests._spark import spark
    from tests.test_pipeline_spark import df_rows

    return df_rows(spark().read.parquet(os.path.join(directory, "out")))


@pytest.mark.spark
@pytest_twisted.ensureDeferred
async def test_spark_reads_and_verifies_live_brokers(tmp_path: Any) -> None:
    """
    While the master takes puts and replicates them, Spark reads the
    master's commit log from C{rmqha+http://} (every row a whole record
    with a good CRC, offsets contiguous from 0: no record caught half
    written) and C{verify} finds the live slave consistent with the live
    master.  Spark runs in a thread: the brokers serve on this reactor.
    """
    from tests._spark import spark, why_no_spark

    if why_no_spark() is not None:
        pytest.skip(str(why_no_spark()))
    from twisted.internet import reactor
    from twisted.internet.task import LoopingCall

    from rmqha.pipeline.jobs import verify
    from tests.test_pipeline_spark import df_rows

    await deferToThread(spark)  # started before the brokers load the CPU
    master: Broker = make_broker(
        reactor, str(tmp_path / "master"), Role.MASTER, SEGMENT,
        ha_listen="tcp:0:interface=127.0.0.1",
        http="tcp:0:interface=127.0.0.1", serve_commitlog=RATE,
    )
    master.startService()
    slave: Broker | None = None
    puts = None
    try:
        address = await master.ha_address()
        slave = make_broker(
            reactor, str(tmp_path / "slave"), Role.SLAVE, SEGMENT,
            master_endpoint=f"tcp:host=127.0.0.1:port={address.port}",
            http="tcp:0:interface=127.0.0.1", serve_commitlog=RATE,
        )
        slave.startService()
        body = os.urandom(2000)
        for i in range(200):
            await master.put(Message("Orders", body, queue_id=i % 4))
        master_port = (await master.getServiceNamed("http").address()).port
        slave_port = (await slave.getServiceNamed("http").address()).port
        counter = iter(range(10**9))
        puts = LoopingCall(lambda: master.put(Message("Live", body, queue_id=next(counter) % 4)))
        puts.start(0.02)

        def read() -> list[dict[str, object]]:
            df = (
                spark().read.format("rocketmq-commitlog")
                .option("splitBytes", "100k").load(f"rmqha+http://127.0.0.1:{master_port}")
            )
            return df_rows(df)

        location = f"rmqha+http://127.0.0.1:{master_port}"
        stream = await deferToThread(_start_stream, location, str(tmp_path / "stream"))
        rows = await deferToThread(read)
        assert len(rows) >= 200
        _whole_and_contiguous(rows)
        # The JVM reader (read_store's choice for a live broker) while the puts go on.
        jvm_rows = await deferToThread(_jvm_rows, location)
        assert len(jvm_rows) >= len(rows)
        _whole_and_contiguous(jvm_rows)
        await until(
            reactor,
            lambda: sum(p["numInputRows"] for p in stream.recentProgress) >= 200,
            "the stream to read 200 records",
        )
        streamed = await deferToThread(_sink_rows, str(tmp_path / "stream"))
        assert len(streamed) >= 200
        _whole_and_contiguous(streamed)
        puts.stop()
        # Quiet now: the stream catches up to exactly the batch read's rows.
        await deferToThread(stream.processAllAvailable)
        everything = await deferToThread(_jvm_rows, location)
        assert await deferToThread(_sink_rows, str(tmp_path / "stream")) == everything
        assert await deferToThread(read) == everything
        await deferToThread(stream.stop)
        result = await deferToThread(
            verify, spark(), f"rmqha+http://127.0.0.1:{master_port}",
            f"rmqha+http://127.0.0.1:{slave_port}",
        )
        assert result.consistent, result.lines()
        assert result.compared_bytes >= 200 * 2000
    finally:
        if puts is not None and puts.running:
            puts.stop()
        if slave is not None:
            await slave.stopService()
        await master.stopService()
