"""`HttpTokenSink`: the writer side of a remote capture store (protocol v1, docs/store-protocol.md).

A model server records each call's exact tokens while a rollout runs:

    sink = HttpTokenSink(url="http://capture-store:8100", token=...)
    await sink.begin_call("3-0", "call-1")       # optional; if never put, the capture is incomplete
    await sink.put(entry)                        # a dict or a pydantic model (model_dump)
    await sink.mark_incomplete("3-0", "call-2")  # that call failed to capture
    await sink.close()

The constructor takes keyword arguments only, so a NeMo Gym model server can
name this class as its `token_id_capture.sink` with `sink_kwargs`. Every call
is safe to repeat (a put of the same payload is a no-op), so connection
trouble and 502/503/504 are retried; any refusal raises, never passes silently.
Entries are encoded with orjson when it is installed (a 25,000-token put in
under a millisecond), each try's whole exchange is bounded by `timeout`, and
an answer that is too large or does not decode raises `InvalidAnswerError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from token_finalizer_client._addressing import (
    call_path,
    check_call_id,
    check_rollout_id,
    rollout_path,
)
from token_finalizer_client._store_connection import StoreConnection
from token_finalizer_client._wire import WireRequest, parse_answer

__all__ = ["HttpTokenSink"]


def _entry_payload(entry: object) -> dict[str, Any]:
    if isinstance(entry, Mapping):
        return dict(entry)
    dump = getattr(entry, "model_dump", None)
    if callable(dump):
        # Plain mode: JSON mode would turn a -inf log probability into null.
        payload = dump()
        if isinstance(payload, dict):
            return payload
    raise TypeError(f"entry must be a mapping or a pydantic model, got {type(entry).__name__}")


class HttpTokenSink(StoreConnection):
    """TokenSink that writes into a remote capture store over HTTP."""

    async def __aenter__(self) -> HttpTokenSink:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _send(self, method: str, path: str, payload: Any) -> Any:
        request = WireRequest.json(method, path, payload)
        return parse_answer(await self._call(request))

    async def put(self, entry: Mapping[str, Any] | Any) -> None:
        """Store one call's TokenEntry (a dict or a pydantic model).

        The same payload again is a no-op. Raises ConflictError for a different
        payload under the same call id or a put after freeze, BadRequestError
        for an entry the store refuses, APIConnectionError when it is unreachable.
        """
        payload = _entry_payload(entry)
        rollout_id = check_rollout_id(payload.get("rollout_id"))
        call_id = check_call_id(payload.get("model_call_id"))
        # The call id is percent-encoded into its path segment: engines name calls
        # with `/`, `:` or `%` (docs/store-protocol.md#paths).
        await self._send("PUT", call_path(rollout_id, call_id), payload)

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        """Record that a call of this rollout failed to capture ("" for the rollout as a whole)."""
        check_rollout_id(rollout_id)
        if model_call_id:
            check_call_id(model_call_id)
        payload = {"model_call_id": model_call_id}
        await self._send("POST", rollout_path(rollout_id, "incomplete"), payload)

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        """Announce a call: if its entry is missing at freeze time, the snapshot is incomplete."""
        check_rollout_id(rollout_id)
        check_call_id(model_call_id)
        payload = {"model_call_id": model_call_id}
        await self._send("POST", rollout_path(rollout_id, "intents"), payload)
