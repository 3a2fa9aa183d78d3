"""/docs and /redoc work offline, and the OpenAPI document declares bearer auth when it is on."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

import httpx
import pytest

from tests.service.api.conftest import SettingsFactory
from tests.support.asgi import in_process
from token_finalizer.api import create_app

_BEARER = {"bearerAuth": []}


class _References(HTMLParser):
    """Every URL an HTML page loads or links to: src and href attributes, ReDoc's spec-url."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [
            value for name, value in attrs if name in {"src", "href", "spec-url"} and value
        ]


def _references(html: str) -> list[str]:
    parser = _References()
    parser.feed(html)
    return parser.urls


def _operations(document: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (path, method): operation
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
    }


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_reference_only_same_origin_urls(client: httpx.Client, page: str) -> None:
    """The page names no other host: every URL it loads is a path on this server."""
    html = client.get(page).text
    urls = _references(html)
    assert urls and all(url.startswith("/") and not url.startswith("//") for url in urls)
    assert ("http://" in html, "https://" in html) == (False, False)


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_every_asset_a_docs_page_references_is_served(client: httpx.Client, page: str) -> None:
    """Each script, style sheet and icon the page references answers 200 with content."""
    urls = _references(client.get(page).text)
    answers = {url: client.get(url) for url in urls}
    assert {url: (a.status_code, len(a.content) > 0) for url, a in answers.items()} == {
        url: (200, True) for url in urls
    }


def test_swagger_ui_page_loads_the_document_and_the_bundle(client: httpx.Client) -> None:
    """/docs runs the served Swagger UI bundle on /openapi.json, without the online validator."""
    html = client.get("/docs").text
    bundle = next(url for url in _references(html) if url.endswith(".js"))
    script = client.get(bundle)
    assert ("url: '/openapi.json'" in html, '"validatorUrl": null' in html) == (True, True)
    assert (
        "javascript" in script.headers["content-type"],
        b"SwaggerUIBundle" in script.content,
    ) == (
        True,
        True,
    )


def test_docs_assets_are_not_in_the_openapi_document(client: httpx.Client) -> None:
    """The pages and their assets are no API operations."""
    paths = set(client.get("/openapi.json").json()["paths"])
    assert paths == {"/finalize", "/retire", "/health", "/ready", "/metrics"}


def test_openapi_declares_bearer_auth_when_tokens_are_configured(
    make_settings: SettingsFactory,
) -> None:
    """With auth.bearer_tokens, an HTTP bearer scheme is declared and /finalize, /retire need it."""
    app = create_app(make_settings(auth={"bearer_tokens": ["secret"]}))
    with in_process(app) as client:
        document = client.get("/openapi.json").json()
    schemes = document["components"]["securitySchemes"]
    secured = {key: op.get("security") for key, op in _operations(document).items()}
    assert {name: (s["type"], s["scheme"]) for name, s in schemes.items()} == {
        "bearerAuth": ("http", "bearer")
    }
    assert secured == {
        ("/finalize", "post"): [_BEARER],
        ("/retire", "post"): [_BEARER],
        ("/health", "get"): None,
        ("/ready", "get"): None,
        ("/metrics", "get"): None,
    }


def test_openapi_declares_no_security_without_auth(client: httpx.Client) -> None:
    """Without auth, the document has no security scheme and no operation requires one."""
    document = client.get("/openapi.json").json()
    secured = [key for key, op in _operations(document).items() if "security" in op]
    assert ("securitySchemes" in document.get("components", {}), secured) == (False, [])


def test_declared_security_is_exactly_what_refuses_a_request_without_token(
    make_settings: SettingsFactory,
) -> None:
    """With auth on, an operation answers 401 without a token exactly when it declares security."""
    app = create_app(make_settings(auth={"bearer_tokens": ["secret"]}))
    with in_process(app) as client:
        operations = _operations(client.get("/openapi.json").json())
        refused = {
            key: client.request(key[1].upper(), key[0], json={}).status_code == 401
            for key in operations
        }
    assert refused == {key: "security" in op for key, op in operations.items()}
