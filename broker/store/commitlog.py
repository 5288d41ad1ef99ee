"""The CommitLog: every entry of every topic, appended to fixed-size segment files.

Segments are named by their first physical offset. An entry never spans two segments: when
the next entry does not fit (keeping 8 bytes for the marker), the segment is closed with an
end-of-segment marker and the entry starts the next file. The position index (`positions/`,
one 20-byte record per log index: phys_offset u64, size u32, term u64) makes reads by index
one lookup away.

The write API names the replication role that calls it (`append_as_leader`,
`truncate_suffix`); all writes happen on one thread (the event loop); the flusher thread only
fsyncs. `tail` is replaced as one tuple so the flusher always sees a consistent triple.

A cut (truncation, restart) bumps `cut_generation` under `_flush_lock`: a flusher round that
read the tail before the cut must not raise `flushed` back above it when its fsync returns.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import threading
from pathlib import Path
from typing import NamedTuple

from broker.store import codec, codec_batch
from broker.store.files import (DiskFull, FileQueue, FsyncFailed, ShortWrite,
                                TooManyOpenFiles, fsync_dir)
from broker.store.record_file import RecordFile
from broker.store.recovery import POSITION, Recovery, Tail
from broker.store.tail_cache import TailCache

log = logging.getLogger(__name__)

POSITIONS_PER_FILE = 1 << 20
# the newest entries held in memory for the dispatcher and HA (a follower dispatches up to
# raft_follower_dispatch_lag_bytes_max = 4 MiB behind, by default)
TAIL_CACHE_BYTES = 8 << 20


class StoreNotWritable(Exception):
    """A write or an fsync failed with an I/O error; the store refuses writes until
    restarted (reads go on)."""


class StoreBusy(StoreNotWritable):
    """Nothing was stored for want of a file descriptor (the segment roll could not open
    the next file); the log is unchanged and stays writable: retry. A subclass of
    StoreNotWritable so that callers that only know that one still answer a retriable
    code."""


class EntryTooLarge(ValueError):
    pass


class FollowerMismatch(ValueError):
    """Entries from a leader that do not fit this log (nothing was written)."""


class NewEntry(NamedTuple):
    """A message for append_as_leader; the log adds index, term, offsets and store time.
    It is also the wire's SendRequest (broker/protocol/send.py)."""

    topic: str
    queue_id: int
    flags: int
    born_ts_ms: int
    msg_id: bytes
    properties: bytes
    body: bytes


class ZoneItem(NamedTuple):
    """A record batch for the leader to append (codec_batch's TLE2): the producer's part as
    received (a SEND_ZONE), its CRC and its records' framing checked, and each record's body
    length. The log adds the head. It is also the wire's ZoneRequest (broker/protocol/send.py)."""

    topic: str
    queue_id: int
    zone: bytes
    records_crc: int
    bodies: list  # each record's body length (codec_batch.frame_records)
    props_max: int  # the largest record's properties length

    @property
    def count(self) -> int:
        return len(self.bodies)

    def entries(self) -> list[NewEntry]:
        """Its messages as NewEntry items (a leader that writes an entry per message)."""
        z, fixed = self.zone, codec.RECORD_SIZE
        if codec_batch.is_kafka(z):
            raise ValueError("a Kafka batch is stored as it arrived, in one record batch: "
                             "it needs commitlog_format: 2")
        out = []
        for r in codec_batch.walk_records(z):
            p = r.rel + fixed
            q = p + r.props_len
            out.append(NewEntry(self.topic, self.queue_id, r.flags, r.born_ts_ms, r.msg_id,
                                bytes(z[p:q]), bytes(z[q:q + r.body_len])))
        return out


class CommitLog(Recovery):
    def __init__(self, directory: Path, segment_bytes: int,
                 positions_per_file: int = POSITIONS_PER_FILE):
        directory = Path(directory)
        self.segment_bytes = segment_bytes
        self.segments = FileQueue(directory / "commitlog", segment_bytes)
        self.positions = RecordFile(directory / "positions", POSITION.size, positions_per_file)
        self.tail = Tail(0, 0, 0)
        self.flushed = Tail(0, 0, 0)
        self.cut_generation = 0
        self._flush_lock = threading.Lock()  # orders a cut against a flusher round's end
        # held across a cut: the broker passes its checkpoint lock, so a background checkpoint
        # write (index manifest and checkpoint of an older snapshot) never straddles a cut
        self.cut_guard = contextlib.nullcontext()
        self.unwritable_reason: str | None = None
        self.fsync_error: FsyncFailed | None = None  # set once: `flushed` never moves again
        self._topic_bytes: dict[str, bytes] = {}
        # The entries of the latest leader append, as written (see recent_entries): a raft
        # leader pushes what it just wrote to every follower, and reading it back from the
        # file cost two reads (position, bytes) per follower and push. (cut generation, first
        # index, term, [entry bytes].) Each entry is one bytes object of its own: a producer's
        # zone arrives as a view into the connection's read buffer, which the next read
        # overwrites.
        self._recent: tuple | None = None
        self.tail_cache = TailCache(TAIL_CACHE_BYTES)  # every append's entries, by offset

    # --- shape -------------------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        first = self.segments.first_unit
        return self.tail.offset if first is None else first

    @property
    def first_index(self) -> int:
        return self.positions.first

    @property
    def start_offset(self) -> int:
        """Where the first entry begins (the tail when there is none): min_offset, or later in
        its segment when the log restarted there (restart_at, reset)."""
        pos = self.position(self.positions.first)
        return max(pos[0], self.min_offset) if pos is not None else self.tail.offset

    def close(self) -> None:
        self.segments.close()
        self.positions.close()

    # --- writes ------------------------------------------------------------------------

    def append_as_leader(self, items, queue_offsets: list[int], term: int,
                         store_ts_ms: int) -> tuple[int, list[int]]:
        """Append `items` (NewEntry-like) as new entries of `term`, with the given queue
        offsets: returns (first index, physical offsets).

        All-or-nothing: if the disk fills up (or any write fails) part-way, what this call
        wrote is zeroed again and the tail stays where it was, so a later recovery cannot
        revive messages whose senders were told "not stored". DiskFull leaves the log
        writable, and so does running out of file descriptors (StoreBusy: the next segment
        could not be opened); another I/O error makes it refuse writes until restarted.
        """
        tail = self._leader_tail(term)
        tb_cache = self._topic_bytes
        topics, sizes = [], []
        for it in items:
            tb = tb_cache.get(it.topic)
            if tb is None:
                tb = tb_cache[it.topic] = it.topic.encode()
            topics.append(tb)
            sizes.append(codec.HEADER_SIZE + len(tb) + len(it.properties) + len(it.body))
        self._fits_segments(sizes)
        places, rolls, end = self._place(tail.offset, sizes)
        index = tail.next_index
        enc, join = codec.encode_parts, b"".join
        entries = [join(enc(index + k, term, places[k], queue_offsets[k], store_ts_ms, it.born_ts_ms,
                            it.msg_id, it.queue_id, it.flags, topics[k], it.properties, it.body))
                   for k, it in enumerate(items)]
        self._write_placed(places, rolls, entries, sizes, [term] * len(items))
        if items:
            self.tail = Tail(end, index + len(items), term)
            self._recent = (self.cut_generation, index, term, entries)
        return index, places

    def append_batches_as_leader(self, batches, base_queue_offsets: list[int], term: int,
                                 store_ts_ms: int) -> tuple[int, list[int]]:
        """Append record batches (TLE2, codec_batch): `batches` are (zone, records_crc), the
        producer's part of each entry as `codec_batch.encode_zone` built it, written as
        received after a 56-byte head of what the log assigns (index, term, phys offset, the
        base queue offset given, store time). One entry, one position record per batch;
        returns (first index, physical offsets of the batches). All-or-nothing, as
        append_as_leader."""
        tail = self._leader_tail(term)
        hsize = codec.BATCH_HEAD_SIZE
        sizes = [hsize + len(zone) for zone, _ in batches]
        self._fits_segments(sizes)
        places, rolls, end = self._place(tail.offset, sizes)
        index = tail.next_index
        head = codec_batch.encode_head
        entries = [head(index + k, term, places[k], base_queue_offsets[k], store_ts_ms, crc, len(zone)) + zone
                   for k, (zone, crc) in enumerate(batches)]
        self._write_placed(places, rolls, entries, sizes, [term] * len(batches))
        if batches:
            self.tail = Tail(end, index + len(batches), term)
            self._recent = (self.cut_generation, index, term, entries)
        return index, places

    def recent_entries(self, lo: int, n: int, max_bytes: int) -> list | None:
        """Entries [lo, lo + n) as (index, term, bytes) -- at least one, then up to
        `max_bytes` -- if the latest leader append holds them all (and no cut or later append
        came since), else None: the caller reads the file. Each entry is the one bytes object
        the append made, for every follower it goes to."""
        r = self._recent
        if r is None or r[0] != self.cut_generation:
            return None
        _, first, term, entries = r
        k = lo - first
        if k < 0 or k + n > len(entries) or lo + n > self.tail.next_index:
            return None
        out, total = [], 0
        for i in range(k, k + n):
            data = entries[i]
            if out and total + len(data) > max_bytes:
                break
            out.append((first + i, term, data))
            total += len(data)
        return out

    def recent_bytes(self, offset: int, max_bytes: int, limit: int | None = None,
                     first_whole: bool = False) -> list[bytes]:
        """The log's bytes from `offset` as the entries written there, from memory (TailCache):
        whole entries that follow each other, up to `limit` (the tail), together at most
        `max_bytes` (`first_whole`: the first whatever its size); [] when `offset` is not
        the start of an entry held (older, a segment's end marker): the caller reads the file."""
        return self.tail_cache.run(offset, self.tail.offset if limit is None else limit, max_bytes, first_whole)

    def _leader_tail(self, term: int) -> Tail:
        """The tail a leader's append starts from, once the log takes writes of `term`."""
        if self.unwritable_reason is not None:
            raise StoreNotWritable(self.unwritable_reason)
        if term < self.tail.last_term:
            raise ValueError(f"term {term} is older than the log's last term {self.tail.last_term}")
        return self.tail

    def _fits_segments(self, sizes: list[int]) -> None:
        """An entry never spans segments and leaves room for the end marker."""
        for size in sizes:
            if size + codec.BLANK_SIZE_MIN > self.segment_bytes:
                raise EntryTooLarge(f"entry of {size} bytes exceeds segment size")

    def append_as_follower(self, raws: list[bytes]) -> None:
        """Append a leader's entries byte for byte, each at the physical offset it names, so
        every replica holds the same bytes at the same offsets. An entry that is corrupt,
        not the next index, or not where this log would put it (the same rule the leader
        followed) raises FollowerMismatch and nothing is written."""
        if self.unwritable_reason is not None:
            raise StoreNotWritable(self.unwritable_reason)
        tail = self.tail
        index, last_term = tail.next_index, tail.last_term
        sizes, terms, named = [], [], []
        check = codec_batch.check_entry
        for raw in raws:
            try:
                size, e_index, e_term, e_phys = check(raw)
            except codec.CorruptEntry as err:
                raise FollowerMismatch(f"entry after index {index - 1}: {err.reason}") from None
            if e_index != index or e_term < last_term or size != len(raw):
                raise FollowerMismatch(f"entry {e_index} (term {e_term}) cannot follow index "
                                       f"{index - 1} (term {last_term})")
            sizes.append(size)
            terms.append(e_term)
            named.append(e_phys)
            index += 1
            last_term = e_term
        places, rolls, _ = self._place(tail.offset, sizes)
        if places != named:
            k = next(i for i, (a, b) in enumerate(zip(places, named)) if a != b)
            raise FollowerMismatch(f"entry {tail.next_index + k} names offset {named[k]}, this log "
                                   f"would put it at {places[k]} (different segment_bytes?)")
        if raws:
            self._write_follower(places, rolls, raws, sizes, terms)

    def append_checked_as_follower(self, raws: list[bytes], places: list[int], terms: list[int]) -> None:
        """append_as_follower for entries whose checks were made already, with the same rules
        (replication/raft/lane.py: broker/store/_zonewalk.c follower_pushes checks each entry as
        check_entry does, the index and term sequence, and that each sits at `places`, where
        _place puts it without a roll). Raises what _write_placed raises; nothing is written then."""
        if self.unwritable_reason is not None:
            raise StoreNotWritable(self.unwritable_reason)
        tail = self.tail
        sizes = [len(r) for r in raws]
        if not raws or places[0] != tail.offset:
            raise FollowerMismatch(f"checked entries start at {places[:1]}, the log ends at {tail.offset}")
        self._write_follower(places, [], raws, sizes, terms)

    def _write_follower(self, places: list[int], rolls: list[int], raws: list[bytes], sizes: list[int],
                        terms: list[int]) -> None:
        """_write_placed of a follower's checked entries (at least one), then the tail after them."""
        self._write_placed(places, rolls, raws, sizes, terms)
        self.tail = Tail(places[-1] + sizes[-1], self.tail.next_index + len(raws), terms[-1])

    def _place(self, pos: int, sizes: list[int]) -> tuple[list[int], list[int], int]:
        """Where entries of `sizes` go from `pos`: (offsets, the offsets where segments are
        closed, the new end). The one rule: an entry leaves room for the end marker."""
        seg_end = self.segment_end(pos)
        places, rolls = [], []
        for size in sizes:
            if pos + size + codec.BLANK_SIZE_MIN > seg_end:
                rolls.append(pos)
                pos = seg_end
                seg_end = pos + self.segment_bytes
            places.append(pos)
            pos += size
        return places, rolls, pos

    def _write_placed(self, places: list[int], rolls: list[int], entries: list, sizes: list[int],
                      terms: list[int]) -> None:
        """Write entries (each bytes-like) at their places, closing rolled segments with
        the end marker, then their position records; all undone if anything fails."""
        if not entries:
            return
        tail = self.tail
        seg_start, parts, pos_records, done = tail.offset, [], [], []
        cur = tail.offset  # where the next byte goes
        pack = POSITION.pack
        try:
            seg = self.segments.file_for_write(tail.offset)
            for r in rolls:
                self.segments.file_for_write(self.segment_end(r))
            seg_end = seg.base + seg.size
            for k, entry in enumerate(entries):
                at = places[k]
                if at >= seg_end:  # roll: close this segment with the marker
                    parts.append(codec.encode_blank(seg_end - cur))
                    self._write(seg, seg_start, parts, done)
                    seg = self.segments.find(at)
                    seg_start, parts, seg_end = at, [], seg.base + seg.size
                parts.append(entry)
                pos_records.append(pack(at, sizes[k], terms[k]))
                cur = at + sizes[k]
            self._write(seg, seg_start, parts, done)
            self.positions.append(b"".join(pos_records))
        except OSError as e:
            self.positions.truncate(tail.next_index)
            self._undo(done, e)  # (raises)
        self.tail_cache.add(places, entries)  # only what was written

    def reset(self, first_raw: bytes) -> None:
        """Drop the whole log; it restarts with `first_raw`, at the offset that entry names
        (a follower whose log no longer overlaps its leader's)."""
        try:
            _, index, _, phys = codec_batch.check_entry(first_raw)
        except codec.CorruptEntry as err:
            raise FollowerMismatch(f"the leader's first entry: {err.reason}") from None
        self.restart_at(phys, index)
        self.append_as_follower([first_raw])

    def restart_at(self, offset: int, index: int) -> None:
        """Drop the whole log; it goes on empty, the next entry being `index` at `offset`."""
        self.tail_cache.clear()  # first: a cut that fails part way leaves nothing stale in it
        with self.cut_guard:
            self.segments.delete_all()
            self.positions.reset(index)
        with self._flush_lock:
            self.cut_generation += 1
            self.tail = self.flushed = Tail(offset, index, 0)

    def segment_end(self, offset: int) -> int:
        """Where the segment holding `offset` ends -- or the one the write will create: the
        same file file_for_write makes (a log restarted at an offset inside a segment,
        with no file yet, starts that segment at its multiple of segment_bytes, as its
        leader's did)."""
        seg = self.segments.find(offset)
        if seg is not None:
            return seg.base + seg.size
        return self.segments.base_for(offset) + self.segment_bytes

    def _write(self, seg, start: int, parts: list[bytes], done: list) -> None:
        if parts:
            n = sum(map(len, parts))
            try:
                seg.pwritev(start - seg.base, parts)
            except ShortWrite as e:
                done.append((seg, start, e.written))
                raise
            done.append((seg, start, n))
            self.segments.mark_dirty(seg)

    def _undo(self, done: list, err: OSError):
        """Zero what a failed append wrote, then raise DiskFull, StoreBusy or
        StoreNotWritable."""
        try:
            for seg, start, n in done:
                seg.pwrite(start - seg.base, bytes(n))  # overwrites: needs no new space
        except OSError as e2:
            self.unwritable_reason = f"write failed ({err}) and could not be undone ({e2})"
        else:
            if err.errno == errno.ENOSPC:
                raise DiskFull(errno.ENOSPC, "no space left on the device: nothing was stored") from err
            if isinstance(err, TooManyOpenFiles):
                # FileQueue.create and RecordFile leave no half-made file or record behind
                log.warning("CommitLog append at offset %d refused: %s", self.tail.offset, err)
                raise StoreBusy(f"nothing was stored, retry: {err.strerror}") from err
            self.unwritable_reason = f"write failed at offset {self.tail.offset}: {err}"
        log.error("CommitLog %s; refusing writes until restart", self.unwritable_reason)
        raise StoreNotWritable(self.unwritable_reason) from err

    def truncate_suffix(self, index: int) -> None:
        """Remove the entries from `index` on (a follower cutting a divergent suffix). The
        log then ends where entry index-1 ends, so an end-of-segment marker written after
        it goes too: the next entry is placed by the same rule as on the leader."""
        if index >= self.tail.next_index:
            return
        if index < self.positions.first:
            raise ValueError(f"cannot truncate to {index}: the log starts at {self.positions.first}")
        if index > self.positions.first:
            phys, size, term = POSITION.unpack(self.positions.read(index - 1))
            self._cut(phys + size, index, term)
        else:
            self._cut(POSITION.unpack(self.positions.read(index))[0], index, 0)

    def truncate_to(self, offset: int) -> int:
        """Remove the entries at or after physical `offset`, which must be where an entry
        ends or starts (the log then ends where the last kept entry ends). Returns the
        number of entries removed."""
        tail = self.tail
        if offset >= tail.offset:
            return 0
        index = self.first_index_at_or_after(offset)
        if index > self.positions.first:
            phys, size, term = POSITION.unpack(self.positions.read(index - 1))
            if phys + size != offset and (index >= tail.next_index or self.position(index)[0] != offset):
                raise ValueError(f"offset {offset} is not an entry boundary (entry {index - 1} "
                                 f"ends at {phys + size})")
            offset = phys + size
        else:
            first = POSITION.unpack(self.positions.read(index))[0] if index < tail.next_index else tail.offset
            if offset != first:
                raise ValueError(f"offset {offset} lies before the log's first entry at {first}")
            term = 0
        self._cut(offset, index, term)
        return tail.next_index - index

    def follows_at(self, offset: int) -> bool:
        """Whether a leader that streams from `offset` continues this log as it ends now: at
        the tail itself, or at the start of the next segment when the rest of the tail's
        segment holds just an end-of-segment marker on the leader (its next entry did not
        fit; truncate_to an entry right after a marker leaves the tail before the marker).
        append_as_follower then places that entry by the same rule and checks the offset."""
        tail = self.tail.offset
        if offset == tail:
            return True
        seg_end = self.segment_end(tail)
        return offset == seg_end and seg_end - tail >= codec.BLANK_SIZE_MIN

    def _cut(self, offset: int, index: int, prev_term: int) -> None:
        """The log ends at `offset` with `index` next: zero what follows in that segment,
        delete later segments, and make both durable (a crash must not revive the cut)."""
        with self.cut_guard:
            self._cut_locked(offset, index, prev_term)

    def _cut_locked(self, offset: int, index: int, prev_term: int) -> None:
        self.tail_cache.clear()  # first: a cut that fails part way leaves nothing stale in it
        seg = self.segments.find(offset)
        if seg is not None:
            seg_end = seg.base + seg.size
            end = self.tail.offset
            if end > seg_end:  # the log went on in a later segment: this one ends with a marker
                last = self.first_index_at_or_after(seg_end) - 1
                pos = self.position(last) if last >= index else None
                end = (pos[0] + pos[1] if pos else offset) + codec.BLANK_SIZE_MIN
            for at in range(offset, end, 1 << 20):
                seg.pwrite(at - seg.base, bytes(min(1 << 20, end - at)))
            self.segments.mark_dirty(seg)
        self.segments.delete_from(offset + 1)
        self.positions.truncate(index)
        with self._flush_lock:
            self.cut_generation += 1
            self.tail = Tail(offset, index, prev_term)
            if self.flushed.offset > offset:
                self.flushed = self.tail
        self._sync_segments()

    def delete_segments_before(self, offset: int) -> list[Path]:
        """Retention: delete whole segments that end at or before `offset`. Position records
        below the new first index that share a file with kept ones stay in it: recovery
        starts the index at the first segment again (Recovery._positions_from_log_start)."""
        gone = self.segments.delete_before(offset)
        if gone:
            first = self.min_offset
            self.tail_cache.forget_before(first)
            idx = self.first_index_at_or_after(first)
            self.positions.delete_before(idx)
            self.positions.first = idx
        return gone

    def first_index_at_or_after(self, offset: int) -> int:
        lo, hi = self.positions.first, self.positions.count
        while lo < hi:
            mid = (lo + hi) // 2
            if POSITION.unpack(self.positions.read(mid))[0] < offset:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # --- flushing (flusher thread) -----------------------------------------------------

    def flush(self) -> Tail:
        """fsync everything written so far; returns the tail that is now durable. A cut made
        while the fsync ran wins: `flushed` then stays where the cut put it (the next round
        covers what was appended after the cut)."""
        if self.fsync_error is not None:
            return self.flushed
        with self._flush_lock:
            tail, generation = self.tail, self.cut_generation
        if tail.offset > self.flushed.offset:
            if not self._sync_segments():
                raise FsyncFailed(self.fsync_error.errno, self.fsync_error.strerror)
            with self._flush_lock:
                if generation == self.cut_generation and tail.offset > self.flushed.offset:
                    self.flushed = tail
        return self.flushed

    def _sync_segments(self, directory: bool = False) -> bool:
        """fsync the dirty segments (and their directory); False when an fsync failed, which
        fails the store: no write is accepted and `flushed` stays where it is until a restart
        re-reads the files (and fsyncs them again)."""
        if self.fsync_error is not None:
            return False
        try:
            self.segments.sync_dirty()
            if directory:
                fsync_dir(self.segments.directory)
        except TooManyOpenFiles:
            raise  # no descriptor to fsync the directory with: not an fsync failure
        except OSError as e:
            self.fsync_error = e if isinstance(e, FsyncFailed) else FsyncFailed(e.errno, e.strerror)
            self.unwritable_reason = f"fsync failed: {self.fsync_error.strerror}"
            log.error("CommitLog %s; refusing writes until restart (reads go on), flushed stays "
                      "at offset %d", self.unwritable_reason, self.flushed.offset)
            return False
        return True

    # --- reads -------------------------------------------------------------------------

    def read(self, phys: int, size: int) -> bytes:
        seg = self.segments.find(phys)
        if seg is None:
            return b""
        return seg.pread(phys - seg.base, size)

    def read_entry(self, phys: int) -> bytes:
        """The raw bytes of the entry at `phys` (not verified)."""
        head = self.read(phys, codec.BATCH_HEAD_SIZE)
        if len(head) < codec.BATCH_HEAD_SIZE:
            raise codec.CorruptEntry("no entry here", phys)
        size, magic = codec.peek(head)
        least = {codec.ENTRY_MAGIC: codec.HEADER_SIZE, codec.BATCH_MAGIC: codec.BATCH_SIZE_MIN}.get(magic)
        if least is None or size < least:
            raise codec.CorruptEntry(f"no entry here (magic 0x{magic:08x})", phys)
        return head + self.read(phys + len(head), size - len(head))

    def position(self, index: int) -> tuple[int, int, int] | None:
        """(phys_offset, size, term) of entry `index`, if the log holds it."""
        if not self.positions.first <= index < self.tail.next_index:
            return None
        raw = self.positions.record(index)
        return POSITION.unpack(raw) if len(raw) == POSITION.size else None

    def read_by_index(self, index: int):
        """The entry `index` decoded: a codec.Entry (TLE1) or a codec_batch.Batch (TLE2)."""
        pos = self.position(index)
        if pos is None:
            return None
        raw = self.read(pos[0], pos[1])
        if codec.peek(raw)[1] == codec.BATCH_MAGIC:
            return codec_batch.decode_batch(raw, 0, base_offset=pos[0])
        return codec.decode(raw, 0, base_offset=pos[0])

    def read_from(self, phys: int, max_bytes: int, limit: int | None = None) -> tuple[int, bytes]:
        """Bytes of whole-or-partial entries from `phys` within one segment, up to `limit`.

        Returns (start, data): when `phys` sits on an end-of-segment marker (or at a segment
        end), start moves to the next segment. Used by the dispatcher and, later, replication.
        """
        limit = self.tail.offset if limit is None else limit
        while phys < limit:
            seg = self.segments.find(phys)
            if seg is None:
                return phys, b""
            seg_end = seg.base + seg.size
            head = seg.pread(phys - seg.base, codec.BLANK_SIZE_MIN)
            stop = codec.classify2(head, 0, len(head), seg_end - phys)
            if stop is not None and stop.kind == codec.MARKER:
                phys = seg_end
                continue
            n = min(max_bytes, limit - phys, seg_end - phys)
            return phys, seg.pread(phys - seg.base, n)
        return phys, b""
