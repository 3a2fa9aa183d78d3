"""The service layer of POST /finalize: source, enablement, delivery, guard, metrics.

Capture problems never become HTTP errors here: `finalize_record` turns them
into masked builds. The only refusals are the request's own (unknown source)
and the per-run mask-fraction guard.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from token_finalizer._constants import ENCODE_IN_THREAD_MIN_TOKENS
from token_finalizer.core.build import Build
from token_finalizer.core.compact_tokens import compact_output
from token_finalizer.core.delivery import finalize_record
from token_finalizer.core.errors import StoreUnreachable
from token_finalizer.core.identity import RecordKey, record_key
from token_finalizer.core.staging import ReceiptPolicy
from token_finalizer.service.errors import (
    MaskFractionExceeded,
    ServiceError,
    SourceUnreachable,
    UnknownSource,
)
from token_finalizer.service.registry import InstrumentedSource
from token_finalizer.service.state import ServiceState
from token_finalizer.tracing import OUTCOME, ROLLOUT_ID, SOURCE, child_span

__all__ = ["FinalizeResult", "finalize_one"]


@dataclass(frozen=True, slots=True)
class FinalizeResult:
    """The answer of one finalize call and what the request log reports about it."""

    answer: dict[str, Any]
    rollout_id: str | None
    source: str
    outcome: str  # ok, masked, no_build
    token_count: int

    @property
    def large(self) -> bool:
        """Whether encoding this answer belongs in a worker thread."""
        return self.token_count >= ENCODE_IN_THREAD_MIN_TOKENS


def _outcome(build: Build | None) -> str:
    if build is None:
        return "no_build"
    return "masked" if build.mask_sample else "ok"


async def _guarded(state: ServiceState, step: Callable[..., Awaitable[None]], *args: Any) -> None:
    try:
        await step(*args)
    except MaskFractionExceeded as refusal:
        state.metrics.guard_refusals.inc()
        refusal.concerning(outcome="guard_refused")
        raise


async def finalize_one(
    state: ServiceState,
    record: dict[str, Any],
    source_name: str | None,
    run_id: str,
    *,
    compact: bool = False,
) -> FinalizeResult:
    """Finalize one record through the named source; the answer object (v2).

    With `compact`, the answer carries the delivered context once
    (`context_token_ids`) and prompts as prefix lengths into it, and a staged
    row's token columns as packed base64 (docs/finalizer-api.md).
    Raises UnknownSource, InvalidRunId (a run id too long to remember),
    MaskFractionExceeded when the run's guard trips, or SourceUnreachable;
    each carries the record's rollout id, the source once resolved and the
    outcome where there is one (ServiceError.concerning).
    """
    key = record_key(record)  # once: the build reuses it
    rollout_id = key.rollout_id
    try:
        source = state.sources.resolve(source_name)
    except UnknownSource as refusal:
        refusal.concerning(rollout_id=rollout_id)
        raise
    try:
        await _guarded(state, state.guard.check, run_id)
        build = await _build(state, record, source, key)
        outcome = _outcome(build)
        state.metrics.finalize.labels(source.name, outcome).inc()
        if build is not None and build.mask_reason is not None:
            state.metrics.mask_reasons.labels(source.name, str(build.mask_reason)).inc()
        # The crossing call's build has happened and is counted; its answer is the 409.
        await _guarded(state, state.guard.observe, run_id, build)
    except ServiceError as refusal:
        refusal.concerning(rollout_id=rollout_id, source=source.name)
        raise
    answer = _answer(state, record, build, rollout_id, source.name, compact=compact)
    token_count = 0 if build is None else build.token_count
    return FinalizeResult(
        answer=answer,
        rollout_id=rollout_id,
        source=source.name,
        outcome=outcome,
        token_count=token_count,
    )


async def _build(
    state: ServiceState, record: dict[str, Any], source: InstrumentedSource, key: RecordKey
) -> Build | None:
    """The build of a record whose agent takes part (None otherwise), within a finalize slot."""
    capture = state.settings.token_id_capture
    if not capture.takes_part(record):
        return None
    retry = state.settings.sources_on_unreachable(source.name) == "retry"
    policy = ReceiptPolicy(state.settings.sources_receipt_policy(source.name))
    async with state.finalize_slots(source.name):
        try:
            # The freeze's span is its child: the build freezes first (docs/tracing.md).
            with child_span("build", _span_attributes(key.rollout_id, source.name)) as span:
                build = await finalize_record(
                    record,
                    source,
                    terminal_attribution=capture.terminal_attribution,
                    raise_unreachable=retry,
                    key=key,
                    receipt_policy=policy,
                )
                if span is not None:
                    span.set_attribute(OUTCOME, _outcome(build))
                return build
        except StoreUnreachable as exc:
            state.metrics.finalize.labels(source.name, "unreachable").inc()
            raise SourceUnreachable(
                f"source {source.name!r} could not be reached or did not finish answering; "
                f"retrying is safe (a second freeze gives the same snapshot): {exc}",
                source=source.name,
            ).concerning(outcome="unreachable") from None


def _span_attributes(rollout_id: str | None, source: str) -> dict[str, str]:
    """A finalize's child-span attributes: its rollout id (when it has one) and source."""
    if rollout_id is None:
        return {SOURCE: source}
    return {ROLLOUT_ID: rollout_id, SOURCE: source}


def _answer(
    state: ServiceState,
    record: dict[str, Any],
    build: Build | None,
    rollout_id: str | None,
    source: str,
    *,
    compact: bool,
) -> dict[str, Any]:
    retire = None
    if build is not None and build.retirable and build.snapshot is not None and rollout_id:
        retire = state.tickets.issue(
            rollout_id, source, build.snapshot.snapshot_id, build.snapshot.version
        )
    answer: dict[str, Any] = {
        "rollout_id": rollout_id,
        "source": source,
        "record": record,
        "build": None if build is None else build.to_dict(with_response=False),
        "retirable": retire is not None,
        "retire": retire,
    }
    if build is not None and build.staged is not None:
        # An externally staged rollout: its verdict and verified row (docs/staging.md).
        answer["staged"] = build.staged.to_json(form="compact" if compact else "arrays")
    if compact:
        answer["context_token_ids"] = None
        response = record.get("response")
        output = response.get("output") if isinstance(response, dict) else None
        compacted = (
            compact_output(output) if build is not None and isinstance(output, list) else None
        )
        if compacted is not None and isinstance(response, dict):
            answer["context_token_ids"], compact_items = compacted
            # The record is the caller's: answer a copy whose output holds the lengths.
            answer["record"] = {**record, "response": {**response, "output": compact_items}}
    return answer
