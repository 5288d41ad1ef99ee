"""A raft leader pushes the entries it just appended from memory (CommitLog.recent_entries),
and the dispatcher and a master's HA stream read what was just written from memory too
(CommitLog.recent_bytes, the TailCache), instead of reading them back: whatever the sequence
of leader appends (both formats), follower appends, truncations and restarts, StoreLog.entries
gives exactly what the files hold for every range and recent_bytes what they hold from each
entry's offset, and the memory answers only for the latest leader append (recent_entries) or
what was written since the last cut (recent_bytes). A producer's zone arrives as a view into
the connection's read buffer, which the next read overwrites: here the buffer is overwritten
after every append."""

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.store import codec_batch
from broker.store.commitlog import POSITION, CommitLog
from broker.store.tail_cache import TailCache
from replication.raft.storelog import StoreLog

from .storeutil import append, item

SEG = 8192

ops = st.lists(st.one_of(
    st.tuples(st.just("leader1"), st.integers(1, 6), st.integers(0, 900)),
    st.tuples(st.just("leader2"), st.integers(1, 4), st.integers(0, 900)),
    st.tuples(st.just("follower"), st.integers(1, 3), st.integers(0, 900)),
    st.tuples(st.just("truncate"), st.integers(0, 40), st.just(0)),
    st.tuples(st.just("restart"), st.just(0), st.just(0)),
), min_size=1, max_size=25)


def from_files(cl: CommitLog, lo: int, n: int, max_bytes: int) -> list:
    saved, cl._recent = cl._recent, None
    try:
        return [(i, t, bytes(d)) for i, t, d in StoreLog(cl).entries(lo, n, max_bytes)]
    finally:
        cl._recent = saved


@settings(max_examples=150, deadline=None)
@given(ops=ops, max_bytes=st.sampled_from([1, 700, 2000, 1 << 20]))
def test_entries_from_memory_match_the_files(tmp_path_factory, ops, max_bytes):
    cl = CommitLog(tmp_path_factory.mktemp("cl"), SEG, positions_per_file=64)
    cl.recover(None)
    view = StoreLog(cl)
    term, serial = 1, 0
    for kind, count, size in ops:
        nxt = cl.tail.next_index
        before = cl.tail.offset
        if kind == "leader1":  # SEND's properties and body are views into the read buffer too
            items = [item(serial + k, size) for k in range(count)]
            read_buffer = bytearray(b"".join(it.body for it in items))
            at = 0
            for k, it in enumerate(items):
                items[k] = it._replace(body=memoryview(read_buffer)[at:at + len(it.body)])
                at += len(it.body)
            append(cl, items, term, 7)
            read_buffer[:] = b"\xee" * len(read_buffer)
        elif kind == "leader2":
            zones = [codec_batch.encode_zone("t", 0, [(0, 1, bytes(16), b"", b"x" * (size + k))]) for k in range(count)]
            read_buffer = bytearray(b"".join(z for z, _ in zones))
            views, at = [], 0
            for z, crc in zones:  # as SEND_ZONE hands them over: views into the read buffer
                views.append((memoryview(read_buffer)[at:at + len(z)], crc))
                at += len(z)
            cl.append_batches_as_leader(views, [serial + k for k in range(count)], term, 7)
            read_buffer[:] = b"\xee" * len(read_buffer)  # the connection's next read
        elif kind == "follower":  # entries another leader wrote, placed by the same rule
            records = [[(0, 1, bytes(16), b"", b"f" * (size + k))] for k in range(count)]
            sizes = [len(codec_batch.encode_batch(0, 0, 0, 0, 0, "t", 0, r)) for r in records]
            places, _, _ = cl._place(cl.tail.offset, sizes)
            cl.append_as_follower([codec_batch.encode_batch(nxt + k, term, places[k], serial + k, 9, "t", 0, r)
                                   for k, r in enumerate(records)])
        elif kind == "truncate" and nxt > cl.first_index:
            cl.truncate_suffix(max(cl.first_index, nxt - 1 - count % max(1, nxt - cl.first_index)))
            term += 1
        elif kind == "restart":
            cl.restart_at(cl.tail.offset, cl.tail.next_index)
        serial += count
        if kind.startswith("leader") and positions(cl)[-count][0] == before:  # no segment closed
            assert cl.recent_bytes(before, 1 << 30), "an append just made must be in memory"
        for lo in range(cl.first_index, cl.tail.next_index + 1):
            for n in (1, 2, 5):
                got = [(i, t, bytes(d)) for i, t, d in view.entries(lo, n, max_bytes)]
                assert got == from_files(cl, lo, n, max_bytes), (lo, n, kind)
        for offset in {cl.min_offset, cl.tail.offset, *(p[0] for p in positions(cl))}:
            for limit in (max_bytes, 1 << 20):
                for first_whole in (False, True):
                    got = cl.recent_bytes(offset, limit, first_whole=first_whole)
                    n = sum(map(len, got))
                    assert n <= limit or (first_whole and len(got) == 1)
                    assert offset + n <= cl.tail.offset
                    if got:
                        assert b"".join(got) == bytes(cl.read_from(offset, n)[1]), (offset, kind)
    cl.close()


def positions(cl: CommitLog) -> list:
    """(phys, size, term) of every entry held."""
    n = cl.tail.next_index - cl.first_index
    return list(POSITION.iter_unpack(cl.positions.read(cl.first_index, n))) if n else []


def test_memory_answers_the_latest_leader_append_only(tmp_path):
    cl = CommitLog(tmp_path, SEG, positions_per_file=64)
    cl.recover(None)
    append(cl, [item(k, 100) for k in range(3)], 1, 0)
    assert [e[0] for e in cl.recent_entries(0, 3, 1 << 20)] == [0, 1, 2]
    append(cl, [item(3, 100)], 1, 0)
    assert cl.recent_entries(0, 3, 1 << 20) is None  # an older append: read from the files
    assert [e[0] for e in cl.recent_entries(3, 1, 1 << 20)] == [3]
    assert len(cl.recent_bytes(positions(cl)[0][0], 1 << 20)) == 4  # every append since the last cut
    cl.truncate_suffix(3)
    assert cl.recent_entries(3, 1, 1 << 20) is None  # cut: gone from memory too
    # a cut empties the TailCache: a stale entry kept at an offset where, after the cut, an end
    # marker sits could otherwise be taken as following the entry before it
    assert cl.tail_cache.bytes == 0 and cl.recent_bytes(positions(cl)[0][0], 1 << 20) == []
    cl.close()


def test_the_tail_cache_keeps_the_newest_within_its_bound():
    cache = TailCache(1000)
    cache.add([0, 400, 800], [b"a" * 400, b"b" * 400, memoryview(b"c" * 100)])  # a view: not kept
    assert cache.run(0, 10_000, 10_000) == [b"a" * 400, b"b" * 400]
    cache.add([800, 1200], [b"c" * 400, b"d" * 400])  # over 1000: the oldest go first
    assert cache.bytes == 800 and cache.run(0, 10_000, 10_000) == []
    assert cache.run(800, 10_000, 10_000) == [b"c" * 400, b"d" * 400]
    assert cache.run(800, 1199, 10_000) == [] and cache.run(800, 1200, 10_000) == [b"c" * 400]
    assert cache.run(800, 10_000, 500) == [b"c" * 400]  # within max_bytes
    assert cache.run(800, 10_000, 100) == [] and cache.run(800, 10_000, 100, first_whole=True) == [b"c" * 400]
