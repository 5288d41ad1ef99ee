"""The Kafka protocol on a broker: requests read off a KafkaConnection, mapped onto what the
broker already has -- its topics, its Guard (the same users, SCRAM and ACLs), its
SendProcessor (the one store path: `put`), its replication (the leader, acks=all answered
once the replicas hold it). docs/design/kafka.md is the plan this follows.

Answered so far (ApiVersions lists exactly these): ApiVersions, Metadata (this broker's group),
Produce (record batch v2, every codec, acks 0 / 1 / all), SaslHandshake v1 and
SaslAuthenticate (SCRAM-SHA-256). A request of another API or version gets UNSUPPORTED_VERSION
as far as it can be answered, then the connection is closed; a request that cannot be
decoded closes the connection (Kafka's rule); either way the broker keeps serving.

Mapping: a Kafka topic is a Tidelog topic, partition p its queue p, an offset a queue offset;
a Produce batch is stored as it arrived (codec_kafka: one entry, its CRC-32C checked here).
A broker's Kafka node id is its index in `peers` (0 standalone).
"""

from __future__ import annotations

import asyncio
import logging
import secrets

from broker.kafka import apis, codec, errors as E
from broker.kafka import records as kr
from broker.kafka.apis import APIS
from broker.kafka.admin import SERVED as ADMIN_SERVED
from broker.kafka.admin import KafkaAdmin
from broker.kafka.cluster import ClusterView, kafka_address_of
from broker.kafka.fetch import Fetcher
from broker.kafka.groups import SERVED as GROUPS_SERVED
from broker.kafka.groups import KafkaGroups
from broker.kafka.idempotence import ProducerStates
from broker.processors.send import Refused, Reject
from broker.protocol.codes import Code
from broker.ratelog import RateLimitedLog
from broker.security import acl
from broker.security.guard import AUTH_FAILURES_MAX
from broker.security.scram import AuthFailed
from broker.store import codec_kafka
from broker.store.commitlog import ZoneItem

log = logging.getLogger(__name__)

PRODUCE, FETCH, LIST_OFFSETS, METADATA, SASL_HANDSHAKE, API_VERSIONS, INIT_PRODUCER_ID, SASL_AUTHENTICATE = \
    0, 1, 2, 3, 17, 18, 22, 36
BEFORE_AUTH = frozenset({API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE})
# what is answered, by version (a subset of apis.APIS: the rest is declared, not yet served)
SERVED = {PRODUCE: (3, 9), FETCH: (4, 12), LIST_OFFSETS: (1, 7), METADATA: (1, 12), SASL_HANDSHAKE: (0, 1), API_VERSIONS: (0, 3),
          INIT_PRODUCER_ID: (0, 4),
          SASL_AUTHENTICATE: (0, 2)}
SERVED.update(GROUPS_SERVED)
SERVED.update(ADMIN_SERVED)
MECHANISMS = ["SCRAM-SHA-256", "SCRAM-SHA-512"]
AUTO_CREATE_PER_REQUEST = 16  # topics one Metadata request may auto-create
METADATA_TOPICS_MAX = 10_000  # topics one Metadata request is answered for behind name servers


def _frame(parts: list) -> list:
    size = sum(map(len, parts))
    return [size.to_bytes(4, "big")] + parts


class KafkaService:
    def __init__(self, broker):
        self.broker = broker
        cfg = broker.config
        self.secure = cfg.secure
        self.node_ids = {p.id: k for k, p in enumerate(cfg.peers)} or {cfg.node_id or cfg.broker_name: 0}
        self.me = cfg.node_id or cfg.broker_name
        self.addresses = {p.id: cfg.kafka_address_of(p) for p in cfg.peers}
        if not cfg.peers or cfg.kafka_listener != "auto":  # (its own listener, as configured)
            self.addresses[self.me] = cfg.kafka_listen
        self.cluster_id = f"tidelog-{cfg.broker_name}"
        self._log = RateLimitedLog(log, 1.0)
        self.cluster = ClusterView(broker)
        self.fetcher = Fetcher(broker, self)
        self.producers = ProducerStates()
        self.groups = KafkaGroups(broker, self)
        self.admin = KafkaAdmin(broker, self)
        broker.store.on_kafka_batch = self.producers.on_committed  # every replica's dispatcher
        self._settle_at = 0
        self.handlers = {API_VERSIONS: self.api_versions, METADATA: self.metadata, PRODUCE: self.produce,
                         FETCH: self.fetcher.fetch, LIST_OFFSETS: self.fetcher.list_offsets,
                         INIT_PRODUCER_ID: self.init_producer_id,
                         SASL_HANDSHAKE: self.sasl_handshake, SASL_AUTHENTICATE: self.sasl_authenticate,
                         **self.groups.handlers, **self.admin.handlers}

    def opened(self) -> None:
        """The store is open (its recovery re-dispatched what followed the checkpoint, and
        fed the producers' state): what the log holds past the dispatcher is read first."""
        self.producers.role_changed()
        self._settle_at = self.broker.store.commitlog.tail.offset

    def on_role_changed(self) -> None:
        """Idempotence waits for the dispatcher to read the log as it is now (idempotence.py)."""
        self.producers.role_changed()
        self._settle_at = self.broker.store.commitlog.tail.offset
        self.groups.role_changed()

    def _settled(self) -> None:
        if not self.producers.settling:
            return
        if self.broker._dispatch_owed:
            self.broker.dispatch_now()
        if self.broker.store.cqs.dispatched_offset >= self._settle_at:
            self.producers.settle()

    def listening_on(self, port: int) -> None:
        """The listener's port (when kafka_listener asked for port 0)."""
        host = self.addresses[self.me][0]
        self.addresses[self.me] = (host, port)

    # --- connections ---------------------------------------------------------------------

    def on_connect(self, conn) -> None:
        self.broker.guard.on_connect(conn, None)  # Kafka clients are users, never members

    def refused(self, conn, what: str) -> None:
        self._log.warning(what, "kafka: refused from %s: %s", conn.peer, what)

    def handle(self, conn, frame: bytes) -> None:
        try:
            h = apis.decode_request_header(frame)
        except codec.KafkaDecodeError as e:
            self.refused(conn, f"a request header that cannot be read ({e}): closing")
            return conn.abort()
        key, v = h.api_key, h.api_version
        served = SERVED.get(key)
        if key == API_VERSIONS and not served[0] <= v <= served[1]:
            # its answer is read at v0 by any client: the versions it may use instead
            return self._answer(conn, conn.slot(), h, 0, {"error_code": E.UNSUPPORTED_VERSION,
                                                           "api_keys": self._api_keys()})
        if served is None or not served[0] <= v <= served[1]:
            self.refused(conn, f"api {key} version {v}, which is not served here (ApiVersions lists "
                               f"what is): closing")
            conn.answer(conn.slot(), _frame([h.correlation_id.to_bytes(4, "big", signed=True),
                                             E.UNSUPPORTED_VERSION.to_bytes(2, "big", signed=True)]))
            return conn.close()
        if self.secure and conn.principal is None and key not in BEFORE_AUTH:
            self.refused(conn, f"api {key} before SASL authentication: closing")
            return conn.close()
        api = APIS[key]
        try:
            req = codec.decode(api.request, v, frame, h.body_at)
        except codec.KafkaDecodeError as e:
            self.refused(conn, f"a malformed request (api {key} v{v}): {e}: closing")
            return conn.abort()
        slot = None if key == PRODUCE and req["acks"] == 0 else conn.slot()
        try:
            self.handlers[key](conn, h, req, slot)
        except Exception:  # a bug must not take the connection or the broker down
            log.exception("kafka api %d v%d from %s failed", key, v, conn.peer)
            conn.abort()

    def _answer(self, conn, slot, h, version: int, obj: dict) -> None:
        if slot is None:
            return
        api = APIS[h.api_key]
        parts = [apis.response_header(h.api_key, version, h.correlation_id)] + \
            codec.encode_parts(api.response, version, obj)
        conn.answer(slot, _frame(parts))

    # --- ApiVersions, SASL -----------------------------------------------------------------

    @staticmethod
    def _api_keys() -> list:
        return [{"api_key": k, "min_version": lo, "max_version": hi} for k, (lo, hi) in sorted(SERVED.items())]

    def api_versions(self, conn, h, req, slot) -> None:
        self._answer(conn, slot, h, h.api_version, {"error_code": E.NONE, "api_keys": self._api_keys()})

    def sasl_handshake(self, conn, h, req, slot) -> None:
        """v1 only does SASL here (SaslAuthenticate carries the tokens); v0 is listed because
        librdkafka 2.0 (Debian's kcat) looks for it, and answered as a mechanism refused: a
        client of Kafka 0.10 would send raw tokens next, which are not read."""
        if not self.secure or req["mechanism"] not in MECHANISMS or h.api_version == 0:
            self._answer(conn, slot, h, h.api_version, {"error_code": E.UNSUPPORTED_SASL_MECHANISM,
                                                         "mechanisms": MECHANISMS if self.secure else []})
            return
        conn.sasl = req["mechanism"]
        self._answer(conn, slot, h, h.api_version, {"error_code": E.NONE, "mechanisms": MECHANISMS})

    def sasl_authenticate(self, conn, h, req, slot) -> None:
        out = {"error_code": E.NONE, "error_message": None, "auth_bytes": b"", "session_lifetime_ms": 0}
        if conn.sasl is None or conn.principal is not None:
            out.update(error_code=E.ILLEGAL_SASL_STATE, error_message="SaslHandshake first, once")
            self._answer(conn, slot, h, h.api_version, out)
            return conn.close()
        try:
            reply, done = self.broker.guard.sasl_step(conn, conn.sasl, bytes(req["auth_bytes"]).decode("utf-8", "replace"))
        except AuthFailed as e:
            out.update(error_code=E.SASL_AUTHENTICATION_FAILED, error_message=f"authentication failed: {e}")
            self._answer(conn, slot, h, h.api_version, out)
            if conn.auth.failures >= AUTH_FAILURES_MAX or h.api_version == 0:
                conn.close()
            conn.sasl = None if conn.auth.failures >= AUTH_FAILURES_MAX else conn.sasl
            return
        out["auth_bytes"] = reply.encode()
        self._answer(conn, slot, h, h.api_version, out)

    def partition_error(self, conn, topic: str, q: int, read: bool) -> int:
        """The error a request for `topic`[q] gets here before anything is read or stored
        (E.NONE: none): the ACL first (a name one may not use says nothing of its existence),
        then the topic, this node's leadership, the partition."""
        p = conn.principal  # (None: logged out meanwhile -- a deleted user, a changed password)
        if p is None or (acl.may_sub(p, topic) if read else acl.may_pub(p, topic)) is not None:
            return E.TOPIC_AUTHORIZATION_FAILED
        cfg = self.broker.topics.get(topic)
        if cfg is None:
            return E.UNKNOWN_TOPIC_OR_PARTITION
        if not self.broker.repl.accepting_writes:
            return E.NOT_LEADER_OR_FOLLOWER
        if not 0 <= q < (cfg.read_queues if read else cfg.write_queues):
            return E.UNKNOWN_TOPIC_OR_PARTITION
        return E.NONE

    # --- InitProducerId ----------------------------------------------------------------------

    def init_producer_id(self, conn, h, req, slot) -> None:
        """A producer id for idempotence: random 62 bits (no coordination between groups or
        failovers; two producers collide with a chance of 2^-62), epoch 0; a producer that
        names its id (KIP-360) gets its next epoch. Transactions are not supported."""
        out = {"throttle_time_ms": 0, "error_code": E.NONE, "producer_id": -1, "producer_epoch": -1}
        if req["transactional_id"] is not None:
            out["error_code"] = E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        elif req.get("producer_id", -1) >= 0:
            out.update(producer_id=req["producer_id"], producer_epoch=(req["producer_epoch"] + 1) % 32768)
        else:
            out.update(producer_id=secrets.randbits(62), producer_epoch=0)
        self._answer(conn, slot, h, h.api_version, out)

    # --- Metadata ----------------------------------------------------------------------------

    def _leader(self) -> int:
        lid = self.broker.repl.leader_id
        return self.node_ids.get(lid, -1) if lid in self.addresses else -1

    def _may_create(self, conn, name: str, budget: list) -> bool:
        """Auto-create `name` here as a send would -- only for a principal that may publish to it,
        at most AUTO_CREATE_PER_REQUEST a request, and only with one group (behind name servers a
        topic made in one group would renumber the partitions when the others get it: create it
        on every group, `tidelog topic create --namesrv`); whether it exists now."""
        if self.broker.topics.get(name) is None and name and budget[0] > 0 and not self.cluster.multi:
            p = conn.principal
            if p is not None and acl.may_pub(p, name) is None:
                budget[0] -= 1
                try:
                    self.broker.send_proc.check_send(name, 0, 0, 0)
                except Reject:
                    pass
        return self.broker.topics.get(name) is not None

    def _denied(self, conn, name: str) -> int:
        """Metadata shows a topic to a principal that may publish to it or read it."""
        p = conn.principal
        return E.TOPIC_AUTHORIZATION_FAILED if p is None or (acl.may_pub(p, name) and acl.may_sub(p, name)) \
            else E.NONE

    def metadata(self, conn, h, req, slot) -> None:
        topics = self.broker.topics
        names = None if req["topics"] is None else [t["name"] for t in req["topics"]]
        if names is None:
            names = sorted(n for n in topics.topics if not n.startswith("%"))
        if self.cluster.multi:  # several groups: the name servers' routes (cluster.py)
            return self._spawn(conn, self._metadata_multi(conn, h, req, slot, names))
        replicas = sorted(self.node_ids[n] for n in self.addresses)
        leader = self._leader()
        out, budget = [], [AUTO_CREATE_PER_REQUEST if req.get("allow_auto_topic_creation", True) else 0]
        for name in names:
            err = self._denied(conn, name)
            if err or not self._may_create(conn, name, budget):
                out.append({"error_code": err or E.UNKNOWN_TOPIC_OR_PARTITION, "name": name, "partitions": []})
                continue
            cfg = topics.get(name)
            out.append({"error_code": E.NONE, "name": name, "partitions": [
                {"error_code": E.NONE if leader >= 0 else E.LEADER_NOT_AVAILABLE, "partition_index": q,
                 "leader_id": leader, "replica_nodes": replicas, "isr_nodes": replicas, "offline_replicas": []}
                for q in range(cfg.write_queues)]})
        brokers = [{"node_id": self.node_ids[n], "host": host, "port": port, "rack": None}
                   for n, (host, port) in sorted(self.addresses.items(), key=lambda x: self.node_ids[x[0]])]
        self._answer(conn, slot, h, h.api_version, {"brokers": brokers, "cluster_id": self.cluster_id,
                                                     "controller_id": leader, "topics": out})

    async def _metadata_multi(self, conn, h, req, slot, names) -> None:
        brokers, topics = await self.cluster.metadata(conn, names[:METADATA_TOPICS_MAX],
                                                      lambda n: self._may_create(conn, n, [0]),
                                                      lambda n: self._denied(conn, n))
        try:
            coord = await self.cluster.coordinator()
        except Exception as e:  # noqa: BLE001 - the name servers do not answer: no controller named
            log.warning("kafka: no coordinator group from the name servers: %s", e)
            coord = None
        controller = next((b["node_id"] for b in brokers if coord and coord[1] and
                           (b["host"], b["port"]) == kafka_address_of(coord[1])), -1)
        self._answer(conn, slot, h, h.api_version, {"brokers": brokers, "cluster_id": self.cluster_id,
                                                     "controller_id": controller, "topics": topics})

    def _spawn(self, conn, coro) -> None:
        """Answer a request from a task (it waits on the name servers); its slot keeps the order."""
        conn.add_inflight(1)

        def done(t: asyncio.Task) -> None:
            conn.done_inflight(1)
            if not t.cancelled() and t.exception() is not None:
                log.error("kafka request from %s failed: %r", conn.peer, t.exception())
                conn.abort()
            else:
                conn.flush()
        asyncio.ensure_future(coro).add_done_callback(done)

    # --- Produce ------------------------------------------------------------------------------

    def produce(self, conn, h, req, slot) -> None:
        acks = req["acks"]
        results: list = []  # [topic, [partition answer dicts]]
        items, places = [], []  # the ZoneItems to store, and the answer each one fills
        sp = self.broker.send_proc
        for t in req["topic_data"]:
            name, answers = t["name"], []
            results.append({"name": name, "partition_responses": answers})
            for p in t["partition_data"]:
                a = {"index": p["index"], "error_code": E.NONE, "base_offset": -1, "log_append_time_ms": -1,
                     "log_start_offset": -1, "record_errors": [], "error_message": None}
                answers.append(a)
                if req["transactional_id"] is not None:
                    a.update(error_code=E.INVALID_RECORD, error_message="transactions are not supported")
                    continue
                if acks not in (0, 1, -1):
                    a.update(error_code=E.INVALID_REQUIRED_ACKS, error_message=f"acks={acks}: 0, 1 or -1")
                    continue
                why = "logged out" if conn.principal is None else self.broker.guard.may_pub(conn, name)
                if why is not None:  # (before anything is looked up for the topic)
                    a.update(error_code=E.TOPIC_AUTHORIZATION_FAILED, error_message=why)
                    continue
                q = self.cluster.local_queue(name, p["index"])
                if q is None:
                    a.update(error_code=E.NOT_LEADER_OR_FOLLOWER, error_message=f"partition {p['index']} of "
                             f"{name} is another group's (or its numbering is being fetched): refresh metadata")
                    continue
                try:
                    for item, kb in self._zone_items(conn, name, q, p["records"]):
                        if isinstance(item, int):  # a duplicate of a stored batch: its first offset
                            a["base_offset"] = item if a["base_offset"] == -1 else a["base_offset"]
                            continue
                        items.append(item)
                        places.append((a, item.count, kb))
                except kr.InvalidRecord as e:
                    self.refused(conn, f"a Produce to {name}[{p['index']}]: {e}")
                    a.update(error_code=e.code, error_message=str(e))
                except Reject as e:
                    a.update(error_code=E.from_code(e.code), error_message=str(e))
        answered = {"responses": results, "throttle_time_ms": 0}
        if not items:
            return self._answer(conn, slot, h, h.api_version, answered)

        def answering(batch):
            k = 0
            for a, n, kb in places:
                if a["base_offset"] == -1:
                    a["base_offset"] = batch.queue_offsets[k]
                if kb is not None:
                    self.producers.on_appended(*kb, batch.queue_offsets[k])
                k += n

            def reply(code, error):
                if code:
                    for a, _, _ in places:
                        a.update(error_code=E.from_code(code), error_message=error)
                self._answer(conn, slot, h, h.api_version, answered)
            if acks == 1:  # the leader stored it: answered now, whatever the replicas do later
                reply(0, None)
                return (lambda code, error: None), 0
            return reply, int(slot is not None)
        try:
            sp.put(conn, items, answering)
        except Refused as e:
            for a, _, _ in places:
                a.update(error_code=E.from_code(e.code), error_message=str(e), base_offset=-1)
            self._answer(conn, slot, h, h.api_version, answered)

    def _zone_items(self, conn, topic: str, partition: int, data) -> list:
        """A partition's record batches as the store's items, every check made: the topic
        and partition, PUB, the batches' framing, CRC-32C and records, the size bounds.
        Each item comes with the (topic, queue, producer id, epoch, base sequence, count) it
        stores, or None; a duplicate of a batch stored before is its first offset instead
        of an item (idempotence.py). Raises Reject or records.InvalidRecord (the whole
        partition is refused)."""
        sp = self.broker.send_proc
        self._settled()
        why = self.broker.guard.may_pub(conn, topic)
        if why is not None:
            raise Reject(Code.NO_PERMISSION, why)
        if not data:
            raise kr.InvalidRecord(E.CORRUPT_MESSAGE, "no record batch")
        out, idempotent = [], False
        for b in kr.split(data):
            hd = b.head
            if hd.is_transactional or hd.is_control:
                raise kr.InvalidRecord(E.INVALID_RECORD, "transactional and control batches are not supported")
            if len(b.data) > sp.zone_max:  # (before anything is decompressed)
                raise kr.InvalidRecord(E.MESSAGE_TOO_LARGE, f"a batch of {len(b.data)} bytes: one entry here "
                                       f"holds {sp.zone_max}")
            if not 1 <= hd.records_count <= codec_kafka.BATCH_COUNT_MAX:  # (the zone head's count field)
                raise kr.InvalidRecord(E.MESSAGE_TOO_LARGE, f"a batch of {hd.records_count} records: one entry "
                                       f"holds at most {codec_kafka.BATCH_COUNT_MAX}")
            bodies, payload = [], 0
            for k, r in enumerate(kr.records(b)):
                if r.offset_delta != k:  # (Kafka's log validator: offsets are the records' places)
                    raise kr.InvalidRecord(E.INVALID_RECORD, f"record {k} has offset delta {r.offset_delta}")
                bodies.append(len(r.value or b""))
                payload += bodies[-1] + len(r.key or b"") + sum(len(n) + len(v or b"") for n, v in r.headers)
            if len(bodies) != hd.records_count:
                raise kr.InvalidRecord(E.INVALID_RECORD, f"{len(bodies)} records in a batch that says "
                                       f"{hd.records_count}")
            if payload > sp.batch_bytes_max:
                raise kr.InvalidRecord(E.MESSAGE_TOO_LARGE, f"a batch of {payload} bytes of keys, values and "
                                       f"headers: the bound is batch_bytes_max={sp.batch_bytes_max}")
            sp.check_send(topic, partition, max(bodies), 0)
            kb = None if hd.producer_id < 0 else (topic, partition, hd.producer_id, hd.producer_epoch,
                                                  hd.base_sequence, hd.records_count)
            if kb is not None:
                if idempotent:  # (checked against the state before either is stored: one at a time)
                    raise kr.InvalidRecord(E.INVALID_RECORD, "two idempotent batches for one partition in one "
                                           "request: one per request")
                idempotent = True
                v = self.producers.check(*kb)
                if v.error:
                    raise kr.InvalidRecord(v.error, v.message)
                if v.duplicate:
                    out.append((v.base_offset, None))
                    continue
            parts, crc, _ = codec_kafka.encode_zone(topic.encode(), partition, b.data)
            out.append((ZoneItem(topic, partition, b"".join(parts), crc, bodies, 0), kb))
        return out
