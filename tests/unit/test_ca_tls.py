"""The cluster CA (broker/security/ca.py) and the TLS contexts (broker/security/tls.py), over
real sockets on 127.0.0.1.

The servers are asyncio.BufferedProtocol servers made by loop.create_server(ssl=ctx), as
broker/connection.py is, on uvloop (what the broker runs) and on the stdlib loop.

What a refused client sees: asyncio and uvloop servers do not send the TLS alert when their
handshake fails (they close the socket), so a TLS 1.3 client completes its side of the
handshake and then reads EOF, and a TLS 1.2 client gets an EOF/reset during its handshake.
The tests hold the server to "never connection_made" and the client to "no answer, an error
or EOF"; where the client refuses the server (its CA, its address) the client gets an
ssl.SSLCertVerificationError.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import os
import ssl
import stat
import time

import pytest
import uvloop
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from broker.security import ca as C
from broker.security import tls as T

LOOPS = {"uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}


def run(coro, loop="uvloop"):
    with asyncio.Runner(loop_factory=LOOPS[loop]) as r:
        return r.run(coro)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    base = tmp_path_factory.mktemp("pki")
    ca = C.create_ca(base / "ca", "c1")
    other = C.create_ca(base / "other-ca", "c1")  # same cluster name, another key: still another CA
    return {
        "base": base,
        "ca": ca,
        "n1": C.issue_node_cert(ca, base / "nodes", "n1", ["127.0.0.1", "h1.example"]),
        "n2": C.issue_node_cert(ca, base / "nodes", "n2", ["127.0.0.1"]),
        "far": C.issue_node_cert(ca, base / "nodes", "far", ["10.9.9.9"]),
        "other": other,
        # another CA's certificate claiming to be member n2
        "forged": C.issue_node_cert(other, base / "forged", "n2", ["127.0.0.1"]),
    }


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# --- a BufferedProtocol echo server, as broker/connection.py reads ---------------------------

class Echo(asyncio.BufferedProtocol):
    def __init__(self, seen: list):
        self.seen = seen
        self.buf = bytearray(1024)  # smaller than a TLS record: the loop must fill it in pieces
        self.hints: list[int] = []

    def connection_made(self, transport):
        self.transport = transport
        self.seen.append(("made", T.peer_member(transport),
                          transport.get_extra_info("ssl_object").version()))

    def get_buffer(self, sizehint):
        self.hints.append(sizehint)
        return memoryview(self.buf)

    def buffer_updated(self, nbytes):
        data = bytes(self.buf[:nbytes])
        self.transport.writelines([b"echo:", data])  # the connection's gathering write

    def eof_received(self):
        return False

    def connection_lost(self, exc):
        self.seen.append(("lost", exc))


async def _serve(ctx, seen):
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Echo(seen), "127.0.0.1", 0, ssl=ctx,
                                      ssl_handshake_timeout=5)
    return server, server.sockets[0].getsockname()[1]


async def _attempt(port, cctx, host="127.0.0.1"):
    """Connect, send, read: ("ok", reply, member, version) or ("refused", what the client saw)."""
    try:
        r, w = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=cctx), 5)
    except (ssl.SSLError, ConnectionError) as e:
        return ("refused", e)
    try:
        w.write(b"ping")
        reply = await asyncio.wait_for(r.read(100), 5)
        if not reply:
            return ("refused", "eof")
        return ("ok", reply, T.peer_member(w), w.get_extra_info("ssl_object").version())
    except (ssl.SSLError, ConnectionError) as e:
        return ("refused", e)
    finally:
        w.close()


def _server_ctx(pki, kind="client-port", node="n1"):
    make = T.server_context if kind == "client-port" else T.member_server_context
    return make(pki["ca"].cert_file, pki[node].cert_file, pki[node].key_file)


def _exchange(pki, sctx, cctx, loop="uvloop"):
    async def go():
        seen: list = []
        server, port = await _serve(sctx, seen)
        try:
            out = await _attempt(port, cctx)
            await asyncio.sleep(0.05)
            return out, seen
        finally:
            server.close()
            await server.wait_closed()
    return run(go(), loop)


# --- the CA and node certificates ------------------------------------------------------------

def test_ca_and_node_files_modes(tmp_path):
    old = os.umask(0)  # a permissive umask must not widen the key files
    try:
        ca = C.create_ca(tmp_path / "ca", "prod")
        node = C.issue_node_cert(ca, tmp_path / "nodes", "n1", ["127.0.0.1"])
    finally:
        os.umask(old)
    assert mode(ca.key_file) == 0o600 and mode(ca.cert_file) == 0o644
    assert mode(node.key_file) == 0o600 and mode(node.cert_file) == 0o644
    assert node.cert_file.name == "n1.crt" and node.key_file.name == "n1.key"
    leftovers = [p.name for p in (tmp_path / "ca").iterdir()] + [p.name for p in (tmp_path / "nodes").iterdir()]
    assert sorted(leftovers) == ["ca.crt", "ca.key", "n1.crt", "n1.key"]  # no temporary files left


def test_key_file_is_created_0600(tmp_path, monkeypatch):
    """The key's file is created with mode 0o600 by os.open itself (never world-readable,
    not even between creation and a chmod)."""
    created = []
    real_open = os.open

    def spy(path, flags, mode=0o777, *a, **kw):
        if flags & os.O_CREAT:
            created.append((os.fspath(path), mode))
        return real_open(path, flags, mode, *a, **kw)

    monkeypatch.setattr(os, "open", spy)  # files.write_atomic (broker/store/files.py) creates them
    ca = C.create_ca(tmp_path, "x")
    C.issue_node_cert(ca, tmp_path, "n1", ["127.0.0.1"])
    keys = [m for p, m in created if ".key" in p]
    assert len(keys) == 2 and all(m == 0o600 for m in keys)


def test_ca_certificate(pki):
    cert = C.load_cert(pki["ca"].cert_file)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "Tidelog CA c1"
    assert cert.issuer == cert.subject
    bc = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and bc.value.ca and bc.value.path_length == 0
    ku = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert ku.key_cert_sign and ku.crl_sign and not ku.digital_signature
    info = C.cert_info(pki["ca"].cert_file)
    assert info["is_ca"] and info["member"] is None and info["days_left"] > 3600


def test_node_certificate(pki, tmp_path):
    cert = C.load_cert(pki["n1"].cert_file)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "n1"
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert sans.get_values_for_type(x509.DNSName) == ["h1.example"]  # no "localhost" added
    assert sans.get_values_for_type(x509.UniformResourceIdentifier) == ["tidelog-member:n1"]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    ku = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert ku.digital_signature and not ku.key_cert_sign
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    cert.verify_directly_issued_by(C.load_cert(pki["ca"].cert_file))

    info = C.cert_info(pki["n1"].cert_file)
    assert info["subject"] == "CN=n1,O=Tidelog" and info["issuer"] == "CN=Tidelog CA c1,O=Tidelog"
    assert info["sans"] == ["IP:127.0.0.1", "DNS:h1.example", "URI:tidelog-member:n1"]
    assert info["member"] == "n1" and not info["is_ca"]
    assert int(info["serial"], 16) == cert.serial_number
    assert dt.datetime.fromisoformat(info["not_after"]) == pki["n1"].not_after
    assert 396 < info["days_left"] <= 397
    assert C.signed_by(pki["n1"].cert_file, pki["ca"].cert_file)
    assert not C.signed_by(pki["forged"].cert_file, pki["ca"].cert_file)

    v6 = C.issue_node_cert(pki["ca"], tmp_path, "n6", ["::1", "[fe80::1]", "Node6.Example"])
    assert C.cert_info(v6.cert_file)["sans"] == ["IP:::1", "IP:fe80::1", "DNS:node6.example",
                                                 "URI:tidelog-member:n6"]
    with pytest.raises(C.CaError, match="node id"):
        C.issue_node_cert(pki["ca"], tmp_path, "../n1", ["127.0.0.1"])
    with pytest.raises(C.CaError, match="neither an IP address nor a DNS name"):
        C.issue_node_cert(pki["ca"], tmp_path, "n7", ["10.0.0.1;touch /tmp/x"])


def test_create_ca_is_idempotent(tmp_path):
    first = C.create_ca(tmp_path, "c1")
    cert, key = first.cert_file.read_bytes(), first.key_file.read_bytes()
    again = C.create_ca(tmp_path, "c1")
    assert again == first
    assert first.cert_file.read_bytes() == cert and first.key_file.read_bytes() == key
    first.cert_file.unlink()  # half a CA is refused, not silently replaced
    with pytest.raises(C.CaError, match="refusing to replace half a CA"):
        C.create_ca(tmp_path, "c1")


def test_needs_rotation(pki, tmp_path):
    n1 = pki["n1"]
    assert not C.needs_rotation(n1.cert_file)
    assert C.needs_rotation(n1.cert_file, within_days=400)
    assert C.needs_rotation(tmp_path / "missing.crt")
    short = C.issue_node_cert(pki["ca"], tmp_path, "short", ["127.0.0.1"], days=10)
    assert C.needs_rotation(short.cert_file) and not C.needs_rotation(short.cert_file, within_days=5)
    # optional checks: the CA it must chain to, the member it must name, the addresses it must cover
    assert not C.needs_rotation(n1.cert_file, ca_file=pki["ca"].cert_file, node_id="n1",
                                addresses=["127.0.0.1", "h1.example"])
    assert C.needs_rotation(n1.cert_file, ca_file=pki["other"].cert_file)
    assert C.needs_rotation(n1.cert_file, node_id="n2")
    assert C.needs_rotation(n1.cert_file, addresses=["10.0.0.2"])

    made, issued = C.ensure_node_cert(pki["ca"], tmp_path / "e", "n1", ["127.0.0.1"])
    assert issued
    kept, issued = C.ensure_node_cert(pki["ca"], tmp_path / "e", "n1", ["127.0.0.1"])
    assert not issued and kept.cert_file.read_bytes() == made.cert_file.read_bytes()
    moved, issued = C.ensure_node_cert(pki["ca"], tmp_path / "e", "n1", ["127.0.0.1", "10.0.0.2"])
    assert issued and "IP:10.0.0.2" in C.cert_info(moved.cert_file)["sans"]


# --- TLS over real sockets -------------------------------------------------------------------

@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_member_client_connects_and_is_identified(pki, loop):
    """A member dials a member at 127.0.0.1: the IP SAN passes the hostname check; each side
    sees the other's member id; BufferedProtocol over TLS reads into a 1 KiB buffer."""
    cctx = T.client_context(pki["ca"].cert_file, pki["n2"].cert_file, pki["n2"].key_file)
    assert cctx.check_hostname and cctx.verify_mode == ssl.CERT_REQUIRED
    for kind in ("client-port", "member-port"):
        out, seen = _exchange(pki, _server_ctx(pki, kind), cctx, loop)
        assert out == ("ok", b"echo:ping", "n1", "TLSv1.3"), (kind, out)
        assert seen[0] == ("made", "n2", "TLSv1.3")


def test_buffered_protocol_large_transfer_over_tls(pki):
    """1 MiB through uvloop's TLS into a BufferedProtocol with a 1 KiB buffer arrives whole."""
    total = 1 << 20

    class Count(asyncio.BufferedProtocol):
        def __init__(self):
            self.buf, self.n, self.hints = bytearray(1024), 0, []

        def connection_made(self, tr):
            self.tr = tr

        def get_buffer(self, hint):
            self.hints.append(hint)
            return memoryview(self.buf)

        def buffer_updated(self, n):
            self.n += n
            if self.n == total:
                self.tr.write(b"done")

    async def go():
        protos = []
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: protos.append(Count()) or protos[-1], "127.0.0.1", 0,
                                          ssl=_server_ctx(pki), ssl_handshake_timeout=5)
        port = server.sockets[0].getsockname()[1]
        r, w = await asyncio.open_connection("127.0.0.1", port, ssl=T.client_context(pki["ca"].cert_file))
        w.write(bytes(total))
        assert await asyncio.wait_for(r.readexactly(4), 10) == b"done"
        w.close()
        server.close()
        return protos[0]

    p = run(go())
    assert p.n == total and len(p.hints) >= total // 1024


def test_client_without_certificate_on_client_port(pki):
    out, seen = _exchange(pki, _server_ctx(pki), T.client_context(pki["ca"].cert_file))
    assert out == ("ok", b"echo:ping", "n1", "TLSv1.3")
    assert seen[0] == ("made", None, "TLSv1.3")  # a client: authenticates later with SCRAM


def test_client_without_certificate_refused_on_member_port(pki):
    out, seen = _exchange(pki, _server_ctx(pki, "member-port"), T.client_context(pki["ca"].cert_file))
    assert out[0] == "refused"
    assert not [s for s in seen if s[0] == "made"]


@pytest.mark.parametrize("kind", ["client-port", "member-port"])
@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2])
def test_certificate_from_another_ca_refused_at_handshake(pki, kind, version):
    """Another CA's certificate naming member n2 fails the server's handshake (the server's
    protocol is never connection_made); the client gets no answer."""
    cctx = T.client_context(pki["ca"].cert_file, pki["forged"].cert_file, pki["forged"].key_file)
    cctx.maximum_version = version
    out, seen = _exchange(pki, _server_ctx(pki, kind), cctx)
    assert out[0] == "refused", out
    assert not [s for s in seen if s[0] == "made"]
    if version == ssl.TLSVersion.TLSv1_2:  # the client is still in its handshake when the server closes
        assert isinstance(out[1], (ssl.SSLError, ConnectionError))


def test_another_ca_refused_by_a_blocking_peer_with_an_alert(pki):
    """Against a peer that sends the TLS alert (a blocking ssl socket; asyncio servers drop it),
    the client sees the ssl error itself."""
    import socket
    import threading

    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]
    sctx = _server_ctx(pki)
    server_error = []

    def serve():
        conn, _ = lsock.accept()
        try:
            sctx.wrap_socket(conn, server_side=True).recv(1)
        except ssl.SSLError as e:
            server_error.append(e)
        finally:
            conn.close()

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    cctx = T.client_context(pki["ca"].cert_file, pki["forged"].cert_file, pki["forged"].key_file)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        with pytest.raises(ssl.SSLError, match="UNKNOWN_CA|unknown ca"):
            with cctx.wrap_socket(s, server_hostname="127.0.0.1") as ss:
                ss.recv(10)  # TLS 1.3: the server's verdict arrives after the client's Finished
    th.join(5)
    lsock.close()
    assert server_error and isinstance(server_error[0], ssl.SSLCertVerificationError)


def test_client_trusting_another_ca_refuses_the_server(pki):
    out, seen = _exchange(pki, _server_ctx(pki), T.client_context(pki["other"].cert_file))
    assert out[0] == "refused" and isinstance(out[1], ssl.SSLCertVerificationError)
    assert not [s for s in seen if s[0] == "made"]


def test_hostname_check(pki):
    """The server's certificate must name the address dialed; check_hostname=False still
    verifies the chain."""
    sctx = _server_ctx(pki, node="far")  # a certificate for 10.9.9.9 served on 127.0.0.1
    out, _ = _exchange(pki, sctx, T.client_context(pki["ca"].cert_file))
    assert out[0] == "refused" and isinstance(out[1], ssl.SSLCertVerificationError)
    assert "127.0.0.1" in str(out[1])
    out, _ = _exchange(pki, sctx, T.client_context(pki["ca"].cert_file, check_hostname=False))
    assert out[:3] == ("ok", b"echo:ping", "far")


def test_peer_member_and_require_member(pki):
    assert T.MEMBER_URI_PREFIX == "tidelog-member:"
    assert T.peer_member(None) is None

    class Plain:  # a non-TLS transport
        def get_extra_info(self, name, default=None):
            return default

    assert T.peer_member(Plain()) is None
    with pytest.raises(T.MemberMismatch):
        T.require_member(Plain())

    async def go():
        seen: list = []
        server, port = await _serve(_server_ctx(pki, "member-port"), seen)
        cctx = T.client_context(pki["ca"].cert_file, pki["n2"].cert_file, pki["n2"].key_file)
        r, w = await asyncio.open_connection("127.0.0.1", port, ssl=cctx)
        try:
            assert T.require_member(w, "n1") == "n1"
            assert T.peer_member(w.get_extra_info("ssl_object")) == "n1"
            with pytest.raises(T.MemberMismatch, match="not 'n3'"):
                T.require_member(w, "n3")
        finally:
            w.close()
            server.close()

    run(go())


def test_timings(pki, tmp_path):
    """create_ca, issue_node_cert and a mutual TLS handshake are cheap enough to do at deploy
    and per connection (the numbers go in the report; the bounds are generous)."""
    t0 = time.perf_counter()
    ca = C.create_ca(tmp_path / "ca", "t")
    t1 = time.perf_counter()
    for i in range(10):
        C.issue_node_cert(ca, tmp_path / "n", f"n{i}", ["127.0.0.1"])
    t2 = time.perf_counter()

    async def handshakes(n, cctx):
        server, port = await _serve(_server_ctx(pki, "member-port"), [])
        times = []
        for _ in range(n):
            s = time.perf_counter()
            r, w = await asyncio.open_connection("127.0.0.1", port, ssl=cctx)
            times.append(time.perf_counter() - s)
            w.close()
        server.close()
        return sorted(times)[n // 2]

    mutual = run(handshakes(30, T.client_context(pki["ca"].cert_file, pki["n2"].cert_file,
                                                 pki["n2"].key_file)))
    print(f"create_ca {1e3 * (t1 - t0):.1f} ms; issue_node_cert {1e2 * (t2 - t1):.1f} ms each; "
          f"mutual TLS connect+handshake median {1e3 * mutual:.2f} ms")
    assert t1 - t0 < 1 and (t2 - t1) / 10 < 1 and mutual < 0.5


def test_pause_reading_bounds_what_a_tls_server_reads(pki):
    """broker/connection.py pauses reading to bound a connection: over TLS on uvloop the pause
    holds (the TLS layer stops reading the socket past its ~256 KiB incoming buffer), so a
    client pushing 64 MiB is blocked after its and our socket buffers fill."""
    import socket
    import threading

    class Paused(asyncio.BufferedProtocol):
        def __init__(self):
            self.buf, self.n = bytearray(65536), 0

        def connection_made(self, tr):
            self.tr = tr
            tr.pause_reading()

        def get_buffer(self, hint):
            return memoryview(self.buf)

        def buffer_updated(self, n):
            self.n += n

    def push(port, sent, release):
        with socket.create_connection(("127.0.0.1", port)) as s:
            with T.client_context(pki["ca"].cert_file).wrap_socket(s, server_hostname="127.0.0.1") as ss:
                ss.settimeout(0.5)
                total, chunk = 0, bytes(65536)
                try:
                    while total < (64 << 20):
                        total += ss.send(chunk)
                except TimeoutError:
                    pass
                sent.append(total)
                release.wait(5)

    async def go():
        protos: list = []
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: protos.append(Paused()) or protos[-1], "127.0.0.1", 0,
                                          ssl=_server_ctx(pki), ssl_handshake_timeout=5)
        port = server.sockets[0].getsockname()[1]
        sent, release = [], threading.Event()
        th = threading.Thread(target=push, args=(port, sent, release), daemon=True)
        th.start()
        while not sent:
            await asyncio.sleep(0.05)
        p = protos[0]
        buffered = p.tr.get_read_buffer_size()
        release.set()
        server.close()
        return sent[0], p.n, buffered

    sent, delivered, buffered = run(go())
    print(f"paused TLS connection: client sent {sent >> 10} KiB before blocking; "
          f"TLS layer holds {buffered >> 10} KiB")
    assert delivered == 0
    assert sent < (32 << 20)
    assert buffered < (2 << 20)


def test_a_node_certificate_names_its_broker_group(pki, tmp_path):
    """Issue 39 item 2: a broker node's certificate carries its group (URI SAN
    tidelog-group:<broker_name>), which a name server reads from the verified peer
    certificate (peer_group) and takes that group's registrations from only; rotation re-issues
    a certificate that names no group or another one."""
    assert T.GROUP_URI_PREFIX == "tidelog-group:"
    g = C.issue_node_cert(pki["ca"], tmp_path, "n5", ["127.0.0.1"], group="g0")
    info = C.cert_info(g.cert_file)
    assert (info["member"], info["group"]) == ("n5", "g0")
    assert info["sans"] == ["IP:127.0.0.1", "URI:tidelog-member:n5", "URI:tidelog-group:g0"]
    assert C.cert_info(pki["n1"].cert_file)["group"] is None  # as issued before groups were named
    with pytest.raises(C.CaError, match="group"):
        C.issue_node_cert(pki["ca"], tmp_path, "n6", ["127.0.0.1"], group="g 0")
    assert not C.needs_rotation(g.cert_file, group="g0")
    assert C.needs_rotation(g.cert_file, group="g1")  # moved to another group
    assert C.needs_rotation(pki["n1"].cert_file, group="g0")  # names none
    assert not C.needs_rotation(pki["n1"].cert_file)  # no group asked for: not checked
    made, issued = C.ensure_node_cert(pki["ca"], tmp_path / "e", "n7", ["127.0.0.1"])
    again, issued = C.ensure_node_cert(pki["ca"], tmp_path / "e", "n7", ["127.0.0.1"], group="g2")
    assert issued and C.cert_info(again.cert_file)["group"] == "g2"

    async def go():
        seen: list = []
        groups: list = []

        class Groups(Echo):
            def connection_made(self, transport):
                super().connection_made(transport)
                groups.append(T.peer_group(transport))

        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: Groups(seen), "127.0.0.1", 0, ssl=_server_ctx(pki), ssl_handshake_timeout=5)
        port = server.sockets[0].getsockname()[1]
        try:
            for cert in (g, pki["n2"]):
                cctx = T.client_context(pki["ca"].cert_file, cert.cert_file, cert.key_file)
                r, w = await asyncio.open_connection("127.0.0.1", port, ssl=cctx)
                w.write(b"x")
                await r.read(10)
                w.close()
        finally:
            server.close()
        return groups

    assert run(go()) == ["g0", None]
    assert T.peer_group(None) is None


def test_deploy_issues_a_brokers_certificate_naming_its_group(tmp_path):
    # ops/security.py: the group a broker's config will have (broker_name); a name server's none;
    # a certificate from before (no group) or of another group is re-issued
    from types import SimpleNamespace as NS

    from ops.security import ClusterSecurity

    spec = NS(security=NS(insecure=False), state=tmp_path, name="c1")
    sec = ClusterSecurity(spec)
    sec.dir.mkdir(parents=True)
    C.create_ca(sec.dir, "c1")

    def plan(id, kind="broker", group="g0"):
        return NS(id=id, kind=kind, address="127.0.0.1:10911", ha_address=None,
                  broker_config=lambda: {"broker_name": group})
    a = sec.node_cert(plan("g0-h1"))
    assert C.cert_info(a.cert_file)["group"] == "g0"
    assert sec.node_cert(plan("g0-h1")).cert_file.read_bytes() == a.cert_file.read_bytes()  # kept
    moved = sec.node_cert(plan("g0-h1", group="g1"))
    assert C.cert_info(moved.cert_file)["group"] == "g1"
    C.issue_node_cert(sec.ca, sec.dir / "nodes", "g0-h2", ["127.0.0.1"])  # as deploy issued it before
    assert C.cert_info(sec.node_cert(plan("g0-h2")).cert_file)["group"] == "g0"
    assert C.cert_info(sec.node_cert(plan("ns-h1", kind="namesrv")).cert_file)["group"] is None
