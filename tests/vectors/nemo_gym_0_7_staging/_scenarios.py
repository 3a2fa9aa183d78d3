"""Run the scripted rollouts end to end and record what every layer did (generator only)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from _harness import ModelServer, RecordingLedger, StagingStore
from _reference import Gym
from _scenario_specs import scenario_specs
from _trainer import finalize

__all__ = ["ScenarioRun", "run_scenarios"]

Json = Any


class ScenarioRun:
    """One scenario's case plus the live objects later families reuse."""

    def __init__(self, case: dict[str, Any], store: StagingStore, ledger: Any) -> None:
        self.case = case
        self.store = store
        self.ledger = ledger


def clean_chain_routes(gym: Gym) -> dict[str, Any]:
    """Routed experts for c1 (5 tokens, nested list) and c2 (8 tokens, nrlre1 int16)."""
    nested = [[[2 * token, 2 * token + 1]] for token in range(5)]
    envelope = gym.routes.encode_routed_experts(
        [[[token % 7, (token + 3) % 7]] for token in range(8)], dtype="int16"
    )
    return {"c1": nested, "c2": envelope}


def scored_response(served: dict[str, Any]) -> dict[str, Any]:
    """The /run response an agent returns for one served completion (Responses shape)."""
    text = served["choices"][0]["message"]["content"]
    return {
        "id": served["id"],
        "object": "response",
        "output": [
            {
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
    }


def concrete_record(spec: dict[str, Any], served: dict[str, dict[str, Any]]) -> dict[str, Any]:
    record: dict[str, Any] = {"reward": 1.0}
    if "response_of" in spec:
        record["response"] = scored_response(served[spec["response_of"]])
    if "declared_of" in spec:
        record["terminal_response_id"] = served[spec["declared_of"]]["id"]
    if "declared_id" in spec:
        record["terminal_response_id"] = spec["declared_id"]
    if "explicit" in spec:
        record["_ng_terminal_model_call_id"] = spec["explicit"]
    return record


def ledger_rows(ledger: Any, kind: str, root: Path, rollout_id: str) -> list[Json]:
    """The rows as the ledger keeps them (the file ledger: one sorted-key JSON line each)."""
    if kind == "file":
        lines = (root / f"{rollout_id}.lineage.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]
    return copy.deepcopy(ledger._ledgers.get(rollout_id, []))


async def run_one(gym: Gym, spec: dict[str, Any], workdir: Path) -> ScenarioRun:
    kind = spec.get("ledger", "file")
    rollout_id = f"rollout-{spec['name'].replace('_', '-')}"
    root = workdir / spec["name"]
    inner = (
        gym.lineage.FileLineageStore(root) if kind == "file" else gym.lineage.InMemoryLineageStore()
    )
    ledger = RecordingLedger(gym, inner)
    store = StagingStore(gym)
    server = ModelServer(gym, ledger, store)
    calls = []
    served: dict[str, dict[str, Any]] = {}
    for call in spec["calls"]:
        seen = await server.serve(rollout_id, call)
        calls.append({"model_call_id": call["model_call_id"], **seen})
        if seen.get("served_response") is not None:
            served[call["model_call_id"]] = seen["served_response"]
    manifest = await inner.manifest(rollout_id)
    committed_keys = {row["staging_key"] for row in manifest["records"]}
    finalize_inputs, finalize_expected = [], []
    for request in spec["finalize"]:
        record = concrete_record(request, served)
        finalize_inputs.append(
            {"name": request["name"], "description": request["description"], "record": record}
        )
        finalize_expected.append(
            {"name": request["name"], **finalize(gym, store, rollout_id, manifest, record)}
        )
    case = {
        "name": spec["name"],
        "description": spec["description"],
        "inputs": {
            "rollout_id": rollout_id,
            "ledger": kind,
            "calls": spec["calls"],
            "finalize": finalize_inputs,
        },
        "expected": {
            "calls": calls,
            "staged_records": store.wire(),
            "orphan_staging_keys": sorted(set(store.records) - committed_keys),
            "ledger_rows": ledger_rows(inner, kind, root, rollout_id),
            "manifest": manifest,
            "finalize": finalize_expected,
        },
    }
    return ScenarioRun(case, store, inner)


async def run_scenarios(gym: Gym, workdir: Path) -> dict[str, ScenarioRun]:
    runs = {}
    for spec in scenario_specs(clean_chain_routes(gym)):
        runs[spec["name"]] = await run_one(gym, spec, workdir)
    return runs
