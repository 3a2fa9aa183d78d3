"""Checks of the Redis settings shared by the redis source, the shared guard and the store CLI.

Pure, so the configuration model can validate a Redis URL, a cluster's seed
list or a key prefix without loading a store
(docs/architecture.md#dependency-rule). Each check returns its argument
(normalised) or raises ValueError naming the problem; a URL is only ever
shown with its password redacted. See docs/configuration.md#sources,
docs/configuration.md#guard and docs/store-protocol.md#redis-cluster.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final
from urllib.parse import parse_qsl, urlsplit

from token_finalizer.core.redaction import redacted_url

__all__ = ["check_key_prefix", "check_redis_seeds", "check_redis_url", "redis_node_name"]

_URL_SCHEMES: Final = ("redis", "rediss")
_DEFAULT_PORT: Final = 6379
# Braces would move the cluster hash tag; glob characters would break key scans.
_KEY_PREFIX: Final = re.compile(r"[A-Za-z0-9._:/-]*", re.ASCII)
# Spellings other clients use for cluster mode; here it is a setting of its own.
_CLUSTER_SCHEMES: Final = ("redis+cluster", "rediss+cluster", "redis-cluster")
_CLUSTER_HINT: Final = "set `cluster: true` (store CLI: --redis-cluster) instead"


def check_redis_url(url: object) -> str:
    """Return `url` when it is a redis:// or rediss:// URL naming a host, else ValueError."""
    if not isinstance(url, str) or not url:
        raise ValueError("a redis source needs `url` (redis://host:port/db or rediss://...)")
    try:
        parts = urlsplit(url)
        host, _port = parts.hostname, parts.port  # reading the port validates it
    except ValueError:
        raise ValueError(f"url {redacted_url(url)} is not a valid redis url") from None
    if parts.scheme in _CLUSTER_SCHEMES:
        raise ValueError(f"url scheme {parts.scheme}:// is not supported: {_CLUSTER_HINT}")
    if parts.scheme not in _URL_SCHEMES:
        raise ValueError(f"url {redacted_url(url)} must start with redis:// or rediss://")
    if not host:
        raise ValueError(f"url {redacted_url(url)} names no host")
    if any(name.lower() == "cluster" for name, _ in parse_qsl(parts.query)):
        raise ValueError(f"url {redacted_url(url)}: `?cluster=` is not supported: {_CLUSTER_HINT}")
    return url


def _database(url: str) -> str:
    return urlsplit(url).path.strip("/") or "0"


def check_redis_seeds(urls: Sequence[object], *, cluster: bool) -> tuple[str, ...]:
    """The URLs of one Redis (one URL) or one Redis Cluster (its seed nodes), checked.

    Several URLs need `cluster`. Cluster seeds must agree on scheme and
    credentials (the cluster client logs in to every node it discovers with
    the first seed's), use database 0 (the only one a cluster has) and carry
    no query options (connection options are settings of their own).
    """
    seeds = tuple(check_redis_url(url) for url in urls)
    if not seeds:
        raise ValueError("a redis connection needs at least one url")
    if not cluster:
        if len(seeds) > 1:
            raise ValueError(
                f"{len(seeds)} redis urls given: several urls are the seed nodes of a "
                "Redis Cluster and need `cluster: true` (store CLI: --redis-cluster)"
            )
        return seeds
    first = urlsplit(seeds[0])
    for url in seeds:
        parts = urlsplit(url)
        shown = redacted_url(url)
        if parts.query:
            raise ValueError(f"cluster seed {shown} carries query options; leave them out")
        if _database(url) != "0":
            raise ValueError(
                f"cluster seed {shown} names database {_database(url)}: a cluster "
                "has database 0 only"
            )
        if (parts.scheme, parts.username, parts.password) != (
            first.scheme,
            first.username,
            first.password,
        ):
            raise ValueError(
                f"cluster seed {shown} differs from the first seed in scheme or credentials; "
                "every node of a cluster is reached the same way"
            )
    return seeds


def redis_node_name(url: str) -> str:
    """`host:port` of the server a redis URL names (the name Redis Cluster gives a node)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{parts.port or _DEFAULT_PORT}"


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
