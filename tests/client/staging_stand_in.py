"""An in-process stand-in of the capture store's staging routes, for the client's unit tests.

It answers the ledger, stage, fetch, extras and attachments calls of the
store protocol (docs/staging.md#the-client) the way the store server does:
rows and records held in dicts, decided by the service's own pure core
(`token_finalizer.core.staging`: write-once rows, the manifest, ledger
resolution, record validation and the stage-time custody checks). It is a
test double of the store, so the tests check what the client sends and how
it reads every answer; the tests against the real store server are
`test_staging_e2e.py`.

    store = StagingStoreStandIn()
    sink = HttpStagingSink(URL, transport=store.transport())       # sync or async clients
    with running_app(store.asgi_app()) as url: ...                  # a real loopback server
    store.requests  # [Seen(method, path segments, body), ...], packed columns as lists

Paths are read from the raw path, each segment percent-decoded, exactly as
the client encoded them. `store.answer_next(status, body)` makes the next
requests get canned answers instead (retries, odd answers). It advertises
the store server's features at `GET /capabilities` (`store.features`; None
answers 404, a store that predates the route), a probe it does not record.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import httpx

from token_finalizer.core.staging import (
    PACKED_COLUMNS,
    CustodyRefusal,
    LedgerConflict,
    LedgerWrite,
    StagedCallRecord,
    StagingRecordError,
    admit_staged_record,
    check_custody,
    failure_row,
    manifest_from_rows,
    plan_commit,
    plan_failure,
    resolve_ledger,
    unpack_columns,
)
from token_finalizer.store_server.capabilities import STORE_FEATURES
from token_finalizer_client._json import dumps, loads

__all__ = ["Seen", "StagingStoreStandIn"]

_PREFIX = ("ng-rollout",)
_CAPTURE = "training-token-capture"


@dataclass(frozen=True)
class Seen:
    """One request as the stand-in received it: method, decoded path segments, parsed body."""

    method: str
    segments: tuple[str, ...]
    body: Any
    headers: dict[str, str]
    content: bytes

    @property
    def operation(self) -> str:
        """The path after `.../training-token-capture/`, segments joined by `/`."""
        return "/".join(self.segments[3:])


@dataclass
class _Rollout:
    rows: list[dict[str, Any]] = field(default_factory=list)
    staged: dict[str, tuple[StagedCallRecord, dict[str, Any], Any]] = field(default_factory=dict)
    frozen: bool = False


def _unpacked(body: Any) -> Any:
    """A stage body with packed token columns as the store reads it: the record with lists."""
    if not isinstance(body, dict) or "columns" not in body:
        return body
    record = unpack_columns(body["record"], body["columns"])
    lists = {name: record[name].tolist() for name in PACKED_COLUMNS}
    return {"attachments": body.get("attachments"), "record": {**record, **lists}}


def _json(status: int, body: Any) -> httpx.Response:
    return httpx.Response(status, content=dumps(body), headers={"content-type": "application/json"})


def _error(status: int, message: str, **extra: Any) -> httpx.Response:
    return _json(status, {"error": message, **extra})


class StagingStoreStandIn:
    """The staging routes of a capture store, in memory (see the module docstring)."""

    def __init__(self) -> None:
        self.rollouts: dict[str, _Rollout] = {}
        self.requests: list[Seen] = []
        self._canned: deque[httpx.Response] = deque()
        self._lock = threading.Lock()
        self.features: list[str] | None = list(STORE_FEATURES)
        self.probes = 0

    # -- test controls ------------------------------------------------------------------

    def answer_next(self, status: int, body: Any = None, *, times: int = 1) -> None:
        """The next `times` requests get this answer instead of the store's."""
        for _ in range(times):
            self._canned.append(_json(status, body if body is not None else {"error": "canned"}))

    def freeze(self, rollout_id: str) -> None:
        """Freeze a rollout: every later ledger write and stage is refused."""
        self._rollout(rollout_id).frozen = True

    def append_raw_row(self, rollout_id: str, row: dict[str, Any]) -> None:
        """A row written behind the ledger's back (an older or buggy writer)."""
        self._rollout(rollout_id).rows.append(dict(row))

    def transport(self) -> httpx.MockTransport:
        """An in-process transport for a sync or an async client."""
        return httpx.MockTransport(self.handle)

    def asgi_app(self) -> Any:
        """The stand-in as an ASGI app, to serve on loopback with uvicorn."""
        return _AsgiAdapter(self)

    # -- the routes ---------------------------------------------------------------------

    def _rollout(self, rollout_id: str) -> _Rollout:
        return self.rollouts.setdefault(rollout_id, _Rollout())

    def handle(self, request: httpx.Request) -> httpx.Response:
        """Answer one request (thread-safe)."""
        raw = request.url.raw_path.split(b"?")[0].decode("ascii")
        segments = tuple(unquote(part) for part in raw.strip("/").split("/"))
        body = _unpacked(loads(request.content)) if request.content else None
        headers = {name.lower(): value for name, value in request.headers.items()}
        if segments == ("health",):  # the probe of a loopback server: not a protocol call
            return _json(200, {"status": "ok"})
        if segments == ("capabilities",):  # negotiated features: not recorded either
            with self._lock:
                self.probes += 1
                if self.features is None:
                    return _error(404, "no route /capabilities")
                return _json(200, {"protocol": 1, "features": list(self.features)})
        with self._lock:
            self.requests.append(Seen(request.method, segments, body, headers, request.content))
            if self._canned:
                return self._canned.popleft()
            if len(segments) < 4 or segments[0] not in _PREFIX or segments[2] != _CAPTURE:
                return _error(404, f"no route {raw}")
            return self._route(request.method, segments[1], segments[3:], body)

    def _route(self, method: str, rid: str, rest: tuple[str, ...], body: Any) -> httpx.Response:
        routes = {
            ("POST", ("ledger", "records")): lambda: self._record(rid, body),
            ("POST", ("ledger", "failures")): lambda: self._failure(rid, body),
            ("GET", ("ledger", "has-rows")): lambda: _json(200, {"has_rows": self._has(rid)}),
            ("GET", ("ledger", "manifest")): lambda: self._manifest(rid),
            ("POST", ("lineage", "resolve")): lambda: self._resolve(rid, body),
            ("POST", ("staged", "fetch")): lambda: self._fetch(rid, body),
            ("POST", ("staged", "extras")): lambda: self._extras(rid, body),
        }
        route = routes.get((method, rest))
        if route is not None:
            return route()
        if method == "PUT" and len(rest) == 2 and rest[0] == "staged":
            return self._stage(rid, rest[1], body)
        if method == "GET" and len(rest) == 3 and rest[::2] == ("staged", "attachments"):
            return self._attachments(rid, rest[1])
        return _error(404, f"no route {method} {'/'.join(rest)}")

    def _has(self, rid: str) -> bool:
        return bool(self.rollouts.get(rid, _Rollout()).rows)

    def _refuse_frozen(self, rid: str) -> httpx.Response | None:
        if self._rollout(rid).frozen:
            return _error(409, f"rollout {rid} is frozen; no call may be added")
        return None

    def _record(self, rid: str, body: Any) -> httpx.Response:
        row = body.get("row") if isinstance(body, dict) else None
        if not isinstance(row, dict) or not isinstance(row.get("model_call_id"), str):
            return _error(422, "the body must be {'row': <ledger row>}")
        try:
            manifest_from_rows(rid, [row])
        except (StagingRecordError, TypeError, ValueError) as exc:
            return _error(422, f"invalid ledger row: {exc}")
        frozen = self._refuse_frozen(rid)
        if frozen is not None:
            return frozen
        rollout = self._rollout(rid)
        try:
            write = plan_commit(rollout.rows, row)
        except LedgerConflict as exc:
            return _error(409, str(exc))
        if write is LedgerWrite.REPLAY:
            return _json(200, {"recorded": False})
        rollout.rows.append(row)
        return _json(201, {"recorded": True})

    def _failure(self, rid: str, body: Any) -> httpx.Response:
        if not isinstance(body, dict):
            return _error(422, "the body must be an object")
        try:
            row = failure_row(body.get("model_call_id"), body.get("reason"))  # type: ignore[arg-type]
        except StagingRecordError as exc:
            return _error(422, str(exc))
        frozen = self._refuse_frozen(rid)
        if frozen is not None:
            return frozen
        rollout = self._rollout(rid)
        if plan_failure(rollout.rows, row) is LedgerWrite.REPLAY:
            return _json(200, {"recorded": False})
        rollout.rows.append(row)
        return _json(201, {"recorded": True})

    def _manifest(self, rid: str) -> httpx.Response:
        rows = self.rollouts.get(rid, _Rollout()).rows
        return _json(200, manifest_from_rows(rid, rows).to_json())

    def _resolve(self, rid: str, body: Any) -> httpx.Response:
        rows = self.rollouts.get(rid, _Rollout()).rows
        resolution = resolve_ledger(rows, body["fingerprint"], body["context_digests"])
        match = None if resolution.match is None else resolution.match.to_json()
        return _json(
            200, {"status": resolution.status, "reason": resolution.reason, "match": match}
        )

    def _ancestors(self, rollout: _Rollout, record: StagedCallRecord) -> list[StagedCallRecord]:
        chain: list[StagedCallRecord] = []
        parent = record.parent_call_id
        while parent is not None and parent in rollout.staged and len(chain) <= len(rollout.staged):
            staged = rollout.staged[parent][0]
            chain.append(staged)
            parent = staged.parent_call_id
        return chain[::-1]

    def _stage(self, rid: str, call_id: str, body: Any) -> httpx.Response:
        if not isinstance(body, dict) or set(body) != {"record", "attachments"}:
            return _error(422, "the body must be {'record', 'attachments'}", check="invalid_record")
        try:
            record = admit_staged_record(body["record"])
        except CustodyRefusal as refusal:
            return _error(422, str(refusal), check=refusal.check)
        if (record.rollout_id, record.model_call_id) != (rid, call_id):
            return _error(422, "the record is not the path's call", check="invalid_record")
        frozen = self._refuse_frozen(rid)
        if frozen is not None:
            return frozen
        rollout = self._rollout(rid)
        stored = rollout.staged.get(call_id)
        if stored is not None:
            if stored[1:] != (body["record"], body["attachments"]):
                return _error(409, f"call {call_id} is staged with a different record")
            return _json(200, {"ok": True, "staging_key": f"{rid}/{call_id}"})
        try:
            check_custody(record, self._ancestors(rollout, record))
        except CustodyRefusal as refusal:
            return _error(422, str(refusal), check=refusal.check)
        rollout.staged[call_id] = (record, body["record"], body["attachments"])
        return _json(200, {"ok": True, "staging_key": f"{rid}/{call_id}"})

    def _fetch(self, rid: str, body: Any) -> httpx.Response:
        staged = self.rollouts.get(rid, _Rollout()).staged
        snapshots = [
            staged[key][0].base_snapshot().to_json() if key in staged else None
            for key in body["keys"]
        ]
        return _json(200, {"snapshots": snapshots})

    def _extras(self, rid: str, body: Any) -> httpx.Response:
        staged = self.rollouts.get(rid, _Rollout()).staged
        extras = [staged[key][1].get("extras") if key in staged else None for key in body["keys"]]
        missing = [key for key in body["keys"] if key not in staged]
        return _json(200, {"extras": extras, "missing": missing})

    def _attachments(self, rid: str, call_id: str) -> httpx.Response:
        staged = self.rollouts.get(rid, _Rollout()).staged
        if call_id not in staged:
            return _error(404, f"call {call_id} of rollout {rid} is not staged")
        return _json(200, {"attachments": staged[call_id][2] or {}})


class _AsgiAdapter:
    """Serves a stand-in's `handle` as an ASGI app (no lifespan, HTTP only)."""

    def __init__(self, store: StagingStoreStandIn) -> None:
        self._store = store

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            message = await receive()
            while message["type"] != "lifespan.shutdown":
                await send({"type": f"{message['type']}.complete"})
                message = await receive()
            await send({"type": "lifespan.shutdown.complete"})
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        raw_path = scope.get("raw_path") or scope["path"].encode()
        request = httpx.Request(
            scope["method"],
            httpx.URL(f"http://stand-in{raw_path.decode('ascii')}"),
            headers=[(name, value) for name, value in scope["headers"]],
            content=b"".join(chunks),
        )
        response = self._store.handle(request)
        headers = [(name.encode(), value.encode()) for name, value in response.headers.items()]
        await send(
            {"type": "http.response.start", "status": response.status_code, "headers": headers}
        )
        await send({"type": "http.response.body", "body": response.content})
