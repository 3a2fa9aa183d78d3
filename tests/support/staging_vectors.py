"""The NeMo Gym 0.7.0 external-staging vectors (tests/vectors/nemo_gym_0_7_staging).

Each file is parsed once per test session. The schema of every file is in
the folder's README.md.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any, Final, TypedDict, cast

__all__ = [
    "CASE_FILES",
    "STAGING_VECTORS",
    "VectorCase",
    "case_by_name",
    "digest_family",
    "golden_vectors",
    "load_staging_vectors",
    "staging_case_ids",
    "staging_cases",
]

STAGING_VECTORS: Final = Path(__file__).parents[1] / "vectors" / "nemo_gym_0_7_staging"

# The files whose top level holds a `cases` list (digests.json groups its cases in families).
CASE_FILES: Final = (
    "scenarios.json",
    "verification.json",
    "ledger.json",
    "terminal.json",
    "control_route.json",
)


class VectorCase(TypedDict):
    """One case of any family: what it is called, what it shows, what goes in, what comes out."""

    name: str
    description: str
    inputs: dict[str, Any]
    expected: Any


@cache
def load_staging_vectors(file_name: str) -> dict[str, Any]:
    """The parsed JSON of one vector file, e.g. `load_staging_vectors("ledger.json")`."""
    return cast(dict[str, Any], json.loads((STAGING_VECTORS / file_name).read_text("utf-8")))


def staging_cases(file_name: str) -> list[VectorCase]:
    """The `cases` of one of `CASE_FILES`."""
    return cast(list[VectorCase], load_staging_vectors(file_name)["cases"])


def digest_family(family: str) -> list[VectorCase]:
    """The cases of one family of digests.json, e.g. `digest_family("chain_hash")`."""
    return cast(list[VectorCase], load_staging_vectors("digests.json")["families"][family])


def case_by_name(file_name: str, name: str) -> VectorCase:
    """The case called `name` in one of `CASE_FILES`."""
    for case in staging_cases(file_name):
        if case["name"] == name:
            return case
    raise KeyError(f"{file_name} has no case {name!r}")


def golden_vectors() -> dict[str, Any]:
    """The wheel's own golden digest vectors, copied verbatim."""
    return load_staging_vectors("golden_vectors.json")


def staging_case_ids(cases: list[VectorCase]) -> list[str]:
    """The pytest ids of vector cases: their names."""
    return [case["name"] for case in cases]
