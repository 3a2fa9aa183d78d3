"""The checks of a Redis URL and key prefix: what passes, and the exact refusals."""

from __future__ import annotations

import re

import pytest

from token_finalizer.core.store_urls import check_key_prefix, check_redis_url

_SECRET = "s3cret-pw"


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:6379/0", f"rediss://user:{_SECRET}@cache.example:6380/3", "redis://r"],
)
def test_a_redis_url_naming_a_host_passes_unchanged(url: str) -> None:
    """A redis:// or rediss:// URL with a host is returned as it was given."""
    assert check_redis_url(url) == url


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (None, "a redis source needs `url` (redis://host:port/db or rediss://...)"),
        ("", "a redis source needs `url` (redis://host:port/db or rediss://...)"),
        (f"http://:{_SECRET}@r:1", "url http://r:1 must start with redis:// or rediss://"),
        ("redis:///0", "url redis:///0 names no host"),
        (f"redis://:{_SECRET}@r:port", "url (an unparsable redis url) is not a valid redis url"),
    ],
)
def test_a_bad_redis_url_is_refused_with_its_message(url: object, message: str) -> None:
    """Each kind of bad URL gets its own message, which never shows the password."""
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        check_redis_url(url)


@pytest.mark.parametrize("prefix", ["", "token-finalizer:guard:", "a.b_c/d-1:"])
def test_a_key_prefix_of_safe_characters_passes_unchanged(prefix: str) -> None:
    """ASCII letters, digits and `. _ : / -` make a usable prefix (empty included)."""
    assert check_key_prefix(prefix) == prefix


@pytest.mark.parametrize("prefix", ["{tf}", "a b", "tf*", "é", None])
def test_a_key_prefix_outside_the_safe_characters_is_refused(prefix: object) -> None:
    """Braces, spaces, glob characters, non-ASCII letters or a non-string are refused."""
    message = (
        f"key_prefix {prefix!r} may only hold ASCII letters, digits, '.', '_', ':', '/' "
        "or '-' (no braces: every key's hash tag is its rollout's)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        check_key_prefix(prefix)
