"""The health verdict from crafted status rows."""

from ops.health import verdict


def raft_rows(**f2):
    leader = {"id": "a", "state": "up", "role": "leader", "term": 3, "end_index": 100,
              "followers": {"b": {"lag": 0}, "c": {"lag": 5}}}
    b = {"id": "b", "state": "up", "role": "follower", "term": 3, "leader": "a", "end_index": 100}
    c = {"id": "c", "state": "up", "role": "follower", "term": 3, "leader": "a", "end_index": 95}
    c.update(f2)
    return [leader, b, c]


def test_raft_healthy():
    v = verdict("raft", raft_rows(), 10, 0)
    assert v == {"verdict": "healthy", "leader": "a", "problems": [], "lagging": []}


def test_raft_degraded_cases():
    assert "lags the leader by 50" in verdict("raft", raft_rows(end_index=50), 10, 0)["problems"][0]
    assert "does not follow a yet" in verdict("raft", raft_rows(leader=None), 10, 0)["problems"][0]
    assert "term 2" in verdict("raft", raft_rows(term=2), 10, 0)["problems"][0]
    v = verdict("raft", raft_rows(state="unreachable", error="refused"), 10, 0)
    assert v["verdict"] == "degraded" and "c is unreachable (refused)" in v["problems"]
    assert v["lagging"] == ["c"]


def test_raft_down_without_leader():
    rows = raft_rows()
    rows[0]["role"] = "candidate"
    assert verdict("raft", rows, 10, 0)["verdict"] == "down"


def test_two_leaders_newest_term_wins():
    rows = raft_rows()
    rows[1].update(role="leader", term=4, followers={})
    assert verdict("raft", rows, 10, 0)["leader"] == "b"


def test_master_slave():
    m = {"id": "m", "state": "up", "role": "master"}
    s = {"id": "s", "state": "up", "role": "slave", "connected": True, "master": "m", "lag_bytes": 10}
    assert verdict("master-slave", [m, s], 0, 100)["verdict"] == "healthy"
    assert "not connected" in verdict("master-slave", [m, dict(s, connected=False)], 0, 100)["problems"][0]
    assert "lags the master by 500" in verdict("master-slave", [m, dict(s, lag_bytes=500)], 0, 100)["problems"][0]
    assert verdict("master-slave", [dict(m, state="unreachable"), s], 0, 100)["verdict"] == "down"


def test_a_sync_master_short_of_its_in_sync_replicas_is_down():
    """It refuses every send (SLAVE_NOT_AVAILABLE): down, not degraded (a new user killed both
    slaves of a SYNC group and status said degraded while produce failed)."""
    repl = {"ha_replication": "sync", "in_sync_count": 1, "required_replicas": 2}
    m = {"id": "m", "state": "up", "role": "master", "replication": repl}
    gone = [{"id": s, "state": "unreachable", "error": "refused"} for s in ("s1", "s2")]
    v = verdict("master-slave", [m, *gone], 0, 100)
    assert v["verdict"] == "down" and v["leader"] == "m", v
    assert v["problems"][0] == "master m refuses writes: 1 of the 2 replicas it requires are in sync (SYNC replication)"
    # an ASYNC master, or one with enough in sync, takes writes: degraded at worst
    assert verdict("master-slave", [dict(m, replication=dict(repl, ha_replication="async")), *gone], 0, 100)[
        "verdict"] == "degraded"
    assert verdict("master-slave", [dict(m, replication=dict(repl, in_sync_count=2)), *gone], 0, 100)[
        "verdict"] == "degraded"


def test_standalone():
    n = {"id": "n0", "state": "up", "role": "standalone"}
    assert verdict("standalone", [n], 0, 0) == {"verdict": "healthy", "leader": "n0", "problems": [],
                                                "lagging": []}
    v = verdict("standalone", [{"id": "n0", "state": "unreachable", "error": "refused"}], 0, 0)
    assert v["verdict"] == "down" and "n0 is unreachable (refused)" in v["problems"]


# --- the name servers' view (docs/design/name-server.md §9) ---------------------------------------

def _groups():
    node = lambda i, a: {"id": i, "address": a}  # noqa: E731
    return [{"name": "g0", "leader": "g0-a", "nodes": [node("g0-a", "10.0.0.1:1"), node("g0-b", "10.0.0.2:1")]},
            {"name": "g1", "leader": None, "nodes": [node("g1-a", "10.0.0.1:2")]}]


def _ns(gid="ns-h1", **groups):
    seen = {"g0": {"leader_id": "g0-a", "leader": "10.0.0.1:1", "term": 2, "nodes": 2},
            "g1": {"leader_id": None, "leader": None, "term": 0, "nodes": 1}}
    seen.update(groups)
    return {"id": gid, "address": "10.0.0.1:9876", "state": "up",
            "groups": {k: v for k, v in seen.items() if v is not None}}


def test_namesrv_agreeing_with_every_group_is_healthy():
    # g1 has no leader of its own: its group row says so (down); the name server is not blamed
    from ops.health import namesrv_verdict
    assert namesrv_verdict([_ns(), _ns("ns-h2")], _groups()) == {"verdict": "healthy", "problems": []}


def test_namesrv_disagreements_degrade_naming_why():
    from ops.health import namesrv_verdict
    other = {"leader_id": "g0-b", "leader": "10.0.0.2:1", "term": 1, "nodes": 2}
    v = namesrv_verdict([_ns(g0=other), _ns("ns-h2", g1=None),
                         {"id": "ns-h3", "address": "x:1", "state": "unreachable", "error": "refused"}], _groups())
    assert v["verdict"] == "degraded"
    assert v["problems"] == [
        "name server ns-h1 routes group g0 to g0-b (10.0.0.2:1), the group's STATUS says g0-a (10.0.0.1:1)",
        "name server ns-h2 does not list group g1",
        "name server ns-h3 is unreachable (refused)"]


# --- caught up: what a drill waits for before it compares the replicas' logs -------------------

def test_behind_names_followers_the_leader_still_has_entries_for():
    from ops.health import behind

    rows = raft_rows()
    rows[0]["followers"] = {"b": {"state": "append", "lag": 0}, "c": {"state": "append", "lag": 5}}
    g = {"name": "g0", "mode": "raft", "leader": "a", "nodes": rows}
    assert behind(g) == {"c": "the leader a sees it in append with 5 entries to send"}
    rows[0]["followers"]["c"] = {"state": "compare", "lag": 0}  # healthy, yet not known to match
    assert behind(g) == {"c": "the leader a sees it in compare with 0 entries to send"}
    rows[0]["followers"]["c"] = {"state": "append", "lag": 0}
    assert behind(g) == {}
    rows[2] = {"id": "c", "state": "unreachable"}
    assert behind(g) == {"c": "unreachable"}
    assert behind(dict(g, leader=None)) == {"a": "no leader", "b": "no leader", "c": "no leader"}


def test_behind_for_master_slave_is_the_byte_lag():
    from ops.health import behind

    m = {"id": "m", "state": "up", "role": "master"}
    s = {"id": "s", "state": "up", "role": "slave", "connected": True, "master": "m", "lag_bytes": 0}
    g = {"name": "g0", "mode": "master-slave", "leader": "m", "nodes": [m, s]}
    assert behind(g) == {}
    assert behind(dict(g, nodes=[m, dict(s, lag_bytes=10)])) == {"s": "10 bytes behind the master"}
    assert behind(dict(g, nodes=[m, dict(s, connected=False)])) == {"s": "not connected to the master"}
