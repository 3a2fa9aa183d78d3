"""Lineage resolution in the local stores: over their index, or (a capture written before
the index existed) over every committed entry.

Every store keeps a lineage index per rollout (docs/store-protocol.md#lineage-index)
and answers from it; `resolve_committed` reads the whole rollout and stays for
redis captures written by a store without the index. A long delta chain takes
a while to rebuild: resolutions over many tokens run in a worker thread so the
store's event loop keeps serving other writers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from token_finalizer._constants import STORE_ENCODE_IN_THREAD_MIN_TOKENS
from token_finalizer.core.entries import TokenEntry
from token_finalizer.core.indexed_resolution import resolve_indexed
from token_finalizer.core.lineage_chains import Chain, ChainSource
from token_finalizer.core.lineage_index import LineageView
from token_finalizer.core.lineage_resolution import Resolution, resolve_lineage
from token_finalizer.sources.base import LineageQuery

__all__ = ["NO_CHAINS", "resolve_committed", "resolve_query"]


class _NoChains:
    """A ChainSource that keeps nothing (a view with nothing committed needs none)."""

    def cached(self, call_id: str) -> Chain | None:
        return None

    def keep(self, call_id: str, chain: Chain) -> None:
        return None


NO_CHAINS: ChainSource = _NoChains()


def resolve_query(view: LineageView, chains: ChainSource | None, query: LineageQuery) -> Resolution:
    """Resolve a wire-form request over a rollout's index (ResolutionRequestError if malformed)."""
    return resolve_indexed(
        view,
        NO_CHAINS if chains is None else chains,
        query.fingerprint,
        query.fingerprint_version,
        query.context_digests,
    )


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
