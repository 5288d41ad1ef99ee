"""The key index's files get every block allocated up front without writing zeros."""
import os

import pytest

from broker.store.files import DiskFull, preallocate


def _written_bytes() -> int:
    """Bytes this process has caused to be written to storage (/proc/self/io)."""
    for line in open("/proc/self/io"):
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    raise AssertionError("no write_bytes in /proc/self/io")


def test_allocated_reads_as_zeros_and_writes_no_data(tmp_path):
    size = 8 << 20
    path = tmp_path / "f"
    before = _written_bytes()
    preallocate(path, size)
    written = _written_bytes() - before
    st = os.stat(path)
    assert st.st_size == size
    assert st.st_blocks * 512 >= size, "not every block is allocated: a mapped page could SIGBUS"
    with open(path, "rb") as f:
        assert f.read() == bytes(size)
    # writing 8 MiB of zeros (the old way) is 8 MiB of writes to the disk
    assert written < size // 8, f"{written} bytes written to allocate {size}"


def test_no_space_raises_disk_full_and_leaves_no_file(tmp_path, monkeypatch):
    def enospc(fd, offset, length):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", enospc)
    with pytest.raises(DiskFull, match="no space for f"):
        preallocate(tmp_path / "f", 1 << 20)
    assert not (tmp_path / "f").exists()
