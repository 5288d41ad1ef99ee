"""Topic management and routing (JSON bodies, see jsonbody.py).

CREATE_TOPIC   CreateTopic            -> TopicInfo        (TOPIC_EXISTS if it does, unless
                                                           `update` is set)
LIST_TOPICS    {}                     -> TopicList
DESCRIBE_TOPIC TopicName              -> TopicInfo        (TOPIC_NOT_EXIST)
GET_ROUTE      TopicName              -> Route            what a producer needs to pick a
                                                           queue; for an unknown topic with
                                                           auto-creation on, the template's
"""

from __future__ import annotations

from dataclasses import dataclass, field

PERM_READ = 4
PERM_WRITE = 2
PERM_RW = PERM_READ | PERM_WRITE


@dataclass(frozen=True)
class TopicName:
    topic: str


@dataclass(frozen=True)
class CreateTopic:
    topic: str
    write_queues: int = 4
    read_queues: int | None = None  # defaults to write_queues
    perm: int = PERM_RW
    update: bool = False
    force: bool = False  # an update that hides messages from consumers (see TopicManager.hides_messages)


@dataclass(frozen=True)
class QueueInfo:
    queue_id: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True)
class TopicInfo:
    topic: str
    write_queues: int
    read_queues: int
    perm: int
    queues: list[QueueInfo] = field(default_factory=list)


@dataclass(frozen=True)
class TopicList:
    topics: list[str]


@dataclass(frozen=True)
class Route:
    topic: str
    write_queues: int
    read_queues: int
    perm: int
    exists: bool  # False: the broker will create it from its template on first send
