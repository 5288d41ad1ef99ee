"""The clients read pull and query answers of either format (docs/design/batch-format.md
"Pull", "Key and msg-id index"): a pull from inside a record batch gets the whole batch and
the consumer drops what lies before the offset it asked for; the tag filter is per message;
a QUERY answer's batch is split and filtered by id or key."""

import types

import pytest

from broker.client.admin import answered_messages
from broker.client.consumer import ConsumerSession, Message, _Queue
from broker.client.errors import CorruptMessage
from broker.protocol import pull as pp
from broker.store import codec, codec_batch

from .storeutil import body_of


def rec(i: int, tag: str | None = None, keys=None):
    return codec_batch.BatchRecord(i, 1000 + i, i.to_bytes(16, "big"),
                                   codec.message_properties(keys=keys or f"k{i}", tags=tag), body_of(i, 40))


def batch(index: int, base: int, n: int, phys: int = 0, tag_of=lambda i: None, topic="t") -> bytes:
    return codec_batch.encode_batch(index, 1, phys, base, 5000 + index, topic, 0,
                                    [rec(i, tag_of(i)) for i in range(base, base + n)])


def tle1(index: int, qoff: int, tag: str | None = None) -> bytes:
    return codec.encode(index, 1, 0, qoff, 5000 + index, 1000 + qoff, qoff.to_bytes(16, "big"), 0, qoff,
                        b"t", codec.message_properties(keys=f"k{qoff}", tags=tag), body_of(qoff, 40))


def session(tags: str = "*"):
    return ConsumerSession(types.SimpleNamespace(topic="t", tag_set=pp.parse_tags(tags)))


def accept(s, offset: int, body: bytes, next_offset: int):
    qs = _Queue(0, offset)
    ok = s._accept(qs, pp.PullResponse(next_offset, 0, next_offset, 0, body), offset)
    return ok, qs


def test_a_pull_of_tle1_entries_is_read_as_before():
    ok, qs = accept(session(), 3, b"".join(tle1(i, i) for i in range(3, 7)), 7)
    assert ok and [m.queue_offset for m in qs.buffer] == [3, 4, 5, 6]
    assert {m.batch_pos for m in qs.buffer} == {0} and qs.next_pull == qs.fetched == 7
    m = qs.buffer[0]
    assert (m.msg_id, m.keys, m.body, m.index, m.flags) == ((3).to_bytes(16, "big").hex(), ["k3"], body_of(3, 40), 3, 3)


def test_a_pull_from_inside_a_batch_starts_exactly_where_it_asked():
    body = batch(10, 0, 5) + batch(11, 5, 4) + batch(12, 9, 3)
    ok, qs = accept(session(), 3, body, 12)
    assert ok and [m.queue_offset for m in qs.buffer] == list(range(3, 12))
    assert [(m.index, m.batch_pos) for m in qs.buffer][:3] == [(10, 3), (10, 4), (11, 0)]
    assert qs.next_pull == qs.fetched == 12  # the broker's: past the last whole batch
    assert qs.buffer[0].msg_id == (3).to_bytes(16, "big").hex() and qs.buffer[0].keys == ["k3"]


def test_the_tag_filter_applies_per_message_of_a_batch():
    tag = lambda i: "a" if i % 3 == 0 else "b"  # noqa: E731
    body = batch(10, 0, 5, tag_of=tag) + tle1(11, 5, "a") + batch(12, 6, 6, tag_of=tag)
    ok, qs = accept(session("a"), 1, body, 12)
    assert ok and [m.queue_offset for m in qs.buffer] == [3, 5, 6, 9]
    assert {m.tags for m in qs.buffer} == {"a"} and qs.fetched == 12


def test_a_corrupt_batch_stops_the_queue_at_its_first_unread_offset():
    bad = bytearray(batch(11, 5, 4))
    bad[-3] ^= 0x10  # a body byte: the records CRC
    ok, qs = accept(session(), 2, batch(10, 0, 5) + bytes(bad), 9)
    assert not ok and [m.queue_offset for m in qs.buffer] == [2, 3, 4]  # its neighbour's, whole
    assert isinstance(qs.error, CorruptMessage) and qs.error.offset == 5
    assert "records CRC mismatch" in str(qs.error) and qs.next_pull == 2  # not advanced
    # asked from inside the corrupt batch: the error names the offset asked for
    ok, qs = accept(session(), 7, bytes(bad), 9)
    assert not ok and not qs.buffer and qs.error.offset == 7


def test_a_corrupt_tle1_entry_is_reported_as_before():
    bad = bytearray(tle1(4, 4))
    bad[-1] ^= 1
    ok, qs = accept(session(), 2, tle1(2, 2) + tle1(3, 3) + bytes(bad), 5)
    assert not ok and [m.queue_offset for m in qs.buffer] == [2, 3]
    assert str(qs.error).endswith("at queue offset 4: CRC mismatch")


def test_from_entry_takes_either_kind():
    e = codec.decode(tle1(7, 7, "x"))
    m = next(iter(codec.iter_messages(batch(3, 20, 3, tag_of=lambda i: "x"), from_queue_offset=21)))
    a, b = Message.from_entry(e), Message.from_entry(m)
    assert (a.queue_offset, a.batch_pos, a.tags, a.index) == (7, 0, "x", 7)
    assert (b.queue_offset, b.batch_pos, b.tags, b.index, b.keys) == (21, 1, "x", 3, ["k21"])


def test_a_query_answer_batch_is_split_and_filtered():
    body = (batch(4, 0, 3, phys=0, topic="t") + tle1(5, 3)
            + codec_batch.encode_batch(6, 1, 0, 4, 5006, "t", 0, [rec(4, keys=["k1", "other"]), rec(5, keys="zz")])
            + codec_batch.encode_batch(7, 1, 0, 0, 5007, "u", 0, [rec(9, keys="k1")]))
    by_key = answered_messages(body, lambda m: m.topic == "t" and "k1" in m.keys)
    assert [(m.index, m.batch_pos, m.queue_offset) for m in by_key] == [(4, 1, 1), (6, 0, 4)]
    by_id = answered_messages(body + body, lambda m: m.msg_id == (5).to_bytes(16, "big"))
    assert [(m.index, m.batch_pos) for m in by_id] == [(6, 1)]  # each message once
    assert answered_messages(tle1(5, 3), lambda m: True)[0].queue_offset == 3
    with pytest.raises(codec.CorruptEntry):
        answered_messages(body[:-1], lambda m: True)
