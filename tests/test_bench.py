"""
The benchmark command's argument checks (the benchmarks themselves are run
by hand: docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import io
import os

from twisted.trial.unittest import SynchronousTestCase

from tools import bench


class DirArgumentTests(SynchronousTestCase):
    def test_missing_dir_is_a_usage_error(self) -> None:
        """
        C{--dir} naming no directory is a usage error (exit 2) naming the
        path, before anything is created, not a traceback from mkdtemp.
        """
        missing = os.path.join(self.mktemp(), "nowhere")
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), self.assertRaises(SystemExit) as raised:
            bench.main(["store", "--dir", missing])
        self.assertEqual(raised.exception.code, 2)
        self.assertIn(f"{missing}: no such directory", stderr.getvalue())
        self.assertFalse(os.path.exists(missing))


class CodecBenchTests(SynchronousTestCase):
    def test_codec_figures(self) -> None:
        """
        C{bench codec} times both codec paths in one run and prints one
        JSON line with each loop's µs per record and speed-up (skipped where
        the compiled codec is not built).
        """
        import json

        from rmqha.store import _record

        if _record._accel is None:
            self.skipTest("the compiled codec is not built or RMQHA_PURE is set")
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            bench.main(["codec", "--count", "40", "--runs", "1"])
        result = json.loads(stdout.getvalue().splitlines()[-1])
        for name in ("encode", "check_record", "replica_validator", "walk_valid"):
            self.assertGreater(result[f"pure_{name}_us"], 0)
            self.assertGreater(result[f"compiled_{name}_us"], 0)
            self.assertIn(f"{name}_speedup", result)
        self.assertIs(_record._accel, _record._load_accelerator())
        self.assertIs(_record.crc32, _record._accel.crc32)


class CRCBenchTests(SynchronousTestCase):
    def test_crc_figures(self) -> None:
        """
        C{bench crc} times the readers with the compiled CRC's folding on
        and off in one run, prints one JSON line with MB/s, MB per CPU
        second and the share of C{zlib.crc32}, and removes its store.
        """
        import json

        from rmqha.store import _record

        if _record._accel is None:
            self.skipTest("the compiled codec is not built or RMQHA_PURE is set")
        if not _record._accel._crc32_set_folding(True):
            self.skipTest("this CPU has no PCLMULQDQ/SSE4.1 folding")
        where = self.mktemp()
        os.mkdir(where)
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
            bench.main(["crc", "--size", "300000", "--segment-size", "262144", "--runs", "1",
                        "--dir", where])
        result = json.loads(stdout.getvalue().splitlines()[-1])
        for crc in ("zlib", "fold"):
            for name in ("plain", "plain_nobodies", "check", "crc32"):
                self.assertGreater(result[f"{crc}_{name}_mb_per_s"], 0)
            self.assertIn(f"{crc}_check_fraction_of_zlib_crc32", result)
        self.assertEqual(os.listdir(where), [])


class RoundtripBenchTests(SynchronousTestCase):
    def test_roundtrip_figures(self) -> None:
        """
        C{bench roundtrip} runs the master's put and ack and the slave's
        frames in one process, checks the slave validated every put, prints
        one JSON line with both costs, and removes its stores.
        """
        import json

        where = self.mktemp()
        os.mkdir(where)
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            bench.main(["roundtrip", "--count", "50", "--runs", "2", "--dir", where])
        result = json.loads(stdout.getvalue().splitlines()[-1])
        for figure in ("master_put_and_ack_us", "slave_frame_us"):
            self.assertGreater(result[figure]["best"], 0)
            self.assertGreaterEqual(result[figure]["median"], result[figure]["best"])
        self.assertEqual(len(result["all"]["master"]), 2)
        self.assertEqual(os.listdir(where), [])

    def test_roundtrip_producers(self) -> None:
        """
        C{bench roundtrip --producer await|callback}: producers putting
        again as answered, every put answered PUT_OK (the harness checks
        it), the slave validating every put.
        """
        import json

        where = self.mktemp()
        os.mkdir(where)
        for producer in ("await", "callback"):
            stdout = io.StringIO()
            with contextlib.redirect_stdout(stdout):
                bench.main([
                    "roundtrip", "--count", "200", "--runs", "1", "--producer", producer,
                    "--producers", "4", "--dir", where,
                ])
            result = json.loads(stdout.getvalue().splitlines()[-1])
            self.assertEqual(result["producer"], producer)
            self.assertGreater(result["master_put_and_ack_us"]["best"], 0)
        self.assertEqual(os.listdir(where), [])


class WarmUpTests(SynchronousTestCase):
    """
    The replication benchmarks touch the memory a run writes before the
    first timed run (a transfer into cold memory ran at a quarter of the
    next one's speed: docs/benchmarks.md).
    """

    def test_warm_memory_writes_and_removes(self) -> None:
        """
        C{_warm_memory} writes exactly the bytes asked for into a scratch
        file of the directory and leaves nothing behind.
        """
        directory = self.mktemp()
        os.mkdir(directory)
        written: list[int] = []
        real_write = os.write

        def write(fd: int, data: bytes) -> int:
            written.append(real_write(fd, data))
            return written[-1]

        self.patch(bench.os, "write", write)
        bench._warm_memory(directory, 3 * (1 << 20) + 5)
        self.assertEqual(sum(written), 3 * (1 << 20) + 5)
        self.assertEqual(os.listdir(directory), [])

    def test_backlog_warm_up_covers_the_slaves_segments(self) -> None:
        """
        The warm-up touches as much memory as a slave's whole segments for
        the master's backlog take (segments are preallocated at full size).
        """
        from rmqha.cli import fill
        from rmqha.store.commitlog import CommitLog

        root = self.mktemp()
        os.mkdir(root)
        store = os.path.join(root, "master")
        with CommitLog.open(store, segment_size=64 * 1024) as log:
            fill(log, 80, 1024, ["BenchTopic"], 8)  # ~90 KB: two segments
        warmed: list[tuple[str, int]] = []
        self.patch(bench, "_warm_memory", lambda d, n: warmed.append((d, n)))
        bench._backlog_warm_up(root, store)
        self.assertEqual(warmed, [(root, 2 * 64 * 1024)])


class PageReportingTests(SynchronousTestCase):
    """
    The guest's free page reporting, read from its module parameters: in
    every benchmark's machine figures, and a note before a benchmark runs
    while it is on.
    """

    def parameters(self, order: str, min_free_ms: str = "0") -> str:
        directory = self.mktemp()
        os.makedirs(directory)
        for name, value in (("page_reporting_order", order), ("min_free_ms", min_free_ms)):
            with open(os.path.join(directory, name), "w") as f:
                f.write(value + "\n")
        return directory

    def test_on(self) -> None:
        """
        An order the allocator has (9: 2 MiB blocks) is reporting on.
        """
        self.assertEqual(
            bench.free_page_reporting(self.parameters("9", "2000")),
            {"order": 9, "min_free_ms": 2000, "active": 1},
        )

    def test_held_off(self) -> None:
        """
        An order above the allocator's largest reports nothing.
        """
        self.assertEqual(bench.free_page_reporting(self.parameters("11"))["active"], 0)  # type: ignore[index]

    def test_none(self) -> None:
        """
        A kernel without it, or a parameter that is not a number: C{None}.
        """
        self.assertIsNone(bench.free_page_reporting(os.path.join(self.mktemp(), "absent")))
        self.assertIsNone(bench.free_page_reporting(self.parameters("nine")))

    def test_note(self) -> None:
        """
        While it is on, a benchmark starts with a note saying so and how to
        hold it off and restore it; held off or absent, nothing is said.
        """
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            bench._warn_page_reporting({"order": 9, "min_free_ms": 0, "active": 1})
        note = stderr.getvalue()
        self.assertIn("free page reporting is on (page_reporting_order 9)", note)
        self.assertIn("'echo 11 > /sys/module/page_reporting/parameters/page_reporting_order'", note)
        self.assertIn("'echo 9 > ...'", note)
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            bench._warn_page_reporting({"order": 11, "min_free_ms": 0, "active": 0})
            bench._warn_page_reporting(None)
        self.assertEqual(stderr.getvalue(), "")

    def test_in_machine_figures(self) -> None:
        """
        What every benchmark's JSON says of the machine includes it.
        """
        self.assertIn("free_page_reporting", bench.machine_info())


class PutsBenchTests(SynchronousTestCase):
    def test_puts_figures(self) -> None:
        """
        C{bench puts} runs both checkouts (here this one against itself)
        and reports, for single puts, the process's CPU rate, the put
        thread's and the wall clock's, each with its speed-up.
        """
        import json

        here = os.path.dirname(os.path.dirname(os.path.abspath(bench.__file__)))
        root = self.mktemp()
        os.mkdir(root)
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            bench.main([
                "puts", "--against", here, "--count", "256", "--runs", "1",
                "--check-size", "300000", "--dir", root,
            ])
        result = json.loads(stdout.getvalue().splitlines()[-1])
        for side in ("before", "after"):
            self.assertGreater(result[f"{side}_batch1_msgs_per_s"], 0)
            self.assertGreater(result[f"{side}_batch1_thread_msgs_per_s"], 0)
            self.assertGreater(result[f"{side}_batch1_wall_msgs_per_s"], 0)
            self.assertEqual(len(result[f"{side}_batch1_wall_msgs_per_s_runs"]), 1)
        self.assertGreater(result["put_wall_speedup"], 0)
        self.assertIn("wall clock", stderr.getvalue())
        self.assertEqual(os.listdir(root), [])


class ScrubBenchTests(SynchronousTestCase):
    def test_scrub_figures(self) -> None:
        """
        C{bench scrub} walks every record of the store it filled with
        the scrub's check, in this checkout and in C{--against} (here
        this one again), alternating, reports each side's rate, cost a
        record and share of a core at the default rate, and removes the
        store.
        """
        import json

        here = os.path.dirname(os.path.dirname(os.path.abspath(bench.__file__)))
        root = self.mktemp()
        os.mkdir(root)
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            bench.main([
                "scrub", "--size", "3000000", "--segment-size", "1048576", "--runs", "2",
                "--against", here, "--dir", root,
            ])
        result = json.loads(stdout.getvalue().splitlines()[-1])
        for side in ("this", "against"):
            # 3,000,000 bytes of 1,141-byte records over 1 MiB segments.
            self.assertEqual(result[side]["records"], 3000000 // 1141 + 1)
            self.assertGreater(result[side]["mb_per_cpu_s"], 0)
            self.assertGreater(result[side]["core_share_at_default_rate"], 0)
        self.assertGreater(result["speedup"], 0)
        self.assertIn("of a core", stderr.getvalue())
        self.assertEqual(os.listdir(root), [])


class SyncAgainstTests(SynchronousTestCase):
    def test_alternates_and_compares(self) -> None:
        """
        C{bench sync --against DIR} runs C{bench sync} in each checkout in
        turn, the order swapped every run, C{--busy-poll} and C{--producer}
        given to this checkout's runs only, and reports the medians' ratios and the
        paired ratios.
        """
        import json
        import subprocess

        here = os.path.dirname(os.path.dirname(os.path.abspath(bench.__file__)))
        other = self.mktemp()
        os.mkdir(other)
        calls: list[tuple[str, list[str]]] = []
        real = subprocess.run

        def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
            if command[1:3] != ["-m", "tools.bench"]:
                return real(command, **kwargs)  # type: ignore[call-overload,no-any-return]
            cwd = str(kwargs["cwd"])
            calls.append((cwd, command))
            this = cwd == here
            figures = {
                "puts_per_s": 3000.0 if this else 1000.0 + len(calls),
                "p50_us": 50.0,
                "p99_us": 100.0 if this else 400.0,
            }
            return subprocess.CompletedProcess(command, 0, "progress\n" + json.dumps(figures), "")

        self.patch(bench.subprocess, "run", run)
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            bench.main([
                "sync", "--producers", "1", "--runs", "2", "--busy-poll", "0",
                "--producer", "callback", "--against", other,
            ])
        result = json.loads(stdout.getvalue().splitlines()[-1])
        self.assertEqual(
            [cwd for cwd, _ in calls], [here, os.path.abspath(other), os.path.abspath(other), here]
        )
        for cwd, command in calls:
            self.assertEqual("--busy-poll" in command, cwd == here)
            self.assertEqual("--producer" in command, cwd == here)
        self.assertEqual(result["this_runs"], [3000, 3000])
        self.assertEqual(result["against_runs"], [1002, 1003])
        self.assertEqual(result["paired_ratios"], [2.99, 2.99])
        self.assertAlmostEqual(result["p99_ratio"], 0.25)

    def _usage_error(self, *argv: str) -> str:
        """
        Run C{bench sync ARGV --against DIR} (DIR an existing directory),
        which must exit with a usage error (2); return what it printed.
        """
        other = self.mktemp()
        os.mkdir(other)
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), self.assertRaises(SystemExit) as raised:
            bench.main(["sync", *argv, "--against", other])
        self.assertEqual(raised.exception.code, 2)
        return stderr.getvalue()

    def test_targets_mode_is_a_usage_error(self) -> None:
        self.assertIn(
            "--against takes --mode sync or async", self._usage_error("--mode", "targets")
        )

    def test_backlog_is_not_given_to_the_other_checkout(self) -> None:
        """
        C{--backlog} with C{--against} is a usage error: the other
        checkout's bench (the filing's) has no such option.
        """
        self.assertIn(
            "--backlog is not given to --against", self._usage_error("--backlog", "1000")
        )


class HTTPBenchClientTests(SynchronousTestCase):
    def test_answers_counted(self) -> None:
        """
        C{bench http}'s client reads answers with a Content-Length or
        chunked, however they are split across reads, counts each batch
        message's status and what was stored, and sends its next request
        only once an answer is whole.
        """
        import json
        import time

        from twisted.internet.testing import StringTransport

        from tools.httpbench import _Client, batch_binary, batch_json

        self.assertEqual(batch_binary([b"ab", b""]), b"\x00\x00\x00\x02ab\x00\x00\x00\x00")
        self.assertEqual(
            json.loads(batch_json([b"\xff"], queue_id=3)),
            {"messages": [{"body_base64": "/w==", "queueId": 3}]},
        )
        tally: dict = {"latencies": [], "statuses": {}, "codes": {}, "stored": 0}
        client = _Client(b"REQUEST", time.perf_counter() + 3600, tally)
        transport = StringTransport()
        client.makeConnection(transport)
        self.assertEqual(transport.value(), b"REQUEST")
        batch = json.dumps({"results": [
            {"status": "PUT_OK", "stored": True}, {"status": "MESSAGE_ILLEGAL", "stored": False},
        ]}).encode()
        answer = b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s" % (len(batch), batch)
        single = b'{"status": "FLUSH_SLAVE_TIMEOUT", "stored": true}'
        chunked = (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
            % (len(single), single)
        )
        for data in (answer, chunked):
            transport.clear()
            for i in range(0, len(data), 7):
                self.assertEqual(transport.value(), b"")
                client.dataReceived(data[i : i + 7])
            self.assertEqual(transport.value(), b"REQUEST")
        self.assertEqual(
            tally["statuses"], {"PUT_OK": 1, "MESSAGE_ILLEGAL": 1, "FLUSH_SLAVE_TIMEOUT": 1}
        )
        self.assertEqual((tally["stored"], tally["codes"]), (2, {400: 1, 200: 1}))
        self.assertEqual(len(tally["latencies"]), 2)


class RemotingBenchTests(SynchronousTestCase):
    """
    C{bench remoting}'s load generator.
    """

    def test_remoting_frames(self) -> None:
        """
        C{bench remoting}'s load generator sends what a broker reads as a
        310 send (or a 320 batch of C{--batch}), each with a new opaque,
        and reads the answer's code and opaque however it is split.
        """
        import socket

        from rmqha.remoting._frames import FLAG_RESPONSE, FrameDecoder, RemotingCommand, decode_frame, encode
        from rmqha.remoting.codes import RequestCode
        from rmqha.remoting.sends import decode_batch, read_send_header
        from tools.remotingbench import _OPAQUE_BASE, _Connection, send_frames

        single = decode_frame(send_frames(64, 1, 2))
        header = read_send_header(single.code, single.ext_fields)
        self.assertEqual((single.code, header.queue_id, header.batch, len(single.body)), (310, 2, False, 64))
        self.assertIn("UNIQ_KEY\x01", header.properties or "")
        batch = decode_frame(send_frames(64, 32, 0))
        self.assertEqual(batch.code, RequestCode.SEND_BATCH_MESSAGE)
        self.assertTrue(read_send_header(batch.code, batch.ext_fields).batch)
        self.assertEqual([len(body) for _, body, _ in decode_batch(batch.body)], [64] * 32)
        ours, theirs = socket.socketpair()
        self.addCleanup(ours.close)
        self.addCleanup(theirs.close)
        connection = _Connection(ours, send_frames(16, 1, 0))
        decoder = FrameDecoder()
        for expected in (_OPAQUE_BASE + 1, _OPAQUE_BASE + 2):
            connection.send()
            decoder.feed(theirs.recv(65536))
            request = decoder.next_command()
            assert request is not None
            self.assertEqual(request.opaque, expected)
            answer = encode(RemotingCommand(code=0, opaque=expected, flag=FLAG_RESPONSE))
            for i in range(0, len(answer), 5):
                self.assertIsNone(connection.answer())
                connection.buffer += answer[i : i + 5]
            self.assertEqual(connection.answer(), (0, expected))
            self.assertEqual(connection.buffer, b"")


class PullsBenchReportTests(SynchronousTestCase):
    """
    C{bench pulls}' verdict: the median drain rate against the median
    store-check rate, the 50 % target named met or not.
    """

    def result(self, pull_seconds: list[float]) -> dict[str, object]:
        size = 100 << 20
        return {
            "store_bytes": size,
            "messages": 1000,
            "check": [1.0, 2.0, 1.0],
            "pull": [
                {"seconds": s, "messages": 1000, "bytes": size, "broker_cpu": 0.5, "consumer_cpu": 0.7}
                for s in pull_seconds
            ],
        }

    def test_met(self) -> None:
        from tools import pullbench

        text = pullbench.report(self.result([1.5, 1.9, 2.5]))
        self.assertIn("store check: median 1.00 s = 105 MB/s", text)
        self.assertIn("pulls / store check: 52.6% (target >= 50 %: met)", text)

    def test_not_met(self) -> None:
        from tools import pullbench

        text = pullbench.report(self.result([10.0]))
        self.assertIn("pulls / store check: 10.0% (target >= 50 %: NOT met)", text)
        self.assertIn("pull: 1,000 messages, 100 MiB in 10.00 s = 10 MB/s, 100 msgs/s", text)
