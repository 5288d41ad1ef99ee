"""`tidelog cluster up|status|down` + produce/consume, as a new user would run them (README)."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import broker
from ops.localbroker import pid_alive

pytestmark = pytest.mark.slow

TIDELOG = str(Path(sys.executable).parent / "tidelog")
WAIT_S = 60.0  # a bound for a group to settle, not a timing claim


def tidelog(*args, env):
    return subprocess.run([sys.executable, "-m", "ops.cli.main", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def status(d, env) -> tuple[int, dict]:
    r = tidelog("cluster", "status", "--data-dir", d, "--json", env=env)
    assert r.returncode in (0, 1, 2) and not r.stderr, r.stderr
    st = json.loads(r.stdout)
    # scripts read the one group's nodes on top (../shared/peers/compare.sh takes their pids)
    assert st["nodes"] == st["groups"][0]["nodes"] and st["mode"] == st["groups"][0]["mode"]
    return r.returncode, st


def wait_verdict(d, env, verdict: str) -> tuple[int, dict]:
    deadline = time.monotonic() + WAIT_S
    while True:
        rc, st = status(d, env)
        if st["verdict"] == verdict or time.monotonic() > deadline:
            return rc, st
        time.sleep(0.2)


def node_pid(d, node: str) -> int:
    return json.loads((Path(d) / "nodes" / node / "data" / "broker.json").read_text())["pid"]


def rows(st: dict) -> dict:
    return {r["id"]: r for r in st["groups"][0]["nodes"]}


def kill_all(pids) -> None:
    """Whatever the test started and is still running (after a failure): kill -9, by pid."""
    for pid in pids:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_cluster_commands(tmp_path):
    """A raft group: up, produce/consume, status (exit codes), a node stopped and started through
    `tidelog stop|start --spec DIR/cluster.yaml`, transfer-leader, down."""
    d = str(tmp_path / "c")
    env = {**os.environ, "TIDELOG_CLUSTER_DIR": d}
    pids = []
    try:
        r = tidelog("cluster", "up", "--nodes", "3", "--mode", "raft", env=env)
        assert r.returncode == 0, r.stderr
        assert "raft group of 3 up" in r.stdout and "leader n" in r.stdout
        pids = [node_pid(d, n) for n in ("n0", "n1", "n2")]
        # the default directory (TIDELOG_CLUSTER_DIR): the CLI finds the credentials by itself
        assert "\ntry: tidelog produce -b " in r.stdout and "cluster env" not in r.stdout
        r = tidelog("cluster", "up", "--nodes", "3", "--mode", "raft", env=env)
        assert r.returncode == 1 and "already running" in r.stderr
        b = tidelog("cluster", "bootstrap", env=env).stdout.strip()
        assert b.count(",") == 2
        r = tidelog("produce", "-b", b, "--topic", "t", "--count", "500", "--json", env=env)
        assert r.returncode == 0 and json.loads(r.stdout)["acked"] == 500, r.stderr
        r = tidelog("consume", "-b", b, "--topic", "t", "--group", "g", "--count", "500", "--quiet", env=env)
        assert r.returncode == 0, r.stderr
        rc, st = status(d, env)
        g = st["groups"][0]
        assert rc == 0 and st["verdict"] == "healthy" and g["leader"] and g["mode"] == "raft"
        assert sorted(n["role"] for n in g["nodes"]) == ["follower", "follower", "leader"]
        assert sorted(n["pid"] for n in g["nodes"]) == sorted(pids)
        leader = rows(st)[g["leader"]]["replication"]
        assert all(f["lag"] == 0 for f in leader["followers"].values())
        assert leader["commit_index"] >= 1  # entries: the 500 messages ride in record batches
        target = next(n["id"] for n in g["nodes"] if n["role"] == "follower")
        spec = f"{d}/cluster.yaml"  # the same cluster through the platform commands
        r = tidelog("stop", "--spec", spec, "--node", target, env=env)
        assert r.returncode == 0, r.stderr
        r = tidelog("cluster", "status", env=env)
        assert r.returncode == 1 and "degraded" in r.stdout and f"{target} is stopped (no process)" in r.stdout
        r = tidelog("start", "--spec", spec, "--node", target, env=env)
        assert r.returncode == 0, r.stderr
        pids.append(node_pid(d, target))
        rc, st = wait_verdict(d, env, "healthy")
        assert rc == 0 and rows(st)[target]["pid"] == pids[-1], st
        r = tidelog("admin", "transfer-leader", "-b", b, "--to", target, env=env)
        assert r.returncode == 0 and re.fullmatch(rf"{target} leads \(term \d+\)\n", r.stdout), r.stdout + r.stderr
        deadline = time.monotonic() + WAIT_S  # it returned once the target led
        while (g := status(d, env)[1]["groups"][0])["leader"] != target:
            assert time.monotonic() < deadline, g
            time.sleep(0.2)
        r = tidelog("admin", "transfer-leader", "-b", b, "--to", target, env=env)  # it leads already
        said = re.fullmatch(rf"{target} already leads \(term (\d+)\): no transfer started\n", r.stdout)
        assert r.returncode == 0 and said, r.stdout + r.stderr
        assert int(said.group(1)) <= rows(status(d, env)[1])[target]["term"]  # (an election since only raises it)
        assert status(d, env)[1]["groups"][0]["leader"] == target
        r = tidelog("admin", "transfer-leader", "-b", b, "--to", "nobody", env=env)
        assert r.returncode == 1 and "no node 'nobody' in group" in r.stderr and "(members: n0, n1, n2)" in r.stderr, \
            r.stderr
        r = tidelog("cluster", "status", env=env)
        assert r.returncode == 0 and "healthy" in r.stdout and "committed" in r.stdout
        header = next(line for line in r.stdout.splitlines() if line.startswith("node "))
        assert header.split()[:6] == ["node", "address", "state", "role", "version", "pid"], r.stdout
        nodes = [line for line in r.stdout.splitlines() if line.startswith(("n0 ", "n1 ", "n2 "))]
        assert len(nodes) == 3 and all(line.split()[4] == broker.__version__ for line in nodes), r.stdout
    finally:
        r = tidelog("cluster", "down", env=env)
        kill_all(pids)
    assert r.returncode == 0 and "stopped 3 node(s)" in r.stdout, r.stdout + r.stderr
    assert not any(pid_alive(p) for p in pids)
    rc, st = status(d, env)
    assert rc == 2 and st["verdict"] == "down"
    assert [n["state"] for n in st["groups"][0]["nodes"]] == ["stopped"] * 3  # not "unreachable"
    assert "n0 is stopped (no process)" in st["groups"][0]["problems"], st["groups"][0]["problems"]
    r = tidelog("cluster", "down", env=env)
    assert r.returncode == 0 and "stopped 0 node(s)" in r.stdout and "n0, n1, n2 not running" in r.stdout


def test_no_cluster_is_one_line(tmp_path):
    for cmd in ("status", "down", "bootstrap"):
        r = tidelog("cluster", cmd, "--data-dir", str(tmp_path / "none"), env=dict(os.environ))
        assert r.returncode == 2 and not r.stdout
        assert r.stderr == f"error: no cluster in {tmp_path / 'none'} (start one with tidelog cluster up)\n"


def test_standalone_elsewhere_prints_a_try_line_that_works(tmp_path):
    """`cluster up --mode standalone --data-dir D`: one node without --nodes; outside the default
    directory the CLI does not find the credentials by itself, so the printed try: line exports
    them first -- run as printed, in a shell, it produces (it used to fail with a route error)."""
    from broker.client import security as cs

    d = tmp_path / "elsewhere"
    env = {k: v for k, v in os.environ.items() if k not in (cs.ENV_CREDENTIALS, cs.ENV_USERNAME, cs.ENV_PASSWORD,
                                                            cs.ENV_CA_FILE, "TIDELOG_BOOTSTRAP")}
    env.update(TIDELOG_CLUSTER_DIR=str(tmp_path / "default"), PATH=f"{Path(TIDELOG).parent}:{env['PATH']}")
    pids = []
    try:
        r = tidelog("cluster", "up", "--mode", "standalone", "--data-dir", str(d), env=env)
        assert r.returncode == 0, r.stderr
        assert f"standalone group of 1 up in {d}" in r.stdout
        pids = [node_pid(d, "n0")]
        hint = next(line for line in r.stdout.splitlines() if line.startswith("try: "))[len("try: "):]
        assert hint.startswith(f'eval "$(tidelog cluster env --data-dir {d})"; tidelog produce -b '), hint
        p = subprocess.run(["bash", "-c", f"{hint} --json"], capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 0 and json.loads(p.stdout)["acked"] == 1000, p.stdout + p.stderr
    finally:
        r = tidelog("cluster", "down", "--data-dir", str(d), env=env)
        kill_all(pids)
    assert r.returncode == 0 and "stopped 1 node(s)" in r.stdout, r.stdout + r.stderr


def test_up_never_deletes_a_directory_whose_spec_is_not_its_own(tmp_path):
    """`cluster up --data-dir .` in a project that keeps its own cluster.yaml: refused, nothing
    touched (it used to rmtree the directory when the mode or node count differed)."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("mine")
    (project / "cluster.yaml").write_text(
        "name: prod\nprovider: static\nssh: {accept_new_host_keys: true}\n"
        "hosts: [{name: h1, address: 10.0.0.1}]\ngroups: [{name: g0, hosts: [h1]}]\n")
    r = tidelog("cluster", "up", "--nodes", "1", "--mode", "standalone", "--fresh", "--data-dir", str(project),
                env=dict(os.environ))
    assert r.returncode != 0 and "is not the spec of a cluster that `tidelog cluster up` made here" in r.stderr
    assert "Traceback" not in r.stderr
    assert sorted(p.name for p in project.iterdir()) == ["cluster.yaml", "notes.txt"]


def test_master_slave_walkthrough(tmp_path):
    """The README's master-slave walkthrough: a SYNC master with two slaves, HA status, kill -9
    the master, promote n1, bring the old master back by hand (`tidelog broker start --config`):
    it rejoins as a slave of the new epoch, the group is healthy again, `down` stops all three."""
    d = str(tmp_path / "ms")
    env = dict(os.environ)
    pids, hand = [], None
    try:
        r = tidelog("cluster", "up", "--nodes", "3", "--mode", "master-slave", "--sync", "--data-dir", d,
                    "--set", "ha_heartbeat_interval_ms=200", "--set", "ha_housekeeping_interval_ms=1000", env=env)
        assert r.returncode == 0, r.stderr
        assert "master-slave (sync) group of 3 up" in r.stdout and "master n0" in r.stdout
        n0_config = f"{d}/nodes/n0/broker.yaml"
        assert n0_config in r.stdout
        pids = [node_pid(d, n) for n in ("n0", "n1", "n2")]
        b = tidelog("cluster", "bootstrap", "--data-dir", d, env=env).stdout.strip()
        # a cluster outside the default directory: its credentials as `cluster env` exports them
        exports = tidelog("cluster", "env", "--data-dir", d, env=env).stdout
        for line in exports.splitlines():
            k, _, v = line.removeprefix("export ").partition("=")
            env[k] = shlex.split(v)[0]
        assert env["TIDELOG_CREDENTIALS"] == f"{d}/security/admin.credentials.yaml" and env["TIDELOG_BOOTSTRAP"] == b
        r = tidelog("produce", "-b", b, "--topic", "t", "--count", "300", "--json", env=env)
        assert r.returncode == 0 and json.loads(r.stdout)["acked"] == 300, r.stderr
        rc, st = status(d, env)
        assert rc == 0 and st["verdict"] == "healthy" and st["groups"][0]["leader"] == "n0"
        m = rows(st)["n0"]["replication"]
        assert m["role"] == "master" and m["ha_replication"] == "sync" and m["slave_count"] == 2
        assert set(m["slaves"]) == {"n1", "n2"} and all("lag_bytes" in s for s in m["slaves"].values())
        s1 = rows(st)["n1"]["replication"]
        assert s1["role"] == "slave" and s1["master"] == "n0" and s1["connected"]
        assert s1["last_read_ms_ago"] is not None and s1["max_offset"] > 0
        r = tidelog("cluster", "status", "--data-dir", d, env=env)
        assert r.returncode == 0 and "ack offset" in r.stdout and "in sync" in r.stdout
        assert "2 required (sync replication)" in r.stdout
        r = tidelog("admin", "status", "-b", rows(st)["n1"]["address"], env=env)
        assert r.returncode == 0 and "slave of n0" in r.stdout, r.stdout + r.stderr
        r = tidelog("admin", "promote", "-b", b, "--node", "nobody", env=env)
        assert r.returncode == 1 and "no node 'nobody'" in r.stderr

        os.kill(pids[0], signal.SIGKILL)  # kill -9 the master, by the pid in its broker.json
        while pid_alive(pids[0]):
            time.sleep(0.05)
        r = tidelog("admin", "promote", "-b", b, "--node", "n1", "--json", env=env)
        assert r.returncode == 0, r.stderr
        rep = json.loads(r.stdout)
        assert rep["node"] == "n1" and rep["epoch"] == 2 and not rep["switchover"]
        rc, st = status(d, env)
        assert rc == 1 and st["verdict"] == "degraded" and st["groups"][0]["leader"] == "n1"
        assert "n0" in st["groups"][0]["lagging"] and rows(st)["n0"]["pid"] is None
        r = tidelog("cluster", "status", "--data-dir", d, env=env)
        assert r.returncode == 1 and "problem: n0 is stopped (no process)" in r.stdout

        with open(tmp_path / "n0.out", "wb") as out:  # "in another shell"
            hand = subprocess.Popen([TIDELOG, "broker", "start", "--config", n0_config], stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        pids.append(hand.pid)
        rc, st = wait_verdict(d, env, "healthy")
        n0 = rows(st)["n0"]
        assert rc == 0 and st["verdict"] == "healthy", st
        assert n0["pid"] == hand.pid and n0["role"] == "slave" and n0["master"] == "n1" and n0["epoch"] == 2
        r = tidelog("consume", "-b", b, "--topic", "t", "--group", "g", "--count", "300", "--quiet", env=env)
        assert r.returncode == 0, r.stderr
    finally:
        r = tidelog("cluster", "down", "--data-dir", d, env=env)
        kill_all(pids)
        if hand is not None:
            hand.wait()
    assert r.returncode == 0 and "stopped 3 node(s)" in r.stdout and "n0" in r.stdout, r.stdout + r.stderr
    assert not any(pid_alive(p) for p in pids)


def test_a_node_is_found_by_the_config_its_command_names(tmp_path):
    """However the config was named (absolute, relative to the working directory, through a
    symlink), a process is the node only if its command line names that node's config."""
    from infra import spec as sp
    from infra.hosts import LocalHost
    from ops.cluster import LocalNodeOps

    spec = sp.from_dict({"name": "t", "provider": "local", "install_dir": str(tmp_path), "state_dir": str(tmp_path),
                         "hosts": [{"name": "n0"}], "groups": [{"mode": "standalone", "hosts": ["n0"]}]})
    plan = spec.node("n0")
    node = LocalNodeOps(plan, LocalHost("n0", plan.ip))
    Path(plan.data_dir).mkdir(parents=True)
    Path(plan.home, "broker.yaml").write_text("{}")
    (tmp_path / "link").symlink_to(tmp_path)
    assert node.pid() is None  # no broker.json
    for cwd, config, found in ((tmp_path, "nodes/n0/broker.yaml", True),
                               (tmp_path / "link", f"{tmp_path / 'link'}/nodes/n0/broker.yaml", True),
                               ("/", f"--config={plan.home}/broker.yaml", True),
                               (tmp_path, "nodes/n1/broker.yaml", False)):
        args = [config] if config.startswith("--") else ["--config", config]
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "broker", "start", *args],
                             cwd=cwd)
        try:
            deadline = time.monotonic() + WAIT_S
            while b"broker" not in Path(f"/proc/{p.pid}/cmdline").read_bytes():  # not exec'd yet
                assert time.monotonic() < deadline
                time.sleep(0.01)
            Path(plan.data_dir, "broker.json").write_text(json.dumps({"pid": p.pid}))
            assert node.pid() == (p.pid if found else None), (cwd, config)
        finally:
            p.kill()
            p.wait()
        assert node.pid() is None


def test_status_view_renders_any_health_status():
    """The one renderer (`cluster status`, and `tidelog status` next): groups of every mode, rows
    with or without pids, addresses that look like markup."""
    import io

    from rich.console import Console

    from ops.cli.status_view import print_status

    raft = {"name": "g0", "mode": "raft", "verdict": "degraded", "leader": "a",
            "problems": ["c is unreachable (refused)"], "nodes": [
                {"id": "a", "host": "h1", "address": "[fd00::1]:10911", "state": "up", "role": "leader",
                 "term": 3, "end_index": 9, "commit_index": 9, "replication": {"begin_index": 1}},
                {"id": "b", "host": "h2", "address": "[fd00::2]:10911", "state": "up", "role": "follower",
                 "term": 3, "end_index": 7, "commit_index": 7, "lag": 2, "replication": {"begin_index": 1}},
                {"id": "c", "host": "h3", "address": "[fd00::3]:10911", "state": "unreachable", "error": "refused"}]}
    ms = {"name": "g1", "mode": "master-slave", "verdict": "healthy", "leader": "m", "problems": [], "nodes": [
        {"id": "m", "host": "h1", "address": "10.0.0.1:10921", "state": "up", "role": "master", "epoch": 2,
         "max_offset": 500, "slaves": {"s": {"ack_offset": 400, "lag_bytes": 100, "in_sync": True,
                                             "transfer_rate_bytes_per_s": 77}},
         "replication": {"slave_count": 1, "in_sync_count": 2, "required_replicas": 2, "ha_replication": "sync"}},
        {"id": "s", "host": "h2", "address": "10.0.0.2:10921", "state": "up", "role": "slave", "epoch": 2,
         "max_offset": 400}]}
    out = io.StringIO()
    print_status({"cluster": "c1", "provider": "static", "verdict": "degraded", "groups": [raft, ms]},
                 Console(file=out))
    text = out.getvalue()
    assert "cluster c1 (static): degraded" in text and "[fd00::3]:10911" in text and "pid" not in text
    assert "term" in text and "committed" in text and "problem: c is unreachable (refused)" in text
    row_s = next(line for line in text.splitlines() if line.startswith("s "))
    assert row_s.split()[-6:] == ["2", "400", "400", "100", "77", "yes"]
    assert "master m: 1 slave; replicas in sync 2 of 2, 2 required (sync replication)" in text
