"""Dispatch: from the CommitLog into the ConsumeQueues and the key index (MessageStore's half
that reads the log after it is confirmed).

Every message gets one 20-byte ConsumeQueue unit (its entry's phys offset and size, its tag
hash); a record batch's (TLE2) units all point at the batch, so a queue offset is still one
message and `get` ships whole batches. The key index gets each message's id and keys, pointing
at its entry. Entries of both formats are read by `codec_batch.walk2`'s rule.
"""

from __future__ import annotations

from zlib import crc32

from broker.store import codec, codec_batch, codec_kafka
from broker.store.codec_batch import is_kafka
from broker.store.consume_queue import RECORD
from broker.store.key_index import ID_SEED, id_hash, key_for, key_hash

DISPATCH_CHUNK_BYTES = 64 << 10  # below malloc's mmap threshold: reused heap pages


class DamagedConsumeQueue(Exception):
    pass


class LogStartPassedDispatch(DamagedConsumeQueue):
    """The CommitLog starts past the dispatched offset: entries were deleted or dropped before
    they were indexed and their system entries applied. Retention never deletes past the
    dispatched offset and a restart of the log resets it, so this is a bug; the dispatcher
    refuses to go on silently (a read below the log start gives nothing, and every later
    dispatch would do nothing). A restart goes on from the log start (MessageStore.open)
    and reports the gap."""


class Dispatch:
    """Mixed into MessageStore: uses its commitlog, cqs, key_index, options, confirm_offset,
    next_queue_offset, _topic_names, on_system_entry and on_kafka_batch."""

    def recompute_queue_offsets(self) -> None:
        """A new leader assigns queue offsets after everything in its log, committed or not."""
        nqo = {k: cq.max_offset for k, cq in self.cqs.queues.items()}
        for _start, data, entries in self._chunks(self.cqs.dispatched_offset, self.commitlog.tail.offset):
            for rel, (_, _, _, qoff, _, count, qid, tlen, at) in entries:
                topic = bytes(data[rel + at:rel + at + tlen]).decode()
                if topic[0] != "%":
                    nqo[(topic, qid)] = max(nqo.get((topic, qid), 0), qoff + count)
        self.next_queue_offset = nqo

    def _chunks(self, pos: int, limit: int):
        """(start, chunk, walk) for each chunk of the log in [pos, limit): iterate the walk
        for (offset in chunk, codec.META fields) of each whole entry in it. The rest of each
        chunk is judged by codec.walk2's rule (entries of either format, codec_batch.BatchMeta): a partial entry or an end-of-segment marker is
        read on from; anything else before `limit` (never-written bytes, a position inside an
        entry, a corrupt entry) raises DamagedConsumeQueue, since the position or the log is
        not what the ConsumeQueues were built from. `limit` is clipped to the log's tail."""
        read_from, walk = self.commitlog.read_from, codec_batch.walk2
        cached = self.commitlog.recent_bytes
        limit = min(limit, self.commitlog.tail.offset)
        want = DISPATCH_CHUNK_BYTES
        while pos < limit:
            held = cached(pos, want, limit, first_whole=True)  # just written: from memory
            if held:
                start, data = pos, held[0] if len(held) == 1 else b"".join(held)
            else:
                start, data = read_from(pos, want, limit)
            if not data:
                self._read_nothing(start, limit)
                return
            w = walk(data, read="meta")
            yield start, data, w
            stop = w.stop
            if stop is None:  # the caller stopped early
                return
            pos, want = start + stop.pos, DISPATCH_CHUNK_BYTES
            if stop.kind == codec.PARTIAL:
                if pos + stop.size <= limit and (stop.pos or stop.size > len(data)):
                    want = max(want, stop.size)  # one entry larger than a chunk
                    continue
                if pos >= limit:
                    return
                raise DamagedConsumeQueue(f"the entry at offset {pos} runs past offset {limit} "
                                          f"({stop.size} bytes)")
            if stop.kind == codec.MARKER and stop.pos:
                continue  # read_from goes on at the next segment
            what = {codec.END: "never written", codec.MARKER: "an end-of-segment marker that "
                    "does not end its segment"}.get(stop.kind, stop.reason)
            raise DamagedConsumeQueue(f"no entry at offset {pos} (below {limit}): {what}")

    def dispatch(self, limit: int | None = None, rebuilding: bool = False) -> set[tuple[str, int]]:
        """Index confirmed entries into ConsumeQueues and the key index; the queues touched.
        Every message gets a 20-byte unit (its entry's phys and size, its tag hash): a
        batch's units all point at the batch."""
        limit = self.confirm_offset if limit is None else limit
        groups: dict[tuple[str, int], list] = {}  # queue -> [first queue offset, units]
        index_ids = self.options.message_index_enable
        keys: list[tuple[list[int], int, int]] = []  # (key hashes, phys, store ts) per entry
        topics = self._topic_names
        meta1, batch = codec.META.unpack_from, codec.BATCH_MAGIC
        done = self.cqs.dispatched_offset
        if done < self.commitlog.min_offset:
            self._read_nothing(done, limit)
        for start, data, entries in self._chunks(done, limit):
            for rel, (size, magic, phys, qoff, ts, count, qid, tlen, at) in entries:
                traw = data[rel + at:rel + at + tlen]
                topic = topics.get(traw)
                if topic is None:
                    topic = topics[traw] = traw.decode()
                done = start + rel + size
                if magic == batch and is_kafka(data, rel + codec.BATCH_HEAD_SIZE):
                    # a Kafka batch (codec_kafka): a unit per record, no tags; its records'
                    # ids are made from its place (their keys are not indexed: that would
                    # decompress every batch here, on every replica)
                    units, hashes = [RECORD.pack(phys, size, 0)] * count, []
                    ids = [crc32(codec_kafka.msg_id(phys, k), ID_SEED) for k in range(count)] if index_ids else ()
                    if self.on_kafka_batch is not None:
                        try:
                            z = codec_kafka.read_zone(data, rel + codec.BATCH_HEAD_SIZE, rel + size)
                        except codec.CorruptEntry as err:  # written checked: the log changed under us
                            raise DamagedConsumeQueue(f"the Kafka batch at offset {phys}: {err.reason}") from None
                        self.on_kafka_batch(topic, qid, z.producer_id, z.producer_epoch, z.base_sequence,
                                            count, qoff)
                elif magic == batch:
                    zone_at = rel + codec.BATCH_HEAD_SIZE
                    try:
                        ids, with_props = codec_batch.record_ids(data, zone_at, rel + size,
                                                                 ID_SEED if index_ids else None)
                    except codec.CorruptEntry as err:  # written checked: the log changed under us
                        raise DamagedConsumeQueue(f"the batch at offset {phys}: {err.reason}") from None
                    if topic[0] == "%":
                        self._system_records(topic, data, zone_at, rel + size)
                        continue
                    if with_props:
                        units, hashes = self._units_with_props(topic, data, zone_at, rel + size, phys, size)
                    else:
                        units, hashes = [RECORD.pack(phys, size, 0)] * count, []
                else:
                    _, _, _, _, _, msg_id, _, _, plen = meta1(data, rel)
                    ids = (msg_id,)
                    if topic[0] == "%":  # a system entry (no-op, topic config, offsets): no queue
                        if self.on_system_entry is not None:
                            self.on_system_entry(topic, data[rel + at + tlen + plen:rel + size])
                        continue
                    if plen:
                        props = data[rel + at + tlen:rel + at + tlen + plen]
                        units = [RECORD.pack(phys, size, codec.tag_hash(codec.tag_of(props)))]
                        hashes = [key_hash(key_for(topic, k)) for k in codec.keys_of(props)]
                    else:
                        units, hashes = [RECORD.pack(phys, size, 0)], []
                if index_ids:
                    hashes += ids if magic == batch else map(id_hash, ids)  # a batch's: hashed already
                if hashes:
                    keys.append((hashes, phys, ts))
                key = (topic, qid)
                group = groups.get(key)
                if group is None:
                    group = groups[key] = [qoff, []]
                elif group[0] + len(group[1]) != qoff:
                    self._write_cq(key, group, rebuilding)
                    group[0], group[1] = qoff, []
                group[1] += units
        for key, group in groups.items():
            self._write_cq(key, group, rebuilding)
        if keys:
            self.key_index.put_many(keys)
        self.cqs.dispatched_offset = done  # only once everything above is written
        return set(groups)

    def _read_nothing(self, pos: int, limit: int) -> None:
        """The log gave no bytes at `pos`: fine at `limit`; below the log start or in a hole
        between segments it means entries nobody will ever index: raise, never stop quietly."""
        cl = self.commitlog
        if pos < cl.min_offset:
            raise LogStartPassedDispatch(
                f"the CommitLog starts at {cl.min_offset}, past offset {pos} the dispatcher reads "
                f"next: entries in [{pos}, {cl.min_offset}) were deleted before they were indexed "
                f"and their system entries applied")
        if pos < limit:
            raise DamagedConsumeQueue(f"no CommitLog segment holds offset {pos} (below {limit}; "
                                      f"the log is [{cl.min_offset}, {cl.tail.offset}))")

    def _system_records(self, topic: str, data, zone_at: int, end: int) -> None:
        """A system batch ("%..." topic: no-ops, topic configs, offsets): no queue; each
        record's body goes to on_system_entry."""
        if self.on_system_entry is not None:
            for r in codec_batch.walk_records(data, zone_at, end):
                p = zone_at + r.rel + codec.RECORD_SIZE + r.props_len
                self.on_system_entry(topic, data[p:p + r.body_len])

    @staticmethod
    def _units_with_props(topic: str, data, zone_at: int, end: int, phys: int, size: int):
        """(ConsumeQueue units, key hashes) of a batch whose records carry properties: each
        record's tag hash; each key once per batch."""
        units, hashes, seen = [], [], set()
        for r in codec_batch.walk_records(data, zone_at, end):
            if not r.props_len:
                units.append(RECORD.pack(phys, size, 0))
                continue
            p = zone_at + r.rel + codec.RECORD_SIZE
            props = data[p:p + r.props_len]
            units.append(RECORD.pack(phys, size, codec.tag_hash(codec.tag_of(props))))
            for k in codec.keys_of(props):
                if k not in seen:
                    seen.add(k)
                    hashes.append(key_hash(key_for(topic, k)))
        return units, hashes

    def _write_cq(self, key, group, rebuilding: bool) -> None:
        start, records = group
        if not records:
            return
        cq = self.cqs.get_or_create(*key)
        if start > cq.max_offset:
            if cq.records.first == cq.records.count and (rebuilding or cq.max_offset == 0):
                cq.records.reset(start)  # a queue whose older messages were deleted
                cq.min_offset = start
            else:
                raise DamagedConsumeQueue(f"ConsumeQueue {key[0]}/{key[1]} ends at "
                                          f"{cq.max_offset}, next message is {start}")
        cq.write(start, b"".join(records))
