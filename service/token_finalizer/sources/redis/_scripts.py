"""The redis store's Lua scripts: package resource files, read once per process.

Every script is one state change (or one consistent read) of one rollout,
run with EVALSHA over the rollout's keys (redis-py reloads a script the
server lost, on NOSCRIPT). `prelude.lua` holds the helpers every script may
use and is prepended to each. See docs/store-protocol.md#redis-store.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Final

__all__ = ["SCRIPT_NAMES", "script_source"]

SCRIPT_NAMES: Final = (
    "put",
    "mark_incomplete",
    "begin_call",
    "freeze",
    "drop",
    "committed",
    "resolve",
    "status",
    "inspect",
    "delete",
    "sweep",
    "ledger_record",
    "ledger_failure",
    "ledger_rows",
    "ledger_resolve",
    "stage",
    "staged_chain",
    "staged_read",
    "staging_freeze",
    # Not the store's: the mask-fraction guard's shared count (service/redis_guard.py).
    "guard_observe",
)
_PRELUDE: Final = "prelude"


def _read(name: str) -> str:
    return (resources.files(__package__) / "scripts" / f"{name}.lua").read_text("utf-8")


@functools.cache
def script_source(name: str) -> str:
    """The Lua source of script `name`, prelude included (read from the package once)."""
    if name not in SCRIPT_NAMES:
        raise KeyError(f"no redis script named {name!r}")
    return f"{_read(_PRELUDE)}\n{_read(name)}"
