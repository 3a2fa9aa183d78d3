"""The redis capture store: the file store's semantics in Redis, Valkey or Redis Cluster.

Every state change is one Lua script (`scripts/`), so writers on many
machines and several finalizer replicas see one order of events; the keys
are laid out in `_client`. Retention is by TTL, set inside the same scripts:

- a drop deletes the data keys and keeps the state as a retired tombstone
  that expires after `retired_ttl_s` (default 7 days; None keeps it forever);
- with `abandoned_ttl_s` set, every write to a capture that is not frozen
  pushes the expiry of all its keys that far out, so a capture nobody writes
  to or freezes for that long disappears whole (default None: never);
- a freeze removes any expiry: a frozen capture that was not retired is
  evidence and stays until it is dropped, deleted or swept.

Memory (docs/capacity.md): above `memory_high_water` of Redis's `maxmemory`
(or when Redis answers OOM) every write that adds capture data raises
StoreMemoryFull at once, while freeze, drop, sweep and mark_incomplete go on
(their scripts are allowed under OOM); `refuse_eviction` is the start-up
check of the eviction policy, `memory_health` what /health reports.

The operator's side (inspect, delete, sweep) is `RedisStoreAdmin`, reached as
`store.admin`. External staging (the ledger and the staged calls, under the
same hash tag and covered by the same drop, TTLs and sweep) is
`RedisStaging` (`staging.py`). See docs/store-protocol.md#redis-store.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Mapping, Sequence, Sized
from dataclasses import dataclass
from typing import Any

from token_finalizer._constants import (
    DEFAULT_HTTP_TIMEOUT_S,
    DEFAULT_MEMORY_HIGH_WATER,
    DEFAULT_RETIRED_TTL_S,
    EXPAND_IN_THREAD_MIN_BYTES,
    LINEAGE_INDEX_MAX_ROLLOUTS,
    PARSE_IN_THREAD_MIN_BYTES,
    REDIS_PUT_ROUNDS,
    STORE_PREPARE_IN_THREAD_MIN_TOKENS,
)
from token_finalizer.core.codec import loads_json
from token_finalizer.core.entries import Snapshot, TokenEntry
from token_finalizer.core.errors import CaptureConflict, CaptureCorrupt, SourceUnavailable
from token_finalizer.core.identity import check_model_call_id, check_new_store_id, check_store_id
from token_finalizer.core.lineage_resolution import Resolution
from token_finalizer.core.store_urls import check_redis_url
from token_finalizer.core.token_ids import Ids
from token_finalizer.sources._entries import entry_parts, same_payload
from token_finalizer.sources._known import KnownIds
from token_finalizer.sources._lineage import resolve_committed
from token_finalizer.sources._packed import (
    RolloutIds,
    expand_lines,
    is_packed,
    record_call,
    stored_value,
)
from token_finalizer.sources._staging import entries_refused, staged_capture
from token_finalizer.sources._staging_delegate import StagingDelegate
from token_finalizer.sources._state import CaptureState, line_digest
from token_finalizer.sources._stored import stored_entries
from token_finalizer.sources.base import FrozenLines, LineageQuery, MemoryHealth
from token_finalizer.sources.redis._client import RedisConnection, text
from token_finalizer.sources.redis._lineage import RedisLineage, index_arguments
from token_finalizer.sources.redis._memory import MemoryReading
from token_finalizer.sources.redis._shards import ShardReading
from token_finalizer.sources.redis.admin import RedisStoreAdmin
from token_finalizer.sources.redis.staging import RedisStaging

__all__ = ["RedisTokenStore"]


def _milliseconds(seconds: float | None, what: str) -> int:
    if seconds is None:
        return 0
    if not seconds > 0:
        raise ValueError(f"{what} must be > 0 seconds or None, got {seconds!r}")
    return max(1, round(seconds * 1000))


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A put's entry, ready for the put script."""

    parsed: TokenEntry
    line: bytes  # the canonical line (what is digested and compared)
    digest: str
    indexed: tuple[str, str, str, str]  # the lineage index's arguments
    value: bytes  # what is stored: the packed record or the line
    base: str  # the call the value refers to for its prompt's prefix ("" if none)
    base_digest: str


def _prepared(entry: object, known: KnownIds, lock: threading.Lock) -> _Prepared:
    """The parsed entry, its line and digest, the index's arguments and the stored value."""
    parsed, line, payload = entry_parts(entry)
    digest = line_digest(line)
    with lock:  # one rollout's ids are extended by one put at a time
        held = known.for_put(parsed.rollout_id, None, None, parsed)
        value, base = stored_value(payload, line, digest, parsed, held.ids)
        base_digest = held.digests.get(base, "") if base else ""
        held.stored(None, parsed.model_call_id, digest)
    return _Prepared(parsed, line, digest, index_arguments(parsed), value, base or "", base_digest)


def _unreferenced(prepared: _Prepared) -> _Prepared:
    """The same put without a reference to another call's ids (that call is not stored
    as this process knew it)."""
    parsed = prepared.parsed
    payload = loads_json(prepared.line)
    value, _ = stored_value(payload, prepared.line, prepared.digest, parsed, RolloutIds())
    return _Prepared(parsed, prepared.line, prepared.digest, prepared.indexed, value, "", "")


def _token_count(entry: object) -> int:
    """How many token ids an entry holds, as far as can be told without parsing it."""
    if isinstance(entry, TokenEntry):
        return entry.cumulative_length
    if isinstance(entry, Mapping):
        fields = (entry.get("prompt_token_ids"), entry.get("generation_token_ids"))
        return sum(len(field) if isinstance(field, Sized) else 0 for field in fields)
    return STORE_PREPARE_IN_THREAD_MIN_TOKENS  # a model object: prepared in a thread


async def _parsed(stored: Sequence[bytes], rollout_id: str) -> tuple[TokenEntry, ...]:
    """The entries of stored values, read without writing their lines (`_stored`); a large
    capture in a worker thread."""
    where = f"the capture of rollout {rollout_id}"
    if sum(map(len, stored)) >= PARSE_IN_THREAD_MIN_BYTES:
        return await asyncio.to_thread(stored_entries, stored, rollout_id, where)
    return stored_entries(stored, rollout_id, where)


async def _expanded(stored: Sequence[bytes]) -> tuple[bytes, ...]:
    """The canonical lines of stored values (packed ones expanded; a long capture in a
    worker thread)."""
    if not any(map(is_packed, stored)):
        return tuple(stored)
    if sum(map(len, stored)) >= EXPAND_IN_THREAD_MIN_BYTES:
        return await asyncio.to_thread(expand_lines, stored)
    return expand_lines(stored)


def _line_of(stored: Sequence[bytes], call_id: str) -> bytes:
    """The canonical line of one call among a capture's stored values (b"" if absent)."""
    known = RolloutIds()
    for value in stored:
        line = known.expand(value)
        if (record_call(value)[0] if is_packed(value) else None) == call_id:
            return line
        if not is_packed(value) and loads_json(line).get("model_call_id") == call_id:
            return line
    return b""


def _refuse(status: bytes, rollout_id: str, *, freezing: bool = False) -> None:
    """Raise what the state machine raises for a frozen or retired capture (or the family
    guard for a staging rollout)."""
    if status == b"family":
        raise entries_refused(rollout_id)
    state = CaptureState(frozen=True, retired=status == b"retired")
    if freezing:
        state.freeze(rollout_id)
    state.check_writable(rollout_id)


class RedisTokenStore(StagingDelegate):
    """CaptureStore over Redis (or Valkey, or Redis Cluster), with the file store's semantics."""

    kind = "redis"
    _staging: RedisStaging

    def __init__(
        self,
        url: str | None = None,
        *,
        urls: Sequence[str] | None = None,
        key_prefix: str | None = None,
        timeout_s: float = DEFAULT_HTTP_TIMEOUT_S,
        retired_ttl_s: float | None = DEFAULT_RETIRED_TTL_S,
        abandoned_ttl_s: float | None = None,
        cluster: bool = False,
        min_replicas_acked: int = 0,
        client: Any = None,
        memory_high_water: float | None = DEFAULT_MEMORY_HIGH_WATER,
        allow_eviction: bool = False,
    ) -> None:
        """`url` names one server, or a seed node with `cluster=True`; `urls` several seeds.

        `timeout_s` is each operation's deadline, retries included
        (docs/store-protocol.md#redis-cluster); `min_replicas_acked` N makes
        every state change wait for N replicas before it is acknowledged.
        `memory_high_water` is the share of `maxmemory` above which capture
        writes are refused (None: never); `allow_eviction` lets
        `refuse_eviction` accept an evicting policy (docs/capacity.md).
        """
        self._retired_ms = _milliseconds(retired_ttl_s, "retired_ttl_s")
        self._abandoned_ms = _milliseconds(abandoned_ttl_s, "abandoned_ttl_s")
        if url is not None and urls:
            raise ValueError("give `url` or `urls`, not both")
        seeds = list(urls) if urls else [] if url is None else [url]
        if client is None and not seeds:
            check_redis_url(url)  # the message that names what is missing
        self._redis = RedisConnection(
            seeds,
            key_prefix=key_prefix or "",
            timeout_s=timeout_s,
            cluster=cluster,
            min_replicas_acked=min_replicas_acked,
            client=client,
            memory_high_water=memory_high_water,
            allow_eviction=allow_eviction,
        )
        self._staging = RedisStaging(self._redis, abandoned_ms=self._abandoned_ms)
        self._lineage = RedisLineage(self._redis)
        self._known = KnownIds(LINEAGE_INDEX_MAX_ROLLOUTS)
        self._pack_lock = threading.Lock()
        self._admin = RedisStoreAdmin(self._redis, self._staging, on_removed=self._forget)

    def __repr__(self) -> str:  # never shows a password
        return f"RedisTokenStore({self._redis.where!r}, key_prefix={self.key_prefix!r})"

    @property
    def key_prefix(self) -> str:
        """The prefix of every key of this store."""
        return self._redis.key_prefix

    @property
    def store_option(self) -> str:
        """`--redis URL` (no credentials), `--redis-cluster` and `--key-prefix` as this store
        was opened: how `token-finalizer store` names it (hints name it); '' for a client
        handed in without a URL."""
        return self._redis.store_option

    @property
    def node(self) -> str:
        """`host:port` of the server the URL names (a cluster's first seed), for health reports."""
        return self._redis.node

    @property
    def admin(self) -> RedisStoreAdmin:
        """Inspect, delete and sweep this store."""
        return self._admin

    def keys(self, rollout_id: str) -> list[str]:
        """The rollout's keys (the id is checked first)."""
        return self._redis.keys(rollout_id)

    # -- writer side -----------------------------------------------------------------------

    async def put(self, entry: TokenEntry | Mapping[str, Any]) -> None:
        """Store one call; the same payload again is a no-op, a different one CaptureConflict.

        A conflict also marks the rollout incomplete, in the same script.
        """
        if _token_count(entry) >= STORE_PREPARE_IN_THREAD_MIN_TOKENS:
            prepared = await asyncio.to_thread(_prepared, entry, self._known, self._pack_lock)
        else:
            prepared = _prepared(entry, self._known, self._pack_lock)
        parsed, line = prepared.parsed, prepared.line
        rollout_id, call_id = parsed.rollout_id, parsed.model_call_id
        compared = b""
        for _ in range(REDIS_PUT_ROUNDS):
            reply = await self._redis.run(
                "put",
                rollout_id,
                (
                    call_id,
                    prepared.digest,
                    prepared.value,
                    compared,
                    self._abandoned_ms,
                    *prepared.indexed,
                    prepared.base,
                    prepared.base_digest,
                ),
                "put",
            )
            status = reply[0]
            if status == b"rebase":
                self._known.forget(rollout_id)
                prepared = await asyncio.to_thread(_unreferenced, prepared)
                continue
            if status == b"new":
                self._lineage.committed(parsed, text(reply[2]))
                return
            if status == b"same":
                return
            if status == b"mismatch":
                stored_digest = reply[1]
                stored_line = await self._canonical(rollout_id, call_id, reply[2])
                if await asyncio.to_thread(same_payload, stored_line, line):
                    return
                compared = stored_digest
                continue
            if status == b"conflict":
                raise CaptureConflict(
                    f"model call {call_id} of rollout {rollout_id} "
                    "was already stored with a different payload"
                )
            if status in (b"frozen", b"retired", b"family"):
                _refuse(status, rollout_id)
            raise self._redis.unexpected("put", reply)
        raise SourceUnavailable(
            f"redis store {self._redis.where}: the stored entry of model call {call_id} of "
            f"rollout {rollout_id} kept changing during the put"
        )

    async def _canonical(self, rollout_id: str, call_id: str, stored: bytes) -> bytes:
        """The canonical line of a stored value (a packed one: read with the capture)."""
        if not is_packed(stored):
            return stored
        reply = await self._redis.run("committed", rollout_id, (), "committed entries")
        if reply[0] != b"ok" or len(reply) != 2:
            return b""  # gone meanwhile: not the same payload, the put goes round again
        return await asyncio.to_thread(_line_of, reply[1], call_id)

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        """Record that a call of this rollout failed to capture (allowed after freeze)."""
        check_new_store_id(rollout_id)
        if model_call_id:
            check_model_call_id(model_call_id)
        reply = await self._redis.run(
            "mark_incomplete", rollout_id, (model_call_id, self._abandoned_ms), "mark_incomplete"
        )
        if reply[0] == b"retired":
            CaptureState(retired=True).mark_incomplete(rollout_id)
        if reply[0] == b"family":
            raise entries_refused(rollout_id)
        if reply[0] != b"ok":
            raise self._redis.unexpected("mark_incomplete", reply)

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        """Announce a call; if its entry is missing at freeze time the snapshot is incomplete."""
        check_new_store_id(rollout_id)
        check_model_call_id(model_call_id)
        reply = await self._redis.run(
            "begin_call", rollout_id, (model_call_id, self._abandoned_ms), "begin_call"
        )
        if reply[0] in (b"frozen", b"retired", b"family"):
            _refuse(reply[0], rollout_id)
        if reply[0] != b"ok":
            raise self._redis.unexpected("begin_call", reply)

    # -- finalizer side ----------------------------------------------------------------------

    def _corrupt(self, rollout_id: str, call_id: object) -> CaptureCorrupt:
        return CaptureCorrupt(
            f"redis store {self._redis.where}: rollout {rollout_id} lists model call "
            f"{text(call_id)} without its entry"
        )

    async def freeze_lines(self, rollout_id: str, *, stored: bool = False) -> FrozenLines:
        """`freeze`, returning the entry lines (the store server's fast path); `stored`:
        the values as stored, packed records among them."""
        reply = await self._redis.run("freeze", rollout_id, (uuid.uuid4().hex,), "freeze")
        status = reply[0]
        if status == b"retired":
            _refuse(status, rollout_id, freezing=True)
        if status == b"corrupt":
            raise self._corrupt(rollout_id, reply[1])
        if status != b"ok" or len(reply) != 5:
            raise self._redis.unexpected("freeze", reply)
        _, snapshot_id, version, incomplete, values = reply
        lines = tuple(values) if stored else await _expanded(values)
        # A staging rollout has no entries; once frozen nothing changes it, so its
        # ledger and staged calls are read by a second script.
        staged = None if lines else await self._staging.frozen_lines(rollout_id)
        return FrozenLines(
            rollout_id=rollout_id,
            lines=tuple(lines),
            incomplete=bool(incomplete),
            snapshot_id=text(snapshot_id),
            version=int(version),
            staged=staged,
        )

    async def freeze(self, rollout_id: str) -> Snapshot:
        """Freeze (idempotent) and read the rollout's immutable snapshot, in one script."""
        frozen = await self.freeze_lines(rollout_id, stored=True)
        staged = frozen.staged
        return Snapshot(
            rollout_id=rollout_id,
            entries=await _parsed(frozen.lines, rollout_id),
            incomplete=frozen.incomplete,
            snapshot_id=frozen.snapshot_id,
            version=frozen.version,
            staged=None if staged is None else staged_capture(staged, rollout_id),
        )

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        """Delete exactly that snapshot's data, keeping the state as a retired tombstone."""
        check_store_id(rollout_id)
        if isinstance(version, bool) or not isinstance(version, int):
            return False
        reply = await self._redis.run(
            "drop", rollout_id, (str(snapshot_id), str(version), self._retired_ms), "drop"
        )
        if reply:
            self._lineage.forget(rollout_id)
            self._known.forget(rollout_id)
        return bool(reply)

    # -- lineage -------------------------------------------------------------------------------

    async def committed_entries(self, rollout_id: str) -> tuple[TokenEntry, ...]:
        """The rollout's stored entries in put order, read without freezing (one script).

        Read-only (lineage resolution of a rollout still being written); a
        retired or unknown rollout has none.
        """
        reply = await self._redis.run("committed", rollout_id, (), "committed entries")
        if reply[0] == b"corrupt":
            raise self._corrupt(rollout_id, reply[1])
        if reply[0] != b"ok" or len(reply) != 2:
            raise self._redis.unexpected("committed entries", reply)
        return await _parsed(reply[1], rollout_id)

    async def resolve_lineage(self, rollout_id: str, query: LineageQuery) -> Resolution:
        """Which stored call of the rollout a request continues (read-only), from its
        lineage index: one script, which sends the answer's lines at most."""
        check_store_id(rollout_id)
        return await self._lineage.resolve(
            rollout_id,
            query,
            # A capture written before the index existed is read whole, as then.
            lambda: resolve_committed(lambda: self.committed_entries(rollout_id), query),
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def _forget(self, rollout_id: str) -> None:
        """Drop what this process holds of a rollout it deleted or swept."""
        self._lineage.forget(rollout_id)
        self._known.forget(rollout_id)

    async def cumulative_ids(self, rollout_id: str, model_call_id: str) -> Ids | None:
        """The cumulative ids of a call this process stored (None: not at hand; a delta
        put's parent, docs/store-protocol.md#delta-put)."""
        return self._known.ids_of(check_store_id(rollout_id), model_call_id)

    async def ping(self) -> None:
        """Raise SourceUnavailable unless the server answers PING."""
        await self._redis.ping()

    # -- memory (docs/capacity.md) -------------------------------------------------------------

    @property
    def memory_reading(self) -> MemoryReading | None:
        """The latest reading of Redis's memory, if any (what metrics export)."""
        return self._redis.memory.last

    async def refuse_eviction(self) -> MemoryReading:
        """The start-up check: EvictionPolicyRefused when Redis (any primary) may evict our
        keys and `allow_eviction` is off; remembers the evictions so far."""
        return await self._redis.memory.refuse_eviction()

    async def memory_health(self) -> MemoryHealth:
        """A fresh reading: `memory_full` above the mark, `captures_evicted` after evictions."""
        watch = self._redis.memory
        reading = await watch.read()
        evicted = reading.evicted_keys - (watch.evicted_at_start or 0)
        return MemoryHealth(watch.verdict(reading), reading.to_dict(), max(0, evicted))

    # -- shards (docs/store-protocol.md#health) ------------------------------------------------

    async def shard_health(self) -> tuple[ShardReading, ...]:
        """Every primary's reach and connected replicas, read now (a cluster; a plain server
        with `min_replicas_acked`); a shard with fewer than `min_replicas_acked` replicas
        cannot take writes."""
        return await self._redis.shards()

    @property
    def min_replicas_acked(self) -> int:
        """How many replicas must confirm each state change (0: none waited for)."""
        return self._redis.min_replicas_acked

    @property
    def shard_readings(self) -> tuple[ShardReading, ...]:
        """What the last `shard_health` read (what metrics export)."""
        return self._redis.last_shards

    async def check_cluster_mode(self) -> None:
        """ClusterModeRefused when the server given as one Redis is a Redis Cluster node."""
        await self._redis.check_cluster_mode()

    async def close(self) -> None:
        """Close the connection pool (a client passed in stays the caller's); idempotent."""
        await self._redis.close()
