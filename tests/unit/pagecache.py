"""A simulated page cache for power-loss tests of the real store.

`PowerLoss(root, rng)` patches os.fsync, os.fdatasync and os.open. While it is on, the
files under `root` are the page cache; what survives a power cut is tracked beside them:
- a file's bytes become durable when the file is fsynced (by inode, so renames carry them);
- a directory's entries (name -> inode) and the sizes of those inodes become durable when
  the directory is fsynced (ext4 commits the inode's metadata with it; its data it does not);
- everything under `root` when the harness starts is durable.

`crash()` replaces the tree under `root` with what a power cut could leave: the durable
directory entries, each file with its durable bytes and, per 4 KiB page that differs, the
page-cache version of that page with probability `torn` (pages reach the disk in any order;
a file's length is its durable or its current one). Nothing else in the process is touched:
close the store's files first (without a final flush), then reopen it.

Not modelled: msync (mmap.flush) would count as no sync at all, which is harsher than a real
disk (the key index writes back with fdatasync, which is recorded like any other); fsyncs are
recorded but not made (the real disk is never power-cut).
"""

from __future__ import annotations

import os
import random
import shutil
import stat
import threading
from pathlib import Path

PAGE = 4096


class PowerLoss:
    def __init__(self, root: Path, rng: random.Random, torn: float = 0.5):
        self.root = str(Path(root).resolve())
        self.rng = rng
        self.torn = torn
        self._lock = threading.Lock()
        self.data: dict[int, bytes] = {}  # inode -> durable bytes
        self.size: dict[int, int] = {}  # inode -> durable length
        self.entries: dict[str, dict[str, tuple[int, bool]]] = {}  # dir -> name -> (inode, is dir)
        self._snapshot_all()

    # --- the patch ---------------------------------------------------------------------

    def install(self, monkeypatch) -> None:
        real_open = os.open

        def fsync(fd):  # the disk under the simulation is never power-cut: no real fsync
            self._synced(fd)

        fdatasync = fsync

        def open_(path, flags, *args, **kw):
            existed = os.path.exists(path) if flags & os.O_CREAT else True
            fd = real_open(path, flags, *args, **kw)
            if not existed:  # a new inode: nothing of it is durable (its number may be reused)
                ino = os.fstat(fd).st_ino
                with self._lock:
                    self.data.pop(ino, None)
                    self.size.pop(ino, None)
            return fd

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "fdatasync", fdatasync)
        monkeypatch.setattr(os, "open", open_)

    def _under(self, path: str) -> bool:
        return path == self.root or path.startswith(self.root + "/")

    def _synced(self, fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if not self._under(path):
            return
        st = os.fstat(fd)
        with self._lock:
            if stat.S_ISDIR(st.st_mode):
                self._sync_dir(path)
            else:
                data = Path(path).read_bytes()
                self.data[st.st_ino] = data
                self.size[st.st_ino] = len(data)

    def _sync_dir(self, path: str) -> None:
        names = {}
        for name in os.listdir(path):
            st = os.lstat(os.path.join(path, name))
            names[name] = (st.st_ino, stat.S_ISDIR(st.st_mode))
            if stat.S_ISREG(st.st_mode):
                self.size[st.st_ino] = st.st_size
        self.entries[path] = names

    def _snapshot_all(self) -> None:
        for d, _dirs, files in os.walk(self.root):
            self._sync_dir(d)
            for name in files:
                p = os.path.join(d, name)
                self.data[os.lstat(p).st_ino] = Path(p).read_bytes()

    # --- the crash ---------------------------------------------------------------------

    def crash(self) -> None:
        """Replace the files under root with what survives a power cut; the durable state
        then starts from that image."""
        with self._lock:
            current = {}  # inode -> bytes in the page cache
            for d, _dirs, files in os.walk(self.root):
                for name in files:
                    p = os.path.join(d, name)
                    current[os.lstat(p).st_ino] = Path(p).read_bytes()
            image: dict[str, bytes | None] = {}  # path -> bytes, None for a directory
            self._rebuild(self.root, current, image)
            shutil.rmtree(self.root)
            for path in sorted(image):  # parents sort before their children
                if image[path] is None:
                    os.makedirs(path, exist_ok=True)
                else:
                    Path(path).write_bytes(image[path])
            self.data.clear()
            self.size.clear()
            self.entries.clear()
            self._snapshot_all()

    def _rebuild(self, d: str, current: dict[int, bytes], image: dict) -> None:
        image[d] = None
        for name, (ino, is_dir) in self.entries.get(d, {}).items():
            p = os.path.join(d, name)
            if is_dir:
                self._rebuild(p, current, image)
            else:
                image[p] = self._survivor(ino, current.get(ino))

    def _survivor(self, ino: int, cur: bytes | None) -> bytes:
        dur = self.data.get(ino, b"")
        length = self.size.get(ino, len(dur))
        if cur is not None and len(cur) != length and self.rng.random() < self.torn:
            length = len(cur)
        out = bytearray((dur + bytes(length))[:length])  # zeros where only the size is durable
        if cur is None:  # deleted since: only its durable bytes are known
            return bytes(out)
        cur = (cur + bytes(length))[:length]
        for at in range(0, length, PAGE):
            if out[at:at + PAGE] != cur[at:at + PAGE] and self.rng.random() < self.torn:
                out[at:at + PAGE] = cur[at:at + PAGE]
        return bytes(out)
