"""The NeMo Gym external-staging block of docs/staging.md is one Gym 0.7 accepts, with our ledger.

Gym's block model forbids unknown keys and refuses external staging without
`enabled` or with `rebuild_response` left true; it loads `lineage_store`
with `lineage_store_kwargs` as keyword arguments and requires a capture
ledger that is process-shared. The documented block must satisfy all of it.
"""

from __future__ import annotations

import asyncio
import importlib
import re
from pathlib import Path
from typing import Any

import yaml

from tests.test_nemo_gym_config_docs import GYM_0_7_BLOCK_KEYS

STAGING_DOC = Path(__file__).resolve().parent.parent / "docs" / "staging.md"
# Gym's CaptureLedger protocol (every method its model server calls).
LEDGER_METHODS = ("resolve", "record", "record_failure", "manifest", "has_rows", "close")


def _block() -> dict[str, Any]:
    """The one `token_id_capture` block of the page (external staging's)."""
    blocks = [
        yaml.safe_load(body)["token_id_capture"]
        for body in re.findall(r"```yaml\n(.*?)```", STAGING_DOC.read_text(), re.DOTALL)
        if "token_id_capture" in (yaml.safe_load(body) or {})
    ]
    assert len(blocks) == 1
    block: dict[str, Any] = blocks[0]
    return block


def _resolved(value: Any) -> Any:
    """A kwarg with `${oc.env:NAME}` resolved as Gym's loader would (to a stand-in secret)."""
    if isinstance(value, str) and value.startswith("${oc.env:"):
        return f"secret-of-{value[len('${oc.env:') : -1]}"
    return value


def _ledger() -> Any:
    block = _block()
    module, _, name = block["lineage_store"].partition(":")
    factory = getattr(importlib.import_module(module), name)
    return factory(**{key: _resolved(v) for key, v in block["lineage_store_kwargs"].items()})


def test_the_block_uses_only_keys_gym_accepts() -> None:
    """Every key of the documented block is a field of Gym 0.7's capture settings."""
    assert set(_block()) <= GYM_0_7_BLOCK_KEYS


def test_the_block_turns_external_staging_on_as_gym_requires() -> None:
    """Enabled, every agent, external staging, rebuild_response false, a control token env."""
    block = _block()
    assert (
        block["enabled"],
        block["all_agents"],
        block["external_staging"],
        block["rebuild_response"],
        bool(block["control_auth_token_env"]),
    ) == (True, True, True, False, True)


def test_the_ledger_is_ours_and_takes_the_documented_kwargs() -> None:
    """The lineage store is HttpCaptureLedger, built from exactly the documented kwargs."""
    from token_finalizer_client import HttpCaptureLedger

    ledger = _ledger()
    try:
        assert isinstance(ledger, HttpCaptureLedger)
        assert all(callable(getattr(ledger, method)) for method in LEDGER_METHODS)
        assert ledger.is_process_shared() is True
    finally:
        asyncio.run(ledger.close())


def test_the_ledger_reads_manifests_with_the_control_token() -> None:
    """The documented kwargs give the ledger a control token, so Gym's own route can answer."""
    block = _block()
    assert {"token", "control_token"} <= set(block["lineage_store_kwargs"])
