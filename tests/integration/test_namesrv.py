"""Name servers and broker registration with real processes, security on (issue 16, first part;
docs/design/name-server.md §2-4): two name servers, a 3-node raft group `g0` and a standalone
broker `g1`, every node registering with both name servers over its member certificate.

- both name servers list both groups, each with the leader the group itself reports;
- GET_TOPIC_ROUTE of a topic created on both groups returns both groups' queues and leaders;
- registration is taken from member certificates only: a user login, even admin, is refused;
- SIGKILL of g0's leader: both name servers drop it at once (its connections close, rule N4) and
  show the new leader within a bounded time (it re-registers on its role change);
- a name server restarted empty is refilled by the brokers' reconnect.
Every process is stopped by pid in the finalizers.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from broker.client import Admin
from broker.protocol import jsonbody
from broker.protocol import namesrv as ns
from broker.protocol.codes import Code, Req
from broker.protocol.topics import TopicName
from ops.localbroker import LocalBroker, free_ports, pid_alive, stop_pid
from broker.security.ca import issue_node_cert
from tests.secure import QUICK, Pki, open_raw, raft_group, stop_all, user_entries, ROLES

pytestmark = pytest.mark.slow

TOPIC = "orders"
REROUTE_BOUND_S = 10.0  # election (600 ms timeout here) + one registration round trip, with room


class GroupPki(Pki):
    """A Pki whose node certificates name their broker group (tidelog-group:<broker_name>), as
    deploy issues them: a name server takes a group's registrations from those only. `groups`:
    member id -> group (a member not in it gets a certificate naming none, as before issue 39)."""

    def __init__(self, root: Path, groups: dict[str, str], **kw):
        super().__init__(root, **kw)
        self.groups = groups

    def node_cert(self, node_id: str, addresses=("127.0.0.1",)):
        return issue_node_cert(self.ca, self.dir / "nodes", node_id, list(addresses), group=self.groups.get(node_id))


# the world's certificates: g0's raft nodes, g1's standalone b0; x9 names g0 but is no raft peer
# of it (a node taken out of the group that kept its certificate)
GROUPS = {"n0": "g0", "n1": "g0", "n2": "g0", "b0": "g1", "x9": "g0"}


class LocalNameServer:
    """`tidelog namesrv start --config namesrv.yaml` as a child process on loopback."""

    def __init__(self, root: Path, pki: Pki, ns_id: str, port: int):
        self.dir = Path(root) / ns_id
        self.port = port
        self.config = {"listen": f"127.0.0.1:{port}", "namesrv_id": ns_id, "tls": pki.tls(ns_id),
                       "users": user_entries(), "roles": ROLES, "insecure": False,
                       "startup_grace_ms": 0}
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> LocalNameServer:
        import socket
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / "namesrv.yaml"
        path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        with open(self.dir / "namesrv.log", "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "ops.cli.main", "namesrv", "start", "--config", str(path)],
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"name server exited:\n{self.log()}"
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"name server did not listen within 20 s:\n{self.log()}")

    def stop(self) -> None:
        if self.proc is not None:
            stop_pid(self.proc.pid, 10)
            self.proc.wait()
            self.proc = None

    def log(self) -> str:
        try:
            return (self.dir / "namesrv.log").read_text(errors="replace")[-4000:]
        except OSError:
            return "(no log)"


async def ask(pki: Pki, address: str, code: int, body=b"{}", user: str = "reader", member: str | None = None):
    conn = await open_raw(address, pki.credentials(user, member=member))
    try:
        f = await conn.request(code, body, 5.0)
        return f.code, bytes(f.body), f.headers.get("error", "")
    finally:
        conn.close()


def cluster_info(pki: Pki, address: str) -> ns.ClusterInfo:
    code, body, err = asyncio.run(ask(pki, address, Req.GET_CLUSTER_INFO))
    assert code == Code.SUCCESS, err
    return jsonbody.decode(ns.ClusterInfo, body)


def route(pki: Pki, address: str, topic: str) -> ns.TopicRoute | None:
    code, body, err = asyncio.run(ask(pki, address, Req.GET_TOPIC_ROUTE, jsonbody.encode(TopicName(topic))))
    if code == Code.TOPIC_NOT_EXIST:
        return None
    assert code == Code.SUCCESS, err
    return jsonbody.decode(ns.TopicRoute, body)


def wait_until(what: str, check, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.05)


def groups_of(info: ns.ClusterInfo) -> dict[str, ns.GroupInfo]:
    return {g.broker_name: g for g in info.groups}


@pytest.fixture(scope="module")
def world(tmp_path_factory, request):
    root = tmp_path_factory.mktemp("namesrv")
    pki = GroupPki(root, GROUPS)
    ports = free_ports(2)
    names = [LocalNameServer(root, pki, f"ns{i}", ports[i]) for i in range(2)]
    request.addfinalizer(lambda: [n.stop() for n in names])
    for n in names:
        n.start()
    reg = {"namesrv_addresses": [n.address for n in names], "cluster_name": "test"}
    g0 = raft_group(pki, root / "g0", 3, broker_name="g0", **reg)
    # a standalone registers under node_id: its certificate's member id (b0)
    g1 = LocalBroker(root / "g1", **pki.broker_config("b0", **QUICK, broker_name="g1", node_id="b0", **reg))
    nodes = [*g0, g1]
    request.addfinalizer(lambda: stop_all(nodes))
    for b in nodes:
        b.start()
    return pki, names, g0, g1


def group_leader(pki: Pki, nodes: list[LocalBroker]) -> LocalBroker:
    """The node whose own STATUS says it leads."""
    def find():
        for b in nodes:
            if b.proc is None:
                continue
            with Admin([b.address], **pki.client("admin")) as a:
                try:
                    if a.status()["role"] == "leader":
                        return b
                except Exception:  # noqa: BLE001 -- not up yet
                    pass
        return None
    return wait_until("a raft leader", find, 15)


def test_both_name_servers_list_both_groups_with_their_leader(world):
    pki, names, g0, g1 = world
    leader = group_leader(pki, g0)
    for n in names:
        def ok(n=n):
            gs = groups_of(cluster_info(pki, n.address))
            return (set(gs) == {"g0", "g1"} and gs["g0"].leader == leader.address and len(gs["g0"].nodes) == 3
                    and gs["g1"].leader == g1.address and gs["g1"].nodes[0].role == "standalone")
        wait_until(f"{n.address} lists g0 (leader {leader.address}) and g1", ok, 10)
    info = cluster_info(pki, names[0].address)
    assert info.clusters == {"test": ["g0", "g1"]}
    assert {x.role for x in groups_of(info)["g0"].nodes} == {"leader", "follower"}


def test_route_of_a_topic_on_both_groups(world):
    pki, names, g0, g1 = world
    with Admin([b.address for b in g0], **pki.client("admin")) as a:
        a.create_topic(TOPIC, 4)
    with Admin([g1.address], **pki.client("admin")) as a:
        a.create_topic(TOPIC, 2)
    leader = group_leader(pki, g0)
    for n in names:  # the leaders re-register on the topic change, not 30 s later
        r = wait_until(f"{n.address} routes {TOPIC} over both groups",
                       lambda n=n: (r := route(pki, n.address, TOPIC)) and len(r.groups) == 2 and r, 5)
        assert [(g.broker_name, g.write_queues, g.leader) for g in r.groups] == [
            ("g0", 4, leader.address), ("g1", 2, g1.address)]
        assert sorted(r.groups[0].followers) == sorted(b.address for b in g0 if b is not leader)
        assert r.groups[0].term >= 1
    assert route(pki, names[0].address, "no-such-topic") is None


def test_only_member_certificates_may_register(world):
    pki, names, g0, g1 = world
    body = jsonbody.encode(ns.RegisterBroker("test", "g0", "n0", "10.9.9.9:1", "raft", "leader", 10**6, 0, 0,
                                             [ns.TopicQueues(TOPIC, 64, 64, 6)]))
    addr = names[0].address
    # admin is authenticated (SCRAM) but is a user: NO_PERMISSION, the code for "known, not
    # allowed" -- a forged registration would steer every producer to 10.9.9.9
    code, _, err = asyncio.run(ask(pki, addr, Req.REGISTER_BROKER, body, user="admin"))
    assert code == Code.NO_PERMISSION and "member certificate" in err, err
    # TLS with neither a login nor a member certificate: AUTH_FAILED, nobody was proven
    code, _, err = asyncio.run(ask(pki, addr, Req.REGISTER_BROKER, body, user=None))
    assert code == Code.AUTH_FAILED, err
    # a member certificate of another node: it may only register itself
    code, _, err = asyncio.run(ask(pki, addr, Req.REGISTER_BROKER, body, user=None, member="n1"))
    assert code == Code.NO_PERMISSION and "not node_id 'n0'" in err, err
    # its own certificate, yet another host's address: a node registers only where it connects from
    code, _, err = asyncio.run(ask(pki, addr, Req.REGISTER_BROKER, body, user=None, member="n0"))
    assert code == Code.NO_PERMISSION and "10.9.9.9:1" in err and "127.0.0.1" in err, err
    assert "10.9.9.9:1" not in {g.leader for g in cluster_info(pki, addr).groups}


def test_a_member_of_one_group_cannot_register_in_another(world):
    """Issue 39 item 2: g1's standalone b0 (its certificate names g1) claims g0's leadership
    with a huge term, from its own address; a certificate naming no group (issued before groups
    were named) may not register at all. Both NO_PERMISSION; g0 keeps its leader and topics."""
    pki, names, g0, g1 = world
    addr = names[0].address
    leader = group_leader(pki, g0)
    huge = (1 << 63) - 1
    for member, group, why in (("b0", "g0", "names broker group 'g1', not 'g0'"),
                               ("ng", "g0", "names no broker group")):
        body = jsonbody.encode(ns.RegisterBroker("test", group, member, "127.0.0.1:1", "raft", "leader", huge, huge,
                                                 0, [ns.TopicQueues(TOPIC, 64, 64, 6)], member))
        code, _, err = asyncio.run(ask(pki, addr, Req.REGISTER_BROKER, body, user=None, member=member))
        assert code == Code.NO_PERMISSION and why in err, err
    g = groups_of(cluster_info(pki, addr))["g0"]
    assert g.leader == leader.address and "b0" not in {x.node_id for x in g.nodes}


def test_a_node_of_the_group_with_a_made_up_term_is_not_routed(world):
    """Issue 39 item 2 within the group: x9's certificate names g0 (a node taken out of it), and
    it registers as g0's leader with a huge term and a topic of its own. Taken, but not routed:
    none of g0's nodes follows it (rule N3); its connection's close drops it."""
    pki, names, g0, g1 = world
    addr = names[0].address
    leader = group_leader(pki, g0)
    huge = (1 << 63) - 1

    async def forge():
        conn = await open_raw(addr, pki.credentials(None, member="x9"))
        try:
            body = jsonbody.encode(ns.RegisterBroker("test", "g0", "x9", "127.0.0.1:1", "raft", "leader", huge, 0, 0,
                                                     [ns.TopicQueues("evil", 8, 8, 6)], "x9"))
            f = await conn.request(Req.REGISTER_BROKER, body, 5.0)
            assert f.code == Code.SUCCESS, f.headers
            return jsonbody.decode(ns.RegisterResult, f.body), await asyncio.to_thread(cluster_info, pki, addr)
        finally:
            conn.close()

    result, info = asyncio.run(forge())
    assert result.leader_address == leader.address  # the name server says who leads: not x9
    g = groups_of(info)["g0"]
    assert g.leader == leader.address and {x.node_id: x.role for x in g.nodes}["x9"] == "follower"
    assert route(pki, addr, "evil") is None
    wait_until("x9 dropped with its connection",
               lambda: "x9" not in {x.node_id for x in groups_of(cluster_info(pki, addr))["g0"].nodes}, 5)


def test_registrations_without_a_member_certificate_count_as_failed_logins(world):
    """Issue 39 item 8: REGISTER/UNREGISTER from a connection with neither a member certificate
    nor a login were answered AUTH_FAILED forever (only the 10 s auth deadline closed it); they
    count as failed logins now, and the third closes the connection."""
    pki, names, g0, g1 = world
    body = jsonbody.encode(ns.NodeRef("g0", "n0"))

    async def spam():
        conn = await open_raw(names[0].address, pki.credentials(None))
        t0 = time.monotonic()
        codes = []
        try:
            for _ in range(5):
                try:
                    f = await conn.request(Req.UNREGISTER_BROKER if codes else Req.REGISTER_BROKER, body, 5.0)
                except Exception as e:  # noqa: BLE001 -- the connection closed
                    codes.append(type(e).__name__)
                    break
                codes.append(f.code)
            return codes, time.monotonic() - t0
        finally:
            conn.close()

    codes, took = asyncio.run(spam())
    assert codes[:3] == [Code.AUTH_FAILED] * 3 and len(codes) == 4 and codes[3] not in (Code.AUTH_FAILED,), codes
    assert took < 5, took  # closed by the count, not by the auth deadline
    assert "n0" in {x.node_id for x in groups_of(cluster_info(pki, names[0].address))["g0"].nodes}


def test_leader_kill_is_rerouted_on_both_name_servers(world):
    pki, names, g0, g1 = world
    old = group_leader(pki, g0)
    old_id = f"n{g0.index(old)}"
    t0 = time.monotonic()
    old.kill()  # SIGKILL: its connections to the name servers close with it
    for n in names:
        def rerouted(n=n):
            g = groups_of(cluster_info(pki, n.address)).get("g0")
            return (g is not None and g.leader not in (None, old.address)
                    and old_id not in {x.node_id for x in g.nodes} and g)
        g = wait_until(f"{n.address} shows g0's new leader", rerouted, REROUTE_BOUND_S)
        assert len(g.nodes) == 2
    took = time.monotonic() - t0
    new = group_leader(pki, g0)
    r = route(pki, names[1].address, TOPIC)
    assert r.groups[0].leader == new.address and r.groups[0].write_queues == 4
    print(f"leader kill: both name servers showed the new leader {took:.2f} s after the SIGKILL")


def test_a_restarted_name_server_is_refilled_on_reconnect(world):
    pki, names, g0, g1 = world
    ns1 = names[1]
    ns1.stop()
    ns1.start()  # empty: nothing on disk
    t0 = time.monotonic()
    leader = group_leader(pki, g0)

    def refilled():
        gs = groups_of(cluster_info(pki, ns1.address))
        r = route(pki, ns1.address, TOPIC)
        return (set(gs) == {"g0", "g1"} and gs["g0"].leader == leader.address and r is not None
                and len(r.groups) == 2)
    wait_until("the restarted name server lists both groups and the route again", refilled, 10)
    print(f"name server restart: refilled {time.monotonic() - t0:.2f} s after it listened")
    assert all(pid_alive(b.pid) for b in [*g0, g1] if b.proc is not None)  # brokers never noticed
