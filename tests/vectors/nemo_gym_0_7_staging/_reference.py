"""Import the released NeMo Gym 0.7.0 capture package from an unpacked wheel (generator only).

Only ``nemo_gym/token_id_capture`` is imported, under an empty ``nemo_gym``
package built in a scratch directory together with ``rollout_correlation.py``
and stand-ins for the two constants modules it reads; none of NeMo Gym's
server stack is needed. ``control_routes`` needs fastapi, which the scratch
virtual environment provides.
"""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["Gym"]


def _build_package(nemo_gym_dir: Path, workdir: Path) -> None:
    package = workdir / "nemo_gym"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "config_types.py").write_text('ROLLOUT_PATH_PREFIX = "ng-rollout"\n')
    (package / "global_config.py").write_text(
        'TASK_INDEX_KEY_NAME = "_ng_task_index"\n'
        'ROLLOUT_INDEX_KEY_NAME = "_ng_rollout_index"\n'
        'ATTEMPT_INDEX_KEY_NAME = "_ng_attempt_index"\n'
        'ROLLOUT_ID_KEY_NAME = "_ng_rollout_id"\n'
    )
    shutil.copy(nemo_gym_dir / "rollout_correlation.py", package)
    shutil.copytree(
        nemo_gym_dir / "token_id_capture",
        package / "token_id_capture",
        ignore=shutil.ignore_patterns("__pycache__"),
    )


class Gym:
    """The reference modules the staging vectors are computed with."""

    def __init__(self, nemo_gym_dir: Path, workdir: Path) -> None:
        _build_package(nemo_gym_dir, workdir)
        sys.dont_write_bytecode = True
        sys.path.insert(0, str(workdir))
        self.golden_path = nemo_gym_dir / "token_id_capture/staging/conformance/golden_vectors.json"

        def load(name: str) -> ModuleType:
            return importlib.import_module(f"nemo_gym.token_id_capture.{name}")

        self.records = load("records")
        self.fingerprint = load("fingerprint")
        self.protocols = load("protocols")
        self.lineage = load("lineage")
        self.sink = load("sink")
        self.external = load("external_capture")
        self.control = load("control_routes")
        self.terminal = load("terminal")
        self.store = load("store")
        self.vllm = load("adapters.vllm")
        self.staging = load("staging")
        self.staged = load("staging.records")
        self.digest = load("staging.digest")
        self.capture = load("staging.capture")
        self.rebuild = load("staging.rebuild")
        self.selection = load("staging.terminal")
        self.routes = load("staging.routes")
