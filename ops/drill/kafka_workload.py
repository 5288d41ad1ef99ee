"""The drill's workload through Kafka (`tidelog drill --workload kafka`): the same open-loop
operations as workload.Workload, sent by librdkafka (confluent-kafka) to the group's Kafka
listeners with acks=all and idempotence on, every operation recorded for the history checker.

Each operation is one record (key `op-<id>`, value `<run>:<id>`, the native workload's shape,
so the native drain and the checker read it unchanged): its delivery report gives the
partition (the queue) and offset it was acknowledged at; an error report makes it "unknown"
(librdkafka gives up after message.timeout.ms: the record may still be stored). librdkafka
retries by itself across failovers (NOT_LEADER_OR_FOLLOWER, a dead leader), so a drill through
it checks what a Kafka application sees: nothing acknowledged lost, nothing stored twice.
"""

from __future__ import annotations

from broker.config import KAFKA_PORT_OFFSET, parse_hostport
from ops.drill.checker import Op
from ops.drill.workload import WorkloadThread

MESSAGE_TIMEOUT_MS = 30_000
TOPIC_PARTITIONS = 4


def kafka_bootstrap(addresses: list[str]) -> str:
    """The group's Kafka listeners (`kafka_listener: auto`: each client port + 2)."""
    out = []
    for a in addresses:
        host, port = parse_hostport(a)
        out.append(f"[{host}]:{port + KAFKA_PORT_OFFSET}" if ":" in host else f"{host}:{port + KAFKA_PORT_OFFSET}")
    return ",".join(out)


def rdkafka_config(addresses: list[str], credentials=None, **extra) -> dict:
    conf = {"bootstrap.servers": kafka_bootstrap(addresses), **extra}
    if credentials is not None and credentials.username:
        conf.update({"security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-256",
                     "sasl.username": credentials.username, "sasl.password": credentials.password,
                     "ssl.ca.location": credentials.ca_file})
    return conf


class KafkaWorkload(WorkloadThread):
    """workload.Workload's operations over librdkafka (WorkloadThread: start, stop, ops, acked, error)."""

    client = "librdkafka"
    thread_name = "drill-kafka-workload"

    def _report(self, op: Op):
        def done(err, msg) -> None:
            op.t1 = self.now()
            if err is None:
                op.outcome, op.queue, op.offset = "ok", msg.partition(), msg.offset()
                self.acked += 1
            else:
                op.outcome, op.error = "unknown", str(err)[:200]
        return done

    def _run(self) -> None:
        from confluent_kafka import Producer

        p = Producer(rdkafka_config(self.bootstrap, self.credentials, **{
            "acks": "all", "enable.idempotence": True, "linger.ms": 5,
            "message.timeout.ms": MESSAGE_TIMEOUT_MS}))
        i = 0
        try:
            while not self._stop.is_set():
                wait = i / self.rate - self.now()
                if wait > 0:
                    p.poll(min(wait, 0.05))
                    continue
                op = Op(i, t0=self.now())
                self.ops.append(op)
                p.produce(self.topic, f"{self.run_id}:{op.id}".encode(), key=f"op-{op.id}".encode(),
                          on_delivery=self._report(op))
                p.poll(0)
                i += 1
        finally:
            p.flush(MESSAGE_TIMEOUT_MS / 1000 + 5)
