"""The redis capture store: the file store's semantics in Redis, Valkey or Redis Cluster.

Keys of rollout `R` under the configured `key_prefix` `P`, all sharing the hash
tag `{ng:R}` so that Redis Cluster keeps one rollout on one slot:

    P{ng:R}:state        HASH   version, frozen, retired, incomplete, snapshot_id,
                                created_at, updated_at, frozen_at, retired_at
    P{ng:R}:entries      HASH   model_call_id -> the entry line as written
                                (compact sorted-key JSON, the file store's jsonl line)
    P{ng:R}:digests      HASH   model_call_id -> sha256 hex of that line
    P{ng:R}:order        LIST   model_call_ids in put order (snapshots keep it)
    P{ng:R}:intents      SET    announced model_call_ids (begin_call)
    P{ng:R}:incomplete   SET    model_call_ids that failed to capture

Every state change is one Lua script run with EVALSHA (redis-py's
`register_script`), and every script names all six keys in KEYS, so writers on
many machines and several finalizer replicas see one order of events. Times
(`created_at`, ...) are the server's clock, so ages agree across machines.

Retention is by TTL, set inside the same scripts:

- a drop deletes the data keys and keeps the state as a retired tombstone
  that expires after `retired_ttl_s` (default 7 days; None keeps it forever);
- with `abandoned_ttl_s` set, every write to a capture that is not frozen
  pushes the expiry of all its keys that far out, so a capture nobody writes
  to or freezes for that long disappears whole (default None: never);
- a freeze removes any expiry: a frozen capture that was not retired is
  evidence and stays until it is dropped, deleted or swept.

`sweep()` offers the file store's age-based sweep as well, for captures
written without TTLs.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final
from urllib.parse import urlsplit

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from token_finalizer._constants import DEFAULT_HTTP_TIMEOUT_S, PARSE_IN_THREAD_MIN_BYTES
from token_finalizer.core.entries import Snapshot, TokenEntry
from token_finalizer.core.errors import (
    CaptureConflict,
    CaptureCorrupt,
    SourceUnavailable,
    StoreUnreachable,
)
from token_finalizer.core.identity import check_store_id
from token_finalizer.core.redaction import redact, redacted_url
from token_finalizer.sources._entries import entry_payload, parse_capture, same_payload
from token_finalizer.sources._state import CaptureState, line_digest
from token_finalizer.sources.file import FrozenLines, SweptCapture

__all__ = [
    "DEFAULT_RETIRED_TTL_S",
    "KEY_PARTS",
    "RedisTokenStore",
    "check_key_prefix",
    "check_redis_url",
    "redacted_url",
]

# A retired tombstone only has to outlive the attempt's straggling writers.
DEFAULT_RETIRED_TTL_S: Final = 7 * 86_400.0
# Connection errors and timeouts are retried this often (every script is safe
# to repeat: put is idempotent, a repeated mark only bumps the version again,
# freeze is idempotent and drop is conditional), with jittered backoff.
_RETRIES: Final = 3
_RETRY_BASE_S: Final = 0.05
_RETRY_CAP_S: Final = 1.0
_CONNECT_TIMEOUT_CAP_S: Final = 5.0
_SCAN_COUNT: Final = 1000
# A put whose stored payload kept changing under it (only an admin delete can do
# that) gives up after this many rounds.
_PUT_ROUNDS: Final = 4

# The order of KEYS in every script.
KEY_PARTS: Final = ("state", "entries", "digests", "order", "intents", "incomplete")
# Braces would move the hash tag; glob characters would break the key scan.
_KEY_PREFIX = re.compile(r"[A-Za-z0-9._:/-]*", re.ASCII)
_URL_SCHEMES: Final = ("redis", "rediss")

# -- the scripts ----------------------------------------------------------------------
# KEYS: 1 state, 2 entries, 3 digests, 4 order, 5 intents, 6 incomplete.
# Flags in the state hash are "1" or absent; HMGET answers false for absent.

_PRELUDE = """
local function now()
  local t = redis.call('TIME')
  return t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
end
-- A write to the capture: note when; while it is open, push its expiry out.
local function touch(ttl_ms)
  local t = now()
  redis.call('HSETNX', KEYS[1], 'created_at', t)
  redis.call('HSET', KEYS[1], 'updated_at', t)
  if ttl_ms > 0 then
    for i = 1, #KEYS do redis.call('PEXPIRE', KEYS[i], ttl_ms) end
  end
end
"""

# ARGV: call id, sha256 of the line, the line, the stored digest the caller has
# compared with its own payload and found different ("" if none), abandoned TTL ms.
_PUT = (
    _PRELUDE
    + """
local call_id, digest, line, compared = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local flags = redis.call('HMGET', KEYS[1], 'retired', 'frozen')
if flags[1] then return {'retired'} end
if flags[2] then return {'frozen'} end
local stored = redis.call('HGET', KEYS[3], call_id)
if stored == digest then return {'same'} end
if stored and stored ~= compared then
  -- other bytes: the caller decides whether they carry the same payload
  return {'mismatch', stored, redis.call('HGET', KEYS[2], call_id) or ''}
end
if stored then
  redis.call('HSET', KEYS[1], 'incomplete', '1')
  redis.call('SADD', KEYS[6], call_id)
  local version = redis.call('HINCRBY', KEYS[1], 'version', 1)
  touch(tonumber(ARGV[5]))
  return {'conflict', version}
end
redis.call('HSET', KEYS[2], call_id, line)
redis.call('HSET', KEYS[3], call_id, digest)
redis.call('RPUSH', KEYS[4], call_id)
local version = redis.call('HINCRBY', KEYS[1], 'version', 1)
touch(tonumber(ARGV[5]))
return {'new', version}
"""
)

# ARGV: call id ("" for the rollout as a whole), abandoned TTL ms. Allowed after freeze.
_MARK_INCOMPLETE = (
    _PRELUDE
    + """
local flags = redis.call('HMGET', KEYS[1], 'retired', 'frozen')
if flags[1] then return {'retired'} end
redis.call('HSET', KEYS[1], 'incomplete', '1')
if ARGV[1] ~= '' then redis.call('SADD', KEYS[6], ARGV[1]) end
local version = redis.call('HINCRBY', KEYS[1], 'version', 1)
if flags[2] then touch(0) else touch(tonumber(ARGV[2])) end
return {'ok', version}
"""
)

# ARGV: call id, abandoned TTL ms. Does not change the version.
_BEGIN_CALL = (
    _PRELUDE
    + """
local flags = redis.call('HMGET', KEYS[1], 'retired', 'frozen')
if flags[1] then return {'retired'} end
if flags[2] then return {'frozen'} end
redis.call('SADD', KEYS[5], ARGV[1])
touch(tonumber(ARGV[2]))
return {'ok'}
"""
)

# ARGV: a fresh snapshot id, used only by the first freeze.
# Answers {'ok', snapshot_id, version, incomplete 0/1, {line, ...}} in put order.
_FREEZE = (
    _PRELUDE
    + """
local s = redis.call('HMGET', KEYS[1], 'retired', 'frozen', 'snapshot_id', 'version', 'incomplete')
if s[1] then return {'retired'} end
local snapshot_id, version = s[3], s[4]
if not s[2] then
  snapshot_id = ARGV[1]
  version = redis.call('HINCRBY', KEYS[1], 'version', 1)
  local t = now()
  redis.call('HSETNX', KEYS[1], 'created_at', t)
  redis.call('HSET', KEYS[1], 'frozen', '1', 'snapshot_id', snapshot_id,
             'frozen_at', t, 'updated_at', t)
  for i = 1, #KEYS do redis.call('PERSIST', KEYS[i]) end
end
local ids = redis.call('LRANGE', KEYS[4], 0, -1)
local lines = {}
for i = 1, #ids do
  local line = redis.call('HGET', KEYS[2], ids[i])
  if not line then return {'corrupt', ids[i]} end
  lines[i] = line
end
local incomplete = 0
if s[5] then
  incomplete = 1
else
  local intents = redis.call('SMEMBERS', KEYS[5])
  for i = 1, #intents do
    if redis.call('HEXISTS', KEYS[3], intents[i]) == 0 then
      incomplete = 1
      break
    end
  end
end
return {'ok', snapshot_id, version, incomplete, lines}
"""
)

# ARGV: snapshot id, version (decimal), retired TTL ms (0: keep the tombstone).
_DROP = (
    _PRELUDE
    + """
local s = redis.call('HMGET', KEYS[1], 'frozen', 'retired', 'snapshot_id', 'version')
if not s[1] or s[3] ~= ARGV[1] or s[4] ~= ARGV[2] then return 0 end
if s[2] then return 1 end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
local t = now()
redis.call('HSET', KEYS[1], 'retired', '1', 'retired_at', t, 'updated_at', t)
local ttl = tonumber(ARGV[3])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
return 1
"""
)

_STATUS = """
return {redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[3])}
"""

# Read-only: the stored lines in put order, without freezing; {} once retired.
# Answers {'ok', {line, ...}} or {'corrupt', call_id}.
_COMMITTED = """
if redis.call('HEXISTS', KEYS[1], 'retired') == 1 then return {'ok', {}} end
local ids = redis.call('LRANGE', KEYS[4], 0, -1)
local lines = {}
for i = 1, #ids do
  local line = redis.call('HGET', KEYS[2], ids[i])
  if not line then return {'corrupt', ids[i]} end
  lines[i] = line
end
return {'ok', lines}
"""

# ARGV: retired older than (s), abandoned older than (s, "" never), now (s, "" the
# server's clock), "1" for a dry run, empty older than (s, "" never). Answers {} or
# {reason, age}. "empty": frozen, not retired, and nothing in it at all (no entry,
# no announced or failed call, no incomplete mark): what finalizing a never
# captured id leaves behind.
_SWEEP = (
    _PRELUDE
    + """
local s = redis.call('HMGET', KEYS[1], 'retired', 'frozen', 'updated_at')
if not s[3] then return {} end
local clock = ARGV[3]
if clock == '' then clock = now() end
local age = tonumber(clock) - tonumber(s[3])
local reason
if s[1] and age >= tonumber(ARGV[1]) then
  reason = 'retired'
elseif ARGV[2] ~= '' and not s[1] and not s[2] and age >= tonumber(ARGV[2]) then
  reason = 'abandoned'
elseif ARGV[5] ~= '' and not s[1] and s[2] and age >= tonumber(ARGV[5])
    and redis.call('HLEN', KEYS[2]) == 0 and redis.call('SCARD', KEYS[5]) == 0
    and redis.call('SCARD', KEYS[6]) == 0 and not redis.call('HGET', KEYS[1], 'incomplete') then
  reason = 'empty'
else
  return {}
end
if ARGV[4] ~= '1' then redis.call('DEL', unpack(KEYS)) end
return {reason, tostring(age)}
"""
)


# -- configuration checks ----------------------------------------------------------------


def check_redis_url(url: object) -> str:
    """Return `url` when it is a redis:// or rediss:// URL naming a host, else ValueError."""
    if not isinstance(url, str) or not url:
        raise ValueError("a redis source needs `url` (redis://host:port/db or rediss://...)")
    try:
        parts = urlsplit(url)
        host, _port = parts.hostname, parts.port
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


def _milliseconds(seconds: float | None, what: str) -> int:
    if seconds is None:
        return 0
    if not seconds > 0:
        raise ValueError(f"{what} must be > 0 seconds or None, got {seconds!r}")
    return max(1, round(seconds * 1000))


# -- helpers -------------------------------------------------------------------------------


def _entries_of(lines: Sequence[bytes], rollout_id: str) -> tuple[TokenEntry, ...]:
    return parse_capture(lines, rollout_id, f"the capture of rollout {rollout_id}")


def _prepared(entry: object) -> tuple[TokenEntry, bytes, str]:
    parsed, line = entry_payload(entry)
    return parsed, line, line_digest(line)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _flag(fields: Mapping[str, str], key: str) -> bool:
    return fields.get(key) == "1"


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    return {_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}


class RedisTokenStore:
    """TokenSource and TokenSink over Redis (or Valkey), with the file store's semantics.

    `url` names one server, or with `cluster=True` any node of a Redis Cluster
    (redis-py's cluster client then routes each script by its keys' slot).
    `client` may be given instead of `url` (a `redis.asyncio.Redis` or
    `RedisCluster` created by the caller, who then also owns closing it).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        key_prefix: str | None = None,
        timeout_s: float = DEFAULT_HTTP_TIMEOUT_S,
        retired_ttl_s: float | None = DEFAULT_RETIRED_TTL_S,
        abandoned_ttl_s: float | None = None,
        cluster: bool = False,
        client: Any = None,
    ) -> None:
        self.key_prefix = check_key_prefix(key_prefix or "")
        self._retired_ms = _milliseconds(retired_ttl_s, "retired_ttl_s")
        self._abandoned_ms = _milliseconds(abandoned_ttl_s, "abandoned_ttl_s")
        if client is None:
            if not timeout_s > 0:
                raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
            url = check_redis_url(url)
            self._where = redacted_url(url)
            connect_s = min(timeout_s, _CONNECT_TIMEOUT_CAP_S)
            if cluster:
                # The cluster client keeps its own retries (it also follows MOVED and ASK).
                self._client: Any = RedisCluster.from_url(
                    url, socket_timeout=timeout_s, socket_connect_timeout=connect_s
                )
            else:
                backoff = ExponentialWithJitterBackoff(cap=_RETRY_CAP_S, base=_RETRY_BASE_S)
                self._client = Redis.from_url(
                    url,
                    socket_timeout=timeout_s,
                    socket_connect_timeout=connect_s,
                    retry=Retry(backoff, _RETRIES),
                    decode_responses=False,
                )
            self._owns_client = True
        else:
            self._where = redacted_url(url) if url else type(client).__name__
            self._client = client
            self._owns_client = False
        self._closed = False
        self._scripts: dict[str, AsyncScript] = {
            name: self._client.register_script(text)
            for name, text in (
                ("put", _PUT),
                ("mark_incomplete", _MARK_INCOMPLETE),
                ("begin_call", _BEGIN_CALL),
                ("freeze", _FREEZE),
                ("drop", _DROP),
                ("status", _STATUS),
                ("committed", _COMMITTED),
                ("sweep", _SWEEP),
            )
        }

    def __repr__(self) -> str:  # never shows a password
        return f"RedisTokenStore({self._where!r}, key_prefix={self.key_prefix!r})"

    # -- plumbing ------------------------------------------------------------------------

    def keys(self, rollout_id: str) -> list[str]:
        """The rollout's keys, in KEY_PARTS order (the id is checked first)."""
        tag = f"{self.key_prefix}{{ng:{check_store_id(rollout_id)}}}:"
        return [tag + part for part in KEY_PARTS]

    def _unavailable(self, what: str, exc: BaseException) -> SourceUnavailable:
        # Connection trouble and timeouts mean the script never ran (or its
        # answer was lost; every script may be repeated): a retry is safe.
        unreachable = isinstance(exc, RedisConnectionError | RedisTimeoutError | OSError)
        error = StoreUnreachable if unreachable else SourceUnavailable
        return error(
            redact(f"redis store {self._where}: {what} failed: {type(exc).__name__}: {exc}")
        )

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise SourceUnavailable(f"redis store {self._where} is closed ({what} refused)")

    async def _run(self, script: str, rollout_id: str, args: Sequence[Any], what: str) -> Any:
        """One script over the rollout's keys; any Redis failure is SourceUnavailable."""
        keys = self.keys(rollout_id)
        self._check_open(what)
        try:
            return await self._scripts[script](keys=keys, args=list(args))
        except (RedisError, OSError) as exc:
            raise self._unavailable(f"{what} of rollout {rollout_id}", exc) from None

    @staticmethod
    def _refuse(status: bytes, rollout_id: str, *, freezing: bool = False) -> None:
        """Raise what the state machine raises for a frozen or retired capture."""
        state = CaptureState(frozen=True, retired=status == b"retired")
        if freezing:
            state.freeze(rollout_id)
        state.check_writable(rollout_id)

    def _unexpected(self, what: str, reply: object) -> SourceUnavailable:
        return SourceUnavailable(f"redis store {self._where}: {what} answered {reply!r:.200}")

    # -- writer side -----------------------------------------------------------------------

    async def put(self, entry: TokenEntry | Mapping[str, Any]) -> None:
        """Store one call; the same payload again is a no-op, a different one CaptureConflict.

        A conflict also marks the rollout incomplete, in the same script.
        """
        parsed, line, digest = await asyncio.to_thread(_prepared, entry)
        rollout_id, call_id = parsed.rollout_id, parsed.model_call_id
        compared = b""
        for _ in range(_PUT_ROUNDS):
            reply = await self._run(
                "put", rollout_id, (call_id, digest, line, compared, self._abandoned_ms), "put"
            )
            status = reply[0]
            if status in (b"new", b"same"):
                return
            if status == b"mismatch":
                stored_digest, stored_line = reply[1], reply[2]
                if await asyncio.to_thread(same_payload, stored_line, line):
                    return
                compared = stored_digest
                continue
            if status == b"conflict":
                raise CaptureConflict(
                    f"model call {call_id} of rollout {rollout_id} "
                    "was already stored with a different payload"
                )
            if status in (b"frozen", b"retired"):
                self._refuse(status, rollout_id)
            raise self._unexpected("put", reply)
        raise SourceUnavailable(
            f"redis store {self._where}: the stored entry of model call {call_id} of rollout "
            f"{rollout_id} kept changing during the put"
        )

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        """Record that a call of this rollout failed to capture (allowed after freeze)."""
        check_store_id(rollout_id)
        if model_call_id:
            check_store_id(model_call_id, what="model_call_id")
        reply = await self._run(
            "mark_incomplete",
            rollout_id,
            (model_call_id, self._abandoned_ms),
            "mark_incomplete",
        )
        if reply[0] == b"retired":
            CaptureState(retired=True).mark_incomplete(rollout_id)
        if reply[0] != b"ok":
            raise self._unexpected("mark_incomplete", reply)

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        """Announce a call; if its entry is missing at freeze time the snapshot is incomplete."""
        check_store_id(rollout_id)
        check_store_id(model_call_id, what="model_call_id")
        reply = await self._run(
            "begin_call", rollout_id, (model_call_id, self._abandoned_ms), "begin_call"
        )
        if reply[0] in (b"frozen", b"retired"):
            self._refuse(reply[0], rollout_id)
        if reply[0] != b"ok":
            raise self._unexpected("begin_call", reply)

    # -- finalizer side ----------------------------------------------------------------------

    async def freeze_lines(self, rollout_id: str) -> FrozenLines:
        """`freeze`, returning the entry lines as stored (the store server's fast path)."""
        reply = await self._run("freeze", rollout_id, (uuid.uuid4().hex,), "freeze")
        status = reply[0]
        if status == b"retired":
            self._refuse(status, rollout_id, freezing=True)
        if status == b"corrupt":
            raise CaptureCorrupt(
                f"redis store {self._where}: rollout {rollout_id} lists model call "
                f"{_text(reply[1])} without its entry"
            )
        if status != b"ok" or len(reply) != 5:
            raise self._unexpected("freeze", reply)
        _, snapshot_id, version, incomplete, lines = reply
        return FrozenLines(
            rollout_id=rollout_id,
            lines=tuple(lines),
            incomplete=bool(incomplete),
            snapshot_id=_text(snapshot_id),
            version=int(version),
        )

    async def freeze(self, rollout_id: str) -> Snapshot:
        """Freeze (idempotent) and read the rollout's immutable snapshot, in one script."""
        frozen = await self.freeze_lines(rollout_id)
        if sum(map(len, frozen.lines)) >= PARSE_IN_THREAD_MIN_BYTES:
            entries = await asyncio.to_thread(_entries_of, frozen.lines, rollout_id)
        else:
            entries = _entries_of(frozen.lines, rollout_id)
        return Snapshot(
            rollout_id=rollout_id,
            entries=entries,
            incomplete=frozen.incomplete,
            snapshot_id=frozen.snapshot_id,
            version=frozen.version,
        )

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        """Delete exactly that snapshot's data, keeping the state as a retired tombstone."""
        check_store_id(rollout_id)
        if isinstance(version, bool) or not isinstance(version, int):
            return False
        reply = await self._run(
            "drop", rollout_id, (str(snapshot_id), str(version), self._retired_ms), "drop"
        )
        return bool(reply)

    async def committed_entries(self, rollout_id: str) -> tuple[TokenEntry, ...]:
        """The rollout's stored entries in put order, read without freezing (one script).

        Read-only (lineage resolution of a rollout still being written); a
        retired or unknown rollout has none.
        """
        reply = await self._run("committed", rollout_id, (), "committed entries")
        if reply[0] == b"corrupt":
            raise CaptureCorrupt(
                f"redis store {self._where}: rollout {rollout_id} lists model call "
                f"{_text(reply[1])} without its entry"
            )
        if reply[0] != b"ok" or len(reply) != 2:
            raise self._unexpected("committed entries", reply)
        lines, where = reply[1], f"the capture of rollout {rollout_id}"
        if sum(map(len, lines)) >= PARSE_IN_THREAD_MIN_BYTES:
            return await asyncio.to_thread(parse_capture, lines, rollout_id, where)
        return parse_capture(lines, rollout_id, where)

    # -- administration --------------------------------------------------------------------------

    async def status(self, rollout_id: str) -> dict[str, Any] | None:
        """The stored state of one rollout, or None when nothing is stored."""
        state_pairs, digest_pairs = await self._run("status", rollout_id, (), "status")
        if not state_pairs:
            return None
        fields = _pairs(state_pairs)
        status: dict[str, Any] = {
            "frozen": _flag(fields, "frozen"),
            "retired": _flag(fields, "retired"),
            "incomplete": _flag(fields, "incomplete"),
            "snapshot_id": fields.get("snapshot_id"),
            "version": int(fields.get("version", 0)),
            "entry_digests": _pairs(digest_pairs),
        }
        for key in ("created_at", "updated_at", "frozen_at", "retired_at"):
            if key in fields:
                status[key] = float(fields[key])
        return status

    async def rollout_ids(self) -> list[str]:
        """Every rollout with a state under this key prefix (all nodes of a cluster)."""
        self._check_open("rollout_ids")
        head, tail = f"{self.key_prefix}{{ng:", "}:state"
        found: set[str] = set()
        try:
            async for raw in self._client.scan_iter(match=f"{head}*{tail}", count=_SCAN_COUNT):
                key = _text(raw)
                rollout_id = key[len(head) : -len(tail)]
                try:
                    found.add(check_store_id(rollout_id))
                except ValueError:
                    continue  # not a key of ours
        except (RedisError, OSError) as exc:
            raise self._unavailable("listing rollouts", exc) from None
        return sorted(found)

    async def delete(self, rollout_id: str) -> None:
        """Remove every key of one rollout, tombstone included (admin use only)."""
        keys = self.keys(rollout_id)
        self._check_open("delete")
        try:
            await self._client.delete(*keys)
        except (RedisError, OSError) as exc:
            raise self._unavailable(f"delete of rollout {rollout_id}", exc) from None

    async def sweep(
        self,
        *,
        retired_older_than: float,
        abandoned_older_than: float | None = None,
        empty_older_than: float | None = None,
        dry_run: bool = False,
        now: float | None = None,
    ) -> list[SweptCapture]:
        """Remove retired tombstones and, only when asked, never-frozen captures gone quiet
        and frozen captures with nothing in them (`empty_older_than`).

        Ages count from each capture's last write by the server's clock (`now`
        overrides it). Each capture is checked and removed in one script, so a
        write arriving meanwhile is never lost half-way. A frozen capture that
        was not retired is evidence and is never touched.
        """
        swept: list[SweptCapture] = []
        args = (
            repr(float(retired_older_than)),
            "" if abandoned_older_than is None else repr(float(abandoned_older_than)),
            "" if now is None else repr(float(now)),
            "1" if dry_run else "0",
            "" if empty_older_than is None else repr(float(empty_older_than)),
        )
        for rollout_id in await self.rollout_ids():
            reply = await self._run("sweep", rollout_id, args, "sweep")
            if reply:
                swept.append(SweptCapture(rollout_id, _text(reply[0]), float(_text(reply[1]))))
        return swept

    async def ping(self) -> None:
        """Raise SourceUnavailable unless the server answers PING."""
        self._check_open("ping")
        try:
            await self._client.ping()
        except (RedisError, OSError) as exc:
            raise self._unavailable("ping", exc) from None

    async def close(self) -> None:
        """Close the connection pool (a client passed in stays the caller's); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            await self._client.aclose()
