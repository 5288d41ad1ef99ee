"""The key index's two writers (key_index.py): numpy for a put of VECTOR_MIN hashes or more,
a loop below. They must write the same bytes -- entries, chains, slots, header -- whatever
the hashes, collisions within one put included (few slots make them common), across file
rolls (few entries per file). Hypothesis prints the failing example and a reproduction blob
on failure; `--hypothesis-seed=N` replays a run."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

from broker.store import key_index
from broker.store.key_index import KeyIndex

SETTINGS = settings(max_examples=120, deadline=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

puts_st = st.lists(st.tuples(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=70),
                             st.integers(0, 2**40), st.integers(0, 5_000)),
                   min_size=1, max_size=12)


def _fill(directory, slots: int, entries_max: int, puts, vector_min: int, monkeypatch) -> list[bytes]:
    monkeypatch.setattr(key_index, "VECTOR_MIN", vector_min)
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
def test_vector_and_loop_write_the_same_bytes(tmp_path_factory, monkeypatch, puts, slots, entries_max):
    loop_files, loop_found = _fill(tmp_path_factory.mktemp("loop"), slots, entries_max, puts, 10**9, monkeypatch)
    vec_files, vec_found = _fill(tmp_path_factory.mktemp("vec"), slots, entries_max, puts, 1, monkeypatch)
    assert len(vec_files) == len(loop_files)
    for k, (a, b) in enumerate(zip(loop_files, vec_files)):
        assert a == b, f"file {k} differs"
    assert vec_found == loop_found
    for hashes, phys, _ in puts:  # every put is found by each of its hashes
        for h in hashes:
            assert phys in vec_found[h]
