"""System entries: CommitLog entries whose topic starts with "%", written by the broker or its
replication rather than by producers. They have no queue; the dispatcher hands each committed
one to `SystemEntries.apply`, its last stage after the ConsumeQueues and the key index.

    %TOPIC%   a topic config (JSON of TopicConfig), applied by every member once committed
    %OFFSET%  a consumer group's committed offsets: {"group", "topic", "offsets": {queue: offset}}
    %NOOP%    a new Raft leader's first entry (lets entries of earlier terms commit); no effect
    %EPOCH%   a new master-slave epoch's first entry: {"epoch", "node"}; no effect here (the
              replication reads epochs from the entries' term field)

In raft mode topic configs and offsets reach every member through the log; standalone and
master-slave nodes apply them where they are made (a master's slaves copy them with the
metadata sync), through the same `apply`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict

log = logging.getLogger(__name__)

TOPIC_TOPIC = "%TOPIC%"
OFFSET_TOPIC = "%OFFSET%"
NOOP_TOPIC = "%NOOP%"
EPOCH_TOPIC = "%EPOCH%"


def topic_entry(cfg) -> tuple[str, bytes]:
    return TOPIC_TOPIC, json.dumps(asdict(cfg)).encode()


def offsets_entry(group: str, topic: str, offsets: dict[int, int]) -> tuple[str, bytes]:
    return OFFSET_TOPIC, json.dumps({"group": group, "topic": topic, "offsets": offsets}).encode()


class SystemEntries:
    """Applies system entries to the broker's topic configs and consumer offsets."""

    def __init__(self, topics, offsets):
        self.topics = topics
        self.offsets = offsets

    def apply(self, topic: str, body) -> None:
        try:
            if topic == TOPIC_TOPIC:
                self.topics.apply(json.loads(bytes(body)))
            elif topic == OFFSET_TOPIC:
                d = json.loads(bytes(body))
                self.offsets.commit(d["group"], d["topic"], {int(q): o for q, o in d["offsets"].items()})
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            log.error("ignoring a malformed %s entry: %s", topic, e)
