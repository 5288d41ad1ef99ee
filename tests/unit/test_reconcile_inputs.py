"""What the reconcile job's driver learns from a collection directory (names and metadata only),
and the drills' replica compare, on logs of both formats (TLE1 entries, TLE2 batches)."""

from __future__ import annotations

import json

import pytest

from spark_jobs import craft
from spark_jobs.inputs import discover

pytestmark = pytest.mark.parametrize("fmt", craft.FORMATS, ids=lambda f: f"TLE{f}")


def test_collection_root_or_one_cluster_directory(tmp_path, fmt):
    craft.write_cluster(tmp_path, "prod", [craft.Node("n1", craft.log(5), 4), craft.Node("n2", craft.log(3), 2)],
                        missing={"n3": "HostError: unreachable"}, format=fmt)
    for where in (tmp_path, tmp_path / "prod"):
        (c,) = discover(where)
        assert c.name == "prod" and [(n.id, n.state, n.committed_index) for n in c.nodes] == \
            [("n1", "ok", 4), ("n2", "ok", 2), ("n3", "missing", -1)]
        assert c.nodes[2].error == "HostError: unreachable" and len(c.nodes[0].segments) == 1


def test_an_empty_node_directory_and_a_missing_commitlog_are_named(tmp_path, fmt):
    base = craft.write_cluster(tmp_path, "prod", [craft.Node("n1", craft.log(5), 4)], format=fmt)
    (base / "n2" / "commitlog").mkdir(parents=True)
    (base / "n3").mkdir()
    (base / "n3" / "node.json").write_text(json.dumps({"group": "g0"}))
    (c,) = discover(tmp_path)
    assert {n.id: (n.state, n.error) for n in c.nodes} == {
        "n1": ("ok", None), "n2": ("empty", "no segment files"), "n3": ("unreadable", "no commitlog directory")}


def test_nothing_to_reconcile_is_a_clear_error(tmp_path, fmt):
    with pytest.raises(FileNotFoundError, match="no collection directory"):
        discover(tmp_path / "absent")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "collect.json").write_text(json.dumps({"nodes": []}))
    with pytest.raises(FileNotFoundError, match="holds no collected cluster"):
        discover(tmp_path)


def test_a_nodes_committed_index_comes_from_its_own_checkpoint(tmp_path, fmt):
    """The checkpoint alone says how far the node had committed (node.json may lack it): the
    reconcile job judges entries at or below it that the log no longer holds as lost."""
    base = craft.write_cluster(tmp_path, "prod", [craft.Node("n1", craft.log(291), 300)], format=fmt)
    info = json.loads((base / "n1" / "node.json").read_text())
    del info["commit_index"]
    (base / "n1" / "node.json").write_text(json.dumps(info))
    (c,) = discover(tmp_path)
    assert [(n.id, n.committed_index) for n in c.nodes] == [("n1", 300)]


def test_the_drills_replica_compare_applies_the_same_lost_rule(tmp_path, fmt):
    """ops.replicas.compare (the drill's log check): entries at or below a replica's own
    committed index that its log no longer holds are named as lost; lag is not."""
    from ops.replicas import compare

    base = craft.write_cluster(tmp_path, "c", [craft.Node("n1", craft.log(30), 29), craft.Node("n2", craft.log(30), 29),
                                               craft.Node("n3", craft.log(21), 29), craft.Node("n4", craft.log(21), 20)],
                               format=fmt)
    (line,) = compare({n: base / n for n in ("n1", "n2", "n3", "n4")}, None)
    assert line == "n3 lost 9 entries it had committed, from 21 (its committed index 29, its log ends at 20)"
