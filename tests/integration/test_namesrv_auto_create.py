"""Topic auto-creation through the name server's template with real processes, security on
(issue 16; RocketMQ's TBW102): one name server, two standalone groups, g0 with
auto_create_topic_enable and g1 without.

- only g0 registers the template, so a ClusterProducer's send to a new topic goes to g0 alone,
  on min(its default_topic_queues, g0's) queues; g0 creates the topic on the first send and
  re-registers at once (well within register_interval_ms), the name server routes the topic to
  g0 only, the producer moves to the topic's own route, and every acknowledged message is read
  back from g0;
- a user without pub on a new topic creates nothing (the broker's rule for auto-creation);
- with auto-creation off on g0 too (restarted), no template is routed and a send to a new topic
  fails TOPIC_NOT_EXIST naming it.
Every process is stopped by pid in the finalizers.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from broker.client import Admin, SendError
from broker.client.cluster import ClusterConsumer, ClusterProducer
from broker.namesrv import TEMPLATE_TOPIC
from broker.protocol.codes import Code
from ops.localbroker import LocalBroker, free_ports
from tests.integration.test_namesrv import GroupPki, LocalNameServer, route, wait_until
from tests.secure import QUICK, stop_all

pytestmark = pytest.mark.slow

REGISTER_INTERVAL_MS = 30_000  # routes that show up sooner came from the re-register on create


@pytest.fixture(scope="module")
def world(tmp_path_factory, request):
    root = tmp_path_factory.mktemp("nsauto")
    pki = GroupPki(root, {"b0": "g0", "b1": "g1"})
    names = LocalNameServer(root, pki, "ns0", free_ports(1)[0])
    request.addfinalizer(names.stop)
    names.start()
    reg = {"namesrv_addresses": [names.address], "cluster_name": "test", "register_interval_ms": REGISTER_INTERVAL_MS,
           **QUICK}
    g0 = LocalBroker(root / "g0", **pki.broker_config("b0", broker_name="g0", node_id="b0",
                                                      auto_create_topic_enable=True, default_topic_queues=4, **reg))
    g1 = LocalBroker(root / "g1", **pki.broker_config("b1", broker_name="g1", node_id="b1",
                                                      auto_create_topic_enable=False, **reg))
    nodes = [g0, g1]
    request.addfinalizer(lambda: stop_all(nodes))
    for b in nodes:
        b.start()
    wait_until("the template routed to g0 alone", lambda: _template_groups(pki, names) == ["g0"], 20)
    return {"pki": pki, "names": names, "g0": g0, "g1": g1, "namesrv": names.address, "auth": pki.client("admin")}


def _template_groups(pki, names):
    r = route(pki, names.address, TEMPLATE_TOPIC)
    return [g.broker_name for g in r.groups] if r is not None else []


def _topics(w, group):
    with Admin([w[group].address], **w["auth"]) as a:
        return a.list_topics()


def test_a_new_topic_is_created_on_the_group_that_allows_it_and_every_ack_is_read_back(world):
    w, topic = world, "fresh"

    async def run():
        async with ClusterProducer(w["namesrv"], default_topic_queues=2, **w["auth"]) as p:
            t0 = time.monotonic()
            first = await asyncio.gather(*(p.send_async(topic, b"first-%d" % i) for i in range(50)))
            first += [await p.send_async(topic, b"first-pass-%d" % i) for i in range(20)]
            borrowed = p.routes.table.route(topic)
            own = await asyncio.to_thread(
                wait_until, "the name server routes the new topic", lambda: route(w["pki"], w["namesrv"], topic), 10)
            t_route = time.monotonic() - t0
            later, deadline = [], time.monotonic() + 10
            while p.routes.table.borrowed(topic):  # its own route on the next refresh (<= 1 s)
                assert time.monotonic() < deadline, "the producer still uses the template's route"
                later.append(await p.send_async(topic, b"later"))
                await asyncio.sleep(0.01)
            later += [await p.send_async(topic, b"own-%d" % i) for i in range(40)]
            return first, borrowed, own, t_route, later
    first, borrowed, own, t_route, later = asyncio.run(run())
    print(f"name server routed the new topic {t_route:.2f} s after the first send")
    assert not borrowed.exists and [(g.broker_name, g.write_queues) for g in borrowed.groups] == [("g0", 2)]
    assert {(r.broker_name, r.queue_id) for r in first} == {("g0", 0), ("g0", 1)}  # min(2, 4)
    # created from g0's template (4 queues) on g0 only; routed long before a periodic registration
    assert [(g.broker_name, g.write_queues) for g in own.groups] == [("g0", 4)] and own.exists
    assert t_route < REGISTER_INTERVAL_MS / 1000 / 2
    assert topic in _topics(w, "g0") and topic not in _topics(w, "g1")
    assert {r.broker_name for r in later} == {"g0"} and {r.queue_id for r in later[-40:]} == set(range(4))

    acked = {r.msg_id for r in first + later}
    seen: set[str] = set()
    with ClusterConsumer(w["namesrv"], "cg", topic, **w["auth"]) as c:
        def read_all():
            for m in c.poll(timeout_ms=200, max_messages=500):
                assert m.broker_name == "g0"
                seen.add(m.msg_id)
            return acked <= seen
        wait_until(f"all {len(acked)} acknowledged messages read back", read_all, 20)


def test_a_user_without_pub_on_the_topic_creates_nothing(world):
    w = world

    async def run():
        async with ClusterProducer(w["namesrv"], **w["pki"].client("app")) as p:  # pub on "orders" only
            with pytest.raises(SendError) as e:
                await p.send_async("not-for-app", b"x")
            return e.value
    e = asyncio.run(run())
    assert e.code == Code.NO_PERMISSION and "not-for-app" in str(e), e
    assert "not-for-app" not in _topics(w, "g0")


def test_with_auto_creation_off_everywhere_a_new_topic_fails_naming_it(world):
    w = world
    g0 = w["g0"]
    g0.stop()
    g0.config["auto_create_topic_enable"] = False
    g0.start()
    wait_until("the template is no longer routed", lambda: _template_groups(w["pki"], w["names"]) == [], 20)
    wait_until("g0 registered again", lambda: route(w["pki"], w["namesrv"], "fresh") is not None, 20)

    async def run():
        async with ClusterProducer(w["namesrv"], **w["auth"]) as p:
            ok = await p.send_async("fresh", b"known topics still work")
            with pytest.raises(SendError) as e:
                await p.send_async("never-made", b"x")
            return ok, e.value
    ok, e = asyncio.run(run())
    assert ok.broker_name == "g0"
    assert e.code == Code.TOPIC_NOT_EXIST and e.stored is False and "'never-made'" in str(e), e
    assert "never-made" not in _topics(w, "g0") and "never-made" not in _topics(w, "g1")
