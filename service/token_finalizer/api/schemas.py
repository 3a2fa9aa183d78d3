"""OpenAPI descriptions of the request and answer bodies, for /docs only.

Bodies are parsed with orjson and never validated through pydantic: a record
carries millions of token ids, and per-element validation would cost more
than the whole finalize. These schemas only document the shapes.
"""

from __future__ import annotations

from typing import Any

from token_finalizer._constants import MAX_SNAPSHOT_VERSION

__all__ = [
    "ERROR_RESPONSES",
    "FINALIZE_ERROR_RESPONSES",
    "FINALIZE_OPENAPI",
    "READY_RESPONSES",
    "RETIRE_OPENAPI",
]

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string", "description": "What is wrong with the request."}},
}


def _error(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    content = {"application/json": {"schema": schema or _ERROR}}
    return {"description": description, "content": content}


_RECORD = {
    "type": "object",
    "description": (
        "A finished rollout record: `response` in OpenAI Responses shape, `reward`, harness "
        "fields, and the capture key (`_ng_rollout_id`, or `_ng_task_index` + "
        "`_ng_rollout_index` [+ `_ng_attempt_index`])."
    ),
    "additionalProperties": True,
    "example": {
        "_ng_rollout_id": "3-0",
        "reward": 1.0,
        "agent_ref": {"name": "swe_agent"},
        "response": {"output": [{"type": "message", "content": "done"}]},
    },
}

_BUILD = {
    "type": ["object", "null"],
    "description": (
        "What finalize built, without the rebuilt output (it lives in `record`): `builder`, "
        "`metrics`, `mask_sample`, `mask_reason` when masked, `unresolved_retries`, "
        "`unresolved_parent_calls`, `_capture_snapshot` {`snapshot_id`, `version`}, `error` "
        "when the build failed (NeMo Gym's own text wherever Gym defines one) and `hint` when "
        "we have guidance on it. Null when the record's agent does not take part."
    ),
    "properties": {
        "error": {"type": "string", "description": "Why the build failed or is masked."},
        "hint": {
            "type": "string",
            "description": "What to do about `error`; absent when there is nothing to add.",
        },
    },
    "additionalProperties": True,
}

_TOKEN_CAPTURE = {
    "type": "object",
    "description": (
        "The record's `_ng_token_capture`: the build's metrics, plus its `error`, `hint` and "
        "`mask_reason` when it has them."
    ),
    "properties": {
        "error": {"type": "string"},
        "hint": {"type": "string"},
        "mask_reason": {"type": "string"},
    },
    "additionalProperties": True,
}

_RETIRE_TICKET = {
    "type": "object",
    "required": ["rollout_id", "source", "snapshot_id", "version", "ticket"],
    "description": (
        "Permission to retire exactly this snapshot: `ticket` is an HMAC-SHA256 over the other "
        "four fields under `retire.key`, so it cannot be edited or forged."
    ),
    "properties": {
        "rollout_id": {
            "type": "string",
            # A safe store key: ASCII letters, digits, '.', '_', '-'; not . or ..
            "pattern": r"^(?!\.\.?$)[A-Za-z0-9._-]+$",
        },
        "source": {"type": "string"},
        "snapshot_id": {"type": "string"},
        "version": {"type": "integer", "minimum": 0, "maximum": MAX_SNAPSHOT_VERSION},
        "ticket": {"type": "string"},
    },
}

_PACKED_COLUMN = {
    "type": "object",
    "required": ["encoding", "length", "data"],
    "description": "Only with `tokens=compact`: the column's little-endian values, base64.",
    "properties": {
        "encoding": {"type": "string", "enum": ["u32le", "u64le", "u8", "f64le"]},
        "length": {"type": "integer", "minimum": 0},
        "data": {"type": "string", "contentEncoding": "base64"},
    },
}


def _token_column(items: dict[str, Any]) -> dict[str, Any]:
    return {"oneOf": [{"type": "array", "items": items}, _PACKED_COLUMN]}


_STAGED = {
    "type": "object",
    "required": ["receipt", "row", "error"],
    "description": (
        "Only for a rollout captured by NeMo Gym's external staging (docs/staging.md): the "
        "receipt built from its frozen manifest, the verified row of the record's terminal "
        "chain (null unless every check passed), or the first check that failed."
    ),
    "properties": {
        "receipt": {"type": ["object", "null"], "description": "NeMo Gym's RolloutReceipt."},
        "row": {
            "type": ["object", "null"],
            "description": "NeMo Gym's LinearizedRow, root call to terminal.",
            "properties": {
                "token_ids": _token_column({"type": "integer", "minimum": 0}),
                "token_mask": _token_column({"type": "number"}),
                "logprobs": _token_column({"type": "number"}),
            },
            "additionalProperties": True,
        },
        "error": {
            "type": ["object", "null"],
            "required": ["class", "code", "detail"],
            "properties": {
                "class": {"type": "string", "enum": ["ReceiptVerificationError", "RebuildError"]},
                "code": {"type": "string", "description": "Also the record's `mask_reason`."},
                "detail": {"type": "string"},
            },
        },
    },
}

_FINALIZE_ANSWER = {
    "type": "object",
    "required": ["rollout_id", "source", "record", "build", "retirable", "retire"],
    "properties": {
        "rollout_id": {"type": ["string", "null"], "description": "The record's capture key."},
        "source": {"type": "string", "description": "The source that was used."},
        "record": {
            "type": "object",
            "description": "The record after finalize; it holds the rebuilt output.",
            "properties": {"_ng_token_capture": _TOKEN_CAPTURE},
        },
        "build": _BUILD,
        "retirable": {
            "type": "boolean",
            "description": "Whether `retire` may drop the consumed snapshot after a durable write.",
        },
        "retire": {
            "oneOf": [_RETIRE_TICKET, {"type": "null"}],
            "description": "Post this to /retire after the durable write; null: not retirable.",
        },
        "context_token_ids": {
            "type": ["array", "null"],
            "items": {"type": "integer"},
            "description": (
                "Only with `tokens=compact`: the delivered context, once; every rebuilt item's "
                "`prompt_token_ids` is then a prefix length into it."
            ),
        },
        "staged": _STAGED,
    },
}

_GUARD_REFUSAL = {
    "type": "object",
    "required": ["error", "finalized", "masked", "reasons"],
    "properties": {
        "error": {"type": "string"},
        "finalized": {"type": "integer"},
        "masked": {"type": "integer"},
        "reasons": {"type": "object", "additionalProperties": {"type": "integer"}},
    },
}

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _error(
        "The body is not valid JSON, not a JSON object, nested too deeply, "
        "or not sent as application/json."
    ),
    401: _error("Missing or wrong bearer token (only when tokens are configured)."),
    404: _error("Unknown source name."),
    413: _error("The body is larger than `limits.max_body_bytes`."),
}

# Declared here, FastAPI does not add its own (differently shaped) 422 schema.
FINALIZE_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES,
    422: _error("A query parameter or header is malformed."),
}

FINALIZE_OPENAPI: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": _RECORD}},
    },
    "responses": {
        "200": {
            "description": (
                "The finalized record. Capture problems are masked records here, never errors."
            ),
            "content": {"application/json": {"schema": _FINALIZE_ANSWER}},
        },
        "409": _error(
            "The run (X-Run-Id) crossed token_id_capture.max_mask_fraction.", _GUARD_REFUSAL
        ),
        "503": _error(
            "The source could not be reached and nothing was frozen: retry after "
            "`Retry-After` seconds (sources.<name>.on_unreachable: retry)."
        ),
    },
}

RETIRE_OPENAPI: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "description": (
                        "The finalize answer's `retire` object, or the whole answer posted back."
                    ),
                    "oneOf": [
                        _RETIRE_TICKET,
                        {
                            "type": "object",
                            "required": ["retire"],
                            "properties": {"retire": _RETIRE_TICKET},
                            "additionalProperties": True,
                        },
                    ],
                }
            }
        },
    },
    "responses": {
        "200": {
            "description": "The snapshot the ticket names was dropped (or already had been).",
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "required": ["retired"],
                        "properties": {"retired": {"type": "boolean"}},
                    }
                }
            },
        },
        "403": _error("The ticket does not verify: forged, edited, or signed with another key."),
        "409": _error(
            "The store moved on since the finalize (a later write): nothing was retired.",
            {
                "type": "object",
                "required": ["error", "retired"],
                "properties": {"error": {"type": "string"}, "retired": {"type": "boolean"}},
            },
        ),
        "422": _error("The body is not a retire object, or the answer is not retirable."),
        "503": _error("The source could not be reached; retry after `Retry-After` seconds."),
    },
}

_READINESS = {
    "type": "object",
    "properties": {
        "status": {"type": "string", "enum": ["ready", "unavailable", "draining"]},
        "sources": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "properties": {"reachable": {"type": "boolean"}, "error": {"type": "string"}},
            },
        },
        "error": {"type": "string"},
    },
}

READY_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Every configured source is reachable.",
        "content": {"application/json": {"schema": _READINESS}},
    },
    503: {
        "description": "A source is unreachable, or the process is shutting down.",
        "content": {"application/json": {"schema": _READINESS}},
    },
}
