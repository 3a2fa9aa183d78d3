"""The per-run mask-fraction guard (docs/configuration.md).

A harness whose captures mostly fail keeps producing masked, token-less
records; the guard stops it. Per run (the `X-Run-Id` header, a default run
otherwise) it counts the records that got a build and how many of those were
masked, by reason. Once at least `mask_fraction_min_samples` were finalized
and the masked fraction exceeds `max_mask_fraction`, the crossing call and
every later call of that run are refused with 409. Refusing loses nothing:
masked captures are never retired, and later calls are refused before any
freeze.

Counts live in this process: with several workers each keeps its own.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from token_finalizer._constants import GUARD_MAX_RUNS
from token_finalizer.core.build import Build
from token_finalizer.service.errors import MaskFractionExceeded

__all__ = ["MaskFractionGuard"]


@dataclass(slots=True)
class _RunCounts:
    finalized: int = 0
    masked: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    tripped: bool = False


class MaskFractionGuard:
    """Counts builds per run and refuses a run once too many of them were masked."""

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
        return MaskFractionExceeded(
            f"run {run_id!r} masked {counts.masked} of {counts.finalized} finalized records, "
            f"more than token_id_capture.max_mask_fraction={self.max_mask_fraction}; "
            "stop collecting and fix token capture",
            finalized=counts.finalized,
            masked=counts.masked,
            reasons=dict(counts.reasons),
        )

    def check(self, run_id: str) -> None:
        """Raise the 409 when this run already crossed the threshold (before any work)."""
        if not self.enabled:
            return
        counts = self._runs.get(run_id)
        if counts is not None and counts.tripped:
            self._runs.move_to_end(run_id)
            raise self._refusal(run_id, counts)

    def observe(self, run_id: str, build: Build | None) -> None:
        """Count one finalize result; raise the 409 when this call crosses the threshold."""
        if not self.enabled or build is None:
            return
        counts = self._counts(run_id)
        counts.finalized += 1
        if build.mask_sample:
            reason = build.mask_reason or "unknown"
            counts.masked += 1
            counts.reasons[reason] += 1
        assert self.max_mask_fraction is not None
        if (
            counts.finalized >= self.min_samples
            and counts.masked / counts.finalized > self.max_mask_fraction
        ):
            counts.tripped = True
        if counts.tripped:
            raise self._refusal(run_id, counts)
