"""The transport-level fault switch, for drills on hosts whose network we cannot cut (provider
`local`): the broker itself drops the traffic a network partition would drop.

Off unless the node's config says `fault_injection: true`; set by FAULT requests
(`Admin.set_faults`). `drop_peers`: replication traffic to and from these group members is
dropped (Raft messages, HA streams, peer calls), as by a partition between them.
`isolated`: every client frame is dropped unanswered too, except FAULT itself (to heal).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass
class FaultSwitch:
    drop_peers: frozenset[str] = field(default_factory=frozenset)
    isolated: bool = False

    def blocks(self, peer: str) -> bool:
        return peer in self.drop_peers

    def set(self, drop_peers, isolated: bool) -> bool:
        """Apply; True if anything changed."""
        new = (frozenset(drop_peers), bool(isolated))
        if new == (self.drop_peers, self.isolated):
            return False
        self.drop_peers, self.isolated = new
        log.warning("fault injection: dropping traffic with %s%s", sorted(self.drop_peers) or "nobody",
                    "; isolated from clients" if self.isolated else "")
        return True
