"""Verify and linearize a staged rollout: ours vs NeMo Gym 0.7.0's verify_and_linearize.

    .venv/bin/python -m bench.staging_verify [--calls 400] [--carry 400] [--generated 100]
        [--rounds 5] [--reference-python PY --reference-wheel DIR/nemo_gym]

One rollout of ``--calls`` chained calls is staged (each call carries
``--carry`` new prompt tokens and generates ``--generated`` tokens with log
probabilities), then written as a trainer receives it: the receipt and the
fetched base snapshots as JSON. Timed, best and median of ``--rounds``:
reading the snapshots and receipt from parsed JSON (validation and staging
digests included), then ``verify_and_linearize``.

The reference needs Python >= 3.12 and pydantic, so it runs in a subprocess:
``--reference-python`` is that interpreter (with pydantic, orjson and numpy),
``--reference-wheel`` the ``nemo_gym`` directory of the unpacked 0.7.0 wheel.
Only its ``token_id_capture`` package is imported, under a stub ``nemo_gym``
package in a temporary directory. Both sides must produce the same row; the
ratios are reference time / our time. Without the two options only ours is
timed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from bench._common import staged_chain
from bench._gym_reference import REFERENCE_PACKAGE
from tests.support.staging_stores import manifest_row
from token_finalizer.core.staging import (
    CallRecord,
    RolloutReceipt,
    StagedCallBaseSnapshot,
    StagedCallRecord,
    verify_and_linearize,
)

ROLLOUT = "bench-staging"

# Run by the reference interpreter: argv = [wheel's nemo_gym dir, data file, rounds].
_REFERENCE_SCRIPT = (
    REFERENCE_PACKAGE
    + r"""
import hashlib, json, statistics, time

data_path, rounds = Path(sys.argv[2]), int(sys.argv[3])
records = importlib.import_module("nemo_gym.token_id_capture.staging.records")
rebuild = importlib.import_module("nemo_gym.token_id_capture.staging.rebuild")
data = json.loads(data_path.read_text())
read_times, verify_times = [], []
for _ in range(rounds):
    start = time.perf_counter()
    receipt = records.RolloutReceipt.model_validate(data["receipt"])
    snapshots = [records.StagedCallBaseSnapshot.model_validate(s) for s in data["snapshots"]]
    middle = time.perf_counter()
    row = rebuild.verify_and_linearize(receipt, snapshots)
    end = time.perf_counter()
    read_times.append(middle - start)
    verify_times.append(end - middle)
ids = b"".join(token.to_bytes(8, "big") for token in row.token_ids)
print(json.dumps({
    "read": read_times,
    "verify": verify_times,
    "tokens": len(row.token_ids),
    "ids_sha256": hashlib.sha256(ids).hexdigest(),
}))
shutil.rmtree(work)
"""
)


def _staged_rollout(calls: int, carry: int, generated: int) -> list[StagedCallRecord]:
    return staged_chain(ROLLOUT, calls, carry, generated, seed=19)


def _manifest_row(record: StagedCallRecord) -> CallRecord:
    return manifest_row(record, admitted_at=1000.0 + len(record.model_call_id))


def _wire_data(staged: list[StagedCallRecord]) -> dict[str, Any]:
    receipt = RolloutReceipt(
        rollout_id=ROLLOUT,
        reward=1.0,
        terminal_model_call_id=staged[-1].model_call_id,
        manifest=tuple(_manifest_row(record) for record in staged),
        terminal_selection="response_id",
    )
    # Through real JSON bytes, as a fetch delivers them.
    payload = {
        "receipt": receipt.to_json(),
        "snapshots": [record.base_snapshot().to_json() for record in staged],
    }
    data: dict[str, Any] = orjson.loads(orjson.dumps(payload))
    return data


def _timed(function: Callable[[], Any], rounds: int) -> tuple[list[float], Any]:
    times, result = [], None
    for _ in range(rounds):
        start = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - start)
    return times, result


def _ours(data: dict[str, Any], rounds: int) -> dict[str, Any]:
    def read() -> tuple[RolloutReceipt, list[StagedCallBaseSnapshot]]:
        receipt = RolloutReceipt.from_json(data["receipt"])
        return receipt, [StagedCallBaseSnapshot.from_json(item) for item in data["snapshots"]]

    read_times, (receipt, snapshots) = _timed(read, rounds)
    verify_times, row = _timed(lambda: verify_and_linearize(receipt, snapshots), rounds)
    return {
        "read": read_times,
        "verify": verify_times,
        "tokens": len(row.token_ids),
        "ids_sha256": hashlib.sha256(row.token_ids.astype(">u8").tobytes()).hexdigest(),
    }


def _reference(python: str, wheel: Path, data: dict[str, Any], rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as workdir:
        data_path = Path(workdir) / "rollout.json"
        data_path.write_bytes(orjson.dumps(data))
        done = subprocess.run(
            [python, "-c", _REFERENCE_SCRIPT, str(wheel), str(data_path), str(rounds)],
            check=True,
            capture_output=True,
            text=True,
        )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _line(name: str, times: list[float]) -> str:
    best, median = min(times) * 1000, statistics.median(times) * 1000
    return f"{name:<28} best {best:8.1f} ms   median {median:8.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--carry", type=int, default=400)
    parser.add_argument("--generated", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reference-python")
    parser.add_argument("--reference-wheel", type=Path)
    args = parser.parse_args()

    staged = _staged_rollout(args.calls, args.carry, args.generated)
    data = _wire_data(staged)
    tokens = staged[-1].cum_len
    print(
        f"{args.calls} calls, +{args.carry} carry / +{args.generated} generated each: "
        f"{tokens} tokens in the terminal row"
    )
    ours = _ours(data, args.rounds)
    print(_line("ours: read snapshots", ours["read"]))
    print(_line("ours: verify_and_linearize", ours["verify"]))
    if not (args.reference_python and args.reference_wheel):
        print("reference: not run (give --reference-python and --reference-wheel)")
        return
    reference = _reference(args.reference_python, args.reference_wheel, data, args.rounds)
    if reference["ids_sha256"] != ours["ids_sha256"] or reference["tokens"] != ours["tokens"]:
        raise SystemExit("the reference linearized a different row")
    print(_line("reference: read snapshots", reference["read"]))
    print(_line("reference: verify", reference["verify"]))
    for step in ("read", "verify"):
        ratio = min(reference[step]) / min(ours[step])
        print(f"ratio {step:<8} reference / ours = {ratio:6.1f}x (best of {args.rounds})")
    theirs = min(reference["read"]) + min(reference["verify"])
    mine = min(ours["read"]) + min(ours["verify"])
    print(f"ratio total    reference / ours = {theirs / mine:6.1f}x")


if __name__ == "__main__":
    main()
