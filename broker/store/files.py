"""Preallocated fixed-size files named by the first unit they hold (RocketMQ's MappedFileQueue).

The CommitLog uses it with bytes as the unit (a segment is named by its first physical
offset); ConsumeQueues and the position index use it with records as the unit.

Files are preallocated with posix_fallocate when created, so running out of disk shows up as
a clean DiskFull at the moment a new file is needed, never as a half-written entry.

Threads: the event-loop thread writes, creates and deletes files; the flusher thread calls
`sync_dirty`. Structural changes (create, delete, close) and syncing hold `lock`, so a file
is never closed under the flusher's fdatasync.
"""

from __future__ import annotations

import bisect
import errno
import logging
import os
import threading
from pathlib import Path

log = logging.getLogger(__name__)

NAME_DIGITS = 20


class DiskFull(OSError):
    """No space for a new file: nothing was written."""


class DataFile:
    __slots__ = ("base", "path", "fd", "size")

    def __init__(self, base: int, path: Path, fd: int, size: int):
        self.base = base
        self.path = path
        self.fd = fd
        self.size = size

    @classmethod
    def create(cls, directory: Path, base: int, size: int) -> DataFile:
        path = directory / f"{base:0{NAME_DIGITS}d}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as e:
                if e.errno == errno.ENOSPC:
                    raise DiskFull(errno.ENOSPC, f"no space to allocate {path.name} ({size} bytes)")
                if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                os.ftruncate(fd, size)  # filesystems without fallocate: sparse file
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        fsync_dir(directory)
        return cls(base, path, fd, size)

    @classmethod
    def open(cls, path: Path) -> DataFile:
        fd = os.open(path, os.O_RDWR)
        return cls(int(path.name), path, fd, os.fstat(fd).st_size)

    def pwrite(self, pos: int, data) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(self.fd, view, pos)
            view = view[n:]
            pos += n

    def pread(self, pos: int, n: int) -> bytes:
        return os.pread(self.fd, n, pos)

    def sync(self) -> None:
        os.fdatasync(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class FileQueue:
    """Files of `file_units` units each, unit = `unit_bytes` bytes, named by their first unit."""

    def __init__(self, directory: Path, file_units: int, unit_bytes: int = 1):
        self.directory = Path(directory)
        self.file_units = file_units
        self.unit_bytes = unit_bytes
        self.files: list[DataFile] = []
        self._bases: list[int] = []
        self._dirty: set[DataFile] = set()
        self.lock = threading.Lock()

    # --- lifecycle ---------------------------------------------------------------------

    def load(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        names = sorted(
            p for p in self.directory.iterdir()
            if p.is_file() and p.name.isdigit() and len(p.name) == NAME_DIGITS
        )
        self.files = [DataFile.open(p) for p in names]
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
        """Create the file that starts at `base` (after the last one). Raises DiskFull."""
        with self.lock:
            if self._bases and base < self._bases[-1] + self.units_of(self.files[-1]):
                raise ValueError(f"file at {base} would overlap {self.files[-1].path.name}")
            f = DataFile.create(self.directory, base, self.file_units * self.unit_bytes)
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

    def mark_dirty(self, f: DataFile) -> None:
        self._dirty.add(f)

    def sync_dirty(self) -> None:
        with self.lock:
            dirty, self._dirty = self._dirty, set()
            for f in dirty:
                if f.fd >= 0:
                    f.sync()

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
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new file."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)
