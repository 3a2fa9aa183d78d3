"""The staging digest primitives, input -> hex (generator only)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from _reference import Gym

__all__ = ["digest_cases"]

Json = Any
HEX_1 = "11" * 32
HEX_2 = "22" * 32
F32_OF_MINUS_0_1 = -0.10000000149011612  # float(numpy.float32(-0.1))


def answer(function: Callable[[], Any]) -> Json:
    try:
        value = function()
    except Exception as error:
        return {"error": {"class": type(error).__name__, "message": str(error)}}
    return {"value": value}


def case(name: str, description: str, inputs: Json, expected: Json) -> dict[str, Any]:
    return {"name": name, "description": description, "inputs": inputs, "expected": expected}


def token_hash_cases(gym: Gym) -> list[dict[str, Any]]:
    rows: list[tuple[str, str, list[Any]]] = [
        ("empty", "No tokens.", []),
        ("zero", "One zero id.", [0]),
        ("small", "Three small ids.", [1, 2, 3]),
        (
            "worked_example_c2",
            "The 8 cumulative ids of the worked chain example.",
            [1, 2, 3, 101, 102, 11, 12, 103],
        ),
        ("u64_max", "The largest id.", [2**64 - 1]),
        ("above_i64", "An id above the signed 64-bit range.", [2**63, 1]),
        ("long", "3000 ids.", list(range(0, 300_000, 100))),
        ("negative", "A negative id is refused.", [3, -1]),
        ("too_large", "2**64 is refused.", [2**64]),
        ("bool", "JSON true is refused (not an int).", [True]),
        ("float", "JSON 1.0 is refused (not an int).", [1.0]),
    ]
    return [
        case(
            f"token_hash_{name}",
            description,
            {"token_ids": ids},
            answer(lambda ids=ids: gym.digest.hash_token_ids(ids)),
        )
        for name, description, ids in rows
    ]


def chain_hash_cases(gym: Gym) -> list[dict[str, Any]]:
    chain = gym.digest.compute_chain_hash
    root = chain(None, [1, 2, 3, 101, 102])
    rows: list[tuple[str, str, Any, list[Any]]] = [
        ("root", "The worked example's root delta.", None, [1, 2, 3, 101, 102]),
        ("child", "The worked example's child delta on the root's chain.", root, [11, 12, 103]),
        ("root_empty_delta", "An empty delta still hashes.", None, []),
        ("child_empty_delta", "An empty child delta still hashes.", root, []),
        ("uppercase_parent", "An uppercase parent hash is refused.", root.upper(), [1]),
        ("short_parent", "A 63-character parent hash is refused.", root[:63], [1]),
        ("negative_id", "A negative id in the delta is refused.", None, [-5]),
    ]
    return [
        case(
            f"chain_hash_{name}",
            description,
            {"parent_chain_hash": parent, "token_ids_delta": delta},
            answer(lambda parent=parent, delta=delta: chain(parent, delta)),
        )
        for name, description, parent, delta in rows
    ]


def extras_cases(gym: Gym) -> list[dict[str, Any]]:
    envelope = gym.routes.encode_routed_experts([[[1, 2]], [[3, 4]]], dtype="int16")
    rows: list[tuple[str, str, Any]] = [
        ("none", "No extras: the empty-extras digest.", None),
        ("empty_mapping", "An empty mapping differs from no extras.", {}),
        (
            "golden_routed_experts",
            "The nested routed experts of the golden vector.",
            {"routed_experts": [[[1, 2]], [[3, 4]]]},
        ),
        (
            "routed_experts_envelope",
            "The same routes as an nrlre1 int16 envelope string.",
            {"routed_experts": envelope},
        ),
        (
            "media_spans",
            "vLLM media spans beside routed experts.",
            {"media_spans": [{"end": 9, "kind": "image", "start": 4}], "routed_experts": None},
        ),
        ("true", "A boolean.", {"x": True}),
        ("one", "An int.", {"x": 1}),
        ("one_point_zero", "A float (JSON 1.0).", {"x": 1.0}),
        ("zero_float", "0.0.", {"x": 0.0}),
        ("negative_zero", "-0.0 differs from 0.0.", {"x": -0.0}),
        (
            "floats",
            "Floats encode as big-endian binary64.",
            {"a": 0.1, "b": 1e300, "c": 5e-324, "d": -2.5},
        ),
        ("i64_limits", "Both signed 64-bit limits.", {"max": 2**63 - 1, "min": -(2**63)}),
        ("above_i64", "2**63 is refused.", {"x": 2**63}),
        (
            "key_order",
            "Keys sort by their UTF-8 bytes, whatever the insertion order.",
            {"z": 1, "é": 2, "Z": 3, "a": 4, "": 5},
        ),
        ("unicode_values", "Strings encode as UTF-8.", {"text": "naïve 日本 😀"}),
        ("nested_empty", "Empty list and mapping values.", {"l": [], "m": {}, "n": None}),
        ("deep", "Lists in mappings in lists.", {"x": [{"y": [1, [2, {"z": None}]]}]}),
        ("top_level_list", "A list is not a mapping.", [1, 2]),
    ]
    return [
        case(
            f"extras_{name}",
            description,
            {"extras": extras},
            answer(lambda extras=extras: gym.digest.compute_extras_digest(extras)),
        )
        for name, description, extras in rows
    ]


def staging_digest_cases(gym: Gym) -> list[dict[str, Any]]:
    golden = gym_golden(gym)["staged_call"]
    root = {
        **golden,
        "model_call_id": "root-1",
        "parent_call_id": None,
        "mode": "text",
        "prev_len": 0,
        "delta_len": 5,
        "cum_len": 5,
        "token_ids_delta": [1, 2, 3, 101, 102],
        "token_mask_delta": [0.0, 0.0, 0.0, 1.0, 1.0],
        "generation_log_probs_delta": [0.0, 0.0, 0.0, -0.1, -2.5],
        "extras_digest": gym.digest.EMPTY_EXTRAS_DIGEST,
        "chain_hash": HEX_1,
        "cumulative_hash": HEX_2,
    }
    rows: list[tuple[str, str, dict[str, Any]]] = [
        ("golden", "The golden vector's staged call.", golden),
        ("text_root", "A text root with no extras.", root),
        (
            "float32_rounding",
            "The root with -0.1 replaced by its float32 value: same digest.",
            {**root, "generation_log_probs_delta": [0.0, 0.0, 0.0, F32_OF_MINUS_0_1, -2.5]},
        ),
        (
            "weight_version_max",
            "The largest weight version.",
            {**root, "weight_version": 2**64 - 1},
        ),
        ("mask_half", "A mask of 0.5 is refused.", {**golden, "token_mask_delta": [0.0, 0.5]}),
        (
            "carry_log_prob",
            "A carry token with a log prob is refused.",
            {**golden, "generation_log_probs_delta": [-0.5, -0.25]},
        ),
        ("cum_len_mismatch", "cum_len must be prev_len + delta_len.", {**golden, "cum_len": 6}),
        (
            "delta_len_zero",
            "An empty delta is refused.",
            {
                **golden,
                "delta_len": 0,
                "cum_len": 3,
                "token_ids_delta": [],
                "token_mask_delta": [],
                "generation_log_probs_delta": [],
            },
        ),
        (
            "delta_len_mismatch",
            "delta_len must be the number of ids.",
            {**golden, "delta_len": 3, "cum_len": 6},
        ),
        ("empty_parent", "An empty parent id is refused.", {**golden, "parent_call_id": ""}),
        ("unknown_mode", "Only text and token_in.", {**golden, "mode": "tokens"}),
        ("text_with_parent", "A text call cannot have a parent.", {**golden, "mode": "text"}),
        ("schema_3", "Only schema version 2.", {**golden, "schema_version": 3}),
        (
            "uppercase_extras_digest",
            "Digests are lowercase hex.",
            {**golden, "extras_digest": golden["extras_digest"].upper()},
        ),
        (
            "float32_overflow",
            "A log prob beyond float32 is refused.",
            {**golden, "generation_log_probs_delta": [0.0, -1e39]},
        ),
        (
            "int_log_prob",
            "JSON 0 where a float is expected is refused.",
            {**golden, "generation_log_probs_delta": [0, -0.25]},
        ),
        ("token_id_too_large", "Ids are u64.", {**golden, "token_ids_delta": [10, 2**64]}),
    ]
    return [
        case(
            f"staging_digest_{name}",
            description,
            fields,
            answer(lambda fields=fields: gym.digest.compute_staging_digest(**fields)),
        )
        for name, description, fields in rows
    ]


def delta_cases(gym: Gym) -> list[dict[str, Any]]:
    rows: list[tuple[str, str, dict[str, Any]]] = [
        (
            "root",
            "A root: the whole prompt is carry.",
            {
                "prompt_token_ids": [1, 2, 3],
                "generated_token_ids": [101, 102],
                "generated_log_probs": [-0.25, -0.5],
                "prev_len": 0,
            },
        ),
        (
            "child",
            "A child: the prompt after prev_len is carry.",
            {
                "prompt_token_ids": [1, 2, 3, 101, 102, 11, 12],
                "generated_token_ids": [103],
                "generated_log_probs": [-0.125],
                "prev_len": 5,
            },
        ),
        (
            "no_carry",
            "The prompt is exactly the prefix.",
            {
                "prompt_token_ids": [1, 2],
                "generated_token_ids": [3],
                "generated_log_probs": [-1.0],
                "prev_len": 2,
            },
        ),
        (
            "no_generation",
            "Nothing generated: a carry-only delta is still built.",
            {
                "prompt_token_ids": [1, 2, 3],
                "generated_token_ids": [],
                "generated_log_probs": [],
                "prev_len": 1,
            },
        ),
        (
            "empty",
            "Nothing at all is refused.",
            {
                "prompt_token_ids": [1],
                "generated_token_ids": [],
                "generated_log_probs": [],
                "prev_len": 1,
            },
        ),
        (
            "prev_len_too_long",
            "prev_len beyond the prompt is refused.",
            {
                "prompt_token_ids": [1],
                "generated_token_ids": [2],
                "generated_log_probs": [-1.0],
                "prev_len": 2,
            },
        ),
        (
            "length_mismatch",
            "Ids and log probs must pair.",
            {
                "prompt_token_ids": [1],
                "generated_token_ids": [2, 3],
                "generated_log_probs": [-1.0],
                "prev_len": 0,
            },
        ),
    ]

    def build(fields: dict[str, Any]) -> Json:
        ids, mask, logprobs = gym.digest.build_staging_delta(**fields)
        return {
            "token_ids_delta": ids,
            "token_mask_delta": mask,
            "generation_log_probs_delta": logprobs,
        }

    return [
        case(f"delta_{name}", description, fields, answer(lambda fields=fields: build(fields)))
        for name, description, fields in rows
    ]


def envelope_cases(gym: Gym) -> list[dict[str, Any]]:
    rows: list[tuple[str, str, list[Any], str]] = [
        ("int8", "2 tokens x 1 layer x 2 experts as int8.", [[[1, 2]], [[3, 4]]], "int8"),
        ("int16", "The same as int16.", [[[1, 2]], [[3, 4]]], "int16"),
        (
            "int32",
            "2 tokens x 2 layers x 1 expert as int32, with a negative value.",
            [[[7], [-1]], [[300], [65536]]],
            "int32",
        ),
        ("overflow", "300 does not fit int8.", [[[300]]], "int8"),
    ]
    return [
        case(
            f"routed_experts_{name}",
            description,
            {"values": values, "dtype": dtype},
            answer(
                lambda values=values, dtype=dtype: gym.routes.encode_routed_experts(
                    values, dtype=dtype
                )
            ),
        )
        for name, description, values, dtype in rows
    ]


def gym_golden(gym: Gym) -> Json:
    import json

    return json.loads(gym.golden_path.read_text())


def digest_cases(gym: Gym) -> dict[str, list[dict[str, Any]]]:
    return {
        "token_hash": token_hash_cases(gym),
        "chain_hash": chain_hash_cases(gym),
        "extras_digest": extras_cases(gym),
        "staging_digest": staging_digest_cases(gym),
        "staging_delta": delta_cases(gym),
        "routed_experts_envelope": envelope_cases(gym),
        "constants": [
            case(
                "empty_extras_digest",
                "The digest of no extras.",
                {},
                {"value": gym.digest.EMPTY_EXTRAS_DIGEST},
            ),
            case(
                "versions",
                "Schema, digest and extras digest versions.",
                {},
                {
                    "value": {
                        "schema_version": gym.digest.STAGING_SCHEMA_VERSION,
                        "digest_version": gym.digest.STAGING_DIGEST_VERSION,
                        "extras_digest_version": gym.digest.EXTRAS_DIGEST_VERSION,
                    }
                },
            ),
        ],
    }
