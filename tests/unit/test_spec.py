"""Cluster specs: the examples load; a bad spec is an error naming the field."""

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

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


# --- issue 14: values that reach shell commands are what their field says -------------------

def static(**over):
    d = {"name": "c1", "provider": "static", "ssh": {"known_hosts": "/etc/kh"},
         "hosts": [{"name": "h1", "address": "10.0.0.1"}], "groups": [{"hosts": ["h1"]}]}
    d.update(over)
    return d


def test_the_issue_address_is_rejected_naming_the_field():
    with pytest.raises(sp.SpecError) as e:
        sp.from_dict(static(hosts=[{"name": "h1", "address": "10.0.0.1;touch${IFS}/tmp/x;#"}]), "my.yaml")
    msg = str(e.value)
    assert msg.startswith("my.yaml: field 'hosts[0].address': ") and "an IP address" in msg \
        and "DNS host name" in msg


def _set(field: str, value: str) -> dict:
    """A valid static spec with `field` (dotted) set to `value`."""
    d = static()
    if field == "hosts[0].address":
        d["hosts"] = [{"name": "h1", "address": value}]
    elif "." in field:
        sect, key = field.split(".")
        d[sect] = {**d.get(sect, {}), key: value}
    else:
        d[field] = value
    return d


# field -> (a good value, how a nasty string is put in it)
FIELDS = {
    "hosts[0].address": ("vm1.example.com", lambda n: f"10.0.0.1{n}"),
    "ssh.user": ("tidelog", lambda n: f"root{n}"),
    "install_dir": ("/opt/tidelog-{host}", lambda n: f"/srv/tidelog{n}"),
    "python": ("/usr/bin/python3.11", lambda n: f"python3.11{n}"),
    "docker.image": ("registry.example.com:5000/team/img:1.2", lambda n: f"python:3.11{n}"),
    "network.bridge": ("tl-br0", lambda n: f"br{n}"),
    "version": ("0.2.0", lambda n: f"0.2.0{n}"),
}
NASTY = ["$(touch /tmp/x)", "`id`", ";id", "|id", "&id", "\nid", "\rid", "\x00", " id", "\tid", "'", '"',
         "${IFS}", ">x", "<x", "(id)", "*", "\\", "#"]


@pytest.mark.parametrize("field", FIELDS)
def test_good_values_load(field):
    sp.from_dict(_set(field, FIELDS[field][0]))


@pytest.mark.parametrize("nasty", NASTY, ids=repr)
@pytest.mark.parametrize("field", FIELDS)
def test_shell_characters_are_rejected_naming_the_field(field, nasty):
    value = FIELDS[field][1](nasty)
    if field == "install_dir" and nasty == " id":
        value = "/srv/a b;id"  # spaces alone are allowed in a path (always quoted): add a ;
    with pytest.raises(sp.SpecError) as e:
        sp.from_dict(_set(field, value), "my.yaml")
    assert f"field '{field}': " in str(e.value) and "must" in str(e.value)


@pytest.mark.parametrize("field, value", [
    ("hosts[0].address", "-oProxyCommand=id"), ("hosts[0].address", "10.0.0.256"),
    ("hosts[0].address", "fe80::1%;id"), ("hosts[0].address", "a" * 64 + ".example.com"),
    ("hosts[0].address", ""), ("ssh.user", "-l"), ("ssh.user", "1root"), ("ssh.user", "a" * 33),
    ("python", "-c"), ("python", "python3 -c"), ("python", "../python3"), ("install_dir", "srv/tidelog"),
    ("network.bridge", "a" * 16), ("network.bridge", "-br"), ("docker.image", "-it"),
    ("docker.image", "Python:3.11"), ("version", "--pre"), ("ssh.key", "/keys/id\nProxyCommand id"),
    ("state_dir", "/tmp/x\nHostKey /etc/shadow"),
])
def test_values_that_are_not_what_the_field_says(field, value):
    with pytest.raises(sp.SpecError) as e:
        sp.from_dict(_set(field, value), "my.yaml")
    assert f"field '{field}': " in str(e.value)


@pytest.mark.parametrize("address", ["10.0.1.11", "fd00::11", "fe80::1%eth0", "vm1", "vm-1.example.com",
                                     "vm1.example.com.", "a" * 63 + ".example.com"])
def test_addresses_and_host_names_load(address):
    assert sp.from_dict(_set("hosts[0].address", address)).address_of("h1") == address


SHELL = set(";&|$`<>()\\\"' \t\n\r*?[]!#{}~\x00")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["hosts[0].address", "ssh.user", "python", "network.bridge", "docker.image",
                        "version"]),
       st.text(min_size=0, max_size=12), st.sampled_from(sorted(SHELL)), st.text(min_size=0, max_size=12))
def test_property_no_shell_character_passes(field, before, bad, after):
    value = FIELDS[field][1]("") + before + bad + after
    if field == "version" and value.endswith(".whl"):
        return  # a wheel path: a controller-side file, only control characters are refused
    with pytest.raises(sp.SpecError) as e:
        sp.from_dict(_set(field, value), "my.yaml")
    assert f"field '{field}': " in str(e.value)


# --- name servers (docs/design/name-server.md §9) ------------------------------------------------

def two_groups_with_namesrv(**ns):
    return base(groups=[{"name": "g0", "hosts": ["h1", "h2", "h3"]},
                        {"name": "g1", "hosts": ["h1", "h2", "h3"], "port": 10921}],
                namesrv={"hosts": ["h1", "h2"], **ns})


def test_namesrv_plans_and_broker_registration_fields():
    s = sp.from_dict(two_groups_with_namesrv(config={"broker_expire_ms": 30000}))
    a, b = s.namesrvs()
    assert (a.id, a.address, a.kind, b.id, b.address) == ("ns-h1", "127.0.0.11:9876", "namesrv", "ns-h2",
                                                          "127.0.0.12:9876")
    assert a.home.endswith("/hosts/h1/nodes/ns-h1") and a.config_file.endswith("/ns-h1/namesrv.yaml")
    assert a.config() == {"listen": "127.0.0.11:9876", "namesrv_id": "ns-h1", "log_file": a.log_file,
                          "pid_file": f"{a.home}/namesrv.pid", "broker_expire_ms": 30000}
    assert s.node("g1-h3").kind == "broker" and len(s.nodes()) == 6  # name servers are not broker nodes
    cfg = s.node("g1-h3").config()
    assert cfg["namesrv_addresses"] == ["127.0.0.11:9876", "127.0.0.12:9876"]
    assert (cfg["cluster_name"], cfg["broker_name"]) == ("c1", "g1")


def test_without_namesrv_broker_configs_are_unchanged():
    s = sp.from_dict(base())
    cfg = s.node("h1").broker_config()
    assert s.namesrvs() == [] and "namesrv_addresses" not in cfg and cfg["broker_name"] == "c1-g0"


@pytest.mark.parametrize("ns, message", [
    ({"hosts": ["h1", "h9"]}, "namesrv.hosts[1]: no host 'h9' in hosts"),
    ({"hosts": ["h1"], "port": 10921}, "namesrv.port: port 10921 on host h1 is already used by group g1"),
    ({"hosts": ["h1", "h1"]}, "namesrv.hosts: one name server per host"),
    ({"hosts": []}, "field 'namesrv.hosts'"),
    ({"hosts": ["h1"], "port": 0}, "field 'namesrv.port'"),
    ({"hosts": ["h1"], "config": {"listen": "x:1"}}, "come from the spec"),
    ({"hosts": ["h1"], "config": {"broker_expire_ms": 5}}, "broker_expire_ms"),
    ({"hosts": ["h1"], "config": {"bogus_ms": 5}}, "unknown field 'bogus_ms'"),
])
def test_bad_namesrv_sections_name_the_field(ns, message):
    d = two_groups_with_namesrv()
    d["namesrv"] = ns
    with pytest.raises(sp.SpecError) as e:
        sp.from_dict(d, "my.yaml")
    assert message in str(e.value)


def test_group_config_may_not_set_registration_fields_with_namesrv():
    d = two_groups_with_namesrv()
    d["groups"][0]["config"] = {"cluster_name": "other"}
    with pytest.raises(sp.SpecError, match=r"groups\[0\].config: \['cluster_name'\] come from the namesrv"):
        sp.from_dict(d)
