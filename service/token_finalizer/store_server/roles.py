"""Store credentials by role: which role each route needs, and which tokens hold which role.

A model server holds a **writer** token: it may write captures and resolve
lineage, never freeze or drop one; with external staging, append ledger rows
and stage calls. The finalizer holds a **finalizer** token: freeze and drop,
read manifests and staged calls. A training framework's control plane holds
a **control** token: NeMo Gym's read-only manifest route. A request whose
token has no role of the route is a 403 (docs/store-protocol.md#roles).
NeMo Gym's control route answers its own 401 in Gym's shape
(`SELF_CHECKED_ROUTES`), so Gym's client reads it unchanged.

`ROUTE_ROLES` is the one table: a route is added to the store server by
adding its line here, and `create_store_app` refuses to start if a route has
none, so no route is ever served without its role being decided. A request's
role is looked up by the route the router will serve it with
(`_route_access`), never by matching the path a second way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from token_finalizer_client.protocol import ROLLOUT_ROUTE

__all__ = [
    "ANY_TOKEN_ROUTES",
    "ATTACHMENTS_ROUTE",
    "CALL_ROUTE",
    "CLEAR_ROUTE",
    "CONTROL_MANIFEST_ROUTE",
    "OPEN_ROUTES",
    "ROUTE_ROLES",
    "SELF_CHECKED_ROUTES",
    "STAGE_ROUTE",
    "StoreRole",
    "StoreTokens",
    "unassigned_routes",
]


class StoreRole(StrEnum):
    WRITER = "writer"
    FINALIZER = "finalizer"
    CONTROL = "control"


# The model call id is the rest of the path, percent-decoded: it may hold `/`.
CALL_ROUTE = ROLLOUT_ROUTE + "/calls/{model_call_id:path}"
# External staging (docs/staging.md#protocol): a staged call, and its attachments.
STAGE_ROUTE = ROLLOUT_ROUTE + "/staged/{model_call_id:path}"
ATTACHMENTS_ROUTE = STAGE_ROUTE + "/attachments"
# The `staged_clear` extension: delete named staged calls (the trainer, after consuming them).
CLEAR_ROUTE = ROLLOUT_ROUTE + "/staged/clear"
# NeMo Gym 0.7's manifest route, outside the rollout prefix, exactly as Gym serves it.
CONTROL_MANIFEST_ROUTE = "/training-token-capture/control/rollouts/{rollout_id}/manifest"

# (method, route as mounted) -> the role it needs. One line per route.
ROUTE_ROLES: Mapping[tuple[str, str], StoreRole] = {
    ("PUT", CALL_ROUTE): StoreRole.WRITER,
    ("POST", ROLLOUT_ROUTE + "/intents"): StoreRole.WRITER,
    ("POST", ROLLOUT_ROUTE + "/incomplete"): StoreRole.WRITER,
    ("POST", ROLLOUT_ROUTE + "/lineage/resolve"): StoreRole.WRITER,
    ("POST", ROLLOUT_ROUTE + "/freeze"): StoreRole.FINALIZER,
    ("POST", ROLLOUT_ROUTE + "/drop"): StoreRole.FINALIZER,
    ("POST", ROLLOUT_ROUTE + "/ledger/records"): StoreRole.WRITER,
    ("POST", ROLLOUT_ROUTE + "/ledger/failures"): StoreRole.WRITER,
    ("GET", ROLLOUT_ROUTE + "/ledger/has-rows"): StoreRole.WRITER,
    ("GET", ROLLOUT_ROUTE + "/ledger/manifest"): StoreRole.FINALIZER,
    ("PUT", STAGE_ROUTE): StoreRole.WRITER,
    ("POST", ROLLOUT_ROUTE + "/staged/fetch"): StoreRole.FINALIZER,
    ("POST", ROLLOUT_ROUTE + "/staged/extras"): StoreRole.FINALIZER,
    ("GET", ATTACHMENTS_ROUTE): StoreRole.FINALIZER,
    ("POST", CLEAR_ROUTE): StoreRole.FINALIZER,
    ("GET", CONTROL_MANIFEST_ROUTE): StoreRole.CONTROL,
}

# Probes: load balancers and the finalizer's /ready carry no token; a client
# asks /capabilities before it has used its token for anything else.
OPEN_ROUTES = frozenset({("GET", "/health"), ("GET", "/capabilities")})
# Routes any configured token may read, whatever its roles: /metrics, so a
# scraper holds no token that can freeze or write (docs/store-protocol.md#metrics).
ANY_TOKEN_ROUTES = frozenset({("GET", "/metrics")})
# Routes that check the bearer token themselves, answering a refusal in the shape
# their caller expects: NeMo Gym's control route (401 {"detail": ...}). The
# shared guard lets them through; each accepts the tokens of its role.
SELF_CHECKED_ROUTES = frozenset({("GET", CONTROL_MANIFEST_ROUTE)})


def unassigned_routes(routes: Iterable[tuple[str, str]]) -> list[str]:
    """`METHOD path` of every (method, path) neither open, any token's, nor in ROUTE_ROLES."""
    return sorted(
        f"{method} {path}"
        for method, path in routes
        if method != "HEAD"
        and (method, path) not in ROUTE_ROLES
        and (method, path) not in OPEN_ROUTES
        and (method, path) not in ANY_TOKEN_ROUTES
    )


@dataclass(frozen=True, slots=True)
class StoreTokens:
    """The store server's bearer tokens: per role, and `shared` ones valid for every role.

    No token at all: no auth. A shared token is the single `--token` of
    earlier versions, kept working; each role's own tokens are the safe setup.
    """

    writer: tuple[str, ...] = ()
    finalizer: tuple[str, ...] = ()
    control: tuple[str, ...] = ()
    shared: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if any(not token for token in self.all_tokens()):
            raise ValueError("a store token is empty; leave it out instead")

    def all_tokens(self) -> tuple[str, ...]:
        return (*self.writer, *self.finalizer, *self.control, *self.shared)

    @property
    def enabled(self) -> bool:
        """Whether any token is configured (else every route is open)."""
        return bool(self.all_tokens())

    def by_role(self) -> dict[str, tuple[str, ...]]:
        """Role -> every token that holds it (its own, then the shared ones)."""
        own = {
            StoreRole.WRITER: self.writer,
            StoreRole.FINALIZER: self.finalizer,
            StoreRole.CONTROL: self.control,
        }
        return {str(role): (*tokens, *self.shared) for role, tokens in own.items()}

    def roles_without_token(self) -> list[str]:
        """Roles no token holds: their routes are refused to everyone (when auth is on)."""
        return [role for role, tokens in self.by_role().items() if not tokens]

    def tokens_in_several_roles(self) -> list[str]:
        """Roles sharing one of their own tokens with another role, as `writer+finalizer`."""
        holders: dict[str, list[str]] = {}
        for role, tokens in (
            (StoreRole.WRITER, self.writer),
            (StoreRole.FINALIZER, self.finalizer),
            (StoreRole.CONTROL, self.control),
        ):
            for token in set(tokens):
                holders.setdefault(token, []).append(str(role))
        return sorted({"+".join(roles) for roles in holders.values() if len(roles) > 1})
