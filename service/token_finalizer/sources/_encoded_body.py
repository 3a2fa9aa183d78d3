"""A capture store's answer body as it came off the wire, decoded later under a size limit.

The `http` source keeps every compressed body compressed while it reads it
(bounding the bytes on the wire), then decodes it in one pass that stops as
soon as the output passes the limit. A small bomb, zstd or gzip alike, is
therefore refused the same way and fast, as the store's fault (a masked
record), instead of expanding while it is read until a deadline cuts the
freeze (docs/store-protocol.md#the-http-source-finalizer-side).
"""

from __future__ import annotations

import zlib

from token_finalizer._constants import INFLATE_STEP_BYTES
from token_finalizer.core.codec import CodecError, zstd_decompress

__all__ = ["IDENTITY", "decode_body", "encoding_of"]

IDENTITY = "identity"
# Content codings this source decodes itself; anything else is refused when read.
_GZIP = frozenset({"gzip", "x-gzip"})
_DEFLATE = "deflate"
# zlib window bits: gzip framing only; zlib or gzip framing, told apart by the header.
_GZIP_WBITS = 16 + zlib.MAX_WBITS
_AUTO_WBITS = 32 + zlib.MAX_WBITS


def encoding_of(content_encoding: str | None) -> str:
    """The one content coding an answer names, lower-cased (`identity` when none)."""
    value = (content_encoding or "").strip().lower()
    return value or IDENTITY


def _inflate(raw: bytes, *, wbits: int, limit: int, name: str) -> bytes:
    """Decode gzip or zlib data (members one after another), stopping past `limit` bytes."""
    parts: list[bytes] = []
    total = 0
    rest = raw
    try:
        while rest:  # one member per pass
            stream = zlib.decompressobj(wbits)
            pending = rest
            while not stream.eof:
                # Bounded output per step: a few input bytes may stand for megabytes.
                part = stream.decompress(pending, INFLATE_STEP_BYTES)
                pending = stream.unconsumed_tail
                if not part and not pending:
                    raise CodecError(f"the {name} body is truncated")
                total += len(part)
                if total > limit:
                    raise CodecError(f"the {name} body decodes to more than {limit} bytes")
                parts.append(part)
            rest = stream.unused_data
    except zlib.error as exc:
        raise CodecError(f"the {name} body does not decode: {exc}") from None
    return b"".join(parts)


def decode_body(raw: bytes, encoding: str, *, limit: int) -> bytes:
    """`raw` decoded from `encoding`, at most `limit` bytes; CodecError otherwise."""
    if encoding == IDENTITY:
        return raw
    if encoding == "zstd":
        return zstd_decompress(raw, limit=limit)
    if encoding in _GZIP:
        return _inflate(raw, wbits=_GZIP_WBITS, limit=limit, name="gzip")
    if encoding == _DEFLATE:
        return _inflate(raw, wbits=_AUTO_WBITS, limit=limit, name="deflate")
    raise CodecError(f"the body is encoded as {encoding!r}, which was not asked for")
