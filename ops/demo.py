"""`make run`: the whole platform on embedded defaults, through the code the DAGs run.

Two raft groups of 3 nodes (g0, g1) behind two name servers (infra/examples/
local-2x3-namesrv.yaml, files under DATA_DIR/platform). Traffic goes through the name servers:
the topic is created on both groups, the Python client (ClusterProducer / ClusterConsumer)
asks a name server for the topic's route and sends to and reads from both groups, and every
acknowledged message is read back from the group, queue and offset that acknowledged it (a
second copy only of a send the producer flagged as retried). The topic's route is printed as
the name servers give it, before and after a kill-leader drill on g0. Then collect of every
replica of both groups and a clean stop (also when a step fails), and on the collected copies
the Spark reconcile, the Great Expectations checkpoints and one `tidelog sql` query (a row per
replica, per group). Each step is the `ops.dagtasks` function the matching Airflow task calls,
so this is what `make airflow` then runs on a schedule.
"""

from __future__ import annotations

import datetime as dt
import re
import shutil
import time
from pathlib import Path

import click
import uvloop
import yaml

from broker.client import TidelogError
from broker.client.cluster import NameServers, create_topic
from infra import spec as sp
from ops import dagtasks
from ops.demo_broker import QUEUES, TOPIC, check, consume_all, produce, retried_copies, summary
from ops.localbroker import free_port, port_free
from ops.security import ClusterSecurity, credentials_for
from spark_jobs.warehouse import console_log, default_warehouse

EXAMPLE = Path(__file__).resolve().parents[1] / "infra" / "examples" / "local-2x3-namesrv.yaml"
DRILL_GROUP = "g0"
PORT_TRIES = 50  # ports asked of the kernel when the spec's are taken on some address
# this run's rows (its cluster, its date): a row per replica of each group
QUERY = ("SELECT group, node, state, end_index, node_committed_index, lag, crc_errors FROM tidelog.replica_summary "
         "WHERE cluster = '{cluster}' AND run_date = '{run_date}' ORDER BY group, node")
STATUS_QUERY = ("SELECT group, status, count(*) AS indexes FROM tidelog.reconciled_log "
                "GROUP BY group, status ORDER BY group, status")
RECAP = re.compile(r"\s*[\w.-]+: started \(pid \d+\)$")
AIRFLOW_DOCS = "http://127.0.0.1:8080/tidelog/data-docs/index.html"


class StepFailed(RuntimeError):
    """A demo step that cannot go on (the cluster is stopped, the summary names it)."""


def say(msg: str) -> None:
    click.echo(click.style("==> ", fg="cyan", bold=True) + msg)


def indent(msg: str) -> None:
    click.echo(f"    {msg.strip()}")


def deploy_log(msg: str) -> None:
    """deploy's lines without dagtasks.deploy's per-node recap of what deploy just said
    ("g0-h1: started (pid N)" after "g0-h1 started on h1 (address), pid N")."""
    if not RECAP.match(msg):
        indent(msg)


def _free_everywhere(ips: list[str], want: int, span: int, taken: set[tuple[str, int]]) -> int:
    """`want` if ports want..want+span-1 are free on every address (and not given to another
    process of the spec), else such a port found by asking the kernel for one."""
    for i in range(PORT_TRIES):
        port = want if i == 0 else free_port(ips[0])
        ports = range(port, port + span)
        if ports[-1] <= 65535 and all((ip, p) not in taken and port_free(ip, p) for ip in ips for p in ports):
            taken.update((ip, p) for ip in ips for p in ports)
            return port
    raise StepFailed(f"no port free on all of {', '.join(ips)} after {PORT_TRIES} tries")


def write_spec(root: Path) -> Path:
    """The example spec with its files under `root`, every group's port (and HA port) free on
    all of its hosts and the name servers' port free on all of theirs: a cluster that `make
    airflow`'s tidelog_deploy started from local-raft3.yaml holds 127.0.0.11-13:10911, another
    run of this demo (or of the tests) may hold the rest."""
    d = yaml.safe_load(EXAMPLE.read_text())
    d["state_dir"] = str(root / "platform")
    spec = sp.from_dict(d, str(EXAMPLE))
    taken: set[tuple[str, int]] = set()
    for g, gd in zip(spec.groups, d["groups"]):
        span = 2 if g.mode == "master-slave" and not g.ha_port else 1
        gd["port"] = _free_everywhere([spec.address_of(h) for h in g.hosts], g.port, span, taken)
    if spec.namesrv is not None:
        d["namesrv"]["port"] = _free_everywhere([spec.address_of(h) for h in spec.namesrv.hosts],
                                                spec.namesrv.port, 1, taken)
    path = root / EXAMPLE.name
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path


# ---- the name servers' view -------------------------------------------------------------------

async def _ask_routes(spec: sp.ClusterSpec, creds) -> list[tuple[sp.NodePlan, object]]:
    out = []
    for plan in spec.namesrvs():
        try:
            async with NameServers([plan.address], credentials=creds, request_timeout_ms=2000,
                                   connect_timeout_ms=1000) as n:
                out.append((plan, await n.topic_route(TOPIC)))
        except TidelogError as e:
            out.append((plan, e))
    return out


def show_routes(spec: sp.ClusterSpec, creds, when: str = "", note: str = "") -> dict[str, str | None]:
    """Print what each name server answers for the topic's route (GET_TOPIC_ROUTE, what every
    client is told): per group its queues, leader and followers, once when they all agree.
    Returns {group: its leader's node id} (None: no leader routed) as the first one answered."""
    ids = {p.address: p.id for p in spec.nodes()}

    def lines(route) -> list[str]:
        if isinstance(route, Exception):
            return [f"no answer: {route}"]
        if route is None:
            return [f"no group holds {TOPIC}"]
        return [f"{g.broker_name}: queues 0-{g.write_queues - 1}, leader "
                + (f"{ids.get(g.leader, g.leader)} (term {g.term})" if g.leader else "none")
                + f", followers {' '.join(ids.get(a, a) for a in g.followers) or 'none'}"
                for g in route.groups]

    answers = [(plan, lines(route), route) for plan, route in uvloop.run(_ask_routes(spec, creds))]
    names = " and ".join(p.id for p, _, _ in answers)
    head = (f"route of {TOPIC} from the name servers" + (f" {when}" if when else "")
            + " (" + (f"{note}; " if note else ""))
    if len({tuple(ls) for _, ls, _ in answers}) == 1:
        say(f"{head}{names} agree)")
        for line in answers[0][1]:
            indent(line)
    else:
        say(f"{head}they differ)")
        for plan, ls, _ in answers:
            for line in ls:
                indent(f"{plan.id}: {line}")
    first = next((r for _, _, r in answers if r is not None and not isinstance(r, Exception)), None)
    return {g.broker_name: ids.get(g.leader, g.leader) if g.leader else None for g in (first.groups if first else [])}


# ---- the demo ---------------------------------------------------------------------------------

def main(data_dir: Path, messages: int, drill_s: float = 12.0, rate: float = 200.0) -> int:
    t0 = time.perf_counter()
    root = Path(data_dir).resolve()
    for sub in ("platform", "collected", "drill-reports"):
        shutil.rmtree(root / sub, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    try:
        spec_path = str(write_spec(root))
    except StepFailed as e:  # no free port: nothing started, nothing to stop
        click.echo(click.style("demo: ", fg="red", bold=True) + _words(e), err=True)
        return 1
    spec = sp.load(spec_path)
    rows, problems, out = [], [], {}
    run_date = dt.datetime.now(dt.timezone.utc).date().isoformat()
    logs = None
    expected = (dagtasks.TaskFailed, StepFailed, *dagtasks.operational_errors())
    try:
        logs = _on_the_cluster(spec, spec_path, root, messages, drill_s, rate, run_date, rows, problems, out)
    except expected as e:
        problems.append(_words(e))
    finally:  # the reconcile reads the collected copies: the cluster's CPU goes to Spark
        try:
            stopped = _stop(spec)
        except Exception as e:  # noqa: BLE001 - said in the summary; the step's own failure is kept
            stopped = "failed"
            problems.append(f"stopping the cluster: {_words(e)}")
    if logs is not None:
        try:
            _reconcile(spec, logs, run_date, rows, problems, out)
        except expected as e:
            problems.append(_words(e))
    rows.append(("brokers / name servers stopped", stopped))

    if not summary("Tidelog platform demo", rows, t0, problems,
                   "OK: every acknowledged message was read back from the group that acknowledged it; the "
                   "drill lost nothing; both groups' replicas reconcile clean and pass every expectation.",
                   width=48, paths=out):
        return 1
    click.echo("Next: `make airflow`, open http://127.0.0.1:8080 (user admin, password printed and in "
               "~/.tidelog/airflow/simple_auth_manager_passwords.json.generated), trigger tidelog_deploy, then "
               "tidelog_failover_drill and tidelog_reconcile_nightly, and open each run's 'Tidelog report' tab.")
    return 0


def _words(e: Exception) -> str:
    return str(e) if isinstance(e, (dagtasks.TaskFailed, StepFailed)) else f"{type(e).__name__}: {e}"


def _stop(spec: sp.ClusterSpec) -> str:
    """Stop every broker, then the name servers; "brokers / name servers" stopped."""
    from ops.deploy import stop

    say("stopping the cluster")
    stopped = stop(spec)
    names = {p.id for p in spec.namesrvs()}
    return (f"{sum(s == 'stopped' for i, s in stopped.items() if i not in names)} / "
            f"{sum(s == 'stopped' for i, s in stopped.items() if i in names)}")


def _on_the_cluster(spec: sp.ClusterSpec, spec_path: str, root: Path, messages: int, drill_s: float, rate: float,
                    run_date: str, rows: list, problems: list, out: dict) -> str:
    """Deploy, traffic through the name servers, the drill, collect; the collected logs' directory."""
    groups = [g.name for g in spec.groups]
    namesrv = spec.namesrv_addresses
    where = "; ".join(f"{g.name} on {spec.address_of(g.hosts[0])}-{spec.address_of(g.hosts[-1]).rsplit('.', 1)[1]}"
                      f":{g.port}" for g in spec.groups)
    say(f"deploying {spec.name}: {len(groups)} raft groups of 3 ({where}), name servers "
        f"{', '.join(namesrv)} (spec {spec_path})")
    dagtasks.deploy(spec_path, log=deploy_log)
    st = dagtasks.health_gate(spec_path, what="after deploy")
    say("healthy: " + ", ".join(f"{g} leader {lead}" for g, lead in st["leaders"].items())
        + "; every name server routes each group to that leader")

    creds = credentials_for(spec)  # deploy made the CA, the certificates and the admin user
    say(f"security on: TLS with the cluster CA, user admin (credentials {ClusterSecurity(spec).credentials_file()})")
    made = create_topic(namesrv, TOPIC, QUEUES, groups=groups, credentials=creds)
    failed = {g: r for g, r in made.items() if isinstance(r, Exception)}
    if failed:
        raise StepFailed(f"creating topic {TOPIC}: " + "; ".join(f"{g}: {e}" for g, e in failed.items()))
    say(f"topic {TOPIC} created on {' and '.join(groups)} through the name servers, {QUEUES} queues each")
    show_routes(spec, creds, note="what every client gets")

    t = time.perf_counter()
    acked = uvloop.run(produce(namesrv, messages, creds, namesrv=True))
    per_group = {g: sum(a.group == g for a in acked.values()) for g in groups}
    say(f"produced {len(acked)} messages through the name servers ({len(acked) / (time.perf_counter() - t):,.0f} "
        f"msg/s), each acknowledged by a quorum of its group: "
        + ", ".join(f"{g} {n}" for g, n in per_group.items()))
    got, _ = consume_all(namesrv, "demo-billing", len(acked), credentials=creds, namesrv=True)
    problems += check(acked, got)
    read_at = {(m.msg_id, m.broker_name, m.queue_id, m.queue_offset) for m in got}
    back = {g: sum((mid, a.group, a.queue_id, a.queue_offset) in read_at for mid, a in acked.items() if a.group == g)
            for g in groups}
    retried = retried_copies(acked, got)
    say("consumer group demo-billing read them back through the name servers, each from the group, queue and "
        "offset that acknowledged it: " + ", ".join(f"{g} {n}" for g, n in back.items())
        + (f"; and {retried} extra copies of sends the producer retried after an unknown outcome (flagged "
           f"possible_duplicate: at-least-once)" if retried else ""))
    rows += [("messages acknowledged", len(acked)), ("messages read back", sum(back.values()))]
    rows += [(f"  {g}: acknowledged / read back", f"{per_group[g]} / {back[g]}") for g in groups]
    rows.append(("  extra copies of retried sends (flagged)", retried))
    if not all(per_group.values()):
        problems.append(f"the producer used one group only: {per_group}")

    before = dagtasks.health_gate(spec_path, group=DRILL_GROUP, what="before the drill")["leaders"][DRILL_GROUP]
    say(f"failover drill on {DRILL_GROUP}: kill -9 its leader ({before} now) while sending {rate:g} acknowledged "
        f"msgs/s for {drill_s:g}s")
    try:
        d = dagtasks.drill(spec_path, "kill-leader", drill_s, rate, root / "drill-reports", group=DRILL_GROUP,
                           log=indent)
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
    st = dagtasks.health_gate(spec_path, what="after the drill")
    after = show_routes(spec, creds, "after the drill")
    rows.append((f"{DRILL_GROUP}'s leader before / after the drill", f"{before} / {after.get(DRILL_GROUP)}"))
    if after != st["leaders"]:
        problems.append(f"after the drill the name servers route to {after}, the groups' leaders are {st['leaders']}")

    say("collecting every replica's CommitLog (both groups)")
    c = dagtasks.collect(spec_path, root / "collected" / run_date, log=indent)
    return c["logs"]


def _reconcile(spec: sp.ClusterSpec, logs: str, run_date: str, rows: list, problems: list, out: dict) -> None:
    """The Spark reconcile of the collected logs, the GX checkpoints, publish and one query."""
    # the warehouse `tidelog sql`, the DAGs and make airflow's query server use, so what the demo
    # publishes is what the next command queries (its partitions: this date, this cluster)
    warehouse = default_warehouse()
    say("reconciling the collected logs with Spark, group by group (a JVM starts: ~10 s)")
    from spark_jobs.warehouse import session

    spark = session(app="tidelog-demo", console=console_log(warehouse, "tidelog-demo"))
    try:
        r = dagtasks.reconcile(logs, run_date, warehouse, spark=spark, log=indent)
        (cl,) = r["clusters"]
        rows += [("reconcile: verdict", cl["verdict"]),
                 ("reconcile: indexes consistent on every replica", cl["statuses"].get("consistent", 0))]
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
        query = QUERY.format(cluster=spec.name, run_date=run_date)
        say(f"$ tidelog sql --warehouse {warehouse} \"{query}\"")
        from ops.cli.data_cmds import sql

        sql.main(["--warehouse", str(warehouse), query], standalone_mode=False)  # stops the session
        spark = None
    finally:
        if spark is not None:
            spark.stop()
    out["query the tables"] = f"tidelog sql \"{STATUS_QUERY}\""   # the default warehouse: this one
    out["spark-sql"] = pub["spark_sql"]
