"""External staging end to end on real servers, on a directory and on Redis.

Two `store serve` processes share one backend; a faithful writer of NeMo
Gym 0.7's capture path (`StagingWriter`: Gym itself needs Python 3.13)
stages through `HttpStagingSink` from a pool of threads and records through
`HttpCaptureLedger`s on both store servers, many rollouts at once. Then two
finalizer replicas (`serve` processes with one `retire.key`, each reading
through its own store server) finalize every record through the client and
retire through the other replica, and `store sweep` runs.

The rollouts: clean chains; chains with a crashed model server (a call
staged but never committed: an orphan, then retried); a main chain with a
subagent branch (two terminals, finalized through different replicas, one
retire each); Gym's lost acknowledgement (the store kept a call the worker
was told failed: failure rows, the rollout poisoned); rollouts nobody
finalizes (one orphan each). Nothing is lost (every verified row is exactly the tokens its
terminal was generated on), poisoned rollouts are masked and kept as
evidence, and after retire and sweep the store holds nothing else, orphans
included.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.support.gym_staging_writer import Call, StagingWriter, scored_record
from tests.support.redis import store_backend
from tests.support.servers import free_port, running_process
from token_finalizer import FileTokenStore
from token_finalizer.cli import main
from token_finalizer.sources.redis import RedisTokenStore
from token_finalizer_client import (
    Finalized,
    FinalizerClient,
    HttpCaptureLedger,
    HttpStagingSink,
)

WRITER, FINALIZER, CONTROL = "w-e2e", "f-e2e", "c-e2e"
RETIRE_KEY = "staging-e2e-retire-key-0123456789abcdef"
ROLLOUTS_PER_KIND = 3
STAGE_THREADS = 16


@dataclass
class Topology:
    """The store servers, the finalizer replicas, and the store CLI's backend options."""

    stores: tuple[str, str]
    replicas: tuple[str, str]
    backend: list[str]


@dataclass
class Written:
    """What the writer served, per rollout kind: the records to finalize and what they must give."""

    verified: list[tuple[dict[str, Any], Call]] = field(default_factory=list)
    poisoned: list[dict[str, Any]] = field(default_factory=list)
    abandoned: list[str] = field(default_factory=list)
    orphans: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass
class Outcome:
    """What the servers answered."""

    written: Written
    orphans_seen: dict[str, tuple[str, ...]]
    verified: list[Finalized]
    poisoned: list[Finalized]
    retired: list[bool]
    left: list[str]


def _config(path: Path, store: str) -> Path:
    path.write_text(
        f"""\
sources:
  default: store
  store: {{kind: http, url: "{store}", token: "{FINALIZER}"}}
retire:
  key: "{RETIRE_KEY}"
"""
    )
    return path


@pytest.fixture(scope="module", params=["dir", "redis"])
def topology(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Topology]:
    """Two store servers over one directory (then one Redis prefix), two finalizer replicas."""
    with ExitStack() as stack:
        directory = tmp_path_factory.mktemp("staging-e2e")
        backend = store_backend(stack, request.param, directory, "staging-e2e")
        stores = []
        for _ in range(2):
            port = free_port()
            args = ["store", "serve", *backend, "--port", str(port), "--writer-token", WRITER]
            args += ["--finalizer-token", FINALIZER, "--control-token", CONTROL]
            stack.enter_context(running_process(args, port=port))
            stores.append(f"http://127.0.0.1:{port}")
        replicas = []
        for index, store in enumerate(stores):
            config = _config(tmp_path_factory.mktemp(f"replica-{index}") / "f.yaml", store)
            port = free_port()
            stack.enter_context(
                running_process(["serve", "--config", str(config), "--port", str(port)], port=port)
            )
            replicas.append(f"http://127.0.0.1:{port}")
        yield Topology((stores[0], stores[1]), (replicas[0], replicas[1]), backend)


def _user(rollout_id: str, index: int) -> dict[str, Any]:
    return {"role": "user", "content": f"step {index} of {rollout_id}"}


async def _chain(
    writer: StagingWriter,
    rollout_id: str,
    calls: int,
    *,
    server: int,
    crash_at: int | None = None,
    lost_ack_at: int | None = None,
) -> list[Call]:
    """A conversation of `calls` turns, each call through the other model server."""
    items: list[dict[str, Any]] = []
    served = []
    for index in range(calls):
        items = [*items, _user(rollout_id, index)]
        generated = [500 + index, 501 + index, 502 + index]
        if crash_at == index:
            await writer.call(
                rollout_id,
                f"c{index}-lost",
                items,
                generated=generated,
                server=server + index,
                fault="crash",
            )
        fault = "lost_ack" if lost_ack_at == index else None
        call = await writer.call(
            rollout_id,
            f"c{index}",
            items,
            generated=generated,
            server=server + index + 1,
            fault=fault,
        )
        served.append(call)
        items = [*items, {"role": "assistant", "content": call.text}]
    return served


async def _write_all(topology: Topology) -> Written:
    """Every rollout written concurrently, as many model-server requests at once."""
    written = Written()
    ledgers = [HttpCaptureLedger(store, token=WRITER) for store in topology.stores]
    sinks = [HttpStagingSink(store, token=WRITER) for store in topology.stores]
    pool = ThreadPoolExecutor(max_workers=STAGE_THREADS)
    writer = StagingWriter(ledgers, sinks, pool)

    async def clean(rid: str, server: int) -> None:
        calls = await _chain(writer, rid, 4, server=server)
        written.verified.append((scored_record(rid, calls[-1]), calls[-1]))

    async def crashed(rid: str, server: int) -> None:
        calls = await _chain(writer, rid, 3, server=server, crash_at=1)
        written.verified.append((scored_record(rid, calls[-1]), calls[-1]))
        written.orphans[rid] = ("c1-lost",)

    async def branched(rid: str, server: int) -> None:
        calls = await _chain(writer, rid, 2, server=server)
        sub = await writer.call(
            rid,
            "sub-0",
            [{"role": "user", "content": f"subtask of {rid}"}],
            generated=[7, 8],
            server=server,
        )
        declared = scored_record(rid, sub, terminal_response_id=sub.response_id)
        written.verified += [(scored_record(rid, calls[-1]), calls[-1]), (declared, sub)]

    async def lost(rid: str, server: int) -> None:
        calls = await _chain(writer, rid, 3, server=server, lost_ack_at=1)
        written.poisoned.append(scored_record(rid, calls[-1]))
        written.orphans[rid] = ("c1",)

    async def abandoned(rid: str, server: int) -> None:
        await _chain(writer, rid, 2, server=server, crash_at=1)
        written.abandoned.append(rid)
        written.orphans[rid] = ("c1-lost",)

    kinds = (clean, crashed, branched, lost, abandoned)
    try:
        await asyncio.gather(
            *(
                kind(f"e2e-{kind.__name__}-{index}-{uuid.uuid4().hex[:6]}", index)
                for kind in kinds
                for index in range(ROLLOUTS_PER_KIND)
            )
        )
    finally:
        pool.shutdown()
        for ledger in ledgers:
            await ledger.close()
        for sink in sinks:
            sink.close()
    return written


def _store(topology: Topology) -> Any:
    """A store over the backend, for what an operator sees (`store inspect`, rollout ids)."""
    if topology.backend[0] == "--dir":
        return FileTokenStore(topology.backend[1])
    return RedisTokenStore(topology.backend[1], key_prefix=topology.backend[3])


async def _orphans(topology: Topology, rollout_ids: list[str]) -> dict[str, tuple[str, ...]]:
    store = _store(topology)
    try:
        reports = [await store.admin.inspect(rid) for rid in rollout_ids]
        return {
            rid: report.staging.orphans for rid, report in zip(rollout_ids, reports, strict=True)
        }
    finally:
        await store.close()


async def _rollout_ids(topology: Topology) -> list[str]:
    store = _store(topology)
    try:
        return list(await store.admin.rollout_ids())
    finally:
        await store.close()


@pytest.fixture(scope="module")
def outcome(topology: Topology) -> Outcome:
    """Write, finalize through alternating replicas, retire through the other one, sweep."""
    written = anyio.run(_write_all, topology)
    orphans_seen = anyio.run(_orphans, topology, sorted(written.orphans))
    clients = [FinalizerClient(replica) for replica in topology.replicas]
    try:
        verified = [
            clients[index % 2].finalize(record)
            for index, (record, _) in enumerate(written.verified)
        ]
        poisoned = [
            clients[index % 2].finalize(record) for index, record in enumerate(written.poisoned)
        ]
        retired = [clients[(index + 1) % 2].retire(answer) for index, answer in enumerate(verified)]
    finally:
        for client in clients:
            client.close()
    sweep = ["store", "sweep", *topology.backend, "--retired-older-than", "0s"]
    assert main([*sweep, "--abandoned-older-than", "0s"]) == 0
    left = anyio.run(_rollout_ids, topology)
    return Outcome(written, orphans_seen, verified, poisoned, retired, left)


def test_every_verified_row_is_its_terminals_tokens(outcome: Outcome) -> None:
    """Nothing lost: each row is exactly the sequence its terminal call was generated on."""
    rows = [answer.staged.row for answer in outcome.verified if answer.staged is not None]
    assert [None if row is None else tuple(row.token_ids.tolist()) for row in rows] == [
        call.tokens for _, call in outcome.written.verified
    ]


def test_every_verified_record_was_retired(outcome: Outcome) -> None:
    """Each ticket retires through the other replica; a subagent's second ticket is already done."""
    assert outcome.retired == [True] * len(outcome.written.verified)


def test_poisoned_rollouts_are_masked_with_the_first_failure(outcome: Outcome) -> None:
    """Gym's lost acknowledgement: masked rollout_failed (worker_capture_failed), no ticket."""
    verdicts = {
        (
            a.build["mask_reason"] if a.build else None,
            a.staged.error.detail if a.staged and a.staged.error else None,
            a.retirable,
        )
        for a in outcome.poisoned
    }
    assert verdicts == {("rollout_failed", "worker_capture_failed", False)}


def test_orphans_were_seen_before_finalize(outcome: Outcome) -> None:
    """`store inspect` names every call staged but never committed."""
    assert outcome.orphans_seen == outcome.written.orphans


def test_retire_and_sweep_leave_only_the_evidence(outcome: Outcome) -> None:
    """After retire and sweep only the poisoned rollouts remain; retired and abandoned are gone."""
    poisoned = sorted(record["_ng_rollout_id"] for record in outcome.written.poisoned)
    assert sorted(outcome.left) == poisoned
