"""The nightly reconcile: do the replicas of each group hold the same log, and where not?

    collection dir ── driver lists segment files (names only) ──▶ one Spark task per segment:
        read the file, decode it with the store's codec (segment_reader) ──▶ Arrow batches
    ──▶ replica_entries ──▶ votes per (group, index) ──▶ reconciled_log, replica_divergence
    ──▶ replica_summary (per node) ──▶ Parquet partitions (run_date, cluster) in the warehouse

Nothing but counts and a handful of summary rows reaches the driver, so the same job runs
unchanged on a Spark cluster (`spark-submit --master ... spark_jobs/reconcile_main.py`, with
the collection on storage every executor can read).

Status of an index (reconciled_log.status), first match wins:
    corrupt           a replica holds it with a bad CRC (or it was lost in a damaged region)
    divergent         the replicas that hold it disagree on its term or CRC
    lost              a replica that had committed it (at or below that replica's own
                      committed index, from its checkpoint / node.json) no longer holds it
    missing_on_some   committed, yet a replica that should hold it does not (and never
                      committed it: it lags)
    uncommitted_tail  above the committed index and not on every replica yet
    consistent        every replica that should hold it does, identically
Votes are per CommitLog entry, one per replica: a TLE2 record batch is one entry however
many messages it holds. replica_entries has a row per message (batch_pos k of its entry; a
TLE1 entry is batch_pos 0, an entry that could not be read as messages is one row with
batch_pos NULL), so everything per index reads the entry rows only (batch_pos 0 or NULL):
their index, term, crc (TLE2: the head_crc, which covers the records_crc), crc_ok and size are
the entry's. A table that needs messages joins on (group, index, batch_pos).

A replica "should hold" an index when its log begins at or before it (retention may have
removed older segments); a replica that could not be collected should hold everything.
`lost_by` names the replicas that lost the index. A store never lets its committed index
pass its own log's end, so a replica's committed index beyond what it holds is lost data,
never lag. The agreed (term, CRC) is the majority among good copies; a tie goes to the higher term.

A replica's verdict (replica_summary.verdict), first match wins: lost (it lost entries it had
committed: `lost` counts them), divergent (its good copies disagree with the agreed log),
damaged (bad CRCs or unreadable segment regions), its state when not collected or readable
(missing / empty / unreadable), clean.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

from spark_jobs import warehouse as wh
from spark_jobs.inputs import ClusterInput, discover

DECODED_DDL = ("cluster string, group string, node string, segment string, index long, batch_pos int, "
               "term long, crc long, crc_ok boolean, phys_offset long, size int, topic string, "
               "queue_id int, queue_offset long, msg_id string, keys array<string>, store_ts_ms long, "
               "problem string")
# a replica whose own log can be judged lost: its files were read (an empty one holds nothing)
HOLDS_STATES = ("ok", "empty")
DIVERGENCE_DDL = ("cluster string, group string, index long, node string, term long, crc long, crc_ok boolean, "
                  "agreed_term long, agreed_crc long, committed boolean, phys_offset long, problem string")
ENTRY_COLUMNS = ("cluster", "group", "node", "index", "batch_pos", "term", "phys_offset", "size", "crc", "crc_ok",
                 "committed", "topic", "queue_id", "queue_offset", "msg_id", "keys", "store_timestamp", "segment", "problem")
# the rows that stand for a whole CommitLog entry: a message at batch_pos 0 (every TLE1 entry,
# a batch's first record), or an entry not read as messages (batch_pos NULL)
ENTRY_ROWS = "coalesce(batch_pos, 0) = 0"
SEGMENTS_DDL = "cluster string, group string, node string, path string, base long"
BATCH_ROWS = 32768


class _ListParam:
    """An accumulator of lists: the decode tasks report segment problems to the driver
    through it (a few rows), so the one pass over the data can write replica_entries."""

    def zero(self, value):
        return []

    def addInPlace(self, a, b):
        a.extend(b)
        return a


def decode_batches(batches, problems=None):
    """mapInArrow: segment descriptors in, entry rows out (runs in the Spark tasks); problem
    rows go to the `problems` accumulator as (group, node, segment, offset, bytes, text)."""
    import pyarrow as pa

    from spark_jobs.segment_reader import COLUMNS, read_columns

    types = {"string": pa.string(), "long": pa.int64(), "int": pa.int32(), "boolean": pa.bool_(),
             "array<string>": pa.list_(pa.string())}
    schema = pa.schema([(name, types[t]) for name, t in (c.split(" ", 1) for c in DECODED_DDL.split(", "))])
    fields = [f for f in COLUMNS if f != "kind"]
    for batch in batches:
        for seg in batch.to_pylist():
            name = Path(seg["path"]).name
            try:
                cols = read_columns(Path(seg["path"]).read_bytes(), seg["base"])
            except OSError as e:
                cols = {f: [] for f in COLUMNS}
                problems.add([(seg["group"], seg["node"], name, seg["base"], 0,
                               f"cannot read {seg['path']}: {type(e).__name__}: {e}")])
            if "problem" in cols["kind"]:
                keep = [i for i, k in enumerate(cols["kind"]) if k == "entry"]
                problems.add([(seg["group"], seg["node"], name, cols["phys_offset"][i], cols["size"][i],
                               cols["problem"][i]) for i, k in enumerate(cols["kind"]) if k == "problem"])
                cols = {f: [cols[f][i] for i in keep] for f in COLUMNS}
            rows = len(cols["kind"])
            for start in range(0, rows, BATCH_ROWS):
                k = min(BATCH_ROWS, rows - start)
                chunk = {"cluster": [seg["cluster"]] * k, "group": [seg["group"]] * k,
                         "node": [seg["node"]] * k, "segment": [name] * k}
                for f in fields:
                    chunk[f] = cols[f][start:start + k]
                yield pa.RecordBatch.from_pydict(chunk, schema=schema)


def _sql_str(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def node_facts(spark, c: ClusterInput):
    rows = [(c.name, n.group, n.id, n.mode, n.state, n.error, n.committed_index, len(n.segments))
            for n in c.nodes]
    return spark.createDataFrame(rows, "cluster string, group string, node string, mode string, state string, "
                                       "error string, node_committed_index long, segment_files int")


def decode(spark, c: ClusterInput, problems):
    from functools import partial

    segs = [(c.name, n.group, n.id, str(p), base) for n in c.nodes if n.state == "ok" for p, base in n.segments]
    desc = spark.createDataFrame(segs, SEGMENTS_DDL) if segs else spark.createDataFrame([], SEGMENTS_DDL)
    return desc.repartition(max(1, len(segs))).mapInArrow(partial(decode_batches, problems=problems), DECODED_DDL)


def reconcile_cluster(spark, c: ClusterInput, run_date: str, warehouse: Path) -> dict:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    timings = {}
    t0 = time.monotonic()
    date = F.lit(run_date).cast("date")
    facts = node_facts(spark, c)
    committed = facts.groupBy("group").agg(F.max("node_committed_index").alias("committed_index"))
    # the one pass over the data: decode every segment and write replica_entries
    acc = spark.sparkContext.accumulator([], _ListParam())
    decoded = (decode(spark, c, acc)
               .withColumn("store_timestamp", F.timestamp_millis("store_ts_ms")).drop("store_ts_ms")
               .join(F.broadcast(committed), "group")
               .withColumn("committed", F.col("index") <= F.col("committed_index"))
               .select(*ENTRY_COLUMNS).withColumn("run_date", date))
    wh.replace_partition(spark, decoded, warehouse, "replica_entries", run_date, c.name)
    timings["decode_and_replica_entries"] = round(time.monotonic() - t0, 2)
    t0 = time.monotonic()
    found = sorted(set(acc.value), key=lambda p: (p[1], p[2], p[3]))  # a retried task reports twice
    problems = spark.createDataFrame(found, "group string, node string, segment string, phys_offset long, "
                                            "size long, problem string")
    # everything else reads the columns it needs back from Parquet
    entries = wh.read_table(spark, warehouse, "replica_entries").filter(
        (F.col("run_date") == date) & (F.col("cluster") == c.name))
    batches = entries.filter(ENTRY_ROWS)  # one row per replica and CommitLog entry
    # each node's first index (from the segments: cheap, small) decides what it should hold
    per_node = (batches.groupBy("group", "node")
                .agg(F.min("index").alias("begin_index"), F.max("index").alias("end_index"),
                     F.count(F.lit(1)).alias("entries"), F.sum(F.when(~F.col("crc_ok"), 1).otherwise(0)).alias("crc_errors"),
                     F.sum("size").alias("bytes"))).cache()
    begins = {(r["group"], r["node"]): r["begin_index"] for r in per_node.select("group", "node", "begin_index").collect()}
    timings["per_node"] = round(time.monotonic() - t0, 2)
    members = {g: sorted(n.id for n in nodes) for g, nodes in c.groups().items()}  # bit i: members[g][i]
    expected, lost_mask = None, F.lit(0).cast("long")
    for n in c.nodes:
        b = begins.get((n.group, n.id))
        should = (F.col("group") == n.group) & (F.lit(b is None) | (F.col("index") >= F.lit(b if b is not None else 0)))
        term = F.when(should, 1).otherwise(0)
        expected = term if expected is None else expected + term
        if n.state in HOLDS_STATES and n.committed_index >= 0:
            # it should hold the index, had committed it itself, and does not hold it
            i = members[n.group].index(n.id)
            gone = should & (F.col("index") <= F.lit(n.committed_index)) & (F.shiftright("mask", i).bitwiseAND(1) == 0)
            lost_mask = lost_mask + F.when(gone, F.shiftleft(F.lit(1).cast("long"), i)).otherwise(0)

    # One plain aggregate per index (no arrays, no sort): which nodes hold it (a bitmask over
    # the cluster's node list), how many copies, how many bad, whether its good copies agree
    # (min = max of term and CRC). Only the rare indexes whose good copies disagree, or have
    # none, are voted on copy by copy.
    bit = F.expr("shiftleft(CAST(1 AS BIGINT), CASE " + " ".join(
        f"WHEN `group` = {_sql_str(g)} AND node = {_sql_str(n)} THEN {i}" for g, ids in members.items()
        for i, n in enumerate(ids)) + " END)")
    ok = F.col("crc_ok")
    agg = (batches.groupBy("group", "index")
           .agg(F.sum(bit).alias("mask"), F.count(F.lit(1)).alias("copies"),
                F.sum(F.when(~ok, 1).otherwise(0)).alias("bad_copies"),
                F.sum(F.when(ok, 1).otherwise(0)).alias("good_copies"),
                F.min(F.when(ok, F.col("term"))).alias("tmin"), F.max(F.when(ok, F.col("term"))).alias("tmax"),
                F.min(F.when(ok, F.col("crc"))).alias("cmin"), F.max(F.when(ok, F.col("crc"))).alias("cmax"),
                F.max("committed").alias("committed"))
           .withColumn("expected_copies", expected)
           .withColumn("lost_mask", lost_mask)
           .withColumn("agree", (F.col("tmin") == F.col("tmax")) & (F.col("cmin") == F.col("cmax")))
           .persist(StorageLevel.MEMORY_AND_DISK))
    status = (F.when(F.col("bad_copies") > 0, "corrupt")
              .when(F.col("variants") > 1, "divergent")
              .when(F.col("lost_mask") != 0, "lost")
              .when((F.col("copies") < F.col("expected_copies")) & F.col("committed"), "missing_on_some")
              .when(F.col("copies") < F.col("expected_copies"), "uncommitted_tail")
              .otherwise("consistent"))
    common = agg.filter("agree").select("*", F.col("tmin").alias("agreed_term"), F.col("cmin").alias("agreed_crc"),
                                        F.lit(1).alias("variants"))
    flagged = agg.filter("agree IS NULL OR NOT agree OR bad_copies > 0")
    n_flagged = flagged.count()  # usually 0: then no copy needs looking at again
    if n_flagged:
        rare_keys = agg.filter("agree IS NULL OR NOT agree").select("group", "index")
        rare = batches.join(rare_keys, ["group", "index"], "left_semi")
        votes = rare.filter(ok).groupBy("group", "index", "term", "crc").agg(F.count(F.lit(1)).alias("votes"))
        voted = (votes.groupBy("group", "index")
                 .agg(F.max(F.struct("votes", "term", "crc")).alias("top"),  # most votes, then the higher term
                      F.count(F.lit(1)).alias("variants"))
                 .select("group", "index", F.col("top.term").alias("agreed_term"),
                         F.col("top.crc").alias("agreed_crc"), "variants"))
        disputed = (agg.join(rare_keys, ["group", "index"], "left_semi").join(voted, ["group", "index"], "left")
                    .withColumn("variants", F.coalesce("variants", F.lit(0))))
        all_rows = common.unionByName(disputed.select(common.columns))
        keys = all_rows.join(flagged.select("group", "index"), ["group", "index"], "left_semi") \
            .select("group", "index", "agreed_term", "agreed_crc")
        divergence = (batches.join(keys if n_flagged > 100_000 else F.broadcast(keys), ["group", "index"])
                      .filter(~ok | ~F.col("term").eqNullSafe(F.col("agreed_term"))
                              | ~F.col("crc").eqNullSafe(F.col("agreed_crc")))
                      .select("cluster", "group", "index", "node", "term", "crc", "crc_ok", "agreed_term",
                              "agreed_crc", "committed", "phys_offset", "problem"))
    else:
        all_rows = common
        divergence = spark.createDataFrame([], DIVERGENCE_DDL)
    names = F.create_map(*[x for g, ids in members.items() for x in (F.lit(g), F.array(*map(F.lit, ids)))])
    reconciled = (all_rows.withColumn("names", F.element_at(names, F.col("group")))
                  .withColumn("replicas", F.expr("filter(names, (x, i) -> shiftright(mask, i) & 1 = 1)"))
                  .withColumn("lost_by", F.expr("filter(names, (x, i) -> shiftright(lost_mask, i) & 1 = 1)"))
                  .withColumn("status", status).withColumn("cluster", F.lit(c.name)))

    def write(name, df):
        t0 = time.monotonic()
        wh.replace_partition(spark, df.withColumn("run_date", date), warehouse, name, run_date, c.name)
        timings[name] = round(time.monotonic() - t0, 2)

    part = lambda t: wh.read_table(spark, warehouse, t).filter(  # noqa: E731
        (F.col("run_date") == date) & (F.col("cluster") == c.name))
    write("reconciled_log", reconciled.select("cluster", "group", "index", "agreed_term", "agreed_crc", "replicas",
                                              "copies", "expected_copies", "bad_copies", "variants", "committed",
                                              "status", "lost_by"))
    write("replica_divergence", divergence)
    write("replica_summary", summary_of(facts, per_node, committed, problems, part))

    # what the job prints: read back this run's (small) aggregates
    t0 = time.monotonic()
    statuses = {r["status"]: r["n"] for r in part("reconciled_log").groupBy("status").agg(F.count(F.lit(1)).alias("n")).collect()}
    bad_committed = part("reconciled_log").filter(F.col("committed") & F.col("status").isin("divergent", "corrupt")).count()
    counts = part("replica_entries").agg(F.sum(F.when(F.expr(ENTRY_ROWS), 1).otherwise(0)).alias("entries"),
                                         F.count("batch_pos").alias("messages")).first()
    nodes = [r.asDict() for r in part("replica_summary").drop("run_date", "cluster").orderBy("group", "node").collect()]
    probs = [f"{node}/{segment}: {text}" for _, node, segment, _, _, text in found[:50]]
    for df in (per_node, agg):
        df.unpersist()
    clean = (bad_committed == 0 and statuses.get("divergent", 0) == 0 and statuses.get("lost", 0) == 0
             and not probs and all(n["verdict"] == "clean" for n in nodes))
    return {"cluster": c.name, "run_date": run_date, "verdict": "clean" if clean else "problems",
            "statuses": statuses, "divergent_or_corrupt_committed": bad_committed,
            "lost_committed": sum(n["lost"] for n in nodes),
            "divergence_rows": part("replica_divergence").count(),
            "entries": counts["entries"] or 0, "messages": counts["messages"],
            "nodes": nodes, "problems": probs, "timings_s": {**timings, "summary": round(time.monotonic() - t0, 2)}}


def summary_of(facts, per_node, committed, problems, part):
    """replica_summary: one row per replica, from the node facts, its decoded log's extent and
    this run's reconciled_log and replica_divergence (read back: small filters)."""
    from pyspark.sql import functions as F

    group_end = per_node.groupBy("group").agg(F.max("end_index").alias("group_end_index"))
    node_problems = problems.groupBy("group", "node").agg(
        F.count(F.lit(1)).alias("segment_problems"),
        F.concat_ws("; ", F.slice(F.sort_array(F.collect_list(F.concat_ws(": ", "segment", "problem"))), 1, 5)).alias("problem"))
    # indexes the agreed log holds that the replica had committed and lost ...
    lost_held = (part("reconciled_log").filter(F.size("lost_by") > 0)
                 .select("group", F.explode("lost_by").alias("node"))
                 .groupBy("group", "node").agg(F.count(F.lit(1)).alias("lost_held")))
    # ... and those it had committed beyond every replica's log (no copy left anywhere)
    beyond = F.when(F.col("state").isin(*HOLDS_STATES) & (F.col("node_committed_index") > F.col("group_end_index")),
                    F.col("node_committed_index") - F.col("group_end_index")).otherwise(0)
    diverged = (part("replica_divergence").filter("crc_ok").groupBy("group", "node")
                .agg(F.count(F.lit(1)).alias("diverged")))
    lost = (F.coalesce("lost_held", F.lit(0)) + beyond).cast("long")
    verdict = (F.when(F.col("lost") > 0, "lost")
               .when(F.col("diverged") > 0, "divergent")
               .when((F.col("crc_errors") > 0) | (F.col("segment_problems") > 0), "damaged")
               .when(F.col("state") != "ok", F.col("state"))
               .otherwise("clean"))
    return (facts.join(per_node, ["group", "node"], "left").join(committed, "group", "left")
            .join(group_end, "group", "left").join(node_problems, ["group", "node"], "left")
            .join(lost_held, ["group", "node"], "left").join(diverged, ["group", "node"], "left")
            .select("cluster", "group", "node", "mode", "state", "begin_index", "end_index",
                    "node_committed_index", F.col("committed_index").alias("group_committed_index"),
                    (F.col("group_end_index") - F.coalesce(F.col("end_index"), F.lit(-1))).alias("lag"),
                    lost.alias("lost"),
                    F.coalesce("entries", F.lit(0)).alias("entries"),
                    F.coalesce("crc_errors", F.lit(0)).alias("crc_errors"),
                    F.coalesce("bytes", F.lit(0)).alias("bytes"), "segment_files",
                    F.coalesce("segment_problems", F.lit(0)).alias("segment_problems"),
                    F.coalesce("problem", "error").alias("problem"), "diverged")
            .withColumn("verdict", verdict).drop("diverged"))


def reconcile(logs: Path, run_date: str | None = None, warehouse: Path | None = None, spark=None,
              master: str | None = None) -> dict:
    """Reconcile every cluster under `logs` into the warehouse; the job's summary."""
    from spark_jobs.reconcile_main import ship_code

    run_date = run_date or dt.date.today().isoformat()
    dt.date.fromisoformat(run_date)  # a clear ValueError for a bad date
    # absolute: on a Spark cluster the executors read the segments (and write the tables) from
    # their own working directories, never the driver's
    warehouse = Path(warehouse or wh.default_warehouse()).expanduser().resolve()
    clusters = discover(Path(logs).expanduser().resolve())
    spark = spark or wh.session(master)
    ship_code(spark)
    results = [reconcile_cluster(spark, c, run_date, warehouse) for c in clusters]
    tables = wh.register(spark, warehouse)
    return {"run_date": run_date, "warehouse": str(warehouse), "tables": tables, "clusters": results,
            "verdict": "clean" if all(r["verdict"] == "clean" for r in results) else "problems"}
