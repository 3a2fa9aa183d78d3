"""The staging hashes, byte-exact with NeMo Gym 0.7.0 (docs/staging.md#digests).

Four SHA-256 digests (lowercase hex) bind a staged call:

- ``hash_tokens``: one exact token sequence (a call's ``cumulative_hash`` is
  the hash of its whole generation-time sequence, prompt and generation);
- ``hash_chain``: a delta chained onto its parent's chain hash, so parent and
  child continuity is provable without the cumulative tokens;
- ``hash_extras``: the opaque extras envelope, by a typed binary encoding;
- ``hash_staged_call``: the call's metadata and token columns, including the
  three hashes above.

Every field is length-delimited: a ``u64`` is 8 bytes big-endian, a text is its
UTF-8 length as ``u64`` then the bytes, an id list is its count then one
``u64`` per id, a float list its count then one big-endian binary32 per value.
Token columns are hashed straight from their ``>u8`` buffers
(``_arrays.token_view``); floats are narrowed to float32 once per column.
"""

from __future__ import annotations

import hashlib
import math
import re
import struct
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from token_finalizer.core.staging._arrays import float32_be, float_view, token_view

__all__ = [
    "EMPTY_EXTRAS_DIGEST",
    "EXTRAS_DIGEST_VERSION",
    "STAGING_DIGEST_VERSION",
    "STAGING_SCHEMA_VERSION",
    "hash_chain",
    "hash_extras",
    "hash_staged_call",
    "hash_token_parts",
    "hash_tokens",
    "is_hex_digest",
    "staging_key",
]

STAGING_SCHEMA_VERSION = 2
STAGING_DIGEST_VERSION = 2
EXTRAS_DIGEST_VERSION = 1

_TOKENS_DOMAIN = b"nemo-gym-staging-prefix-v2"
_CHAIN_DOMAIN = b"nemo-gym-staging-chain-v1"
_EXTRAS_DOMAIN = b"nemo-gym-staging-extras-v1"
_CALL_DOMAIN = b"nemo-gym-staging-call-v2"

_U64 = struct.Struct(">Q")
_TWO_U64 = struct.Struct(">QQ")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")
_U64_MAX = 2**64 - 1
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
# A chain or cumulative hash is always present in a staged call; the byte
# before it is a presence marker kept by the v2 layout.
_PRESENT = b"\x01"


def is_hex_digest(value: object) -> bool:
    """Whether ``value`` is a lowercase hex SHA-256 digest (64 characters)."""
    return isinstance(value, str) and _HEX_DIGEST.fullmatch(value) is not None


def staging_key(rollout_id: str, model_call_id: str) -> str:
    """The default staging key of a call: ``rollout_id/model_call_id``."""
    if not rollout_id or not model_call_id:
        raise ValueError("rollout_id and model_call_id must be non-empty")
    return f"{rollout_id}/{model_call_id}"


def hash_tokens(ids: object) -> str:
    """Token hash of one sequence: a list of ints or an integer array."""
    return hash_token_parts((ids,))


def hash_token_parts(parts: Iterable[object]) -> str:
    """Token hash of the concatenation of ``parts``, without building the concatenation."""
    arrays = [token_view(part) for part in parts]
    hasher = hashlib.sha256(_TOKENS_DOMAIN)
    hasher.update(_U64.pack(sum(len(array) for array in arrays)))
    for array in arrays:
        hasher.update(array.data)
    return hasher.hexdigest()


def hash_chain(parent_chain_hash: str | None, token_ids_delta: object) -> str:
    """Chain hash of a delta on top of its parent's chain hash (``None`` for a root)."""
    hasher = hashlib.sha256(_CHAIN_DOMAIN)
    if parent_chain_hash is None:
        hasher.update(b"\x00")
    else:
        _check_digest(parent_chain_hash, "parent_chain_hash")
        hasher.update(_PRESENT + bytes.fromhex(parent_chain_hash))
    ids = token_view(token_ids_delta)
    hasher.update(_U64.pack(len(ids)))
    hasher.update(ids.data)
    return hasher.hexdigest()


def hash_extras(extras: Mapping[str, Any] | None) -> str:
    """Extras digest of a JSON-like mapping, or of ``None`` (``EMPTY_EXTRAS_DIGEST``).

    Only exact ``None``/``bool``/``int``/``float``/``str``/``list``/``dict``
    values with string keys are encoded; anything else (tuples, bytes, numpy
    scalars) raises ``TypeError`` so two runtimes can never pick different
    encodings for one value. Integers must fit int64 and floats be finite
    (``ValueError``). ``{}`` and ``None`` hash differently.
    """
    if extras is None:
        normalized: dict[str, Any] | None = None
    elif isinstance(extras, Mapping):
        normalized = dict(extras)
    else:
        raise TypeError(f"extras must be a mapping or None, got {type(extras).__name__}")
    out = bytearray(bytes((EXTRAS_DIGEST_VERSION,)))
    _encode_extra(normalized, out)
    return hashlib.sha256(_EXTRAS_DOMAIN + out).hexdigest()


def _encode_extra(value: Any, out: bytearray) -> None:
    kind = type(value)
    if value is None:
        out += b"N"
    elif kind is bool:
        out += b"B\x01" if value else b"B\x00"
    elif kind is int:
        if not _I64_MIN <= value <= _I64_MAX:
            raise ValueError(f"extras integer is outside signed 64-bit range: {value}")
        out += b"I" + _I64.pack(value)
    elif kind is float:
        if not math.isfinite(value):
            raise ValueError(f"extras floats must be finite, got {value!r}")
        out += b"F" + _F64.pack(value)
    elif kind is str:
        out += b"S" + _text(value)
    elif kind is list:
        out += b"L" + _U64.pack(len(value))
        if len(value) >= _INT_RUN_MIN and set(map(type, value)) == {int}:
            _encode_int_run(value, out)
        else:
            for item in value:
                _encode_extra(item, out)
    elif kind is dict:
        if any(type(key) is not str for key in value):
            raise TypeError("extras mappings must have string keys")
        out += b"D" + _U64.pack(len(value))
        for key in sorted(value, key=lambda key: key.encode("utf-8")):
            out += _text(key)
            _encode_extra(value[key], out)
    else:
        raise TypeError(f"extras contain unsupported value type {kind.__name__}")


# Lists of at least this many ints (routed-expert rows) are encoded by numpy
# in one pass instead of one struct call per element.
_INT_RUN_MIN = 16
_TAGGED_I64 = np.dtype([("tag", "S1"), ("value", ">i8")])


def _encode_int_run(values: list[int], out: bytearray) -> None:
    try:
        numbers = np.asarray(values, dtype=np.int64)
    except OverflowError:
        for item in values:
            _encode_extra(item, out)  # names the first value outside int64
        return
    tagged = np.empty(len(values), dtype=_TAGGED_I64)
    tagged["tag"] = b"I"
    tagged["value"] = numbers
    out += tagged.tobytes()


EMPTY_EXTRAS_DIGEST = hash_extras(None)


def _check_versions(schema_version: int, digest_version: int, extras_digest_version: int) -> None:
    _check_version(schema_version, STAGING_SCHEMA_VERSION, "staging schema")
    _check_version(digest_version, STAGING_DIGEST_VERSION, "staging digest")
    _check_version(extras_digest_version, EXTRAS_DIGEST_VERSION, "extras digest")


def _check_identity(
    rollout_id: str,
    model_call_id: str,
    parent_call_id: str | None,
    mode: str,
    prev_len: int,
    delta_len: int,
) -> None:
    """The call's ids, mode and lengths, in the reference's order; ValueError on the first break."""
    if not rollout_id or not model_call_id:
        raise ValueError("rollout_id and model_call_id must be non-empty")
    if parent_call_id == "":
        raise ValueError("parent_call_id must be non-empty when present")
    if mode not in ("text", "token_in"):
        raise ValueError(f"unsupported capture mode {mode!r}")
    if parent_call_id is None and (prev_len != 0 or mode != "text"):
        raise ValueError("a parentless call must be a text-mode root with prev_len == 0")
    if parent_call_id is not None and (prev_len == 0 or mode != "token_in"):
        raise ValueError("a child call must use token_in mode with prev_len > 0")
    if delta_len == 0:
        raise ValueError("a staged call delta must contain at least one token")


def _checked_columns(
    delta_len: int, token_ids: object, token_mask: object, log_probs_column: object
) -> tuple[Any, Any, Any]:
    """The three delta columns as arrays, checked against each other and `delta_len`."""
    ids = _column(token_view, token_ids, "token_ids_delta")
    mask = _column(_strict_floats, token_mask, "token_mask_delta")
    log_probs = _column(_strict_floats, log_probs_column, "generation_log_probs_delta")
    if delta_len != len(ids):
        raise ValueError(f"delta_len {delta_len} does not match {len(ids)} token IDs")
    if not len(ids) == len(mask) == len(log_probs):
        raise ValueError("token IDs, masks, and log probabilities must have equal lengths")
    carry = mask == 0.0
    if not (carry | (mask == 1.0)).all():
        raise ValueError("token_mask_delta must contain only 0.0 or 1.0")
    if (log_probs[carry] != 0.0).any():
        raise ValueError("prompt-carry log probabilities must be 0.0")
    return ids, mask, log_probs


def hash_staged_call(
    *,
    schema_version: int,
    digest_version: int,
    extras_digest_version: int,
    rollout_id: str,
    model_call_id: str,
    parent_call_id: str | None,
    mode: str,
    prev_len: int,
    delta_len: int,
    cum_len: int,
    weight_version: int,
    token_ids_delta: object,
    token_mask_delta: object,
    generation_log_probs_delta: object,
    extras_digest: str,
    chain_hash: str,
    cumulative_hash: str,
) -> str:
    """Staging digest (v2) of one staged call; broken preconditions raise ``ValueError``.

    Columns may be lists (masks and log probabilities must then be Python
    floats, as the reference requires) or the arrays the typed records hold.
    """
    _check_versions(schema_version, digest_version, extras_digest_version)
    _check_identity(rollout_id, model_call_id, parent_call_id, mode, prev_len, delta_len)
    ids, mask, log_probs = _checked_columns(
        delta_len, token_ids_delta, token_mask_delta, generation_log_probs_delta
    )
    if cum_len != prev_len + delta_len:
        raise ValueError(
            f"cum_len {cum_len} does not equal prev_len + delta_len ({prev_len + delta_len})"
        )
    _check_digest(extras_digest, "extras_digest")

    hasher = hashlib.sha256(_CALL_DOMAIN)
    hasher.update(bytes((schema_version, digest_version, extras_digest_version)))
    hasher.update(_text(rollout_id))
    hasher.update(_text(model_call_id))
    hasher.update(b"\x00" if parent_call_id is None else b"\x01" + _text(parent_call_id))
    hasher.update(_text(mode))
    for name, number in (
        ("prev_len", prev_len),
        ("delta_len", delta_len),
        ("cum_len", cum_len),
        ("weight_version", weight_version),
    ):
        hasher.update(_u64(number, name))
    # Each column is a length-delimited block holding a counted list.
    hasher.update(_TWO_U64.pack(8 + 8 * len(ids), len(ids)))
    hasher.update(ids.data)
    for name, column in (
        ("token_mask_delta", mask),
        ("generation_log_probs_delta", log_probs),
    ):
        hasher.update(_TWO_U64.pack(8 + 4 * len(column), len(column)))
        hasher.update(float32_be(column, field=name).data)
    hasher.update(bytes.fromhex(extras_digest))
    hasher.update(_present_digest(chain_hash, "chain_hash"))
    hasher.update(_present_digest(cumulative_hash, "cumulative_hash"))
    return hasher.hexdigest()


def _strict_floats(values: object) -> Any:
    return float_view(values, ints_allowed=False)


def _column(convert: Any, values: object, name: str) -> Any:
    try:
        return convert(values)
    except ValueError as error:
        raise ValueError(f"{name} {error}") from None


def _check_version(value: object, expected: int, what: str) -> None:
    if type(value) is not int or value != expected:
        raise ValueError(f"unsupported {what} version {value}")


def _check_digest(value: object, field: str) -> None:
    if not is_hex_digest(value):
        raise ValueError(f"{field} must be a lowercase SHA-256 hex digest")


def _present_digest(value: object, field: str) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f"{field} must be a digest string")
    _check_digest(value, field)
    return _PRESENT + bytes.fromhex(value)


def _u64(value: object, field: str) -> bytes:
    if type(value) is not int or not 0 <= value <= _U64_MAX:
        raise ValueError(f"{field} must be an unsigned 64-bit integer, got {value!r}")
    return _U64.pack(value)


def _text(value: object) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f"expected text, got {type(value).__name__}")
    encoded = value.encode("utf-8")
    return _U64.pack(len(encoded)) + encoded
