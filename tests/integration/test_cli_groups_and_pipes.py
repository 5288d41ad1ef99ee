"""The client commands as a new user runs them from the README: `tidelog topic describe` with a
TIDELOG_BOOTSTRAP that names two broker groups (`tidelog cluster up --groups 2`, then
`eval "$(tidelog cluster env)"`), and `tidelog consume --json | head` (stdout's reader goes away)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys

import pytest

from broker.client import Admin, Producer
from ops.cluster import LocalCluster
from tests.helpers import run_tidelog as tidelog

pytestmark = pytest.mark.slow

BODY_BYTES = 30_000  # a JSON line of ~30 KB: a pipe's 64 KiB buffer holds two of them


@pytest.fixture(scope="module")
def two_groups(tmp_path_factory):
    """Two raft groups of three on loopback and a name server, insecure; (the environment
    `cluster env` exports, {"g0": g0's addresses, "g1": g1's})."""
    d = tmp_path_factory.mktemp("two-groups") / "c"
    try:
        tidelog("cluster", "up", "--insecure", "--groups", "2", "--namesrv", "1", "--data-dir", str(d), timeout_s=120)
        env = {"TIDELOG_CREDENTIALS": ""}
        for line in tidelog("cluster", "env", "--data-dir", str(d)).stdout.splitlines():
            words = shlex.split(line)
            if words[:1] == ["export"]:
                k, v = words[1].split("=", 1)
                env[k] = v
        nodes = LocalCluster(d).nodes
        yield env, {g: ",".join(n.address for n in nodes if n.id.startswith(f"{g}-")) for g in ("g0", "g1")}
    finally:
        tidelog("cluster", "down", "--data-dir", str(d), check=False)


def test_topic_describe_shows_every_groups_queues(two_groups):
    env, g = two_groups
    assert env["TIDELOG_BOOTSTRAP"] == f"{g['g0']},{g['g1']}"
    name = {}
    for group, queues in (("g0", 2), ("g1", 3)):
        with Admin(g[group]) as a:
            a.create_topic("spread", queues)
            name[group] = a.status()["broker_name"]
    g0, g1 = name["g0"], name["g1"]
    with Producer(g["g1"]) as pr:
        for i in range(7):
            pr.send("spread", b"m%d" % i)

    info = json.loads(tidelog("topic", "describe", "spread", "--json", env=env).stdout)
    assert info["write_queues"] == info["read_queues"] == 5
    assert info["groups"] == {g0: {"write_queues": 2, "read_queues": 2, "perm": 6},
                              g1: {"write_queues": 3, "read_queues": 3, "perm": 6}}
    assert sorted((q["broker_name"], q["queue_id"]) for q in info["queues"]) == \
        [(g0, 0), (g0, 1), (g1, 0), (g1, 1), (g1, 2)]
    assert sum(q["max_offset"] for q in info["queues"] if q["broker_name"] == g1) == 7

    text = tidelog("topic", "describe", "spread", env=env).stdout
    assert text.splitlines()[:3] == ["topic spread: 5 write / 5 read queues over 2 groups",
                                     f"  {g0}: 2 write / 2 read queues, perm rw",
                                     f"  {g1}: 3 write / 3 read queues, perm rw"]
    rows = {tuple(r[:2]) for r in map(str.split, text.splitlines()) if len(r) == 5 and r[0] in (g0, g1)}
    assert rows == {(q["broker_name"], str(q["queue_id"])) for q in info["queues"]}

    one = json.loads(tidelog("topic", "describe", "spread", "--json", "-b", g["g1"]).stdout)
    assert one["write_queues"] == 3 and "groups" not in one  # one group's addresses: as before
    assert sum(q["max_offset"] for q in one["queues"]) == 7

    p = tidelog("topic", "describe", "nowhere", env=env, check=False)
    assert p.returncode == 1 and p.stderr.splitlines() == [
        f"error: TOPIC_NOT_EXIST: topic nowhere does not exist in any group ({g0}, {g1})"]


def test_consume_into_a_pipe_whose_reader_left_ends_quietly_and_commits_what_was_printed(two_groups):
    """`tidelog consume --json | head -n 3`: head reads three lines and exits. The consumer ends
    with exit 0 and nothing on stderr, commits only what it wrote (the three, and what the
    pipe's buffer took), and leaves the group. Through the name server (TIDELOG_NAMESRV: a
    consumer per group) and with -b (one group's consumer)."""
    env, g = two_groups
    with Admin(g["g1"]) as a:
        a.create_topic("piped", 1)
    with Producer(g["g1"]) as pr:
        for i in range(100):
            pr.send("piped", b"%d" % i + b"x" * BODY_BYTES)
    for group, where in (("via-namesrv", []), ("via-bootstrap", ["-b", g["g1"]])):
        head_3(env, g["g1"], group, where)


def head_3(env: dict, g1: str, group: str, where: list[str]) -> None:
    """`tidelog consume -t piped -g GROUP --json | head -n 3`, then the group as g1 describes it."""
    p = subprocess.Popen([sys.executable, "-m", "ops.cli.main", "consume", *where, "-t", "piped", "-g", group,
                          "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={**os.environ, "TIDELOG_NO_PROGRESS": "1", **env})
    try:
        got = [json.loads(p.stdout.readline()) for _ in range(3)]
        p.stdout.close()  # what head does after its lines
        err = p.stderr.read().decode()
        assert p.wait(60) == 0 and err == "", err
    finally:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
    assert [m["queue_offset"] for m in got] == [0, 1, 2]

    d = json.loads(tidelog("group", "describe", group, "-b", g1, "--json").stdout)
    (q,) = d["queues"]
    pipe_holds = 64 * 1024 // BODY_BYTES + 1  # lines written that head never read
    assert 3 <= q["committed_offset"] <= 3 + pipe_holds, q  # not all that poll() returned
    assert d["members"] == []  # it left the group on its way out


def test_other_commands_whose_stdout_reader_left_end_quietly(two_groups):
    """`tidelog produce ... | true` (the reader gone before the summary) and any other command:
    exit 0, nothing on stderr; a produce with a failed send (too large) still exits 1."""
    env, g = two_groups
    r, w = os.pipe()
    os.close(r)
    try:
        for args, code in ((["produce", "-t", "quiet", "-n", "5", "-b", g["g1"]], 0),
                           (["topic", "list", "-b", g["g1"]], 0),
                           (["produce", "-t", "quiet", "-n", "1", "--size", str(5 << 20), "-b", g["g1"]], 1)):
            p = subprocess.run([sys.executable, "-m", "ops.cli.main", *args], stdout=w, stderr=subprocess.PIPE,
                               text=True, timeout=60, env={**os.environ, "TIDELOG_NO_PROGRESS": "1", **env})
            assert p.returncode == code and (p.stderr == "" if code == 0 else "first error:" in p.stderr), \
                (args, p.stderr)
    finally:
        os.close(w)
    with Admin(g["g1"]) as a:
        assert sum(q.max_offset for q in a.describe_topic("quiet").queues) == 5
