"""TLS contexts for every Tidelog port, and who the peer is.

Trust is the cluster CA only (broker/security/ca.py): no system CAs, on either side.
- server_context: the client port. Clients may present no certificate (they authenticate
  with SCRAM); a certificate that does not chain to the CA fails the handshake.
- member_server_context: the HA port. A certificate from the CA is required.
- client_context: clients and members dialing members; verifies the server against the CA
  (and its address against the certificate's SANs); members also present their own cert.
- peer_member: the member id a verified peer certificate carries (URI SAN
  `tidelog-member:<id>`). Only the CA issues such certificates, so this is the identity a
  RAFT/HA frame's sender must have.
- peer_group: the broker group (URI SAN `tidelog-group:<broker_name>`) a verified peer
  certificate names: what a name server takes a group's registrations from.

TLS 1.2 is the floor, 1.3 preferred (negotiated whenever both sides have it); TLS 1.2 is held
to ECDHE with AEAD ciphers.
"""

from __future__ import annotations

import ssl

from broker.security.ca import GROUP_URI_PREFIX, MEMBER_URI_PREFIX

__all__ = ["MEMBER_URI_PREFIX", "GROUP_URI_PREFIX", "server_context", "member_server_context",
           "client_context", "peer_member", "peer_group", "require_member", "MemberMismatch"]

TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


class MemberMismatch(ssl.SSLError):
    """The peer's verified certificate is not the member we expected."""


def _base(purpose_server: bool, ca_file) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if purpose_server else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(TLS12_CIPHERS)  # TLS 1.3 suites are separate and all fine
    ctx.options |= ssl.OP_NO_COMPRESSION
    if purpose_server:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE | ssl.OP_NO_RENEGOTIATION
    # the CA is the only trust anchor: no load_default_certs(), no SSL_CERT_FILE/DIR
    ctx.load_verify_locations(cafile=str(ca_file))
    return ctx


def server_context(ca_file, cert_file, key_file) -> ssl.SSLContext:
    """The client port: the node's certificate; a client certificate is optional, but one that
    does not chain to `ca_file` fails the handshake (CERT_OPTIONAL)."""
    ctx = _base(True, ca_file)
    ctx.load_cert_chain(str(cert_file), str(key_file))
    ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def member_server_context(ca_file, cert_file, key_file) -> ssl.SSLContext:
    """The HA port (members only): a certificate chaining to `ca_file` is required (CERT_REQUIRED)."""
    ctx = server_context(ca_file, cert_file, key_file)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(ca_file, cert_file=None, key_file=None, check_hostname: bool = True) -> ssl.SSLContext:
    """Dialing a node: its certificate must chain to `ca_file` (only); with check_hostname the
    address dialed (server_hostname, an IP or a name) must be in its SANs. With cert/key the
    context presents them (a member dialing a member)."""
    ctx = _base(False, ca_file)
    ctx.check_hostname = check_hostname
    ctx.verify_mode = ssl.CERT_REQUIRED  # always: check_hostname=False still verifies the chain
    if cert_file is not None:
        ctx.load_cert_chain(str(cert_file), str(key_file) if key_file is not None else None)
    elif key_file is not None:
        raise ValueError("key_file given without cert_file")
    return ctx


def _peercert(obj) -> dict | None:
    """The verified peer certificate (getpeercert() dict) of an SSLObject, SSLSocket, asyncio
    transport or StreamWriter; None when there is none."""
    if obj is None:
        return None
    if hasattr(obj, "getpeercert"):
        try:
            return obj.getpeercert() or None
        except (ValueError, OSError):  # handshake not done / socket closed
            return None
    get = getattr(obj, "get_extra_info", None)
    if get is None:
        return None
    sslobj = get("ssl_object")
    if sslobj is not None:
        return _peercert(sslobj)
    return get("peercert") or None


def peer_member(obj) -> str | None:
    """The member id in the peer certificate's URI SAN `tidelog-member:<id>`; None when the peer
    presented no (verified) certificate, the connection is not TLS, or the certificate has no
    such SAN (or more than one). getpeercert() only returns certificates the handshake verified
    against the CA (an empty dict under CERT_NONE), so the answer is never an unverified claim."""
    return _peer_uri(obj, MEMBER_URI_PREFIX)


def peer_group(obj) -> str | None:
    """The broker group in the peer certificate's URI SAN `tidelog-group:<broker_name>`; None
    as for peer_member (no verified certificate, no such SAN, or more than one)."""
    return _peer_uri(obj, GROUP_URI_PREFIX)


def _peer_uri(obj, prefix: str) -> str | None:
    cert = _peercert(obj)
    if not cert:
        return None
    ids = [value[len(prefix):] for kind, value in cert.get("subjectAltName", ())
           if kind == "URI" and value.startswith(prefix)]
    return ids[0] if len(ids) == 1 and ids[0] else None


def require_member(obj, expected: str | None = None) -> str:
    """The peer's member id, or MemberMismatch when it has none or (with `expected`) another
    one: a member dialing member n2 calls require_member(transport, "n2")."""
    member = peer_member(obj)
    if member is None:
        raise MemberMismatch("the peer presented no member certificate")
    if expected is not None and member != expected:
        raise MemberMismatch(f"the peer is member {member!r}, not {expected!r}")
    return member
