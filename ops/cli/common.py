"""Helpers shared by the CLI commands: output, errors, progress."""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

DEFAULT_BOOTSTRAP = "127.0.0.1:10911"

err_console = Console(stderr=True)
TABLE_WIDTH_NOT_TERMINAL = 200  # piped or captured output: no folding of long ids


def print_table(columns: list[str], rows, title: str | None = None) -> None:
    """A rich table on stdout (numbers right-aligned); never used for --json output."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    out = Console(highlight=False)
    if not out.is_terminal:
        out = Console(highlight=False, width=TABLE_WIDTH_NOT_TERMINAL)
    rows = [["" if v is None else str(v) for v in r] for r in rows]
    t = Table(*columns, title=Text(title) if title else None, box=box.SIMPLE_HEAD, title_justify="left")
    for i, c in enumerate(t.columns):
        if rows and all(r[i].lstrip("-").isdigit() or r[i] in ("", "-") for r in rows):
            c.justify = "right"
    for r in rows:  # cells are data (group names, client ids), never rich markup
        t.add_row(*map(Text, r))
    out.print(t)


def _checked_bootstrap(ctx, param, value: str) -> str:
    from broker.client.connection import parse_bootstrap

    try:
        parse_bootstrap(value)
    except ValueError as e:
        fail(f"--bootstrap: {e}", 2)
    use_known_credentials(value)
    return value


def use_known_credentials(bootstrap: str) -> None:
    """No credentials in the environment: use the admin credentials that `cluster up` / `deploy`
    wrote for the cluster these addresses belong to, if any (broker/client/security.py)."""
    from broker.client import security as cs

    if any(os.environ.get(k) for k in (cs.ENV_CREDENTIALS, cs.ENV_USERNAME, cs.ENV_CA_FILE)):
        return
    from ops.security import find_credentials

    found = find_credentials(bootstrap)
    if found is not None:
        os.environ[cs.ENV_CREDENTIALS] = str(found)


def bootstrap_option(f):
    return click.option("--bootstrap", "-b", envvar="TIDELOG_BOOTSTRAP", default=DEFAULT_BOOTSTRAP,
                        show_default=True, callback=_checked_bootstrap,
                        help="Broker address(es), host:port[,host:port]")(f)


def _checked_namesrv(ctx, param, value: str | None) -> str | None:
    if not value:
        return None
    from broker.client.connection import parse_bootstrap

    try:
        parse_bootstrap(value)
    except ValueError as e:
        fail(f"--namesrv: {e}", 2)
    use_known_credentials(value)
    return value


def namesrv_option(f):
    return click.option("--namesrv", envvar="TIDELOG_NAMESRV", callback=_checked_namesrv,
                        help="Name server address(es), host:port[,host:port]: use every broker group "
                             "they know (an explicit --bootstrap wins over $TIDELOG_NAMESRV)")(f)


def use_namesrv(namesrv: str | None) -> bool:
    """Whether a command talks to the cluster through name servers: --namesrv given (or
    TIDELOG_NAMESRV set) and --bootstrap not given on the command line."""
    if not namesrv:
        return False
    ctx = click.get_current_context()
    return ctx.get_parameter_source("bootstrap") != click.core.ParameterSource.COMMANDLINE or \
        ctx.get_parameter_source("namesrv") == click.core.ParameterSource.COMMANDLINE


def json_option(f):
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text")(f)


def emit_json(obj) -> None:
    click.echo(json.dumps(obj, default=str))


def parse_overrides(overrides) -> dict:
    """--set FIELD=VALUE options as a dict (values parsed as YAML: numbers, booleans, lists)."""
    import yaml

    out = {}
    for o in overrides:
        k, sep, v = o.partition("=")
        if not sep or not k:
            fail(f"--set {o!r}: expected FIELD=VALUE, e.g. --set flush=sync", 2)
        out[k] = yaml.safe_load(v)
    return out


def require(checks: dict[str, bool]) -> None:
    """Option checks click cannot say in one line: {"--rate must be > 0": ok, ...}; the first
    that fails is the error (exit 2)."""
    for message, ok in checks.items():
        if not ok:
            fail(message, 2)


def stdout_gone() -> bool:
    """stdout is a pipe (or socket) whose reader went away: `tidelog consume --json | head`."""
    import select

    try:
        p = select.poll()
        p.register(sys.stdout.fileno(), 0)  # no events asked: only POLLERR / POLLHUP come back
        return bool(p.poll(0))
    except (OSError, ValueError):
        return False


def stdout_closed(code: int = 0):
    """End the command after its stdout's reader went away, as Unix tools do: quietly, exit 0
    (not 141, and not click's 1). What is still buffered for stdout goes to /dev/null, so
    Python's flush at exit does not print "Exception ignored ... BrokenPipeError"."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    sys.exit(code)


def fail(message: str, code: int = 1):
    """Exit non-zero with a message that names what was wrong."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


@contextmanager
def progress(total: float | None, label: str, enabled: bool = True):
    """A progress bar on stderr, only drawn when stderr is a terminal (never into stdout,
    so never into --json output; TIDELOG_NO_PROGRESS turns it off). Yields
    `tick(n=1, completed=None, note=None)`: advance by n, or set the position; `note` is
    shown after the bar (e.g. the node just done, acks so far). Safe from any thread."""
    if not enabled or not err_console.is_terminal or os.environ.get("TIDELOG_NO_PROGRESS"):
        yield lambda n=1, completed=None, note=None: None
        return
    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[note]}"),
                  TimeRemainingColumn(), console=err_console, transient=True) as p:
        task = p.add_task(label, total=total, note="")

        def tick(n=1, completed=None, note=None) -> None:
            fields = {} if note is None else {"note": note}
            if completed is None:
                p.update(task, advance=n, **fields)
            else:
                p.update(task, completed=completed, **fields)
        yield tick
