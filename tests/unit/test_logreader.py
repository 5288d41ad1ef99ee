"""The offline log reader (broker/store/logreader.py) and the drills' replica digest
(ops/replicas.py) on crafted logs of both formats: TLE1 entries and TLE2 record batches."""

from __future__ import annotations

import pytest

from broker.store import codec
from broker.store.logreader import iter_batches, iter_entries, iter_messages, segments
from ops.replicas import compare, digest
from spark_jobs import craft

both = pytest.mark.parametrize("fmt", craft.FORMATS, ids=lambda f: f"TLE{f}")


def cluster(tmp_path, fmt, nodes, segment_bytes=4096):
    return craft.write_cluster(tmp_path, "c", nodes, segment_bytes=segment_bytes, format=fmt)


@both
def test_messages_and_batches_across_segments(tmp_path, fmt):
    entries = craft.log(120, term=2, keys=("k",))
    base = cluster(tmp_path, fmt, [craft.Node("n1", entries, 119)])
    assert len(segments(base / "n1")) > 1
    end: list = []
    msgs = list(iter_messages(base / "n1", end))
    assert end[0].reason is None
    want = [(e.index, k) for e in entries for k in range(e.records(fmt))]
    assert [(m.index, m.batch_pos) for m in msgs] == want
    assert [m.queue_offset for m in msgs] == list(range(len(want)))  # base + k, one queue
    assert {m.msg_id for m in msgs} == {craft.msg_id(i, 2, k) for i, k in want}
    assert all(m.keys == ["k"] and m.topic == "orders" and m.term == 2 for m in msgs)
    assert list(iter_entries(base / "n1")) == msgs  # the old name, the same messages
    heads = list(iter_batches(base / "n1"))
    assert [h.head.index for h in heads] == list(range(120)) and {h.topic for h in heads} == {"orders"}
    assert [h.head.count for h in heads] == [e.records(fmt) for e in entries]
    assert [h.head.phys_offset for h in heads] == sorted({m.phys_offset for m in msgs})
    if fmt == 2:
        assert max(h.head.count for h in heads) == craft.BATCH_RECORDS_MAX


@both
def test_a_damaged_entry_stops_the_walk_and_says_where(tmp_path, fmt):
    base = cluster(tmp_path, fmt, [craft.Node("n1", craft.log(10), 9)], segment_bytes=1 << 16)
    (seg,) = segments(base / "n1")
    data = bytearray(seg.read_bytes())
    heads = list(iter_batches(base / "n1"))
    victim = heads[6].head
    data[victim.phys_offset + victim.size - 1] ^= 0x01  # the last byte of its last body
    seg.write_bytes(data)
    end: list = []
    assert [h.head.index for h in iter_batches(base / "n1", end)] == list(range(6))
    assert end[0].offset == victim.phys_offset and "CRC mismatch" in end[0].reason
    end = []
    assert {m.index for m in iter_messages(base / "n1", end)} == set(range(6))
    assert end[0].offset == victim.phys_offset


@both
def test_digest_is_per_entry_and_replicas_of_one_format_agree(tmp_path, fmt):
    entries = craft.log(30)
    base = cluster(tmp_path, fmt, [craft.Node("n1", entries, 29), craft.Node("n2", entries, 29)])
    d1, why = digest(base / "n1")
    assert why is None and sorted(d1) == list(range(30))
    term, phys, size, topic, qid, qoff, count, crc = d1[7]
    assert (term, topic, qid, count) == (1, "orders", 0, entries[7].records(fmt))
    assert qoff == sum(e.records(fmt) for e in entries[:7])
    assert digest(base / "n2")[0] == d1 and compare({"n1": base / "n1", "n2": base / "n2"}, None) == []


@both
def test_digest_tells_apart_replicas_whose_content_differs(tmp_path, fmt):
    """Same index, term, place and size, another body: the content CRC differs (TLE2: the
    producer's records_crc; TLE1: the entry's CRC)."""
    good = craft.log(12)
    good[5] = craft.E(5, 1, body=b"the body of 5")
    other = list(good)
    other[5] = craft.E(5, 1, body=b"the body of 6")
    base = cluster(tmp_path, fmt, [craft.Node("n1", good, 11), craft.Node("n2", other, 11)])
    d1, d2 = digest(base / "n1")[0], digest(base / "n2")[0]
    assert [i for i in d1 if d1[i] != d2[i]] == [5] and d1[5][:7] == d2[5][:7]
    (line,) = compare({"n1": base / "n1", "n2": base / "n2"}, 11)
    assert line.startswith("n2 and n1 disagree at 1 committed indexes from 5")


def test_a_tle1_log_still_reads_as_batches_of_one(tmp_path):
    base = cluster(tmp_path, 1, [craft.Node("n1", craft.log(5), 4)])
    (seg,) = segments(base / "n1")
    heads = [h.head for h in iter_batches(base / "n1")]
    first = codec.decode(seg.read_bytes(), 0)
    assert heads[0].magic == codec.ENTRY_MAGIC and heads[0].count == 1 and heads[0].size == first.size
    assert [m.batch_pos for m in iter_messages(base / "n1")] == [0] * 5


@both
def test_a_replica_behind_its_leader_is_compared_up_to_its_own_committed_index(tmp_path, fmt):
    """A restarted old leader holds a suffix of its old term past its committed index until
    the new leader cuts it: not a disagreement on the committed prefix while it is behind
    (the drill waits for it to catch up first), one once it claims those entries committed."""
    new = craft.log(12)
    old = new[:8] + [craft.E(i, 1, body=b"the old leader's %d" % i) for i in range(8, 12)]
    new = new[:8] + [craft.E(i, 2) for i in range(8, 12)]
    base = cluster(tmp_path, fmt, [craft.Node("n1", new, 11), craft.Node("n2", new, 11),
                                   craft.Node("n3", old, 7)])
    dirs = {n: base / n for n in ("n1", "n2", "n3")}
    (line,) = compare(dirs, 11)
    assert line.startswith("n3 and n1 disagree at 4 committed indexes from 8")
    assert compare(dirs, 11, frozenset({"n3"})) == []
    claims = cluster(tmp_path / "b", fmt, [craft.Node("n1", new, 11), craft.Node("n3", old, 9)])
    (line,) = compare({n: claims / n for n in ("n1", "n3")}, 11, frozenset({"n3"}))
    assert line.startswith("n3 and n1 disagree at 2 committed indexes from 8")
