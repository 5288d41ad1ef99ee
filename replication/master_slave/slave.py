"""The slave's side of the HA stream, as a pure state machine: turn the master's TRANSFER
frames (replication/master_slave/wire.py) back into whole CommitLog entries.

Bodies are raw CommitLog bytes and may cut an entry anywhere. A body's bytes are taken as they
arrive; the whole entries among them are handed on when the frame ends, once `handon_bytes`
have gathered or once `handon_s` has passed since the last hand-on, whichever comes first (a
frame may be a whole `ha_transfer_batch_bytes`: on a slow link the slave's reports must move
while it arrives, ha_server.STALL_S; on a fast one, a hand-on per read costs an append and a
report each). A partial entry waits for the rest (either magic: a TLE2 record batch is one
entry, handed on whole, never a prefix of its records); end-of-segment markers are skipped (the
slave's own log writes the same marker by the same placement rule, which `append_as_follower`
checks); anything that does not continue exactly where the stream stands is refused
(StreamMismatch: the driver drops the connection and the slave resynchronizes through a new
handshake).
"""

from __future__ import annotations

from broker.store import codec
from replication.master_slave.wire import HEADER, decode_header

TRANSFER_BYTES_MAX = 64 << 20  # a body larger than this is refused, whatever the config
HANDON_BYTES = 256 << 10
HANDON_S = 1.0  # well inside ha_server.STALL_S (10 s)


class StreamMismatch(ValueError):
    pass


class SlaveStream:
    def __init__(self, start: int, entry_bytes_max: int, handon_bytes: int = HANDON_BYTES,
                 handon_s: float = HANDON_S):
        self.expected = start  # the offset the next body must start at
        self.entry_bytes_max = entry_bytes_max
        self.handon_bytes = handon_bytes
        self.handon_s = handon_s
        self.handed_at = 0.0  # the `now` of the last hand-on
        self.frames = bytearray()  # the start of a header the last read cut
        self.body_left = 0  # bytes of the current frame's body still to come
        self.pending = bytearray()  # CommitLog bytes after the last whole entry
        self.pending_at = start  # the offset of pending[0]
        self.blank_left = 0  # bytes of an end-of-segment marker still to skip
        self.epoch = 0
        self.master_end = 0
        self.confirm = 0
        self.heartbeats = 0

    def feed(self, data, now: float = 0.0) -> list[bytes]:
        """Bytes from the connection -> the whole entries they complete, in log order: when a
        frame ends, else only once `handon_bytes` wait in `pending` or `handon_s` has passed
        since the last hand-on (`now` is the caller's clock, time.monotonic()). A body byte is
        copied once into `pending` and once out in its entry: this runs for every byte a slave
        receives."""
        hsize, pos, ended = HEADER.size, 0, False
        if self.frames:  # a header cut by the last read: complete it (a few bytes)
            pos = hsize - len(self.frames)
            self.frames += data[:pos]
            if len(self.frames) == hsize:
                ended = self._header(self.frames, 0)
                self.frames = bytearray()
        n = len(data)
        with memoryview(data) as view:
            while pos < n:
                if self.body_left:  # (the header before it was checked)
                    take = min(self.body_left, n - pos)
                    self.pending += view[pos:pos + take]
                    self.expected += take
                    self.body_left -= take
                    pos += take
                    ended = ended or not self.body_left
                elif n - pos < hsize:
                    self.frames += view[pos:]
                    break
                else:
                    ended = self._header(view, pos) or ended
                    pos += hsize
        if not ended and self.body_left and len(self.pending) < self.handon_bytes \
                and now - self.handed_at < self.handon_s:
            return []  # mid-frame, too little yet to be worth an append and a report
        self.handed_at = now
        return self._entries()

    def _header(self, buf, pos: int) -> bool:
        """Check and take the TRANSFER header at `pos`; whether it ends its frame (a heartbeat:
        no body)."""
        offset, size, epoch, master_end, confirm = decode_header(buf, pos)  # range-checked
        if size > TRANSFER_BYTES_MAX:
            raise StreamMismatch(f"transfer of {size} bytes exceeds {TRANSFER_BYTES_MAX}")
        if offset != self.expected:
            raise StreamMismatch(f"master sent offset {offset}, this slave needs {self.expected}")
        if epoch < self.epoch:
            raise StreamMismatch(f"master's epoch went back from {self.epoch} to {epoch}")
        self.epoch, self.master_end, self.confirm = epoch, master_end, confirm
        self.body_left = size
        if not size:
            self.heartbeats += 1
        return not size

    def _entries(self) -> list[bytes]:
        """The whole entries in `pending`, TLE1 or TLE2, by codec.walk2's rule (framing only:
        `append_as_follower` checks each entry's CRCs): a PARTIAL stop waits for more
        bytes, a MARKER is skipped (its zero fill may still be on the way), anything
        else (never-written bytes, a corrupt entry) is a StreamMismatch."""
        pend, p, n = self.pending, 0, len(self.pending)
        out = []
        append, walk, size_max = out.append, codec.walk2, self.entry_bytes_max
        with memoryview(pend) as view:  # (released before `pend` is cut)
            while p < n:
                if self.blank_left:
                    skip = min(self.blank_left, n - p)
                    p += skip
                    self.blank_left -= skip
                    continue
                w = walk(pend, p, n, read="frame", size_max=size_max)
                for q, size in w:
                    append(bytes(view[q:q + size]))
                stop = w.stop
                p = stop.pos
                if stop.kind == codec.MARKER:
                    self.blank_left = stop.size
                    continue
                if stop.kind == codec.PARTIAL:
                    break
                size, magic = codec.peek(pend, p)
                raise StreamMismatch(f"no entry at offset {self.pending_at + p} "
                                     f"(size {size}, magic 0x{magic:08x}: {stop.reason or stop.kind})")
        del pend[:p]
        self.pending_at += p
        return out
