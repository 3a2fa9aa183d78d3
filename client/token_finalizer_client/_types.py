"""Typed results of the finalizer API."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from token_finalizer_client._compact import expand_record, load_numpy, plain_record
from token_finalizer_client._exceptions import FinalizerError
from token_finalizer_client._staged_row import StagedOutcome, read_staged

__all__ = ["Finalized", "Readiness"]


@dataclass(frozen=True, slots=True)
class Finalized:
    """One `POST /finalize` answer (answer v2), with its tokens in the standard form.

    `record` is the record after finalize (rebuilt `response.output`,
    `_ng_token_capture`, `mask_sample` when masked) and holds the only copy of
    the rebuilt output; `build` is what finalize returned, without the
    rebuilt response (None when the record's agent does not take part).
    `retirable` says whether the capture may be dropped once `record` is
    stored durably, and `retire` is the service's signed permission to do so
    (`{"rollout_id", "source", "snapshot_id", "version", "ticket"}`, None
    unless retirable): what `retire()` sends back. `staged` is the verdict
    of a rollout captured by NeMo Gym's external staging (its verified row,
    or the error; `_staged_row`), None for any other rollout.
    """

    record: dict[str, Any]
    build: dict[str, Any] | None
    rollout_id: str | None
    source: str | None
    retirable: bool
    retire: dict[str, Any] | None = None
    staged: StagedOutcome | None = None

    @classmethod
    def from_answer(cls, answer: Any, *, as_numpy: bool = False) -> Finalized:
        """Read a finalize answer object; FinalizerError when it is not a v2 answer.

        A compact answer (`context_token_ids`) is expanded into the standard
        record; the context itself is not kept. With `as_numpy`, the token
        lists of the output items become numpy arrays (see `_compact`).
        """
        if not isinstance(answer, dict) or not isinstance(answer.get("record"), dict):
            raise FinalizerError(
                "the finalize answer is not an object with a `record` object; "
                "is the base URL a token-finalizer service?"
            )
        if "retire" not in answer:
            raise FinalizerError(
                "the service answered an old finalize answer (no `retire` key); upgrade the "
                "token-finalizer service to one that answers finalize v2, which this client needs"
            )
        retire = answer["retire"]
        if retire is not None and not isinstance(retire, dict):
            raise FinalizerError(
                f"the finalize answer's `retire` is neither an object nor null: {retire!r:.200}"
            )
        if as_numpy:
            load_numpy()  # the clear ImportError first, even for an answer without tokens
        build = answer.get("build")
        return cls(
            record=expand_record(
                answer["record"], answer.get("context_token_ids"), as_numpy=as_numpy
            ),
            build=build if isinstance(build, dict) else None,
            rollout_id=answer.get("rollout_id"),
            source=answer.get("source"),
            retirable=bool(answer.get("retirable")),
            retire=retire,
            staged=read_staged(answer.get("staged")),
        )

    def to_answer(self) -> dict[str, Any]:
        """The standard v2 answer object (for storing as a JSON line).

        Plain JSON values only: prompts expanded, no `context_token_ids`,
        numpy arrays (from `as_numpy`) turned back into lists.
        `Finalized.from_answer` reads it back, and `retire()` accepts it.
        """
        answer = {
            "rollout_id": self.rollout_id,
            "source": self.source,
            "record": plain_record(self.record),
            "build": self.build,
            "retirable": self.retirable,
            "retire": self.retire,
        }
        if self.staged is not None:
            answer["staged"] = self.staged.to_json()
        return answer

    @property
    def masked(self) -> bool:
        """Whether the record is marked `mask_sample` (trainers skip it)."""
        return bool(self.record.get("mask_sample"))


@dataclass(frozen=True, slots=True)
class Readiness:
    """A `GET /ready` answer: 200 and 503 both carry the per-source details in `body`."""

    ready: bool
    status_code: int
    body: dict[str, Any]
