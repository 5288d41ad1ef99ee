"""The HA wire and the slave's stream reassembly (replication/master_slave/{wire,slave}.py)."""

import random

import pytest

from broker.store import codec
from broker.store.commitlog import CommitLog
from replication.master_slave import wire
from replication.master_slave.slave import SlaveStream, StreamMismatch

from .storeutil import append, item

SEG = 4096


def master_log(tmp_path, n=40):
    cl = CommitLog(tmp_path / "m", SEG, positions_per_file=64)
    cl.recover(None)
    append(cl, [item(i, random.Random(i).randrange(0, 900)) for i in range(n)], 3, 0)
    return cl


def entry_spans(cl):
    """(offset, size) of each entry of the log, in order."""
    return [cl.position(i)[:2] for i in range(cl.first_index, cl.tail.next_index)]


def raw_entries(cl):
    return [cl.read(p, n) for p, n in entry_spans(cl)]


def frame_ends(stream):
    """(bytes of `stream` through the frame, log offset its body ends at) for each frame."""
    out, pos = [], 0
    while pos < len(stream):
        offset, size = wire.decode_header(stream, pos)[:2]
        pos += wire.HEADER.size + size
        out.append((pos, offset + size))
    return out


def log_reached(ends, fed):
    """The log offset the first `fed` bytes of a stream with these `frame_ends` reach."""
    done = [x for x in ends if x[0] <= fed]
    at, end = done[-1] if done else (0, 0)
    return end + max(0, fed - at - wire.HEADER.size) if len(done) < len(ends) else end


def frames(cl, start, rng, batch_max=700):
    """The master's TRANSFER frames for [start, end), in random batch sizes, with heartbeats."""
    out, pos = [], start
    while pos < cl.tail.offset:
        n = min(rng.randrange(1, batch_max), cl.tail.offset - pos)
        seg = cl.segments.find(pos)
        n = min(n, seg.base + seg.size - pos)
        out.append(wire.encode_header(pos, n, 3, cl.tail.offset, pos) + cl.read(pos, n))
        pos += n
        if rng.random() < 0.1:
            out.append(wire.encode_header(pos, 0, 3, cl.tail.offset, pos))
    return b"".join(out)


def test_stream_reassembles_entries_across_segments_in_any_chunking(tmp_path, seed):
    rng = random.Random(seed)
    cl = master_log(tmp_path)
    assert len(cl.segments.files) > 3  # the stream crosses end-of-segment markers
    data = frames(cl, 0, rng)
    s = SlaveStream(0, SEG)
    got, pos = [], 0
    while pos < len(data):
        n = rng.randrange(1, 3000)
        got += s.feed(data[pos:pos + n])
        pos += n
    assert got == raw_entries(cl)
    assert s.expected == cl.tail.offset and s.master_end == cl.tail.offset and s.epoch == 3
    follower = CommitLog(tmp_path / "s", SEG, positions_per_file=64)
    follower.recover(None)
    follower.append_as_follower(got)  # places every entry where the master did
    assert [f.pread(0, SEG) for f in follower.segments.files] == [f.pread(0, SEG) for f in cl.segments.files]


def test_stream_refuses_what_does_not_continue_it(tmp_path):
    cl = master_log(tmp_path, 5)
    end = cl.tail.offset
    s = SlaveStream(100, SEG)
    with pytest.raises(StreamMismatch, match="master sent offset 0, this slave needs 100"):
        s.feed(wire.encode_header(0, 10, 1, end, 0) + b"x" * 10)
    s = SlaveStream(0, SEG)
    with pytest.raises(StreamMismatch, match="no entry at offset 0"):
        s.feed(wire.encode_header(0, 16, 1, end, 0) + b"\xff" * 16)
    s = SlaveStream(0, SEG)
    with pytest.raises(StreamMismatch, match="exceeds"):
        s.feed(wire.encode_header(0, 1 << 30, 1, end, 0))
    s = SlaveStream(0, SEG)
    s.feed(wire.encode_header(0, 0, 5, end, 0))
    with pytest.raises(StreamMismatch, match="epoch went back"):
        s.feed(wire.encode_header(0, 0, 4, end, 0))
    s = SlaveStream(0, 200)  # an entry larger than this node could ever hold
    big = raw_entries(cl)[1]
    with pytest.raises(StreamMismatch, match="size"):
        s.feed(wire.encode_header(0, len(big), 1, end, 0) + big)


def test_handshake_round_trip_and_bad_input():
    h = wire.Hello("n1", [[1, 0], [2, 4096]], 0, 9000, 2)
    raw = wire.encode_handshake(h)
    assert wire.decode_handshake(raw[:-1], wire.Hello) == (None, 0)
    assert wire.decode_handshake(raw + b"rest", wire.Hello) == (h, len(raw))
    w = wire.Welcome("n0", 2, [[1, 0], [2, 4096]], 4096, 7, 4096, False)
    assert wire.decode_handshake(wire.encode_handshake(w), wire.Welcome)[0] == w
    for bad, why in [(b'{"node": "n1"', "bad Hello"),
                     (b'{"version": 9, "node": "x", "epochs": [], "min_offset": 0, "end_offset": 0, "epoch_seen": 0}', "version 9"),
                     (b'{"version": 1, "node": "x", "epochs": "no", "min_offset": 0, "end_offset": 0, "epoch_seen": 0}', "epochs"),
                     (b'{"version": 1, "node": "x", "epochs": [], "min_offset": -1, "end_offset": 0, "epoch_seen": 0}', "min_offset"),
                     (b'[1, 2]', "not an object")]:
        with pytest.raises(wire.HAProtocolError, match=why):
            wire.decode_handshake(len(bad).to_bytes(4, "big") + bad, wire.Hello)
    with pytest.raises(wire.HAProtocolError, match="exceeds"):
        wire.decode_handshake((wire.HANDSHAKE_BYTES_MAX + 1).to_bytes(4, "big"), wire.Hello)


def test_blank_marker_split_across_frames(tmp_path):
    cl = master_log(tmp_path)
    first_roll = next(p for p in (cl.position(i)[0] for i in range(cl.tail.next_index)) if p >= SEG)
    s = SlaveStream(0, SEG)
    got = s.feed(wire.encode_header(0, SEG - 3, 3, cl.tail.offset, 0) + cl.read(0, SEG - 3))
    assert s.blank_left > 0  # inside the end-of-segment marker's bytes
    got += s.feed(wire.encode_header(SEG - 3, 3, 3, cl.tail.offset, 0) + cl.read(SEG - 3, 3))
    assert s.blank_left == 0 and s.pending_at == first_roll == SEG
    assert got == raw_entries(cl)[:len(got)] and codec.peek_ids(got[-1])[0] == len(got) - 1


@pytest.mark.parametrize("handon", [0, 1, 600, 3000, 1 << 30])
def test_entries_are_handed_on_while_a_frame_arrives_not_only_when_it_ends(tmp_path, seed, handon):
    """One frame of the whole log, fed a random piece at a time: a whole entry waits unhanded
    only while fewer than `handon` bytes have gathered (handon=0: it is handed on as soon as its
    last byte is here), and the stream does not hand on after every read. A slave that waited
    for the frame's last byte showed its master no progress for as long as a whole
    ha_transfer_batch_bytes took to arrive (ha_server.STALL_S cuts such a link); one that handed
    on every read paid an append and a report for each."""
    rng = random.Random(seed)
    cl = master_log(tmp_path)
    entries = raw_entries(cl)
    spans = [(p, p + n) for p, n in entry_spans(cl)]
    log = b"".join(f.pread(0, SEG) for f in cl.segments.files)[:cl.tail.offset]  # markers and all
    frame = wire.encode_header(0, len(log), 3, cl.tail.offset, 0) + log
    s = SlaveStream(0, SEG, handon_bytes=handon)
    got, fed, handons = [], 0, 0
    while fed < len(frame):
        n = rng.randrange(1, 1500)
        new = s.feed(frame[fed:fed + n])
        got += new
        handons += bool(new)
        fed = min(len(frame), fed + n)
        arrived = fed - wire.HEADER.size  # log bytes here
        whole = sum(1 for _, e in spans if e <= arrived)
        assert len(got) <= whole
        if len(got) < whole:  # the first entry here whole but not handed on lies in the last `handon` bytes
            assert spans[len(got)][0] > arrived - handon, \
                f"at byte {arrived}: the entry at {spans[len(got)][0]} was whole but not handed on ({handon=})"
    assert got == entries and s.expected == cl.tail.offset
    if handon > 2 * SEG:
        assert handons == 1, "the frame's entries were handed on before it ended"
    elif handon > 1000:  # a partial entry (< 1000 B here) stays behind after each hand-on
        assert handons <= len(log) // (handon - 1000) + 2, f"{handons} hand-ons for {len(log)} bytes"


@pytest.mark.parametrize("clock", [False, True])
def test_hand_ons_follow_the_rule_on_random_frames(tmp_path, seed, clock):
    """Random frames (heartbeats among them) in random pieces, far below handon_bytes, on a
    clock or none: a read hands on every whole entry here exactly when a frame ended in it, it
    ended outside a body, or handon_s has passed since the last such read; else nothing.
    Each part failed once: the first threshold held a frame's entries until the next frame ended
    when one read brought its end and the next header; without the second a slow link shows its
    master no progress (ha_server.STALL_S cuts it, again and again); a clock restarted only by
    mid-frame hand-ons handed on early."""
    rng = random.Random(seed)
    cl = master_log(tmp_path)
    ends = [p + n for p, n in entry_spans(cl)]
    stream = frames(cl, 0, rng, batch_max=2000)
    fends = frame_ends(stream)
    s = SlaveStream(0, SEG, handon_bytes=1 << 30, handon_s=1.0)
    got, fed, now, last = [], 0, 1000.0 if clock else 0.0, 0.0
    while fed < len(stream):
        n = rng.randrange(1, 300)
        now += rng.uniform(0, 0.5) if clock else 0.0
        new = s.feed(stream[fed:fed + n], now)
        got += new
        ended = any(fed < f <= fed + n for f, _ in fends)
        fed = min(len(stream), fed + n)
        if ended or not s.body_left or now - last >= 1.0:
            whole = sum(1 for e in ends if e <= log_reached(fends, fed))
            assert len(got) == whole, f"read to byte {fed}: {whole} entries whole, {len(got)} handed on"
            last = now
        else:
            assert not new, f"{len(new)} entries handed on mid-frame, {now - last:.2f} s after the last hand-on"
    assert got == raw_entries(cl)
