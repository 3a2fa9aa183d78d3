"""The API's documentation pages, served offline, and the bearer scheme in its OpenAPI document.

FastAPI's own /docs and /redoc pages load Swagger UI and ReDoc from a CDN, so
they stay blank on a machine without internet access. Here both pages load
their scripts, style sheet and icon from the app itself: the assets come
from the `fastapi-offline` distribution (Swagger UI 5, ReDoc 2, refreshed
with each of its releases) and are mounted under `ASSETS_PATH`; the pages
are FastAPI's own (`get_swagger_ui_html`, `get_redoc_html`) pointed at them.

When bearer tokens are configured, the OpenAPI document declares an HTTP
bearer security scheme and every operation that checks the token requires
it, so /docs offers "Authorize" and sends the token with its requests.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from starlette.responses import HTMLResponse
from starlette.routing import BaseRoute

from token_finalizer.api.deps import require_bearer_token

__all__ = [
    "ASSETS_PATH",
    "BEARER_SCHEME",
    "DOCS_PATH",
    "REDOC_PATH",
    "declare_bearer_auth",
    "install_offline_docs",
]

DOCS_PATH = "/docs"
REDOC_PATH = "/redoc"
ASSETS_PATH = "/docs-assets"
BEARER_SCHEME = "bearerAuth"

# The distribution that bundles the assets, and its folder that holds them.
_ASSETS_PACKAGE = ("fastapi_offline", "static")

# Swagger UI's default `validatorUrl` sends the document's URL to an online
# validator (swagger.io) and shows its badge: nothing leaves the machine here.
_SWAGGER_UI_PARAMETERS: dict[str, Any] = {"validatorUrl": None}


def _root(request: Request) -> str:
    """The path prefix the app is served under (uvicorn --root-path, a proxy), or ''."""
    root: str = request.scope.get("root_path", "")
    return root.rstrip("/")


def install_offline_docs(app: FastAPI) -> None:
    """Serve /docs (Swagger UI) and /redoc (ReDoc) with assets from this app only.

    The app must be created with `docs_url=None` and `redoc_url=None` (FastAPI's
    CDN pages); its `openapi_url` is what both pages read.
    """
    openapi_url = app.openapi_url or "/openapi.json"
    app.mount(ASSETS_PATH, StaticFiles(packages=[_ASSETS_PACKAGE]), name="docs-assets")

    @app.get(DOCS_PATH, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = _root(request)
        return get_swagger_ui_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_PATH}/favicon.png",
            swagger_ui_parameters=_SWAGGER_UI_PARAMETERS,
        )

    @app.get(REDOC_PATH, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = _root(request)
        return get_redoc_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{ASSETS_PATH}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS_PATH}/favicon.png",
            # Google Fonts would be another request off the machine.
            with_google_fonts=False,
        )


def _requires_bearer(route: APIRoute) -> bool:
    return any(dep.call is require_bearer_token for dep in route.dependant.dependencies)


def declare_bearer_auth(app: FastAPI, routes: Iterable[BaseRoute]) -> None:
    """Declare the HTTP bearer scheme in the app's OpenAPI document, on the routes that check it.

    `routes` are the app's API routes as declared (those of the router it
    includes, without a prefix); the ones that depend on `require_bearer_token`
    require the scheme. Call it only when bearer tokens are configured:
    without auth the document declares no security at all.
    """
    guarded = {
        (route.path, method.lower())
        for route in routes
        if isinstance(route, APIRoute) and _requires_bearer(route)
        for method in route.methods or ()
    }
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()  # FastAPI's document (it caches it in app.openapi_schema)
        schemes = schema.setdefault("components", {}).setdefault("securitySchemes", {})
        schemes[BEARER_SCHEME] = {
            "type": "http",
            "scheme": "bearer",
            "description": "One of the tokens configured in `auth.bearer_tokens`.",
        }
        for path, operations in schema.get("paths", {}).items():
            for method, operation in operations.items():
                if (path, method) in guarded:
                    operation["security"] = [{BEARER_SCHEME: []}]
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
