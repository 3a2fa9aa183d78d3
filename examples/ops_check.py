"""Ops: is the finalizer ready, and how many records has it finalized, masked and retired?

For: whoever operates the finalizer (on-call, a cron check, a deploy smoke
test). It asks `GET /ready` (is every configured capture source reachable?)
and `GET /metrics` (Prometheus text), and prints the counters that matter:
finalizes by outcome, mask reasons, retires by outcome. Exit status: 0 ready,
1 not ready (503: a source is unreachable, or the service is draining),
2 the finalizer cannot be reached at all.

Run:

    .venv/bin/python examples/ops_check.py
    .venv/bin/python examples/ops_check.py --finalizer-url http://finalizer:8000
    FINALIZER_URL=http://finalizer:8000 .venv/bin/python examples/ops_check.py

/health, /ready and /metrics need no token even when the service has auth.
The counters are per process: with `serve --workers N` each answer comes from
one worker.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import httpx

from token_finalizer_client import APIConnectionError, FinalizerClient

# One sample line of the Prometheus text format: name{labels} value
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')
_COUNTERS = {
    "token_finalizer_finalize_total": "finalize",
    "token_finalizer_mask_reasons_total": "masked because",
    "token_finalizer_retire_total": "retire",
}


def counters(metrics_text: str) -> list[tuple[str, dict[str, str], float]]:
    """The finalize, mask-reason and retire samples of a /metrics answer."""
    samples = []
    for line in metrics_text.splitlines():
        match = _SAMPLE.match(line)
        if match and match["name"] in _COUNTERS:
            labels = dict(_LABEL.findall(match["labels"]))
            samples.append((match["name"], labels, float(match["value"])))
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--finalizer-url",
        default=os.environ.get("FINALIZER_URL", "http://127.0.0.1:8000"),
        help="the finalizer (default: $FINALIZER_URL or http://127.0.0.1:8000)",
    )
    args = parser.parse_args()

    # No retries: a health check should answer now, not after backoff.
    with FinalizerClient(args.finalizer_url, max_retries=0, timeout=5.0) as client:
        try:
            readiness = client.ready()  # 200 and 503 both answer, with per-source details
        except APIConnectionError as exc:
            print(f"finalizer {args.finalizer_url}: unreachable ({exc})")
            return 2
    status = readiness.body.get("status")
    print(f"finalizer {args.finalizer_url}: {status} ({readiness.status_code})")
    for name, source in (readiness.body.get("sources") or {}).items():
        state = "reachable" if source.get("reachable") else f"UNREACHABLE: {source.get('error')}"
        print(f"  source {name}: {state}")

    # The client has no metrics call: /metrics is plain Prometheus text.
    metrics = httpx.get(f"{args.finalizer_url.rstrip('/')}/metrics", timeout=5.0)
    metrics.raise_for_status()
    samples = counters(metrics.text)
    if not samples:
        print("  nothing finalized yet")
    for name, labels, value in samples:
        detail = labels.get("outcome") or labels.get("reason")
        print(f"  {_COUNTERS[name]} {detail} (source {labels.get('source')}): {value:g}")
    return 0 if readiness.ready else 1


if __name__ == "__main__":
    sys.exit(main())
