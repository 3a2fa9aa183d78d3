"""verify_and_linearize on tampered receipts and snapshots (generator only).

Every case starts from the clean chain's real receipt and fetched snapshots
and changes one thing. Some changes are only expressible by skipping pydantic
validation (``model_construct``): a source or a receipt builder that does not
validate can still hand them to the verifier, so each case also says whether
Gym's own models accept its receipt and snapshots.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from _harness import dump
from _reference import Gym
from _trainer import build_receipt, outcome_of

__all__ = ["verification_cases"]

Json = Any
Case = tuple[str, str, Callable[[Any, list[Any]], tuple[Any, list[Any]]]]


class Tamper:
    """Helpers that change one receipt row or one snapshot, resealed or not."""

    def __init__(self, gym: Gym) -> None:
        self.gym = gym

    def seal(self, snapshot: Any, **changes: Any) -> Any:
        """A snapshot with ``changes`` and a digest recomputed over them (it validates)."""
        fields = {**snapshot.model_dump(), **changes}
        fields.pop("digest")
        digest = self.gym.digest.compute_staging_digest(**fields)
        return self.gym.staged.StagedCallBaseSnapshot.model_validate({**fields, "digest": digest})

    @staticmethod
    def raw(snapshot: Any, **changes: Any) -> Any:
        """A snapshot with ``changes`` and its old digest (no validation)."""
        return snapshot.model_copy(update=changes)

    def row_of(self, row: Any, snapshot: Any, **changes: Any) -> Any:
        """The manifest row re-pointed at a resealed snapshot."""
        fields = {
            name: getattr(snapshot, name)
            for name in (
                "parent_call_id",
                "mode",
                "prev_len",
                "delta_len",
                "cum_len",
                "weight_version",
                "digest",
                "extras_digest",
                "chain_hash",
                "cumulative_hash",
            )
        }
        return row.model_copy(update={**fields, **changes})

    @staticmethod
    def receipt(receipt: Any, **changes: Any) -> Any:
        return receipt.model_copy(update=changes)

    @staticmethod
    def rows(receipt: Any, index: int, **changes: Any) -> Any:
        manifest = list(receipt.manifest)
        manifest[index] = manifest[index].model_copy(update=changes)
        return receipt.model_copy(update={"manifest": manifest})


def _accepts(model: Any, wire: Json) -> str:
    try:
        model.model_validate(wire)
    except Exception as error:
        return "invalid: " + first_validation_error(error)
    return "valid"


def first_validation_error(error: Exception) -> str:
    """``loc: msg`` of a pydantic ValidationError's first error, else the error's text."""
    errors = getattr(error, "errors", None)
    if not callable(errors):
        return f"{type(error).__name__}: {error}"
    first = errors()[0]
    location = ".".join(str(part) for part in first["loc"])
    return f"{location}: {first['msg']}" if location else str(first["msg"])


def _structural_cases(gym: Gym, t: Tamper) -> list[Case]:
    def poisoned(receipt: Any, snaps: list[Any]) -> tuple[Any, list[Any]]:
        return t.receipt(
            receipt, capture_poisoned=True, failure_reason="worker_capture_failed"
        ), snaps

    def version(field: str) -> Callable[[Any, list[Any]], tuple[Any, list[Any]]]:
        return lambda receipt, snaps: (t.receipt(receipt, **{field: 3}), snaps)

    def row_version(field: str) -> Callable[[Any, list[Any]], tuple[Any, list[Any]]]:
        return lambda receipt, snaps: (t.rows(receipt, 1, **{field: 3}), snaps)

    return [
        ("accepted", "The untouched clean chain verifies.", lambda r, s: (r, s)),
        ("rollout_failed", "A receipt poisoned with a failure reason.", poisoned),
        (
            "capture_poisoned",
            "A receipt marked poisoned without a failure reason.",
            lambda r, s: (t.receipt(r, capture_poisoned=True), s),
        ),
        (
            "empty_manifest",
            "An unpoisoned receipt without rows (Gym's receipt model refuses it).",
            lambda r, s: (t.receipt(r, manifest=[], terminal_model_call_id=None), []),
        ),
        ("unsupported_schema", "Receipt schema_version 3.", version("schema_version")),
        ("unsupported_digest", "Receipt digest_version 3.", version("digest_version")),
        (
            "unsupported_extras_digest",
            "Receipt extras_digest_version 3.",
            version("extras_digest_version"),
        ),
        (
            "duplicate_manifest_row",
            "c2's row appears twice (Gym's receipt model refuses it).",
            lambda r, s: (
                t.receipt(r, manifest=[r.manifest[0], r.manifest[1], r.manifest[1], r.manifest[2]]),
                [s[0], s[1], s[1], s[2]],
            ),
        ),
        (
            "duplicate_staging_key",
            "c2's row names c1's staging key.",
            lambda r, s: (t.rows(r, 1, staging_key=r.manifest[0].staging_key), s),
        ),
        ("row_count_mismatch", "Only two snapshots for three rows.", lambda r, s: (r, s[:2])),
        (
            "duplicate_snapshot",
            "c1's snapshot is fetched for c1 and again for c2.",
            lambda r, s: (r, [s[0], s[0], s[2]]),
        ),
        (
            "snapshot_identity_mismatch",
            "The second key answers a call that is not in the manifest.",
            lambda r, s: (r, [s[0], t.seal(s[1], model_call_id="c9"), s[2]]),
        ),
        (
            "snapshot_order_mismatch",
            "The source answers c2 and c1 swapped.",
            lambda r, s: (r, [s[1], s[0], s[2]]),
        ),
        (
            "wrong_rollout",
            "c2's snapshot belongs to another rollout (resealed there).",
            lambda r, s: (r, [s[0], t.seal(s[1], rollout_id="other-rollout"), s[2]]),
        ),
        ("wrong_schema_version", "c2's row says schema 3.", row_version("schema_version")),
        ("wrong_digest_version", "c2's row says digest 3.", row_version("digest_version")),
        (
            "wrong_extras_digest_version",
            "c2's row says extras digest 3.",
            row_version("extras_digest_version"),
        ),
    ]


def _field_cases(gym: Gym, t: Tamper) -> list[Case]:
    empty = gym.digest.EMPTY_EXTRAS_DIGEST

    def row(index: int, **changes: Any) -> Callable[[Any, list[Any]], tuple[Any, list[Any]]]:
        return lambda receipt, snaps: (t.rows(receipt, index, **changes), snaps)

    def snap_wrong_digest(receipt: Any, snaps: list[Any]) -> tuple[Any, list[Any]]:
        changed = t.seal(snaps[1], generation_log_probs_delta=[0.0, 0.0, -0.25])
        return receipt, [snaps[0], changed, snaps[2]]

    return [
        ("wrong_parent_call_id", "c3's row names c1 as parent.", row(2, parent_call_id="c1")),
        (
            "wrong_mode",
            "c1's row says token_in (Gym's row model refuses it).",
            row(0, mode="token_in"),
        ),
        ("wrong_prev_len", "c2's row: prev 6, cum 9.", row(1, prev_len=6, cum_len=9)),
        ("wrong_delta_len", "c2's row: delta 4, cum 9.", row(1, delta_len=4, cum_len=9)),
        (
            "wrong_cum_len",
            "c2's row: cum 9 alone (Gym's row model refuses it).",
            row(1, cum_len=9),
        ),
        ("wrong_weight_version", "c2's row says weight 8.", row(1, weight_version=8)),
        ("wrong_digest", "c2's snapshot has another log prob, resealed.", snap_wrong_digest),
        ("wrong_extras_digest", "c2's row commits to no extras.", row(1, extras_digest=empty)),
        ("wrong_chain_hash", "c2's row has another chain hash.", row(1, chain_hash="0" * 64)),
        (
            "wrong_cumulative_hash",
            "c3's row has another cumulative hash.",
            row(2, cumulative_hash="f" * 64),
        ),
        (
            "invalid_snapshot_mask_value",
            "c2's snapshot holds mask 0.5 under its old digest (Gym's model refuses it).",
            lambda r, s: (r, [s[0], t.raw(s[1], token_mask_delta=[0.0, 0.5, 1.0]), s[2]]),
        ),
        (
            "invalid_snapshot_float32_overflow",
            "c2's generated log prob is -1e39, which float32 cannot hold (old digest).",
            lambda r, s: (
                r,
                [s[0], t.raw(s[1], generation_log_probs_delta=[0.0, 0.0, -1e39]), s[2]],
            ),
        ),
        (
            "corrupt_digest",
            "c2's generated token is changed under its old digest (Gym's model refuses it).",
            lambda r, s: (r, [s[0], t.raw(s[1], token_ids_delta=[11, 12, 104]), s[2]]),
        ),
        (
            "logprob_bound_at_float32",
            "c3's -0.1 replaced by its float32 value under the old digest: still accepted, and "
            "the row carries the snapshot's value.",
            lambda r, s: (
                r,
                [
                    s[0],
                    s[1],
                    t.raw(s[2], generation_log_probs_delta=[0.0, 0.0, -0.10000000149011612, -2.5]),
                ],
            ),
        ),
        (
            "staging_key_not_compared",
            "c2's row names another staging key: the verifier never compares it.",
            row(1, staging_key="elsewhere/c2"),
        ),
    ]


def _graph_cases(gym: Gym, t: Tamper) -> list[Case]:
    digest = gym.digest

    def resealed(index: int, **changes: Any) -> Callable[[Any, list[Any]], tuple[Any, list[Any]]]:
        def apply(receipt: Any, snaps: list[Any]) -> tuple[Any, list[Any]]:
            snapshot = t.seal(snaps[index], **changes)
            changed = list(snaps)
            changed[index] = snapshot
            rows = list(receipt.manifest)
            rows[index] = t.row_of(rows[index], snapshot)
            return t.receipt(receipt, manifest=rows), changed

        return apply

    def cycle(receipt: Any, snaps: list[Any]) -> tuple[Any, list[Any]]:
        x = t.seal(snaps[1], model_call_id="x", parent_call_id="y", prev_len=5, cum_len=8)
        y = t.seal(snaps[1], model_call_id="y", parent_call_id="x", prev_len=2, cum_len=5)
        rows = [
            t.row_of(receipt.manifest[1], x, model_call_id="x", staging_key="k/x"),
            t.row_of(receipt.manifest[1], y, model_call_id="y", staging_key="k/y"),
        ]
        return t.receipt(receipt, manifest=rows, terminal_model_call_id="x"), [x, y]

    c2_delta = [11, 12, 103]
    return [
        (
            "missing_parent",
            "c1's row and snapshot are left out.",
            lambda r, s: (t.receipt(r, manifest=r.manifest[1:]), s[1:]),
        ),
        (
            "parent_length_mismatch",
            "c2 starts at 4 while c1 ends at 5 (row and snapshot agree, resealed).",
            resealed(1, prev_len=4, cum_len=7),
        ),
        ("lineage_cycle", "x and y name each other as parent.", cycle),
        (
            "missing_terminal_absent",
            "The terminal names a call outside the manifest (Gym's receipt model refuses it).",
            lambda r, s: (t.receipt(r, terminal_model_call_id="c9"), s),
        ),
        (
            "missing_terminal_none",
            "An unpoisoned receipt without a terminal (Gym's receipt model refuses it).",
            lambda r, s: (t.receipt(r, terminal_model_call_id=None), s),
        ),
        (
            "chain_hash_mismatch",
            "c2's chain hash starts a new chain instead of extending c1's (resealed).",
            resealed(1, chain_hash=digest.compute_chain_hash(None, c2_delta)),
        ),
        (
            "invalid_mask_order",
            "c2's mask is 1,0,1 (resealed).",
            resealed(
                1, token_mask_delta=[1.0, 0.0, 1.0], generation_log_probs_delta=[-0.5, 0.0, -0.125]
            ),
        ),
        (
            "empty_generation",
            "c3's mask is all carry (resealed).",
            resealed(2, token_mask_delta=[0.0] * 4, generation_log_probs_delta=[0.0] * 4),
        ),
        (
            "cumulative_hash_mismatch",
            "c3's cumulative hash covers other tokens (resealed).",
            resealed(2, cumulative_hash=digest.hash_token_ids([1, 2, 3])),
        ),
        (
            "non_terminal_cumulative_hash_ignored",
            "c2's cumulative hash covers other tokens (resealed): accepted, only the terminal's "
            "is checked.",
            resealed(1, cumulative_hash=digest.hash_token_ids([1, 2, 3])),
        ),
    ]


def verification_cases(gym: Gym, clean: Any) -> list[dict[str, Any]]:
    """Cases over the clean chain run (``clean`` is its ScenarioRun)."""
    manifest = clean.case["expected"]["manifest"]
    record = clean.case["inputs"]["finalize"][0]["record"]
    rollout_id = clean.case["inputs"]["rollout_id"]
    receipt = build_receipt(gym, rollout_id, manifest, record)["receipt"]
    snapshots = clean.store.fetch([row.staging_key for row in receipt.manifest])
    t = Tamper(gym)
    cases = []
    specs = [*_structural_cases(gym, t), *_field_cases(gym, t), *_graph_cases(gym, t)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pydantic warns when dumping unvalidated values
        for name, description, change in specs:
            tampered_receipt, tampered = change(receipt, list(snapshots))
            receipt_wire = dump(tampered_receipt)
            snapshot_wires = [dump(snapshot) for snapshot in tampered]
            cases.append(
                {
                    "name": name,
                    "description": description,
                    "inputs": {"receipt": receipt_wire, "snapshots": snapshot_wires},
                    "expected": {
                        "gym_validation": {
                            "receipt": _accepts(gym.staged.RolloutReceipt, receipt_wire),
                            "snapshots": [
                                _accepts(gym.staged.StagedCallBaseSnapshot, wire)
                                for wire in snapshot_wires
                            ],
                        },
                        **outcome_of(gym, tampered_receipt, tampered),
                    },
                }
            )
    return cases
