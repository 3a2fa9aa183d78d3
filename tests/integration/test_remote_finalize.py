"""Remote capture end to end on loopback: writer sink -> store server -> finalizer service.

Three real servers take part: the capture-store server (uvicorn, over a file
store, token required), the finalizer service (uvicorn) configured with an
`http` source for that store and a `file` source for a local directory, and
the writers, which are `HttpTokenSink` (remote) and the file store's own
writer side (local). The same scenario written both ways must finalize to
the same record.
"""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest

from tests.support.captures import agent_rollout, make_entry, record_for
from tests.support.servers import free_port, running_app
from tests.support.stores import stored_state
from token_finalizer import FileTokenStore
from token_finalizer.api import create_app
from token_finalizer.settings import settings_from_mapping
from token_finalizer.sources.http import HttpTokenSource
from token_finalizer.store_server import create_store_app
from token_finalizer_client import ConflictError, HttpTokenSink

pytestmark = pytest.mark.anyio

STORE_TOKEN = "store-s3cret"


@dataclass
class Deployment:
    """The servers of one test module and the stores behind them."""

    finalizer_url: str
    store_url: str
    remote_store: FileTokenStore
    local_store: FileTokenStore


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """A store server and a finalizer whose default source is that store over http."""
    remote_store = FileTokenStore(tmp_path_factory.mktemp("remote"))
    local_dir = tmp_path_factory.mktemp("local")
    with running_app(create_store_app(remote_store, token=STORE_TOKEN)) as store_url:
        settings = settings_from_mapping(
            {
                "sources": {
                    "default": "remote",
                    "remote": {"kind": "http", "url": store_url, "token": "${TOKEN}"},
                    "local": {"kind": "file", "dir": str(local_dir)},
                }
            },
            env={"TOKEN": STORE_TOKEN},
        )
        with running_app(create_app(settings)) as finalizer_url:
            yield Deployment(finalizer_url, store_url, remote_store, FileTokenStore(local_dir))


@pytest.fixture
async def finalizer(deployment: Deployment) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client of the finalizer service."""
    async with httpx.AsyncClient(base_url=deployment.finalizer_url, timeout=60.0) as client:
        yield client


@pytest.fixture
async def sink(deployment: Deployment) -> AsyncIterator[HttpTokenSink]:
    """The writer sink a model server would configure (keyword arguments only)."""
    opened = HttpTokenSink(url=deployment.store_url, token=STORE_TOKEN, timeout=10.0)
    yield opened
    await opened.close()


async def finalize(client: httpx.AsyncClient, record: dict, source: str | None = None) -> dict:
    params = {"source": source} if source else None
    response = await client.post("/finalize", json=record, params=params)
    assert response.status_code == 200, response.text
    return response.json()


# -- one rollout, all the way ------------------------------------------------------------


async def test_rollout_written_remotely_is_finalized_and_retired(
    deployment: Deployment, finalizer: httpx.AsyncClient, sink: HttpTokenSink
) -> None:
    """Sink puts -> finalize through the http source -> retire: the store dropped the capture."""
    for entry in agent_rollout("remote-1", calls=6, new_tokens_per_turn=50):
        await sink.put(entry)
    answer = await finalize(finalizer, record_for("remote-1"))
    assert (answer["source"], answer["build"]["mask_sample"], answer["retirable"]) == (
        "remote",
        False,
        True,
    )
    assert answer["record"]["_ng_token_capture"]["n_calls"] == 6
    retired = await finalizer.post("/retire", json=answer)
    assert retired.json() == {"retired": True}
    assert stored_state(deployment.remote_store, "remote-1").retired is True
    assert not (deployment.remote_store.directory / "remote-1.tokens.jsonl").exists()


async def test_late_write_after_retire_fails_loudly(
    finalizer: httpx.AsyncClient, sink: HttpTokenSink
) -> None:
    """Once retired, a late put for that rollout raises ConflictError at the writer."""
    for entry in agent_rollout("remote-2", calls=2, new_tokens_per_turn=20):
        await sink.put(entry)
    answer = await finalize(finalizer, record_for("remote-2"))
    await finalizer.post("/retire", json=answer)
    with pytest.raises(ConflictError, match="retired"):
        await sink.put(make_entry("remote-2", "late", [1], [2]))


async def test_ready_probes_the_store(finalizer: httpx.AsyncClient) -> None:
    """/ready is 200 and reports the http source reachable while the store serves."""
    response = await finalizer.get("/ready")
    assert (response.status_code, response.json()["sources"]["remote"]) == (
        200,
        {"reachable": True},
    )


async def test_unreachable_store_is_503_and_ready_fails() -> None:
    """With the store down, finalize answers 503 + Retry-After and /ready is 503."""
    settings = settings_from_mapping(
        {"sources": {"gone": {"kind": "http", "url": f"http://127.0.0.1:{free_port()}"}}},
        env={},
    )
    with running_app(create_app(settings)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:
            answer = await client.post("/finalize", json=record_for("lost-1"))
            ready = await client.get("/ready")
    assert (answer.status_code, "Retry-After" in answer.headers) == (503, True)
    assert answer.json()["source"] == "gone"
    assert (ready.status_code, ready.json()["sources"]["gone"]["reachable"]) == (503, False)


async def test_unreachable_store_with_on_unreachable_mask_is_masked() -> None:
    """With `on_unreachable: mask` the store being down gives a masked, unretirable record."""
    url = f"http://127.0.0.1:{free_port()}"
    settings = settings_from_mapping(
        {"sources": {"gone": {"kind": "http", "url": url, "on_unreachable": "mask"}}}, env={}
    )
    with running_app(create_app(settings)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60.0) as client:
            answer = (await client.post("/finalize", json=record_for("lost-2"))).json()
    assert (answer["build"]["mask_reason"], answer["retirable"], answer["retire"]) == (
        "store_unreachable",
        False,
        None,
    )
    assert answer["record"]["_ng_token_capture"]["error"].startswith("StoreUnreachable: ")


# -- the same scenarios through a file source and an http source ---------------------------

Step = tuple[str, tuple[Any, ...]]


def _chain(rollout_id: str) -> list[Step]:
    return [("put", (e,)) for e in agent_rollout(rollout_id, calls=4, new_tokens_per_turn=30)]


def _two_roots(rollout_id: str) -> list[Step]:
    return [
        ("put", (make_entry(rollout_id, "a", [1, 2], [3], created_at=1.0),)),
        ("put", (make_entry(rollout_id, "b", [7, 8], [9], created_at=2.0),)),
    ]


def _branch(rollout_id: str) -> list[Step]:
    return [
        ("put", (make_entry(rollout_id, "root", [1, 2], [3]),)),
        ("put", (make_entry(rollout_id, "main", [1, 2, 3, 4], [5]),)),
        ("put", (make_entry(rollout_id, "side", [1, 2, 3, 6], [7]),)),
    ]


def _unresolved_retries(rollout_id: str) -> list[Step]:
    return [
        ("put", (make_entry(rollout_id, "try-1", [1, 2], [3]),)),
        ("put", (make_entry(rollout_id, "try-2", [1, 2], [4]),)),
    ]


def _infinite_log_prob(rollout_id: str) -> list[Step]:
    entry = make_entry(rollout_id, "c1", [1, 2], [3, 4], log_probs=[-math.inf, -0.25])
    return [("put", (entry,))]


SCENARIOS: dict[str, Callable[[str], list[Step]]] = {
    "chain": _chain,
    "incomplete-mark": lambda r: [*_chain(r), ("mark_incomplete", (r, "lost"))],
    "announced-missing": lambda r: [("begin_call", (r, "never")), *_chain(r)],
    "announced-arrived": lambda r: [("begin_call", (r, "call-00000")), *_chain(r)],
    "two-roots": _two_roots,
    "branch": _branch,
    "unresolved-retries": _unresolved_retries,
    "empty-generation": lambda r: [
        *_chain(r),
        ("put", (make_entry(r, "empty", [1], []),)),
    ],
    "infinite-log-prob": _infinite_log_prob,
    "nothing-written": lambda r: [],
}


def _comparable(answer: dict) -> dict:
    """Everything but the source name and the snapshot identity (each store mints its own).

    The retire ticket signs both, so of it only the rollout and version are compared. A
    `store delete` hint names a directory store's `--dir`, which only the file source knows
    (an http source cannot tell where its store keeps data): that option is left out.
    """
    build = _without_store_option(dict(answer["build"] or {}))
    build.pop("_capture_snapshot", None)
    record = dict(answer["record"])
    if isinstance(record.get("_ng_token_capture"), dict):
        record["_ng_token_capture"] = _without_store_option(dict(record["_ng_token_capture"]))
    retire = answer["retire"]
    if retire is not None:
        retire = {"rollout_id": retire["rollout_id"], "version": retire["version"]}
    return {**answer, "source": None, "record": record, "build": build, "retire": retire}


def _without_store_option(fields: dict) -> dict:
    if isinstance(fields.get("hint"), str):
        fields["hint"] = re.sub(r" --dir [^`]+`", "`", fields["hint"])
    return fields


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
async def test_file_and_http_sources_finalize_identically(
    deployment: Deployment, finalizer: httpx.AsyncClient, sink: HttpTokenSink, scenario: str
) -> None:
    """One scenario written locally and remotely finalizes to the same answer."""
    rollout_id = f"same-{scenario}"
    for method, args in SCENARIOS[scenario](rollout_id):
        await getattr(deployment.local_store, method)(*args)
        await getattr(sink, method)(*args)
    local = await finalize(finalizer, record_for(rollout_id), "local")
    remote = await finalize(finalizer, record_for(rollout_id), "remote")
    assert _comparable(local) == _comparable(remote)
    assert local["source"] == "local" and remote["source"] == "remote"


async def test_redundant_capture_finalizes_identically(
    deployment: Deployment, finalizer: httpx.AsyncClient, sink: HttpTokenSink
) -> None:
    """A record that already carries token ids is left alone by both sources, and both agree."""
    rollout_id = "same-redundant"
    entry = make_entry(rollout_id, "c1", [1], [2])
    await deployment.local_store.put(entry)
    await sink.put(entry)
    record = record_for(rollout_id)
    record["response"]["output"][0]["generation_token_ids"] = [2]
    local = await finalize(finalizer, record, "local")
    remote = await finalize(finalizer, record, "remote")
    assert _comparable(local) == _comparable(remote)
    assert (remote["record"] == record, remote["build"]["_redundant_capture"]) == (True, True)


async def test_infinite_log_prob_reaches_the_http_source_intact(
    deployment: Deployment, sink: HttpTokenSink
) -> None:
    """A -inf log probability put through the sink is -inf in the http source's snapshot."""
    await sink.put(make_entry("inf-1", "c1", [1, 2], [3, 4], log_probs=[-math.inf, -0.25]))
    async with HttpTokenSource(deployment.store_url, token=STORE_TOKEN) as source:
        snapshot = await source.freeze("inf-1")
    assert snapshot.entries[0].generation_log_probs.tolist() == [-math.inf, -0.25]


async def test_newer_schema_capture_is_masked_identically(
    deployment: Deployment, finalizer: httpx.AsyncClient
) -> None:
    """A line from a newer writer (schema 2) masks the record, with the same reason, both ways."""
    rollout_id = "same-newer-schema"
    line = orjson.dumps({**make_entry(rollout_id, "c1", [1], [2]), "schema_version": 2})
    for store in (deployment.local_store, deployment.remote_store):
        (store.directory / f"{rollout_id}.tokens.jsonl").write_bytes(line + b"\n")
    local = await finalize(finalizer, record_for(rollout_id), "local")
    remote = await finalize(finalizer, record_for(rollout_id), "remote")
    assert _comparable(local) == _comparable(remote)
    assert remote["build"]["error"].startswith("TokenEntryError: schema_version 2 is newer")
    assert remote["retirable"] is False
