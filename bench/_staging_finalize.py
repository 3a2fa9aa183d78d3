"""Finalize of a long staged rollout to a verified row: the finalizer vs the trainer doing it.

One rollout of `calls` chained calls (each `carry` new prompt tokens and
`generated` generated ones) is staged in a capture directory with its
committed ledger rows, and served by `store serve`. Two ways to get its
verified row, each timed over `rounds`:

- ours: `FinalizerClient.finalize(record)` against `token-finalizer serve`,
  whose `http` source reads the store server: the freeze (manifest and
  snapshots in one answer), the receipt, `verify_and_linearize`, the extras
  check, and the row answered compact and decoded into numpy by the client;
- the reference, in the trainer's process (NeMo Gym 0.7.0 needs Python 3.13,
  so it runs in a subprocess of `--reference-python`): the manifest from the
  store server's control route, Gym's own `RolloutReceipt`,
  `HttpStagingSource.fetch` of every manifest key (Gym's snapshot models),
  and the wheel's `verify_and_linearize` (`total`); then, timed apart, the
  extras check ours makes, through `HttpStagingSource.fetch_extras` (one
  call per chain call, as the protocol reads extras) and the wheel's
  `compute_extras_digest`.

Both must give the same token ids.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from bench._gym_reference import REFERENCE_PACKAGE
from bench.staging_verify import ROLLOUT, _manifest_row, _staged_rollout
from tests.support.servers import free_port, running_process
from token_finalizer import FileTokenStore
from token_finalizer.core.staging import commit_row
from token_finalizer_client import FinalizerClient

__all__ = ["FinalizeRun", "finalize_servers", "run_ours", "run_reference", "stage_rollout"]

FINALIZER, CONTROL = "bench-finalizer", "bench-control"

# Run by the reference interpreter after REFERENCE_PACKAGE:
# argv = [wheel, store url, finalizer token, control token, rollout id, response id, rounds].
_REFERENCE_TRAINER = (
    REFERENCE_PACKAGE
    + r"""
import hashlib, json, time
import httpx
from token_finalizer_client import HttpStagingSource

store, token, control, rollout_id, response_id = sys.argv[2:7]
rounds = int(sys.argv[7])
records = importlib.import_module("nemo_gym.token_id_capture.staging.records")
rebuild = importlib.import_module("nemo_gym.token_id_capture.staging.rebuild")
digest = importlib.import_module("nemo_gym.token_id_capture.staging.digest")
source = HttpStagingSource(store, token=token, timeout=120.0)
manifest_path = f"/training-token-capture/control/rollouts/{rollout_id}/manifest"
times = {"manifest": [], "fetch": [], "verify": [], "total": [], "extras": []}
with httpx.Client(base_url=store, headers={"Authorization": f"Bearer {control}"}) as http:
    for _ in range(rounds):
        start = time.perf_counter()
        manifest = records.RolloutManifest.model_validate(http.get(manifest_path).json())
        terminal = next(r for r in manifest.records if r.response_id == response_id)
        receipt = records.RolloutReceipt(
            rollout_id=rollout_id,
            reward=1.0,
            terminal_model_call_id=terminal.model_call_id,
            manifest=manifest.records,
            terminal_selection="response_id",
        )
        fetched = time.perf_counter()
        snapshots = source.fetch([record.staging_key for record in manifest.records])
        verified = time.perf_counter()
        row = rebuild.verify_and_linearize(receipt, snapshots)
        end = time.perf_counter()
        times["manifest"].append(fetched - start)
        times["fetch"].append(verified - fetched)
        times["verify"].append(end - verified)
        times["total"].append(end - start)
        # The extras check of the chain (what ours does too), one fetch per call as the
        # StagingSource protocol reads extras: timed apart from the total.
        for commitment in row.extras_commitments:
            extras = source.fetch_extras(f"{rollout_id}/{commitment.model_call_id}")
            assert digest.compute_extras_digest(extras) == commitment.extras_digest
        times["extras"].append(time.perf_counter() - end)
source.close()
ids = b"".join(token.to_bytes(8, "big") for token in row.token_ids)
print(json.dumps({**times, "tokens": len(row.token_ids),
                  "ids_sha256": hashlib.sha256(ids).hexdigest()}))
shutil.rmtree(work)
"""
)


@dataclass(frozen=True, slots=True)
class FinalizeRun:
    """One side's per-round times (seconds) and the row it produced."""

    times: dict[str, list[float]]
    tokens: int
    ids_sha256: str

    def best_ms(self, step: str = "total") -> float:
        return min(self.times[step]) * 1000

    def median_ms(self, step: str = "total") -> float:
        return statistics.median(self.times[step]) * 1000


def stage_rollout(directory: Path, calls: int, carry: int, generated: int) -> dict[str, Any]:
    """Stage the rollout and commit its rows in `directory`; the finished record to finalize."""
    staged = _staged_rollout(calls, carry, generated)

    async def write() -> None:
        store = FileTokenStore(directory)
        chain: list[str] = []
        try:
            for record in staged:
                await store.stage(record)
                chain.append(record.staging_key)
                row = commit_row(
                    _manifest_row(record),
                    staging_chain=chain,
                    fingerprint="",
                    context_len=0,
                    context_digest="0" * 64,
                )
                await store.record_ledger_row(ROLLOUT, row)
        finally:
            await store.close()

    anyio.run(write)
    terminal = staged[-1].model_call_id
    return {"_ng_rollout_id": ROLLOUT, "response": {"id": f"resp-{terminal}"}, "reward": 1.0}


@contextmanager
def finalize_servers(directory: Path) -> Iterator[tuple[str, str]]:
    """`store serve` over `directory` and `serve` reading it over HTTP: (store, finalizer) URLs."""
    with ExitStack() as stack:
        store_port, finalizer_port = free_port(), free_port()
        args = ["store", "serve", "--dir", str(directory), "--port", str(store_port)]
        args += ["--finalizer-token", FINALIZER, "--control-token", CONTROL]
        stack.enter_context(running_process(args, port=store_port))
        store = f"http://127.0.0.1:{store_port}"
        config = directory.parent / "finalizer.yaml"
        config.write_text(
            "sources:\n  default: store\n"
            f'  store: {{kind: http, url: "{store}", token: "{FINALIZER}"}}\n'
            'retire:\n  key: "bench-staging-retire-key-0123456789abcdef"\n'
        )
        serve = ["serve", "--config", str(config), "--port", str(finalizer_port)]
        stack.enter_context(running_process(serve, port=finalizer_port))
        yield store, f"http://127.0.0.1:{finalizer_port}"


def run_ours(finalizer: str, record: dict[str, Any], rounds: int) -> FinalizeRun:
    """`FinalizerClient.finalize` to a verified, decoded row, `rounds` times."""
    times: list[float] = []
    row: Any = None
    with FinalizerClient(finalizer, timeout=300.0) as client:
        for _ in range(rounds):
            start = time.perf_counter()
            finalized = client.finalize(record)
            times.append(time.perf_counter() - start)
            if finalized.staged is None or finalized.staged.row is None:
                raise SystemExit(f"the finalizer verified no row: {finalized.build}")
            row = finalized.staged.row
    ids = row.token_ids.astype(">u8").tobytes()
    return FinalizeRun({"total": times}, len(row.token_ids), hashlib.sha256(ids).hexdigest())


def run_reference(
    python: str, wheel: Path, store: str, record: dict[str, Any], rounds: int
) -> FinalizeRun:
    """The trainer's own verification with the wheel, in a `python` (3.13) subprocess."""
    args = [python, "-c", _REFERENCE_TRAINER, str(wheel), store, FINALIZER, CONTROL]
    args += [record["_ng_rollout_id"], record["response"]["id"], str(rounds)]
    done = subprocess.run(args, check=True, capture_output=True, text=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    tokens, digest = result.pop("tokens"), result.pop("ids_sha256")
    return FinalizeRun(result, tokens, digest)
