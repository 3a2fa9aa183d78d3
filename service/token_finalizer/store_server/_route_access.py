"""The role a request needs, read off the route that will serve it.

The store's router is asked which route fully matches the request (the
first, as it will dispatch it), and that route's template is looked up in
`ROUTE_ROLES`. Matching the path a second way, with patterns of our own, let
`/freeze%0A` reach the freeze route while the role table found no role
(issue 29): one matcher leaves no gap between the two. A HEAD is served by a
GET route, so it needs that route's role. The store's metrics label each
request by the same template (`route_template`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from starlette.routing import BaseRoute, Match

from token_finalizer.store_server.roles import (
    ANY_TOKEN_ROUTES,
    OPEN_ROUTES,
    ROUTE_ROLES,
    SELF_CHECKED_ROUTES,
)
from token_finalizer.web.auth import ANY_ROLE, AccessOf, AnyRole, Scope, Unguarded

__all__ = ["RouteOf", "route_access", "route_template"]

# A request's scope -> (method, route template) of the route that will serve it, or None.
RouteOf = Callable[[Scope], "tuple[str, str] | None"]
_TEMPLATE_KEY = "token_finalizer_route"


def route_template(routes: Sequence[BaseRoute]) -> RouteOf:
    """(method, template) of the first of `routes` that fully matches a request; None if none.

    `routes` is the app's live route list: routes added after this call are
    found too.
    """

    def template_of(scope: Scope) -> tuple[str, str] | None:
        # The metrics and the guard both ask for every request: the routes are scanned
        # once, and the answer kept in the request's state.
        state = scope.setdefault("state", {})
        if _TEMPLATE_KEY in state:
            return state[_TEMPLATE_KEY]  # type: ignore[no-any-return]
        found = None
        for route in routes:
            match, _ = route.matches(scope)
            if match is Match.FULL:
                method = "GET" if scope["method"] == "HEAD" else scope["method"]
                found = method, getattr(route, "path", "")
                break
        state[_TEMPLATE_KEY] = found
        return found

    return template_of


def route_access(routes: Sequence[BaseRoute]) -> AccessOf:
    """The role of each request by the first of `routes` that fully matches it."""
    template_of = route_template(routes)

    def access_of(scope: Scope) -> str | AnyRole | Unguarded | None:
        template = template_of(scope)
        if template is None:
            return None
        if template in OPEN_ROUTES:
            return Unguarded.OPEN
        if template in SELF_CHECKED_ROUTES:
            return Unguarded.SELF_CHECKED
        if template in ANY_TOKEN_ROUTES:
            return ANY_ROLE
        role = ROUTE_ROLES.get(template)
        return None if role is None else str(role)

    return access_of
