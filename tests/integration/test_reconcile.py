"""The reconcile job (real Spark) and its GX gates (real GX) on crafted replica logs with
known faults: the exact rows each fault leaves, and the expectation that names it. The clean
and the flipped-byte cases run on both formats (TLE1 entries, TLE2 batches of 1..4 records)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from broker.store.logreader import iter_batches, iter_entries, segments
from expectations.validate import validate
from spark_jobs import craft
from spark_jobs.craft import E, Node
from spark_jobs.reconcile import reconcile
from spark_jobs.warehouse import read_table, register, replace_partition, session
from tests.helpers import run_tidelog as tidelog

pytestmark = pytest.mark.slow
both = pytest.mark.parametrize("fmt", craft.FORMATS, ids=lambda f: f"TLE{f}")

SEG = 64 << 10
N = 1500  # entries: 0-799 in term 1, 800-1499 in term 2; all committed
COMMITTED = N - 1


def base_log(n: int = N) -> list[E]:
    return [E(i, 1 if i < 800 else 2, keys=(f"k{i}",) if i % 10 == 0 else ()) for i in range(n)]


@pytest.fixture(scope="module")
def spark():
    s = session("local[2]", app="tidelog-tests")
    yield s
    s.stop()


@pytest.fixture()
def wh(tmp_path):
    return tmp_path / "warehouse"


def run(spark, tmp_path, wh, date, nodes, missing=None, name="c1", fmt=1):
    logs = tmp_path / f"logs-{date}"
    craft.write_cluster(logs, name, nodes, missing, segment_bytes=SEG, format=fmt)
    r = reconcile(logs, date, wh, spark=spark)
    (c,) = r["clusters"]
    return c, logs / name


def rows(spark, wh, table, date, where="true"):
    return [r.asDict() for r in read_table(spark, wh, table).filter(f"run_date = '{date}' AND ({where})")
            .orderBy(*(["index"] if table != "replica_summary" else []), "node" if table != "reconciled_log" else "index")
            .collect()]


def three(entries=None, committed=COMMITTED):
    return [Node(n, list(entries or base_log()), committed) for n in ("n1", "n2", "n3")]


LOST = ("no committed entry lost by a replica that had committed it "
        "(at or below its own committed index, no longer in its log)")
LOST_EVERYWHERE = "no replica committed entries beyond every replica's log (committed, yet no copy left)"


def failed(v):
    return sorted({f["description"] for f in v["failures"]})


@both
def test_clean_logs_reconcile_consistent_and_pass_every_expectation(spark, tmp_path, wh, fmt):
    c, _ = run(spark, tmp_path, wh, "2026-01-01", three(), fmt=fmt)
    messages = sum(e.records(fmt) for e in base_log())
    assert c["verdict"] == "clean" and c["statuses"] == {"consistent": N}
    assert c["entries"] == 3 * N and c["messages"] == 3 * messages and c["divergence_rows"] == 0
    assert [(n["node"], n["begin_index"], n["end_index"], n["lag"], n["crc_errors"]) for n in c["nodes"]] == \
        [("n1", 0, N - 1, 0, 0), ("n2", 0, N - 1, 0, 0), ("n3", 0, N - 1, 0, 0)]
    e10 = rows(spark, wh, "replica_entries", "2026-01-01", "index = 10 AND node = 'n1'")
    assert sorted(e["batch_pos"] for e in e10) == list(range(base_log()[10].records(fmt)))
    for e in e10:
        assert e["keys"] == ["k10"] and e["term"] == 1 and e["crc_ok"] and e["committed"] and e["topic"] == "orders"
    assert len({(e["phys_offset"], e["crc"]) for e in e10}) == 1  # the batch's
    r = rows(spark, wh, "reconciled_log", "2026-01-01", "index = 900")
    assert [(x["replicas"], x["agreed_term"], x["status"], x["copies"]) for x in r] == \
        [(["n1", "n2", "n3"], 2, "consistent", 3)]  # one vote per replica and entry
    assert [n["entries"] for n in c["nodes"]] == [N] * 3
    v = validate("2026-01-01", wh, spark=spark)
    assert v["success"] and v["failures"] == [] and v["data_docs"].startswith("file://")
    assert os.path.exists(v["data_docs"][len("file://"):])
    if fmt == 2:  # a message gone from the middle of a batch: only the batch_pos expectation can tell
        part = read_table(spark, wh, "replica_entries").filter("run_date = '2026-01-01' AND cluster = 'c1'")
        kept = spark.createDataFrame(part.filter("NOT (node = 'n2' AND index = 10 AND batch_pos = 1)").collect(),
                                     part.schema)
        replace_partition(spark, kept, wh, "replica_entries", "2026-01-01", "c1")
        v = validate("2026-01-01", wh, spark=spark)
        assert failed(v) == ["each entry's messages are contiguous from batch_pos 0 (no message missing from a batch)"]
        (f,) = v["failures"]
        assert f["unexpected_count"] == 1 and f["suite"] == "replica_entries"


def test_follower_behind(spark, tmp_path, wh):
    nodes = three()
    nodes[2] = Node("n3", base_log(200), 199)
    c, _ = run(spark, tmp_path, wh, "2026-01-02", nodes)
    assert c["statuses"] == {"consistent": 200, "missing_on_some": N - 200}
    r = rows(spark, wh, "reconciled_log", "2026-01-02", "status = 'missing_on_some'")
    assert [x["index"] for x in r] == list(range(200, N)) and {tuple(x["replicas"]) for x in r} == {("n1", "n2")}
    assert {n["node"]: n["lag"] for n in c["nodes"]} == {"n1": 0, "n2": 0, "n3": N - 200}
    assert c["divergence_rows"] == 0
    v = validate("2026-01-02", wh, spark=spark)
    assert failed(v) == ["no replica lags the longest log by more than lag_entries_max entries"]


def test_divergent_uncommitted_tail_of_a_deposed_leader(spark, tmp_path, wh):
    old = Node("n1", base_log() + [E(i, 2) for i in range(N, N + 10)], COMMITTED)
    new = base_log() + [E(i, 3) for i in range(N, N + 5)]
    c, _ = run(spark, tmp_path, wh, "2026-01-03", [old, Node("n2", new, COMMITTED), Node("n3", new, COMMITTED)])
    assert c["statuses"] == {"consistent": N, "divergent": 5, "uncommitted_tail": 5}
    assert c["divergent_or_corrupt_committed"] == 0
    d = rows(spark, wh, "replica_divergence", "2026-01-03")
    assert [(x["index"], x["node"], x["term"], x["agreed_term"], x["committed"]) for x in d] == \
        [(i, "n1", 2, 3, False) for i in range(N, N + 5)]
    assert all(x["crc"] != x["agreed_crc"] and x["crc_ok"] for x in d)
    tail = rows(spark, wh, "reconciled_log", "2026-01-03", "status = 'uncommitted_tail'")
    assert [(x["index"], x["replicas"]) for x in tail] == [(i, ["n1"]) for i in range(N + 5, N + 10)]
    v = validate("2026-01-03", wh, spark=spark)
    assert failed(v) == ["no divergent uncommitted tail (a deposed leader's entries not yet cut back)"]


@both
def test_flipped_byte_in_a_committed_entry(spark, tmp_path, wh, fmt):
    logs = tmp_path / "logs-flip"
    base = craft.write_cluster(logs, "c1", three(), segment_bytes=SEG, format=fmt)
    # flip one body byte of entry 700 on n2 (TLE2: of its batch's last record)
    (h,) = [b.head for b in iter_batches(base / "n2") if b.head.index == 700]
    seg = max((p for p in segments(base / "n2") if int(p.name) <= h.phys_offset), key=lambda p: int(p.name))
    data = bytearray(seg.read_bytes())
    data[h.phys_offset - int(seg.name) + h.size - 3] ^= 0x40
    seg.write_bytes(data)
    r = reconcile(logs, "2026-01-04", wh, spark=spark)
    (c,) = r["clusters"]
    assert c["statuses"] == {"consistent": N - 1, "corrupt": 1} and c["divergent_or_corrupt_committed"] == 1
    (d,) = rows(spark, wh, "replica_divergence", "2026-01-04")
    assert (d["index"], d["node"], d["crc_ok"], d["committed"], d["term"], d["agreed_term"]) == (700, "n2", False, True, 1, 1)
    assert {n["node"]: n["crc_errors"] for n in c["nodes"]} == {"n1": 0, "n2": 1, "n3": 0}
    v = validate("2026-01-04", wh, spark=spark)
    assert failed(v) == ["every entry's CRC is valid", "no divergent or corrupt entry at or below the committed index"]


def test_missing_replica_directory(spark, tmp_path, wh):
    c, _ = run(spark, tmp_path, wh, "2026-01-05", three()[:2], missing={"n3": "SSHException: host unreachable"})
    assert c["statuses"] == {"missing_on_some": N}
    n3 = next(n for n in c["nodes"] if n["node"] == "n3")
    assert n3["state"] == "missing" and "host unreachable" in n3["problem"] and n3["entries"] == 0
    v = validate("2026-01-05", wh, spark=spark)
    assert "every replica was collected and its log is readable" in failed(v)


def test_truncated_segment(spark, tmp_path, wh):
    logs = tmp_path / "logs-trunc"
    base = craft.write_cluster(logs, "c1", three(), segment_bytes=SEG)
    segs = segments(base / "n3")
    assert len(segs) >= 3
    cut = 5000  # into the middle segment, mid-entry
    data = segs[1].read_bytes()
    start, end = int(segs[1].name), int(segs[2].name)
    lost = [e.index for e in iter_entries(base / "n3") if start <= e.phys_offset < end
            and e.phys_offset + e.size > start + cut]
    segs[1].write_bytes(data[:cut])
    r = reconcile(logs, "2026-01-06", wh, spark=spark)
    (c,) = r["clusters"]
    # n3 had committed every entry: what the cut took from it is lost, not lag
    assert c["statuses"] == {"consistent": N - len(lost), "lost": len(lost)}
    gone = rows(spark, wh, "reconciled_log", "2026-01-06", "status = 'lost'")
    assert [x["index"] for x in gone] == lost and {tuple(x["lost_by"]) for x in gone} == {("n3",)}
    assert {n["node"]: (n["verdict"], n["lost"]) for n in c["nodes"]} == \
        {"n1": ("clean", 0), "n2": ("clean", 0), "n3": ("lost", len(lost))}
    (p,) = c["problems"]
    assert p.startswith(f"n3/{segs[1].name}:") and "truncated" in p
    v = validate("2026-01-06", wh, spark=spark)
    assert failed(v) == ["each replica's indexes are contiguous (no hole in its log)",
                         "every segment reads to its end (no damaged framing, no truncated copy)", LOST]


def test_rerunning_a_date_replaces_its_rows(spark, tmp_path, wh):
    old = Node("n1", base_log() + [E(i, 2) for i in range(N, N + 3)], COMMITTED)
    new = base_log() + [E(i, 3) for i in range(N, N + 3)]
    run(spark, tmp_path, wh, "2026-01-07", [old, Node("n2", new, COMMITTED), Node("n3", new, COMMITTED)])
    assert len(rows(spark, wh, "replica_divergence", "2026-01-07")) == 3
    other, _ = run(spark, tmp_path, wh, "2026-01-08", three(), name="c1")
    shutil.rmtree(tmp_path / "logs-2026-01-07")
    again, _ = run(spark, tmp_path, wh, "2026-01-07", three())
    assert again["entries"] == 3 * N and again["divergence_rows"] == 0
    assert rows(spark, wh, "replica_divergence", "2026-01-07") == []  # the old rows are gone
    assert len(rows(spark, wh, "replica_entries", "2026-01-07")) == 3 * N  # not doubled
    assert len(rows(spark, wh, "replica_entries", "2026-01-08")) == 3 * N  # the other date untouched
    assert (wh / "tables.sql").read_text().count("CREATE TABLE") == 4


def test_cli_reconcile_validate_sql_as_a_user(tmp_path):
    """The commands a user runs after `tidelog collect`: exit codes, the printed verdicts, the
    Data Docs path, a SQL answer, and clear errors for bad input. A replica that lost committed
    entries makes `reconcile` exit 1 and `validate` name the failed expectation."""
    wh = str(tmp_path / "wh")
    good = craft.write_cluster(tmp_path / "good", "prod", three(base_log(300), 299), segment_bytes=SEG).parent
    p = tidelog("reconcile", "--logs", str(good), "--run-date", "2026-03-01", "--warehouse", wh)
    assert "prod 2026-03-01: clean; 900 entries; consistent 300" in p.stdout
    assert "validation 2026-03-01: PASSED" in p.stdout and "Data Docs: file://" in p.stdout
    assert (tmp_path / "wh" / "_catalog" / "tables.json").exists()  # the catalog took the tables before `sql` runs
    q = tidelog("sql", "SELECT status, count(*) AS n FROM reconciled_log WHERE run_date = '2026-03-01' "
                       "GROUP BY status", "--warehouse", wh, "--json")
    assert json.loads(q.stdout) == [{"status": "consistent", "n": 300}]
    # n3's own checkpoint says committed 300, its log ends at 290: lost committed entries
    nodes = [Node("n1", craft.log(301), 300), Node("n2", craft.log(301), 300), Node("n3", craft.log(291), 300)]
    bad = craft.write_cluster(tmp_path / "bad", "prod", nodes, segment_bytes=SEG).parent
    p = tidelog("reconcile", "--logs", str(bad), "--run-date", "2026-03-02", "--warehouse", wh, "--no-validate",
                check=False)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "prod 2026-03-02: problems; 893 entries; consistent 291, lost 10" in p.stdout
    assert "validation" not in p.stdout
    v = tidelog("validate", "--run-date", "2026-03-02", "--warehouse", wh, check=False)
    assert v.returncode == 1 and "validation 2026-03-02: FAILED" in v.stdout and "index.html" in v.stdout
    assert f"! reconciled_log: {LOST}" in v.stdout
    p = tidelog("reconcile", "--logs", str(tmp_path / "nope"), "--warehouse", wh, check=False)
    assert p.returncode == 2 and "no collection directory" in p.stderr


def test_two_groups_in_one_cluster_reconcile_apart(spark, tmp_path, wh):
    """Indexes are per group: g1's index 5 is not g0's index 5; each group's replicas and
    committed index are its own."""
    g1 = [Node(n, [E(i, 7) for i in range(40)], 39, group="g1") for n in ("m1", "m2")]
    g1[1] = Node("m2", [E(i, 7) for i in range(30)], 29, group="g1")
    c, _ = run(spark, tmp_path, wh, "2026-01-09", three(base_log(100), 99) + g1)
    assert c["statuses"] == {"consistent": 130, "missing_on_some": 10}
    r = rows(spark, wh, "reconciled_log", "2026-01-09", "index = 35")
    assert sorted((x["group"], x["replicas"], x["status"]) for x in r) == \
        [("g0", ["n1", "n2", "n3"], "consistent"), ("g1", ["m1"], "missing_on_some")]
    assert {(n["group"], n["node"]): n["lag"] for n in c["nodes"]} == \
        {("g0", "n1"): 0, ("g0", "n2"): 0, ("g0", "n3"): 0, ("g1", "m1"): 0, ("g1", "m2"): 10}


def test_a_replica_that_lost_committed_entries_is_lost_not_lag(spark, tmp_path, wh):
    """Issue bug 7: n3's own checkpoint says committed 300 but its log ends at 290. Indexes
    291-300 are lost on n3 (it had committed them), not lag: status lost, verdict lost, a
    failed expectation. In g1, m1 committed 24 while every log ends at 19: lost with no copy
    left anywhere, which only the summary can show."""
    nodes = [Node("n1", craft.log(301), 300), Node("n2", craft.log(301), 300), Node("n3", craft.log(291), 300)]
    g1 = [Node("m1", craft.log(20), 24, group="g1"), Node("m2", craft.log(20), 19, group="g1")]
    c, _ = run(spark, tmp_path, wh, "2026-01-10", nodes + g1)
    assert c["statuses"] == {"consistent": 291 + 20, "lost": 10} and c["verdict"] == "problems"
    assert c["lost_committed"] == 15
    gone = rows(spark, wh, "reconciled_log", "2026-01-10", "status = 'lost'")
    assert [(x["group"], x["index"], x["replicas"], x["lost_by"], x["committed"]) for x in gone] == \
        [("g0", i, ["n1", "n2"], ["n3"], True) for i in range(291, 301)]
    assert {n["node"]: (n["end_index"], n["node_committed_index"], n["lag"], n["lost"], n["verdict"])
            for n in c["nodes"]} == {"n1": (300, 300, 0, 0, "clean"), "n2": (300, 300, 0, 0, "clean"),
                                     "n3": (290, 300, 10, 10, "lost"), "m1": (19, 24, 0, 5, "lost"),
                                     "m2": (19, 19, 0, 0, "clean")}
    v = validate("2026-01-10", wh, spark=spark)
    assert not v["success"] and failed(v) == [LOST, LOST_EVERYWHERE]
    (f,) = [f for f in v["failures"] if f["description"] == LOST]
    assert f["suite"] == "reconciled_log" and f["unexpected_count"] == 10


def test_a_lagging_replica_is_lag_and_clean(spark, tmp_path, wh):
    """What a replica never had is lag: n3 committed only as far as its log goes (290), so
    291-300 are missing_on_some and n3 is clean. n2's oldest segment was removed by
    retention: what it no longer holds below its begin is not lost."""
    nodes = [Node("n1", craft.log(301), 300), Node("n2", craft.log(301), 300), Node("n3", craft.log(291), 290)]
    logs = tmp_path / "logs-lag"
    base = craft.write_cluster(logs, "c1", nodes, segment_bytes=4096)
    segments(base / "n2")[0].unlink()  # retention removed n2's oldest segment
    begin = next(iter_entries(base / "n2")).index
    assert 0 < begin < 291
    (c,) = reconcile(logs, "2026-01-11", wh, spark=spark)["clusters"]
    assert c["statuses"] == {"consistent": 291, "missing_on_some": 10} and c["verdict"] == "clean"
    assert c["lost_committed"] == 0
    assert {n["node"]: (n["begin_index"], n["lag"], n["lost"], n["verdict"]) for n in c["nodes"]} == \
        {"n1": (0, 0, 0, "clean"), "n2": (begin, 0, 0, "clean"), "n3": (0, 10, 0, "clean")}
    assert rows(spark, wh, "reconciled_log", "2026-01-11", "size(lost_by) > 0") == []
    v = validate("2026-01-11", wh, spark=spark)
    assert v["success"] and v["failures"] == []


def test_a_session_registering_a_second_warehouse_queries_the_second(spark, tmp_path):
    """register() in a session that registered another warehouse before: the tables point at
    the new one (CREATE TABLE IF NOT EXISTS kept the first's: SQL read the wrong warehouse, and
    failed once that one was removed)."""
    first, second = tmp_path / "wh1", tmp_path / "wh2"
    run(spark, tmp_path, first, "2026-01-11", three(base_log(100), 99))
    run(spark, tmp_path, second, "2026-01-12", three(base_log(40), 39))
    for wh, date in ((first, "2026-01-11"), (second, "2026-01-12"), (first, "2026-01-11")):
        register(spark, wh)
        got = spark.sql("SELECT DISTINCT run_date, count(*) AS n FROM tidelog.reconciled_log GROUP BY run_date").collect()
        assert [(str(r.run_date), r.n) for r in got] == [(date, 100 if wh == first else 40)], wh
