"""Terms, epochs, indexes and offsets are range-checked on decode, on encode and in the cores
(issue 14: one forged `Heartbeat(src="n1", term=2**64-1)` was adopted and persisted, and the
group could never elect again). The bounds: replication/raft/messages.py (TERM_MAX,
INDEX_MAX) and replication/master_slave/epochs.py (EPOCH_MAX, OFFSET_MAX)."""

from __future__ import annotations

import dataclasses
import json
import random
import struct

import pytest

from broker.protocol import ha as hp
from broker.protocol import jsonbody
from broker.protocol.codes import BadRequest, FieldLimitError
from replication.master_slave import roles
from replication.master_slave import wire as hw
from replication.master_slave.core import NodeCore
from replication.master_slave.epochs import EPOCH_MAX, OFFSET_MAX, EpochLimitError, EpochList
from replication.master_slave.master import MasterConfig
from replication.master_slave.roles import MASTER, SLAVE, View
from replication.raft import messages as m
from replication.raft import wire as rw
from replication.raft.core import HardState, RaftConfig, Role
from replication.raft.memlog import MemLog
from replication.raft.node import RaftNode
from replication.raft.state import HardStateFile

TERM_MAX, INDEX_MAX = m.TERM_MAX, m.INDEX_MAX


def packed(msg) -> bytes:
    """The message's bytes in the wire layout (replication/raft/wire.py), without any range
    check: what a forger sends."""
    src = msg.src.encode()
    kind = KIND_OF[type(msg)]
    head = struct.pack(">BQB", kind, msg.term, len(src)) + src
    if isinstance(msg, m.Push):
        out = head + struct.pack(">BqQI", msg.type, msg.commit_index, msg.seq, len(msg.entries))
        for index, term, data in msg.entries:
            out += struct.pack(">qQI", index, term, len(data)) + data
        return out
    if isinstance(msg, m.VoteRequest):
        return head + struct.pack(">qQB", msg.last_index, msg.last_term, msg.pre_vote | msg.transfer << 1)
    if isinstance(msg, m.VoteResponse | m.HeartbeatResponse):
        return head + struct.pack(">BB", *(msg.granted, msg.pre_vote) if isinstance(msg, m.VoteResponse)
                                  else (msg.ok, msg.needs_probe))
    if isinstance(msg, m.PushResponse):
        return head + struct.pack(">BBqqqQ", msg.type, msg.code, msg.index, msg.begin_index, msg.end_index, msg.seq)
    if isinstance(msg, m.Heartbeat):
        return head + struct.pack(">q", msg.commit_index)
    return head


KIND_OF = {m.VoteRequest: 1, m.VoteResponse: 2, m.Push: 3, m.PushResponse: 4, m.Heartbeat: 5,
           m.HeartbeatResponse: 6, m.TimeoutNow: 7}


def one_of_each(term: int) -> list:
    return [
        m.VoteRequest("n1", term, 5, 1, True, False),
        m.VoteResponse("n1", term, True, False),
        m.Push("n1", term, m.PushType.APPEND, 3, ((4, 1, b"x"),), 7),
        m.PushResponse("n1", term, m.PushType.APPEND, m.PushCode.SUCCESS, 4, 0, 4, 7),
        m.Heartbeat("n1", term, 3),
        m.HeartbeatResponse("n1", term, True, False),
        m.TimeoutNow("n1", term),
    ]


KINDS = [type(x).__name__ for x in one_of_each(1)]


# --- the Raft wire ---------------------------------------------------------------------------

def test_the_forged_heartbeat_of_the_issue_does_not_decode():
    body = struct.pack(">BQB", 5, 2**64 - 1, 2) + b"n1" + struct.pack(">q", 0)
    with pytest.raises(BadRequest, match=f"Heartbeat from 'n1': term {2**64 - 1} is out of range, "
                                         f"the limit is 0..TERM_MAX={2**62}"):
        rw.decode(body)


@pytest.mark.parametrize("i", range(len(KINDS)), ids=KINDS)
def test_a_term_past_term_max_is_refused_in_every_kind(i):
    over, at = one_of_each(TERM_MAX + 1)[i], one_of_each(TERM_MAX)[i]
    with pytest.raises(BadRequest, match=f"term {TERM_MAX + 1} is out of range.*TERM_MAX={TERM_MAX}"):
        rw.decode(packed(over))
    with pytest.raises(FieldLimitError, match="term.*TERM_MAX"):
        rw.encode(over)
    assert rw.decode(rw.encode(at)) == at  # the bound itself is allowed


@pytest.mark.parametrize("msg, field", [
    (m.VoteRequest("n1", 2, 5, TERM_MAX + 1), "last_term"),
    (m.VoteRequest("n1", 2, INDEX_MAX + 1, 1), "last_index"),
    (m.VoteRequest("n1", 2, -2, 1), "last_index"),
    (m.Push("n1", 2, m.PushType.APPEND, INDEX_MAX + 1), "commit_index"),
    (m.Push("n1", 2, m.PushType.APPEND, 3, ((4, TERM_MAX + 1, b"x"),)), "entry term"),
    (m.Push("n1", 2, m.PushType.APPEND, 3, ((2**63 - 1, 1, b"x"),)), "entry index"),
    (m.Push("n1", 2, m.PushType.TRUNCATE, 3, ((-1, 1, b"x"),)), "entry index"),
    (m.PushResponse("n1", 2, m.PushType.APPEND, m.PushCode.SUCCESS, -2**63, 0, 4), "index"),
    (m.PushResponse("n1", 2, m.PushType.APPEND, m.PushCode.SUCCESS, 4, INDEX_MAX + 1, 4), "begin_index"),
    (m.PushResponse("n1", 2, m.PushType.APPEND, m.PushCode.SUCCESS, 4, 0, 2**63 - 1), "end_index"),
    (m.Heartbeat("n1", 2, 2**63 - 1), "commit_index"),
    (m.Heartbeat("n1", 2, -5), "commit_index"),
])
def test_indexes_and_other_terms_out_of_range_are_refused(msg, field):
    with pytest.raises(BadRequest, match=f"{field} .* out of range"):
        rw.decode(packed(msg))
    with pytest.raises(FieldLimitError, match=field):
        rw.encode(msg)


def test_none_index_and_empty_log_values_still_travel():
    for msg in (m.VoteRequest("n1", 1, -1, 0, True), m.Heartbeat("n1", 1, -1),
                m.PushResponse("n1", 1, m.PushType.COMMIT, m.PushCode.TERM_STALE, -1, 0, -1)):
        assert rw.decode(rw.encode(msg)) == msg


# --- the Raft core ---------------------------------------------------------------------------

def node(term=0, voters=("a", "b", "c")) -> RaftNode:
    return RaftNode(RaftConfig("a", voters, election_ticks=10, heartbeat_ticks=3), MemLog(),
                    HardState(term), -1, random.Random(1))


@pytest.mark.parametrize("i", range(len(KINDS)), ids=KINDS)
def test_the_core_never_adopts_a_term_past_term_max(i):
    n = node(term=3)
    n.ready()
    msg = one_of_each(TERM_MAX + 1)[i]
    n.step(dataclasses.replace(msg, src="b"))
    r = n.ready()
    assert n.term == 3 and r.hard_state is None and not r.messages and n.role == Role.FOLLOWER
    assert n.status()["refused_messages"] == 1 and "TERM_MAX" in n.status()["last_refused"]


def test_a_node_at_term_max_never_campaigns_past_it():
    for voters in (("a", "b", "c"), ("a",)):
        n = node(term=TERM_MAX, voters=voters)
        for _ in range(200):
            n.tick()
            r = n.ready()
            assert r.hard_state is None or r.hard_state.term <= TERM_MAX
            assert all(msg.term <= TERM_MAX for _, msg in r.messages)
        assert n.term == TERM_MAX and n.role == Role.FOLLOWER
        assert "TERM_MAX" in n.status()["problem"]


def test_a_node_one_below_term_max_campaigns_to_it_and_no_further():
    n = node(term=TERM_MAX - 1, voters=("a",))
    for _ in range(100):
        n.tick()
        n.ready()
    assert n.term == TERM_MAX and n.is_leader


def test_the_core_refuses_a_hard_state_past_term_max():
    with pytest.raises(ValueError, match="TERM_MAX"):
        node(term=2**64 - 1)


def test_a_persisted_term_past_term_max_fails_to_load_and_says_what_to_do(tmp_path):
    f = tmp_path / "raft_state.json"
    f.write_text(json.dumps({"term": 2**64 - 1, "voted_for": None}))
    with pytest.raises(ValueError, match="TERM_MAX") as e:
        HardStateFile(f).load()
    assert "voted_for" in str(e.value) and "remove this node's data" in str(e.value)
    f.write_text(json.dumps({"term": TERM_MAX, "voted_for": "b"}))
    assert HardStateFile(f).load() == HardState(TERM_MAX, "b")


# --- master-slave: HA_ROLE, the epoch rules, the HA wire -------------------------------------------

def test_ha_role_follow_of_epoch_2_32_is_refused_on_decode():
    body = json.dumps({"action": "follow", "master": "n1", "epoch": 2**32}).encode()
    with pytest.raises(BadRequest, match="epoch"):
        jsonbody.decode(hp.HARole, body)
    with pytest.raises(BadRequest, match="EPOCH_MAX"):
        hp.HARole("follow", master="n1", epoch=2**32)  # nor sent
    ok = json.dumps({"action": "follow", "master": "n1", "epoch": EPOCH_MAX}).encode()
    assert jsonbody.decode(hp.HARole, ok).epoch == EPOCH_MAX


def test_following_an_epoch_past_epoch_max_is_refused_by_the_core():
    c = NodeCore("n0", ("n0", "n1", "n2"), MasterConfig())
    with pytest.raises(EpochLimitError, match="EPOCH_MAX"):
        c.on_follow("n1", EPOCH_MAX + 1)
    assert c.epoch_seen == 0
    with pytest.raises(EpochLimitError, match="EPOCH_MAX"):
        roles.accepts_follow(0, None, 2**32, "n1")


def test_promoting_past_epoch_max_is_refused_naming_who_reports_the_epoch():
    me = View("n1", SLAVE, 3, 3, "n0", 100)
    with pytest.raises(EpochLimitError, match="EPOCH_MAX=.*n2 reports epoch") as e:
        roles.new_epoch(me, [View("n2", SLAVE, 3, EPOCH_MAX, "n0", 100)])
    assert "epoch_seen" in str(e.value)
    assert roles.new_epoch(me, [View("n0", MASTER, EPOCH_MAX - 1, EPOCH_MAX - 1, "n0", 100)]) == EPOCH_MAX
    with pytest.raises(EpochLimitError):
        EpochList([(1, 0)]).open(EPOCH_MAX + 1, 10)
    with pytest.raises(EpochLimitError):
        EpochList([(1, 0), (2**32, 10)])


def hello(**kw):
    return {"node": "n1", "epochs": [[1, 0]], "min_offset": 0, "end_offset": 10, "epoch_seen": 1,
            "version": hw.VERSION, **kw}


def framed(d: dict) -> bytes:
    body = json.dumps(d).encode()
    return struct.pack(">I", len(body)) + body


@pytest.mark.parametrize("cls, fields, limit", [
    (hw.Hello, {"epoch_seen": 2**32}, "EPOCH_MAX"),
    (hw.Hello, {"epochs": [[1, 0], [EPOCH_MAX + 1, 5]]}, "EPOCH_MAX"),
    (hw.Hello, {"end_offset": 2**63}, "OFFSET_MAX"),
    (hw.Welcome, {"epoch": EPOCH_MAX + 1}, "EPOCH_MAX"),
    (hw.Welcome, {"start": OFFSET_MAX + 1}, "OFFSET_MAX"),
    (hw.Welcome, {"truncate_to": 2**64}, "OFFSET_MAX"),
])
def test_ha_handshakes_out_of_range_are_refused(cls, fields, limit):
    d = hello(**fields)
    if cls is hw.Welcome:
        d = {"node": "n0", "version": hw.VERSION, **fields}
    with pytest.raises(hw.HAProtocolError, match=limit):
        hw.decode_handshake(framed(d), cls)
    with pytest.raises(hw.HAProtocolError, match=limit):
        hw.encode_handshake(cls(**d))


def test_ha_transfer_header_and_report_out_of_range_are_refused():
    with pytest.raises(hw.HAProtocolError, match="epoch.*EPOCH_MAX"):
        hw.encode_header(0, 0, EPOCH_MAX + 1, 0, 0)
    with pytest.raises(hw.HAProtocolError, match="epoch.*EPOCH_MAX"):
        hw.decode_header(hw.HEADER.pack(0, 0, 2**32 - 1, 0, 0))
    with pytest.raises(hw.HAProtocolError, match="confirm.*OFFSET_MAX"):
        hw.decode_header(hw.HEADER.pack(0, 0, 1, 0, 2**64 - 1))
    with pytest.raises(hw.HAProtocolError, match="OFFSET_MAX"):
        hw.encode_report(OFFSET_MAX + 1)
    with pytest.raises(hw.HAProtocolError, match="OFFSET_MAX"):
        hw.decode_report(hw.REPORT.pack(2**63))
    assert hw.decode_header(hw.encode_header(5, 0, EPOCH_MAX, OFFSET_MAX, 3)) == (5, 0, EPOCH_MAX, OFFSET_MAX, 3)
    assert hw.decode_report(hw.encode_report(OFFSET_MAX)) == OFFSET_MAX
