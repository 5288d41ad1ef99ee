"""User mistakes and unreachable brokers: one line `error: ...`, the right exit status, no
traceback (issue 12). Clusters here are local specs on free ports that are never started."""

import time

import pytest

from ops.localbroker import free_port

from ..helpers import BrokerThread, local_spec, run_tidelog


def fails(*args, rc: int) -> str:
    """Run tidelog; assert the exit status and no traceback; return stderr's first line."""
    p = run_tidelog(*args, check=False, timeout_s=120)
    assert p.returncode == rc, (p.returncode, p.stderr, p.stdout)
    assert "Traceback" not in p.stderr + p.stdout, p.stderr
    return p.stderr.splitlines()[0]


@pytest.fixture(scope="module")
def never_deployed(tmp_path_factory):
    return local_spec(tmp_path_factory.mktemp("cli-errors"), "never")


@pytest.mark.parametrize("bootstrap", ["localhost", "host:notaport", "127.0.0.1:99999"])
def test_bad_bootstrap(bootstrap):
    first = fails("produce", "-b", bootstrap, "--topic", "t", rc=2)
    assert first == (f"error: --bootstrap: bad bootstrap address {bootstrap!r}: expected host:port, "
                     "e.g. 127.0.0.1:10911")


def test_bad_bootstrap_in_a_list_and_on_admin_commands():
    first = fails("topic", "list", "-b", "127.0.0.1:10911,nohost", rc=2)
    assert first == "error: --bootstrap: bad bootstrap address 'nohost': expected host:port, e.g. 127.0.0.1:10911"


def test_set_without_equals():
    first = fails("broker", "start", "--config", "nowhere.yaml", "--set", "flush", rc=2)
    assert first == "error: --set 'flush': expected FIELD=VALUE, e.g. --set flush=sync"


def test_spec_that_does_not_exist(tmp_path):
    missing = tmp_path / "nope.yaml"
    first = fails("status", "--spec", str(missing), rc=2)
    assert first == f"error: {missing}: cannot read the spec: No such file or directory"


@pytest.mark.parametrize("command", [["status"], ["collect", "--out", "x"], ["drill"], ["upgrade", "--to", "current"]])
def test_unknown_group_names_the_groups_that_exist(never_deployed, command):
    first = fails(*command, "--spec", str(never_deployed), "--group", "g9", rc=2)
    assert first == (f"error: {never_deployed}: no group 'g9' in never (its groups: g0); "
                     "give one of those to --group, or leave it out")


def test_wrong_client_port_is_a_connect_error_not_system_error():
    port = free_port()
    t0 = time.monotonic()
    first = fails("produce", "-b", f"127.0.0.1:{port}", "--topic", "t", "--count", "1", rc=1)
    assert time.monotonic() - t0 < 15  # loose (shared CI): refused everywhere is final at once
    assert first == f"error: cannot connect to 127.0.0.1:{port}: [Errno 111] Connection refused"
    first = fails("consume", "-b", f"127.0.0.1:{port}", "--topic", "t", "--group", "g", rc=1)
    assert first == f"error: cannot connect to 127.0.0.1:{port}: [Errno 111] Connection refused"


def test_consuming_a_topic_that_does_not_exist(tmp_path):
    with BrokerThread(tmp_path / "b") as b:
        first = fails("consume", "-b", b.address, "--topic", "x", "--group", "g", "--idle-timeout-s", "60", rc=1)
    assert first == "error: TOPIC_NOT_EXIST: topic 'x' does not exist (create it with tidelog topic create x)"


def test_collect_of_a_cluster_never_deployed_is_an_error(never_deployed, tmp_path):
    first = fails("collect", "--spec", str(never_deployed), "--out", str(tmp_path / "out"), rc=1)
    assert first.startswith("error: nothing was collected from never: every node is missing (h1: no CommitLog in ")
    assert "(never deployed or started there?)" in first and first.endswith("never/collect.json")


@pytest.mark.parametrize("command", [["drill", "--duration", "5"], ["upgrade", "--to", "current"],
                                     ["upgrade", "--to", "current", "--workload-rate", "50"]])
def test_drill_and_upgrade_of_a_stopped_cluster_fail_fast(never_deployed, command):
    t0 = time.monotonic()
    first = fails(*command, "--spec", str(never_deployed), rc=1)
    assert time.monotonic() - t0 < 15  # loose bound for ≤ 5 s (the health gate would wait 30 s)
    assert first.startswith("error: never is down: h1 is unreachable (cannot connect to 127.0.0.11:")
    assert "h3 is unreachable" in first
    assert first.endswith(f"; start it with tidelog deploy --spec {never_deployed}")


def test_a_running_group_is_left_to_the_health_gate(monkeypatch):
    """require_running fails only when no node answers; degraded or electing groups go on to
    the usual gate (which waits up to health.timeout_s)."""
    from infra.spec import from_dict
    from ops import upgrade

    spec = from_dict({"name": "x", "provider": "local", "hosts": [{"name": f"h{i}"} for i in (1, 2, 3)],
                      "groups": [{"name": "g0", "mode": "raft", "hosts": ["h1", "h2", "h3"]}]})
    up = {"state": "up"}
    down = {"state": "unreachable", "error": "cannot connect"}
    for states, raises in (([down, down, down], True), ([down, up, down], False), ([up, up, up], False)):
        rows = [{"id": f"h{i + 1}", **s} for i, s in enumerate(states)]
        problems = [f"{r['id']} is unreachable (cannot connect)" for r in rows if r["state"] != "up"] + ["no leader"]
        monkeypatch.setattr(upgrade.health, "status", lambda *a, **k: {"groups": [
            {"name": "g0", "nodes": rows, "problems": problems}]})
        if raises:
            with pytest.raises(upgrade.ClusterDown) as e:
                upgrade.require_running(spec)
            assert str(e.value) == ("x is down: h1 is unreachable (cannot connect); h2 is unreachable (cannot "
                                    "connect); h3 is unreachable (cannot connect); start it with tidelog deploy")
        else:
            assert upgrade.require_running(spec)["nodes"] == rows


def test_progress_draws_on_a_terminal_only(monkeypatch):
    import io

    from rich.console import Console

    from ops.cli import common

    monkeypatch.delenv("TIDELOG_NO_PROGRESS", raising=False)
    buf = io.StringIO()
    monkeypatch.setattr(common, "err_console", Console(file=buf, force_terminal=True, width=120))
    with common.progress(3, "deploy (nodes)") as tick:
        tick(note="h1 started")
        tick(completed=3, note="h3 started")
    assert "deploy (nodes)" in buf.getvalue() and "h3 started" in buf.getvalue()
    monkeypatch.setenv("TIDELOG_NO_PROGRESS", "1")
    buf.truncate(0)
    with common.progress(3, "deploy (nodes)") as tick:
        tick(note="h1")
    assert buf.getvalue() == ""


@pytest.mark.parametrize("args, first", [
    (["drill", "--rate", "0"], "error: --rate must be more than 0 sends per second"),
    (["drill", "--duration", "-1"], "error: --duration must be more than 0 seconds"),
    (["drill", "--fault-s", "0"], "error: --fault-s must be more than 0 seconds"),
    (["upgrade", "--to", "current", "--workload-rate", "-5"], "error: --workload-rate must not be negative"),
    (["collect", "--out", "/etc/passwd"],
     "error: --out /etc/passwd: not a directory; give a directory (it is created if missing)"),
])
def test_bad_platform_options(never_deployed, args, first):
    assert fails(*args, "--spec", str(never_deployed), rc=2) == first


@pytest.mark.parametrize("args, first", [
    (["--count", "-3"], "error: --count must not be negative"),
    (["--count", "1", "--window", "0"], "error: --window must be at least 1"),
])
def test_bad_produce_options(args, first):
    assert fails("produce", "-b", "127.0.0.1:1", "--topic", "t", *args, rc=2) == first


def test_progress_goes_to_a_terminal_stderr_never_into_json(never_deployed, tmp_path):
    import json
    import os
    import pty
    import subprocess
    import sys

    master, slave = pty.openpty()  # stderr is a terminal, stdout a pipe
    env = {k: v for k, v in os.environ.items() if k != "TIDELOG_NO_PROGRESS"}
    p = subprocess.Popen([sys.executable, "-m", "ops.cli.main", "collect", "--spec", str(never_deployed),
                          "--out", str(tmp_path / "out"), "--json"], stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    out, _ = p.communicate(timeout=120)
    err = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        err += chunk
    os.close(master)
    assert p.returncode == 1
    assert json.loads(out)["missing"] == ["h1", "h2", "h3"]  # stdout: the JSON and nothing else
    assert b"collect (nodes)" in err and b"error: nothing was collected" in err
