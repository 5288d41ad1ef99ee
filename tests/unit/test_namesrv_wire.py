"""Name-server bodies (broker/protocol/namesrv.py): round trips, and bodies that do not decode
or validate are BadRequest naming the field (answered BAD_REQUEST)."""

import json

import pytest

from broker.protocol import jsonbody
from broker.protocol import namesrv as ns
from broker.protocol.codes import BadRequest, Code, Req


def reg(**kw) -> ns.RegisterBroker:
    base = dict(cluster="c", broker_name="g0", node_id="n0", address="127.0.0.1:10911", mode="raft",
                role="leader", term=3, epoch=0, topics_version=2,
                topics=[ns.TopicQueues("orders", 8, 8, 6), ns.TopicQueues("audit", 2, 4, 4)])
    return ns.RegisterBroker(**{**base, **kw})


def test_codes_take_rocketmq_numbers():
    assert (Req.REGISTER_BROKER, Req.UNREGISTER_BROKER, Req.GET_TOPIC_ROUTE, Req.GET_CLUSTER_INFO) == (103, 104, 105, 106)
    assert Code.NAMESRV_UNAVAILABLE == 61


@pytest.mark.parametrize("msg", [
    reg(), reg(role="follower", topics=[]),
    ns.RegisterResult("ns1", "127.0.0.1:1"), ns.RegisterResult("ns1", None),
    ns.NodeRef("g0", "n0"),
    ns.TopicRoute("orders", 7, True, [ns.GroupRoute("g0", 8, 8, 6, "127.0.0.1:1", 3, ["127.0.0.1:2"]),
                                       ns.GroupRoute("g1", 4, 4, 6, None, 0, [])]),
    ns.ClusterInfo("ns1", {"c": ["g0"]}, [ns.GroupInfo("g0", "c", "127.0.0.1:1", "n0", 3, 0, 2,
                                                     [ns.NodeInfo("n0", "127.0.0.1:1", "leader", 3, 0, 12, 2)])]),
])
def test_round_trip(msg):
    assert jsonbody.decode(type(msg), jsonbody.encode(msg)) == msg


@pytest.mark.parametrize("change, where", [
    ({"role": "king"}, "role"),
    ({"mode": "paxos"}, "mode"),
    ({"broker_name": "a b"}, "broker_name"),
    ({"node_id": ""}, "node_id"),
    ({"term": -1}, "term"),
    ({"topics": [{"topic": "t", "write_queues": 0, "read_queues": 1}]}, "write_queues"),
    ({"topics": [{"topic": "", "write_queues": 1, "read_queues": 1}]}, "topic"),
    ({"topics": "all"}, "topics"),
])
def test_bad_register_bodies_name_the_field(change, where):
    body = json.loads(jsonbody.encode(reg()))
    body.update(change)
    with pytest.raises(BadRequest, match=where):
        jsonbody.decode(ns.RegisterBroker, json.dumps(body).encode())


@pytest.mark.parametrize("raw", [b"not json", b"[]", b'{"broker_name": "g0"}', b"\xff\xfe"])
def test_corrupt_bodies_are_bad_requests(raw):
    with pytest.raises(BadRequest):
        jsonbody.decode(ns.RegisterBroker, raw)
    with pytest.raises(BadRequest):
        jsonbody.decode(ns.NodeRef, raw)
