"""Writes `calls.json`: staged calls as 0.3.0 and 0.4.0 stored them, and what 0.4.0 answered.

Run against the 0.4.0 tree (commit 67854fb), never against a newer one:

    mkdir /tmp/tf-040 && git archive 67854fb | tar -x -C /tmp/tf-040
    PYTHONPATH=/tmp/tf-040/service:/tmp/tf-040/client:/tmp/tf-040 \
        python tests/service/sources/old_staged/generate.py

The file then holds, per call: the file store's 0.3.0 line (columns as lists)
and 0.4.0 line (`columns`: base64 `>u8`/`>f8` images), the Redis store's
0.4.0 values (`staged`: the base JSON; `staged_extras`), and 0.4.0's answers:
the plain and the `?columns=packed` snapshot of each file store line, and the
packed snapshot of a stored base JSON (its plain one is the JSON itself).
docs/staging.md#packed-at-rest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson

from tests.support.staging_stores import Conversation, committed_row
from token_finalizer.core.staging import build_staged_call, staging_key
from token_finalizer.sources._staging import base_json, extras_json, file_line, parse_staged_call
from token_finalizer.store_server._answers import _packed_snapshot, _plain_snapshot

RID = "old-staged"
BIG = [2**32 + 5, 2**63 + 7, 2**64 - 1]


def _calls() -> list[tuple[Any, Any]]:
    """(record, attachments): ids past u32 and u63, log probs f32-exact and not, one token."""
    shapes = [
        ([1, 2, 3, *BIG], [7, 8], [-0.5, -0.25], {"routed_experts": [[1, 2]]}, None),
        ([11, 12], [13, 14, 15], [-0.1, -1 / 3, -2.5e-300], None, {"a": {"json": [1, 2]}}),
        ([], [16], [-0.75], None, {"b": {"bytes": "AAEC"}}),
    ]
    made: list[tuple[Any, Any]] = []
    prompt: list[int] = []
    parent = None
    for index, (carry, generated, log_probs, extras, attachments) in enumerate(shapes):
        prompt = [*prompt, *carry]
        record = build_staged_call(
            rollout_id=RID,
            model_call_id=f"c{index + 1}",
            parent=parent,
            prompt_token_ids=prompt,
            generated_token_ids=generated,
            generated_log_probs=log_probs,
            weight_version=3,
            extras=extras,
        )
        made.append((record, attachments))
        prompt = [*prompt, *generated]
        parent = record
    return made


def _answer(form: Any, line: bytes) -> str:
    """A freeze answer's snapshot, in `form`, of the file store's `line`."""
    return str(form(parse_staged_call(line, "generate")).decode())


def main() -> None:
    calls = []
    chain: list[str] = []
    for record, attachments in _calls():
        chain.append(staging_key(RID, record.model_call_id))
        line_030 = orjson.dumps(
            {"attachments": attachments, "record": record.to_json()}, option=orjson.OPT_SORT_KEYS
        )
        line_040 = file_line(record, attachments)
        base = base_json(record)
        index = len(chain) - 1
        answer = {"role": "assistant", "content": f"answer {index}"}
        request = Conversation(RID).request_items(index)
        row = committed_row(record, request, [answer], staging_chain=list(chain))
        calls.append(
            {
                "record": record.to_json(),
                "attachments": attachments,
                "ledger_row": row,
                "file_line_0_3_0": line_030.decode(),
                "file_line_0_4_0": line_040.decode(),
                "redis_base_0_4_0": base.decode(),
                "redis_rest_0_4_0": extras_json(record, attachments).decode(),
                "file_plain_answer_0_3_0": _answer(_plain_snapshot, line_030),
                "file_plain_answer": _answer(_plain_snapshot, line_040),
                "file_packed_answer_0_3_0": _answer(_packed_snapshot, line_030),
                "file_packed_answer": _answer(_packed_snapshot, line_040),
                "redis_packed_answer": _packed_snapshot(base).decode(),
            }
        )
    out = Path(__file__).with_name("calls.json")
    out.write_text(json.dumps({"rollout_id": RID, "calls": calls}, indent=1) + "\n")


if __name__ == "__main__":
    main()
