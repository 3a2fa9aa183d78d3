"""A remote capture store: protocol v1 (docs/store-protocol.md) served over any of our local stores.

    POST {base}/ng-rollout/{id}/training-token-capture/freeze          snapshot, 409 retired
    POST {base}/ng-rollout/{id}/training-token-capture/drop            {"dropped": bool}
    PUT  {base}/ng-rollout/{id}/training-token-capture/calls/{call}    200, 409, 422
    POST {base}/ng-rollout/{id}/training-token-capture/incomplete      200
    POST {base}/ng-rollout/{id}/training-token-capture/intents         200, 409
    POST {base}/ng-rollout/{id}/training-token-capture/lineage/resolve 200 resolution, 422
    GET  {base}/health                                                 {"status": "ok"}

`token-finalizer store serve --dir DIR` runs it over a file store; the
finalizer reaches it through an `http` source, model servers through
`token_finalizer_client.HttpTokenSink` (writes) and
`token_finalizer_client.HttpLineageResolver` (lineage/resolve, read-only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from token_finalizer.store_server.app import create_store_app

__all__ = ["create_store_app"]


def __getattr__(name: str) -> Any:
    # Imported on first use (PEP 562): the command line reads `roles` without
    # loading the web framework the app needs.
    if name == "create_store_app":
        from token_finalizer.store_server.app import create_store_app

        return create_store_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
