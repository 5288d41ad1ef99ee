"""The platform with name servers (issue 16, docs/design/name-server.md §9): `LocalCluster.up`
with 2 raft groups × 3 nodes behind 2 name servers, secure (the default), as `tidelog cluster up
--groups 2 --namesrv 2` makes it. Deploy's route gate has passed when `up` returns; `status`
shows both name servers routing both groups to the leaders the groups report; a topic created
on every group through the name servers takes 200 messages and gives all 200 back (the CLI, with
the exports of `cluster env`); `collect` copies every group's nodes and keeps the name servers'
view; a whole-cluster rolling upgrade under load (sends through the name servers) moves the
name servers one at a time (each refilled by both groups before the next goes down), then g0,
then g1, losing no acknowledged send, and its rollback returns every process to the build
before; `tidelog stop` / `start` take the name servers last / first and come back healthy with
the routes; `cluster down` leaves no process of it (checked by pid).
"""

import json
import os
import shlex
import signal
import subprocess
import sys

import pytest

from ops import health
from ops.build import build_wheel, tree_version
from ops.cluster import LocalCluster
from ops.collect import collect
from ops.localbroker import pid_alive
from ops.upgrade import rollback, upgrade

pytestmark = pytest.mark.slow

COUNT = 200


def tidelog(*args, env):
    return subprocess.run([sys.executable, "-m", "ops.cli.main", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def test_two_groups_behind_two_name_servers(tmp_path):
    d = tmp_path / "c"
    c = LocalCluster(d)
    pids: list[int] = []
    try:
        c.up(3, "raft", wait=True, groups=2, namesrv=2)
        pids = [n.pid for n in c.nodes + c.namesrvs]
        assert len(pids) == 8 and all(pids), pids
        assert [n.id for n in c.namesrvs] == ["ns-n0", "ns-n1"]

        # status: both name servers, both groups, each routed to the leader the group reports
        st = c.health()
        assert st["verdict"] == "healthy", st
        leaders = {g["name"]: g["leader"] for g in st["groups"]}
        assert set(leaders) == {"g0", "g1"} and all(leaders.values())
        ns = st["namesrv"]
        assert ns["verdict"] == "healthy" and ns["problems"] == []
        assert [r["id"] for r in ns["servers"]] == ["ns-n0", "ns-n1"]
        for r in ns["servers"]:
            assert r["state"] == "up" and r["pid"] in pids
            assert {g: v["leader_id"] for g, v in r["groups"].items()} == leaders
            assert all(v["nodes"] == 3 for v in r["groups"].values())
        env = dict(os.environ)
        for line in tidelog("cluster", "env", "--data-dir", str(d), env=env).stdout.splitlines():
            k, _, v = line.removeprefix("export ").partition("=")
            env[k] = shlex.split(v)[0]
        namesrv = ",".join(c.namesrv_addresses)
        assert env["TIDELOG_NAMESRV"] == namesrv and env["TIDELOG_CREDENTIALS"] == str(c.credentials_file)
        r = tidelog("status", "--spec", str(c.spec_path), env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "name servers: healthy" in r.stdout and "ns-n0" in r.stdout and "ns-n1" in r.stdout
        assert r.stdout.count(f"{leaders['g0']} (term") == 2 and r.stdout.count(f"{leaders['g1']} (term") == 2

        # clients through the name servers: a topic on every group, 200 sent, 200 read
        r = tidelog("topic", "create", "T", "--namesrv", namesrv, "--groups", "all", "--json", env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert set(json.loads(r.stdout)) == {"g0", "g1"}
        r = tidelog("produce", "--namesrv", namesrv, "--topic", "T", "--count", str(COUNT), "--size", "64",
                    "--json", env=env)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["acked"] == COUNT
        r = tidelog("consume", "--namesrv", namesrv, "--topic", "T", "--group", "readers", "--count", str(COUNT),
                    "--json", env=env)
        assert r.returncode == 0, r.stderr
        got = [json.loads(line) for line in r.stdout.splitlines()]
        assert len(got) == COUNT and len({m["msg_id"] for m in got}) == COUNT
        assert {m["broker_name"] for m in got} == {"g0", "g1"}  # spread over both groups

        # collect covers every group, and keeps the name servers' view beside the groups' own
        spec = c.spec
        col = collect(spec, tmp_path / "collected")
        assert col["missing"] == [] and {n["group"] for n in col["nodes"]} == {"g0", "g1"}, col
        assert all((tmp_path / "collected" / spec.name / n["id"] / "commitlog").is_dir() for n in col["nodes"])
        assert [r["id"] for r in col["namesrv"]["servers"]] == ["ns-n0", "ns-n1"] and col["namesrv"]["verdict"] == "healthy"
        assert all(set(r["groups"]) == {"g0", "g1"} for r in col["namesrv"]["servers"]), col["namesrv"]

        # a whole-cluster roll under load: name servers one at a time, then group by group
        wheel = build_wheel(tmp_path / "dist", version="0.1.97")
        r = upgrade(spec, str(wheel), workload_rate=100)
        pids = [n.pid for n in c.nodes + c.namesrvs]
        w = r["workload"]
        assert w["safe"] and w["counts"]["lost"] == 0 and w["ok"] > 50, w
        assert set(w["ok_by_group"]) == {"g0", "g1"} and all(w["ok_by_group"].values()), w
        assert r["group"] == "all" and set(r["versions"].values()) == {"0.1.97"} and len(r["versions"]) == 8, r
        order = [s["node"] for s in r["steps"] if "node" in s]
        g0, g1 = ({p.id for p in spec.nodes(g)} for g in ("g0", "g1"))
        assert order[:2] == ["ns-n0", "ns-n1"] and set(order[2:5]) == g0 and set(order[5:]) == g1, order
        assert all(s["routes_refilled_s"] < spec.health.timeout_s for s in r["steps"] if s.get("kind") == "namesrv")
        back = rollback(spec)
        pids = [n.pid for n in c.nodes + c.namesrvs]
        assert sorted(back["rolled_back"]) == sorted(order), back
        st = health.wait_healthy(spec)
        assert st["verdict"] == "healthy", st
        assert {row["version"] for g in st["groups"] for row in g["nodes"]} == {tree_version()}
        assert all(not o.build().startswith("0.1.97") for o in c._namesrv_ops())
        pids = [n.pid for n in c.nodes + c.namesrvs]

        # stop: the groups, then the name servers; start: the reverse, then healthy with routes again
        r = tidelog("stop", "--spec", str(c.spec_path), "--json", env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert list(json.loads(r.stdout))[-2:] == ["ns-n0", "ns-n1"]
        assert not [p for p in pids if pid_alive(p)] and c.running() == []
        r = tidelog("start", "--spec", str(c.spec_path), "--json", env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        started = json.loads(r.stdout)
        assert list(started)[:2] == ["ns-n0", "ns-n1"] and started["verdict"] == "healthy", started
        pids = [n.pid for n in c.nodes + c.namesrvs]
        assert len(pids) == 8 and all(pids), pids
        r = tidelog("consume", "--namesrv", namesrv, "--topic", "T", "--group", "again", "--count", str(COUNT),
                    "--json", env=env)
        assert r.returncode == 0 and len(r.stdout.splitlines()) == COUNT, r.stderr

        r = tidelog("cluster", "down", "--data-dir", str(d), env=env)
        assert r.returncode == 0 and "stopped 8 node(s)" in r.stdout, r.stdout + r.stderr
        assert not [p for p in pids if pid_alive(p)] and c.running() == []
    finally:
        try:  # restarted by the roll: the pids the cluster has now, besides those seen before
            pids = pids + [n.pid for n in c.nodes + c.namesrvs]
        except Exception:  # noqa: BLE001 - no spec written yet
            pass
        for pid in set(pids):  # after a failure: whatever still runs, by pid
            if pid and pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
