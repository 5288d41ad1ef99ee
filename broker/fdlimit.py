"""The process's file-descriptor limit (issue 14).

A broker holds a descriptor per connection, per CommitLog segment and index file, and up to
`consume_queue_open_files_max` for ConsumeQueues; distributions start processes with a soft
limit of 1,024 while the hard limit is far higher. The soft limit is raised to the hard one,
capped: a hard limit of "unlimited" (or 2^30) would only make select()-style loops and
per-fd tables in libraries huge, and a million descriptors are far beyond what the bounds
(connections, open ConsumeQueue files) let a broker use.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger(__name__)

NOFILE_CAP = 1 << 20  # Linux's default fs.nr_open: setrlimit refuses more anyway


def raise_nofile_limit(cap: int = NOFILE_CAP) -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (at most `cap`); (soft, hard) after.
    A refusal (e.g. a container that forbids it) keeps the old limit and is logged."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = cap if hard == resource.RLIM_INFINITY else min(hard, cap)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return soft, hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError) as e:
        log.warning("cannot raise the file descriptor limit from %d to %d: %s", soft, want, e)
    return resource.getrlimit(resource.RLIMIT_NOFILE)
