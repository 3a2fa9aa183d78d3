"""Terminal attribution: which captured call produced the scored response.

The record names the kept call in up to four independent ways. Each witness
either names one call or abstains with a reason; the verdict attributes only
when every witness that spoke agrees, up to calls with identical token
sequences (interchangeable for training). A contradiction attributes nothing
and is kept in the reason trail, because it points at a real defect that
ranking the witnesses would hide.

Attribution runs on the raw snapshot and never fails a build: any exception
yields "nothing attributed" with the reason ``attribution_error``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from token_finalizer.core.lineage_fields import CallView, lineage_field
from token_finalizer.core.witnesses import NO_METHOD, given, response_output, run_witnesses
from token_finalizer_client.protocol import (
    FINGERPRINT_VERSION,
    FingerprintError,
    assistant_fingerprint,
)

__all__ = [
    "TERMINAL_CALL_KEY",
    "TERMINAL_RESPONSE_ID_KEY",
    "TerminalAttribution",
    "attribute_terminal",
    "declared_response_id",
    "disabled_attribution",
]

TERMINAL_CALL_KEY = "_ng_terminal_model_call_id"
TERMINAL_RESPONSE_ID_KEY = "terminal_response_id"


@dataclass(frozen=True)
class TerminalAttribution:
    """The attributed call (or None), the winning method, and the reason trail.

    ``declared`` records that the record declared a terminal response id: the
    mask rule (docs/records-and-builds.md#mask-rules) treats that like an attribution.
    """

    method: str
    call_id: str | None
    reason: str
    declared: bool

    @property
    def attributed(self) -> bool:
        return self.call_id is not None


def disabled_attribution() -> TerminalAttribution:
    """The answer when attribution is configured off.

    The record's terminal claims are not consulted at all then, so nothing
    counts as declared either.
    """
    return TerminalAttribution(NO_METHOD, None, "disabled", declared=False)


def declared_response_id(record: Mapping[str, Any]) -> str | None:
    """The record's declared terminal response id; a falsy value means none."""
    return given(record.get(TERMINAL_RESPONSE_ID_KEY))


def attribute_terminal(
    entries: Sequence[CallView], record: Mapping[str, Any]
) -> TerminalAttribution:
    """Attribute the record's scored response to one call of the raw snapshot."""
    try:
        declared = declared_response_id(record) is not None
    except Exception:
        declared = False
    try:
        return _attribute(entries, record, declared)
    except Exception:
        return TerminalAttribution(NO_METHOD, None, "attribution_error", declared)


def _attribute(
    entries: Sequence[CallView], record: Mapping[str, Any], declared: bool
) -> TerminalAttribution:
    verdict = run_witnesses(
        entries,
        explicit_id=given(record.get(TERMINAL_CALL_KEY)),
        declared_id=declared_response_id(record),
        response=record.get("response"),
        served_id=_served_id,
        collapse=_collapse,
        content_witness=_content_witness,
    )
    return TerminalAttribution(verdict.method, verdict.call_id, verdict.reason, declared)


def _served_id(entry: CallView) -> object:
    return lineage_field(entry, "response_id")


def _content_witness(
    entries: Sequence[CallView],
    response: dict[str, Any],
    reasons: list[str],
    witnesses: list[tuple[str, CallView]],
) -> None:
    """Match the response's model-authored content against three readings per call.

    A full transcript matches a call's cumulative ``continuation_fingerprint``;
    a last-turn-only response matches a call's own output; the trailing
    model-authored run of a merged transcript matches the last call's own
    output. The readings can name different calls, so all matches pool before
    the ambiguity decision.
    """
    read = response_output(response, reasons)
    if read is None:
        return
    _, target, tail = read

    # Keyed by call id: a later copy of a duplicated id that matches replaces
    # the earlier one.
    matches: dict[str, CallView] = {}
    from_continuation = False
    for entry in entries:
        continuation = lineage_field(entry, "continuation_fingerprint")
        version = lineage_field(entry, "fingerprint_version")
        if (
            continuation
            and continuation == target
            and (version is None or version == FINGERPRINT_VERSION)
        ):
            matches[entry.model_call_id] = entry
            from_continuation = True
        own = _own_output_fingerprint(entry)
        if own and (own == target or (tail and own == tail)):
            matches[entry.model_call_id] = entry
    winner = _collapse(list(matches.values()))
    if winner is None:
        reasons.append("content_ambiguous" if matches else "no_content_match")
        return
    witnesses.append(("content_cumulative" if from_continuation else "content_output", winner))


def _own_output_fingerprint(entry: CallView) -> str:
    """Fingerprint of a call's own output items; "" when absent or unfingerprintable."""
    if not entry.output_items:
        return ""
    try:
        return assistant_fingerprint(list(entry.output_items))
    except FingerprintError:
        return ""


def _collapse(candidates: Sequence[CallView]) -> CallView | None:
    """One call standing for ``candidates`` if they all carry the same token sequence.

    Identical retries train identically, so the smallest call id stands for
    them; different sequences are a genuine ambiguity (None).
    """
    if not candidates:
        return None
    if len(candidates) == 1:
        return candidates[0]
    first = _sequence_identity(candidates[0])
    if any(_sequence_identity(other) != first for other in candidates[1:]):
        return None
    return min(candidates, key=lambda entry: entry.model_call_id)


def _sequence_identity(entry: CallView) -> tuple[object, ...]:
    """(digest, cum_len) when the writer recorded both, else the stored token arrays.

    The two kinds are tagged differently on purpose: a call with a digest and
    one without never count as the same sequence.
    """
    digest = lineage_field(entry, "digest")
    cum_len = lineage_field(entry, "cum_len")
    if digest and cum_len is not None:
        return ("digest", digest, cum_len)
    return ("tokens", _token_key(entry.prompt_token_ids), _token_key(entry.generation_token_ids))


def _token_key(ids: npt.NDArray[np.integer[Any]]) -> tuple[int, bytes]:
    """A hashable, dtype-independent key of a token array."""
    array = np.asarray(ids)
    return (array.size, array.astype(np.int64, copy=False).tobytes())
