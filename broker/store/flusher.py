"""The CommitLog flusher: group commit for `flush: sync`, a timer for `flush: async`.

It runs in its own thread so that appends continue while an fsync is in progress: every
append that arrives during one fsync is covered by the next, which is what makes a sync
broker fast (RocketMQ's GroupCommitService). `on_flushed(tail, error)` is called from this
thread after each fsync; the server hops back to the event loop from there. After a failed
fsync it reports the error once and flushes no more: `flushed` cannot advance (see files.py).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from broker.store.commitlog import CommitLog, Tail

log = logging.getLogger(__name__)


class Flusher:
    def __init__(self, commitlog: CommitLog, sync: bool, interval_ms: int,
                 on_flushed: Callable[[Tail, Exception | None], None]):
        self.commitlog = commitlog
        self.sync = sync
        self.interval_s = interval_ms / 1000
        self.on_flushed = on_flushed
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="tidelog-flusher", daemon=True)
        self.rounds = 0
        self.error: Exception | None = None

    def start(self) -> None:
        self._thread.start()

    def request(self) -> None:
        """Ask for a flush of everything appended so far (sync mode calls it per append)."""
        self._wake.set()

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            if self.sync:
                self._wake.wait()
            else:
                self._wake.wait(self.interval_s)
            self._wake.clear()
            stopping = self._stop
            if self.error is None:
                try:
                    before = self.commitlog.flushed.offset
                    tail = self.commitlog.flush()
                    if self.commitlog.fsync_error is not None:  # failed in a cut, say
                        raise self.commitlog.fsync_error
                    if tail.offset != before:
                        self.rounds += 1
                        self.on_flushed(tail, None)
                except OSError as e:
                    self.error = e
                    log.error("fsync of the CommitLog failed: %s; acks that need it will fail", e)
                    self.on_flushed(self.commitlog.flushed, e)
            if stopping:
                return
