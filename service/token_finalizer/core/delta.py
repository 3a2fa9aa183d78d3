"""Lineage snapshots, before arranging: duplicates dropped, delta prompts made whole.

An at-least-once transport may deliver one call twice (dropped silently when
the tokens agree, reported when they do not), and a 0.7 writer may store a
prompt as the suffix after its parent's cumulative sequence. Each delta
entry's full prompt is rebuilt by walking its parents to a full-prompt
anchor and checked against its recorded digest; an entry whose chain cannot
be rebuilt exactly is left out and reported. The walk does not depend on
entry order. See docs/records-and-builds.md#l2-delta-materialization.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from token_finalizer.core.digest_batch import DigestBatch
from token_finalizer.core.entries import TokenEntry
from token_finalizer.core.tape import Tape
from token_finalizer.core.token_ids import same_ids

__all__ = ["MAX_DELTA_DEPTH", "Deduplicated", "Materialized", "deduplicate", "materialize"]

# Delta entries walked from an entry to its full-prompt anchor before giving up.
MAX_DELTA_DEPTH = 10_000


@dataclass(frozen=True, slots=True)
class Deduplicated:
    """The first copy of every call id, and the ids of repeats whose tokens differ."""

    entries: list[TokenEntry]
    conflicts: list[str]


@dataclass(frozen=True, slots=True)
class Materialized:
    """Entries with full prompts, the ids left out, and known digests of cumulative sequences."""

    entries: list[TokenEntry]
    broken: list[str]
    # model_call_id -> digest of its cumulative sequence, where already computed.
    cumulative_digests: dict[str, str]


def _same_tokens(first: TokenEntry, other: TokenEntry) -> bool:
    return same_ids(first.prompt_token_ids, other.prompt_token_ids) and same_ids(
        first.generation_token_ids, other.generation_token_ids
    )


def deduplicate(entries: Sequence[TokenEntry]) -> Deduplicated:
    """Keep the first copy of each model_call_id (in snapshot order)."""
    first: dict[str, TokenEntry] = {}
    conflicts: list[str] = []
    for entry in entries:
        kept = first.get(entry.model_call_id)
        if kept is None:
            first[entry.model_call_id] = entry
        elif not _same_tokens(kept, entry):
            conflicts.append(entry.model_call_id)
    return Deduplicated(entries=list(first.values()), conflicts=conflicts)


class _Unreconstructable(Exception):
    """A delta chain with a missing parent, a cycle, too many steps or a wrong digest."""


class _Materializer:
    """Rebuilds cumulative sequences on shared tapes, memoized per call id."""

    def __init__(self, entries: Sequence[TokenEntry]) -> None:
        self._by_id = {entry.model_call_id: entry for entry in entries}
        # call id -> (tape, cumulative length, delta depth) of a rebuilt sequence, or
        # None when broken. The depth counts delta entries down to the anchor, so
        # the limit holds per entry whatever order entries are rebuilt in.
        self._done: dict[str, tuple[Tape, int, int] | None] = {}
        # Tapes whose end is some call's cumulative end: a child may append in place.
        self._tape_end_owner: dict[int, str] = {}
        # Recorded digests are checked all at once at the end (`verify`), hashed
        # from the tapes without copies and across threads.
        self._batch = DigestBatch()
        self._checks: list[tuple[str, int]] = []  # (call id, its index in the batch)
        self.digests: dict[str, str] = {}

    def cumulative(self, call_id: str) -> tuple[Tape, int]:
        """The tape and length of `call_id`'s cumulative sequence; _Unreconstructable if none."""
        path = self._walk(call_id)
        for entry in reversed(path):
            self._extend(entry)
        done = self._done[call_id]
        if done is None:
            raise _Unreconstructable(call_id)
        tape, length, _ = done
        return tape, length

    def _walk(self, call_id: str) -> list[TokenEntry]:
        """Delta entries from `call_id` up to (excluding) the first already settled one."""
        path: list[TokenEntry] = []
        seen: set[str] = set()
        current: str | None = call_id
        while current is not None and current not in self._done:
            entry = self._by_id.get(current)
            if entry is None or current in seen:
                self._fail([e.model_call_id for e in path])
                raise _Unreconstructable(call_id)
            seen.add(current)
            if not entry.prompt_is_delta:
                self._anchor(entry)
                break
            path.append(entry)
            current = entry.parent_call_id
        if current is not None and self._done.get(current, ()) is None:
            self._fail([e.model_call_id for e in path])
            raise _Unreconstructable(call_id)
        return path

    def _fail(self, call_ids: list[str]) -> None:
        for call_id in call_ids:
            self._done[call_id] = None

    def _anchor(self, entry: TokenEntry) -> None:
        tape = Tape(entry.prompt_token_ids)
        tape.append(entry.generation_token_ids)
        self._settle(entry, tape, depth=0)

    def _extend(self, entry: TokenEntry) -> None:
        parent_id = entry.parent_call_id
        assert parent_id is not None  # a delta entry always names its parent
        parent = self._done.get(parent_id)
        if parent is None or parent[2] >= MAX_DELTA_DEPTH:
            self._done[entry.model_call_id] = None
            return
        tape, length, parent_depth = parent
        if self._tape_end_owner.get(id(tape)) != parent_id or tape.length != length:
            # Another call already continued this tape past the parent: branch off a copy.
            tape = Tape(tape.view(length))
        tape.append(entry.prompt_token_ids)
        tape.append(entry.generation_token_ids)
        self._settle(entry, tape, depth=parent_depth + 1)
        if entry.digest:
            self._checks.append((entry.model_call_id, self._batch.add(tape.view(tape.length))))

    def _settle(self, entry: TokenEntry, tape: Tape, *, depth: int) -> None:
        self._done[entry.model_call_id] = (tape, tape.length, depth)
        self._tape_end_owner[id(tape)] = entry.model_call_id

    def verify(self) -> set[str]:
        """Hash every rebuilt sequence that has a recorded digest; the ids broken by a mismatch.

        A mismatch breaks its own entry and every delta entry rebuilt on top
        of it (whose walk to the anchor passes through it), as if the walk
        had stopped there.
        """
        rebuilt = self._batch.run()
        mismatched: set[str] = set()
        for call_id, index in self._checks:
            if rebuilt[index] == self._by_id[call_id].digest:
                self.digests[call_id] = rebuilt[index]
            else:
                mismatched.add(call_id)
        verdict: dict[str, bool] = {}
        for call_id, done in self._done.items():
            if done is None:
                continue
            path: list[str] = []
            current = call_id
            while current not in verdict:
                entry = self._by_id[current]
                if current in mismatched or not entry.prompt_is_delta:
                    verdict[current] = current in mismatched
                    break
                path.append(current)
                assert entry.parent_call_id is not None  # a rebuilt delta entry names its parent
                current = entry.parent_call_id
            for passed in path:
                verdict[passed] = verdict[current]
        broken = {call_id for call_id, bad in verdict.items() if bad}
        for call_id in broken:
            self.digests.pop(call_id, None)
        return broken


def materialize(entries: Sequence[TokenEntry]) -> Materialized:
    """Give every delta entry its full prompt; leave out (and name) those that cannot be rebuilt.

    An entry is broken when its walk meets a missing parent, a cycle, more
    than MAX_DELTA_DEPTH delta entries, or a broken entry, or when its
    rebuilt cumulative sequence (or one it was rebuilt on) does not match its
    recorded digest.
    """
    if not any(entry.prompt_is_delta for entry in entries):
        return Materialized(entries=list(entries), broken=[], cumulative_digests={})
    rebuilder = _Materializer(entries)
    rebuilt: dict[str, tuple[Tape, int]] = {}
    for entry in entries:
        if entry.prompt_is_delta:
            with contextlib.suppress(_Unreconstructable):
                rebuilt[entry.model_call_id] = rebuilder.cumulative(entry.model_call_id)
    mismatched = rebuilder.verify()
    kept: list[TokenEntry] = []
    broken: list[str] = []
    for entry in entries:
        if not entry.prompt_is_delta:
            kept.append(entry)
            continue
        found = rebuilt.get(entry.model_call_id)
        if found is None or entry.model_call_id in mismatched:
            broken.append(entry.model_call_id)
            continue
        tape, length = found
        prompt = tape.view(length - len(entry.generation_token_ids))
        kept.append(dataclasses.replace(entry, prompt_token_ids=prompt))
    return Materialized(entries=kept, broken=broken, cumulative_digests=rebuilder.digests)
