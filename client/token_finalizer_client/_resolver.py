"""`HttpLineageResolver`: request-time lineage from a remote capture store (protocol v1).

A NeMo Gym 0.7 model server asks, before it dispatches a call, which committed
call of the rollout the request continues (its `LineageResolver` protocol):

    resolver = HttpLineageResolver(url="http://capture-store:8100", token=...)
    resolution = await resolver.resolve("3-0", request_items)
    if resolution.status == "resolved":
        parent = resolution.match   # model_call_id, cumulative_token_ids, digest, prev_len
    await resolver.close()

The items are hashed here (`protocol`'s fingerprints, the ones the service uses) and
only the hashes travel: `POST .../lineage/resolve` with the assistant
fingerprint and the digest of every prefix of the items. The store compares
strings over the rollout's committed entries and answers the match with its
full cumulative token ids: as one base64 string of little-endian integers
(`?tokens=compact`, `_cumulative`), only the ids after the rollout's last
match (`known`), or as the plain list of protocol v1, by what the store
advertises (`_capabilities`; a store that refuses an extension is asked
again, and the resolve sent again in what it now advertises). A
rollout staged externally (NeMo Gym's external staging) resolves over its
capture-ledger rows instead: the match carries no ids, but the parent's
`cum_len` as `prev_len`, its `staging_chain` and `chain_hash`
(docs/staging.md#the-client). A request without model-authored items is a
root and sends nothing.

`resolve` never raises: an unreachable store, a timeout, a refusal, an answer
that is not a resolution (or too large, or a body that does not decode),
items that cannot be fingerprinted or a bad rollout id all answer
`unresolved` with reason `lookup_error` (and a warning in the log), which a
0.7 writer records as an unresolved boundary. Requests go through the same
request building, retry policy (connection trouble and 502/503/504; a resolve
is read-only), bounds (each try's whole exchange within `timeout`, the
answer within `DEFAULT_STORE_MAX_ANSWER_BYTES`) and error mapping as
`HttpTokenSink`. A store's reason is kept to `MAX_REASON_CHARS`.

`status` is a `StrEnum` equal to the strings "root", "resolved" and
"unresolved". When NeMo Gym's `nemo_gym.token_id_capture.records` is loaded in
the process (a 0.7 model server), it is Gym's own `ParentResolutionStatus`
member, so the entries Gym stamps with it serialize without pydantic warnings;
otherwise it is this package's `ResolutionStatus`. Gym is never imported here.
"""

from __future__ import annotations

import enum
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from token_finalizer_client._addressing import check_rollout_id, rollout_path
from token_finalizer_client._capabilities import (
    COMPACT_RESOLVE,
    KNOWN_PREFIX,
    REFUSED_EXTENSION_STATUSES,
)
from token_finalizer_client._constants import COMPACT_TOKENS, LOGGER_NAME, MAX_REASON_CHARS
from token_finalizer_client._cumulative import cumulative_token_ids
from token_finalizer_client._exceptions import InvalidAnswerError, shorten
from token_finalizer_client._exchange import Reply
from token_finalizer_client._fingerprint import (
    FINGERPRINT_VERSION,
    HEX_DIGEST,
    assistant_fingerprint,
    context_digests,
)
from token_finalizer_client._known_ids import KnownIds, KnownIdsCache
from token_finalizer_client._store_connection import StoreConnection
from token_finalizer_client._url_credentials import masked
from token_finalizer_client._wire import WireRequest, read_object

__all__ = [
    "LOOKUP_ERROR",
    "HttpLineageResolver",
    "LineageMatch",
    "LineageResolution",
    "ResolutionStatus",
]

logger = logging.getLogger(LOGGER_NAME)

# The reason of every resolution this client could not obtain from the store.
LOOKUP_ERROR = "lookup_error"
_RESOLVE_OPERATION = "lineage/resolve"
# Asked of a store advertising compact_resolve: the match's ids as one base64
# string (see `_cumulative`).
_COMPACT_PARAMS = dict([COMPACT_TOKENS])
# Where NeMo Gym 0.7 defines ParentResolutionStatus (looked up, never imported).
_GYM_RECORDS_MODULE = "nemo_gym.token_id_capture.records"


class ResolutionStatus(enum.StrEnum):
    """Whether a request continues a committed call: equal to the strings it names."""

    ROOT = "root"
    RESOLVED = "resolved"
    UNRESOLVED = "unresolved"


@dataclass(frozen=True, slots=True)
class LineageMatch:
    """The committed call a request continues.

    Over token entries: its full `cumulative_token_ids`, and `prev_len` is
    their length; `staging_chain` and `chain_hash` are empty. Over a capture
    ledger (NeMo Gym's external staging, docs/staging.md#the-client): no ids
    (they stay with the staged calls), `prev_len` is the call's `cum_len`,
    `staging_chain` the staging keys of its ancestors and itself (root
    first), `chain_hash` the hash its child chains onto, and `digest` its
    cumulative hash.
    """

    model_call_id: str
    cumulative_token_ids: tuple[int, ...]
    digest: str
    prev_len: int
    staging_chain: tuple[str, ...] = ()
    chain_hash: str = ""


@dataclass(frozen=True, slots=True)
class LineageResolution:
    """One request-time parent decision: a match exactly when `status` is resolved."""

    status: enum.StrEnum
    match: LineageMatch | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if (self.status == ResolutionStatus.RESOLVED) != (self.match is not None):
            needs = "needs" if self.match is None else "cannot carry"
            raise ValueError(f"a {self.status} resolution {needs} a match")


def _status(name: str) -> enum.StrEnum:
    """The status named `name`: Gym's own enum member when Gym is loaded, else ours."""
    gym = sys.modules.get(_GYM_RECORDS_MODULE)
    gym_status = getattr(gym, "ParentResolutionStatus", None)
    if isinstance(gym_status, type) and issubclass(gym_status, enum.StrEnum):
        try:
            return gym_status(name)
        except ValueError:
            pass
    return ResolutionStatus(name)


def _unresolved(reason: str) -> LineageResolution:
    return LineageResolution(_status(ResolutionStatus.UNRESOLVED.value), None, reason)


def _check_chain(chain: list[str], rollout_id: str, call_id: str) -> None:
    """A staged match's chain is the rollout's own and ends at the match (docs/staging.md)."""
    own = f"{rollout_id}/"
    if not all(key.startswith(own) for key in chain) or chain[-1] != f"{own}{call_id}":
        raise InvalidAnswerError(
            f"the match's staging_chain {chain!r:.200} is not rollout {rollout_id!r:.100}'s "
            f"own ending at its call {call_id!r:.100}"
        )


def _match(value: object, known: tuple[int, ...], rollout_id: str) -> LineageMatch:
    if not isinstance(value, dict):
        raise InvalidAnswerError(f"a resolved answer's match is not an object: {value!r:.200}")
    call_id, digest = value.get("model_call_id"), value.get("digest")
    prev_len = value.get("prev_len")
    if not isinstance(call_id, str) or not call_id:
        raise InvalidAnswerError(f"the match names no model_call_id: {call_id!r:.200}")
    if not isinstance(digest, str):
        raise InvalidAnswerError(f"the match's digest is not a string: {digest!r:.200}")
    if type(prev_len) is not int:
        raise InvalidAnswerError(f"the match's prev_len is not a length: {prev_len!r:.200}")
    token_ids = cumulative_token_ids(value, known)
    chain, chain_hash = value.get("staging_chain") or [], value.get("chain_hash") or ""
    if not chain and not chain_hash:  # a match over token entries
        if prev_len != len(token_ids):
            raise InvalidAnswerError(
                f"prev_len {prev_len} is not the match's {len(token_ids)} token ids"
            )
        return LineageMatch(call_id, token_ids, digest, prev_len)
    # A match over ledger rows: the chain names where the prefix is staged.
    if not isinstance(chain, list) or not all(isinstance(key, str) and key for key in chain):
        raise InvalidAnswerError(f"the match's staging_chain is not a list of keys: {chain!r:.200}")
    if not chain or not isinstance(chain_hash, str) or not HEX_DIGEST.fullmatch(chain_hash):
        raise InvalidAnswerError(
            "a staged match needs a staging_chain and a chain_hash of 64 lowercase hex "
            f"characters, got {chain!r:.100} and {chain_hash!r:.100}"
        )
    if token_ids or prev_len < 1:
        raise InvalidAnswerError(
            f"a staged match carries no token ids and a prev_len >= 1, got {len(token_ids)} "
            f"ids and prev_len {prev_len}"
        )
    _check_chain(chain, rollout_id, call_id)
    return LineageMatch(call_id, (), digest, prev_len, tuple(chain), chain_hash)


def _read_resolution(
    body: dict[str, Any], rollout_id: str, known: tuple[int, ...] = ()
) -> LineageResolution:
    """`rollout_id`'s resolve answer as a LineageResolution; InvalidAnswerError when it is not one.

    `known`: the ids of the known prefix the request named (`_known_ids`).
    A staged match must name only the rollout's own staged calls.
    """
    status, reason, match = body.get("status"), body.get("reason", ""), body.get("match")
    if status not in tuple(ResolutionStatus):
        raise InvalidAnswerError(f"the resolve answer's status is {status!r:.200}")
    if not isinstance(reason, str):
        raise InvalidAnswerError(f"the resolve answer's reason is not a string: {reason!r:.200}")
    reason = shorten(reason, MAX_REASON_CHARS)
    if status == ResolutionStatus.RESOLVED:
        return LineageResolution(_status(str(status)), _match(match, known, rollout_id), reason)
    if match is not None:
        raise InvalidAnswerError(f"a {status} answer carries a match")
    return LineageResolution(_status(str(status)), None, reason)


@dataclass(frozen=True, slots=True)
class _Extensions:
    """What one resolve request uses beyond protocol v1."""

    compact: bool = False
    known: KnownIds | None = None  # sent only with compact (an offset needs the compact form)


_PLAIN_V1 = _Extensions()


class HttpLineageResolver(StoreConnection):
    """NeMo Gym 0.7 `LineageResolver` over a remote capture store (read-only)."""

    _known: KnownIdsCache | None = None  # made on first use (`_known_ids`)

    def _known_ids(self) -> KnownIdsCache:
        if self._known is None:
            self._known = KnownIdsCache()
        return self._known

    async def __aenter__(self) -> HttpLineageResolver:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _extensions(self, known: KnownIds | None) -> _Extensions:
        """The extensions a resolve may use on this store, naming `known` when it may."""
        if not await self._supports(COMPACT_RESOLVE):
            return _PLAIN_V1
        if known is None or not await self._supports(KNOWN_PREFIX):
            return _Extensions(compact=True)
        return _Extensions(compact=True, known=known)

    async def _send_resolve(
        self, rollout_id: str, payload: dict[str, Any], used: _Extensions
    ) -> Reply:
        if used.known is not None:
            payload = {**payload, "known": used.known.to_wire()}
        params = _COMPACT_PARAMS if used.compact else None
        path = rollout_path(rollout_id, _RESOLVE_OPERATION)
        return await self._call(WireRequest.json("POST", path, payload, params=params))

    async def _ask(
        self, rollout_id: str, fingerprint: str, digests: list[str], known: KnownIds | None
    ) -> tuple[dict[str, Any], KnownIds | None]:
        """The store's answer, and the known prefix the request named (None: none)."""
        payload: dict[str, Any] = {
            "fingerprint_version": FINGERPRINT_VERSION,
            "fingerprint": fingerprint,
            "context_digests": digests,
        }
        check_rollout_id(rollout_id)  # before anything is sent, the store's features included
        used = await self._extensions(known)
        reply = await self._send_resolve(rollout_id, payload, used)
        if used != _PLAIN_V1 and reply.status_code in REFUSED_EXTENSION_STATUSES:
            # Perhaps no longer the store that advertised them: ask it again, and
            # resolve once more if it now advertises less (a resolve is read-only).
            self._forget_capabilities()
            again = await self._extensions(known)
            if again != used:
                used = again
                reply = await self._send_resolve(rollout_id, payload, used)
        return read_object(reply), used.known

    async def _lookup(self, rollout_id: str, request_items: Sequence[Any]) -> LineageResolution:
        """The store's resolution of `request_items`; raises whatever keeps it from answering."""
        fingerprint = assistant_fingerprint(request_items)
        if not fingerprint:
            return LineageResolution(_status(ResolutionStatus.ROOT.value))
        digests = context_digests(request_items)
        cache = self._known_ids()
        known = cache.get(rollout_id)
        answer, named = await self._ask(rollout_id, fingerprint, digests, known)
        resolution = _read_resolution(answer, rollout_id, () if named is None else named.ids)
        match = resolution.match
        if match is not None:
            cache.keep(rollout_id, match.digest, match.cumulative_token_ids)
        return resolution

    async def resolve(self, rollout_id: str, request_items: Sequence[Any]) -> LineageResolution:
        """Which committed call `request_items` continues: root, resolved or unresolved.

        Never raises; any failure is `unresolved` with reason `lookup_error`.
        """
        try:
            return await self._lookup(rollout_id, request_items)
        except Exception as exc:  # a resolver answers; it never fails the model call
            logger.warning(
                "lineage lookup of rollout %r at %s failed (%s: %s); answering unresolved",
                rollout_id,
                self.url,
                type(exc).__name__,
                masked(str(exc)),  # a transport message may repeat a URL's user info
            )
            return _unresolved(LOOKUP_ERROR)

    def is_process_shared(self) -> bool:
        """True: every model-server worker reads the same store."""
        return True

    async def close(self) -> None:
        """Close the connection pool; safe to call twice. Resolving after it is a lookup_error."""
        await super().close()
