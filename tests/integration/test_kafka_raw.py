"""Raw Kafka requests against a real broker (insecure, to reach the handlers with exactly the
bytes a test chooses): an idempotent batch retried after the broker was killed -9 is answered
as the duplicate it is (the producer state is rebuilt by the recovery's re-dispatch)."""

from __future__ import annotations

import socket
import struct

import pytest

from broker.kafka import apis, codec
from broker.kafka import records as kr
from ops.localbroker import LocalBroker, free_port


def call(sock, key: int, version: int, body: dict, corr: int = 1) -> dict:
    api = apis.APIS[key]
    head = struct.pack(">hhih", key, version, corr, 3) + b"raw"
    if api.request.flexible(version):
        head += b"\x00"
    data = head + codec.encode(api.request, version, body)
    sock.sendall(struct.pack(">i", len(data)) + data)
    size = struct.unpack(">i", recv(sock, 4))[0]
    frame = recv(sock, size)
    assert struct.unpack_from(">i", frame)[0] == corr
    at = 4 + (1 if api.response.flexible(version) and key != apis.API_VERSIONS else 0)
    return codec.decode(api.response, version, frame, at)


def recv(sock, n: int) -> bytes:
    out = b""
    while len(out) < n:
        got = sock.recv(n - len(out))
        assert got, f"closed after {len(out)} of {n} bytes"
        out += got
    return out


def produce(sock, batch: bytes, corr: int) -> dict:
    r = call(sock, 0, 7, {"transactional_id": None, "acks": -1, "timeout_ms": 5000,
                          "topic_data": [{"name": "raw", "partition_data": [{"index": 0, "records": batch}]}]}, corr)
    return r["responses"][0]["partition_responses"][0]


@pytest.fixture
def broker(tmp_path):
    kport = free_port()
    b = LocalBroker(tmp_path / "b", kafka_listener=f"127.0.0.1:{kport}", flush="sync")
    b.kport = kport
    b.start()
    yield b
    b.kill()


def test_an_idempotent_retry_after_a_kill_is_answered_as_a_duplicate(broker):
    batches = [kr.encode([kr.Record(0, 0, b"k", b"v%d" % i, [])], producer_id=4242, producer_epoch=0,
                         base_sequence=i) for i in range(3)]
    with socket.create_connection(("127.0.0.1", broker.kport), timeout=10) as s:
        firsts = [produce(s, b, corr=i + 1) for i, b in enumerate(batches)]
    assert [(a["error_code"], a["base_offset"]) for a in firsts] == [(0, 0), (0, 1), (0, 2)]
    broker.kill()  # kill -9: the checkpoint is older than these entries
    broker.start()
    with socket.create_connection(("127.0.0.1", broker.kport), timeout=10) as s:
        again = produce(s, batches[2], corr=9)  # the client did not hear the answer: it retries
        nxt = produce(s, kr.encode([kr.Record(0, 0, b"k", b"v3", [])], producer_id=4242, producer_epoch=0,
                                   base_sequence=3), corr=10)
        gap = produce(s, kr.encode([kr.Record(0, 0, b"k", b"v9", [])], producer_id=4242, producer_epoch=0,
                                   base_sequence=9), corr=11)
    assert (again["error_code"], again["base_offset"]) == (0, 2), again  # not stored a second time
    assert (nxt["error_code"], nxt["base_offset"]) == (0, 3), nxt
    assert gap["error_code"] == 45, gap  # OUT_OF_ORDER_SEQUENCE_NUMBER



def test_record_offsets_must_be_their_places(broker):
    """A batch whose records' offset deltas are not 0, 1, ... (Kafka's log validator refuses it)
    would give Kafka consumers offsets the queue does not have: INVALID_RECORD, nothing stored."""
    bad = kr.encode([kr.Record(0, 0, None, b"a", []), kr.Record(10 ** 9, 0, None, b"b", [])])
    with socket.create_connection(("127.0.0.1", broker.kport), timeout=10) as s:
        r = produce(s, bad, corr=1)
        ok = produce(s, kr.encode([kr.Record(0, 0, None, b"a", []), kr.Record(1, 0, None, b"b", [])]), corr=2)
    assert r["error_code"] == 87, r  # (Produce v7 has no error_message)
    assert (ok["error_code"], ok["base_offset"]) == (0, 0), ok
