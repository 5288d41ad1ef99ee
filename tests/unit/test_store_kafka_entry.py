"""A Kafka batch stored by a real MessageStore (format 2) beside native messages: dispatched
one ConsumeQueue unit per record, read back by `get` as the stored bytes and by every reader
of the log (walk2, check_entry, iter_messages, the message index), and kept whole by recovery
after a restart -- one log, two kinds of zone."""

import pytest

from broker.kafka import records as kr
from broker.store import codec, codec_batch, codec_kafka
from broker.store.commitlog import ZoneItem
from broker.store.message_store import MessageStore, StoreOptions
from tests.unit.storeutil import put_item


def kafka_item(topic: str, queue_id: int, n: int, compression: int = kr.NONE, seq: int = 0) -> ZoneItem:
    recs = [kr.Record(k, k, f"key-{seq + k}".encode(), f"value-{seq + k}".encode(), [("h", b"x")])
            for k in range(n)]
    batch = kr.encode(recs, base_timestamp=1_700_000_000_000, producer_id=7, base_sequence=seq,
                      compression=compression)
    parts, crc, _ = codec_kafka.encode_zone(topic.encode(), queue_id, batch)
    return ZoneItem(topic, queue_id, b"".join(parts), crc, [len(r.value) for r in recs], 0)


def stored_messages(store, topic, queue_id, offset=0):
    r = store.get(topic, queue_id, offset, 1000, 1 << 20)
    return list(codec.iter_messages(r.data, verify=True, from_queue_offset=offset))


@pytest.mark.parametrize("compression", [kr.NONE, kr.GZIP, kr.ZSTD])
def test_a_kafka_batch_is_one_entry_of_the_log_beside_native_messages(tmp_path, compression):
    opts = StoreOptions(segment_bytes=1 << 20, message_index_enable=True)
    store = MessageStore(tmp_path, opts)
    store.open()
    store.put([put_item(0, topic="orders")])
    kb = store.put([kafka_item("orders", 0, 5, compression)])
    store.put([put_item(1, topic="orders")])
    store.dispatch()
    msgs = stored_messages(store, "orders", 0)
    assert [m.queue_offset for m in msgs] == list(range(7))
    assert [m.body for m in msgs[1:6]] == [f"value-{k}".encode() for k in range(5)]
    assert msgs[1].props()["KEYS"] == "key-0" and msgs[1].props()["h:h"] == "x"
    assert kb.phys_offsets == [msgs[1].phys_offset] * 5 and kb.queue_offsets == [1, 2, 3, 4, 5]
    assert msgs[1].msg_id == codec_kafka.msg_id(msgs[1].phys_offset, 0) and msgs[3].batch_pos == 2
    # a get from inside the batch ships the whole entry; the reader drops what it did not ask for
    assert [m.queue_offset for m in stored_messages(store, "orders", 0, 3)] == [3, 4, 5, 6]
    raw = store.commitlog.read_entry(msgs[1].phys_offset)
    assert codec.check_entry(raw)[0] == len(raw)
    assert bytes(codec_kafka.batch(raw, codec.BATCH_HEAD_SIZE))[61:] == \
        bytes(kafka_item("orders", 0, 5, compression).zone)[9 + 6 + 61:]
    start, data = store.commitlog.read_from(0, 1 << 20)
    w = codec.walk2(data, base=start, read="head")
    assert [h.count for _, h in w] == [1, 5, 1] and w.stop.kind != codec.CORRUPT
    assert [len(ms) for _, ms in codec.walk2(data, base=start, read="messages")] == [1, 5, 1]
    store.close()
    again = MessageStore(tmp_path, opts)  # recovery keeps the Kafka entry whole
    again.open()
    again.dispatch()
    assert [m.body for m in stored_messages(again, "orders", 0)] == [m.body for m in msgs]
    again.close()


def test_native_record_walks_refuse_a_kafka_zone_and_format_1_names_the_setting(tmp_path):
    z = kafka_item("t", 0, 2)
    assert codec_batch.is_kafka(z.zone) and not codec_batch.is_kafka(codec.encode_zone("t", 0, [
        (0, 0, bytes(16), b"", b"x")])[0])
    for walk in (codec_batch.walk_records, codec_batch.frame_records):
        with pytest.raises(codec.CorruptEntry, match="a Kafka zone where native records"):
            walk(z.zone)
    store = MessageStore(tmp_path, StoreOptions(segment_bytes=1 << 20, commitlog_format=1))
    store.open()
    with pytest.raises(ValueError, match="commitlog_format: 2"):
        store.put([z])
    store.close()


def test_the_spark_segment_reader_reads_a_kafka_entry_as_rows(tmp_path):
    """What reconcile and Spark SQL see (spark_jobs/segment_reader.py, no Spark needed): a row
    per Kafka record, its msg_id the one iter_messages gives, its key in `keys`; and the slow,
    entry-by-entry reader (a damaged segment) agrees."""
    from spark_jobs.segment_reader import read_columns, read_segment

    store = MessageStore(tmp_path, StoreOptions(segment_bytes=1 << 20))
    store.open()
    store.put([put_item(0, topic="orders")])
    store.put([kafka_item("orders", 1, 3, kr.LZ4)])
    store.dispatch()
    start, data = store.commitlog.read_from(0, 1 << 20)
    want = [m.msg_id.hex() for m in stored_messages(store, "orders", 1)]
    store.close()
    cols = read_columns(data, start)
    entry = [k for k, kind in enumerate(cols["kind"]) if kind == "entry"][1:]
    assert [cols["msg_id"][k] for k in entry] == want
    assert [cols["keys"][k] for k in entry] == [["key-0"], ["key-1"], ["key-2"]]
    assert [(cols["queue_offset"][k], cols["batch_pos"][k]) for k in entry] == [(0, 0), (1, 1), (2, 2)]
    rows = read_segment(data, start)
    assert [r.msg_id for r in rows if r.kind == "entry"][1:] == want and all(r.crc_ok for r in rows if r.kind == "entry")
