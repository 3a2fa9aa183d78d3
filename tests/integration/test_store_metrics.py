"""The store server's /metrics as real `store serve` processes (docs/store-protocol.md#metrics).

With `--workers 2`, under puts sent 8 at a time, the workers' counts are
summed through a fresh PROMETHEUS_MULTIPROC_DIR under the server's $TMPDIR:
the test reads the per-worker files there to check that both workers served, and every scrape
must say exactly what was sent. One worker's server shows that every route's
latency histogram moves.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from tests.support.captures import make_entry
from tests.support.servers import free_port, running_process
from tests.support.staging_stores import Conversation, query_of

WRITER = {"Authorization": "Bearer w-token"}
FINALIZER = {"Authorization": "Bearer f-token"}
TOKENS = ["--writer-token", "w-token", "--finalizer-token", "f-token"]
ROUND = 20
# Puts in flight at once: both workers busy at the same time.
CONCURRENCY = 8
MAX_ROUNDS = 5


def _sum(families: Iterable[Any], metric: str, **labels: str) -> float:
    return sum(
        sample.value
        for family in families
        for sample in family.samples
        if sample.name == metric and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def _scrape(base: str) -> list[Any]:
    # A fresh connection per scrape, so scrapes land on either worker.
    with httpx.Client(base_url=base, timeout=10) as client:
        answer = client.get("/metrics", headers=WRITER)
    assert answer.status_code == 200
    return list(text_string_to_metric_families(answer.text))


def _path(rollout_id: str, operation: str) -> str:
    return f"/ng-rollout/{rollout_id}/training-token-capture/{operation}"


def _put(base: str, index: int) -> int:
    """One put on a fresh connection; its body's length."""
    entry = make_entry(f"r-{index}", "c1", list(range(50 + index)), [1, 2])
    body = orjson.dumps(entry)
    with httpx.Client(base_url=base, timeout=10) as client:
        answer = client.put(
            _path(f"r-{index}", "calls/c1"),
            content=body,
            headers={**WRITER, "Content-Type": "application/json"},
        )
    assert answer.status_code == 200
    return len(body)


def _puts_per_worker(directory: Path) -> list[float]:
    """Each worker's own count of answered puts, read from its counter file."""
    counts = []
    for path in directory.glob("counter_*.db"):
        families = MultiProcessCollector.merge([str(path)])
        counts.append(_sum(families, "token_finalizer_store_requests_total", route="put"))
    return counts


def test_two_workers_scrape_as_one(tmp_path: Path) -> None:
    """Concurrent puts spread over 2 workers: every scrape counts each put, entry and byte once."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    port = free_port()
    args = ["store", "serve", "--dir", str(tmp_path / "captures"), "--port", str(port)]
    base = f"http://127.0.0.1:{port}"
    sent = sent_bytes = 0
    with running_process([*args, *TOKENS, "--workers", "2"], port=port, env={"TMPDIR": str(temp)}):
        (metrics_dir,) = temp.glob("token-finalizer-metrics-*")
        # Fresh connections are spread by the kernel; should one worker take a
        # whole round, another round follows (the totals stay what was sent).
        with ThreadPoolExecutor(max_workers=CONCURRENCY) as pool:
            for _ in range(MAX_ROUNDS):
                indices = range(sent, sent + ROUND)
                sent_bytes += sum(pool.map(functools.partial(_put, base), indices))
                sent += ROUND
                if sum(count > 0 for count in _puts_per_worker(metrics_dir)) > 1:
                    break
        assert sum(count > 0 for count in _puts_per_worker(metrics_dir)) == 2
        for _ in range(4):
            families = _scrape(base)
            totals = (
                _sum(families, "token_finalizer_store_requests_total", route="put", status="200"),
                _sum(families, "token_finalizer_store_entries_stored_total", route="put"),
                _sum(families, "token_finalizer_store_stored_bytes_total", route="put"),
            )
            assert totals == (sent, sent, sent_bytes)


def _every_route(base: str) -> None:
    """One request to each of resolve, begin, put, stage, freeze and drop."""
    chat = Conversation.of("r-routes", 1)
    query = query_of([{"type": "message", "role": "user", "content": "hi"}])
    resolve = {
        "fingerprint_version": query.fingerprint_version,
        "fingerprint": query.fingerprint,
        "context_digests": list(query.context_digests),
    }
    record = chat.records[0]
    staged = {"record": record.to_json(), "attachments": None}
    with httpx.Client(base_url=base, timeout=10, headers=WRITER) as client:
        rid = "r-calls"
        assert client.post(_path(rid, "lineage/resolve"), json=resolve).status_code == 200
        assert client.post(_path(rid, "intents"), json={"model_call_id": "c1"}).status_code == 200
        entry = make_entry(rid, "c1", [1, 2, 3], [4])
        assert client.put(_path(rid, "calls/c1"), json=entry).status_code == 200
        stage_path = _path(chat.rollout_id, f"staged/{record.model_call_id}")
        assert client.put(stage_path, json=staged).status_code == 200
        frozen = client.post(_path(rid, "freeze"), headers=FINALIZER)
        assert frozen.status_code == 200
        target = {key: frozen.json()[key] for key in ("snapshot_id", "version")}
        assert client.post(_path(rid, "drop"), json=target, headers=FINALIZER).status_code == 200


def test_every_route_histogram_moves(tmp_path: Path) -> None:
    """resolve, begin, put, stage, freeze, drop: each route's latency histogram counts its call."""
    port = free_port()
    args = ["store", "serve", "--dir", str(tmp_path / "captures"), "--port", str(port), *TOKENS]
    base = f"http://127.0.0.1:{port}"
    routes = ("resolve", "begin", "put", "stage", "freeze", "drop")
    with running_process(args, port=port):
        metric = "token_finalizer_store_request_seconds_count"
        before = {route: _sum(_scrape(base), metric, route=route) for route in routes}
        _every_route(base)
        families = _scrape(base)
        moved = {route: _sum(families, metric, route=route) - before[route] for route in routes}
    assert moved == dict.fromkeys(routes, 1.0)
