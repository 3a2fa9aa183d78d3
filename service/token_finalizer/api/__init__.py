"""The finalizer HTTP service: `create_app(settings)` builds the ASGI app (docs/finalizer-api.md).

POST /finalize[?source=NAME]  record -> {rollout_id, source, record, build, retirable}
POST /retire                  {rollout_id, build, source?} -> {retired}
GET  /health, /ready, /metrics; OpenAPI at /docs
"""

from __future__ import annotations

from token_finalizer.api.app import app_from_environment, create_app

__all__ = ["app_from_environment", "create_app"]
