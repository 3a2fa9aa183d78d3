"""The witness steps both terminal attributions share (docs/records-and-builds.md#witnesses).

``core/terminal.py`` attributes over captured calls and
``core/staging/attribution.py`` over token-free manifest rows. The rows differ
(how a row's response id is read, which rows count as one sequence), the steps
over the finished record do not: each witness names one row or abstains with a
reason, and only witnesses that agree attribute. The caller passes how to read
a row's response id and how to collapse candidates to one row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from token_finalizer_client.protocol import (
    FingerprintError,
    assistant_fingerprint,
    is_model_authored,
)

__all__ = [
    "ResponseOutput",
    "declared_witness",
    "explicit_witness",
    "given",
    "response_id_witness",
    "response_output",
    "witness_verdict",
]


class _Row(Protocol):
    @property
    def model_call_id(self) -> str: ...


RowT = TypeVar("RowT", bound=_Row)

# The response's object output items, their model-authored fingerprint and the
# fingerprint of their trailing model-authored run ("" when not a proper suffix).
ResponseOutput = tuple[list[dict[str, Any]], str, str]


def given(value: Any) -> str | None:
    """A record claim: a falsy value (null, "", 0, false) means not given."""
    return str(value) if value else None


def explicit_witness(
    rows: Sequence[RowT],
    explicit_id: str,
    reasons: list[str],
    witnesses: list[tuple[str, RowT]],
) -> None:
    """Name the row with the explicit call id; a duplicated id names its last copy."""
    named = {row.model_call_id: row for row in rows}.get(explicit_id)
    if named is None:
        reasons.append("explicit_terminal_not_captured")
    else:
        witnesses.append(("explicit", named))


def declared_witness(
    rows: Sequence[RowT],
    declared_id: str,
    reasons: list[str],
    witnesses: list[tuple[str, RowT]],
    *,
    served_id: Callable[[RowT], object],
    collapse: Callable[[Sequence[RowT]], RowT | None],
) -> str:
    """Name the rows that served the declared response id; else the failure, "" when named.

    A failure stops attribution: the harness said which response it kept, and
    picking another row would train on a response nobody scored.
    """
    claimed = [row for row in rows if served_id(row) == declared_id]
    winner = collapse(claimed)
    if winner is None:
        failure = "declared_ambiguous" if claimed else "declared_terminal_not_captured"
        reasons.append(failure)
        return failure
    witnesses.append(("declared", winner))
    return ""


def response_id_witness(
    rows: Sequence[RowT],
    response: Mapping[str, Any],
    reasons: list[str],
    witnesses: list[tuple[str, RowT]],
    *,
    served_id: Callable[[RowT], object],
    collapse: Callable[[Sequence[RowT]], RowT | None],
) -> None:
    """Name the rows that served ``response.id``, when they collapse to one."""
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
    """What the content witness matches rows against; None, with the reason, when nothing."""
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


def witness_verdict(
    witnesses: list[tuple[str, RowT]],
    reasons: list[str],
    collapse: Callable[[Sequence[RowT]], RowT | None],
) -> tuple[str, RowT] | str:
    """The first witness's method and row when all witnesses agree; else the failure.

    Agreement is up to ``collapse``; a disagreement goes into the reason trail
    with who named what, and a corroboration with the other methods.
    """
    if not witnesses:
        return "no_witness"
    if collapse([row for _, row in witnesses]) is None:
        named_by = ";".join(f"{method}={row.model_call_id}" for method, row in witnesses)
        reasons.append(f"witness_disagreement[{named_by}]")
        return "witness_disagreement"
    method, named = witnesses[0]
    if len(witnesses) > 1:
        reasons.append("corroborated_by=" + "+".join(other for other, _ in witnesses[1:]))
    return method, named
