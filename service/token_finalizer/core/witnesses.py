"""The witness steps both terminal attributions share (docs/records-and-builds.md#witnesses).

``core/terminal.py`` attributes over captured calls and
``core/staging/attribution.py`` over token-free manifest rows. The rows differ
(how a row's response id is read, which rows count as one sequence, what the
content witness compares), the steps over the finished record do not: each
witness names one row or abstains with a reason, a declared response id that
names no row stops at once, and only witnesses that agree attribute.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from token_finalizer_client.protocol import (
    FingerprintError,
    assistant_fingerprint,
    is_model_authored,
)

__all__ = [
    "NO_METHOD",
    "ResponseOutput",
    "Verdict",
    "given",
    "response_output",
    "run_witnesses",
]

NO_METHOD = "none"


class _Row(Protocol):
    @property
    def model_call_id(self) -> str: ...


RowT = TypeVar("RowT", bound=_Row)

# The response's object output items, their model-authored fingerprint and the
# fingerprint of their trailing model-authored run ("" when not a proper suffix).
ResponseOutput = tuple[list[dict[str, Any]], str, str]


@dataclass(frozen=True, slots=True)
class Verdict(Generic[RowT]):
    """The first witness's method and row (``NO_METHOD`` and None when none), the reason
    trail, and why nothing was attributed ("" when a row was)."""

    method: str
    row: RowT | None
    reason: str
    failure: str

    @property
    def call_id(self) -> str | None:
        return None if self.row is None else self.row.model_call_id


def given(value: Any) -> str | None:
    """A record claim: a falsy value (null, "", 0, false) means not given."""
    return str(value) if value else None


def run_witnesses(
    rows: Sequence[RowT],
    *,
    explicit_id: str | None,
    declared_id: str | None,
    response: object,
    served_id: Callable[[RowT], object],
    collapse: Callable[[Sequence[RowT]], RowT | None],
    content_witness: Callable[
        [Sequence[RowT], dict[str, Any], list[str], list[tuple[str, RowT]]], None
    ],
) -> Verdict[RowT]:
    """Ask the witnesses in order (explicit, declared, response id, content); the verdict.

    ``served_id`` reads the response id a row served; ``collapse`` stands one
    row for candidates that are one token sequence, None when they are not;
    ``content_witness`` appends its row to the witnesses, or its reason.
    """
    reasons: list[str] = []
    witnesses: list[tuple[str, RowT]] = []

    def unattributed(failure: str) -> Verdict[RowT]:
        return Verdict(NO_METHOD, None, ",".join(reasons), failure)

    if explicit_id is not None:
        # A duplicated id is looked up as its last copy, as a dict built in order would.
        named = {row.model_call_id: row for row in rows}.get(explicit_id)
        if named is None:
            reasons.append("explicit_terminal_not_captured")
        else:
            witnesses.append(("explicit", named))

    if declared_id is not None:
        claimed = [row for row in rows if served_id(row) == declared_id]
        winner = collapse(claimed)
        if winner is None:
            # The harness said which response it kept; picking another row
            # instead would train on a response nobody scored.
            failure = "declared_ambiguous" if claimed else "declared_terminal_not_captured"
            reasons.append(failure)
            return unattributed(failure)
        witnesses.append(("declared", winner))

    if isinstance(response, dict) and response:
        _response_id_witness(rows, response, reasons, witnesses, served_id, collapse)
        content_witness(rows, response, reasons, witnesses)
    else:
        reasons.append("no_response_object")

    if not witnesses:
        return unattributed("no_witness")
    if collapse([row for _, row in witnesses]) is None:
        named_by = ";".join(f"{method}={row.model_call_id}" for method, row in witnesses)
        reasons.append(f"witness_disagreement[{named_by}]")
        return unattributed("witness_disagreement")
    method, first = witnesses[0]
    if len(witnesses) > 1:
        reasons.append("corroborated_by=" + "+".join(other for other, _ in witnesses[1:]))
    return Verdict(method, first, ",".join(reasons), "")


def _response_id_witness(
    rows: Sequence[RowT],
    response: Mapping[str, Any],
    reasons: list[str],
    witnesses: list[tuple[str, RowT]],
    served_id: Callable[[RowT], object],
    collapse: Callable[[Sequence[RowT]], RowT | None],
) -> None:
    response_id = str(response.get("id") or "")
    if not response_id:
        reasons.append("response_has_no_id")
        return
    served = [row for row in rows if served_id(row) == response_id]
    if not served:
        reasons.append("response_id_no_match")
        return
    winner = collapse(served)
    if winner is None:
        reasons.append("response_id_ambiguous")
    else:
        witnesses.append(("response_id", winner))


def response_output(response: Mapping[str, Any], reasons: list[str]) -> ResponseOutput | None:
    """What a content witness matches rows against; None, with the reason, when nothing."""
    output = response.get("output")
    items = [item for item in output if isinstance(item, dict)] if isinstance(output, list) else []
    if not items:
        reasons.append("response_has_no_output")
        return None
    try:
        target = assistant_fingerprint(items)
    except FingerprintError:
        reasons.append("response_output_unfingerprintable")
        return None
    if not target:
        reasons.append("no_model_authored_output")
        return None
    return items, target, _trailing_model_fingerprint(items)


def _trailing_model_fingerprint(items: list[dict[str, Any]]) -> str:
    """Fingerprint of the trailing model-authored run, when it is a proper suffix; else ""."""
    start = len(items)
    while start > 0 and is_model_authored(items[start - 1]):
        start -= 1
    if start in (0, len(items)):
        return ""
    try:
        return assistant_fingerprint(items[start:])
    except FingerprintError:
        # Not reached after the whole output fingerprinted (the run is a part of
        # it); kept so that a tail never fails an attribution on its own.
        return ""
