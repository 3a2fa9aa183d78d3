"""GET /capabilities of the store server: the extensions it serves, open without a token."""

from __future__ import annotations

import httpx

from tests.support.asgi import in_process
from token_finalizer import MemoryTokenStore
from token_finalizer.store_server import create_store_app
from token_finalizer.store_server.capabilities import STORE_FEATURES
from token_finalizer.store_server.roles import StoreTokens
from token_finalizer_client import transport


def _get(app: object, **headers: str) -> httpx.Response:
    with in_process(app) as client:
        return client.get("/capabilities", headers=headers)


def test_the_answer_is_protocol_1_with_every_feature() -> None:
    """`{"protocol": 1, "features": STORE_FEATURES}`, in that order."""
    answer = _get(create_store_app(MemoryTokenStore()))
    assert (answer.status_code, answer.json()) == (
        200,
        {"protocol": 1, "features": list(STORE_FEATURES)},
    )


def test_it_is_open_when_tokens_are_configured() -> None:
    """With role tokens, /capabilities still answers a request without any token."""
    app = create_store_app(MemoryTokenStore(), tokens=StoreTokens(writer=("w",), finalizer=("f",)))
    assert _get(app).status_code == 200


def test_every_feature_our_clients_use_is_advertised() -> None:
    """The client's feature names are all in STORE_FEATURES, so our own store gets them all."""
    used = {
        transport.COMPACT_RESOLVE,
        transport.KNOWN_PREFIX,
        transport.PACKED_FREEZE,
        transport.PACKED_STAGE,
    }
    assert used <= set(STORE_FEATURES)
