"""Prometheus metrics of one app, in a registry of its own, in one or several processes.

A per-app CollectorRegistry (not the process-global one) lets several apps
live in one process, as tests and embedders do, without name clashes.

With several workers (`serve --workers N`) the numbers must not depend on
which worker a scrape reaches. `serve` then points PROMETHEUS_MULTIPROC_DIR
at a fresh directory before the workers start (`multiprocess_directory`):
prometheus-client, imported by each worker with that variable set, keeps
every value in a per-process memory-mapped file there, and /metrics answers
the sum over all the files (`MultiProcessCollector`), from whichever worker.
Counters and histograms add up as they are; a gauge would need a
`multiprocess_mode` (e.g. `livesum`) and, for the live modes,
`mark_process_dead` when a worker exits; this module has no gauge. Values
of a worker that died stay in the sum, so totals never go backwards when
uvicorn replaces a worker. One app per process in that mode: two apps of
one process would write the same keys of the same file.

Without the variable (tests, in-process apps, `serve` with one worker),
each app answers with its own registry, as before.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, values
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from token_finalizer._constants import LATENCY_BUCKETS_S

__all__ = [
    "CONTENT_TYPE_LATEST",
    "MULTIPROC_DIR_ENV_VAR",
    "ServiceMetrics",
    "multiprocess_directory",
    "multiprocess_enabled",
]

# prometheus-client's own variable: set before it is imported, it switches every
# metric of the process to memory-mapped files in that directory.
MULTIPROC_DIR_ENV_VAR = "PROMETHEUS_MULTIPROC_DIR"

# Paths get their own latency label; anything else (404s, /docs) shares "other"
# so arbitrary URLs cannot blow up the label cardinality.
_ENDPOINTS = frozenset({"/finalize", "/retire", "/health", "/ready", "/metrics"})


def multiprocess_enabled() -> bool:
    """Whether this process's metrics live in PROMETHEUS_MULTIPROC_DIR.

    prometheus-client chooses once, when it is first imported; the variable
    set later changes nothing, so both must hold.
    """
    directory = os.environ.get(MULTIPROC_DIR_ENV_VAR)
    return bool(directory) and bool(getattr(values.ValueClass, "_multiprocess", False))


@contextlib.contextmanager
def multiprocess_directory() -> Iterator[str]:
    """A fresh PROMETHEUS_MULTIPROC_DIR for the worker processes started inside the block.

    Set in this process's environment (workers inherit it) and removed, with
    every file in it, when the block ends; a variable set before is restored.
    Stale files of an earlier run would add their counts to this one's, so the
    directory is always new (under $TMPDIR).
    """
    previous = os.environ.get(MULTIPROC_DIR_ENV_VAR)
    directory = tempfile.mkdtemp(prefix="token-finalizer-metrics-")
    os.environ[MULTIPROC_DIR_ENV_VAR] = directory
    try:
        yield directory
    finally:
        if previous is None:
            os.environ.pop(MULTIPROC_DIR_ENV_VAR, None)
        else:
            os.environ[MULTIPROC_DIR_ENV_VAR] = previous
        shutil.rmtree(directory, ignore_errors=True)


class ServiceMetrics:
    """The counters and histograms the service updates, and their text exposition."""

    def __init__(self) -> None:
        self.multiprocess = multiprocess_enabled()
        self.registry = CollectorRegistry(auto_describe=True)
        if not self.multiprocess:
            # process_resident_memory_bytes, process_open_fds, process_cpu_seconds_total...
            ProcessCollector(registry=self.registry)
        self.finalize = Counter(
            "token_finalizer_finalize",
            "Finalize calls by source and outcome (ok, masked, no_build, unreachable).",
            ["source", "outcome"],
            registry=self.registry,
        )
        self.mask_reasons = Counter(
            "token_finalizer_mask_reasons",
            "Masked builds by source and short reason.",
            ["source", "reason"],
            registry=self.registry,
        )
        self.guard_refusals = Counter(
            "token_finalizer_guard_refusals",
            "Finalize calls refused with 409 by the per-run mask-fraction guard.",
            registry=self.registry,
        )
        self.guard_unavailable = Counter(
            "token_finalizer_guard_unavailable",
            "Guard steps (check, observe) skipped because the shared guard's Redis failed "
            "or was being left alone after a failure; the finalize went on unguarded.",
            ["operation"],
            registry=self.registry,
        )
        self.retire = Counter(
            "token_finalizer_retire",
            "Retire calls by source and outcome (retired, stale, failed).",
            ["source", "outcome"],
            registry=self.registry,
        )
        self.source_errors = Counter(
            "token_finalizer_source_errors",
            "Exceptions raised by a source, by source and operation (freeze, drop, ping).",
            ["source", "operation"],
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "token_finalizer_request_seconds",
            "Time from request start to the answer being ready, by endpoint and status.",
            ["endpoint", "status"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.source_seconds = Histogram(
            "token_finalizer_source_seconds",
            "Time spent in a source call, by source and operation.",
            ["source", "operation"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )

    def observe_request(self, path: str, status: int, seconds: float) -> None:
        """Record one answered request's latency (other paths share one label)."""
        endpoint = path if path in _ENDPOINTS else "other"
        self.request_seconds.labels(endpoint, str(status)).observe(seconds)

    def exposition(self) -> bytes:
        """The Prometheus text format: this app's metrics, or every worker's summed."""
        if not self.multiprocess:
            return generate_latest(self.registry)
        merged = CollectorRegistry()
        MultiProcessCollector(merged)  # type: ignore[no-untyped-call]  # unannotated upstream
        # RSS, open fds and CPU of the worker that answered this scrape.
        ProcessCollector(registry=merged)
        return generate_latest(merged)
