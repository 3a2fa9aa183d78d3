"""Rebuild one frozen snapshot into a Build: link, arrange, project, decide the mask.

Two kinds of snapshot are built: *seed* snapshots (no entry carries a lineage
decision) by prefix merging alone, and *lineage* snapshots written by NeMo Gym
0.7 model servers by their recorded, digest-verified parents. Terminal
attribution (which call the verifier scored) applies to both unless it is
turned off. See docs/records-and-builds.md#build.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from token_finalizer._constants import FRACTION_DIGITS
from token_finalizer.core.build import MASK_SAMPLE_KEY, Build, BuildFailed, MaskReason
from token_finalizer.core.call_graph import (
    Call,
    LinkReport,
    link_by_lineage,
    link_by_prefix,
    processing_order,
)
from token_finalizer.core.delta import deduplicate, materialize
from token_finalizer.core.entries import Snapshot, TokenEntry, uniform_token_arrays
from token_finalizer.core.errors import TokenIdOutOfRange
from token_finalizer.core.forest import Forest, TerminalChain, arrange
from token_finalizer.core.projection import NO_CHAIN_ERROR, project_response
from token_finalizer.core.terminal import (
    TerminalAttribution,
    attribute_terminal,
    disabled_attribution,
)
from token_finalizer.core.token_digest import InvalidTokenIds

__all__ = [
    "BUILDER_NAME",
    "DUPLICATE_CALL_ID_ERROR",
    "EMPTY_CAPTURE_ERROR",
    "EMPTY_CAPTURE_HINT",
    "is_lineage_snapshot",
    "rebuild_snapshot",
]

BUILDER_NAME = "prefix_merging"
# Error texts of failed builds: a contract (docs/records-and-builds.md#error-strings);
# this one is NeMo Gym 0.7's, byte for byte (tests/vectors/nemo_gym_0_7/errors.json).
EMPTY_CAPTURE_ERROR = "capture contains no token records"
# Its hint: finalizing a wrong or early id froze that id for good. `{store}` is the
# source's own `token-finalizer store` option (` --dir PATH`), when it has one.
EMPTY_CAPTURE_HINT = (
    "finalize froze rollout {rollout_id} all the same, so a later write to it is refused: "
    "if the id is wrong or its rollout was not finished, remove the capture with "
    "`token-finalizer store delete {rollout_id}{store}`"
)
DUPLICATE_CALL_ID_ERROR = "duplicate model_call_id in capture"


def is_lineage_snapshot(entries: Sequence[TokenEntry]) -> bool:
    """Whether any entry carries a 0.7 parent decision (else prefix merging alone applies)."""
    return any(entry.lineage.stamped for entry in entries)


def _fraction(numerator: int, denominator: int) -> float:
    return round(numerator / denominator, FRACTION_DIGITS) if denominator else 0.0


def _attribution_metrics(attribution: TerminalAttribution, chain: str) -> dict[str, Any]:
    return {
        "method": attribution.method,
        "call_id": attribution.call_id,
        "reason": attribution.reason,
        "chain": chain,
    }


@dataclass(slots=True)
class _Linked:
    """Kept calls in processing order, linked, with what the lineage rules reported."""

    calls: list[Call]
    report: LinkReport
    empty_generation_calls: int
    generated_tokens_captured: int


def _link(snapshot_entries: Sequence[TokenEntry]) -> _Linked:
    report = LinkReport()
    # One dtype for every token array of the build: arrays of different calls meet.
    entries = uniform_token_arrays(snapshot_entries)
    if is_lineage_snapshot(entries):
        deduplicated = deduplicate(entries)
        for call_id in deduplicated.conflicts:
            report.failures["duplicate_call_id_conflict"] += 1
            report.unresolved.append(call_id)
        materialized = materialize(deduplicated.entries)
        for call_id in materialized.broken:
            report.failures["delta_chain_unreconstructable"] += 1
            report.unresolved.append(call_id)
        candidates, known = materialized.entries, materialized.cumulative_digests
    else:
        # A copy with the same tokens is the same call stored twice (a relay that
        # re-sent its line): built once, counted in `n_calls` as often as stored.
        # Copies that differ leave no way to tell which call happened.
        deduplicated = deduplicate(entries)
        if deduplicated.conflicts:
            raise BuildFailed(
                f"{DUPLICATE_CALL_ID_ERROR}: {', '.join(sorted(set(deduplicated.conflicts)))}",
                reason=MaskReason.DUPLICATE_CALL_ID,
            )
        candidates, known = deduplicated.entries, {}
    kept = [entry for entry in candidates if len(entry.generation_token_ids)]
    calls = processing_order(kept, [entry.prompt_token_ids for entry in kept])
    if is_lineage_snapshot(entries):
        link_by_lineage(calls, report, known)
    else:
        link_by_prefix(calls)
    return _Linked(
        calls=calls,
        report=report,
        empty_generation_calls=len(candidates) - len(kept),
        generated_tokens_captured=sum(len(entry.generation_token_ids) for entry in kept),
    )


def _mask_reason(
    snapshot: Snapshot,
    forest: Forest,
    linked: _Linked,
    attribution: TerminalAttribution,
    record: Mapping[str, Any] | None,
) -> MaskReason | None:
    reason = _chain_mask_reason(snapshot, forest, linked, attribution)
    # A build that nothing but its record masks: the record arrived marked
    # `mask_sample` (by its harness, say), and a build of a masked record is
    # never retired. The last of the mask rules, so that any capture problem
    # is still reported by its own reason.
    if reason is None and record is not None and record.get(MASK_SAMPLE_KEY):
        return MaskReason.RECORD_MASKED
    return reason


def _chain_mask_reason(
    snapshot: Snapshot, forest: Forest, linked: _Linked, attribution: TerminalAttribution
) -> MaskReason | None:
    if snapshot.incomplete:
        return MaskReason.CAPTURE_INCOMPLETE
    if forest.terminal is TerminalChain.DELIVERED:
        return None
    if forest.terminal is TerminalChain.BROKEN:
        return MaskReason.TERMINAL_BROKEN
    if forest.terminal is TerminalChain.NOT_CAPTURED:
        return MaskReason.TERMINAL_NOT_CAPTURED
    if attribution.declared:
        return MaskReason.DECLARED_TERMINAL_UNMATCHED
    if forest.unresolved_retries:
        return MaskReason.UNRESOLVED_RETRIES
    if linked.report.unresolved:
        return MaskReason.UNRESOLVED_PARENTS
    if forest.roots != 1:
        return MaskReason.MULTIPLE_ROOTS
    if forest.chains != 1:
        return MaskReason.MULTIPLE_CHAINS
    return None


def _failed(
    snapshot: Snapshot,
    failure: BuildFailed,
    attribution: TerminalAttribution | None,
    chain: str,
) -> Build:
    """The masked build of a failure; an incomplete snapshot is reported as such first."""
    metrics: dict[str, Any] = {"n_calls": len(snapshot.entries)}
    if attribution is not None:
        metrics["terminal_attribution"] = _attribution_metrics(attribution, chain or "error")
    if snapshot.incomplete:
        metrics["capture_incomplete"] = True
    return Build.failed(
        snapshot.rollout_id,
        str(failure),
        metrics=metrics,
        builder=BUILDER_NAME,
        snapshot=snapshot,
        mask_reason=MaskReason.CAPTURE_INCOMPLETE if snapshot.incomplete else failure.reason,
        hint=failure.hint,
    )


def rebuild_snapshot(
    snapshot: Snapshot,
    *,
    model: str = "",
    record: Mapping[str, Any] | None = None,
    terminal_attribution: bool = True,
    store_option: str = "",
) -> Build:
    """Rebuild the response of one frozen snapshot; a failure is a masked build, not a raise.

    `record` is the finished rollout record: terminal attribution reads the
    verifier's choice from it, and a record already marked `mask_sample`
    masks the build (MaskReason.RECORD_MASKED) so that it is never retired. Without a
    record nothing is attributed. `store_option` names the snapshot's store to
    `token-finalizer store` (`--dir PATH`, `--redis URL`) in the hints that
    tell an operator to run one (docs/records-and-builds.md#hints).
    """
    if not snapshot.entries:
        # The freeze that found nothing still froze the id: the hint says so
        # beside Gym's error (docs/records-and-builds.md#hints).
        empty = BuildFailed(
            EMPTY_CAPTURE_ERROR,
            reason=MaskReason.EMPTY_CAPTURE,
            hint=EMPTY_CAPTURE_HINT.format(
                rollout_id=snapshot.rollout_id, store=f" {store_option}" if store_option else ""
            ),
        )
        return _failed(snapshot, empty, None, "")
    if terminal_attribution and record is not None:
        attribution = attribute_terminal(snapshot.entries, record)
    elif terminal_attribution:
        attribution = attribute_terminal(snapshot.entries, {})
    else:
        attribution = disabled_attribution()
    status = ""
    try:
        linked = _link(snapshot.entries)
        forest = arrange(
            linked.calls, terminal_id=attribution.call_id, attributed=attribution.attributed
        )
        if forest is None:
            status = TerminalChain.NOT_CAPTURED if attribution.attributed else ""
            raise BuildFailed(NO_CHAIN_ERROR, reason=MaskReason.NO_TRAINABLE_CHAIN)
        status = forest.terminal.value
        response = project_response(forest.main_chain, rollout_id=snapshot.rollout_id, model=model)
    except BuildFailed as exc:
        return _failed(snapshot, exc, attribution, status)
    except (InvalidTokenIds, TokenIdOutOfRange) as exc:  # an id outside [0, 2**64)
        failure = BuildFailed(f"ValueError: {exc}", reason=MaskReason.INVALID_TOKENS)
        return _failed(snapshot, failure, attribution, status)
    except ValueError as exc:
        failure = BuildFailed(f"ValueError: {exc}", reason=MaskReason.BUILD_FAILED)
        return _failed(snapshot, failure, attribution, status)
    return _built(snapshot, response, forest, linked, attribution, record)


def _built(
    snapshot: Snapshot,
    response: dict[str, Any],
    forest: Forest,
    linked: _Linked,
    attribution: TerminalAttribution,
    record: Mapping[str, Any] | None,
) -> Build:
    n_calls = len(snapshot.entries)
    captured = linked.generated_tokens_captured
    delivered = sum(len(call.generation) for call in forest.main_chain)
    metrics: dict[str, Any] = {
        "n_calls": n_calls,
        "terminal_attribution": _attribution_metrics(attribution, forest.terminal.value),
        "chains": forest.chains,
        "roots": forest.roots,
        "quarantined_calls": forest.quarantined_calls,
        "quarantined_fraction": _fraction(forest.quarantined_calls, n_calls),
        "delivered_fraction": _fraction(delivered, captured),
        "generated_tokens_captured": captured,
        "generated_tokens_delivered": delivered,
        "parent_link_failures": dict(linked.report.failures),
        "unresolved_parent_calls": len(linked.report.unresolved),
        "empty_generation_calls": linked.empty_generation_calls,
    }
    if snapshot.incomplete:
        metrics["capture_incomplete"] = True
    return Build.built(
        snapshot,
        builder=BUILDER_NAME,
        response=response,
        metrics=metrics,
        mask_reason=_mask_reason(snapshot, forest, linked, attribution, record),
        unresolved_retries=forest.unresolved_retries,
        unresolved_parent_calls=linked.report.unresolved,
    )
