"""Regenerate the NeMo Gym 0.7.0 test vectors in this directory (run by hand, never in CI).

    python tests/vectors/nemo_gym_0_7/generate.py [--reference /tmp/ng/whl/nemo_gym]

``--reference`` is the ``nemo_gym`` directory of the unpacked 0.7.0 wheel
(``pip download --no-deps --ignore-requires-python nemo-gym==0.7.0``, then
unzip). Only its ``token_id_capture`` subpackage is imported, under an empty
``nemo_gym`` package built in a temporary directory together with
``rollout_correlation.py`` and stand-ins for the two constants modules that
file reads, so none of NeMo Gym's server dependencies are needed (pydantic,
orjson and numpy are).

Every expected value is what the released code answers, except where docs/
deliberately differs: such a case carries our expected value, the reference's
answer under ``reference`` and a ``note`` saying why.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_REFERENCE = Path("/tmp/ng/whl/nemo_gym")
ROLLOUT = "r"

Json = Any


# --------------------------------------------------------------------------- reference


class Reference:
    """The reference modules, imported from a throw-away stub package tree."""

    def __init__(self, nemo_gym_dir: Path, workdir: Path) -> None:
        package = workdir / "nemo_gym"
        package.mkdir()
        (package / "__init__.py").write_text("")
        (package / "config_types.py").write_text('ROLLOUT_PATH_PREFIX = "ng-rollout"\n')
        (package / "global_config.py").write_text(
            'TASK_INDEX_KEY_NAME = "_ng_task_index"\n'
            'ROLLOUT_INDEX_KEY_NAME = "_ng_rollout_index"\n'
            'ATTEMPT_INDEX_KEY_NAME = "_ng_attempt_index"\n'
            'ROLLOUT_ID_KEY_NAME = "_ng_rollout_id"\n'
        )
        shutil.copy(nemo_gym_dir / "rollout_correlation.py", package)
        shutil.copytree(
            nemo_gym_dir / "token_id_capture",
            package / "token_id_capture",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        sys.dont_write_bytecode = True
        sys.path.insert(0, str(workdir))

        def load(name: str) -> ModuleType:
            return importlib.import_module(f"nemo_gym.token_id_capture.{name}")

        self.records = load("records")
        self.fingerprint = load("fingerprint")
        self.terminal = load("terminal")
        self.lineage = load("lineage")
        self.builder = load("builder")
        self.consumer = load("consumer")
        self.store = load("store")
        self.delivery = load("delivery")

    def entry(self, data: dict[str, Any]) -> Any:
        return self.records.TokenEntry.model_validate(data)


class Writer:
    """Stamps entries the way a 0.7 model server does (lineage + continuation fields)."""

    def __init__(self, ref: Reference) -> None:
        self.ref = ref
        self.cumulative: dict[str, list[int]] = {}

    def call(
        self,
        call_id: str,
        prompt: list[int],
        generation: list[int],
        *,
        request: list[dict[str, Any]] | None = None,
        output: list[dict[str, Any]] | None = None,
        parent: str | None = None,
        resolution: str | None = None,
        delta: bool = False,
        response_id: str | None = None,
        lineage: bool = True,
        **overrides: Any,
    ) -> dict[str, Any]:
        """One entry in wire form; ``overrides`` are applied last (to corrupt a field)."""
        records = self.ref.records
        entry = records.TokenEntry(
            rollout_id=ROLLOUT,
            model_call_id=call_id,
            prompt_token_ids=prompt,
            generation_token_ids=generation,
            generation_log_probs=[-0.5] * len(generation),
            output_items=output or [],
            response_id=response_id,
        )
        # Set after validation: the model refuses a delta without its parent link,
        # which stamp_lineage adds below.
        entry.prompt_is_delta = delta
        base = self.cumulative[parent] if delta and parent is not None else []
        cumulative = base + prompt + generation
        self.cumulative[call_id] = cumulative
        if lineage:
            status = resolution or ("resolved" if parent else "root")
            records.stamp_lineage(
                entry,
                parent,
                parent_resolution=records.ParentResolutionStatus(status),
                cumulative=cumulative,
            )
        if request is not None:
            self.ref.lineage.stamp_continuation(entry, request)
        data: dict[str, Any] = entry.model_dump(mode="json", exclude_defaults=True)
        data.setdefault("output_items", [])
        data.update(overrides)
        return data


def plain(call_id: str, prompt: list[int], generation: list[int], **fields: Any) -> dict[str, Any]:
    """An entry in wire form with exactly the given fields (no stamping)."""
    return {
        "rollout_id": ROLLOUT,
        "model_call_id": call_id,
        "prompt_token_ids": prompt,
        "generation_token_ids": generation,
        "generation_log_probs": [-0.5] * len(generation),
        "output_items": fields.pop("output_items", []),
        **fields,
    }


def outcome(function: Callable[[], Any]) -> dict[str, Any]:
    """``{"value": ...}`` or ``{"error": "<Type>: <message>"}``."""
    try:
        return {"value": function()}
    except Exception as error:  # RecursionError and StopIteration included
        return {"error": f"{type(error).__name__}: {error}"[:200]}


# --------------------------------------------------------------------------- items

SYSTEM = {"role": "system", "content": "You are terse."}
USER = {"role": "user", "content": "What is 2+2?"}
USER_2 = {"role": "user", "content": "And 3+3?"}
ASSISTANT_1 = {"role": "assistant", "content": "4"}
ASSISTANT_2 = {"role": "assistant", "content": "6"}
CALL = {
    "type": "function_call",
    "call_id": "call_1",
    "name": "add",
    "arguments": '{"a": 3, "b": 3}',
}
CALL_OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "6"}


# --------------------------------------------------------------------------- token digests


def token_digest_cases(ref: Reference) -> dict[str, Any]:
    compute = ref.records.compute_digest
    sequences: dict[str, list[int]] = {
        "empty": [],
        "single_zero": [0],
        "small": [1, 2, 3],
        "int32_max": [2**31 - 1],
        "int64_max": [2**63 - 1],
        "above_int64": [2**63, 1],
        "uint64_max": [2**64 - 1, 0, 2**64 - 1],
        "long": list(range(0, 300_000, 97)),
    }
    cases: list[dict[str, Any]] = [
        {"name": name, "ids": ids, "expected": compute(ids)} for name, ids in sequences.items()
    ]
    cases += [
        {
            "name": "parts_prompt_generation",
            "parts": [[5, 6, 7], [8, 9]],
            "expected": compute([5, 6, 7, 8, 9]),
        },
        {"name": "parts_all_empty", "parts": [[], []], "expected": compute([])},
        {
            "name": "parts_empty_first",
            "parts": [[], [1], [], [2, 3]],
            "expected": compute([1, 2, 3]),
        },
    ]
    negative = outcome(lambda: compute([3, -1, 2]))
    cases.append({"name": "negative", "ids": [3, -1, 2], "error": negative["error"]})
    cases.append(
        {
            "name": "too_large",
            "ids": [1, 2**64],
            "error": "ValueError: token ids must be below 2**64, got 18446744073709551616",
            "reference": outcome(lambda: compute([1, 2**64])),
            "note": "our rules: ids >= 2**64 fail with a ValueError (the reference does not "
            "report them: its negative-id search comes up empty).",
        }
    )
    cases.append(
        {
            "name": "too_large_before_negative",
            "ids": [2**64, -1],
            "error": "ValueError: token ids must be below 2**64, got 18446744073709551616",
            "reference": outcome(lambda: compute([2**64, -1])),
            "note": "We name the first offending id; the reference names the first negative one.",
        }
    )
    cases.append(
        {
            "name": "negative_mixed_with_large",
            "ids": [7, -3, 2**63],
            "error": negative["error"].replace("-1", "-3"),
            "reference": outcome(lambda: compute([7, -3, 2**63])),
        }
    )
    return {"digest_version": 1, "cases": cases}


# --------------------------------------------------------------------------- fingerprints

ARGUMENT_VALUES: dict[str, Any] = {
    "null": None,
    "empty_string": "",
    "whitespace_only": "   ",
    "json_object_string": '{"b": 1, "a": [1, 2.50, {"d": null, "c": true}]}',
    "json_string_with_padding": '  {"a":1}\n',
    "unparsable_string_stripped": "  not json {  ",
    "json_string_literal": '"quoted"',
    "json_number_string": "1",
    "json_float_string": "1.0",
    "json_nan_string": "NaN",
    "json_infinity_string": "-Infinity",
    "json_overflowing_float_string": "1e999",
    "json_negative_zero_string": "-0.0",
    "json_big_int_string": "123456789012345678901234567890",
    "json_u64_max_string": "18446744073709551615",
    "json_i64_min_string": "-9223372036854775808",
    "json_below_i64_min_string": "-9223372036854775809",
    "too_many_digits_string": "9" * 5000,
    "json_nested_300_string": "[" * 300 + "]" * 300,
    "json_nested_3000_string": "[" * 3000 + "]" * 3000,
    "json_unicode_string": '{"é": "ü", "a": "日本", "z": "😀"}',
    "json_escaped_surrogate_string": '"\\ud800"',
    "dict": {"z": 1, "a": {"y": [3, 2], "b": None}},
    "dict_floats": {"x": 0.1 + 0.2, "y": 1e16, "z": -0.0, "w": 1e-7, "v": 100.0},
    "dict_nan": {"x": float("nan"), "y": float("inf"), "z": float("-inf")},
    "dict_u64_max": {"x": 2**64 - 1, "y": -(2**63)},
    "dict_int_too_large": {"x": 2**64},
    "dict_int_too_small": {"x": -(2**63) - 1},
    "list": [3, "a", None, True],
    "true": True,
    "false": False,
    "zero": 0,
    "float": 2.5,
    "unicode_dict": {"ключ": "значение", "emoji": "🎉"},
}


def fingerprint_item_cases() -> dict[str, Any]:
    """Name -> items; each exercises one branch of the our resolution rules normalization."""
    cases: dict[str, Any] = {
        # whole-list shapes
        "empty_list": [],
        "null_items": None,
        "user_only": [SYSTEM, USER],
        "chat_one_turn": [SYSTEM, USER, ASSISTANT_1],
        "chat_two_turns": [SYSTEM, USER, ASSISTANT_1, USER_2, ASSISTANT_2],
        "assistant_without_content": [USER, {"role": "assistant"}],
        "assistant_null_content": [USER, {"role": "assistant", "content": None}],
        "assistant_empty_string_content": [{"role": "assistant", "content": ""}],
        "assistant_empty_list_content": [{"role": "assistant", "content": []}],
        "role_wins_over_type": [{"role": "assistant", "type": "message", "content": "x"}],
        "role_falsy_uses_type": [{"role": "", "type": "reasoning", "summary": []}],
        "no_role_no_type": [{"content": "orphan"}],
        "role_non_string": [{"role": 7, "content": "x"}],
        "extra_fields_ignored": [{"role": "assistant", "content": "x", "id": "m1", "status": "ok"}],
        # content parts
        "content_list_strings": [{"role": "assistant", "content": ["a", "", "b"]}],
        "content_text_types": [
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "t"},
                    {"type": "output_text", "text": "o", "annotations": []},
                    {"type": "input_text", "text": "i"},
                    {"text": "untyped"},
                    {"type": None, "text": "null type"},
                    {"type": "", "text": "empty type"},
                ],
            }
        ],
        "content_empty_texts_skipped": [
            {"role": "assistant", "content": [{"type": "text", "text": ""}, {"text": ""}]}
        ],
        "content_text_block_non_string_text": [
            {"role": "assistant", "content": [{"type": "text", "text": 5}]}
        ],
        "content_text_block_missing_text": [{"role": "assistant", "content": [{"type": "text"}]}],
        "content_other_type_with_text": [
            {"role": "assistant", "content": [{"type": "refusal", "text": "no", "refusal": "no"}]}
        ],
        "content_image_block": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "input_image",
                        "image_url": "data:image/png;base64,AAAA",
                        "detail": "low",
                    }
                ],
            }
        ],
        "content_thinking_block": [
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "text", "text": "answer"},
                ],
            }
        ],
        "content_non_string_type": [{"role": "assistant", "content": [{"type": 5, "x": 1}]}],
        "content_bool_type": [{"role": "assistant", "content": [{"type": True}]}],
        "content_block_floats_and_unicode": [
            {
                "role": "user",
                "content": [{"type": "data", "value": 0.1 + 0.2, "big": 1e300, "label": "ça"}],
            }
        ],
        "content_block_nan": [{"role": "user", "content": [{"type": "data", "v": float("nan")}]}],
        "unicode_text": [
            {"role": "user", "content": "naïve café 日本語 😀"},
            {"role": "assistant", "content": "ok ✓"},
        ],
        # tool calls: Chat tool_calls
        "chat_tool_calls": [
            USER,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "add", "arguments": '{"b": 2, "a": 1}'},
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "mul", "arguments": '{"a":1,"b":2}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "3"},
            {"role": "tool", "tool_call_id": "call_2", "content": "2"},
        ],
        "chat_tool_call_reserialized_arguments": [
            USER,
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "call_1", "function": {"name": "add", "arguments": '{"a":1,"b":2}'}}
                ],
            },
        ],
        "chat_tool_call_dict_arguments": [
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "call_1", "function": {"name": "add", "arguments": {"a": 1}}}
                ],
            }
        ],
        "chat_tool_call_missing_function": [{"role": "assistant", "tool_calls": [{"id": "c"}]}],
        "chat_tool_call_null_function": [
            {"role": "assistant", "tool_calls": [{"id": "c", "function": None}]}
        ],
        "chat_tool_call_null_name": [
            {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": None}}]}
        ],
        "chat_tool_call_missing_id": [
            {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}
        ],
        "chat_tool_call_numeric_id": [
            {"role": "assistant", "tool_calls": [{"id": 17, "function": {"name": "f"}}]}
        ],
        "chat_tool_calls_empty_list": [{"role": "assistant", "content": "x", "tool_calls": []}],
        "chat_tool_calls_null": [{"role": "assistant", "content": "x", "tool_calls": None}],
        "chat_tool_calls_empty_string": [{"role": "assistant", "content": "x", "tool_calls": ""}],
        "chat_tool_calls_null_element": [{"role": "assistant", "tool_calls": [None]}],
        "chat_tool_calls_empty_object_element": [{"role": "assistant", "tool_calls": [{}]}],
        "chat_tool_calls_falsy_elements": [{"role": "assistant", "tool_calls": [0, "", [], False]}],
        "chat_tool_calls_object_with_empty_key": [{"role": "assistant", "tool_calls": {"": 1}}],
        "chat_tool_calls_string_element": [{"role": "assistant", "tool_calls": ["x"]}],
        "chat_tool_calls_string": [{"role": "assistant", "tool_calls": "abc"}],
        "chat_tool_calls_number": [{"role": "assistant", "tool_calls": 5}],
        "chat_tool_calls_object": [{"role": "assistant", "tool_calls": {"a": 1}}],
        "chat_tool_call_function_string": [
            {"role": "assistant", "tool_calls": [{"id": "c", "function": "f"}]}
        ],
        "chat_tool_calls_on_user_item": [{"role": "user", "tool_calls": [{"id": "c"}]}],
        "chat_tool_message_string": [{"role": "tool", "tool_call_id": "c1", "content": "out"}],
        "chat_tool_message_no_id": [{"role": "tool", "content": "out"}],
        "chat_tool_message_null_content": [{"role": "tool", "tool_call_id": "c1", "content": None}],
        "chat_tool_message_list_content": [
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "out"}]}
        ],
        "chat_tool_message_object_content": [
            {"role": "tool", "tool_call_id": "c1", "content": {"a": 1}}
        ],
        # Responses items
        "responses_transcript": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "t"}]},
            CALL,
            CALL_OUTPUT,
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "6", "annotations": []}],
            },
        ],
        "function_call_id_fallback": [{"type": "function_call", "id": "fc_1", "name": "f"}],
        "function_call_no_ids": [{"type": "function_call", "name": "f", "arguments": "{}"}],
        "function_call_call_id_wins": [
            {"type": "function_call", "call_id": "call_9", "id": "fc_9", "name": "f"}
        ],
        "function_call_missing_name": [{"type": "function_call", "call_id": "c"}],
        "function_call_null_name": [{"type": "function_call", "call_id": "c", "name": None}],
        "function_call_namespace": [
            {"type": "function_call", "call_id": "c", "name": "search", "namespace": "web"}
        ],
        "function_call_empty_namespace": [
            {"type": "function_call", "call_id": "c", "name": "search", "namespace": ""}
        ],
        "function_call_null_namespace": [
            {"type": "function_call", "call_id": "c", "name": "search", "namespace": None}
        ],
        "function_call_numeric_namespace": [
            {"type": "function_call", "call_id": "c", "name": "search", "namespace": 3}
        ],
        "function_call_with_content": [
            {"type": "function_call", "call_id": "c", "name": "f", "content": "odd"}
        ],
        "function_call_output_object": [
            {"type": "function_call_output", "call_id": "c", "output": {"b": 1, "a": 2}}
        ],
        "function_call_output_null": [{"type": "function_call_output", "call_id": "c"}],
        "function_call_output_list": [
            {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text"}]}
        ],
        "function_call_output_id_fallback": [
            {"type": "function_call_output", "id": "fco_1", "output": "x"}
        ],
        "function_call_output_with_tool_role": [
            {"type": "function_call_output", "role": "tool", "call_id": "c", "output": "x"}
        ],
        # Anthropic blocks
        "anthropic_tool_use": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "weather",
                        "input": {"city": "Oslo"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "cold"}],
            },
        ],
        "anthropic_tool_use_null_input": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f"}]}
        ],
        "anthropic_tool_use_string_input": [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "f", "input": '{"x": 1}'}],
            }
        ],
        "anthropic_tool_use_null_name": [
            {"role": "assistant", "content": [{"type": "tool_use", "name": None}]}
        ],
        "anthropic_tool_result_id_fallback": [
            {"role": "user", "content": [{"type": "tool_result", "id": "t2", "content": "x"}]}
        ],
        "anthropic_tool_result_list_content": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t",
                        "content": [{"type": "text", "text": "x"}],
                    }
                ],
            }
        ],
        "anthropic_tool_result_null_content": [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}
        ],
        "tool_message_with_tool_result_blocks": [
            {
                "role": "tool",
                "tool_call_id": "c",
                "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}],
            }
        ],
        "all_tool_call_kinds_on_one_item": [
            {
                "type": "function_call",
                "role": "assistant",
                "call_id": "c0",
                "name": "f0",
                "arguments": "{}",
                "content": [{"type": "tool_use", "id": "t1", "name": "f1", "input": {}}],
                "tool_calls": [{"id": "c2", "function": {"name": "f2", "arguments": "{}"}}],
            }
        ],
        # invalid inputs
        "item_string": ["hello"],
        "item_null": [None],
        "item_list": [[{"role": "user"}]],
        "item_number": [3],
        "content_object": [{"role": "user", "content": {"text": "x"}}],
        "content_number": [{"role": "user", "content": 5}],
        "content_zero": [{"role": "user", "content": 0}],
        "content_false": [{"role": "user", "content": False}],
        "content_list_number_element": [{"role": "user", "content": [5]}],
        "content_list_null_element": [{"role": "user", "content": [None]}],
        "content_list_nested_list": [{"role": "user", "content": [["x"]]}],
        "content_block_without_type_or_text": [{"role": "user", "content": [{"image_url": "u"}]}],
        "content_block_without_type_non_string_text": [{"role": "user", "content": [{"text": 5}]}],
        "invalid_content_on_user_only": [{"role": "user", "content": 5}, ASSISTANT_1],
        "lone_surrogate_text": [{"role": "assistant", "content": "\ud800"}],
        "lone_surrogate_in_block": [{"role": "user", "content": [{"type": "x", "v": "\udc00"}]}],
        "big_int_in_block": [{"role": "user", "content": [{"type": "x", "v": 2**64}]}],
        "u64_max_in_block": [{"role": "user", "content": [{"type": "x", "v": 2**64 - 1}]}],
    }
    for name, value in ARGUMENT_VALUES.items():
        cases[f"arguments_{name}"] = [
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": value}
        ]
    return cases


def fingerprint_cases(ref: Reference) -> dict[str, Any]:
    fp = ref.fingerprint
    argument_cases = []
    for name, value in ARGUMENT_VALUES.items():
        result = outcome(partial(fp.canonicalize_tool_arguments, value))
        argument_cases.append({"name": name, "value": value, **_our_error(result)})
    item_cases = []
    for name, items in fingerprint_item_cases().items():
        assistant = outcome(partial(fp.assistant_fingerprint, items))
        context = outcome(partial(fp.conversation_digest, items))
        item_cases.append(
            {
                "name": name,
                "items": items,
                "assistant_fingerprint": _our_error(assistant),
                "conversation_digest": _our_error(context),
            }
        )
    return {
        "fingerprint_version": fp.FINGERPRINT_VERSION,
        "about": "value = the reference's answer; error = the input is invalid (our "
        "FingerprintError); reference_error = the exception the reference raised.",
        "canonical_arguments": argument_cases,
        "items": item_cases,
    }


def _our_error(result: dict[str, Any]) -> dict[str, Any]:
    """Every reference exception is an invalid input for us (one FingerprintError)."""
    if "error" not in result:
        return result
    return {"error": "FingerprintError", "reference_error": result["error"]}


# --------------------------------------------------------------------------- terminal


def reference_attribution(ref: Reference, entries: list[dict[str, Any]], record: Json) -> Json:
    """Attribution as NeMo Gym's delivery + consumer run it, in metric form."""
    explicit = record.get(ref.delivery.TERMINAL_CALL_KEY)
    declared = record.get(ref.delivery.TERMINAL_RESPONSE_ID_KEY)
    response = record.get("response") if isinstance(record.get("response"), dict) else {}
    try:
        result = ref.terminal.resolve_terminal(
            [ref.entry(entry) for entry in entries],
            response or None,
            str(explicit) if explicit else None,
            declared_response_id=str(declared) if declared else None,
        )
        method, call_id, reason = result.method, result.model_call_id, result.reason
    except Exception:
        method, call_id, reason = "", None, "attribution_error"
    return {
        "method": method or "none",
        "call_id": call_id,
        "reason": reason,
        "declared": bool(declared),
    }


def terminal_scenarios(ref: Reference) -> list[dict[str, Any]]:
    """Each scenario: name, entries, record, and optionally ``ours`` + ``note``."""
    w = Writer(ref)
    req1 = [SYSTEM, USER]
    out1 = [ASSISTANT_1]
    req2 = [SYSTEM, USER, ASSISTANT_1, USER_2]
    out2 = [ASSISTANT_2]
    c1 = w.call("c1", [1, 2], [3], request=req1, output=out1, response_id="resp-1")
    c2 = w.call(
        "c2", [1, 2, 3, 4], [5], request=req2, output=out2, parent="c1", response_id="resp-2"
    )
    chain = [c1, c2]
    full = req2 + out2  # a full transcript response
    aux = w.call(
        "aux", [9], [8], output=[{"role": "assistant", "content": "title"}], response_id="resp-x"
    )
    # an identical retry of c2: same tokens, same digest and cum_len
    c2_twin = {**c2, "model_call_id": "c2-twin", "response_id": "resp-2b"}
    # a different retry of c2 with the same output text
    c2_other = w.call("c2-other", [1, 2, 3, 4], [6], request=req2, output=out2, parent="c1")
    # pre-lineage entries: no digest, no fingerprints
    p1 = plain("p1", [1, 2], [3], output_items=out1)
    p2 = plain("p2", [1, 2, 3, 4], [5], output_items=out2)

    def response(output: Json = None, **fields: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"object": "response", **fields}
        if output is not None:
            body["output"] = output
        return body

    bad_call_output = [{"role": "assistant", "tool_calls": ["x"]}]
    return [
        {"name": "nothing_given", "entries": chain, "record": {}},
        {
            "name": "explicit_alone",
            "entries": chain,
            "record": {"_ng_terminal_model_call_id": "c1"},
        },
        {
            "name": "explicit_not_captured",
            "entries": chain,
            "record": {"_ng_terminal_model_call_id": "c9"},
        },
        {
            "name": "explicit_falsy_zero",
            "entries": chain,
            "record": {"_ng_terminal_model_call_id": 0},
        },
        {
            "name": "explicit_falsy_empty",
            "entries": chain,
            "record": {"_ng_terminal_model_call_id": ""},
        },
        {
            "name": "explicit_non_string_value",
            "entries": [plain("7", [1], [2])],
            "record": {"_ng_terminal_model_call_id": 7},
        },
        {
            "name": "explicit_duplicate_id_uses_last_copy",
            "entries": [
                plain("d", [1], [2], response_id="rd"),
                plain("d", [1], [3]),
                plain("e", [1], [3], response_id="re"),
            ],
            "record": {"_ng_terminal_model_call_id": "d", "response": {"id": "re"}},
        },
        {"name": "declared_alone", "entries": chain, "record": {"terminal_response_id": "resp-2"}},
        {
            "name": "declared_not_captured",
            "entries": chain,
            "record": {"terminal_response_id": "resp-9", "response": response(full, id="resp-2")},
        },
        {
            "name": "declared_ambiguous",
            "entries": [c1, c2, {**c2_other, "response_id": "resp-2"}],
            "record": {"terminal_response_id": "resp-2"},
        },
        {
            "name": "declared_collapses_identical_retries",
            "entries": [c1, {**c2_twin, "response_id": "resp-2"}, c2],
            "record": {"terminal_response_id": "resp-2"},
        },
        {
            "name": "declared_falsy_false",
            "entries": chain,
            "record": {"terminal_response_id": False, "response": response(id="resp-1")},
        },
        {
            "name": "explicit_missing_then_declared_missing",
            "entries": chain,
            "record": {"_ng_terminal_model_call_id": "c9", "terminal_response_id": "resp-9"},
        },
        {
            "name": "response_id_alone",
            "entries": chain,
            "record": {"response": response(id="resp-1")},
        },
        {"name": "response_without_id", "entries": chain, "record": {"response": response()}},
        {
            "name": "response_id_no_match",
            "entries": chain,
            "record": {"response": response(id="resp-404")},
        },
        {
            "name": "response_id_ambiguous",
            "entries": [c1, c2, {**c2_other, "response_id": "resp-2"}],
            "record": {"response": response(id="resp-2")},
        },
        {
            "name": "response_id_collapses_pre_lineage_twins",
            "entries": [
                {**p2, "response_id": "same"},
                {**p2, "model_call_id": "p0", "response_id": "same"},
            ],
            "record": {"response": response(id="same")},
        },
        {
            "name": "response_id_numeric",
            "entries": [plain("n", [1], [2], response_id="42")],
            "record": {"response": response(id=42)},
        },
        {"name": "empty_response_object", "entries": chain, "record": {"response": {}}},
        {"name": "response_not_object", "entries": chain, "record": {"response": "text"}},
        {
            "name": "content_output_final_turn",
            "entries": [p1, p2],
            "record": {"response": response(out2)},
        },
        {
            "name": "content_cumulative_full_transcript",
            "entries": chain,
            "record": {"response": response(full)},
        },
        {
            "name": "content_tail_of_merged_transcript",
            "entries": [p1, p2],
            "record": {"response": response(full)},
        },
        {
            "name": "content_transcript_ending_in_user_item",
            "entries": [p1, p2],
            "record": {"response": response([*full, USER])},
        },
        {
            "name": "content_all_model_items_no_tail",
            "entries": [p1, p2],
            "record": {"response": response([ASSISTANT_1, ASSISTANT_2])},
        },
        {
            "name": "content_ambiguous",
            "entries": [p1, p2, {**p2, "model_call_id": "p3", "generation_token_ids": [6]}],
            "record": {"response": response(out2)},
        },
        {
            "name": "content_identical_retries_collapse",
            "entries": [p1, p2, {**p2, "model_call_id": "p0"}],
            "record": {"response": response(out2)},
        },
        {
            "name": "content_no_match",
            "entries": chain,
            "record": {"response": response([{"role": "assistant", "content": "5"}])},
        },
        {
            "name": "content_no_model_authored_output",
            "entries": chain,
            "record": {"response": response([USER])},
        },
        {
            "name": "content_output_missing",
            "entries": chain,
            "record": {"response": response(id="")},
        },
        {"name": "content_output_empty", "entries": chain, "record": {"response": response([])}},
        {
            "name": "content_output_not_list",
            "entries": chain,
            "record": {"response": response({"a": 1})},
        },
        {
            "name": "content_output_without_objects",
            "entries": chain,
            "record": {"response": response(["text", 3])},
            "ours": {
                "method": "none",
                "call_id": None,
                "declared": False,
                "reason": "response_has_no_id,response_has_no_output",
            },
            "note": "our rules: a list with no object item is response_has_no_output (the "
            "reference fingerprints the empty list and says no_model_authored_output).",
        },
        {
            "name": "content_non_object_items_ignored",
            "entries": [p1, p2],
            "record": {"response": response(["junk", *out2, 5])},
        },
        {
            "name": "content_unfingerprintable_output",
            "entries": chain,
            "record": {"response": response([{"role": "assistant", "content": 5}])},
        },
        {
            "name": "content_unfingerprintable_output_tool_calls",
            "entries": chain,
            "record": {"response": response(bad_call_output, id="resp-2")},
            "ours": {
                "method": "response_id",
                "call_id": "c2",
                "declared": False,
                "reason": "response_output_unfingerprintable",
            },
            "note": "The reference's fingerprint raises AttributeError here, which it does not "
            "catch (attribution_error); our attribution rules: any fingerprint failure is "
            "response_output_unfingerprintable and the other witnesses still speak.",
        },
        {
            "name": "content_entry_unfingerprintable_skipped",
            "entries": [{**p1, "output_items": [{"role": "assistant", "content": 5}]}, p2],
            "record": {"response": response(out2)},
        },
        {
            "name": "content_entry_unfingerprintable_tool_calls_skipped",
            "entries": [{**p1, "output_items": bad_call_output}, p2],
            "record": {"response": response(out2)},
            "ours": {
                "method": "content_output",
                "call_id": "p2",
                "declared": False,
                "reason": "response_has_no_id",
            },
            "note": "The reference raises AttributeError on this entry's items "
            "(attribution_error); our attribution rules skips an entry whose items cannot be "
            "fingerprinted.",
        },
        {
            "name": "content_stale_fingerprint_version",
            "entries": [
                {**c1, "fingerprint_version": 1},
                {**c2, "fingerprint_version": 1, "output_items": []},
            ],
            "record": {"response": response(full)},
        },
        {
            "name": "content_null_fingerprint_version",
            "entries": [c1, {**c2, "fingerprint_version": None, "output_items": []}],
            "record": {"response": response(full)},
        },
        {
            "name": "content_cumulative_and_output_pool",
            "entries": [c1, {**c2, "continuation_fingerprint": ""}, aux],
            "record": {"response": response(out1)},
        },
        {
            "name": "content_readings_pool_before_ambiguity",
            "entries": [c1, p1],
            "record": {"response": response(out1)},
        },
        {
            "name": "corroborated_all_witnesses",
            "entries": chain,
            "record": {
                "_ng_terminal_model_call_id": "c2",
                "terminal_response_id": "resp-2",
                "response": response(full, id="resp-2"),
            },
        },
        {
            "name": "corroborated_by_identical_twin",
            "entries": [c1, c2, c2_twin],
            "record": {"_ng_terminal_model_call_id": "c2-twin", "response": response(id="resp-2")},
        },
        {
            "name": "disagreement_explicit_vs_response_id",
            "entries": chain,
            "record": {"_ng_terminal_model_call_id": "c1", "response": response(out2, id="resp-2")},
        },
        {
            "name": "disagreement_digest_vs_plain_same_tokens",
            "entries": [c2, {**p2, "response_id": "resp-p"}],
            "record": {"_ng_terminal_model_call_id": "c2", "response": response(id="resp-p")},
        },
        {
            "name": "abstentions_kept_on_success",
            "entries": chain,
            "record": {
                "_ng_terminal_model_call_id": "c9",
                "response": response(out2, id="resp-404"),
            },
        },
        {
            "name": "content_witness_with_aux_call",
            "entries": [c1, aux, c2],
            "record": {"response": response(full, id="resp-2")},
        },
    ]


def terminal_cases(ref: Reference) -> dict[str, Any]:
    cases = []
    for scenario in terminal_scenarios(ref):
        reference = reference_attribution(ref, scenario["entries"], scenario["record"])
        case = {
            "name": scenario["name"],
            "entries": scenario["entries"],
            "record": scenario["record"],
            "expected": scenario.get("ours", reference),
        }
        if "ours" in scenario:
            if scenario["ours"] == reference:
                raise SystemExit(f"{scenario['name']}: the noted difference is gone")
            case["reference"] = reference
            case["note"] = scenario["note"]
        cases.append(case)
    return {"cases": cases}


# --------------------------------------------------------------------------- resolution


def _resolution_answer(result: Any) -> Json:
    """A reference resolution result as the vectors store it: status, reason, match."""
    match = result.match
    return {
        "status": result.status.value,
        "reason": result.reason,
        "match": None
        if match is None
        else {
            "model_call_id": match.model_call_id,
            "cumulative_token_ids": list(match.cumulative_token_ids),
            "digest": match.digest,
            "prev_len": match.prev_len,
        },
    }


def reference_resolution(
    ref: Reference, entries: list[dict[str, Any]], items: Json
) -> dict[str, Any]:
    """Resolve as a 0.7 model server does: root check, then its file lineage store."""
    try:
        if not ref.fingerprint.assistant_fingerprint(items):
            return {"status": "root", "reason": "", "match": None}
    except Exception:
        return {"status": "unresolved", "reason": "lookup_error", "match": None}
    with tempfile.TemporaryDirectory() as root:
        store = ref.store.TokenCaptureStore(root)
        for entry in entries:
            store.append(ref.entry(entry))
        resolver = ref.lineage.FileLineageStore(root)
        try:
            result = asyncio.run(resolver.resolve(ROLLOUT, items))
        except Exception:
            return {"status": "unresolved", "reason": "lookup_error", "match": None}
    return _resolution_answer(result)


def resolution_scenarios(ref: Reference) -> list[dict[str, Any]]:
    w = Writer(ref)
    req1 = [SYSTEM, USER]
    req2 = [SYSTEM, USER, ASSISTANT_1, USER_2]
    req3 = [*req2, ASSISTANT_2, {"role": "user", "content": "Thanks"}]
    c1 = w.call("c1", [1, 2], [3], request=req1, output=[ASSISTANT_1])
    c2 = w.call("c2", [1, 2, 3, 4], [5], request=req2, output=[ASSISTANT_2], parent="c1")
    # The same conversation stored with delta prompts.
    d1 = w.call("d1", [1, 2], [3], request=req1, output=[ASSISTANT_1])
    d2 = w.call("d2", [4], [5], request=req2, output=[ASSISTANT_2], parent="d1", delta=True)
    d3_request = [*req3]
    d3 = w.call("d3", [6, 7], [8, 9], request=d3_request, output=[CALL], parent="d2", delta=True)
    after_d3 = [*d3_request, CALL, CALL_OUTPUT]
    twin = {**c1, "model_call_id": "c0"}
    other = w.call("c1-retry", [1, 2], [7], request=req1, output=[ASSISTANT_1])
    unstamped_d1 = {**d1, "continuation_fingerprint": ""}
    invalid_user = {"role": "user", "content": 5}

    return [
        {"name": "root_without_items", "entries": [c1], "items": []},
        {"name": "root_user_only", "entries": [c1], "items": req1},
        {"name": "root_with_invalid_user_item", "entries": [c1], "items": [invalid_user]},
        {"name": "resolved_first_call", "entries": [c1], "items": req2},
        {"name": "resolved_second_call", "entries": [c1, c2], "items": req3},
        {"name": "resolved_commit_order_irrelevant", "entries": [c2, c1], "items": req3},
        {"name": "no_match_empty_rollout", "entries": [], "items": req2},
        {
            "name": "no_match_different_answer",
            "entries": [c1],
            "items": [SYSTEM, USER, ASSISTANT_2, USER_2],
        },
        {
            "name": "no_match_context_rewritten",
            "entries": [c1],
            "items": [SYSTEM, {"role": "user", "content": "What is 2 + 2?"}, ASSISTANT_1],
        },
        {"name": "no_match_request_shorter_than_context", "entries": [c1], "items": [ASSISTANT_1]},
        {
            "name": "no_match_without_context_digest",
            "entries": [{**c1, "continuation_context_digest": ""}],
            "items": req2,
        },
        {
            "name": "no_match_stale_fingerprint_version",
            "entries": [{**c1, "fingerprint_version": 1}],
            "items": req2,
        },
        {
            "name": "resolved_null_fingerprint_version",
            "entries": [{k: v for k, v in c1.items() if k != "fingerprint_version"}],
            "items": req2,
        },
        {"name": "ambiguous_different_retries", "entries": [c1, other], "items": req2},
        {"name": "identical_retries_collapse_to_smallest_id", "entries": [c1, twin], "items": req2},
        {
            "name": "ambiguous_same_tokens_one_without_digest",
            "entries": [c1, {**twin, "digest": None, "cum_len": None}],
            "items": req2,
        },
        {
            "name": "ambiguous_same_tokens_no_digests",
            "entries": [{**c1, "digest": None}, {**twin, "digest": None}],
            "items": req2,
        },
        {
            "name": "only_one_candidate_has_matching_context",
            "entries": [c1, {**other, "continuation_context_digest": "0" * 64}],
            "items": req2,
        },
        {"name": "delta_chain_materialized", "entries": [d1, d2, d3], "items": after_d3},
        {"name": "delta_chain_one_step", "entries": [d1, d2], "items": req3},
        {"name": "delta_missing_parent", "entries": [d2, d3], "items": after_d3},
        {
            "name": "delta_wrong_digest",
            "entries": [d1, d2, {**d3, "digest": "0" * 64}],
            "items": after_d3,
        },
        {
            "name": "delta_cycle",
            "entries": [
                {**d2, "parent_call_id": "d3"},
                {**d3, "parent_call_id": "d2"},
            ],
            "items": after_d3,
        },
        {
            "name": "delta_parent_without_fingerprint",
            "entries": [unstamped_d1, d2],
            "items": req3,
            "ours": "materialize",
            "note": "The reference's file store only indexes fingerprinted entries, so a delta "
            "whose parent has no continuation fingerprint cannot be rebuilt (lookup_error); "
            "we walk parents over every committed entry.",
        },
        {
            "name": "digest_mismatch_full_prompt",
            "entries": [{**c1, "digest": "f" * 64}],
            "items": req2,
        },
        {
            "name": "cum_len_disagrees_with_tokens",
            "entries": [{**c1, "cum_len": 2}],
            "items": req2,
            "ours": {"status": "unresolved", "reason": "lookup_error", "match": None},
            "note": "We refuse a match whose cum_len is not its sequence length (a child "
            "would cut its prompt at a wrong prev_len); the reference resolves it.",
        },
        {
            "name": "delta_without_cum_len_elsewhere_in_rollout",
            "entries": [
                c1,
                {**d1, "model_call_id": "x1"},
                {**d2, "model_call_id": "x2", "parent_call_id": "x1", "cum_len": None},
            ],
            "items": req2,
            "ours": "materialize",
            "note": "The reference cannot index a delta entry without cum_len and fails every "
            "lookup of the rollout; we only need the length of a candidate.",
        },
        {
            "name": "unfingerprintable_assistant_item",
            "entries": [c1],
            "items": [SYSTEM, USER, {"role": "assistant", "content": 5}],
        },
        {
            "name": "invalid_item_after_matched_context",
            "entries": [c1],
            "items": [SYSTEM, USER, ASSISTANT_1, invalid_user],
            "ours": {"status": "unresolved", "reason": "lookup_error", "match": None},
            "note": "The wire form carries the digest of every prefix, so an item that cannot "
            "be digested fails the lookup; the reference only digests the candidate's "
            "context prefix and resolves.",
        },
    ]


def resolution_cases(ref: Reference) -> dict[str, Any]:
    fp = ref.fingerprint
    cases = []
    for scenario in resolution_scenarios(ref):
        entries, items = scenario["entries"], scenario["items"]
        reference = reference_resolution(ref, entries, items)
        expected: Any = scenario.get("ours", reference)
        if expected == "materialize":
            expected = _our_materialized(ref, entries, items)
        elif expected is reference and reference["match"] is not None:
            # our resolution rules: prev_len is cum_len everywhere (the file store answers 0).
            expected = {**reference, "match": {**reference["match"]}}
            match_entry = next(
                e for e in entries if e["model_call_id"] == reference["match"]["model_call_id"]
            )
            expected["match"]["prev_len"] = match_entry.get("cum_len") or len(
                reference["match"]["cumulative_token_ids"]
            )
        case: dict[str, Any] = {
            "name": scenario["name"],
            "entries": entries,
            "request_items": items,
        }
        try:
            case["request"] = {
                "fingerprint_version": fp.FINGERPRINT_VERSION,
                "fingerprint": fp.assistant_fingerprint(items),
                "context_digests": [
                    fp.conversation_digest(items[:k]) for k in range(len(items) + 1)
                ],
            }
        except Exception:
            case["request"] = None
        case["expected"] = expected
        if expected != reference:
            case["reference"] = reference
            case["note"] = scenario.get(
                "note",
                "prev_len: our rules answer cum_len everywhere (the file store answers 0).",
            )
        cases.append(case)
    return {"cases": cases}


def _our_materialized(ref: Reference, entries: list[dict[str, Any]], items: Json) -> Json:
    """Resolve through the in-memory reference index (tokens given whole), for noted cases."""
    lineage = ref.lineage.RolloutLineage()
    by_id = {entry["model_call_id"]: entry for entry in entries}
    for entry in entries:
        if not entry.get("continuation_fingerprint"):
            continue
        full = _full_entry(entry, by_id)
        lineage.add_entry(ref.entry(full))
    result = lineage.resolve(items)
    return _resolution_answer(result)


def _full_entry(entry: dict[str, Any], by_id: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The entry with its delta prompt replaced by the full prompt."""
    if not entry.get("prompt_is_delta"):
        return entry
    parent = _full_entry(by_id[entry["parent_call_id"]], by_id)
    prompt = parent["prompt_token_ids"] + parent["generation_token_ids"] + entry["prompt_token_ids"]
    full = {**entry, "prompt_token_ids": prompt, "prompt_is_delta": False}
    if full.get("cum_len") is None:
        full["cum_len"] = len(prompt) + len(entry["generation_token_ids"])
    return full


# --------------------------------------------------------------------------- builder


def builder_scenarios(ref: Reference) -> list[dict[str, Any]]:
    w = Writer(ref)
    req1 = [SYSTEM, USER]
    req2 = [SYSTEM, USER, ASSISTANT_1, USER_2]
    req3 = [*req2, ASSISTANT_2, {"role": "user", "content": "Thanks"}]
    a1 = w.call("a1", [1, 2], [3], request=req1, output=[ASSISTANT_1], response_id="ra1")
    a2 = w.call(
        "a2", [1, 2, 3, 4], [5], request=req2, output=[ASSISTANT_2], parent="a1", response_id="ra2"
    )
    a3 = w.call(
        "a3",
        [1, 2, 3, 4, 5, 6],
        [7, 8],
        request=req3,
        output=[CALL],
        parent="a2",
        response_id="ra3",
    )
    linear = [a1, a2, a3]
    d2 = w.call(
        "d2",
        [4],
        [5],
        request=req2,
        output=[ASSISTANT_2],
        parent="a1",
        delta=True,
        response_id="rd2",
    )
    d3 = w.call(
        "d3", [6], [7, 8], request=req3, output=[CALL], parent="d2", delta=True, response_id="rd3"
    )
    a3_retry = w.call(
        "a3-retry",
        [1, 2, 3, 4, 5, 6],
        [9],
        request=req3,
        output=[CALL],
        parent="a2",
        response_id="ra3r",
    )
    side = w.call(
        "side",
        [50, 51],
        [52],
        output=[{"role": "assistant", "content": "t"}],
        response_id="rside",
        created_at=0.5,
    )
    after = w.call("a4", [1, 2, 3, 4, 5, 6, 7, 8, 10], [11], parent="a3", response_id="ra4")
    empty = w.call("e1", [1, 2], [], request=req1, output=[], response_id="re1")
    child_of_empty = w.call("e2", [1, 2, 3, 20], [21], parent="e1", response_id="re2")
    unresolved = w.call("u2", [1, 2, 3, 4], [5], resolution="unresolved", response_id="ru2")
    unresolved_chain = [a1, unresolved]
    late = w.call("z9", [1, 2, 3, 4, 5, 6, 7], [8], parent="a1")

    return [
        {
            "name": "linear_attributed_by_response_id",
            "entries": linear,
            "record": {"response": {"id": "ra3", "output": [CALL]}},
        },
        {"name": "linear_unattributed", "entries": linear, "record": {}},
        {"name": "delta_chain", "entries": [a1, d2, d3], "record": {"response": {"id": "rd3"}}},
        {"name": "delta_missing_parent", "entries": [d2, d3, a3], "record": {}},
        {
            "name": "delta_wrong_digest",
            "entries": [a1, d2, {**d3, "digest": "0" * 64}],
            "record": {},
        },
        {"name": "delta_cycle", "entries": [a1, {**d2, "parent_call_id": "d3"}, d3], "record": {}},
        {"name": "duplicate_same_payload_dropped", "entries": [a1, a2, a2, a3], "record": {}},
        {
            "name": "duplicate_conflict",
            "entries": [a1, a2, {**a2, "generation_token_ids": [6]}, a3],
            "record": {},
        },
        {"name": "parent_unresolved_boundary", "entries": unresolved_chain, "record": {}},
        {
            "name": "parent_digest_mismatch",
            "entries": [a1, {**a2, "prompt_token_ids": [1, 9, 3, 4]}],
            "record": {},
        },
        {
            "name": "parent_missing_recovered_by_prefix",
            "entries": [a1, a2, {**a3, "parent_call_id": "gone"}],
            "record": {},
        },
        {
            "name": "parent_missing_no_prefix",
            "entries": [{**a2, "parent_call_id": "gone"}],
            "record": {},
        },
        {
            "name": "parent_named_but_processed_later",
            "entries": [a1, {**a2, "parent_call_id": "z9"}, late],
            "record": {},
        },
        {
            "name": "bogus_claim_while_prefix_recovery_active",
            "entries": [a1, {**a2, "parent_call_id": "z9"}, late, {**a3, "parent_call_id": "gone"}],
            "record": {},
            "note": "our lineage rules, step 4: a kept parent not yet processed is always a "
            "boundary (parent_call_id_missing); the reference runs prefix recovery for it "
            "whenever some other entry's parent is absent (then: _recovered).",
        },
        {
            "name": "parent_empty_generation_recovered",
            "entries": [empty, child_of_empty, a1],
            "record": {},
        },
        {
            "name": "missing_resolution_in_lineage_snapshot",
            "entries": [a1, plain("m2", [1, 2, 3, 4], [5])],
            "record": {},
        },
        {
            "name": "empty_parent_id_without_resolution",
            "entries": [a1, {**a2, "parent_resolution": None, "parent_call_id": ""}],
            "record": {},
            "note": "our lineage rules step 4 calls an empty parent id a boundary "
            "(resolved_parent_missing_id); the reference treats it as a missing parent and "
            "tries prefix recovery.",
        },
        {
            "name": "final_retry_resolved_by_terminal",
            "entries": [*linear, a3_retry],
            "record": {"response": {"id": "ra3r"}},
        },
        {"name": "final_retry_unattributed", "entries": [*linear, a3_retry], "record": {}},
        {
            "name": "terminal_chain_broken",
            "entries": unresolved_chain,
            "record": {"response": {"id": "ru2"}},
        },
        {
            "name": "terminal_not_captured_empty_generation",
            "entries": [empty, a1],
            "record": {"_ng_terminal_model_call_id": "e1"},
        },
        {
            "name": "terminal_truncates_later_calls",
            "entries": [*linear, after],
            "record": {"response": {"id": "ra3"}},
        },
        {
            "name": "side_call_dropped_with_terminal",
            "entries": [*linear, side],
            "record": {"response": {"id": "ra3"}},
        },
        {"name": "side_call_masks_without_terminal", "entries": [*linear, side], "record": {}},
        {
            "name": "declared_ambiguous_masks",
            "entries": [*linear, {**a3_retry, "response_id": "ra3"}],
            "record": {"terminal_response_id": "ra3"},
        },
        {
            "name": "declared_not_captured_masks",
            "entries": linear,
            "record": {"terminal_response_id": "nope"},
        },
        {"name": "only_empty_generations", "entries": [empty], "record": {}},
        {
            "name": "seed_snapshot",
            "entries": [plain("s1", [1, 2], [3]), plain("s2", [1, 2, 3, 4], [5])],
            "record": {},
            "note": "No lineage field: a seed snapshot. The reference masks it as "
            "missing_resolution; our lineage rules builds it by the seed builder's rules instead.",
        },
    ]


def builder_cases(ref: Reference) -> dict[str, Any]:
    cases = []
    for scenario in builder_scenarios(ref):
        entries, record = scenario["entries"], scenario["record"]
        attribution = reference_attribution(ref, entries, record)
        models = [ref.entry(entry) for entry in entries]
        explicit = record.get("_ng_terminal_model_call_id")
        declared = record.get("terminal_response_id")
        response = record.get("response") if isinstance(record.get("response"), dict) else {}
        built = ref.consumer._assemble(
            ROLLOUT,
            models,
            "prefix_merging",
            "",
            verified_response=response or None,
            explicit_terminal_call_id=str(explicit) if explicit else None,
            declared_response_id=str(declared) if declared else None,
        )
        try:
            out = ref.builder.run_builder(models, terminal_call_id=attribution["call_id"])
            chains = [
                {
                    "chain_id": chain.chain_id,
                    "call_ids": [link.entry.model_call_id for link in chain.links],
                }
                for chain in out.chains
            ]
            notes = out.notes
            builder = {
                "chains": chains,
                "main_chain_call_ids": next(
                    (c["call_ids"] for c in chains if c["chain_id"] == "main"), []
                ),
                "quarantined": list(out.quarantined),
                "roots": notes.roots,
                "unresolved_retries": list(notes.unresolved_retries),
                "unresolved_parent_calls": list(notes.unresolved_parent_calls),
                "parent_link_failures": dict(notes.parent_link_failures),
                "empty_generation_calls": list(notes.empty_generation_calls),
                "terminal_chain": notes.terminal_chain,
            }
        except Exception as error:
            builder = {"error": f"{type(error).__name__}: {error}"}
        case = {
            "name": scenario["name"],
            "snapshot_kind": "lineage"
            if any(
                e.get("parent_resolution") is not None or e.get("parent_call_id") is not None
                for e in entries
            )
            else "seed",
            "entries": entries,
            "record": record,
            "reference": {"attribution": attribution, "builder": builder, "build": built},
        }
        if "note" in scenario:
            case["note"] = scenario["note"]
        cases.append(case)
    return {
        "about": "Reference (NeMo Gym 0.7.0) answers, recorded as is: 'builder' is "
        "run_builder's output (chains as call ids, main chain first when a terminal was "
        "delivered), 'build' is consumer._assemble's result. Notes mark where docs/ "
        "expects otherwise.",
        "cases": cases,
    }


# --------------------------------------------------------------------------- main


def write(name: str, payload: Any) -> None:
    path = HERE / name
    path.write_text(json.dumps(payload, indent=1, sort_keys=False) + "\n", encoding="ascii")
    print(f"wrote {path.relative_to(HERE.parents[2])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", type=Path, default=DEFAULT_REFERENCE)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        ref = Reference(args.reference, Path(workdir))
        header = {
            "generated_by": "tests/vectors/nemo_gym_0_7/generate.py",
            "reference": "nemo-gym 0.7.0",
        }
        write("token_digests.json", {**header, **token_digest_cases(ref)})
        write("fingerprints.json", {**header, **fingerprint_cases(ref)})
        write("terminal.json", {**header, **terminal_cases(ref)})
        write("resolution.json", {**header, **resolution_cases(ref)})
        write("builder.json", {**header, **builder_cases(ref)})


if __name__ == "__main__":
    main()
