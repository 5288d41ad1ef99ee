"""Errors the replication modes raise into the request handlers."""

from __future__ import annotations

from broker.protocol.codes import Code


class NotLeader(Exception):
    """This node does not serve the request; `leader_address` says who does, when known."""

    def __init__(self, leader_address: str | None, code: Code = Code.NOT_LEADER, why: str | None = None):
        self.leader_address = leader_address
        self.code = code
        super().__init__(why or ("leadership is moving" if code == Code.LEADER_TRANSFERRING else
                                 f"not the leader; the leader is {leader_address or 'being elected'}"))


class SlaveNotAvailable(Exception):
    """A SYNC master has too few replicas in sync to take a send: nothing was stored."""


class PromotionRefused(Exception):
    """A role change (promote, fence, follow) was refused: the message says why."""
