"""The admin commands as a new user ran them (second report): with a TIDELOG_BOOTSTRAP naming two
broker groups (`tidelog cluster up --groups 2`, then `eval "$(tidelog cluster env)"`), `topic
list`, `group list`, `group describe` and `query` answer from every group (they asked the first
that answered, silently); `admin transfer-leader` waits until the target leads and finds the
group it belongs to; `topic create --update --force` shrinks what the broker refuses unforced
(also through --namesrv); `query` names what it looked for; `produce` to a secure broker without
credentials is a TLS error naming `tidelog cluster env`, not SYSTEM_ERROR."""

from __future__ import annotations

import json
import shlex
import signal

import pytest

from broker.client import Admin, Consumer, Producer
from ops.cluster import LocalCluster
from tests.helpers import run_tidelog as tidelog

pytestmark = pytest.mark.slow

B0, B1 = "c-g0", "c-g1"  # the broker groups' names: a local cluster's groups are named after its directory


@pytest.fixture(scope="module")
def two_groups(tmp_path_factory):
    """Two raft groups of three on loopback, insecure: (the environment `cluster env` exports,
    {"g0": g0's addresses, "g1": g1's}, the cluster)."""
    d = tmp_path_factory.mktemp("two-groups") / "c"
    try:
        tidelog("cluster", "up", "--insecure", "--groups", "2", "--data-dir", str(d), timeout_s=120)
        env = {"TIDELOG_CREDENTIALS": "", "TIDELOG_NAMESRV": ""}
        for line in tidelog("cluster", "env", "--data-dir", str(d)).stdout.splitlines():
            words = shlex.split(line)
            if words[:1] == ["export"]:
                k, v = words[1].split("=", 1)
                env[k] = v
        c = LocalCluster(d)
        yield env, {g: ",".join(n.address for n in c.nodes if n.id.startswith(f"{g}-")) for g in ("g0", "g1")}, c
    finally:
        tidelog("cluster", "down", "--data-dir", str(d), check=False)


def consume(addresses: str, group: str, topic: str, want: int) -> None:
    with Consumer(addresses, group, topic) as c:
        got = 0
        for _ in range(50):
            got += len(c.poll(timeout_ms=200, max_messages=want - got))
            if got >= want:
                break
        c.commit()
    assert got == want


def test_lists_and_group_describe_cover_every_group(two_groups):
    env, g, _ = two_groups
    with Admin(g["g0"]) as a0, Admin(g["g1"]) as a1:
        a0.create_topic("both", 1)
        a1.create_topic("both", 1)
        a1.create_topic("only-g1", 1)
    with Producer(g["g0"]) as p0, Producer(g["g1"]) as p1:
        for i in range(3):
            p0.send("both", b"a%d" % i)
        for i in range(5):
            p1.send("only-g1", b"b%d" % i, key="k-%d" % i)
    consume(g["g0"], "billing", "both", 3)  # lag 0 on g0
    consume(g["g1"], "billing", "only-g1", 2)  # lag 3 on g1

    topics = {t["topic"]: t["groups"] for t in json.loads(tidelog("topic", "list", "--json", env=env).stdout)}
    assert topics["both"] == [B0, B1] and topics["only-g1"] == [B1]
    assert {"both", "only-g1"} <= set(tidelog("topic", "list", env=env).stdout.split())
    one = json.loads(tidelog("topic", "list", "--json", "-b", g["g1"]).stdout)  # one group: as before
    assert "only-g1" in one and all(isinstance(t, str) for t in one)

    (billing,) = [r for r in json.loads(tidelog("group", "list", "--json", env=env).stdout) if r["group"] == "billing"]
    assert billing["lag"] == 3 and billing["topics"] == ["both", "only-g1"]
    assert {b: v["lag"] for b, v in billing["groups"].items()} == {B0: 0, B1: 3}
    assert f"{B0} 0, {B1} 3" in tidelog("group", "list", env=env).stdout

    d = json.loads(tidelog("group", "describe", "billing", "--json", env=env).stdout)
    assert d["lag"] == 3 and d["groups"] == {B0: {"lag": 0}, B1: {"lag": 3}}
    assert sorted((q["broker_name"], q["topic"], q["lag"]) for q in d["queues"]) == \
        [(B0, "both", 0), (B1, "only-g1", 3)]
    text = tidelog("group", "describe", "billing", env=env).stdout
    assert text.splitlines()[0].strip() == f"group billing: lag 3 over 2 broker groups ({B0} 0, {B1} 3)"
    one = json.loads(tidelog("group", "describe", "billing", "--json", "-b", g["g1"]).stdout)
    assert one["lag"] == 3 and "groups" not in one  # one group's addresses: as before
    p = tidelog("group", "describe", "nobody", env=env, check=False)
    assert p.returncode == 1 and f"no consumer group 'nobody' in any broker group ({B0}, {B1})" in p.stderr, p.stderr

    # query: every group, and what was looked for when nothing is found
    found = [json.loads(line)
             for line in tidelog("query", "-t", "only-g1", "-k", "k-4", "--json", env=env).stdout.splitlines()]
    assert [(m["body"], m["broker_name"]) for m in found] == [("b4", B1)]
    (line,) = tidelog("query", "-t", "only-g1", "-k", "k-4", env=env).stdout.splitlines()
    assert line.startswith(f"{B1}/only-g1/0:4 ") and line.endswith(" b4"), line  # which group's queue 0
    p = tidelog("query", "-t", "ordres", "-k", "order-42", env=env, check=False)
    assert p.returncode == 1 and p.stderr.splitlines() == [
        f"error: TOPIC_NOT_EXIST: topic ordres does not exist in any group ({B0}, {B1}), so no message has key "
        "'order-42' in it (tidelog topic list shows the topics)"]
    p = tidelog("query", "-t", "both", "-k", "order-42", "--begin-ms", "1000", env=env, check=False)
    assert p.returncode == 1 and p.stderr.splitlines() == [
        "error: no message with key 'order-42' in topic 'both' stored from 1970-01-01T00:00:01.000+00:00 (1000 ms)"]


def test_produce_and_consume_use_every_group_of_the_bootstrap(two_groups):
    """`eval "$(tidelog cluster env)"` of `--groups 2` without name servers: produce spreads
    over both groups and consume reads both (each had used the first group that answered,
    silently: half the messages never consumed), lines saying the group."""
    env, g, _ = two_groups
    with Admin(g["g0"]) as a0, Admin(g["g1"]) as a1:
        a0.create_topic("spread-cli", 2)
        a1.create_topic("spread-cli", 3)
    n = 300
    p = tidelog("produce", "-t", "spread-cli", "-n", str(n), "-s", "40", "--window", "8", env=env)
    assert f"sent {n} messages to spread-cli" in p.stdout and ", 0 errors" in p.stdout, p.stdout
    info = json.loads(tidelog("topic", "describe", "spread-cli", "--json", env=env).stdout)
    per_group = {b: sum(q["max_offset"] for q in info["queues"] if q["broker_name"] == b) for b in (B0, B1)}
    assert sum(per_group.values()) == n and min(per_group.values()) > 0, per_group

    lines = tidelog("consume", "-t", "spread-cli", "-g", "whole", "--json", "--idle-timeout-s", "3",
                    env=env).stdout.splitlines()
    got = [json.loads(line) for line in lines]
    assert sorted(m["body"][:12] for m in got) == ["%012d" % i for i in range(n)]
    assert {b: sum(m["broker_name"] == b for m in got) for b in (B0, B1)} == per_group
    d = json.loads(tidelog("group", "describe", "whole", "--json", env=env).stdout)
    assert d["lag"] == 0  # committed in both groups

    # an address nobody answers at (nor names): said, and the groups that answered are used
    stale = tidelog("consume", "-t", "spread-cli", "-g", "whole-again", "-q", "--idle-timeout-s", "2",
                    "-b", env["TIDELOG_BOOTSTRAP"] + ",127.0.0.1:1", env=env)
    assert f"consumed {n} messages" in stale.stdout, stale.stdout + stale.stderr
    assert "warning: no answer from 127.0.0.1:1, and no broker that answered names it" in stale.stderr, stale.stderr

    one = tidelog("consume", "-t", "spread-cli", "-g", "one", "-q", "-b", g["g1"], "--idle-timeout-s", "2",
                  env=env, check=False)  # one group's addresses: that group, as before
    assert f"consumed {per_group[B1]} messages" in one.stdout + one.stderr, one.stdout + one.stderr
    # a topic no group holds: created from a group's template on its first send (the brokers
    # auto-create by default), as through name servers
    p = tidelog("produce", "-t", "new-cli", "-n", "5", env=env)
    assert "sent 5 messages to new-cli" in p.stdout, p.stdout
    info = json.loads(tidelog("topic", "describe", "new-cli", "--json", env=env).stdout)
    assert sum(q["max_offset"] for q in info["queues"]) == 5


def test_topic_create_makes_the_topic_in_every_group_of_the_bootstrap(two_groups):
    """`tidelog topic create` with every node of two groups (what `tidelog cluster env` of
    `--groups 2` exports, no name servers): the topic is made in both, as produce and consume
    use both (it had been made in the first group that answered only, and silently)."""
    env, g, _ = two_groups
    p = tidelog("topic", "create", "made-cli", "-q", "3", env=env)
    assert sorted(p.stdout.splitlines()) == [f"{b}: topic made-cli: 3 write / 3 read queues" for b in (B0, B1)]
    info = json.loads(tidelog("topic", "describe", "made-cli", "--json", env=env).stdout)
    assert sorted((q["broker_name"], q["queue_id"]) for q in info["queues"]) == \
        [(b, q) for b in (B0, B1) for q in range(3)], info
    p = tidelog("topic", "create", "made-cli", "-q", "5", "--update", "--json", env=env)
    assert json.loads(p.stdout) == {b: {"write_queues": 5, "read_queues": 5} for b in (B0, B1)}
    p = tidelog("topic", "create", "made-cli", env=env, check=False)  # exists in both: said per group
    assert p.returncode == 1 and "topic made-cli created on no group, not on " in p.stderr, p.stderr
    one = tidelog("topic", "create", "made-one", "-b", g["g1"], env=env)  # one group's addresses: there
    assert one.stdout.strip() == "topic made-one: 4 write / 4 read queues"
    info = json.loads(tidelog("topic", "describe", "made-one", "--json", env=env).stdout)
    assert {q["broker_name"] for q in info["queues"]} == {B1}


def test_transfer_leader_waits_until_the_target_leads_in_its_group(two_groups):
    env, g, _ = two_groups
    with Admin(g["g1"]) as a:
        r = a.status()["replication"]
    target = sorted(n for n in r["peers"] if n != r["leader"])[0]
    p = tidelog("admin", "transfer-leader", "--to", target, env=env)  # the bootstrap's first group is g0
    (line,) = p.stdout.splitlines()
    assert line.startswith(f"{target} leads (term ") and line.endswith(")"), p.stdout
    with Admin([r["peers"][target]]) as a:  # it leads now, not some time later
        st = a.status()["replication"]
    assert (st["role"], line) == ("leader", f"{target} leads (term {st['term']})")
    assert tidelog("admin", "transfer-leader", "--to", target, env=env).stdout.startswith(f"{target} already leads")

    p = tidelog("admin", "transfer-leader", "--to", "n2", env=env, check=False)
    assert p.returncode == 1 and p.stderr.splitlines() == [
        f"error: no node 'n2' in groups {B0} (members: g0-n0, g0-n1, g0-n2), {B1} (members: g1-n3, g1-n4, g1-n5): "
        "give --to one of them"]
    p = tidelog("admin", "transfer-leader", "--to", "n2", "-b", g["g1"], check=False)
    assert p.returncode == 1 and f"no node 'n2' in group {B1} (members: g1-n3, g1-n4, g1-n5)" in p.stderr


def test_transfer_leader_to_a_hung_member_times_out_naming_the_leader(two_groups):
    env, g, c = two_groups
    with Admin(g["g0"]) as a:
        r = a.status()["replication"]
    first = env["TIDELOG_BOOTSTRAP"].split(",")[0]
    target = sorted(n for n, addr in r["peers"].items() if n != r["leader"] and addr != first)[0]
    c.kill(target, signal.SIGSTOP)  # caught up, but it never takes over
    try:
        p = tidelog("admin", "transfer-leader", "--to", target, "--timeout-s", "1.5", env=env, check=False)
    finally:
        c.kill(target, signal.SIGCONT)
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stderr.startswith(f"error: the leadership transfer to {target} in group {B0} did not complete "
                               f"within 1.5s: {r['leader']} leads (term "), p.stderr


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    """One standalone broker and a name server, insecure: (its address, the name server's)."""
    c = LocalCluster(tmp_path_factory.mktemp("standalone") / "c")
    try:
        c.up(1, "standalone", "async", insecure=True, namesrv=1, wait=True)
        yield c.addresses[0], c.namesrv_addresses[0]
    finally:
        c.down()


def test_topic_create_force_shrinks_what_is_refused_unforced(standalone):
    address, namesrv = standalone
    env = {"TIDELOG_CREDENTIALS": "", "TIDELOG_NAMESRV": "", "TIDELOG_BOOTSTRAP": address}
    for topic, via in (("orders", []), ("events", ["--namesrv", namesrv])):
        tidelog("topic", "create", topic, "--queues", "4", *via, env=env)
        with Producer([address]) as p:
            for i in range(8):
                p.send(topic, b"m%d" % i, queue_id=i % 4)
        p = tidelog("topic", "create", topic, "--queues", "2", "--update", *via, env=env, check=False)
        assert p.returncode == 1 and "would hide 4 unconsumed messages" in p.stderr + p.stdout, p.stderr + p.stdout
        assert p.stderr.rstrip().endswith("(or give --force to do it anyway)"), p.stderr
        with Admin([address]) as a:
            assert a.describe_topic(topic).read_queues == 4  # nothing changed
        p = tidelog("topic", "create", topic, "--queues", "2", "--update", "--force", *via, env=env)
        assert "topic %s: 2 write / 2 read queues" % topic in p.stdout, p.stdout
        with Admin([address]) as a:
            assert a.describe_topic(topic).read_queues == 2
    p = tidelog("topic", "create", "orders", "--queues", "1", "--force", env=env, check=False)
    assert p.returncode == 2 and "--force goes with --update" in p.stderr


def test_produce_to_a_secure_broker_without_credentials_is_a_tls_error(tmp_path):
    c = LocalCluster(tmp_path / "c")
    try:
        c.up(1, "standalone", "async")
        env = {"TIDELOG_CREDENTIALS": "", "TIDELOG_CA_FILE": "", "TIDELOG_USERNAME": "", "TIDELOG_PASSWORD": "",
               "TIDELOG_NAMESRV": ""}
        p = tidelog("produce", "-b", c.addresses[0], "-t", "orders", "-n", "1", env=env, check=False)
    finally:
        c.down()
    assert p.returncode == 1, p.stdout + p.stderr
    assert "SYSTEM_ERROR" not in p.stderr and "route lookup failed" not in p.stderr, p.stderr
    (line,) = p.stderr.splitlines()
    assert line.startswith(f"error: TLS required: connection to {c.addresses[0]} lost"), line
    assert 'eval "$(tidelog cluster env --data-dir D)"' in line and "TIDELOG_CREDENTIALS" in line, line
