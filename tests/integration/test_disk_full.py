"""A full disk: sends get DISK_FULL, the broker keeps serving, nothing acknowledged is lost,
nothing refused comes back, and writes resume once there is space again."""

import os
import shutil
import subprocess
import time

import pytest

from broker.client import Admin, Producer, SendError
from broker.protocol.codes import Code

from ..helpers import BrokerThread

pytestmark = pytest.mark.slow


@pytest.fixture
def small_disk(tmp_path):
    """A real 48 MiB ext4 filesystem on a loop device (needs root, as CI has)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a loop filesystem needs root")
    img, mnt = tmp_path / "disk.img", tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["truncate", "-s", "48M", str(img)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], check=True)
    subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True)
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], check=False).returncode:
            subprocess.run(["umount", "-l", str(mnt)], check=False)  # busy: detach lazily


def fill(path, leave_bytes: int) -> None:
    """Take all but `leave_bytes` of the filesystem's space."""
    free = shutil.disk_usage(path.parent).free
    with open(path, "wb") as f:
        chunk = bytes(1 << 20)
        todo = free - leave_bytes
        while todo > 0:
            f.write(chunk[:min(len(chunk), todo)])
            todo -= len(chunk)
        f.flush()
        os.fsync(f.fileno())


def test_enospc_refuses_cleanly_and_loses_nothing(small_disk):
    """Segment 1 holds zeros (allocated at start), segment 2 cannot be prepared (no space)
    and starts sparse; the disk fills while writing into it (or the position index), and
    every refused batch is undone."""
    cfg = dict(segment_bytes=4 << 20, message_body_bytes_max=64 << 10, flush="sync",
               disk_usage_ratio_clean=1.0, disk_usage_ratio_force=1.0, disk_usage_ratio_write_max=1.0,
               retention_check_interval_ms=10**9)
    acked, refused = {}, 0
    with BrokerThread(small_disk / "b", **cfg) as b:
        with Admin([b.address]) as a:
            a.create_topic("t", 2)
        fill(small_disk / "filler", leave_bytes=2 << 20)
        with Producer([b.address], retry_times_when_send_failed=0) as p:
            for i in range(20000):
                try:
                    r = p.send("t", b"%06d" % i + b"x" * 4000)
                    acked[r.msg_id] = r
                except SendError as e:
                    assert e.code == Code.DISK_FULL and e.stored is False, e
                    refused += 1
                    if refused >= 20:
                        break
            assert refused >= 20 and len(acked) > 400
            with Admin([b.address]) as a:
                assert a.status()["store"]["max_offset"] > 0  # still serving
            (small_disk / "filler").unlink()
            time.sleep(1.5)  # the disk guard and dispatch retry catch up
            r = p.send("t", b"after")
            acked[r.msg_id] = r
def test_disk_guard_refuses_sends_before_the_disk_is_full(tmp_path):
    with BrokerThread(tmp_path / "b", disk_usage_ratio_write_max=0.95) as b:
        store = b.broker.store
        store.disk_usage_ratio = lambda: 0.97
        time.sleep(1.3)
        with Producer([b.address], retry_times_when_send_failed=0) as p:
            with pytest.raises(SendError, match="disk_usage_ratio_write_max") as e:
                p.send("t", b"x")
            assert e.value.code == Code.DISK_FULL and e.value.stored is False
            with Admin([b.address]) as a:
                assert a.status()["store"]["writable"] is False
            store.disk_usage_ratio = lambda: 0.5
            time.sleep(1.3)
            assert p.send("t", b"x").queue_offset == 0
