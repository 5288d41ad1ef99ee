"""`make run`: the whole platform on embedded defaults, through the code the DAGs run.

A local 3-node raft group (infra/examples/local-raft3.yaml, files under DATA_DIR/platform),
traffic through the Python client (every acknowledged message read back once), a kill-leader
drill, collect, the Spark reconcile, the Great Expectations checkpoints, one `tidelog sql`
query on the published tables, a clean stop. Each step is the `ops.dagtasks` function the
matching Airflow task calls, so this is what `make airflow` then runs on a schedule.
"""

from __future__ import annotations

import datetime as dt
import shutil
import time
from pathlib import Path

import click
import uvloop
import yaml

from broker.client import Admin
from infra import spec as sp
from ops import dagtasks
from ops.demo_broker import QUEUES, TOPIC, check, consume_all, produce, summary
from ops.localbroker import free_port, port_free
from ops.security import ClusterSecurity, credentials_for
from spark_jobs.warehouse import default_warehouse

EXAMPLE = Path(__file__).resolve().parents[1] / "infra" / "examples" / "local-raft3.yaml"
QUERY = ("SELECT node, state, begin_index, end_index, node_committed_index, lag, crc_errors "
         "FROM tidelog.replica_summary ORDER BY node")
STATUS_QUERY = "SELECT status, count(*) FROM tidelog.reconciled_log GROUP BY status"
AIRFLOW_DOCS = "http://127.0.0.1:8080/tidelog/data-docs/index.html"


def say(msg: str) -> None:
    click.echo(click.style("==> ", fg="cyan", bold=True) + msg)


def indent(msg: str) -> None:
    click.echo(f"    {msg.strip()}")


def write_spec(root: Path) -> Path:
    """The example spec with its files under `root`, on a free port (a cluster that `make
    airflow`'s tidelog_deploy started from the same example may hold the default one)."""
    d = yaml.safe_load(EXAMPLE.read_text())
    d["state_dir"] = str(root / "platform")
    port = d["groups"][0].get("port", 10911)
    if not all(port_free(f"127.0.0.{11 + i}", port) for i in range(len(d["hosts"]))):
        d["groups"][0]["port"] = free_port("127.0.0.11")
    path = root / "local-raft3.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path


def main(data_dir: Path, messages: int, drill_s: float = 12.0, rate: float = 200.0) -> int:
    from ops.deploy import stop

    t0 = time.perf_counter()
    root = Path(data_dir).resolve()
    for sub in ("platform", "collected", "drill-reports"):
        shutil.rmtree(root / sub, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    spec_path = str(write_spec(root))
    spec = sp.load(spec_path)
    run_date = dt.datetime.now(dt.timezone.utc).date().isoformat()
    # the warehouse `tidelog sql`, the DAGs and make airflow's query server use, so what the demo
    # publishes is what the next command queries (its partitions: this date, this cluster)
    warehouse = default_warehouse()
    rows, problems, out = [], [], {}
    spark = None
    try:
        say(f"deploying {spec.name}: 3 raft nodes on 127.0.0.11-13 (spec {spec_path})")
        dagtasks.deploy(spec_path, log=indent)
        st = dagtasks.health_gate(spec_path, what="after deploy")
        bootstrap = [n.address for n in spec.nodes()]
        say(f"healthy; leader {st['leaders']['g0']}")

        creds = credentials_for(spec)  # deploy made the CA, the certificates and the admin user
        say(f"security on: TLS with the cluster CA, user admin (credentials {ClusterSecurity(spec).credentials_file()})")
        with Admin(bootstrap, credentials=creds) as a:
            a.create_topic(TOPIC, QUEUES)
        t = time.perf_counter()
        acked = uvloop.run(produce(bootstrap, messages, creds))
        say(f"produced {len(acked)} messages to {TOPIC}, each acknowledged by a quorum "
            f"({len(acked) / (time.perf_counter() - t):,.0f} msg/s)")
        got, _ = consume_all(bootstrap, "demo-billing", messages, credentials=creds)
        problems += check(acked, got)
        say(f"consumer group demo-billing read {len(got)} of them back")
        rows += [("messages acknowledged", len(acked)), ("messages read back", len(got))]

        say(f"failover drill: kill -9 the leader while sending {rate:g} acknowledged msgs/s for {drill_s:g}s")
        try:
            d = dagtasks.drill(spec_path, "kill-leader", drill_s, rate, root / "drill-reports", log=indent)
        except dagtasks.TaskFailed as e:
            problems.append(str(e))
            d = None
        if d:
            f = d["figures"]
            rows += [("drill: sends acknowledged", f["ok"]), ("drill: failed / unknown", f"{f['failed']} / {f['unknown']}"),
                     ("drill: acknowledged but lost", d["counts"]["lost"]),
                     ("drill: time to a new leader (s)", f["time_to_new_leader_s_max"]),
                     ("drill: longest gap between acks (s)", f["longest_ack_gap_s"])]
            out["drill report"], out["drill plot"] = d["report"], d["plot"]

        say("collecting every replica's CommitLog")
        c = dagtasks.collect(spec_path, root / "collected" / run_date, log=indent)
        say("reconciling the replicas with Spark (a JVM starts: ~10 s)")
        from spark_jobs.warehouse import session

        spark = session()
        r = dagtasks.reconcile(c["logs"], run_date, warehouse, spark=spark, log=indent)
        (cl,) = r["clusters"]
        rows += [("reconcile: verdict", cl["verdict"]), ("reconcile: indexes consistent on every replica",
                                                          cl["statuses"].get("consistent", 0))]
        if r["verdict"] != "clean":
            problems.append(f"the reconcile found problems: {cl['statuses']}")
        say("Great Expectations checkpoints on the reconciled tables")
        try:
            v = dagtasks.gx_checkpoint(run_date, warehouse, spark=spark, log=indent)
            out["Data Docs"] = f"{v['data_docs']} (with make airflow: {AIRFLOW_DOCS})"
            rows.append(("GX validation", "passed"))
        except dagtasks.TaskFailed as e:
            problems.append(str(e))
            rows.append(("GX validation", "FAILED"))
        pub = dagtasks.publish(run_date, warehouse)
        cmd = f"tidelog sql --warehouse {warehouse} \"{QUERY}\""
        say(f"$ {cmd}")
        from ops.cli.data_cmds import sql

        sql.main(["--warehouse", str(warehouse), QUERY], standalone_mode=False)  # stops the session
        spark = None
        out["query the tables"] = f"tidelog sql \"{STATUS_QUERY}\""   # the default warehouse: this one
        out["spark-sql"] = pub["spark_sql"]
    finally:
        if spark is not None:
            spark.stop()
        say("stopping the cluster")
        stopped = stop(spec)
        rows.append(("nodes stopped", sum(1 for s in stopped.values() if s == "stopped")))

    if not summary("Tidelog platform demo", rows, t0, problems,
                   "OK: every acknowledged message was read back; the drill lost nothing; the replicas "
                   "reconcile clean and pass every expectation.", width=48, paths=out):
        return 1
    click.echo("Next: `make airflow`, open http://127.0.0.1:8080 (user admin, password printed and in "
               "~/.tidelog/airflow/simple_auth_manager_passwords.json.generated), trigger tidelog_deploy, then "
               "tidelog_failover_drill and tidelog_reconcile_nightly, and open each run's 'Tidelog report' tab.")
    return 0
