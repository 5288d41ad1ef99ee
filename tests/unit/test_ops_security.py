"""ops/security.py: the cluster's CA, certificates, users and credentials files, as deploy makes
them; the Airflow connection path the DAGs' tasks take."""

import json
import stat

import pytest
import yaml

from broker import config as bc
from broker.security import ca as cas
from broker.security.scram import ClientExchange, ServerExchange, new_secret, parse_verifier
from infra import spec as specs
from ops.security import ClusterSecurity, credentials_for, find_credentials


def spec_of(tmp_path, subnet="127.0.77.0/24", **security):
    return specs.from_dict({
        "name": "sec", "provider": "local", "state_dir": str(tmp_path / "state"),
        "install_dir": str(tmp_path / "hosts"), "network": {"subnet": subnet},
        "hosts": [{"name": "h1"}, {"name": "h2"}, {"name": "h3"}],
        "groups": [{"name": "g0", "mode": "raft", "hosts": ["h1", "h2", "h3"]}],
        **({"security": security} if security else {})})


def mode(p):
    return stat.S_IMODE(p.stat().st_mode)


def test_ensure_makes_a_ca_users_and_0600_credentials_and_is_idempotent(tmp_path):
    spec = spec_of(tmp_path, users=[{"name": "billing", "roles": ["rw"]}], roles={"rw": {"pub": ["orders"]}})
    sec = ClusterSecurity(spec)
    sec.ensure()
    users_before = sec.users_file.read_text()
    creds_before = sec.credentials_file("billing").read_text()
    sec.ensure()  # again: nothing changes, so node configs stay "current" from one deploy to the next
    assert sec.users_file.read_text() == users_before
    assert sec.credentials_file("billing").read_text() == creds_before
    assert mode(sec.dir) == 0o700
    for p in (sec.ca.key_file, sec.users_file, sec.credentials_file(), sec.credentials_file("billing")):
        assert mode(p) == 0o600, p
    users = yaml.safe_load(users_before)
    assert set(users) == {"admin", "billing"} and users["billing"]["roles"] == ["rw"]
    # the verifier in the broker config matches the password in the credentials file
    creds = yaml.safe_load(creds_before)
    v = {"billing": parse_verifier(users["billing"]["scram"])}
    server, client = ServerExchange(v, new_secret()), ClientExchange("billing", creds["password"])
    reply, _ = server.step(client.first())
    final, done = server.step(client.step(reply))
    client.finish(final)
    assert done and server.user == "billing"


def test_node_configs_are_valid_secure_broker_configs(tmp_path):
    spec = spec_of(tmp_path, users=[{"name": "app", "roles": ["rw"]}], roles={"rw": {"pub": ["o*"], "sub": ["o*"]}})
    sec = ClusterSecurity(spec)
    sec.ensure()
    plan = spec.nodes()[0]
    cfg = bc.from_dict({**plan.broker_config(), **sec.broker_fields(plan)})
    assert cfg.secure and not cfg.insecure
    assert str(cfg.tls.key_file).endswith("/tls/node.key")
    assert {u.name for u in cfg.users} == {"admin", "app"} and cfg.roles["rw"].pub == ("o*",)
    cfg.require_security()


def test_insecure_spec_makes_nothing_and_says_insecure(tmp_path):
    spec = spec_of(tmp_path, insecure=True)
    sec = ClusterSecurity(spec)
    sec.ensure()
    assert not sec.dir.exists() and credentials_for(spec) is None
    assert sec.broker_fields(spec.nodes()[0]) == {"insecure": True}


def test_node_certificates_are_reissued_only_when_needed_and_on_rotation(tmp_path):
    spec = spec_of(tmp_path)
    sec = ClusterSecurity(spec)
    sec.ensure()
    plan = spec.nodes()[0]
    first = cas.cert_info(sec.node_cert(plan).cert_file)
    assert first["member"] == plan.id and f"IP:{plan.address.split(':')[0]}" in first["sans"]
    assert cas.cert_info(sec.node_cert(plan).cert_file)["serial"] == first["serial"]  # kept
    rotated = cas.cert_info(sec.node_cert(plan, rotate=True).cert_file)
    assert rotated["serial"] != first["serial"] and rotated["member"] == plan.id


def test_a_spec_naming_an_undefined_role_is_refused(tmp_path):
    with pytest.raises(specs.SpecError, match="not defined in security.roles"):
        spec_of(tmp_path, users=[{"name": "x", "roles": ["nope"]}])


def test_the_admin_password_can_live_in_an_airflow_connection(tmp_path, monkeypatch):
    """security.connection_id: the connection's Login/Password are the admin user deploy sets up
    and ops code connects as; the CA is the cluster's (or the connection's extra ca_file)."""
    spec = spec_of(tmp_path, connection_id="tidelog_broker")
    monkeypatch.setenv("AIRFLOW_CONN_TIDELOG_BROKER", json.dumps(
        {"conn_type": "generic", "login": "ops", "password": "s3cret-from-airflow"}))
    sec = ClusterSecurity(spec)
    sec.ensure()
    c = credentials_for(spec)
    assert (c.username, c.password, c.ca_file) == ("ops", "s3cret-from-airflow", str(sec.ca.cert_file))
    assert "tidelog_broker" in c.source
    users = yaml.safe_load(sec.users_file.read_text())
    assert users["ops"]["roles"] == ["admin"] and users["ops"]["password"] == "s3cret-from-airflow"
    # a new password in Airflow gives the brokers a new verifier at the next deploy
    monkeypatch.setenv("AIRFLOW_CONN_TIDELOG_BROKER", json.dumps(
        {"conn_type": "generic", "login": "ops", "password": "rotated", "extra": {"ca_file": "/x/ca.crt"}}))
    sec.ensure()
    users2 = yaml.safe_load(sec.users_file.read_text())
    assert users2["ops"]["scram"] != users["ops"]["scram"] and credentials_for(spec).ca_file == "/x/ca.crt"


def test_a_missing_airflow_connection_is_a_clear_error(tmp_path):
    from infra.credentials import CredentialsError
    spec = spec_of(tmp_path, connection_id="tidelog_nowhere")
    with pytest.raises(CredentialsError, match="tidelog_nowhere"):
        ClusterSecurity(spec).ensure()


def test_the_cli_finds_the_credentials_of_the_cluster_its_bootstrap_names(tmp_path, monkeypatch):
    import ops.cluster
    monkeypatch.setattr(ops.cluster, "DEFAULT_DIR", tmp_path / "state")
    spec = spec_of(tmp_path)
    ClusterSecurity(spec).ensure()
    node = spec.nodes()[1].address
    assert find_credentials(f"10.9.9.9:1,{node}") == ClusterSecurity(spec).credentials_file()
    assert find_credentials("10.9.9.9:1") is None


def test_a_cluster_rebuilt_in_the_same_directory_gets_credentials_naming_its_new_addresses(tmp_path, monkeypatch):
    """`cluster up --fresh` (or another size or mode) in the default directory picks new
    addresses; the credentials files kept naming the first cluster's, so the CLI's `-b`
    lookup (find_credentials) no longer found them and every secure command failed."""
    import ops.cluster
    monkeypatch.setattr(ops.cluster, "DEFAULT_DIR", tmp_path / "state")
    ClusterSecurity(spec_of(tmp_path)).ensure()
    rebuilt = spec_of(tmp_path, subnet="127.0.78.0/24")
    sec = ClusterSecurity(rebuilt)
    password = yaml.safe_load(sec.credentials_file().read_text())["password"]
    sec.ensure()
    node = rebuilt.nodes()[0].address
    assert node.startswith("127.0.78.")
    assert find_credentials(node) == sec.credentials_file()
    creds = yaml.safe_load(sec.credentials_file().read_text())
    assert creds["bootstrap"] == ",".join(p.address for p in rebuilt.nodes())
    assert creds["password"] == password  # the users stay: only the addresses moved


def test_a_certificate_from_before_groups_were_named_is_found(tmp_path):
    """What makes a whole-cluster upgrade roll the groups before the name servers (a name
    server of this build refuses a broker certificate that names no group)."""
    spec = spec_of(tmp_path)
    sec = ClusterSecurity(spec)
    sec.ensure()
    plan = spec.nodes()[0]
    sec.node_cert(plan)
    assert not sec.names_no_group(plan)
    out = sec.dir / "nodes"
    cas.issue_node_cert(sec.ca, out, plan.id, [plan.address.split(":")[0]])  # as the previous build issued it
    assert sec.names_no_group(plan)
    sec.node_cert(plan)  # deploy / a restart re-issues it with the group
    assert not sec.names_no_group(plan)
    assert not ClusterSecurity(spec_of(tmp_path / "i", insecure=True)).names_no_group(plan)
