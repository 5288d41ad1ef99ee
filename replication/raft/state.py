"""The hard state file: term and vote, replaced atomically and fsynced before anyone hears
what they led to."""

from __future__ import annotations

import json
from pathlib import Path

from broker.store.files import write_atomic
from replication.raft.core import HardState
from replication.raft.messages import TERM_MAX


class HardStateFile:
    def __init__(self, path: Path):
        self.path = Path(path)

    def load(self) -> HardState:
        """The saved term and vote. Refuses (ValueError, saying what to do) a damaged file and
        a term outside 0..TERM_MAX: a node at such a term could never be elected nor elect."""
        try:
            d = json.loads(self.path.read_text())
            term, voted_for = d["term"], d.get("voted_for")
            if type(term) is not int or (voted_for is not None and not isinstance(voted_for, str)):
                raise TypeError(f"term {term!r} and voted_for {voted_for!r}: an integer and a name or null")
        except FileNotFoundError:
            return HardState()
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{self.path} is damaged ({e}): this node cannot know whom it voted "
                             f"for; restore it, or remove the node's data to rejoin empty") from None
        if not 0 <= term <= TERM_MAX:
            raise ValueError(
                f"{self.path} holds term {term}, outside 0..TERM_MAX={TERM_MAX} (a forged or corrupt "
                f"term: no group reaches it by elections, and no peer accepts a message past it): "
                f"stop every member of the group; on each whose raft_state.json holds such a term, "
                f"set \"term\" to one more than the highest term in any member's CommitLog (its "
                f"entries' term field) and \"voted_for\" to null; then start them. Or remove this "
                f"node's data to rejoin empty")
        return HardState(term, voted_for)

    def write(self, hs: HardState) -> None:
        write_atomic(self.path, json.dumps({"term": hs.term, "voted_for": hs.voted_for}).encode())
