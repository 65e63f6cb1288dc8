# -*- test-case-name: tests.test_cli -*-
"""
The C{rmqha} command: operator tools for a store.

    rmqha store info DIR [--json]
    rmqha store check DIR
    rmqha store repair DIR --from REPLICA_DIR [--dry-run]
    rmqha store dump DIR [--from OFFSET] [--limit N]
    rmqha store fill DIR --count N --body-size BYTES [--topics a,b] [--segment-size BYTES]
    rmqha demo [--dir DIR] [--count N] [--live N] [--segment-size BYTES]
    rmqha admin topics|broker-status|consumer-offsets --broker HOST:PORT [--json]

Every inspection command opens the store read-only: it never modifies a
store, and works on one a broker has open.  C{repair} is the one that
writes to an existing store: it takes the store's lock (so never while a
broker has it open) and keeps every byte it replaces in quarantine.  Errors are one line on stderr
and a non-zero exit status (2 for bad arguments, 1 otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
import traceback
from collections import Counter
from typing import IO, Any, Callable, NoReturn, Sequence, cast

from rmqha import __version__
from rmqha.store._record import (
    ACCELERATED,
    Message,
    MessageRejected,
    RecordError,
    record_json,
)
from rmqha._units import parse_size
from rmqha.store._recovery import repair_store, verify_store
from rmqha.store.consumequeue import QueueCheck
from rmqha.store.commitlog import CommitLog
from rmqha.store.errors import Damage, StoreError

__all__ = ["main"]


class _CommandError(Exception):
    """
    A failure to report as one line, exit status 1.
    """


class _UsageError(Exception):
    """
    Bad arguments: one line, exit status 2.
    """


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, not argparse's usage block: this is read in scripts.
        raise _UsageError(f"{self.prog}: error: {message}")


def _size_arg(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            return parse_size(text, name)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def _nonnegative(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} {text!r} is not an integer"
            ) from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"{name} {value} is negative")
        return value

    return parse


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="rmqha",
        description="RocketMQ-compatible commit log with master/slave replication.",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"rmqha {__version__} (codec: {'compiled' if ACCELERATED else 'pure Python'})",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    store = commands.add_parser("store", help="inspect or fill a store")
    actions = store.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    actions.required = True

    info = actions.add_parser("info", help="segments, offsets, messages per topic")
    info.add_argument("dir", help="store root (the directory holding commitlog/)")
    info.add_argument("--json", action="store_true", help="one JSON object")
    info.set_defaults(run=_info)

    check = actions.add_parser(
        "check",
        help="verify every record, then the consume queues against them; exit 1 on a finding",
    )
    check.add_argument("dir")
    check.set_defaults(run=_check)

    repair = actions.add_parser(
        "repair",
        help="replace damaged records with a replica's verified copy (store not running)",
    )
    repair.add_argument("dir", help="the damaged store (no broker may have it open)")
    repair.add_argument(
        "--from", dest="replica", required=True, metavar="REPLICA_DIR",
        help="a replica's store root (a slave's, or a copy of it)",
    )
    repair.add_argument(
        "--dry-run", action="store_true", help="check what would be repaired; write nothing"
    )
    repair.set_defaults(run=_repair)

    dump = actions.add_parser("dump", help="records as JSON lines (body base64)")
    dump.add_argument("dir")
    dump.add_argument(
        "--from",
        dest="start",
        type=_nonnegative("--from"),
        default=None,
        help="offset of the first record (a record boundary; default the oldest)",
    )
    dump.add_argument(
        "--limit", type=_nonnegative("--limit"), default=None, help="at most N records"
    )
    dump.set_defaults(run=_dump)

    fill = actions.add_parser("fill", help="append generated messages")
    fill.add_argument("dir")
    fill.add_argument("--count", type=_nonnegative("--count"), required=True)
    fill.add_argument("--body-size", type=_size_arg("--body-size"), required=True)
    fill.add_argument(
        "--topics", default="TopicTest", help="comma-separated topics, used in turn"
    )
    fill.add_argument("--queues", type=_nonnegative("--queues"), default=4,
                      help="queues per topic, used in turn (default 4)")
    fill.add_argument(
        "--segment-size",
        type=_size_arg("--segment-size"),
        default=None,
        help="segment size for a new store (default 1g); each segment file is "
        "preallocated at full size",
    )
    fill.set_defaults(run=_fill)

    demo = commands.add_parser(
        "demo", help="the quick-start demo: a live master and slave on loopback"
    )
    demo.add_argument(
        "--dir", default=None,
        help="where the two stores go, kept afterwards: a new or empty directory, or "
        "one an earlier demo made (default: a temporary directory, removed at the end)",
    )
    demo.add_argument(
        "--segment-size", type=_size_arg("--segment-size"), default=None,
        help="segment size of the stores (default 64m, 4m with --failover; each "
        "segment file is preallocated at full size)",
    )
    demo.add_argument(
        "--count", type=_nonnegative("--count"), default=50_000,
        help="messages the producer sends (rmqha.client) before the slave starts: the backlog",
    )
    demo.add_argument(
        "--live", type=_nonnegative("--live"), default=5_000,
        help="messages it sends while the slave catches up and the consumers consume",
    )
    demo.add_argument(
        "--failover", action="store_true",
        help="automatic failover instead: one etcd, three brokers, SYNC load; the master "
        "is killed and the old one rejoins (docs/failover.md)",
    )
    demo.add_argument(
        "--kills", type=_nonnegative("--kills"), default=1,
        help="with --failover: how many masters to kill (default 1)",
    )
    demo.set_defaults(run=_demo)

    certs = commands.add_parser(
        "certs", help="TLS certificates (and a failover group's secret) for a test set-up"
    )
    certs_actions = certs.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    certs_actions.required = True
    init = certs_actions.add_parser(
        "init",
        help="write a CA and master/slave key pairs (test and lab set-ups; docs/tls.md), "
        "or, with --group, what a failover group needs (docs/failover.md)",
    )
    init.add_argument("dir", help="where the files go (created if needed)")
    init.add_argument(
        "--master-name", default=None,
        help="the master's certificate name (also valid: localhost, 127.0.0.1, ::1; "
        "default: master)",
    )
    init.add_argument(
        "--slave-names", default=None,
        help="comma-separated slave names, one key pair each (default: slave)",
    )
    init.add_argument(
        "--group", default=None,
        help="a failover group's name: write a CA, one key pair per --nodes id (its "
        "certificate names the id) and a group secret (group.secret, 0600)",
    )
    init.add_argument(
        "--nodes", default=None,
        help="with --group: the comma-separated node ids (--node-id of each node)",
    )
    init.set_defaults(run=_certs_init)
    issue = certs_actions.add_parser(
        "issue",
        help="one more key pair signed by the CA in DIR (a new node, an operator's "
        "client, a replacement before expiry; docs/tls.md)",
    )
    issue.add_argument("dir", help="the CA's directory: ca.pem and ca.key, as certs init wrote them")
    issue.add_argument(
        "name",
        help="the certificate's name: CN and first DNS name (what --tls-allowed-peers, "
        "--http-allowed-peers and node ids match), or an IP address",
    )
    issue.add_argument("--dns", default=None, help="comma-separated further DNS names")
    issue.add_argument(
        "--ip", default=None, help="comma-separated IP addresses (e.g. 127.0.0.1,::1)"
    )
    issue.add_argument(
        "--usage", choices=("both", "server", "client"), default="both",
        help="extended key usage: server, client, or both (default: both, what "
        "certs init gives every broker, which serves and dials)",
    )
    issue.add_argument(
        "--days", type=_nonnegative("--days"), default=825,
        help="validity in days from five minutes ago (default 825)",
    )
    issue.add_argument(
        "--out", default=None, help="where the pair goes (default: DIR; must exist)"
    )
    issue.add_argument(
        "--stem", default=None, help="file names: STEM.pem and STEM.key (default: NAME)"
    )
    issue.set_defaults(run=_certs_issue)

    cluster = commands.add_parser(
        "cluster", help="a failover group: status, switchover (docs/failover.md)"
    )
    cluster_actions = cluster.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    cluster_actions.required = True
    for name, text in [
        ("status", "the master, epoch, in-sync set and every member's role, offset and lag"),
        ("switchover", "a planned change of master to an in-sync member"),
    ]:
        action = cluster_actions.add_parser(name, help=text)
        action.add_argument(
            "--coordinator", required=True,
            help="etcd:http://HOST:PORT[,http://HOST:PORT...], with the options of the "
            "brokers' --coordinator (tlsCa=, tlsCert=, tlsKey=, user=, passwordFile=; "
            "or the password in RMQHA_ETCD_PASSWORD)",
        )
        action.add_argument("--group", required=True, help="the group (brokerName)")
        if name == "status":
            action.add_argument("--json", action="store_true", help="print JSON")
            action.set_defaults(run=_cluster_status)
        else:
            action.add_argument("--to", required=True, metavar="NODE_ID", help="the new master")
            action.add_argument(
                "--timeout", type=float, default=30.0,
                help="seconds to wait for the new master (default 30); the request is "
                "withdrawn after",
            )
            action.set_defaults(run=_cluster_switchover)

    admin = commands.add_parser(
        "admin", help="ask a broker (genuine or rmqha) over remoting (docs/remoting.md)"
    )
    admin_actions = admin.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    admin_actions.required = True
    for name, text in [
        ("topics", "every topic: read and write queues, perm (mqadmin topicList)"),
        ("broker-status", "the broker's runtime info, key : value (mqadmin brokerStatus)"),
        ("consumer-offsets", "topic@group queue offset for every committed offset"),
    ]:
        action = admin_actions.add_parser(name, help=text)
        action.add_argument(
            "--broker", required=True, type=_broker_address, metavar="HOST:PORT",
            help="the broker's remoting address (its listenPort)",
        )
        action.add_argument(
            "--timeout", type=_positive_seconds, default=3.0,
            help="seconds to wait for the connection and the answer (default 3)",
        )
        action.add_argument("--json", action="store_true", help="print JSON")
        action.set_defaults(run=_admin)

    pipeline = commands.add_parser(
        "pipeline", help="Spark jobs: stats, export, verify (docs/pipeline.md)"
    )
    pipeline.__class__ = _PipelineParser
    cast(_PipelineParser, pipeline)._filled = False
    pipeline.set_defaults(run=_pipeline)
    return parser


class _PipelineParser(_Parser):
    """
    C{rmqha pipeline}'s parser, given its jobs' arguments only when it is
    used: they live in L{rmqha.pipeline.jobs}, whose import (its readers
    and stores) every other command would pay for at start.  (The jobs'
    own parsers are of this class too, made filled.)
    """

    _filled = True

    def _fill(self) -> None:
        if not self._filled:
            self._filled = True
            from rmqha.pipeline.jobs import add_arguments

            add_arguments(self)

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:
        self._fill()
        return super().parse_known_args(*args, **kwargs)

    def format_help(self) -> str:
        self._fill()
        return super().format_help()

    def format_usage(self) -> str:
        self._fill()
        return super().format_usage()


def _on_cluster(args: argparse.Namespace, work: Callable[[Any, Any], Any]) -> Any:
    """
    Run C{work(reactor, dcs)} (a coroutine) on the global reactor and
    return its result; its L{ClusterError} or L{DCSError} become one-line
    errors.
    """
    from twisted.internet import reactor
    from twisted.internet.defer import ensureDeferred

    from rmqha.coord.cluster import ClusterError
    from rmqha.coord.dcs import DCSError
    from rmqha.coord.etcd import EtcdDCS, parse_coordinator

    try:
        dcs = EtcdDCS(reactor, parse_coordinator(args.coordinator), args.group)
    except ValueError as e:
        raise _UsageError(f"rmqha cluster: error: {e}") from None
    outcome: list[Any] = []

    async def run() -> None:
        try:
            outcome.append(("ok", await work(reactor, dcs)))
        except (ClusterError, DCSError) as e:
            outcome.append(("error", str(e)))
        finally:
            await dcs.close()
            reactor.stop()

    reactor.callWhenRunning(lambda: ensureDeferred(run()))
    reactor.run()
    kind, value = outcome[0] if outcome else ("error", "interrupted")
    if kind == "error":
        raise _CommandError(value)
    return value


def _cluster_status(args: argparse.Namespace, out: IO[str]) -> int:
    from rmqha.coord.cluster import render, status

    state = _on_cluster(args, lambda reactor, dcs: status(dcs, reactor))
    if args.json:
        out.write(json.dumps(state, indent=2) + "\n")
    else:
        out.write(render(args.group, state) + "\n")
    master = state["master"]
    # (1 without a master, or with one that has stopped reporting.)
    return 0 if master is not None and master["reporting"] is not False else 1


def _cluster_switchover(args: argparse.Namespace, out: IO[str]) -> int:
    from rmqha.coord.cluster import switchover

    result = _on_cluster(
        args, lambda reactor, dcs: switchover(reactor, dcs, args.to, args.timeout)
    )
    out.write(
        f"{result['master']} is the master at epoch {result['epoch']} "
        f"(took {result['seconds']} s)\n"
    )
    return 0


def _broker_address(text: str) -> str:
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"--broker {text!r} is not HOST:PORT")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"--timeout {text!r} is not a positive number of seconds")
    return value


def _broker_endpoint(address: str) -> str:
    host, _, port = address.rpartition(":")
    if host.startswith("["):
        return "tcp6:host=" + host[1:-1].replace(":", "\\:") + f":port={port}"
    return f"tcp:host={host}:port={port}"


_ADMIN_CODES = {"topics": 21, "broker-status": 28, "consumer-offsets": 43}


#: The table each action's body carries: its field, and the metadata
#: file of the same shape (C{broker-status}: a C{KVTable}).
_ADMIN_TABLES = {"topics": "topicConfigTable", "consumer-offsets": "offsetTable", "broker-status": "table"}


async def admin_query(client: Any, address: str, action: str, timeout: float) -> dict[str, Any]:
    """
    Ask the broker at C{address} through C{client} (a running
    L{rmqha.remoting.protocol.RemotingClient}) for what C{action}
    (C{topics}, C{broker-status}, C{consumer-offsets}) shows, parsed into
    plain JSON-ready data.

    @raise _CommandError: no connection, no answer in time, an answer
        other than SUCCESS (naming its code and remark), or a body that is
        not the table asked for: one line naming the broker.
    """
    from rmqha.remoting._frames import RemotingCommand
    from rmqha.remoting.codes import RequestCode, ResponseCode
    from rmqha.remoting.protocol import RemotingRequestError, one_line

    code = RequestCode(_ADMIN_CODES[action])
    what = f"{code.name} ({int(code)})"
    try:
        response = await client.request(RemotingCommand(code=int(code)), timeout)
    except RemotingRequestError as e:
        raise _CommandError(f"broker {address}: {e}") from None
    if response.code != ResponseCode.SUCCESS:
        try:
            name = ResponseCode(response.code).name
        except ValueError:
            name = "unknown code"
        raise _CommandError(
            f"broker {address} answered {what} with {name} ({response.code}): "
            f"{one_line(response.remark or '') or 'no remark'}"
        )
    try:
        return _admin_table(action, response.body or b"")
    except ValueError as e:
        raise _CommandError(f"broker {address}: the body of {what} {one_line(str(e))}") from None


def _admin_table(action: str, body: bytes) -> dict[str, Any]:
    """
    The table of C{action}'s answer C{body}, as L{admin_query} returns it.

    @raise ValueError: what is wrong with the body, worded to follow
        "the body of CODE".
    """
    from rmqha.remoting.metadata import (
        ConsumerOffsetTable,
        MetadataError,
        MetadataFile,
        TopicTable,
        decode_table,
        parse_fastjson,
    )

    if not body:
        raise ValueError("is empty")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"is not UTF-8 at byte {e.start}") from None
    field = _ADMIN_TABLES[action]
    try:
        doc = parse_fastjson(text)
        if not isinstance(doc, dict):
            raise ValueError(f"is not a JSON object with {field} but {_json_kind(doc)}")
        table = doc.get(field)
        if not isinstance(table, dict):
            raise ValueError(
                f"has no {field} object" if table is None else f"has {field} as {_json_kind(table)}, not an object"
            )
        if action == "broker-status":
            wrong = sorted(str(k) for k, v in table.items() if isinstance(v, (dict, list)) or v is None)
            if wrong:
                raise ValueError(f"has {field} entries that are not text: {', '.join(wrong[:5])}")
            return {str(k): _kv_text(v) for k, v in sorted(table.items(), key=lambda kv: str(kv[0]))}
        if action == "topics":
            topics = decode_table(MetadataFile.TOPICS, text)
            assert isinstance(topics, TopicTable)
            return {
                name: {
                    "readQueueNums": t.read_queue_nums,
                    "writeQueueNums": t.write_queue_nums,
                    "perm": t.perm,
                }
                for name, t in sorted(topics.topics.items())
            }
        offsets = decode_table(MetadataFile.CONSUMER_OFFSETS, text)
        assert isinstance(offsets, ConsumerOffsetTable)
        return {
            key: {str(q): queues[q] for q in sorted(queues)}
            for key, queues in sorted(offsets.offsets.items())
        }
    except MetadataError as e:
        raise ValueError(f"does not parse: {e}") from None


def _json_kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "null" if value is None else "an object"


def _kv_text(value: object) -> str:
    # As fastjson reads a number or boolean into a String field.
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def render_admin(action: str, data: dict[str, Any]) -> str:
    """
    The text C{rmqha admin ACTION} prints for L{admin_query}'s C{data}.
    """
    lines: list[str] = []
    if action == "topics":
        lines.append(f"{'#Topic':<48} {'#Read':>6} {'#Write':>6} {'#Perm':>5}")
        for name, t in data.items():
            lines.append(
                f"{name:<48} {t['readQueueNums']:>6} {t['writeQueueNums']:>6} {t['perm']:>5}"
            )
    elif action == "broker-status":
        # As mqadmin brokerStatus prints its TreeMap.
        lines.extend(f"{key:<32}: {value}" for key, value in data.items())
    else:
        for key, queues in data.items():
            lines.extend(f"{key} {queue} {offset}" for queue, offset in queues.items())
    return "".join(line + "\n" for line in lines)


async def admin_run(client: Any, address: str, action: str, timeout: float) -> dict[str, Any]:
    """
    L{admin_query} through C{client} (a L{RemotingClient}, not started):
    started for the query, stopped after it whatever its outcome.

    @raise _CommandError: as L{admin_query}.
    """
    client.startService()
    try:
        return await admin_query(client, address, action, timeout)
    finally:
        await client.stopService()


def _run_admin(args: argparse.Namespace) -> dict[str, Any]:
    """
    L{admin_run} on the global reactor, with a client of C{--broker}.

    @raise _CommandError: as L{admin_query}.
    """
    from twisted.internet import reactor
    from twisted.internet.defer import ensureDeferred

    from rmqha.remoting.protocol import RemotingClient

    client = RemotingClient(reactor, _broker_endpoint(args.broker), name=args.broker)
    outcome: list[Any] = []

    async def run() -> None:
        try:
            outcome.append(("ok", await admin_run(client, args.broker, args.action, args.timeout)))
        except _CommandError as e:
            outcome.append(("error", str(e)))
        except Exception:
            outcome.append(("bug", sys.exc_info()[1]))  # (raised again below, with its trace)
        finally:
            reactor.stop()

    reactor.callWhenRunning(lambda: ensureDeferred(run()))
    reactor.run()
    kind, value = outcome[0] if outcome else ("error", "interrupted")
    if kind == "bug":
        assert isinstance(value, BaseException)
        raise value
    if kind == "error":
        raise _CommandError(value)
    assert isinstance(value, dict)
    return value


def _admin(args: argparse.Namespace, out: IO[str]) -> int:
    value = _run_admin(args)
    if args.json:
        out.write(json.dumps(value, indent=2) + "\n")
    else:
        out.write(render_admin(args.action, value))
    return 0


def _pipeline(args: argparse.Namespace, out: IO[str]) -> int:
    # Exit status 0, 1 only for verify's proven divergence, 2 for any
    # error (one line; with --debug the trace first), as
    # `python -m rmqha.pipeline.jobs` and spark-submit.
    from rmqha.pipeline.jobs import check_inputs

    if args.job == "jar":  # not a Spark job: the data source's jar, for --jars
        from rmqha.pipeline._jar import ensure_jar

        jar, why = ensure_jar()
        if jar is None:
            raise _UsageError(f"rmqha: error: no jar: {why}")
        out.write(jar + "\n")
        return 0
    try:
        # Before PySpark and the JVM: a wrong path is one line at once.
        check_inputs(args)
    except ValueError as e:
        raise _UsageError(f"rmqha: error: {e}") from None
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise _UsageError(
            "rmqha: error: the pipeline needs PySpark: pip install 'rmqha[spark]' (and Java 17)"
        ) from None
    from rmqha.pipeline.jobs import error_line, run

    try:
        return run(args, out)
    except Exception as e:
        if args.debug:
            traceback.print_exc()
        raise _UsageError(f"rmqha: error: {error_line(e)}") from None


def _certs_init(args: argparse.Namespace, out: IO[str]) -> int:
    from rmqha import certs

    if args.group is not None or args.nodes is not None:
        return _certs_init_group(args, out)
    names = [n.strip() for n in (args.slave_names or "slave").split(",")]
    written = certs.init(args.dir, args.master_name or "master", names)
    out.write(f"CA              {written.ca}  (ca.key: keep it offline)\n")
    out.write(f"master          {written.master[0]}  {written.master[1]}\n")
    for name, (cert, key) in written.slaves.items():
        out.write(f"slave {name:<9} {cert}  {key}\n")
    d = shlex.quote(args.dir)
    # Runnable as printed, side by side in one directory: two stores, two
    # pidfiles, loopback only (the master's certificate names 127.0.0.1).
    out.write(
        "\nmaster: twistd -n --pidfile master.pid rmqha --role master --store-dir master-store "
        f"--ha-listen ssl:10912:interface=127.0.0.1 --tls-cert {d}/master.pem "
        f"--tls-key {d}/master.key --tls-ca {d}/ca.pem --tls-require-client-cert "
        f"--tls-allowed-peers {','.join(written.slaves)}\n"
    )
    first = next(iter(written.slaves))
    out.write(
        f"slave:  twistd -n --pidfile slave-{first}.pid rmqha --role slave "
        f"--store-dir slave-{first}-store --master 127.0.0.1:10912 --tls-ca {d}/ca.pem "
        f"--tls-cert {d}/slave-{first}.pem --tls-key {d}/slave-{first}.key\n"
    )
    return 0


def _certs_issue(args: argparse.Namespace, out: IO[str]) -> int:
    from cryptography import x509

    from rmqha import certs

    def split(text: str | None) -> list[str]:
        return [n.strip() for n in text.split(",")] if text else []

    written = certs.issue_from(
        args.dir,
        args.name,
        split(args.dns),
        split(args.ip),
        server=args.usage in ("both", "server"),
        client=args.usage in ("both", "client"),
        days=args.days,
        out_directory=args.out,
        stem=args.stem,
    )
    certificate = written.certificate
    san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    names = [str(n) for n in san.get_values_for_type(x509.DNSName)]
    names += [str(a) for a in san.get_values_for_type(x509.IPAddress)]
    usage = {"both": "server and client", "server": "server", "client": "client"}[args.usage]
    ends = certificate.not_valid_after_utc
    out.write(f"certificate     {written.cert}  {written.key}\n")
    out.write(f"names           {', '.join(names)}\n")
    out.write(f"usage           TLS {usage}\n")
    out.write(f"valid until     {ends:%Y-%m-%d %H:%M} UTC\n")
    ca_ends = written.ca.not_valid_after_utc
    if ends > ca_ends:
        out.write(
            f"note: the CA expires first, {ca_ends:%Y-%m-%d %H:%M} UTC: the certificate "
            "stops verifying then\n"
        )
    return 0


def _certs_init_group(args: argparse.Namespace, out: IO[str]) -> int:
    from rmqha import certs

    if args.group is None or args.nodes is None:
        raise _CommandError("certs init: --group and --nodes go together")
    if args.master_name is not None or args.slave_names is not None:
        raise _CommandError(
            "certs init: --master-name and --slave-names are for a fixed master and its "
            "slaves; a failover group has --nodes"
        )
    node_ids = [n.strip() for n in args.nodes.split(",")]
    written = certs.init_group(args.dir, args.group, node_ids)
    out.write(f"CA              {written.ca}  (ca.key: keep it offline)\n")
    for node_id, (cert, key) in written.nodes.items():
        out.write(f"node {node_id:<10} {cert}  {key}\n")
    out.write(f"group secret    {written.secret}  (mode 0600)\n")
    d = shlex.quote(args.dir)
    group = shlex.quote(args.group)
    # Runnable as printed, side by side in one directory, with an etcd on
    # its default port: one store, pidfile and pair of ports per node.
    out.write("\nthe group's nodes, authenticated by the group secret (docs/failover.md):\n")
    for i, node_id in enumerate(written.nodes):
        ha, http = 10912 + 10 * i, 8080 + i
        n = shlex.quote(node_id)
        out.write(
            f"{node_id}: twistd -n --pidfile {n}.pid rmqha --coordinator "
            f"etcd:http://127.0.0.1:2379 --group {group} --node-id {n} "
            f"--advertise 127.0.0.1:{ha} --ha-listen tcp:{ha}:interface=127.0.0.1 "
            f"--http tcp:{http}:interface=127.0.0.1 --advertise-http 127.0.0.1:{http} "
            f"--store-dir {n}-store --group-secret-file {d}/group.secret\n"
        )
    first = shlex.quote(next(iter(written.nodes)))
    out.write(
        "\nor by TLS client certificates instead (each node its own pair), e.g. "
        f"{first}: --ha-listen ssl:10912:interface=127.0.0.1 --tls-cert {d}/node-{first}.pem "
        f"--tls-key {d}/node-{first}.key --tls-ca {d}/ca.pem --tls-require-client-cert\n"
    )
    return 0


def _open_read_only(directory: str) -> CommitLog:
    if not os.path.isdir(directory):
        raise _CommandError(f"{directory}: no such directory")
    return CommitLog.open(directory, read_only=True)




def store_summary(commitlog: CommitLog) -> dict[str, Any]:
    """
    What C{rmqha store info --json} prints.
    """
    topics: Counter[str] = Counter()
    recovery = commitlog.recovery
    corruption = recovery.corruption
    try:
        for record in commitlog.records(with_body=False):
            topics[record.topic] += 1  # type: ignore[union-attr]
    except RecordError as e:
        # Damage in a segment older than recovery walks: count what comes
        # before it and say so ('store check' lists every damaged stretch).
        corruption = corruption or f"{e} (messages counted up to there; see 'rmqha store check')"
    return {
        "store_dir": commitlog.store_dir,
        "commitlog_dir": commitlog.commitlog_dir,
        "segment_size": commitlog.segment_size,
        "segments": [
            {"name": name, "start": start, "bytes": wrote}
            for name, start, wrote in commitlog.segments
        ],
        "min_offset": commitlog.min_offset,
        "max_offset": commitlog.max_offset,
        "messages": sum(topics.values()),
        "topics": dict(sorted(topics.items())),
        "clean_shutdown": recovery.clean_shutdown,
        "torn_tail": recovery.torn or recovery.stop_reason is not None,
        "stop_reason": recovery.stop_reason,
        "corruption": corruption,
    }


def _info(args: argparse.Namespace, out: IO[str]) -> int:
    with _open_read_only(args.dir) as commitlog:
        summary = store_summary(commitlog)
    if args.json:
        json.dump(summary, out)
        out.write("\n")
        return 0
    size = summary["segment_size"]
    out.write(f"store          {summary['store_dir']}\n")
    out.write(f"segment size   {size} bytes ({_human(size)})\n")
    out.write(f"segments       {len(summary['segments'])}\n")
    for segment in summary["segments"]:
        out.write(
            f"  {segment['name']}  {segment['bytes']:>12} bytes used "
            f"({100 * segment['bytes'] / size:5.1f}%)\n"
        )
    out.write(f"min offset     {summary['min_offset']}\n")
    out.write(
        f"max offset     {summary['max_offset']} "
        f"({_human(summary['max_offset'] - summary['min_offset'])} of data)\n"
    )
    out.write(f"messages       {summary['messages']}\n")
    for topic, count in summary["topics"].items():
        out.write(f"  {topic:<40} {count:>12}\n")
    state = "clean" if summary["clean_shutdown"] else "NOT clean (abort marker present)"
    out.write(f"last shutdown  {state}\n")
    if summary["corruption"]:
        out.write(f"CORRUPT        {summary['corruption']}\n")
    elif summary["torn_tail"]:
        out.write(
            f"torn tail      {summary['stop_reason'] or 'non-zero bytes after the end'}"
            " (cut when opened read-write)\n"
        )
    return 0


def _check(args: argparse.Namespace, out: IO[str]) -> int:
    if not os.path.isdir(args.dir):
        raise _CommandError(f"{args.dir}: no such directory")
    # The consume queues are checked from the record check's own walk,
    # each block while it is in memory (one read of the log for both).
    queues = None
    if os.path.isdir(os.path.join(args.dir, "consumequeue")):
        queues = QueueCheck(args.dir)
    try:
        report = verify_store(args.dir, on_block=None if queues is None else queues.feed)
        if report.ok and queues is not None:
            queues.finish(report.end_offset)
    finally:
        if queues is not None:
            queues.close()
    if report.unfinished_segment is not None:
        out.write(
            f"note: segment file {report.unfinished_segment} was never finished "
            "(short, only zeros: its creation was interrupted); it holds nothing "
            "and opening the store removes it\n"
        )
    if report.incomplete_tail is not None:
        out.write(
            f"note: incomplete tail at {report.incomplete_tail} (still being "
            "written); a read-only check cannot tell a record in progress from a "
            "torn one: if no broker has this store open, opening it cuts the "
            "record and keeps its bytes in rmqha/quarantine/\n"
        )
    for damage in report.damage:
        out.write(_damage_line(damage) + "\n")
    if report.ok:
        out.write(
            f"sound: {report.records} records in {report.segments} segments, "
            f"offsets {report.min_offset}..{report.end_offset}\n"
        )
        return _check_queues(args.dir, queues, out)
    if any(not d.is_tail for d in report.damage):
        out.write(
            f"{len(report.damage)} damaged stretch(es); valid records follow "
            "damage, so opening the store refuses: repair with 'rmqha store "
            f"repair {args.dir} --from REPLICA_DIR'\n"
        )
    return 1


def _check_queues(directory: str, queues: QueueCheck | None, out: IO[str]) -> int:
    """
    What C{queues} found, the log being sound: one line per finding.
    """
    if queues is None:
        out.write(
            "note: no consume queues (consumequeue/): a broker builds them "
            "when it starts on this store\n"
        )
        return 0
    findings = queues.findings
    for line in findings:
        out.write(line + "\n")
    if findings:
        out.write(
            f"{len(findings)} consume-queue finding(s); the queues are built "
            f"from the log: with no broker running, remove "
            f"{os.path.join(directory, 'consumequeue')}: the broker builds them "
            "again when it starts\n"
        )
        return 1
    out.write("consume queues: every unit matches its record\n")
    return 0


def _damage_line(damage: Damage) -> str:
    line = (
        f"bad record at offset {damage.offset} in segment {damage.segment}: "
        f"{damage.reason}; "
    )
    if damage.next_valid is not None:
        valid = (
            f" ({damage.valid_end - damage.next_valid} bytes, up to offset "
            f"{damage.valid_end})" if damage.valid_end is not None else ""
        )
        return line + f"valid records follow at offset {damage.next_valid}{valid}"
    return line + (
        "nothing valid after it (a torn tail: opening the store read-write "
        "cuts it, keeping the bytes in rmqha/quarantine/)"
    )


def _repair(args: argparse.Namespace, out: IO[str]) -> int:
    for directory in (args.dir, args.replica):
        if not os.path.isdir(directory):
            raise _CommandError(f"{directory}: no such directory")
    if os.path.samefile(args.dir, args.replica):
        raise _UsageError(
            f"rmqha store repair: error: --from {args.replica} is the store itself; "
            "name a replica's store"
        )
    report = repair_store(args.dir, args.replica, dry_run=args.dry_run)
    if not report.repairs:
        out.write(f"nothing to repair: every record in {args.dir} verifies\n")
        return 0
    for repair in report.repairs:
        damage = repair.damage
        if repair.problem is not None:
            hint = (
                "; it is a torn tail (nothing valid after it): opening the store "
                "cuts it, keeping the bytes in rmqha/quarantine/"
                if damage.is_tail else ""
            )
            out.write(
                f"cannot repair offset {damage.offset} ({damage.reason}): "
                f"{repair.problem}{hint}\n"
            )
        elif report.dry_run:
            out.write(
                f"would repair offsets {damage.offset}..{repair.end} "
                f"({damage.reason}) with {repair.records} record(s) from the replica\n"
            )
        else:
            out.write(
                f"repaired offsets {damage.offset}..{repair.end} ({damage.reason}) "
                f"with {repair.records} record(s) from the replica; the damaged "
                f"bytes are kept in {repair.quarantined}\n"
            )
    return 0 if report.ok else 1


def _dump(args: argparse.Namespace, out: IO[str]) -> int:
    with _open_read_only(args.dir) as commitlog:
        start = commitlog.min_offset if args.start is None else args.start
        if not commitlog.min_offset <= start <= commitlog.max_offset:
            raise _CommandError(
                f"--from {start} is outside the store's offsets "
                f"{commitlog.min_offset}..{commitlog.max_offset}"
            )
        count = 0
        try:
            for record in commitlog.records(start):
                if args.limit is not None and count >= args.limit:
                    break
                out.write(json.dumps(record_json(record)) + "\n")  # type: ignore[arg-type]
                count += 1
        except RecordError as e:
            if e.offset == start:
                raise _CommandError(
                    f"--from {start} is not the start of a record ({e.reason})"
                ) from None
            raise
    return 0


def fill(
    commitlog: CommitLog,
    count: int,
    body_size: int,
    topics: Sequence[str],
    queues: int = 4,
    seed: int = 0,
) -> tuple[int, int]:
    """
    Append C{count} generated messages, cycling through C{topics} and
    C{queues} queues, with bodies of C{body_size} bytes cut from a random
    pool and RocketMQ producer properties (C{UNIQ_KEY}, C{TAGS}, C{KEYS},
    C{WAIT}).

    @return: the first and the next free offset.
    """
    import random

    rng = random.Random(seed)
    pool = rng.randbytes(max(body_size * 2, 1 << 16))
    first = None
    put = commitlog.put
    queues = max(queues, 1)
    for i in range(count):
        start = rng.randrange(len(pool) - body_size + 1)
        message = Message(
            topic=topics[i % len(topics)],
            body=pool[start : start + body_size],
            queue_id=(i // len(topics)) % queues,
            properties={
                "UNIQ_KEY": f"7F0000010001{seed & 0xFFFF:04X}{i:016X}",
                "TAGS": f"Tag{i % 3}",
                "KEYS": f"key-{i}",
                "WAIT": "true",
            },
        )
        result = put(message)
        if first is None:
            first = result.offset
    return (commitlog.max_offset if first is None else first), commitlog.max_offset


def _fill(args: argparse.Namespace, out: IO[str]) -> int:
    topics = [t.strip() for t in args.topics.split(",") if t.strip()]
    if not topics:
        raise _CommandError("--topics names no topic")
    started = time.perf_counter()
    with CommitLog.open(
        args.dir, segment_size=args.segment_size, consume_queues=True
    ) as commitlog:
        first, end = fill(commitlog, args.count, args.body_size, topics, args.queues)
        commitlog.flush()
    elapsed = time.perf_counter() - started
    out.write(
        f"appended {args.count} messages ({_human(end - first)}) at offsets "
        f"{first}..{end} in {elapsed:.2f} s\n"
    )
    return 0


def _demo(args: argparse.Namespace, out: IO[str]) -> int:
    from rmqha.store._segments import MAX_SEGMENT_SIZE
    from rmqha.demo import DemoDirectoryError, run_demo

    segment = args.segment_size
    if segment is None:
        segment = 4 << 20 if args.failover else 64 << 20
    if not 64 << 10 <= segment <= MAX_SEGMENT_SIZE:
        # Checked here: inside the demo's reactor it would be a traceback.
        raise _UsageError(
            f"rmqha demo: error: --segment-size {segment} is outside "
            f"{64 << 10}..{MAX_SEGMENT_SIZE} bytes"
        )
    try:
        if args.failover:
            from rmqha.demo import run_failover_demo

            return run_failover_demo(args.dir, out, max(1, args.kills), segment)
        return run_demo(args.dir, args.count, args.live, out, segment)
    except DemoDirectoryError as e:
        raise _UsageError(f"rmqha demo: error: {e}") from None


def _human(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def main(
    argv: Sequence[str] | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
) -> int:
    """
    Run the C{rmqha} command.

    @return: the exit status.
    """
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except _UsageError as e:
        err.write(f"{e}\n")
        return 2
    except SystemExit as e:  # --help, --version
        return int(e.code or 0)
    try:
        return int(args.run(args, out))
    except _UsageError as e:  # arguments found wrong once looked at: nothing done
        err.write(f"{e}\n")
        return 2
    except (_CommandError, StoreError, MessageRejected, RecordError, ValueError) as e:
        err.write(f"rmqha: error: {e}\n")
        return 1
    except BrokenPipeError:  # (an OSError: before it) e.g. `store dump | head`
        return 0
    except OSError as e:
        err.write(f"rmqha: error: {e.filename or ''}{': ' if e.filename else ''}{e.strerror or e}\n")
        return 1
    except KeyboardInterrupt:
        err.write("rmqha: interrupted\n")
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
