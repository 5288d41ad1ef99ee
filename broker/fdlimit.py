"""The process's file-descriptor limit. (Skeleton: issue 14, filled in by the fd work.)"""

from __future__ import annotations


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; (soft, hard) after."""
    import resource

    return resource.getrlimit(resource.RLIMIT_NOFILE)
