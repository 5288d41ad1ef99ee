"""JSON bodies for the low-rate message families (topics, offsets, queries, admin).

A body is one UTF-8 JSON object whose fields are the dataclass's fields. Decoding validates
types with pydantic, so a bad request is answered with BAD_REQUEST naming the field.
"""

from __future__ import annotations

import dataclasses
import json
from functools import lru_cache

from pydantic import TypeAdapter, ValidationError

from broker.protocol.codes import BadRequest


def encode(msg) -> bytes:
    """A dataclass (or a plain dict, for free-form answers such as reports) as a body."""
    body = msg if isinstance(msg, dict) else dataclasses.asdict(msg)
    return json.dumps(body, separators=(",", ":")).encode()


@lru_cache(maxsize=None)
def _adapter(cls) -> TypeAdapter:
    return TypeAdapter(cls)


def decode(cls, body: bytes):
    try:
        return _adapter(cls).validate_json(bytes(body) or b"{}")
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "body"
        raise BadRequest(f"{cls.__name__}: {where}: {first['msg']}") from None
