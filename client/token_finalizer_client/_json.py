"""Decoding JSON answers: orjson when it is installed, the standard library otherwise.

orjson parses a large finalize answer several times faster, but it is an
optional extra (`token-finalizer-client[fast]`), so the package works
without it. Both give the same values for any body the standard library
accepts: orjson refuses a few things the stdlib reads (`NaN` and
`-Infinity`, which Python writers put in log probabilities; integers beyond
64 bits), and those bodies are parsed again by the stdlib.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

__all__ = ["loads"]


def _optional(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


# None when orjson is not installed (tests set it to None to take the stdlib path).
_orjson: Any = _optional("orjson")


def loads(content: bytes | str) -> Any:
    """The parsed JSON document; ValueError (json.JSONDecodeError) when it is not JSON."""
    if _orjson is not None:
        try:
            return _orjson.loads(content)
        except ValueError:  # orjson.JSONDecodeError: retry with the more lenient stdlib
            pass
    return json.loads(content)
