"""`HttpTokenSource`: NeMo Gym 0.7's `TokenSource` over a remote capture store (protocol v1).

Gym 0.7 can finalize a rollout in its own process: its rollout collection
freezes the capture through the `TokenSource` installed there, rebuilds the
response, then retires the snapshot (docs/gym-in-process.md). This class is
that source over our store server, in the finalizer role:

    source = HttpTokenSource("http://capture-store:8100", token=FINALIZER_TOKEN)
    install_token_source(source)                # Gym's own hook
    snapshot = await source.freeze("3-0")       # Gym's TokenCaptureSnapshot
    await source.drop("3-0", snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    await source.close()

Only plain protocol v1 is spoken (`POST .../freeze` without a body or a
query, `POST .../drop`), so any v1 store serves it. With `nemo_gym`
importable (loaded already, or importable on the first freeze) `freeze`
returns Gym's `TokenCaptureSnapshot` holding Gym's `TokenEntry` models
(token ids as plain lists), which Gym's builder, consumer and conformance
checks require; without Gym, this package's `SourceSnapshot` of
`SourceEntry` (`_source_types`), the same fields under the same names.

Both calls are safe to repeat (freeze is idempotent, drop conditional on the
exact snapshot), so both go through the package's one retry policy. A
retired rollout's freeze raises `ConflictError` (409); a staging rollout
(external staging keeps no token entries) raises `InvalidAnswerError`: read
it with `HttpStagingSource`. Like every asyncio client object here it works
from any event loop (`_loop_pools`).
"""

from __future__ import annotations

from typing import Any

import httpx

from token_finalizer_client._addressing import check_rollout_id, rollout_path
from token_finalizer_client._constants import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_STORE_MAX_CONNECTIONS,
    DEFAULT_STORE_MAX_KEEPALIVE,
    DEFAULT_STORE_TIMEOUT_S,
)
from token_finalizer_client._exceptions import InvalidAnswerError
from token_finalizer_client._gym_types import GYM_PROTOCOLS, GYM_RECORDS, gym_class
from token_finalizer_client._source_types import SourceSnapshot, source_entry
from token_finalizer_client._store_connection import StoreConnection
from token_finalizer_client._wire import WireRequest, read_object

__all__ = ["HttpTokenSource"]


def _gym_snapshot(answer: dict[str, Any], entries: list[Any]) -> Any | None:
    """Gym's snapshot of Gym's entries, or None when Gym cannot be imported."""
    entry_type = gym_class(GYM_RECORDS, "TokenEntry", load=True)
    snapshot_type = gym_class(GYM_PROTOCOLS, "TokenCaptureSnapshot", load=True)
    if entry_type is None or snapshot_type is None:
        return None
    validate = getattr(entry_type, "model_validate")  # noqa: B009 (pydantic's, typed Any here)
    try:
        gym_entries = tuple(validate(entry) for entry in entries)
    except ValueError as exc:  # pydantic's ValidationError
        raise InvalidAnswerError(f"a frozen entry is not Gym's TokenEntry: {exc}") from None
    return snapshot_type(
        rollout_id=answer["rollout_id"],
        entries=gym_entries,
        incomplete=answer["incomplete"],
        snapshot_id=answer["snapshot_id"],
        version=answer["version"],
    )


def _checked(answer: dict[str, Any], rollout_id: str) -> list[Any]:
    """The entries of a freeze answer, its other fields checked; InvalidAnswerError if not one."""
    if answer.get("kind") == "staged":
        raise InvalidAnswerError(
            f"rollout {rollout_id} is captured by external staging: "
            "it holds no token entries (read it with HttpStagingSource)"
        )
    entries, version = answer.get("entries"), answer.get("version")
    if answer.get("rollout_id") != rollout_id or not isinstance(entries, list):
        raise InvalidAnswerError(f"the freeze answer is not this rollout's: {answer!r:.200}")
    if not all(isinstance(entry, dict) for entry in entries):
        raise InvalidAnswerError("the freeze answer holds an entry that is not an object")
    snapshot_id = answer.get("snapshot_id")
    if not isinstance(snapshot_id, str) or not snapshot_id:
        raise InvalidAnswerError("the freeze answer has no snapshot_id")
    if not isinstance(version, int) or isinstance(version, bool):
        raise InvalidAnswerError("the freeze answer's version is not an integer")
    if not isinstance(answer.get("incomplete"), bool):
        raise InvalidAnswerError("the freeze answer's incomplete is not a boolean")
    return entries


class HttpTokenSource(StoreConnection):
    """NeMo Gym 0.7 `TokenSource` over a remote capture store (see the module docstring)."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float = DEFAULT_STORE_TIMEOUT_S,
        *,
        max_retries: int = DEFAULT_MAX_RETRIES,
        max_connections: int = DEFAULT_STORE_MAX_CONNECTIONS,
        max_keepalive: int = DEFAULT_STORE_MAX_KEEPALIVE,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(
            url=url,
            token=token,
            timeout=timeout,
            max_retries=max_retries,
            max_connections=max_connections,
            max_keepalive=max_keepalive,
            transport=transport,
        )

    async def __aenter__(self) -> HttpTokenSource:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def freeze(self, rollout_id: str) -> Any:
        """Freeze the rollout and return its one atomic snapshot (idempotent).

        Gym's `TokenCaptureSnapshot` of Gym's `TokenEntry` models when Gym is
        importable, else a `SourceSnapshot`. ConflictError once retired.
        """
        path = rollout_path(rollout_id, "freeze")
        answer = read_object(await self._call(WireRequest("POST", path)))
        entries = _checked(answer, rollout_id)
        gym = _gym_snapshot(answer, entries)
        if gym is not None:
            return gym
        return SourceSnapshot(
            rollout_id=rollout_id,
            entries=tuple(source_entry(entry) for entry in entries),
            incomplete=answer["incomplete"],
            snapshot_id=answer["snapshot_id"],
            version=answer["version"],
        )

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        """Retire exactly the consumed snapshot: True once retired, False if the state moved on."""
        check_rollout_id(rollout_id)
        if not isinstance(snapshot_id, str) or not snapshot_id:
            raise ValueError(f"snapshot_id must be a non-empty string, got {snapshot_id!r:.80}")
        if not isinstance(version, int) or isinstance(version, bool):
            raise ValueError(f"version must be an integer, got {version!r:.80}")
        body = {"snapshot_id": snapshot_id, "version": version}
        path = rollout_path(rollout_id, "drop")
        answer = read_object(await self._call(WireRequest.json("POST", path, body)))
        dropped = answer.get("dropped")
        if not isinstance(dropped, bool):
            raise InvalidAnswerError(f"the drop answer is not {{'dropped': bool}}: {answer!r:.200}")
        return dropped
