"""Nemesis sequences (combined faults) against fake nodes, network and group: the order of the
steps, the undo stack run at heal, and every undo run even when a step or an undo fails."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from ops.drill.nemesis import KINDS, NAMES, NAMESRV, SEQUENCES, Group, Nemesis, NemesisError


class FakeNode:
    def __init__(self, nid: str, journal: list, fail: dict):
        self.plan = SimpleNamespace(id=nid, address=f"{nid}:1")
        self.journal, self.fail = journal, fail
        self.running, self.paused, self.next_pid = True, False, 100

    def _maybe_fail(self, what: str):
        if self.fail.get((what, self.plan.id)):
            raise RuntimeError(f"{what} {self.plan.id} failed")

    def build(self):
        return "b1"

    def pid(self):
        return self.next_pid if self.running else None

    def signal(self, sig):
        self._maybe_fail(sig)
        if not self.running:
            raise RuntimeError(f"{self.plan.id} is not running")
        self.journal.append((sig, self.plan.id))
        if sig == "KILL":
            self.running, self.paused = False, False
            return self.next_pid
        self.paused = sig == "STOP"
        return self.next_pid

    def wait_gone(self, pid):
        pass

    def start(self, build):
        self._maybe_fail("start")
        if self.running:
            raise RuntimeError(f"{self.plan.id} is already running")
        self.journal.append(("start", self.plan.id))
        self.running, self.next_pid = True, self.next_pid + 1
        return self.next_pid


class FakeFaults:
    def __init__(self, journal, nodes, fail):
        self.journal, self.nodes, self.fail = journal, nodes, fail

    def partition(self, node, others):
        if self.fail.get(("partition", node.id)) or not self.nodes[node.id].running and self.fail.get("stopped"):
            raise RuntimeError(f"cannot reach {node.id}")
        self.journal.append(("partition", node.id, tuple(o.id for o in others)))

    def isolate(self, node):
        self.journal.append(("isolate", node.id))

    def heal(self):
        self.journal.append(("heal-network",))


class FakeGroup(Group):
    def __init__(self, mode, nodes, journal, fail):
        self.mode, self.nodes, self.journal, self.fail = mode, nodes, journal, fail
        self.current = "n0"

    def leader(self):
        return self.current if self.nodes[self.current].running and not self.nodes[self.current].paused else None

    def wait_leader(self, not_node, timeout_s):
        up = [n for n, o in sorted(self.nodes.items()) if o.running and not o.paused and n != not_node]
        self.journal.append(("elected", up[0]))
        self.current = up[0]
        return up[0]

    def failover(self, old_master):
        if self.fail.get("promote"):
            raise RuntimeError("promotion refused")
        up = [n for n, o in sorted(self.nodes.items()) if o.running and not o.paused and n != old_master]
        self.journal.append(("promote", up[0]))
        self.current = up[0]
        return {"node": up[0], "report": {"epoch": 2, "clean": True}}

    def transfer(self, leader, target):
        self.journal.append(("transfer", leader, target))
        return {"started": f"{leader} -> {target}"}


def make(name, mode="master-slave", fail=None, seed=1):
    journal, fail = [], dict(fail or {})
    nodes = {f"n{i}": FakeNode(f"n{i}", journal, fail) for i in range(3)}
    group = FakeGroup(mode, nodes, journal, fail)
    nem = Nemesis(name, nodes, FakeFaults(journal, nodes, fail), random.Random(seed), group.leader,
                  group=group, window_s=0.0, promote_after_s=0.0, sleep=lambda s: None)
    return nem, nodes, journal, group


def all_up(nodes):
    return all(o.running and not o.paused for o in nodes.values())


def test_names():
    assert set(SEQUENCES) <= set(NAMES) and set(KINDS) <= set(NAMES) and "mixed" in NAMES
    with pytest.raises(NemesisError):
        Nemesis("isolated-restart", {}, None, random.Random(1), lambda: None)  # no group controls


def test_isolated_restart_master_slave_follows_the_scenario():
    """n0 stores a tail while its slaves are paused; n0 is killed; n1 promoted and acks more;
    n1, n2 paused; n0 restarted (in isolation); all resumed."""
    nem, nodes, journal, group = make("isolated-restart")
    f = nem.inject()
    assert f.kind == "isolated-restart" and f.node == "n0" and f.error is None
    assert journal == [("STOP", "n1"), ("STOP", "n2"), ("KILL", "n0"), ("CONT", "n1"), ("CONT", "n2"),
                       ("promote", "n1"), ("partition", "n0", ("n1", "n2")), ("STOP", "n1"), ("STOP", "n2"),
                       ("start", "n0")]
    assert f.failover["node"] == "n1" and f.handles_failover
    assert [s["step"] for s in f.steps] == ["SIGSTOP", "SIGSTOP", "kill -9", "SIGCONT", "SIGCONT", "promote",
                                            "partition", "SIGSTOP", "SIGSTOP", "start"]
    assert all("at_s" in s for s in f.steps) and "promoted n1" in f.detail
    journal.clear()
    assert nem.heal(f) == []
    assert journal == [("CONT", "n2"), ("CONT", "n1"), ("heal-network",)]  # latest first: all resumed, then
    assert all_up(nodes) and f.steps[-1]["step"] == "heal"


def test_isolated_restart_raft_waits_for_an_election_and_isolates_by_pause_when_the_network_cannot():
    nem, nodes, journal, _ = make("isolated-restart", mode="raft", fail={"stopped": True})
    f = nem.inject()
    assert ("elected", "n1") in journal and not any(j[0] == "promote" for j in journal)
    part = next(s for s in f.steps if s["step"] == "partition")
    assert "skipped" in part and "paused peers" in part["detail"] and f.error is None
    assert journal[-1] == ("start", "n0") and nodes["n1"].paused and nodes["n2"].paused
    nem.heal(f)
    assert all_up(nodes)


def test_a_failed_step_stops_the_sequence_and_every_undo_still_runs():
    # the promotion fails with the slaves resumed, n0 down: heal restarts n0
    nem, nodes, journal, _ = make("isolated-restart", fail={"promote": True})
    f = nem.inject()
    assert f.error and "promotion refused" in f.error and "FAILED" in f.detail
    assert journal[-1] == ("CONT", "n2") and not nodes["n0"].running
    nem.heal(f)
    assert all_up(nodes)
    # the kill fails with both slaves paused: both resumed at heal
    nem, nodes, journal, _ = make("isolated-restart", fail={("KILL", "n0"): True})
    f = nem.inject()
    assert "kill -9 n0" in f.error and [s.get("error") is not None for s in f.steps] == [False, False, True]
    journal.clear()
    nem.heal(f)
    assert journal == [("CONT", "n2"), ("CONT", "n1")] and all_up(nodes)


def test_every_undo_runs_even_when_one_fails():
    nem, nodes, journal, _ = make("isolated-restart")
    f = nem.inject()
    nodes["n2"].fail[("CONT", "n2")] = True  # the first undo (latest pause) fails
    errors = nem.heal(f)
    assert len(errors) == 1 and "resume n2" in errors[0]
    assert ("CONT", "n1") in journal and journal[-1] == ("heal-network",)
    assert [s.get("error") is not None for s in f.steps if s["step"] == "heal"] == [True, False, False]
    assert not nodes["n1"].paused and nodes["n2"].paused  # the failure is reported, not hidden


def test_partition_then_kill_kills_the_new_leader_then_heals_both():
    for mode, chosen in (("master-slave", "promote"), ("raft", "elected")):
        nem, nodes, journal, _ = make("partition-then-kill", mode=mode)
        f = nem.inject()
        assert journal == [("partition", "n0", ("n1", "n2")), (chosen, "n1"), ("KILL", "n1")]
        journal.clear()
        nem.heal(f)
        assert journal == [("start", "n1"), ("heal-network",)] and all_up(nodes)


@pytest.mark.parametrize("seed", range(6))
def test_kill_during_transfer(seed):
    for mode in ("raft", "master-slave"):
        nem, nodes, journal, group = make("kill-during-transfer", mode=mode, seed=seed)
        f = nem.inject()
        (transfer,) = [j for j in journal if j[0] == "transfer"]
        (kill,) = [j for j in journal if j[0] == "KILL"]
        assert transfer[1] == "n0" and transfer[2] != "n0" and kill[1] in ("n0", transfer[2])
        assert [s["step"] for s in f.steps[:3]] == ["transfer leadership", "kill -9", "transfer result"]
        if mode == "master-slave" and kill[1] == "n0":  # the master is gone: a failover
            assert f.steps[3]["step"] == "promote" and f.failover["node"] != "n0"
        nem.heal(f)
        assert all_up(nodes)


@pytest.mark.parametrize("mode", ["master-slave", "raft"])
def test_mixed_is_seeded_and_sometimes_overlaps_two_faults(mode):
    seen = {"single": 0, "overlap": 0}
    for seed in range(40):
        runs = []
        for _ in range(2):
            nem, nodes, journal, _ = make("mixed", mode=mode, seed=seed)
            f = nem.inject()
            runs.append((f.kind, [(s["step"], s["node"]) for s in f.steps], list(journal)))
            nem.heal(f)
            assert all_up(nodes) and not any(o.paused for o in nodes.values())
        assert runs[0] == runs[1]  # the same seed, the same faults
        overlapped = [s for s in f.steps if "overlaps" in s]
        seen["overlap" if overlapped else "single"] += 1
        if overlapped:
            assert f.handles_failover and overlapped[0]["overlaps"] == f.kind and f.error is None
            faults = [s for s in f.steps if s["step"] in ("kill -9", "SIGSTOP", "partition", "isolate")]
            assert len(faults) == 2 and sum(s["step"] in ("partition", "isolate") for s in faults) <= 1
            assert faults[0]["node"] != faults[1]["node"] and faults[1]["fault"] in KINDS
            heals = [s for s in f.steps if s["step"] == "heal"]
            assert heals and heals[0]["at_s"] >= faults[1]["at_s"]  # both held until the heal
    assert seen["overlap"] and seen["single"]


def test_single_faults_keep_their_one_step_and_undo():
    nem, nodes, journal, _ = make("kill-leader")
    f = nem.inject()
    assert (f.kind, f.node, f.detail) == ("kill-leader", "n0", "kill -9 pid 100") and not f.handles_failover
    assert len(f.steps) == 1 and journal == [("KILL", "n0")]
    nem.heal(f)
    assert journal[-1] == ("start", "n0") and all_up(nodes)


def test_every_nemesis_is_offered_by_the_cli_and_the_dag_form():
    import ast
    from pathlib import Path

    from ops.cli.platform_cmds import drill

    (opt,) = [p for p in drill.params if p.name == "nemesis"]
    assert tuple(opt.type.choices) == NAMES
    tree = ast.parse((Path(__file__).resolve().parents[2] / "ops" / "dagkit.py").read_text())
    (nemeses,) = [ast.literal_eval(n.value) for n in tree.body
                  if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "NEMESES"]
    assert tuple(nemeses) == NAMES


# --- name-server faults (issue 16) ----------------------------------------------------------------

def make_ns(name, mode="raft", fail=None, seed=1):
    """make() plus two fake name servers ns-a, ns-b sharing the journal."""
    journal, fail = [], dict(fail or {})
    nodes = {f"n{i}": FakeNode(f"n{i}", journal, fail) for i in range(3)}
    ns = {f"ns-{c}": FakeNode(f"ns-{c}", journal, fail) for c in "ab"}
    group = FakeGroup(mode, nodes, journal, fail)
    nem = Nemesis(name, nodes, FakeFaults(journal, nodes, fail), random.Random(seed), group.leader, group=group,
                  window_s=0.0, promote_after_s=0.0, sleep=lambda s: None, namesrv=ns)
    return nem, nodes, ns, journal, group


def test_namesrv_nemeses_are_named_and_need_name_servers():
    assert NAMESRV == ("kill-namesrv", "kill-namesrv-and-leader") and NAMES[-2:] == NAMESRV
    for name in NAMESRV:  # without a namesrv section there is nothing to kill
        with pytest.raises(NemesisError, match="needs name servers"):
            make(name)
    with pytest.raises(NemesisError, match="group's controls"):
        Nemesis("kill-namesrv-and-leader", {}, None, random.Random(1), lambda: None, namesrv={"ns-a": None})


def test_kill_namesrv_kills_every_name_server_and_no_broker_then_restarts_them():
    nem, nodes, ns, journal, _ = make_ns("kill-namesrv")
    f = nem.inject()
    assert journal == [("KILL", "ns-a"), ("KILL", "ns-b")] and f.error is None
    assert f.kind == "kill-namesrv" and f.node == "ns-a,ns-b" and f.nodes == ["ns-a", "ns-b"]
    assert not f.handles_failover and all_up(nodes)  # the brokers are not touched
    journal.clear()
    assert nem.heal(f) == []
    assert sorted(journal) == [("start", "ns-a"), ("start", "ns-b")] and all_up(ns)  # started together
    assert [s["detail"] for s in f.steps if s["step"] == "heal"] == ["restart name servers"]


@pytest.mark.parametrize("mode,chosen", [("raft", "elected"), ("master-slave", "promote")])
def test_kill_namesrv_and_leader_kills_the_name_servers_first_then_the_leader(mode, chosen):
    nem, nodes, ns, journal, group = make_ns("kill-namesrv-and-leader", mode=mode)
    f = nem.inject()
    assert journal == [("KILL", "ns-a"), ("KILL", "ns-b"), ("KILL", "n0"), (chosen, "n1")]
    assert f.node == "n0" and f.handles_failover and group.current == "n1"  # the drill times the new leader
    assert [s["step"] for s in f.steps] == ["kill -9", "kill -9", "kill -9",
                                            "wait for a new leader" if mode == "raft" else "promote"]
    journal.clear()
    nem.heal(f)  # the old leader first, then the name servers
    assert journal[0] == ("start", "n0") and sorted(journal[1:]) == [("start", "ns-a"), ("start", "ns-b")]
    assert all_up(nodes) and all_up(ns)


def test_a_name_server_that_will_not_die_ends_the_sequence_and_the_others_restart():
    nem, nodes, ns, journal, _ = make_ns("kill-namesrv-and-leader", fail={("KILL", "ns-b"): True})
    f = nem.inject()
    assert "kill -9 ns-b" in f.error and journal == [("KILL", "ns-a")] and nodes["n0"].running
    journal.clear()
    assert nem.heal(f) == []
    assert journal == [("start", "ns-a")] and all_up(ns) and all_up(nodes)  # only the one that died


def test_a_name_server_that_will_not_start_is_the_heals_error_and_the_other_still_starts():
    nem, nodes, ns, journal, _ = make_ns("kill-namesrv", fail={("start", "ns-a"): True})
    f = nem.inject()
    journal.clear()
    (err,) = nem.heal(f)
    assert "restart name servers" in err and "start ns-a failed" in err
    assert journal == [("start", "ns-b")] and not ns["ns-a"].running


def test_namesrv_faults_only_ever_hit_the_name_servers_and_the_target_groups_leader():
    """The selection: whatever the seed, the brokers hit are the target group's leader at most
    (the nemesis holds only that group's ops), the name servers all of them."""
    for seed in range(10):
        for name in NAMESRV:
            nem, nodes, ns, journal, group = make_ns(name, seed=seed)
            group.current = f"n{seed % 3}"
            f = nem.inject()
            killed = [j[1] for j in journal if j[0] == "KILL"]
            assert killed[:2] == ["ns-a", "ns-b"]
            assert killed[2:] == ([f"n{seed % 3}"] if name == "kill-namesrv-and-leader" else [])
            nem.heal(f)


@pytest.mark.parametrize("name", NAMESRV)
def test_a_drill_without_name_servers_refuses_their_nemeses_before_touching_anything(name, tmp_path):
    from infra import spec as sp
    from ops.drill.run import DrillError, drill
    from tests.helpers import local_spec

    spec = sp.load(local_spec(tmp_path, "nons"))  # no namesrv section, and nothing runs
    with pytest.raises(DrillError, match=f"nemesis {name} kills the name servers: the spec nons has no namesrv"):
        drill(spec, name, 5, 10, tmp_path)
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").iterdir())
