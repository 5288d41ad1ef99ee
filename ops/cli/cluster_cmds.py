"""`tidelog cluster up|status|down|bootstrap`: a local group on loopback, one process per node
(`--groups N --namesrv K`: N groups behind K name servers).

A thin layer over the platform: `up` writes DIR/cluster.yaml (provider local) and deploys it
like `tidelog deploy`; `status` is `tidelog status` for that spec (same verdict, same table,
exit 0 healthy / 1 degraded / 2 down); `down` stops whatever runs as the group's nodes.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from ops.cli.common import emit_json, fail, json_option, parse_overrides
from ops.cli.status_view import print_status
from ops.cluster import DEFAULT_DIR, ClusterError, LocalCluster
from ops.health import RANK

NO_CLUSTER = 2  # the exit code of `status` for a group that is down: there is no group at all
DEFAULT_NODES = 3  # `cluster up` without --nodes (standalone: 1)


def data_dir_option(f):
    return click.option("--data-dir", type=click.Path(path_type=Path), default=DEFAULT_DIR,
                        show_default=True, envvar="TIDELOG_CLUSTER_DIR",
                        help="The cluster's directory (its spec, cluster.yaml, and the nodes' files)")(f)


def existing(data_dir: Path) -> LocalCluster:
    try:
        return LocalCluster(data_dir).load()
    except ClusterError as e:
        fail(str(e), NO_CLUSTER)


@click.group()
def cluster():
    """A local broker group on loopback (the embedded default)."""


@cluster.command("up")
@click.option("--nodes", "-n", type=int, default=None,
              help="Nodes per group  [default: 3; standalone: 1]")
@click.option("--mode", type=click.Choice(["raft", "master-slave", "standalone"]), default="raft",
              show_default=True)
@click.option("--flush", type=click.Choice(["async", "sync"]), default="async", show_default=True,
              help="When a node fsyncs (sync: before it acknowledges)")
@click.option("--sync/--async", "sync_replication", default=True, show_default=True,
              help="master-slave: a send waits for a slave (SYNC master) or not (ASYNC master)")
@click.option("--fresh", is_flag=True, help="Start empty (delete the cluster's old data)")
@click.option("--insecure", is_flag=True,
              help="No TLS, no authentication (the brokers warn at every start); default: secure")
@click.option("--set", "overrides", multiple=True, metavar="FIELD=VALUE",
              help="A broker config field for every node (repeatable)")
@click.option("--groups", "n_groups", type=click.IntRange(1, 8), default=1, show_default=True,
              help="Broker groups g0..g{N-1}, --nodes nodes each")
@click.option("--namesrv", "n_namesrv", type=click.IntRange(0, 9), default=0, show_default=True,
              help="Name servers (every node registers with them; clients: --namesrv)")
@data_dir_option
@json_option
def cluster_up(nodes, mode, flush, sync_replication, fresh, insecure, overrides, n_groups, n_namesrv, data_dir,
               as_json):
    """Start the nodes in the background (they outlive this command); wait until healthy."""
    if nodes is None:
        nodes = 1 if mode == "standalone" else DEFAULT_NODES
    elif mode == "standalone" and nodes != 1:
        raise click.BadParameter(f"mode standalone runs one node, not {nodes} (leave --nodes out, or give "
                                 "--mode raft or master-slave)", param_hint="'--nodes'")
    if mode == "raft" and nodes % 2 == 0:  # (etcd and KRaft's docs warn the same)
        click.echo(f"warning: a raft group of {nodes} survives no more failed nodes than one of {nodes - 1} "
                   f"({(nodes - 1) // 2}): a majority of {nodes // 2 + 1} must be up; 3 or 5 is the usual choice",
                   err=True)
    c = LocalCluster(data_dir)
    extra = parse_overrides(overrides)
    if mode == "master-slave":
        extra.setdefault("ha_replication", "sync" if sync_replication else "async")
    try:
        c.up(nodes, mode, flush, fresh, wait=True, insecure=insecure, groups=n_groups, namesrv=n_namesrv, **extra)
        st = c.status()
    except ClusterError as e:
        fail(str(e))
    if as_json:
        return emit_json(st)
    what = f"{mode} ({extra['ha_replication']}) " if mode == "master-slave" else f"{mode} "
    role = {"master-slave": "master", "raft": "leader"}.get(mode)
    for g in st["groups"]:
        leader = g["leader"]
        name = "group" if n_groups == 1 else f"group {g['name']}"
        click.echo(f"{what}{name} of {nodes} up in {c.dir}" + (f", {role} {leader}" if role and leader else ""))
    for n in c.nodes:
        click.echo(f"  {n.id}  {n.address}  pid {n.pid}  config {n.config_path}")
    for n in c.namesrvs:
        click.echo(f"  {n.id}  {n.address}  pid {n.pid}  config {n.config_path}  (name server)")
    click.echo(f"bootstrap: {','.join(c.addresses)}")
    if c.namesrvs:
        click.echo(f"namesrv: {','.join(c.namesrv_addresses)}")
    creds = c.credentials_file
    if creds is not None:
        click.echo(f"security: TLS and user admin; clients: export TIDELOG_CREDENTIALS={creds}")
    else:
        click.echo("security: OFF (--insecure): no TLS, no authentication")
    # outside the default directory the CLI does not find the cluster's credentials by itself
    env = ("" if c.dir == DEFAULT_DIR.resolve()
           else f'eval "$(tidelog cluster env --data-dir {shlex.quote(str(c.dir))})"; ')
    if c.namesrvs:
        click.echo(f"try: {env}tidelog topic create demo --namesrv {','.join(c.namesrv_addresses)} --groups all; "
                   f"tidelog produce --namesrv {','.join(c.namesrv_addresses)} --topic demo --count 1000")
    else:
        click.echo(f"try: {env}tidelog produce -b {','.join(c.addresses)} --topic demo --count 1000")


@cluster.command("status")
@data_dir_option
@json_option
def cluster_status(data_dir, as_json):
    """Every node's state, role, pid, indexes or HA offsets, and the verdict (exit 0/1/2)."""
    st = existing(data_dir).status()  # --json: the groups, and the one group's nodes on top
    if as_json:
        emit_json(st)
    else:
        print_status(st)
    sys.exit(RANK[st["verdict"]])


@cluster.command("down")
@data_dir_option
def cluster_down(data_dir):
    """Stop every node that runs (however it was started), by its pid."""
    c = existing(data_dir)
    stopped = c.down()
    rest = [n.id for n in c.nodes + c.namesrvs if n.id not in stopped]
    click.echo(f"stopped {len(stopped)} node(s) in {c.dir}" + (f": {', '.join(stopped)}" if stopped else "")
               + (f" ({', '.join(rest)} not running)" if rest else ""))


@cluster.command("env")
@data_dir_option
def cluster_env(data_dir):
    """Print shell exports for this cluster's clients: eval "$(tidelog cluster env)"."""
    c = existing(data_dir)
    click.echo(f"export TIDELOG_BOOTSTRAP={shlex.quote(','.join(c.addresses))}")
    if c.namesrv_addresses:
        click.echo(f"export TIDELOG_NAMESRV={shlex.quote(','.join(c.namesrv_addresses))}")
    creds = c.credentials_file
    if creds is not None:
        click.echo(f"export TIDELOG_CREDENTIALS={shlex.quote(str(creds))}")
    else:
        click.echo("unset TIDELOG_CREDENTIALS  # --insecure: plain TCP")


@cluster.command("bootstrap")
@data_dir_option
def cluster_bootstrap(data_dir):
    """Print the group's addresses, for -b / TIDELOG_BOOTSTRAP."""
    click.echo(",".join(existing(data_dir).addresses))
