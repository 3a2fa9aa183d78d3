"""Lineage resolution over a rollout's committed entries, shared by the local stores.

A long delta chain takes a while to rebuild: resolutions over many tokens run
in a worker thread so the store's event loop keeps serving other writers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from token_finalizer._constants import STORE_ENCODE_IN_THREAD_MIN_TOKENS
from token_finalizer.core.entries import TokenEntry
from token_finalizer.core.lineage_resolution import Resolution, resolve_lineage
from token_finalizer.sources.base import LineageQuery

__all__ = ["resolve_committed"]


def _resolve(entries: Sequence[TokenEntry], query: LineageQuery) -> Resolution:
    return resolve_lineage(
        entries, query.fingerprint, query.fingerprint_version, list(query.context_digests)
    )


async def resolve_committed(
    read_entries: Callable[[], Awaitable[Sequence[TokenEntry]]], query: LineageQuery
) -> Resolution:
    """Resolve `query` over the rollout's committed calls (`read_entries`, in put order).

    A request without model-authored items is a root: nothing is read for it.
    """
    entries = await read_entries() if query.fingerprint else ()
    tokens = sum(entry.cumulative_length for entry in entries)
    if tokens >= STORE_ENCODE_IN_THREAD_MIN_TOKENS:
        return await asyncio.to_thread(_resolve, entries, query)
    return _resolve(entries, query)
