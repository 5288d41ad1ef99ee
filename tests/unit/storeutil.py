"""Helpers for store tests."""

from broker.store import codec
from broker.store.commitlog import NewEntry


def body_of(i: int, size: int) -> bytes:
    return (b"%08d" % i) * (size // 8) + b"x" * (size % 8)


def item(i: int, size: int = 100, topic: str = "t", queue_id: int = 0) -> NewEntry:
    return NewEntry(topic, queue_id, 0, 1000 + i, i.to_bytes(16, "big"), b"", body_of(i, size))


def put_item(i: int, size: int = 100, topic: str = "t", queue_id: int = 0, keys=None,
             tags=None) -> NewEntry:
    return NewEntry(topic, queue_id, 0, 1000 + i, i.to_bytes(16, "big"),
                    codec.message_properties(keys=keys, tags=tags), body_of(i, size))


def append(cl, items, term=0, ts=0):
    """append_as_leader with queue offsets equal to the items' numbers."""
    return cl.append_as_leader(items, [int.from_bytes(it.msg_id, "big") for it in items], term, ts)
