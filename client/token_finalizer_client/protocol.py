"""The wire contract both distributions share: fingerprints, the id rule, protocol paths.

Pure: the standard library only (orjson when installed), no HTTP library, so
the service's core imports it and stays free of httpx
(docs/architecture.md#dependency-rule). What travels between a model server,
a capture store and the finalizer is defined here once:

- fingerprints v2 (`assistant_fingerprint`, `conversation_digest`,
  `context_digests`, stamped `FINGERPRINT_VERSION`), bit-exact with NeMo Gym
  0.7 (docs/records-and-builds.md#fingerprints);
- the store id rules for rollout ids and model call ids (`check_rollout_id`,
  `check_new_rollout_id` for writers, `check_call_id`, `MAX_ID_LENGTH`;
  docs/records-and-builds.md#store-id-rule);
- the paths of protocol v1 (`rollout_path`, `call_path`, `ROLLOUT_ROUTE`;
  docs/store-protocol.md#paths).

The HTTP side (retry policy, store connections) is `token_finalizer_client.transport`.
"""

from __future__ import annotations

from token_finalizer_client._addressing import (
    CAPTURE_SEGMENT,
    ROLLOUT_ID_RULE,
    ROLLOUT_ROUTE,
    ROLLOUT_SEGMENT,
    InvalidIdError,
    call_path,
    check_call_id,
    check_new_rollout_id,
    check_rollout_id,
    rollout_path,
)
from token_finalizer_client._constants import MAX_ID_LENGTH
from token_finalizer_client._fingerprint import (
    FINGERPRINT_VERSION,
    FingerprintError,
    assistant_fingerprint,
    canonical_arguments,
    canonical_json,
    context_digests,
    conversation_digest,
    is_model_authored,
)

__all__ = [
    "CAPTURE_SEGMENT",
    "FINGERPRINT_VERSION",
    "MAX_ID_LENGTH",
    "ROLLOUT_ID_RULE",
    "ROLLOUT_ROUTE",
    "ROLLOUT_SEGMENT",
    "FingerprintError",
    "InvalidIdError",
    "assistant_fingerprint",
    "call_path",
    "canonical_arguments",
    "canonical_json",
    "check_call_id",
    "check_new_rollout_id",
    "check_rollout_id",
    "context_digests",
    "conversation_digest",
    "is_model_authored",
    "rollout_path",
]
