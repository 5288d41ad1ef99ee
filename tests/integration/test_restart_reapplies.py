"""A restart re-applies the system entries after the last checkpoint on top of the topic and
offset files, not under them: in raft mode consumer offsets and topic configs reach a node
through the log and are written at checkpoints, so those committed after the last one live
only in the log until the next. Broker.start loaded the files after the store had re-applied
those entries, and overwrote them (found by the retention simulation's author, issue 39)."""

from broker.store.commitlog import NewEntry
from broker.store.message_store import MessageStore
from broker.system import offsets_entry

from ..helpers import BrokerThread

STORE_FIELDS = ("segment_bytes", "message_body_bytes_max", "cq_records_per_file", "index_slots", "index_entries_max")


def later_commit_then_die(d, config) -> None:
    """An %OFFSET% entry {0: 9} after the last checkpoint, as a raft node holds one it applied
    but had not checkpointed yet when it died (no close, no checkpoint after the append)."""
    store = MessageStore(d, config.store_options())
    store.open()
    topic, body = offsets_entry("billing", "orders", {0: 9})
    store.put([NewEntry(topic, 0, 0, 1, b"\x01" * 16, b"", body)])
    store.commitlog.flush()
    store.preparer.shutdown()


def test_offsets_committed_after_the_last_checkpoint_survive_a_crash(tmp_path):
    d = tmp_path / "b"
    with BrokerThread(d) as b:  # a clean stop writes the offsets file: {0: 5}
        b.call(lambda: b.broker.offsets.commit("billing", "orders", {0: 5}))
        config = b.config
    later_commit_then_die(d, config)
    with BrokerThread(d) as b:
        assert b.call(lambda: b.broker.offsets.query("billing", "orders", [0])) == {0: 9}


def test_offsets_re_applied_at_a_start_survive_a_crash_right_after_it(tmp_path):
    """The store's own checkpoint at the end of open (and at a cut) moves the dispatched
    offset past the entries it re-applied: the offsets file must be written before it, or a
    kill -9 before the broker's next periodic checkpoint loses them for good."""
    from ops.localbroker import LocalBroker

    d = tmp_path / "b"
    with BrokerThread(d) as b:
        b.call(lambda: b.broker.offsets.commit("billing", "orders", {0: 5}))
        config = b.config
    later_commit_then_die(d, config)
    same = {k: config.model_dump()[k] for k in STORE_FIELDS}
    lb = LocalBroker(d, checkpoint_interval_ms=600_000, **same).start()  # no periodic checkpoint
    lb.kill()
    with BrokerThread(d) as b:
        assert b.call(lambda: b.broker.offsets.query("billing", "orders", [0])) == {0: 9}
