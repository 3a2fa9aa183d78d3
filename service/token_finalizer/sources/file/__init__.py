"""The file capture store: a local directory, NeMo Gym compatible on disk.

_fs        filesystem primitives: regular files only, durable appends, atomic replace
_capture   one rollout's files, lock and state file
store      FileTokenStore: writers, freeze, drop, lineage resolution
admin      FileStoreAdmin: status, inspect, delete, sweep, listing
"""

from __future__ import annotations

from token_finalizer.sources.file.admin import FileStoreAdmin
from token_finalizer.sources.file.store import FileTokenStore

__all__ = ["FileStoreAdmin", "FileTokenStore"]
