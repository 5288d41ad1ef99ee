"""A live broker process takes generated garbage (the `fuzz` bench row, smaller) and comes out
alive, answering, without leaked connections; and it answers over-long fields with a named
error code instead of failing (bug 9b)."""

from __future__ import annotations

import json
import socket

import pytest

from bench import fuzz_bench
from broker.protocol import frame as fr
from broker.protocol import send as sp
from broker.protocol.codes import Code, Req
from ops.localbroker import LocalBroker


@pytest.fixture
def broker(tmp_path):
    lb = LocalBroker(tmp_path / "b", segment_bytes=16 << 20)
    lb.start()
    yield lb
    lb.stop()


def test_broker_survives_20000_fuzzed_frames_without_leaking_connections(broker):
    r = fuzz_bench.run_against(broker.address, broker.pid, frames=20_000, seed=20_000, conns=3)
    assert r["frames"] >= 20_000 and r["connections"] >= 3, r
    # ~82% of the frames ask for an answer (the rest are one-way) and the fuzzer waits for every
    # answer before it closes (was: a fixed 0.5 s, which a loaded box outlasted: 4,223 in CI)
    assert r["answers"] >= 0.75 * r["frames"], r
    assert not r["crashed"] and "error" not in r, r
    assert r["sockets_after"] <= r["sockets_before"], r  # every fuzz connection was let go
    assert r["errors"] == 0, r


def ask(address: str, frames: list[bytes]) -> list[fr.Frame]:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"".join(frames))
        dec, got = fr.FrameDecoder(), []
        while len(got) < len(frames):
            data = s.recv(1 << 16)
            assert data, f"connection closed after {len(got)} answers"
            got += dec.feed(data)
    return got


def test_broker_answers_over_long_fields_with_bad_request_and_keeps_the_connection(broker):
    long_topic = sp.encode_request(sp.SendRequest("t" * 127, 0, 0, 0, b"\0" * 16, b"", b"x"))
    long_topic = long_topic[:32] + bytes([200]) + long_topic[33:35] + b"t" * 200 + b"x"
    huge_create = json.dumps({"topic": "x" * 100_000}).encode()
    answers = ask(broker.address, [fr.encode(Req.SEND, 1, long_topic),
                                   fr.encode(Req.CREATE_TOPIC, 2, huge_create),
                                   fr.encode(Req.STATUS, 3, b"{}")])
    by_corr = {f.corr_id: f for f in answers}
    assert by_corr[1].code == Code.BAD_REQUEST and "TOPIC_BYTES_MAX=127" in by_corr[1].headers["error"]
    # the refusal quotes the 100 KB name: cut, so the answer fits a header (was: no answer)
    assert by_corr[2].code == Code.BAD_REQUEST and len(by_corr[2].headers["error"]) <= fr.ERROR_BYTES_MAX
    assert by_corr[3].code == Code.SUCCESS


def test_the_kafka_listener_survives_30000_generated_requests(tmp_path):
    """The `kafka-fuzz` bench row, smaller: structured requests of every served API and version
    with random field values (every clean connection's requests answered), mutated and random
    ones and framing killers (the connection closed); then a librdkafka produce and fetch
    still work, no socket is left open and RSS stays within the bound."""
    import os

    from bench import kafka_bench
    from ops.localbroker import free_port

    kport = free_port()
    with LocalBroker(tmp_path / "k", kafka_listener=f"127.0.0.1:{kport}", segment_bytes=16 << 20) as b:
        boot = f"127.0.0.1:{kport}"
        assert kafka_bench.serves(boot)
        rss0, _, socks0 = kafka_bench.proc_stats(b.pid)
        counts = kafka_bench.fuzz("127.0.0.1", kport, 30_000, seed=30_000)
        assert os.path.exists(f"/proc/{b.pid}") and kafka_bench.serves(boot), counts
        rss1, _, socks1 = kafka_bench.proc_stats(b.pid)
        print(f"\n{counts}, RSS {rss0} -> {rss1} kB, sockets {socks0} -> {socks1}")
    assert counts["sent"] >= 30_000 and counts["clean_unanswered"] == 0 and counts["closed_by_broker"] >= 1, counts
    assert counts["answers"] >= 0.8 * counts["clean_sent"] > 0
    assert socks1 <= socks0 and rss1 - rss0 < kafka_bench.RSS_GROWTH_KB_MAX
