"""`tidelog`: one command line for the broker, the client and the platform."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from broker.config import ConfigError
from ops.cli import acl_cmds, admin_cmds, client_cmds, cluster_cmds, data_cmds, platform_cmds, spark_cmds
from ops.cli.common import fail, parse_overrides, stdout_closed, stdout_gone


class _Tidelog(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            if not stdout_gone():
                raise  # another pipe (a child's stdin...): click's exit 1, as before
            stdout_closed()  # `tidelog ... | head`: quietly, exit 0 (click's own handler exits 1)


@click.group(cls=_Tidelog, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tidelog")
def cli():
    """Tidelog: a replicated message broker and the platform that runs it."""


@cli.group()
def broker():
    """Run a broker node."""


@broker.command("start")
@click.option("--config", "-c", "config_path", type=click.Path(path_type=Path), required=True,
              help="Broker YAML config (fields: see README)")
@click.option("--set", "overrides", multiple=True, metavar="FIELD=VALUE",
              help="Override a config field (repeatable)")
def broker_start(config_path, overrides):
    """Run one broker node in the foreground until SIGTERM/SIGINT."""
    from broker import config as bc
    from broker.server import DataDirInUse, run

    try:
        cfg = bc.load(config_path, parse_overrides(overrides))
        cfg.require_security()
    except ConfigError as e:
        fail(str(e), 2)
    setup_logging(cfg.log_level, cfg.log_file)
    if cfg.log_file:  # else the log itself is on stderr; with one, the terminal would show nothing at all
        click.echo(f"broker {cfg.node_id or cfg.broker_name} on {cfg.listen}: logging to {cfg.log_file}; "
                   "runs in the foreground until Ctrl-C or SIGTERM", err=True)
    try:
        run(cfg)
    except DataDirInUse as e:
        fail(str(e), 2)
    except OSError as e:
        fail(f"cannot start the broker: {e}", 2)


@cli.group()
def namesrv():
    """Run a name server (routes: which groups hold a topic, who leads each)."""


@namesrv.command("start")
@click.option("--config", "-c", "config_path", type=click.Path(path_type=Path), default=None,
              help="Name-server YAML config (fields: see README)")
@click.option("--listen", default=None, metavar="HOST:PORT", help="Listen address (default 127.0.0.1:9876)")
@click.option("--insecure", is_flag=True, help="No TLS, no authentication (warned about at start)")
@click.option("--set", "overrides", multiple=True, metavar="FIELD=VALUE",
              help="Override a config field (repeatable)")
def namesrv_start(config_path, listen, insecure, overrides):
    """Run one name server in the foreground until SIGTERM/SIGINT."""
    from broker.namesrv import config as nc
    from broker.namesrv.server import run

    extra = parse_overrides(overrides)
    if listen:
        extra["listen"] = listen
    if insecure:
        extra["insecure"] = True
    try:
        cfg = nc.load(config_path, extra) if config_path else nc.from_dict(extra, "--listen/--set")
        cfg.require_security()
    except ConfigError as e:
        fail(str(e), 2)
    setup_logging(cfg.log_level, cfg.log_file)
    if cfg.log_file:  # as `broker start`
        click.echo(f"name server {cfg.namesrv_id} on {cfg.listen}: logging to {cfg.log_file}; "
                   "runs in the foreground until Ctrl-C or SIGTERM", err=True)
    try:
        run(cfg)
    except OSError as e:
        fail(f"cannot start the name server: {e}", 2)


def setup_logging(level: str, log_file: Path | None = None) -> None:
    handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


cli.add_command(client_cmds.produce)
cli.add_command(client_cmds.consume)
cli.add_command(client_cmds.topic)
cli.add_command(admin_cmds.admin)
cli.add_command(client_cmds.query)
cli.add_command(admin_cmds.group)
cli.add_command(cluster_cmds.cluster)
for _cmd in platform_cmds.COMMANDS + data_cmds.COMMANDS + spark_cmds.COMMANDS + acl_cmds.COMMANDS:
    cli.add_command(_cmd)


class _BenchCommand(click.Command):
    def format_epilog(self, ctx, formatter):
        """The names -w takes (bench.run is imported for the help only: ~1 s of imports)."""
        from bench.run import workloads_help

        formatter.write(f"\n{workloads_help(formatter.width)}\n")


@cli.command(cls=_BenchCommand)
@click.option("--workload", "-w", "workloads", multiple=True,
              help="Run only these workloads (repeatable; default: all; names below)")
@click.option("--duration-s", type=float, default=5.0, show_default=True,
              help="Bound on each workload's measured phase")
@click.option("--messages", type=int, default=300_000, show_default=True,
              help="Bound on messages per workload")
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path("bench-data"), show_default=True)
@click.option("--reconcile-entries", type=int, default=1_000_000, show_default=True,
              help="Entries per replica for the reconcile-3replicas row")
def bench(workloads, duration_s, messages, data_dir, reconcile_entries):
    """Run the benchmark workloads: one JSON line each on stdout."""
    from bench.run import main as bench_main

    sys.exit(bench_main(list(workloads), duration_s, messages, data_dir, reconcile_entries))


@cli.command()
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path("run-data"), show_default=True)
@click.option("--messages", type=int, default=5000, show_default=True, help="Messages produced and read back")
@click.option("--drill-s", type=float, default=12.0, show_default=True, help="Seconds of the kill-leader drill")
@click.option("--broker-only", is_flag=True,
              help="Only the single-broker crash demo (produce, SIGKILL, restart, every message back)")
def demo(data_dir, messages, drill_s, broker_only):
    """The end-to-end demo behind `make run`: the whole platform on two local raft groups behind two name servers."""
    if broker_only:
        from ops.demo_broker import main as demo_main

        sys.exit(demo_main(data_dir, messages))
    from ops.demo import main as demo_main

    sys.exit(demo_main(data_dir, messages, drill_s))


@cli.command("airflow")
@click.option("--home", type=click.Path(path_type=Path), default=None,
              help="AIRFLOW_HOME (default ~/.tidelog/airflow, or $TIDELOG_AIRFLOW_HOME)")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the UI and REST API listen on")
@click.option("--port", type=int, default=8080, show_default=True, help="UI and REST API port")
@click.option("--log-port", type=int, default=8793, show_default=True,
              help="Port of the scheduler's task-log server (the triggerer's takes the next one); "
                   "unlike the UI, both listen on all interfaces: Airflow hard-codes their address")
@click.option("--ready-timeout", "ready_timeout_s", type=float, default=240.0, show_default=True,
              help="Give up if the UI and our DAGs are not up by then")
@click.option("--print-env", is_flag=True,
              help="Only print the environment (export lines) that points Airflow's own CLI at this Airflow: "
                   'eval "$(tidelog airflow --print-env)"; airflow dags test ...')
@click.option("--sql-server/--no-sql-server", default=True, show_default=True,
              help="Also run the warehouse's SQL query server ($TIDELOG_WAREHOUSE) while Airflow runs")
def airflow_cmd(home, host, port, log_port, ready_timeout_s, print_env, sql_server):
    """Airflow standalone with Tidelog's DAGs (what `make airflow` runs); Ctrl-C stops it."""
    from ops.airflow_local import default_home, exports, main as airflow_main

    if print_env:
        click.echo(exports(home or default_home()))
        return
    sys.exit(airflow_main(home or default_home(), host, port, log_port, ready_timeout_s, sql_server))


def main():
    cli(prog_name="tidelog")


if __name__ == "__main__":
    main()
