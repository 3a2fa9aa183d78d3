"""Model server on another machine: write a 3-call agent rollout into a remote capture store.

For: whoever runs model servers that do not share a disk with the finalizer.
They write through `HttpTokenSink` into a capture store
(`token-finalizer store serve`, protocol v1), and the finalizer reads the same
store through an `http` source (see docs/quickstart.md, "Remote capture store").
The sink takes keyword arguments only, which is how a NeMo Gym model server
builds it from its `token_id_capture.sink` and `sink_kwargs` settings.

Run, with a store serving (`token-finalizer store serve --dir capture-store`):

    .venv/bin/python examples/write_capture_http.py
    .venv/bin/python examples/write_capture_http.py --store-url http://store:8100 --rollout-id 7-0
    export CAPTURE_STORE_URL=http://store:8100 CAPTURE_TOKEN=s3cret  # the store's --token
    .venv/bin/python examples/write_capture_http.py

The rollout and every TokenEntry field are the same as in
examples/write_capture_file.py, which explains them; only the sink differs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any

from token_finalizer_client import ConflictError, FinalizerError, HttpTokenSink
from token_finalizer_client.protocol import check_new_rollout_id

TASK = "<|user|>How many lines are in notes.txt?<|end|>"
TURNS: list[tuple[str, dict[str, Any], str | None]] = [
    (
        '<|call|>bash {"cmd": "wc -l notes.txt"}<|end|>',
        {"type": "function_call", "call_id": "tool-0", "name": "bash",
         "arguments": '{"cmd": "wc -l notes.txt"}'},
        "<|tool|>3 notes.txt<|end|>",
    ),
    (
        '<|call|>bash {"cmd": "tail -n 1 notes.txt"}<|end|>',
        {"type": "function_call", "call_id": "tool-1", "name": "bash",
         "arguments": '{"cmd": "tail -n 1 notes.txt"}'},
        "<|tool|>buy milk<|end|>",
    ),
    (
        "notes.txt has 3 lines.<|end|>",
        {"type": "message", "role": "assistant", "content": "notes.txt has 3 lines."},
        None,
    ),
]  # fmt: skip


def tokenize(text: str) -> list[int]:
    """A toy tokenizer: one token per UTF-8 byte. Yours is the served model's."""
    return list(text.encode())


def sample(prompt_token_ids: list[int], text: str) -> tuple[list[int], list[float]]:
    """The scripted model: the sampled token ids of `text` and one log probability each."""
    generation = tokenize(text)
    return generation, [round(-0.01 * (i % 7 + 1), 2) for i in range(len(generation))]


async def write_rollout(sink: HttpTokenSink, rollout_id: str) -> list[dict[str, Any]]:
    """Serve the rollout's three model calls, putting one TokenEntry per call; return them."""
    entries = []
    context = tokenize(TASK)  # everything the model has seen so far
    for turn, (text, item, tool_output) in enumerate(TURNS):
        call_id = f"call-{turn}"
        await sink.begin_call(rollout_id, call_id)  # optional: missing at freeze = incomplete
        try:
            generation, log_probs = sample(context, text)
        except Exception:
            await sink.mark_incomplete(rollout_id, call_id)  # this call failed to capture
            raise
        entry = {
            "rollout_id": rollout_id,
            "model_call_id": call_id,
            "model": "policy",
            "prompt_token_ids": list(context),  # the WHOLE context so far
            "generation_token_ids": generation,
            "generation_log_probs": log_probs,
            "output_items": [item],
            "token_item_index": 0,
            "created_at": time.time(),
            "response_id": f"resp-{rollout_id}-{turn}",
        }
        await sink.put(entry)  # a dict or a pydantic model; stored (fsynced) when it returns
        entries.append(entry)
        context += generation
        if tool_output is not None:
            context += tokenize(tool_output)
    return entries


async def run(sink_kwargs: dict[str, Any], rollout_id: str) -> list[dict[str, Any]]:
    # One sink per model server process, opened once and closed at shutdown.
    async with HttpTokenSink(**sink_kwargs) as sink:
        return await write_rollout(sink, rollout_id)


def refusal(exc: ConflictError, rollout_id: str) -> str:
    """What the writer says when the store answered 409 (its message says which case)."""
    if "frozen" in exc.message or "retired" in exc.message:
        # Something finalized this rollout: a harness, or a finalize of a wrong
        # or too early id. The store cannot say who, and neither can we.
        return (
            f"error: the store refused a write ({exc}): rollout {rollout_id} was finalized, "
            "and a writer cannot tell by whom (a harness, or a finalize of a wrong or too early "
            "id). A frozen capture takes no more writes. If that finalize was a mistake, remove "
            f"the capture for good on the store's host with `token-finalizer store delete "
            f"{rollout_id} --dir DIR` (or --redis URL) and write again; otherwise pass another "
            "--rollout-id."
        )
    # A second run of this script writes the same calls with another created_at:
    # a different payload under an existing call id, which the store refuses AND
    # records as a capture failure (finalized, the rollout is masked
    # capture_incomplete).
    return (
        f"error: the store refused a write ({exc}): rollout {rollout_id} was already written. "
        "Each rollout is written once: pass another --rollout-id."
    )


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
        default="quickstart-0",
        help="letters, digits, '.', '_' or '-', starting with a letter or digit "
        "(default: quickstart-0)",
    )
    args = parser.parse_args()

    # What a NeMo Gym model server would have as `sink_kwargs` in its configuration.
    sink_kwargs = {
        "url": args.store_url,
        "token": os.environ.get("CAPTURE_TOKEN") or None,  # the store's --token, if it has one
        "timeout": 10.0,
    }
    try:
        entries = asyncio.run(run(sink_kwargs, args.rollout_id))
    except ConflictError as exc:
        print(refusal(exc, args.rollout_id), file=sys.stderr)
        return 1
    except FinalizerError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1

    generated = sum(len(entry["generation_token_ids"]) for entry in entries)
    print(
        f"wrote rollout {args.rollout_id} to {args.store_url}: "
        f"{len(entries)} calls, {generated} generated tokens"
    )
    for entry in entries:
        print(
            f"  {entry['model_call_id']}: prompt {len(entry['prompt_token_ids'])} tokens, "
            f"generation {len(entry['generation_token_ids'])} tokens"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
