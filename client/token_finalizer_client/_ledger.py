"""`HttpCaptureLedger`: NeMo Gym 0.7's capture ledger, kept in a remote capture store.

In external staging (`token_id_capture.external_staging: true`) each Gym
model server holds a `CaptureLedger`: one token-free row per committed call,
shared by every worker and replica. This class is that ledger over the
capture store's protocol (docs/staging.md#the-client), loadable as
`token_id_capture.lineage_store: token_finalizer_client:HttpCaptureLedger`
with `lineage_store_kwargs: {url: ..., token: ..., timeout: ...}`:

    ledger = HttpCaptureLedger("http://capture-store:8100", token=WRITER_TOKEN)
    resolution = await ledger.resolve("3-0", request_items)  # a parent, its chain
    await ledger.record(commit)                 # Gym's CaptureLedgerCommit, or a mapping
    await ledger.record_failure("3-0", "call-2", "worker_capture_failed")
    manifest = await ledger.manifest("3-0")     # {"rollout_id", "records", "failures"}
    await ledger.close()

- `record` computes the row here (`_ledger_row`: Gym's row, key for key)
  and posts it; the store answers once the row is durable and visible to
  every replica. The same row again is a no-op; any difference for the
  call id (or a frozen or retired rollout) raises `LedgerConflictError`, a
  `ValueError` as Gym's protocol asks.
- `record_failure` is idempotent per (call id, reason).
- `resolve` asks the store (which resolves over ledger rows or token
  entries, whichever the rollout holds). Unlike `HttpLineageResolver`, it
  raises when the store cannot answer: Gym then fails that model call
  closed in staging mode (no row is written, so a passing outage does not
  poison the rollout) and treats it as an unresolved lookup error in the
  built-in mode. It is a complete lineage resolver for the built-in path.
- `manifest` and `has_rows` read the rollout's rows; an id the store
  refuses raises a `ValueError`. Reading a manifest takes the finalizer
  role, which a model server's writer token does not have: given a
  `control_token`, `manifest` reads through the store's NeMo Gym control
  route (`GET /training-token-capture/control/rollouts/{id}/manifest`) with
  that token instead, so a model server holding a writer and a control
  token can serve Gym's own control route over this ledger.

Everything runs on the model server's event loop without blocking it (one
asyncio pool, opened on first use), through the package's one retry policy
(every call here is safe to repeat) and its bounds on time and answer size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from token_finalizer_client._addressing import (
    check_call_id,
    check_new_rollout_id,
    check_rollout_id,
    rollout_path,
)
from token_finalizer_client._constants import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_STORE_MAX_CONNECTIONS,
    DEFAULT_STORE_MAX_KEEPALIVE,
    DEFAULT_STORE_TIMEOUT_S,
)
from token_finalizer_client._exceptions import (
    APIStatusError,
    InvalidAnswerError,
    InvalidLedgerRequestError,
    LedgerConflictError,
)
from token_finalizer_client._ledger_row import committed_row
from token_finalizer_client._resolver import HttpLineageResolver, LineageResolution
from token_finalizer_client._wire import WireRequest, read_object

__all__ = ["HttpCaptureLedger"]

_RECORDS = "ledger/records"
_FAILURES = "ledger/failures"
_HAS_ROWS = "ledger/has-rows"
_MANIFEST = "ledger/manifest"
# NeMo Gym's control route, as the store server serves it (outside the rollout prefix).
_CONTROL_MANIFEST = "/training-token-capture/control/rollouts/{rollout_id}/manifest"


def _ledger_error(exc: APIStatusError) -> APIStatusError:
    """A ledger refusal as the ValueError Gym's protocol expects; any other error as it is."""
    if exc.status_code == 409:
        return LedgerConflictError(exc.status_code, exc.message, exc.body)
    if exc.status_code in (400, 422):
        return InvalidLedgerRequestError(exc.status_code, exc.message, exc.body)
    return exc


class HttpCaptureLedger(HttpLineageResolver):
    """NeMo Gym 0.7 `CaptureLedger` over a remote capture store (see the module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_STORE_TIMEOUT_S,
        control_token: str | None = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
        max_connections: int = DEFAULT_STORE_MAX_CONNECTIONS,
        max_keepalive: int = DEFAULT_STORE_MAX_KEEPALIVE,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if control_token is not None and (not isinstance(control_token, str) or not control_token):
            raise ValueError("control_token is empty; pass None to read manifests with `token`")
        # Sent with the manifest read only; never shown (the class's repr names no token).
        self._control = (
            None if control_token is None else {"Authorization": f"Bearer {control_token}"}
        )
        super().__init__(
            url=url,
            token=token,
            timeout=timeout,
            max_retries=max_retries,
            max_connections=max_connections,
            max_keepalive=max_keepalive,
            transport=transport,
        )

    async def __aenter__(self) -> HttpCaptureLedger:
        return self

    async def _send(self, request: WireRequest) -> dict[str, Any]:
        """The answer object of `request`; ledger refusals raised as ValueErrors."""
        try:
            return read_object(await self._call(request))
        except APIStatusError as exc:
            raised = _ledger_error(exc)
            if raised is exc:
                raise
            raise raised from None

    async def resolve(self, rollout_id: str, request_items: Sequence[Any]) -> LineageResolution:
        """Which committed call `request_items` continues: root, resolved or unresolved.

        Raises when the store cannot answer (unreachable after the retries, a
        refusal, an answer that is not a resolution: InvalidAnswerError, also for a
        staged match whose chain names another rollout's calls) or the items cannot be
        fingerprinted: Gym fails the call closed instead of poisoning the rollout.
        """
        return await self._lookup(rollout_id, request_items)

    async def record(self, commit: Any) -> None:
        """Store the ledger row of one committed call (Gym's `CaptureLedgerCommit`, or a mapping).

        Returns once the row is durable and visible to every replica; the
        identical row again is a no-op. LedgerConflictError (a ValueError)
        for a different row under the call id, a failure row stored first,
        or a frozen or retired rollout; ValueError for a commit that is not one.
        """
        committed = committed_row(commit)
        path = rollout_path(committed.rollout_id, _RECORDS)
        await self._send(WireRequest.json("POST", path, {"row": committed.row}))

    async def record_failure(self, rollout_id: str, model_call_id: str, reason: str) -> None:
        """Record that a call's capture did not complete: the rollout will not be trained on.

        Idempotent per (call id, reason); a new reason appends a row.
        LedgerConflictError once the rollout is frozen or retired.
        """
        check_new_rollout_id(rollout_id)
        check_call_id(model_call_id)
        if not isinstance(reason, str) or not reason:
            raise ValueError(f"reason must be a non-empty string, got {reason!r:.80}")
        body = {"model_call_id": model_call_id, "reason": reason}
        await self._send(WireRequest.json("POST", rollout_path(rollout_id, _FAILURES), body))

    async def manifest(self, rollout_id: str) -> dict[str, Any]:
        """The rollout's token-free ledger: `{"rollout_id", "records", "failures"}`.

        Each list keeps commit order; a rollout without rows has empty lists.
        ValueError for a rollout id the store refuses. With a `control_token`,
        read through the store's NeMo Gym control route with that token.
        """
        if self._control is None:
            request = WireRequest("GET", rollout_path(rollout_id, _MANIFEST))
        else:
            path = _CONTROL_MANIFEST.format(rollout_id=check_rollout_id(rollout_id))
            request = WireRequest("GET", path, headers=self._control)
        answer = await self._send(request)
        records, failures = answer.get("records"), answer.get("failures")
        if answer.get("rollout_id") != rollout_id or not isinstance(records, list):
            raise InvalidAnswerError(f"the manifest answer is not this rollout's: {answer!r:.200}")
        if not isinstance(failures, list):
            raise InvalidAnswerError(f"the manifest answer has no failures list: {answer!r:.200}")
        return answer

    async def has_rows(self, rollout_id: str) -> bool:
        """Whether the rollout has any ledger row, committed or failed."""
        answer = await self._send(WireRequest("GET", rollout_path(rollout_id, _HAS_ROWS)))
        has_rows = answer.get("has_rows")
        if not isinstance(has_rows, bool):
            raise InvalidAnswerError(
                f"the has-rows answer is not {{'has_rows': bool}}: {answer!r:.200}"
            )
        return has_rows
