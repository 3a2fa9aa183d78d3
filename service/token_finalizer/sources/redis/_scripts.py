"""The redis store's Lua scripts: package resource files, read once per process.

Every script is one state change (or one consistent read) of one rollout,
run with EVALSHA over the rollout's keys (redis-py reloads a script the
server lost, on NOSCRIPT). `prelude.lua` holds the helpers every script may
use and is prepended to each. A script whose first line is a shebang
(`#!lua flags=allow-oom`: the scripts that free memory, or only flag, and so
must run when Redis is at `maxmemory`; Redis 7 refuses any other script that
writes then) keeps it first, above the prelude. See
docs/store-protocol.md#redis-store and docs/capacity.md.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Final

__all__ = ["ALLOWED_UNDER_OOM", "SCRIPT_NAMES", "script_source"]

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
    "staged_clear",
    # Not the store's: the mask-fraction guard's shared count (service/redis_guard.py).
    "guard_observe",
)
_PRELUDE: Final = "prelude"
_SHEBANG: Final = "#!lua"
# The scripts allowed while Redis is at `maxmemory` (their shebang says so).
ALLOWED_UNDER_OOM: Final = frozenset(
    {"freeze", "drop", "sweep", "delete", "mark_incomplete", "staged_clear"}
)


def _read(name: str) -> str:
    return (resources.files(__package__) / "scripts" / f"{name}.lua").read_text("utf-8")


@functools.cache
def script_source(name: str) -> str:
    """The Lua source of script `name`, prelude included (read from the package once)."""
    if name not in SCRIPT_NAMES:
        raise KeyError(f"no redis script named {name!r}")
    body = _read(name)
    if body.startswith(_SHEBANG):
        shebang, _, body = body.partition("\n")
        return f"{shebang}\n{_read(_PRELUDE)}\n{body}"
    return f"{_read(_PRELUDE)}\n{body}"
