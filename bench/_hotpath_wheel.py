"""The hot-path workload against the real NeMo Gym 0.7.0 wheel, in a Python >= 3.13 subprocess.

`run_wheel` (called by `bench/hotpath.py --gym-python PY --gym-wheel DIR`)
starts this module under PY, an interpreter with pydantic, orjson and numpy
(none of our packages): `python -m bench._hotpath_wheel --wheel DIR ...`. It
imports only the wheel's `token_id_capture` package, under an empty
`nemo_gym` package laid out in a temporary directory with the two constants
modules and `rollout_correlation.py` that package reads, so none of Gym's
server dependencies are needed. Then it runs the shared driver
(`bench/_hotpath_driver.py`) against Gym's own `TokenCaptureStore` and
`FileLineageStore` over a temporary directory, exactly as a 0.7 model server
wires them when no sink is configured, and prints the samples as one JSON
object on stdout.

Standard library only at import time, so it runs outside our virtualenv.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench._hotpath_driver import SideSamples, run_side
from bench._hotpath_workload import ModelCall, Workload

__all__ = ["run_wheel"]

_REPOSITORY = Path(__file__).resolve().parent.parent
_CONSTANTS = {
    "config_types.py": 'ROLLOUT_PATH_PREFIX = "ng-rollout"\n',
    "global_config.py": (
        'TASK_INDEX_KEY_NAME = "_ng_task_index"\n'
        'ROLLOUT_INDEX_KEY_NAME = "_ng_rollout_index"\n'
        'ATTEMPT_INDEX_KEY_NAME = "_ng_attempt_index"\n'
        'ROLLOUT_ID_KEY_NAME = "_ng_rollout_id"\n'
    ),
}


def run_wheel(python: str, wheel: Path, workload: Workload, *, burst_rounds: int) -> SideSamples:
    """Run `workload` against the wheel under `python`; its samples (raises if the run fails)."""
    command = [python, "-m", "bench._hotpath_wheel", "--wheel", str(wheel)]
    command += ["--rollouts", str(workload.rollouts), "--calls", str(workload.calls)]
    command += ["--layout", workload.layout, "--burst-rounds", str(burst_rounds)]
    command += ["--new-prompt-tokens", str(workload.new_prompt_tokens)]
    command += ["--new-generation-tokens", str(workload.new_generation_tokens)]
    environment = {**os.environ, "PYTHONPATH": str(_REPOSITORY), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        command, cwd=_REPOSITORY, env=environment, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"the wheel run failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return SideSamples.from_json(json.loads(done.stdout))


def _import_capture_package(wheel: Path, workdir: Path) -> None:
    """The wheel's `token_id_capture` modules, imported under a stub `nemo_gym` package."""
    package = workdir / "nemo_gym"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, text in _CONSTANTS.items():
        (package / name).write_text(text)
    shutil.copy(wheel / "rollout_correlation.py", package)
    shutil.copytree(
        wheel / "token_id_capture",
        package / "token_id_capture",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    sys.path.insert(0, str(workdir))
    importlib.import_module("nemo_gym.token_id_capture")


class _WheelSide:
    """Gym's file store as the sink, its FileLineageStore as the resolver, its writer stamping."""

    def __init__(self, root: Path) -> None:
        self._records = importlib.import_module("nemo_gym.token_id_capture.records")
        self._lineage_module = importlib.import_module("nemo_gym.token_id_capture.lineage")
        store_module = importlib.import_module("nemo_gym.token_id_capture.store")
        self._store = store_module.TokenCaptureStore(root)
        self._lineage = self._lineage_module.FileLineageStore(root)

    async def resolve(self, rollout_id: str, request_items: list[dict[str, Any]]) -> Any:
        return await self._lineage.resolve(rollout_id, request_items)

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        await self._store.begin_call(rollout_id, model_call_id)

    def entry(self, call: ModelCall, resolution: Any, delta: bool) -> Any:
        """As 0.7's capture_tokens + commit_entry build it (delta split included)."""
        records = self._records
        entry = records.TokenEntry(**call.entry_fields())
        self._lineage_module.stamp_continuation(entry, list(call.request_items))
        match = resolution.match
        cumulative = None
        resolved = resolution.status == records.ParentResolutionStatus.RESOLVED
        if delta and resolved and match is not None and match.cumulative_token_ids:
            parent = list(match.cumulative_token_ids)
            prompt = list(entry.prompt_token_ids)
            if len(prompt) >= len(parent) and prompt[: len(parent)] == parent:
                cumulative = prompt + list(entry.generation_token_ids)
                entry.prompt_token_ids = prompt[len(parent) :]
                entry.prompt_is_delta = True
        records.stamp_lineage(
            entry,
            match.model_call_id if match is not None else None,
            parent_resolution=resolution.status,
            cumulative=cumulative,
        )
        entry.parent_resolution_reason = resolution.reason or ""
        return entry

    async def put(self, entry: Any) -> None:
        await self._store.put(entry)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, required=True, help="the wheel's nemo_gym directory")
    parser.add_argument("--rollouts", type=int, required=True)
    parser.add_argument("--calls", type=int, required=True)
    parser.add_argument("--layout", choices=("delta", "full"), required=True)
    parser.add_argument("--burst-rounds", type=int, required=True)
    parser.add_argument("--new-prompt-tokens", type=int, required=True)
    parser.add_argument("--new-generation-tokens", type=int, required=True)
    args = parser.parse_args()
    workload = Workload(
        rollouts=args.rollouts,
        calls=args.calls,
        delta=args.layout == "delta",
        new_prompt_tokens=args.new_prompt_tokens,
        new_generation_tokens=args.new_generation_tokens,
    )
    with tempfile.TemporaryDirectory(prefix="hotpath-wheel-") as workdir:
        _import_capture_package(args.wheel, Path(workdir))
        side = _WheelSide(Path(workdir) / "capture")
        samples = asyncio.run(run_side(side, workload, burst_rounds=args.burst_rounds))
    json.dump(samples.to_json(), sys.stdout)


if __name__ == "__main__":
    main()
