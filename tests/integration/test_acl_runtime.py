"""Users and roles changed at runtime (ACL_UPDATE, issue 14) on real secure broker processes:
enforced at once (new rights, and a deleted user loses access on its open connections too),
admin only, persisted in acl.json across a restart, and in raft mode replicated through the
log to every member (a user set through the leader logs in on the others after the leader
is killed); in master-slave mode a slave copies them with the metadata sync."""

from __future__ import annotations

import json
import os
import time

import pytest

from broker.client import Admin, AuthenticationError, PermissionDenied, Producer, SendError
from broker.client.security import Credentials
from broker.protocol.codes import Code, Req
from tests.secure import Pki, master_slave_group, open_raw, raft_group, run, standalone, start_all, stop_all

pytestmark = pytest.mark.slow

BOUNDED = {"send_timeout_ms": 3000, "retry_times_when_send_failed": 0, "failover_timeout_ms": 2000}
LATE_PW = "late-secret-9"


def login(pki, addresses, user, password, **kw):
    return Producer(addresses, ca_file=pki.ca_file, username=user, password=password, **BOUNDED, **kw)


def test_runtime_users_are_enforced_at_once_admin_only_and_survive_a_restart(tmp_path):
    pki = Pki(tmp_path)
    b = standalone(pki, tmp_path / "broker")
    b.start()
    try:
        with Admin([b.address], **pki.client("admin")) as a:
            a.create_topic("orders", 2)
            a.create_topic("other", 2)
            a.set_role("rw", pub=["orders"], sub=["orders"])
            view = a.set_user("late", LATE_PW, ["rw"])
        assert {"name": "late", "roles": ["rw"], "source": "runtime"} in view["users"]
        assert "SCRAM" not in repr(view)  # never a verifier on the wire
        with login(pki, [b.address], "late", LATE_PW) as p:
            p.send("orders", b"from late")
            with pytest.raises(SendError) as ei:
                p.send("other", b"not granted")
        assert ei.value.code == Code.NO_PERMISSION and "'late'" in str(ei.value)

        # only an admin changes users: app (pub/sub orders) is refused
        with Admin([b.address], **pki.client("app")) as a:
            with pytest.raises(PermissionDenied):
                a.set_user("sneaky", "pw", ["admin"])
            with pytest.raises(PermissionDenied):
                a.acl()

        async def delete_while_connected():
            conn = await open_raw(b.address, Credentials("late", LATE_PW, pki.ca_file))
            try:
                f = await conn.request(Req.LIST_TOPICS, b"{}", 3.0)
                assert f.code == Code.SUCCESS, f
                with Admin([b.address], **pki.client("admin")) as a:
                    view = await a.delete_user_async("late")
                assert "late" not in [u["name"] for u in view["users"]]
                # the same connection, already authenticated: refused on its next request
                f = await conn.request(Req.LIST_TOPICS, b"{}", 3.0)
                assert f.code == Code.AUTH_FAILED, f
            finally:
                conn.close()
        run(delete_while_connected())
        with login(pki, [b.address], "late", LATE_PW) as p:  # a new connection
            with pytest.raises(AuthenticationError):
                p.send("orders", b"after delete")

        with Admin([b.address], **pki.client("admin")) as a:
            a.set_user("late", LATE_PW + "-2", ["rw"])  # back, with another password
            a.delete_user("reader")  # a config user, deleted at runtime
        acl_file = b.data_dir / "config" / "acl.json"
        assert os.stat(acl_file).st_mode & 0o777 == 0o600
        assert LATE_PW not in acl_file.read_text()  # verifiers only
        b.stop()
        b.start()
        with login(pki, [b.address], "late", LATE_PW + "-2") as p:
            p.send("orders", b"after restart")
            with pytest.raises(SendError) as ei:
                p.send("other", b"still not granted")
            assert ei.value.code == Code.NO_PERMISSION
        with login(pki, [b.address], "reader", "reader-secret-3") as p:  # still deleted
            with pytest.raises(AuthenticationError):
                p.send("orders", b"x")
        with Admin([b.address], **pki.client("admin")) as a:
            users = {u["name"]: u for u in a.acl()["users"]}
        assert sorted(users) == ["admin", "app", "late"] and users["app"]["source"] == "config"
    finally:
        stop_all([b])


def wait_leader(pki, nodes, timeout_s=20.0) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            roles = {}
            for b in nodes:
                with Admin([b.address], **pki.client("admin"), request_timeout_ms=2000) as a:
                    roles[b.address] = a.status()["replication"]
            leaders = {s["id"] for s in roles.values() if s["role"] == "leader"}
            if len(leaders) == 1 and all(s.get("leader") in leaders for s in roles.values()):
                return leaders.pop()
        except Exception:  # noqa: BLE001 -- a node down or still starting
            pass
        if time.monotonic() > deadline:
            raise AssertionError("no single leader")
        time.sleep(0.2)


def test_raft_replicates_runtime_users_through_the_log(tmp_path):
    pki = Pki(tmp_path)
    nodes = raft_group(pki, tmp_path)
    try:
        start_all(nodes)
        leader = wait_leader(pki, nodes)
        by_id = {f"n{i}": b for i, b in enumerate(nodes)}
        with Admin([by_id[leader].address], **pki.client("admin")) as a:
            a.create_topic("orders", 2)
            a.set_role("rw", pub=["orders"], sub=["orders"])
            a.set_user("late", LATE_PW, ["rw"])
        for b in nodes:  # every member applied the committed entry, not only the leader
            path, deadline = b.data_dir / "config" / "acl.json", time.monotonic() + 10
            while not (path.exists() and '"late"' in path.read_text()):  # a follower applies a bit later
                assert time.monotonic() < deadline, f"no user late in {path}"
                time.sleep(0.05)
        by_id[leader].kill()
        others = [b for i, b in by_id.items() if i != leader]
        new_leader = wait_leader(pki, others)
        assert new_leader != leader
        for b in others:  # logs in on each survivor, by itself (no following of the leader)
            async def status_as_late(address=b.address):
                conn = await open_raw(address, Credentials("late", LATE_PW, pki.ca_file))
                try:
                    return await conn.request(Req.LIST_TOPICS, b"{}", 3.0)
                finally:
                    conn.close()
            assert run(status_as_late()).code == Code.SUCCESS
        with login(pki, [b.address for b in others], "late", LATE_PW) as p:
            p.send("orders", b"after the leader died")
        # a delete through the new leader reaches the survivors too
        with Admin([by_id[new_leader].address], **pki.client("admin")) as a:
            a.delete_user("late")
        for b in others:
            async def refused(address=b.address):
                deadline = time.monotonic() + 10
                while True:
                    try:
                        conn = await open_raw(address, Credentials("late", LATE_PW, pki.ca_file))
                        conn.close()
                    except AuthenticationError:
                        return
                    assert time.monotonic() < deadline, f"{address} still takes a deleted user"
                    time.sleep(0.1)
            run(refused())
    finally:
        stop_all(nodes)


def copied(overlay: dict) -> bool:
    users = overlay.get("users", {})
    return "late" in users and users.get("reader", "absent") is None


def test_a_slave_copies_runtime_users_with_the_metadata_sync(tmp_path):
    pki = Pki(tmp_path)
    nodes = master_slave_group(pki, tmp_path, metadata_sync_interval_ms=200)
    master, slave = nodes
    try:
        start_all(nodes)
        with Admin([master.address], **pki.client("admin")) as a:
            a.set_role("rw", pub=["orders"], sub=["orders"])
            a.set_user("late", LATE_PW, ["rw"])
            a.delete_user("reader")
        # a sync may copy the overlay between the set and the delete: wait for both (the delete
        # is kept as a tombstone, "reader": null)
        path, deadline = slave.data_dir / "config" / "acl.json", time.monotonic() + 15
        while not (path.exists() and copied(json.loads(path.read_text()))):
            assert time.monotonic() < deadline, f"the slave did not copy the master's users: {path}"
            time.sleep(0.1)

        async def login_on_slave(user, password):
            conn = await open_raw(slave.address, Credentials(user, password, pki.ca_file))
            conn.close()
        run(login_on_slave("late", LATE_PW))  # the slave itself knows the user
        with pytest.raises(AuthenticationError):
            run(login_on_slave("reader", "reader-secret-3"))  # and the delete
    finally:
        stop_all(nodes)
