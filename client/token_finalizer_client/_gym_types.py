"""NeMo Gym's own staging classes, when Gym is in the process; never imported with this package.

Gym's capture code refuses a stage result that is not its `StageResult`,
and its verifier a snapshot that is not its `StagedCallBaseSnapshot`
(docs/staging.md#the-client). So the staging sink answers with Gym's
`StageResult` when Gym's staging records module is already loaded (a worker
running Gym's capture has loaded it), and the staging source builds Gym's
snapshots when that module can be imported at all (a trainer about to run
Gym's verifier); otherwise both use this package's look-alikes
(`_staged_types`). Importing this package never imports Gym: the module is
looked up in `sys.modules`, or imported on the first fetch that needs it.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

__all__ = [
    "GYM_PROTOCOLS",
    "GYM_RECORDS",
    "GYM_STAGING_RECORDS",
    "gym_class",
    "gym_staging_class",
]

# Where NeMo Gym 0.7 defines its staging wire types.
GYM_STAGING_RECORDS = "nemo_gym.token_id_capture.staging.records"
# Where it defines `TokenEntry`, and the `TokenCaptureSnapshot` a TokenSource returns.
GYM_RECORDS = "nemo_gym.token_id_capture.records"
GYM_PROTOCOLS = "nemo_gym.token_id_capture.protocols"

# Modules an import was tried for and failed: not tried again in this process.
_unimportable: set[str] = set()


def _module(name: str, *, load: bool) -> Any:
    module = sys.modules.get(name)
    if module is not None or not load or name in _unimportable:
        return module
    try:
        return importlib.import_module(name)
    except Exception:  # not installed, or broken (Gym needs pydantic): ours are used
        _unimportable.add(name)
        return None


def gym_class(module: str, name: str, *, load: bool = False) -> type | None:
    """Gym's class `name` of `module`, or None when Gym is not there.

    Only a module already loaded is looked at, unless `load` asks to import
    it (once per process; a failed import is not tried again).
    """
    found = getattr(_module(module, load=load), name, None)
    return found if isinstance(found, type) else None


def gym_staging_class(name: str, *, load: bool = False) -> type | None:
    """Gym's staging class `name` (`gym_class` of its staging records module)."""
    return gym_class(GYM_STAGING_RECORDS, name, load=load)
