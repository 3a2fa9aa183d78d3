"""Token digests of many sequences at once: no copies per sequence, hashed across threads.

A lineage build checks the digest of every call's cumulative sequence, and
those sequences nest: a 400-call rollout with a 400k-token context hashes
about 80M ids (640 MB), the floor of its cost, since the digest's header
holds the length and no two prefixes share any hashing work. What is not
the floor is converting each sequence to big-endian u64 first (another
O(calls x context) of copies), or hashing on one core while others idle:

- the ids of one build live in a few shared buffers (the prompts of a
  capture are views of one parse buffer, delta prompts views of one tape),
  so each buffer is converted to big-endian once, and every sequence is
  hashed from slices of that conversion (memoryviews, no copy);
- hashlib releases the GIL for large updates, so the sequences of a batch
  are hashed by a small thread pool when there is enough to hash.

See docs/architecture.md#digest-batches.
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import numpy.typing as npt

from token_finalizer._constants import DIGEST_PARALLEL_MIN_BYTES, DIGEST_THREADS
from token_finalizer.core.token_digest import (
    EMPTY_TOKEN_DIGEST,
    TOKEN_DIGEST_VERSION,
    InvalidTokenIds,
)
from token_finalizer.core.token_ids import buffer_of, out_of_range_message

__all__ = ["DigestBatch"]

Ids = npt.NDArray[np.integer[Any]]

_DOMAIN = b"nemo-gym-tokens"
_BIG_ENDIAN = np.dtype(">u8")

_pool: ThreadPoolExecutor | None = None
_pool_pid = 0
_pool_lock = threading.Lock()


def _shared_pool() -> ThreadPoolExecutor:
    """The process's hashing threads, created on first use (again after a fork)."""
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():
            _pool = ThreadPoolExecutor(DIGEST_THREADS, thread_name_prefix="token-digest")
            _pool_pid = os.getpid()
        return _pool


class _Converted:
    """One id buffer's leading ids as big-endian u64, extended as longer views ask for it.

    Only ids inside views already handed out are converted: an append-only
    buffer (a parse buffer, a tape) never changes those again.
    """

    __slots__ = ("big_endian", "length", "owner")

    def __init__(self, owner: Ids) -> None:
        self.owner = owner  # kept alive: the cache is keyed by its id()
        self.big_endian = np.empty(len(owner), dtype=_BIG_ENDIAN)
        self.length = 0

    def upto(self, end: int) -> npt.NDArray[Any]:
        if end > self.length:
            fresh = self.owner[self.length : end]
            if fresh.dtype.kind == "i" and len(fresh) and int(fresh.min()) < 0:
                raise InvalidTokenIds(out_of_range_message(int(fresh.min())))
            self.big_endian[self.length : end] = fresh
            self.length = end
        return self.big_endian


class DigestBatch:
    """Collects sequences (each given as its parts), then digests them all in one `run`."""

    def __init__(self) -> None:
        self._converted: dict[int, _Converted] = {}
        self._jobs: list[tuple[int, list[memoryview]]] = []

    def add(self, *parts: Ids) -> int:
        """Queue the digest of the concatenation of `parts`; its index in `run`'s answer.

        The parts are converted now (InvalidTokenIds for a negative id), so
        the buffers may change after `add` returns without changing the digest.
        """
        views = [self._big_endian(part) for part in parts if len(part)]
        self._jobs.append((sum(view.nbytes for view in views) // 8, views))
        return len(self._jobs) - 1

    def _big_endian(self, ids: Ids) -> memoryview:
        found = buffer_of(ids)
        if found is None:  # not a view of a plain buffer: convert it alone
            return _Converted(np.ascontiguousarray(ids)).upto(len(ids)).data
        owner, offset = found
        converted = self._converted.get(id(owner))
        if converted is None:
            converted = self._converted[id(owner)] = _Converted(owner)
        return converted.upto(offset + len(ids))[offset : offset + len(ids)].data

    def run(self) -> list[str]:
        """The hex digests of every queued sequence, in the order they were added."""
        jobs, self._jobs = self._jobs, []
        total_bytes = 8 * sum(count for count, _ in jobs)
        if DIGEST_THREADS > 1 and len(jobs) > 1 and total_bytes >= DIGEST_PARALLEL_MIN_BYTES:
            return list(_shared_pool().map(_digest, jobs))
        return [_digest(job) for job in jobs]


def _digest(job: tuple[int, list[memoryview]]) -> str:
    count, views = job
    if count == 0:
        return EMPTY_TOKEN_DIGEST
    hasher = hashlib.sha256(_DOMAIN)
    hasher.update(struct.pack(">BQ", TOKEN_DIGEST_VERSION, count))
    for view in views:
        hasher.update(view)  # large updates release the GIL: threads hash in parallel
    return hasher.hexdigest()
