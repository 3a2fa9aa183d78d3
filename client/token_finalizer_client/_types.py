"""Typed results of the finalizer API."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from token_finalizer_client._exceptions import FinalizerError

__all__ = ["Finalized", "Readiness"]


@dataclass(frozen=True, slots=True)
class Finalized:
    """One `POST /finalize` answer.

    `record` is the record after finalize (rebuilt `response.output`,
    `_ng_token_capture`, `mask_sample` when masked); `build` is what finalize
    returned (None when the record's agent does not take part); `retirable`
    says whether `retire` may drop the capture once `record` is stored durably.
    """

    record: dict[str, Any]
    build: dict[str, Any] | None
    rollout_id: str | None
    source: str | None
    retirable: bool

    @classmethod
    def from_answer(cls, answer: Any) -> Finalized:
        """Read a finalize answer object; FinalizerError when it is not one."""
        if not isinstance(answer, dict) or not isinstance(answer.get("record"), dict):
            raise FinalizerError(
                "the finalize answer is not an object with a `record` object; "
                "is the base URL a token-finalizer service?"
            )
        build = answer.get("build")
        return cls(
            record=answer["record"],
            build=build if isinstance(build, dict) else None,
            rollout_id=answer.get("rollout_id"),
            source=answer.get("source"),
            retirable=bool(answer.get("retirable")),
        )

    def to_answer(self) -> dict[str, Any]:
        """The answer object again, as the service sent it (for storing as a JSON line)."""
        return {
            "rollout_id": self.rollout_id,
            "source": self.source,
            "record": self.record,
            "build": self.build,
            "retirable": self.retirable,
        }

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
