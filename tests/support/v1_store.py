"""A capture store written from docs/store-protocol.md#protocol-v1 alone: in memory, no extension.

It serves the v1 calls exactly as the doc's tables say and nothing more: no
`/capabilities` (404), no query parameter (any is a 404, as a store that never
heard of it routes it), no staging. Unknown body keys are ignored, as the doc
requires. `seen` lists every request (method, path, query, body keys);
`fail_next_freezes` makes the next freezes answer 503 (a blip); `seed` plants
entries as stored lines (a line twice included). A lineage resolve matches
full-prompt entries only (a delta chain answers `lookup_error`).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

__all__ = ["V1Store"]


@dataclass
class _Capture:
    entries: list[dict[str, Any]] = field(default_factory=list)
    intents: set[str] = field(default_factory=set)
    incomplete: bool = False
    frozen: bool = False
    retired: bool = False
    snapshot_id: str = ""
    version: int = 0


class JSONResponse(Response):
    """JSON with -Infinity and NaN tokens allowed (log probabilities may hold them)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return json.dumps(content, allow_nan=True).encode()


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


class V1Store:
    """The store, and `app()` serving it."""

    def __init__(self) -> None:
        self.captures: dict[str, _Capture] = {}
        self.seen: list[tuple[str, str, str, tuple[str, ...]]] = []
        self.fail_next_freezes = 0

    def seed(self, rollout_id: str, entries: list[dict[str, Any]]) -> None:
        self.captures.setdefault(rollout_id, _Capture()).entries.extend(entries)

    def app(self) -> Starlette:
        return Starlette(
            routes=[Route("/{path:path}", self._handle, methods=["GET", "POST", "PUT"])]
        )

    async def _handle(self, request: Request) -> JSONResponse:
        raw = request.scope["raw_path"].decode("ascii")
        parts = [unquote(part) for part in raw.split("/")[1:]]
        body = json.loads(await request.body() or b"{}") if request.method != "GET" else {}
        query = request.scope["query_string"].decode()
        self.seen.append(
            (request.method, raw, query, tuple(body) if isinstance(body, dict) else ())
        )
        if parts == ["health"] and request.method == "GET":
            return JSONResponse({"status": "ok"})
        if (
            query
            or len(parts) < 4
            or parts[0] != "ng-rollout"
            or parts[2] != "training-token-capture"
        ):
            return _error(404, f"no such path: {raw}?{query}")
        capture = self.captures.setdefault(parts[1], _Capture())
        call = (request.method, "/".join(parts[3:]))
        if call == ("POST", "freeze"):
            return self._freeze(parts[1], capture)
        if call == ("POST", "drop"):
            return self._drop(capture, body)
        if request.method == "PUT" and parts[3] == "calls" and len(parts) == 5:
            return self._put(capture, parts[1], parts[4], body)
        if call == ("POST", "incomplete"):
            if capture.retired:
                return _error(409, "retired")
            capture.incomplete, capture.version = True, capture.version + 1
            return JSONResponse({"incomplete": True})
        if call == ("POST", "intents"):
            if capture.frozen or capture.retired:
                return _error(409, "frozen or retired")
            capture.intents.add(body["model_call_id"])
            return JSONResponse({"announced": True})
        if call == ("POST", "lineage/resolve"):
            return JSONResponse(self._resolve(capture, body))
        return _error(404, f"no such path: {raw}")

    def _freeze(self, rollout_id: str, capture: _Capture) -> JSONResponse:
        if self.fail_next_freezes:
            self.fail_next_freezes -= 1
            return _error(503, "the store is busy")
        if capture.retired:
            return _error(409, f"rollout {rollout_id} is retired")
        if not capture.frozen:
            capture.frozen, capture.snapshot_id = True, uuid.uuid4().hex
            capture.version += 1
        stored = {entry["model_call_id"] for entry in capture.entries}
        return JSONResponse(
            {
                "rollout_id": rollout_id,
                "entries": capture.entries,
                "incomplete": capture.incomplete or bool(capture.intents - stored),
                "snapshot_id": capture.snapshot_id,
                "version": capture.version,
            }
        )

    def _drop(self, capture: _Capture, body: dict[str, Any]) -> JSONResponse:
        named = (body["snapshot_id"], body["version"]) == (capture.snapshot_id, capture.version)
        if capture.frozen and named and not capture.retired:
            capture.entries, capture.intents, capture.retired = [], set(), True
        return JSONResponse({"dropped": named and capture.retired})

    def _put(self, capture: _Capture, rollout_id: str, call_id: str, body: Any) -> JSONResponse:
        if body.get("rollout_id", rollout_id) != rollout_id:
            return _error(422, "rollout_id differs from the path's")
        if body.get("model_call_id", call_id) != call_id:
            return _error(422, "model_call_id differs from the path's")
        if capture.frozen or capture.retired:
            return _error(409, "frozen or retired")
        entry = {**body, "rollout_id": rollout_id, "model_call_id": call_id}
        same = [stored for stored in capture.entries if stored["model_call_id"] == call_id]
        if same and same[0] != entry:
            return _error(409, f"call {call_id} holds another payload")
        if not same:
            capture.entries.append(entry)
            capture.version += 1
        return JSONResponse({"stored": True})

    def _resolve(self, capture: _Capture, body: dict[str, Any]) -> dict[str, Any]:
        fingerprint, digests = body["fingerprint"], body["context_digests"]
        if fingerprint == "":
            return {"status": "root", "reason": "", "match": None}
        found = {
            entry["model_call_id"]: entry
            for entry in capture.entries
            if entry.get("continuation_fingerprint") == fingerprint
            and entry.get("fingerprint_version", 2) == 2
            and entry.get("continuation_context_len", -1) < len(digests)
            and digests[entry["continuation_context_len"]]
            == entry.get("continuation_context_digest")
        }
        if not found:
            return {"status": "unresolved", "reason": "no_match", "match": None}
        if len(found) > 1:
            return {"status": "unresolved", "reason": "ambiguous", "match": None}
        (call_id, entry), ids = next(iter(found.items())), None
        if not entry.get("prompt_is_delta"):
            ids = entry["prompt_token_ids"] + entry["generation_token_ids"]
        if ids is None:
            return {"status": "unresolved", "reason": "lookup_error", "match": None}
        match = {
            "model_call_id": call_id,
            "cumulative_token_ids": ids,
            "digest": entry.get("digest") or "",
            "prev_len": len(ids),
        }
        return {"status": "resolved", "reason": "", "match": match}
