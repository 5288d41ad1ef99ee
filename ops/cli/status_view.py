"""The status of a cluster as text: one table per group under its verdict (`tidelog cluster
status`, `tidelog status`). Takes what ops.health.status returns; rows may carry a `pid`.
Every row shows its node's version (the one its STATUS answers): during a rolling upgrade the
table says which nodes run the new build yet.

    raft          term, begin/end/committed index, and each follower's lag (entries)
    master-slave  epoch, max offset, and per slave (from the master's view, like `mqadmin
                  haStatus`): ack offset, lag bytes, transfer rate, in sync
    name servers  (with a namesrv section) per name server its state and, per group, the leader
                  it routes to: id, term, nodes registered, seconds since the leader registered
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

WIDTH_NOT_A_TERMINAL = 200  # piped or captured: do not squeeze the table into 80 columns

LEAD_ROLE = {"raft": "leader", "master-slave": "master", "standalone": "node"}


def _v(x) -> str:
    return "-" if x is None else str(x)


def _raft_cells(row: dict, leader: dict | None) -> list[str]:
    r = row.get("replication") or {}
    lag = None if leader is None or row is leader else row.get("lag")
    return [_v(row.get("term")), _v(r.get("begin_index")), _v(row.get("end_index")),
            _v(row.get("commit_index")), _v(lag)]


def _ha_cells(row: dict, leader: dict | None) -> list[str]:
    s = ((leader or {}).get("slaves") or {}).get(row["id"]) or {}
    in_sync = "-" if not s else "yes" if s.get("in_sync") else "no"
    return [_v(row.get("epoch")), _v(row.get("max_offset")), _v(s.get("ack_offset")),
            _v(s.get("lag_bytes", row.get("lag_bytes"))), _v(s.get("transfer_rate_bytes_per_s")), in_sync]


COLUMNS = {
    "raft": (["term", "begin", "end", "committed", "lag"], _raft_cells),
    "master-slave": (["epoch", "max offset", "ack offset", "lag bytes", "rate B/s", "in sync"], _ha_cells),
    "standalone": (["max offset"], lambda row, leader: [_v(row.get("max_offset"))]),
}


def group_table(g: dict) -> Table:
    rows = g["nodes"]
    leader = next((r for r in rows if r["id"] == g.get("leader")), None)
    names, cells = COLUMNS[g["mode"]]
    show_host = any(r.get("host") not in (None, r["id"]) for r in rows)
    show_pid = any("pid" in r for r in rows)
    t = Table(box=None, pad_edge=False, header_style="bold")
    for name in ["node"] + ["host"] * show_host + ["address", "state", "role", "version"] + ["pid"] * show_pid:
        t.add_column(name)
    for name in names:
        t.add_column(name, justify="right")
    for r in rows:
        t.add_row(*map(Text, [r["id"], *[_v(r.get("host"))] * show_host, r["address"], r["state"],
                              _v(r.get("role")), _v(r.get("version")), *[_v(r.get("pid"))] * show_pid,
                              *cells(r, leader)]))
    return t


def namesrv_table(ns: dict, groups: list[str]) -> Table:
    rows = ns["servers"]
    show_pid = any("pid" in r for r in rows)
    t = Table(box=None, pad_edge=False, header_style="bold")
    for name in ["name server", "address", "state"] + ["pid"] * show_pid + groups:
        t.add_column(name)
    for r in rows:
        cells = []
        for g in groups:
            seen = (r.get("groups") or {}).get(g)
            cells.append("-" if r["state"] != "up" else "missing" if seen is None else
                         f"{seen['leader_id'] or 'no leader'} (term {seen['term']}, {seen['nodes']} nodes, "
                         f"{_v(seen['age_s'])} s ago)")
        t.add_row(*map(Text, [r["id"], r["address"], r["state"], *[_v(r.get("pid"))] * show_pid, *cells]))
    return t


def print_status(st: dict, console: Console | None = None) -> None:
    console = console or Console()
    if not console.is_terminal:
        console.width = WIDTH_NOT_A_TERMINAL
    where = f" in {escape(st['dir'])}" if st.get("dir") else ""
    console.print(f"cluster {st['cluster']} ({st['provider']}){where}: [bold]{st['verdict']}[/bold]")
    for g in st["groups"]:
        lead = f", {LEAD_ROLE[g['mode']]} {g['leader']}" if g.get("leader") else ""
        console.print(f"group {g['name']} ({g['mode']}): {g['verdict']}{lead}")
        console.print(group_table(g))
        r = next((r for r in g["nodes"] if r["id"] == g.get("leader")), None)
        if g["mode"] == "master-slave" and r is not None:
            repl = r.get("replication") or {}
            slaves = repl.get("slave_count") or 0
            console.print(f"  master {r['id']}: {slaves} slave{'' if slaves == 1 else 's'}; replicas in sync "
                          f"{repl.get('in_sync_count')} of {slaves + 1}, {repl.get('required_replicas')} required "
                          f"({repl.get('ha_replication')} replication)")
        for p in g.get("problems") or []:
            console.print(f"  problem: {p}", markup=False)
    ns = st.get("namesrv")
    if ns:
        console.print(f"name servers: {ns['verdict']} (below: the leader each name server routes each group to)")
        console.print(namesrv_table(ns, [g["name"] for g in st["groups"]]))
        for p in ns.get("problems") or []:
            console.print(f"  problem: {p}", markup=False)
