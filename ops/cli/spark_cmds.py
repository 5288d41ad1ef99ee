"""`tidelog spark up|down|status`: a Spark standalone cluster on loopback (ops/spark_cluster.py)
for `tidelog reconcile --master` and the nightly DAG's Spark master field."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from ops.cli.common import emit_json, fail, json_option
from ops.spark_cluster import DEFAULT_DIR, READY_TIMEOUT_S, SparkCluster, SparkClusterError

NOT_RUNNING = 2  # the exit code of `status` when no cluster runs


def data_dir_option(f):
    return click.option("--data-dir", type=click.Path(path_type=Path), default=DEFAULT_DIR, show_default=True,
                        envvar="TIDELOG_SPARK_DIR",
                        help="The cluster's directory: spark.json (pids, ports), the processes' logs")(f)


@click.group()
def spark():
    """A Spark standalone cluster on loopback (one master, two workers) for the reconcile job."""


@spark.command("up")
@click.option("--port", type=int, default=None,
              help="The master's port on 127.0.0.1 (default 7077 when free, else a free one)")
@click.option("--webui-port", type=int, default=None,
              help="The master's web UI port (default 8080 when free, else a free one)")
@click.option("--timeout", "timeout_s", type=float, default=READY_TIMEOUT_S, show_default=True,
              help="Seconds to wait for both workers to register")
@data_dir_option
@json_option
def spark_up(port, webui_port, timeout_s, data_dir, as_json):
    """Start the master and two workers (1 core, 1 GiB each) in the background; wait until
    both workers are ALIVE; print the master URL."""
    c = SparkCluster(data_dir)
    if not as_json:
        click.echo(f"starting a Spark master and 2 workers in {c.dir} (three JVMs: 10-20 s)...", err=True)
    try:
        st = c.up(port, webui_port, timeout_s=timeout_s)
    except SparkClusterError as e:
        fail(str(e))
    if as_json:
        return emit_json(st)
    click.echo(f"Spark master {st['master_url']} {'up' if st['started'] else 'already running'} in {c.dir}: "
               f"{st['workers_alive']} workers ALIVE, {st['cores']} cores; web UI {st['webui']}")
    for p in st["processes"]:
        click.echo(f"  {p['name']:<9} pid {p['pid']:<8} log {p['log']}")
    click.echo(f"executors run {st['python']}; point the reconcile at it:\n"
               f"export TIDELOG_SPARK_MASTER={shlex.quote(st['master_url'])}\n"
               f"stop it: tidelog spark down --data-dir {shlex.quote(str(c.dir))}")


@spark.command("status")
@data_dir_option
@json_option
def spark_status(data_dir, as_json):
    """The master URL and the workers alive; exit 0 all up, 1 degraded (or processes left
    without a master), 2 not running."""
    st = SparkCluster(data_dir).status()
    left = any(p["alive"] for p in st.get("processes", []))
    code = (0 if st["workers_alive"] >= st["workers"] else 1) if st["running"] else 1 if left else NOT_RUNNING
    if as_json:
        emit_json(st)
    elif not st["running"]:
        click.echo(st["reason"])
    else:
        click.echo(f"Spark master {st['master_url']}: {st['workers_alive']} of {st['workers']} workers ALIVE, "
                   f"{st['cores']} cores; web UI {st['webui']}")
        for p in st["processes"]:
            click.echo(f"  {p['name']:<9} pid {p['pid']:<8} {'running' if p['alive'] else 'stopped'}")
    sys.exit(code)


@spark.command("down")
@data_dir_option
@json_option
def spark_down(data_dir, as_json):
    """Stop every process `spark up` started, by its recorded pid (SIGTERM, then SIGKILL)."""
    stopped = SparkCluster(data_dir).down()
    if as_json:
        return emit_json({"stopped": stopped})
    if not stopped:
        click.echo(f"nothing to stop: no Spark cluster runs from {Path(data_dir).expanduser()}")
        return
    click.echo("stopped the Spark master and workers: "
               + ", ".join(f"{p['name']} (pid {p['pid']}{', SIGKILL' if p['killed'] else ''})" for p in stopped))


COMMANDS = [spark]
