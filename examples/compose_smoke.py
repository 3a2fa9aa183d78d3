"""Smoke test of the scaled-out deployment: write through the store, finalize on a, retire on b.

For: whoever brings up docker-compose.yml (the `smoke` service runs this once
both finalizer replicas are healthy), or any two finalizer replicas in front
of one capture store. It proves the replicas are interchangeable:

1. a 3-call agent rollout is written into the capture store through
   `HttpTokenSink`, as a model server does;
2. the finished record is finalized through replica a (`X-Run-Id: compose-smoke`);
3. the retire ticket a issued is redeemed on replica b, which only works
   when both share `retire.key`, and the store shows the capture retired
   (it refuses a late write, to the writer token);
4. a second rollout the other way round: finalized on b, retired on a;
5. each replica's `/metrics` counts what it did.

Run (each value also comes from the environment variable named):

    .venv/bin/python examples/compose_smoke.py \\
        --store-url http://127.0.0.1:8100 \\         # CAPTURE_STORE_URL
        --finalizer-a http://127.0.0.1:8000 \\       # FINALIZER_A_URL
        --finalizer-b http://127.0.0.1:8001          # FINALIZER_B_URL
    # tokens: CAPTURE_TOKEN (the store's writer token), FINALIZER_TOKEN (the replicas')

Exit status 0 when every step held, 1 otherwise (the failing step is printed).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from typing import Any

import httpx

from token_finalizer_client import FinalizerClient, FinalizerError, HttpTokenSink

RUN_ID = "compose-smoke"


class SmokeFailed(Exception):
    """A step did not hold."""


def expect(condition: bool, message: str) -> None:
    """Stop the smoke test with `message` unless `condition` (asserts vanish under -O)."""
    if not condition:
        raise SmokeFailed(message)


def _tokens(text: str) -> list[int]:
    """A toy tokenizer: one token per UTF-8 byte."""
    return list(text.encode())


async def write_rollout(store_url: str, token: str | None, rollout_id: str) -> int:
    """Three model calls, each prompt the whole context so far; the number of calls."""
    turns = ["ls<|end|>", "cat notes.txt<|end|>", "There are 3 notes.<|end|>"]
    context = _tokens("<|user|>How many notes are there?<|end|>")
    async with HttpTokenSink(url=store_url, token=token, timeout=10.0) as sink:
        for turn, text in enumerate(turns):
            call_id = f"call-{turn}"
            await sink.begin_call(rollout_id, call_id)
            generation = _tokens(text)
            await sink.put(
                {
                    "rollout_id": rollout_id,
                    "model_call_id": call_id,
                    "model": "policy",
                    "prompt_token_ids": list(context),
                    "generation_token_ids": generation,
                    "generation_log_probs": [-0.1] * len(generation),
                    "output_items": [{"type": "message", "role": "assistant", "content": text}],
                    "token_item_index": 0,
                    "created_at": time.time(),
                }
            )
            context += generation + _tokens("<|tool|>ok<|end|>")
    return len(turns)


def record_for(rollout_id: str) -> dict[str, Any]:
    """The finished rollout record a harness sends to /finalize."""
    return {
        "_ng_rollout_id": rollout_id,
        "reward": 1.0,
        "agent_ref": {"name": "smoke_agent"},
        "response": {
            "id": f"resp-{rollout_id}",
            "model": "policy",
            "object": "response",
            "output": [{"type": "message", "role": "assistant", "content": "There are 3 notes."}],
        },
    }


def smoke(args: argparse.Namespace) -> None:
    """Every step; SmokeFailed or FinalizerError names the one that failed."""
    rollout_id = args.rollout_id or f"smoke-{uuid.uuid4().hex[:12]}"
    calls = asyncio.run(write_rollout(args.store_url, args.capture_token, rollout_id))
    print(f"1. wrote rollout {rollout_id} ({calls} calls) to {args.store_url}")

    token = args.finalizer_token
    with (
        FinalizerClient(args.finalizer_a, token=token, run_id=RUN_ID) as a,
        FinalizerClient(args.finalizer_b, token=token, run_id=RUN_ID) as b,
    ):
        finalized = a.finalize(record_for(rollout_id))
        build = finalized.build or {}
        expect(not build.get("mask_sample", True), f"replica a masked the record: {build}")
        expect(finalized.retirable, "replica a did not issue a retire ticket")
        n_calls = build.get("metrics", {}).get("n_calls")
        print(f"2. finalized on {args.finalizer_a}: a build of {n_calls} calls")

        expect(b.retire(finalized), "replica b did not retire the ticket replica a issued")
        print(f"3. retired on {args.finalizer_b} with the ticket replica a issued")
    # The store itself says so, to the writer token a model server holds: a
    # retired capture refuses any further write (409).
    intents = f"{args.store_url}/ng-rollout/{rollout_id}/training-token-capture/intents"
    headers = {"Authorization": f"Bearer {args.capture_token}"} if args.capture_token else {}
    answer = httpx.post(intents, json={"model_call_id": "late"}, headers=headers, timeout=10.0)
    expect(
        answer.status_code == 409 and "retired" in answer.text,
        f"the store did not report the capture retired: {answer.status_code} {answer.text:.200}",
    )
    print(f"4. the store holds {rollout_id} retired (a late write answers 409)")

    # The other way round: finalized on b, retired on a.
    second = f"{rollout_id}-b"
    asyncio.run(write_rollout(args.store_url, args.capture_token, second))
    with (
        FinalizerClient(args.finalizer_a, token=token, run_id=RUN_ID) as a,
        FinalizerClient(args.finalizer_b, token=token, run_id=RUN_ID) as b,
    ):
        again = b.finalize(record_for(second))
        expect(again.retirable, f"replica b did not issue a retire ticket: {again.build}")
        expect(a.retire(again), "replica a did not retire the ticket replica b issued")
    print(f"5. finalized {second} on {args.finalizer_b}, retired on {args.finalizer_a}")

    # Each replica's /metrics (open, like the probes) counts what it did.
    for url, did in ((args.finalizer_a, "finalize"), (args.finalizer_b, "retire")):
        metrics = httpx.get(f"{url.rstrip('/')}/metrics", timeout=10.0)
        counted = [
            line
            for line in metrics.text.splitlines()
            if line.startswith(f"token_finalizer_{did}_total{{") and not line.endswith(" 0.0")
        ]
        expect(metrics.status_code == 200 and bool(counted), f"{url}/metrics counts no {did}")
    print("6. /metrics of a counts its finalize, of b its retire")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    env = os.environ.get
    parser.add_argument("--store-url", default=env("CAPTURE_STORE_URL", "http://127.0.0.1:8100"))
    parser.add_argument("--finalizer-a", default=env("FINALIZER_A_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--finalizer-b", default=env("FINALIZER_B_URL", "http://127.0.0.1:8001"))
    parser.add_argument("--rollout-id", help="default: a new smoke-<random> id")
    args = parser.parse_args()
    args.capture_token = env("CAPTURE_TOKEN") or None
    args.finalizer_token = env("FINALIZER_TOKEN") or None
    try:
        smoke(args)
    except (SmokeFailed, FinalizerError, httpx.HTTPError) as exc:
        print(f"smoke test FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print("smoke test passed: the replicas are interchangeable")
    return 0


if __name__ == "__main__":
    sys.exit(main())
