"""A faithful writer of NeMo Gym 0.7's external staging, played with our clients (Gym needs 3.13).

`StagingWriter` does, per model call, what Gym's capture path does
(docs/staging.md#flow; the vectors' `scenarios.json` recorded it from the
released package):

1. the model server resolves the request's parent in its ledger
   (`HttpCaptureLedger.resolve`): no model-authored item is a text root; a
   resolved parent makes a `token_in` call continuing its chain; an
   unresolved request becomes a root while the rollout has no rows, else the
   call is served unadmitted after an `unresolved_parent` failure row;
2. the inference worker (on a thread of a pool: Gym's completion threads)
   takes the parent chain's tokens as the prefix, generates, builds the
   staged delta and its hashes, and stages it (`HttpStagingSink.stage`);
3. the model server commits the call's ledger row (`record`), or, when the
   stage failed, the two failure rows Gym writes (`worker_capture_failed`,
   then the middleware's `request_finished_without_staged_coordinates`).

Faults a test asks for: `crash` (staged, then the model server dies before
its commit: no row at all, an orphan, and the harness retries the call),
`lost_ack` (the store kept the call but the worker saw a failure: Gym's two
failure rows, an orphan, the rollout poisoned). The worker keeps the deltas
it staged (its own prefix cache), as a serving engine keeps its KV blocks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from token_finalizer.core.staging import build_staged_call, staging_key
from token_finalizer_client import HttpCaptureLedger, HttpStagingSink
from token_finalizer_client.protocol import FINGERPRINT_VERSION, assistant_fingerprint

__all__ = ["Call", "StagingWriter", "scored_record"]

WORKER_CAPTURE_FAILED = "worker_capture_failed"
REQUEST_FINISHED = "request_finished_without_staged_coordinates"


@dataclass(frozen=True)
class Call:
    """One model call as served: its id, the served response id, its text, its row tokens."""

    model_call_id: str
    response_id: str
    text: str
    staged: bool
    tokens: tuple[int, ...]  # the whole sequence it was generated on, prompt and generation


@dataclass
class _Worker:
    """The inference worker's side: one sink shared by its threads, its staged deltas."""

    sinks: Sequence[HttpStagingSink]
    pool: ThreadPoolExecutor
    deltas: dict[str, tuple[int, ...]] = field(default_factory=dict)


class StagingWriter:
    """Gym's capture path for many rollouts at once: model servers (ledgers) and a worker."""

    def __init__(
        self,
        ledgers: Sequence[HttpCaptureLedger],
        sinks: Sequence[HttpStagingSink],
        pool: ThreadPoolExecutor,
    ) -> None:
        self._ledgers = ledgers
        self._worker = _Worker(sinks, pool)
        self._served = 0

    async def call(
        self,
        rollout_id: str,
        model_call_id: str,
        items: list[dict[str, Any]],
        *,
        generated: Sequence[int],
        server: int,
        fault: str | None = None,
        weight_version: int = 1,
    ) -> Call:
        """Serve one call of `items` through model server `server`; what was served."""
        ledger = self._ledgers[server % len(self._ledgers)]
        admitted_at = time.time()
        resolution = await ledger.resolve(rollout_id, items)
        parent: _Parent | None = None
        chain: tuple[str, ...] = ()
        if resolution.match is not None:
            match = resolution.match
            parent = _Parent(match.model_call_id, match.prev_len, match.chain_hash)
            chain = match.staging_chain
        elif resolution.status == "unresolved" and await ledger.has_rows(rollout_id):
            await ledger.record_failure(rollout_id, model_call_id, "unresolved_parent")
            return self._served_call(model_call_id, staged=False, tokens=())
        prefix = tuple(token for key in chain for token in self._worker.deltas[key])
        if len(prefix) != (0 if parent is None else parent.cum_len):
            raise AssertionError(f"the worker's prefix of {model_call_id} is not its parent's")
        prompt = [*prefix, *_prompt_tokens(items, len(chain))]
        record = build_staged_call(
            rollout_id=rollout_id,
            model_call_id=model_call_id,
            parent=parent,  # type: ignore[arg-type]  # what the admission says of the parent
            prompt_token_ids=prompt,
            generated_token_ids=list(generated),
            generated_log_probs=[-0.125 * (i + 1) for i in range(len(generated))],
            weight_version=weight_version,
        )
        key = staging_key(rollout_id, model_call_id)
        sink = self._worker.sinks[server % len(self._worker.sinks)]
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self._worker.pool, sink.stage, record.to_json())
        self._worker.deltas[key] = tuple(int(t) for t in record.token_ids_delta)
        served = self._served_call(model_call_id, staged=True, tokens=(*prompt, *generated))
        if fault == "crash":
            return served  # the model server died: no row, the staged call is an orphan
        if not result.ok or fault == "lost_ack":
            for reason in (WORKER_CAPTURE_FAILED, REQUEST_FINISHED):
                await ledger.record_failure(rollout_id, model_call_id, reason)
            return served
        response = [{"role": "assistant", "content": served.text}]
        commit = {
            "rollout_id": rollout_id,
            "record": {
                "model_call_id": model_call_id,
                "parent_call_id": None if parent is None else parent.model_call_id,
                "prev_len": record.prev_len,
                "delta_len": record.delta_len,
                "cum_len": record.cum_len,
                "weight_version": record.weight_version,
                "digest": record.digest,
                "extras_digest": record.extras_digest,
                "staging_key": key,
                "mode": record.mode,
                "chain_hash": record.chain_hash,
                "cumulative_hash": record.cumulative_hash,
                "response_id": served.response_id,
                "admitted_at": admitted_at,
                "output_fingerprint": assistant_fingerprint(response),
                "continuation_fingerprint": assistant_fingerprint(items + response),
                "fingerprint_version": FINGERPRINT_VERSION,
            },
            "staging_chain": [*chain, key],
            "request_items": items,
            "response_items": response,
        }
        await ledger.record(commit)
        return served

    def _served_call(self, model_call_id: str, *, staged: bool, tokens: tuple[int, ...]) -> Call:
        self._served += 1
        text = f"answer {self._served}"
        return Call(model_call_id, f"chatcmpl-{self._served}", text, staged, tokens)


@dataclass(frozen=True)
class _Parent:
    """The parent as Gym's admission names it: call id, `prev_len` (its cum_len), chain hash."""

    model_call_id: str
    cum_len: int
    chain_hash: str


def _prompt_tokens(items: list[dict[str, Any]], depth: int) -> list[int]:
    """The new prompt tokens of a request: its last user turn, tokenized (deterministically)."""
    text = str(items[-1].get("content", ""))
    return [1000 + depth] + [200 + (ord(char) % 50) for char in text[:6]]


def scored_record(rollout_id: str, call: Call, **extra: Any) -> dict[str, Any]:
    """The finished record a harness sends: the served response it scored, and a reward."""
    output = [
        {
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": call.text, "annotations": []}],
        }
    ]
    response = {"id": call.response_id, "object": "response", "output": output}
    return {"_ng_rollout_id": rollout_id, "response": response, "reward": 1.0, **extra}
