"""The `tidelog` command line against a broker process, as an operator would use it."""

import json
import subprocess
import sys

import pytest

from ops.localbroker import LocalBroker, free_port

pytestmark = pytest.mark.slow


def tidelog(*args, stdin: str | None = None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ops.cli.main", *args], input=stdin,
                          capture_output=True, text=True, timeout=60, env=env)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = LocalBroker(tmp_path_factory.mktemp("cli") / "b", segment_bytes=1 << 20,
                    message_body_bytes_max=64 << 10)
    b.start()
    yield b
    b.stop()


def test_topics_produce_consume_status_query(broker):
    bs = ["--bootstrap", broker.address]
    r = tidelog("topic", "create", "orders", "--queues", "3", *bs)
    assert r.returncode == 0 and "3 write / 3 read" in r.stdout
    r = tidelog("produce", "--topic", "orders", "--count", "300", "--size", "200", "--key", "o", *bs, "--json")
    summary = json.loads(r.stdout)
    assert r.returncode == 0 and summary["acked"] == 300 and summary["errors"] == 0
    r = tidelog("produce", "--topic", "orders", *bs, stdin="line one\nline two\n")
    assert r.returncode == 0 and "sent 2 messages" in r.stdout
    r = tidelog("consume", "--topic", "orders", "--group", "cli", "--count", "302", "--json", *bs)
    msgs = [json.loads(line) for line in r.stdout.splitlines()]
    assert r.returncode == 0 and len(msgs) == 302
    assert {m["body"] for m in msgs} >= {"line one", "line two"}
    r = tidelog("consume", "--topic", "orders", "--group", "cli", "--idle-timeout-s", "1", "--json", *bs)
    assert r.returncode == 0 and r.stdout == ""  # the group's offsets were committed
    r = tidelog("topic", "describe", "orders", "--json", *bs)
    info = json.loads(r.stdout)
    assert sum(q["max_offset"] for q in info["queues"]) == 302
    r = tidelog("admin", "status", "--json", *bs)
    st = json.loads(r.stdout)
    # entries: a record batch per producer batch (the 302 messages counted above)
    assert 0 < st["store"]["next_index"] <= 302 and st["role"] == "standalone"
    r = tidelog("admin", "status", *bs)
    assert "standalone" in r.stdout and "flushed" in r.stdout
    r = tidelog("query", "--topic", "orders", "--key", "o-7", "--json", *bs)
    assert r.returncode == 0 and json.loads(r.stdout)["keys"] == ["o-7"]
    r = tidelog("query", "--id", msgs[0]["msg_id"], *bs)
    assert r.returncode == 0 and msgs[0]["msg_id"] in r.stdout
    r = tidelog("topic", "list", *bs)
    assert r.stdout.split() == ["orders"]


def test_errors_exit_non_zero_and_say_what_was_wrong(broker, tmp_path):
    dead = ["--bootstrap", f"127.0.0.1:{free_port()}"]
    r = tidelog("produce", "--topic", "t", "--count", "1", *dead)
    assert r.returncode == 1 and "cannot connect" in r.stderr
    r = tidelog("topic", "describe", "missing", "--bootstrap", broker.address)
    assert r.returncode == 1 and "TOPIC_NOT_EXIST" in r.stderr
    r = tidelog("query", "--key", "x", "--bootstrap", broker.address)
    assert r.returncode == 2 and r.stderr.splitlines()[0] == "error: give --topic and --key, or --id"
    cfg = tmp_path / "broker.yaml"
    cfg.write_text("flush: sometimes\nlisten: 127.0.0.1:1\n")
    r = tidelog("broker", "start", "--config", str(cfg))
    assert r.returncode == 2 and "field 'flush'" in r.stderr
    cfg.write_text(f"data_dir: {tmp_path / 'open'}\nlisten: 127.0.0.1:{free_port()}\n")
    r = tidelog("broker", "start", "--config", str(cfg))  # security is on by default: no tls, no start
    assert r.returncode == 2 and "security is on by default" in r.stderr and "insecure: true" in r.stderr, r.stderr
    assert not (tmp_path / "open").exists()
    cfg.write_text(f"data_dir: {broker.data_dir}\nlisten: 127.0.0.1:{free_port()}\ninsecure: true\n"
                   f"segment_bytes: 1048576\nmessage_body_bytes_max: 65536\n")
    r = tidelog("broker", "start", "--config", str(cfg))
    assert r.returncode == 2 and "in use by another broker" in r.stderr
