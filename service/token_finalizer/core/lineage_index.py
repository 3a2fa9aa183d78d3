"""The lineage index of one rollout: what resolution needs of each committed call.

Resolving a request (docs/records-and-builds.md#lineage-resolution) needs two
things of a committed call, and never its tokens until it is the answer:
whether it is a *candidate* (its continuation fingerprint and the context it
was served with) and how its cumulative sequence is made (its *link*: parent,
delta flag, lengths, digest). The index keeps exactly those as calls commit,
so a resolve looks up the request's fingerprint instead of re-reading the
rollout. Only calls a request could ever match are candidates: a request
carries a 64-hex fingerprint and 64-hex context digests, so anything else
stamped on an entry cannot be equal to them.

`RolloutLineage` is the in-memory index (memory and file stores); the redis
store keeps the same data beside the capture and hands resolution a
`LineageView` over what one script returned. See docs/store-protocol.md#lineage-index.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from token_finalizer.core.lineage_fields import CallView, lineage_field
from token_finalizer.core.lineage_resolution import HEX_DIGEST, same_call_payload
from token_finalizer_client.protocol import FINGERPRINT_VERSION

__all__ = [
    "EMPTY_LINEAGE",
    "CallLink",
    "Candidate",
    "LineageView",
    "RolloutLineage",
    "candidate_of",
    "link_of",
]

# Distinct scopes for the chain cache: one per index, never reused in a process.
_SCOPES = itertools.count(1)


@dataclass(frozen=True, slots=True)
class CallLink:
    """How one committed call's cumulative sequence is made, without its tokens."""

    call_id: str
    parent_call_id: str | None
    prompt_is_delta: bool
    own_length: int  # stored prompt + generation
    cum_len: int | None
    digest: str  # "" when the writer stamped none


@dataclass(frozen=True, slots=True)
class Candidate:
    """A committed call a request may continue: it was served `context_len` items
    whose conversation digest is `context_digest`."""

    call_id: str
    context_len: int
    context_digest: str

    def continued_by(self, context_digests: Sequence[str]) -> bool:
        """Whether a request with these prefix digests starts with this call's context."""
        return (
            self.context_len < len(context_digests)
            and context_digests[self.context_len] == self.context_digest
        )


def link_of(entry: CallView) -> CallLink:
    """The link of a committed call (lineage fields read as resolution reads them)."""
    digest = lineage_field(entry, "digest")
    return CallLink(
        call_id=entry.model_call_id,
        parent_call_id=lineage_field(entry, "parent_call_id") or None,
        prompt_is_delta=bool(lineage_field(entry, "prompt_is_delta")),
        own_length=len(entry.prompt_token_ids) + len(entry.generation_token_ids),
        cum_len=lineage_field(entry, "cum_len"),
        digest=digest if isinstance(digest, str) else "",
    )


def candidate_of(entry: CallView) -> tuple[str, Candidate] | None:
    """(fingerprint, candidate) when some well-formed request could continue this call.

    The same conditions as resolution's own test of an entry, minus the
    request: a current (or absent) fingerprint version, a recorded context
    digest, a context length that can index the request's digests.
    """
    fingerprint = lineage_field(entry, "continuation_fingerprint")
    if not isinstance(fingerprint, str) or not HEX_DIGEST.fullmatch(fingerprint):
        return None
    if lineage_field(entry, "fingerprint_version") not in (None, FINGERPRINT_VERSION):
        return None
    context_digest = lineage_field(entry, "continuation_context_digest")
    context_len = lineage_field(entry, "continuation_context_len") or 0
    if not isinstance(context_digest, str) or not HEX_DIGEST.fullmatch(context_digest):
        return None
    if not isinstance(context_len, int) or context_len < 0:
        return None
    return fingerprint, Candidate(entry.model_call_id, int(context_len), context_digest)


class LineageView(Protocol):
    """What resolution reads of one rollout: its candidates, links and (for the answer) calls."""

    @property
    def conflicted(self) -> bool:
        """Whether some call id was committed twice with different payloads."""
        ...

    def candidates(self, fingerprint: str) -> Sequence[Candidate]:
        """The candidates stamped with `fingerprint`, in commit order."""
        ...

    def link(self, call_id: str) -> CallLink | None:
        """The committed call's link, None when no such call was committed."""
        ...

    def call(self, call_id: str) -> CallView | None:
        """The committed call itself (its tokens), None when it cannot be read."""
        ...


class RolloutLineage:
    """The in-memory index of one rollout's committed calls, fed in commit order.

    `load` reads the first committed copy of a call back (its tokens are not
    kept here): for the answer's delta chain, and to compare a repeated call
    id with its first copy. `scope` names this index in a chain cache; a new
    index (a recreated capture) never shares one.
    """

    __slots__ = ("_candidates", "_conflicted", "_links", "_load", "scope", "tokens")

    def __init__(self, load: Callable[[str], CallView | None]) -> None:
        self._load = load
        self._links: dict[str, CallLink] = {}
        self._candidates: dict[str, list[Candidate]] = {}
        self._conflicted = False
        self.scope = next(_SCOPES)
        self.tokens = 0  # stored prompt + generation tokens of every call

    def __len__(self) -> int:
        return len(self._links)

    def __contains__(self, call_id: object) -> bool:
        return call_id in self._links

    def add(self, entry: CallView) -> CallLink | None:
        """Index a committed call; its link when it is new, None for a repeated call id.

        A repeat whose payload differs from the first copy marks the rollout
        conflicted, as resolution over the entries would find it.
        """
        call_id = entry.model_call_id
        if call_id in self._links:
            if not self._conflicted:
                first = self._load(call_id)
                if first is None or not same_call_payload(first, entry):
                    self._conflicted = True
            return None
        link = link_of(entry)
        self._links[call_id] = link
        found = candidate_of(entry)
        if found is not None:
            fingerprint, candidate = found
            self._candidates.setdefault(fingerprint, []).append(candidate)
        self.tokens += link.own_length
        return link

    @property
    def conflicted(self) -> bool:
        """Whether some call id was committed twice with different payloads."""
        return self._conflicted

    def candidates(self, fingerprint: str) -> Sequence[Candidate]:
        """The candidates stamped with `fingerprint`, in commit order."""
        return self._candidates.get(fingerprint, ())

    def link(self, call_id: str) -> CallLink | None:
        """The committed call's link, None when no such call was committed."""
        return self._links.get(call_id)

    def call(self, call_id: str) -> CallView | None:
        """The committed call, read back through `load`."""
        return self._load(call_id) if call_id in self._links else None


class _EmptyLineage:
    """The view of a rollout with nothing committed (unknown, or retired)."""

    conflicted = False

    def candidates(self, fingerprint: str) -> Sequence[Candidate]:
        return ()

    def link(self, call_id: str) -> CallLink | None:
        return None

    def call(self, call_id: str) -> CallView | None:
        return None


EMPTY_LINEAGE: LineageView = _EmptyLineage()
