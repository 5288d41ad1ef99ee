"""`tidelog infra|deploy|status|start|stop|collect`: a spec'd cluster on its hosts."""

from __future__ import annotations

from pathlib import Path

import click

from ops.cli.common import emit_json, err_console, fail, json_option, print_table, progress, require

DEFAULT_SPEC = Path(__file__).resolve().parents[2] / "infra" / "examples" / "local-raft3.yaml"


def spec_option(f):
    return click.option("--spec", "spec_path", type=click.Path(path_type=Path), envvar="TIDELOG_SPEC",
                        default=DEFAULT_SPEC, show_default="infra/examples/local-raft3.yaml",
                        help="Cluster spec (YAML; see infra/examples/)")(f)


def load_spec(path: Path, group: str | None = None):
    """The spec (and, with `group`, that the group is in it), or `error: ...` and exit 2."""
    from infra.spec import SpecError, load

    try:
        spec = load(path)
    except SpecError as e:
        fail(str(e), 2)
    names = [g.name for g in spec.groups]
    if group is not None and group not in names:
        fail(f"{path}: no group {group!r} in {spec.name} (its groups: {', '.join(names)}); "
             f"give one of those to --group, or leave it out", 2)
    return spec


def platform_errors():
    """The exceptions a platform command turns into `error: ...` and exit 1."""
    from infra.credentials import CredentialsError
    from infra.hosts import HostError
    from infra.providers import ProviderError
    from ops.build import BuildError
    from ops.deploy import DeployError
    from ops.nodes import NodeError

    return (HostError, ProviderError, BuildError, DeployError, NodeError, CredentialsError)


def guarded(fn, *args, **kw):
    """Call a platform function; its errors become `error: ...` and exit 1."""
    try:
        return fn(*args, **kw)
    except platform_errors() as e:
        fail(str(e))


def say(msg: str) -> None:
    """A log line on stderr, printed above a live progress bar rather than across it."""
    err_console.print(msg, markup=False, highlight=False, soft_wrap=True)


def provider_action(spec_path: Path, action: str, as_json: bool):
    """(spec, the provider's report); the report is None once printed as JSON."""
    from infra import providers

    spec = load_spec(spec_path)
    r = guarded(lambda: getattr(providers.get(spec), action)())
    if as_json:
        emit_json(r)
        return spec, None
    return spec, r


@click.group()
def infra():
    """Hosts from a provider: local, netns, docker, static."""


@infra.command("up")
@spec_option
@json_option
def infra_up(spec_path, as_json):
    """Bring the spec's hosts up (idempotent)."""
    spec, r = provider_action(spec_path, "up", as_json)
    if r is None:
        return
    for m in r["made"]:
        click.echo(f"  made {m}")
    click.echo(f"{spec.name}: {len(r['hosts'])} {spec.provider} hosts up: "
               + ", ".join(f"{h} {a}" for h, a in r["hosts"].items()))


@infra.command("down")
@spec_option
@json_option
def infra_down(spec_path, as_json):
    """Remove everything `infra up` made (stops whatever runs on those hosts)."""
    spec, r = provider_action(spec_path, "down", as_json)
    if r is None:
        return
    for m in r["removed"]:
        click.echo(f"  removed {m}")
    click.echo(r.get("note") or f"{spec.name}: down")


@infra.command("status")
@spec_option
@json_option
def infra_status(spec_path, as_json):
    """Is every host reachable (over SSH for remote providers)?"""
    from infra import providers

    spec = load_spec(spec_path)
    r = guarded(lambda: providers.get(spec).status())
    if as_json:
        emit_json(r)
    else:
        print_table(["host", "address", "state", "hostname"],
                    [[h["name"], h["address"], h["state"], h.get("hostname") or "-"] for h in r["hosts"]])
        for h in r["hosts"]:  # whole lines: errors are long, and read (and grepped) as sentences
            if h.get("error"):
                click.echo(f"  ! {h['name']}: {h['error']}")
        click.echo(r["verdict"])
    raise SystemExit(0 if r["verdict"] == "up" else 1)


@click.command()
@spec_option
@click.option("--version", "version", default=None,
              help="current | a version (dist/tidelog-V-*.whl) | a wheel path (default: the spec's)")
@click.option("--no-wait", is_flag=True, help="Do not wait for the cluster to be healthy")
@json_option
def deploy(spec_path, version, no_wait, as_json):
    """Install and start the spec's broker groups; wait until healthy. Idempotent."""
    from ops.deploy import deploy as run_deploy

    spec = load_spec(spec_path)
    try:
        with progress(len(spec.nodes()), "deploy (nodes)") as tick:
            r = run_deploy(spec, version, wait=not no_wait, log=say,
                           on_node=lambda node, what: tick(note=f"{node} {what}"))
    except platform_errors() as e:
        if as_json and getattr(e, "report", None):
            emit_json(e.report)
        fail(str(e))
    if as_json:
        return emit_json(r)
    print_table(["node", "what happened"], list(r["nodes"].items()))
    click.echo(f"{spec.name}: {'deployed' if r['changed'] else 'nothing to change'} (build {r['build']})"
               + (f", {r['status']['verdict']}" if "status" in r else ""))


@click.command("status")
@spec_option
@click.option("--group", default=None, help="Only this broker group")
@json_option
def status(spec_path, group, as_json):
    """Every node's role, version, term/epoch, offsets and lag; a verdict line.

    Exit status: 0 healthy, 1 degraded, 2 down (for gates)."""
    from ops.health import status as get_status

    spec = load_spec(spec_path, group)
    st = get_status(spec, group)
    if as_json:
        emit_json(st)
    else:
        from ops.cli.status_view import print_status

        print_status(st)
    raise SystemExit({"healthy": 0, "degraded": 1, "down": 2}[st["verdict"]])


@click.command()
@spec_option
@click.option("--node", default=None, help="Only this node (id or host); default: all")
@json_option
def stop(spec_path, node, as_json):
    """Stop nodes (SIGTERM: flush and checkpoint; SIGKILL after 30 s)."""
    from ops.deploy import stop as run_stop

    print_per_node(guarded(run_stop, load_spec(spec_path), node), as_json)


@click.command()
@spec_option
@click.option("--node", default=None, help="Only this node (id or host); default: all")
@click.option("--no-wait", is_flag=True, help="Do not wait for the cluster to be healthy")
@json_option
def start(spec_path, node, no_wait, as_json):
    """Start stopped nodes on the build they last ran."""
    from ops.deploy import start as run_start

    print_per_node(guarded(run_start, load_spec(spec_path), node, wait=not no_wait), as_json)


def print_per_node(r: dict, as_json: bool) -> None:
    if as_json:
        return emit_json(r)
    print_table(["node", "what happened"], [(k, v) for k, v in r.items() if k != "verdict"])
    if "verdict" in r:
        click.echo(r["verdict"])


COMMANDS = [infra, deploy, status, stop, start]


@click.command()
@spec_option
@click.option("--nemesis", type=click.Choice(["kill-leader", "kill-random", "pause-leader", "partition-leader",
                                              "isolate-random", "mixed", "isolated-restart", "partition-then-kill",
                                              "kill-during-transfer", "kill-namesrv", "kill-namesrv-and-leader"]),
              default="kill-leader", show_default=True,
              help="The fault (mixed: a random one per window, sometimes two overlapping); isolated-restart, "
                   "partition-then-kill, kill-during-transfer: combined sequences of steps in one window; "
                   "kill-namesrv (every name server), kill-namesrv-and-leader (then the group's leader): "
                   "a spec with name servers")
@click.option("--duration", "duration_s", type=float, default=30.0, show_default=True, help="Seconds of workload")
@click.option("--rate", type=float, default=200.0, show_default=True, help="Acknowledged sends per second")
@click.option("--report", "report_dir", type=click.Path(path_type=Path), default=Path("drill-reports"),
              show_default=True, help="Reports go to DIR/<run id>/ (report.json, drill.png, logs/)")
@click.option("--group", default=None, help="The broker group the faults hit (default: the spec's first); with "
              "name servers the workload runs through them on every group")
@click.option("--seed", type=int, default=None, help="Replay a run's choices (printed by every run)")
@click.option("--fault-s", type=float, default=None, help="How long each fault lasts (default: duration/4, 2-8 s)")
@click.option("--calm-s", type=float, default=None, help="Healthy time between faults (default: duration/8, 1-5 s)")
@click.option("--failover", type=click.Choice(["promote", "none"]), default="promote", show_default=True,
              help="Master-slave groups: promote the best slave when a fault takes the master away")
@click.option("--promote-after", "promote_after_s", type=float, default=1.0, show_default=True,
              help="Seconds between losing the master and the promotion (detection time)")
@click.option("--workload", type=click.Choice(["native", "kafka"]), default="native", show_default=True,
              help="Who sends: the Python client, or librdkafka (acks=all, idempotence) through the Kafka "
                   "listeners; the same history checker either way")
@json_option
def drill(spec_path, nemesis, duration_s, rate, report_dir, group, seed, fault_s, calm_s, failover,
          promote_after_s, workload, as_json):
    """Failover drill: workload + faults + heal, then the history checker.

    Exits 1 when any safety check fails (lost, duplicated, reordered, wrong offset, replicas
    disagreeing on the committed prefix) or, with name servers, a liveness check (sends that
    stopped while every name server was down)."""
    from ops.drill.nemesis import NemesisError
    from ops.drill.run import DrillError, drill as run_drill
    from ops.upgrade import ClusterDown

    require({"--duration must be more than 0 seconds": duration_s > 0,
             "--rate must be more than 0 sends per second": rate > 0,
             "--fault-s must be more than 0 seconds": fault_s is None or fault_s > 0,
             "--calm-s must not be negative": calm_s is None or calm_s >= 0,
             "--promote-after must not be negative": promote_after_s >= 0})
    spec = load_spec(spec_path, group)
    try:
        with progress(duration_s, f"drill {nemesis} (s)") as tick:
            r = run_drill(spec, nemesis, duration_s, rate, report_dir, group, seed, fault_s, calm_s, log=say,
                          failover=failover, promote_after_s=promote_after_s, workload=workload,
                          on_progress=lambda t, acks: tick(completed=t, note=f"{acks} acks"))
    except ClusterDown as e:
        fail(f"{e} --spec {spec_path}")
    except (*platform_errors(), DrillError, NemesisError) as e:
        fail(str(e))
    if as_json:
        emit_json(r)
    else:
        f = r["figures"]
        live = r.get("liveness") or {"ok": True, "problems": []}
        click.echo(f"drill {r['run_id']} ({r['nemesis']}, seed {r['seed']}): "
                   f"{'SAFETY VIOLATION' if not r['ok'] else 'LIVENESS FAILURE' if not live['ok'] else 'OK'}")
        click.echo(f"  ops {f['ops']}: ok {f['ok']}, failed {f['failed']}, unknown {f['unknown']}; "
                   f"read back {f['reads']}")
        click.echo(f"  faults {f['faults']}; time to new leader (max) {f['time_to_new_leader_s_max']} s; "
                   f"longest gap between acks {f['longest_ack_gap_s']} s; heal (max) {f.get('heal_s_max')} s; "
                   f"recovery (max) {f['recovery_s_max']} s; "
                   f"every replica caught up {f.get('catch_up_s')} s after the drain")
        click.echo(f"  latency ms p50 {f['latency_ms_p50']} p99 {f['latency_ms_p99']} max {f['latency_ms_max']}")
        for kind, n in r["counts"].items():
            if n and kind in r["anomalies"]:
                click.echo(f"  ! {kind}: {n} (e.g. {r['anomalies'][kind][0]})")
        for problem in live["problems"]:
            click.echo(f"  ! liveness: {problem}")
        click.echo(f"  report {r['report_dir']}/report.json, plot {r['plot']}")
    raise SystemExit(0 if r["ok"] and (r.get("liveness") or {}).get("ok", True) else 1)


@click.command("collect")
@spec_option
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True,
              help="Copies go to OUT/<cluster>/<node>/")
@click.option("--group", default=None, help="Only this broker group")
@json_option
def collect_cmd(spec_path, out_dir, group, as_json):
    """Copy every node's segments and checkpoint (for `tidelog reconcile`)."""
    from ops.collect import collect

    spec = load_spec(spec_path, group)
    copied = {"bytes": 0}

    def node_done(info: dict) -> None:
        copied["bytes"] += info.get("bytes", 0)
        tick(note=f"{info['id']} {'missing' if 'error' in info else 'done'}, {copied['bytes']} bytes")

    if out_dir.exists() and not out_dir.is_dir():
        fail(f"--out {out_dir}: not a directory; give a directory (it is created if missing)", 2)
    with progress(len(spec.nodes(group)), "collect (nodes)") as tick:
        r = guarded(collect, spec, out_dir, group, on_node=node_done)
    if r["nodes"] and len(r["missing"]) == len(r["nodes"]):
        if as_json:
            emit_json(r)
        fail(f"nothing was collected from {spec.name}: every node is missing ("
             + "; ".join(f"{n['id']}: {n['error']}" for n in r["nodes"]) + f"); see {r['dir']}/collect.json")
    if as_json:
        emit_json(r)
    else:
        print_table(["node", "bytes"], [[n["id"], n.get("bytes", "-")] for n in r["nodes"]])
        for n in r["nodes"]:  # whole lines: the reasons are sentences
            if "error" in n:
                click.echo(f"  ! {n['id']}: {n['error']}")
        click.echo(f"collected into {r['dir']}")
    raise SystemExit(1 if r["missing"] else 0)


COMMANDS += [drill, collect_cmd]


@click.command()
@spec_option
@click.option("--to", "to", default=None, help="Target: a version (dist/tidelog-V-*.whl), a wheel path, or current")
@click.option("--rollback", is_flag=True,
              help="Without --to: return the last roll's upgraded nodes to their previous builds. "
                   "With --to: do that automatically if the roll stops")
@click.option("--group", default=None, help="One broker group (default: the whole cluster -- name servers one at a "
              "time, then group by group, behind route gates -- or, with one group and no name servers, that group)")
@click.option("--workload-rate", type=float, default=0.0, show_default=True,
              help="Run acknowledged sends at this rate through the roll; report losses and the "
                   "longest gap between acks")
@json_option
def upgrade(spec_path, to, rollback, group, workload_rate, as_json):
    """Rolling upgrade: followers one at a time, then move leadership and upgrade the old leader;
    a whole cluster: its name servers one at a time, then group by group."""
    from ops.upgrade import (ClusterDown, UpgradeError, rollback as run_rollback, upgrade as run_upgrade,
                             whole_cluster)

    require({"--workload-rate must not be negative": workload_rate >= 0})
    spec = load_spec(spec_path, group)
    if to is None and not rollback:
        fail("give --to VERSION (or --rollback to undo the last roll)", 2)
    try:
        count = (len(spec.nodes()) + len(spec.namesrvs()) if whole_cluster(spec, group)
                 else len(spec.nodes(spec.group(group).name)))
        with progress(count, "upgrade (nodes)" if to else "rollback (nodes)") as tick:
            on_node = lambda node, what: tick(note=f"{node} {what}")  # noqa: E731
            r = (run_upgrade(spec, to, group, rollback, log=say, workload_rate=workload_rate, on_node=on_node)
                 if to is not None else run_rollback(spec, group, log=say, on_node=on_node))
    except ClusterDown as e:
        if as_json:
            emit_json(e.report)
        fail(f"{e} --spec {spec_path}")
    except UpgradeError as e:
        if as_json:
            emit_json(e.report)
        fail(str(e))
    except platform_errors() as e:
        fail(str(e))
    if as_json:
        return emit_json(r)
    if to is not None:
        click.echo(f"{spec.name}/{r['group']}: upgraded to {r['to']}: "
                   + ", ".join(f"{k} v{v}" for k, v in r["versions"].items()))
        w = r.get("workload")
        if w:
            click.echo(f"  workload: {'OK' if w['safe'] else 'SAFETY VIOLATION'}; {w.get('ok')} ok of "
                       f"{w.get('ops')}, failed {w.get('failed')}, unknown {w.get('unknown')}, lost "
                       f"{w.get('counts', {}).get('lost')}; longest gap between acks {w.get('longest_ack_gap_s')} s")
            if not w["safe"]:
                raise SystemExit(1)
    else:
        click.echo(f"{spec.name}/{r['group']}: rolled back {', '.join(r['rolled_back']) or 'nothing'}")


COMMANDS += [upgrade]
