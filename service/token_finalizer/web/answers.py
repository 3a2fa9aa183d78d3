"""JSON answers shared by the finalizer API and the capture-store server.

Large answers are mostly token ids: they are encoded once with orjson (numpy
arrays included, no conversion to Python ints) and zstd-compressed when the
client asks for it, since a snapshot repeats every prompt prefix.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from starlette.responses import Response, StreamingResponse

from token_finalizer._constants import STREAM_CHUNK_BYTES, STREAM_MIN_BYTES, ZSTD_MIN_BYTES
from token_finalizer.core.codec import Piece, encode_json, with_encodable_text, zstd_compress

__all__ = [
    "accepts_zstd",
    "encoded_response",
    "error_response",
    "json_response",
]

_JSON = "application/json"


def accepts_zstd(accept_encoding: str | None) -> bool:
    """Whether an Accept-Encoding header admits zstd (a q=0 entry refuses it)."""
    for part in (accept_encoding or "").split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip().lower() != "zstd":
            continue
        quality = params.strip().removeprefix("q=").strip() if params else "1"
        try:
            return float(quality) > 0
        except ValueError:
            return True
    return False


def json_response(
    payload: Any,
    *,
    status_code: int = 200,
    accept_encoding: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """A JSON answer, zstd-compressed when the client accepts it and it is worth it.

    A lone surrogate in a string read from a store (written before such strings were
    refused) is spelled `\\ud800` in the answer, so a route answers it instead of a 500 on
    every retry (docs/staging.md; what is stored is never changed).
    """
    try:
        body = encode_json(payload)
    except TypeError:  # orjson refuses a lone surrogate; anything else fails again below
        body = encode_json(with_encodable_text(payload))
    return encoded_response(
        body,
        status_code=status_code,
        accept_encoding=accept_encoding,
        headers=headers,
    )


def encoded_response(
    body: bytes | Sequence[Piece],
    *,
    status_code: int = 200,
    accept_encoding: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """An already-encoded JSON body, or its pieces in order, compressed when accepted.

    Pieces are compressed as one stream and never joined uncompressed: a large
    answer spliced from shared parts does not pay for a 64 MB copy. A large
    uncompressed answer is streamed piece by piece in bounded chunks, so the
    event loop never copies hundreds of MB into a socket buffer in one go and
    the server writes only as fast as the client reads.
    """
    pieces: list[Piece] = [body] if isinstance(body, bytes) else list(body)
    size = sum(len(piece) for piece in pieces)
    extra = dict(headers or {})
    if size >= ZSTD_MIN_BYTES and accepts_zstd(accept_encoding):
        extra["Content-Encoding"] = "zstd"
        extra["Vary"] = "Accept-Encoding"
        return Response(
            zstd_compress(pieces), status_code=status_code, media_type=_JSON, headers=extra
        )
    if size >= STREAM_MIN_BYTES:
        extra["Content-Length"] = str(size)
        return StreamingResponse(
            _chunks(pieces), status_code=status_code, media_type=_JSON, headers=extra
        )
    content = pieces[0] if len(pieces) == 1 else b"".join(pieces)
    return Response(content, status_code=status_code, media_type=_JSON, headers=extra)


async def _chunks(pieces: list[Piece]) -> AsyncIterator[Piece]:
    for piece in pieces:
        view = memoryview(piece)
        for start in range(0, len(view), STREAM_CHUNK_BYTES):
            yield view[start : start + STREAM_CHUNK_BYTES]


def error_response(status_code: int, message: str, **details: Any) -> Response:
    """The one error shape of every endpoint: `{"error": "<message>", ...details}`."""
    return Response(
        encode_json({"error": message, **details}), status_code=status_code, media_type=_JSON
    )
