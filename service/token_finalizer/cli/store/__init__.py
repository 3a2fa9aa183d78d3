"""`token-finalizer store serve|sweep|inspect|delete`: a capture store's admin.

    serve      protocol v1 over a directory or Redis (`serve`)
    sweep      retired tombstones, and if asked abandoned or empty captures (`sweep`)
    inspect    one capture's state as JSON (`admin`)
    delete     one capture for good, after asking (`admin`)

Every command chooses its store once from `--dir DIR` or `--redis URL
[--key-prefix P]` (`backend`) and works on it through the store interface.
"""

from __future__ import annotations

from token_finalizer.cli.store.admin import (
    DELETE_HELP,
    INSPECT_HELP,
    add_delete_arguments,
    add_inspect_arguments,
    store_delete,
    store_inspect,
)
from token_finalizer.cli.store.durations import format_age, parse_duration, parse_ttl
from token_finalizer.cli.store.serve import (
    SERVE_HELP,
    STORE_TOKEN_ENV_VAR,
    add_serve_arguments,
    store_serve,
)
from token_finalizer.cli.store.sweep import SWEEP_HELP, add_sweep_arguments, store_sweep

__all__ = [
    "DELETE_HELP",
    "INSPECT_HELP",
    "SERVE_HELP",
    "STORE_TOKEN_ENV_VAR",
    "SWEEP_HELP",
    "add_delete_arguments",
    "add_inspect_arguments",
    "add_serve_arguments",
    "add_sweep_arguments",
    "format_age",
    "parse_duration",
    "parse_ttl",
    "store_delete",
    "store_inspect",
    "store_serve",
    "store_sweep",
]
