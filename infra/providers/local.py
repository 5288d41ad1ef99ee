"""Provider `local`: every host is this machine; each host's nodes listen on its own loopback
address (127.0.0.11, .12, ... or .11, .12 of the spec's network.subnet: `tidelog cluster` gives
every cluster a 127.a.b.0/24 of its own) and keep their files under the cluster's state directory.

No SSH and no root: network faults go through the brokers' own transport-level fault switch
(`fault_injection: true`, set by deploy for local clusters), which drops the traffic between
chosen peers inside the broker.
"""

from __future__ import annotations

from pathlib import Path

from broker.client import Admin
from infra.hosts import Host, LocalHost
from infra.providers.base import Faults, Provider
from infra.spec import NodePlan


class LocalProvider(Provider):
    kind = "local"

    def make_host(self, name: str) -> Host:
        return LocalHost(name, self.spec.address_of(name))

    def up(self) -> dict:
        for h in self.spec.hosts:
            Path(self.spec.install_dir_of(h.name)).mkdir(parents=True, exist_ok=True)
        self.save_inventory()
        return {"cluster": self.spec.name, "provider": self.kind, "made": [],
                "hosts": {h.name: self.spec.address_of(h.name) for h in self.spec.hosts}}

    def down(self) -> dict:
        import shutil

        existed = self.spec.state.exists()
        shutil.rmtree(self.spec.state, ignore_errors=True)
        return {"cluster": self.spec.name, "provider": self.kind,
                "removed": [str(self.spec.state)] if existed else []}

    def faults(self) -> Faults:
        return TransportFaults(self.spec)


class TransportFaults(Faults):
    """The brokers' fault switch: a node drops replication traffic to and from named peers
    (partition), or everything including clients (isolate)."""

    def __init__(self, spec=None):
        self.spec = spec  # its credentials: FAULT is an admin operation
        self.touched: dict[str, NodePlan] = {}

    def _set(self, node: NodePlan, drop_peers: list[str], isolate: bool) -> None:
        # touched first: a request that times out (the node is paused) is still delivered
        # when the node resumes, and heal() must then clear what it set
        self.touched[node.id] = node
        creds = None
        if self.spec is not None:
            from ops.security import credentials_for
            creds = credentials_for(self.spec)
        with Admin([node.address], request_timeout_ms=3000, connect_timeout_ms=2000, credentials=creds) as a:
            a.set_faults(node.address, drop_peers=drop_peers, isolate=isolate)

    def _set_if_up(self, node: NodePlan, drop_peers: list[str], isolate: bool) -> bool:
        """As _set, but a node that is down or paused (by an overlapping fault: kill -9, or
        SIGSTOP, where the call times out) does not fail the fault: the live side's switch
        drops the traffic both ways meanwhile, a killed node's switch starts clear when it
        restarts, and a paused one applies the request when it resumes (heal clears it: it
        is in `touched`). False if the node did not answer."""
        from broker.client.errors import ConnectError, RequestTimeout

        try:
            self._set(node, drop_peers, isolate)
            return True
        except (ConnectError, RequestTimeout):
            return False

    def partition(self, node: NodePlan, others: list[NodePlan]) -> None:
        self._set_if_up(node, [o.id for o in others], False)
        for o in others:
            self._set_if_up(o, [node.id], False)

    def isolate(self, node: NodePlan) -> None:
        self._set_if_up(node, [p.id for p in node.peers() if p.id != node.id], True)
        for o in node.peers():
            if o.id != node.id:
                self._set_if_up(o, [node.id], False)

    def heal(self) -> None:
        from broker.client import TidelogError

        for node in list(self.touched.values()):
            try:
                self._set(node, [], False)
            except TidelogError:
                pass  # a node that is down has no faults left when it restarts
        self.touched.clear()
