"""The one JSON and zstd codec of the server side.

Captures and answers are mostly token ids. Parsed the ordinary way, a long
rollout's JSON becomes millions of Python ints that are copied into numpy
arrays afterwards, which costs more than everything else a read does. So the
token arrays are cut out of the text, parsed by numpy, and put back after the
(now small) JSON parse; anything unexpected falls back to the ordinary parse,
so the result never depends on the shortcut. Encoding goes through orjson
with numpy arrays serialized in place. See docs/architecture.md#codec.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson
import zstandard

from token_finalizer._constants import ZSTD_LEVEL, ZSTD_WINDOW_LOG

__all__ = [
    "CodecError",
    "Piece",
    "dumps_entry_line",
    "encode_json",
    "ids_from_text",
    "loads_json",
    "loads_strict_json",
    "loads_with_token_arrays",
    "zstd_compress",
    "zstd_decompress",
]

# One piece of an encoded body: bytes, or a view into a larger encoding that
# is spliced into the body without being copied out first.
Piece = bytes | memoryview

_INT32_MAX = int(np.iinfo(np.int32).max)
_EMPTY_IDS = np.empty(0, dtype=np.int32)
_ID_BYTES = b"0123456789,"
_LIFTED_KEYS = (b'"prompt_token_ids":[', b'"generation_token_ids":[')
_LIFTED_NAMES = frozenset({"prompt_token_ids", "generation_token_ids"})
# A string no real token field holds; the index after it says which array it stands for.
_PLACEHOLDER = "\u0000lifted:"


class CodecError(ValueError):
    """A body that cannot be decoded (bad zstd, over the size limit)."""


def loads_json(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON with orjson, falling back to the stdlib for NaN/Infinity.

    Capture lines written by Python's json module may carry `-Infinity` log
    probabilities, which orjson rejects.
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if "recursion" in str(exc):
            raise ValueError(f"JSON nested too deeply: {exc}") from None
        if isinstance(data, memoryview):
            data = data.tobytes()
        try:
            return json.loads(data)
        except RecursionError:
            raise ValueError("JSON nested too deeply") from None


def loads_strict_json(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse standard JSON only (no NaN/Infinity); ValueError naming the problem."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ValueError(str(exc)) from None


def encode_json(payload: Any) -> bytes:
    """Compact JSON with numpy arrays serialized in place (no Python int lists)."""
    return orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)


def dumps_entry_line(data: Mapping[str, Any]) -> bytes:
    """Compact, sorted-key JSON of one entry (no newline), as the file store writes it.

    Non-finite log probabilities go through the stdlib, which writes
    `-Infinity`; orjson would silently turn them into null.
    """
    log_probs = data.get("generation_log_probs")
    if isinstance(log_probs, list) and not all(map(math.isfinite, log_probs)):
        return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return orjson.dumps(data, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)


def ids_from_text(segment: bytes) -> np.ndarray | None:
    """Parse `1,2,3` straight into int32 without Python ints; None when unsure."""
    if not segment:
        return _EMPTY_IDS
    if segment.translate(None, _ID_BYTES):  # signs, dots, spaces...: leave it to the slow path
        return None
    try:
        ids = np.fromstring(segment, dtype=np.int64, sep=",")
    except ValueError:
        return None
    if len(ids) != segment.count(b",") + 1 or int(ids.max()) > _INT32_MAX:
        return None  # an empty element or an overflowing id: let the slow path report it
    return ids.astype(np.int32)


def _restore(data: Any, arrays: list[np.ndarray]) -> bool:
    """Put each lifted array back on its placeholder; False when any is not where expected.

    Token arrays are expected on the top-level object (one entry) or on the
    objects of its `entries` list (a snapshot); each placeholder exactly once.
    """
    holders: list[Any] = [data]
    if isinstance(data, dict) and isinstance(data.get("entries"), list):
        holders.extend(data["entries"])
    used = [False] * len(arrays)
    for holder in holders:
        if not isinstance(holder, dict):
            continue
        for name in _LIFTED_NAMES:
            value = holder.get(name)
            if not (isinstance(value, str) and value.startswith(_PLACEHOLDER)):
                continue
            try:
                index = int(value[len(_PLACEHOLDER) :])
            except ValueError:
                return False
            if not 0 <= index < len(arrays) or used[index]:
                return False
            holder[name] = arrays[index]
            used[index] = True
    return all(used)


def loads_with_token_arrays(content: bytes) -> Any:
    """`loads_json` of an entry or a snapshot, its token id arrays parsed by numpy."""
    pieces: list[bytes] = []
    arrays: list[np.ndarray] = []
    cursor = 0
    next_at = {key: content.find(key) for key in _LIFTED_KEYS}
    while True:
        found = [(at, key) for key, at in next_at.items() if at >= 0]
        if not found:
            break
        start, key = min(found)
        begin = start + len(key)
        end = content.find(b"]", begin)
        ids = ids_from_text(content[begin:end]) if end >= 0 else None
        if ids is None:  # not a plain list of ids: the ordinary parse handles it
            next_at[key] = content.find(key, begin)
            continue
        pieces += (content[cursor : begin - 1], orjson.dumps(f"{_PLACEHOLDER}{len(arrays)}"))
        arrays.append(ids)
        cursor = end + 1
        next_at = {
            k: at if at < 0 or at >= cursor else content.find(k, cursor)
            for k, at in next_at.items()
        }
    if not arrays:
        return loads_json(content)
    pieces.append(content[cursor:])
    data = loads_json(b"".join(pieces))
    return data if _restore(data, arrays) else loads_json(content)


def zstd_compress(pieces: Sequence[Piece]) -> bytes:
    """One zstd frame of the pieces in order, recording its content size.

    The size in the header lets one-shot decoders allocate once; a fresh
    compressor per call, since compressors are not thread-safe.
    """
    size = sum(len(piece) for piece in pieces)
    params = zstandard.ZstdCompressionParameters.from_level(
        ZSTD_LEVEL, window_log=ZSTD_WINDOW_LOG, source_size=size
    )
    stream = zstandard.ZstdCompressor(compression_params=params).compressobj(size=size)
    return b"".join([*(stream.compress(piece) for piece in pieces), stream.flush()])


def zstd_decompress(raw: bytes, *, limit: int) -> bytes:
    """Decode a zstd body of at most `limit` bytes once decoded; CodecError otherwise.

    One-shot decompression into a buffer of the size the frame announces is
    several times faster than a streaming decoder; several frames, or a frame
    without its size, take the streaming path.
    """
    decompressor = zstandard.ZstdDecompressor()
    try:
        size = zstandard.frame_content_size(raw)
        if size > limit:
            raise CodecError(f"the zstd body announces {size} bytes, over the {limit} limit")
        if size >= 0:
            try:
                return decompressor.decompress(raw, allow_extra_data=False)
            except zstandard.ZstdError:
                pass  # more than one frame
        parts: list[bytes] = []
        total, rest = 0, raw
        while rest:
            stream = decompressor.decompressobj()
            part = stream.decompress(rest)
            total += len(part)
            if total > limit:
                raise CodecError(f"the zstd body decodes to more than {limit} bytes")
            if not stream.eof:
                raise CodecError("the zstd body is truncated")
            parts.append(part)
            rest = stream.unused_data
        return b"".join(parts)
    except zstandard.ZstdError as exc:
        raise CodecError(f"the zstd body does not decode: {exc}") from None
