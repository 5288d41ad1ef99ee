"""Topic configs of one broker, persisted in `<data_dir>/config/topics.json` (atomic writes).

The file is rewritten whole on every change (a crash leaves the old or the new one), one
topic a line: each topic's line is kept encoded, so a save joins them instead of encoding
every topic again (asdict + an indented dump took ~55 ms at 3,000 topics, on the event
loop, for each auto-created topic: 3,000 auto-creates took ~96 s).

Topics are created explicitly (CREATE_TOPIC) or, when `auto_create_topic_enable` is on, from
the default template on the first send (as RocketMQ does with TBW102).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from broker.protocol.topics import PERM_READ, PERM_RW, PERM_WRITE
from broker.store.files import write_atomic

log = logging.getLogger(__name__)

TOPIC_RE = re.compile(r"^[A-Za-z0-9_%|-]{1,127}$")


class TopicError(ValueError):
    pass


@dataclass(frozen=True)
class TopicConfig:
    name: str
    write_queues: int
    read_queues: int
    perm: int = PERM_RW

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE)

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)


def check_name(name: str) -> None:
    if not TOPIC_RE.match(name or ""):
        raise TopicError(f"bad topic name {name!r}: 1-127 characters of A-Z a-z 0-9 _ % | -")


def _line(t: TopicConfig) -> str:
    return json.dumps(asdict(t))


class TopicManager:
    def __init__(self, path: Path, auto_create: bool, default_queues: int, queues_max: int):
        self.path = Path(path)
        self.auto_create = auto_create
        self.default_queues = default_queues
        self.queues_max = queues_max
        self.topics: dict[str, TopicConfig] = {}
        self._lines: dict[str, str] = {}  # each topic's JSON, as it is in the file
        self.version = 0  # bumped on every change (name servers hear of it: broker/registrar.py)
        self.on_change = None  # called after a topic was created or changed, however it was

    def load(self) -> None:
        if not self.path.exists():
            return
        try:
            data = json.loads(self.path.read_text())
            self.topics = {t["name"]: TopicConfig(**t) for t in data["topics"]}
            self._lines = {name: _line(t) for name, t in self.topics.items()}
        except (ValueError, KeyError, TypeError) as e:
            raise TopicError(f"{self.path} is damaged ({e}); restore it or remove it to start "
                             f"with no topics") from None

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = ",\n  ".join(self._lines[name] for name in self.topics)
        write_atomic(self.path, f'{{"version": 1, "topics": [\n  {body}\n]}}\n'.encode())

    def get(self, name: str) -> TopicConfig | None:
        return self.topics.get(name)

    def template(self, name: str) -> TopicConfig:
        return TopicConfig(name, self.default_queues, self.default_queues)

    def validate(self, name: str, write_queues: int, read_queues: int | None = None,
                 perm: int = PERM_RW, update: bool = False) -> TopicConfig:
        """The config a create/update would set; raises TopicError or FileExistsError."""
        check_name(name)
        if name.startswith("%"):
            raise TopicError(f"topic names starting with % are reserved for the system: {name!r}")
        read_queues = write_queues if read_queues is None else read_queues
        for what, n in (("write_queues", write_queues), ("read_queues", read_queues)):
            if not 1 <= n <= self.queues_max:
                raise TopicError(f"{what}={n}: must be 1..{self.queues_max}")
        if perm & ~PERM_RW or perm == 0:
            raise TopicError(f"perm={perm}: use 2 (write), 4 (read) or 6 (both)")
        if name in self.topics and not update:
            raise FileExistsError(name)
        return TopicConfig(name, write_queues, read_queues, perm)

    @staticmethod
    def hides_messages(old: TopicConfig | None, new: TopicConfig, unread) -> str | None:
        """Why `new` would leave messages where no consumer reads them, or None. `unread(q)`:
        the messages held in queue q that some consumer group has not consumed (all held ones
        when no group has read the topic). Kafka refuses to remove partitions; RocketMQ shrinks
        a topic in two steps, write queues first and read queues once consumers drained them:
        both kept here, anything else needs `force`."""
        if new.read_queues < new.write_queues:
            return (f"read_queues={new.read_queues} is less than write_queues={new.write_queues}: messages sent "
                    f"to queues {new.read_queues}..{new.write_queues - 1} would reach no consumer")
        if old is None or new.read_queues >= old.read_queues:
            return None
        stranded = {q: n for q in range(new.read_queues, old.read_queues) if (n := unread(q)) > 0}
        if not stranded:
            return None
        where = ", ".join(f"queue {q}: {n}" for q, n in stranded.items())
        return (f"read_queues {old.read_queues} -> {new.read_queues} would hide {sum(stranded.values())} unconsumed "
                f"messages ({where}). Shrink write_queues first, let the consumer groups drain those queues, "
                f"then shrink read_queues; or force it")

    def create(self, name: str, write_queues: int, read_queues: int | None = None,
               perm: int = PERM_RW, update: bool = False) -> TopicConfig:
        return self.apply(asdict(self.validate(name, write_queues, read_queues, perm, update)))

    def apply(self, cfg: dict) -> TopicConfig:
        """Set a topic's config (from a local request or a committed replicated entry)."""
        t = TopicConfig(**cfg)
        if self.topics.get(t.name) != t:
            self.topics[t.name] = t
            self._lines[t.name] = _line(t)
            self.save()
            log.info("topic %s: %d write / %d read queues, perm %d", t.name, t.write_queues,
                     t.read_queues, t.perm)
            self.version += 1
            if self.on_change is not None:
                self.on_change()
        return t

    def get_or_auto_create(self, name: str) -> TopicConfig | None:
        cfg = self.topics.get(name)
        if cfg is None and self.auto_create:
            cfg = self.create(name, self.default_queues)
        return cfg
