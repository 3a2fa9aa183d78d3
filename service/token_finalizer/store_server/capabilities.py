"""The protocol extensions this store server speaks, advertised at `GET /capabilities`.

Clients use an extension only where it is advertised (docs/store-protocol.md#capabilities).
"""

from __future__ import annotations

from typing import Any

__all__ = ["PROTOCOL_VERSION", "STORE_FEATURES", "capabilities_body"]

PROTOCOL_VERSION = 1
# delta_put: a put may name its prompt's prefix by its parent (docs/store-protocol.md#delta-put).
STORE_FEATURES = ("delta_put",)


def capabilities_body() -> dict[str, Any]:
    """The answer of `GET /capabilities`."""
    return {"protocol": PROTOCOL_VERSION, "features": list(STORE_FEATURES)}
