"""Which extensions of protocol v1 a capture store speaks, asked once and kept.

Protocol v1 is what every store serves (docs/store-protocol.md#protocol-v1);
each extension beyond it has a feature name, and a store advertises the
ones it serves at `GET /capabilities` (`{"protocol": 1, "features": [...]}`).
A client uses an extension only when its store advertises it, and otherwise
speaks plain v1 (docs/store-protocol.md#extensions-and-capabilities):

- one `StoreCapabilities` per connection: the first caller asks the store
  and every caller after it reads the answer; callers that ask while the
  probe is under way wait for that one probe (threads and coroutines alike);
- a store without the route (404, 405: it predates it) has no extension;
- a probe that gets no usable answer (the store unreachable, a 5xx) counts
  as "no extension" for that call only and is asked again by the next one;
- `forget()` after a store refused a request that used an extension
  (`REFUSED_EXTENSION_STATUSES`): the next call asks again, so a store that
  was replaced by an older one is spoken to in v1;
- an answer is kept `CAPABILITIES_TTL_S`, then asked again on next use, so
  a store upgraded in place starts being used.

The asyncio clients, the blocking staging clients and the service's `http`
source each pass their own way of sending the probe; the rules are here.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from token_finalizer_client._constants import CAPABILITIES_TTL_S, LOGGER_NAME
from token_finalizer_client._json import loads

__all__ = [
    "CAPABILITIES_PATH",
    "COMPACT_FREEZE",
    "COMPACT_RESOLVE",
    "KNOWN_PREFIX",
    "PACKED_FREEZE",
    "PACKED_STAGE",
    "PROTOCOL_VERSION",
    "REFUSED_EXTENSION_STATUSES",
    "STAGED_CLEAR",
    "Probe",
    "StoreCapabilities",
    "features_of",
]

logger = logging.getLogger(LOGGER_NAME)

CAPABILITIES_PATH = "/capabilities"
PROTOCOL_VERSION = 1
# The feature names of today's extensions (docs/store-protocol.md#extensions-and-capabilities).
COMPACT_RESOLVE = "compact_resolve"  # lineage/resolve?tokens=compact
KNOWN_PREFIX = "known_prefix"  # a resolve's "known": only the ids after it
PACKED_FREEZE = "packed_freeze"  # freeze?columns=packed
COMPACT_FREEZE = "compact_freeze"  # freeze?entries=compact: entries as stored
PACKED_STAGE = "packed_stage"  # a stage body's token columns in "columns"
STAGED_CLEAR = "staged_clear"  # POST .../staged/clear: delete named staged calls
# An answer to a request that used an extension after which the store is asked again.
REFUSED_EXTENSION_STATUSES = frozenset({404, 405, 422})
# A store answering these to /capabilities has no such route: plain v1 only.
_NO_ROUTE_STATUSES = frozenset({404, 405})
_NONE: frozenset[str] = frozenset()

# What sending the probe gives: the status and the (decoded) body.
Probe = tuple[int, bytes]


def features_of(status_code: int, content: bytes) -> frozenset[str] | None:
    """The features a `/capabilities` answer advertises; None when it tells nothing.

    404 and 405: a store that predates the route, no feature. A 200 must be
    `{"protocol": 1, "features": [str, ...]}` (names that are not strings
    are skipped); a 200 of another protocol, or that is not such an object,
    advertises nothing. Any other status tells nothing (asked again later).
    """
    if status_code in _NO_ROUTE_STATUSES:
        return _NONE
    if status_code != 200:
        return None
    try:
        body: Any = loads(content)
    except ValueError:
        return _NONE
    if not isinstance(body, dict) or body.get("protocol") != PROTOCOL_VERSION:
        return _NONE
    features = body.get("features")
    if not isinstance(features, list):
        return _NONE
    return frozenset(name for name in features if isinstance(name, str))


class StoreCapabilities:
    """One store's advertised features: probed by the first caller, kept until `forget()`."""

    def __init__(self, *, ttl_s: float = CAPABILITIES_TTL_S) -> None:
        self._ttl_s = ttl_s
        self._kept_at = 0.0
        self._features: frozenset[str] | None = None
        # Bumped by forget(): a probe that started before it does not settle the answer.
        self._generation = 0
        self._lock = threading.Lock()  # guards the fields; held only briefly
        self._probing = threading.Lock()  # one blocking probe at a time
        self._pending: asyncio.Task[frozenset[str] | None] | None = None
        self.probes = 0  # how many times the store was asked (tests, logs)

    @property
    def known(self) -> frozenset[str] | None:
        """The features kept from the last answer; None when the store is to be asked."""
        features = self._features
        if features is not None and time.monotonic() - self._kept_at > self._ttl_s:
            return None
        return features

    def forget(self) -> None:
        """Drop the kept answer: the next caller asks the store again."""
        with self._lock:
            self._features = None
            self._generation += 1

    def _settle(self, probe: Probe | BaseException, generation: int) -> frozenset[str] | None:
        if isinstance(probe, BaseException):
            logger.debug("capabilities probe failed (%s): speaking plain v1", probe)
            return None
        features = features_of(*probe)
        with self._lock:
            if features is not None and generation == self._generation:
                self._features, self._kept_at = features, time.monotonic()
        return features

    def supports(self, feature: str, probe: Callable[[], Probe]) -> bool:
        """Whether the store advertises `feature`, asking it with `probe` when not known yet.

        Thread-safe: threads that find no answer wait for one probe.
        """
        features = self.known
        if features is None:
            with self._probing:
                features = self.known
                if features is None:
                    generation = self._generation
                    self.probes += 1
                    try:
                        answer: Probe | BaseException = probe()
                    except Exception as exc:  # no answer: v1 for this call, asked again next
                        answer = exc
                    features = self._settle(answer, generation)
        return features is not None and feature in features

    async def asupports(self, feature: str, probe: Callable[[], Awaitable[Probe]]) -> bool:
        """`supports` for asyncio callers: coroutines that find no answer share one probe.

        The probe runs as its own task, so a caller that is cancelled while
        waiting does not cancel it for the others.
        """
        features = self.known
        if features is None:
            features = await asyncio.shield(self._probe_task(probe))
        return features is not None and feature in features

    def _probe_task(
        self, probe: Callable[[], Awaitable[Probe]]
    ) -> asyncio.Task[frozenset[str] | None]:
        loop = asyncio.get_running_loop()
        with self._lock:
            pending = self._pending
            if pending is not None and not pending.done() and pending.get_loop() is loop:
                return pending
            task = loop.create_task(self._aprobe(probe, self._generation))
            # A probe under way on another loop is left to its own callers.
            if pending is None or pending.done() or pending.get_loop().is_closed():
                self._pending = task
            return task

    async def _aprobe(
        self, probe: Callable[[], Awaitable[Probe]], generation: int
    ) -> frozenset[str] | None:
        self.probes += 1
        try:
            answer: Probe | BaseException = await probe()
        except Exception as exc:  # no answer: v1 for this call, asked again next
            answer = exc
        try:
            return self._settle(answer, generation)
        finally:
            with self._lock:
                if self._pending is asyncio.current_task():
                    self._pending = None
