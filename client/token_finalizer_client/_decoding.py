"""Decoding an answer's body (zstd, gzip) without ever holding more than a limit.

A compressed body is small on the wire whatever it expands to: 41 KB of zstd
can stand for more than a gigabyte. httpx's own decoders expand each network
chunk whole, so the clients read the raw body and decode it here instead:
output is produced in steps of at most `DECODE_STEP_BYTES` and counted as it
comes, and decoding stops the moment the total passes the limit
(docs/architecture.md#bounded-answers). A frame or member that announces its
size is checked before anything is decoded.

The errors are the client's own `InvalidAnswerError` (a body that does not
decode, an encoding the client never asked for) and `AnswerTooLargeError`.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import zstandard

from token_finalizer_client._constants import DECODE_STEP_BYTES, MAX_ENCODED_PARTS
from token_finalizer_client._exceptions import AnswerTooLargeError, InvalidAnswerError

__all__ = ["decode_content"]

# The most one input byte of zstd can expand to: a 4-byte RLE block stands for
# a whole 128 KiB block. Input is fed in steps small enough that even this
# ratio cannot carry one step far past the limit.
_ZSTD_MAX_RATIO = 128 * 1024 // 4
# Input steps of a zstd body: at least this (a step's overhead is Python's).
_ZSTD_MIN_STEP = 64
# Input steps of a gzip body (deflate expands at most ~1032:1).
_GZIP_INPUT_STEP = 64 * 1024
_GZIP_MAGIC = b"\x1f\x8b"
_GZIP_WBITS = 16 + zlib.MAX_WBITS


class _Output:
    """Decoded parts, refused as soon as their total passes `limit`."""

    def __init__(self, limit: int, encoding: str) -> None:
        self.limit = limit
        self.encoding = encoding
        self.total = 0
        self.parts: list[bytes] = []

    def add(self, part: bytes) -> None:
        self.total += len(part)
        if self.total > self.limit:
            raise AnswerTooLargeError(
                f"the {self.encoding} body decodes to more than {self.limit} bytes"
            )
        self.parts.append(part)

    def joined(self) -> bytes:
        return b"".join(self.parts)


def _truncated(encoding: str) -> InvalidAnswerError:
    return InvalidAnswerError(f"the {encoding} body is truncated")


def _zstd_frames(raw: bytes, limit: int) -> bytes:
    """Every frame of `raw`, decoded in bounded steps."""
    decompressor = zstandard.ZstdDecompressor()
    output = _Output(limit, "zstd")
    view = memoryview(raw)
    position = 0
    for _ in range(MAX_ENCODED_PARTS):
        frame = decompressor.decompressobj()
        while not frame.eof:
            if position >= len(view):
                raise _truncated("zstd")
            room = max(0, limit - output.total)
            step = min(DECODE_STEP_BYTES, max(_ZSTD_MIN_STEP, room // _ZSTD_MAX_RATIO))
            chunk = view[position : position + step]
            position += len(chunk)
            output.add(frame.decompress(chunk))
        position -= len(frame.unused_data)  # the next frame starts inside the last step
        if position >= len(view):
            return output.joined()
    raise InvalidAnswerError(f"the zstd body has more than {MAX_ENCODED_PARTS} frames")


def _zstd(raw: bytes, limit: int) -> bytes:
    try:
        size = zstandard.frame_content_size(raw)
        if size > limit:
            raise AnswerTooLargeError(f"the zstd body announces {size} bytes, over {limit}")
        if size >= 0:
            try:
                # One frame of known size: decoded in one go into a buffer of
                # that size, several times faster than in steps.
                decoded: bytes = zstandard.ZstdDecompressor().decompress(
                    raw, allow_extra_data=False
                )
                return decoded
            except zstandard.ZstdError:
                pass  # more than one frame, or a size that lies: decode in steps
        return _zstd_frames(raw, limit)
    except zstandard.ZstdError as exc:
        raise InvalidAnswerError(f"the zstd body does not decode: {exc}") from None


def _gzip(raw: bytes, limit: int) -> bytes:
    """Every member of `raw` (gzip), decoded in bounded steps; trailing bytes are ignored."""
    output = _Output(limit, "gzip")
    view = memoryview(raw)
    position = 0
    try:
        for _ in range(MAX_ENCODED_PARTS):
            member = zlib.decompressobj(_GZIP_WBITS)
            while not member.eof:
                if position >= len(view):
                    raise _truncated("gzip")
                data: bytes | memoryview = view[position : position + _GZIP_INPUT_STEP]
                position += len(data)
                while True:  # this input step, its output in bounded parts
                    part = member.decompress(data, DECODE_STEP_BYTES)
                    output.add(part)
                    data = member.unconsumed_tail
                    if member.eof or (not data and len(part) < DECODE_STEP_BYTES):
                        break
            position -= len(member.unused_data)
            if view[position : position + 2] != _GZIP_MAGIC:
                return output.joined()  # no further member (as httpx ignores padding)
    except zlib.error as exc:
        raise InvalidAnswerError(f"the gzip body does not decode: {exc}") from None
    raise InvalidAnswerError(f"the gzip body has more than {MAX_ENCODED_PARTS} members")


_DECODERS: dict[str, Callable[[bytes, int], bytes]] = {
    "zstd": _zstd,
    "gzip": _gzip,
    "x-gzip": _gzip,
}


def decode_content(raw: bytes, content_encoding: str, limit: int) -> bytes:
    """`raw` with its `Content-Encoding` undone, at most `limit` bytes of it.

    AnswerTooLargeError past the limit; InvalidAnswerError for a body that
    does not decode or an encoding the client does not accept.
    """
    data = raw
    encodings = [name.strip().lower() for name in content_encoding.split(",")]
    for encoding in reversed(encodings):  # the encoding applied last is undone first
        if encoding in ("", "identity"):
            continue
        decoder = _DECODERS.get(encoding)
        if decoder is None:
            raise InvalidAnswerError(
                f"the body is encoded {encoding[:40]!r}, which the client never accepts"
            )
        data = decoder(data, limit)
    if len(data) > limit:
        raise AnswerTooLargeError(f"the body holds more than {limit} bytes")
    return data
