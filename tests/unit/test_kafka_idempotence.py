"""broker/kafka/idempotence.py: the verdicts of Kafka's idempotent produce, and a seeded
search: a producer that retries, reorders and restarts (new epochs) against a leader whose
state is rebuilt from what was committed never gets a batch stored twice or out of order."""

import os
import random

import pytest

from broker.kafka.idempotence import (INVALID_PRODUCER_EPOCH, OUT_OF_ORDER_SEQUENCE_NUMBER, REQUEST_TIMED_OUT,
                                      SEQ_MOD, ProducerStates)

T = ("t", 0, 7)


def test_verdicts():
    s = ProducerStates()
    assert s.check(*T, 0, 0, 3).error == 0  # first batch
    s.on_appended(*T, 0, 0, 3, 100)
    assert s.check(*T, 0, 0, 3).error == REQUEST_TIMED_OUT  # a retry of one still in flight
    assert s.check(*T, 0, 3, 2).error == 0  # the next one, pipelined
    assert s.check(*T, 0, 4, 2).error == OUT_OF_ORDER_SEQUENCE_NUMBER
    s.on_committed(*T, 0, 0, 3, 100)
    v = s.check(*T, 0, 0, 3)
    assert v.duplicate and v.base_offset == 100  # committed: answered with its first offset
    s.role_changed()
    assert s.check(*T, 0, 3, 1).error == REQUEST_TIMED_OUT  # until the dispatcher read the whole log
    s.settle()
    assert s.check(*T, 0, 3, 1).error == 0 and s.check(*T, 0, 5, 1).error == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert s.check(*T, 1, 0, 1).error == 0 and s.check(*T, 1, 9, 1).error == OUT_OF_ORDER_SEQUENCE_NUMBER
    s.on_committed(*T, 1, 0, 1, 103)
    assert s.check(*T, 0, 3, 1).error == INVALID_PRODUCER_EPOCH
    assert s.check("t", 0, -1, -1, -1, 5).error == 0  # not idempotent: stored
    s.on_committed(*T, 1, SEQ_MOD - 1, 1, 104)  # (sequences wrap)
    assert s.check(*T, 1, 0, 1).error == 0


@pytest.mark.parametrize("seed", range(300))
def test_a_retrying_producer_never_gets_a_batch_stored_twice(seed):
    """A producer sends numbered batches with up to 5 in flight, each answer lost at random,
    and resends in order from the first unacknowledged one; the leader stores, the quorum
    commits (each committed batch's answer reaches the producer or not), and the leader fails
    over now and then: its uncommitted appends cut, or kept and committed by the next leader
    (which settles once they are). The log must hold each batch at most once and in order,
    and every acknowledged batch. (A failure prints its seed; TIDELOG_SEED moves the range.)"""
    base_seed = int(os.environ.get("TIDELOG_SEED", 0)) * 1000 + seed
    rng = random.Random(base_seed)
    s = ProducerStates()
    log, uncommitted, acked = [], [], set()
    batches, seq = [], 0
    for _ in range(30):
        c = rng.randint(1, 4)
        batches.append((seq, c))
        seq = (seq + c) % SEQ_MOD
    for _ in range(3000):
        nxt = next((k for k in range(len(batches)) if k not in acked), None)
        if nxt is None:
            break
        for k in range(nxt, min(len(batches), nxt + 5)):  # (re)send the window in order
            if k in acked:
                continue
            v = s.check("t", 0, 7, 0, *batches[k])
            if v.error == 0 and v.duplicate and rng.random() < 0.7:
                acked.add(k)  # answered with the stored batch's offset
            elif v.error == 0 and not v.duplicate:
                uncommitted.append(batches[k])
                s.on_appended("t", 0, 7, 0, *batches[k], sum(b[1] for b in log + uncommitted))
            if rng.random() < 0.3:
                break
        r = rng.random()
        if r < 0.5 and uncommitted:  # the quorum commits what was stored: answers may get lost
            for b in uncommitted:
                s.on_committed("t", 0, 7, 0, *b, sum(x[1] for x in log))
                log.append(b)
                if rng.random() < 0.6:
                    acked.add(batches.index(b))
            uncommitted = []
            s.settle()
        elif r < 0.6:  # a failover: what was not committed is cut, or kept for the next leader
            if rng.random() < 0.5:
                uncommitted = []
            s.role_changed()
            if not uncommitted:
                s.settle()
    stored = log + uncommitted
    assert len(stored) == len(set(stored)), f"seed {base_seed}: a batch stored twice: {stored}"
    assert stored == batches[:len(stored)], f"seed {base_seed}: out of order: {stored}"
    for k in acked:
        assert batches[k] in stored, f"seed {base_seed}: acknowledged batch {k} is not in the log"
    assert len(acked) == len(batches), f"seed {base_seed}: the producer never finished ({len(acked)} acked)"


def test_a_new_leader_that_does_not_settle_stores_a_retry_twice(monkeypatch):
    """The mutation check for `settling`: a new leader that checks retries against its
    committed state alone (its predecessor's uncommitted batches unseen) stores a batch twice
    within a few seeds of the search above."""
    monkeypatch.setattr(ProducerStates, "role_changed", lambda self: self.pending.clear())
    failed = []
    for seed in range(300):
        try:
            test_a_retrying_producer_never_gets_a_batch_stored_twice(seed)
        except AssertionError as e:
            failed.append((seed, str(e)))
            break
    assert failed and "stored twice" in failed[0][1], failed
