"""tidelog_reconcile_nightly: collect the replicas' logs, reconcile them with Spark, validate with
Great Expectations, publish the tables."""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import Asset, Param, dag, get_current_context, task

from ops import dagkit, dagtasks
from spark_jobs.warehouse import TABLES

ASSETS = [Asset(name=f"tidelog.{t}", uri=f"tidelog://warehouse/{t}", group="tidelog") for t in TABLES]

DOC = """
### Nightly reconcile

1. **collect**: copies every node's CommitLog segments and checkpoint (SFTP for remote hosts)
   into *Collect directory*/`<run date>`/`<cluster>`/`<node>`/; a node that cannot be reached is
   recorded, not fatal (the reconcile reports it as a missing replica).
2. **reconcile**: the Spark job decodes every replica's log with the broker's own codec and
   writes the run date's partitions of `tidelog.replica_entries`, `reconciled_log` (one row per
   index: consistent / missing_on_some / uncommitted_tail / lost / divergent / corrupt; `lost`:
   a replica no longer holds an entry at or below its own committed index),
   `replica_divergence` and `replica_summary`.
3. **gx_checkpoint**: Great Expectations checkpoints on the run date's rows: unique and
   contiguous indexes, valid CRCs, nothing divergent or corrupt at or below the committed
   index, no committed entry lost by a replica that had committed it, every replica collected and read to its end, lag within *Lag limit*.
4. **publish**: emits the `tidelog.*` Assets (their events carry the warehouse location and the
   query command), so downstream DAGs can be scheduled on them.

**A red run means**: *gx_checkpoint* — the replicas disagree or are damaged: the log lists every
failed expectation with its description and sample rows, and the Data Docs path; query the
details with `tidelog sql` (see the publish step of a green run for the command). *collect* —
no replica could be reached. Scheduled nightly at 03:00 UTC (`TIDELOG_RECONCILE_SCHEDULE`).
"""


@dag(dag_id="tidelog_reconcile_nightly",
     schedule=dagkit.schedule("TIDELOG_RECONCILE_SCHEDULE", "0 3 * * *"), catchup=False, max_active_runs=1,
     tags=dagkit.TAGS + ["reconcile", "spark", "great-expectations"], doc_md=DOC,
     default_args=dagkit.DEFAULT_ARGS,
     params={
         "spec": dagkit.spec_param(),
         "group": dagkit.group_param("every group"),
         "run_date": Param(None, type=["null", "string"], pattern=r"^(\d{4}-\d{2}-\d{2})?$", title="Run date",
                           description="YYYY-MM-DD the tables' partition is written under; empty: the "
                                       "run's logical date (or today for a run without one)."),
         "collect_dir": Param(dagkit.home_dir("TIDELOG_COLLECT_DIR", "collected"), type="string",
                              title="Collect directory",
                              description="Where the replicas' logs are copied, per run date."),
         "warehouse": Param(dagkit.home_dir("TIDELOG_WAREHOUSE", "warehouse"), type="string", title="Warehouse",
                            description="Where the Parquet tables live (what `tidelog sql` and spark-sql read)."),
         "lag_entries_max": Param(1000, type="integer", minimum=0, title="Lag limit (entries)",
                                  description="GX: the most entries a replica may lag the longest log."),
         "spark_master": Param(None, type=["null", "string"], title="Spark master",
                               description="Empty: $TIDELOG_SPARK_MASTER, else local[2] on the worker; or a "
                                           "cluster's spark://host:port (`tidelog spark up` prints one). The "
                                           "collect directory and the warehouse must be paths its executors reach."),
     })
def tidelog_reconcile_nightly():
    def date_of(p) -> str:
        return p["run_date"] or dagkit.run_date()

    @task
    def collect():
        p = dagkit.params_of()
        out = Path(p["collect_dir"]).expanduser() / date_of(p)
        return dagkit.run(dagtasks.collect, p["spec"], out, p["group"])

    @task
    def reconcile(collected: dict):
        p = dagkit.params_of()
        return dagkit.run(dagtasks.reconcile, collected["logs"], date_of(p), p["warehouse"], p["spark_master"])

    @task
    def gx_checkpoint(reconciled: dict):
        p = dagkit.params_of()
        return dagkit.run(dagtasks.gx_checkpoint, reconciled["run_date"], p["warehouse"], p["lag_entries_max"],
                          p["spark_master"])

    @task(outlets=ASSETS)
    def publish(validated: dict):
        p = dagkit.params_of()
        out = dagkit.run(dagtasks.publish, validated["run_date"], p["warehouse"])
        events = get_current_context()["outlet_events"]
        for a in ASSETS:
            table = a.name.split(".", 1)[1]
            events[a].extra = {"run_date": out["run_date"], "location": out["tables"][table],
                               "query": out["tidelog_sql"], "data_docs": dagkit.ui_url("/tidelog/data-docs/index.html"),
                               "report": dagkit.ui_url(f"/tidelog/runs/{dagkit.run_path()}")}
        return out

    publish(gx_checkpoint(reconcile(collect())))


tidelog_reconcile_nightly()
