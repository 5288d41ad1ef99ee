"""The master's side of master-slave replication, as a pure state machine (after RocketMQ's
HAService + GroupTransferService): each slave's acknowledged offset, which slaves are in
sync, the sends waiting for replicas, and the high watermark consumers may read up to.

No sockets, files or clocks: the driver passes `now_ms` in and gets back the tokens of the
sends to answer. A send of a SYNC master is answered SUCCESS once the master holds it
durably (under its flush policy) and `required - 1` slaves have acknowledged its offset;
FLUSH_SLAVE_TIMEOUT after `slave_ack_timeout_ms` (FLUSH_DISK_TIMEOUT if the slaves have it
but the master's own fsync is what is late). A send is refused before it is stored
(SLAVE_NOT_AVAILABLE) when fewer than `required` replicas are in sync, where a slave is in
sync if it is connected, no more than `ha_slave_fallbehind_max_bytes` behind, and has reported
within `silent_ms` (2 x ha_heartbeat_interval_ms: a slave that went quiet behind a partition
stops counting within seconds, so sends are refused before they are stored instead of
stored and answered FLUSH_SLAVE_TIMEOUT; it is dropped after `housekeeping_ms`).

`required` is `in_sync_replicas` (the master counts); with `auto_degrade` it shrinks with
the in-sync set down to `min_in_sync_replicas` (RocketMQ 5's quorum write).

An ASYNC master answers a send at once, with or without slaves (RocketMQ's ASYNC_MASTER:
availability is why one chooses it). With `async_fence_replicas` (off by default) it fences
itself instead: it stores a send only while that many replicas, itself included, are in sync
(reported within `silent_ms`, its lease, and at most `fallbehind_max_bytes` behind), else
SLAVE_NOT_AVAILABLE, and STATUS says why (`self_fenced`). With a majority that meets every
promotion quorum (roles.restart_quorum), a failover while it is cut off loses at most
fallbehind_max_bytes plus one append (`append_bytes_max`) of acknowledged sends.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from broker.protocol.codes import Code

RATE_WINDOW_MS = 5000


@dataclass(frozen=True)
class MasterConfig:
    sync: bool = True
    in_sync_replicas: int = 2
    min_in_sync_replicas: int = 1
    auto_degrade: bool = False
    fallbehind_max_bytes: int = 256 << 20
    ack_timeout_ms: int = 3000
    housekeeping_ms: int = 20_000
    silent_ms: int = 2_000  # a slave quiet this long is not in sync (2 x the heartbeat)
    async_fence_replicas: int = 0  # ASYNC: in sync replicas (master counted) to take a send; 0: off
    append_bytes_max: int = 0  # the most one append writes (the self-fence's bound past the window)


@dataclass
class SlaveProgress:
    node: str
    address: str
    connected_ms: int
    last_report_ms: int
    ack: int = -1  # -1 until the first report
    samples: deque = field(default_factory=deque)  # (ms, ack) for the transfer rate

    def rate(self, now_ms: int) -> float:
        """Bytes per second acknowledged over the last RATE_WINDOW_MS (0 when idle)."""
        while len(self.samples) > 1 and now_ms - self.samples[1][0] >= RATE_WINDOW_MS:
            self.samples.popleft()  # keep one sample at or before the window's start
        if len(self.samples) < 2:
            return 0.0
        (t0, a0), (_, a1) = self.samples[0], self.samples[-1]
        span = now_ms - t0
        return (a1 - a0) * 1000 / span if span > 0 else 0.0


class MasterCore:
    def __init__(self, cfg: MasterConfig, written: int = 0, durable: int = 0, confirm: int = 0):
        self.cfg = cfg
        self.written = written  # the master's CommitLog end
        self.durable = durable  # what the master holds under its flush policy
        self.confirm = max(confirm, 0) if cfg.sync else durable  # high watermark, never goes back
        self.slaves: dict[str, SlaveProgress] = {}
        self.waiting: deque = deque()  # (end offset, deadline ms, token), by offset
        self.now_ms = 0  # the latest time the driver passed in (reports, admissions, ticks)

    # --- membership and reports ---------------------------------------------------------

    def connect(self, node: str, address: str, now_ms: int) -> None:
        self.now_ms = max(self.now_ms, now_ms)
        self.slaves[node] = SlaveProgress(node, address, now_ms, now_ms)

    def disconnect(self, node: str) -> None:
        self.slaves.pop(node, None)

    def report(self, node: str, offset: int, now_ms: int) -> list:
        """A slave holds the log up to `offset`: the tokens of sends this satisfies."""
        self.now_ms = max(self.now_ms, now_ms)
        s = self.slaves.get(node)
        if s is None:
            return []
        s.last_report_ms = now_ms
        if offset != s.ack:
            s.ack = offset
            s.samples.append((now_ms, offset))
            s.rate(now_ms)  # trims the samples
        return self._release()

    def local(self, written: int, durable: int) -> list:
        """The master's own log grew (`written`) or was fsynced (`durable`)."""
        self.written = written
        self.durable = durable
        return self._release()

    # --- in sync --------------------------------------------------------------------------

    def in_sync(self, s: SlaveProgress) -> bool:
        return (s.ack >= 0 and self.written - s.ack <= self.cfg.fallbehind_max_bytes
                and self.now_ms - s.last_report_ms <= self.cfg.silent_ms)

    def in_sync_count(self) -> int:
        """Replicas in sync, the master included."""
        return 1 + sum(1 for s in self.slaves.values() if self.in_sync(s))

    def _why_not_in_sync(self, s: SlaveProgress) -> str:
        if s.ack < 0:
            return "no report yet"
        if self.now_ms - s.last_report_ms > self.cfg.silent_ms:
            return f"silent for {self.now_ms - s.last_report_ms} ms"
        return f"{self.written - s.ack} bytes behind"

    def required(self) -> int:
        c = self.cfg
        if not c.auto_degrade:
            return c.in_sync_replicas
        return max(c.min_in_sync_replicas, min(c.in_sync_replicas, self.in_sync_count()))

    def admit(self, now_ms: int | None = None) -> str | None:
        """None if a send may be stored now, else why not (SLAVE_NOT_AVAILABLE)."""
        if now_ms is not None:
            self.now_ms = max(self.now_ms, now_ms)
        if not self.cfg.sync:
            return self.self_fenced()
        have, need = self.in_sync_count(), self.required()
        if have >= need:
            return None
        lagging = [f"{s.node} ({self._why_not_in_sync(s)})" for s in self.slaves.values()
                   if not self.in_sync(s)]
        return (f"{have} of the {need} replicas required (in_sync_replicas, the master counted) "
                f"are in sync" + (f"; lagging: {', '.join(lagging)}" if lagging else
                                  "; no slave is connected" if not self.slaves else ""))

    def self_fenced(self) -> str | None:
        """ASYNC with `async_fence_replicas`: why this master takes no sends now (None: it does)."""
        need = self.cfg.async_fence_replicas
        if self.cfg.sync or not need or self.in_sync_count() >= need:
            return None
        out = [f"{s.node} ({self._why_not_in_sync(s)})" for s in self.slaves.values() if not self.in_sync(s)]
        return (f"self-fenced: {self.in_sync_count()} of the {need} replicas needed (the master counted) "
                f"hold its log to within {self.cfg.fallbehind_max_bytes} bytes and reported within "
                f"{self.cfg.silent_ms} ms -- a promotion may be under way where it cannot hear"
                + (f"; {', '.join(out)}" if out else "; no slave is connected"))

    def replicated(self) -> int:
        """The offset the master (durably) and `required - 1` slaves all hold."""
        k = self.required() - 1
        if k <= 0 or not self.cfg.sync:
            return self.durable
        acks = sorted((s.ack for s in self.slaves.values()), reverse=True)
        if len(acks) < k:
            return -1
        return min(self.durable, acks[k - 1])

    # --- waiting sends ------------------------------------------------------------------------

    def wait(self, end: int, now_ms: int, token) -> bool:
        """Hold a send whose entries end at `end`; False if it is satisfied already."""
        self.now_ms = max(self.now_ms, now_ms)
        if self.replicated() >= end:
            return False
        self.waiting.append((end, now_ms + self.cfg.ack_timeout_ms, token))
        return True

    def _release(self) -> list:
        rep = self.replicated()
        if self.cfg.sync:
            if rep > self.confirm:
                self.confirm = rep
        else:
            self.confirm = self.durable
        out = []
        w = self.waiting
        while w and w[0][0] <= rep:
            out.append(w.popleft()[2])
        return out

    def tick(self, now_ms: int) -> tuple[list, list[str]]:
        """([(token, code, reason)] of sends that timed out, [slaves gone silent])."""
        self.now_ms = max(self.now_ms, now_ms)
        expired = []
        w = self.waiting
        while w and w[0][1] <= now_ms:
            end, _, token = w.popleft()
            if self.durable < end <= self._slaves_hold():
                expired.append((token, Code.FLUSH_DISK_TIMEOUT, "replicated to the slaves, but "
                                "not fsynced on the master within slave_ack_timeout_ms"))
            else:
                expired.append((token, Code.FLUSH_SLAVE_TIMEOUT, "stored on the master; "
                                f"{self.required() - 1} slave(s) did not acknowledge it within "
                                f"slave_ack_timeout_ms={self.cfg.ack_timeout_ms}"))
        silent = [s.node for s in self.slaves.values()
                  if now_ms - s.last_report_ms > self.cfg.housekeeping_ms]
        return expired, silent

    def _slaves_hold(self) -> int:
        k = self.required() - 1
        acks = sorted((s.ack for s in self.slaves.values()), reverse=True)
        return acks[k - 1] if 0 < k <= len(acks) else (self.written if k <= 0 else -1)

    def fail_all(self) -> list:
        """Tokens of every waiting send (the node stops being master)."""
        out = [t for _, _, t in self.waiting]
        self.waiting.clear()
        return out

    # --- status --------------------------------------------------------------------------------

    def status(self, now_ms: int) -> dict:
        self.now_ms = max(self.now_ms, now_ms)
        return {
            "master_max_offset": self.written,
            "durable_offset": self.durable,
            "confirm_offset": self.confirm,
            "slave_count": len(self.slaves),
            "in_sync_count": self.in_sync_count(),
            "required_replicas": self.required(),
            "waiting_sends": len(self.waiting),
            "self_fenced": self.self_fenced(),
            "slaves": {s.node: {
                "address": s.address,
                "ack_offset": s.ack,
                "lag_bytes": self.written - s.ack if s.ack >= 0 else None,
                "transfer_rate_bytes_per_s": round(s.rate(now_ms)),
                "in_sync": self.in_sync(s),
                "connected_for_ms": now_ms - s.connected_ms,
                "last_report_ms_ago": now_ms - s.last_report_ms,
            } for s in self.slaves.values()},
        }
