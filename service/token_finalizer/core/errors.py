"""Exceptions raised by the core and the capture stores.

    CaptureError                    base of everything below
    ├── InvalidRolloutId            an id that is not a safe store key, or a malformed record id
    ├── TokenEntryError             a TokenEntry that fails validation (or a newer schema_version)
    │   └── TokenIdOutOfRange       a token id below 0 or of 2**64 or more (`invalid_token_ids`)
    ├── CaptureConflict             a different payload under an existing model_call_id
    ├── CaptureFrozen               a write after the rollout was frozen
    ├── CaptureRetired              a freeze or write after the snapshot was retired
    ├── CaptureCorrupt              a store whose files cannot be trusted any more
    ├── StoreFull                   a store out of disk space or quota: the call did not take effect
    │   └── StoreMemoryFull         a Redis store above its memory high-water mark (or at
    │                               `maxmemory`): a write that adds capture data was refused
    ├── EvictionPolicyRefused       a Redis whose `maxmemory-policy` may evict capture keys
    ├── ClusterModeRefused          a Redis Cluster node configured as one plain Redis
    └── SourceUnavailable           a remote store that cannot be reached or answers nonsense
        └── StoreUnreachable        no usable answer at all (refused, timed out, 502/503/504):
            │                       nothing changed in the store, so the call may be repeated
            └── StoreNodeUnreachable one server of the store (a Redis node) did not answer;
                                    `node` names it as `host:port`

The finalize path never lets these escape: they become masked records whose
`error` is ``"<ExceptionType>: <message>"``. Writers see them raised.
"""

from __future__ import annotations

__all__ = [
    "CaptureConflict",
    "CaptureCorrupt",
    "CaptureError",
    "CaptureFrozen",
    "CaptureRetired",
    "ClusterModeRefused",
    "EvictionPolicyRefused",
    "InvalidRolloutId",
    "SourceUnavailable",
    "StoreFull",
    "StoreMemoryFull",
    "StoreNodeUnreachable",
    "StoreUnreachable",
    "TokenEntryError",
    "TokenIdOutOfRange",
    "describe_exception",
]


def describe_exception(exc: BaseException) -> str:
    """`"<ExceptionType>: <message>"`, the form build errors take (the type alone if no message)."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class CaptureError(Exception):
    """Base class of every capture-store and core error."""


class InvalidRolloutId(CaptureError, ValueError):
    """A rollout or model call id that cannot be used as a store key."""


class TokenEntryError(CaptureError, ValueError):
    """A TokenEntry that does not satisfy the record contract."""


class TokenIdOutOfRange(TokenEntryError):
    """A token id outside [0, 2**64), the range NeMo Gym 0.7 accepts.

    Its own class so that a finalize reading such a capture masks the record
    as `invalid_token_ids`; the message starts with the words of the token
    digest's error (docs/records-and-builds.md#token-ids).
    """


class CaptureConflict(CaptureError):
    """A put whose payload differs from the one already stored for that call."""


class CaptureFrozen(CaptureError):
    """A write to a rollout whose capture is already frozen."""


class CaptureRetired(CaptureError):
    """A freeze or write for a rollout whose snapshot was already retired."""


class CaptureCorrupt(CaptureError):
    """Store files that were damaged by something other than a torn final write."""


class StoreFull(CaptureError):
    """A store that ran out of space (ENOSPC, EFBIG, EDQUOT): nothing of the call was kept."""


class StoreMemoryFull(StoreFull):
    """A write that adds capture data, refused because the store's memory is (nearly) full.

    `memory` is what the store reported: `used` and `max` bytes, `fraction`
    and the `high_water` mark (empty when Redis itself refused before a
    reading was taken). Freeze, drop and sweep still work: they free memory.
    See docs/capacity.md.
    """

    def __init__(self, message: str, memory: dict[str, object] | None = None) -> None:
        super().__init__(message)
        self.memory: dict[str, object] = dict(memory or {})

    @property
    def details(self) -> dict[str, object]:
        """What the store server's 507 carries beside the message."""
        return {"memory": self.memory} if self.memory else {}

    def __reduce__(self) -> tuple[type[StoreMemoryFull], tuple[str, dict[str, object]]]:
        return type(self), (str(self), self.memory)


class EvictionPolicyRefused(CaptureError):
    """A Redis that may evict capture keys (any `maxmemory-policy` but `noeviction`).

    Raised at start-up; the message names the policy, the node and the fix.
    """


class ClusterModeRefused(CaptureError):
    """A server configured as one Redis that is a Redis Cluster node (`cluster_enabled:1`).

    Raised at start-up: such a node serves its own slots only, and every other
    key would be a MOVED that callers retry as if the store were down.
    """


class SourceUnavailable(CaptureError):
    """A remote capture store that is unreachable or answered something unusable."""


class StoreUnreachable(SourceUnavailable):
    """No usable answer came back: the store was not reached, or said it cannot serve now."""


class StoreNodeUnreachable(StoreUnreachable):
    """One server of a store did not answer (a Redis server, or a primary of a cluster).

    `node` is its `host:port`, so health reports can name the node that is down.
    """

    def __init__(self, message: str, node: str) -> None:
        super().__init__(message)
        self.node = node

    def __reduce__(self) -> tuple[type[StoreNodeUnreachable], tuple[str, str]]:
        return type(self), (str(self), self.node)
