import pytest

from broker.protocol.codes import BadRequest
from replication.raft import messages as m
from replication.raft import wire

SAMPLES = [
    m.VoteRequest("n1", 7, 120, 6, pre_vote=True),
    m.VoteRequest("n1", 7, -1, 0, transfer=True),
    m.VoteResponse("n2", 7, True, True),
    m.Push("n0", 3, m.PushType.APPEND, 99, ((100, 3, b"entry-a"), (101, 3, b"")), seq=4242),
    m.Push("n0", 3, m.PushType.COMPARE, -1, ((5, 2, b""),), seq=1),
    m.Push("n0", 3, m.PushType.COMMIT, 7),
    m.PushResponse("n2", 3, m.PushType.APPEND, m.PushCode.INCONSISTENT_STATE, 101, 0, 99, 4242),
    m.Heartbeat("n0", 3, 55),
    m.HeartbeatResponse("n1", 3, True, needs_probe=True),
    m.TimeoutNow("n0", 3),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda x: type(x).__name__)
def test_round_trip(msg):
    assert wire.decode(wire.encode(msg)) == msg
    assert wire.decode(memoryview(b"".join(wire.encode_parts(msg)))) == msg


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda x: type(x).__name__)
def test_truncated_or_padded_bodies_are_refused(msg):
    raw = wire.encode(msg)
    for bad in (raw[:-1], raw + b"\0", raw[:3]):
        with pytest.raises(BadRequest):
            wire.decode(bad)


def test_random_bytes(rng):
    for _ in range(2000):
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 60)))
        try:
            wire.decode(junk)
        except BadRequest:
            pass
