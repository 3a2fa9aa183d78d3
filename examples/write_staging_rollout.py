"""Model server and inference worker in external staging: stage two calls, commit their ledger rows.

For: whoever wires NeMo Gym 0.7's external staging (`external_staging: true`)
to the capture store, or writes a model server of their own that must do what
Gym's does (docs/staging.md#flow). Per model call:

1. the model server resolves the request's parent in its ledger
   (`HttpCaptureLedger.resolve`): a request without a model-authored item is
   a root; otherwise the ledger names the committed call it continues;
2. the inference worker generates, builds the call's staged record (the
   delta past the parent's end, its digests and hashes: what Gym's worker
   computes, here with `token_finalizer.core.staging.build_staged_call`) and
   stages it (`HttpStagingSink.stage`, which answers a `StageResult`);
3. the model server commits the call's ledger row (`HttpCaptureLedger.record`)
   from the staged record's columns, the served response id and the
   fingerprints of its items; a call that did not stage gets a failure row.

Then it writes the finished record a harness finalizes (`--record-out`), so
that `examples/finalize_with_client.py --record FILE` answers the verified,
linearized row of the terminal call's chain.

Run, with a store serving (`token-finalizer store serve --dir capture-store`)
and a finalizer reading it through an `http` source (docs/quickstart.md,
"Remote capture store"):

    .venv/bin/python examples/write_staging_rollout.py
    .venv/bin/python examples/finalize_with_client.py --record staging-record.json
    .venv/bin/python examples/write_staging_rollout.py --store-url http://store:8100 --rollout-id s7
    export CAPTURE_STORE_URL=http://store:8100 CAPTURE_TOKEN=...  # the store's writer token

The tokenizer and the model are toys (one token per UTF-8 byte, scripted
answers); the ledger, the sink and the wire formats are the real ones.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from token_finalizer.core.staging import StagedCallRecord, build_staged_call
from token_finalizer_client import ConflictError, FinalizerError, HttpCaptureLedger, HttpStagingSink
from token_finalizer_client.protocol import (
    FINGERPRINT_VERSION,
    assistant_fingerprint,
    check_new_rollout_id,
)

WEIGHT_VERSION = 3  # the policy's weight version that served the calls
FAILED_TO_STAGE = ("worker_capture_failed", "request_finished_without_staged_coordinates")

# The conversation: the task, then one scripted answer per model call. After
# the first answer the harness adds the tool's output and calls the model again.
TASK = [
    {"role": "system", "content": "You answer with a shell command, then with the result."},
    {"role": "user", "content": "How many lines are in notes.txt?"},
]
ANSWERS = ["run: wc -l notes.txt", "notes.txt has 3 lines."]
TOOL_OUTPUT = {"role": "user", "content": "tool output: 3 notes.txt"}


def tokenize(items: list[dict[str, Any]]) -> list[int]:
    """A toy chat template and tokenizer: one token per UTF-8 byte. Yours is the served model's."""
    return list("".join(f"<{item['role']}>{item['content']}" for item in items).encode())


def sample(text: str) -> tuple[list[int], list[float]]:
    """The scripted model: the sampled token ids of `text` and one log probability each."""
    generated = list(text.encode())
    return generated, [round(-0.01 * (i % 7 + 1), 2) for i in range(len(generated))]


class Worker:
    """The inference worker: generates on the parent's exact tokens and stages each call."""

    def __init__(self, sink: HttpStagingSink) -> None:
        self.sink = sink
        self.staged: dict[str, StagedCallRecord] = {}  # its prefix cache, by call id
        self.sequences: dict[str, list[int]] = {}  # each call's prompt + generation

    def generate_and_stage(
        self,
        rollout_id: str,
        call_id: str,
        parent_id: str | None,
        new_items: list[dict[str, Any]],
        text: str,
    ) -> tuple[StagedCallRecord, bool, str]:
        """Serve one call: (its staged record, whether it staged, the store's error if not)."""
        parent = None if parent_id is None else self.staged[parent_id]
        # The prompt starts with the parent's whole sequence, token for token:
        # a continuation is never re-tokenized from text (that is what staging proves).
        prefix = [] if parent_id is None else self.sequences[parent_id]
        prompt = prefix + tokenize(new_items)
        generated, log_probs = sample(text)
        record = build_staged_call(
            rollout_id=rollout_id,
            model_call_id=call_id,
            parent=parent,
            prompt_token_ids=prompt,
            generated_token_ids=generated,
            generated_log_probs=log_probs,
            weight_version=WEIGHT_VERSION,
        )
        result = self.sink.stage(record.to_json())  # blocking; Gym calls it from its threads
        self.staged[call_id] = record
        self.sequences[call_id] = prompt + generated
        return record, result.ok, result.error or ""


def commit(
    record: StagedCallRecord,
    staging_chain: list[str],
    request_items: list[dict[str, Any]],
    response_items: list[dict[str, Any]],
    response_id: str,
    admitted_at: float,
) -> dict[str, Any]:
    """The model server's ledger commit for a staged call (Gym's `CaptureLedgerCommit`, as JSON).

    The record part is the manifest row: the staged record's custody columns,
    plus what only the model server knows (the response id it served, when it
    admitted the call, the fingerprints that let the next call find this one).
    """
    return {
        "rollout_id": record.rollout_id,
        "record": {
            "model_call_id": record.model_call_id,
            "parent_call_id": record.parent_call_id,
            "mode": record.mode,
            "prev_len": record.prev_len,
            "delta_len": record.delta_len,
            "cum_len": record.cum_len,
            "weight_version": record.weight_version,
            "digest": record.digest,
            "extras_digest": record.extras_digest,
            "staging_key": f"{record.rollout_id}/{record.model_call_id}",
            "chain_hash": record.chain_hash,
            "cumulative_hash": record.cumulative_hash,
            "response_id": response_id,
            "admitted_at": admitted_at,
            "output_fingerprint": assistant_fingerprint(response_items),
            "continuation_fingerprint": assistant_fingerprint(request_items + response_items),
            "fingerprint_version": FINGERPRINT_VERSION,
        },
        # The staging keys of the call's ancestors and its own, root first.
        "staging_chain": [*staging_chain, f"{record.rollout_id}/{record.model_call_id}"],
        "request_items": request_items,
        "response_items": response_items,
    }


async def serve_call(
    ledger: HttpCaptureLedger,
    worker: Worker,
    rollout_id: str,
    call_id: str,
    items: list[dict[str, Any]],
    text: str,
) -> list[dict[str, Any]]:
    """One model call, model server and worker: resolve, generate and stage, commit. The output."""
    admitted_at = time.time()
    resolution = await ledger.resolve(rollout_id, items)  # the items' hashes only are sent
    match = resolution.match
    if match is None and resolution.status != "root":
        raise SystemExit(f"error: {call_id}'s parent is not in the ledger ({resolution.status})")
    parent_id = None if match is None else match.model_call_id
    chain = [] if match is None else list(match.staging_chain)
    # The worker gets only the items past the parent's request and response.
    new_items = items if match is None else items[-1:]
    record, staged, error = await asyncio.to_thread(
        worker.generate_and_stage, rollout_id, call_id, parent_id, new_items, text
    )
    response = [{"role": "assistant", "content": text}]
    if not staged:
        # Gym's two rows for a call that did not stage: the rollout is masked, never trained on.
        for reason in FAILED_TO_STAGE:
            await ledger.record_failure(rollout_id, call_id, reason)
        raise SystemExit(f"error: {call_id} did not stage: {error}")
    await ledger.record(commit(record, chain, items, response, f"resp-{call_id}", admitted_at))
    return response


async def write_rollout(ledger: HttpCaptureLedger, worker: Worker, rollout_id: str) -> list[Any]:
    """The rollout's two calls, each continuing the one before; the last call's output."""
    items = list(TASK)
    output: list[dict[str, Any]] = []
    for index, text in enumerate(ANSWERS):
        if index:
            items = [*items, *output, TOOL_OUTPUT]
        output = await serve_call(ledger, worker, rollout_id, f"call-{index}", items, text)
    return output


def finished_record(rollout_id: str, output: list[dict[str, Any]]) -> dict[str, Any]:
    """The record the harness finalizes: the last response (the one scored) and its id."""
    last = f"call-{len(ANSWERS) - 1}"
    message = {
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": output[0]["content"], "annotations": []}],
    }
    response = {"id": f"resp-{last}", "object": "response", "output": [message]}
    return {"_ng_rollout_id": rollout_id, "reward": 1.0, "response": response}


async def run(url: str, token: str | None, rollout_id: str) -> list[dict[str, Any]]:
    # One ledger per model-server process and one sink per worker, opened once.
    ledger = HttpCaptureLedger(url, token=token, timeout=10.0)
    try:
        with HttpStagingSink(url, token=token, timeout=10.0) as sink:
            worker = Worker(sink)
            output = await write_rollout(ledger, worker, rollout_id)
            for call_id, record in worker.staged.items():
                print(
                    f"  {call_id}: {record.mode}, prev_len {record.prev_len}, "
                    f"delta_len {record.delta_len}, cum_len {record.cum_len}"
                )
            return output
    finally:
        await ledger.close()


def rollout_id_argument(value: str) -> str:
    """--rollout-id, refused up front unless finalize could ever take it (NeMo Gym's rule)."""
    try:
        return check_new_rollout_id(value, "rollout id")
    except ValueError as invalid:
        raise argparse.ArgumentTypeError(str(invalid)) from None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--store-url",
        default=os.environ.get("CAPTURE_STORE_URL", "http://127.0.0.1:8100"),
        help="the capture store (default: $CAPTURE_STORE_URL or http://127.0.0.1:8100)",
    )
    parser.add_argument(
        "--rollout-id",
        type=rollout_id_argument,
        default="staging-0",
        help="letters, digits, '.', '_' or '-', starting with a letter or digit "
        "(default: staging-0)",
    )
    parser.add_argument(
        "--record-out",
        type=Path,
        default=Path("staging-record.json"),
        help="where the record to finalize goes (default: ./staging-record.json)",
    )
    args = parser.parse_args()

    token = os.environ.get("CAPTURE_TOKEN") or None  # a writer token of the store, if it has any
    print(f"staging rollout {args.rollout_id} into {args.store_url}")
    try:
        output = asyncio.run(run(args.store_url, token, args.rollout_id))
    except ConflictError as exc:
        print(
            f"error: the store refused a write ({exc}): rollout {args.rollout_id} was written "
            "or finalized already; pass another --rollout-id",
            file=sys.stderr,
        )
        return 1
    except FinalizerError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    args.record_out.write_text(json.dumps(finished_record(args.rollout_id, output)) + "\n")
    print(f"wrote the record to finalize to {args.record_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
