"""Property tests for every decoder on the wire and on disk: encode -> decode is the identity
for generated valid values, and any bytes (random, or a valid encoding with bytes flipped,
cut or added) raise nothing but the module's named error:

    frames (broker/protocol/frame.py)           FrameError (FrameDecoder/FrameReader: .error)
    SEND / SEND_BATCH / PULL bodies, JSON       BadRequest (broker/protocol/codes.py)
    Raft messages (replication/raft/wire.py)    BadRequest
    HA handshakes (replication/master_slave)    HAProtocolError
    CommitLog entries (broker/store/codec.py)   CorruptEntry

Numbers are range-checked on top of their fields' widths (issue 14): any message a decoder
returns has its terms, epochs, indexes and offsets within replication/raft/messages.py's and
replication/master_slave/epochs.py's bounds; an encoder refuses a value past them.

Encoders refuse what their fields cannot carry with FieldLimitError (a ValueError naming the
field and the limit) before anything is sent: bug 9b, a 256-byte topic was a struct.error.
Hypothesis prints the failing example and a reproduction blob (print_blob) on failure.
"""

from __future__ import annotations

import dataclasses
import json
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.client import Producer
from broker.protocol import admin as ap
from broker.protocol import frame as fr
from broker.protocol import ha as hp
from broker.protocol import jsonbody
from broker.protocol import offsets as op
from broker.protocol import pull as pp
from broker.protocol import query as qp
from broker.protocol import send as sp
from broker.protocol import topics as tp
from broker.protocol.codes import BadRequest, FieldLimitError
from broker.store import codec
from replication.master_slave import wire as hw
from replication.master_slave.epochs import EPOCH_MAX, OFFSET_MAX
from replication.raft import messages as rm
from replication.raft import wire as rw
from tests.unit.test_wire_ranges import packed

PROPS = settings(max_examples=300, deadline=None, print_blob=True,
                 suppress_health_check=[HealthCheck.too_slow])
FUZZ = settings(max_examples=500, deadline=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow])

u8, u16, u32 = st.integers(0, 2**8 - 1), st.integers(0, 2**16 - 1), st.integers(0, 2**32 - 1)
u64, i32, i64 = st.integers(0, 2**64 - 1), st.integers(-2**31, 2**31 - 1), st.integers(-2**63, 2**63 - 1)


def utf8(min_bytes: int, max_bytes: int, max_chars: int = 60):
    return st.text(min_size=min_bytes, max_size=max_chars).filter(
        lambda s: min_bytes <= len(s.encode()) <= max_bytes)


topics = utf8(1, codec.TOPIC_BYTES_MAX)
blobs = st.binary(max_size=300)


def mutated(valid: st.SearchStrategy) -> st.SearchStrategy:
    """Valid encodings with bytes flipped, cut, inserted or appended: what a decoder meets."""
    @st.composite
    def build(draw):
        b = bytearray(draw(valid))
        for _ in range(draw(st.integers(1, 4))):
            op_ = draw(st.sampled_from(["flip", "cut", "insert", "extend", "trunc"]))
            i = draw(st.integers(0, max(len(b) - 1, 0)))
            if op_ == "flip" and b:
                b[i] = draw(u8)
            elif op_ == "cut" and b:
                del b[i:i + draw(st.integers(1, 8))]
            elif op_ == "insert":
                b[i:i] = draw(st.binary(min_size=1, max_size=8))
            elif op_ == "extend":
                b += draw(st.binary(min_size=1, max_size=16))
            elif b:
                del b[i:]
        return bytes(b)
    return st.one_of(build(), st.binary(max_size=200))


# --- frames ----------------------------------------------------------------------------------

headers = st.dictionaries(utf8(1, 40, 20), st.text(max_size=60), max_size=4)
frames = st.tuples(u16, u32, st.sampled_from([0, fr.FLAG_RESPONSE, fr.FLAG_ONEWAY]), headers, blobs)


def encoded_frame(t) -> bytes:
    code, corr, flags, h, body = t
    return fr.encode(code, corr, body, h, flags)


@PROPS
@given(st.lists(frames, min_size=1, max_size=5), st.integers(1, 64))
def test_frames_round_trip_through_decoder_and_reader(fs, piece):
    data = b"".join(map(encoded_frame, fs))
    dec, got = fr.FrameDecoder(), []
    for i in range(0, len(data), piece):
        got += [(f.code, f.corr_id, f.flags, dict(f.headers), bytes(f.body)) for f in dec.feed(data[i:i + piece])]
    assert dec.error is None and dec.eof_error() is None
    assert got == [(c, corr, fl, h, b) for c, corr, fl, h, b in fs]
    r, got = fr.FrameReader(capacity=256), []
    for i in range(0, len(data), piece):
        chunk = data[i:i + piece]
        view = r.get_buffer()
        n = min(len(view), len(chunk))
        view[:n] = chunk[:n]
        got += [(f.code, f.corr_id, f.flags, dict(f.headers), bytes(f.body)) for f in r.buffer_updated(n)]
        chunk = chunk[n:]
        while chunk:
            view = r.get_buffer()
            n = min(len(view), len(chunk))
            view[:n] = chunk[:n]
            got += [(f.code, f.corr_id, f.flags, dict(f.headers), bytes(f.body)) for f in r.buffer_updated(n)]
            chunk = chunk[n:]
    assert r.error is None and got == [(c, corr, fl, h, b) for c, corr, fl, h, b in fs]


any_frames = mutated(st.lists(frames, min_size=1, max_size=3).map(lambda fs: b"".join(map(encoded_frame, fs))))


@FUZZ
@given(any_frames, st.integers(1, 64), st.sampled_from([64, 1 << 20]))
def test_frame_decoders_take_any_bytes(data, piece, frame_max):
    dec = fr.FrameDecoder(frame_max)
    for i in range(0, len(data), piece):
        for f in dec.feed(data[i:i + piece]):
            assert isinstance(f.headers, dict)
    assert dec.error is None or isinstance(dec.error, fr.FrameError)
    e = dec.eof_error()
    assert e is None or isinstance(e, fr.FrameError)
    r = fr.FrameReader(frame_max, capacity=128)
    rest = data
    while rest and r.error is None:  # after an error the connection is closed: no more reads
        view = r.get_buffer()
        assert len(view) > 0
        n = min(len(view), len(rest))
        view[:n] = rest[:n]
        r.buffer_updated(n)
        rest = rest[n:]
    assert r.error is None or isinstance(r.error, fr.FrameError)
    e = r.eof_error()
    assert e is None or isinstance(e, fr.FrameError)


@FUZZ
@given(mutated(headers.map(fr.encode_headers)))
def test_header_maps_raise_only_frame_error(raw):
    try:
        assert isinstance(fr.decode_headers(raw), dict)
    except fr.FrameError as e:
        assert e.code == fr.Code.BAD_FRAME


# --- SEND, SEND_BATCH, PULL -----------------------------------------------------------------

send_requests = st.builds(sp.SendRequest, topics, i32, u32, u64, st.binary(min_size=16, max_size=16),
                          st.binary(max_size=100), blobs)
batch_requests = st.builds(sp.SendBatchRequest, topics, i32, st.lists(st.builds(
    sp.BatchMessage, u32, u64, st.binary(min_size=16, max_size=16), st.binary(max_size=50), blobs),
    min_size=1, max_size=5))
pull_requests = st.builds(pp.PullRequest, topics, i32, u64, u32, u32, u32, st.text(max_size=40))


@PROPS
@given(send_requests, st.builds(sp.SendResponse, i32, u64, u64, u64, u64))
def test_send_round_trip(r, resp):
    got = sp.decode_request(sp.encode_request(r))
    assert got._replace(properties=bytes(got.properties), body=bytes(got.body)) == r
    assert sp.decode_response(sp.encode_response(resp)) == resp


@PROPS
@given(batch_requests, st.builds(sp.SendBatchResponse, i32, u64, u64, u64, st.lists(u64, max_size=20)))
def test_batch_round_trip(r, resp):
    assert sp.decode_batch_request(sp.encode_batch_request(r)) == r
    assert sp.decode_batch_response(sp.encode_batch_response(resp)) == resp


@PROPS
@given(pull_requests, st.builds(pp.PullResponse, u64, u64, u64, u32, blobs))
def test_pull_round_trip(r, resp):
    assert pp.decode_request(pp.encode_request(r)) == r
    got = pp.decode_response(pp.encode_response(resp))
    assert got._replace(entries=bytes(got.entries)) == resp


@FUZZ
@given(st.one_of(mutated(send_requests.map(sp.encode_request)),
                 mutated(batch_requests.map(sp.encode_batch_request)),
                 mutated(pull_requests.map(pp.encode_request))))
def test_request_bodies_raise_only_bad_request(raw):
    for decode in (sp.decode_request, sp.decode_response, sp.decode_batch_request,
                   sp.decode_batch_response, pp.decode_request, pp.decode_response):
        for buf in (raw, memoryview(raw)):
            try:
                decode(buf)
            except BadRequest:
                pass


# --- JSON bodies -------------------------------------------------------------------------------

JSON_CLASSES = [tp.TopicName, tp.CreateTopic, op.QueryOffsets, op.Offsets, op.CommitOffsets,
                qp.QueryByKey, qp.QueryById, ap.Heartbeat, ap.TransferLeader, ap.Faults,
                ap.DescribeGroup, ap.GroupMembers, hp.HARole]
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20)
                           | st.floats(allow_nan=False),
                           lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4),
                           max_leaves=20)


@PROPS
@given(st.sampled_from(JSON_CLASSES).flatmap(lambda c: st.builds(c)))
def test_json_bodies_round_trip(msg):
    assert jsonbody.decode(type(msg), jsonbody.encode(msg)) == msg


@FUZZ
@given(st.one_of(st.integers(), st.sampled_from([-1, EPOCH_MAX, EPOCH_MAX + 1, 2**32, 2**64])))
def test_ha_role_epochs_decode_within_bounds(epoch):
    raw = json.dumps({"action": "follow", "master": "n1", "epoch": epoch}).encode()
    if 0 <= epoch <= EPOCH_MAX:
        assert jsonbody.decode(hp.HARole, raw).epoch == epoch
    else:
        with pytest.raises(BadRequest, match="epoch"):
            jsonbody.decode(hp.HARole, raw)


@FUZZ
@given(st.sampled_from(JSON_CLASSES), st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.sampled_from(["topic", "group", "offsets", "queue_ids", "action", "msg_id", "x"]),
                    json_values, max_size=4).map(lambda v: json.dumps(v).encode()),
    mutated(st.just(b'{"topic":"t","group":"g","offsets":{"1":2}}')),
    st.integers(1, 5000).map(lambda n: b"[" * n + b"]" * n)))
def test_json_bodies_raise_only_bad_request(cls, raw):
    try:
        msg = jsonbody.decode(cls, raw)
    except BadRequest:
        return
    if isinstance(msg, hp.HARole):
        assert 0 <= msg.epoch <= EPOCH_MAX


# --- Raft ------------------------------------------------------------------------------------

srcs = utf8(0, rw.SRC_BYTES_MAX)


def raft_messages_of(term, index, entry_index, seq=u64):
    return st.one_of(
        st.builds(rm.VoteRequest, srcs, term, index, term, st.booleans(), st.booleans()),
        st.builds(rm.VoteResponse, srcs, term, st.booleans(), st.booleans()),
        st.builds(rm.Push, srcs, term, st.sampled_from(rm.PushType), index,
                  st.lists(st.tuples(entry_index, term, blobs), max_size=4).map(tuple), seq),
        st.builds(rm.PushResponse, srcs, term, st.sampled_from(rm.PushType), st.sampled_from(rm.PushCode),
                  index, index, index, seq),
        st.builds(rm.Heartbeat, srcs, term, index),
        st.builds(rm.HeartbeatResponse, srcs, term, st.booleans(), st.booleans()),
        st.builds(rm.TimeoutNow, srcs, term),
    )


terms = st.integers(0, rm.TERM_MAX) | st.sampled_from([0, 1, rm.TERM_MAX])
raft_indexes = st.integers(rm.INDEX_NONE, rm.INDEX_MAX) | st.sampled_from([-1, 0, rm.INDEX_MAX])
raft_messages = raft_messages_of(terms, raft_indexes, st.integers(0, rm.INDEX_MAX))
# what the fields can carry, past the bounds: a forger's messages (the wire layout, unchecked)
wide_raft_messages = raft_messages_of(u64, i64, i64)


def raft_in_bounds(msg) -> bool:
    """Every number of a decoded Raft message within its bound (spelled out, not out_of_bounds)."""
    ok = 0 <= msg.term <= rm.TERM_MAX
    for name in ("last_index", "commit_index", "index", "begin_index", "end_index"):
        if hasattr(msg, name):
            ok &= -1 <= getattr(msg, name) <= rm.INDEX_MAX
    if hasattr(msg, "last_term"):
        ok &= 0 <= msg.last_term <= rm.TERM_MAX
    for index, term, _ in getattr(msg, "entries", ()):
        ok &= 0 <= index <= rm.INDEX_MAX and 0 <= term <= rm.TERM_MAX
    return ok


@PROPS
@given(raft_messages)
def test_raft_round_trip(msg):
    raw = rw.encode(msg)
    assert rw.decode(raw) == msg and rw.decode(memoryview(raw)) == msg


@FUZZ
@given(mutated(raft_messages.map(rw.encode)) | mutated(wide_raft_messages.map(lambda x: packed(x))))
def test_raft_decode_raises_only_bad_request(raw):
    try:
        msg = rw.decode(raw)
    except BadRequest:
        return
    assert raft_in_bounds(msg), msg


@FUZZ
@given(wide_raft_messages)
def test_raft_messages_past_the_bounds_are_refused_both_ways(msg):
    raw = packed(msg)  # the layout alone: what a forger can send
    if raft_in_bounds(msg):
        assert rw.decode(raw) == msg == rw.decode(rw.encode(msg))
    else:
        with pytest.raises(BadRequest, match="out of range, the limit is"):
            rw.decode(raw)
        with pytest.raises(FieldLimitError, match="_MAX"):
            rw.encode(msg)


# --- HA handshakes ---------------------------------------------------------------------------

nat = st.integers(0, OFFSET_MAX) | st.just(OFFSET_MAX)
ep = st.integers(0, EPOCH_MAX) | st.just(EPOCH_MAX)
epochs = st.lists(st.tuples(ep, nat).map(list), max_size=4)
hellos = st.builds(hw.Hello, st.text(min_size=1, max_size=20), epochs, nat, nat, ep)
welcomes = st.builds(hw.Welcome, st.text(min_size=1, max_size=20), ep, epochs, nat, nat,
                     st.none() | nat, st.booleans(), st.none() | st.text(max_size=30),
                     st.none() | st.text(max_size=30))


@PROPS
@given(st.one_of(hellos, welcomes), blobs, nat, u32, ep, nat, nat)
def test_ha_round_trip(msg, tail, offset, size, epoch, end, confirm):
    raw = hw.encode_handshake(msg)
    assert hw.decode_handshake(raw + tail, type(msg)) == (msg, len(raw))
    assert hw.decode_handshake(raw[:-1], type(msg)) == (None, 0)
    header = hw.encode_header(offset, size, epoch, end, confirm)
    assert hw.HEADER.unpack(header) == hw.decode_header(header) == (offset, size, epoch, end, confirm)
    assert hw.REPORT.unpack(hw.encode_report(offset)) == (offset,) == (hw.decode_report(hw.encode_report(offset)),)


def ha_in_bounds(msg) -> bool:
    ok = all(0 <= getattr(msg, f) <= EPOCH_MAX for f in ("epoch", "epoch_seen") if hasattr(msg, f))
    ok &= all(0 <= getattr(msg, f) <= OFFSET_MAX for f in ("min_offset", "end_offset", "start", "first_index")
              if hasattr(msg, f))
    ok &= all(0 <= e <= EPOCH_MAX and 0 <= s <= OFFSET_MAX for e, s in msg.epochs)
    return ok and (getattr(msg, "truncate_to", None) is None or 0 <= msg.truncate_to <= OFFSET_MAX)


@FUZZ
@given(u64, u32, u32, u64, u64)
def test_ha_transfer_headers_and_reports_decode_within_bounds(offset, size, epoch, end, confirm):
    raw = hw.HEADER.pack(offset, size, epoch, end, confirm)
    if epoch <= EPOCH_MAX and max(offset, end, confirm) <= OFFSET_MAX:
        assert hw.decode_header(raw) == (offset, size, epoch, end, confirm)
    else:
        with pytest.raises(hw.HAProtocolError, match="_MAX"):
            hw.decode_header(raw)
        with pytest.raises(hw.HAProtocolError, match="_MAX"):
            hw.encode_header(offset, size, epoch, end, confirm)
    if offset <= OFFSET_MAX:
        assert hw.decode_report(hw.REPORT.pack(offset)) == offset
    else:
        with pytest.raises(hw.HAProtocolError, match="OFFSET_MAX"):
            hw.decode_report(hw.REPORT.pack(offset))


def framed(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


@FUZZ
@given(st.sampled_from([hw.Hello, hw.Welcome]), st.one_of(
    mutated(st.one_of(hellos, welcomes).map(hw.encode_handshake)),
    json_values.map(lambda v: framed(json.dumps(v).encode())),
    st.dictionaries(st.sampled_from(["node", "epochs", "version", "epoch", "start", "reset", "error",
                                     "min_offset", "end_offset", "epoch_seen", "truncate_to"]),
                    json_values, max_size=8).map(lambda d: framed(json.dumps({"version": 1, **d}).encode())),
    st.integers(1, 200_000).map(lambda n: framed(b"[" * n + b"]" * n))))
def test_ha_handshake_raises_only_ha_protocol_error(cls, raw):
    try:
        msg, used = hw.decode_handshake(raw, cls)
        assert (msg is None and used == 0) or (isinstance(msg, cls) and ha_in_bounds(msg))
    except hw.HAProtocolError:
        pass


big = st.sampled_from([EPOCH_MAX + 1, 2**32, 2**63, 2**64, OFFSET_MAX + 1])


@FUZZ
@given(st.sampled_from([hw.Hello, hw.Welcome]),
       st.sampled_from(["epoch", "epoch_seen", "min_offset", "end_offset", "start", "first_index",
                        "truncate_to", "epochs"]), big)
def test_ha_handshakes_past_the_bounds_are_refused(cls, field, value):
    d = {"node": "n1", "version": hw.VERSION, "epochs": [], "min_offset": 0, "end_offset": 0, "epoch_seen": 0}
    if cls is hw.Welcome:
        d = {"node": "n1", "version": hw.VERSION}
    if field == "epochs":
        d[field] = [[value, 0]]
    elif field in {f.name for f in dataclasses.fields(cls)}:
        d[field] = value
    else:
        return
    msg = None
    try:
        msg, _ = hw.decode_handshake(framed(json.dumps(d).encode()), cls)
    except hw.HAProtocolError as e:
        assert "_MAX" in str(e)
    assert msg is None or ha_in_bounds(msg)
    if msg is None:
        with pytest.raises(hw.HAProtocolError, match="_MAX"):
            hw.encode_handshake(cls(**d))


def test_deeply_nested_ha_handshake_is_a_protocol_error():
    # was: RecursionError out of json.loads, past the HA server's error handling
    with pytest.raises(hw.HAProtocolError, match="RecursionError"):
        hw.decode_handshake(framed(b"[" * 100_000 + b"]" * 100_000), hw.Hello)


# --- CommitLog entries -----------------------------------------------------------------------

entries = st.tuples(u64, u64, u64, u64, u64, u64, st.binary(min_size=16, max_size=16), u32, u32,
                    topics.map(str.encode), st.binary(max_size=80), blobs)


@PROPS
@given(st.lists(entries, min_size=1, max_size=4))
def test_entries_round_trip(fields):
    raw = b"".join(codec.encode(*f) for f in fields)
    got = list(codec.iter_entries(raw))
    assert [(*e[:9], e.topic.encode(), e.properties, e.body) for e in got] == [tuple(f) for f in fields]
    e, _, ok = codec.inspect(raw)
    assert ok and e == got[0]
    assert codec.check(raw)[0] == got[0].size


@FUZZ
@given(mutated(st.lists(entries, min_size=1, max_size=2).map(lambda fs: b"".join(codec.encode(*f) for f in fs))),
       st.booleans())
def test_entry_decoders_raise_only_corrupt_entry(raw, verify):
    for f in (lambda: list(codec.iter_entries(raw, verify)), lambda: codec.inspect(raw),
              lambda: codec.check(raw), lambda: codec.decode(raw, 0, verify, base_offset=0),
              lambda: codec.peek(raw), lambda: codec.peek_ids(raw)):
        try:
            f()
        except codec.CorruptEntry:
            pass
    assert isinstance(codec.decode_properties(raw), dict)


names = st.text(min_size=1, max_size=10).filter(lambda s: "\x01" not in s and "\x02" not in s)


@PROPS
@given(st.dictionaries(names, st.text(max_size=20).filter(lambda s: "\x01" not in s and "\x02" not in s),
                       max_size=5))
def test_properties_round_trip(props):
    assert codec.decode_properties(codec.encode_properties(props)) == props


# --- encoders refuse what their fields cannot carry (bug 9b) -------------------------------------

@pytest.mark.parametrize("topic", ["t" * 128, "t" * 256, "é" * 100, ""])
def test_encoders_refuse_a_topic_over_the_limit_with_a_named_error(topic):
    msg = sp.SendRequest(topic, 0, 0, 0, b"\0" * 16, b"", b"x")
    for encode in (lambda: sp.encode_request(msg),
                   lambda: sp.encode_batch_request(sp.SendBatchRequest(topic, 0, [sp.BatchMessage(0, 0, b"\0" * 16, b"", b"x")])),
                   lambda: pp.encode_request(pp.PullRequest(topic, 0, 0, 1, 1, 0))):
        with pytest.raises(FieldLimitError, match="TOPIC_BYTES_MAX") as e:
            encode()
        assert isinstance(e.value, ValueError) and e.value.field == "topic"


def test_encoders_name_every_other_limit():
    cases = [
        (lambda: sp.encode_request(sp.SendRequest("t", 2**31, 0, 0, b"\0" * 16, b"", b"")), "queue_id"),
        (lambda: sp.encode_request(sp.SendRequest("t", 0, 0, 0, b"\0" * 15, b"", b"")), "msg_id"),
        (lambda: sp.encode_request(sp.SendRequest("t", 0, 0, 0, b"\0" * 16, b"p" * 40000, b"")), "PROPS_BYTES_MAX"),
        (lambda: sp.encode_request(sp.SendRequest("t", 0, 0, -1, b"\0" * 16, b"", b"")), "born_ts_ms"),
        (lambda: pp.encode_request(pp.PullRequest("t", 0, -1, 1, 1, 0)), "queue_offset"),
        (lambda: fr.encode(70, 2**32), "corr_id"),
        (lambda: fr.encode(70, 1, b"", {"k" * 300: "v"}), "HEADER_KEY_BYTES_MAX"),
        (lambda: fr.encode(70, 1, b"", {"k": "v" * 70000}), "HEADER_VALUE_BYTES_MAX"),
        (lambda: fr.encode(70, 1, b"", {"k": "v" * 20000}), "HEADER_MAP_BYTES_MAX"),
        (lambda: rw.encode(rm.Heartbeat("n" * 256, 1, 0)), "SRC_BYTES_MAX"),
        (lambda: rw.encode(rm.Heartbeat("n", -1, 0)), "term"),
    ]
    for encode, named in cases:
        with pytest.raises(FieldLimitError, match=named):
            encode()
    with pytest.raises(hw.HAProtocolError, match="epoch"):
        hw.encode_header(0, 0, 2**32, 0, 0)


def test_a_long_error_text_still_makes_an_answer_the_client_reads():
    raw = fr.encode_response(7, 1, b"", {"error": "bad topic name " + "x" * 100_000})
    (f,) = fr.FrameDecoder().feed(raw)
    assert f.headers["error"].startswith("bad topic name x") and "cut" in f.headers["error"]


def test_decoders_refuse_a_topic_over_the_limit():
    ok = sp.encode_request(sp.SendRequest("t" * 127, 0, 0, 0, b"\0" * 16, b"", b""))
    raw = ok[:32] + bytes([200]) + ok[33:35] + b"t" * 200
    with pytest.raises(BadRequest, match="TOPIC_BYTES_MAX=127"):
        sp.decode_request(raw)


def test_producer_refuses_a_long_topic_before_sending():
    # nothing listens on port 1: the old client looked the route up first (then struct.error
    # from the encoder once a broker answered); now the topic is refused before any connect
    with Producer(["127.0.0.1:1"]) as p:
        for topic in ("t" * 256, "t" * 128):
            with pytest.raises(FieldLimitError, match=r"topic: \d+ bytes, the limit is 1..127 \(TOPIC_BYTES_MAX\)"):
                p.send(topic, b"x")
            with pytest.raises(FieldLimitError):
                p.send_batch(topic, [b"x"])
