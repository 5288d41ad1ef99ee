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


def raw_entries(cl):
    return [cl.read(p, s) for p, s, _ in (cl.position(i) for i in range(cl.first_index, cl.tail.next_index))]


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
    spans = [(p, p + n) for p, n, _ in (cl.position(i) for i in range(cl.first_index, cl.tail.next_index))]
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


def test_a_slow_frame_hands_on_what_has_arrived_every_handon_s(tmp_path, seed):
    """Far below `handon_bytes`, a frame that arrives slowly still hands its whole entries on
    once `handon_s` has passed since the last hand-on (and not before): a link under
    handon_bytes / STALL_S would otherwise show its master no progress and be cut, again and
    again, with what it had received lost each time."""
    rng = random.Random(seed)
    cl = master_log(tmp_path)
    spans = [(p, p + n) for p, n, _ in (cl.position(i) for i in range(cl.first_index, cl.tail.next_index))]
    log = b"".join(f.pread(0, SEG) for f in cl.segments.files)[:cl.tail.offset]
    frame = wire.encode_header(0, len(log), 3, cl.tail.offset, 0) + log
    s = SlaveStream(0, SEG, handon_bytes=1 << 30, handon_s=1.0)
    got, fed, now, last = [], 0, 1000.0, None
    while fed < len(frame):
        n = rng.randrange(1, 400)
        now += rng.uniform(0, 0.4)
        new = s.feed(frame[fed:fed + n], now)
        got += new
        fed = min(len(frame), fed + n)
        whole = sum(1 for _, e in spans if e <= fed - wire.HEADER.size)
        if last is None or now - last >= 1.0 or fed == len(frame):
            assert len(got) == whole, f"at {now - 1000:.2f} s: {whole} entries whole, {len(got)} handed on"
            last = now
        else:
            assert not new, f"handed on {len(new)} entries {now - last:.2f} s after the last hand-on"
    assert got == raw_entries(cl)


def test_each_frames_entries_are_handed_on_when_it_ends(tmp_path, seed):
    """Random frames (heartbeats among them) fed in random pieces, far below handon_bytes and
    with no clock: after each read, at least every entry whole at the end of the last frame
    that has ended is handed on (and none not yet whole) -- also when the same read carries the
    next frame's header (the first version of the threshold held them until that next frame
    ended)."""
    rng = random.Random(seed)
    cl = master_log(tmp_path)
    ends = [p + n for p, n, _ in (cl.position(i) for i in range(cl.first_index, cl.tail.next_index))]
    stream = frames(cl, 0, rng)
    frame_ends, pos = [], 0  # (stream bytes through the frame, log offset it ends at)
    while pos < len(stream):
        offset, size = wire.decode_header(stream, pos)[:2]
        pos += wire.HEADER.size + size
        frame_ends.append((pos, offset + size))

    def log_end_at(fed):  # the log offset the stream's first `fed` bytes reach
        done = [(f, e) for f, e in frame_ends if f <= fed]
        at, end = done[-1] if done else (0, 0)
        return end + max(0, fed - at - wire.HEADER.size) if fed < len(stream) else end

    s = SlaveStream(0, SEG, handon_bytes=1 << 30)
    got, fed = [], 0
    while fed < len(stream):
        n = rng.randrange(1, 3 * wire.HEADER.size)
        got += s.feed(stream[fed:fed + n])
        fed = min(len(stream), fed + n)
        log_end = max((e for f, e in frame_ends if f <= fed), default=0)
        owed = sum(1 for e in ends if e <= log_end)
        here = sum(1 for e in ends if e <= log_end_at(fed))
        assert owed <= len(got) <= here, \
            f"read to byte {fed}: {owed} entries whole where a frame ended, {here} whole, {len(got)} handed on"
    assert got == raw_entries(cl)


def test_the_second_between_mid_frame_hand_ons_counts_from_any_hand_on(tmp_path, seed):
    """Random frames in random pieces on a clock, far below handon_bytes: a read that ends
    inside a frame's body hands entries on only if handon_s has passed since the last read that
    handed any on or ended a frame (a frame's end is a hand-on too: the clock restarts there)."""
    rng = random.Random(seed)
    cl = master_log(tmp_path)
    stream = frames(cl, 0, rng, batch_max=2000)
    bounds, pos = set(), 0  # stream positions where a frame ends
    while pos < len(stream):
        pos += wire.HEADER.size + wire.decode_header(stream, pos)[1]
        bounds.add(pos)
    s = SlaveStream(0, SEG, handon_bytes=1 << 30, handon_s=1.0)
    got, fed, now, last = [], 0, 1000.0, None
    while fed < len(stream):
        n = rng.randrange(1, 300)
        now += rng.uniform(0, 0.5)
        new = s.feed(stream[fed:fed + n], now)
        ended = any(fed < b <= fed + n for b in bounds)
        fed = min(len(stream), fed + n)
        if new and not ended and s.body_left:
            assert last is None or now - last >= 1.0, \
                f"mid-frame hand-on {now - last:.2f} s after the last hand-on"
        if new or ended:
            last = now
        got += new
    assert got == raw_entries(cl)
