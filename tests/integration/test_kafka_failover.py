"""A librdkafka producer (acks=all, enable.idempotence) at >= 1,000 records/s into a secure group
through its Kafka listeners (TLS + SCRAM, the cluster's admin user): a raft-3 group whose leader
is killed -9 three times (restarted each time), and a master-slave SYNC group whose master is
killed -9 and its best slave promoted (`admin promote`, as an operator or a drill does). No
acknowledged record lost, none stored twice, no error surfaced to the application, and a
librdkafka consumer group keeps consuming through the kills."""

from __future__ import annotations

import threading
import time

import pytest
import yaml

from ops.cluster import LocalCluster

confluent_kafka = pytest.importorskip("confluent_kafka")
pytestmark = pytest.mark.slow

TOPIC = "kfail"
RATE = 2000


def conf(c: LocalCluster, **extra) -> dict:
    cred = yaml.safe_load(c.credentials_file.read_text())
    boot = ",".join(f"{a.rsplit(':', 1)[0]}:{int(a.rsplit(':', 1)[1]) + 2}" for a in c.addresses)
    return {"bootstrap.servers": boot, "security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-256",
            "sasl.username": cred["username"], "sasl.password": cred["password"],
            "ssl.ca.location": cred["ca_file"], **extra}


def kill_and_promote(c: LocalCluster, master: str) -> None:
    """master-slave: kill -9 the master, promote the slave holding the newest log, restart the
    old master (it rejoins as a slave)."""
    from broker.client import Admin

    c.kill(master)
    time.sleep(0.5)
    slaves = [n for n in ("n0", "n1", "n2") if n != master]
    ends = {}
    for n in slaves:
        with Admin([c.node(n).address], credentials=str(c.credentials_file)) as a:
            ends[n] = a.status()["store"]["max_offset"]
    best = max(slaves, key=lambda n: ends[n])
    with Admin([c.node(best).address], credentials=str(c.credentials_file)) as a:
        report = a.promote(best)
    assert report["clean"], report
    time.sleep(1.0)
    c.restart(master)


def current_master(c: LocalCluster) -> str:
    from broker.client import Admin

    for n in ("n0", "n1", "n2"):
        try:
            with Admin([c.node(n).address], credentials=str(c.credentials_file)) as a:
                r = a.status()["replication"]
            if r.get("role") == "master":
                return n
        except Exception:  # a node down or not answering: ask the next one
            continue
    raise AssertionError("no master")


@pytest.mark.parametrize("mode", ["raft", "master-slave"])
def test_librdkafka_through_leader_kills(tmp_path, mode):
    c = LocalCluster(tmp_path / "cluster")
    acked, errors, app_errors = {}, [], []
    consumed, stop = [], threading.Event()
    kills_max = 3 if mode == "raft" else 1
    try:
        extra = {"raft_election_timeout_ms": 300} if mode == "raft" else {"ha_replication": "sync"}
        c.up(3, mode, "async", segment_bytes=1 << 22, message_body_bytes_max=64 << 10,
             default_topic_queues=4, **extra)
        if mode == "raft":
            c.wait_for_leader()
        else:
            assert c.wait_healthy()["verdict"] == "healthy"
        p = confluent_kafka.Producer(conf(c, **{"acks": "all", "enable.idempotence": True, "linger.ms": 5,
                                                "message.timeout.ms": 60_000, "error_cb": app_errors.append}))

        def report(err, msg):
            if err is not None:
                errors.append(err)
            else:
                key = (msg.partition(), msg.offset())
                assert key not in acked, f"two records acknowledged at {key}"
                acked[key] = msg.value()

        def consume():
            k = confluent_kafka.Consumer(conf(c, **{"group.id": "kfail-readers", "auto.offset.reset": "earliest",
                                                    "enable.auto.commit": True, "session.timeout.ms": 6000}))
            k.subscribe([TOPIC])
            while not stop.is_set():
                m = k.poll(0.1)
                if m is not None and not m.error():
                    consumed.append((m.partition(), m.offset(), m.value()))
            k.close()
        reader = threading.Thread(target=consume, daemon=True)
        reader.start()
        sent, t0 = 0, time.monotonic()
        kills = []
        while time.monotonic() - t0 < 16:
            elapsed = time.monotonic() - t0
            while sent < RATE * elapsed:  # a steady RATE records/s
                p.produce(TOPIC, value=b"r%08d" % sent, key=b"k%d" % (sent % 97), on_delivery=report)
                sent += 1
            p.poll(0.01)
            if len(kills) < kills_max and elapsed > 2 + 4.5 * len(kills):
                if mode == "raft":
                    leader = c.wait_for_leader()
                    c.kill(leader)
                    threading.Thread(target=lambda n=leader: (time.sleep(1.5), c.restart(n)), daemon=True).start()
                else:
                    leader = current_master(c)
                    threading.Thread(target=kill_and_promote, args=(c, leader), daemon=True).start()
                kills.append((round(elapsed, 1), leader))
        assert p.flush(60) == 0
        rate = sent / (time.monotonic() - t0)
        deadline = time.monotonic() + 30
        while len({(q, o) for q, o, _ in consumed}) < len(acked) and time.monotonic() < deadline:
            time.sleep(0.2)
        stop.set()
        reader.join(20)
    finally:
        c.down()
    print(f"\n{sent} sent at {rate:.0f}/s, {len(acked)} acknowledged, kills at {kills}, "
          f"{len(consumed)} consumed")
    assert len(kills) == kills_max and rate >= 1000
    assert errors == [] and [e for e in app_errors if e.fatal()] == [], (errors[:3], app_errors[:3])
    assert len(acked) == sent
    values = sorted(acked.values())
    assert values == sorted(b"r%08d" % i for i in range(sent)), "a record lost or stored twice"
    for q in range(4):  # offsets without gaps: nothing stored that was not acknowledged
        assert sorted(o for p_, o in acked if p_ == q) == list(range(sum(1 for p_, _ in acked if p_ == q)))
    seen = {(q, o): v for q, o, v in consumed}
    assert all(seen.get(k) == v for k, v in acked.items()), "the group missed or misread a record"


def test_a_producer_spans_two_groups_and_only_the_killed_groups_partitions_pause(tmp_path):
    """Two secure raft-3 groups behind a name server: Metadata numbers a topic's partitions
    across both (g0's queues 0-3 are partitions 0-3, g1's are 4-7), each led by its group's
    leader. g1's leader is killed -9: for a while only partitions 4-7 go unacknowledged while 0-3
    carry on, then 4-7 resume on g1's new leader; nothing acknowledged is lost or doubled."""
    from broker.client.cluster import create_topic

    c = LocalCluster(tmp_path / "cluster")
    acks: list = []  # (time, partition) of each acknowledgement
    errors = []
    try:
        c.up(3, "raft", "async", wait=True, groups=2, namesrv=1, segment_bytes=1 << 22,
             message_body_bytes_max=64 << 10, raft_election_timeout_ms=300)
        made = create_topic(c.namesrv_addresses, TOPIC, 4, credentials=str(c.credentials_file))
        assert sorted(made) == ["g0", "g1"] and not any(isinstance(r, Exception) for r in made.values()), made
        p = confluent_kafka.Producer(conf(c, **{"acks": "all", "enable.idempotence": True, "linger.ms": 5,
                                                "message.timeout.ms": 60_000}))
        md = p.list_topics(TOPIC, timeout=10).topics[TOPIC]
        assert sorted(md.partitions) == list(range(8)), md.partitions
        assert len({md.partitions[q].leader for q in range(8)}) == 2  # one leader per group
        values = {}

        def report(err, msg):
            if err is not None:
                errors.append(err)
            else:
                acks.append((time.monotonic(), msg.partition()))
                assert (msg.partition(), msg.offset()) not in values
                values[(msg.partition(), msg.offset())] = msg.value()
        sent, t0, killed = 0, time.monotonic(), None
        while time.monotonic() - t0 < 9:
            while sent < RATE * (time.monotonic() - t0):
                p.produce(TOPIC, value=b"r%08d" % sent, partition=sent % 8, on_delivery=report)
                sent += 1
            p.poll(0.01)
            if killed is None and time.monotonic() - t0 > 3:
                g1 = next(g for g in c.status()["groups"] if g["name"] == "g1")
                c.kill(g1["leader"])
                killed = (time.monotonic(), g1["leader"])
        assert p.flush(60) == 0
        c.restart(killed[1])
    finally:
        c.down()
    assert errors == [] and len(values) == sent
    assert sorted(values.values()) == sorted(b"r%08d" % i for i in range(sent))
    at = killed[0]
    window = [q for t, q in acks if at + 0.05 < t < at + 0.3]  # before g1 elects a new leader
    assert window and all(q < 4 for q in window), "g1's partitions were acknowledged while it had no leader"
    assert any(q >= 4 for t, q in acks if t > at + 1.0), "g1's partitions never resumed"
