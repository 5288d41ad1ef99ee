"""The cluster CA: one self-signed CA per cluster (`tidelog deploy` / `cluster up` create it), and
the node certificates it signs.

A node certificate names the node three ways:
- subject CN = the node id (for people reading `status`);
- SANs for every address the node is reached at (IPAddress when the text parses as an IP,
  DNSName otherwise), so clients and members check the hostname as usual;
- a URI SAN `tidelog-member:<node id>`: the member identity. Only certificates this CA signed
  carry it, so a TLS peer whose verified certificate has it *is* that member
  (broker/security/tls.py peer_member);
- for a broker node, a URI SAN `tidelog-group:<broker_name>`: the group it belongs to. A name
  server takes registrations for a group only from a certificate naming it (tls.py peer_group;
  broker/namesrv/core.py `refusal`), so a node of one group -- or one taken out of it and given
  another group's certificate -- cannot steer another group's routes. Name servers' own
  certificates name no group.

Keys are EC P-256 (fast to make and to handshake with). Private keys are written 0600 from
their first byte (broker/store/files.py write_atomic: a temporary file created 0600, then renamed), certificates
0644. Every file is written atomically: a crash leaves the old file or the new one, never half.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
from pathlib import Path
from typing import NamedTuple

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from broker.store.files import write_atomic

MEMBER_URI_PREFIX = "tidelog-member:"
GROUP_URI_PREFIX = "tidelog-group:"
NODE_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # as broker/config.py Peer.id
CA_CERT_NAME = "ca.crt"
CA_KEY_NAME = "ca.key"
BACKDATE = dt.timedelta(minutes=5)  # not_before this far in the past: hosts' clocks differ a little


class CaError(Exception):
    """The CA or a certificate could not be made or read; the message names the file."""


class CaFiles(NamedTuple):
    cert_file: Path
    key_file: Path


class NodeCert(NamedTuple):
    cert_file: Path
    key_file: Path
    not_after: dt.datetime  # UTC, timezone-aware


# --- files ---------------------------------------------------------------------------------

def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def load_cert(path: Path) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(Path(path).read_bytes())
    except (OSError, ValueError) as e:
        raise CaError(f"{path}: cannot read the certificate: {e}") from e


def load_key(path: Path):
    try:
        return serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as e:
        raise CaError(f"{path}: cannot read the private key: {e}") from e


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


# --- the CA --------------------------------------------------------------------------------

def create_ca(directory: Path, cluster: str, days: int = 3650) -> CaFiles:
    """The cluster CA in `directory` (ca.crt 0644, ca.key 0600). Idempotent: when both files
    exist they are checked (a CA certificate whose key matches) and returned unchanged."""
    directory = Path(directory)
    files = CaFiles(directory / CA_CERT_NAME, directory / CA_KEY_NAME)
    have_cert, have_key = files.cert_file.exists(), files.key_file.exists()
    if have_cert and have_key:
        _check_ca(files)
        return files
    if have_cert or have_key:
        present = files.cert_file if have_cert else files.key_file
        missing = files.key_file if have_cert else files.cert_file
        raise CaError(f"{present} exists but {missing} does not: refusing to replace half a CA "
                      f"(remove {present} to make a new one; every node certificate must then be reissued)")
    if days < 1:
        raise CaError(f"days must be at least 1, not {days}")
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Tidelog"),
        x509.NameAttribute(NameOID.COMMON_NAME, f"Tidelog CA {cluster}"),
    ])
    now = _now()
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, key_cert_sign=True, crl_sign=True,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(key, hashes.SHA256())
    )
    # key first: a crash between the two leaves a key without a certificate (refused above,
    # loudly), never a certificate whose key is lost
    write_atomic(files.key_file, _key_pem(key), 0o600)
    write_atomic(files.cert_file, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return files


def _check_ca(files: CaFiles) -> tuple[x509.Certificate, object]:
    cert, key = load_cert(files.cert_file), load_key(files.key_file)
    if cert.public_key().public_numbers() != key.public_key().public_numbers():
        raise CaError(f"{files.key_file} is not the key of {files.cert_file}")
    try:
        bc = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        bc = None
    if bc is None or not bc.ca:
        raise CaError(f"{files.cert_file} is not a CA certificate")
    return cert, key


# --- node certificates ---------------------------------------------------------------------

def _san(address: str) -> x509.GeneralName:
    text = address.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return x509.IPAddress(ipaddress.ip_address(text))
    except ValueError:
        pass
    if not text or not re.fullmatch(r"[A-Za-z0-9*]([A-Za-z0-9.*-]{0,252})", text):
        raise CaError(f"address {address!r} is neither an IP address nor a DNS name")
    return x509.DNSName(text.lower())


def issue_node_cert(ca: CaFiles, out_dir: Path, node_id: str, addresses: list[str],
                    days: int = 397, group: str | None = None) -> NodeCert:
    """A certificate for member `node_id` (of broker group `group`, when given: a broker node's
    broker_name), signed by `ca`: out_dir/<node_id>.crt (0644) and <node_id>.key (0600, a
    fresh key each time), each written atomically. `addresses` are host names or IP addresses
    (no ports); "localhost" is not added unless listed."""
    if not NODE_ID_RE.match(node_id or ""):
        raise CaError(f"node id {node_id!r} must match {NODE_ID_RE.pattern}")
    if group is not None and not NODE_ID_RE.match(group):
        raise CaError(f"group {group!r} must match {NODE_ID_RE.pattern} (a broker_name)")
    if days < 1:
        raise CaError(f"days must be at least 1, not {days}")
    sans: list[x509.GeneralName] = []
    for a in addresses:
        g = _san(a)
        if g not in sans:
            sans.append(g)
    sans.append(x509.UniformResourceIdentifier(MEMBER_URI_PREFIX + node_id))
    if group is not None:
        sans.append(x509.UniformResourceIdentifier(GROUP_URI_PREFIX + group))
    ca_cert, ca_key = _check_ca(ca)
    now = _now()
    not_after = now + dt.timedelta(days=days)
    ca_not_after = ca_cert.not_valid_after_utc
    if not_after > ca_not_after:
        not_after = ca_not_after  # a certificate cannot outlive its issuer usefully
    key = ec.generate_private_key(ec.SECP256R1())
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Tidelog"),
            x509.NameAttribute(NameOID.COMMON_NAME, node_id),
        ]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, key_cert_sign=False, crl_sign=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                              ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cert_file, key_file = out_dir / f"{node_id}.crt", out_dir / f"{node_id}.key"
    # key then certificate: between the two renames the pair mismatches for an instant; a
    # server loads both only at start (or on an explicit reload after this returns)
    write_atomic(key_file, _key_pem(key), 0o600)
    write_atomic(cert_file, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return NodeCert(cert_file, key_file, cert.not_valid_after_utc)


# --- reading certificates ------------------------------------------------------------------

def _san_text(g: x509.GeneralName) -> str:
    if isinstance(g, x509.IPAddress):
        return f"IP:{g.value}"
    if isinstance(g, x509.DNSName):
        return f"DNS:{g.value}"
    if isinstance(g, x509.UniformResourceIdentifier):
        return f"URI:{g.value}"
    return f"{type(g).__name__}:{g.value}"


def _sans(cert: x509.Certificate) -> list[x509.GeneralName]:
    try:
        return list(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    except x509.ExtensionNotFound:
        return []


def _uri_id(cert: x509.Certificate, prefix: str) -> str | None:
    ids = [g.value[len(prefix):] for g in _sans(cert)
           if isinstance(g, x509.UniformResourceIdentifier) and g.value.startswith(prefix)]
    return ids[0] if len(ids) == 1 and ids[0] else None


def cert_member(cert: x509.Certificate) -> str | None:
    """The member id in the certificate's `tidelog-member:` URI SAN (None: none, or several)."""
    return _uri_id(cert, MEMBER_URI_PREFIX)


def cert_group(cert: x509.Certificate) -> str | None:
    """The broker group in the certificate's `tidelog-group:` URI SAN (None: none, or several)."""
    return _uri_id(cert, GROUP_URI_PREFIX)


def cert_info(path: Path) -> dict:
    """What `status` shows and rotation decides on; JSON-ready (dates as ISO 8601 UTC).
    Keys: subject, issuer, serial (hex), not_before, not_after, days_left, sans (["IP:…",
    "DNS:…", "URI:…"]), member (id or None), group (broker_name or None), is_ca,
    fingerprint_sha256."""
    cert = load_cert(path)
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    not_after = cert.not_valid_after_utc
    return {
        "path": str(path),
        "subject": cert.subject.rfc4514_string(),
        "issuer": cert.issuer.rfc4514_string(),
        "serial": format(cert.serial_number, "x"),
        "not_before": cert.not_valid_before_utc.isoformat(),
        "not_after": not_after.isoformat(),
        "days_left": round((not_after - _now()).total_seconds() / 86400, 2),
        "sans": [_san_text(g) for g in _sans(cert)],
        "member": cert_member(cert),
        "group": cert_group(cert),
        "is_ca": is_ca,
        "fingerprint_sha256": cert.fingerprint(hashes.SHA256()).hex(),
    }


def signed_by(cert_file: Path, ca_file: Path) -> bool:
    """The certificate's signature verifies with the CA's key (and names it as issuer)."""
    cert, ca = load_cert(cert_file), load_cert(ca_file)
    try:
        cert.verify_directly_issued_by(ca)
    except (InvalidSignature, ValueError, TypeError):  # bad signature, other issuer name, key type
        return False
    return True


def needs_rotation(cert_file: Path, within_days: int = 30, *, ca_file: Path | None = None,
                   node_id: str | None = None, addresses: list[str] | None = None,
                   group: str | None = None) -> bool:
    """True when the certificate should be (re)issued: missing or unreadable, expiring within
    `within_days` (or not yet valid), and, when given, not signed by `ca_file`, not for member
    `node_id`, not covering every one of `addresses`, or not naming broker group `group`
    (a certificate from before groups were named, or one of another group)."""
    try:
        cert = load_cert(cert_file)
    except CaError:
        return True
    now = _now()
    if cert.not_valid_after_utc - now < dt.timedelta(days=within_days):
        return True
    if cert.not_valid_before_utc > now + BACKDATE:
        return True
    if ca_file is not None and not signed_by(cert_file, ca_file):
        return True
    if node_id is not None and cert_member(cert) != node_id:
        return True
    if group is not None and cert_group(cert) != group:
        return True
    if addresses is not None:
        have = _sans(cert)
        try:
            if any(_san(a) not in have for a in addresses):
                return True
        except CaError:
            return True
    return False


def ensure_node_cert(ca: CaFiles, out_dir: Path, node_id: str, addresses: list[str],
                     days: int = 397, within_days: int = 30, group: str | None = None) -> tuple[NodeCert, bool]:
    """The node's certificate, (re)issued only when needs_rotation says so (missing, expiring,
    another CA, another member id, an address not covered, not naming `group`). Returns
    (cert, issued)."""
    cert_file, key_file = Path(out_dir) / f"{node_id}.crt", Path(out_dir) / f"{node_id}.key"
    if key_file.exists() and not needs_rotation(cert_file, within_days, ca_file=ca.cert_file,
                                                node_id=node_id, addresses=addresses, group=group):
        try:
            cert, key = load_cert(cert_file), load_key(key_file)
            if cert.public_key().public_numbers() == key.public_key().public_numbers():
                return NodeCert(cert_file, key_file, cert.not_valid_after_utc), False
        except CaError:
            pass
    return issue_node_cert(ca, out_dir, node_id, addresses, days, group), True
