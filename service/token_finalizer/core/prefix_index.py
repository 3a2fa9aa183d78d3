"""Find the calls whose cumulative sequence is the longest prefix of a prompt.

Candidates are indexed by (cumulative length, last token): for a prompt, each
shorter length costs one dictionary probe, and only candidates whose last
token matches are compared in full, generation first (it is short, and it is
where unrelated candidates differ). A chain of calls therefore costs one
memcmp-speed pass over its prompts instead of a Python step per token.
See docs/records-and-builds.md#parent-by-longest-prefix.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from token_finalizer.core.token_ids import same_ids

__all__ = ["Candidate", "PrefixIndex"]

Ids = npt.NDArray[np.integer[Any]]


class Candidate(Protocol):
    """A call as the index sees it: its prompt and its generation."""

    @property
    def prompt(self) -> Ids: ...

    @property
    def generation(self) -> Ids: ...


C = TypeVar("C", bound=Candidate)


def extends(prompt: Ids, candidate: Candidate, length: int) -> bool:
    """Whether `candidate`'s cumulative sequence (prompt + generation) equals prompt[:length]."""
    split = len(candidate.prompt)
    return same_ids(prompt[split:length], candidate.generation) and same_ids(
        prompt[:split], candidate.prompt
    )


class PrefixIndex(Generic[C]):
    """Calls by (cumulative length, last token); calls must have a non-empty generation."""

    def __init__(self) -> None:
        self._by_end: dict[tuple[int, int], list[C]] = defaultdict(list)
        self._lengths: list[int] = []  # sorted, distinct

    def add(self, call: C) -> None:
        length = len(call.prompt) + len(call.generation)
        self._by_end[(length, int(call.generation[-1]))].append(call)
        at = bisect.bisect_left(self._lengths, length)
        if at == len(self._lengths) or self._lengths[at] != length:
            self._lengths.insert(at, length)

    def longest_prefixes(self, prompt: Ids) -> list[C]:
        """Every indexed call (in insertion order) whose cumulative sequence is the longest
        prefix of `prompt` found; empty when none is."""
        usable = self._lengths[: bisect.bisect_right(self._lengths, len(prompt))]
        if not usable:
            return []
        lengths = np.array(usable[::-1], dtype=np.int64)
        for length, token in zip(lengths.tolist(), prompt[lengths - 1].tolist(), strict=True):
            candidates = self._by_end.get((length, token))
            if not candidates:
                continue
            found = [c for c in candidates if extends(prompt, c, length)]
            if found:
                return found
        return []
