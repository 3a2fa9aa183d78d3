"""GET /capabilities: which extensions of protocol v1 this store server speaks.

Protocol v1 (docs/store-protocol.md#protocol-v1) is what every store must
serve; each extension beyond it has a feature name, and a client uses an
extension only when the store advertises it here
(docs/store-protocol.md#extensions-and-capabilities). A store that predates
this route answers 404, which clients read as "no extension". The route is
open without a token, like /health: it says nothing about any rollout.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PROTOCOL_VERSION", "STORE_FEATURES", "capabilities_body"]

PROTOCOL_VERSION = 1

# Every extension this server serves, by its feature name (docs/store-protocol.md).
STORE_FEATURES: tuple[str, ...] = (
    "compact_resolve",  # POST .../lineage/resolve?tokens=compact
    "known_prefix",  # a resolve body's "known", answered with an offset
    "packed_freeze",  # POST .../freeze?columns=packed (staged snapshots' columns)
    "packed_stage",  # PUT .../staged/{id} with the token columns in "columns"
    "delta_put",  # a put naming its prompt's prefix by its parent (#delta-put)
    "staged_clear",  # POST .../staged/clear: delete named staged calls (docs/staging.md)
    "compact_freeze",  # POST .../freeze?entries=compact: entries as stored (#compact-freeze)
)


def capabilities_body() -> dict[str, Any]:
    """The answer of `GET /capabilities`: the protocol and the features, in a fixed order."""
    return {"protocol": PROTOCOL_VERSION, "features": list(STORE_FEATURES)}
