"""Bounded decoding of answer bodies: what decodes, what is refused, and in how much memory."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib

import pytest
import zstandard

from token_finalizer_client import AnswerTooLargeError, InvalidAnswerError
from token_finalizer_client._constants import MAX_ENCODED_PARTS
from token_finalizer_client._decoding import decode_content

MIB = 1024 * 1024
TEXT = b'{"status": "resolved", "ids": [' + b", ".join(b"%d" % n for n in range(5000)) + b"]}"


def zstd_bomb(decoded_mib: int) -> bytes:
    """A zstd frame of zeros that announces no size: a few KB decoding to `decoded_mib` MiB."""
    compressor = zstandard.ZstdCompressor(level=1).compressobj()
    zeros = bytes(MIB)
    return b"".join([*(compressor.compress(zeros) for _ in range(decoded_mib)), compressor.flush()])


def gzip_bomb(decoded_mib: int) -> bytes:
    """A gzip member of zeros: about 1 KB per MiB decoded."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(MIB)
    return b"".join([*(compressor.compress(zeros) for _ in range(decoded_mib)), compressor.flush()])


@pytest.mark.parametrize(
    ("encoded", "encoding"),
    [
        (TEXT, ""),
        (TEXT, "identity"),
        (zstandard.compress(TEXT), "zstd"),
        (gzip.compress(TEXT, mtime=0), "gzip"),
        (gzip.compress(TEXT, mtime=0), "x-gzip"),
        (zstandard.compress(gzip.compress(TEXT, mtime=0)), "gzip, zstd"),
    ],
    ids=["none", "identity", "zstd", "gzip", "x-gzip", "gzip-then-zstd"],
)
def test_each_accepted_encoding_decodes(encoded: bytes, encoding: str) -> None:
    """Identity, zstd, gzip and a chain of them decode to the original bytes."""
    assert decode_content(encoded, encoding, limit=MIB) == TEXT


def test_zstd_without_announced_size_decodes() -> None:
    """A streamed zstd frame (no content size in its header) decodes in steps to the same bytes."""
    compressor = zstandard.ZstdCompressor().compressobj()
    encoded = compressor.compress(TEXT) + compressor.flush()
    assert zstandard.frame_content_size(encoded) == -1
    assert decode_content(encoded, "zstd", limit=MIB) == TEXT


def test_several_zstd_frames_decode_in_order() -> None:
    """Concatenated zstd frames decode to their concatenated contents."""
    encoded = zstandard.compress(TEXT[:100]) + zstandard.compress(TEXT[100:])
    assert decode_content(encoded, "zstd", limit=MIB) == TEXT


def test_several_gzip_members_decode_in_order() -> None:
    """Concatenated gzip members decode to their concatenated contents."""
    encoded = gzip.compress(TEXT[:100]) + gzip.compress(TEXT[100:])
    assert decode_content(encoded, "gzip", limit=MIB) == TEXT


def test_a_body_of_exactly_the_limit_is_kept() -> None:
    """The limit itself is allowed: only more is refused."""
    assert decode_content(zstandard.compress(TEXT), "zstd", limit=len(TEXT)) == TEXT


@pytest.mark.parametrize("encoding", ["zstd", "gzip"])
def test_a_bomb_is_refused_within_bounded_memory(encoding: str) -> None:
    """A 256 MiB bomb against a 1 MiB limit is refused holding a few MiB, never the whole."""
    bomb = zstd_bomb(256) if encoding == "zstd" else gzip_bomb(256)
    tracemalloc.start()
    try:
        with pytest.raises(AnswerTooLargeError, match="more than 1048576 bytes"):
            decode_content(bomb, encoding, limit=MIB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * MIB


def test_an_announced_size_over_the_limit_is_refused_before_decoding() -> None:
    """A zstd frame announcing more than the limit is refused from its header."""
    with pytest.raises(AnswerTooLargeError, match="announces"):
        decode_content(zstandard.compress(bytes(2 * MIB)), "zstd", limit=MIB)


def test_an_unencoded_body_over_the_limit_is_refused() -> None:
    """Without any encoding the body itself is held to the limit."""
    with pytest.raises(AnswerTooLargeError):
        decode_content(bytes(MIB + 1), "identity", limit=MIB)


@pytest.mark.parametrize(
    ("encoded", "encoding", "problem"),
    [
        (zstandard.compress(TEXT)[:-8], "zstd", "truncated|does not decode"),
        (b"not zstd at all", "zstd", "does not decode"),
        (gzip.compress(TEXT, mtime=0)[:-12], "gzip", "truncated"),
        (b"not gzip at all", "gzip", "does not decode"),
        (TEXT, "br", "never accepts"),
        (TEXT, "deflate", "never accepts"),
    ],
    ids=["zstd-truncated", "zstd-garbage", "gzip-truncated", "gzip-garbage", "br", "deflate"],
)
def test_undecodable_bodies_are_invalid_answers(
    encoded: bytes, encoding: str, problem: str
) -> None:
    """A broken body, or an encoding the client never asks for, is an InvalidAnswerError."""
    with pytest.raises(InvalidAnswerError, match=problem):
        decode_content(encoded, encoding, limit=MIB)


def test_too_many_zstd_frames_are_refused() -> None:
    """A body of more empty frames than the client walks through is refused, not looped over."""
    empty = zstandard.ZstdCompressor(write_content_size=False).compress(b"")
    with pytest.raises(InvalidAnswerError, match="frames"):
        decode_content(empty * (MAX_ENCODED_PARTS + 1), "zstd", limit=MIB)
