"""The service layer of POST /retire: validate the body, resolve the source, drop.

The body may be a whole finalize answer posted back: only `rollout_id`,
`build` and the optional `source` are read.
"""

from __future__ import annotations

from typing import Any

from token_finalizer.core.delivery import capture_build_can_retire, retire_rollout_token_capture
from token_finalizer.core.errors import InvalidRolloutId
from token_finalizer.core.identity import check_store_id
from token_finalizer.service.errors import InvalidRequest
from token_finalizer.service.state import ServiceState

__all__ = ["retire"]


def _rollout_id(body: dict[str, Any]) -> str:
    if body.get("rollout_id") is None:
        raise InvalidRequest("retire body needs `rollout_id` (the id finalize answered)")
    try:
        return check_store_id(body["rollout_id"])
    except InvalidRolloutId as exc:
        raise InvalidRequest(f"retire body: {exc}") from None


def _build(body: dict[str, Any]) -> dict[str, Any] | None:
    if "build" not in body:
        raise InvalidRequest("retire body needs `build` (the build finalize answered)")
    build = body["build"]
    if build is not None and not isinstance(build, dict):
        raise InvalidRequest("retire body: `build` must be a JSON object or null")
    return build


def _source_name(body: dict[str, Any]) -> str | None:
    name = body.get("source")
    if name is not None and not isinstance(name, str):
        raise InvalidRequest("retire body: `source` must be a string naming a configured source")
    return name


async def retire(
    state: ServiceState, body: dict[str, Any], *, log: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Retire the snapshot a build consumed: `{"retired": bool}`; InvalidRequest / UnknownSource.

    `log` receives the request-log fields (rollout id, source, outcome) as they become known.
    """
    log = {} if log is None else log
    rollout_id = _rollout_id(body)
    log["rollout_id"] = rollout_id
    build = _build(body)
    source = state.sources.resolve(_source_name(body))
    log["source"] = source.name
    if not capture_build_can_retire(build):
        outcome = "not_retirable"
        retired = False
    else:
        retired = await retire_rollout_token_capture(rollout_id, source, build)
        outcome = "retired" if retired else "not_retired"
    state.metrics.retire.labels(source.name, outcome).inc()
    log["outcome"] = outcome
    return {"retired": retired}
