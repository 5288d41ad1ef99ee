"""Operator commands: consumer groups (offsets, lag, members) and the group's admin (status,
a master-slave promotion, a raft leadership transfer), over every broker group the
addresses belong to."""

from __future__ import annotations

import click

from broker.client import BrokerError, TidelogError, multigroup
from broker.protocol.codes import Code
from ops.cli.client_cmds import _fail_groups, _per_group, _sole, admin_call, plural
from ops.cli.common import bootstrap_option, emit_json, fail, json_option, print_table, require


@click.group("group")
def group():
    """Consumer groups: committed offsets, lag, members (like mqadmin consumerProgress)."""


@group.command("list")
@bootstrap_option
@json_option
def group_list(bootstrap, as_json):
    """Every group with committed offsets or live members: topics, members, total lag (with
    several broker groups: the lag in each)."""
    found = _per_group(multigroup.list_groups, bootstrap)
    if len(found) == 1:
        groups = _sole(found)
        if as_json:
            return emit_json([g.__dict__ for g in groups])
        if not groups:
            return click.echo("no consumer groups")
        return print_table(["group", "topics", "members", "lag"],
                           [[g.group, ",".join(g.topics), g.members, g.lag] for g in groups])
    seen: dict[str, dict] = {}  # consumer group -> {broker_name: GroupSummary}
    for b, groups in found.items():
        for g in ([] if isinstance(groups, Exception) else groups):
            seen.setdefault(g.group, {})[b] = g
    rows = [{"group": name, "topics": sorted({t for g in per.values() for t in g.topics}),
             "members": max(g.members for g in per.values()), "lag": sum(g.lag for g in per.values()),
             "groups": {b: {"topics": g.topics, "members": g.members, "lag": g.lag} for b, g in per.items()}}
            for name, per in sorted(seen.items())]
    if as_json:
        emit_json(rows)
    elif not rows:
        click.echo("no consumer groups")
    else:
        print_table(["group", "topics", "members", "lag", "lag per broker group"],
                    [[r["group"], ",".join(r["topics"]), r["members"], r["lag"],
                      ", ".join(f"{b} {g['lag']}" for b, g in r["groups"].items())] for r in rows])
    _fail_groups(found, "its consumer groups are not listed")


@group.command("describe")
@bootstrap_option
@click.argument("name")
@click.option("--topic", "-t", default=None, help="Only this topic")
@json_option
def group_describe(bootstrap, name, topic, as_json):
    """Per queue: the broker's offset, the group's committed offset, the lag, the owner;
    per member: address, last heartbeat, the queues it owns (with several broker groups: in
    each, and the lag per broker group)."""
    found = _per_group(multigroup.describe_group, bootstrap, name, topic)
    if len(found) == 1:
        d = _sole(found)
        return _emit_group(d, as_json)
    views = {b: d for b, d in found.items() if not isinstance(d, Exception)}
    absent = [b for b, d in found.items() if isinstance(d, BrokerError) and d.code == Code.SUBSCRIPTION_GROUP_NOT_EXIST]
    if not views and len(absent) == len(found):
        fail(f"SUBSCRIPTION_GROUP_NOT_EXIST: no consumer group {name!r} in any broker group "
             f"({', '.join(absent)}): see tidelog group list")
    if views:
        _emit_groups_group(name, views, absent, as_json)
    _fail_groups(found, "its queues are not shown", absent)


def _emit_group(d: dict, as_json: bool) -> None:
    if as_json:
        return emit_json(d)
    print_table(["topic", "queue", "broker offset", "committed", "lag", "owner"],
                [[q["topic"], q["queue_id"], q["broker_offset"],
                  "-" if q["committed_offset"] < 0 else q["committed_offset"],
                  "-" if q["lag"] is None else q["lag"], q["owner"] or "-"] for q in d["queues"]],
                title=f"group {d['group']}: lag {d['lag']}")
    if d["members"]:
        print_table(["member", "address", "last heartbeat", "owns"],
                    [[m["client_id"], m["address"] or "-", f"{m['last_heartbeat_ms_ago'] / 1000:.1f}s ago",
                      " ".join(f"{t}:{','.join(map(str, qs))}" for t, qs in m["owns"].items()) or "-"]
                     for m in d["members"]])
    else:
        click.echo("no live members")


def _emit_groups_group(name: str, views: dict, absent: list[str], as_json: bool) -> None:
    """A consumer group over several broker groups: the one-group fields, the lag as the total,
    each queue and member with its broker group (its offsets and members are per broker group)."""
    lag = sum(d["lag"] for d in views.values())
    each = ", ".join(f"{b} {d['lag']}" for b, d in views.items())
    if as_json:
        return emit_json({"group": name, "lag": lag, "groups": {b: {"lag": d["lag"]} for b, d in views.items()},
                          "queues": [{"broker_name": b, **q} for b, d in views.items() for q in d["queues"]],
                          "members": [{"broker_name": b, **m} for b, d in views.items() for m in d["members"]]})
    print_table(["broker group", "topic", "queue", "broker offset", "committed", "lag", "owner"],
                [[b, q["topic"], q["queue_id"], q["broker_offset"],
                  "-" if q["committed_offset"] < 0 else q["committed_offset"],
                  "-" if q["lag"] is None else q["lag"], q["owner"] or "-"]
                 for b, d in views.items() for q in d["queues"]],
                title=f"group {name}: lag {lag} over {len(views)} broker group" + ("s" if len(views) > 1 else "")
                      + f" ({each})"
                      + (f" (not on {', '.join(absent)})" if absent else ""))
    members = [(b, m) for b, d in views.items() for m in d["members"]]
    if members:
        print_table(["broker group", "member", "address", "last heartbeat", "owns"],
                    [[b, m["client_id"], m["address"] or "-", f"{m['last_heartbeat_ms_ago'] / 1000:.1f}s ago",
                      " ".join(f"{t}:{','.join(map(str, qs))}" for t, qs in m["owns"].items()) or "-"]
                     for b, m in members])
    else:
        click.echo("no live members")


@click.group()
def admin():
    """Broker administration."""


@admin.command("status")
@bootstrap_option
@json_option
def admin_status(bootstrap, as_json):
    """A broker's role, offsets, flush position, uptime and version."""
    st = admin_call(bootstrap, lambda a: a.status())
    if as_json:
        emit_json(st)
        return
    s = st["store"]
    click.echo(f"{st['broker_name']} {st['role']} v{st['version']} on {st['listen']}, up {st['uptime_s']:.0f}s, "
               f"flush {st['flush']}, {plural(st['topics'], 'topic')}, {plural(st['connections'], 'connection')}")
    print_table(["min offset", "max offset", "flushed", "first index", "next index", "segments", "writable"],
                [[s["min_offset"], s["max_offset"], s["flushed_offset"], s["first_index"], s["next_index"],
                  s["segments"], "yes" if s["writable"] else f"NO: {s['not_writable_reason']}"]], title="log")
    r = st.get("replication") or {}
    if st["mode"] == "master-slave" and r.get("role") == "master":
        click.echo(f"master of epoch {r['epoch']} ({r['ha_replication']}): max offset {r['master_max_offset']}, "
                   f"confirm {r['confirm_offset']}, {r['slave_count']} slave(s), {r['in_sync_count']} "
                   f"replica(s) in sync, "
                   + (f"{r['required_replicas']} required" if r["ha_replication"] == "sync" else
                      "answering sends at once (a failover may lose what no slave holds yet)"))
        if r.get("self_fenced"):
            click.echo(f"TAKING NO SENDS: {r['self_fenced']}")
        if r["slaves"]:
            print_table(["slave", "address", "ack offset", "lag bytes", "B/s", "in sync"],
                        [[n, sl["address"], sl["ack_offset"], sl["lag_bytes"], sl["transfer_rate_bytes_per_s"],
                          "yes" if sl["in_sync"] else "NO"] for n, sl in sorted(r["slaves"].items())])
    elif st["mode"] == "master-slave":
        click.echo(f"slave of {r.get('master') or '(none yet)'} {r.get('master_address') or ''}, epoch "
                   f"{r['epoch']}: max offset {r['max_offset']}, "
                   + (f"connected, last read {r['last_read_ms_ago']} ms ago, last report "
                      f"{r['last_write_ms_ago']} ms ago, lag {r['lag_bytes']} bytes" if r.get("connected")
                      else f"NOT connected (lag when lost: {r.get('lag_bytes')} bytes)"))


@admin.command("promote")
@bootstrap_option
@click.option("--node", required=True, help="The slave (node id) to make master")
@click.option("--force", is_flag=True,
              help="Promote even if acknowledged messages may be lost (an unclean promotion)")
@json_option
def admin_promote(bootstrap, node, force, as_json):
    """Make a slave of a master-slave group its master (failover or switchover)."""
    r = admin_call(bootstrap, lambda a: a.promote(node, force))
    if as_json:
        return emit_json(r)
    if r.get("already_master"):
        return click.echo(f"{node} is already master (epoch {r['epoch']})")
    kind = "switchover" if r["switchover"] else "failover"
    loss = r.get("may_lose")  # (None from a build before it was sent)
    bound = "" if not loss else (f": up to {loss['bytes_max']} bytes" if loss.get("bytes_max") is not None
                                 else ": no bound")
    click.echo(f"{node} is master of epoch {r['epoch']} from offset {r['start_offset']} ({kind}, "
               + ("clean)" if r["clean"] else f"UNCLEAN: acknowledged messages may be lost{bound})"))
    for p in r["problems"] + ([loss["text"]] if loss else []):
        click.echo(f"  ! {p}")
    for n, what in sorted(r["followers"].items()):
        click.echo(f"  {n}: {what}")
    for n in r["unreachable"]:
        click.echo(f"  {n}: unreachable (it finds the new master when it is back)")


@admin.command("transfer-leader")
@bootstrap_option
@click.option("--to", "target", required=True, help="The node id that should lead")
@click.option("--timeout-s", type=float, default=10.0, show_default=True,
              help="How long to wait until it leads")
def admin_transfer_leader(bootstrap, target, timeout_s):
    """Hand a raft group's leadership to a caught-up member and wait until it leads (with
    several groups' addresses: in the group that has the member)."""
    require({"--timeout-s must not be negative": timeout_s >= 0})
    try:
        name, members = multigroup.group_of(bootstrap, target)
    except ValueError as e:
        fail(f"{e}: give --to one of them")
    except TidelogError as e:
        fail(str(e))
    r = admin_call(list(members.values()), lambda a: a.transfer_leader(target)) or {}
    if r.get("already_leader"):
        return click.echo(f"{target} already leads (term {r.get('term')}): no transfer started")
    try:
        leader, term = multigroup.wait_leader(members, target, timeout_s)
    except TidelogError as e:
        fail(str(e))
    if leader == target:
        return click.echo(f"{target} leads (term {term})")
    now = f"{leader} leads (term {term})" if leader else "no member answers as leader"
    fail(f"the leadership transfer to {target} in group {name} did not complete within {timeout_s:g}s: {now} "
         f"(is {target} up and caught up? see tidelog admin status -b {members[target]}, then run it again)")
