"""Token digest, version 1: the hash that names an exact token sequence.

Lineage records carry the digest of each call's cumulative sequence, and the
builder checks a claimed parent by hashing a prefix of the child's prompt, so
the encoding must match NeMo Gym's byte for byte:

    sha256(b"nemo-gym-tokens" + pack(">BQ", 1, n) + n unsigned 64-bit big-endian ids)

and, for n == 0, sha256(b"nemo-gym-tokens") with no header at all.

Arrays are converted to big-endian u64 in one numpy cast and fed to hashlib
straight from their buffer; only inputs numpy cannot hold as a machine integer
array (Python ints beyond int64 mixed with negatives, floats in a list) take a
slower exact path, which exists to report the offending id instead of
overflowing.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

__all__ = [
    "EMPTY_TOKEN_DIGEST",
    "TOKEN_DIGEST_VERSION",
    "InvalidTokenIds",
    "TokenIds",
    "token_digest",
    "token_digest_of_parts",
]

TOKEN_DIGEST_VERSION = 1

TokenIds: TypeAlias = npt.NDArray[np.integer[Any]] | Sequence[int]

_DOMAIN = b"nemo-gym-tokens"
_ID_LIMIT = 2**64
_NO_BYTES = np.empty(0, dtype=">u8")

EMPTY_TOKEN_DIGEST = hashlib.sha256(_DOMAIN).hexdigest()


class InvalidTokenIds(ValueError):
    """Token ids the digest cannot encode (negative, 2**64 or more, not one-dimensional).

    A ValueError, as NeMo Gym raises; its own class lets a build name the
    mask reason (`invalid_token_ids`) without reading the message.
    """


def token_digest(ids: TokenIds) -> str:
    """Lowercase hex digest of one token sequence."""
    return token_digest_of_parts(ids)


def token_digest_of_parts(*parts: TokenIds) -> str:
    """Digest of the concatenation of ``parts``, without building the concatenation.

    The header needs the total length, so every part is validated and encoded
    before hashing starts; an out-of-range id therefore fails the whole call,
    naming the first offending id in concatenation order.
    """
    encoded = [_big_endian_u64(part) for part in parts]
    total = sum(len(part) for part in encoded)
    hasher = hashlib.sha256(_DOMAIN)
    if total == 0:
        return hasher.hexdigest()
    hasher.update(struct.pack(">BQ", TOKEN_DIGEST_VERSION, total))
    for part in encoded:
        hasher.update(part.data)
    return hasher.hexdigest()


def _big_endian_u64(ids: TokenIds) -> npt.NDArray[np.uint64]:
    """Validate ``ids`` and return them as a contiguous big-endian u64 array."""
    array = ids if isinstance(ids, np.ndarray) else np.asarray(ids)
    if array.ndim != 1:
        raise InvalidTokenIds(f"token ids must be one-dimensional, got shape {array.shape}")
    if array.size == 0:
        return _NO_BYTES
    kind = array.dtype.kind
    if kind == "i":
        negative = np.flatnonzero(array < 0)
        if negative.size:
            raise InvalidTokenIds(f"token ids must be non-negative, got {int(array[negative[0]])}")
        return np.ascontiguousarray(array.astype(">u8", copy=False))
    if kind == "u":
        return np.ascontiguousarray(array.astype(">u8", copy=False))
    # numpy turns a list mixing negatives with ids above int64 into floats, and
    # ids of 2**64 and more into objects: only exact Python ints can say which.
    if kind == "O" or (kind == "f" and not isinstance(ids, np.ndarray)):
        return _exact_big_endian_u64(array.tolist() if kind == "O" else list(ids))
    raise TypeError(f"token ids must be integers, got dtype {array.dtype}")


def _exact_big_endian_u64(values: list[Any]) -> npt.NDArray[np.uint64]:
    """Slow path for ids numpy cannot hold exactly; checks each value as a Python int."""
    for value in values:
        if not isinstance(value, int | np.integer):
            raise TypeError(f"token ids must be integers, got {type(value).__name__}")
        if value < 0:
            raise InvalidTokenIds(f"token ids must be non-negative, got {int(value)}")
        if value >= _ID_LIMIT:
            raise InvalidTokenIds(f"token ids must be below 2**64, got {int(value)}")
    return np.array(values, dtype=np.uint64).astype(">u8")
