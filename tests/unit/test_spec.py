"""Cluster specs: the examples load; a bad spec is an error naming the field."""

from pathlib import Path

import pytest

from infra import spec as sp

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "infra" / "examples").glob("*.yaml"))


def base(**over):
    d = {"name": "c1", "provider": "local", "hosts": [{"name": "h1"}, {"name": "h2"}, {"name": "h3"}],
         "groups": [{"mode": "raft", "hosts": ["h1", "h2", "h3"]}]}
    d.update(over)
    return d


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_load(path):
    s = sp.load(path)
    assert s.nodes() and all(n.address.endswith(f":{n.group.port}") for n in s.nodes())


def test_examples_cover_every_provider():
    assert {sp.load(p).provider for p in EXAMPLES} == {"local", "netns", "docker", "static"}


def test_plan_addresses_and_configs():
    s = sp.from_dict(base())
    n = s.node("h2")
    assert n.address == "127.0.0.12:10911" and n.id == "h2"
    cfg = n.broker_config()
    assert cfg["node_id"] == "h2" and [p["id"] for p in cfg["peers"]] == ["h1", "h2", "h3"]
    assert cfg["data_dir"].endswith("/hosts/h2/nodes/h2/data")
    ms = sp.from_dict(base(provider="netns", groups=[{"mode": "master-slave", "hosts": ["h1", "h2"],
                                                      "replication": "async"}]))
    m, s2 = ms.nodes()
    assert m.broker_config()["role"] == "master" and s2.broker_config()["role"] == "slave"
    assert s2.broker_config()["ha_replication"] == "async" and s2.ha_address == "10.231.0.12:10912"


@pytest.mark.parametrize("change, message", [
    ({"provider": "kvm"}, "field 'provider': Input should be 'local', 'netns', 'docker' or 'static'"),
    ({"groups": [{"mode": "raft", "hosts": ["h1", "h4"]}]}, "groups[0].hosts[1]: no host 'h4' in hosts"),
    ({"groups": [{"mode": "paxos", "hosts": ["h1"]}]}, "field 'groups[0].mode': Input should be"),
    ({"hosts": [{"name": "h1"}, {"name": "h1"}], "groups": [{"hosts": ["h1"]}]}, "names must be unique"),
    ({"groups": [{"hosts": ["h1"], "config": {"segment_bytez": 1}}]}, "unknown field 'segment_bytez'"),
    ({"groups": [{"hosts": ["h1"], "config": {"node_id": "x"}}]}, "come from the group itself"),
    ({"groups": [{"name": "a", "hosts": ["h1"]}, {"name": "b", "hosts": ["h1"]}]},
     "port 10911 on host h1 is already used by group a"),
    ({"groups": [{"mode": "standalone", "hosts": ["h1", "h2"]}]}, "groups[0].hosts: a standalone group runs one node"),
    ({"provider": "static"}, "hosts[0].address: a static host needs its address"),
    ({"bogus": 1}, "unknown field 'bogus'"),
    ({"ssh": {"port": 0}}, "field 'ssh.port': Input should be greater than or equal to 1"),
])
def test_bad_specs_name_the_field(change, message):
    with pytest.raises(sp.SpecError) as e:
        sp.from_dict(base(**change), "my.yaml")
    assert message in str(e.value) and str(e.value).startswith("my.yaml")


def test_standalone_group():
    s = sp.from_dict(base(groups=[{"mode": "standalone", "hosts": ["h2"]}]))
    cfg = s.node("h2").broker_config()
    assert cfg["mode"] == "standalone" and cfg["listen"] == "127.0.0.12:10911" and "role" not in cfg


def test_unreadable_and_invalid_yaml(tmp_path):
    with pytest.raises(sp.SpecError, match="cannot read the spec"):
        sp.load(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("name: [unclosed")
    with pytest.raises(sp.SpecError, match="not valid YAML"):
        sp.load(tmp_path / "bad.yaml")


def test_relative_paths_are_relative_to_the_spec(tmp_path):
    (tmp_path / "s.yaml").write_text(
        "name: c\nprovider: static\nssh: {key: keys/id, known_hosts: kh}\n"
        "hosts: [{name: a, address: 10.0.0.1}]\ngroups: [{hosts: [a]}]\n")
    s = sp.load(tmp_path / "s.yaml")
    assert s.ssh.key == tmp_path / "keys" / "id" and s.ssh.known_hosts == tmp_path / "kh"
