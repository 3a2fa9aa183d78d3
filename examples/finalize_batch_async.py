"""Asyncio harness: finalize a batch of finished rollouts, write each answer durably, retire.

For: a harness written with asyncio that collects many finished rollouts and
hands them to the trainer in batches. It shows `AsyncFinalizerClient` and
its two batch calls:

- `finalize_iter(records, concurrency=K)` (the default here): answers stream
  back in input order with at most K requests in flight and nothing kept in
  memory, so a batch of any size runs in bounded memory;
- `finalize_many(records, on_result=...)` (`--many`): the same, collected
  into a list, with a callback called in input order as answers arrive.

Each answer (the record and its retire ticket) is appended to a JSONL file
and fsynced before any capture is retired; only then are the retirable ones
retired, concurrently. A record that cannot be finalized (a 4xx for that
record) is reported and kept out of the output instead of ending the batch
(`return_exceptions=True`).

Run, with `token-finalizer serve` running and captures written
(examples/write_capture_file.py --rollout-id a-0, then --rollout-id b-0):

    .venv/bin/python examples/finalize_batch_async.py --rollout-id a-0 --rollout-id b-0
    .venv/bin/python examples/finalize_batch_async.py --records batch.jsonl --concurrency 32
    .venv/bin/python examples/finalize_batch_async.py --rollout-id a-0 --many --no-retire

Without --records it finalizes the example rollout's record (the one the
write_capture_* examples write) once per --rollout-id.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from finalize_with_client import append_durably, example_record

from token_finalizer_client import AsyncFinalizerClient, Finalized, FinalizerError


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """One finished record per JSONL line, read lazily (finalize_iter never holds them all)."""
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def keep(index: int, outcome: Finalized | FinalizerError, out: Path) -> Finalized | None:
    """Write one answer durably (or report the record's error); the answer when it is kept."""
    if isinstance(outcome, FinalizerError):
        print(f"record {index}: not finalized: {outcome}", file=sys.stderr)
        return None
    append_durably(out, outcome.to_answer())
    state = "masked" if outcome.masked else "finalized"
    print(f"record {index}: rollout {outcome.rollout_id} {state}")
    return outcome


async def finalize_batch(args: argparse.Namespace) -> int:
    if args.records is not None:
        records: Iterator[dict[str, Any]] = read_records(args.records)
    else:
        records = iter([example_record(rollout_id) for rollout_id in args.rollout_id])
    token = os.environ.get("FINALIZER_TOKEN") or None
    kept: list[Finalized] = []
    client = AsyncFinalizerClient(args.finalizer_url, token=token, run_id="async-batch")
    async with client:
        if args.many:

            def on_result(index: int, outcome: Finalized | FinalizerError) -> None:
                written = keep(index, outcome, args.out)
                if written is not None:
                    kept.append(written)

            await client.finalize_many(
                records,
                concurrency=args.concurrency,
                on_result=on_result,
                return_exceptions=True,
            )
        else:
            index = 0
            stream = client.finalize_iter(
                records, concurrency=args.concurrency, return_exceptions=True
            )
            async for outcome in stream:
                written = keep(index, outcome, args.out)
                if written is not None:
                    kept.append(written)
                index += 1
        # Every answer above is fsynced: only now may the captures they consumed go.
        if not args.no_retire:
            retirable = [answer for answer in kept if answer.retirable]
            retired = await asyncio.gather(*(client.retire(answer) for answer in retirable))
            print(f"retired {sum(retired)} of {len(retirable)} retirable captures")
    print(f"{len(kept)} answers written to {args.out}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--finalizer-url",
        default=os.environ.get("FINALIZER_URL", "http://127.0.0.1:8000"),
        help="the finalizer (default: $FINALIZER_URL or http://127.0.0.1:8000)",
    )
    parser.add_argument(
        "--rollout-id",
        action="append",
        default=[],
        help="finalize the example record of this rollout (repeat for several)",
    )
    parser.add_argument("--records", type=Path, help="a JSONL file of finished records")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight (8)")
    parser.add_argument("--many", action="store_true", help="use finalize_many with a callback")
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
    if args.records is None and not args.rollout_id:
        args.rollout_id = ["quickstart-0"]
    return asyncio.run(finalize_batch(args))


if __name__ == "__main__":
    sys.exit(main())
