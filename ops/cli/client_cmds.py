"""Client commands: produce, consume, topic, admin status, query."""

from __future__ import annotations

import asyncio
import sys
import time

import click
import uvloop

from broker.client import Admin, BrokerError, ConnectError, Consumer, Producer, TidelogError
from broker.client import multigroup
from broker.client.connection import parse_bootstrap
from broker.client.cluster import ClusterConsumer, ClusterProducer, NameServerUnavailable
from broker.protocol.codes import Code
from broker.protocol.query import TIME_MAX_MS
from ops.cli.common import (bootstrap_option, emit_json, fail, json_option, namesrv_option, print_table, progress,
                            require, stdout_closed, use_namesrv)


PERM_NAMES = {6: "rw", 4: "r", 2: "w"}


def plural(n: int, word: str) -> str:
    """ "1 message", "2 messages", "0 messages"."""
    return f"{n} {word}" + ("" if n == 1 else "s")


def _body_text(body: bytes) -> str:
    try:
        return body.decode()
    except UnicodeDecodeError:
        return "0x" + body.hex()


def admin_call(bootstrap, fn):
    """fn(Admin) with the errors turned into a clear exit."""
    with Admin(bootstrap) as a:
        try:
            return fn(a)
        except TidelogError as e:
            fail(str(e))


def message_dict(m) -> dict:
    return {"topic": m.topic, "queue_id": m.queue_id, "queue_offset": m.queue_offset,
            "msg_id": m.msg_id, "keys": m.keys, "tags": m.tags, "properties": m.properties,
            "born_ts_ms": m.born_ts_ms, "store_ts_ms": m.store_ts_ms, "index": m.index,
            "body": _body_text(m.body), **({"broker_name": m.broker_name} if m.broker_name else {})}


@click.command()
@bootstrap_option
@namesrv_option
@click.option("--topic", "-t", required=True, help="The topic to send to")
@click.option("--count", "-n", type=int, help="Send N generated messages (default: one per stdin line)")
@click.option("--size", "-s", type=int, default=1024, show_default=True, help="Body size with --count")
@click.option("--key", "-k", help="Business key (with --count: a key prefix, numbered)")
@click.option("--tags", help="The messages' tag")
@click.option("--window", "-w", type=int, default=64, show_default=True,
              help="Acknowledged sends kept in flight")
@json_option
def produce(bootstrap, namesrv, topic, count, size, key, tags, window, as_json):
    """Send messages and wait for each acknowledgement."""
    require({"--count must not be negative": count is None or count >= 0,
             "--size must not be negative": size >= 0, "--window must be at least 1": window >= 1})
    if count is None:
        bodies = (line.rstrip("\n").encode() for line in sys.stdin)
        total = None
    else:
        filler = (b"tidelog-" * (size // 8 + 1))[:size]
        bodies = ((b"%012d" % i + filler)[:max(size, 12)] for i in range(count))
        total = count
    try:
        if use_namesrv(namesrv):
            make = lambda: ClusterProducer(namesrv)
        elif groups := spanned_groups(bootstrap):
            make = lambda: ClusterProducer(bootstrap, names=multigroup.BootstrapRoutes(groups))
        else:
            make = lambda: Producer(bootstrap)
        summary = uvloop.run(_produce(make, topic, bodies, total, key, tags, max(1, window),
                                      count is not None))
    except TidelogError as e:
        fail(f"{e}{_namesrv_hint(e)}")
    try:
        if as_json:
            emit_json(summary)
        else:
            dups = summary["possible_duplicates"]
            click.echo(f"sent {plural(summary['acked'], 'message')} to {topic} in {summary['wall_s']:.2f}s "
                       f"({summary['msgs_per_s']:.0f} msg/s), {plural(summary['errors'], 'error')}"
                       + (f", {dups} resent after an unknown outcome (possible duplicates)" if dups else ""))
    except BrokenPipeError:  # nobody reads the summary (`| head -0`): the exit code still tells
        stdout_closed(1 if summary["errors"] else 0)
    if summary["errors"]:
        sys.exit(1)


def spanned_groups(bootstrap) -> dict[str, list[str]] | None:
    """The broker groups the addresses belong to when there are several (`tidelog cluster env`
    of `cluster up --groups N` names every node of every group): produce and consume then use
    every group, as with name servers; None for one group's addresses (or when none answers:
    the one-group client says what is wrong, as it always did)."""
    if len(parse_bootstrap(bootstrap)) < 2:
        return None
    try:
        groups, silent = multigroup.answering(multigroup.bootstrap_groups(bootstrap))
    except TidelogError:
        return None
    if silent:  # a stale address, or a group that is down: not a group anyone saw
        click.echo(f"warning: no answer from {', '.join(silent)}, and no broker that answered names "
                   f"{'them' if len(silent) > 1 else 'it'}: a broker group there (if any) is left out", err=True)
    return groups if len(groups) > 1 else None


def _namesrv_hint(e) -> str:
    """The next step when no name server answers: the brokers' own addresses."""
    if isinstance(e, NameServerUnavailable):
        return ": give the brokers instead with -b host:port,... (or TIDELOG_BOOTSTRAP, with TIDELOG_NAMESRV unset)"
    return ""


async def _produce(make_producer, topic, bodies, total, key, tags, window, numbered_keys):
    """Send every body, `window` at a time; the summary counts the messages acknowledged after
    a resend whose first attempt's outcome was unknown (possible_duplicates: they may be stored
    twice, under one msg_id)."""
    acked = errors = dups = 0
    first_error = None
    t0 = time.perf_counter()
    it = iter(enumerate(bodies))
    async with make_producer() as p:
        with progress(total, f"produce {topic}", enabled=total is not None) as advance:
            async def worker():
                nonlocal acked, errors, dups, first_error
                for i, body in it:
                    k = f"{key}-{i}" if key and numbered_keys else key
                    try:
                        r = await p.send_async(topic, body, key=k, tags=tags)
                        acked += 1
                        dups += bool(r.possible_duplicate)
                    except ConnectError:
                        raise  # no broker takes the connection: every other send would fail too
                    except TidelogError as e:
                        errors += 1
                        first_error = first_error or str(e)
                    advance()
            await asyncio.gather(*(worker() for _ in range(window)))
    wall = time.perf_counter() - t0
    if first_error:
        click.echo(f"first error: {first_error}", err=True)
    return {"topic": topic, "acked": acked, "errors": errors, "possible_duplicates": dups, "wall_s": round(wall, 3),
            "msgs_per_s": round(acked / wall, 1) if wall else 0.0}


@click.command()
@bootstrap_option
@namesrv_option
@click.option("--topic", "-t", required=True, help="The topic to read")
@click.option("--group", "-g", required=True, help="Consumer group (its offsets are committed)")
@click.option("--count", "-n", type=int, help="Stop after N messages")
@click.option("--idle-timeout-s", type=float, default=5.0, show_default=True,
              help="Stop when nothing arrives for this long")
@click.option("--from", "from_where", type=click.Choice(["earliest", "latest"]), default="earliest",
              show_default=True, help="Where a group with no committed offset starts")
@click.option("--tags", default="*", show_default=True, help='Tag filter, e.g. "a||b"')
@click.option("--quiet", "-q", is_flag=True, help="Do not print messages (progress and summary only)")
@json_option
def consume(bootstrap, namesrv, topic, group, count, idle_timeout_s, from_where, tags, quiet, as_json):
    """Read messages as a member of a consumer group, committing offsets."""
    got = 0
    closed = False  # stdout's reader went away (`| head`): stop, commit what was printed, leave
    t0 = time.perf_counter()
    try:
        if use_namesrv(namesrv):
            make = lambda: ClusterConsumer(namesrv, group, topic, from_where=from_where, tags=tags)
        elif groups := spanned_groups(bootstrap):
            make = lambda: ClusterConsumer(bootstrap, group, topic, from_where=from_where, tags=tags,
                                           names=multigroup.BootstrapRoutes(groups))
        else:
            make = lambda: Consumer(bootstrap, group, topic, from_where=from_where, tags=tags)
        with make() as c, \
                progress(count, f"consume {topic}", enabled=quiet and count is not None) as advance:
            last = time.monotonic()
            while not closed and (count is None or got < count):
                want = 500 if count is None else min(500, count - got)
                msgs = c.poll(timeout_ms=200, max_messages=want)
                if not msgs:
                    if time.monotonic() - last >= idle_timeout_s:
                        break
                    continue
                last = time.monotonic()
                shown = len(msgs) if quiet else _print_messages(msgs, as_json)
                if shown < len(msgs):
                    closed = True
                    _give_back(c, msgs[shown:])
                got += shown
                advance(shown)
            c.commit()
    except BrokerError as e:
        hint = f" (create it with tidelog topic create {topic})" if e.code == Code.TOPIC_NOT_EXIST else ""
        fail(f"{e}{hint}")
    except TidelogError as e:
        fail(f"{e}{_namesrv_hint(e)}")
    wall = time.perf_counter() - t0
    if quiet or not as_json:
        click.echo(f"consumed {plural(got, 'message')} from {topic} as {group} in {wall:.2f}s", err=not quiet)
    if closed:
        stdout_closed()
    if count is not None and got < count:
        fail(f"only {got} of {count} messages arrived within idle timeout {idle_timeout_s}s")


def _print_messages(msgs, as_json: bool) -> int:
    """Print each message (a JSON line, or group/queue:offset msg_id body); how many were
    written: fewer when stdout's reader went away."""
    for i, m in enumerate(msgs):
        try:
            if as_json:
                emit_json(message_dict(m))
            else:
                where = f"{m.broker_name}/" if m.broker_name else ""
                click.echo(f"{where}{m.queue_id}:{m.queue_offset} {m.msg_id} {_body_text(m.body)}")
        except BrokenPipeError:
            return i
    return len(msgs)


def _give_back(c, msgs) -> None:
    """poll() returned `msgs` but they were never printed: move each of their queues back to the
    first of them, so that the commit stops before them and the group's next reader gets them."""
    first: dict[tuple, int] = {}
    for m in msgs:  # in order per queue: the first seen is the lowest offset
        first.setdefault((m.broker_name, m.queue_id), m.queue_offset)
    for (group, queue_id), offset in first.items():
        try:
            c.seek(queue_id if group is None else (group, queue_id), offset)
        except ValueError:
            pass  # a rebalance took the queue meanwhile (and committed it): nothing left to move


@click.group()
def topic():
    """Create, list and describe topics."""


@topic.command("create")
@bootstrap_option
@namesrv_option
@click.option("--groups", help="With name servers: the broker groups to create it on, g0,g1 or all "
                               "(default all); --queues is per group")
@click.argument("name")
@click.option("--queues", "-q", type=int, default=4, show_default=True, help="Write queues")
@click.option("--read-queues", type=int, help="Read queues (default: = --queues)")
@click.option("--perm", type=click.Choice(["rw", "r", "w"]), default="rw", show_default=True,
              help="What clients may do: read and write, read only, write only")
@click.option("--update", is_flag=True, help="Change an existing topic")
@click.option("--force", is_flag=True, help="With --update: shrink even if unconsumed messages would "
                                            "reach no consumer (refused otherwise)")
@json_option
def topic_create(bootstrap, namesrv, groups, name, queues, read_queues, perm, update, force, as_json):
    """Create a topic (or with --update, change its queues or permission)."""
    p = {v: k for k, v in PERM_NAMES.items()}[perm]
    require({"--force goes with --update": update or not force})
    if use_namesrv(namesrv):
        return _topic_create_on_groups(namesrv, groups, name, queues, read_queues, p, update, force, as_json)
    require({"--groups needs --namesrv (or TIDELOG_NAMESRV)": not groups})
    spanned = spanned_groups(bootstrap)
    if spanned:  # several groups' addresses (`tidelog cluster env` of --groups N): on each, as
        # with name servers -- produce and consume use every group, so must the topic
        out = multigroup.on_groups(spanned,
                                   lambda a: a.create_topic(name, queues, read_queues, p, update, force))
        return _report_created(out, name, update, as_json)
    with Admin(bootstrap) as a:
        try:
            info = a.create_topic(name, queues, read_queues, p, update, force)
        except TidelogError as e:
            fail(f"{e}{_force_hint(e)}")
    if as_json:
        emit_topic(info)
    else:
        click.echo(f"topic {info.topic}: {info.write_queues} write / {info.read_queues} read queues")


def _topic_create_on_groups(namesrv, groups, name, queues, read_queues, perm, update, force, as_json):
    from broker.client import cluster

    chosen = None if groups in (None, "", "all") else [g.strip() for g in groups.split(",") if g.strip()]
    try:
        out = cluster.create_topic(namesrv, name, queues, read_queues, perm, update, chosen, force=force)
    except (TidelogError, ValueError) as e:
        fail(str(e))
    _report_created(out, name, update, as_json)


def _report_created(out: dict, name: str, update: bool, as_json: bool) -> None:
    """Each group's TopicInfo or error; exit 1 naming the groups it failed on."""
    failed = {g: r for g, r in out.items() if isinstance(r, Exception)}
    if as_json:
        emit_json({g: ({"error": str(r)} if isinstance(r, Exception) else
                       {"write_queues": r.write_queues, "read_queues": r.read_queues}) for g, r in out.items()})
    else:
        for g, r in out.items():
            click.echo(f"{g}: " + (f"failed: {r}{_force_hint(r)}" if isinstance(r, Exception) else
                                    f"topic {name}: {r.write_queues} write / {r.read_queues} read queues"))
    if failed and update:
        fail(f"topic {name} updated on {', '.join(sorted(set(out) - set(failed))) or 'no group'}, not on "
             f"{', '.join(sorted(failed))}: see why above" + next(filter(None, map(_force_hint, failed.values())), ""))
    if failed:
        fail(f"topic {name} created on {', '.join(sorted(set(out) - set(failed))) or 'no group'}, not on "
             f"{', '.join(sorted(failed))}: run it again with --update for those")


def _force_hint(e) -> str:
    """The next step after an update the broker refused because it would hide unconsumed
    messages (its words: "... or force it", "... would reach no consumer")."""
    if isinstance(e, BrokerError) and e.code == Code.BAD_REQUEST and (
            "force it" in str(e) or "would reach no consumer" in str(e)):
        return " (or give --force to do it anyway)"
    return ""


def emit_topic(info) -> None:
    emit_json(info.__dict__ | {"queues": [q.__dict__ for q in info.queues]})


@topic.command("list")
@bootstrap_option
@json_option
def topic_list(bootstrap, as_json):
    """Every topic of each broker group the addresses belong to (--json with several: the
    groups holding each)."""
    found = _per_group(multigroup.list_topics, bootstrap)
    if len(found) == 1:
        names = _sole(found)
        if as_json:
            return emit_json(names)
        for n in names:
            click.echo(n)
        return
    holders: dict[str, list[str]] = {}
    for g, names in found.items():
        for n in ([] if isinstance(names, Exception) else names):
            holders.setdefault(n, []).append(g)
    if as_json:
        emit_json([{"topic": n, "groups": gs} for n, gs in sorted(holders.items())])
    else:
        for n in sorted(holders):
            click.echo(n)
    _fail_groups(found, "its topics are not listed")


def _per_group(ask, bootstrap, *args) -> dict:
    """ask(bootstrap, *args) of broker/client/multigroup.py: {broker_name: answer or error}."""
    try:
        return ask(bootstrap, *args)
    except TidelogError as e:
        fail(str(e))


def _sole(found: dict):
    """The answer of the one broker group in `found` (exit 1 with its error)."""
    (answer,) = found.values()
    if isinstance(answer, Exception):
        fail(str(answer))
    return answer


def _fail_groups(found: dict, what: str, absent=()) -> None:
    """Exit 1 naming each broker group whose answer was an error (not one in `absent`)."""
    failed = {g: r for g, r in found.items() if isinstance(r, Exception) and g not in absent}
    if failed:
        fail("; ".join(f"group {g}: {e}" for g, e in failed.items()) + f" ({what})")


@topic.command("describe")
@bootstrap_option
@click.argument("name")
@json_option
def topic_describe(bootstrap, name, as_json):
    """Every queue of the topic, with its min and max offset, in each broker group the
    addresses belong to (like mqadmin topicStatus)."""
    try:
        found = multigroup.describe_topic(bootstrap, name)
    except TidelogError as e:
        fail(str(e))
    if len(found) == 1:
        info = _sole(found)
        if as_json:
            return emit_topic(info)
        return print_table(["queue", "min offset", "max offset", "messages"],
                           [[q.queue_id, q.min_offset, q.max_offset, q.max_offset - q.min_offset] for q in info.queues],
                           title=f"topic {info.topic}: {info.write_queues} write / {info.read_queues} read queues, "
                                 f"perm {PERM_NAMES.get(info.perm, info.perm)}")
    infos = {g: r for g, r in found.items() if not isinstance(r, Exception)}
    absent = [g for g, r in found.items() if isinstance(r, BrokerError) and r.code == Code.TOPIC_NOT_EXIST]
    failed = {g: r for g, r in found.items() if g not in infos and g not in absent}
    if not infos and not failed:
        fail(f"{found[absent[0]]} in any group ({', '.join(absent)})")
    if infos:
        _emit_groups_topic(name, infos, absent, as_json)
    if failed:
        fail("; ".join(f"group {g}: {e}" for g, e in failed.items()) + " (its queues are not shown)")


def _emit_groups_topic(name: str, infos: dict, absent: list[str], as_json: bool) -> None:
    """A topic on several groups: the one-group fields as totals, each queue with its group."""
    writes, reads = sum(i.write_queues for i in infos.values()), sum(i.read_queues for i in infos.values())
    if as_json:
        return emit_json({"topic": name, "write_queues": writes, "read_queues": reads,
                          "groups": {g: {"write_queues": i.write_queues, "read_queues": i.read_queues, "perm": i.perm}
                                     for g, i in infos.items()},
                          "queues": [{"broker_name": g, **q.__dict__} for g, i in infos.items() for q in i.queues]})
    click.echo(f"topic {name}: {writes} write / {reads} read queues over {len(infos)} group"
               + ("s" if len(infos) > 1 else "") + (f" (not on {', '.join(absent)})" if absent else ""))
    for g, i in infos.items():
        click.echo(f"  {g}: {i.write_queues} write / {i.read_queues} read queues, "
                   f"perm {PERM_NAMES.get(i.perm, i.perm)}")
    print_table(["group", "queue", "min offset", "max offset", "messages"],
                [[g, q.queue_id, q.min_offset, q.max_offset, q.max_offset - q.min_offset]
                 for g, i in infos.items() for q in i.queues])


@click.command()
@bootstrap_option
@click.option("--topic", "-t", help="Topic (with --key)")
@click.option("--key", "-k", help="Find messages by business key")
@click.option("--id", "msg_id", help="Find a message by its msg_id")
@click.option("--begin-ms", type=int, default=0, help="Stored at or after (ms since the epoch)")
@click.option("--end-ms", type=int, default=TIME_MAX_MS, help="Stored at or before (ms since the epoch)")
@click.option("--max", "max_results", type=int, default=32, show_default=True)
@json_option
def query(bootstrap, topic, key, msg_id, begin_ms, end_ms, max_results, as_json):
    """Look messages up by key (needs --topic) or by message id, within a time range."""
    if bool(key) == bool(msg_id) or (key and not topic):
        fail("give --topic and --key, or --id", 2)
    answers = _per_group(multigroup.per_group, bootstrap,
                         lambda a: a.query_by_key(topic, key, begin_ms, end_ms, max_results) if key
                         else [m for m in [a.query_by_id(msg_id, begin_ms, end_ms)] if m])
    if len(answers) == 1:
        (found,) = answers.values()
        if isinstance(found, Exception):
            fail(str(found))
    else:  # every group's, each message with its group
        found = sorted((m._replace(broker_name=g) for g, r in answers.items() if not isinstance(r, Exception)
                        for m in r), key=lambda m: m.store_ts_ms)[:max_results]
    if not found and key and not any(isinstance(r, Exception) for r in answers.values()):
        missing = _topic_missing(bootstrap, topic)
        if missing:
            fail(f"{missing}, so no message has key {key!r} in it (tidelog topic list shows the topics)")
    for m in found:
        if as_json:
            emit_json(message_dict(m))
        else:
            where = f"{m.broker_name}/" if m.broker_name else ""  # several groups: queue ids repeat
            click.echo(f"{where}{m.topic}/{m.queue_id}:{m.queue_offset} {m.msg_id} {_body_text(m.body)}")
    _fail_groups(answers, "its messages are not looked up")
    if not found:
        what = f"no message with key {key!r} in topic {topic!r}" if key else f"no message with id {msg_id}"
        fail(f"{what} stored {_time_range(begin_ms, end_ms)}")


def _topic_missing(bootstrap, topic: str) -> str | None:
    """The broker's TOPIC_NOT_EXIST words when no group of `bootstrap` holds `topic`, else None."""
    found = _per_group(multigroup.describe_topic, bootstrap, topic)
    if all(isinstance(r, BrokerError) and r.code == Code.TOPIC_NOT_EXIST for r in found.values()):
        e = next(iter(found.values()))
        return f"{e}" + (f" in any group ({', '.join(found)})" if len(found) > 1 else "")
    return None


def _time_range(begin_ms: int, end_ms: int) -> str:
    """ "at any time", "from T", "until T" or "from T to T" (UTC, ISO 8601) for a query's range."""
    from datetime import datetime, timezone

    def iso(ms: int) -> str:
        return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds") + f" ({ms} ms)"
    if begin_ms <= 0 and end_ms >= TIME_MAX_MS:
        return "at any time"
    if end_ms >= TIME_MAX_MS:
        return f"from {iso(begin_ms)}"
    return (f"from {iso(begin_ms)} " if begin_ms > 0 else "") + f"until {iso(end_ms)}"
