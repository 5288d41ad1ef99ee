"""Write replica directories the way `tidelog collect` leaves them (`<cluster>/<node>/` with
commitlog segments, a checkpoint and node.json, plus the cluster's collect.json), through the
store's codec: for the reconcile job's tests and its benchmark, where logs with known
contents (and known damage) are needed without running a cluster.

`format=1` writes one TLE1 entry per E; `format=2` writes one TLE2 record batch per E (its
`count` records, by default 1 + index % BATCH_RECORDS_MAX, so a log mixes batches of one and
of several), so that every reader test runs on both formats: indexes are the same either way,
queue offsets advance by the batch's count. An E's own `format` overrides the log's (a log
written across the upgrade holds both).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from broker.store import codec
from broker.store.checkpoint import Checkpoint, CheckpointFile
from broker.store.files import NAME_DIGITS

BASE_TS_MS = 1_795_000_000_000
BATCH_RECORDS_MAX = 4  # format 2: a batch's records, by default 1 + index % BATCH_RECORDS_MAX
FORMATS = (1, 2)


@dataclass(frozen=True)
class E:
    """One entry to write: its index and term; the rest is derived unless given."""
    index: int
    term: int
    body: bytes = b""
    topic: str = "orders"
    queue_id: int = 0
    keys: tuple = ()
    count: int | None = None  # format 2: records in its batch (None: 1 + index % BATCH_RECORDS_MAX)
    format: int | None = None  # None: the log's

    def payload(self, k: int = 0) -> bytes:
        if self.body:
            return self.body
        return f"message {self.index}{f'.{k}' if k else ''} of term {self.term}".encode()

    def records(self, format: int) -> int:
        """How many messages this entry holds in a log written in `format`."""
        if (self.format or format) == 1:
            return 1
        return self.count if self.count is not None else 1 + self.index % BATCH_RECORDS_MAX


def msg_id(index: int, term: int, k: int = 0) -> bytes:
    """Record k of entry `index`'s id (k = 0: the same id in both formats)."""
    return hashlib.blake2b(f"{index}/{term}{f'/{k}' if k else ''}".encode(), digest_size=16).digest()


def _encode_entry(e: E, format: int, phys: int, qoff: int, props: bytes) -> bytes:
    ts = BASE_TS_MS + e.index
    if (e.format or format) == 1:
        return codec.encode(e.index, e.term, phys, qoff, ts, ts, msg_id(e.index, e.term), e.queue_id, 0,
                            e.topic.encode(), props, e.payload())
    records = [(0, ts, msg_id(e.index, e.term, k), props, e.payload(k)) for k in range(e.records(2))]
    return codec.encode_batch(e.index, e.term, phys, qoff, ts, e.topic, e.queue_id, records)


def encode_log(entries, segment_bytes: int, format: int = 1) -> list[tuple[int, bytearray]]:
    """Segments (base offset, bytes) holding `entries` in order, as TLE1 entries (`format`
    1) or TLE2 batches (2); the last one is padded with never-written (zero) space as a live
    store's preallocated segment is."""
    if format not in FORMATS:
        raise ValueError(f"format={format!r}: one of {FORMATS}")
    segs: list[tuple[int, bytearray]] = [(0, bytearray())]
    queue_next: dict[tuple, int] = {}
    for e in entries:
        props = codec.encode_properties({codec.PROP_KEYS: " ".join(e.keys)}) if e.keys else b""
        q = (e.topic, e.queue_id)
        qoff = queue_next.get(q, 0)
        queue_next[q] = qoff + e.records(format)
        base, buf = segs[-1]
        entry = _encode_entry(e, format, base + len(buf), qoff, props)
        if len(buf) + len(entry) + codec.BLANK_SIZE_MIN > segment_bytes:
            rest = segment_bytes - len(buf)
            buf += codec.encode_blank(rest) + bytes(rest - codec.BLANK_SIZE_MIN)  # full size, as a store's
            segs.append((base + segment_bytes, bytearray()))
            base, buf = segs[-1]
            entry = _encode_entry(e, format, base, qoff, props)  # it names its own offset
        buf += entry
    base, buf = segs[-1]
    buf += bytes(max(codec.BLANK_SIZE_MIN, min(4096, segment_bytes - len(buf))))
    return segs


@dataclass
class Node:
    id: str
    entries: list = field(default_factory=list)
    committed_index: int = -1
    group: str = "g0"
    mode: str = "raft"


def write_node(cluster_dir: Path, node: Node, segment_bytes: int = 1 << 20, format: int = 1) -> Path:
    d = Path(cluster_dir) / node.id
    (d / "commitlog").mkdir(parents=True, exist_ok=True)
    segs = encode_log(node.entries, segment_bytes, format)
    for base, buf in segs:
        (d / "commitlog" / f"{base:0{NAME_DIGITS}d}").write_bytes(buf)
    last = node.entries[-1] if node.entries else None
    cp = CheckpointFile(d / "checkpoint")
    cp.load()
    cp.write(Checkpoint(0, 0, last.term if last else 0, node.committed_index))
    cp.close()
    end = last.index if last else -1
    (d / "node.json").write_text(json.dumps({
        "id": node.id, "group": node.group, "mode": node.mode, "state": "up", "collected_at": time.time(),
        "commit_index": node.committed_index, "begin_index": node.entries[0].index if node.entries else 0,
        "end_index": end}))
    return d


def write_cluster(out: Path, name: str, nodes: list[Node], missing: dict | None = None,
                  segment_bytes: int = 1 << 20, format: int = 1) -> Path:
    """`out/<name>/<node>/...` and collect.json; `missing` maps node ids to the error that kept
    them from being collected (their directories are not written); `format`: TLE1 or TLE2."""
    base = Path(out) / name
    base.mkdir(parents=True, exist_ok=True)
    infos = []
    for n in nodes:
        write_node(base, n, segment_bytes, format)
        infos.append({"id": n.id, "group": n.group, "mode": n.mode})
    for nid, err in (missing or {}).items():
        infos.append({"id": nid, "group": nodes[0].group if nodes else "g0", "error": err})
    (base / "collect.json").write_text(json.dumps({"cluster": name, "dir": str(base), "nodes": infos,
                                                   "missing": sorted(missing or {})}))
    return base


def log(n: int, term: int = 1, start: int = 0, **kw) -> list[E]:
    return [E(i, term, **kw) for i in range(start, start + n)]
