"""Which manifest row the verifier scored: witnesses, then the parent-link walk.

Terminal attribution over token-free manifest rows (docs/staging.md#receipt-policy):
the same four witnesses as for token captures (explicit call id, declared
response id, the response's id, its content), each naming one row or
abstaining with a reason; rows with identical ``(cumulative_hash,
chain_hash, cum_len)`` are one sequence and collapse to the smallest call id.
Content matches the rows' precomputed fingerprints only (rows hold no
items): a row's ``continuation_fingerprint`` against the response's model
output, its ``output_fingerprint`` against that or against the output's
trailing model-authored block; rows stamped with another fingerprint version
never match.

``select_terminal_call`` is NeMo Gym 0.7.0's fallback when no witness names a
row: roots with children first, the earliest admitted, then down the
children, preferring those with children; a tie at any level is ambiguous.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from token_finalizer.core.staging.manifest import CallRecord
from token_finalizer.core.terminal import TERMINAL_CALL_KEY, TERMINAL_RESPONSE_ID_KEY
from token_finalizer.core.witnesses import NO_METHOD, given, response_output, run_witnesses
from token_finalizer_client.protocol import FINGERPRINT_VERSION

__all__ = [
    "SELECTION_AMBIGUOUS",
    "SELECTION_DUPLICATE_CALL_ID",
    "SELECTION_NO_RECORDS",
    "SELECTION_NO_ROOT",
    "SELECTION_ORPHANED_ROW",
    "SELECTION_SELECTED",
    "RowAttribution",
    "TerminalSelection",
    "attribute_rows",
    "select_terminal_call",
]

SELECTION_SELECTED = "selected"
SELECTION_NO_RECORDS = "no_records"
SELECTION_DUPLICATE_CALL_ID = "duplicate_call_id"
SELECTION_ORPHANED_ROW = "orphaned_row"
SELECTION_NO_ROOT = "no_root"
SELECTION_AMBIGUOUS = "ambiguous_terminal"


@dataclass(frozen=True, slots=True)
class RowAttribution:
    """The attributed row (or None), the first witness's method, and the reason trail.

    ``declared`` says the record declared a terminal response id; ``failure``
    is why nothing was attributed (``declared_terminal_not_captured``,
    ``declared_ambiguous``, ``witness_disagreement``, ``no_witness`` or
    ``attribution_error``), "" when a row was.
    """

    method: str
    call_id: str | None
    reason: str
    declared: bool
    failure: str


@dataclass(frozen=True, slots=True)
class TerminalSelection:
    """The parent-link walk's terminal call, or None, with the walk's reason."""

    call_id: str | None
    reason: str


def attribute_rows(records: Sequence[CallRecord], record: Mapping[str, Any]) -> RowAttribution:
    """Attribute the finished record's scored response to one manifest row; never raises."""
    declared_id = given(record.get(TERMINAL_RESPONSE_ID_KEY))
    try:
        return _attribute(records, record, declared_id)
    except Exception:
        return RowAttribution(
            NO_METHOD, None, "attribution_error", declared_id is not None, "attribution_error"
        )


def _attribute(
    records: Sequence[CallRecord], record: Mapping[str, Any], declared_id: str | None
) -> RowAttribution:
    verdict = run_witnesses(
        records,
        explicit_id=given(record.get(TERMINAL_CALL_KEY)),
        declared_id=declared_id,
        response=record.get("response"),
        served_id=_served_id,
        collapse=_collapse,
        content_witness=_content_witness,
    )
    return RowAttribution(
        verdict.method, verdict.call_id, verdict.reason, declared_id is not None, verdict.failure
    )


def _served_id(row: CallRecord) -> str:
    return row.response_id


def _content_witness(
    records: Sequence[CallRecord],
    response: dict[str, Any],
    reasons: list[str],
    witnesses: list[tuple[str, CallRecord]],
) -> None:
    read = response_output(response, reasons)
    if read is None:
        return
    _, target, tail = read
    matches: dict[str, CallRecord] = {}
    for row in records:
        if row.fingerprint_version != FINGERPRINT_VERSION:
            continue
        own = row.output_fingerprint
        if row.continuation_fingerprint == target or (own and own in (target, tail)):
            matches[row.model_call_id] = row
    winner = _collapse(list(matches.values()))
    if winner is None:
        reasons.append("content_ambiguous" if matches else "no_content_match")
    else:
        witnesses.append(("content", winner))


def _collapse(candidates: Sequence[CallRecord]) -> CallRecord | None:
    """One row standing for rows that all name one token sequence (smallest id), else None."""
    if not candidates:
        return None
    identities = {(row.cumulative_hash, row.chain_hash, row.cum_len) for row in candidates}
    if len(identities) != 1:
        return None
    return min(candidates, key=lambda row: row.model_call_id)


def select_terminal_call(records: Sequence[CallRecord]) -> TerminalSelection:
    """The terminal by parent links alone, when no witness named one.

    Roots that have children are preferred; among them the earliest
    ``admitted_at`` wins (rows without one last, then manifest order). From
    there, descend while a call has children, preferring children that have
    children themselves; more than one candidate left at a level is
    ``ambiguous_terminal``.
    """
    if not records:
        return TerminalSelection(None, SELECTION_NO_RECORDS)
    by_id = {row.model_call_id: row for row in records}
    if len(by_id) != len(records):
        return TerminalSelection(None, SELECTION_DUPLICATE_CALL_ID)
    if any(row.parent_call_id is not None and row.parent_call_id not in by_id for row in records):
        return TerminalSelection(None, SELECTION_ORPHANED_ROW)
    children: dict[str, list[CallRecord]] = {}
    roots: list[CallRecord] = []
    for row in records:
        if row.parent_call_id is None:
            roots.append(row)
        else:
            children.setdefault(row.parent_call_id, []).append(row)
    if not roots:
        # Every row names a present parent: the parent links form a cycle.
        return TerminalSelection(None, SELECTION_NO_ROOT)

    position = {row.model_call_id: index for index, row in enumerate(records)}

    def admission_order(row: CallRecord) -> tuple[bool, float, int]:
        stamped = row.admitted_at is not None
        return (not stamped, row.admitted_at or 0.0, position[row.model_call_id])

    def prefer_extended(candidates: list[CallRecord]) -> list[CallRecord]:
        extended = [row for row in candidates if children.get(row.model_call_id)]
        return extended or candidates

    node = min(prefer_extended(roots), key=admission_order)
    while True:
        below = children.get(node.model_call_id)
        if not below:
            return TerminalSelection(node.model_call_id, SELECTION_SELECTED)
        pool = prefer_extended(below)
        if len(pool) > 1:
            return TerminalSelection(None, SELECTION_AMBIGUOUS)
        node = pool[0]
