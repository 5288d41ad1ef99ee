"""Issue 39: system entries (%ACL%, %TOPIC%, %OFFSET%) are applied by the dispatcher; a
retention that deleted segments it had not read left them unapplied for good -- a user
deleted through the log could still log in on that node. Store and dispatch level, with the
broker's own SystemEntries, AclStore and Guard."""

from __future__ import annotations

import json
from types import SimpleNamespace

from broker.acl_store import AclStore
from broker.config import BrokerConfig, RoleEntry, UserEntry
from broker.offsets import OffsetManager
from broker.security.guard import Guard
from broker.security.scram import make_verifier
from broker.store.commitlog import NewEntry
from broker.store.message_store import MessageStore, StoreOptions
from broker.store.retention import RetentionPolicy
from broker.system import SystemEntries, acl_entry, offsets_entry

from .storeutil import put_item

OPTS = StoreOptions(segment_bytes=8192, cq_records_per_file=16, index_slots=64,
                    index_entries_max=256, positions_per_file=32, replicated=True)
ADMIN = UserEntry(name="admin", roles=("admin",), scram=make_verifier("admin-password"))


class Topics(SimpleNamespace):
    def apply(self, cfg: dict) -> None:
        self.applied.append(cfg["name"])


def node(tmp_path):
    """A raft member's store and what its dispatcher applies system entries to."""
    cfg = BrokerConfig(data_dir=tmp_path, insecure=True, users=[ADMIN.model_dump()],
                       roles={"admin": RoleEntry(admin=True).model_dump()})
    acl = AclStore(tmp_path / "config" / "acl.json")
    guard = Guard(cfg, store=acl)
    offsets = OffsetManager(tmp_path / "config" / "consumer_offsets.json")
    topics = Topics(path=tmp_path / "config" / "topics.json", applied=[])
    store = MessageStore(tmp_path / "store", OPTS)
    store.on_system_entry = SystemEntries(topics, offsets, acl=acl).apply
    store.open()
    return store, guard, offsets, topics


def system(store, topic: str, body: bytes) -> int:
    """Append a system entry as a raft leader does (RaftDriver.append_system); its end."""
    return store.put([NewEntry(topic, 0, 0, 0, bytes(16), b"", body)]).end_offset


def test_a_deleted_user_cannot_log_in_after_retention_ran_with_dispatch_behind(tmp_path):
    store, guard, offsets, topics = node(tmp_path)
    system(store, *acl_entry({"op": "set_user", "name": "late", "roles": ["admin"],
                              "scram": make_verifier("late-password")}))
    store.set_committed(store.commitlog.tail.next_index - 1)
    store.dispatch()
    assert "late" in guard.verifiers
    before = store.cqs.dispatched_offset
    system(store, *acl_entry({"op": "delete_user", "name": "late"}))
    system(store, "%TOPIC%", json.dumps({"name": "orders"}).encode())
    system(store, *offsets_entry("billing", "orders", {0: 7}))
    for i in range(40):  # ~5 segments more: the system entries' segment is the oldest
        store.put([put_item(i, 900)])
    store.set_committed(store.commitlog.tail.next_index - 1)  # all committed, none dispatched
    store.checkpoint()
    plan = store.run_retention(RetentionPolicy(), [], now_s=2e9, local_hour=9, disk_ratio=0.99)
    assert store.commitlog.min_offset <= before == store.cqs.dispatched_offset
    assert not plan.delete and "dispatched offset" in plan.held
    store.dispatch()
    assert "late" not in guard.verifiers  # its login fails: no verifier
    assert topics.applied == ["orders"] and offsets.query("billing", "orders", [0]) == {0: 7}
    assert store.queue_bounds("t", 0) == (0, 40)
    store.checkpoint()
    assert store.run_retention(RetentionPolicy(), [], now_s=2e9, local_hour=9, disk_ratio=0.99).delete
    assert store.commitlog.min_offset > before
    store.close()
    # and after a restart: acl.json holds the delete, the log no longer needs to
    store, guard, _, _ = node(tmp_path)
    assert "late" not in guard.verifiers and store.dispatch_gap is None
    store.close()


def test_without_the_dispatcher_the_system_entries_stay_in_the_log(tmp_path):
    """The dispatcher never runs here (a follower's lazy dispatch, a failing ConsumeQueue
    write): however full the disk, retention keeps the unapplied entries, and the store
    refuses sends at disk_usage_ratio_write_max (the broker sets disk_full_reason)."""
    store, guard, _, _ = node(tmp_path)
    system(store, *acl_entry({"op": "delete_user", "name": "admin"}))
    for i in range(40):
        store.put([put_item(i, 900)])
    store.set_committed(store.commitlog.tail.next_index - 1)
    store.commitlog.flush()
    for _ in range(3):
        assert not store.run_retention(RetentionPolicy(), [], now_s=2e9, local_hour=4, disk_ratio=1.0).delete
    assert "admin" in guard.verifiers
    store.dispatch()
    assert "admin" not in guard.verifiers
    store.close()


def test_a_kill_after_retention_re_applies_from_the_checkpoint_which_is_still_in_the_log(tmp_path):
    """Dispatched but not checkpointed: a kill -9 re-dispatches from the checkpoint's offset,
    so retention keeps those entries (%OFFSET% applications are persisted only with the
    checkpoint: Broker._write_checkpoint writes the offsets file first)."""
    store, _, offsets, _ = node(tmp_path)
    store.checkpoint()
    system(store, *offsets_entry("billing", "orders", {0: 9}))
    for i in range(40):
        store.put([put_item(i, 900)])
    store.set_committed(store.commitlog.tail.next_index - 1)
    store.dispatch()
    store.commitlog.flush()
    assert offsets.query("billing", "orders", [0]) == {0: 9}  # in memory only
    assert not store.run_retention(RetentionPolicy(), [], now_s=2e9, local_hour=9, disk_ratio=0.99).delete
    for part in (store.commitlog, store.cqs, store.key_index, store.cp_file):  # kill -9
        part.close()
    store.preparer.shutdown()
    store, _, offsets, _ = node(tmp_path)
    store.set_committed(store.commitlog.tail.next_index - 1)  # the leader says so again
    store.dispatch()
    assert offsets.query("billing", "orders", [0]) == {0: 9}  # re-applied from the log
    store.close()

