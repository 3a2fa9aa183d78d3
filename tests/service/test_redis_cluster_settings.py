"""Reaching a Redis Cluster from the configuration and the store CLI: what is accepted, what not.

`sources.<name>.cluster` with `url` (a seed) or `urls` (seeds),
`guard.redis` as a URL or a mapping, `--redis-cluster` with repeated
`--redis`; and the spellings of cluster mode other clients use, refused with
a message saying what to write instead. The same over real clusters:
tests/integration/test_redis_cluster_*.py.
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from token_finalizer.cli import main
from token_finalizer.cli.store.backend import UsageError, add_backend_arguments, backend_of
from token_finalizer.settings import ConfigError, settings_from_mapping

SEEDS = ["redis://:pw@10.0.0.1:7000/0", "redis://:pw@10.0.0.2:7000/0"]


def _source(**fields: Any) -> dict[str, Any]:
    return {"sources": {"shared": {"kind": "redis", **fields}}}


def test_a_cluster_source_from_one_seed_reaches_the_store_options() -> None:
    """cluster, min_replicas_acked and the seed reach the store's options."""
    settings = settings_from_mapping(
        _source(url=SEEDS[0], cluster=True, min_replicas_acked=1), env={}
    )
    options = settings.sources["shared"].open_options()
    assert (options["urls"], options["cluster"], options["min_replicas_acked"]) == (
        (SEEDS[0],),
        True,
        1,
    )


def test_a_cluster_source_takes_several_seeds() -> None:
    """`urls:` lists seed nodes."""
    settings = settings_from_mapping(_source(urls=SEEDS, cluster=True), env={})
    assert settings.sources["shared"].open_options()["urls"] == tuple(SEEDS)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"urls": SEEDS}, "need `cluster: true`"),
        ({"url": SEEDS[0], "urls": SEEDS, "cluster": True}, "not both"),
        ({"url": "redis+cluster://10.0.0.1:7000"}, "set `cluster: true`"),
        ({"url": "redis://10.0.0.1:7000/0?cluster=true"}, "set `cluster: true`"),
        ({"url": "redis://10.0.0.1:7000/3", "cluster": True}, "database 0 only"),
        ({"urls": [SEEDS[0], "redis://:other@10.0.0.2:7000/0"], "cluster": True}, "credentials"),
        ({"url": SEEDS[0], "min_replicas_acked": -1}, "min_replicas_acked"),
        ({"urls": [], "cluster": True}, "at least one seed"),
    ],
)
def test_unusable_cluster_settings_are_refused(fields: dict[str, Any], message: str) -> None:
    """Each mistake fails at start-up naming the fix, never showing the password."""
    with pytest.raises(ConfigError, match=message) as failure:
        settings_from_mapping(_source(**fields), env={})
    assert ":pw@" not in str(failure.value)


def test_cluster_keys_belong_to_redis_sources_only() -> None:
    """`cluster` on a file source is refused."""
    with pytest.raises(ConfigError, match="are for redis sources"):
        settings_from_mapping({"sources": {"f": {"kind": "file", "dir": "x", "cluster": True}}})


def test_the_guard_takes_a_url_or_a_cluster_mapping() -> None:
    """`guard.redis: URL` (as before) and `guard.redis: {urls, cluster, min_replicas_acked}`."""
    short = settings_from_mapping({"guard": {"redis": SEEDS[0]}}, env={})
    full = settings_from_mapping(
        {"guard": {"redis": {"urls": SEEDS, "cluster": True, "min_replicas_acked": 1}}}, env={}
    )
    assert short.guard.redis is not None and short.guard.redis.seeds == (SEEDS[0],)
    assert full.guard.redis is not None
    assert (full.guard.redis.seeds, full.guard.redis.cluster) == (tuple(SEEDS), True)
    assert full.guard.redis.min_replicas_acked == 1


def _backend(*args: str) -> Any:
    parser = argparse.ArgumentParser()
    add_backend_arguments(parser)
    return backend_of(parser.parse_args(list(args)))


def test_redis_cluster_flag_with_several_seeds() -> None:
    """--redis twice with --redis-cluster: both seeds, cluster mode, the default deadline."""
    backend = _backend("--redis", SEEDS[0], "--redis", SEEDS[1], "--redis-cluster")
    assert (backend.options["urls"], backend.options["cluster"]) == (SEEDS, True)
    assert backend.options["timeout_s"] == 5.0
    assert ":pw@" not in backend.where and "cluster" in backend.where


def test_redis_timeout_and_replicas_reach_the_store() -> None:
    """--redis-timeout and --min-replicas-acked become the store's options."""
    backend = _backend("--redis", SEEDS[0], "--redis-timeout", "2.5", "--min-replicas-acked", "1")
    assert (backend.options["timeout_s"], backend.options["min_replicas_acked"]) == (2.5, 1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--redis", SEEDS[0], "--redis", SEEDS[1]], "--redis-cluster"),
        (["--dir", ".", "--redis-cluster"], "--redis-cluster only goes with --redis"),
        (["--dir", ".", "--min-replicas-acked", "1"], "only goes with --redis"),
    ],
)
def test_unusable_cluster_options_are_usage_errors(args: list[str], message: str) -> None:
    """Several seeds without --redis-cluster, or a redis option without --redis."""
    with pytest.raises(UsageError, match=message):
        _backend(*args)


def test_store_sweep_refuses_several_seeds_without_cluster(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The command line exits 2 and says what is missing."""
    command = ["store", "sweep", "--redis", SEEDS[0], "--redis", SEEDS[1]]
    assert main([*command, "--retired-older-than", "1d"]) == 2
    assert "--redis-cluster" in capsys.readouterr().err
