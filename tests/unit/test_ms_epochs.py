"""Epoch lists and the fork point between two logs (replication/master_slave/epochs.py)."""

import random

import pytest

from replication.master_slave.epochs import EpochList, Plan, consistent_point, sync_plan


def test_epoch_list_keeps_order_and_truncates():
    e = EpochList([[1, 0], [2, 500]])
    with pytest.raises(ValueError):
        e.open(2, 900)  # not newer
    with pytest.raises(ValueError):
        e.open(3, 400)  # starts before the last one
    e.open(4, 900)
    assert e.last_epoch == 4 and e.start_of(2) == 500 and e.find(3) is None
    assert e.end_of(0, 2000) == 500 and e.end_of(2, 2000) == 2000
    assert e.truncate(900) and e.to_list() == [[1, 0], [2, 500]]
    assert not e.truncate(901)
    with pytest.raises(ValueError):
        EpochList([[2, 0], [1, 10]])


@pytest.mark.parametrize("slave, s_end, master, m_end, expect", [
    ([[1, 0]], 700, [[1, 0]], 900, 700),  # behind, same epoch: nothing to cut
    ([[1, 0]], 900, [[1, 0]], 700, 700),  # a master that lost its tail in a crash: cut
    ([[1, 0]], 1000, [[1, 0], [2, 800]], 1500, 800),  # an old master's suffix after the fork
    ([[1, 0]], 500, [[1, 0], [2, 800]], 1500, 500),  # a slave that was behind the fork
    ([[1, 0], [3, 800]], 900, [[1, 0], [2, 800]], 1500, 800),  # epoch 3 unknown to this master
    ([[1, 0], [2, 600]], 900, [[1, 0], [2, 800]], 1500, 600),  # same number, other start: forked
    ([[5, 0]], 100, [[1, 0], [2, 800]], 1500, None),  # nothing in common
    ([], 0, [[1, 0]], 100, None),
])
def test_consistent_point(slave, s_end, master, m_end, expect):
    assert consistent_point(EpochList(slave), s_end, EpochList(master), m_end) == expect


def test_sync_plan():
    m = EpochList([[1, 0], [2, 800]])
    assert sync_plan(EpochList(), 0, 0, m, 0, 0, 1500) == Plan(0, None, False)  # a new slave
    assert sync_plan(EpochList([[1, 0]]), 0, 1000, m, 0, 0, 1500) == Plan(800, 800, False)
    assert sync_plan(EpochList([[1, 0]]), 0, 700, m, 0, 0, 1500) == Plan(700, None, False)
    # the master deleted what the slave needs next, or they share nothing: start over
    assert sync_plan(EpochList([[1, 0]]), 0, 700, m, 4096, 4096, 9000) == Plan(4096, None, True)
    assert sync_plan(EpochList([[7, 0]]), 0, 70, m, 0, 0, 1500) == Plan(0, None, True)
    assert sync_plan(EpochList(), 0, 0, m, 4096, 4096, 9000) == Plan(4096, None, True)


def test_fork_point_in_random_histories(seed):
    """A seeded model of a group: masters write, slaves copy prefixes, masters crash losing
    unflushed tails, slaves get promoted (each promotion or restart opens an epoch). For any
    two nodes, the logs agree exactly up to the consistent point, and differ (or one ends)
    right after it."""
    rng = random.Random(seed)
    for _ in range(200):
        nodes = 3
        logs = [[] for _ in range(nodes)]  # entries: (epoch, serial) at offset = position
        epochs = [EpochList() for _ in range(nodes)]
        master, epoch, serial = 0, 1, 0
        epochs[0].open(1, 0)
        for _ in range(rng.randrange(5, 40)):
            op = rng.random()
            if op < 0.5:  # the master writes
                for _ in range(rng.randrange(1, 5)):
                    serial += 1
                    logs[master].append((epoch, serial))
            elif op < 0.75:  # a slave copies a prefix of the master's log (after syncing)
                s = rng.choice([i for i in range(nodes) if i != master])
                cp = consistent_point(epochs[s], len(logs[s]), epochs[master], len(logs[master]))
                if cp is None:
                    logs[s], epochs[s] = [], EpochList()
                    cp = 0
                del logs[s][cp:]
                epochs[s].truncate(cp)
                upto = rng.randrange(cp, len(logs[master]) + 1)
                for off in range(cp, upto):
                    e = logs[master][off][0]
                    if e > epochs[s].last_epoch or not epochs[s].entries:
                        epochs[s].open(e, epochs[master].start_of(e))
                    logs[s].append(logs[master][off])
            elif op < 0.85:  # the master crashes, loses a tail, restarts with a new epoch
                del logs[master][rng.randrange(0, len(logs[master]) + 1):]
                epochs[master].truncate(len(logs[master]) + 1)
                epoch += 1
                epochs[master].open(epoch, len(logs[master]))
            else:  # a slave is promoted
                master = rng.choice([i for i in range(nodes) if i != master])
                epoch += 1
                epochs[master].open(epoch, len(logs[master]))
        for a in range(nodes):
            for b in range(nodes):
                cp = consistent_point(epochs[a], len(logs[a]), epochs[b], len(logs[b]))
                if cp is None:
                    continue
                assert logs[a][:cp] == logs[b][:cp], (seed, a, b, cp)
                assert cp == len(logs[a]) or cp == len(logs[b]) or logs[a][cp] != logs[b][cp], (seed, a, b)
