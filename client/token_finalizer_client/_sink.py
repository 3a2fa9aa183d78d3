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
    check_new_rollout_id,
    rollout_path,
)
from token_finalizer_client._exceptions import BadRequestError
from token_finalizer_client._sent_ids import SentIds
from token_finalizer_client._store_connection import StoreConnection
from token_finalizer_client._token_digest import token_digest
from token_finalizer_client._wire import WireRequest, parse_answer

__all__ = ["HttpTokenSink"]

DELTA_PUT = "delta_put"  # the store feature (docs/store-protocol.md#capabilities)


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


def _ids(value: object) -> tuple[int, ...] | None:
    """A token field as a tuple of ints, or None when it is not plainly one."""
    if isinstance(value, list | tuple) and all(type(item) is int for item in value):
        return tuple(value)
    tolist = getattr(value, "tolist", None)  # a numpy array
    if callable(tolist):
        listed = tolist()
        if isinstance(listed, list) and all(type(item) is int for item in listed):
            return tuple(listed)
    return None


class HttpTokenSink(StoreConnection):
    """TokenSink that writes into a remote capture store over HTTP.

    A full-prompt entry whose parent this sink put itself goes as that parent's
    prefix + the suffix where the store advertises `delta_put`
    (docs/store-protocol.md#delta-put); the store stores the full entry.
    """

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._sent = SentIds()

    def _cumulative(self, rollout_id: str, payload: dict[str, Any]) -> tuple[int, ...] | None:
        """The entry's cumulative ids (a delta record: after its parent's), or None."""
        prompt = _ids(payload.get("prompt_token_ids", []))
        generation = _ids(payload.get("generation_token_ids", []))
        if prompt is None or generation is None:
            return None
        if payload.get("prompt_is_delta") is True:
            parent = payload.get("parent_call_id")
            before = self._sent.get(rollout_id, parent) if isinstance(parent, str) else None
            return None if before is None else before + prompt + generation
        return prompt + generation

    def _delta_body(self, rollout_id: str, payload: dict[str, Any]) -> dict[str, Any] | None:
        """The put body naming the prompt's prefix by its parent, or None (send it whole)."""
        parent = payload.get("parent_call_id")
        if (
            not isinstance(parent, str)
            or payload.get("parent_resolution") != "resolved"
            or payload.get("prompt_is_delta") is True
        ):
            return None
        known = self._sent.get(rollout_id, parent)
        prompt = _ids(payload.get("prompt_token_ids"))
        if known is None or prompt is None or len(prompt) < len(known):
            return None
        if prompt[: len(known)] != known:
            return None
        body = {key: value for key, value in payload.items() if key != "prompt_token_ids"}
        body["prompt_ref"] = {
            "parent": parent,
            "length": len(known),
            "digest": token_digest(known),
        }
        body["prompt_suffix"] = list(prompt[len(known) :])
        return body

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
        rollout_id = check_new_rollout_id(payload.get("rollout_id"))
        call_id = check_call_id(payload.get("model_call_id"))
        # The call id is percent-encoded into its path segment: engines name calls
        # with `/`, `:` or `%` (docs/store-protocol.md#paths).
        path = call_path(rollout_id, call_id)
        cumulative = self._cumulative(rollout_id, payload)
        delta = self._delta_body(rollout_id, payload)
        if delta is not None and await self._supports(DELTA_PUT):
            try:
                await self._send("PUT", path, delta)
            except BadRequestError:
                # 422: the store does not hold the parent as this sink sent it (or no
                # longer speaks the extension): the full entry, once.
                self._forget_capabilities()
                await self._send("PUT", path, payload)
        else:
            await self._send("PUT", path, payload)
        if cumulative is not None:
            self._sent.keep(rollout_id, call_id, cumulative)

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        """Record that a call of this rollout failed to capture ("" for the rollout as a whole)."""
        check_new_rollout_id(rollout_id)
        if model_call_id:
            check_call_id(model_call_id)
        payload = {"model_call_id": model_call_id}
        await self._send("POST", rollout_path(rollout_id, "incomplete"), payload)

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        """Announce a call: if its entry is missing at freeze time, the snapshot is incomplete."""
        check_new_rollout_id(rollout_id)
        check_call_id(model_call_id)
        payload = {"model_call_id": model_call_id}
        await self._send("POST", rollout_path(rollout_id, "intents"), payload)
