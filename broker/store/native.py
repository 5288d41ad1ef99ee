"""The optional C fast paths (broker/store/_zonewalk.c), loaded in one place.

Every caller has the pure-Python code as the rule and the fallback; the C module is used when
it was built (setuptools compiles it at install where a C compiler is present).
`TIDELOG_NO_C_EXT=1` in the environment makes every caller take the Python path although the
module is built: `make test` runs the store and raft tests once more that way, so the fallback
a host without a compiler runs is tested, not only assumed.
"""

from __future__ import annotations

import os

NO_C_ENV = "TIDELOG_NO_C_EXT"


def zonewalk():
    """The C module, or None (not built here, or turned off by TIDELOG_NO_C_EXT)."""
    if os.environ.get(NO_C_ENV, "") not in ("", "0"):
        return None
    try:
        from broker.store import _zonewalk
    except ImportError:
        return None
    return _zonewalk
