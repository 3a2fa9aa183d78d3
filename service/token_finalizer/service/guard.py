"""The per-run mask-fraction guard (docs/configuration.md#guard).

A harness whose captures mostly fail keeps producing masked, token-less
records; the guard stops it. Per run (the `X-Run-Id` header, a default run
otherwise) it counts the records that got a build and how many of those were
masked, by reason. Once at least `mask_fraction_min_samples` were finalized
and the masked fraction exceeds `max_mask_fraction`, the crossing call and
every later call of that run are refused with 409. Refusing loses nothing:
masked captures are never retired, and later calls are refused before any
freeze.

One interface (`RunGuard`), two implementations:

- `MaskFractionGuard` keeps the counts in this process (each worker and each
  replica counts on its own); it remembers the last `GUARD_MAX_RUNS` runs.
- `RedisMaskFractionGuard` (service/redis_guard.py), chosen by
  `guard: {redis: URL}`, keeps them in Redis, so every worker of every
  replica counts into, and refuses on, the same totals.

`guard_setup.open_guard` picks one from the settings.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from token_finalizer._constants import GUARD_MAX_RUNS
from token_finalizer.core.build import Build
from token_finalizer.service.errors import MaskFractionExceeded, ServiceError

__all__ = [
    "MAX_RUN_ID_LENGTH",
    "InvalidRunId",
    "MaskFractionGuard",
    "RunGuard",
    "check_run_id",
    "counted_reason",
    "mask_fraction_refusal",
]

# Longest run id (X-Run-Id, --run-id) accepted, in characters: the guard
# remembers runs by id (GUARD_MAX_RUNS of them in a process, a Redis key each
# with a shared guard), so an id must not be able to hold unbounded memory.
MAX_RUN_ID_LENGTH: Final = 256
# The reason a masked build without one is counted under (typed builds always
# carry one; the label only keeps the counts whole if that ever changes).
UNKNOWN_REASON: Final = "unknown"


class InvalidRunId(ServiceError):
    """A run id longer than MAX_RUN_ID_LENGTH (400): nothing was frozen or counted."""


def check_run_id(run_id: str) -> str:
    """Return `run_id`, or raise InvalidRunId when it is too long to be remembered."""
    if len(run_id) > MAX_RUN_ID_LENGTH:
        raise InvalidRunId(
            f"X-Run-Id is {len(run_id)} characters long; at most {MAX_RUN_ID_LENGTH} are accepted",
            max_length=MAX_RUN_ID_LENGTH,
        )
    return run_id


def mask_fraction_refusal(
    run_id: str,
    max_mask_fraction: float | None,
    *,
    finalized: int,
    masked: int,
    reasons: Mapping[str, int],
) -> MaskFractionExceeded:
    """The 409 of a tripped run, with its counts (the same words for both guards)."""
    return MaskFractionExceeded(
        f"run {run_id!r} masked {masked} of {finalized} finalized records, "
        f"more than token_id_capture.max_mask_fraction={max_mask_fraction}; "
        "stop collecting and fix token capture",
        finalized=finalized,
        masked=masked,
        reasons=dict(reasons),
    )


def counted_reason(build: Build) -> str:
    """The label a masked build is counted under: its reason's plain string value."""
    return UNKNOWN_REASON if build.mask_reason is None else str(build.mask_reason)


def crosses(finalized: int, masked: int, max_mask_fraction: float, min_samples: int) -> bool:
    """Whether these counts trip the guard (the Redis guard's Lua script decides the same)."""
    return finalized >= min_samples and masked / finalized > max_mask_fraction


class RunGuard(Protocol):
    """What finalizing needs from a mask-fraction guard, wherever it keeps its counts."""

    @property
    def enabled(self) -> bool:
        """False when no `max_mask_fraction` is configured: nothing is counted."""
        ...

    async def check(self, run_id: str) -> None:
        """Raise the 409 when this run already crossed the threshold (before any work).

        Raises InvalidRunId for a run id longer than MAX_RUN_ID_LENGTH, enabled or not.
        """
        ...

    async def observe(self, run_id: str, build: Build | None) -> None:
        """Count one finalize result; raise the 409 when this call crosses the threshold."""
        ...

    async def probe(self) -> dict[str, Any] | None:
        """What /ready reports of where the counts live (None: in this process, nothing to
        reach); reported only, never a reason for /ready to fail (the guard fails open)."""
        ...

    async def aclose(self) -> None:
        """Release connections; idempotent."""
        ...


@dataclass(slots=True)
class _RunCounts:
    finalized: int = 0
    masked: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    tripped: bool = False


class MaskFractionGuard:
    """Counts builds per run in this process and refuses a run once too many were masked."""

    def __init__(
        self, max_mask_fraction: float | None, min_samples: int, *, max_runs: int = GUARD_MAX_RUNS
    ) -> None:
        self.max_mask_fraction = max_mask_fraction
        self.min_samples = min_samples
        self._max_runs = max_runs
        self._runs: OrderedDict[str, _RunCounts] = OrderedDict()

    @property
    def enabled(self) -> bool:
        """False when no `max_mask_fraction` is configured: nothing is counted."""
        return self.max_mask_fraction is not None

    def _counts(self, run_id: str) -> _RunCounts:
        counts = self._runs.get(run_id)
        if counts is None:
            counts = self._runs[run_id] = _RunCounts()
            if len(self._runs) > self._max_runs:
                self._runs.popitem(last=False)
        else:
            self._runs.move_to_end(run_id)
        return counts

    def _refusal(self, run_id: str, counts: _RunCounts) -> MaskFractionExceeded:
        return mask_fraction_refusal(
            run_id,
            self.max_mask_fraction,
            finalized=counts.finalized,
            masked=counts.masked,
            reasons=counts.reasons,
        )

    async def check(self, run_id: str) -> None:
        """Raise the 409 when this run already crossed the threshold (before any work)."""
        check_run_id(run_id)
        if not self.enabled:
            return
        counts = self._runs.get(run_id)
        if counts is not None and counts.tripped:
            self._runs.move_to_end(run_id)
            raise self._refusal(run_id, counts)

    async def observe(self, run_id: str, build: Build | None) -> None:
        """Count one finalize result; raise the 409 when this call crosses the threshold."""
        if self.max_mask_fraction is None or build is None:
            return
        counts = self._counts(check_run_id(run_id))
        counts.finalized += 1
        if build.mask_sample:
            counts.masked += 1
            counts.reasons[counted_reason(build)] += 1
        if crosses(counts.finalized, counts.masked, self.max_mask_fraction, self.min_samples):
            counts.tripped = True
        if counts.tripped:
            raise self._refusal(run_id, counts)

    async def probe(self) -> None:
        """Nothing to reach: the counts live in this process."""
        return None

    async def aclose(self) -> None:
        """Nothing to release."""
