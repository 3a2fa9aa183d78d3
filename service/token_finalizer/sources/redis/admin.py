"""The redis store's admin: status, inspect, delete, sweep and listing, one script per rollout.

Ages count from each capture's last write by the server's clock, so they
agree across machines. Each capture is checked and removed by one script, so
a write arriving meanwhile is never lost half-way. A rollout whose keys
cannot be read (a key of the wrong type, say) is skipped and reported by a
sweep; the rest is swept all the same. See docs/store-protocol.md#sweep.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from token_finalizer.core.errors import (
    CaptureError,
    InvalidRolloutId,
    StoreUnreachable,
    describe_exception,
)
from token_finalizer.core.identity import check_store_id
from token_finalizer.sources._state import CaptureState
from token_finalizer.sources.base import (
    CaptureReport,
    Skipped,
    SweepReport,
    SweepRules,
    SweptCapture,
)
from token_finalizer.sources.redis._client import RedisConnection, text
from token_finalizer.sources.redis.staging import RedisStaging

__all__ = ["RedisStoreAdmin"]

_TIMES = ("created_at", "updated_at", "frozen_at", "retired_at")


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    return {text(flat[i]): text(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}


def _state(fields: Mapping[str, str], digests: Mapping[str, str]) -> CaptureState:
    """The state machine's view of a state hash; timestamps are kept as extras."""
    return CaptureState(
        frozen=fields.get("frozen") == "1",
        retired=fields.get("retired") == "1",
        incomplete=fields.get("incomplete") == "1",
        snapshot_id=fields.get("snapshot_id"),
        version=int(fields.get("version", 0)),
        entry_digests=dict(digests),
        extra={key: float(fields[key]) for key in _TIMES if key in fields},
    )


def _seconds(value: float | None) -> str:
    return "" if value is None else repr(float(value))


class RedisStoreAdmin:
    """StoreAdmin over a redis store's connection."""

    def __init__(
        self,
        redis: RedisConnection,
        staging: RedisStaging,
        on_removed: Callable[[str], None] | None = None,
    ) -> None:
        self._redis = redis
        self._staging = staging
        # Told the id of each capture this admin removes (the store drops its cached chains).
        self._on_removed = on_removed or (lambda rollout_id: None)

    async def status(self, rollout_id: str) -> CaptureState | None:
        """The stored state of one rollout, or None when nothing is stored."""
        state_pairs, digest_pairs = await self._redis.run("status", rollout_id, (), "status")
        if not state_pairs:
            return None
        return _state(_pairs(state_pairs), _pairs(digest_pairs))

    async def inspect(self, rollout_id: str) -> CaptureReport | None:
        """One capture's report, read in one script; None when nothing is stored."""
        state_pairs, entries, failed, missing, announced, present = await self._redis.run(
            "inspect", rollout_id, (), "inspect"
        )
        if not state_pairs:
            return None
        state = _state(_pairs(state_pairs), {})
        # Only the keys Redis holds (a capture never has every part: no staging, no lineage).
        keys = self._redis.keys(rollout_id)
        existing = [keys[int(position) - 1] for position in present]
        details: dict[str, Any] = {"keys": existing, **state.extra}
        return CaptureReport.of_state(
            rollout_id,
            "redis",
            state,
            entries=int(entries),
            incomplete_call_ids=tuple(sorted(map(text, failed))),
            missing_call_ids=tuple(sorted(map(text, missing))),
            announced_calls=int(announced),
            details=details,
            staging=await self._staging.report(rollout_id),
        )

    async def delete(self, rollout_id: str) -> tuple[str, ...]:
        """Remove every key of one rollout, tombstone included; the key names removed."""
        removed = await self._redis.run("delete", rollout_id, (), "delete")
        self._on_removed(rollout_id)
        return tuple(text(key) for key in removed)

    async def rollout_ids(self) -> list[str]:
        """Every rollout with a state under this key prefix (all nodes of a cluster)."""
        found: set[str] = set()
        async for rollout_id in self._redis.scan_rollout_ids():
            try:
                found.add(check_store_id(rollout_id))
            except InvalidRolloutId:
                continue  # not a key of ours
        return sorted(found)

    async def sweep(
        self, rules: SweepRules, *, dry_run: bool = False, now: float | None = None
    ) -> SweepReport:
        """Remove what `rules` select, each capture checked and removed in one script."""
        args = (
            repr(float(rules.retired_older_than)),
            _seconds(rules.abandoned_older_than),
            _seconds(now),
            "1" if dry_run else "0",
            _seconds(rules.empty_older_than),
        )
        swept: list[SweptCapture] = []
        skipped: list[Skipped] = []
        for rollout_id in await self.rollout_ids():
            try:
                reply = await self._redis.run("sweep", rollout_id, args, "sweep")
            except StoreUnreachable:
                raise  # the store went away: nothing more can be swept now
            except CaptureError as exc:
                # One capture the script cannot read (a key of another type under our
                # names) must not stop the sweep of every other one.
                skipped.append(Skipped(rollout_id, describe_exception(exc)))
                continue
            if reply:
                swept.append(SweptCapture(rollout_id, text(reply[0]), float(text(reply[1]))))
                if not dry_run:
                    self._on_removed(rollout_id)
        return SweepReport(captures=tuple(swept), skipped=tuple(skipped))
