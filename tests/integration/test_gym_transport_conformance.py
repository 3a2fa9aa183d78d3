"""NeMo Gym 0.7 transport conformance of `token-finalizer store serve`, on a file and a redis store.

NeMo Gym 0.7 checks an external capture transport with
`nemo_gym.token_id_capture.conformance.run_conformance(sink, source, lineage)`.
These are our own tests of the same contract, run against a real
`store serve` process (`--dir D`, then `--redis URL --key-prefix P`) through
the three clients a deployment uses: `HttpTokenSink` (the model server's
writer), `HttpTokenSource` (the finalizer's reader) and `HttpLineageResolver`
(the model server's request-time lineage). Factories make a fresh client for
every use that must show cross-client visibility. Each test has its own
rollout id.

Gym's check names, in its order: put_then_freeze_visibility,
idempotent_reput, conflicting_reput, mark_incomplete_durability,
freeze_idempotency, post_freeze_write_safety, conditional_retirement,
lineage_visibility, fresh_client_lineage_visibility, begin_call_custody;
each has one test below, named after what it shows.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.gym_calls import assistant_says, committed_call, user_says
from tests.support.redis import redis_url as find_redis_url
from tests.support.redis import unique_prefix
from tests.support.servers import free_port, running_process
from token_finalizer.sources.http import HttpTokenSource
from token_finalizer_client import ConflictError, HttpLineageResolver, HttpTokenSink

pytestmark = pytest.mark.anyio

REQUEST = [user_says("What is the weather in Paris?")]
ANSWER = [assistant_says("It is sunny.")]


@pytest.fixture(scope="module", params=["file", "redis"])
def store_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """`store serve --dir D`, then `store serve --redis URL --key-prefix P`, on a free port."""
    port = free_port()
    serve = ["store", "serve", "--port", str(port)]
    if request.param == "file":
        directory: Path = tmp_path_factory.mktemp("gym-conformance")
        with running_process([*serve, "--dir", str(directory)], port=port):
            yield f"http://127.0.0.1:{port}"
        return
    url = find_redis_url()
    with (
        unique_prefix(url, "gym-conformance") as prefix,
        running_process([*serve, "--redis", url, "--key-prefix", prefix], port=port),
    ):
        yield f"http://127.0.0.1:{port}"


class Clients:
    """Fresh sinks, sources and resolvers of one store server, all closed at the end."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._opened: list[Any] = []

    def _keep(self, client: Any) -> Any:
        self._opened.append(client)
        return client

    def sink(self) -> HttpTokenSink:
        return self._keep(HttpTokenSink(url=self.url))  # type: ignore[no-any-return]

    def source(self) -> HttpTokenSource:
        return self._keep(HttpTokenSource(self.url))  # type: ignore[no-any-return]

    def resolver(self) -> HttpLineageResolver:
        return self._keep(HttpLineageResolver(url=self.url))  # type: ignore[no-any-return]

    async def close(self) -> None:
        for client in self._opened:
            await client.close()


@pytest.fixture
async def clients(store_url: str) -> AsyncIterator[Clients]:
    """Client factories of the module's store server."""
    opened = Clients(store_url)
    yield opened
    await opened.close()


@pytest.fixture
def rid() -> str:
    """A rollout id no other test uses."""
    return f"gym-{uuid.uuid4().hex[:12]}"


def _entry(rollout_id: str, call_id: str = "call-1", generation: list[int] | None = None) -> Any:
    """A call committed as a 0.7 model server commits it: every lineage field stamped."""
    return committed_call(
        rollout_id,
        call_id,
        request_items=REQUEST,
        output_items=ANSWER,
        prompt=[101, 102, 103],
        generation=[201, 202] if generation is None else generation,
    )


async def test_put_then_freeze_round_trips_every_field(clients: Clients, rid: str) -> None:
    """A put is in the next snapshot, every field as written, the 0.7 lineage fields included."""
    entry = _entry(rid)
    await clients.sink().put(entry)
    snapshot = await clients.source().freeze(rid)
    assert (len(snapshot.entries), snapshot.incomplete, bool(snapshot.snapshot_id)) == (
        1,
        False,
        True,
    )
    assert snapshot.entries[0].to_dict() == entry


async def test_identical_reput_is_a_no_op(clients: Clients, rid: str) -> None:
    """The same entry put again (a retry resending the same payload) is stored once."""
    entry = _entry(rid)
    sink = clients.sink()
    await sink.put(entry)
    await sink.put(copy.deepcopy(entry))
    snapshot = await clients.source().freeze(rid)
    assert (len(snapshot.entries), snapshot.incomplete) == (1, False)


async def test_conflicting_reput_fails_closed(clients: Clients, rid: str) -> None:
    """A different payload under a stored call id raises, and the snapshot is incomplete."""
    sink = clients.sink()
    await sink.put(_entry(rid))
    with pytest.raises(ConflictError):
        await sink.put(_entry(rid, generation=[215]))
    assert (await clients.source().freeze(rid)).incomplete


async def test_mark_incomplete_is_durable_and_stales_retirement(clients: Clients, rid: str) -> None:
    """After freeze, a mark is seen by a fresh source, moves the version, and stales the drop."""
    sink = clients.sink()
    await sink.put(_entry(rid))
    before = await clients.source().freeze(rid)
    await sink.mark_incomplete(rid, "call-2")
    after = await clients.source().freeze(rid)
    assert after.incomplete and after.version != before.version
    dropped = await clients.source().drop(
        rid, snapshot_id=before.snapshot_id, version=before.version
    )
    assert dropped is False


async def test_freeze_is_idempotent(clients: Clients, rid: str) -> None:
    """Two fresh sources freezing the same rollout get the same snapshot id, version and entries."""
    await clients.sink().put(_entry(rid))
    first = await clients.source().freeze(rid)
    second = await clients.source().freeze(rid)
    assert (first.snapshot_id, first.version) == (second.snapshot_id, second.version)
    assert [e.to_dict() for e in first.entries] == [e.to_dict() for e in second.entries]


async def test_put_after_freeze_raises(clients: Clients, rid: str) -> None:
    """A put racing after the freeze is refused (a hard fence), so no snapshot goes stale."""
    sink = clients.sink()
    await sink.put(_entry(rid))
    await clients.source().freeze(rid)
    with pytest.raises(ConflictError):
        await sink.put(_entry(rid, "call-2"))


async def test_retirement_is_conditional_and_keeps_evidence(clients: Clients, rid: str) -> None:
    """A drop naming the wrong version is refused and keeps the capture; the exact one retires."""
    await clients.sink().put(_entry(rid))
    source = clients.source()
    snapshot = await source.freeze(rid)
    stale = await source.drop(rid, snapshot_id=snapshot.snapshot_id, version=snapshot.version + 1)
    evidence = await source.freeze(rid)
    exact = await source.drop(rid, snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    assert (stale, len(evidence.entries), exact) == (False, 1, True)


async def test_announced_call_without_entry_masks_the_snapshot(clients: Clients, rid: str) -> None:
    """begin_call custody: a call announced and never put makes the snapshot incomplete."""
    await clients.sink().begin_call(rid, "call-lost")
    assert (await clients.source().freeze(rid)).incomplete


async def _check_lineage(resolver: HttpLineageResolver, rid: str, entry: dict[str, Any]) -> None:
    """A faithful continuation resolves to the call with its tokens; a rewrite does not."""
    faithful = await resolver.resolve(rid, [*REQUEST, *ANSWER, user_says("And tomorrow?")])
    assert faithful.status == "resolved" and faithful.match is not None
    assert faithful.match.model_call_id == "call-1"
    assert list(faithful.match.cumulative_token_ids) == [101, 102, 103, 201, 202]
    assert faithful.match.digest == entry["digest"]
    rewritten = await resolver.resolve(rid, [user_says("REWRITTEN"), *ANSWER])
    assert rewritten.status == "unresolved"
    root = await resolver.resolve(rid, [user_says("fresh question")])
    assert root.status == "root"


async def test_lineage_visibility(clients: Clients, rid: str) -> None:
    """A resolver that existed before the put resolves the continuation once the put returned."""
    resolver = clients.resolver()
    entry = _entry(rid)
    await clients.sink().put(entry)
    await _check_lineage(resolver, rid, entry)


async def test_fresh_client_lineage_visibility(clients: Clients, rid: str) -> None:
    """A resolver built only after the put (another worker's) resolves the continuation too."""
    entry = _entry(rid)
    await clients.sink().put(entry)
    await _check_lineage(clients.resolver(), rid, entry)
