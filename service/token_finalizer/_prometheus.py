"""What both servers' Prometheus metrics share: a registry per app, summed over workers.

A per-app CollectorRegistry (not the process-global one) lets several apps
live in one process, as tests and embedders do, without name clashes.

With several workers (`serve --workers N`, `store serve --workers N`) the
numbers must not depend on which worker a scrape reaches. The command then
points PROMETHEUS_MULTIPROC_DIR at a fresh directory before the workers
start (`multiprocess_directory`): prometheus-client, imported by each worker
with that variable set, keeps every value in a per-process memory-mapped
file there, and /metrics answers the sum over all the files
(`MultiProcessCollector`), from whichever worker, with every declared family
even before any worker used it (as one worker shows). Counters and histograms add
up as they are; a gauge declares its `multiprocess_mode` (the store's
memory figures: `mostrecent`, the last value any worker read). Values of a
worker that died stay in the sum, so totals never go backwards when uvicorn
replaces a worker. One app per process in that mode: two apps of one process
would write the same keys of the same file.

Without the variable (tests, in-process apps, one worker), each app answers
with its own registry.

An operator may set PROMETHEUS_MULTIPROC_DIR themselves (a volume of their
choosing). The command then owns that directory's lifecycle too
(`prepare_multiprocess_directory`): it is created if missing and the value
files of an earlier run are removed before any worker starts, so a fresh
server never reports the previous one's counts. A value file that cannot be
read (truncated by a full disk, say) is left out of the sum with a warning,
instead of failing every scrape (docs/architecture.md#scale-out).

No `*_created` series: prometheus-client would export each counter's and
histogram's creation time as a gauge family of its own in the text format,
which dashboards mistake for metrics; they are switched off for the process
when this module is imported (docs/finalizer-api.md#health-readiness-metrics).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, ProcessCollector, values
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics import disable_created_metrics
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

__all__ = [
    "CONTENT_TYPE_LATEST",
    "MULTIPROC_DIR_ENV_VAR",
    "AppMetrics",
    "multiprocess_directory",
    "multiprocess_enabled",
    "prepare_multiprocess_directory",
    "prepare_operator_directory",
]

logger = logging.getLogger(__name__)

# Before any metric of ours exists: none of them gets a `_created` child.
disable_created_metrics()  # type: ignore[no-untyped-call]

# prometheus-client's own variable: set before it is imported, it switches every
# metric of the process to memory-mapped files in that directory.
MULTIPROC_DIR_ENV_VAR = "PROMETHEUS_MULTIPROC_DIR"

# prometheus-client's value files: `<kind>_<pid>.db`.
_VALUE_FILES = "*.db"


def multiprocess_enabled() -> bool:
    """Whether this process's metrics live in PROMETHEUS_MULTIPROC_DIR.

    prometheus-client chooses once, when it is first imported; the variable
    set later changes nothing, so both must hold.
    """
    directory = os.environ.get(MULTIPROC_DIR_ENV_VAR)
    return bool(directory) and bool(getattr(values.ValueClass, "_multiprocess", False))


def prepare_multiprocess_directory(directory: str) -> None:
    """Make `directory` ready for a new run: created if missing, earlier value files removed.

    Only the value files go (other files an operator keeps there stay). Raises
    OSError with a message naming the directory when it cannot be used.
    """
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise OSError(f"{MULTIPROC_DIR_ENV_VAR}={directory} is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        for stale in path.glob(_VALUE_FILES):
            stale.unlink(missing_ok=True)
    except OSError as exc:
        raise OSError(
            f"{MULTIPROC_DIR_ENV_VAR}={directory} cannot be used: {exc.strerror or exc}"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise OSError(f"{MULTIPROC_DIR_ENV_VAR}={directory} is not writable")


def prepare_operator_directory() -> None:
    """When the operator set PROMETHEUS_MULTIPROC_DIR, make it ready for this run (before any
    process writes there: a new run counts from zero). OSError naming it when it cannot be
    used; nothing to do when it is unset."""
    directory = os.environ.get(MULTIPROC_DIR_ENV_VAR)
    if directory:
        prepare_multiprocess_directory(directory)


@contextlib.contextmanager
def multiprocess_directory() -> Iterator[str]:
    """The PROMETHEUS_MULTIPROC_DIR of the worker processes started inside the block.

    The operator's own directory when the variable is set (prepared for this
    run, and left in place afterwards); otherwise a fresh one under $TMPDIR,
    set in this process's environment (workers inherit it) and removed, with
    every file in it, when the block ends.
    """
    previous = os.environ.get(MULTIPROC_DIR_ENV_VAR)
    if previous:
        prepare_multiprocess_directory(previous)
        yield previous
        return
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


def _merged(files: list[str]) -> list[Metric]:
    """prometheus-client's sum over value files (raises for a file it cannot read)."""
    metrics: list[Metric] = MultiProcessCollector.merge(files)  # type: ignore[no-untyped-call]
    return metrics


class _ReadableFilesCollector:
    """MultiProcessCollector's sum, leaving out (with one warning each) files it cannot read."""

    def __init__(self, directory: str) -> None:
        self._directory = Path(directory)
        self._warned: set[str] = set()

    def _readable(self, path: str) -> bool:
        try:
            _merged([path])
        except FileNotFoundError:
            return False  # removed since the directory was listed
        except Exception as exc:  # a damaged file fails in many ways (struct, JSON, bounds)
            if path not in self._warned:
                self._warned.add(path)
                logger.warning(
                    "metrics file %s cannot be read (%s: %s); its values are left out of /metrics",
                    path,
                    type(exc).__name__,
                    exc,
                )
            return False
        return True

    def collect(self) -> Iterable[Metric]:
        files = sorted(str(path) for path in self._directory.glob(_VALUE_FILES))
        try:
            return _merged(files)
        except Exception:  # one damaged file: sum the others
            return _merged([path for path in files if self._readable(path)])


class _DeclaredFamilies:
    """The workers' sum, plus each family this app declares that no worker has a value of yet.

    prometheus-client's sum knows a family only from the values in the files,
    and a labelled family has none until its first series is used; one worker
    alone exports every declared family from the start. So a scrape looks the
    same with one worker or N (docs/finalizer-api.md#health-readiness-metrics).
    """

    def __init__(self, declared: CollectorRegistry, values: _ReadableFilesCollector) -> None:
        self._declared = declared
        self._values = values

    def collect(self) -> Iterable[Metric]:
        summed = list(self._values.collect())
        seen = {family.name for family in summed}
        for family in self._declared.collect():
            if family.name not in seen:
                yield Metric(family.name, family.documentation, family.type, family.unit)
        yield from summed


class AppMetrics:
    """One app's registry and its text exposition; subclasses declare their families on it."""

    def __init__(self) -> None:
        self.multiprocess = multiprocess_enabled()
        self._values: _ReadableFilesCollector | None = None
        if self.multiprocess:
            directory = os.environ[MULTIPROC_DIR_ENV_VAR]
            # Created if missing (an embedding app sets the variable itself); only
            # the commands remove an earlier run's files, before their workers start.
            Path(directory).mkdir(parents=True, exist_ok=True)
            self._values = _ReadableFilesCollector(directory)
        self.registry = CollectorRegistry(auto_describe=True)
        if not self.multiprocess:
            # process_resident_memory_bytes, process_open_fds, process_cpu_seconds_total...
            ProcessCollector(registry=self.registry)

    def exposition(self) -> bytes:
        """The Prometheus text format: this app's metrics, or every worker's summed."""
        if self._values is None:
            return generate_latest(self.registry)
        merged = CollectorRegistry()
        merged.register(_DeclaredFamilies(self.registry, self._values))
        # RSS, open fds and CPU of the worker that answered this scrape.
        ProcessCollector(registry=merged)
        return generate_latest(merged)
