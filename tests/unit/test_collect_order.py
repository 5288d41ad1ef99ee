"""`tidelog collect` copies a node's checkpoint before its CommitLog (ops/collect.py): on a
live node the log only grows past what the checkpoint calls committed, so a copy taken in
that order never shows committed entries its log lacks (the reconcile job would call them
lost). The listing order of the directory must not matter."""

import itertools
from types import SimpleNamespace

from ops.collect import collect_node


class RecordingHost:
    def __init__(self, entries):
        self.entries, self.calls = entries, []

    def listdir(self, path):
        return self.entries

    def get(self, src, dst):
        self.calls.append(src.rsplit("/", 1)[1])
        dst.write_bytes(b"x")

    def get_tree(self, src, dst):
        self.calls.append(src.rsplit("/", 1)[1])
        dst.mkdir(parents=True, exist_ok=True)
        return 1


def test_the_checkpoint_is_copied_before_the_log_whatever_the_listing_order(tmp_path):
    plan = SimpleNamespace(id="n0", host="h", address="a:1", data_dir="/data",
                           group=SimpleNamespace(name="g", mode="raft"))
    listing = [("commitlog", True, 0), ("ha", True, 0), ("checkpoint", False, 64), ("raft_state.json", False, 9)]
    for i, order in enumerate(itertools.permutations(listing)):
        host = RecordingHost(list(order))
        collect_node(host, plan, tmp_path / f"c{i}", {})
        assert host.calls.index("checkpoint") < host.calls.index("commitlog"), (order, host.calls)
