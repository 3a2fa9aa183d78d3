"""The paths of the remote capture store protocol, v1 (docs/store-protocol.md).

Model servers already correlate calls to a rollout by the path segment
`/ng-rollout/<rollout_id>/training-token-capture`; every protocol path keeps
it, so one id string means the same rollout everywhere.
"""

from __future__ import annotations

from token_finalizer.core.identity import check_store_id

__all__ = ["ROLLOUT_ROUTE", "ROLLOUT_SEGMENT", "rollout_path"]

ROLLOUT_SEGMENT = "ng-rollout"
CAPTURE_SEGMENT = "training-token-capture"
# The route template a server mounts the protocol's calls under.
ROLLOUT_ROUTE = f"/{ROLLOUT_SEGMENT}/{{rollout_id}}/{CAPTURE_SEGMENT}"


def rollout_path(rollout_id: str, operation: str) -> str:
    """`/ng-rollout/{id}/training-token-capture/{operation}`, the id checked first."""
    return f"/{ROLLOUT_SEGMENT}/{check_store_id(rollout_id)}/{CAPTURE_SEGMENT}/{operation}"
