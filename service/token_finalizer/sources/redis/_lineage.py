"""The redis store's lineage index: written by the put script, read by the resolve script.

Beside each rollout's entries, under its hash tag (docs/store-protocol.md#lineage-index):

    P{ng:R}:links     call id -> "parent\\ndelta\\nown length\\ncum_len\\ndigest"
    P{ng:R}:lineage   fingerprint -> "call_id context_len context_digest\\n" per candidate

The put script writes both with the entry, from fields the writer already
parsed (`index_arguments`). A resolve runs one read-only script that keeps
the fingerprint's candidates whose context the request starts with and
returns their links and, for a single candidate, the lines of its delta
chain down to a call whose chain this process holds (or the anchor). So a
resolve moves the answer's lines at most, never the rollout.

The state hash also holds `lineage_epoch`, minted by a rollout's first put:
cached chains are kept per (rollout, epoch), so a capture deleted and
written again is never answered from the chains of the one before.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from token_finalizer._constants import (
    LINEAGE_CACHE_MAX_TOKENS,
    LINEAGE_INDEX_MAX_ROLLOUTS,
    LINEAGE_REDIS_CACHED_STOPS,
    PARSE_IN_THREAD_MIN_BYTES,
    STORE_ENCODE_IN_THREAD_MIN_TOKENS,
)
from token_finalizer.core.entries import TokenEntry
from token_finalizer.core.errors import CaptureCorrupt, TokenEntryError
from token_finalizer.core.indexed_resolution import answer, choose
from token_finalizer.core.lineage_chains import ChainCache, ScopedChains, remember_committed
from token_finalizer.core.lineage_index import (
    EMPTY_LINEAGE,
    CallLink,
    Candidate,
    candidate_of,
    link_of,
)
from token_finalizer.core.lineage_resolution import (
    LOOKUP_ERROR,
    MAX_DELTA_DEPTH,
    ROOT,
    UNRESOLVED,
    Resolution,
    check_resolution_request,
)
from token_finalizer.sources._lineage import resolve_query
from token_finalizer.sources._packed import is_packed, render_from
from token_finalizer.sources.base import LineageQuery
from token_finalizer.sources.redis._client import RedisConnection, text

__all__ = ["RedisLineage", "index_arguments"]


def _encode_link(link: CallLink) -> str:
    cum_len = "" if link.cum_len is None else str(link.cum_len)
    delta = "1" if link.prompt_is_delta else "0"
    return f"{link.parent_call_id or ''}\n{delta}\n{link.own_length}\n{cum_len}\n{link.digest}"


def _decode_link(call_id: str, raw: str) -> CallLink:
    parent, delta, own_length, cum_len, digest = raw.split("\n", 4)
    return CallLink(
        call_id=call_id,
        parent_call_id=parent or None,
        prompt_is_delta=delta == "1",
        own_length=int(own_length),
        cum_len=int(cum_len) if cum_len else None,
        digest=digest,
    )


def index_arguments(entry: TokenEntry) -> tuple[str, str, str, str]:
    """The put script's index arguments: a fresh epoch, the link, the fingerprint, the record."""
    found = candidate_of(entry)
    fingerprint, record = "", ""
    if found is not None:
        fingerprint, candidate = found
        record = f"{candidate.call_id} {candidate.context_len} {candidate.context_digest}\n"
    return uuid.uuid4().hex, _encode_link(link_of(entry)), fingerprint, record


class _ReplyView:
    """A LineageView over what the resolve script returned (its candidates already kept)."""

    conflicted = False  # the put script refuses a second payload for a call id

    def __init__(self, rollout_id: str, reply: Sequence[Any]) -> None:
        self._rollout_id = rollout_id
        flat = [text(value) for value in reply[2]]
        self._candidates = [
            Candidate(flat[i], int(flat[i + 1]), flat[i + 2]) for i in range(0, len(flat), 3)
        ]
        self._links: dict[str, CallLink] = {}
        self._lines: dict[str, bytes] = {}
        self.merge(reply)

    @property
    def candidate_count(self) -> int:
        return len(self._candidates)

    @property
    def line_bytes(self) -> int:
        return sum(map(len, self._lines.values()))

    def merge(self, reply: Sequence[Any]) -> None:
        """Add the links and lines of another reply of the same rollout and epoch."""
        links, lines = reply[3], reply[4]
        for i in range(0, len(links), 2):
            call_id = text(links[i])
            self._links[call_id] = _decode_link(call_id, text(links[i + 1]))
        for i in range(0, len(lines), 2):
            self._lines[text(lines[i])] = lines[i + 1]

    def candidates(self, fingerprint: str) -> Sequence[Candidate]:
        return self._candidates

    def link(self, call_id: str) -> CallLink | None:
        return self._links.get(call_id)

    def call(self, call_id: str) -> TokenEntry | None:
        line = self._lines.get(call_id)
        if line is None:
            return None
        if not line:
            raise CaptureCorrupt(
                f"rollout {self._rollout_id} indexes call {call_id} without its entry"
            )
        if is_packed(line):
            rendered = render_from(call_id, self._lines)
            if rendered is None:
                raise CaptureCorrupt(
                    f"rollout {self._rollout_id}: call {call_id} refers to a call not sent"
                )
            line = rendered
        entry = TokenEntry.from_json(line)
        if entry.rollout_id != self._rollout_id:
            raise TokenEntryError(
                f"the capture of rollout {self._rollout_id} holds an entry of {entry.rollout_id}"
            )
        return entry


class RedisLineage:
    """Resolution over the redis store's lineage index, with this process's chain cache."""

    def __init__(self, redis: RedisConnection) -> None:
        self._redis = redis
        self._chains = ChainCache(LINEAGE_CACHE_MAX_TOKENS)
        # rollout id -> the epoch its chains are cached under, least recently used first.
        self._epochs: OrderedDict[str, str] = OrderedDict()

    def _note_epoch(self, rollout_id: str, epoch: str) -> None:
        previous = self._epochs.pop(rollout_id, None)
        if previous is not None and previous != epoch:
            self._chains.forget((rollout_id, previous))
        self._epochs[rollout_id] = epoch
        while len(self._epochs) > LINEAGE_INDEX_MAX_ROLLOUTS:
            evicted, old = self._epochs.popitem(last=False)
            self._chains.forget((evicted, old))

    def forget(self, rollout_id: str) -> None:
        """Drop a rollout's cached chains (it was retired, deleted or swept)."""
        epoch = self._epochs.pop(rollout_id, None)
        if epoch is not None:
            self._chains.forget((rollout_id, epoch))

    def committed(self, entry: TokenEntry, epoch: str) -> None:
        """A put stored `entry` under `epoch`: cache its chain when that costs no read."""
        self._note_epoch(entry.rollout_id, epoch)
        chains = ScopedChains(self._chains, (entry.rollout_id, epoch))
        remember_committed(entry, link_of(entry), chains)

    async def _script(self, rollout_id: str, args: Sequence[Any]) -> Any:
        return await self._redis.run("resolve", rollout_id, args, "lineage resolve")

    async def resolve(
        self,
        rollout_id: str,
        query: LineageQuery,
        over_entries: Callable[[], Awaitable[Resolution]],
    ) -> Resolution:
        """Resolve `query` from the index; `over_entries` for a capture written without one."""
        check_resolution_request(
            query.fingerprint, query.fingerprint_version, query.context_digests
        )
        if not query.fingerprint:
            return Resolution(ROOT, "", None)
        known = self._epochs.get(rollout_id, "")
        held = self._chains.recent((rollout_id, known), LINEAGE_REDIS_CACHED_STOPS) if known else {}
        head = (known, MAX_DELTA_DEPTH, len(held), *held)
        reply = await self._script(
            rollout_id, ("candidates", *head, query.fingerprint, *query.context_digests)
        )
        if reply[0] == b"retired":
            return resolve_query(EMPTY_LINEAGE, None, query)
        if reply[0] == b"unindexed":
            return await over_entries()
        if reply[0] != b"ok" or len(reply) != 5:
            raise self._redis.unexpected("lineage resolve", reply)
        epoch = text(reply[1])
        if epoch != known:
            held = {}  # the script ignored them: they belong to an earlier capture
            if epoch:
                self._note_epoch(rollout_id, epoch)
        view = _ReplyView(rollout_id, reply)
        chains = ScopedChains(self._chains, (rollout_id, epoch), held)
        chosen = choose(view, chains, query.fingerprint, query.context_digests)
        if isinstance(chosen, Resolution):
            return chosen
        if view.candidate_count > 1:  # several collapsed to one: its lines were not sent
            more = await self._script(
                rollout_id, ("chain", epoch, MAX_DELTA_DEPTH, len(held), *held, chosen.call_id)
            )
            if more[0] != b"ok" or text(more[1]) != epoch:
                return Resolution(UNRESOLVED, LOOKUP_ERROR, None)  # changed meanwhile
            view.merge(more)
        expected = chosen.cum_len if chosen.cum_len is not None else chosen.own_length
        if (
            expected >= STORE_ENCODE_IN_THREAD_MIN_TOKENS
            or view.line_bytes >= PARSE_IN_THREAD_MIN_BYTES
        ):
            return await asyncio.to_thread(answer, chosen, view, chains)
        return answer(chosen, view, chains)
