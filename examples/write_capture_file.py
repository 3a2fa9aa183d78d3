"""Model server: write the exact tokens of a 3-call agent rollout into a capture directory.

For: whoever runs the model server on the same host as the finalizer. With the
embedded default (`token-finalizer serve` without a config) the finalizer
reads `./capture`, the directory this script writes into through
`FileTokenStore`, so `POST /finalize` of the rollout's record then gets its
real, unmasked tokens back.

Run it from the directory `token-finalizer serve` runs in:

    .venv/bin/python examples/write_capture_file.py
    .venv/bin/python examples/write_capture_file.py --dir /data/capture --rollout-id 7-0
    CAPTURE_DIR=/data/capture .venv/bin/python examples/write_capture_file.py

What it leaves in the directory (per rollout id R, the default file layout):

    R.tokens.jsonl        one TokenEntry per model call (one JSON line, fsynced per put)
    R.tokens.state.json   the capture's state: frozen? retired? version
    R.tokens.intents      calls announced with begin_call
    R.tokens.lock         the lock writers and the finalizer share

A real model server gets the token ids and log probabilities from its
inference engine; here a toy tokenizer (one token per UTF-8 byte) and a
scripted "model" stand in for them. Each rollout is written once: finalizing
freezes it, and any later write to it fails (CaptureFrozen). A finalize of a
wrong or early id freezes that id just the same; this writer then says so,
and `token-finalizer store delete ID --dir DIR` is the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

from token_finalizer import CaptureError, CaptureFrozen, CaptureRetired, FileTokenStore
from token_finalizer_client.protocol import check_new_rollout_id

# The scripted agent rollout. Per model call: the text the model generates,
# the Responses output item the server parses it into, and what the tool
# then returns (None after the final answer).
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


async def write_rollout(store: FileTokenStore, rollout_id: str) -> list[dict[str, Any]]:
    """Serve the rollout's three model calls, writing one TokenEntry per call; return them."""
    entries = []
    context = tokenize(TASK)  # everything the model has seen so far
    for turn, (text, item, tool_output) in enumerate(TURNS):
        call_id = f"call-{turn}"  # unique within the rollout: letters, digits, . _ -

        # Optional: announce the call before sampling. If the server dies before
        # the put below, the finalizer finds the announced call missing and
        # masks the rollout (capture_incomplete) instead of training on a
        # rollout with a silently missing turn.
        await store.begin_call(rollout_id, call_id)
        try:
            generation, log_probs = sample(context, text)
        except Exception:
            # A call whose tokens could not be captured: mark it, so the
            # finalizer masks the rollout rather than rebuilding it without it.
            await store.mark_incomplete(rollout_id, call_id)
            raise

        entry = {
            "rollout_id": rollout_id,  # the record's _ng_rollout_id (or "<task>-<rollout>")
            "model_call_id": call_id,
            "model": "policy",  # the served model's name
            "prompt_token_ids": list(context),  # the WHOLE context so far, not just the new turn
            "generation_token_ids": generation,  # exactly the ids that were sampled
            "generation_log_probs": log_probs,  # one per sampled id
            "output_items": [item],  # this call's Responses output items, without token arrays
            "token_item_index": 0,  # the item of output_items that gets the token arrays
            "created_at": time.time(),  # wall clock; the earliest root call starts the main chain
            # Optional: the id of the response served to the agent. When the
            # record's response.id equals it, the finalizer knows this call
            # produced the response the verifier scored.
            "response_id": f"resp-{rollout_id}-{turn}",
        }
        await store.put(entry)  # durable (fsynced) when it returns; same payload again: no-op
        entries.append(entry)

        # The next call sees everything: this call's generation, then the tool's output.
        context += generation
        if tool_output is not None:
            context += tokenize(tool_output)
    return entries


def frozen_message(rollout_id: str, directory: Path) -> str:
    """What a writer says when the rollout it is to write was frozen by a finalize."""
    return (
        f"error: rollout {rollout_id} is frozen: something finalized it (a harness, or a "
        "finalize of a wrong or too early id), and a writer cannot tell who. A frozen capture "
        "takes no more writes. If that finalize was a mistake, remove the capture for good with "
        f"`token-finalizer store delete {rollout_id} --dir {directory}` and write again; "
        "otherwise pass another --rollout-id."
    )


def refusal(store: FileTokenStore, rollout_id: str, directory: Path) -> str | None:
    """Why this rollout cannot be written into the store (None when it can)."""
    state = asyncio.run(store.admin.status(rollout_id))
    if state is None:
        return None
    if state.retired:
        return (
            f"error: rollout {rollout_id} was finalized and retired: its capture is closed. "
            "Pass another --rollout-id."
        )
    if state.frozen:
        return frozen_message(rollout_id, directory)
    return (
        f"error: {directory}/ already holds a capture of rollout {rollout_id} (not finalized "
        "yet): each rollout is written once. Pass another --rollout-id."
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
        "--dir",
        type=Path,
        default=Path(os.environ.get("CAPTURE_DIR", "capture")),
        help="the capture directory (default: $CAPTURE_DIR or ./capture)",
    )
    parser.add_argument(
        "--rollout-id",
        type=rollout_id_argument,
        default="quickstart-0",
        help="letters, digits, '.', '_' or '-', starting with a letter or digit "
        "(default: quickstart-0)",
    )
    args = parser.parse_args()

    store = FileTokenStore(args.dir)
    problem = refusal(store, args.rollout_id, args.dir)
    if problem is not None:
        print(problem, file=sys.stderr)
        return 1
    try:
        entries = asyncio.run(write_rollout(store, args.rollout_id))
    except (CaptureFrozen, CaptureRetired):
        # Finalized while this writer was still writing: too early, or the wrong id.
        print(frozen_message(args.rollout_id, args.dir), file=sys.stderr)
        return 1
    except CaptureError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1

    generated = sum(len(entry["generation_token_ids"]) for entry in entries)
    print(f"wrote rollout {args.rollout_id}: {len(entries)} calls, {generated} generated tokens")
    for entry in entries:
        print(
            f"  {entry['model_call_id']}: prompt {len(entry['prompt_token_ids'])} tokens, "
            f"generation {len(entry['generation_token_ids'])} tokens"
        )
    for path in sorted(args.dir.glob(f"{args.rollout_id}.tokens.*")):
        print(f"  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
