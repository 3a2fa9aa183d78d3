"""Calls of one snapshot as a forest: who extends whom, and the parent rules of both kinds.

Seed snapshots (no lineage field on any entry) link each call to the earlier
call whose cumulative sequence is the longest prefix of its prompt; several
equal candidates make the link ambiguous and quarantine the call. Lineage
snapshots link by the parent each 0.7 writer recorded, verified by digest,
and fall back to prefix matching only for a parent that is missing from the
snapshot. See docs/records-and-builds.md#l4-parent-links.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from token_finalizer.core.digest_batch import DigestBatch
from token_finalizer.core.entries import TokenEntry
from token_finalizer.core.lineage_fields import RESOLVED, ROOT, UNRESOLVED
from token_finalizer.core.prefix_index import PrefixIndex, extends
from token_finalizer.core.token_digest import token_digest, token_digest_of_parts

__all__ = ["Call", "LinkReport", "link_by_lineage", "link_by_prefix", "processing_order"]

Ids = npt.NDArray[np.integer[Any]]


@dataclass(slots=True, eq=False)
class Call:
    """One kept call: its full prompt, its place in processing order, its links."""

    entry: TokenEntry
    prompt: Ids
    order: int = 0
    parent: Call | None = None
    children: list[Call] = field(default_factory=list)
    quarantined: bool = False
    boundary: bool = False  # a root because its recorded parent could not be verified

    @property
    def generation(self) -> Ids:
        return self.entry.generation_token_ids

    @property
    def call_id(self) -> str:
        return self.entry.model_call_id

    @property
    def cumulative_length(self) -> int:
        return len(self.prompt) + len(self.generation)

    def attach(self, parent: Call) -> None:
        self.parent = parent
        parent.children.append(self)


def processing_order(entries: Sequence[TokenEntry], prompts: Sequence[Ids]) -> list[Call]:
    """Calls sorted by (full prompt length, model_call_id): parents always come first."""
    calls = [Call(entry=e, prompt=p) for e, p in zip(entries, prompts, strict=True)]
    calls.sort(key=lambda call: (len(call.prompt), call.call_id))
    for order, call in enumerate(calls):
        call.order = order
    return calls


def link_by_prefix(calls: Sequence[Call]) -> None:
    """Seed rule: the parent is the longest-prefix call; ties hang under the first, quarantined."""
    index: PrefixIndex[Call] = PrefixIndex()
    for call in calls:
        index.add(call)
    for call in calls:
        found = index.longest_prefixes(call.prompt)
        if found:
            call.attach(found[0])
            # Only the ambiguous call is marked; its subtree drops out of every
            # chain because each path through it holds a quarantined call.
            call.quarantined = len(found) > 1


@dataclass(slots=True)
class LinkReport:
    """Why recorded parents were not used: counts by reason, and the calls cut off."""

    failures: Counter[str] = field(default_factory=Counter)
    unresolved: list[str] = field(default_factory=list)

    def boundary(self, call: Call, reason: str) -> None:
        call.boundary = True
        self.failures[reason] += 1
        self.unresolved.append(call.call_id)


class _DigestCache:
    """Digests of cumulative sequences, computed at most once per call."""

    def __init__(self, known: dict[str, str]) -> None:
        self._known = dict(known)

    def prefetch(self, calls: Sequence[Call]) -> None:
        """Hash, as one batch, every digest the lineage rule will compare (see `_verified`).

        That is the cumulative digest of each call that a later call names as
        its parent, when the parent recorded a digest to compare it with. The
        batch hashes from shared buffers and across threads.
        """
        by_id = {call.call_id: call for call in calls}
        wanted: dict[str, Call] = {}
        for call in calls:
            parent = by_id.get(call.entry.lineage.parent_call_id or "")
            if (
                parent is not None
                and parent.order < call.order
                and parent.entry.digest
                and parent.call_id not in self._known
            ):
                wanted[parent.call_id] = parent
        batch = DigestBatch()
        queued = {call_id: batch.add(p.prompt, p.generation) for call_id, p in wanted.items()}
        digests = batch.run()
        for call_id, index in queued.items():
            self._known[call_id] = digests[index]

    def of(self, call: Call) -> str:
        digest = self._known.get(call.call_id)
        if digest is None:
            digest = token_digest_of_parts(call.prompt, call.generation)
            self._known[call.call_id] = digest
        return digest


def _verified(prompt: Ids, parent: Call, digests: _DigestCache) -> bool:
    """Whether `parent`'s recorded (cum_len, digest) is a prefix of `prompt`.

    The common case (the prompt really extends the parent's tokens) is decided
    by comparing arrays and the parent's own digest once (nothing to hash when
    the parent recorded no digest: its tokens are the prefix); only a prompt
    that differs from the parent's tokens is hashed.
    """
    length = parent.entry.cum_len
    if length is None:
        length = parent.cumulative_length
    if length > len(prompt):
        return False
    recorded = parent.entry.digest
    if length == parent.cumulative_length and extends(prompt, parent, length):
        return not recorded or recorded == digests.of(parent)
    return token_digest(prompt[:length]) == (recorded or digests.of(parent))


def link_by_lineage(
    calls: Sequence[Call], report: LinkReport, known_digests: dict[str, str]
) -> None:
    """Lineage rule: verify each recorded parent; recover a missing one by unique prefix."""
    by_id = {call.call_id: call for call in calls}
    digests = _DigestCache(known_digests)
    digests.prefetch(calls)
    processed: PrefixIndex[Call] = PrefixIndex()
    seen: set[str] = set()
    for call in calls:
        lineage = call.entry.lineage
        claimed = lineage.parent_call_id
        if lineage.parent_resolution == ROOT:
            pass
        elif lineage.parent_resolution == UNRESOLVED:
            report.boundary(call, "parent_unresolved")
        elif lineage.parent_resolution == RESOLVED or claimed is not None:
            if not claimed:
                report.boundary(call, "resolved_parent_missing_id")
            elif claimed in seen:
                parent = by_id[claimed]
                if _verified(call.prompt, parent, digests):
                    call.attach(parent)
                else:
                    report.boundary(call, "parent_digest_mismatch")
            elif claimed in by_id:  # kept, but not before this call: a claim that cannot hold
                report.boundary(call, "parent_call_id_missing")
            else:
                found = processed.longest_prefixes(call.prompt)
                if len(found) == 1:
                    call.attach(found[0])
                    report.failures["parent_call_id_missing_recovered"] += 1
                else:
                    report.boundary(call, "parent_call_id_missing")
        else:
            report.boundary(call, "missing_resolution")
        processed.add(call)
        seen.add(call.call_id)
