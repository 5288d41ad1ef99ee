"""The hard state file: term and vote, replaced atomically and fsynced before anyone hears
what they led to."""

from __future__ import annotations

import json
from pathlib import Path

from broker.store.files import write_atomic
from replication.raft.core import HardState


class HardStateFile:
    def __init__(self, path: Path):
        self.path = Path(path)

    def load(self) -> HardState:
        try:
            d = json.loads(self.path.read_text())
            return HardState(int(d["term"]), d.get("voted_for"))
        except FileNotFoundError:
            return HardState()
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{self.path} is damaged ({e}): this node cannot know whom it voted "
                             f"for; restore it, or remove the node's data to rejoin empty") from None

    def write(self, hs: HardState) -> None:
        write_atomic(self.path, json.dumps({"term": hs.term, "voted_for": hs.voted_for}).encode())
