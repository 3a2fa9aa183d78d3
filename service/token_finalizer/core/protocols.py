"""The TokenSource (finalizer side) and TokenSink (writer side) protocols.

A training framework may hand the delivery functions any object with these
methods; the project's own sources (memory, file, http) all implement both
sides except the http source, which is read-side only. A source whose
freeze can answer an externally staged rollout also implements
`ExtrasSource` (every source of the project does): the staged build reads
the extras of the verified chain through it (docs/staging.md#finalize-and-retire).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from token_finalizer.core.entries import Snapshot, TokenEntry

__all__ = ["AddressedSource", "ExtrasSource", "TokenSink", "TokenSource"]


@runtime_checkable
class TokenSource(Protocol):
    """Where a finished rollout's capture is frozen, read and retired."""

    async def freeze(self, rollout_id: str) -> Snapshot:
        """Freeze the rollout (idempotent) and return its immutable snapshot."""
        ...

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        """Retire exactly that snapshot; False when the store moved on since."""
        ...

    async def close(self) -> None:
        """Release resources; safe to call twice."""
        ...


@runtime_checkable
class TokenSink(Protocol):
    """Where model servers record each call's tokens while a rollout runs."""

    async def put(self, entry: TokenEntry | Mapping[str, Any]) -> None:
        """Store one call; same payload again is a no-op, a different one an error."""
        ...

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        """Record that a call of this rollout failed to capture."""
        ...

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        """Announce a call; a snapshot missing its entry is incomplete."""
        ...

    async def close(self) -> None:
        """Release resources; safe to call twice."""
        ...


@runtime_checkable
class ExtrasSource(Protocol):
    """Where the extras of a frozen staging rollout's calls are read."""

    async def fetch_extras(
        self, rollout_id: str, call_ids: Sequence[str]
    ) -> Mapping[str, Mapping[str, Any] | None]:
        """Each staged call's extras (None: it staged none); a call not staged is absent."""
        ...


@runtime_checkable
class AddressedSource(Protocol):
    """A source an operator's `token-finalizer store` commands can name (file, redis)."""

    @property
    def store_option(self) -> str:
        """The options naming this store to `token-finalizer store` (`--dir PATH`,
        `--redis URL`, credentials left out); quoted for a shell."""
        ...
