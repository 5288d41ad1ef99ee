"""Looking messages up by key or by message id.

QUERY_BY_KEY  QueryByKey (JSON)  -> entries (store/codec.py), newest window first, or
                                    QUERY_NOT_FOUND
QUERY_BY_ID   QueryById (JSON)   -> one entry, or QUERY_NOT_FOUND
Times are store timestamps in ms; the defaults search everything.
"""

from __future__ import annotations

from dataclasses import dataclass

TIME_MAX_MS = 2**62


@dataclass(frozen=True)
class QueryByKey:
    topic: str
    key: str
    begin_ms: int = 0
    end_ms: int = TIME_MAX_MS
    max_results: int = 32


@dataclass(frozen=True)
class QueryById:
    msg_id: str  # 32 hex characters
    begin_ms: int = 0
    end_ms: int = TIME_MAX_MS
