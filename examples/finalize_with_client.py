"""Rollout harness: finalize a finished rollout, write the record durably, then retire it.

For: whoever runs the rollout harness (the loop that collects finished agent
rollouts for the trainer). Per finished rollout it

1. posts the record to the finalizer (`FinalizerClient.finalize`): the
   capture is frozen and the record comes back with its exact tokens in
   `response.output`, or masked (`mask_sample: true`) with the reason;
2. appends the finalize answer to a JSONL file and fsyncs it (your durable
   write: the trainer's acceptance, a local fsync...);
3. only then retires the capture it consumed (`client.retire(finalized)`), or
   with --no-retire leaves that to the trainer
   (examples/retire_after_durable_write.py).

Run, with `token-finalizer serve` running and a capture written
(examples/write_capture_file.py):

    .venv/bin/python examples/finalize_with_client.py
    .venv/bin/python examples/finalize_with_client.py --rollout-id 7-0 --out /data/finalized.jsonl
    .venv/bin/python examples/finalize_with_client.py --record my-record.json --no-retire
    FINALIZER_URL=http://finalizer:8000 FINALIZER_TOKEN=... .venv/bin/python ...

Without --record it finalizes the record of the example rollout (the one the
write_capture_* examples write) under --rollout-id; `--record
staging-record.json` finalizes the one examples/write_staging_rollout.py
wrote, and prints its verified row. Each line of the output
file is a whole finalize answer (`record`, `build`, `retire`...), the same
lines `token-finalizer finalize` writes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from token_finalizer_client import (
    APIConnectionError,
    Finalized,
    FinalizerClient,
    FinalizerError,
    MaskFractionExceeded,
)


def example_record(rollout_id: str) -> dict[str, Any]:
    """The finished record of the example rollout, as a harness holds it after the episode.

    `_ng_rollout_id` is the capture key the model server wrote under (or give
    `_ng_task_index` and `_ng_rollout_index`: key "<task>-<rollout>").
    `response` is the final model response, the one the reward was computed
    for: the finalizer matches it (by `id`, or by content) to the call that
    produced it, and the rebuilt output ends with that call.
    """
    return {
        "_ng_rollout_id": rollout_id,
        "reward": 1.0,
        "agent_ref": {"name": "quickstart_agent"},
        "response": {
            "id": f"resp-{rollout_id}-2",
            "output": [
                {"type": "message", "role": "assistant", "content": "notes.txt has 3 lines."}
            ],
        },
    }


def append_durably(path: Path, answer: dict[str, Any]) -> None:
    """Append one JSON line and fsync it (and a new file's directory) before returning."""
    new = not path.exists()
    with open(path, "ab") as handle:
        handle.write(json.dumps(answer).encode() + b"\n")
        handle.flush()
        os.fsync(handle.fileno())
    if new:  # the file's directory entry has to survive a crash too
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def describe(finalized: Finalized) -> None:
    """Print what the trainer gets: masked or not, and the token-bearing items."""
    record = finalized.record
    metrics = record.get("_ng_token_capture") or {}
    print(f"finalized rollout {finalized.rollout_id} (source {finalized.source})")
    print(f"  mask_sample: {json.dumps(finalized.masked)}")
    if finalized.masked:
        reason = metrics.get("mask_reason") or metrics.get("error")
        print(f"  mask reason: {reason}  (the trainer skips this record)")
    output = (record.get("response") or {}).get("output") or []
    for index, item in enumerate(output):
        if isinstance(item, dict) and "generation_token_ids" in item:
            print(
                f"  output[{index}] {item.get('type')}: "
                f"prompt_token_ids {len(item['prompt_token_ids'])}, "
                f"generation_token_ids {len(item['generation_token_ids'])}, "
                f"generation_log_probs {len(item['generation_log_probs'])}"
            )
    if "generated_tokens_delivered" in metrics:
        print(
            f"  delivered: {metrics['generated_tokens_delivered']} of "
            f"{metrics['generated_tokens_captured']} generated tokens "
            f"(delivered_fraction {metrics['delivered_fraction']}), "
            f"calls {metrics['n_calls']}, chains {metrics['chains']}, roots {metrics['roots']}"
        )
    terminal = metrics.get("terminal_attribution") or {}
    if terminal.get("call_id"):
        print(f"  the scored response came from {terminal['call_id']} ({terminal['method']})")
    staged = finalized.staged  # an external-staging rollout (docs/staging.md): its verified row
    if staged is not None and staged.row is not None:
        row = staged.row
        print(
            f"  verified row: {len(row.token_ids)} tokens ({int(sum(row.token_mask))} generated), "
            f"prompt_len {row.prompt_len}, calls {', '.join(row.model_call_ids)}"
        )
    elif staged is not None and staged.error is not None:
        print(f"  no verified row: {staged.error.code}: {staged.error.detail}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--finalizer-url",
        default=os.environ.get("FINALIZER_URL", "http://127.0.0.1:8000"),
        help="the finalizer (default: $FINALIZER_URL or http://127.0.0.1:8000)",
    )
    parser.add_argument("--rollout-id", default="quickstart-0", help="default: quickstart-0")
    parser.add_argument("--record", type=Path, help="a JSON file holding the record to finalize")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(os.environ.get("FINALIZED_JSONL", "finalized.jsonl")),
        help="the durable JSONL output (default: $FINALIZED_JSONL or ./finalized.jsonl)",
    )
    parser.add_argument(
        "--no-retire", action="store_true", help="leave retiring to the trainer side"
    )
    args = parser.parse_args()

    if args.record is not None:
        record = json.loads(args.record.read_text())
    else:
        record = example_record(args.rollout_id)
    token = os.environ.get("FINALIZER_TOKEN") or None  # when the service has auth.bearer_tokens
    try:
        # Open one client per process and reuse it; run_id is what the service's
        # mask-fraction guard counts this run under.
        with FinalizerClient(args.finalizer_url, token=token, run_id="quickstart") as client:
            finalized = client.finalize(record)
            describe(finalized)

            append_durably(args.out, finalized.to_answer())
            print(f"appended the finalize answer to {args.out} (fsynced)")

            if not finalized.retirable:
                print("nothing to retire: a masked build keeps its capture as evidence")
            elif args.no_retire:
                print("not retired (--no-retire): the trainer retires it after its own write")
            else:
                # Only now: the record is durable, so the capture may go.
                retired = client.retire(finalized)
                print(f"retired: {json.dumps(retired)}")
    except MaskFractionExceeded as exc:
        print(f"error: the run is refused, too many masked records: {exc}", file=sys.stderr)
        return 1
    except APIConnectionError as exc:
        print(
            f"error: cannot reach the finalizer at {args.finalizer_url} ({exc}); "
            "start it with `.venv/bin/token-finalizer serve`",
            file=sys.stderr,
        )
        return 2
    except FinalizerError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
