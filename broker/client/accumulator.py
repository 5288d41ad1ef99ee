"""The producer's accumulator: which messages travel together, and to which queue.

Messages handed over to a producer between two flushes wait here; a flush drains them as
batches, each bound for one (topic, queue) and sent as one frame (RocketMQ's
ProduceAccumulator, Kafka's RecordAccumulator). Pure: no sockets, no clocks, no futures --
an item is whatever the caller hands over, with its topic, its queue (or None) and its size.

- Items for an explicit queue are batched per that queue.
- Items with no queue go to a sticky queue (Kafka's KIP-480): a whole batch to one queue,
  the next batch of that topic to the next queue, round robin over the topic's write queues
  from a random start. One big batch beats the same messages spread thinly over every queue:
  fewer frames, fewer writes, fewer acknowledgements.
- A batch is cut before it would pass `batch_messages_max` items or `batch_bytes_max` bytes
  (an item bigger than that travels alone), so it never exceeds the broker's limits.
- Within one (topic, queue), batches come out in hand-over order and hold their items in
  hand-over order: the order a producer's messages are stored in within a queue.
"""

from __future__ import annotations

import random
import re
from typing import Any, Callable, NamedTuple

BATCH_MESSAGES_WIRE_MAX = 0xFFFF  # SEND_BATCH's count is a u16


class Batch(NamedTuple):
    topic: str
    queue_id: int | None  # None: the topic's queue count is not known yet (no route)
    sticky: bool  # the queue was picked here, not by the user: a retry may go elsewhere
    items: list
    size: int  # bytes, as the items' sizes say


def check_limits(batch_bytes_max: int, batch_messages_max: int) -> None:
    """ValueError naming the option that no batch could respect."""
    if not (isinstance(batch_messages_max, int) and 1 <= batch_messages_max <= BATCH_MESSAGES_WIRE_MAX):
        raise ValueError(f"batch_messages_max: {batch_messages_max!r}, the limit is "
                         f"1..{BATCH_MESSAGES_WIRE_MAX} (a SEND_BATCH counts messages in a u16)")
    if not (isinstance(batch_bytes_max, int) and batch_bytes_max >= 1):
        raise ValueError(f"batch_bytes_max: {batch_bytes_max!r}, must be an int of at least 1")


_LIMIT_NAMED = re.compile(r"\b(batch_messages_max|batch_bytes_max)=(\d+)")


def limits_named(refusal: str) -> dict[str, int]:
    """The broker's batch limits a MESSAGE_TOO_LARGE refusal names ("... exceeds
    batch_messages_max=8"), e.g. {"batch_messages_max": 8}; {} when it names none (a single
    message over message_body_bytes_max: no batch limit to learn)."""
    return {name: int(v) for name, v in _LIMIT_NAMED.findall(refusal) if int(v) >= 1}


class Accumulator:
    def __init__(self, batch_bytes_max: int, batch_messages_max: int, rng: random.Random):
        check_limits(batch_bytes_max, batch_messages_max)
        self.bytes_max = batch_bytes_max
        self.messages_max = batch_messages_max
        self.rng = rng
        # (topic, queue) -> [items, sizes], insertion order = hand-over order (two lists, not a
        # tuple per message: every object a message allocates is garbage collection work)
        self._groups: dict[tuple[str, int | None], list] = {}
        self._next_queue: dict[str, int] = {}  # per topic: the sticky queue's counter
        self.count = 0  # items waiting
        self.bytes = 0  # their sizes

    def add(self, topic: str, queue_id: int | None, size: int, item: Any) -> None:
        group = self._groups.get((topic, queue_id))
        if group is None:
            group = self._groups[(topic, queue_id)] = [[], []]
        group[0].append(item)
        group[1].append(size)
        self.count += 1
        self.bytes += size

    def lower_limits(self, batch_bytes_max: int, batch_messages_max: int) -> None:
        """Cut the next batches smaller (a broker refused a batch over its own limits)."""
        self.bytes_max = min(self.bytes_max, batch_bytes_max)
        self.messages_max = min(self.messages_max, batch_messages_max)

    def full(self) -> bool:
        """Enough waits for at least one whole batch: lingering longer gains nothing."""
        return self.count >= self.messages_max or self.bytes >= self.bytes_max

    def topics(self) -> list[str]:
        return list(dict.fromkeys(topic for topic, _ in self._groups))

    def drain(self, write_queues: Callable[[str], int | None],
              live: Callable[[Any], bool] | None = None) -> list[Batch]:
        """Every waiting item, in batches; `write_queues(topic)`: the topic's queue count, or
        None when unknown (its sticky batches then say queue None); `live(item)`: False for
        an item to leave out (its send was cancelled)."""
        groups, self._groups = self._groups, {}
        self.count = self.bytes = 0
        out: list[Batch] = []
        for (topic, queue_id), (items, sizes) in groups.items():
            if live is not None and not all(map(live, items)):
                kept = [k for k, item in enumerate(items) if live(item)]
                items, sizes = [items[k] for k in kept], [sizes[k] for k in kept]
            for items, size in self._cut(items, sizes):
                if queue_id is not None:
                    out.append(Batch(topic, queue_id, False, items, size))
                else:
                    out.append(Batch(topic, self._sticky(topic, write_queues(topic)), True, items, size))
        return out

    def _cut(self, items: list, sizes: list):
        """(items, their bytes) per batch, in order, cut at messages_max and bytes_max."""
        total = sum(sizes)
        if len(items) <= self.messages_max and total <= self.bytes_max:
            yield items, total  # the common case: the group is one batch as it is
            return
        cut: list = []
        total = 0
        for item, size in zip(items, sizes):
            if cut and (len(cut) >= self.messages_max or total + size > self.bytes_max):
                yield cut, total
                cut, total = [], 0
            cut.append(item)
            total += size
        if cut:
            yield cut, total

    def _sticky(self, topic: str, queues: int | None) -> int | None:
        """This batch's queue; the topic's next batch goes to the next one."""
        if not queues:
            return None
        n = self._next_queue.get(topic)
        if n is None:
            n = self.rng.randrange(1 << 16)
        self._next_queue[topic] = n + 1
        return n % queues
