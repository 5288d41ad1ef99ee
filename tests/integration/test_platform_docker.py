"""Provider `docker` end to end (as root, as CI runs): dockerd from Debian's docker.io (started
here when no engine answers, stopped afterwards), the base image built from Debian packages
with debootstrap (cached), then `tidelog infra up`, `tidelog deploy` (the wheel and its
dependency wheels over SFTP, a venv built offline in each container), a drill with a real
partition (iptables inside the containers, over SSH), collection over SFTP and `tidelog infra
down`. Also: netns hosts still reach each other while dockerd runs (its FORWARD DROP policy and
bridge netfilter), and a missing engine is named clearly.

The durations of each step are printed at the end of the module (and in --durations)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from infra import docker_image, providers
from infra import spec as sp
from infra.providers import ProviderError
from ops.build import build_wheel
from ops.collect import collect
from ops.drill.run import drill
from ops.replicas import compare
from ops.security import ClusterSecurity
from tests import docker_env
from tests.helpers import run_tidelog as tidelog

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="starts dockerd, builds the base image with debootstrap "
                                "and makes network namespaces: needs root (CI runs as root)")
pytestmark = pytest.mark.slow

SUBNET = "10.233.77.0/24"
ADDRS = {"h1": "10.233.77.11", "h2": "10.233.77.12", "h3": "10.233.77.13"}
NETNS_SUBNET = "10.231.78.0/24"
TIMINGS: dict[str, float] = {}


def write(path: Path, d: dict) -> Path:
    path.write_text(yaml.safe_dump(d))
    return path


class timed:
    def __init__(self, key: str):
        self.key = key

    def __enter__(self):
        self.t0 = time.monotonic()

    def __exit__(self, *exc):
        TIMINGS[self.key] = round(time.monotonic() - self.t0, 1)


@pytest.fixture(scope="module")
def engine(tmp_path_factory, request):
    with docker_env.engine(tmp_path_factory.mktemp("dockerd")) as e:
        TIMINGS.update(e.timings)
        with timed("image_s"):
            img = docker_image.ensure_image(e.client)
        TIMINGS.update({k: v for k, v in img.items() if k in ("build_s", "import_s")})
        try:
            yield e
        finally:
            tr = request.config.pluginmanager.get_plugin("terminalreporter")
            line = (f"docker provider timings (s): {json.dumps(TIMINGS)}; dockerd "
                    f"{'started and stopped here' if e.started else 'already running'}; image "
                    f"{'present' if img['present'] else 'built' if img.get('built') else 'imported from cache'}")
            capman = request.config.pluginmanager.get_plugin("capturemanager")
            if tr is not None and capman is not None:
                with capman.global_and_fixture_disabled():  # shown with the results, passed or not
                    tr.write_line("\n" + line)


@pytest.fixture(scope="module")
def cluster(engine, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("docker")
    # one wheel of this tree for the whole module (what `version: current` builds at each deploy):
    # a checkout edited while the module runs must not make the second deploy a different build
    wheel = build_wheel(tmp / "wheels")
    path = write(tmp / "docker.yaml", {
        "name": "tdocker", "provider": "docker", "state_dir": str(tmp / "state"), "version": str(wheel),
        "docker": {"image": docker_image.IMAGE}, "network": {"subnet": SUBNET},
        "hosts": [{"name": "h1"}, {"name": "h2"}, {"name": "h3"}],
        "groups": [{"name": "g0", "mode": "raft", "hosts": ["h1", "h2", "h3"], "port": 10911,
                    "config": {"segment_bytes": 8 << 20, "raft_election_timeout_ms": 600}}],
        "health": {"timeout_s": 60}})
    spec = sp.load(path)
    prov = providers.get(spec)
    prov.down()  # what an interrupted run left (same container names, same subnet); usually nothing
    try:
        with timed("up_s"):
            up = json.loads(tidelog("infra", "up", "--spec", str(path), "--json").stdout)
        assert up["hosts"] == ADDRS
        yield path, spec, tmp
    finally:
        prov.down()  # also after a failure; a no-op after test_infra_down_removes_everything
    c = engine.client
    assert c.containers.list(all=True, filters={"label": "tidelog.cluster=tdocker"}) == []
    assert c.networks.list(names=["tidelog-tdocker"]) == []
    assert not spec.state.exists()


@needs_root
def test_hosts_are_containers_over_ssh(cluster, engine):
    path, spec, _ = cluster
    st = json.loads(tidelog("infra", "status", "--spec", str(path), "--json").stdout)
    assert st["verdict"] == "up" and [h["hostname"] for h in st["hosts"]] == ["h1", "h2", "h3"]
    assert all(h["python"].startswith("Python 3.11") for h in st["hosts"])
    hosts = providers.get(spec).hosts()
    hosts["h1"].write_text("/srv/tidelog/probe", "h1's")
    assert hosts["h2"].read_text("/srv/tidelog/probe") is None  # separate filesystems
    attrs = engine.client.containers.get("tidelog-tdocker-h1").attrs
    assert attrs["Mounts"] == [] and "NET_ADMIN" in attrs["HostConfig"]["CapAdd"]
    # the host key is the one infra up generated and pinned: no trust on first use
    assert (spec.state / "known_hosts").read_text().count("ssh-ed25519") == 3


@needs_root
def test_deploy_ships_the_build_and_its_dependencies(cluster):
    path, spec, _ = cluster
    with timed("deploy_s"):
        r = json.loads(tidelog("deploy", "--spec", str(path), "--json").stdout)
    assert r["status"]["verdict"] == "healthy" and sorted(r["installed_on"]) == ["h1", "h2", "h3"]
    again = json.loads(tidelog("deploy", "--spec", str(path), "--json").stdout)
    assert not again["changed"] and set(again["nodes"].values()) == {"unchanged"}, again
    # each container installed into its own venv, from the uploaded wheels only
    host = providers.get(spec).host("h2")
    out = host.run("ls /srv/tidelog/versions/*/venv/bin/tidelog && ls /srv/tidelog/wheels").out
    assert "tidelog-" in out and "pydantic_core-" in out


@needs_root
def test_drill_with_a_real_partition(cluster, seed, tmp_path):
    _, spec, _ = cluster
    with timed("drill_s"):
        r = drill(spec, "partition-leader", duration_s=8, rate=100, report_dir=tmp_path, seed=seed,
                  fault_s=2.5, calm_s=1)
    assert r["ok"], (r["anomalies"], r["counts"])
    assert r["figures"]["faults"] >= 1 and r["figures"]["final_verdict"] == "healthy"
    assert r["figures"]["time_to_new_leader_s_max"] is not None
    # healed: no rule of the drill is left in any container
    for name, host in providers.get(spec).hosts().items():
        rules = host.run("iptables -w -S TIDELOG 2>/dev/null || true").out
        assert "DROP" not in rules, (name, rules)


@needs_root
def test_collect_over_sftp(cluster, tmp_path):
    _, spec, _ = cluster
    tidelog("produce", "-b", spec.nodes()[0].address, "--topic", "c", "--count", "300",
            env={"TIDELOG_CREDENTIALS": str(ClusterSecurity(spec).credentials_file())})
    with timed("collect_s"):
        r = collect(spec, tmp_path)
    assert r["missing"] == [] and r["bytes"] > 0
    base = tmp_path / spec.name
    assert compare({n: base / n for n in ("h1", "h2", "h3")}, None) == []


def _connect(ns: str, addr: str) -> subprocess.CompletedProcess:
    code = f"import socket; socket.create_connection(({addr!r}, 22), timeout=2).close()"
    return subprocess.run(["ip", "netns", "exec", ns, "python3", "-c", code], capture_output=True, text=True)


@needs_root
def test_netns_hosts_reach_each_other_while_dockerd_runs(engine, tmp_path):
    """On a fresh machine (IP forwarding off) dockerd sets FORWARD's policy to DROP, and it turns
    bridge netfilter on: frames between two namespace hosts on one bridge go through FORWARD.
    The netns provider's own ACCEPT rules keep them flowing; without them the hosts are cut off
    (checked, so this test can fail). Where forwarding was already on, dockerd leaves the policy
    alone and there is nothing to cut: only the reachability is checked."""
    path = write(tmp_path / "netns.yaml", {
        "name": "tcoexist", "provider": "netns", "state_dir": str(tmp_path / "state"),
        "network": {"subnet": NETNS_SUBNET}, "hosts": [{"name": "h1"}, {"name": "h2"}],
        "groups": [{"name": "g0", "mode": "raft", "hosts": ["h1", "h2"]}]})
    prov = providers.get(sp.load(path))
    try:
        prov.up()
        policy = subprocess.run(["iptables", "-w", "-S", "FORWARD"], capture_output=True, text=True).stdout
        dropping = "-P FORWARD DROP" in policy and docker_env.BRIDGE_NF.read_text().strip() == "1"
        assert dropping or not engine.ip_forward_was_off, policy  # our dockerd on a fresh machine: DROP
        h2 = "10.231.78.12"
        assert _connect(prov.ns("h1"), h2).returncode == 0
        if dropping:
            prov._disallow_forward()
            assert _connect(prov.ns("h1"), h2).returncode != 0  # what dockerd alone does to the bridge
            prov._allow_forward()
            assert _connect(prov.ns("h1"), h2).returncode == 0
    finally:
        prov.down()
    rules = subprocess.run(["iptables", "-w", "-S", "FORWARD"], capture_output=True, text=True).stdout
    assert prov.bridge not in rules  # down removed its rules


@needs_root
def test_infra_down_removes_everything(cluster, engine):
    path, spec, _ = cluster
    with timed("down_s"):
        down = json.loads(tidelog("infra", "down", "--spec", str(path), "--json").stdout)
    assert {f"container tidelog-tdocker-h{i}" for i in (1, 2, 3)} <= set(down["removed"])
    assert engine.client.containers.list(all=True, filters={"label": "tidelog.cluster=tdocker"}) == []
    gone = tidelog("infra", "status", "--spec", str(path), check=False)
    assert gone.returncode == 1 and "is not running (tidelog infra up makes it)" in gone.stdout


def test_no_engine_is_named_clearly(tmp_path):
    path = write(tmp_path / "d.yaml", {
        "name": "tnoengine", "provider": "docker", "state_dir": str(tmp_path / "state"),
        "docker": {"base_url": f"unix://{tmp_path}/no-docker.sock"},
        "hosts": [{"name": "h1"}], "groups": [{"hosts": ["h1"]}]})
    with pytest.raises(ProviderError, match="no Docker engine answers at unix://"):
        providers.get(sp.load(path)).client()
    p = tidelog("infra", "up", "--spec", str(path), check=False)
    assert p.returncode == 1 and "no Docker engine answers" in p.stderr and "Traceback" not in p.stderr
