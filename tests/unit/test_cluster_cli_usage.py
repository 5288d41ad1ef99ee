"""The status table and `cluster up`'s options, without starting a broker: the version column
(`tidelog status`, `tidelog cluster status`), `--nodes` for standalone."""

import io

import pytest
from click.testing import CliRunner
from rich.console import Console

from ops.cli.cluster_cmds import cluster
from ops.cli.status_view import print_status
from ops.cluster import ClusterError, LocalCluster


def _text(st: dict) -> str:
    out = io.StringIO()
    print_status(st, Console(file=out))
    return out.getvalue()


def test_the_status_table_shows_each_nodes_version():
    """A rolling upgrade halfway: the text table (not only --json) says which node runs which version."""
    g = {"name": "g0", "mode": "raft", "verdict": "degraded", "leader": "a", "problems": [], "nodes": [
        {"id": "a", "address": "127.0.0.1:1", "state": "up", "role": "leader", "version": "1.4.0",
         "term": 3, "end_index": 9, "commit_index": 9, "replication": {"begin_index": 1}},
        {"id": "b", "address": "127.0.0.1:2", "state": "up", "role": "follower", "version": "1.5.0",
         "term": 3, "end_index": 9, "commit_index": 9, "lag": 0, "replication": {"begin_index": 1}},
        {"id": "c", "address": "127.0.0.1:3", "state": "unreachable", "error": "refused"}]}
    lines = _text({"cluster": "c1", "provider": "local", "verdict": "degraded", "groups": [g]}).splitlines()
    header = next(line for line in lines if line.startswith("node "))
    assert header.split()[:5] == ["node", "address", "state", "role", "version"]
    row = {line.split()[0]: line.split() for line in lines if line[:2] in ("a ", "b ", "c ")}
    assert row["a"][4] == "1.4.0" and row["b"][4] == "1.5.0" and row["c"][4] == "-"
    # the pid (cluster status) comes after the version; a standalone group has the column too
    g1 = {"name": "g1", "mode": "standalone", "verdict": "healthy", "leader": "s", "problems": [], "nodes": [
        {"id": "s", "address": "127.0.0.1:4", "state": "up", "role": "standalone", "version": "1.5.0",
         "pid": 42, "max_offset": 7}]}
    lines = _text({"cluster": "c2", "provider": "local", "verdict": "healthy", "groups": [g1]}).splitlines()
    header = next(line for line in lines if line.startswith("node "))
    assert header.split() == ["node", "address", "state", "role", "version", "pid", "max", "offset"]
    assert next(line for line in lines if line.startswith("s ")).split() == [
        "s", "127.0.0.1:4", "up", "standalone", "1.5.0", "42", "7"]


@pytest.fixture
def ups(monkeypatch):
    """LocalCluster.up recorded and stopped short: what `cluster up` asked for."""
    seen = []

    def up(self, nodes, mode, *args, **kwargs):
        seen.append((nodes, mode))
        raise ClusterError("stopped by the test")

    monkeypatch.setattr(LocalCluster, "up", up)
    return seen


@pytest.mark.parametrize("mode, nodes", [("standalone", 1), ("raft", 3), ("master-slave", 3)])
def test_nodes_defaults_to_one_for_standalone_only(tmp_path, ups, mode, nodes):
    r = CliRunner().invoke(cluster, ["up", "--mode", mode, "--data-dir", str(tmp_path)])
    assert ups == [(nodes, mode)], r.output
    assert "runs one node" not in r.output


def test_standalone_with_more_nodes_is_a_usage_error_naming_the_option(tmp_path, ups):
    r = CliRunner().invoke(cluster, ["up", "--mode", "standalone", "--nodes", "3", "--data-dir", str(tmp_path)])
    assert r.exit_code == 2 and ups == []
    assert "'--nodes'" in r.output and "standalone runs one node, not 3" in r.output
    r = CliRunner().invoke(cluster, ["up", "--mode", "standalone", "-n", "1", "--data-dir", str(tmp_path)])
    assert ups == [(1, "standalone")]


@pytest.mark.parametrize("nodes, survives", [(2, 0), (4, 1)])
def test_an_even_raft_group_is_warned_about(tmp_path, ups, nodes, survives):
    r = CliRunner().invoke(cluster, ["up", "--nodes", str(nodes), "--data-dir", str(tmp_path)])
    assert ups == [(nodes, "raft")]
    assert (f"warning: a raft group of {nodes} survives no more failed nodes than one of {nodes - 1} "
            f"({survives})") in r.output, r.output
    r = CliRunner().invoke(cluster, ["up", "--nodes", "3", "--data-dir", str(tmp_path)])
    assert "warning" not in r.output


def test_a_cluster_is_named_after_its_directory(tmp_path):
    """Two local clusters reconciled on one day must not replace each other's warehouse
    partitions (keyed by cluster name): each is named after its directory; the default one
    stays "local"."""
    from ops.cluster import DEFAULT_DIR, cluster_name
    assert cluster_name(tmp_path / "Orders_Test.1") == "orders-test-1"
    assert cluster_name(tmp_path / ("a" * 40)) == "a" * 31
    assert cluster_name(tmp_path / "___") == "local"
    assert cluster_name(DEFAULT_DIR) == "local"
    c = LocalCluster(tmp_path / "ms-east")
    c._write_spec(1, "standalone", "async", "127.9.9.0/24", {}, insecure=True)
    assert c.spec.name == "ms-east"
