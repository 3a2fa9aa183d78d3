"""The `http` source: a remote capture store speaking protocol v1 (docs/store-protocol.md).

Finalizer side only (freeze, drop, ping, close, and the extras of staged
calls: a staging rollout's freeze answer holds its manifest and snapshots,
read by `_http_staged`). One pooled AsyncClient per
source, opened with the source and closed with it. Freeze and drop are both
safe to repeat (freeze is idempotent, drop is conditional on the exact
snapshot), so they go through the project's one retry policy,
`token_finalizer_client.transport.RetryPolicy` (transient transport errors and
502/503/504 are retried with jittered exponential backoff; any other answer
stands), with this source's own attempt count and delays; each retry is
logged as one warning naming the method and path (docs/configuration.md#logs).

Beyond plain v1 it asks a freeze's staged columns packed (`?columns=packed`)
only of a store that advertises `packed_freeze`, and a token rollout's
entries as stored (`?entries=compact`, packed records read by `_stored`
without writing their lines: O(context) for a full-prompt rollout) only of one
that advertises `compact_freeze`, at `GET /capabilities`, asked once per
source through the client package's `StoreCapabilities` (the rule every client
of ours follows; docs/store-protocol.md#extensions-and-capabilities).

Every failure is raised as a CaptureError subclass whose message says what
went wrong and where; the finalize path turns it into a masked build.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import numpy as np

from token_finalizer._constants import (
    DEFAULT_HTTP_TIMEOUT_S,
    HTTP_COMPACT_PARSE_IN_THREAD_MIN_BYTES,
    HTTP_DEADLINE_TIMEOUTS,
    HTTP_MAX_ANSWER_BYTES,
    HTTP_MAX_CONNECTIONS,
    HTTP_MAX_KEEPALIVE,
    HTTP_MAX_RETRIES,
    HTTP_PARSE_IN_THREAD_MIN_BYTES,
    HTTP_RETRY_BASE_DELAY_S,
    HTTP_RETRY_MAX_DELAY_S,
    MAX_SNAPSHOT_VERSION,
)
from token_finalizer.core.codec import (
    PromptReuse,
    loads_exact_json,
    loads_json,
    loads_with_token_arrays,
)
from token_finalizer.core.entries import Snapshot, TokenEntry
from token_finalizer.core.errors import (
    CaptureCorrupt,
    CaptureRetired,
    SourceUnavailable,
    StoreUnreachable,
    describe_exception,
)
from token_finalizer.core.identity import check_store_id
from token_finalizer.core.redaction import redact
from token_finalizer.sources._encoded_body import IDENTITY, decode_body, encoding_of
from token_finalizer.sources._http_staged import STAGED_KIND, extras_of, staged_snapshot
from token_finalizer.sources._packed import is_packed
from token_finalizer.sources._stored import StoredEntries
from token_finalizer.sources.base import MemoryHealth, StagedExtras
from token_finalizer_client.protocol import rollout_path
from token_finalizer_client.transport import (
    CAPABILITIES_PATH,
    COMPACT_FREEZE,
    PACKED_FREEZE,
    REFUSED_EXTENSION_STATUSES,
    RETRY_STATUSES,
    RetryPolicy,
    StoreCapabilities,
    StoreEndpoint,
    is_retryable_error,
    trace_headers,
)

__all__ = ["HttpTokenSource"]

# Asked with every freeze of a store advertising the feature: packed_freeze
# (docs/staging.md#packed-columns), compact_freeze (docs/store-protocol.md#compact-freeze).
_FREEZE_PARAMS = {PACKED_FREEZE: ("columns", "packed"), COMPACT_FREEZE: ("entries", "compact")}
# How a store server's freeze answer of a staging rollout starts (after the rollout id).
_STAGED_HEAD = b'"kind":"staged"'
_HEAD_BYTES = 512


def _loads_freeze(data: bytes, prompts: PromptReuse) -> Any:
    """A freeze answer parsed: token entries' id arrays by numpy, a staging rollout plainly.

    A staging rollout's answer holds no entries (its columns come packed), so
    the scan for entry arrays is skipped; either parse gives the same value.
    """
    if _STAGED_HEAD in data[:_HEAD_BYTES]:
        return loads_exact_json(data, allow_non_finite=True)
    return loads_with_token_arrays(data, prompts=prompts)


_T = TypeVar("_T")
# A store server's /health statuses that concern its memory, not its reach: such a
# store answers freezes and retires (docs/capacity.md).
_MEMORY_STATUSES = frozenset({"memory_full", "captures_evicted", "eviction_policy"})
# How much of an unhealthy store's reason /ready repeats; the largest /health body read.
_HEALTH_REASON_CHARS = 500
_HEALTH_BODY_BYTES = 64 * 1024


def _memory_of(response: httpx.Response) -> MemoryHealth | None:
    """What a store server's /health says of its memory (docs/store-protocol.md#health)."""
    if response.status_code not in (200, 503) or len(response.content) > _HEALTH_BODY_BYTES:
        return None
    try:
        body = loads_json(response.content)
    except ValueError:
        return None
    memory = body.get("memory") if isinstance(body, dict) else None
    if not isinstance(memory, dict):
        return None
    status = body.get("status")
    if response.status_code == 200:
        return MemoryHealth(None, memory)
    if status not in _MEMORY_STATUSES:
        return None
    evicted = _exactly(body.get("evicted_keys"), int) or 0
    return MemoryHealth(str(status), memory, evicted)


def _exactly(value: object, kind: type[_T]) -> _T | None:
    """`value` when it is a `kind` (a JSON boolean is no int here), else None."""
    if isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
        return value
    return None


_TOKEN_ARRAYS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


def _same_entry(first: TokenEntry, other: TokenEntry) -> bool:
    """Whether two parsed entries hold the same payload (token arrays compared as arrays)."""
    for name in _TOKEN_ARRAYS:
        if not np.array_equal(getattr(first, name), getattr(other, name), equal_nan=True):
            return False
    rest, other_rest = first.to_dict(as_lists=False), other.to_dict(as_lists=False)
    for name in _TOKEN_ARRAYS:
        del rest[name], other_rest[name]
    return bool(rest == other_rest)


def _record_of(entry: str) -> bytes:
    """A compact freeze answer's packed record, decoded; CaptureCorrupt if it is none."""
    try:
        record = base64.b64decode(entry, validate=True)
    except ValueError as exc:  # binascii.Error, or a string beyond ASCII
        raise CaptureCorrupt(f"not base64: {exc}") from None
    if not is_packed(record):
        raise CaptureCorrupt("not a packed record")
    return record


@dataclass(frozen=True, slots=True)
class _Answer:
    """One HTTP answer, its body still compressed when the server compressed it."""

    status_code: int
    headers: Mapping[str, str]
    raw: bytes
    encoding: str

    @property
    def compressed(self) -> bool:
        return self.encoding != IDENTITY

    def body(self) -> bytes:
        """The decoded body; CodecError when it does not decode or passes the size limit."""
        return decode_body(self.raw, self.encoding, limit=HTTP_MAX_ANSWER_BYTES)

    def error_text(self) -> str:
        """The server's `error` message, else the start of its body."""
        try:
            body = self.body()
        except ValueError:
            return "(a body that does not decode)"
        try:
            data = loads_json(body)
        except ValueError:
            data = None
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, str):
            return error
        return body[:200].decode("utf-8", "replace").strip() or "(empty body)"


class HttpTokenSource:
    """TokenSource over a remote capture store (protocol v1)."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout_s: float = DEFAULT_HTTP_TIMEOUT_S,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        max_retries: int = HTTP_MAX_RETRIES,
        deadline_s: float | None = None,
    ) -> None:
        # The store's headers (bearer token, zstd), timeouts and pool limits are set
        # up as the client package's sink does; ValueError for a bad argument.
        endpoint = StoreEndpoint.create(
            url,
            token=token,
            timeout_s=timeout_s,
            max_connections=HTTP_MAX_CONNECTIONS,
            max_keepalive=HTTP_MAX_KEEPALIVE,
            accept_encoding="zstd",  # kept compressed here, decoded off the event loop
        )
        # Shown in messages, /ready and logs: never the credentials a URL may hold.
        # (The endpoint's own URL holds none: its user info goes out as Basic auth.)
        self.url = redact(url.rstrip("/"))
        # The whole of one freeze (all tries, all bytes); see docs/configuration.md.
        self.deadline_s = deadline_s or timeout_s * HTTP_DEADLINE_TIMEOUTS
        self._retry = RetryPolicy(
            max_retries, base_delay_s=HTTP_RETRY_BASE_DELAY_S, max_delay_s=HTTP_RETRY_MAX_DELAY_S
        )
        self.max_retries = max_retries
        self._client = endpoint.open(transport)
        self._closed = False
        self._memory: MemoryHealth | None = None
        self._capabilities = StoreCapabilities()

    def __repr__(self) -> str:  # never shows the token
        return f"HttpTokenSource(url={self.url!r})"

    async def __aenter__(self) -> HttpTokenSource:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- transport -----------------------------------------------------------

    async def _exchange(self, method: str, path: str, **kwargs: Any) -> _Answer:
        # The finalize's trace goes on into the store (docs/tracing.md).
        request = self._client.build_request(method, path, headers=trace_headers(), **kwargs)
        response = await self._client.send(request, stream=True)
        try:
            # Every body is read as sent: a compressed one is decoded later in one
            # pass under the size limit, off the event loop (`_encoded_body`), so a
            # gzip bomb fails as fast as a zstd one instead of expanding while read.
            encoding = encoding_of(response.headers.get("content-encoding"))
            parts: list[bytes] = []
            size = 0
            async for chunk in response.aiter_raw():
                parts.append(chunk)
                size += len(chunk)
                if size > HTTP_MAX_ANSWER_BYTES:
                    raise SourceUnavailable(
                        f"capture store {self.url} sent an answer over "
                        f"{HTTP_MAX_ANSWER_BYTES} bytes to {method} {path}"
                    )
            return _Answer(response.status_code, response.headers, b"".join(parts), encoding)
        finally:
            await response.aclose()

    async def _send(self, method: str, path: str, what: str, **kwargs: Any) -> _Answer:
        """One logical call: retried on transient failures, raised as SourceUnavailable."""
        if self._closed:
            raise SourceUnavailable(f"the http source for {self.url} is closed")
        try:
            return await self._retry.acall(
                lambda: self._exchange(method, path, **kwargs), method=method, path=path
            )
        except httpx.HTTPError as exc:
            if is_retryable_error(exc):
                raise StoreUnreachable(
                    f"capture store {self.url} did not answer {what} "
                    f"after {self._retry.attempts} attempt(s): {describe_exception(exc)}"
                ) from None
            # E.g. a body that fails to decode: not transient.
            raise SourceUnavailable(
                f"capture store {self.url} answered {what} unreadably: {describe_exception(exc)}"
            ) from None

    def _check_status(self, answer: _Answer, what: str) -> None:
        """Raise for anything but a 200: CaptureRetired for 409, else SourceUnavailable."""
        status = answer.status_code
        if status == 200:
            return
        if status == 409:
            raise CaptureRetired(f"capture store {self.url}: {answer.error_text()}")
        if status in (401, 403):
            reason = "refused the bearer token"
        elif status in RETRY_STATUSES:
            reason = f"was unavailable after {self._retry.attempts} attempt(s)"
        elif status == 404:
            reason = "has no such protocol v1 path (is the url right?)"
        else:
            reason = "failed"
        # A store that says it cannot serve now was not changed by the call.
        error = StoreUnreachable if status in RETRY_STATUSES else SourceUnavailable
        raise error(
            f"capture store {self.url} {reason}: {what} answered HTTP {status}: "
            f"{answer.error_text()}"
        )

    # -- negotiated extensions ------------------------------------------------

    async def _probe_capabilities(self) -> tuple[int, bytes]:
        # One try within one deadline: no answer means plain v1 for this call.
        if self._closed:
            raise SourceUnavailable(f"the http source for {self.url} is closed")
        async with asyncio.timeout(self.deadline_s):
            answer = await self._exchange("GET", CAPABILITIES_PATH)
        return answer.status_code, answer.body()

    async def _supports(self, feature: str) -> bool:
        """Whether the store advertises `feature` (asked once per source, then kept)."""
        return await self._capabilities.asupports(feature, self._probe_capabilities)

    async def _freeze_params(self) -> dict[str, str]:
        """The query of a freeze: each freeze extension the store advertises."""
        params = {}
        for feature, (name, value) in _FREEZE_PARAMS.items():
            if await self._supports(feature):
                params[name] = value
        return params

    # -- TokenSource -----------------------------------------------------------

    async def _within_deadline(self, method: str, path: str, what: str, **kwargs: Any) -> _Answer:
        try:
            # One deadline for the whole call, retries and every byte included:
            # a store trickling its answer cannot hold a finalize for long.
            async with asyncio.timeout(self.deadline_s):
                return await self._send(method, path, what, **kwargs)
        except TimeoutError:
            raise StoreUnreachable(
                f"capture store {self.url} did not finish the {what} within {self.deadline_s}s"
            ) from None

    async def freeze(self, rollout_id: str) -> Snapshot:
        """Freeze the rollout in the remote store and return its snapshot."""
        path = rollout_path(check_store_id(rollout_id), "freeze")
        what = f"freeze of rollout {rollout_id}"
        # A staging rollout's token columns come packed, and a token rollout's
        # entries as stored, where the store says it can: decoded by numpy here,
        # not parsed number by number.
        params = await self._freeze_params()
        answer = await self._within_deadline("POST", path, what, params=params or None)
        if params and answer.status_code in REFUSED_EXTENSION_STATUSES:
            # Perhaps no longer the store that advertised them: ask again, and freeze
            # once more with what it still advertises if that is less (a freeze is
            # idempotent).
            self._capabilities.forget()
            again = await self._freeze_params()
            if again != params:
                params = again
                answer = await self._within_deadline("POST", path, what, params=params or None)
        self._check_status(answer, f"freeze of rollout {rollout_id}")
        # A compact answer is dense: read in a thread from a smaller size.
        compact = "entries" in params
        large = (
            HTTP_COMPACT_PARSE_IN_THREAD_MIN_BYTES if compact else HTTP_PARSE_IN_THREAD_MIN_BYTES
        )
        if answer.compressed or len(answer.raw) >= large:
            # Decoding and parsing a large snapshot would stall the event loop (and
            # a compressed body is small on the wire whatever its decoded size).
            return await asyncio.to_thread(self._snapshot, answer, rollout_id)
        return self._snapshot(answer, rollout_id)

    def _parsed(self, answer: _Answer, what: str, loads: Callable[[bytes], Any]) -> Any:
        try:
            return loads(answer.body())
        except ValueError as exc:
            raise SourceUnavailable(
                f"capture store {self.url}: {what} is not readable JSON ({exc})"
            ) from None
        except MemoryError as exc:  # too large to parse here (`core.address_space`): masked
            raise SourceUnavailable(
                f"capture store {self.url}: {what} of {len(answer.raw)} bytes does not fit "
                f"in memory: {exc or 'out of memory'}"
            ) from None

    def _snapshot(self, answer: _Answer, rollout_id: str) -> Snapshot:
        what = f"the freeze answer for rollout {rollout_id}"
        prompts = PromptReuse()  # one capture: each prompt parsed by what it adds
        body = self._parsed(answer, what, lambda data: _loads_freeze(data, prompts))
        if not isinstance(body, dict):
            raise SourceUnavailable(f"capture store {self.url}: {what} is not a JSON object")
        if body.get("rollout_id") != rollout_id:
            raise SourceUnavailable(
                f"capture store {self.url}: {what} names rollout {body.get('rollout_id')!r}"
            )
        kind = body.get("kind", "entries")
        if kind not in ("entries", STAGED_KIND):
            raise SourceUnavailable(f"capture store {self.url}: {what} is of unknown kind {kind!r}")
        entries = _exactly(body.get("entries"), list)
        snapshot_id = _exactly(body.get("snapshot_id"), str) or None  # "" names no snapshot
        version = _exactly(body.get("version"), int)
        if version is not None and not 0 <= version <= MAX_SNAPSHOT_VERSION:
            version = None  # a ticket (orjson) holds 64 bits: 2**70 is no version
        incomplete = _exactly(body.get("incomplete"), bool)
        if entries is None or snapshot_id is None or version is None or incomplete is None:
            fields = {
                "entries": entries,
                "snapshot_id": snapshot_id,
                "version": version,
                "incomplete": incomplete,
            }
            problems = [name for name, value in fields.items() if value is None]
            raise SourceUnavailable(
                f"capture store {self.url}: {what} has no valid {', '.join(problems)}"
            )
        if kind == STAGED_KIND:
            where = f"capture store {self.url}: {what}"
            return staged_snapshot(body, rollout_id, snapshot_id, version, where)
        # TokenEntryError (a newer schema, a bad field) propagates as it is.
        if any(isinstance(entry, str) for entry in entries):
            parsed = self._stored_entries(entries, what)
        else:
            parsed = tuple(TokenEntry.from_dict(entry) for entry in entries)
        self._check_entries(parsed, rollout_id, what)
        return Snapshot(
            rollout_id=rollout_id,
            entries=parsed,
            incomplete=incomplete,
            snapshot_id=snapshot_id,
            version=version,
        )

    def _stored_entries(self, entries: list[Any], what: str) -> tuple[TokenEntry, ...]:
        """The entries of a compact freeze answer (docs/store-protocol.md#compact-freeze):
        a string is a packed record in base64, read with the ids of the entries before it;
        an object a plain entry."""
        reader = StoredEntries(in_snapshot=True)
        parsed: list[TokenEntry] = []
        for index, entry in enumerate(entries):
            if not isinstance(entry, str):
                parsed.append(reader.entry(TokenEntry.from_dict(entry)))
                continue
            try:
                parsed.append(reader.record(_record_of(entry)))
            except CaptureCorrupt as exc:
                raise SourceUnavailable(
                    f"capture store {self.url}: {what} holds an unreadable packed entry "
                    f"(entries[{index}]): {exc}"
                ) from None
        return tuple(parsed)

    def _check_entries(self, entries: tuple[TokenEntry, ...], rollout_id: str, what: str) -> None:
        strangers = sorted({e.rollout_id for e in entries if e.rollout_id != rollout_id})
        if strangers:
            raise SourceUnavailable(
                f"capture store {self.url}: {what} holds entries of rollout(s) "
                f"{', '.join(strangers)}"
            )
        # A line the store holds twice (a relay re-sent it) is listed twice, the
        # same both times; two different payloads of one call are the store's fault.
        first: dict[str, TokenEntry] = {}
        differing = set()
        for entry in entries:
            kept = first.setdefault(entry.model_call_id, entry)
            if kept is not entry and not _same_entry(kept, entry):
                differing.add(entry.model_call_id)
        if differing:
            raise SourceUnavailable(
                f"capture store {self.url}: {what} lists model call(s) "
                f"{', '.join(sorted(differing))} twice, with different payloads"
            )

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        """Retire exactly that snapshot in the remote store."""
        path = rollout_path(check_store_id(rollout_id), "drop")
        what = f"drop of rollout {rollout_id}"
        answer = await self._send(
            "POST", path, what, json={"snapshot_id": snapshot_id, "version": version}
        )
        self._check_status(answer, what)
        body = self._parsed(answer, f"the {what} answer", loads_json)
        dropped = body.get("dropped") if isinstance(body, dict) else None
        if not isinstance(dropped, bool):
            raise SourceUnavailable(
                f"capture store {self.url}: the {what} answer is not {{'dropped': bool}}"
            )
        return dropped

    async def fetch_extras(self, rollout_id: str, call_ids: Sequence[str]) -> StagedExtras:
        """The extras of these staged calls (`POST staged/extras`); a call not staged is absent."""
        ids = list(call_ids)
        if not ids:
            return {}
        path = rollout_path(check_store_id(rollout_id), "staged/extras")
        what = f"extras of rollout {rollout_id}"
        answer = await self._within_deadline("POST", path, what, json={"keys": ids})
        self._check_status(answer, what)
        where = f"capture store {self.url}: the {what}"
        if answer.compressed or len(answer.raw) >= HTTP_PARSE_IN_THREAD_MIN_BYTES:
            body = await asyncio.to_thread(self._parsed, answer, where, loads_json)
        else:
            body = self._parsed(answer, where, loads_json)
        return extras_of(body, ids, where)

    async def ping(self) -> None:
        """Raise SourceUnavailable unless `GET {url}/health` answers 200 (not retried).

        A 503 about the store's memory (`memory_full`, `captures_evicted`,
        `eviction_policy`) is no refusal: the store is reachable, and
        `memory_health` repeats what it said.
        """
        if self._closed:
            raise SourceUnavailable(f"the http source for {self.url} is closed")
        try:
            response = await self._client.get("/health", headers=trace_headers())
        except httpx.HTTPError as exc:
            raise SourceUnavailable(
                f"capture store {self.url} is unreachable: {describe_exception(exc)}"
            ) from None
        self._memory = _memory_of(response)
        if response.status_code != 200 and (self._memory is None or self._memory.status is None):
            # The store's own reason (its Redis down, its directory gone), cut short.
            answer = _Answer(response.status_code, response.headers, response.content, IDENTITY)
            reason = redact(answer.error_text())[:_HEALTH_REASON_CHARS]
            raise SourceUnavailable(
                f"capture store {self.url} is not healthy: /health answered "
                f"HTTP {response.status_code}: {reason}"
            )

    async def memory_health(self) -> MemoryHealth | None:
        """The memory the store server's /health reported at the last ping, if any."""
        return self._memory

    async def close(self) -> None:
        """Close the connection pool; safe to call twice."""
        if not self._closed:
            self._closed = True
            await self._client.aclose()
