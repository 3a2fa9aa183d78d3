"""The token digest of an id sequence, as the store computes it (no numpy needed).

sha256 of the domain `nemo-gym-tokens`, then (for a non-empty sequence) the version
byte and the length as big-endian u64, then every id as big-endian u64
(docs/store-protocol.md#lineage-resolve).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

__all__ = ["token_digest"]

_DOMAIN = b"nemo-gym-tokens"
_VERSION = 1


def token_digest(ids: Sequence[int]) -> str:
    """Lowercase hex digest of one token sequence (ids in [0, 2**64))."""
    hasher = hashlib.sha256(_DOMAIN)
    if ids:
        hasher.update(struct.pack(">BQ", _VERSION, len(ids)))
        hasher.update(struct.pack(f">{len(ids)}Q", *ids))
    return hasher.hexdigest()
