"""
Tests for group authentication (issue 25, item 4; docs/failover.md, "Who
counts"): members of a failover group prove their node ids to each other,
with a shared secret (the HMAC handshake, L{rmqha.ha.auth}) or TLS client
certificates naming the ids; an unproven id is never counted, a master
that cannot prove the elected leader's id is never followed.

Expected bytes are built with C{struct}, C{zlib} and C{hmac} from the
layouts in docs/protocol.md, never with the code under test.
"""

from __future__ import annotations

import hmac
import io
import os
import struct
import zlib
from hashlib import sha256
from typing import Any

from cryptography import x509
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet import ssl
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, ensureDeferred, succeed
from twisted.internet.protocol import Factory
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import capturedLogs, formatEvent
from twisted.trial.unittest import SynchronousTestCase

from rmqha import certs
from rmqha.broker import INSECURE_GROUP_WARNING, Broker, Role
from rmqha.settings import BrokerSettings
from rmqha.cli import main
from rmqha.coord.dcs import InSync
from rmqha.ha._wire import (
    AUTH_PROOF_SIZE,
    CONTROL_PROBE,
    FEATURE_GROUP_AUTH,
    ChecksumError,
    Greeting,
    ProtocolError,
    decode_auth_challenge,
    decode_auth_hello,
    decode_auth_proof,
    decode_control_info,
    encode_auth_challenge,
    encode_auth_hello,
    encode_auth_proof,
    encode_code,
    encode_digest_request,
    encode_identify,
    encode_report,
    sniff_greeting,
)
from rmqha.ha.auth import (
    HANDSHAKE_TIMEOUT,
    AuthError,
    GroupAuth,
    MasterHandshake,
    SlaveHandshake,
    auth_mac,
    load_group_secret,
)
from rmqha.ha.control import ControlClient, probe
from rmqha.ha.epochs import EpochFile
from rmqha.ha.group import PutStatus
from rmqha.ha.master import MasterConnection, MasterFactory
from rmqha.ha.replica import Replica, ReplicaState
from rmqha.ha.slave import SlaveFactory
from rmqha.store.commitlog import CommitLog
from rmqha.testing import connect_in_memory
from rmqha.tls import PeerPolicy, TLSFiles, _VerifyingCreator, server_context

from tests._helpers import fixed_clock, make_message, open_store
from tests.test_coordinator import _Group
from tests.test_master import MasterTestCase
from tests.test_roles import SEGMENT, _InMemory

SECRET = b"0123456789abcdef0123456789abcdef"
OTHER_SECRET = b"fedcba9876543210fedcba9876543210"

#: The codes, written out from docs/protocol.md.
HELLO_CODE = -0x524D5148410009
CHALLENGE_CODE = -0x524D514841000A
PROOF_CODE = -0x524D514841000B
ACCEPTED = struct.pack(">q", -0x524D514841000C)
REFUSED = struct.pack(">q", -0x524D514841000D)
CONTROL_REFUSED = struct.pack(">q", -0x524D5148410006)


def sealed(message: bytes) -> bytes:
    return message + struct.pack(">I", zlib.crc32(message))


def hello_bytes(node_id: str, nonce: bytes) -> bytes:
    raw = node_id.encode()
    return sealed(struct.pack(">qH", HELLO_CODE, len(raw)) + raw + nonce)


def challenge_bytes(node_id: str, nonce: bytes, mac: bytes) -> bytes:
    raw = node_id.encode()
    return sealed(struct.pack(">qH", CHALLENGE_CODE, len(raw)) + raw + nonce + mac)


def reference_mac(
    secret: bytes, label: bytes, group: str, slave_nonce: bytes, master_nonce: bytes,
    slave_id: str, master_id: str,
) -> bytes:
    """
    docs/protocol.md's MAC: HMAC-SHA256 over length-prefixed fields.
    """
    fields = [b"rmqha group auth v1", label, group.encode(), slave_nonce, master_nonce,
              slave_id.encode(), master_id.encode()]
    return hmac.new(secret, b"".join(struct.pack(">H", len(f)) + f for f in fields), sha256).digest()


def auth(node_id: str, secret: bytes | None = SECRET, group: str = "g", **kw: Any) -> GroupAuth:
    return GroupAuth(group, node_id, secret, **kw)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(cuts), len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


def converse(
    master: MasterHandshake, slave: SlaveHandshake, chunks: Any = None, after: bytes = b"",
    answer: bytes = b"",
) -> None:
    """
    Run a whole handshake between the two sides, each side's bytes cut by
    C{chunks(data)} (default: whole); the slave sends C{after} right after
    its proof, the master C{answer} right after its verdict.
    """
    cut = chunks or (lambda data: [data])
    to_slave = b""
    for piece in cut(slave.hello()):
        to_slave += master.feed(piece)
    proved = False
    for piece in cut(to_slave):
        proved = slave.feed(piece) or proved
    assert proved and not slave.done
    to_slave = b""
    for piece in cut(slave.proof + after):
        if master.done:
            master.rest += piece
        else:
            to_slave += master.feed(piece)
    for piece in cut(to_slave + answer):
        if slave.done:
            slave.rest += piece
        else:
            slave.feed(piece)


class WireTests(SynchronousTestCase):
    """
    The AUTH messages, bytes in and out (docs/protocol.md).
    """

    def test_layouts(self) -> None:
        """
        Each message is the layout docs/protocol.md gives, byte for byte,
        and decodes back to its fields with its size.
        """
        nonce, other, mac = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32
        hello = hello_bytes("node-é", nonce)
        self.assertEqual(encode_auth_hello("node-é", nonce), hello)
        self.assertEqual(len(hello), 46 + len("node-é".encode()))
        found = decode_auth_hello(hello + b"more")
        assert found is not None
        self.assertEqual((found[0].node_id, found[0].nonce, found[1]), ("node-é", nonce, len(hello)))
        challenge = challenge_bytes("a", other, mac)
        self.assertEqual(encode_auth_challenge("a", other, mac), challenge)
        self.assertEqual(len(challenge), 79)
        self.assertEqual(decode_auth_challenge(challenge), (("a", other, mac), 79))
        proof = sealed(struct.pack(">q", PROOF_CODE) + mac)
        self.assertEqual(encode_auth_proof(mac), proof)
        self.assertEqual(len(proof), AUTH_PROOF_SIZE)
        self.assertEqual(decode_auth_proof(proof + b"x"), (mac, 44))
        sniffed = sniff_greeting(hello)
        self.assertEqual(sniffed, (Greeting.AUTH, HELLO_CODE))

    def test_partial_messages_wait(self) -> None:
        """
        Every proper prefix of a message decodes to nothing yet.
        """
        for message, decode in [
            (hello_bytes("a", b"\x00" * 32), decode_auth_hello),
            (challenge_bytes("bb", b"\x00" * 32, b"\x00" * 32), decode_auth_challenge),
            (encode_auth_proof(b"\x00" * 32), decode_auth_proof),
        ]:
            for cut in range(len(message)):
                self.assertIsNone(decode(message[:cut]), (decode, cut))  # type: ignore[operator]

    def test_bad_messages(self) -> None:
        """
        A flipped bit anywhere fails the CRC (or the code); an impossible
        length is refused as soon as the length is here, before waiting
        for the rest; a wrong code is refused; values that cannot be sent
        are refused at encoding.
        """
        message = hello_bytes("abc", b"\x07" * 32)
        for i in range(len(message)):
            for bit in range(8):
                damaged = bytearray(message)
                damaged[i] ^= 1 << bit
                with self.assertRaises(ProtocolError):
                    found = decode_auth_hello(damaged)
                    if found is None:  # (a longer length: waits; then fails)
                        decode_auth_hello(bytes(damaged) + b"\x00" * 300)
        flipped = bytearray(message)
        flipped[-1] ^= 1
        self.assertRaises(ChecksumError, decode_auth_hello, flipped)
        head = struct.pack(">q", HELLO_CODE)
        for length in (0, 256, 65535):
            self.assertRaises(ProtocolError, decode_auth_hello, head + struct.pack(">H", length))
        self.assertRaises(ProtocolError, decode_auth_challenge, message)
        self.assertRaises(ProtocolError, decode_auth_proof, message)
        self.assertRaises(ValueError, encode_auth_hello, "a", b"short")
        self.assertRaises(ValueError, encode_auth_hello, "", b"\x00" * 32)
        self.assertRaises(ValueError, encode_auth_challenge, "a\nb", b"\x00" * 32, b"\x00" * 32)
        self.assertRaises(ValueError, encode_auth_proof, b"\x00" * 31)

    def test_mac(self) -> None:
        """
        The MAC is docs/protocol.md's: HMAC-SHA256 of the length-prefixed
        protocol name, label, group, nonces and ids.
        """
        args = ("g", b"\x01" * 32, b"\x02" * 32, "b", "a")
        self.assertEqual(
            auth_mac(SECRET, b"master", *args), reference_mac(SECRET, b"master", *args)
        )
        self.assertNotEqual(auth_mac(SECRET, b"master", *args), auth_mac(SECRET, b"slave", *args))


    def test_documented_example(self) -> None:
        """
        docs/protocol.md's worked example, byte for byte.
        """
        master = MasterHandshake(auth("a"), nonce=b"\x22" * 32)
        slave = SlaveHandshake(auth("b"), nonce=b"\x11" * 32)
        self.assertEqual(
            slave.hello().hex(),
            "ffadb2aeb7befff7000162" + "11" * 32 + "dfd86780",
        )
        challenge = master.feed(slave.hello())
        self.assertEqual(
            challenge.hex(),
            "ffadb2aeb7befff6000161" + "22" * 32
            + "e9db4c821e6e9bca49e5620b39006825e97fa30b83bbdbfd22e51f0ab4b9b016" + "1d4b4900",
        )
        slave.feed(challenge)
        self.assertEqual(
            slave.proof.hex(),
            "ffadb2aeb7befff5"
            "35fc657f5bb2b5bb5585718460fe64930fee1ef198c3e2b2980e77af56c377c0116a2b50",
        )
        self.assertEqual((ACCEPTED.hex(), REFUSED.hex()), ("ffadb2aeb7befff4", "ffadb2aeb7befff3"))


class HandshakeTests(SynchronousTestCase):
    """
    L{MasterHandshake} and L{SlaveHandshake}, sans I/O.
    """

    def test_both_prove_their_ids(self) -> None:
        """
        The master learns the slave's proven id, the slave the master's;
        what each side sent after the handshake comes out as C{rest}; the
        messages are the documented ones, the MACs the reference MACs.
        """
        s_nonce, m_nonce = b"\x11" * 32, b"\x22" * 32
        master = MasterHandshake(auth("a"), nonce=m_nonce)
        slave = SlaveHandshake(auth("b"), expected_master="a", nonce=s_nonce)
        self.assertEqual(slave.hello(), hello_bytes("b", s_nonce))
        challenge = master.feed(slave.hello())
        self.assertEqual(
            challenge,
            challenge_bytes("a", m_nonce, reference_mac(SECRET, b"master", "g", s_nonce, m_nonce, "b", "a")),
        )
        self.assertTrue(slave.feed(challenge))
        self.assertEqual(
            slave.proof,
            sealed(struct.pack(">q", PROOF_CODE)
                   + reference_mac(SECRET, b"slave", "g", s_nonce, m_nonce, "b", "a")),
        )
        self.assertEqual(master.feed(slave.proof + b"PROBE"), ACCEPTED)
        self.assertEqual((master.done, master.slave_id, master.rest), (True, "b", b"PROBE"))
        slave.feed(ACCEPTED + b"INFO")
        self.assertEqual((slave.done, slave.master_id, slave.rest), (True, "a", b"INFO"))

    @settings(deadline=None, derandomize=True, max_examples=150)
    @given(data=st.data())
    def test_random_chunkings(self, data: st.DataObject) -> None:
        """
        Bytes cut anywhere (one at a time, or at random) give the same
        outcome as whole messages.
        """
        cuts = data.draw(st.lists(st.integers(0, 400), max_size=12))
        one_byte = data.draw(st.booleans())

        def chunks(payload: bytes) -> list[bytes]:
            if one_byte:
                return [payload[i : i + 1] for i in range(len(payload))]
            return split(payload, [c for c in cuts if c <= len(payload)])

        node = data.draw(st.from_regex(r"[a-z0-9é._-]{1,40}", fullmatch=True))
        master = MasterHandshake(auth("m" + node))
        slave = SlaveHandshake(auth("s" + node))
        converse(master, slave, chunks, after=b"report!", answer=b"info!")
        self.assertEqual((master.slave_id, slave.master_id), ("s" + node, "m" + node))
        self.assertEqual((master.rest, slave.rest), (b"report!", b"info!"))

    @settings(deadline=None, derandomize=True, max_examples=300)
    @given(stream=st.binary(max_size=600), cuts=st.lists(st.integers(0, 600), max_size=10))
    def test_random_bytes_to_the_master(self, stream: bytes, cuts: list[int]) -> None:
        """
        Random bytes after a valid hello head, in random chunkings: the
        master either waits (holding at most one message) or refuses with
        a L{ProtocolError}; it never accepts, never raises anything else.
        """
        master = MasterHandshake(auth("a"))
        data = struct.pack(">q", HELLO_CODE) + stream
        try:
            for piece in split(data, [c for c in cuts if c <= len(data)]):
                master.feed(piece)
                self.assertLessEqual(len(master._buffer), 301 + len(piece))
        except ProtocolError:
            pass
        self.assertFalse(master.done)

    def test_wrong_secret_or_group(self) -> None:
        """
        A slave with another secret, or of another group, cannot prove its
        id; a master with another secret cannot prove its own: each side
        refuses the other with one line saying why.
        """
        for slave_auth in (auth("b", OTHER_SECRET), auth("b", group="h")):
            master = MasterHandshake(auth("a"))
            slave = SlaveHandshake(slave_auth)
            challenge = master.feed(slave.hello())
            e = self.assertRaises(AuthError, slave.feed, challenge)
            self.assertIn("cannot prove it is a member of group", str(e))
            # Had the slave answered anyway (it does not), its proof fails.
            forged = encode_auth_proof(
                auth_mac(slave_auth.secret, b"slave", slave_auth.group, slave._nonce,  # type: ignore[arg-type]
                         decode_auth_challenge(challenge)[0][1], "b", "a")  # type: ignore[index]
            )
            e = self.assertRaises(AuthError, master.feed, forged)
            self.assertIn("the proof of node b does not hold", str(e))
            self.assertNotIn("\n", str(e))

    def test_replayed_messages_fail(self) -> None:
        """
        A recorded conversation replayed gets nowhere: the slave's hello
        and proof against a new master (which draws a fresh nonce), the
        master's challenge against a new slave, and the master's own MAC
        sent back as a slave's proof (the labels differ).
        """
        master = MasterHandshake(auth("a"))
        slave = SlaveHandshake(auth("b"))
        recorded_hello = slave.hello()
        recorded_challenge = master.feed(recorded_hello)
        slave.feed(recorded_challenge)
        recorded_proof = slave.proof
        master.feed(recorded_proof)
        self.assertTrue(master.done)

        again = MasterHandshake(auth("a"))
        again.feed(recorded_hello)
        self.assertRaises(AuthError, again.feed, recorded_proof)

        fresh = SlaveHandshake(auth("b"))
        fresh.hello()
        self.assertRaises(AuthError, fresh.feed, recorded_challenge)

        reflected = MasterHandshake(auth("a"))
        challenge = reflected.feed(slave.hello())
        mac = decode_auth_challenge(challenge)[0].mac  # type: ignore[index]
        self.assertRaises(AuthError, reflected.feed, encode_auth_proof(mac))

    def test_identities_checked(self) -> None:
        """
        A master proving another node than the expected leader is not
        followed; neither side takes a peer claiming its own id.
        """
        master = MasterHandshake(auth("b"))
        slave = SlaveHandshake(auth("c"), expected_master="a")
        e = self.assertRaises(AuthError, slave.feed, master.feed(slave.hello()))
        self.assertIn("proved it is node b, not a, the elected leader: not followed", str(e))
        e = self.assertRaises(AuthError, MasterHandshake(auth("a")).feed, SlaveHandshake(auth("a")).hello())
        self.assertIn("own id a", str(e))

    def test_refusals_are_told_apart(self) -> None:
        """
        The slave says whether the master refused it, takes no group
        authentication at all, or answered something else.
        """
        for answer, needle in [
            (REFUSED, "refused this node's hello"),
            (CONTROL_REFUSED, "does not take group authentication"),
            (b"\x00" * 8, "not AUTH_CHALLENGE"),
        ]:
            slave = SlaveHandshake(auth("b"))
            e = self.assertRaises(AuthError, slave.feed, answer)
            self.assertIn(needle, str(e))
        master = MasterHandshake(auth("a"))
        slave = SlaveHandshake(auth("b"))
        slave.feed(master.feed(slave.hello()))
        e = self.assertRaises(AuthError, slave.feed, REFUSED)
        self.assertIn("refused this node's proof", str(e))


class SecretFileTests(SynchronousTestCase):
    """
    L{load_group_secret}: one line naming the option and the file.
    """

    def write(self, data: bytes, mode: int = 0o600) -> str:
        path = self.mktemp()
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, mode)
        return path

    def test_reads_and_strips(self) -> None:
        """
        The secret is the file's bytes, a trailing newline stripped; a
        group-readable file is allowed.
        """
        self.assertEqual(load_group_secret(self.write(SECRET + b"\n")), SECRET)
        self.assertEqual(load_group_secret(self.write(SECRET, 0o640)), SECRET)

    def test_refusals(self) -> None:
        """
        Readable or writable by others, too short, too long, not a regular
        file, missing: refused, naming where the path came from.
        """
        cases = [
            (self.write(SECRET, 0o644), "readable or writable by others (mode 0644); chmod 600"),
            (self.write(SECRET, 0o602), "readable or writable by others"),
            (self.write(b"short\n"), "5 bytes of secret; it must hold 16 to 1024"),
            (self.write(b"x" * 1025), "1025 bytes of secret"),
            (self.write(b"x" * 5000), "larger than 4096 bytes"),
            (os.path.dirname(self.write(SECRET)), "not a regular file"),
            (self.mktemp(), "No such file or directory"),
        ]
        for path, needle in cases:
            e = self.assertRaises(ValueError, load_group_secret, path, "groupSecretFile in b.conf")
            self.assertIn(needle, str(e))
            self.assertTrue(str(e).startswith(f"groupSecretFile in b.conf {path}: "), str(e))
            self.assertNotIn("\n", str(e))

    def test_group_auth_settings(self) -> None:
        """
        A L{GroupAuth} needs a secret or certificates, and a usable id; its
        repr never shows the secret.
        """
        self.assertRaises(ValueError, GroupAuth, "g", "a")
        self.assertRaises(ValueError, GroupAuth, "g", "a", b"short")
        self.assertRaises(ValueError, GroupAuth, "g", "", SECRET)
        self.assertNotIn(SECRET.decode(), repr(auth("a")))
        self.assertEqual(auth("a").mode, "group secret")
        self.assertEqual(auth("a", certificates=True).mode, "group secret and TLS client certificates")
        self.assertEqual(auth("a", None, certificates=True).mode, "TLS client certificates")


def master_side(handshake: SlaveHandshake, connection: MasterConnection, transport: StringTransport) -> bytes:
    """
    Let C{handshake} (the slave's side) authenticate to C{connection}; the
    bytes the master wrote.
    """
    connection.dataReceived(handshake.hello())
    challenge = transport.value()
    transport.clear()
    handshake.feed(challenge)
    return challenge


class MasterConnectionTests(MasterTestCase):
    """
    The master's side on a L{StringTransport}: who proves what, and what
    the refused get.
    """

    def auth_factory(self, node: str = "a", **kw: Any) -> MasterFactory:
        factory = MasterFactory(self.store, self.clock, auth=auth(node, **kw))
        self.addCleanup(factory.stopFactory)
        return factory

    def test_authenticated_slave_replicates(self) -> None:
        """
        The handshake, then the first report: the slave is node b, proven;
        the log flows after the master's AUTH_ACCEPTED; the status says
        so; no timer is left.
        """
        self.fill(3)
        factory = self.auth_factory()
        connection, transport = self.connect(factory)
        slave = SlaveHandshake(auth("b"), expected_master="a")
        master_side(slave, connection, transport)
        # One byte at a time: the greeting after the proof is sniffed anew.
        for byte in slave.proof + encode_report(0):
            connection.dataReceived(bytes([byte]))
        self.assertTrue(transport.value().startswith(ACCEPTED))
        self.assertGreater(len(transport.value()), 8)
        self.assertEqual(connection.failover_node, "b")
        self.assertEqual(connection.replica, "node b")
        (status,) = factory.slaves()
        self.assertEqual((status.replica_id, status.authenticated), ("b", True))
        # (The handshake's own timer is gone: past it, still connected.)
        self.clock.advance(HANDSHAKE_TIMEOUT + 1)
        self.assertFalse(transport.disconnecting)

    def test_forged_identify_never_counts(self) -> None:
        """
        On a master requiring the group secret, IDENTIFY with a member's id
        (unauthenticated) may copy the log, but is never the node it
        claims, and does not replace that node's proven connection; one
        line says so.  (With --insecure-group it is the node: the attack.)
        """
        self.fill(3)
        factory = self.auth_factory()
        real, _ = self.connect(factory, 40001)
        slave = SlaveHandshake(auth("b"))
        master_side(slave, real, _)
        real.dataReceived(slave.proof + encode_report(0))
        forged, forged_transport = self.connect(factory, 40002)
        forged.dataReceived(encode_identify("b") + encode_report(0))
        self.assertTrue(forged.replicating)
        self.assertGreater(len(forged_transport.value()), 0)
        self.assertFalse(_.disconnecting)
        self.assertEqual((real.failover_node, forged.failover_node), ("b", None))
        self.assertEqual(forged.replica, "declared id b")

        class _HA:
            in_sync = object()
            acked: list[tuple[str, int]] = []

            def accepts_node(self, node: str, host: str) -> bool:
                return True

            def replica_acked(self, node: str, ack: int) -> None:
                self.acked.append((node, ack))

            def acks_changed(self) -> None:
                pass

            def release(self) -> None:
                pass

            def replica_gone(self, node: str) -> None:
                pass

        ha = _HA()
        factory.ha = ha  # type: ignore[assignment]
        self.addCleanup(setattr, factory, "ha", None)
        with capturedLogs() as events:
            forged.dataReceived(encode_report(self.store.max_offset))
            forged.dataReceived(encode_report(self.store.max_offset))
        self.assertEqual(factory.replicas.node_acks(), {"b": 0})
        self.assertEqual(ha.acked, [])
        lines = [formatEvent(e) for e in events]
        self.assertEqual(
            lines,
            ["slave 127.0.0.1:40002 declares node id b without proving it (group secret "
             "required): it may copy the log, but its acks never count"],
        )
        insecure = MasterFactory(self.store, self.clock)
        self.addCleanup(insecure.stopFactory)
        naive, _ = self.connect(insecure, 40003)
        naive.dataReceived(encode_identify("b") + encode_report(0))
        self.assertEqual(naive.failover_node, "b")

    def test_wrong_secret_dropped_with_one_line(self) -> None:
        """
        A slave whose proof fails is dropped: AUTH_REFUSED after the
        challenge, nothing of the log, one warning naming the peer and
        why.
        """
        self.fill(3)
        factory = self.auth_factory()
        connection, transport = self.connect(factory)
        slave = SlaveHandshake(auth("b", OTHER_SECRET))
        connection.dataReceived(slave.hello())
        transport.clear()
        bogus = encode_auth_proof(b"\x00" * 32)
        with capturedLogs() as events:
            connection.dataReceived(bogus + encode_report(0))
        self.assertEqual(transport.value(), REFUSED)
        self.assertTrue(transport.disconnecting)
        self.assertEqual(
            [formatEvent(e) for e in events],
            ["dropping slave 127.0.0.1:40000: group authentication failed: the proof of node b "
             "does not hold (another group secret or group name, or a replayed message)"],
        )
        self.assertIsNone(connection.failover_node)

    def test_replayed_handshake_dropped(self) -> None:
        """
        A hello and proof recorded from a good connection, replayed on a
        new one, fail (the master's nonce is new).
        """
        self.fill(1)
        factory = self.auth_factory()
        good, good_transport = self.connect(factory, 40001)
        slave = SlaveHandshake(auth("b"))
        master_side(slave, good, good_transport)
        recorded = slave.hello() + slave.proof + encode_report(0)
        good.dataReceived(slave.proof + encode_report(0))
        self.assertTrue(good.authenticated)
        replay, replay_transport = self.connect(factory, 40002)
        replay.dataReceived(recorded)
        self.assertTrue(replay_transport.value().endswith(REFUSED))
        self.assertTrue(replay_transport.disconnecting)
        self.assertFalse(replay.authenticated)

    def test_handshake_times_out(self) -> None:
        """
        A peer that starts the handshake and stops is dropped after
        L{HANDSHAKE_TIMEOUT} on the clock, with one line.
        """
        factory = self.auth_factory()
        connection, transport = self.connect(factory)
        connection.dataReceived(SlaveHandshake(auth("b")).hello()[:20])
        with capturedLogs() as events:
            self.clock.advance(HANDSHAKE_TIMEOUT)
        self.assertTrue(transport.disconnecting)
        self.assertEqual(
            [formatEvent(e) for e in events],
            ["dropping slave 127.0.0.1:40000: group authentication failed: not finished within "
             "5 s (declared node id: none yet)"],
        )

    def test_slave_gives_up_during_the_handshake(self) -> None:
        """
        A slave that closes the connection after its hello (one with
        another secret gives up at the challenge) leaves one warning
        naming the node id it declared, and no timer.
        """
        factory = self.auth_factory()
        connection, transport = self.connect(factory)
        connection.dataReceived(SlaveHandshake(auth("b")).hello())
        with capturedLogs() as events:
            connection.connectionLost()
        self.assertEqual(
            [formatEvent(e) for e in events],
            ["slave 127.0.0.1:40000 closed the connection during group authentication "
             "(declared node id: b): another group secret or group name?"],
        )
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_handshake_only_first(self) -> None:
        """
        AUTH_HELLO after the handshake, or after an IDENTIFY: CONTROL_REFUSED
        and a line saying it is taken only first on a connection.
        """
        factory = self.auth_factory()
        proven, proven_transport = self.connect(factory, 40001)
        slave = SlaveHandshake(auth("b"))
        master_side(slave, proven, proven_transport)
        proven.dataReceived(slave.proof)
        self.assertTrue(proven.authenticated)
        declared, declared_transport = self.connect(factory, 40002)
        declared.dataReceived(encode_identify("c"))
        for connection, transport in [(proven, proven_transport), (declared, declared_transport)]:
            transport.clear()
            with capturedLogs() as events:
                connection.dataReceived(SlaveHandshake(auth("c")).hello())
            self.assertEqual(transport.value(), CONTROL_REFUSED)
            self.assertTrue(transport.disconnecting)
            self.assertIn("takes only first on a connection", formatEvent(events[0]))

    def test_master_without_secret(self) -> None:
        """
        AUTH_HELLO to a master without the group secret: CONTROL_REFUSED
        (the slave then says "takes no group authentication") and a line.
        """
        factory = self.factory()
        connection, transport = self.connect(factory)
        with capturedLogs() as events:
            connection.dataReceived(SlaveHandshake(auth("b")).hello())
        self.assertEqual(transport.value(), CONTROL_REFUSED)
        self.assertIn("has no group secret for", formatEvent(events[0]))
        e = self.assertRaises(AuthError, SlaveHandshake(auth("b")).feed, transport.value())
        self.assertIn("does not take group authentication", str(e))

    def test_control_requests_need_the_handshake(self) -> None:
        """
        A probe without the handshake gets INFO, whose FEATURE_GROUP_AUTH
        says why; its first request closes the session.  After the
        handshake the same request is answered.
        """
        self.fill(3)
        factory = self.auth_factory()
        connection, transport = self.connect(factory, 40001)
        connection.dataReceived(encode_code(CONTROL_PROBE))
        info = decode_control_info(transport.value())
        self.assertTrue(info[3] & FEATURE_GROUP_AUTH)
        transport.clear()
        with capturedLogs() as events:
            connection.dataReceived(encode_digest_request(0, 100))
        self.assertEqual(transport.value(), b"")
        self.assertTrue(transport.disconnecting)
        self.assertIn("did not prove its node id", formatEvent(events[0]))
        connection.connectionLost()

        trusted, trusted_transport = self.connect(factory, 40002)
        slave = SlaveHandshake(auth("b"))
        master_side(slave, trusted, trusted_transport)
        trusted.dataReceived(slave.proof + encode_code(CONTROL_PROBE))
        trusted.dataReceived(encode_digest_request(0, 100))
        answer = trusted_transport.value()
        self.assertTrue(answer.startswith(ACCEPTED))
        self.assertEqual(len(answer), 8 + 36 + 44)
        self.assertFalse(trusted_transport.disconnecting)
        trusted.connectionLost()

    def test_second_identity_refused(self) -> None:
        """
        After the handshake, an IDENTIFY or a second AUTH_HELLO is refused.
        """
        factory = self.auth_factory()
        for extra in (encode_identify("c"), SlaveHandshake(auth("c")).hello()):
            connection, transport = self.connect(factory)
            slave = SlaveHandshake(auth("b"))
            master_side(slave, connection, transport)
            connection.dataReceived(slave.proof + extra)
            self.assertTrue(transport.disconnecting)
            connection.connectionLost()


class SlaveConnectionTests(SynchronousTestCase):
    """
    The slave's replication connection (L{rmqha.ha.slave}) with a group
    secret, against masters in memory.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.source = open_store(self, segment_size=4096)
        self.replica = open_store(self, segment_size=4096)
        for _ in range(5):
            self.source.put(make_message(b"r" * 200))

    def converse(
        self, master_auth: GroupAuth | None, expected: str | None = "a"
    ) -> tuple[MasterFactory, SlaveFactory, list[str]]:
        master = MasterFactory(self.source, self.clock, auth=master_auth)
        slave = SlaveFactory(self.replica, self.clock)
        slave.auth = auth("b")
        slave.expected_master = expected
        with capturedLogs() as events:
            connection = connect_in_memory(master, slave, self.clock)
            connection.slave.send_report()
            connection.flush()
        self.addCleanup(connection.hang_up)
        self.last = connection
        return master, slave, [formatEvent(e) for e in events]

    def test_replicates_after_the_handshake(self) -> None:
        """
        Both ends proven: the log is replicated byte for byte, and the
        slave knows the master's proven id.
        """
        master, slave, _ = self.converse(auth("a"))
        self.assertEqual(self.replica.max_offset, self.source.max_offset)
        self.assertEqual(self.last.slave.master_id, "a")
        self.assertEqual([s.replica_id for s in master.slaves()], ["b"])
        self.last.hang_up()
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_impostor_master_not_followed(self) -> None:
        """
        A master proving another node than the leader, or not proving it
        is a member at all, or taking no authentication: the slave drops
        it with one line, writes nothing, and counts it a fruitless
        connection (back-off, check again).
        """
        for master_auth, needle in [
            (auth("x"), "proved it is node x, not a, the elected leader"),
            (auth("a", OTHER_SECRET), "cannot prove it is a member of group g"),
            (None, "does not take group authentication"),
        ]:
            master, slave, lines = self.converse(master_auth)
            self.assertEqual(self.replica.max_offset, 0, needle)
            self.assertEqual(slave.fruitless_connections, 1)
            drops = [line for line in lines if "dropping the connection to the master" in line]
            self.assertEqual(len(drops), 1, lines)
            self.assertIn(needle, drops[0])
            self.last.hang_up()


    def test_master_silent_during_the_handshake(self) -> None:
        """
        A master that never answers the hello: the slave drops it after
        L{HANDSHAKE_TIMEOUT} on the clock, with one line, having sent
        nothing but the hello.
        """
        slave = SlaveFactory(self.replica, self.clock)
        slave.auth = auth("b")
        connection = slave.buildProtocol(None)
        transport = StringTransport()
        connection.makeConnection(transport)
        connection.send_report()
        self.assertEqual(decode_auth_hello(transport.value())[0].node_id, "b")  # type: ignore[index]
        sent = transport.value()
        with capturedLogs() as events:
            self.clock.advance(HANDSHAKE_TIMEOUT)
        self.assertTrue(transport.disconnecting)
        self.assertEqual(transport.value(), sent)
        self.assertEqual(
            [formatEvent(e) for e in events],
            ["dropping the connection to the master: group authentication failed: the master "
             "did not finish it within 5 s"],
        )
        connection.connectionLost()
        self.assertEqual(self.clock.getDelayedCalls(), [])


class TLSIdentityTests(SynchronousTestCase):
    """
    Group authentication by TLS client certificates, with what
    C{rmqha certs init --group} writes.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.directory = self.mktemp()
        self.set = certs.init_group(self.directory, "g", ["a", "b", "c"])
        self.source = open_store(self, segment_size=4096)
        for _ in range(3):
            self.source.put(make_message(b"t" * 200))

    def files(self, node: str) -> TLSFiles:
        cert, key = self.set.nodes[node]
        return TLSFiles(cert, key, self.set.ca)

    def connect(self, master_node: str, slave_node: str, server_name: str, slave_factory: Any) -> Any:
        policy = PeerPolicy(require_client_cert=True)
        factory = MasterFactory(
            self.source, self.clock, peer_policy=policy, auth=GroupAuth("g", master_node, certificates=True)
        )
        key, cert, _ = self.files(slave_node).key_pair()
        creator = _VerifyingCreator(
            ssl.optionsForClientTLS(
                server_name,
                trustRoot=self.files(slave_node).trust_root(),
                extraCertificateOptions={"privateKey": key, "certificate": cert},
            ),
            server_name,
        )
        connection = connect_in_memory(
            factory, slave_factory, self.clock,
            master_tls=server_context(self.files(master_node), policy), slave_tls=creator,
        )
        self.addCleanup(self._hang_up, connection)
        return factory, connection

    def _hang_up(self, connection: Any) -> None:
        connection.hang_up()
        for call in self.clock.getDelayedCalls():
            call.cancel()

    def test_certificate_must_name_the_declared_id(self) -> None:
        """
        A slave whose certificate names b and which declares b is node b;
        one declaring b with c's certificate is no node.
        """
        for slave_node, expected in (("b", "b"), ("c", None)):
            replica = open_store(self, segment_size=4096)
            slave = SlaveFactory(replica, self.clock)
            slave.identity = "b"
            factory, connection = self.connect("a", slave_node, "a", slave)
            connection.slave.send_report()
            connection.flush()
            (only,) = factory.connections
            self.assertEqual(only.failover_node, expected, slave_node)
            self.assertEqual(replica.max_offset, self.source.max_offset)

    def test_probe_proves_the_certificate_names(self) -> None:
        """
        The probe's INFO carries the names the master's verified
        certificate proves (here dialled by a loopback address, which every
        group certificate also names).
        """
        results: list[Any] = []
        client = ControlClient(self.clock, auth=GroupAuth("g", "c", certificates=True))
        factory, connection = self.connect("b", "c", "127.0.0.1", Factory.forProtocol(lambda: client))
        client.info.addCallback(results.append)
        connection.flush()
        (info,) = results
        self.assertEqual(info.node_ids, frozenset({"b"}))


class ProbeTests(SynchronousTestCase):
    """
    L{probe} with a group secret: the handshake, then PROBE and INFO.
    """

    def test_probe_proves_the_master(self) -> None:
        """
        A probe authenticates first; its INFO carries the master's proven
        id; a master proving another id fails the probe with AuthFailed.
        """
        from rmqha.ha.control import AuthFailed

        clock = Clock()
        store = open_store(self, segment_size=4096)
        for master_node, expected, outcome in (("a", "a", "a"), ("x", "a", AuthFailed)):
            master = MasterFactory(store, clock, auth=auth(master_node))
            connections: list[Any] = []

            class _Endpoint:
                def connect(self, factory: Any) -> Deferred[Any]:
                    c = connect_in_memory(master, factory, clock)
                    connections.append(c)
                    return succeed(c.slave)

            d = ensureDeferred(probe(clock, _Endpoint(), 3.0, auth=auth("b"), expected_master=expected))  # type: ignore[arg-type]
            connections[0].flush()
            if outcome is AuthFailed:
                f = self.failureResultOf(d, AuthFailed)
                self.assertIn("proved it is node x, not a", f.getErrorMessage())
            else:
                _client, info = self.successResultOf(d)
                self.assertEqual(info.node_ids, frozenset({"a"}))
            connections[0].hang_up()
            for call in clock.getDelayedCalls():
                call.cancel()


class NotMasterProbeTests(SynchronousTestCase):
    def test_authenticated_probe_told_not_the_master(self) -> None:
        """
        A slave with the group secret opens with AUTH_HELLO; a failover
        node's held HA port that is not the master answers NOT_MASTER with
        why (docs/protocol.md): the probe fails with NotTheMaster and that
        reason, not with an authentication error.
        """
        from rmqha.ha.control import NotTheMaster
        from rmqha.ha.haport import HAGate

        clock = Clock()
        gate = HAGate(clock, lambda: "this node is not the master: it stands by")
        connections: list[Any] = []

        class _Endpoint:
            def connect(self, factory: Any) -> Deferred[Any]:
                c = connect_in_memory(gate, factory, clock)
                connections.append(c)
                return succeed(c.slave)

        d = ensureDeferred(probe(clock, _Endpoint(), 3.0, auth=auth("b"), expected_master="a"))  # type: ignore[arg-type]
        connections[0].flush()
        f = self.failureResultOf(d, NotTheMaster)
        self.assertEqual(f.getErrorMessage(), "this node is not the master: it stands by")
        connections[0].hang_up()
        for call in clock.getDelayedCalls():
            call.cancel()


class _AuthGroup(_Group):
    """
    The coordinator tests' in-memory group, authenticated by the secret.
    """

    secret: bytes | None = SECRET

    def group_auth(self, node_id: str) -> GroupAuth | None:
        return auth(node_id, self.secret) if self.secret is not None else None


class ForgedAckTests(_AuthGroup):
    """
    Issue 25, item 4: a stranger on the HA port declaring a member's id and
    acknowledging bytes it does not hold.
    """

    def forge(self) -> tuple[Deferred[Any], MasterConnection]:
        """
        Three nodes; c's link stalls; a stranger declares c and acks the
        master's max offset after a put: the put's result (so far).
        """
        for name in "abc":
            self.node(name)
        self.elapse(2)
        master = self.master()
        assert master is not None and master.id == "a"
        factory = master.broker.master_factory
        assert factory is not None
        link = next(c for c in factory.connections if c.failover_node == "c")
        stalled = next(p for e in self.endpoints for p in e.pumps if p.server is link)
        stalled.pump = lambda *a, **k: False  # type: ignore[method-assign]
        forger = factory.buildProtocol(IPv4Address("TCP", "10.6.6.6", 40666))
        forger.makeConnection(StringTransport())
        self.addCleanup(forger.connectionLost)
        forger.dataReceived(
            encode_identify("c") + encode_report(master.broker.commitlog.max_offset)
        )
        d = self.put(master.broker)
        forger.dataReceived(encode_report(master.broker.commitlog.max_offset))
        self.elapse(0.5)
        return d, forger

    def test_forged_ack_never_counts(self) -> None:
        """
        With the group secret the stranger's acks never count: the put
        waits for the real c (until c leaves the in-sync set), and the
        stranger is no node.
        """
        d, forger = self.forge()
        self.assertIsNone(forger.failover_node)
        self.assertNoResult(d)
        self.elapse(1.0)
        self.assertEqual(self.successResultOf(d).status, PutStatus.PUT_OK)
        published = self.successResultOf(self.nodes["a"].dcs.load()).in_sync
        self.assertEqual(published, InSync(1, ("a", "b")))


class InsecureForgedAckTests(ForgedAckTests):
    """
    The same stranger in a group run with --insecure-group: its acks count
    as c's (what --insecure-group gives up; docs/failover.md).
    """

    secret = None

    def test_forged_ack_never_counts(self) -> None:
        """
        (The attack: the put is PUT_OK at once though c holds none of it.)
        """
        d, forger = self.forge()
        self.assertEqual(forger.failover_node, "c")
        self.assertEqual(self.successResultOf(d).status, PutStatus.PUT_OK)
        c = self.nodes["c"].broker.commitlog
        self.assertLess(c.max_offset, self.nodes["a"].broker.commitlog.max_offset)


class AuthGroupTests(_AuthGroup):
    def test_elect_replicate_and_status(self) -> None:
        """
        An authenticated group elects, every slave proves its id, puts are
        PUT_OK; /status says how ids are proven and that each slave is
        authenticated; no insecure warning is logged.
        """
        from rmqha.admin import status

        with capturedLogs() as events:
            for name in "abc":
                self.node(name)
            self.elapse(2)
        master = self.master()
        assert master is not None
        d = self.put(master.broker)
        self.elapse(0.5)
        self.assertEqual(self.successResultOf(d).status, PutStatus.PUT_OK)
        shown = status(master.broker, master.coordinator)
        self.assertEqual(shown["failover"]["auth"], "group secret")
        self.assertEqual(
            sorted((s["replica_id"], s["authenticated"]) for s in shown["slaves"]),
            [("b", True), ("c", True)],
        )
        self.assertNotIn(INSECURE_GROUP_WARNING, [formatEvent(e) for e in events])

    def test_slave_with_wrong_secret_not_counted(self) -> None:
        """
        A node started with another secret is dropped by the master on
        every attempt (never counted, never replicating) and says why.
        """
        self.node("a")
        self.node("b")
        self.elapse(2)
        self.secret = OTHER_SECRET
        with capturedLogs() as events:
            c = self.node("c")
            self.elapse(2)
        master = self.master()
        assert master is not None and master.id == "a"
        self.assertEqual(master.coordinator.in_sync.effective, {"a", "b"})  # type: ignore[union-attr]
        self.assertEqual(c.broker.commitlog.max_offset, 0)
        self.assertIn("cannot prove it is a member of group g", c.broker.problem or "")
        lines = [formatEvent(e) for e in events]
        self.assertIn(
            "slave 127.0.0.1:40000 closed the connection during group authentication "
            "(declared node id: c): another group secret or group name?",
            lines,
        )


class InsecureWarningTests(_Group):
    def test_insecure_group_warns_and_shows(self) -> None:
        """
        A coordinated broker without group authentication warns at start,
        and /status says "none".
        """
        from rmqha.admin import status

        with capturedLogs() as events:
            node = self.node("a")
        self.assertIn(INSECURE_GROUP_WARNING, [formatEvent(e) for e in events])
        self.assertEqual(
            status(node.broker, node.coordinator)["failover"]["auth"], "none (--insecure-group)"
        )


class ExpectedLeaderTests(_InMemory):
    """
    A failover slave follows only a master that proves the node id the
    coordinator names as leader (L{Replica.expected_leader}).
    """

    def node(self, node_id: str, role: Role, secret: bytes = SECRET) -> Broker:
        store = self.mktemp()
        broker = Broker(
            # (A coordinated slave: its settings' role is the one it takes
            # once elected.)
            BrokerSettings(
                role=role if role.is_master else Role.MASTER,
                ha_listen="tcp:0",
                scrub_rate=0,
                node_id=node_id,
            ),
            reactor=self.clock,
            open_commitlog=lambda: CommitLog.open(store, segment_size=SEGMENT, clock=fixed_clock),
            run_in_thread=lambda f: succeed(f()),
            retry_policy=lambda attempt: 1.0,
            fd_limit=lambda: 4096,
            coordinated=role is Role.SLAVE,
            epochs=EpochFile(store),
            group_auth=auth(node_id, secret),
        )
        broker.startService()
        self.addCleanup(self.stop, broker)
        return broker

    def test_only_the_expected_leader_is_followed(self) -> None:
        """
        Pointed at a master proving b while the leader is a: refused, with
        the problem in one line, nothing replicated.  A squatter with
        another secret: refused.  Pointed at the leader itself: replicates.
        """
        b = self.node("b", Role.MASTER)
        self.switch(b.become_master(Role.MASTER, epoch=1))  # (the leader's epoch)
        squatter = self.node("a", Role.MASTER, OTHER_SECRET)
        self.put(b)
        c = self.node("c", Role.SLAVE)
        for master, needle in [
            (b, "proved it is node b, not a, the elected leader: not followed"),
            (squatter, "cannot prove it is a member of group g"),
        ]:
            self.switch(c.become_slave(self.endpoint(master), leader=("a", 1)))  # type: ignore[arg-type]
            self.settle()
            replica = c.role_service
            assert isinstance(replica, Replica)
            self.assertIs(replica.state, ReplicaState.BACKING_OFF)
            self.assertIn(needle, replica.problem or "")
            self.assertEqual(c.commitlog.max_offset, 0)
        self.switch(c.become_slave(self.endpoint(b), leader=("b", 1)))  # type: ignore[arg-type]
        self.settle()
        replica = c.role_service
        assert isinstance(replica, Replica)
        self.assertIs(replica.state, ReplicaState.REPLICATING)
        self.assertEqual(c.commitlog.max_offset, b.commitlog.max_offset)
        self.assertIsNone(replica.problem)


    def test_certificate_names_checked_against_the_leader(self) -> None:
        """
        With TLS client certificates (no secret), what the probe's INFO
        says the master's certificate proves is checked against the
        leader: another node's names, or none, are refused in one line.
        """
        from rmqha.ha.control import MasterInfo
        from rmqha.ha.mastercheck import Refused

        replica = Replica(
            self.clock, None, "tcp:host=127.0.0.1:port=1",  # type: ignore[arg-type]
            auth=GroupAuth("g", "c", certificates=True), expected_leader=("a", 3),
        )
        for names, needle in [
            ({"b"}, "proved it is node b, not a, the elected leader: not followed"),
            (set(), "proved no node id (TLS client certificates required)"),
        ]:
            info = MasterInfo(0, 0, SEGMENT, 0, node_ids=frozenset(names))
            e = self.assertRaises(Refused, replica._checks.check_master_identity, info)
            self.assertIn(needle, str(e))
        replica._checks.check_master_identity(MasterInfo(0, 0, SEGMENT, 0, node_ids=frozenset({"a", "x"})))


class CertsInitGroupTests(SynchronousTestCase):
    """
    C{rmqha certs init --group NAME --nodes a,b,c DIR}, for real.
    """

    def run_cli(self, *argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        status = main(list(argv), stdout=out, stderr=err)
        return status, out.getvalue(), err.getvalue()

    def test_writes_what_a_group_needs(self) -> None:
        """
        A CA, one key pair per node whose certificate names the node id
        (server and client use), and a 0600 group secret that loads; the
        printed command lines use them, and a node's twistd options built
        from them are accepted.
        """
        from cryptography.x509.oid import ExtendedKeyUsageOID as EKU

        from rmqha.tap import Options
        from rmqha.tls import certificate_names

        d = self.mktemp()
        status, out, err = self.run_cli("certs", "init", d, "--group", "broker-a", "--nodes", "a,b,c")
        self.assertEqual((status, err), (0, ""))
        self.assertEqual(
            sorted(os.listdir(d)),
            ["ca.key", "ca.pem", "group.secret", "node-a.key", "node-a.pem",
             "node-b.key", "node-b.pem", "node-c.key", "node-c.pem"],
        )
        self.assertEqual(os.stat(f"{d}/group.secret").st_mode & 0o777, 0o600)
        self.assertEqual(os.stat(f"{d}/node-b.key").st_mode & 0o777, 0o600)
        secret = load_group_secret(f"{d}/group.secret")
        self.assertEqual(len(secret), 64)
        for node in "abc":
            with open(f"{d}/node-{node}.pem", "rb") as f:
                certificate = x509.load_pem_x509_certificate(f.read())
            self.assertEqual(certificate_names(certificate), [node])
            self.assertEqual(
                set(certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value),
                {EKU.SERVER_AUTH, EKU.CLIENT_AUTH},
            )
            TLSFiles(f"{d}/node-{node}.pem", f"{d}/node-{node}.key", f"{d}/ca.pem").key_pair()
        self.assertIn(f"--group-secret-file {d}/group.secret", out)
        self.assertIn("--node-id c", out)
        self.patch(os, "environ", {})
        base = ["--store-dir", "s", "--coordinator", "etcd:http://127.0.0.1:2379",
                "--group", "broker-a", "--node-id", "a", "--advertise", "127.0.0.1:10912"]
        options = Options()
        options.parseOptions([*base, "--group-secret-file", f"{d}/group.secret"])
        self.assertEqual(options.group_auth(options.settings), GroupAuth("broker-a", "a", secret))
        options = Options()
        options.parseOptions([
            *base, "--tls-cert", f"{d}/node-a.pem", "--tls-key", f"{d}/node-a.key",
            "--tls-ca", f"{d}/ca.pem", "--tls-require-client-cert",
        ])
        self.assertEqual(
            options.group_auth(options.settings), GroupAuth("broker-a", "a", certificates=True)
        )
        status, _, err = self.run_cli("certs", "init", d, "--group", "broker-a", "--nodes", "a")
        self.assertEqual(status, 1)
        self.assertIn("group.secret exist", err)

    def test_bad_usage(self) -> None:
        """
        --group without --nodes, with --slave-names, a repeated node id or
        a bad group name: one error line each, nothing written.
        """
        for argv, needle in [
            (("--group", "g"), "--group and --nodes go together"),
            (("--group", "g", "--nodes", "a", "--slave-names", "s"), "--slave-names"),
            (("--group", "g", "--nodes", "a,a"), "must all differ"),
            (("--group", "g/h", "--nodes", "a"), "without '/'"),
        ]:
            d = self.mktemp()
            status, _, err = self.run_cli("certs", "init", d, *argv)
            self.assertEqual(status, 1, argv)
            self.assertIn(needle, err, argv)
            self.assertEqual(err.count("\n"), 1)
            self.assertFalse(os.path.exists(d))


class OptionsTests(SynchronousTestCase):
    """
    Failover mode's authentication options (L{rmqha.tap}).
    """

    def setUp(self) -> None:
        self.environ: dict[str, str] = {}
        self.patch(os, "environ", self.environ)
        self.secret = self.mktemp()
        with open(self.secret, "wb") as f:
            f.write(SECRET + b"\n")
        os.chmod(self.secret, 0o600)

    base = ("--store-dir", "s", "--coordinator", "etcd:http://127.0.0.1:2379",
            "--group", "g", "--node-id", "a", "--advertise", "127.0.0.1:10912")

    def parse(self, *argv: str) -> Any:
        from rmqha.tap import Options

        options = Options()
        options.parseOptions(list(argv))
        return options

    def test_refuses_an_unauthenticated_group(self) -> None:
        """
        --coordinator without a secret, TLS client certificates or
        --insecure-group stops with one line naming the options.
        """
        from twisted.python.usage import UsageError

        e = self.assertRaises(UsageError, self.parse, *self.base)
        for needle in ("--group-secret-file", "groupSecretFile", "RMQHA_GROUP_SECRET_FILE",
                       "--tls-require-client-cert", "--insecure-group"):
            self.assertIn(needle, str(e))
        self.assertNotIn("\n", str(e))
        self.assertIsNone(self.parse(*self.base, "--insecure-group").group_auth(
            self.parse(*self.base, "--insecure-group").settings
        ))

    def test_secret_from_flag_conf_or_environment(self) -> None:
        """
        The secret file comes from the flag, broker.conf's groupSecretFile
        or RMQHA_GROUP_SECRET_FILE, in that order; a bad one is refused
        naming where it came from.
        """
        from twisted.python.usage import UsageError

        expected = GroupAuth("g", "a", SECRET)
        options = self.parse(*self.base, "--group-secret-file", self.secret)
        self.assertEqual(options.group_auth(options.settings), expected)
        conf = self.mktemp()
        with open(conf, "w") as f:
            f.write(f"groupSecretFile={self.secret}\n")
        options = self.parse(*self.base, "--config", conf)
        self.assertEqual(options.group_auth(options.settings), expected)
        self.environ["RMQHA_GROUP_SECRET_FILE"] = self.secret
        options = self.parse(*self.base)
        self.assertEqual(options.group_auth(options.settings), expected)
        os.chmod(self.secret, 0o644)
        for argv, source in [
            (("--group-secret-file", self.secret), "--group-secret-file"),
            (("--config", conf), f"groupSecretFile in {conf}"),
            ((), "RMQHA_GROUP_SECRET_FILE"),
        ]:
            e = self.assertRaises(UsageError, self.parse, *self.base, *argv)
            self.assertEqual(
                str(e),
                f"{source} {self.secret}: readable or writable by others (mode 0644); chmod "
                "600 it (and replace the secret if others may have read it)",
            )

    def test_contradictions(self) -> None:
        """
        --insecure-group with a secret; the options without
        --coordinator (the environment variable alone is ignored there);
        --tls-server-name with --coordinator: each one line.
        """
        from twisted.python.usage import UsageError

        for argv, needle in [
            ((*self.base, "--insecure-group", "--group-secret-file", self.secret), "contradict"),
            (("--store-dir", "s", "--group-secret-file", self.secret), "give --coordinator"),
            (("--store-dir", "s", "--insecure-group"), "give --coordinator"),
            ((*self.base, "--insecure-group", "--tls-server-name", "x"), "--tls-server-name"),
        ]:
            e = self.assertRaises(UsageError, self.parse, *argv)
            self.assertIn(needle, str(e), argv)
        self.environ["RMQHA_GROUP_SECRET_FILE"] = self.secret
        self.parse("--store-dir", "s")

    def test_broker_gets_the_group_auth(self) -> None:
        """
        makeService gives the broker the group's authentication.
        """
        from rmqha.tap import makeService

        store = self.mktemp()
        service = makeService(self.parse(*self.base[2:], "--store-dir", store,
                                         "--group-secret-file", self.secret))
        broker, _ = list(service)  # type: ignore[call-overload]
        self.assertEqual(broker.role_services.group_auth, GroupAuth("g", "a", SECRET))
