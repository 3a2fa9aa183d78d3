"""Trainer: retire the captures of finalize answers that are stored durably.

For: whoever runs the trainer (or the job that accepts finalized records into
training data). The harness wrote each finalize answer to a JSONL file and
fsynced it (examples/finalize_with_client.py --no-retire). Reading the answers
back from that file is the proof that they are durable; this script then
posts each answer's `retire` object to `POST /retire`, which drops exactly the
capture snapshot the record was built from. Masked answers have `retire:
null`: their captures stay in the store as evidence and are skipped.

Run, with `token-finalizer serve` running:

    .venv/bin/python examples/retire_after_durable_write.py
    .venv/bin/python examples/retire_after_durable_write.py /data/finalized.jsonl
    FINALIZER_URL=http://finalizer:8000 FINALIZER_TOKEN=... .venv/bin/python ...

Retiring twice is safe (True again). A ticket is signed by the finalizer that
issued it: with several replicas or workers, or across a restart, configure
the same `retire.key` on all of them (docs/configuration.md#retire), or the
ticket answers 403. The batch command `token-finalizer retire FILE --server
URL` does the same for a whole file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from token_finalizer_client import APIConnectionError, FinalizerClient, FinalizerError


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "answers",
        nargs="?",
        type=Path,
        default=Path(os.environ.get("FINALIZED_JSONL", "finalized.jsonl")),
        help="the durable JSONL of finalize answers (default: $FINALIZED_JSONL or "
        "./finalized.jsonl)",
    )
    parser.add_argument(
        "--finalizer-url",
        default=os.environ.get("FINALIZER_URL", "http://127.0.0.1:8000"),
        help="the finalizer (default: $FINALIZER_URL or http://127.0.0.1:8000)",
    )
    args = parser.parse_args()

    try:
        answers = [json.loads(line) for line in args.answers.read_text().splitlines() if line]
    except FileNotFoundError:
        print(f"error: {args.answers} does not exist; finalize something first", file=sys.stderr)
        return 2

    token = os.environ.get("FINALIZER_TOKEN") or None
    refused = 0
    with FinalizerClient(args.finalizer_url, token=token) as client:
        for number, answer in enumerate(answers, start=1):
            # {"rollout_id", "source", "snapshot_id", "version", "ticket"}, or null when masked
            retire = answer.get("retire")
            if retire is None:
                print(f"line {number}: {answer.get('rollout_id')}: not retirable, skipped")
                continue
            try:
                retired = client.retire(retire)
            except APIConnectionError as exc:
                print(f"error: cannot reach {args.finalizer_url}: {exc}", file=sys.stderr)
                return 2
            except FinalizerError as exc:  # e.g. 403: a ticket signed with another key
                print(f"line {number}: {retire['rollout_id']}: refused: {exc}")
                refused += 1
                continue
            # False: the store moved on since the finalize (a later write to the
            # capture): nothing was dropped, nothing is lost.
            print(f"line {number}: {retire['rollout_id']}: retired {json.dumps(retired)}")
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
