"""Kafka clients nobody here wrote (confluent-kafka / librdkafka, kafka-python) against a real
secure broker (TLS + SCRAM-SHA-256 + ACLs, tests/secure.py) through its kafka_listener
(broker/kafka/): produce with every codec the client offers, fetch back in partition order,
ListOffsets, one log for two protocols (Kafka-produced messages read by the native Consumer,
native sends fetched by a Kafka consumer), wrong passwords and ACLs refused with Kafka's
errors, and malformed requests that close the connection while the broker keeps serving.

One broker for the module (a process; every client connects to it), a topic per test."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import struct
import time

import pytest

from broker.client.consumer import Consumer as NativeConsumer
from broker.client.producer import Producer as NativeProducer
from ops.localbroker import LocalBroker, free_port
from tests.secure import PASSWORDS, Pki

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")

ROLES = {"admin": {"admin": True},
         "app": {"pub": ["orders*"], "sub": ["orders*"], "groups": ["billing", "app-*"]},
         "reader": {"sub": ["orders*"], "groups": ["billing"]}}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    root = tmp_path_factory.mktemp("kafka")
    pki = Pki(root)
    kport = free_port()
    cfg = pki.broker_config("n0", roles=ROLES, kafka_listener=f"127.0.0.1:{kport}",
                            auto_create_topic_enable=True, default_topic_queues=4)
    cfg["roles"] = ROLES
    b = LocalBroker(root / "b", **cfg).start()
    b.kafka = f"127.0.0.1:{kport}"
    b.pki = pki
    yield b
    b.stop()


def rdkafka_conf(b, user="app", password=None, **extra) -> dict:
    return {"bootstrap.servers": b.kafka, "security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-256",
            "sasl.username": user, "sasl.password": password or PASSWORDS[user],
            "ssl.ca.location": b.pki.ca_file, "ssl.endpoint.identification.algorithm": "none", **extra}


def kafka_python_conf(b, user="app") -> dict:
    return dict(bootstrap_servers=b.kafka, security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-256",
                sasl_plain_username=user, sasl_plain_password=PASSWORDS[user], ssl_cafile=b.pki.ca_file,
                ssl_check_hostname=False)


def rd_produce(b, topic: str, n: int, **conf) -> list:
    """n keyed records (partition = i % 4) with acks=all: the delivery reports."""
    p = confluent_kafka.Producer(rdkafka_conf(b, **{"acks": "all", "linger.ms": 5, **conf}))
    reports = []
    for i in range(n):
        p.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode(), headers=[("n", str(i).encode())],
                  partition=i % 4, on_delivery=lambda err, msg: reports.append((err, msg.partition(), msg.offset())))
        p.poll(0)
    assert p.flush(30) == 0
    return reports


def rd_consume(b, topic: str, n: int, partitions=range(4), timeout_s=30.0) -> list:
    c = confluent_kafka.Consumer(rdkafka_conf(b, **{"group.id": "billing", "enable.auto.commit": False}))
    c.assign([confluent_kafka.TopicPartition(topic, q, 0) for q in partitions])
    got, deadline = [], time.monotonic() + timeout_s
    try:
        while len(got) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            assert m.error() is None, m.error()
            got.append((m.partition(), m.offset(), m.key(), m.value(), m.headers()))
    finally:
        c.close()
    return got


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_librdkafka_produces_and_fetches_back_in_partition_order(broker, codec):
    topic = f"orders-{codec}"
    reports = rd_produce(broker, topic, 400, **{"compression.type": codec})
    assert [r for r in reports if r[0] is not None] == []
    assert sorted(r[2] for r in reports if r[1] == 0) == list(range(100))
    got = rd_consume(broker, topic, 400)
    assert len(got) == 400
    for q in range(4):
        mine = [g for g in got if g[0] == q]
        assert [g[1] for g in mine] == list(range(100))  # each offset once, in order
        assert [g[2] for g in mine] == [f"k{i}".encode() for i in range(q, 400, 4)]
        assert mine[0][4] == [("n", str(q).encode())]


def test_idempotent_producers_store_each_record_once(broker):
    """librdkafka with enable.idempotence (InitProducerId, sequences per partition) and
    kafka-python's default (idempotence on): every record once, offsets without gaps."""
    topic = "orders-idem"
    reports = rd_produce(broker, topic, 2000, **{"enable.idempotence": True, "compression.type": "lz4"})
    assert [r for r in reports if r[0] is not None] == []
    kp = kafka.KafkaProducer(acks="all", **kafka_python_conf(broker))
    fs = [kp.send(topic, key=b"kp", value=b"%d" % i, partition=2) for i in range(300)]
    kp.flush(20)
    kp.close()
    assert [f.get(5).offset for f in fs] == list(range(500, 800))
    got = rd_consume(broker, topic, 2300)
    assert len(got) == 2300 and len({(g[0], g[1]) for g in got}) == 2300
    assert sorted(g[1] for g in got if g[0] == 2) == list(range(800))


def test_one_log_two_protocols(broker):
    """Kafka-produced records are native messages (KEYS, h:<header>), and native sends are
    fetched by a Kafka consumer as records (key, headers from the properties)."""
    topic = "orders-both"
    kp = kafka.KafkaProducer(acks="all", compression_type="gzip", enable_idempotence=False,
                             **kafka_python_conf(broker))
    for i in range(50):
        kp.send(topic, key=b"key%d" % i, value=b"kafka-%d" % i, partition=0, headers=[("src", b"kafka")])
    kp.flush(20)
    kp.close()
    with NativeProducer([broker.address], **broker.pki.client("app")) as p:
        for i in range(50):
            p.send(topic, b"native-%d" % i, key=f"nk{i}", queue_id=0, properties={"src": "native"})
    c = NativeConsumer([broker.address], "billing", topic, queues=[0], **broker.pki.client("app"))
    native = []
    with c:
        deadline = time.monotonic() + 20
        while len(native) < 100 and time.monotonic() < deadline:
            native += c.poll(500)
    assert [m.body for m in native] == [b"kafka-%d" % i for i in range(50)] + [b"native-%d" % i for i in range(50)]
    assert native[0].keys == ["key0"] and native[0].properties == {"h:src": "kafka"}
    got = rd_consume(broker, topic, 100, partitions=[0])
    assert [g[1] for g in got] == list(range(100))
    assert got[0][2:4] == (b"key0", b"kafka-0") and got[50][2:4] == (b"nk0", b"native-0")
    assert ("src", b"native") in got[50][4] and got[0][4] == [("src", b"kafka")]


def test_list_offsets_earliest_latest_and_by_time(broker):
    topic = "orders-times"
    rd_produce(broker, topic, 40)
    mid = int(time.time() * 1000)
    time.sleep(0.05)
    rd_produce(broker, topic, 40)
    c = confluent_kafka.Consumer(rdkafka_conf(broker, **{"group.id": "billing"}))
    try:
        lo, hi = c.get_watermark_offsets(confluent_kafka.TopicPartition(topic, 1), timeout=10)
        assert (lo, hi) == (0, 20)
        [at] = c.offsets_for_times([confluent_kafka.TopicPartition(topic, 1, mid)], timeout=10)
        assert at.offset == 10 and at.error is None
        [none] = c.offsets_for_times([confluent_kafka.TopicPartition(topic, 1, mid + 3_600_000)], timeout=10)
        assert none.offset == -1
    finally:
        c.close()


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_both_scram_mechanisms_log_in(broker, mechanism):
    """Kafka's SCRAM-SHA-512 with the user's second verifier, SCRAM-SHA-256 with its first."""
    reports = rd_produce(broker, "orders-mech", 8, **{"sasl.mechanisms": mechanism})
    assert [r for r in reports if r[0] is not None] == []
    errors = []
    p = confluent_kafka.Producer(rdkafka_conf(broker, password="not-it", error_cb=errors.append,
                                              **{"sasl.mechanisms": mechanism}))
    p.produce("orders-mech", b"v")
    p.flush(5)
    assert any(e.code() == confluent_kafka.KafkaError._AUTHENTICATION for e in errors), errors


def test_metadata_creates_a_topic_only_for_a_principal_that_may_publish_to_it(broker):
    """Auto-creation through Metadata is a send's: a reader (SUB only) asking for an unknown topic
    gets UNKNOWN_TOPIC_OR_PARTITION and creates nothing; an app that may publish creates it."""
    from broker.client import Admin

    reader = confluent_kafka.Consumer(rdkafka_conf(broker, user="reader", **{"group.id": "billing"}))
    try:
        md = reader.list_topics("orders-by-reader", timeout=10)
        assert md.topics["orders-by-reader"].error.code() == confluent_kafka.KafkaError.UNKNOWN_TOPIC_OR_PART
    finally:
        reader.close()
    with Admin([broker.address], **broker.pki.client("admin")) as a:
        assert "orders-by-reader" not in a.list_topics()
    rd_produce(broker, "orders-by-app", 1)
    with Admin([broker.address], **broker.pki.client("admin")) as a:
        assert "orders-by-app" in a.list_topics()


def test_wrong_password_and_acls_get_kafka_errors(broker):
    errors = []
    p = confluent_kafka.Producer(rdkafka_conf(broker, password="not-it", error_cb=errors.append))
    p.produce("orders-x", b"v")
    p.flush(5)
    assert any(e.code() == confluent_kafka.KafkaError._AUTHENTICATION for e in errors), errors
    rd_produce(broker, "orders-ro", 1)  # (made by the app: a reader cannot create it)
    reports = rd_produce(broker, "orders-ro", 4, **{"sasl.username": "reader", "sasl.password": PASSWORDS["reader"],
                                                  "message.timeout.ms": 5000})
    assert {r[0].code() for r in reports} == {confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED}, reports


def raw_tls(b):
    import ssl
    ctx = ssl.create_default_context(cafile=b.pki.ca_file)
    ctx.check_hostname = False
    s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", int(b.kafka.rsplit(":", 1)[1])), timeout=5))
    return s


@pytest.mark.parametrize("frame", [
    struct.pack(">i", -1),  # a negative size
    struct.pack(">i", 1 << 30) + b"x" * 64,  # past frame_bytes_max
    struct.pack(">i", 4) + b"\x00\x12\x00\x03",  # shorter than a header
    struct.pack(">ihhi", 10, 18, 3, 7) + b"\xff\xff",  # ApiVersions v3, its body cut off
    struct.pack(">ihhih", 10, 3, 12, 7, 0),  # Metadata before authenticating
], ids=["negative", "oversized", "short", "truncated-body", "unauthenticated"])
def test_malformed_requests_close_the_connection_and_the_broker_serves_on(broker, frame):
    s = raw_tls(broker)
    s.sendall(frame)
    try:
        assert s.recv(4096) == b""  # closed (nothing to answer, or not authenticated)
    except (ConnectionResetError, OSError):
        pass
    s.close()
    assert len(rd_produce(broker, "orders-after", 4)) == 4  # it still serves


def test_an_unsupported_version_is_answered_before_the_close(broker):
    s = raw_tls(broker)
    s.sendall(struct.pack(">ihhih", 10, 18, 99, 42, 0))  # ApiVersions v99
    head = b""
    while len(head) < 10:
        more = s.recv(4096)
        assert more, f"closed after {head!r}"
        head += more
    size, corr, err = struct.unpack_from(">iih", head)
    assert corr == 42 and err == 35  # UNSUPPORTED_VERSION, with the versions there are (v0 body)
    s.close()


class GroupRun:
    """Consumers of one group in threads, each committing what it processed before its
    partitions go (on_revoke) and when it leaves: what every consumer read, in the order it
    was processed (a lock), so that per partition the order is the group's order."""

    def __init__(self, b, topic: str, group: str):
        self.b, self.topic, self.group = b, topic, group
        self.got: list = []
        self.limit = 0  # consumers pause their partitions once the group has read this many
        self.lock = threading.Lock()
        self.errors: list = []

    def consumer(self, stop: threading.Event):
        c = confluent_kafka.Consumer(rdkafka_conf(self.b, **{
            "group.id": self.group, "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000, "heartbeat.interval.ms": 300}))

        def commit(cons, _parts=None):
            try:
                cons.commit(asynchronous=False)
            except confluent_kafka.KafkaException as e:
                if e.args[0].code() != confluent_kafka.KafkaError._NO_OFFSET:
                    self.errors.append(e)
        c.subscribe([self.topic], on_revoke=commit)
        paused = False
        try:
            while not stop.is_set():
                over = len(self.got) >= self.limit
                if over != paused or over:  # (a rebalance's new partitions start unpaused)
                    (c.pause if over else c.resume)(c.assignment())
                    paused = over
                m = c.poll(0.1)
                if m is None:
                    continue
                if m.error():
                    self.errors.append(m.error())
                    continue
                with self.lock:
                    self.got.append((m.partition(), m.offset(), m.key()))
        finally:
            commit(c)
            c.close()

    def start(self) -> tuple:
        stop = threading.Event()
        t = threading.Thread(target=self.consumer, args=(stop,), daemon=True)
        t.start()
        return t, stop

    def wait_for(self, n: int, timeout_s: float = 60) -> None:
        self.limit = n
        deadline = time.monotonic() + timeout_s
        while len(self.got) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(self.got) >= n, f"{len(self.got)} of {n} consumed; errors {self.errors[:3]}"


def test_a_librdkafka_group_rebalances_commits_and_resumes_exactly_once(broker):
    """10,000 keyed records (acks=all, idempotence); a group of 3 consumers; one leaves, one
    joins (rebalances each time), they stop; the group starts again and resumes from what was
    committed: every record read exactly once by the group, each partition in order."""
    topic, n = "orders-group", 10_000
    reports = rd_produce(broker, topic, n, **{"enable.idempotence": True})
    assert [r for r in reports if r[0] is not None] == []
    run = GroupRun(broker, topic, "app-rdkafka")
    members = [run.start() for _ in range(3)]
    run.wait_for(2500)
    t, stop = members.pop(0)  # one leaves
    stop.set()
    t.join(30)
    run.wait_for(5000)
    members.append(run.start())  # one joins
    run.wait_for(7500)
    time.sleep(0.5)
    for t, stop in members:
        stop.set()
    for t, _ in members:
        t.join(30)
    first = len(run.got)
    assert first < n, "the group read everything before it stopped: nothing left to resume"
    again = [run.start() for _ in range(2)]  # the group again: from the committed offsets
    run.wait_for(n)
    time.sleep(1.0)  # (anything read twice would show up now)
    for t, stop in again:
        stop.set()
    for t, _ in again:
        t.join(30)
    assert run.errors == []
    assert len(run.got) == n and len({(p, o) for p, o, _ in run.got}) == n, \
        f"{len(run.got)} read, {len({(p, o) for p, o, _ in run.got})} distinct"
    for q in range(4):
        assert [o for p, o, _ in run.got if p == q] == list(range(n // 4)), f"partition {q} out of order"


def kcat(b, *args, user="app", stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """Debian's kcat, as a user types it (SASL over TLS with the cluster CA)."""
    return subprocess.run(["kcat", "-b", b.kafka, "-X", "security.protocol=SASL_SSL", "-X", "sasl.mechanisms=SCRAM-SHA-256",
                           "-X", f"sasl.username={user}", "-X", f"sasl.password={PASSWORDS[user]}",
                           "-X", f"ssl.ca.location={b.pki.ca_file}", *args],
                          input=stdin, capture_output=True, timeout=60)


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed (make sysdeps installs it)")
def test_kcat_lists_produces_and_consumes(broker):
    r = kcat(broker, "-P", "-t", "orders-kcat", "-p", "1", "-K", ":", stdin=b"".join(b"k%d:line %d\n" % (i, i) for i in range(20)))
    assert r.returncode == 0, r.stderr
    r = kcat(broker, "-L", "-t", "orders-kcat")
    assert r.returncode == 0 and b"topic \"orders-kcat\" with 4 partitions" in r.stdout, r.stdout + r.stderr
    r = kcat(broker, "-C", "-t", "orders-kcat", "-p", "1", "-o", "beginning", "-e", "-f", "%k=%s@%o\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().splitlines() == [f"k{i}=line {i}@{i}" for i in range(20)]


def test_admin_client_creates_topics_and_partitions_and_describes_configs(broker):
    from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic

    a = AdminClient(rdkafka_conf(broker, user="admin"))
    f = a.create_topics([NewTopic("orders-admin", 3), NewTopic("orders-admin-rf", 2, replication_factor=3)])
    f["orders-admin"].result(15)
    with pytest.raises(confluent_kafka.KafkaException, match="replication_factor"):
        f["orders-admin-rf"].result(15)
    with pytest.raises(confluent_kafka.KafkaException) as e:
        a.create_topics([NewTopic("orders-admin", 3)])["orders-admin"].result(15)
    assert e.value.args[0].code() == confluent_kafka.KafkaError.TOPIC_ALREADY_EXISTS
    a.create_partitions([NewPartitions("orders-admin", 5)])["orders-admin"].result(15)
    md = a.list_topics("orders-admin", timeout=10)
    assert len(md.topics["orders-admin"].partitions) == 5
    cfg = a.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "orders-admin")])
    entries = list(cfg.values())[0].result(15)
    assert entries["cleanup.policy"].value == "delete" and "retention.ms" in entries
    with pytest.raises(confluent_kafka.KafkaException) as e:
        a.delete_topics(["orders-admin"])["orders-admin"].result(15)
    assert e.value.args[0].code() == confluent_kafka.KafkaError.POLICY_VIOLATION
    app = AdminClient(rdkafka_conf(broker, user="app"))
    with pytest.raises(confluent_kafka.KafkaException) as e:
        app.create_topics([NewTopic("orders-app", 1)])["orders-app"].result(15)
    assert e.value.args[0].code() == confluent_kafka.KafkaError.CLUSTER_AUTHORIZATION_FAILED


def kafka_python_member(run: GroupRun, stop: threading.Event) -> None:
    """GroupRun.consumer's loop with kafka-python's KafkaConsumer."""
    from kafka import ConsumerRebalanceListener, KafkaConsumer

    c = KafkaConsumer(group_id=run.group, enable_auto_commit=False, auto_offset_reset="earliest",
                      session_timeout_ms=6000, heartbeat_interval_ms=300, max_poll_records=20,
                      **kafka_python_conf(run.b))

    class Commit(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            if revoked:
                c.commit()

        def on_partitions_assigned(self, assigned):
            pass
    c.subscribe([run.topic], listener=Commit())
    try:
        while not stop.is_set():
            over = len(run.got) >= run.limit
            (c.pause if over else c.resume)(*c.assignment())
            for tp, recs in c.poll(timeout_ms=100).items():
                with run.lock:
                    run.got += [(r.partition, r.offset, r.key) for r in recs]
    finally:
        if c.assignment():
            c.commit()
        c.close()


def aiokafka_member(run: GroupRun, stop: threading.Event) -> None:
    """The same with aiokafka's AIOKafkaConsumer (its own event loop in this thread)."""
    import asyncio
    import ssl

    from aiokafka import AIOKafkaConsumer
    from aiokafka.abc import ConsumerRebalanceListener

    async def main():
        ctx = ssl.create_default_context(cafile=run.b.pki.ca_file)
        ctx.check_hostname = False
        c = AIOKafkaConsumer(bootstrap_servers=run.b.kafka, group_id=run.group, enable_auto_commit=False,
                             auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=300,
                             security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-256",
                             sasl_plain_username="app", sasl_plain_password=PASSWORDS["app"], ssl_context=ctx)

        class Commit(ConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked):
                if revoked:
                    await c.commit()

            async def on_partitions_assigned(self, assigned):
                pass
        c.subscribe([run.topic], listener=Commit())
        await c.start()
        try:
            while not stop.is_set():
                over = len(run.got) >= run.limit
                (c.pause if over else c.resume)(*c.assignment())
                for tp, recs in (await c.getmany(timeout_ms=100, max_records=20)).items():
                    with run.lock:
                        run.got += [(r.partition, r.offset, r.key) for r in recs]
        finally:
            if c.assignment():
                await c.commit()
            await c.stop()
    asyncio.run(main())


@pytest.mark.parametrize("client", ["kafka-python", "aiokafka"])
def test_python_client_groups_rebalance_commit_and_resume_exactly_once(broker, client):
    """As the librdkafka group test, with kafka-python's and aiokafka's own producers (acks=all,
    idempotence) and consumer groups: 3 members, one leaves, one joins, the group stops and
    resumes from its committed offsets; each record once, each partition in order."""
    topic, n = f"orders-{client}", 3000
    if client == "kafka-python":
        kp = kafka.KafkaProducer(acks="all", enable_idempotence=True, compression_type="gzip",
                                 **kafka_python_conf(broker))
        for i in range(n):
            kp.send(topic, key=b"k%d" % i, value=b"v%d" % i, partition=i % 4)
        kp.flush(30)
        kp.close()
    else:
        import asyncio
        import ssl

        from aiokafka import AIOKafkaProducer

        async def produce():
            ctx = ssl.create_default_context(cafile=broker.pki.ca_file)
            ctx.check_hostname = False
            p = AIOKafkaProducer(bootstrap_servers=broker.kafka, acks="all", enable_idempotence=True,
                                 compression_type="lz4", security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-256",
                                 sasl_plain_username="app", sasl_plain_password=PASSWORDS["app"], ssl_context=ctx)
            await p.start()
            try:
                await asyncio.gather(*[await p.send(topic, key=b"k%d" % i, value=b"v%d" % i, partition=i % 4)
                                       for i in range(n)])
            finally:
                await p.stop()
        asyncio.run(produce())
    run = GroupRun(broker, topic, f"app-{client}")
    run.consumer = (lambda stop: kafka_python_member(run, stop)) if client == "kafka-python" else \
        (lambda stop: aiokafka_member(run, stop))
    members = [run.start() for _ in range(3)]
    run.wait_for(n // 4)
    t, stop = members.pop(0)
    stop.set()
    t.join(30)
    run.wait_for(n // 2)
    members.append(run.start())
    run.wait_for(3 * n // 4)
    time.sleep(0.5)
    for t, stop in members:
        stop.set()
    for t, _ in members:
        t.join(30)
    assert len(run.got) < n, "the group read everything before it stopped: nothing left to resume"
    again = [run.start() for _ in range(2)]
    run.wait_for(n)
    time.sleep(1.0)
    for t, stop in again:
        stop.set()
    for t, _ in again:
        t.join(30)
    assert len(run.got) == n and len({(p, o) for p, o, _ in run.got}) == n, \
        f"{len(run.got)} read, {len({(p, o) for p, o, _ in run.got})} distinct"
    for q in range(4):
        assert [o for p, o, _ in run.got if p == q] == list(range(n // 4)), f"partition {q} out of order"
