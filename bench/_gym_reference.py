"""NeMo Gym 0.7.0's own in-process finalize, timed in a subprocess (a benchmark baseline).

The released wheel needs Python >= 3.12 and pydantic, so it runs under
another interpreter: `python` with pydantic, orjson and numpy, and `wheel`
the `nemo_gym` directory of the unpacked 0.7.0 wheel. Only its
`token_id_capture` package is imported, under a stub `nemo_gym` package in a
temporary directory (the rest of the wheel needs a whole Gym installation).
Each round freezes a fresh copy of the capture with 0.7's own file store and
runs `finalize_rollout_token_capture` on a finished record, as a 0.7 trainer
does in process; the time covers the freeze, the build and the projection.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

__all__ = ["REFERENCE_PACKAGE", "reference_times"]

# The start of every script the reference interpreter runs (argv[1]: the wheel's nemo_gym
# directory): the wheel's token_id_capture package under a stub `nemo_gym` package in a
# temporary directory `work`, first on sys.path. The script removes `work` when done.
REFERENCE_PACKAGE = r"""
import importlib, shutil, sys, tempfile
from pathlib import Path

wheel = Path(sys.argv[1])
work = Path(tempfile.mkdtemp())
package = work / "nemo_gym"
package.mkdir()
(package / "__init__.py").write_text("")
(package / "config_types.py").write_text('ROLLOUT_PATH_PREFIX = "ng-rollout"\n')
(package / "global_config.py").write_text(
    'TASK_INDEX_KEY_NAME = "_ng_task_index"\nROLLOUT_INDEX_KEY_NAME = "_ng_rollout_index"\n'
    'ATTEMPT_INDEX_KEY_NAME = "_ng_attempt_index"\nROLLOUT_ID_KEY_NAME = "_ng_rollout_id"\n'
)
shutil.copy(wheel / "rollout_correlation.py", package)
shutil.copytree(wheel / "token_id_capture", package / "token_id_capture")
sys.path.insert(0, str(work))
"""

# After REFERENCE_PACKAGE; argv: the wheel's nemo_gym directory, the capture directory,
# the rollout id, rounds.
_SCRIPT = (
    REFERENCE_PACKAGE
    + r"""
import asyncio, json, time

capture, rollout_id, rounds = Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
delivery = importlib.import_module("nemo_gym.token_id_capture.delivery")
store_module = importlib.import_module("nemo_gym.token_id_capture.store")
times = []
for _ in range(rounds):
    directory = work / "capture"
    shutil.rmtree(directory, ignore_errors=True)
    shutil.copytree(capture, directory)
    record = {
        "_ng_rollout_id": rollout_id,
        "reward": 1.0,
        "response": {"id": "r", "model": "policy", "object": "response", "output": []},
    }
    store = store_module.TokenCaptureStore(directory)
    started = time.perf_counter()
    built = asyncio.run(delivery.finalize_rollout_token_capture(record, store))
    times.append(time.perf_counter() - started)
    assert built is not None and not built.get("mask_sample"), (built or {}).get("error")
    output = record["response"]["output"]
    assert output and output[-1]["prompt_token_ids"], "the reference built nothing"
shutil.rmtree(work)
print(json.dumps({"times": times}))
"""
)


def reference_times(
    python: str, wheel: Path, capture_dir: Path, rollout_id: str, rounds: int
) -> list[float]:
    """Seconds of each round of NeMo Gym 0.7.0's in-process finalize of the capture."""
    out = subprocess.run(
        [python, "-c", _SCRIPT, str(wheel), str(capture_dir), rollout_id, str(rounds)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    times: list[float] = json.loads(out.strip().splitlines()[-1])["times"]
    return times
