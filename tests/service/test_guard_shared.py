"""The mask-fraction guard shared through Redis (`guard: {redis: URL}`), and the run-id bound.

Two `RedisMaskFractionGuard` objects on one key prefix stand for two replicas
(or two workers): they must count into, and refuse on, the same totals. The
in-process guard must decide exactly as the shared one on the same sequence.
Redis out of reach: the guard fails open (the finalize goes on, counted in
`token_finalizer_guard_unavailable_total`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import redis

from tests.support.asgi import in_process
from tests.support.captures import agent_rollout, record_for, snapshot_of
from tests.support.redis import redis_url as find_redis_url
from tests.support.redis import unique_prefix
from tests.support.servers import free_port
from tests.support.stores import stored_state
from token_finalizer import FileTokenStore
from token_finalizer.api import create_app
from token_finalizer.core.build import Build
from token_finalizer.service.errors import MaskFractionExceeded
from token_finalizer.service.guard import (
    MAX_RUN_ID_LENGTH,
    InvalidRunId,
    MaskFractionGuard,
    RunGuard,
)
from token_finalizer.service.guard_setup import open_guard
from token_finalizer.service.metrics import ServiceMetrics
from token_finalizer.service.redis_guard import RedisMaskFractionGuard
from token_finalizer.settings import ConfigError, Settings, settings_from_mapping

EMPTY = "empty_capture"
MASKED = Build.unusable("no capture", mask_reason=EMPTY)
GOOD = Build.built(
    snapshot_of([{**agent_rollout("g", calls=1, new_tokens_per_turn=4)[0]}]),
    builder="seed",
    response={},
    metrics={},
    mask_reason=None,
)


@pytest.fixture(scope="module")
def redis_url() -> str:
    """The test Redis (a clear failure when none answers)."""
    return find_redis_url()


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test alone; its keys are deleted afterwards."""
    with unique_prefix(redis_url, "guard") as value:
        yield value


def _metric(metrics: ServiceMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def _outcome(guard: RunGuard, run_id: str, build: Build) -> int:
    """What finalize answers for one build: 200, or 409 at check or observe."""
    try:
        await guard.check(run_id)
        await guard.observe(run_id, build)
    except MaskFractionExceeded:
        return 409
    return 200


def _shared(url: str, prefix: str, **options: Any) -> RedisMaskFractionGuard:
    # timeout_s bounds each whole operation (retries, connecting, loading the script):
    # generous here, where a burst of first calls opens many connections at once.
    options = {"max_mask_fraction": 0.5, "min_samples": 4, "timeout_s": 5.0, **options}
    return RedisMaskFractionGuard(url, key_prefix=prefix, **options)


# -- two guards, one count ----------------------------------------------------------------


@pytest.mark.anyio
async def test_the_sum_of_two_replicas_trips_the_run(redis_url: str, prefix: str) -> None:
    """Neither replica alone reaches min_samples; their sum crosses, and both refuse after."""
    a, b = _shared(redis_url, prefix), _shared(redis_url, prefix)
    try:
        # b: masked, good, masked (2 of 3); a: masked, good (1 of 2). Sum: 3 of 5 > 0.5.
        steps = [(b, MASKED), (a, MASKED), (b, GOOD), (a, GOOD), (b, MASKED)]
        outcomes = [await _outcome(guard, "run-1", build) for guard, build in steps]
        later = [await _outcome(guard, "run-1", GOOD) for guard in (a, b)]
        with pytest.raises(MaskFractionExceeded) as refused:
            await a.check("run-1")
    finally:
        await a.aclose()
        await b.aclose()
    assert outcomes == [200, 200, 200, 200, 409]
    assert later == [409, 409]
    assert refused.value.details == {"finalized": 5, "masked": 3, "reasons": {EMPTY: 3}}
    assert "run-1" in refused.value.message


@pytest.mark.anyio
@pytest.mark.parametrize(
    "sequence",
    [
        "mmmm",  # all masked: the 4th call crosses
        "mgmg",  # exactly half is not above it
        "gggmmmmm",  # 5 of 8 masked: crosses at the 8th
        "mmmgggggggm",
        "m",
    ],
)
async def test_shared_and_in_process_guards_decide_alike(
    redis_url: str, prefix: str, sequence: str
) -> None:
    """The Lua script's decision is the in-process guard's, call for call."""
    local: RunGuard = MaskFractionGuard(0.5, 4)
    shared = _shared(redis_url, prefix)
    builds = [MASKED if step == "m" else GOOD for step in sequence]
    try:
        expected = [await _outcome(local, "r", build) for build in builds]
        got = [await _outcome(shared, "r", build) for build in builds]
    finally:
        await shared.aclose()
    assert got == expected


@pytest.mark.anyio
async def test_concurrent_counts_from_two_guards_are_exact(redis_url: str, prefix: str) -> None:
    """200 counts at once through two guards (connection pools) add up to exactly 200."""
    a = _shared(redis_url, prefix, max_mask_fraction=1.0)
    b = _shared(redis_url, prefix, max_mask_fraction=1.0)
    try:
        await asyncio.gather(
            *(
                (a if i % 2 else b).observe("busy", MASKED if i % 4 == 0 else GOOD)
                for i in range(200)
            )
        )
        counts = await a.counts("busy")
    finally:
        await a.aclose()
        await b.aclose()
    assert (counts["finalized"], counts["masked"], counts[f"reason:{EMPTY}"]) == ("200", "50", "50")
    assert "tripped" not in counts


@pytest.mark.anyio
async def test_concurrent_crossing_is_refused_everywhere_after(redis_url: str, prefix: str) -> None:
    """Masked counts racing from two guards: the run trips once, and stays tripped for both."""
    a, b = _shared(redis_url, prefix), _shared(redis_url, prefix)
    try:
        outcomes = await asyncio.gather(
            *(_outcome(a if i % 2 else b, "race", MASKED) for i in range(20))
        )
        after = [await _outcome(guard, "race", GOOD) for guard in (a, b)]
        counts = await a.counts("race")
    finally:
        await a.aclose()
        await b.aclose()
    # The first 3 counted calls are below min_samples; every one counted later is refused.
    assert (outcomes.count(200), outcomes.count(409)) == (3, 17)
    assert after == [409, 409]
    assert counts["tripped"] == "1"


@pytest.mark.anyio
async def test_other_runs_are_not_affected(redis_url: str, prefix: str) -> None:
    """A tripped run leaves every other run id alone."""
    guard = _shared(redis_url, prefix)
    try:
        for _ in range(4):
            await _outcome(guard, "bad", MASKED)
        outcomes = [await _outcome(guard, run, GOOD) for run in ("good", "default")]
    finally:
        await guard.aclose()
    assert outcomes == [200, 200]


@pytest.mark.anyio
async def test_runs_that_got_no_build_are_not_counted(redis_url: str, prefix: str) -> None:
    """observe(run, None) (agent not taking part) writes nothing."""
    guard = _shared(redis_url, prefix)
    try:
        await guard.observe("none", None)
        counts = await guard.counts("none")
    finally:
        await guard.aclose()
    assert counts == {}


# -- keys and expiry ------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_run_is_one_hash_that_expires_after_its_last_count(
    redis_url: str, prefix: str
) -> None:
    """`<prefix>run:<id>` holds the counts; every count pushes its expiry run_ttl_s out."""
    guard = _shared(redis_url, prefix, run_ttl_s=60)
    try:
        await guard.observe("ttl", MASKED)
        await guard.observe("ttl", GOOD)
    finally:
        await guard.aclose()
    client = redis.Redis.from_url(redis_url)
    try:
        key = f"{prefix}run:ttl"
        stored = {k.decode(): v.decode() for k, v in client.hgetall(key).items()}
        ttl = client.pttl(key)
    finally:
        client.close()
    assert stored == {"finalized": "2", "masked": "1", f"reason:{EMPTY}": "1"}
    assert 55_000 < ttl <= 60_000


@pytest.mark.anyio
async def test_an_expired_run_is_forgotten(redis_url: str, prefix: str) -> None:
    """Once its key expired a tripped run is a new run (counts start over)."""
    guard = _shared(redis_url, prefix, run_ttl_s=0.2, min_samples=1, max_mask_fraction=0.0)
    try:
        first = await _outcome(guard, "short", MASKED)
        await asyncio.sleep(0.4)
        counts = await guard.counts("short")
        again = await _outcome(guard, "short", GOOD)
    finally:
        await guard.aclose()
    assert (first, counts, again) == (409, {}, 200)


# -- Redis out of reach: fail open ------------------------------------------------------------


@pytest.mark.anyio
async def test_unreachable_redis_lets_finalizes_through_and_counts_them() -> None:
    """No Redis: check and observe pass, and each skipped step is counted by operation."""
    metrics = ServiceMetrics()
    guard = RedisMaskFractionGuard(
        f"redis://127.0.0.1:{free_port()}/0",
        max_mask_fraction=0.0,
        min_samples=1,
        timeout_s=0.5,
        metrics=metrics,
    )
    started = time.monotonic()
    try:
        outcomes = [await _outcome(guard, "r", MASKED) for _ in range(5)]
    finally:
        await guard.aclose()
    elapsed = time.monotonic() - started
    name = "token_finalizer_guard_unavailable_total"
    assert outcomes == [200] * 5
    assert _metric(metrics, name, operation="check") == 5.0
    assert _metric(metrics, name, operation="observe") == 5.0
    # One failed connect, then Redis is left alone: no per-call timeouts.
    assert elapsed < 2.0


@pytest.mark.anyio
async def test_guard_recovers_when_redis_answers_again(redis_url: str, prefix: str) -> None:
    """After the back-off window the guard counts again."""
    guard = _shared(redis_url, prefix, min_samples=1, max_mask_fraction=0.0)
    guard._down_until = time.monotonic() + 60  # as if a failure had just happened
    try:
        skipped = await _outcome(guard, "back", MASKED)
        guard._down_until = time.monotonic() - 1  # ... and the window has passed
        counted = await _outcome(guard, "back", MASKED)
    finally:
        await guard.aclose()
    assert (skipped, counted) == (200, 409)


# -- run ids ----------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["process", "redis"])
async def test_run_ids_longer_than_the_bound_are_refused(
    redis_url: str, prefix: str, kind: str
) -> None:
    """MAX_RUN_ID_LENGTH characters are accepted, one more is InvalidRunId (guard on or off)."""
    guards: list[RunGuard] = [MaskFractionGuard(None, 4)]
    guards.append(MaskFractionGuard(0.5, 4) if kind == "process" else _shared(redis_url, prefix))
    try:
        for guard in guards:
            await guard.check("r" * MAX_RUN_ID_LENGTH)
            await guard.observe("r" * MAX_RUN_ID_LENGTH, GOOD)
            with pytest.raises(InvalidRunId):
                await guard.check("r" * (MAX_RUN_ID_LENGTH + 1))
    finally:
        for guard in guards:
            await guard.aclose()


def test_in_process_guard_memory_is_bounded() -> None:
    """10,000 runs of the longest id: the oldest are forgotten, memory stays bounded."""
    guard = MaskFractionGuard(0.5, 4, max_runs=100)

    async def count() -> None:
        for i in range(1_000):
            await guard.observe(f"{i:0{MAX_RUN_ID_LENGTH}d}", GOOD)

    anyio.run(count)
    assert len(guard._runs) == 100


# -- choosing the guard from settings --------------------------------------------------------


def _settings(**overrides: Any) -> Settings:
    return settings_from_mapping(
        {"sources": {"local": {"kind": "memory"}}, **overrides},
        env={},
    )


@pytest.mark.anyio
async def test_open_guard_follows_the_settings(redis_url: str, prefix: str) -> None:
    """guard.redis + max_mask_fraction: shared; either missing: the in-process guard."""
    capture = {"max_mask_fraction": 0.3, "mask_fraction_min_samples": 7}
    shared_settings = _settings(
        token_id_capture=capture, guard={"redis": redis_url, "key_prefix": prefix, "run_ttl_s": 9}
    )
    shared = open_guard(shared_settings, ServiceMetrics())
    local = open_guard(_settings(token_id_capture=capture), ServiceMetrics())
    off = open_guard(_settings(guard={"redis": redis_url}), ServiceMetrics())
    try:
        assert isinstance(shared, RedisMaskFractionGuard)
        assert (shared.max_mask_fraction, shared.min_samples, shared.key_prefix) == (
            0.3,
            7,
            prefix,
        )
        assert shared._ttl_ms == 9_000
        assert isinstance(local, MaskFractionGuard) and local.enabled
        assert isinstance(off, MaskFractionGuard) and not off.enabled
    finally:
        await shared.aclose()


@pytest.mark.parametrize(
    ("guard", "message"),
    [
        ({"redis": "http://redis:6379"}, "guard.redis: url"),
        ({"redis": "redis://"}, "guard.redis: url"),
        ({"redis": "redis://r:6379", "key_prefix": "a{b}"}, "guard.key_prefix"),
        ({"redis": "redis://r:6379", "run_ttl_s": 0}, "guard.run_ttl_s"),
        ({"redis": "redis://r:6379", "timeout_s": -1}, "guard.timeout_s"),
        ({"redis": "redis://r:6379", "url": "x"}, "guard.url"),
    ],
)
def test_invalid_guard_settings_name_the_key(guard: dict[str, Any], message: str) -> None:
    """A bad guard section fails validation with the offending key in the message."""
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        _settings(guard=guard)


def test_guard_settings_defaults() -> None:
    """No guard section: in-process counts; the shared defaults are documented ones."""
    guard = _settings().guard
    assert (guard.redis, guard.key_prefix, guard.run_ttl_s, guard.timeout_s) == (
        None,
        "token-finalizer:guard:",
        7 * 86_400.0,
        1.0,
    )


# -- through the app ----------------------------------------------------------------------------


def _app_settings(capture_dir: Path, guard: dict[str, Any] | None) -> Settings:
    data: dict[str, Any] = {
        "sources": {"local": {"kind": "file", "dir": str(capture_dir)}},
        "token_id_capture": {"max_mask_fraction": 0.5, "mask_fraction_min_samples": 4},
    }
    if guard is not None:
        data["guard"] = guard
    return settings_from_mapping(data, env={})


def _finalize(client: httpx.Client, rollout_id: str, run: str) -> httpx.Response:
    return client.post("/finalize", json=record_for(rollout_id), headers={"X-Run-Id": run})


def test_two_apps_share_one_guard(tmp_path: Path, redis_url: str, prefix: str) -> None:
    """Two apps (two replicas) on one guard prefix: masked calls alternate, the sum trips both."""
    settings = _app_settings(tmp_path, {"redis": redis_url, "key_prefix": prefix})
    app_a, app_b = create_app(settings), create_app(settings)
    with in_process(app_a) as a, in_process(app_b) as b:
        statuses = [_finalize((a, b)[i % 2], f"m-{i}", "shared").status_code for i in range(4)]
        later = [_finalize(client, "later", "shared").status_code for client in (a, b)]
        other = _finalize(b, "other", "another-run").status_code
        body = _finalize(a, "again", "shared").json()
        metrics = a.get("/metrics").text
    assert statuses == [200, 200, 200, 409]
    assert later == [409, 409]
    assert other == 200
    assert (body["finalized"], body["masked"], body["reasons"]) == (4, 4, {EMPTY: 4})
    assert "token_finalizer_guard_refusals_total 2.0" in metrics
    # Refused before the freeze: "later" was never frozen by either replica.
    assert stored_state(FileTokenStore(tmp_path), "later") is None


def test_unreachable_guard_redis_does_not_stop_finalizing(tmp_path: Path) -> None:
    """guard.redis down: finalizes answer 200 (masked, as the store says) and are counted."""
    settings = _app_settings(
        tmp_path, {"redis": f"redis://127.0.0.1:{free_port()}/0", "timeout_s": 0.5}
    )
    with in_process(create_app(settings)) as client:
        statuses = [_finalize(client, f"m-{i}", "down").status_code for i in range(6)]
        ready = client.get("/ready").status_code
        metrics = client.get("/metrics").text
    assert statuses == [200] * 6
    assert ready == 200  # the guard is not a dependency of readiness
    assert 'token_finalizer_guard_unavailable_total{operation="check"} 6.0' in metrics
    assert 'token_finalizer_guard_unavailable_total{operation="observe"} 6.0' in metrics


@pytest.mark.parametrize("guard", [None, "redis"])
def test_too_long_run_id_answers_400_and_freezes_nothing(
    tmp_path: Path, redis_url: str, prefix: str, guard: str | None
) -> None:
    """X-Run-Id longer than MAX_RUN_ID_LENGTH: 400 naming the bound; the capture stays open."""
    shared = None if guard is None else {"redis": redis_url, "key_prefix": prefix}
    store = FileTokenStore(tmp_path)
    entries = agent_rollout("long", calls=2, new_tokens_per_turn=8)

    async def write() -> None:
        for entry in entries:
            await store.put(entry)

    anyio.run(write)
    with in_process(create_app(_app_settings(tmp_path, shared))) as client:
        refused = _finalize(client, "long", "x" * (MAX_RUN_ID_LENGTH + 1))
        frozen_after_refusal = stored_state(store, "long").frozen
        accepted = _finalize(client, "long", "x" * MAX_RUN_ID_LENGTH)
    assert refused.status_code == 400
    assert str(MAX_RUN_ID_LENGTH) in refused.json()["error"]
    assert frozen_after_refusal is False
    assert accepted.status_code == 200


def test_the_app_closes_the_shared_guard(tmp_path: Path, redis_url: str, prefix: str) -> None:
    """The lifespan's shutdown closes the guard's Redis connections with the sources."""
    app = create_app(_app_settings(tmp_path, {"redis": redis_url, "key_prefix": prefix}))
    with in_process(app) as client:
        _finalize(client, "m-0", "closing")
        guard = app.state.service.guard
        assert isinstance(guard, RedisMaskFractionGuard) and not guard._closed
    assert guard._closed


def test_the_guards_lua_lives_beside_the_stores_scripts() -> None:
    """The counting script is a package script file, not Lua inline in Python (issue 29)."""
    import inspect

    import token_finalizer.service.redis_guard as redis_guard
    from token_finalizer.sources.redis._scripts import script_source

    assert (
        "HINCRBY" in inspect.getsource(redis_guard),
        "HINCRBY" in script_source("guard_observe"),
    ) == (False, True)
