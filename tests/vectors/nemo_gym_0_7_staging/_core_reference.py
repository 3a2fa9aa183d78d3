"""The reference package under a stub ``nemo_gym``, and a worker that stages through it.

Part of generate_core.py (run by hand, never in CI); see its docstring.
"""

from __future__ import annotations

import importlib
import shutil
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

ROLLOUT = "rollout-7"
Json = Any


class Reference:
    """The reference modules, imported from a throw-away stub package tree."""

    def __init__(self, nemo_gym_dir: Path, workdir: Path) -> None:
        package = workdir / "nemo_gym"
        package.mkdir()
        (package / "__init__.py").write_text("")
        (package / "config_types.py").write_text('ROLLOUT_PATH_PREFIX = "ng-rollout"\n')
        (package / "global_config.py").write_text(
            'TASK_INDEX_KEY_NAME = "_ng_task_index"\n'
            'ROLLOUT_INDEX_KEY_NAME = "_ng_rollout_index"\n'
            'ATTEMPT_INDEX_KEY_NAME = "_ng_attempt_index"\n'
            'ROLLOUT_ID_KEY_NAME = "_ng_rollout_id"\n'
        )
        shutil.copy(nemo_gym_dir / "rollout_correlation.py", package)
        shutil.copytree(
            nemo_gym_dir / "token_id_capture",
            package / "token_id_capture",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        sys.dont_write_bytecode = True
        sys.path.insert(0, str(workdir))

        def load(name: str) -> ModuleType:
            return importlib.import_module(f"nemo_gym.token_id_capture.{name}")

        self.digest = load("staging.digest")
        self.records = load("staging.records")
        self.capture = load("staging.capture")
        self.rebuild = load("staging.rebuild")
        self.selection = load("staging.terminal")
        self.terminal = load("terminal")
        self.fingerprint = load("fingerprint")
        self.lineage = load("lineage")
        self.workdir = workdir


def error_name(function: Any) -> Json:
    """``{"value": ...}`` or ``{"error": "<exception class>"}``."""
    try:
        return {"value": function()}
    except Exception as error:
        return {"error": type(error).__name__}


# --------------------------------------------------------------------------- items


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": text}


def tool_call(call_id: str, arguments: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": "run", "arguments": arguments}


def tool_output(call_id: str, output: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


# --------------------------------------------------------------------------- worker


class DictSink:
    """A thread-safe in-memory staging sink and source."""

    def __init__(self, ref: Reference) -> None:
        self.ref = ref
        self.staged: dict[str, Any] = {}
        self.lock = threading.Lock()

    def stage(self, record: Any, *, attachments: Any = None) -> Any:
        with self.lock:
            self.staged[record.staging_key] = record
        return self.ref.records.StageResult(ok=True, staging_key=record.staging_key)

    def fetch(self, keys: list[str]) -> list[Any]:
        base = self.ref.records.StagedCallBaseSnapshot
        return [
            base.model_validate(self.staged[key].model_dump(exclude={"extras"})) for key in keys
        ]


class Rollout:
    """Stages calls through the reference worker and commits their manifest rows."""

    def __init__(self, ref: Reference, rollout_id: str = ROLLOUT) -> None:
        self.ref = ref
        self.rollout_id = rollout_id
        self.sink = DictSink(ref)
        self.capture = ref.capture.RolloutTokenCapture(sink=self.sink, weight_version_fn=lambda: 0)
        self.chains: dict[str, list[str]] = {}
        self.coords: dict[str, Any] = {}
        self.rows: list[Any] = []
        self.commits: list[Any] = []
        self.clock = 1000.0

    def call(
        self,
        call_id: str,
        parent: str | None,
        carry: list[int],
        generated: list[int],
        *,
        weight_version: int = 3,
        extras: dict[str, Any] | None = None,
        request: list[dict[str, Any]] | None = None,
        response: list[dict[str, Any]] | None = None,
        wrong_prefix: list[int] | None = None,
        prev_len: int | None = None,
        forged_parent_chain_hash: str | None = None,
        admitted_at: float | None = None,
    ) -> Any:
        """Stage one call through the reference worker and commit its manifest row.

        ``wrong_prefix`` replaces the prefix the worker is given (it trusts it);
        ``prev_len`` admits the call at another length than its parent's end;
        ``forged_parent_chain_hash`` replaces the parent chain hash of the admission.
        """
        records = self.ref.records
        parent_coords = self.coords.get(parent) if parent else None
        if parent_coords is not None and prev_len is None:
            prev_len = parent_coords.cum_len
        admission = records.CaptureAdmission(
            rollout_id=self.rollout_id,
            model_call_id=call_id,
            parent_call_id=parent,
            prev_len=prev_len or 0,
            mode="token_in" if parent else "text",
            staging_chain=self.chains[parent] if parent else [],
            parent_chain_hash=(
                forged_parent_chain_hash or (parent_coords.chain_hash if parent_coords else None)
            ),
        )
        prefix = (wrong_prefix or self.chain_tokens(parent)[: prev_len or 0]) if parent else None
        active = self.capture.begin_call(
            admission, prefix_token_ids=prefix, weight_version=weight_version
        )
        prompt = list(prefix or []) + carry
        log_probs = [-0.125 * (index + 1) for index in range(len(generated))]
        coords = self.capture.complete_call(
            active,
            prompt_token_ids=prompt,
            generated_token_ids=generated,
            generated_logprobs=log_probs,
            extras=extras,
        )
        assert coords.disposition == "staged", coords
        self.coords[call_id] = coords
        self.chains[call_id] = [*(self.chains[parent] if parent else []), coords.staging_key]
        request = request or [user(f"turn of {call_id}")]
        response = response or [assistant(f"answer of {call_id}")]
        fingerprint = self.ref.fingerprint.assistant_fingerprint
        self.clock += 1.0
        row = records.CallRecord(
            model_call_id=call_id,
            parent_call_id=coords.parent_call_id,
            prev_len=coords.prev_len,
            delta_len=coords.delta_len,
            cum_len=coords.cum_len,
            weight_version=coords.weight_version,
            digest=coords.digest,
            extras_digest=coords.extras_digest,
            staging_key=coords.staging_key,
            mode=admission.mode,
            chain_hash=coords.chain_hash,
            cumulative_hash=coords.cumulative_hash,
            response_id=f"resp-{call_id}",
            admitted_at=self.clock if admitted_at is None else admitted_at,
            output_fingerprint=fingerprint(response) or None,
            continuation_fingerprint=fingerprint(request + response) or None,
            fingerprint_version=2,
        )
        self.rows.append(row)
        self.commits.append(
            records.CaptureLedgerCommit(
                rollout_id=self.rollout_id,
                record=row,
                staging_chain=tuple(self.chains[call_id]),
                request_items=request,
                response_items=response,
            )
        )
        return row

    def chain_tokens(self, call_id: str) -> list[int]:
        """The call's cumulative tokens as a worker fetches them: its chain's staged deltas."""
        tokens: list[int] = []
        for key in self.chains[call_id]:
            tokens += self.sink.staged[key].token_ids_delta
        return tokens

    def receipt(self, terminal: str | None, **fields: Any) -> Any:
        values = {"terminal_model_call_id": terminal, "terminal_selection": "declared", **fields}
        return self.ref.records.RolloutReceipt(
            rollout_id=self.rollout_id, manifest=list(self.rows), **values
        )


def dump(model: Any) -> Json:
    return model.model_dump(mode="json")
