"""Helpers for store tests."""

from broker.store.commitlog import LeaderItem
from broker.store.message_store import PutItem


def item(i: int, size: int = 100, topic: bytes = b"t", queue_id: int = 0) -> LeaderItem:
    return LeaderItem(i, 1000 + i, i.to_bytes(16, "big"), queue_id, 0, topic, b"",
                      (b"%08d" % i) * (size // 8) + b"x" * (size % 8))


def put_item(i: int, size: int = 100, topic: str = "t", queue_id: int = 0, keys=None,
             tags=None) -> PutItem:
    from broker.store import codec
    props = codec.message_properties(keys=keys, tags=tags)
    return PutItem(topic, topic.encode(), queue_id, 0, 1000 + i, i.to_bytes(16, "big"), props,
                   (b"%08d" % i) * (size // 8) + b"x" * (size % 8))
