"""broker/kafka/coordinator.py under a seeded crowd of clients that behave as Kafka's do
(join, MEMBER_ID_REQUIRED, sync, heartbeat, rejoin on REBALANCE_IN_PROGRESS, leave, crash),
on a simulated clock. Checked after every step: one leader per generation, a member's
assignment is what that generation's leader gave it, two members of a generation never own a
partition twice; and after the churn stops, every live client is in one Stable generation
within the rebalance timeout plus a bound. A failing seed prints its replay line."""

import heapq
import itertools
import os
import random

import pytest

from broker.kafka import coordinator as co

SEEDS = int(os.environ.get("TIDELOG_COORD_SEEDS", "300"))
PARTS = 6
SESSION, REBALANCE = 6000, 8000


class Client:
    """A consumer as librdkafka drives the classic protocol (range assignor as the leader)."""

    def __init__(self, name):
        self.name, self.member_id, self.generation = name, "", -1
        self.state = "joining"  # joining / syncing / stable / dead / left
        self.owned: set[int] = set()
        self.waiting = None  # "join" / "sync": a call the coordinator has not answered
        self.next_heartbeat = 0


def assign(members: list[str]) -> dict[str, bytes]:
    members = sorted(members)
    return {m: bytes(p for p in range(PARTS) if p % len(members) == i) for i, m in enumerate(members)}


def run(seed: int) -> None:
    rng = random.Random(seed)
    c = co.Coordinator(co.Bounds(initial_rebalance_delay_ms=rng.choice([0, 500])))
    clients = [Client(f"c{i}") for i in range(rng.randint(1, 5))]
    leaders: dict[int, str] = {}  # generation -> leader
    given: dict[int, dict[str, bytes]] = {}  # generation -> the leader's assignment
    events: list = []  # (due, n, what, args): requests and answers in flight (each its own delay)
    count = itertools.count()
    clock = [0]

    def later(what, *args):
        heapq.heappush(events, (clock[0] + rng.randint(1, 300), next(count), what, args))

    def answers(replies):
        for r in replies:
            later("reply", r)

    def join(cl):
        cl.state, cl.waiting, cl.owned = "joining", "join", set()
        later("join", cl, cl.member_id)

    def on_reply(r):
        cl, b = r.token, r.body
        if cl.state in ("dead", "left"):
            return
        if r.api == "heartbeat":
            if cl.state == "stable" and b["generation"] == cl.generation:
                if b["error_code"] == co.UNKNOWN_MEMBER_ID:
                    cl.member_id = ""
                if b["error_code"] != co.NONE:
                    join(cl)
            return
        cl.waiting = None
        if r.api == "join":
            if b["error_code"] == co.MEMBER_ID_REQUIRED:
                cl.member_id = b["member_id"]
                join(cl)
            elif b["error_code"] == co.NONE:
                g = b["generation_id"]
                assert leaders.setdefault(g, b["leader"]) == b["leader"], f"generation {g}: two leaders"
                cl.generation, cl.member_id = g, b["member_id"]
                assignments = {}
                if b["member_id"] == b["leader"]:
                    assignments = assign([m["member_id"] for m in b["members"]])
                    assert g not in given, f"generation {g} assigned twice"
                    given[g] = assignments
                cl.state, cl.waiting = "syncing", "sync"
                later("sync", cl, cl.member_id, g, assignments)
            else:
                if b["error_code"] == co.UNKNOWN_MEMBER_ID:
                    cl.member_id = ""
                join(cl)
        elif b["error_code"] == co.NONE:
            a = b["assignment"]
            assert a == given[cl.generation].get(cl.member_id, b""), "an assignment the leader did not give"
            cl.owned, cl.state = set(a), "stable"
            cl.next_heartbeat = clock[0] + rng.randint(200, 2000)
        else:
            if b["error_code"] == co.UNKNOWN_MEMBER_ID:
                cl.member_id = ""
            join(cl)

    def arrive(what, args):
        now = clock[0]
        if what == "reply":
            return on_reply(*args)
        if what == "join":
            cl, mid = args
            return answers(c.join(cl, now, "g", mid, cl.name, "127.0.0.1", SESSION, REBALANCE, "consumer",
                                  [("range", b"m-" + cl.name.encode())]))
        if what == "sync":
            return answers(c.sync(*args[:1], now, "g", *args[1:]))
        if what == "heartbeat":
            cl, mid, gen = args
            later("reply", co.Reply(cl, "heartbeat", {"error_code": c.heartbeat(now, "g", mid, gen),
                                                         "generation": gen}))
        if what == "leave":
            answers(c.leave(now, "g", [args[0]])[1])

    def check():
        """A generation's members never own a partition twice, and a member of an older
        generation never still owns one that the current generation gave someone else."""
        stable = [cl for cl in clients if cl.state == "stable"]
        seen: dict[int, int] = {}
        for cl in sorted(stable, key=lambda cl: -cl.generation):
            for p in cl.owned:
                assert p not in seen, f"partition {p} owned by generations {seen[p]} and {cl.generation}"
                seen[p] = cl.generation

    for cl in clients:
        join(cl)
    churn_until = rng.randint(5_000, 60_000)
    tick_at = 0
    while clock[0] < churn_until + REBALANCE + SESSION + 20_000:
        step_to = min(events[0][0] if events else tick_at, tick_at)
        clock[0] = step_to
        if events and events[0][0] <= step_to:
            _, _, what, args = heapq.heappop(events)
            arrive(what, args)
        else:
            tick_at += rng.randint(10, 400)
            now = clock[0]
            if now < churn_until and rng.random() < 0.03:
                kind = rng.choice(["crash", "leave", "new", "restart"])
                live = [cl for cl in clients if cl.state not in ("dead", "left")]
                if kind == "new" or not live:
                    cl = Client(f"c{len(clients)}")
                    clients.append(cl)
                    join(cl)
                else:
                    cl = rng.choice(live)
                    cl.state = "dead" if kind in ("crash", "restart") else "left"
                    if kind == "leave" and cl.member_id:
                        later("leave", cl.member_id)
                    if kind == "restart":  # a new process: a new member
                        n = Client(cl.name + "r")
                        clients.append(n)
                        join(n)
            for cl in clients:
                if cl.state == "stable" and now >= cl.next_heartbeat:
                    later("heartbeat", cl, cl.member_id, cl.generation)
                    cl.next_heartbeat = now + rng.randint(500, 2000)
            answers(c.tick(now))
        check()
    live = [cl for cl in clients if cl.state not in ("dead", "left")]
    if live:
        gens = {cl.generation for cl in live}
        assert all(cl.state == "stable" for cl in live) and len(gens) == 1, \
            f"not settled: {[(cl.name, cl.state, cl.generation) for cl in live]}"
        owned = sorted(p for cl in live for p in cl.owned)
        assert owned == list(range(PARTS)), f"partitions owned after settling: {owned}"
        assert set(c.groups["g"].members) == {cl.member_id for cl in live}, "ghost members"


@pytest.mark.parametrize("seed", range(SEEDS))
def test_seeded_crowd(seed):
    try:
        run(seed)
    except AssertionError as e:
        raise AssertionError(f"seed {seed}: {e} (replay: TIDELOG_COORD_SEEDS=... pytest "
                             f"'tests/unit/test_kafka_coordinator.py::test_seeded_crowd[{seed}]')") from None


def test_a_rebalance_that_does_not_wait_for_every_member_is_caught(monkeypatch):
    """Mutation check: a rebalance that completes as soon as anyone rejoins (dropping the
    members that have not yet) forms a generation while the old one's members still hold
    their partitions; the crowd catches it within a few seeds."""
    real = co.Coordinator._maybe_complete

    def hasty(self, g, now_ms, timed_out=False):
        return real(self, g, now_ms, timed_out=True)
    monkeypatch.setattr(co.Coordinator, "_maybe_complete", hasty)
    for seed in range(100):
        try:
            run(seed)
        except AssertionError as e:
            print(f"caught at seed {seed}: {e}")
            return
    raise AssertionError("100 seeds did not catch a rebalance that does not wait for its members")
