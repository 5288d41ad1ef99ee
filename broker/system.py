"""System entries: CommitLog entries whose topic starts with "%", written by the broker or its
replication rather than by producers. They have no queue; the dispatcher hands each committed
one to `SystemEntries.apply`, its last stage after the ConsumeQueues and the key index.

    %TOPIC%   a topic config (JSON of TopicConfig), applied by every member once committed
    %OFFSET%  a consumer group's committed offsets: {"group", "topic", "offsets": {queue: offset}}
    %NOOP%    a new Raft leader's first entry (lets entries of earlier terms commit); no effect
    %EPOCH%   a new master-slave epoch's first entry: {"epoch", "node"}; no effect here (the
              replication reads epochs from the entries' term field)
    %ACL%     a runtime user or role change (ACL_UPDATE): {"op": "set_user", "name", "roles",
              "scram"} | {"op": "delete_user", "name"} | {"op": "set_role", "name", "admin",
              "pub", "sub", "groups"} | {"op": "delete_role", "name"}; applied to the AclStore
              (broker/acl_store.py: acl.json, then the Guard) by every member once committed

In raft mode topic configs, offsets and ACL changes reach every member through the log; standalone and
master-slave nodes apply them where they are made (a master's slaves copy them with the
metadata sync -- ACLs as the whole acl.json overlay), through the same `apply`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path

from broker import acl_store

log = logging.getLogger(__name__)

TOPIC_TOPIC = "%TOPIC%"
OFFSET_TOPIC = "%OFFSET%"
NOOP_TOPIC = "%NOOP%"
EPOCH_TOPIC = "%EPOCH%"
ACL_TOPIC = "%ACL%"


def topic_entry(cfg) -> tuple[str, bytes]:
    return TOPIC_TOPIC, json.dumps(asdict(cfg)).encode()


def offsets_entry(group: str, topic: str, offsets: dict[int, int]) -> tuple[str, bytes]:
    return OFFSET_TOPIC, json.dumps({"group": group, "topic": topic, "offsets": offsets}).encode()


def acl_entry(change: dict) -> tuple[str, bytes]:
    return ACL_TOPIC, json.dumps(change, sort_keys=True).encode()


class SystemEntries:
    """Applies system entries to the broker's topic configs, consumer offsets and ACLs.

    `acl`: the broker's AclStore; by default the one of the data directory the topic configs
    live in (acl_store.shared: the Guard built from the same config holds the same one)."""

    def __init__(self, topics, offsets, acl: acl_store.AclStore | None = None):
        self.topics = topics
        self.offsets = offsets
        path = getattr(topics, "path", None)
        if acl is None and path is not None:
            acl = acl_store.shared(Path(path).parent / acl_store.ACL_FILE)
        self.acl = acl

    def apply(self, topic: str, body) -> None:
        try:
            if topic == TOPIC_TOPIC:
                self.topics.apply(json.loads(bytes(body)))
            elif topic == OFFSET_TOPIC:
                d = json.loads(bytes(body))
                self.offsets.commit(d["group"], d["topic"], {int(q): o for q, o in d["offsets"].items()})
            elif topic == ACL_TOPIC:
                if self.acl is None:
                    log.error("ignoring a %s entry: this broker has no ACL store", topic)
                else:
                    self.acl.apply(json.loads(bytes(body)))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            log.error("ignoring a malformed %s entry: %s", topic, e)
