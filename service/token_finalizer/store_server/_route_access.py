"""The role a request needs, read off the route that will serve it.

The store's router is asked which route fully matches the request (the
first, as it will dispatch it), and that route's template is looked up in
`ROUTE_ROLES`. Matching the path a second way, with patterns of our own, let
`/freeze%0A` reach the freeze route while the role table found no role
(issue 29): one matcher leaves no gap between the two. A HEAD is served by a
GET route, so it needs that route's role.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.routing import BaseRoute, Match

from token_finalizer.store_server.roles import OPEN_ROUTES, ROUTE_ROLES, SELF_CHECKED_ROUTES
from token_finalizer.web.auth import AccessOf, Scope, Unguarded

__all__ = ["route_access"]


def route_access(routes: Sequence[BaseRoute]) -> AccessOf:
    """The role of each request by the first of `routes` that fully matches it.

    `routes` is the app's live route list: routes added after this call are
    found too.
    """

    def access_of(scope: Scope) -> str | Unguarded | None:
        for route in routes:
            match, _ = route.matches(scope)
            if match is not Match.FULL:
                continue
            method = "GET" if scope["method"] == "HEAD" else scope["method"]
            template = (method, getattr(route, "path", ""))
            if template in OPEN_ROUTES:
                return Unguarded.OPEN
            if template in SELF_CHECKED_ROUTES:
                return Unguarded.SELF_CHECKED
            role = ROUTE_ROLES.get(template)
            return None if role is None else str(role)
        return None

    return access_of
