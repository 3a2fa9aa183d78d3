"""Answers: orjson (numpy included), zstd when asked, large ones encoded off the loop."""

from __future__ import annotations

import functools
from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import Response

from token_finalizer.api.encoding import finalize_answer_pieces
from token_finalizer.web.answers import encoded_response, json_response

__all__ = ["answer", "encode_answer"]


def encode_answer(payload: Any, accept_encoding: str | None) -> Response:
    """`json_response(payload)`, byte for byte, spliced from pieces for finalize answers.

    The pieces (see `encoding`) avoid encoding the same token ids again and
    again; with zstd they are compressed as one stream and never joined.
    """
    try:
        pieces = finalize_answer_pieces(payload)
        if pieces is None:
            return json_response(payload, accept_encoding=accept_encoding)
        return encoded_response(pieces, accept_encoding=accept_encoding)
    except TypeError:  # orjson: a lone surrogate read from the store (docs/staging.md)
        return json_response(payload, accept_encoding=accept_encoding)


async def answer(request: Request, payload: Any, *, large: bool = False) -> Response:
    """A JSON answer honouring the request's Accept-Encoding.

    A large answer (tens of MB of token ids) takes tens of milliseconds to
    encode and compress; a worker thread keeps the event loop serving meanwhile.
    """
    accept_encoding = request.headers.get("accept-encoding")
    if large:
        return await anyio.to_thread.run_sync(
            functools.partial(encode_answer, payload, accept_encoding)
        )
    return json_response(payload, accept_encoding=accept_encoding)
