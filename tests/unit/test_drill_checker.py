"""The drill checker on crafted histories: a clean one passes, each anomaly is found."""

from ops.drill.checker import Op, Read, check


def clean():
    ops = [Op(i, t0=i * 1.0, t1=i * 1.0 + 0.5, outcome="ok", queue=i % 2, offset=i // 2) for i in range(6)]
    reads = [Read(o.id, o.queue, o.offset) for o in ops]
    return ops, reads


def test_clean_history_passes_with_figures():
    ops, reads = clean()
    ops.append(Op(6, t0=6.0, t1=9.0, outcome="fail", error="NOT_LEADER"))
    ops.append(Op(7, t0=6.5, t1=9.5, outcome="unknown"))
    r = check(ops, reads)
    assert r.ok, r.anomalies
    assert r.figures["ok"] == 6 and r.figures["failed"] == 1 and r.figures["unknown"] == 1
    assert r.counts["unknown_absent"] == 1
    assert r.figures["longest_ack_gap_s"] == 1.0


def test_lost():
    ops, reads = clean()
    r = check(ops, reads[:-1])
    assert not r.ok and r.counts["lost"] == 1 and r.anomalies["lost"][0]["op"] == 5


def test_wrong_offset():
    ops, reads = clean()
    reads[0], reads[2] = Read(2, 0, 0), Read(0, 0, 1)  # ops 0 and 2 swapped places
    r = check(ops, reads)
    assert r.counts["wrong_offset"] == 2
    assert r.counts["reordered"] == 1  # 0 was acked before 2 was sent, yet 2 comes first


def test_duplicates_explained_or_not():
    ops, reads = clean()
    ops[1].attempts = 2  # a retry after a timeout may store twice: explained
    reads += [Read(1, 1, 10), Read(3, 1, 11)]
    r = check(ops, reads)
    assert r.counts["duplicated_explained"] == 1
    assert r.counts["duplicated"] == 1 and r.anomalies["duplicated"][0]["op"] == 3


def test_failed_op_that_was_stored_is_unexpected():
    ops, reads = clean()
    ops.append(Op(9, t0=7, t1=7.1, outcome="fail", error="NOT_LEADER"))
    reads.append(Read(9, 0, 3))
    r = check(ops, reads)
    assert r.counts["unexpected"] == 1


def test_unknown_that_landed_is_fine():
    ops, reads = clean()
    ops.append(Op(9, t0=7, t1=10, outcome="unknown"))
    reads.append(Read(9, 0, 3))
    r = check(ops, reads)
    assert r.ok and r.counts["unknown_landed"] == 1


def test_reordered_only_for_non_overlapping_ops():
    # overlapping ops may land in either order; A done before B started may not
    ops = [Op(0, 0.0, 2.0, "ok", 0, 1), Op(1, 1.0, 3.0, "ok", 0, 0)]
    assert check(ops, [Read(0, 0, 1), Read(1, 0, 0)]).ok
    ops = [Op(0, 0.0, 1.0, "ok", 0, 1), Op(1, 1.5, 3.0, "ok", 0, 0)]
    r = check(ops, [Read(0, 0, 1), Read(1, 0, 0)])
    assert r.counts["reordered"] == 1 and r.anomalies["reordered"][0]["earlier_op"] == 0


def test_divergence_fails_the_check():
    ops, reads = clean()
    r = check(ops, reads, divergent=["h3 differs from h1 at index 7"])
    assert not r.ok and r.counts["divergent"] == 1


def test_longest_gap_between_acks():
    ops = [Op(i, t, t + 0.1, "ok", 0, i) for i, t in enumerate([0.0, 0.2, 3.4, 3.5])]
    f = check(ops, [Read(o.id, 0, o.offset) for o in ops]).figures
    assert f["longest_ack_gap_s"] == 3.2 and f["longest_ack_gap_at_s"] == 0.3
