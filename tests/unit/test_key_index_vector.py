"""The key index's writers (key_index.py): C (_zonewalk.index_put) when built; without it numpy
for a put of VECTOR_MIN hashes or more, a loop below. They must write the same bytes -- entries, chains, slots, header -- whatever
the hashes, collisions within one put included (few slots make them common), across file
rolls (few entries per file). Hypothesis prints the failing example and a reproduction blob
on failure; `--hypothesis-seed=N` replays a run."""

from __future__ import annotations

import mmap

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from broker.store import key_index
from broker.store.key_index import KeyIndex

ZONEWALK = key_index._zonewalk  # the C module, or None where it is not built

SETTINGS = settings(max_examples=120, deadline=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

puts_st = st.lists(st.tuples(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=70),
                             st.integers(0, 2**40), st.integers(0, 5_000)),
                   min_size=1, max_size=12)


def _fill(directory, slots: int, entries_max: int, puts, vector_min: int, monkeypatch,
          c: bool = False) -> list[bytes]:
    monkeypatch.setattr(key_index, "VECTOR_MIN", vector_min)
    monkeypatch.setattr(key_index, "_zonewalk", ZONEWALK if c else None)
    ki = KeyIndex(directory, slots, entries_max)
    ki.load()
    ts = 1_700_000_000_000
    for hashes, phys, dt in puts:
        ts += dt
        ki.put_many([(hashes, phys, ts)])
    for f in ki.files:
        f._write_header()
    out = [bytes(f.mm) for f in ki.files]
    lookups = {h: ki.lookup(h, 0, 2**62, 10_000) for hashes, _, _ in puts for h in hashes}
    ki.close()
    return out, lookups


@SETTINGS
@given(puts=puts_st, slots=st.sampled_from([1, 3, 16, 101]), entries_max=st.sampled_from([16, 40, 1000]))
def test_c_vector_and_loop_write_the_same_bytes(tmp_path_factory, monkeypatch, puts, slots, entries_max):
    loop_files, loop_found = _fill(tmp_path_factory.mktemp("loop"), slots, entries_max, puts, 10**9, monkeypatch)
    vec_files, vec_found = _fill(tmp_path_factory.mktemp("vec"), slots, entries_max, puts, 1, monkeypatch)
    assert len(vec_files) == len(loop_files)
    for k, (a, b) in enumerate(zip(loop_files, vec_files)):
        assert a == b, f"file {k} differs"
    assert vec_found == loop_found
    if ZONEWALK is not None:
        c_files, c_found = _fill(tmp_path_factory.mktemp("c"), slots, entries_max, puts, 10**9, monkeypatch, c=True)
        assert c_files == loop_files and c_found == loop_found
    for hashes, phys, _ in puts:  # every put is found by each of its hashes
        for h in hashes:
            assert phys in vec_found[h]


@pytest.mark.skipif(ZONEWALK is None, reason="the C fast path is not built here")
def test_c_put_refuses_what_the_loop_must_judge_and_writes_nothing():
    """None, the buffer untouched, for input _put_loop would not take as it is (it then raises
    or writes): the Python code decides those cases."""
    slots, entries_max = 4, 3
    size = key_index.HEADER.size + slots * 4 + entries_max * key_index.ENTRY.size
    at = key_index.HEADER.size + slots * 4
    mm = mmap.mmap(-1, size)
    put = ZONEWALK.index_put
    for args in (([1, 2, -1], 0, 3, 5, 0, slots, at, 0),  # a hash out of u32
                 ([1, 2**32], 0, 2, 5, 0, slots, at, 0),
                 ([1, "x"], 0, 2, 5, 0, slots, at, 0),  # not an int
                 ([1, True], 0, 2, 5, 0, slots, at, 0),  # an int subclass: not exactly an int
                 ([1, 2], 0, 2, 5, 0, slots, at, 2),  # past the buffer's entries
                 ([1, 2], 0, 3, 5, 0, slots, at, 0),  # end past the list
                 ([1, 2], 0, 2, -5, 0, slots, at, 0),  # a negative offset
                 ([1, 2], 0, 2, 5, 2**32, slots, at, 0),  # a diff over u32
                 ([1, 2], 0, 2, 5, 0, slots + 1, at, 0)):  # slots reaching into the entries
        assert put(mm, *args) is None, args
        assert mm[:] == bytes(size), args
    assert put(mm, [5, 9], 0, 2, 7, 3, slots, at, 0) is True
    assert key_index.ENTRY.unpack_from(mm, at) == (5, 7, 3, 0)
    assert key_index.ENTRY.unpack_from(mm, at + key_index.ENTRY.size) == (9, 7, 3, 1)  # 9 % 4 == 5 % 4
    assert key_index.SLOT.unpack_from(mm, key_index.HEADER.size + 4) == (2,)
    with pytest.raises(TypeError):
        put(bytes(size), [1], 0, 1, 5, 0, slots, at, 0)  # a read-only buffer: a caller's bug
