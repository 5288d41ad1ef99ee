"""Provider `netns` (as root, as CI runs): namespace hosts with their own sshd, deploy over real
SSH/SFTP, status, drills with real partitions (iptables) and isolation (link down), collect
over SFTP; provider `static` against the same hosts' SSH; host-key refusal; `infra down`.
(Provider `docker`, and netns beside a running dockerd: test_platform_docker.py.)"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from infra import providers
from infra import spec as sp
from ops.security import ClusterSecurity
from tests.helpers import run_tidelog as tidelog
from infra.hosts import HostKeyError
from ops import health
from ops.collect import collect
from ops.drill.run import drill
from ops.replicas import compare

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")]

SUBNET = "10.231.77.0/24"


def write(path: Path, d: dict) -> Path:
    path.write_text(yaml.safe_dump(d))
    return path


@pytest.fixture(scope="module")
def netns(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("netns")
    path = write(tmp / "netns.yaml", {
        "name": "tnetns", "provider": "netns", "state_dir": str(tmp / "state"),
        "network": {"subnet": SUBNET},
        "hosts": [{"name": "h1"}, {"name": "h2"}, {"name": "h3"}],
        "groups": [{"name": "g0", "mode": "raft", "hosts": ["h1", "h2", "h3"], "port": 10911,
                    "config": {"segment_bytes": 8 << 20, "raft_election_timeout_ms": 600}}],
        "health": {"timeout_s": 60}})
    spec = sp.load(path)
    prov = providers.get(spec)
    try:
        up = json.loads(tidelog("infra", "up", "--spec", str(path), "--json").stdout)
        assert up["hosts"] == {"h1": "10.231.77.11", "h2": "10.231.77.12", "h3": "10.231.77.13"}
        yield path, spec, tmp
    finally:
        prov.down()
    # everything it made is gone
    assert "tl-tnetns-" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert subprocess.run(["ip", "link", "show", prov.bridge], capture_output=True).returncode != 0
    assert not spec.state.exists()
    gone = tidelog("infra", "status", "--spec", str(path), check=False)
    assert gone.returncode == 1 and "does not exist (tidelog infra up makes it)" in gone.stdout


def test_hosts_are_separate_machines_over_ssh(netns):
    path, spec, _ = netns
    st = json.loads(tidelog("infra", "status", "--spec", str(path), "--json").stdout)
    assert st["verdict"] == "up" and [h["hostname"] for h in st["hosts"]] == ["h1", "h2", "h3"]
    assert all(h["python"].startswith("Python 3.11") for h in st["hosts"])
    hosts = providers.get(spec).hosts()
    hosts["h1"].write_text("/srv/tidelog/probe", "h1's")
    assert hosts["h2"].read_text("/srv/tidelog/probe") is None  # a private /srv per host


def test_deploy_over_ssh_status_and_idempotence(netns):
    path, spec, _ = netns
    r = json.loads(tidelog("deploy", "--spec", str(path), "--json").stdout)
    assert r["status"]["verdict"] == "healthy" and sorted(r["installed_on"]) == ["h1", "h2", "h3"]
    again = json.loads(tidelog("deploy", "--spec", str(path), "--json").stdout)
    assert not again["changed"] and set(again["nodes"].values()) == {"unchanged"}
    p = tidelog("status", "--spec", str(path))
    assert p.stdout.splitlines()[0].endswith(": healthy") and "10.231.77.1" in p.stdout


@pytest.mark.parametrize("nemesis", ["partition-leader", "isolate-random", "kill-leader"])
def test_drill_with_real_faults(netns, nemesis, seed, tmp_path):
    _, spec, _ = netns
    r = drill(spec, nemesis, duration_s=8, rate=100, report_dir=tmp_path, seed=seed, fault_s=2.5, calm_s=1)
    assert r["ok"], (r["anomalies"], r["counts"])
    assert r["figures"]["faults"] >= 1 and r["figures"]["final_verdict"] == "healthy"
    if nemesis != "isolate-random":
        assert r["figures"]["time_to_new_leader_s_max"] is not None


def test_collect_over_sftp(netns, tmp_path):
    path, spec, _ = netns
    tidelog("produce", "-b", spec.nodes()[0].address, "--topic", "c", "--count", "300",
            env={"TIDELOG_CREDENTIALS": str(ClusterSecurity(spec).credentials_file())})  # deploy printed it
    r = collect(spec, tmp_path)
    assert r["missing"] == [] and r["bytes"] > 0
    base = tmp_path / spec.name
    assert compare({n: base / n for n in ("h1", "h2", "h3")}, None) == []


def test_static_provider_on_the_same_hosts(netns):
    path, spec, tmp = netns
    state = spec.state
    static = write(tmp / "static.yaml", {
        "name": "tnetns", "provider": "static", "state_dir": str(state), "install_dir": "/srv/tidelog",
        "ssh": {"user": "root", "key": str(state / "id_ed25519"), "known_hosts": str(state / "known_hosts")},
        "hosts": [{"name": h, "address": f"10.231.77.{11 + i}"} for i, h in enumerate(("h1", "h2", "h3"))],
        "groups": [{"name": "g0", "mode": "raft", "hosts": ["h1", "h2", "h3"], "port": 10911,
                    "config": {"segment_bytes": 8 << 20, "raft_election_timeout_ms": 600}}]})
    up = json.loads(tidelog("infra", "up", "--spec", str(static), "--json").stdout)
    assert set(up["hosts"]) == {"h1", "h2", "h3"}
    # the same nodes, seen through the static inventory: deploy finds them running
    again = json.loads(tidelog("deploy", "--spec", str(static), "--json").stdout)
    assert set(again["nodes"].values()) == {"unchanged"}
    assert health.status(sp.load(static))["verdict"] == "healthy"


def test_deploy_dag_takes_ssh_credentials_from_an_airflow_connection(netns, airflow_db, tmp_path):
    """The spec names an Airflow SSH connection instead of a key; the tidelog_deploy DAG (run
    with dag.test) logs in to every host with the connection's user and key."""
    from tests import airflow_env

    _, spec, _ = netns
    state = spec.state

    def static_spec(name: str, conn: str) -> Path:
        return write(tmp_path / f"{name}.yaml", {
            "name": "tnetns", "provider": "static", "state_dir": str(state), "install_dir": "/srv/tidelog",
            "ssh": {"connection_id": conn, "known_hosts": str(state / "known_hosts")},
            "hosts": [{"name": h, "address": f"10.231.77.{11 + i}"} for i, h in enumerate(("h1", "h2", "h3"))],
            "groups": [{"name": "g0", "mode": "raft", "hosts": ["h1", "h2", "h3"], "port": 10911,
                        "config": {"segment_bytes": 8 << 20, "raft_election_timeout_ms": 600}}]})

    conn = json.dumps({"conn_type": "ssh", "login": "root", "host": "",
                       "extra": {"key_file": str(state / "id_ed25519")}})
    e = {**airflow_db, "AIRFLOW_CONN_TIDELOG_TEST_SSH": conn}
    res, out = airflow_env.run_dag(e, "tidelog_deploy", {"spec": str(static_spec("conn", "tidelog_test_ssh"))})
    assert res["state"] == "success", out[-6000:]
    assert all(f"  h{i}: unchanged" in out for i in (1, 2, 3))   # it reached each host's node over SSH
    # a connection that does not exist: a clear message naming it and where to create it
    p = subprocess.run([str(airflow_env.BIN / "tidelog"), "infra", "status", "--spec",
                        str(static_spec("noconn", "tidelog_nope"))], env=e, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p
    assert p.stderr.startswith("error: Airflow connection 'tidelog_nope' not found; create it (type SSH)"), p


def test_wrong_or_unknown_host_key_is_refused(netns, tmp_path):
    _, spec, _ = netns
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    (tmp_path / "kh_wrong").write_text(f"10.231.77.11 {' '.join(other.with_suffix('.pub').read_text().split()[:2])}\n")
    (tmp_path / "kh_empty").write_text("")
    for kh, message in (("kh_wrong", "host key mismatch"), ("kh_empty", "host key not in known_hosts")):
        s = sp.from_dict({**spec.model_dump(mode="json", exclude={"ssh"}), "provider": "static",
                          "hosts": [{"name": "h1", "address": "10.231.77.11"}],
                          "groups": [{"hosts": ["h1"]}],
                          "ssh": {"key": str(spec.state / "id_ed25519"), "known_hosts": str(tmp_path / kh)}})
        with pytest.raises(HostKeyError, match=message):
            providers.get(s).host("h1").run("true")
    # and through the CLI: a clear message, exit 1, the cluster untouched
    p = tidelog("infra", "status", "--spec", str(write(tmp_path / "s.yaml", {
        "name": "x", "provider": "static", "ssh": {"key": str(spec.state / "id_ed25519"),
                                                   "known_hosts": str(tmp_path / "kh_wrong")},
        "hosts": [{"name": "h1", "address": "10.231.77.11"}], "groups": [{"hosts": ["h1"]}]})), check=False)
    assert p.returncode == 1 and "host key mismatch" in p.stdout
    assert health.status(spec)["verdict"] == "healthy"

