"""Decoding a capture store's answer body under a size limit: zstd, gzip and deflate alike."""

from __future__ import annotations

import gzip
import zlib

import pytest
import zstandard

from token_finalizer.core.codec import CodecError
from token_finalizer.sources._encoded_body import decode_body, encoding_of

BODY = b'{"entries": []}' * 1000


@pytest.mark.parametrize(
    ("encoding", "raw"),
    [
        ("identity", BODY),
        ("zstd", zstandard.ZstdCompressor().compress(BODY)),
        ("gzip", gzip.compress(BODY, mtime=0)),
        ("x-gzip", gzip.compress(BODY, mtime=0)),
        ("deflate", zlib.compress(BODY)),
    ],
)
def test_each_encoding_decodes_to_the_body(encoding: str, raw: bytes) -> None:
    """A body within the limit comes back whole, whatever the coding."""
    assert decode_body(raw, encoding, limit=len(BODY)) == BODY


@pytest.mark.parametrize(
    ("encoding", "raw"),
    [
        ("zstd", zstandard.ZstdCompressor().compress(BODY)),
        ("gzip", gzip.compress(BODY, mtime=0)),
        ("deflate", zlib.compress(BODY)),
    ],
)
def test_one_byte_over_the_limit_is_refused_naming_the_coding(encoding: str, raw: bytes) -> None:
    """A body decoding to limit + 1 bytes is refused, naming the coding and the limit."""
    with pytest.raises(CodecError, match=f"the {encoding} body .*{len(BODY) - 1}"):
        decode_body(raw, encoding, limit=len(BODY) - 1)


def test_two_gzip_members_decode_one_after_the_other() -> None:
    """Concatenated gzip members are one body, as HTTP allows."""
    raw = gzip.compress(b"ab") + gzip.compress(b"cd")
    assert decode_body(raw, "gzip", limit=4) == b"abcd"


@pytest.mark.parametrize("raw", [gzip.compress(BODY, mtime=0)[:-20], b"not gzip at all"])
def test_a_truncated_or_broken_gzip_body_is_refused(raw: bytes) -> None:
    """A body that is cut short or not gzip at all does not decode."""
    with pytest.raises(CodecError, match="gzip body"):
        decode_body(raw, "gzip", limit=len(BODY))


def test_a_coding_that_was_not_asked_for_is_refused() -> None:
    """`br` (or anything else) is not decoded: refused, naming it."""
    with pytest.raises(CodecError, match="'br', which was not asked for"):
        decode_body(b"...", "br", limit=100)


@pytest.mark.parametrize(
    ("header", "encoding"), [(None, "identity"), ("", "identity"), (" GZip ", "gzip")]
)
def test_the_content_encoding_header_is_read_lower_cased(header: str | None, encoding: str) -> None:
    """No header is identity; a header is trimmed and lower-cased."""
    assert encoding_of(header) == encoding
