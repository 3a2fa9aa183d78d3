"""JSON answers shared by the finalizer API and the capture-store server.

Large answers are mostly token ids: they are encoded once with orjson (numpy
arrays included, no conversion to Python ints) and zstd-compressed when the
client asks for it, since a snapshot repeats every prompt prefix.
"""

from __future__ import annotations

from typing import Any

import orjson
import zstandard
from starlette.responses import Response

from token_finalizer._constants import ZSTD_LEVEL, ZSTD_MIN_BYTES

__all__ = ["accepts_zstd", "encode_json", "error_response", "json_response"]

_JSON = "application/json"


def encode_json(payload: Any) -> bytes:
    """orjson with numpy arrays serialized in place."""
    return orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)


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
    """A JSON answer, zstd-compressed when the client accepts it and it is worth it."""
    body = encode_json(payload)
    extra = dict(headers or {})
    if len(body) >= ZSTD_MIN_BYTES and accepts_zstd(accept_encoding):
        # A fresh compressor per answer: ZstdCompressor is not safe across threads.
        body = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(body)
        extra["Content-Encoding"] = "zstd"
        extra["Vary"] = "Accept-Encoding"
    return Response(body, status_code=status_code, media_type=_JSON, headers=extra)


def error_response(status_code: int, message: str, **details: Any) -> Response:
    """The one error shape of every endpoint: `{"error": "<message>", ...details}`."""
    return Response(
        encode_json({"error": message, **details}), status_code=status_code, media_type=_JSON
    )
