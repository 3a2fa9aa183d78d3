"""Field rules shared by the staging wire types (docs/staging.md#types).

Each reader takes the raw value and returns it normalized, or raises
``StagingRecordError`` naming the type and the field. The rules are NeMo Gym
0.7.0's: integers are exact ints (a JSON ``1.0`` and booleans are refused),
floats accept ints (a JSON ``0`` is ``0.0``) but never booleans or non-finite
values, identifiers are non-empty strings, digests are 64 lowercase hex
characters, and unknown keys are refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from typing import TypeVar

from token_finalizer.core.staging._arrays import (
    FloatColumn,
    TokenColumn,
    float_array,
    token_array,
)
from token_finalizer.core.staging.digests import is_hex_digest

__all__ = ["Fields", "StagingRecordError"]

T = TypeVar("T")


class StagingRecordError(ValueError):
    """A staging wire value breaks its type's rules; ``field`` names the offending field."""

    def __init__(self, type_name: str, field: str, problem: str) -> None:
        self.type_name = type_name
        self.field = field
        self.problem = problem
        super().__init__(f"{type_name}.{field}: {problem}")


class Fields:
    """The readers for one wire type, so every error names that type."""

    __slots__ = ("type_name",)

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name

    def fail(self, field: str, problem: str) -> StagingRecordError:
        return StagingRecordError(self.type_name, field, problem)

    def keys(self, data: object, allowed: Collection[str], required: Collection[str]) -> None:
        """``data`` is a mapping with every required key and no unknown one."""
        if not isinstance(data, Mapping):
            raise self.fail("*", f"must be a JSON object, got {type(data).__name__}")
        for key in data:
            if key not in allowed:
                raise self.fail(str(key), "unknown field (extra fields are not permitted)")
        for key in required:
            if key not in data:
                raise self.fail(key, "field required")

    def identifier(self, field: str, value: object) -> str:
        if type(value) is not str:
            raise self.fail(field, f"must be a string, got {type(value).__name__}")
        if not value:
            raise self.fail(field, "must be a non-empty string")
        return value

    def optional_identifier(self, field: str, value: object) -> str | None:
        return None if value is None else self.identifier(field, value)

    def text(self, field: str, value: object) -> str | None:
        """An optional string that may be empty (reasons and error texts)."""
        if value is not None and type(value) is not str:
            raise self.fail(field, f"must be a string or null, got {type(value).__name__}")
        return value

    def count(self, field: str, value: object) -> int:
        """A non-negative exact int."""
        if type(value) is not int:
            raise self.fail(field, f"must be an integer, got {type(value).__name__}")
        if value < 0:
            raise self.fail(field, f"must be >= 0, got {value}")
        return value

    def version(self, field: str, value: object, expected: int) -> int:
        # An integral float equal to the version passes, as it does in the reference.
        if type(value) not in (int, float) or value != expected:
            raise self.fail(field, f"must be {expected}, got {value!r}")
        return expected

    def boolean(self, field: str, value: object) -> bool:
        if type(value) is not bool:
            raise self.fail(field, f"must be a boolean, got {type(value).__name__}")
        return value

    def number(self, field: str, value: object) -> float:
        """A finite float; an int is taken as its float, a boolean is refused."""
        if type(value) is int:
            try:
                value = float(value)
            except OverflowError:
                raise self.fail(field, "integer too large for a float") from None
        if type(value) is not float:
            raise self.fail(field, f"must be a number, got {type(value).__name__}")
        if not math.isfinite(value):
            raise self.fail(field, f"must be finite, got {value!r}")
        return value

    def optional_number(self, field: str, value: object) -> float | None:
        return None if value is None else self.number(field, value)

    def digest(self, field: str, value: object) -> str:
        if not is_hex_digest(value):
            raise self.fail(field, "must be 64 lowercase hex characters")
        assert isinstance(value, str)
        return value

    def optional_digest(self, field: str, value: object) -> str | None:
        return None if value is None else self.digest(field, value)

    def choice(self, field: str, value: object, allowed: Collection[str]) -> str:
        if type(value) is not str or value not in allowed:
            raise self.fail(field, f"must be one of {sorted(allowed)}, got {value!r}")
        return value

    def token_ids(self, field: str, value: object) -> TokenColumn:
        return self._column(token_array, field, value)

    def floats(self, field: str, value: object) -> FloatColumn:
        return self._column(float_array, field, value)

    def _column(self, convert: Callable[[object], T], field: str, value: object) -> T:
        try:
            return convert(value)
        except ValueError as error:
            raise self.fail(field, str(error)) from None

    def items(self, field: str, value: object, read: Callable[[object], T]) -> tuple[T, ...]:
        """A JSON array, each element read by ``read``."""
        if not isinstance(value, list | tuple):
            raise self.fail(field, f"must be a list, got {type(value).__name__}")
        return tuple(read(item) for item in value)
