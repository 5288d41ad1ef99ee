"""The one replication interface (replication/base.py): every mode offers the same calls;
what a mode does not offer is refused by name, never by a missing attribute; the
processors never ask which mode runs."""

import ast
import asyncio
import time
from pathlib import Path

import pytest

from broker.protocol.codes import BadRequest, Code
from broker.system import OFFSET_TOPIC, TOPIC_TOPIC, SystemEntries, offsets_entry
from replication.base import Ports, Replication
from replication.master_slave.driver import MasterSlaveDriver
from replication.raft.driver import RaftDriver

ROOT = Path(__file__).resolve().parents[2]


def test_every_mode_implements_the_interface_without_adding_to_it():
    public = {n for n in dir(Replication) if not n.startswith("_")}
    for cls in (RaftDriver, MasterSlaveDriver):
        assert issubclass(cls, Replication)
        assert public <= set(dir(cls)), public - set(dir(cls))


def test_processors_and_server_never_ask_which_mode_runs():
    """No `.raft`, no `repl is None` (standalone is a replication too), and the processors
    never read `config.mode` (the server reads it once, to pick the Replication)."""
    for path in [*sorted((ROOT / "broker/processors").glob("*.py")), ROOT / "broker/server.py"]:
        tree = ast.parse(path.read_text())
        banned = ("raft",) if path.name == "server.py" else ("raft", "mode")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                assert node.attr not in banned, f"{path.name}:{node.lineno} reads .{node.attr}"
            if isinstance(node, ast.Compare) and any(isinstance(c, ast.Constant) and c.value is None
                                                     for c in node.comparators):
                left = node.left
                assert not (isinstance(left, ast.Attribute) and left.attr == "repl"), \
                    f"{path.name}:{node.lineno} checks repl against None"


class FakeTopics:
    def __init__(self):
        self.applied = []

    def apply(self, cfg):
        self.applied.append(cfg)


class FakeOffsets:
    def __init__(self):
        self.commits = []

    def commit(self, group, topic, offsets):
        self.commits.append((group, topic, offsets))


def standalone():
    topics, offsets = FakeTopics(), FakeOffsets()
    persisted = []
    ports = Ports(store=None, config=None, data_dir=Path("."), faults=None, topics=topics, offsets=offsets,
                  system=SystemEntries(topics, offsets), request_flush=lambda: None,
                  schedule_dispatch=lambda: None, dispatch_now=lambda: None, role_changed=lambda: None,
                  persist_offsets=lambda done: persisted.append(done))
    return Replication(ports), topics, offsets, persisted


def test_standalone_applies_system_entries_where_they_are_made():
    repl, topics, offsets, persisted = standalone()
    answers = []
    repl.commit_system(TOPIC_TOPIC, b'{"name": "t"}', lambda code, err: answers.append(code))
    assert topics.applied == [{"name": "t"}] and answers == [Code.SUCCESS]
    repl.commit_system(*offsets_entry("g", "t", {0: 5}), lambda code, err: answers.append(code))
    assert offsets.commits == [("g", "t", {0: 5})]
    assert len(answers) == 1 and len(persisted) == 1  # answered once the offsets are on disk
    persisted[0](Code.SUCCESS, None)
    assert answers == [Code.SUCCESS, Code.SUCCESS]


def test_what_a_mode_does_not_offer_is_refused_by_name():
    repl, *_ = standalone()
    with pytest.raises(BadRequest, match="transfer-leader needs mode raft"):
        repl.transfer_leader("n1")
    with pytest.raises(BadRequest, match="promotion needs mode master-slave"):
        asyncio.run(repl.handle_role_request(None))
    with pytest.raises(BadRequest, match="GET_METADATA needs mode master-slave"):
        repl.metadata()
    assert repl.handlers() == {} and repl.status() == {} and repl.retention_holders() == []


def test_a_malformed_system_entry_is_logged_not_raised(caplog):
    topics, offsets = FakeTopics(), FakeOffsets()
    SystemEntries(topics, offsets).apply(OFFSET_TOPIC, b"{not json")
    assert "malformed %OFFSET% entry" in caplog.text and not offsets.commits


def test_a_send_whose_replication_answers_before_append_returns_still_gets_that_answer(tmp_path):
    """A replication may call a send's `done` before `append` returns (a raft leader counts its
    local append at once, and a failure there fails the pending acks): the client still gets
    that outcome, not silence until its timeout, and the connection's in-flight count is not
    left raised (it pauses reading past a bound)."""
    from broker.protocol import send as sp
    from broker.protocol.codes import Req
    from tests.helpers import BrokerThread, RawClient

    with BrokerThread(tmp_path / "b") as b:
        repl = b.broker.repl
        stored = repl.append

        def append(items, done):
            batch, _ = stored(items, None)
            done(Code.TERM_CHANGED, "leadership moved before a quorum held the append")
            return batch, True

        b.call(setattr, repl, "append", append)
        c = RawClient(b.port)
        try:
            f = c.request(Req.SEND, sp.encode_request(sp.SendRequest("t", 0, 0, 1, b"\1" * 16, b"", b"x")))
            assert f.code == Code.TERM_CHANGED and "quorum" in f.headers["error"], (f.code, f.headers)
            assert b.call(lambda: [conn.inflight for conn in b.broker.connections]) == [0]
        finally:
            c.close()


def test_a_raft_follower_that_becomes_leader_indexes_everything_before_it_serves(tmp_path):
    """Followers index committed entries off the replication path (on their tick). A new leader
    may serve reads under its lease before its no-op commits (its first heartbeats renew the
    lease): so on becoming leader it indexes everything it knows committed first, before queue
    offsets are recomputed and before the broker hears of the role change."""
    from types import SimpleNamespace

    from broker.config import from_dict

    calls = []
    d = RaftDriver.__new__(RaftDriver)
    d.bcfg = from_dict({"listen": "127.0.0.1:0", "data_dir": str(tmp_path), "insecure": True})
    d.node = SimpleNamespace(is_leader=True, term=2, commit_index=7, log=SimpleNamespace(last_index=lambda: 9))
    d.store = SimpleNamespace(recompute_queue_offsets=lambda: calls.append("recompute queue offsets"))
    d.ports = SimpleNamespace(dispatch_now=lambda: calls.append("dispatch"),
                              role_changed=lambda: calls.append("role changed"))
    d._dispatch_at = 0.0
    before = time.monotonic()
    d._role_changed()
    assert calls == ["dispatch", "recompute queue offsets", "role changed"]
    # the next tick's indexing is counted from this dispatch
    assert d._dispatch_at >= before + d.bcfg.raft_follower_dispatch_interval_ms / 1000


def test_the_raft_clock_runs_due_ticks_once_in_order_survives_a_failing_one_and_stops_with_the_driver(tmp_path, caplog):
    """RaftDriver._clock runs the ticks a sleeping tick loop owes before an input: each due
    tick once; a tick that raises is logged and the input goes on; after stop() no tick runs
    (a node shutting down must not campaign on the ticks since its loop stopped)."""
    import asyncio
    from types import SimpleNamespace

    from broker.config import from_dict
    from replication.raft.acks import PendingAcks

    now = [100.0]
    ticks = []

    def tick():
        ticks.append(round(now[0], 3))
        if len(ticks) == 2:
            raise RuntimeError("a tick that fails")

    d = RaftDriver.__new__(RaftDriver)
    d.bcfg = from_dict({"listen": "127.0.0.1:0", "data_dir": str(tmp_path), "insecure": True})
    d.node = SimpleNamespace(tick=tick)
    d._process = lambda: None
    d._period, d._next_tick_at = 0.01, 100.01
    d._loop = SimpleNamespace(time=lambda: now[0])
    d.clock = {"ticks": 0, "wakes": 0}
    d._ticker, d.acks, d.links = None, PendingAcks(), {}
    now[0] = 100.035
    d._clock()  # three ticks were due (100.01, .02, .03); the second raised
    assert len(ticks) == 3 and d.clock["ticks"] == 3
    assert "raft tick failed" in caplog.text
    d._clock()
    assert len(ticks) == 3  # none due: none run
    asyncio.run(d.stop())
    now[0] = 101.0
    d._clock()
    assert len(ticks) == 3, "ticks ran after stop()"
