"""A stub serving layer around the released capture package (generator only).

The model-server side runs NeMo Gym's own ``CaptureContext``, ``resolve_parent``
and ``VLLMWorkerCaptureHandler``; the worker side runs its own
``RolloutTokenCapture`` with ``VLLMCaptureAdapter``. What the package leaves to
a server or a framework is ours and deliberately small: the engine (a function
of the scenario's token script), a thread-safe dict staging store, a ledger
proxy that records every call Gym makes on it, and the middleware's closing
rule (an admitted call that never committed gets one failure row).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from _reference import Gym

__all__ = ["CallObservation", "EngineFailure", "ModelServer", "RecordingLedger", "StagingStore"]

Json = Any


def dump(model: Any) -> Json:
    """The wire JSON of a pydantic model of the package (field order kept)."""
    return model.model_dump(mode="json")


def error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


class EngineFailure(Exception):
    """The engine answered HTTP 500: the model server never sees a completion."""


# --------------------------------------------------------------------------- staging store


class StagingStore:
    """A thread-safe in-memory ``StagingSink`` and ``StagingSource`` keyed by ``rid/mcid``.

    ``modes`` sets how a given staging key is answered: ``ok``, ``reject`` (a
    refused write, nothing stored) or ``lost_ack`` (stored, then the
    acknowledgement is lost on the way back: the worker sees an exception).
    """

    def __init__(self, gym: Gym) -> None:
        self._gym = gym
        self._lock = threading.Lock()
        self.records: dict[str, Any] = {}
        self.attachments: dict[str, Mapping[str, Any] | None] = {}
        self.modes: dict[str, str] = {}
        self.operations: list[dict[str, Any]] = []

    def stage(self, record: Any, *, attachments: Mapping[str, Any] | None = None) -> Any:
        key = self._gym.staged.staging_key(record.rollout_id, record.model_call_id)
        mode = self.modes.get(key, "ok")
        # A stored record is listed once, under the store's records; a refused
        # one only here.
        operation: dict[str, Any] = {
            "op": "stage",
            "staging_key": key,
            "attachments": _plain_attachments(attachments),
        }
        self.operations.append(operation)
        with self._lock:
            existing = self.records.get(key)
            if mode == "reject" or (existing is not None and dump(existing) != dump(record)):
                result = self._gym.staged.StageResult(ok=False, error="refused by the test sink")
                operation["record"] = dump(record)
                operation["result"] = dump(result)
                return result
            self.records[key] = record
            self.attachments[key] = attachments
        if mode == "lost_ack":
            operation["result"] = {"raised": "ConnectionError: acknowledgement lost"}
            raise ConnectionError("acknowledgement lost")
        result = self._gym.staged.StageResult(ok=True, staging_key=key)
        operation["result"] = dump(result)
        return result

    def fetch(self, staging_keys: list[str]) -> list[Any]:
        base = self._gym.staged.StagedCallBaseSnapshot
        with self._lock:
            return [
                base.model_validate(self.records[key].model_dump(exclude={"extras"}))
                for key in staging_keys
            ]

    def extras(self, key: str) -> Any:
        with self._lock:
            return self.records[key].extras

    def deltas(self, staging_chain: list[str]) -> list[int]:
        with self._lock:
            return [token for key in staging_chain for token in self.records[key].token_ids_delta]

    def wire(self) -> dict[str, Any]:
        """Every staged record as Gym dumps it, with its attachments."""
        return {
            key: {
                "record": dump(record),
                "attachments": _plain_attachments(self.attachments.get(key)),
            }
            for key, record in sorted(self.records.items())
        }


def _plain_attachments(attachments: Mapping[str, Any] | None) -> Json:
    if attachments is None:
        return None
    out: dict[str, Any] = {}
    for name, value in attachments.items():
        if isinstance(value, bytes):
            out[name] = {"bytes_hex": value.hex()}
        else:
            out[name] = {"json": value}
    return out


def attachments_from_plain(plain: Json) -> Mapping[str, Any] | None:
    if plain is None:
        return None
    return {
        name: bytes.fromhex(value["bytes_hex"]) if "bytes_hex" in value else value["json"]
        for name, value in plain.items()
    }


# --------------------------------------------------------------------------- ledger proxy


class RecordingLedger:
    """Forwards Gym's ``CaptureLedger`` calls to a real ledger and records each of them."""

    def __init__(self, gym: Gym, inner: Any) -> None:
        self._gym = gym
        self.inner = inner
        self.operations: list[dict[str, Any]] = []

    async def _call(self, op: str, args: dict[str, Any], coroutine: Any) -> Any:
        entry: dict[str, Any] = {"op": op, "args": args}
        self.operations.append(entry)
        try:
            result = await coroutine
        except Exception as error:
            entry["error"] = error_text(error)
            raise
        entry["result"] = resolution_json(result) if op == "resolve" else result
        return result

    async def resolve(self, rollout_id: str, request_items: list[dict[str, Any]]) -> Any:
        args = {"rollout_id": rollout_id, "request_items": copy.deepcopy(request_items)}
        return await self._call("resolve", args, self.inner.resolve(rollout_id, request_items))

    async def record(self, commit: Any) -> None:
        await self._call("record", {"commit": dump(commit)}, self.inner.record(commit))

    async def record_failure(self, rollout_id: str, model_call_id: str, reason: str) -> None:
        args = {"rollout_id": rollout_id, "model_call_id": model_call_id, "reason": reason}
        coroutine = self.inner.record_failure(rollout_id, model_call_id, reason)
        await self._call("record_failure", args, coroutine)

    async def manifest(self, rollout_id: str) -> dict[str, Any]:
        args = {"rollout_id": rollout_id}
        result: dict[str, Any] = await self._call("manifest", args, self.inner.manifest(rollout_id))
        return result

    async def has_rows(self, rollout_id: str) -> bool:
        args = {"rollout_id": rollout_id}
        result: bool = await self._call("has_rows", args, self.inner.has_rows(rollout_id))
        return result

    def is_process_shared(self) -> bool:
        return bool(self.inner.is_process_shared())

    async def close(self) -> None:
        await self.inner.close()


def resolution_json(resolution: Any) -> Json:
    match = resolution.match
    return {
        "status": resolution.status.value,
        "reason": resolution.reason,
        "match": None
        if match is None
        else {
            "model_call_id": match.model_call_id,
            "cumulative_token_ids": list(match.cumulative_token_ids),
            "digest": match.digest,
            "staging_chain": list(match.staging_chain),
            "prev_len": match.prev_len,
            "chain_hash": match.chain_hash,
        },
    }


# --------------------------------------------------------------------------- engine + worker


def engine_payload(call: dict[str, Any], prompt: list[int]) -> dict[str, Any]:
    """The vLLM chat completion the engine answers for one scripted call."""
    engine = call["engine"]
    generation = engine["generation"]
    logprobs = engine["logprobs"]
    message: dict[str, Any] = {"role": "assistant", "content": engine["content"]}
    if "routed_experts" in engine:
        message["routed_experts"] = engine["routed_experts"]
    choice: dict[str, Any] = {"index": 0, "finish_reason": "stop", "message": message}
    if engine.get("token_fields") == "message":
        message.update(generation_token_ids=generation, generation_log_probs=logprobs)
    else:
        choice["logprobs"] = {
            "content": [
                {"token": f"token_id:{token}", "logprob": lp, "bytes": None, "top_logprobs": []}
                for token, lp in zip(generation, logprobs, strict=True)
            ]
        }
    return {
        "id": engine["completion_id"],
        "object": "chat.completion",
        "created": 0,
        "model": "policy",
        "prompt_token_ids": prompt,
        "choices": [choice],
        "usage": {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(generation),
            "total_tokens": len(prompt) + len(generation),
        },
    }


class Worker:
    """The framework's inference worker: Gym's ``RolloutTokenCapture`` over the dict store."""

    def __init__(self, gym: Gym, store: StagingStore) -> None:
        self._gym = gym
        self._store = store
        self.weight_version = 0
        self.capture = gym.capture.RolloutTokenCapture(
            sink=store,
            weight_version_fn=lambda: self.weight_version,
            adapter=gym.vllm.VLLMCaptureAdapter(),
        )

    def complete(
        self, body: dict[str, Any], call: dict[str, Any], seen: dict[str, Any]
    ) -> dict[str, Any]:
        engine = call["engine"]
        fault = engine.get("fault")
        self.weight_version = call["weight_version"]
        capture_params = body.get("ng_capture")
        if capture_params is None or fault == "ignores_ng_capture":
            if fault == "http_500":
                raise EngineFailure("engine answered HTTP 500")
            return engine_payload(call, list(engine["prompt_after_prefix"]))
        admission = self._gym.staged.CaptureAdmission.model_validate(capture_params)
        prefix = self._store.deltas(list(admission.staging_chain))
        if "prefix_fault" in engine:
            prefix[engine["prefix_fault"]["index"]] = engine["prefix_fault"]["token"]
        # enter_prefix only sets required_prefix_token_ids to this list.
        seen["prefix"] = list(prefix)
        self._gym.vllm.VLLMCaptureAdapter().enter_prefix(body, prefix)
        active = self.capture.begin_call(admission, prefix_token_ids=prefix, stream=body["stream"])
        if fault == "http_500":
            raise EngineFailure("engine answered HTTP 500 after admission")
        payload = engine_payload(call, prefix + list(engine["prompt_after_prefix"]))
        seen["engine_response"] = copy.deepcopy(payload)
        adapter = self._gym.vllm.VLLMCaptureAdapter()
        generated, logprobs = adapter.extract_generation(payload)
        seen["engine_tokens"] = {
            "prompt_token_ids": adapter.extract_prompt_ids(payload),
            "generated_token_ids": generated,
            "generated_log_probs": logprobs,
            "extras": adapter.extract_extras(payload),
        }
        attachments = attachments_from_plain(call.get("attachments"))
        coords = self.capture.complete_call_from_response(active, payload, attachments=attachments)
        wire = dump(coords)
        if fault == "coordinates_diverge":
            wire["prev_len"] += 1
            wire["cum_len"] += 1
        payload["ng_commit_coords"] = wire
        return payload


# --------------------------------------------------------------------------- model server


@dataclass
class CallObservation:
    """Everything one call showed, in the order it happened."""

    model_call_id: str
    data: dict[str, Any] = field(default_factory=dict)


class ModelServer:
    """One Gym model server with external staging, driven call by call."""

    def __init__(self, gym: Gym, ledger: RecordingLedger, store: StagingStore) -> None:
        self._gym = gym
        self.ledger = ledger
        self.store = store
        self.worker = Worker(gym, store)
        self.handler = gym.external.VLLMWorkerCaptureHandler()

    async def serve(self, rollout_id: str, call: dict[str, Any]) -> dict[str, Any]:
        gym = self._gym
        seen: dict[str, Any] = {}
        ledger_mark = len(self.ledger.operations)
        stage_mark = len(self.store.operations)
        self.store.modes[f"{rollout_id}/{call['model_call_id']}"] = call.get("sink", "ok")
        context = gym.sink.CaptureContext(
            rollout_id=rollout_id,
            model_call_id=call["model_call_id"],
            token_sink=None,
            lineage_store=self.ledger,
            external_staging=True,
            admitted_at=call["admitted_at"],
        )
        reset = gym.sink.set_token_sink(context)
        try:
            await self._serve_in_context(context, call, seen)
        finally:
            await self._fail_if_uncommitted(context)
            gym.sink.reset_token_sink(reset)
        seen["committed"] = context.committed
        seen["ledger_ops"] = self.ledger.operations[ledger_mark:]
        seen["stage_ops"] = self.store.operations[stage_mark:]
        return seen

    async def _serve_in_context(
        self, context: Any, call: dict[str, Any], seen: dict[str, Any]
    ) -> None:
        gym = self._gym
        # Chat Completions dialect without instructions or tools: the request
        # items are the messages as received.
        items = copy.deepcopy(call["request"]["messages"])
        await gym.sink.resolve_parent(items)
        seen["resolution"] = resolution_json(context.parent_resolution)
        admission = context.capture_admission
        seen["admission"] = None if admission is None else dump(admission)
        engine = call["engine"]
        if engine.get("fault") == "server_synthesized":
            served = engine_payload(call, [])
            served.pop("prompt_token_ids")
            served["choices"][0].pop("logprobs", None)
            seen["served_response"] = copy.deepcopy(served)
            seen["http_status"] = 200
            await self.handler.finalize_response(served)
            return
        body = copy.deepcopy(call["request"])
        body["stream"] = False
        body = self.handler.prepare_request(body)
        if "forge_parent_chain_hash" in engine:
            body["ng_capture"]["parent_chain_hash"] = engine["forge_parent_chain_hash"]
        seen["engine_request"] = copy.deepcopy(body)
        try:
            payload = self.worker.complete(body, call, seen)
        except EngineFailure as failure:
            seen["http_status"] = 500
            seen["engine_error"] = str(failure)
            return
        # An unadmitted call reaches the engine as plain traffic (no coordinates).
        seen.setdefault("engine_response", copy.deepcopy(payload))
        self.handler.prepare_response(payload)
        seen["commit_coordinates"] = context.external_commit_coords
        if "served_id" in engine:
            payload["id"] = engine["served_id"]
        seen["served_response"] = copy.deepcopy(payload)
        seen["http_status"] = 200
        await self.handler.finalize_response(payload)

    async def _fail_if_uncommitted(self, context: Any) -> None:
        """The middleware's closing rule, restated: admitted, not committed -> one failure row."""
        if context.capture_admission is None or context.committed:
            return
        await self.ledger.record_failure(
            context.rollout_id,
            context.model_call_id,
            self._gym.records.UNCOMMITTED_CALL_REASON,
        )
