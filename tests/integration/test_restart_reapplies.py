"""A restart re-applies the system entries after the last checkpoint on top of the topic and
offset files, not under them: in raft mode consumer offsets and topic configs reach a node
through the log and are written at checkpoints, so those committed after the last one live
only in the log until the next. Broker.start loaded the files after the store had re-applied
those entries, and overwrote them (found by the retention simulation's author, issue 39)."""

from broker.store.commitlog import NewEntry
from broker.store.message_store import MessageStore
from broker.system import offsets_entry

from ..helpers import BrokerThread


def test_offsets_committed_after_the_last_checkpoint_survive_a_crash(tmp_path):
    d = tmp_path / "b"
    with BrokerThread(d) as b:  # a clean stop writes the offsets file: {0: 5}
        b.call(lambda: b.broker.offsets.commit("billing", "orders", {0: 5}))
        config = b.config
    store = MessageStore(d, config.store_options())  # then, as a raft follower would, with no checkpoint after:
    store.open()
    store.put([NewEntry(*offsets_entry("billing", "orders", {0: 9})[:1], 0, 0, 1, b"\x01" * 16, b"",
                        offsets_entry("billing", "orders", {0: 9})[1])])
    store.commitlog.flush()
    store.preparer.shutdown()  # and the process dies here (no close, no checkpoint)
    with BrokerThread(d) as b:
        assert b.call(lambda: b.broker.offsets.query("billing", "orders", [0])) == {0: 9}
