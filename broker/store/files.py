"""Fixed-size files named by the first unit they hold (RocketMQ's MappedFileQueue).

The CommitLog uses it with bytes as the unit (a segment is named by its first physical
offset); ConsumeQueues and the position index use it with records as the unit.

How files get their space: CommitLog segments, ConsumeQueues and the position index start
sparse (ftruncate) and get their blocks from the writes; running out of disk surfaces as
ENOSPC from the write itself, and `ShortWrite` says how much got written so the caller can
undo it. Segments were once zero-filled ahead in a background thread (RocketMQ's
AllocateMappedFileService with warmMappedFileEnable): measured end to end here, that cost as
much CPU as writing the data (35-155 ms a 64 MiB segment) and its fdatasync of the whole file
held up the group commit's fsyncs (raft-3 flush sync at W=256: 42-46k msgs/s, p99 35-39 ms
zero-filled against 55-60k, p99 6.5-10.5 ms sparse; async flush and W=1 no worse sparse), so
they are not any more. The key index has all its blocks allocated up front (by its own
`Preparer`, ahead, with posix_fallocate: no zeros written): it is memory-mapped, and a page
of a sparse mapped file that cannot get disk space is a SIGBUS.

Threads: the event-loop thread writes, creates and deletes files; the flusher thread calls
`sync_dirty`. Structural changes (create, delete, close) and syncing hold `lock`, so a file
is never closed under the flusher's fdatasync.

A failed fsync is final (PostgreSQL's "fsyncgate"): Linux may drop the dirty pages it could
not write and mark them clean, so a retried fsync can succeed without them. A FileQueue
whose fsync failed keeps raising FsyncFailed and never reports those files synced.

File descriptors are bounded (issue 14): a store with thousands of ConsumeQueues cannot keep
one open per file. Files of a FileQueue that has an `OpenFiles` pool are opened on first use
and the least recently used are closed past the pool's bound; a closed file reopens on its
next read or write. Every open goes through `open_fd`: on EMFILE/ENFILE it closes the pools'
idle descriptors and retries once, then raises TooManyOpenFiles, which callers treat as
"nothing happened, try again later", never as damage.
"""

from __future__ import annotations

import bisect
import errno
import logging
import os
import threading
import weakref
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

log = logging.getLogger(__name__)

NAME_DIGITS = 20
IOV_MAX = 1024
PREP_SUFFIX = ".prep"


class DiskFull(OSError):
    """No space: nothing that was asked for got written."""


class FsyncFailed(OSError):
    """An fsync failed: what was written since the last good one may not be on disk, and
    no later fsync can prove it is. Only re-reading the files after a restart can."""


class TooManyOpenFiles(OSError):
    """No file descriptor for an open, even after closing the idle ones: nothing was done,
    and the same call can succeed once descriptors are free again."""


class ShortWrite(OSError):
    """A write failed after `written` bytes had been written."""

    def __init__(self, err: OSError, written: int):
        super().__init__(err.errno, err.strerror)
        self.written = written


_FD_ERRNOS = (errno.EMFILE, errno.ENFILE)
_pools: weakref.WeakSet = weakref.WeakSet()  # every OpenFiles, for open_fd to free from


def open_fd(path, flags: int, mode: int = 0o644) -> int:
    """os.open; out of descriptors (EMFILE/ENFILE), close the pools' idle files and retry
    once, then raise TooManyOpenFiles."""
    try:
        return os.open(path, flags, mode)
    except OSError as e:
        if e.errno not in _FD_ERRNOS:
            raise
        first = e
    freed = sum(pool.close_idle() for pool in list(_pools))
    try:
        return os.open(path, flags, mode)
    except OSError as e:
        if e.errno not in _FD_ERRNOS:
            raise
        log.warning("cannot open %s: %s (closed %d idle files first)", path, e.strerror, freed)
        raise TooManyOpenFiles(e.errno, f"cannot open {path}: {e.strerror} (the process is at its "
                                        f"file descriptor limit; retry once some are closed)") from first


class OpenFiles:
    """At most `max_open` descriptors for the DataFiles that share this pool, least recently
    used closed first (RocketMQ keeps every ConsumeQueue mapped; with auto-created topics
    that runs any fd limit out).

    Threads: the thread that created the pool (the store's writer) opens, touches and closes
    files; it never takes the lock for a file that is already open, so a read or write costs
    a dict move_to_end. Other threads only fsync (`sync`): they pin an open file under the
    lock so it is not closed under them, or open a private descriptor for a closed one.
    """

    def __init__(self, max_open: int):
        if max_open < 1:
            raise ValueError(f"max_open must be at least 1, not {max_open}")
        self.max_open = max_open
        self._lru: OrderedDict[DataFile, None] = OrderedDict()
        self.lock = threading.Lock()
        self._owner = threading.get_ident()
        self.opens = 0  # how many times a file was (re)opened: a measure of churn
        _pools.add(self)

    def __len__(self) -> int:
        return len(self._lru)

    def fd(self, f: DataFile) -> int:
        """f's descriptor, opening it (and closing the least recently used) if needed."""
        fd = f.fd
        if fd >= 0:
            self._lru.move_to_end(f)
            return fd
        if f.closed:
            raise ValueError(f"{f.path} is closed")
        fd = open_fd(f.path, os.O_RDWR)
        self.adopt(f, fd)
        return fd

    def adopt(self, f: DataFile, fd: int) -> None:
        """f was just opened as `fd`: count it, closing LRU files past the bound."""
        self._owner = threading.get_ident()  # whoever opens files is the writer
        with self.lock:
            f.fd = fd
            self._lru[f] = None
            self.opens += 1
            self._shrink(self.max_open)

    def forget(self, f: DataFile) -> None:
        """f is being closed for good (its FileQueue holds the lock that syncs it)."""
        with self.lock:
            self._lru.pop(f, None)

    def close_idle(self) -> int:
        """Close every open file nobody is syncing (an open hit the fd limit); how many. Only
        the owner thread closes: elsewhere a file could be closed under the owner's pread."""
        if threading.get_ident() != self._owner:
            return 0
        with self.lock:
            return self._shrink(0)

    def _shrink(self, keep: int) -> int:
        n = 0
        if len(self._lru) <= keep:
            return 0
        for f in list(self._lru):
            if len(self._lru) <= keep:
                break
            if f.pins:  # being fsynced by another thread
                continue
            del self._lru[f]
            fd, f.fd = f.fd, -1
            os.close(fd)
            n += 1
        return n

    def sync(self, f: DataFile) -> None:
        """fdatasync f from any thread. A closed file is synced through a descriptor of its
        own: Linux writes back the inode's dirty pages whichever descriptor asks (and since
        4.13 reports a writeback error to a descriptor opened after it, if unseen)."""
        with self.lock:
            fd = f.fd
            if fd >= 0:
                f.pins += 1
        if fd >= 0:
            try:
                os.fdatasync(fd)
            finally:
                with self.lock:
                    f.pins -= 1
            return
        if f.closed:
            return
        fd = open_fd(f.path, os.O_RDWR)
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)


def preallocate(path: Path, size: int) -> None:
    """Create `path` of `size` bytes that read as zeros, every block allocated on disk
    (raises DiskFull, removes it). posix_fallocate reserves the blocks without writing them
    (ext4, xfs, tmpfs: a 40 MB key index file was 40 MB of zeros written and fdatasynced at
    every broker's start before); on a file system without fallocate glibc writes zeros."""
    fd = open_fd(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, size)
        os.fdatasync(fd)
    except OSError as e:
        os.close(fd)
        path.unlink(missing_ok=True)
        if e.errno == errno.ENOSPC:
            raise DiskFull(errno.ENOSPC, f"no space for {path.name} ({size} bytes)") from None
        raise
    os.close(fd)


class Preparer:
    """One background thread that allocates files before they are needed (and warms up
    what would stall the event loop the first time: see `call`)."""

    def __init__(self):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tidelog-prepare")

    def submit(self, path: Path, size: int) -> Future:
        return self._pool.submit(preallocate, path, size)

    def call(self, fn) -> Future:
        """Run `fn()` on the same thread (warm-ups that would stall the event loop)."""
        return self._pool.submit(fn)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class DataFile:
    """One file. Without a pool it holds its descriptor from open to close; with one (an
    `OpenFiles`) the descriptor comes and goes, `fd` is -1 while it is closed."""

    __slots__ = ("base", "path", "fd", "size", "pool", "pins", "closed", "__weakref__")

    def __init__(self, base: int, path: Path, fd: int, size: int, pool: OpenFiles | None = None):
        self.base = base
        self.path = path
        self.fd = -1 if pool is not None else fd
        self.size = size
        self.pool = pool
        self.pins = 0  # syncs in progress on another thread (the pool does not close it)
        self.closed = False
        if pool is not None and fd >= 0:
            pool.adopt(self, fd)

    @classmethod
    def create(cls, directory: Path, base: int, size: int, zeros: bool = False,
               pool: OpenFiles | None = None) -> DataFile:
        """A new file: all its blocks allocated (`zeros`) or sparse. All or nothing: on an error
        (no space, no descriptor) no file of that name is left behind."""
        path = directory / f"{base:0{NAME_DIGITS}d}"
        if zeros:
            tmp = path.with_name(path.name + PREP_SUFFIX)
            preallocate(tmp, size)
            try:
                fd = open_fd(tmp, os.O_RDWR)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            os.rename(tmp, path)
        else:
            fd = open_fd(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            if not zeros:
                os.ftruncate(fd, size)
            fsync_dir(directory)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        return cls(base, path, fd, size, pool)

    @classmethod
    def open(cls, path: Path, pool: OpenFiles | None = None) -> DataFile:
        if pool is not None:  # opened on first use
            return cls(int(path.name), path, -1, os.stat(path).st_size, pool)
        fd = open_fd(path, os.O_RDWR)
        return cls(int(path.name), path, fd, os.fstat(fd).st_size)

    def _fd(self) -> int:
        if self.pool is not None:
            return self.pool.fd(self)
        return self.fd

    def pwrite(self, pos: int, data) -> None:
        fd = self._fd()
        view = memoryview(data)
        while view:
            n = os.pwrite(fd, view, pos)
            view = view[n:]
            pos += n

    def pwritev(self, pos: int, parts: list) -> None:
        """Write `parts` back to back from `pos` (a gathering write: nothing is joined).
        Raises ShortWrite with the number of bytes that did get written."""
        written = 0
        try:
            fd = self._fd()
            for i in range(0, len(parts), IOV_MAX):
                chunk = parts[i:i + IOV_MAX]
                size = sum(map(len, chunk))
                n = os.pwritev(fd, chunk, pos + written)
                if n < size:  # short (e.g. the disk just filled up): retry the rest, raising
                    rest = memoryview(b"".join(chunk))[n:]
                    written += n
                    while rest:
                        k = os.pwrite(fd, rest, pos + written)
                        rest = rest[k:]
                        written += k
                else:
                    written += n
        except OSError as e:
            raise ShortWrite(e, written) from e

    def pread(self, pos: int, n: int) -> bytes:
        return os.pread(self._fd(), n, pos)

    def sync(self) -> None:
        if self.pool is not None:
            self.pool.sync(self)
        elif self.fd >= 0:
            os.fdatasync(self.fd)

    def close(self) -> None:
        self.closed = True
        if self.pool is not None:
            self.pool.forget(self)
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class FileQueue:
    """Files of `file_units` units each, unit = `unit_bytes` bytes, named by their first unit."""

    def __init__(self, directory: Path, file_units: int, unit_bytes: int = 1,
                 pool: OpenFiles | None = None):
        self.directory = Path(directory)
        self.pool = pool  # set before load: files then open on demand, LRU-bounded
        self.file_units = file_units
        self.unit_bytes = unit_bytes
        self.files: list[DataFile] = []
        self._bases: list[int] = []
        self._dirty: set[DataFile] = set()
        self.fsync_error: FsyncFailed | None = None
        self.lock = threading.Lock()

    # --- lifecycle ---------------------------------------------------------------------

    def load(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        for p in self.directory.glob("*" + PREP_SUFFIX):
            p.unlink()  # left by a version that zero-filled files ahead, or a crash in create
        names = sorted(
            p for p in self.directory.iterdir()
            if p.is_file() and p.name.isdigit() and len(p.name) == NAME_DIGITS
        )
        self.files = [DataFile.open(p, self.pool) for p in names]
        self._bases = [f.base for f in self.files]

    def close(self) -> None:
        with self.lock:
            for f in self.files:
                f.close()
            self.files.clear()
            self._bases.clear()
            self._dirty.clear()

    # --- lookup ------------------------------------------------------------------------

    @property
    def first_unit(self) -> int | None:
        return self.files[0].base if self.files else None

    def units_of(self, f: DataFile) -> int:
        return f.size // self.unit_bytes

    def find(self, unit: int) -> DataFile | None:
        """The file that holds `unit`, if any."""
        i = bisect.bisect_right(self._bases, unit) - 1
        if i < 0:
            return None
        f = self.files[i]
        return f if unit < f.base + self.units_of(f) else None

    def next_base(self) -> int | None:
        if not self.files:
            return None
        last = self.files[-1]
        return last.base + self.units_of(last)

    # --- changes -----------------------------------------------------------------------

    def create(self, base: int) -> DataFile:
        """Create the (sparse) file that starts at `base`, after the last one."""
        size = self.file_units * self.unit_bytes
        with self.lock:
            if self._bases and base < self._bases[-1] + self.units_of(self.files[-1]):
                raise ValueError(f"file at {base} would overlap {self.files[-1].path.name}")
            f = DataFile.create(self.directory, base, size, pool=self.pool)
            self.files.append(f)
            self._bases.append(base)
        return f

    def file_for_write(self, unit: int) -> DataFile:
        """The file holding `unit`, created (with any missing predecessor) if needed."""
        f = self.find(unit)
        if f is not None:
            return f
        base = unit - unit % self.file_units if not self.files else self.next_base()
        while True:
            f = self.create(base)
            if unit < base + self.file_units:
                return f
            base += self.file_units

    def base_for(self, unit: int) -> int:
        """The first unit of the file that holds `unit`, or of the one file_for_write would
        create for it (an empty queue starts at a multiple of file_units)."""
        f = self.find(unit)
        if f is not None:
            return f.base
        base = unit - unit % self.file_units if not self.files else self.next_base()
        while unit >= base + self.file_units:
            base += self.file_units
        return base

    def mark_dirty(self, f: DataFile) -> None:
        self._dirty.add(f)

    def mark_dirty_from(self, unit: int) -> None:
        """Mark every file holding units at or after `unit` for the next sync_dirty."""
        for f in self.files:
            if f.base + self.units_of(f) > unit:
                self._dirty.add(f)

    def sync_dirty(self) -> None:
        """fsync the files written since the last call; raises FsyncFailed, now and on
        every later call, once one fsync failed (the files stay marked dirty)."""
        with self.lock:
            if self.fsync_error is not None:
                raise FsyncFailed(self.fsync_error.errno, self.fsync_error.strerror)
            dirty, self._dirty = self._dirty, set()
            pending = list(dirty)
            for i, f in enumerate(pending):
                if f.closed:
                    continue
                try:
                    f.sync()
                except TooManyOpenFiles:  # not an fsync failure: the next round retries
                    self._dirty.update(pending[i:])
                    raise
                except OSError as e:
                    self._dirty.update(pending[i:])
                    self.fsync_error = FsyncFailed(e.errno, f"fsync of {f.path} failed: {e.strerror}")
                    log.error("%s; the files of %s are no longer known to be on disk",
                              self.fsync_error.strerror, self.directory)
                    raise FsyncFailed(e.errno, self.fsync_error.strerror) from e

    def delete_before(self, unit: int) -> list[Path]:
        """Delete whole files that end at or before `unit`; never the last file."""
        gone = []
        with self.lock:
            while len(self.files) > 1 and self.files[0].base + self.units_of(self.files[0]) <= unit:
                f = self.files.pop(0)
                self._bases.pop(0)
                self._dirty.discard(f)
                f.close()
                f.path.unlink(missing_ok=True)
                gone.append(f.path)
        return gone

    def delete_from(self, unit: int) -> list[Path]:
        """Delete whole files that start at or after `unit`."""
        gone = []
        with self.lock:
            while self.files and self.files[-1].base >= unit:
                f = self.files.pop()
                self._bases.pop()
                self._dirty.discard(f)
                f.close()
                f.path.unlink(missing_ok=True)
                gone.append(f.path)
        if gone:
            fsync_dir(self.directory)
        return gone

    def delete_all(self) -> None:
        self.delete_from(-1)


def fsync_dir(directory: Path) -> None:
    fd = open_fd(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new file;
    `mode` holds from the first byte (0o600 for secrets), whatever an older tmp file had."""
    tmp = path.with_name(path.name + ".tmp")
    fd = open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)
