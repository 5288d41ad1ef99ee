"""Idempotent produce (KIP-98's producer ids and sequences), pure: what a leader answers a
batch that carries a producer id, given what the log holds.

Each Kafka batch names (producer_id, producer_epoch, base_sequence, records_count); per
partition, a producer's batches must follow each other: the next base_sequence is one past
the last batch's last sequence (int32, wrapping). The state of a (topic, partition,
producer) is its epoch and its last BATCHES_KEPT batches (first and last sequence, first
queue offset), and it comes from two places:

- `committed`: built by every replica's dispatcher from the Kafka entries it indexes (the
  zone head holds the four fields: nothing is decompressed), so a new leader knows every
  producer the old one acknowledged;
- `pending`: this leader's own appends since it became leader (stored, not yet
  dispatched), so a batch pipelined right behind another is checked against it. A role change
  clears it (what was not committed may be cut).

A new leader's log may hold batches its predecessor stored and nobody committed yet: its
dispatcher has not seen them, and a retry of one would pass for a new batch. So from a role
change until the dispatcher has read the whole log the leader had then (`settle`, called by
the service once the dispatched offset reaches it), every idempotent batch is answered
REQUEST_TIMED_OUT: the producer retries, and by then the state is whole.

`check` says what to do with a batch: store it (None), answer it as a duplicate of a
stored batch (its first offset; once that batch is committed -- before that, REQUEST_TIMED_OUT,
and the producer retries), or refuse it (OUT_OF_ORDER_SEQUENCE_NUMBER, INVALID_PRODUCER_EPOCH).
A producer the leader has no state for may start at any sequence (its earlier batches may have
aged out of the log).
"""

from __future__ import annotations

from typing import NamedTuple

BATCHES_KEPT = 5  # Kafka's max.in.flight.requests.per.connection bound for idempotence
SEQ_MOD = 1 << 31
PRODUCERS_MAX = 100_000  # per broker: the oldest producers' state is dropped past it

OUT_OF_ORDER_SEQUENCE_NUMBER, INVALID_PRODUCER_EPOCH, REQUEST_TIMED_OUT = 45, 47, 7


class Seen(NamedTuple):
    first_seq: int
    last_seq: int
    base_offset: int


class Verdict(NamedTuple):
    error: int  # 0: store it, or (duplicate) answer it with base_offset
    duplicate: bool = False
    base_offset: int = -1
    message: str | None = None


STORE = Verdict(0)


class ProducerStates:
    def __init__(self):
        self.committed: dict[tuple, tuple[int, list[Seen]]] = {}  # (topic, q, pid) -> (epoch, batches)
        self.pending: dict[tuple, tuple[int, list[Seen]]] = {}
        self.settling = False  # a role change: wait for the dispatcher to read the whole log

    @staticmethod
    def _add(table: dict, key, epoch: int, seen: Seen) -> None:
        cur = table.get(key)
        if cur is None or epoch > cur[0]:
            table[key] = (epoch, [seen])
        elif epoch == cur[0]:
            cur[1].append(seen)
            del cur[1][:-BATCHES_KEPT]
        if len(table) > PRODUCERS_MAX:
            del table[next(iter(table))]

    def on_committed(self, topic: str, q: int, pid: int, epoch: int, seq: int, count: int, base_offset: int) -> None:
        """A Kafka batch the dispatcher indexed (every replica)."""
        if pid >= 0:
            self._add(self.committed, (topic, q, pid), epoch, Seen(seq, (seq + count - 1) % SEQ_MOD, base_offset))

    def on_appended(self, topic: str, q: int, pid: int, epoch: int, seq: int, count: int, base_offset: int) -> None:
        """A batch this leader just stored."""
        if pid >= 0:
            self._add(self.pending, (topic, q, pid), epoch, Seen(seq, (seq + count - 1) % SEQ_MOD, base_offset))

    def role_changed(self) -> None:
        self.pending.clear()
        self.settling = True

    def settle(self) -> None:
        """The dispatcher has read every entry the log held at the last role change."""
        self.settling = False

    def check(self, topic: str, q: int, pid: int, epoch: int, seq: int, count: int) -> Verdict:
        if pid < 0:
            return STORE
        if self.settling:
            return Verdict(REQUEST_TIMED_OUT, message="a new leader is still reading its log's idempotence "
                           "state: retry")
        key = (topic, q, pid)
        done, mine = self.committed.get(key), self.pending.get(key)
        last = max((s for s in (done, mine) if s is not None), key=lambda s: (s[0], s[1][-1].base_offset),
                   default=None)
        if last is None:
            return STORE
        last_epoch, batches = last
        if epoch < last_epoch:
            return Verdict(INVALID_PRODUCER_EPOCH, message=f"producer {pid} epoch {epoch} is older than "
                           f"{last_epoch}: a newer instance of this producer took over")
        if epoch > last_epoch:
            return STORE if seq == 0 else Verdict(
                OUT_OF_ORDER_SEQUENCE_NUMBER, message=f"producer {pid}'s new epoch {epoch} starts at sequence {seq}, not 0")
        last_seq = (seq + count - 1) % SEQ_MOD
        for table in (done, mine):
            if table is None or table[0] != epoch:
                continue
            for s in table[1]:
                if s.first_seq == seq and s.last_seq == last_seq:
                    if table is done:
                        return Verdict(0, True, s.base_offset)
                    return Verdict(REQUEST_TIMED_OUT, message=f"a retry of sequences {seq}..{last_seq}, still "
                                   f"being replicated: retry")
        expected = (batches[-1].last_seq + 1) % SEQ_MOD
        if seq != expected:
            return Verdict(OUT_OF_ORDER_SEQUENCE_NUMBER, message=f"producer {pid} sent sequence {seq} to "
                           f"{topic}[{q}]; the next one is {expected}")
        return STORE
