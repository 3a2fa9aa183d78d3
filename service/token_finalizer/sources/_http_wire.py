"""Reading a protocol v1 freeze answer fast: zstd in one shot, token ids straight into numpy.

The 5M-token snapshot is 32 MB of JSON, nearly all of it token ids. Parsed the
ordinary way it becomes millions of Python ints that are only copied into
arrays afterwards, which costs more than everything else the http source
does; so every token array is cut out of the text, parsed by numpy, and put
back after the (now small) JSON parse. Anything unexpected falls back to the
ordinary parse, so the result never depends on the shortcut.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import zstandard

from token_finalizer.records import ids_from_text, loads_json

__all__ = ["AnswerError", "loads_snapshot", "unzstd"]

_LIFTED_KEYS = (b'"prompt_token_ids":[', b'"generation_token_ids":[')
_LIFTED_NAMES = frozenset({"prompt_token_ids", "generation_token_ids"})
# Unlikely in real data; _restore_lifted checks placement and order regardless.
_PLACEHOLDER = "\u0000lifted:"


class AnswerError(ValueError):
    """An answer body that cannot be decoded."""


def unzstd(raw: bytes, *, limit: int) -> bytes:
    """Decode a zstd body of at most `limit` bytes once decoded.

    One-shot decompression into a buffer of the size the frame announces is
    several times faster than the streaming decoder httpx uses; several
    frames, or a frame without its size, take the streaming path.
    """
    decompressor = zstandard.ZstdDecompressor()
    try:
        size = zstandard.frame_content_size(raw)
        if size > limit:
            raise AnswerError(f"the zstd body announces {size} bytes, over the {limit} limit")
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
                raise AnswerError(f"the zstd body decodes to more than {limit} bytes")
            if not stream.eof:
                raise AnswerError("the zstd body is truncated")
            parts.append(part)
            rest = stream.unused_data
        return b"".join(parts)
    except zstandard.ZstdError as exc:
        raise AnswerError(f"the zstd body does not decode: {exc}") from None


def _restore_lifted(data: Any, arrays: list[np.ndarray]) -> bool:
    """Put each lifted array back where its placeholder landed; False if any did not fit.

    Placeholders must sit on entry-level token keys, in document order, each
    exactly once: anything else means a key was found somewhere unexpected.
    """
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return False
    used = 0
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        found = [
            (name, value)
            for name, value in entry.items()
            if name in _LIFTED_NAMES and isinstance(value, str) and value.startswith(_PLACEHOLDER)
        ]
        for name, value in found:
            if used >= len(arrays) or value != f"{_PLACEHOLDER}{used}\u0000":
                return False
            entry[name] = arrays[used]
            used += 1
    return used == len(arrays)


def loads_snapshot(content: bytes) -> Any:
    """`loads_json` of a freeze answer, its token id arrays parsed by numpy from the text."""
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
        placeholder = orjson.dumps(f"{_PLACEHOLDER}{len(arrays)}\u0000")
        pieces += (content[cursor : begin - 1], placeholder)
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
    return data if _restore_lifted(data, arrays) else loads_json(content)
