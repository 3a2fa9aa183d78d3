"""A staging source's `receipt_policy`: ours by default, NeMo RL's when configured.

docs/staging.md#nemo-rls-receipt-policy, docs/configuration.md#sources. The
rollout is a clean chain c1 -> c2 -> c3 plus the failure row of a call that
was admitted and served but never committed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.staged_service import STAGED_RETIRE, staged_service
from tests.support.staging_stores import Conversation
from token_finalizer.settings import ConfigError, settings_from_mapping

UNCOMMITTED = "request_finished_without_staged_coordinates"


def _finalize(tmp_path: Path, **source_options: Any) -> dict[str, Any]:
    """Write the rollout and finalize it on c3's response, under the given source options."""
    chat = Conversation.of("st-policy", 3)
    with staged_service(
        "memory", tmp_path, source_options=source_options, **STAGED_RETIRE
    ) as service:

        async def write(store: Any) -> None:
            for record, row in zip(chat.records, chat.rows, strict=True):
                await store.stage(record)
                await store.record_ledger_row(chat.rollout_id, row)
            await store.record_ledger_failure(chat.rollout_id, "c4", UNCOMMITTED)

        service.seed(write)
        return service.finalize({"_ng_rollout_id": chat.rollout_id, "response": {"id": "resp-c3"}})


def test_by_default_an_uncommitted_call_masks_the_rollout(tmp_path: Path) -> None:
    """Ours: the failure row poisons, `rollout_failed` with Gym's reason, no row."""
    staged = _finalize(tmp_path)["staged"]
    assert staged["row"] is None
    assert (staged["error"]["code"], staged["error"]["detail"]) == ("rollout_failed", UNCOMMITTED)


def test_the_nemo_rl_policy_trains_on_the_chain(tmp_path: Path) -> None:
    """`receipt_policy: nemo_rl`: the uncommitted call does not poison; c1..c3 is the row."""
    answer = _finalize(tmp_path, receipt_policy="nemo_rl")
    assert answer["staged"]["error"] is None
    assert answer["staged"]["row"]["model_call_ids"] == ["c1", "c2", "c3"]
    assert answer["retirable"] is True


def test_an_unknown_policy_is_refused_at_start_up() -> None:
    """Anything but token_finalizer or nemo_rl fails the configuration, naming the key."""
    config = {"sources": {"local": {"kind": "memory", "receipt_policy": "gym"}}}
    with pytest.raises(ConfigError, match="receipt_policy"):
        settings_from_mapping(config, env={})
