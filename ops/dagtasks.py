"""What the Airflow DAGs' tasks do. `dags/` only declares and wires; the work is here, as
plain functions of the DAG's params (no Airflow import), so the CLI, the demo and the tests
call the same code the DAGs do.

Each function returns a small JSON-able summary (it becomes the task's XCom and is printed in
the task log) and raises `TaskFailed` with the sentence an SRE should read first when a run
turns red: what failed, on which node, and what state the cluster was left in.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from infra import providers
from infra import spec as sp
from ops import health

Log = Callable[[str], None]


class TaskFailed(RuntimeError):
    pass


def operational_errors() -> tuple[type[BaseException], ...]:
    """What the world can do to a task (a host that refuses us, a missing credential, a node
    that will not start, a broker that does not answer): failures worded for the operator,
    where anything else is a bug and keeps its traceback."""
    from broker.client.errors import TidelogError
    from infra.credentials import CredentialsError
    from infra.hosts import HostError
    from infra.providers.base import ProviderError
    from ops.nodes import NodeError

    return (CredentialsError, HostError, ProviderError, NodeError, TidelogError)


def _quiet(msg: str) -> None:
    pass


def load_spec(path: str | Path) -> sp.ClusterSpec:
    try:
        return sp.load(Path(path).expanduser())
    except sp.SpecError as e:  # its words start with the spec's path
        raise TaskFailed(f"cluster spec {e}") from None


def safe_name(run_id: str) -> str:
    """A run id as one directory name (Airflow's contain ':' and '+')."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", run_id).strip("_") or "run"


def _status_lines(st: dict) -> list[str]:
    lines = []
    for g in st["groups"]:
        lines.append(f"group {g['name']}: {g['verdict']}, leader {g['leader']}"
                     + (f"; problems: {'; '.join(g['problems'])}" if g["problems"] else ""))
        for row in g["nodes"]:
            lines.append(f"  {row['id']:<8} {row.get('state', '?'):<11} {row.get('role') or '-':<9} "
                         f"version {row.get('version') or '-'}")
    return lines


# ---- deploy ----------------------------------------------------------------------------------

def provision(spec_path: str, log: Log = _quiet) -> dict:
    spec = load_spec(spec_path)
    try:
        r = providers.get(spec).up()
    except Exception as e:  # noqa: BLE001 - every provider error ends the task with its words
        raise TaskFailed(f"provisioning {spec.name} ({spec.provider}) failed: {type(e).__name__}: {e}") from None
    log(f"hosts of {spec.name} ({spec.provider}): {r['hosts']}; made now: {r.get('made') or 'none'}")
    return {"cluster": spec.name, "provider": spec.provider, "hosts": r["hosts"], "made": r.get("made", [])}


def deploy(spec_path: str, version: str = "", log: Log = _quiet) -> dict:
    """Install and start what is missing (deploy converges: a second run changes nothing)."""
    from ops.build import BuildError
    from ops.deploy import DeployError, deploy as run_deploy

    spec = load_spec(spec_path)
    try:
        r = run_deploy(spec, version or None, wait=False, log=log)
    except (DeployError, BuildError) as e:
        raise TaskFailed(f"deploying {spec.name} failed: {e}") from None
    for node, what in sorted(r["nodes"].items()):
        log(f"  {node}: {what}")
    refused = [n for n, what in r["nodes"].items() if "not touched" in what]
    if refused:
        raise TaskFailed(f"{', '.join(sorted(refused))} run another build or config and were left alone: "
                         f"roll them with tidelog_rolling_upgrade")
    return {"cluster": spec.name, "build": r["build"], "changed": r["changed"], "nodes": r["nodes"]}


def health_gate(spec_path: str, group: str = "", timeout_s: float | None = None, what: str = "health gate",
                log: Log = _quiet) -> dict:
    """Wait (the spec's health.timeout_s) until the group is healthy; fail naming what is not."""
    spec = load_spec(spec_path)
    try:
        st = health.wait_healthy(spec, timeout_s=timeout_s, group=group or None)
    except sp.SpecError as e:
        raise TaskFailed(f"{spec.name}: {e}") from None
    for line in _status_lines(st):
        log(line)
    if st["verdict"] != "healthy":
        problems = "; ".join(p for g in st["groups"] for p in g["problems"])
        raise TaskFailed(f"{what}: {spec.name} is {st['verdict']} after "
                         f"{timeout_s or spec.health.timeout_s:g}s: {problems}")
    return {"cluster": spec.name, "verdict": st["verdict"],
            "leaders": {g["name"]: g["leader"] for g in st["groups"]},
            "versions": {row["id"]: row.get("version") for g in st["groups"] for row in g["nodes"]}}


# ---- rolling upgrade -------------------------------------------------------------------------

def rolling_upgrade(spec_path: str, to: str, group: str = "", rollback_on_failure: bool = True,
                    workload_rate: float = 0.0, log: Log = _quiet) -> dict:
    """One node at a time behind health gates, the leader last. A failed gate stops the roll
    with the group serving; with `rollback_on_failure` the nodes already rolled go back."""
    from ops.build import BuildError
    from ops.upgrade import UpgradeError, upgrade

    if not to:
        raise TaskFailed("no target version: set `to` (a version in the spec's wheels dir, a wheel path, "
                         "or current)")
    spec = load_spec(spec_path)
    try:
        r = upgrade(spec, to, group or None, rollback_on_failure, log=log, workload_rate=workload_rate)
    except BuildError as e:
        raise TaskFailed(f"target {to!r}: {e}") from None
    except sp.SpecError as e:
        raise TaskFailed(f"upgrade of {spec.name}: {e}") from None
    except UpgradeError as e:
        rep = e.report
        back = rep.get("rollback")
        raise TaskFailed(
            f"{e}. Upgraded before the stop: {rep.get('upgraded') or 'none'}; the group is "
            f"{rep.get('verdict', 'unknown')}"
            + (f"; rolled back: {back.get('rolled_back')}" if back else
               "; nothing rolled back (trigger again with rollback, or `tidelog upgrade --rollback`)")
            + (f"; workload: {_workload_words(rep['workload'])}" if "workload" in rep else "")) from None
    log(f"rolled {r['group']} to {r['to']}: {', '.join(r['upgraded'])}; versions now {r['versions']}")
    if "workload" in r:
        log(f"workload through the roll: {_workload_words(r['workload'])}")
        if not r["workload"]["safe"]:
            raise TaskFailed(f"the roll finished but acknowledged sends were not all kept: "
                             f"{_workload_words(r['workload'])}")
    return {"cluster": r["cluster"], "group": r["group"], "to": r["to"], "upgraded": r["upgraded"],
            "versions": r["versions"], "workload": r.get("workload")}


def _workload_words(w: dict) -> str:
    if "error" in w:
        return w["error"]
    return (f"{w.get('ok')} acknowledged, {w.get('failed')} failed, {w.get('unknown')} unknown, "
            f"lost {w['counts'].get('lost', 0)}, longest gap between acks {w.get('longest_ack_gap_s')}s")


def rollback(spec_path: str, group: str = "", log: Log = _quiet) -> dict:
    from ops.upgrade import UpgradeError, rollback as run_rollback

    spec = load_spec(spec_path)
    try:
        r = run_rollback(spec, group or None, log=log)
    except UpgradeError as e:
        raise TaskFailed(str(e)) from None
    return {"cluster": r["cluster"], "group": r["group"], "rolled_back": r["rolled_back"]}


# ---- failover drill --------------------------------------------------------------------------

def drill(spec_path: str, nemesis: str, duration_s: float, rate: float, reports_dir: str | Path,
          group: str = "", seed: int | None = None, log: Log = _quiet, workload: str = "native") -> dict:
    """Run a drill; its report.json and drill.png go to `reports_dir/<drill run id>/`. Any safety
    anomaly (an acknowledged send lost, replicas that disagree, ...) fails the task."""
    from ops.drill.run import DrillError, drill as run_drill

    spec = load_spec(spec_path)
    try:
        rep = run_drill(spec, nemesis, float(duration_s), float(rate), Path(reports_dir).expanduser(),
                        group or None, seed, log=log, workload=workload or "native")
    except (DrillError, sp.SpecError) as e:
        raise TaskFailed(f"drill on {spec.name} did not run: {e}") from None
    f = rep["figures"]
    log(f"drill report: {rep['report_dir']}/report.json")
    log(f"drill plot:   {rep['plot']}")
    log(f"figures: {f['ok']} acknowledged, {f['failed']} failed, {f['unknown']} unknown; time to a new leader "
        f"{f['time_to_new_leader_s_max']}s; longest gap between acks {f['longest_ack_gap_s']}s; recovery "
        f"{f['recovery_s_max']}s; replay with seed {rep['seed']}")
    wl = rep.get("workload") or {}
    if wl.get("via") == "namesrv":
        log(f"workload through the name servers on groups {', '.join(wl['groups'])} (acknowledged per group: "
            f"{f.get('ok_by_group')}); faults aimed at group {rep['group']}")
    if "namesrv_down_s_max" in f:
        log(f"name servers down up to {f['namesrv_down_s_max']}s: {f['acks_without_namesrv']} sends acknowledged "
            f"meanwhile, longest gap {f['longest_ack_gap_without_namesrv_s']}s")
    summary = {"cluster": rep["cluster"], "group": rep["group"], "nemesis": nemesis, "ok": rep["ok"],
               "seed": rep["seed"], "report": f"{rep['report_dir']}/report.json", "plot": rep["plot"],
               "groups": wl.get("groups", [rep["group"]]),
               "counts": rep["counts"], "figures": {k: f.get(k) for k in (
                   "ok", "failed", "unknown", "time_to_new_leader_s_max", "longest_ack_gap_s",
                   "recovery_s_max", "final_verdict", "ok_by_group", "namesrv_down_s_max",
                   "acks_without_namesrv", "longest_ack_gap_without_namesrv_s") if k in f}}
    if not rep["ok"]:
        found = [f"{kind} x{rep['counts'].get(kind, len(exs))}: {exs[0]}"
                 for kind, exs in rep["anomalies"].items() if exs]
        raise TaskFailed(f"SAFETY VIOLATION in the {nemesis} drill on {spec.name} (seed {rep['seed']}): "
                         + " | ".join(found) + f". Report: {summary['report']}")
    if not rep.get("liveness", {"ok": True})["ok"]:  # safe, but sends stopped where they must not
        raise TaskFailed(f"LIVENESS FAILURE in the {nemesis} drill on {spec.name} (seed {rep['seed']}): "
                         + " | ".join(rep["liveness"]["problems"]) + f". Report: {summary['report']}")
    return summary


# ---- nightly reconcile -----------------------------------------------------------------------

def collect(spec_path: str, out_dir: str | Path, group: str = "", log: Log = _quiet) -> dict:
    from ops.collect import collect as run_collect

    spec = load_spec(spec_path)
    r = run_collect(spec, Path(out_dir).expanduser(), group or None)
    got = [n for n in r["nodes"] if "error" not in n]
    for n in r["nodes"]:
        log(f"  {n['id']}: " + (n["error"] if "error" in n else f"{n['bytes']:,} bytes, role {n.get('role')}, "
                                f"committed {n.get('committed_index')}"))
    if not got:
        raise TaskFailed(f"no replica of {spec.name} could be collected: "
                         + "; ".join(f"{n['id']}: {n['error']}" for n in r["nodes"]))
    log(f"collected {len(got)} of {len(r['nodes'])} replicas into {r['dir']}"
        + (f"; missing {r['missing']} (the reconcile reports them)" if r["missing"] else ""))
    return {"cluster": spec.name, "logs": str(Path(r["dir"]).parent), "dir": r["dir"], "bytes": r["bytes"],
            "missing": r["missing"]}


def _spark(master: str | None, app: str, warehouse: str | Path, log: Log):
    """A SparkSession whose JVM writes its console output to a file under the warehouse."""
    from spark_jobs.warehouse import console_log, session

    out = console_log(Path(warehouse), app)
    spark = session(master or None, app=app, console=out)
    log(f"Spark ({spark.sparkContext.master}) started; its driver's console output: {out}")
    return spark


def reconcile(logs: str | Path, run_date: str, warehouse: str | Path, master: str | None = None,
              spark=None, log: Log = _quiet) -> dict:
    """The Spark job: writes the run date's partitions. Findings do not fail this task; the
    GX checkpoint after it turns them into named failed expectations."""
    from spark_jobs.inputs import discover
    from spark_jobs.reconcile import reconcile as run_job

    try:
        discover(Path(logs))
    except FileNotFoundError as e:
        raise TaskFailed(str(e)) from None
    own = spark is None
    spark = spark or _spark(master, "tidelog-reconcile", warehouse, log)
    try:
        r = run_job(Path(logs), run_date, Path(warehouse).expanduser(), spark=spark)
    finally:
        if own:
            spark.stop()
    for c in r["clusters"]:
        log(f"{c['cluster']} {run_date}: {c['verdict']}; {c['entries']} entries; "
            + ", ".join(f"{k} {v}" for k, v in sorted(c["statuses"].items())))
        for p in c["problems"]:
            log(f"  ! {p}")
    return {"run_date": run_date, "warehouse": r["warehouse"], "verdict": r["verdict"], "tables": r["tables"],
            "clusters": [{k: c[k] for k in ("cluster", "verdict", "entries", "statuses", "divergence_rows")}
                         for c in r["clusters"]]}


def gx_checkpoint(run_date: str, warehouse: str | Path, lag_entries_max: int = 1000, master: str | None = None,
                  spark=None, log: Log = _quiet) -> dict:
    """The GX checkpoints on the run date's rows; a failed expectation fails the task, each one
    named with its description and a sample of the rows that broke it."""
    from expectations.validate import ValidationError, validate

    own = spark is None
    spark = spark or _spark(master, "tidelog-validate", warehouse, log)
    try:
        v = validate(run_date, Path(warehouse).expanduser(), spark=spark, lag_entries_max=int(lag_entries_max))
    except ValidationError as e:
        raise TaskFailed(str(e)) from None
    finally:
        if own:
            spark.stop()
    log(f"Great Expectations {run_date}: {'PASSED' if v['success'] else 'FAILED'} "
        f"({', '.join(f'{t} {chr(10003) if ok else chr(10007)}' for t, ok in v['tables'].items())})")
    for f in v["failures"]:
        log(f"  FAILED {f['suite']}: {f['description']} [{f['expectation']}], unexpected {f['unexpected_count']}"
            + (f"; e.g. {f['sample'][:3]}" if f["sample"] else ""))
    log(f"Data Docs: {v['data_docs']}")
    if not v["success"]:
        raise TaskFailed(f"{len(v['failures'])} expectation(s) failed on {run_date}: "
                         + "; ".join(f"{f['suite']}: {f['description']}" for f in v["failures"])
                         + f". Data Docs: {v['data_docs']}")
    return {"run_date": run_date, "success": True, "tables": v["tables"], "data_docs": v["data_docs"]}


def publish(run_date: str, warehouse: str | Path, log: Log = _quiet) -> dict:
    """Where the validated tables are and how to query them (the DAG attaches this to its
    Asset events, so downstream DAGs and the UI see each publication)."""
    from spark_jobs.warehouse import DATABASE, SCHEMA_FILE, TABLES, spark_sql_command, table_dir

    wh = Path(warehouse).expanduser().resolve()
    tables = {t: str(table_dir(wh, t)) for t in TABLES if (table_dir(wh, t) / SCHEMA_FILE).exists()}
    missing = sorted(set(TABLES) - set(tables))
    if missing:  # a run that wrote no rows to a table still records its schema
        raise TaskFailed(f"tables missing in {wh}: {', '.join(missing)} (did the reconcile task write there?)")
    from spark_jobs import sqlserver

    try:  # the persistent catalog knows every table (through the query server when one runs)
        how = sqlserver.ensure_catalog(wh)
    except sqlserver.ServerError as e:
        raise TaskFailed(str(e)) from None
    server = sqlserver.running(wh)
    out = {"run_date": run_date, "warehouse": str(wh), "database": DATABASE, "tables": tables,
           "catalog": how, "query_server": server and server["jdbc_url"], "spark_sql": spark_sql_command(wh),
           "tidelog_sql": f"tidelog sql --warehouse {wh} \"SELECT * FROM {DATABASE}.replica_summary "
                          f"WHERE run_date = '{run_date}'\""}
    log(f"published {DATABASE}.{{{', '.join(tables)}}} for {run_date} (catalog: {how}"
        + (f"; query server {server['jdbc_url']}" if server else "") + f"):\n  {out['tidelog_sql']}\n  {out['spark_sql']}")
    return out
