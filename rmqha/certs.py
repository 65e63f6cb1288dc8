# -*- test-case-name: tests.test_tls,tests.test_group_auth,tests.integration.test_tls -*-
"""
C{rmqha certs init}: a CA and key pairs for a test or lab set-up.

    DIR/ca.pem, DIR/ca.key                  the CA (keep ca.key offline)
    DIR/master.pem, DIR/master.key          the master (--tls-cert/--tls-key)
    DIR/slave-NAME.pem, DIR/slave-NAME.key  one per slave

EC P-256 keys; the master's certificate is for its name, C{localhost} and
127.0.0.1 / ::1 (server auth); each slave's certificate carries its name as
CN and DNS name (client auth), which is what C{--tls-allowed-peers} matches.

C{rmqha certs issue DIR NAME}: one more key pair from the CA in DIR
(L{issue_from}), for a new node, an operator's client or a certificate
replacing one about to expire.

C{rmqha certs init --group NAME --nodes a,b,c DIR}: what a failover group
needs (L{init_group}, docs/failover.md, "Who counts"):

    DIR/ca.pem, DIR/ca.key                  the group's CA
    DIR/node-ID.pem, DIR/node-ID.key        one per node: its certificate
                                            names the node id (server and
                                            client auth)
    DIR/group.secret                        the group secret (0600)
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "CertificateSet",
    "GroupSet",
    "Issued",
    "init",
    "init_group",
    "issue",
    "issue_from",
    "IssuedFiles",
    "load_ca",
    "make_ca",
    "write_pair",
    "write_secret",
]

_ORGANIZATION = "rmqha"


@dataclass(frozen=True)
class Issued:
    key: ec.EllipticCurvePrivateKey
    certificate: x509.Certificate


def _name(common_name: str) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, _ORGANIZATION)]
    if common_name:
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def make_ca(
    common_name: str = "rmqha test CA",
    days: int = 3650,
    now: datetime.datetime | None = None,
) -> Issued:
    """
    A self-signed CA certificate and its key.
    """
    now = now or datetime.datetime.now(datetime.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(key, certificate)


def issue(
    ca: Issued,
    common_name: str,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str] = (),
    server: bool = False,
    client: bool = False,
    days: int = 825,
    not_before: datetime.datetime | None = None,
) -> Issued:
    """
    A leaf certificate signed by C{ca}, valid from C{not_before} (default
    five minutes ago) for C{days}.  An empty C{common_name} leaves the
    CommonName out (the names are then only in C{dns_names} and
    C{ip_addresses}: etcd's gateway refuses a client certificate with a
    CommonName once its auth is enabled).
    """
    start = not_before or datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(
        minutes=5
    )
    key = ec.generate_private_key(ec.SECP256R1())
    usages = []
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    alt_names: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    alt_names += [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
    )
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    return Issued(key, builder.sign(ca.key, hashes.SHA256()))


def write_pair(issued: Issued, directory: str, stem: str) -> tuple[str, str]:
    """
    C{stem.pem} and C{stem.key} (mode 0600) in C{directory}, both new files:
    an existing one is never overwritten (C{FileExistsError}), and if the
    second cannot be written the first is removed again.
    """
    cert_path = os.path.join(directory, stem + ".pem")
    key_path = os.path.join(directory, stem + ".key")
    key_pem = issued.key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    cert_pem = issued.certificate.public_bytes(serialization.Encoding.PEM)
    written: list[str] = []
    try:
        for path, data, mode in ((key_path, key_pem, 0o600), (cert_path, cert_pem, 0o666)):
            # O_EXCL: a file that appeared since any check is not replaced.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            written.append(path)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
    except BaseException:
        for path in written:
            os.unlink(path)
        raise
    return cert_path, key_path


def write_secret(path: str) -> str:
    """
    A new group secret file at C{path}: 32 random bytes in hex and a
    newline, mode 0600 (never overwriting a file).
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
    except BaseException:
        os.unlink(path)
        raise
    return path


@dataclass(frozen=True)
class CertificateSet:
    """
    What L{init} wrote.
    """

    ca: str
    master: tuple[str, str]
    slaves: dict[str, tuple[str, str]]


def _node(ca: Issued, name: str, *extra_names: str) -> Issued:
    """
    A broker's certificate: server and client use alike, since every
    broker may serve (the HA port on a master, the admin port on any
    broker over C{--http ssl:}) and dial (a slave to its master), and a
    broker's role is not fixed for its life.  DNS names C{name} (what
    allowlists match) and C{extra_names}; loopback addresses, where the
    examples connect.
    """
    return issue(
        ca, name, [name, *extra_names], ["127.0.0.1", "::1"], server=True, client=True
    )


def init(
    directory: str, master_name: str = "master", slave_names: Sequence[str] = ("slave",)
) -> CertificateSet:
    """
    Write a CA and key pairs for a master and its slaves into
    C{directory} (created if needed).

    @raise ValueError: a name is empty or repeated, or files of the set
        exist already (all named; nothing is overwritten, and there is no
        C{--force}: a key someone may be using is not ours to replace).
    """
    _check_names([master_name, *slave_names], "the master and slave names")
    stems = ["ca", "master", *(f"slave-{n}" for n in slave_names)]
    paths = [os.path.join(directory, stem + suffix) for stem in stems for suffix in (".pem", ".key")]
    with _new_set(directory, paths) as written:
        ca = make_ca()
        ca_path, ca_key = write_pair(ca, directory, "ca")
        written += [ca_path, ca_key]
        master_paths = write_pair(_node(ca, master_name, "localhost"), directory, "master")
        written += master_paths
        slaves = {}
        for name in slave_names:
            slaves[name] = write_pair(_node(ca, name), directory, f"slave-{name}")
            written += slaves[name]
    return CertificateSet(ca_path, master_paths, slaves)


def _check_names(names: Sequence[str], what: str) -> None:
    """
    @raise ValueError: a name is empty, unusable in a certificate or a
        file name, or repeated.
    """
    for name in names:
        if not name or any(c in name for c in "/\\,: ") or not name.isprintable():
            raise ValueError(f"{name!r} is not a usable certificate name")
    if len(set(names)) != len(names):
        raise ValueError(f"{what} must all differ")


@contextmanager
def _new_set(directory: str, paths: Sequence[str]) -> Iterator[list[str]]:
    """
    Write a set of new files into C{directory} (created if needed): the
    block appends each path it writes to the list it is given; if it
    fails, those files (only those) and a directory made here are removed.

    @raise ValueError: files of the set exist already (all named; nothing
        is overwritten).
    """
    existing = [path for path in paths if os.path.lexists(path)]
    if existing:
        raise ValueError(f"{', '.join(existing)} exist{'s' if len(existing) == 1 else ''}; "
                         "not overwriting (choose another directory)")
    created_directory = not os.path.isdir(directory)
    os.makedirs(directory, exist_ok=True)
    written: list[str] = []
    try:
        yield written
    except BaseException:
        # Half a set is no use and would block the retry: remove what this
        # call wrote (only that).
        for path in written:
            os.unlink(path)
        if created_directory:
            try:
                os.rmdir(directory)
            except OSError:
                pass
        raise


@dataclass(frozen=True)
class GroupSet:
    """
    What L{init_group} wrote.
    """

    ca: str
    #: node id -> (certificate, key)
    nodes: dict[str, tuple[str, str]]
    secret: str


def init_group(directory: str, group: str, node_ids: Sequence[str]) -> GroupSet:
    """
    Write what a failover group needs into C{directory} (created if
    needed): a CA, a key pair per node whose certificate names the node
    id (server and client use: every node may lead or follow), and a group
    secret (C{group.secret}, mode 0600).  Either authenticates the group
    (docs/failover.md): the secret with C{--group-secret-file}, the
    certificates with C{--tls-cert/--tls-key/--tls-ca
    --tls-require-client-cert}.

    @raise ValueError: the group name or a node id is empty, unusable or
        repeated, or files of the set exist already (all named; nothing is
        overwritten).
    """
    if not group or "/" in group or any(c.isspace() for c in group):
        raise ValueError(f"group {group!r}: give a name without '/' or spaces")
    if not node_ids:
        raise ValueError("a group needs at least one node id")
    _check_names(node_ids, "the node ids")
    stems = ["ca", *(f"node-{n}" for n in node_ids)]
    paths = [os.path.join(directory, stem + suffix) for stem in stems for suffix in (".pem", ".key")]
    secret_path = os.path.join(directory, "group.secret")
    with _new_set(directory, [*paths, secret_path]) as written:
        ca = make_ca(f"rmqha group {group} CA")
        ca_path, ca_key = write_pair(ca, directory, "ca")
        written += [ca_path, ca_key]
        nodes = {}
        for node_id in node_ids:
            nodes[node_id] = write_pair(_node(ca, node_id), directory, f"node-{node_id}")
            written += nodes[node_id]
        written.append(write_secret(secret_path))
    return GroupSet(ca_path, nodes, secret_path)


def load_ca(directory: str) -> Issued:
    """
    The CA in C{directory} as L{init} or L{init_group} wrote it:
    C{ca.pem} and its unencrypted key C{ca.key}.

    @raise ValueError: one line naming the file that is missing, unreadable
        or not what it should be.
    """
    if not os.path.isdir(directory):
        raise ValueError(f"{directory}: no such directory (the CA's, as certs init wrote it)")
    cert_path = os.path.join(directory, "ca.pem")
    key_path = os.path.join(directory, "ca.key")
    data = {}
    for path in (cert_path, key_path):
        try:
            with open(path, "rb") as f:
                data[path] = f.read()
        except OSError as e:
            raise ValueError(f"{path}: {e.strerror} (the CA's, as certs init wrote it)") from None
    try:
        certificate = x509.load_pem_x509_certificate(data[cert_path])
    except ValueError:
        raise ValueError(f"{cert_path}: not a PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(data[key_path], password=None)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{key_path}: not an unencrypted PEM private key ({e})") from None
    try:
        constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints)
        is_ca = constraints.value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise ValueError(f"{cert_path}: not a CA certificate (no CA basic constraint)")
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(*spki) != certificate.public_key().public_bytes(*spki):
        raise ValueError(f"{key_path} is not the key of {cert_path}")
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{key_path}: not an EC key (certs init writes EC P-256)")
    return Issued(key, certificate)


@dataclass(frozen=True)
class IssuedFiles:
    """
    What L{issue_from} wrote, and the certificate.
    """

    cert: str
    key: str
    certificate: x509.Certificate
    #: The CA's certificate.
    ca: x509.Certificate


def issue_from(
    ca_directory: str,
    name: str,
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    server: bool = True,
    client: bool = True,
    days: int = 825,
    out_directory: str | None = None,
    stem: str | None = None,
) -> IssuedFiles:
    """
    One more key pair signed by the CA in C{ca_directory} (L{load_ca}):
    C{STEM.pem} and C{STEM.key} (0600) in C{out_directory} (default: the
    CA's), new files only.

    @param name: the certificate's CN and first name: a DNS SAN (what
        allowlists and node ids match), or an IP SAN if it is an address.
    @param stem: the files' name (default C{name}).
    @raise ValueError: one line: a bad name, address or validity, the CA
        unusable, or a file that exists already (nothing is overwritten).
    """
    _check_names([name, *dns_names], "the names")
    addresses = list(ip_addresses)
    dns = [name, *dns_names]
    try:
        ipaddress.ip_address(name)
    except ValueError:
        pass
    else:
        dns.remove(name)
        if name not in addresses:
            addresses.insert(0, name)
    for address in addresses:
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise ValueError(f"{address!r} is not an IP address") from None
    if days < 1:
        raise ValueError(f"a validity of {days} days: give at least 1")
    if not (server or client):
        raise ValueError("a certificate for neither server nor client use is no use")
    stem = stem or name
    _check_names([stem], "the file name")
    ca = load_ca(ca_directory)
    directory = ca_directory if out_directory is None else out_directory
    if not os.path.isdir(directory):
        raise ValueError(f"{directory}: no such directory")
    paths = [os.path.join(directory, stem + suffix) for suffix in (".pem", ".key")]
    existing = [path for path in paths if os.path.lexists(path)]
    if existing:
        raise ValueError(
            f"{', '.join(existing)} exist{'s' if len(existing) == 1 else ''}; not "
            "overwriting (give another name or --stem)"
        )
    issued = issue(ca, name, dns, addresses, server=server, client=client, days=days)
    cert_path, key_path = write_pair(issued, directory, stem)
    return IssuedFiles(cert_path, key_path, issued.certificate, ca.certificate)
