"""Retire tickets: proof, minted by a finalizer, of which snapshot a retire may drop.

The finalize answer's `retire` object names the rollout, the source and the
exact snapshot (`snapshot_id`, `version`) a clean build consumed, and carries
an HMAC-SHA256 over those four fields under `retire.key`. `/retire` drops a
snapshot only for a ticket it can verify, so a caller cannot retire a masked
build (evidence) by editing the answer it posts back. Every replica shares the
key, so any of them accepts any other's tickets. See docs/finalizer-api.md#post-retire.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from token_finalizer._constants import MAX_SNAPSHOT_VERSION
from token_finalizer.service.errors import InvalidRequest, TicketRejected

__all__ = ["RetireTicket", "TicketSigner", "warn_key_not_configured"]

logger = logging.getLogger(__name__)

# Bumped if the signed message ever changes, so old tickets stop verifying.
_DOMAIN = b"token-finalizer retire ticket v1\n"


@dataclass(frozen=True, slots=True)
class RetireTicket:
    """A verified permission to drop exactly one snapshot."""

    rollout_id: str
    source: str
    snapshot_id: str
    version: int


def _field(body: Mapping[str, Any], key: str, kind: type) -> Any:
    value = body.get(key)
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON has one number type: 7.0 is the integer 7
    if value is None:
        raise InvalidRequest(f"retire needs `{key}` (post the finalize answer's `retire` object)")
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        name = {str: "string", int: "integer"}.get(kind, kind.__name__)
        raise InvalidRequest(f"retire: `{key}` must be a JSON {name}, got {value!r}")
    return value


def warn_key_not_configured(whose: str) -> None:
    """Log that retire tickets are signed with a key `whose` ... will refuse (once per start)."""
    logger.warning(
        f"retire.key is not configured: retire tickets are signed with a key {whose} "
        "will refuse them, and so will this server once restarted; set retire.key to the "
        "same secret everywhere (a refused ticket is recovered by finalizing again)"
    )


class TicketSigner:
    """Mints and verifies tickets under one key."""

    def __init__(self, key: bytes) -> None:
        if not key:
            raise ValueError("the retire key is empty")
        self._key = key

    @classmethod
    def from_config(cls, key: str | None) -> TicketSigner:
        """The configured key, or a random one for this process (with a warning)."""
        if key:
            return cls(key.encode())
        warn_key_not_configured("of this process only, so another worker or replica")
        return cls(secrets.token_bytes(32))

    def _sign(self, rollout_id: str, source: str, snapshot_id: str, version: int) -> str:
        message = _DOMAIN + orjson.dumps([rollout_id, source, snapshot_id, version])
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def issue(self, rollout_id: str, source: str, snapshot_id: str, version: int) -> dict[str, Any]:
        """The answer's `retire` object for a retirable build."""
        return {
            "rollout_id": rollout_id,
            "source": source,
            "snapshot_id": snapshot_id,
            "version": version,
            "ticket": self._sign(rollout_id, source, snapshot_id, version),
        }

    @staticmethod
    def read_unverified(body: Mapping[str, Any]) -> RetireTicket:
        """The fields of a ticket, unchecked: only for callers that hold the store themselves."""
        version = _field(body, "version", int)
        if not 0 <= version <= MAX_SNAPSHOT_VERSION:
            raise InvalidRequest(f"retire: `version` {version} is not a snapshot version")
        return RetireTicket(
            rollout_id=_field(body, "rollout_id", str),
            source=_field(body, "source", str),
            snapshot_id=_field(body, "snapshot_id", str),
            version=version,
        )

    def verify(self, body: Mapping[str, Any]) -> RetireTicket:
        """The ticket in `body`; InvalidRequest when malformed, TicketRejected when forged."""
        ticket = self.read_unverified(body)
        presented = _field(body, "ticket", str)
        expected = self._sign(ticket.rollout_id, ticket.source, ticket.snapshot_id, ticket.version)
        if not hmac.compare_digest(presented.encode(), expected.encode()):
            raise TicketRejected(
                "retire ticket does not verify: it was not issued by a finalizer sharing this "
                "retire.key, or its fields were changed"
            )
        return ticket
