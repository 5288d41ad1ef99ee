"""broker/client/cluster.py's rules with stand-in group producers and name servers (the real
ones: tests/integration/test_namesrv_clients.py): which group a send goes to, when it moves to
another group, what a result says, and that a known route outlives the name servers."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from broker.client import cluster, namesrv_client
from broker.client.errors import ConnectError, SendError
from broker.client.outcomes import SendResult
from broker.protocol import namesrv as ns
from broker.protocol.codes import Code


def route(*names, queues=2):
    return ns.TopicRoute("t", 1, True, [ns.GroupRoute(n, queues, queues, 6, f"{n}-leader:1", 1, [])
                                        for n in names])


class FakeGroupProducer:
    """A group's Producer: answers each send by `script[group]` (a result or an error)."""
    script: dict = {}
    sent: list = []
    ids: list = []

    def __init__(self, addresses, **kw):
        self.addresses = [tuple(a.split(":")) for a in addresses]
        self.group = addresses[0].split("-")[0]

    def send_nowait(self, topic, body, key, tags, properties, queue_id, flags, msg_id):
        f = asyncio.get_running_loop().create_future()
        FakeGroupProducer.sent.append((self.group, queue_id, body))
        FakeGroupProducer.ids.append(msg_id)
        outcome = self.script.get(self.group, "ok")
        if outcome == "ok":
            f.set_result(SendResult(msg_id.hex(), topic, queue_id, 0, 0, 0, 0))
        else:  # a new error each time, as a real producer makes
            f.set_exception(SendError(outcome.code, outcome.args[0].split(": ", 1)[-1], stored=outcome.stored,
                                      attempts=outcome.attempts))
        return f

    async def aclose(self):
        pass

    def close(self):
        pass


@pytest.fixture
def env(monkeypatch):
    monkeypatch.setattr(cluster, "Producer", FakeGroupProducer)
    FakeGroupProducer.script, FakeGroupProducer.sent, FakeGroupProducer.ids = {}, [], []
    state = {"route": route("g0", "g1"), "fetches": 0}

    async def topic_route(self, topic):
        state["fetches"] += 1
        r = state["route"]
        if isinstance(r, Exception):
            raise r
        return r
    monkeypatch.setattr(cluster.NameServers, "topic_route", topic_route)
    return state


def run(coro):
    return asyncio.run(coro)


def test_sends_spread_over_every_queue_of_every_group_and_say_their_group(env):
    async def go():
        p = cluster.ClusterProducer("ns:9876")
        results = []
        for _ in range(40):  # one send per loop pass: the sticky queue moves on each pass
            results.append(await p.send_async("t", b"x"))
        return results
    results = run(go())
    assert Counter((r.broker_name, r.queue_id) for r in results) == {(g, q): 10 for g in ("g0", "g1") for q in (0, 1)}
    assert env["fetches"] == 1  # one route fetch, then the route is known


def test_one_loop_pass_sticks_to_one_queue_so_its_sends_make_one_batch(env):
    async def go():
        p = cluster.ClusterProducer("ns:9876")
        await p.send_async("t", b"first")  # the route is known from here
        FakeGroupProducer.sent.clear()
        return await asyncio.gather(*[p.send_nowait("t", b"x") for _ in range(50)])
    run(go())
    assert len({(g, q) for g, q, _ in FakeGroupProducer.sent}) == 1


def test_a_send_that_stored_nothing_moves_to_another_group(env):
    FakeGroupProducer.script = {"g0": SendError(Code.NOT_CONNECTED, "every address refused", stored=False)}

    async def go():
        p = cluster.ClusterProducer("ns:9876")
        return [await p.send_async("t", b"x") for _ in range(8)]
    assert {r.broker_name for r in run(go())} == {"g1"}
    tried = Counter(g for g, _, _ in FakeGroupProducer.sent)
    assert tried["g0"] >= 1 and tried["g1"] == 8


def test_an_unknown_outcome_moves_with_its_msg_id_and_says_possible_duplicate(env):
    """The group died with the send in flight (its own retries left it unknown): another group
    takes it under the same msg_id, and the result says it may be a duplicate."""
    FakeGroupProducer.script = {"g0": SendError(Code.SYSTEM_ERROR, "lost", stored=None, attempts=3)}

    async def go():
        p = cluster.ClusterProducer("ns:9876")
        rs = [await p.send_async("t", b"x") for _ in range(6)]
        q = cluster.ClusterProducer("ns:9876", retry_when_outcome_unknown=False)
        with pytest.raises(SendError) as e:
            for _ in range(6):
                await q.send_async("t", b"x")
        return rs, e.value
    rs, err = run(go())
    moved = [r for r in rs if r.attempts > 1]
    assert moved and all(r.broker_name == "g1" and r.possible_duplicate and r.attempts == 4 for r in moved)
    assert all(not r.possible_duplicate for r in rs if r.attempts == 1)
    sent = FakeGroupProducer.sent
    for i, (g, _, _) in enumerate(sent[:-1]):  # each move keeps the id of the attempt it follows
        if g == "g0" and sent[i + 1][0] == "g1":
            assert FakeGroupProducer.ids[i] == FakeGroupProducer.ids[i + 1]
    assert err.stored is None  # retry_when_outcome_unknown=False: it stays unknown, not moved


def test_a_refusal_after_an_unknown_attempt_is_not_called_not_stored(env):
    FakeGroupProducer.script = {"g0": SendError(Code.SYSTEM_ERROR, "lost", stored=None),
                                "g1": SendError(Code.SYSTEM_BUSY, "busy", stored=False)}

    async def go():
        p = cluster.ClusterProducer("ns:9876", retry_times_when_send_failed=1)
        errs = []
        for _ in range(4):
            with pytest.raises(SendError) as e:
                await p.send_async("t", b"x")
            errs.append(e.value)
        return errs
    for e in run(go()):  # whichever group came first, one attempt was unknown: so is the send
        assert e.stored is None


def test_retries_across_groups_are_bounded(env):
    FakeGroupProducer.script = {g: SendError(Code.SYSTEM_BUSY, "busy", stored=False) for g in ("g0", "g1")}

    async def go():
        p = cluster.ClusterProducer("ns:9876", retry_times_when_send_failed=2)
        with pytest.raises(SendError) as e:
            await p.send_async("t", b"x")
        return e.value
    assert run(go()).code == Code.SYSTEM_BUSY
    assert [g for g, _, _ in FakeGroupProducer.sent] in (["g0", "g1", "g0"], ["g1", "g0", "g1"])


def test_known_routes_outlive_the_name_servers_and_unknown_topics_fail_clearly(env):
    async def go():
        p = cluster.ClusterProducer("ns:9876", route_refresh_interval_ms=1)
        await p.send_async("t", b"x")
        env["route"] = cluster.NameServerUnavailable("no name server answered (ns:9876: refused)")
        await asyncio.sleep(0.01)
        await p.routes.refresh("t", force=True)  # fails: the route stays
        ok = [await p.send_async("t", b"x") for _ in range(4)]
        with pytest.raises(cluster.NameServerUnavailable) as e:
            await p.send_async("new-topic", b"x")
        return ok, e.value
    ok, err = run(go())
    assert len(ok) == 4 and isinstance(err, ConnectError) and err.code == Code.NAMESRV_UNAVAILABLE
    assert "no name server answered" in str(err)


def test_a_topic_no_group_holds_is_topic_not_exist(env):
    env["route"] = None

    async def go():
        p = cluster.ClusterProducer("ns:9876")
        with pytest.raises(SendError) as e:
            await p.send_async("t", b"x")
        return e.value
    e = run(go())
    assert e.code == Code.TOPIC_NOT_EXIST and e.stored is False


def test_a_single_group_topic_that_loses_its_leader_after_an_unknown_attempt_stays_unknown(env, monkeypatch):
    """The group died with the send in flight (unknown); the refreshed route shows it without a
    leader, so no queue is left to retry on: the send may still be committed by the group's
    next leader, so it must not be reported as not stored (and its attempts count)."""
    monkeypatch.setattr(namesrv_client, "ROUTE_REFRESH_MIN_INTERVAL_MS", 0)  # the retry's refresh is not skipped
    env["route"] = route("g0")
    FakeGroupProducer.script = {"g0": SendError(Code.SYSTEM_ERROR, "lost", stored=None, attempts=2)}

    async def go():
        p = cluster.ClusterProducer("ns:9876")
        await p.routes.ensure("t")
        env["route"] = ns.TopicRoute("t", 2, True, [ns.GroupRoute("g0", 2, 2, 6, None, 1, [])])
        with pytest.raises(SendError) as e:
            await p.send_async("t", b"x")
        return e.value
    e = run(go())
    assert e.stored is None and e.attempts == 2, (e, e.stored, e.attempts)


def test_closing_ends_sends_still_waiting_for_a_route(env):
    gate = asyncio.Event()

    async def slow_route(self, topic):
        await gate.wait()
        return route("g0")

    async def go(monkeypatch_route):
        p = cluster.ClusterProducer("ns:9876")
        f = p.send_nowait("t", b"x")  # no route yet: a task fetches it
        await asyncio.sleep(0.01)
        await p.aclose()
        return f
    import broker.client.cluster as c
    orig = c.NameServers.topic_route
    c.NameServers.topic_route = slow_route
    try:
        f = run(go(None))
    finally:
        c.NameServers.topic_route = orig
    assert f.done() and isinstance(f.exception(), SendError) and f.exception().stored is False


class FakeGroupConsumer:
    """A group's Consumer: g1's whole group is down (its rebalance cannot connect)."""

    def __init__(self, addresses, group, topic, **kw):
        self.name = addresses[0].split("-")[0]
        self.left = [b"a", b"b"] if self.name == "g0" else []

    def data_event(self):
        return asyncio.Event()  # nothing more ever arrives here

    async def poll_async(self, timeout_ms, max_messages):
        if self.name == "g1":
            raise ConnectError("cannot connect to any member of g1", refused=True)
        out, self.left = [m(self.name, b) for b in self.left], []
        if not out:
            await asyncio.sleep(timeout_ms / 1000)
        return out

    async def aclose(self):
        pass

    def close(self):
        pass


def m(group, body):
    from broker.client.consumer import Message
    return Message("t", 0, 0, body.hex(), body, [], None, {}, 0, 0, 0, 0, 0)


def test_a_consumer_reads_the_groups_that_answer_while_one_is_down(env, monkeypatch):
    monkeypatch.setattr(cluster, "Consumer", FakeGroupConsumer)

    async def go():
        c = cluster.ClusterConsumer("ns:9876", "billing", "t")
        got = await c.poll_async(200)
        env["route"] = route("g1")  # only the dead group left: its error is raised
        c2 = cluster.ClusterConsumer("ns:9876", "billing", "t")
        with pytest.raises(ConnectError):
            await c2.poll_async(50)
        return got
    got = run(go())
    assert [(x.broker_name, x.body) for x in got] == [("g0", b"a"), ("g0", b"b")]


def test_a_group_learns_a_new_member_from_a_changed_route_and_only_then_reads_the_routes(env, monkeypatch):
    """Each send asks for its group's producer; the members are taken from the routes once per
    route change (a scan of every topic's route per send cost about a third of the client's CPU
    in the two-group bench), and a member a new route adds is taken at once."""
    from broker.client.routes import RouteTable
    scans = Counter()
    real = RouteTable.addresses_of

    def counted(self, name):
        scans[name] += 1
        return real(self, name)
    monkeypatch.setattr(RouteTable, "addresses_of", counted)

    async def go():
        p = cluster.ClusterProducer("ns:9876")
        for _ in range(20):
            await p.send_async("t", b"x")
        before = dict(scans)
        env["route"] = ns.TopicRoute("t", 2, True, [ns.GroupRoute("g0", 2, 2, 6, "g0-leader:1", 1, ["g0-new:1"]),
                                                    ns.GroupRoute("g1", 2, 2, 6, "g1-leader:1", 1, [])])
        await p.routes.refresh("t", force=True)
        for _ in range(20):
            await p.send_async("t", b"x")
        return before, p.groups["g0"].addresses
    before, g0_addresses = run(go())
    assert before == {"g0": 1, "g1": 1}, before  # 20 sends, one look at the routes per group
    assert scans == {"g0": 2, "g1": 2}, scans  # and one more after the route changed
    assert ("g0-new", 1) in g0_addresses
