"""Checks of the Redis settings shared by the redis source and the shared guard.

Pure, so the configuration model can validate a Redis URL or key prefix
without loading a store (docs/architecture.md#dependency-rule). Both checks
return their argument unchanged or raise ValueError naming the problem; a
URL is only ever shown with its password redacted.
See docs/configuration.md#sources and docs/configuration.md#guard.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import urlsplit

from token_finalizer.core.redaction import redacted_url

__all__ = ["check_key_prefix", "check_redis_url"]

_URL_SCHEMES: Final = ("redis", "rediss")
# Braces would move the cluster hash tag; glob characters would break key scans.
_KEY_PREFIX: Final = re.compile(r"[A-Za-z0-9._:/-]*", re.ASCII)


def check_redis_url(url: object) -> str:
    """Return `url` when it is a redis:// or rediss:// URL naming a host, else ValueError."""
    if not isinstance(url, str) or not url:
        raise ValueError("a redis source needs `url` (redis://host:port/db or rediss://...)")
    try:
        parts = urlsplit(url)
        host, _port = parts.hostname, parts.port  # reading the port validates it
    except ValueError:
        raise ValueError(f"url {redacted_url(url)} is not a valid redis url") from None
    if parts.scheme not in _URL_SCHEMES:
        raise ValueError(f"url {redacted_url(url)} must start with redis:// or rediss://")
    if not host:
        raise ValueError(f"url {redacted_url(url)} names no host")
    return url


def check_key_prefix(prefix: object) -> str:
    """Return `prefix` when it only holds ASCII letters, digits and `. _ : / -`, else ValueError.

    Braces would move the cluster hash tag out of the rollout's own `{ng:R}`.
    """
    if not isinstance(prefix, str) or not _KEY_PREFIX.fullmatch(prefix):
        raise ValueError(
            f"key_prefix {prefix!r} may only hold ASCII letters, digits, '.', '_', ':', '/' "
            "or '-' (no braces: every key's hash tag is its rollout's)"
        )
    return prefix
