"""`HttpStagingSource`: a trainer's read side of staged calls (NeMo Gym 0.7's `StagingSource`).

After a rollout the trainer reads its manifest, builds a receipt and
fetches the staged calls the manifest names, in manifest order, to verify
and linearize them with Gym's `verify_and_linearize` (or it lets the
finalizer do all of that in one call). This class fetches them from the
capture store (docs/staging.md#the-client):

    source = HttpStagingSource("http://capture-store:8100", token=FINALIZER_TOKEN)
    snapshots = source.fetch([record["staging_key"] for record in manifest["records"]])
    extras = source.fetch_extras("3-0/call-2")            # the call's extras, or None
    attachments = source.fetch_attachments("3-0/call-2")  # {name: bytes or JSON value}

- `fetch(keys)`: one base snapshot per key (metadata and token columns, no
  extras), in the caller's order; one `POST .../staged/fetch` per rollout.
  A key the store does not hold raises `KeyError(key)`. The snapshots are
  Gym's own `StagedCallBaseSnapshot` models whenever Gym's staging records
  can be imported (its verifier accepts no other class; building them runs
  Gym's own validation, digests included), else this package's frozen
  look-alike (`_staged_types`, token columns as tuples).
- `fetch_extras(key)`: the extras the call staged (an object, or None).
- `fetch_attachments(key)`: `{name: value}` exactly as staged: bytes stay
  bytes, JSON values stay JSON.

Keys are Gym's staging keys, `rollout_id/model_call_id`, as the staging
sink's store answers them. Everything is synchronous and thread-safe (one
shared pool, `_blocking_store`), retried by the one retry policy (reads
only) and bounded: a fetch answer may be up to `max_answer_bytes` once
decoded, since it carries a whole rollout's tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import httpx

from token_finalizer_client._addressing import (
    rollout_path,
    split_staging_key,
    staged_path,
    staging_keys_by_rollout,
)
from token_finalizer_client._attachments import decode_attachments
from token_finalizer_client._blocking_store import BlockingStoreConnection
from token_finalizer_client._constants import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_STAGED_FETCH_MAX_ANSWER_BYTES,
    DEFAULT_STORE_MAX_CONNECTIONS,
    DEFAULT_STORE_MAX_KEEPALIVE,
    DEFAULT_STORE_TIMEOUT_S,
)
from token_finalizer_client._exceptions import InvalidAnswerError, NotFoundError, shorten
from token_finalizer_client._gym_types import gym_staging_class
from token_finalizer_client._staged_types import snapshot_from_json
from token_finalizer_client._wire import WireRequest, read_object

__all__ = ["HttpStagingSource"]

_FETCH = "staged/fetch"
_EXTRAS = "staged/extras"
_ATTACHMENTS = "attachments"


def _listed(answer: dict[str, Any], name: str, count: int) -> list[Any]:
    values = answer.get(name)
    if not isinstance(values, list) or len(values) != count:
        raise InvalidAnswerError(f"the store answered no list of {count} {name}: {answer!r:.200}")
    return values


def _snapshot(data: object, key: str) -> Any:
    """One fetched snapshot as Gym's model when Gym can be imported, else as this package's."""
    gym = gym_staging_class("StagedCallBaseSnapshot", load=True)
    try:
        snapshot = snapshot_from_json(data) if gym is None else cast(Any, gym).model_validate(data)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise InvalidAnswerError(
            f"the store's snapshot of {key} is invalid: {shorten(str(exc))}"
        ) from None
    if f"{snapshot.rollout_id}/{snapshot.model_call_id}" != key:
        raise InvalidAnswerError(f"the store answered another call's snapshot for {key}")
    return snapshot


class HttpStagingSource(BlockingStoreConnection):
    """NeMo Gym 0.7 `StagingSource` over a remote capture store, plus extras and attachments."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_STORE_TIMEOUT_S,
        max_retries: int = DEFAULT_MAX_RETRIES,
        max_connections: int = DEFAULT_STORE_MAX_CONNECTIONS,
        max_keepalive: int = DEFAULT_STORE_MAX_KEEPALIVE,
        max_answer_bytes: int = DEFAULT_STAGED_FETCH_MAX_ANSWER_BYTES,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(
            url,
            token=token,
            timeout=timeout,
            max_retries=max_retries,
            max_connections=max_connections,
            max_keepalive=max_keepalive,
            max_answer_bytes=max_answer_bytes,
            transport=transport,
        )

    def __enter__(self) -> HttpStagingSource:
        return self

    def _post(self, rollout_id: str, operation: str, call_ids: list[str]) -> dict[str, Any]:
        path = rollout_path(rollout_id, operation)
        return read_object(self._call(WireRequest.json("POST", path, {"keys": call_ids})))

    def fetch(self, staging_keys: Sequence[str]) -> list[Any]:
        """One base snapshot per key, in order; KeyError(key) for a key the store does not hold."""
        fetched: dict[str, Any] = {}
        for rollout_id, call_ids in staging_keys_by_rollout(staging_keys).items():
            answer = self._post(rollout_id, _FETCH, call_ids)
            for call_id, data in zip(
                call_ids, _listed(answer, "snapshots", len(call_ids)), strict=True
            ):
                key = f"{rollout_id}/{call_id}"
                if data is None:
                    raise KeyError(key)
                fetched[key] = _snapshot(data, key)
        return [fetched[key] for key in staging_keys]

    def fetch_extras(self, staging_key: str) -> dict[str, Any] | None:
        """The extras the call staged (None when it staged none); KeyError when it is not staged."""
        rollout_id, call_id = split_staging_key(staging_key)
        answer = self._post(rollout_id, _EXTRAS, [call_id])
        missing = answer.get("missing", [])
        if not isinstance(missing, list):
            raise InvalidAnswerError(f"the extras answer's missing is not a list: {answer!r:.200}")
        if call_id in missing:
            raise KeyError(staging_key)
        (extras,) = _listed(answer, "extras", 1)
        if extras is not None and not isinstance(extras, dict):
            raise InvalidAnswerError(f"the extras of {staging_key} are not an object or null")
        return extras

    def fetch_attachments(self, staging_key: str) -> dict[str, Any]:
        """`{name: value}` exactly as staged (bytes stay bytes); KeyError when it is not staged."""
        rollout_id, call_id = split_staging_key(staging_key)
        request = WireRequest("GET", staged_path(rollout_id, call_id, _ATTACHMENTS))
        try:
            answer = read_object(self._call(request))
        except NotFoundError:
            raise KeyError(staging_key) from None
        return decode_attachments(answer.get("attachments"))
