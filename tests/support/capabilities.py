"""Stores played by httpx.MockTransport handlers, with the capabilities they advertise.

A client asks `GET /capabilities` before it uses any extension of protocol v1
(docs/store-protocol.md#extensions-and-capabilities). `advertising(handler)`
answers that probe the way the store server does (every feature of
`STORE_FEATURES`, or the ones given; None: 404, a store that predates the
route) and passes every other request to `handler`, so a test's list of
requests holds the protocol calls only. `Advertised.probes` counts the probes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import httpx

from token_finalizer.store_server.capabilities import STORE_FEATURES

__all__ = ["Advertised", "advertising"]

Handler = Callable[[httpx.Request], httpx.Response]


@dataclass
class Advertised:
    """A handler behind a capabilities probe: what it advertises (changeable), how often asked."""

    handler: Handler
    features: list[str] | None
    probes: int = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path != "/capabilities":
            return self.handler(request)
        self.probes += 1
        if self.features is None:
            return httpx.Response(404, json={"error": "no such path: /capabilities"})
        return httpx.Response(200, json={"protocol": 1, "features": self.features})


def advertising(handler: Handler, features: Iterable[str] | None = STORE_FEATURES) -> Advertised:
    """`handler` behind a store's `GET /capabilities` advertising `features` (None: 404)."""
    return Advertised(handler, None if features is None else list(features))
