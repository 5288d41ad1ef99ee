"""Stopping asyncio tasks for certain, on Python 3.11.

`asyncio.wait_for` on 3.11 swallows a cancel that lands just as what it waits for completes:
it returns that result, or raises that error, instead of CancelledError (CPython gh-86296; 3.12
rewrote wait_for on asyncio.timeout). A retry loop that catches the error goes on, and the
`await task` that was to stop it waits forever. It froze a master-slave failover (a slave's
link to its dead master outlived the stop a promotion asked for, tests/unit/test_task_stops.py).
So the code waits with `async with asyncio.timeout(...)`, which runs in the caller's own task
and lets a cancel through, never with wait_for; and a stop cancels until the task has ended.
"""

from __future__ import annotations

import asyncio

RECANCEL_S = 0.05


async def cancel_and_wait(*tasks: asyncio.Future | None) -> None:
    """Cancel `tasks` (None skipped) and return once every one has ended, cancelling again
    any that swallowed the cancel (the next one lands at another await: a retry loop's sleep).
    Their results and errors are dropped."""
    given = [t for t in tasks if t is not None]
    pending = set(given)
    while pending:
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
    await asyncio.gather(*given, return_exceptions=True)
