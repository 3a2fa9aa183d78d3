"""Lineage resolution over a rollout's index: resolution's answers at O(candidates + answer).

`resolve_lineage` (core.lineage_resolution) reads every committed entry; the
stores answer the same question from their lineage index (core.lineage_index)
and cached chains (core.lineage_chains) instead, in two steps:

- `choose`: the request's candidates are looked up by fingerprint and kept
  when the request starts with their context; several that name one
  sequence (same non-empty digest, same length) collapse to the smallest id.
- `answer`: the chosen call's cumulative ids, from the cache or rebuilt from
  its nearest cached ancestor, checked against its digest and cum_len once.

A store whose view is built from a script's reply (redis) may fetch the
chosen call's lines between the two. Every answer equals `resolve_lineage`
over the same committed entries, failures included: a broken chain, a
conflicting repeat or a malformed entry is `unresolved` / `lookup_error`. A
store that cannot read its own data (CaptureError, OSError) raises as before.
See docs/store-protocol.md#lineage-index.
"""

from __future__ import annotations

from collections.abc import Sequence

from token_finalizer.core.errors import CaptureError
from token_finalizer.core.lineage_chains import (
    BrokenChain,
    ChainSource,
    cumulative_length,
    materialize,
)
from token_finalizer.core.lineage_index import CallLink, Candidate, LineageView
from token_finalizer.core.lineage_resolution import (
    LOOKUP_ERROR,
    RESOLVED,
    ROOT,
    UNRESOLVED,
    Resolution,
    ResolutionMatch,
    check_resolution_request,
)
from token_finalizer.core.token_digest import token_digest

__all__ = ["answer", "choose", "resolve_indexed"]

_LOOKUP_ERROR = Resolution(UNRESOLVED, LOOKUP_ERROR, None)


def resolve_indexed(
    view: LineageView,
    chains: ChainSource,
    fingerprint: str,
    fingerprint_version: int,
    context_digests: Sequence[str],
) -> Resolution:
    """Resolve a wire-form request over an index (ResolutionRequestError when malformed)."""
    check_resolution_request(fingerprint, fingerprint_version, context_digests)
    if not fingerprint:
        return Resolution(ROOT, "", None)
    chosen = choose(view, chains, fingerprint, context_digests)
    return chosen if isinstance(chosen, Resolution) else answer(chosen, view, chains)


def choose(
    view: LineageView, chains: ChainSource, fingerprint: str, context_digests: Sequence[str]
) -> Resolution | CallLink:
    """The link of the call a checked, non-root request continues, or the unresolved answer."""
    try:
        if view.conflicted:
            return _LOOKUP_ERROR
        candidates = [c for c in view.candidates(fingerprint) if c.continued_by(context_digests)]
        if len(candidates) > 1 and _interchangeable(candidates, view, chains):
            candidates = [min(candidates, key=lambda candidate: candidate.call_id)]
        if not candidates:
            return Resolution(UNRESOLVED, "no_match", None)
        if len(candidates) > 1:
            return Resolution(UNRESOLVED, "ambiguous", None)
        link = view.link(candidates[0].call_id)
        return _LOOKUP_ERROR if link is None else link
    except (CaptureError, OSError):
        raise
    except Exception:
        return _LOOKUP_ERROR


def answer(link: CallLink, view: LineageView, chains: ChainSource) -> Resolution:
    """`resolved` with the call's checked cumulative ids, or `lookup_error`."""
    try:
        chain = materialize(link, view, chains)
        if not chain.verified:
            if link.digest and token_digest(chain.tokens) != link.digest:
                return _LOOKUP_ERROR
            # A child would cut its prompt at prev_len; a wrong length would corrupt it.
            if link.cum_len is not None and link.cum_len != len(chain.tokens):
                return _LOOKUP_ERROR
            chain = chain.checked()
            chains.keep(link.call_id, chain)
    except (CaptureError, OSError):
        raise
    except Exception:  # BrokenChain in the expected cases; any malformed entry alike
        return _LOOKUP_ERROR
    tokens = chain.tokens
    return Resolution(RESOLVED, "", ResolutionMatch(link.call_id, tokens, link.digest, len(tokens)))


def _interchangeable(candidates: list[Candidate], view: LineageView, chains: ChainSource) -> bool:
    """Whether all candidates name one cumulative sequence by the same non-empty digest."""
    links = [view.link(candidate.call_id) for candidate in candidates]
    if any(link is None for link in links):
        raise BrokenChain("a candidate has no link")
    known = [link for link in links if link is not None]
    first_digest = known[0].digest
    if not first_digest or any(link.digest != first_digest for link in known[1:]):
        return False
    return len({cumulative_length(link, view, chains) for link in known}) == 1
