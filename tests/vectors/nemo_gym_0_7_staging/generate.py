"""Regenerate the NeMo Gym 0.7.0 external-staging vectors in this directory (by hand, never in CI).

    python3.13 -m venv VENV && VENV/bin/pip install pydantic orjson numpy fastapi httpx
    VENV/bin/python tests/vectors/nemo_gym_0_7_staging/generate.py --reference WHEEL/nemo_gym

Run it from the repository root with Python 3.13 (the wheel requires it).
``--reference`` is the ``nemo_gym`` directory of the unpacked 0.7.0 wheel
(``pip download --no-deps --ignore-requires-python nemo-gym==0.7.0``, then
unzip). Only its ``token_id_capture`` subpackage is imported (see
``_reference.py``); the serving layer around it is a stub of ours
(``_harness.py``), and the receipt policy is ours (``_trainer.py``). Every
expected value is what the released code answered; README.md describes the
files. The run is deterministic: regenerating gives identical files.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.dont_write_bytecode = True  # leave no __pycache__ in the repository
sys.path.insert(0, str(HERE))

from _control_route import control_route_cases  # noqa: E402
from _digests import digest_cases  # noqa: E402
from _ledger import ledger_cases  # noqa: E402
from _reference import Gym  # noqa: E402
from _scenarios import run_scenarios  # noqa: E402
from _terminal import terminal_cases  # noqa: E402
from _verification import verification_cases  # noqa: E402

HEADER = {
    "generated_by": "tests/vectors/nemo_gym_0_7_staging/generate.py",
    "reference": "nemo-gym 0.7.0",
}


def scalar(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def render(value: Any, depth: int = 0) -> str:
    """Sorted-key JSON, one member per line, short containers and scalar lists inline."""
    inline = json.dumps(
        value, sort_keys=True, ensure_ascii=False, allow_nan=False, separators=(", ", ": ")
    )
    scalars_only = isinstance(value, list) and not any(isinstance(v, dict | list) for v in value)
    if not isinstance(value, dict | list) or scalars_only or len(inline) + 2 * depth <= 96:
        return inline
    pad, inner = "  " * depth, "  " * (depth + 1)
    if isinstance(value, list):
        members = [inner + render(item, depth + 1) for item in value]
        return "[\n" + ",\n".join(members) + "\n" + pad + "]"
    members = [f"{inner}{scalar(key)}: {render(value[key], depth + 1)}" for key in sorted(value)]
    return "{\n" + ",\n".join(members) + "\n" + pad + "}"


def write(name: str, payload: Any) -> None:
    path = HERE / name
    text = render(payload)
    if json.loads(text) != json.loads(json.dumps(payload)):
        raise AssertionError(f"{name} does not round-trip")
    path.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {path.relative_to(HERE.parents[2])} ({len(text) // 1024} KiB)")


async def generate(gym: Gym, workdir: Path) -> None:
    runs = await run_scenarios(gym, workdir / "scenarios")
    write("scenarios.json", {**HEADER, "cases": [run.case for run in runs.values()]})
    write(
        "verification.json",
        {**HEADER, "cases": verification_cases(gym, runs["clean_chain"])},
    )
    families = digest_cases(gym)
    write("digests.json", {**HEADER, "families": families})
    twins = runs["identical_retry_file_ledger"]
    ledger = await ledger_cases(gym, runs["clean_chain"], twins, workdir / "ledger")
    write("ledger.json", {**HEADER, "cases": ledger})
    write("terminal.json", {**HEADER, "cases": terminal_cases(gym, runs)})
    control = await control_route_cases(gym, runs, workdir)
    write("control_route.json", {**HEADER, **control})
    shutil.copyfile(gym.golden_path, HERE / "golden_vectors.json")
    print("copied golden_vectors.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--reference", type=Path, required=True)
    args = parser.parse_args()
    # The package logs every deliberate fault (with tracebacks); the vectors record them.
    logging.disable(logging.CRITICAL)
    with tempfile.TemporaryDirectory() as scratch:
        workdir = Path(scratch)
        (workdir / "package").mkdir()
        gym = Gym(args.reference, workdir / "package")
        asyncio.run(generate(gym, workdir))


if __name__ == "__main__":
    main()
