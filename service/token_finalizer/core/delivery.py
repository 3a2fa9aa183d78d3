"""The seed's delivery API: finalize a finished rollout record, and retire its capture later.

`finalize_rollout_token_capture` freezes the rollout's capture through its
TokenSource, rebuilds `response.output` from that frozen snapshot as one
prefix-contiguous token chain, and masks the record when tokens are missing or
ambiguous. It never retires and never raises. The caller retires with
`retire_rollout_token_capture` only after the finished record was written
durably (trainer acceptance or a local fsync); failed and masked builds are
never retired, so their capture stays behind as evidence.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

import numpy as np

from token_finalizer._constants import BUILD_IN_THREAD_MIN_TOKENS
from token_finalizer.core.build import (
    MASK_SAMPLE_KEY,
    REDUNDANT_CAPTURE_KEY,
    STAGED_BUILDER,
    Build,
    MaskReason,
)
from token_finalizer.core.entries import Snapshot
from token_finalizer.core.errors import (
    StoreUnreachable,
    TokenIdOutOfRange,
    describe_exception,
)
from token_finalizer.core.identity import RecordKey, record_key
from token_finalizer.core.protocols import AddressedSource, ExtrasSource, TokenSource
from token_finalizer.core.rebuild import BUILDER_NAME, rebuild_snapshot
from token_finalizer.core.staged_build import build_staged
from token_finalizer.core.staging import ReceiptPolicy

__all__ = [
    "MASK_SAMPLE_KEY",
    "TOKEN_CAPTURE_KEY",
    "_REDUNDANT_CAPTURE_KEY",
    "_unusable",
    "capture_build_can_retire",
    "finalize_record",
    "finalize_rollout_token_capture",
    "retire_rollout_token_capture",
    "rollout_carries_token_ids",
]

TOKEN_CAPTURE_KEY = "_ng_token_capture"
_REDUNDANT_CAPTURE_KEY = REDUNDANT_CAPTURE_KEY

logger = logging.getLogger(__name__)


def _unusable(result: dict[str, Any], error: str, message: str) -> dict[str, Any]:
    """Mask a rollout that needed token ids and could not get them.

    The seed's helper, kept to its exact shape. An unmasked rollout would look
    healthy until it reached the trainer, so the record keeps the reason for
    aggregate reporting. There is no snapshot in the answer: nothing was
    consumed, so nothing may be retired.
    """
    logger.warning("%s", message)
    metrics: dict[str, Any] = {"n_calls": 0, "error": error}
    if isinstance(result, dict):  # a non-object record has nowhere to carry the mark
        result[MASK_SAMPLE_KEY] = True
        result[TOKEN_CAPTURE_KEY] = metrics
    return {"rebuilt_response": None, MASK_SAMPLE_KEY: True, "error": error, "metrics": metrics}


def _mark_unusable(result: Any, error: str, message: str, reason: MaskReason) -> Build:
    """`_unusable` for the typed path: the same marks, plus the machine-readable reason."""
    logger.warning("%s", message)
    build = Build.unusable(error, mask_reason=reason)
    if isinstance(result, dict):  # a non-object record has nowhere to carry the mark
        result[MASK_SAMPLE_KEY] = True
        result[TOKEN_CAPTURE_KEY] = build.record_capture()
    return build


def _has_items(value: object) -> bool:
    if isinstance(value, np.ndarray):
        return value.size > 0
    return isinstance(value, list | tuple) and len(value) > 0


def rollout_carries_token_ids(result: dict[str, Any]) -> bool:
    """Whether this rollout already holds what training needs.

    Token ids already in the record are what the policy sampled; they win over
    any reconstruction, and partial coverage must stay visible rather than be
    overwritten.
    """
    if not isinstance(result, dict):
        return False
    response = result.get("response")
    output = response.get("output") if isinstance(response, dict) else None
    if not isinstance(output, list):
        return False
    return any(
        isinstance(item, dict) and _has_items(item.get("generation_token_ids")) for item in output
    )


# Token ids a record may carry: non-negative integers of the token digest's range
# (docs/records-and-builds.md#token-digest).
_TOKEN_ID_END = 2**64
_TOKEN_ID_KEYS = ("prompt_token_ids", "generation_token_ids")


def _token_ids_problem(value: object) -> str | None:
    """Why `value` is not a flat list of token ids (None when it is one)."""
    if isinstance(value, np.ndarray):
        if value.ndim != 1 or value.dtype.kind not in "iu":
            return f"is a {value.ndim}-dimensional {value.dtype} array, not token ids"
        if value.size and int(value.min()) < 0:
            return f"holds a negative token id ({int(value.min())})"
        return None
    if not isinstance(value, list):
        return f"must be a list of token ids, got a {type(value).__name__}"
    if not value:
        return None
    strangers = set(map(type, value)) - {int}  # a JSON boolean is no token id
    if strangers:
        names = ", ".join(sorted(kind.__name__ for kind in strangers))
        return f"must hold integers only, holds {names}"
    low, high = min(value), max(value)
    if low < 0:
        return f"holds a negative token id ({low})"
    if high >= _TOKEN_ID_END:
        return f"holds a token id of 2**64 or more ({high})"
    return None


def _own_token_ids_problem(result: dict[str, Any]) -> str | None:
    """Why the token ids a record carries cannot be trained on (None when all are well-formed).

    Only called for a record that carries token ids (`rollout_carries_token_ids`),
    so `response.output` is a list.
    """
    for index, item in enumerate(result["response"]["output"]):
        if not isinstance(item, dict):
            continue
        for key in _TOKEN_ID_KEYS:
            value = item.get(key)
            problem = None if value is None else _token_ids_problem(value)
            if problem is not None:
                where = f"response.output[{index}].{key}"
                return f"the record's own token ids are malformed: {where} {problem}"
    return None


def _own_token_count(result: dict[str, Any]) -> int:
    count = 0
    for item in result["response"]["output"]:
        if isinstance(item, dict):
            for key in _TOKEN_ID_KEYS:
                value = item.get(key)
                if isinstance(value, list | np.ndarray):
                    count += len(value)
    return count


def _already_masked(result: dict[str, Any]) -> bool:
    """Whether the record arrived marked `mask_sample` (read as trainers read it)."""
    return bool(result.get(MASK_SAMPLE_KEY))


def capture_build_can_retire(built: dict[str, Any] | None) -> bool:
    """Whether a successful build consumed a frozen snapshot (a staged one: a verified row)."""
    if not isinstance(built, dict) or built.get(MASK_SAMPLE_KEY):
        return False
    staged = built.get("staged")
    if built.get("builder") == STAGED_BUILDER:
        return isinstance(staged, dict) and staged.get("row") is not None
    return built.get("rebuilt_response") is not None or bool(built.get(_REDUNDANT_CAPTURE_KEY))


def _apply(result: dict[str, Any], build: Build) -> None:
    """Write a build into its record: only response.output and the capture keys change."""
    rebuilt = build.rebuilt_response
    if rebuilt is not None:
        response = result.get("response")
        if isinstance(response, dict):
            response["output"] = rebuilt["output"]
        else:
            result["response"] = rebuilt
    result[TOKEN_CAPTURE_KEY] = build.record_capture()
    if build.mask_sample:
        result[MASK_SAMPLE_KEY] = True


def _record_model(result: dict[str, Any]) -> str:
    response = result.get("response")
    model = response.get("model") if isinstance(response, dict) else None
    return model if isinstance(model, str) else ""


async def _build(
    result: dict[str, Any],
    rollout_id: str,
    source: TokenSource,
    *,
    terminal_attribution: bool,
    raise_unreachable: bool,
    receipt_policy: ReceiptPolicy = ReceiptPolicy.TOKEN_FINALIZER,
) -> Build:
    try:
        snapshot: Snapshot = await source.freeze(rollout_id)
    except Exception as exc:
        unreachable = isinstance(exc, StoreUnreachable)
        if unreachable and raise_unreachable:
            raise
        logger.warning("freeze of rollout %s failed: %s", rollout_id, describe_exception(exc))
        if isinstance(exc, TokenIdOutOfRange):
            # A stored id outside [0, 2**64): reported as hashing it would be
            # (docs/records-and-builds.md#token-ids), never delivered.
            error, reason = f"ValueError: {exc}", MaskReason.INVALID_TOKENS
        else:
            error = describe_exception(exc)
            reason = MaskReason.STORE_UNREACHABLE if unreachable else MaskReason.FREEZE_FAILED
        return Build.failed(
            rollout_id, error, mask_reason=reason, metrics={"n_calls": 0}, builder=BUILDER_NAME
        )
    return await _rebuilt(
        snapshot,
        result,
        source,
        terminal_attribution=terminal_attribution,
        raise_unreachable=raise_unreachable,
        receipt_policy=receipt_policy,
    )


async def _staged(
    snapshot: Snapshot,
    result: dict[str, Any],
    source: TokenSource,
    *,
    terminal_attribution: bool,
    raise_unreachable: bool,
    receipt_policy: ReceiptPolicy,
) -> Build:
    """The build of a frozen staging rollout: verified, never rebuilt (docs/staging.md)."""
    extras = source if isinstance(source, ExtrasSource) else None
    try:
        return await build_staged(
            snapshot,
            result,
            extras,
            terminal_attribution=terminal_attribution,
            receipt_policy=receipt_policy,
        )
    except StoreUnreachable as exc:
        if raise_unreachable:
            raise
        logger.warning("extras of rollout %s unreachable: %s", snapshot.rollout_id, exc)
        return Build.failed(
            snapshot.rollout_id,
            describe_exception(exc),
            mask_reason=MaskReason.STORE_UNREACHABLE,
            metrics={"n_calls": 0},
            builder=STAGED_BUILDER,
            snapshot=snapshot,
        )


async def _rebuilt(
    snapshot: Snapshot,
    result: dict[str, Any],
    source: TokenSource,
    *,
    terminal_attribution: bool,
    raise_unreachable: bool = False,
    receipt_policy: ReceiptPolicy = ReceiptPolicy.TOKEN_FINALIZER,
) -> Build:
    """The build of a frozen snapshot for this record (never raises but StoreUnreachable,
    and that only when `raise_unreachable`)."""
    if snapshot.staged is not None:
        return await _staged(
            snapshot,
            result,
            source,
            terminal_attribution=terminal_attribution,
            raise_unreachable=raise_unreachable,
            receipt_policy=receipt_policy,
        )
    rebuild = functools.partial(
        rebuild_snapshot,
        snapshot,
        model=_record_model(result),
        record=result,
        terminal_attribution=terminal_attribution,
        store_option=source.store_option if isinstance(source, AddressedSource) else "",
    )
    tokens = sum(e.cumulative_length for e in snapshot.entries)
    if tokens >= BUILD_IN_THREAD_MIN_TOKENS:
        # Large builds run off the event loop so one long rollout cannot stall
        # every other request of the process.
        return await asyncio.to_thread(rebuild)
    return rebuild()


async def finalize_record(
    result: dict[str, Any],
    source: TokenSource | None,
    *,
    terminal_attribution: bool = True,
    raise_unreachable: bool = False,
    key: RecordKey | None = None,
    receipt_policy: ReceiptPolicy = ReceiptPolicy.TOKEN_FINALIZER,
) -> Build | None:
    """Finalize one record in place and return its typed Build (None without a source).

    `key` is the record's capture key when the caller already derived it (the
    service does, for its logs and metrics); otherwise it is derived here.

    `terminal_attribution=False` builds by the chain rules alone (docs/configuration.md).
    `receipt_policy` decides a staging rollout's receipt: ours, or NeMo RL's
    (docs/staging.md#receipt-policy).
    `raise_unreachable=True` lets StoreUnreachable through instead of masking: the
    store was not reached, nothing was frozen, and the caller may try again later
    (the service answers 503; docs/finalizer-api.md#unreachable-stores).

    Token fields stay numpy arrays: the service serializes them directly
    (orjson), which avoids turning millions of ids into Python ints only to
    encode them again. Never raises (but StoreUnreachable when asked); never retires.
    """
    if source is None:
        return None
    key = record_key(result) if key is None else key
    if key.malformed is not None:
        error = f"malformed rollout id: {key.malformed}"
        return _mark_unusable(result, error, error, MaskReason.MALFORMED_ROLLOUT_ID)
    rollout_id = key.rollout_id
    try:
        if rollout_carries_token_ids(result):
            return await _redundant_capture(
                result,
                rollout_id,
                source,
                terminal_attribution=terminal_attribution,
                receipt_policy=receipt_policy,
            )
        if rollout_id is None:
            return _mark_unusable(
                result,
                "no capture key",
                "rollout record names no rollout id; masking it",
                MaskReason.NO_CAPTURE_KEY,
            )
        build = await _build(
            result,
            rollout_id,
            source,
            terminal_attribution=terminal_attribution,
            raise_unreachable=raise_unreachable,
            receipt_policy=receipt_policy,
        )
        _apply(result, build)
        return build
    except StoreUnreachable:
        raise  # only ever raised here when the caller asked for it
    except Exception as exc:
        logger.exception("finalize of rollout %s failed unexpectedly", rollout_id)
        return _mark_unusable(
            result,
            describe_exception(exc),
            f"finalize failed: {describe_exception(exc)}",
            MaskReason.FINALIZE_ERROR,
        )


async def _redundant_capture(
    result: dict[str, Any],
    rollout_id: str | None,
    source: TokenSource,
    *,
    terminal_attribution: bool,
    receipt_policy: ReceiptPolicy,
) -> Build | None:
    """Freeze the capture of a record that already carries its own token ids.

    The record stays as it is, and the frozen capture is handed back, to be
    retired after handoff, only when nothing speaks against it: the record's
    own ids are all well-formed, the record is not masked, the snapshot is
    complete, and the capture's own build is clean or delivers exactly the
    ids the record carries (docs/records-and-builds.md#delivery-functions).
    Otherwise (None) the frozen capture stays as evidence: a record's made-up
    ids must not buy the deletion of a capture that would have been masked. A
    record whose own ids are malformed cannot be trained on: it is masked
    (`invalid_token_ids`) without touching its capture.
    """
    if _own_token_count(result) >= BUILD_IN_THREAD_MIN_TOKENS:
        # A record carrying a long rollout's ids: checked off the event loop.
        problem = await asyncio.to_thread(_own_token_ids_problem, result)
    else:
        problem = _own_token_ids_problem(result)
    if problem is not None:
        return _mark_unusable(
            result, problem, f"rollout {rollout_id}: {problem}", MaskReason.INVALID_TOKENS
        )
    if rollout_id is None:
        return None
    try:
        snapshot = await source.freeze(rollout_id)
    except Exception as exc:
        logger.warning(
            "freeze of redundant capture %s failed: %s", rollout_id, describe_exception(exc)
        )
        return None
    kept_because = None
    if snapshot.incomplete:
        kept_because = "its capture is incomplete"
    elif _already_masked(result):
        kept_because = "the record is masked"
    else:
        # What a finalize of this record would have built from the capture alone.
        own = await _rebuilt(
            snapshot,
            result,
            source,
            terminal_attribution=terminal_attribution,
            receipt_policy=receipt_policy,
        )
        if own.mask_sample and not _same_token_ids(result, own):
            kept_because = f"the capture's own build is masked ({own.mask_reason})"
    if kept_because is not None:
        logger.warning(
            "rollout %s carries its own token ids, but %s: its frozen capture is kept, "
            "not offered for retirement",
            rollout_id,
            kept_because,
        )
        return None
    return Build.redundant_capture(snapshot)


def _token_pairs(output: object) -> list[tuple[Any, Any]]:
    """(prompt ids, generation ids) of every item of an output that carries generated ids."""
    if not isinstance(output, list):
        return []
    return [
        (item.get("prompt_token_ids"), item["generation_token_ids"])
        for item in output
        if isinstance(item, dict) and _has_items(item.get("generation_token_ids"))
    ]


def _same_token_ids(result: dict[str, Any], build: Build) -> bool:
    """Whether the record's token-bearing items carry exactly the ids `build` delivers."""
    if build.rebuilt_response is None:
        return False
    carried = _token_pairs(result["response"]["output"])
    delivered = _token_pairs(build.rebuilt_response.get("output"))
    return len(carried) == len(delivered) and all(
        np.array_equal(np.asarray(mine), np.asarray(theirs))
        for pair, other in zip(carried, delivered, strict=True)
        for mine, theirs in zip(pair, other, strict=True)
    )


def _to_lists(items: list[Any]) -> None:
    for item in items:
        if isinstance(item, dict):
            for key, value in item.items():
                if isinstance(value, np.ndarray):
                    item[key] = value.tolist()


async def finalize_rollout_token_capture(
    result: dict[str, Any], source: TokenSource | None
) -> dict[str, Any] | None:
    """Rebuild one finished rollout record's `response.output` from its recorded token ids.

    Mutates `result` in place, replacing only `response.output` (or setting
    `response` when the record had none) and adding `_ng_token_capture` and,
    when masked, `mask_sample`. Returns the build, or None when `source` is
    None. Never raises; never retires.
    """
    build = await finalize_record(result, source)
    if build is None:
        return None
    if build.rebuilt_response is not None:
        # The record and the build share these item dicts: one pass converts both.
        _to_lists(build.rebuilt_response["output"])
    return build.to_dict()


async def retire_rollout_token_capture(
    rollout_id: str, source: TokenSource | None, built: dict[str, Any] | None
) -> bool:
    """Retire a frozen snapshot after durable handoff.

    Call only after downstream acceptance or a local fsync. Drops exactly the
    snapshot named in the build; masked or failed builds are never retired.
    """
    if source is None or not capture_build_can_retire(built):
        return False
    ref = built.get("_capture_snapshot") if built else None
    if not isinstance(ref, dict):
        logger.warning("build of rollout %s names no capture snapshot; not retiring", rollout_id)
        return False
    try:
        return bool(
            await source.drop(
                rollout_id, snapshot_id=str(ref["snapshot_id"]), version=int(ref["version"])
            )
        )
    except Exception as exc:
        logger.warning("retire of rollout %s failed: %s", rollout_id, describe_exception(exc))
        return False
