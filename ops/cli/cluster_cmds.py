"""`tidelog cluster up|status|down`: a local group on loopback, one process per node."""

from __future__ import annotations

from pathlib import Path

import click

from ops.cli.common import emit_json, fail, json_option, parse_overrides
from ops.cluster import DEFAULT_DIR, ClusterError, LocalCluster


def data_dir_option(f):
    return click.option("--data-dir", type=click.Path(path_type=Path), default=DEFAULT_DIR,
                        show_default=True, envvar="TIDELOG_CLUSTER_DIR",
                        help="The cluster's state directory (nodes' data and cluster.json)")(f)


@click.group()
def cluster():
    """A local broker group on loopback (the embedded default)."""


@cluster.command("up")
@click.option("--nodes", "-n", type=int, default=3, show_default=True)
@click.option("--mode", type=click.Choice(["raft", "master-slave", "standalone"]), default="raft",
              show_default=True)
@click.option("--flush", type=click.Choice(["async", "sync"]), default="async", show_default=True,
              help="When a node fsyncs (sync: before it acknowledges)")
@click.option("--sync/--async", "sync_replication", default=True, show_default=True,
              help="master-slave: a send waits for a slave (SYNC master) or not (ASYNC master)")
@click.option("--fresh", is_flag=True, help="Start empty (delete the cluster's old data)")
@click.option("--set", "overrides", multiple=True, metavar="FIELD=VALUE",
              help="A broker config field for every node (repeatable)")
@data_dir_option
@json_option
def cluster_up(nodes, mode, flush, sync_replication, fresh, overrides, data_dir, as_json):
    """Start the nodes in the background (they outlive this command)."""
    c = LocalCluster(data_dir)
    extra = parse_overrides(overrides)
    if mode == "master-slave":
        extra.setdefault("ha_replication", "sync" if sync_replication else "async")
    try:
        c.up(nodes, mode, flush, fresh, **extra)
        leader = c.wait_for_leader() if mode != "standalone" else None
        if mode == "master-slave" and c.wait_healthy()["verdict"] != "healthy":
            fail(f"the group did not get healthy: see `tidelog cluster status --data-dir {c.dir}`")
    except (ClusterError, RuntimeError) as e:
        fail(str(e))
    if as_json:
        return emit_json(c.status())
    what = f"{mode} ({extra['ha_replication']}) " if mode == "master-slave" else f"{mode} "
    role = "master" if mode == "master-slave" else "leader"
    click.echo(f"{what}group of {nodes} up in {c.dir}" + (f", {role} {leader}" if leader else ""))
    for n in c.nodes:
        click.echo(f"  {n.id}  {n.address}  pid {n.pid}")
    click.echo(f"bootstrap: {','.join(c.addresses)}")
    click.echo(f"try: tidelog produce -b {','.join(c.addresses)} --topic demo --count 1000")


@cluster.command("status")
@data_dir_option
@json_option
def cluster_status(data_dir, as_json):
    """Every node's role, term, leader, indexes and the followers' lag."""
    try:
        st = LocalCluster(data_dir).load().status()
    except ClusterError as e:
        fail(str(e))
    if as_json:
        return emit_json(st)
    click.echo(f"{st['mode']} group in {st['dir']}: {st['verdict']}"
               + (f", {'master' if st['mode'] == 'master-slave' else 'leader'} {st['leader']}"
                  if st["leader"] else ""))
    if st["mode"] == "master-slave":
        return _ha_table(st)
    lag = {}
    for row in st["nodes"]:
        lag.update(row.get("replication", {}).get("followers") or {})
    click.echo(f"  {'node':<5} {'address':<21} {'state':<8} {'role':<10} {'term':>5} {'begin':>7} "
               f"{'end':>9} {'committed':>9} {'lag':>7}")
    for row in st["nodes"]:
        r = row.get("replication", {})
        f = lag.get(row["id"], {})
        click.echo(f"  {row['id']:<5} {row['address']:<21} {row['state']:<8} {row.get('role', '-'):<10} "
                   f"{r.get('term', '-'):>5} {r.get('begin_index', '-'):>7} {r.get('end_index', '-'):>9} "
                   f"{r.get('commit_index', '-'):>9} {f.get('lag', '-'):>7}")


def _ha_table(st: dict) -> None:
    """Like `mqadmin haStatus`: the master's offsets, and each slave's ack, lag and rate."""
    slaves = {}
    for row in st["nodes"]:
        slaves.update(row.get("replication", {}).get("slaves") or {})
    click.echo(f"  {'node':<5} {'address':<21} {'state':<8} {'role':<7} {'epoch':>5} {'max offset':>12} "
               f"{'ack offset':>12} {'lag bytes':>10} {'rate B/s':>10} {'in sync':>7}")
    for row in st["nodes"]:
        r = row.get("replication", {})
        s = slaves.get(row["id"], {})
        in_sync = "-" if not s else "yes" if s.get("in_sync") else "no"
        click.echo(f"  {row['id']:<5} {row['address']:<21} {row['state']:<8} {row.get('role', '-'):<7} "
                   f"{r.get('epoch', '-'):>5} {row.get('store', {}).get('max_offset', '-'):>12} "
                   f"{s.get('ack_offset', '-'):>12} {_v(s.get('lag_bytes', r.get('lag_bytes'))):>10} "
                   f"{_v(s.get('transfer_rate_bytes_per_s')):>10} {in_sync:>7}")
        if row.get("role") == "master":
            click.echo(f"        slaves {r.get('slave_count')}, in sync {r.get('in_sync_count')} "
                       f"(required {r.get('required_replicas')}, {r.get('ha_replication')})")


def _v(x) -> str:
    return "-" if x is None else str(x)


@cluster.command("down")
@data_dir_option
def cluster_down(data_dir):
    """Stop every node (by the pids recorded at `up`)."""
    try:
        c = LocalCluster(data_dir).load()
    except ClusterError as e:
        fail(str(e))
    killed = c.down()
    click.echo(f"stopped {len(c.nodes)} node(s) in {c.dir}"
               + (f" ({', '.join(killed)} had to be killed)" if killed else ""))


@cluster.command("bootstrap")
@data_dir_option
def cluster_bootstrap(data_dir):
    """Print the group's addresses, for -b / TIDELOG_BOOTSTRAP."""
    try:
        click.echo(",".join(LocalCluster(data_dir).load().addresses))
    except ClusterError as e:
        fail(str(e))
