"""The local provider's fault switch (infra/providers/local.py TransportFaults) with a node
that is down or paused: an overlapping fault (a node killed or SIGSTOPped, then a partition
or an isolation) must set the switch on the live nodes and skip that one, not fail the drill
with 'connection refused' or a timeout."""

import pytest

from broker.client.errors import ConnectError, RequestTimeout
from infra.providers.local import TransportFaults


class Plan:
    def __init__(self, id, group):
        self.id, self.address, self.group = id, f"{id}:1", group

    def peers(self):
        return self.group


def test_a_partition_skips_a_node_that_is_down(monkeypatch):
    group = []
    group += [Plan("n0", group), Plan("n1", group), Plan("n2", group)]
    set_on = []

    def fake_set(self, node, drop_peers, isolate):
        if node.id == "n2":
            raise ConnectError("cannot connect to n2:1: [Errno 111] Connection refused")
        set_on.append((node.id, tuple(drop_peers), isolate))

    monkeypatch.setattr(TransportFaults, "_set", fake_set)
    f = TransportFaults()
    f.partition(group[0], group[1:])
    assert set_on == [("n0", ("n1", "n2"), False), ("n1", ("n0",), False)]
    set_on.clear()
    f.isolate(group[2])  # the isolated node itself is down: its peers still drop it
    assert set_on == [("n0", ("n2",), False), ("n1", ("n2",), False)]


def test_other_errors_still_fail(monkeypatch):
    from broker.client.errors import BrokerError

    def fake_set(self, node, drop_peers, isolate):
        raise BrokerError(0, "FAULT_INJECTION_DISABLED")

    monkeypatch.setattr(TransportFaults, "_set", fake_set)
    with pytest.raises(BrokerError):
        TransportFaults().partition(Plan("n0", []), [])


def test_an_isolation_skips_a_paused_node(monkeypatch):
    group = []
    group += [Plan("n0", group), Plan("n1", group)]
    set_on = []

    def fake_set(self, node, drop_peers, isolate):
        if node.id == "n0":
            raise RequestTimeout("no answer from n0:1 in time")  # SIGSTOPped
        set_on.append(node.id)

    monkeypatch.setattr(TransportFaults, "_set", fake_set)
    TransportFaults().isolate(group[0])
    assert set_on == ["n1"]


def test_heal_clears_a_node_whose_fault_request_timed_out(monkeypatch):
    """A paused node gets the FAULT request when it resumes (it sat in its socket): heal must
    clear its switch then, or it stays isolated and the group degraded after the drill."""
    group = []
    group += [Plan("n0", group), Plan("n1", group)]
    calls = []

    class FakeAdmin:
        def __init__(self, addresses, **kw):
            self.address = addresses[0]

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def set_faults(self, address, drop_peers, isolate):
            calls.append((address, tuple(drop_peers), isolate))
            if address == "n0:1" and isolate:
                raise RequestTimeout("no answer from n0:1 in time")

    import infra.providers.local as local
    monkeypatch.setattr(local, "Admin", FakeAdmin)
    f = TransportFaults()
    f.isolate(group[0])
    calls.clear()
    f.heal()
    assert ("n0:1", (), False) in calls and ("n1:1", (), False) in calls
