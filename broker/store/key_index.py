"""The key index: find messages by business key (and by message id) within a time range.

After RocketMQ's IndexFile: each file is a hash table on disk, named by the time it was
created (ms). Layout of one file (big-endian), memory-mapped:

    header (40 bytes):  begin_ts_ms u64 | end_ts_ms u64 | begin_phys u64 | end_phys u64
                        | slots u32 | count u32
    slots (slots x 4):  number (1-based) of the newest entry whose key hashes to the slot
    entries (20 each):  key_hash u32 | phys_offset u64 | ts_diff_s u32 | prev u32
                        (ts_diff_s: store time minus begin_ts_ms, in seconds; prev: the
                        previous entry of the same slot, 0 at the end of the chain)

Index keys are `topic#key` for business keys and `#id#` + the 16 id bytes for message ids. The index is
derived data: a lookup reads the entries it points at and keeps only those whose key and
time really match, so hash collisions, entries re-inserted after a crash and entries that
point past a cut CommitLog tail are all harmless.
"""

from __future__ import annotations

import functools
import logging
import mmap
import os
import struct
import threading
import zlib
from pathlib import Path

from broker.store import native
from broker.store.files import NAME_DIGITS, PREP_SUFFIX, DataFile, Preparer, TooManyOpenFiles, fsync_dir, open_fd

# the put loop in C (broker/store/_zonewalk.c index_put): a fast path of _put_loop; without
# it (no C compiler where this was installed, or TIDELOG_NO_C_EXT) numpy and the loop below
_zonewalk = native.zonewalk()

log = logging.getLogger(__name__)

HEADER = struct.Struct(">QQQQII")
ENTRY = struct.Struct(">IQII")
SLOT = struct.Struct(">I")
VECTOR_MIN = 48  # hashes per put from which numpy's fixed cost (~20 us) pays: measured break-even ~48 (a W=1 send is one)


def key_for(topic: str, key: str) -> bytes:
    return f"{topic}#{key}".encode()


def id_key(msg_id: bytes) -> bytes:
    return b"#id#" + msg_id


def key_hash(key: bytes) -> int:
    return zlib.crc32(key)


ID_SEED = zlib.crc32(b"#id#")  # id_hash(m) is crc32(m, ID_SEED) (codec_batch.record_ids takes it)


def id_hash(msg_id: bytes) -> int:
    """key_hash(id_key(msg_id)), without building the key (CRC-32 continues from the prefix's)."""
    return zlib.crc32(msg_id, ID_SEED)


@functools.cache
def _numpy():
    """numpy and ENTRY as its dtype, for puts of VECTOR_MIN+ hashes without the C put. Not imported at module
    load (~0.15-0.2 s): a store's Preparer thread imports it when the store loads, and a
    first big put before that finishes waits for the import."""
    import numpy as np
    return np, np.dtype([("hash", ">u4"), ("phys", ">u8"), ("diff", ">u4"), ("prev", ">u4")])


class IndexFile:
    def __init__(self, df: DataFile, slots: int, entries_max: int):
        self.df = df
        self.slots = slots
        self.entries_max = entries_max
        self.mm = mmap.mmap(df.fd, df.size)
        (self.begin_ts, self.end_ts, self.begin_phys, self.end_phys, slots_on_disk,
         self.count) = HEADER.unpack_from(self.mm, 0)
        if slots_on_disk == 0 and self.count == 0:
            self._write_header()
        elif slots_on_disk != slots or self.count > entries_max or self.end_ts < self.begin_ts:
            raise ValueError(f"index file {df.path.name}: damaged header")
        self._entries_at = HEADER.size + slots * SLOT.size

    @staticmethod
    def file_bytes(slots: int, entries_max: int) -> int:
        return HEADER.size + slots * SLOT.size + entries_max * ENTRY.size

    @property
    def full(self) -> bool:
        return self.count >= self.entries_max

    def _write_header(self) -> None:
        HEADER.pack_into(self.mm, 0, self.begin_ts, self.end_ts, self.begin_phys, self.end_phys,
                         self.slots, self.count)

    def put_many(self, hashes: list[int], start: int, phys: int, ts: int) -> int:
        """Index hashes[start:] (key hashes) at one entry `phys` stored at `ts`, until full;
        returns the next hash to place."""
        count = self.count
        end = min(len(hashes), start + self.entries_max - count)
        if end <= start:
            return end
        if count == 0:
            self.begin_ts, self.begin_phys = ts, phys
        diff = (ts - self.begin_ts) // 1000
        diff = diff if diff > 0 else 0
        if _zonewalk is not None and _zonewalk.index_put(self.mm, hashes, start, end, phys, diff, self.slots,
                                                         self._entries_at, count):
            self.count = count + end - start
        elif end - start >= VECTOR_MIN:
            self._put_vector(hashes, start, end, phys, diff)
        else:
            self._put_loop(hashes, start, end, phys, diff)
        self.end_ts, self.end_phys = max(self.end_ts, ts), phys
        return end

    def _put_loop(self, hashes: list[int], start: int, end: int, phys: int, diff: int) -> None:
        mm, slots, count = self.mm, self.slots, self.count
        slot_pack, slot_unpack, entry_pack = SLOT.pack_into, SLOT.unpack_from, ENTRY.pack_into
        hsize, esize = HEADER.size, ENTRY.size
        at = self._entries_at + count * esize
        for i in range(start, end):
            h = hashes[i]
            slot_at = hsize + (h % slots) * 4
            entry_pack(mm, at, h, phys, diff, slot_unpack(mm, slot_at)[0])
            at += esize
            count += 1
            slot_pack(mm, slot_at, count)
        self.count = count

    def _put_vector(self, hashes: list[int], start: int, end: int, phys: int, diff: int) -> None:
        """What _put_loop writes, with numpy: one entry array, the slots' chains linked in
        place (a slot hit twice in this call chains to this call's earlier entry)."""
        np, entry_dtype = _numpy()
        n, count = end - start, self.count
        h = np.array(hashes[start:end], dtype=np.uint32)
        s = h.astype(np.int64) % self.slots
        numbers = np.arange(count + 1, count + 1 + n, dtype=np.uint32)  # each entry's 1-based number
        slot_view = np.frombuffer(self.mm, dtype=">u4", count=self.slots, offset=HEADER.size)
        order = np.argsort(s, kind="stable")  # same slot: in call order
        ss = s[order]
        first = np.empty(n, dtype=bool)
        first[0] = True
        np.not_equal(ss[1:], ss[:-1], out=first[1:])
        prev_sorted = np.empty(n, dtype=np.uint32)
        prev_sorted[first] = slot_view[ss[first]]  # the chain as it was before this call
        prev_sorted[~first] = numbers[order][:-1][~first[1:]]  # the same slot's previous entry here
        entries = np.empty(n, dtype=entry_dtype)
        entries["hash"] = h
        entries["phys"] = phys
        entries["diff"] = diff
        entries["prev"][order] = prev_sorted
        at = self._entries_at + count * ENTRY.size
        self.mm[at:at + n * ENTRY.size] = entries.tobytes()
        last = np.empty(n, dtype=bool)
        last[-1] = True
        last[:-1] = first[1:]
        slot_view[ss[last]] = numbers[order][last]  # each slot points at its newest entry
        del slot_view  # no export may outlive this call (close() closes the mmap)
        self.count = count + n

    def lookup(self, h: int, begin_ms: int, end_ms: int, limit: int) -> list[int]:
        out = []
        n = SLOT.unpack_from(self.mm, HEADER.size + (h % self.slots) * SLOT.size)[0]
        steps = 0
        while 0 < n <= self.count and len(out) < limit and steps <= self.count:
            eh, phys, diff_s, prev = ENTRY.unpack_from(self.mm, self._entries_at + (n - 1) * ENTRY.size)
            ts = self.begin_ts + diff_s * 1000
            # diff is whole seconds: widen the window by one second, callers re-check
            if eh == h and begin_ms - 1000 <= ts <= end_ms:
                out.append(phys)
            if prev >= n:
                break  # a loop in a damaged chain
            n, steps = prev, steps + 1
        return out

    def sync(self) -> None:
        """Write the mapping's dirty pages back. fdatasync, not mmap.flush(): CPython 3.11's
        msync holds the GIL, so the checkpoint thread's write-back of a busy index stalled the
        event loop (measured: 60-90 ms per flush of ~3,000 dirty pages; p99.9 of W=1 sends
        ~10 ms). On Linux msync(MS_SYNC) is an fsync of the mapped range of the file, and a
        shared mapping's dirty pages are the file's page cache, which fdatasync writes back."""
        self._write_header()
        self.df.sync()

    def close(self) -> None:
        self._write_header()
        self.mm.close()
        self.df.close()


class KeyIndex:
    def __init__(self, directory: Path, slots: int, entries_max: int, preparer: Preparer | None = None):
        self.directory = Path(directory)
        self.slots = slots
        self.entries_max = entries_max
        self.preparer = preparer  # allocates the next file while this one fills up
        self._ahead = None  # that allocation (a Future), if started
        self.files: list[IndexFile] = []
        self._lock = threading.Lock()  # closing a file vs. the checkpoint thread syncing it

    def load(self) -> bool:
        """Open the index files; False when one is damaged (it is removed: rebuild)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for p in self.directory.glob("*" + PREP_SUFFIX):
            p.unlink()  # a preparation cut short by a crash
        ok = True
        for p in sorted(self.directory.iterdir()):
            if not (p.is_file() and p.name.isdigit()):
                continue
            try:
                df = DataFile.open(p)
                if df.size != IndexFile.file_bytes(self.slots, self.entries_max):
                    df.close()
                    raise ValueError(f"index file {p.name}: {df.size} bytes, sizes changed?")
                self.files.append(IndexFile(df, self.slots, self.entries_max))
            except ValueError as e:
                log.warning("%s: removing it", e)
                p.unlink(missing_ok=True)
                ok = False
        if self.preparer is not None:
            # a fresh store's first file and numpy (the first big put's) are ready before the
            # first sends: made on the event loop they were a ~0.3 s stall (40 MB of zeros,
            # as the file was made then; numpy's import) in a new raft group's first burst,
            # long enough for its leader to miss check-quorum on a loaded box
            self._prepare_ahead()
            if _zonewalk is None:  # (with the C put, numpy is not needed)
                self.preparer.call(_numpy)
        return ok

    def _active(self, ts_ms: int) -> IndexFile:
        if not self.files or self.files[-1].full:
            name = max(ts_ms, self.files[-1].df.base + 1 if self.files else 0)
            # allocated, not sparse: a page of a memory-mapped sparse file that cannot get
            # disk space kills the process with SIGBUS instead of raising ENOSPC
            df = self._take_prepared(name) or DataFile.create(
                self.directory, name, IndexFile.file_bytes(self.slots, self.entries_max), zeros=True)
            self.files.append(IndexFile(df, self.slots, self.entries_max))
        return self.files[-1]

    @property
    def _prep_path(self) -> Path:
        return self.directory / ("next" + PREP_SUFFIX)

    def _take_prepared(self, name: int) -> DataFile | None:
        """The file allocated ahead, renamed to `name`, if it is ready (when it was ~40 MB of
        zeros written, that on the event loop was a measured stall of a few hundred ms)."""
        fut, self._ahead = self._ahead, None
        if fut is None or not fut.done() or fut.exception() is not None:
            return None  # not ready: the caller fills one now (one thread prepares, in order)
        path = self.directory / f"{name:0{NAME_DIGITS}d}"
        try:  # all or nothing (out of descriptors: the prepared file stays for the next try)
            fd = open_fd(self._prep_path, os.O_RDWR)
        except TooManyOpenFiles:
            self._ahead = fut
            raise
        os.rename(self._prep_path, path)
        try:
            fsync_dir(self.directory)
        except BaseException:
            os.rename(path, self._prep_path)
            os.close(fd)
            self._ahead = fut
            raise
        return DataFile(name, path, fd, IndexFile.file_bytes(self.slots, self.entries_max))

    def put_many(self, entries: list[tuple[list[int], int, int]]) -> None:
        """Index (key hashes, phys_offset, store_ts_ms): the keys (key_hash / id_hash) of
        the messages of one entry each, in log order, rolling files as they fill."""
        for hashes, phys, ts in entries:
            i = 0
            while i < len(hashes):
                i = self._active(ts).put_many(hashes, i, phys, ts)
        if self.preparer is not None:
            self._prepare_ahead()

    def _prepare_ahead(self) -> None:
        """Start allocating the next file once the last is half full (or there is none)."""
        if self._ahead is None and (not self.files or self.files[-1].count * 2 >= self.entries_max):
            self._ahead = self.preparer.submit(self._prep_path, IndexFile.file_bytes(self.slots, self.entries_max))

    def lookup(self, h: int, begin_ms: int, end_ms: int, limit: int) -> list[int]:
        """Physical offsets of candidate entries for the key hash `h` (key_hash / id_hash),
        newest first, without duplicates."""
        seen, out = set(), []
        for f in reversed(self.files):
            if f.count == 0 or f.end_ts < begin_ms - 1000 or f.begin_ts > end_ms:
                continue
            for phys in f.lookup(h, begin_ms, end_ms, limit):
                if phys not in seen:
                    seen.add(phys)
                    out.append(phys)
            if len(out) >= limit:
                break
        return out[:limit]

    def sync(self) -> None:
        with self._lock:
            for f in list(self.files):
                f.sync()

    def delete_before_phys(self, min_phys: int) -> int:
        """Retention: drop files whose entries all point below `min_phys`."""
        n = 0
        with self._lock:
            while len(self.files) > 1 and self.files[0].end_phys < min_phys:
                f = self.files.pop(0)
                f.close()
                f.df.path.unlink(missing_ok=True)
                n += 1
        if n:
            fsync_dir(self.directory)
        return n

    def reset(self) -> None:
        with self._lock:
            for f in self.files:
                f.close()
                f.df.path.unlink(missing_ok=True)
            self.files.clear()

    def close(self) -> None:
        with self._lock:
            for f in self.files:
                f.close()
            self.files.clear()
