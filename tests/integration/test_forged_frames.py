"""Issue 14 acceptance: forged replication traffic against real secure groups (processes on
loopback, TLS from a test CA, node certificates naming their member).

Raft (3 nodes): a RAFT frame naming the leader, sent to a follower by an authenticated admin
*user*, or by another member's certificate, is dropped and logged; no node's term moves; the
group keeps serving and loses nothing it acknowledged. Without the checks (guard.py
MEMBER_ONLY, raft/driver.py on_frame `msg.src != sender`) a forged Heartbeat / TimeoutNow with
a large term is adopted and the terms jump: these tests fail.

Master-slave (SYNC, 2 nodes): the HA port refuses a peer without a certificate, and a peer
whose CA-issued certificate is not the member its HELLO names; the real slave stays
connected; once it is dead, the impostor's REPORTs acknowledge nothing: no SYNC send is
answered SUCCESS that no replica holds.
"""

from __future__ import annotations

import asyncio
import signal
import ssl
import struct
import time

import pytest

from broker.client import Admin, AuthenticationError, Consumer, PermissionDenied, Producer, SendError
from broker.client.connection import ClientConnection
from broker.client.security import Credentials
from broker.protocol import frame as fr
from broker.protocol.codes import Code, Req
from broker.security.tls import client_context
from replication.master_slave import wire as ha
from tests.secure import PASSWORDS, Pki, log_text, master_slave_group, open_raw, raft_group, start_all, stop_all

pytestmark = pytest.mark.slow

TOPIC = "orders"
SMALL_TERM = 50  # a test group's terms stay far below this (one election per start, a few more at most)


# --- raft ------------------------------------------------------------------------------------------

def raft_body(kind: int, src: str, term: int, tail: bytes = b"") -> bytes:
    """A RAFT message by hand (replication/raft/wire.py): kind u8 | term u64 | src_len u8 | src | ...,
    so that values the encoder refuses can be sent anyway."""
    s = src.encode()
    return struct.pack(">BQB", kind, term, len(s)) + s + tail


def heartbeat(src: str, term: int, commit_index: int = 0) -> bytes:
    return raft_body(5, src, term, struct.pack(">q", commit_index))


def timeout_now(src: str, term: int) -> bytes:
    return raft_body(7, src, term)


def statuses(pki, nodes) -> dict:
    out = {}
    for b in nodes:
        with Admin([b.address], **pki.client("admin"), request_timeout_ms=2000) as a:
            out[b.address] = a.status()["replication"]
    return out


def wait_leader(pki, nodes, timeout_s=20.0) -> tuple[str, dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            st = statuses(pki, nodes)
            leaders = {s["id"] for s in st.values() if s["role"] == "leader"}
            if len(leaders) == 1 and all(s.get("leader") in leaders for s in st.values()):
                return leaders.pop(), st
        except Exception:  # noqa: BLE001 -- a node still starting
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"no single leader: {st}")
        time.sleep(0.2)


def produce(pki, nodes, n: int, tag: str) -> dict:
    acked = {}
    with Producer([b.address for b in nodes], **pki.client("app"), send_timeout_ms=3000) as p:
        for i in range(n):
            body = f"{tag}-{i}".encode()
            acked[p.send(TOPIC, body).msg_id] = body
    return acked


def read_all(pki, nodes, want: dict) -> dict:
    got = {}
    with Consumer([b.address for b in nodes], "billing", TOPIC, auto_commit=False, **pki.client("app")) as c:
        deadline = time.monotonic() + 20
        while not want.keys() <= got.keys() and time.monotonic() < deadline:
            for m in c.poll(timeout_ms=300, max_messages=1000):
                got[m.msg_id] = m.body
    return got


def test_forged_raft_frames_are_dropped_and_logged(tmp_path):
    pki = Pki(tmp_path)
    nodes = raft_group(pki, tmp_path, raft_election_timeout_ms=600)
    try:
        start_all(nodes)
        leader, _ = wait_leader(pki, nodes)
        by_id = {f"n{i}": b for i, b in enumerate(nodes)}
        followers = [i for i in by_id if i != leader]
        victim, other = by_id[followers[0]], followers[1]
        with Admin([b.address for b in nodes], **pki.client("admin")) as a:
            a.create_topic(TOPIC, 2)
        acked = produce(pki, nodes, 50, "before")

        async def attack():
            # 1. the admin *user* on a follower's client port: authenticated, but no member
            conn = await open_raw(victim.address, Credentials("admin", PASSWORDS["admin"], pki.ca_file))
            for term in (2**64 - 1, 10**6):
                conn.oneway(Req.RAFT, heartbeat(leader, term))
                conn.oneway(Req.RAFT, timeout_now(leader, term))
            # the connection still serves its user: the drop is silent (RAFT is oneway)
            f = await conn.request(Req.STATUS, b"{}", 3.0)
            assert f.code == Code.SUCCESS
            conn.close()
            # 2. member `other`'s certificate, claiming to be the leader
            conn = await open_raw(victim.address, pki.credentials(member=other))
            for term in (10**6, 10**6 + 1):
                conn.oneway(Req.RAFT, heartbeat(leader, term))
                conn.oneway(Req.RAFT, timeout_now(leader, term))
            f = await conn.request(Req.STATUS, b"{}", 3.0)
            assert f.code == Code.SUCCESS
            conn.close()
            # 3. a certificate the cluster CA issued for a non-member: no member, no admin
            conn = await open_raw(victim.address, pki.credentials(member="evil"))
            conn.oneway(Req.RAFT, heartbeat(leader, 10**6))
            f = await conn.request(Req.TRANSFER_LEADER, b'{"target": "%s"}' % victim_id.encode(), 3.0)
            assert f.code == Code.AUTH_FAILED, f
            conn.close()

        async def dial_the_wrong_member():
            # the other way round: a member dialing `leader` at the victim's address finds out
            # (ClientConnection.open member=): the certificate there is the victim's
            host, port = victim.address.rsplit(":", 1)
            with pytest.raises(AuthenticationError, match=f"is not member {leader}"):
                await ClientConnection.open(host, int(port), 3.0, credentials=pki.credentials(member=other),
                                            member=leader)
            c = await ClientConnection.open(host, int(port), 3.0, credentials=pki.credentials(member=other),
                                            member=victim_id)
            c.close()

        victim_id = followers[0]
        asyncio.run(attack())
        asyncio.run(dial_the_wrong_member())
        time.sleep(1.5)  # several heartbeat intervals and more than an election timeout

        terms = {s["id"]: s["term"] for s in statuses(pki, nodes).values()}
        assert max(terms.values()) < SMALL_TERM, f"a forged term was adopted: {terms}"
        leader_after, _ = wait_leader(pki, nodes)  # one leader that every node follows

        log = log_text(victim)
        assert "a RAFT frame from user 'admin', not a group member: dropped" in log, victim.log_tail(30)
        assert (f"dropping a raft message claiming to be from {leader} on a connection whose "
                f"certificate proves {other}") in log, victim.log_tail(30)
        assert "a certificate for 'evil', not a member of this group" in log, victim.log_tail(30)
        assert "a RAFT frame before authenticating: dropped" in log, victim.log_tail(30)
        assert leader_after == leader, "the leader changed: a forged frame got through"
        acked |= produce(pki, nodes, 50, "after")
        got = read_all(pki, nodes, acked)
        missing = [k for k in acked if k not in got]
        assert not missing, f"{len(missing)} of {len(acked)} acknowledged messages lost"
        assert all(got[k] == v for k, v in acked.items())
    finally:
        stop_all(nodes)


# --- master-slave ----------------------------------------------------------------------------------

async def ha_handshake(address: str, ctx: ssl.SSLContext | None, hello: ha.Hello, timeout_s=3.0):
    """Connect to an HA port, send HELLO, read WELCOME: (welcome, reader, writer)."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(host, int(port), ssl=ctx, server_hostname=host if ctx else None), timeout_s)
    writer.write(ha.encode_handshake(hello))
    await writer.drain()
    head = await asyncio.wait_for(reader.readexactly(4), timeout_s)
    body = await asyncio.wait_for(reader.readexactly(int.from_bytes(head, "big")), timeout_s)
    welcome, _ = ha.decode_handshake(head + body, ha.Welcome)
    return welcome, reader, writer


def impostor_hello(node: str) -> ha.Hello:
    return ha.Hello(node=node, epochs=[], min_offset=0, end_offset=0, epoch_seen=0)


async def impersonate(address: str, ctx: ssl.SSLContext, node: str, until: float, log: list) -> None:
    """Keep claiming to be slave `node`: HELLO, and when welcomed, REPORT the master's end as
    held (what a forged slave ack is). Every refusal is noted in `log`."""
    while time.monotonic() < until:
        writer = None
        try:
            welcome, reader, writer = await ha_handshake(address, ctx, impostor_hello(node))
            if welcome.error:
                log.append(welcome.error)
                await asyncio.sleep(0.1)
                continue
            log.append("WELCOMED")
            held = welcome.start  # what it claims to hold: whatever the master says it has
            while time.monotonic() < until:
                writer.write(ha.REPORT.pack(held))  # as a slave does: at once, then steadily
                await writer.drain()
                try:
                    head = await asyncio.wait_for(reader.readexactly(ha.HEADER.size), 0.2)
                except asyncio.TimeoutError:
                    continue
                offset, size, _epoch, master_end, _confirm = ha.HEADER.unpack(head)
                if size:
                    await reader.readexactly(size)
                held = max(held, master_end, offset + size)
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError, asyncio.TimeoutError, ha.HAProtocolError) as e:
            log.append(f"{type(e).__name__}: {e}")
            await asyncio.sleep(0.1)
        finally:
            if writer is not None:
                writer.close()


def master_status(pki, master) -> dict:
    with Admin([master.address], **pki.client("admin"), request_timeout_ms=2000) as a:
        return a.status()["replication"]


def slave_connected(pki, master, slave_id: str) -> bool:
    st = master_status(pki, master)
    return slave_id in str(st.get("slaves") or st.get("in_sync") or st)


def test_forged_slave_cannot_acknowledge_sync_sends(tmp_path):
    pki = Pki(tmp_path)
    nodes = master_slave_group(pki, tmp_path, 2)
    master, slave = nodes
    ha_address = master.config["peers"][0]["ha_address"]  # the master's HA port
    try:
        start_all(nodes)
        with Admin([master.address], **pki.client("admin")) as a:
            a.create_topic(TOPIC, 2)
        with Producer([master.address], **pki.client("app"), send_timeout_ms=5000,
                      retry_times_when_send_failed=0) as p:
            deadline = time.monotonic() + 20
            while True:  # the first SYNC send succeeds once the slave has caught up
                try:
                    p.send(TOPIC, b"warm-up")
                    break
                except SendError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)

        # 1. no certificate: the HA port wants one (CERT_REQUIRED) -- no WELCOME, ever
        async def no_cert():
            ctx = client_context(pki.ca_file)
            with pytest.raises((ssl.SSLError, OSError, asyncio.IncompleteReadError, asyncio.TimeoutError)):
                await ha_handshake(ha_address, ctx, impostor_hello("n1"))
        asyncio.run(no_cert())

        # 2. a CA-issued certificate for a non-member, HELLO naming the real slave: refused
        evil = pki.node_cert("evil")
        evil_ctx = client_context(pki.ca_file, evil.cert_file, evil.key_file)

        async def impostor_once():
            welcome, _, writer = await ha_handshake(ha_address, evil_ctx, impostor_hello("n1"))
            writer.close()
            return welcome
        welcome = asyncio.run(impostor_once())
        assert welcome.error and "n1" in welcome.error and "evil" in welcome.error, welcome
        line = "its HELLO names n1 but its certificate proves evil"
        assert line in log_text(master), master.log_tail(20)

        async def impostor_as_itself():
            welcome, _, writer = await ha_handshake(ha_address, evil_ctx, impostor_hello("evil"))
            writer.close()
            return welcome
        welcome = asyncio.run(impostor_as_itself())
        assert welcome.error and "not a member" in welcome.error, welcome

        # the real slave is still connected: SYNC sends are acknowledged
        acked = {}
        with Producer([master.address], **pki.client("app"), send_timeout_ms=5000,
                      retry_times_when_send_failed=0) as p:
            for i in range(20):
                r = p.send(TOPIC, b"with-slave-%d" % i)
                acked[r.msg_id] = r

        # a user without the admin role cannot move the group either (promote with force, faults)
        with Admin([master.address], **pki.client("app")) as a:
            with pytest.raises(PermissionDenied, match="'app' may not promote"):
                a.promote("n1", force=True)
            with pytest.raises(PermissionDenied, match="'app' may not inject faults"):
                a.set_faults(master.address, drop_peers=["n1"])
        assert master_status(pki, master)["role"] == "master"

        # 3. the real slave dies; the impostor keeps trying: nothing more is acknowledged
        slave.kill()  # SIGKILL by pid
        outcomes, notes = [], []

        async def scenario():
            until = time.monotonic() + 6.0
            attacker = asyncio.create_task(impersonate(ha_address, evil_ctx, "n1", until, notes))
            await asyncio.sleep(0.5)
            p = Producer([master.address], **pki.client("app"), send_timeout_ms=4000,
                         retry_times_when_send_failed=0)
            try:
                while time.monotonic() < until - 1.0:
                    try:
                        r = await p.send_async(TOPIC, b"no-slave-%d" % len(outcomes))
                        outcomes.append(("SUCCESS", r.msg_id))
                    except SendError as e:
                        outcomes.append((e.code_name, e.stored))
            finally:
                await p.aclose()
                await attacker
        asyncio.run(scenario())

        assert outcomes, "no send was tried"
        assert "WELCOMED" not in notes, notes
        assert any("evil" in n for n in notes), notes  # it did keep trying, and was refused
        succeeded = [o for o in outcomes if o[0] == "SUCCESS"]
        assert not succeeded, f"SYNC sends acknowledged with no slave alive: {outcomes}"
        assert {o[0] for o in outcomes} <= {"SLAVE_NOT_AVAILABLE", "FLUSH_SLAVE_TIMEOUT"}, outcomes
    finally:
        stop_all(nodes)
