"""The NeMo Gym 0.7 configuration the docs show captures, and Gym 0.7 accepts every key of it.

NeMo Gym captures an agent's calls only when `token_id_capture.enabled` and
either `all_agents: true` or the agent's own `token_id_capture: true`; without
that every record is masked. Gym's block model forbids unknown keys, so the
documented block may use only the keys Gym 0.7.0 defines (listed below, read
from its `TokenIdCaptureSettings`). The sink and resolver it names must be
the client's classes, built from exactly those keyword arguments.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "docs" / "store-protocol.md"]

# The fields of `nemo_gym.token_id_capture.config.TokenIdCaptureSettings` in NeMo Gym 0.7.0.
GYM_0_7_BLOCK_KEYS = frozenset(
    {
        "enabled",
        "all_agents",
        "dir",
        "sink",
        "sink_kwargs",
        "lineage_store",
        "lineage_store_kwargs",
        "rebuild_response",
        "allow_unresolved_continuations",
        "delta_records",
        "max_mask_fraction",
        "mask_fraction_min_samples",
        "external_staging",
        "external_staging_backend",
        "control_auth_token_env",
    }
)


def _yaml_blocks(path: Path) -> list[Any]:
    text = path.read_text()
    return [yaml.safe_load(body) for body in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)]


def _gym_block(path: Path) -> dict[str, Any]:
    """The one `token_id_capture` block of the page that names a sink (Gym's, not ours)."""
    blocks = [
        block["token_id_capture"]
        for block in _yaml_blocks(path)
        if isinstance(block, dict) and "sink" in (block.get("token_id_capture") or {})
    ]
    assert len(blocks) == 1, path
    return blocks[0]


def _client_class(spec: str) -> Any:
    module, _, name = spec.partition(":")
    assert module == "token_finalizer_client", spec
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("path", DOCS, ids=lambda path: path.name)
def test_gym_block_uses_only_keys_gym_accepts(path: Path) -> None:
    """Gym 0.7 refuses unknown keys in the block: every documented one is Gym's."""
    assert set(_gym_block(path)) <= GYM_0_7_BLOCK_KEYS


@pytest.mark.parametrize("path", DOCS, ids=lambda path: path.name)
def test_gym_block_captures_every_agent(path: Path) -> None:
    """The block turns capture on for every agent (`enabled` and `all_agents`)."""
    block = _gym_block(path)
    assert (block["enabled"], block["all_agents"]) == (True, True)


@pytest.mark.parametrize("path", DOCS, ids=lambda path: path.name)
def test_gym_block_builds_our_sink_and_resolver_on_one_store(path: Path) -> None:
    """sink and lineage_store are the client's classes, their kwargs bind, on the same URL."""
    block = _gym_block(path)
    for name in ("sink", "lineage_store"):
        kwargs = block[f"{name}_kwargs"]
        inspect.signature(_client_class(block[name])).bind(**kwargs)
    assert block["sink_kwargs"]["url"] == block["lineage_store_kwargs"]["url"]
    assert block["rebuild_response"] is False


def test_readme_shows_the_per_agent_flag() -> None:
    """The README shows the alternative: an agent's own `token_id_capture: true`."""
    agents = [
        block
        for block in _yaml_blocks(ROOT / "README.md")
        if isinstance(block, dict) and "token_id_capture" not in block
    ]
    flags = [
        config["token_id_capture"]
        for block in agents
        for server in block.values()
        if isinstance(server, dict)
        for config in (server.get("responses_api_agents") or {}).values()
    ]
    assert flags == [True]


@pytest.mark.parametrize("path", DOCS, ids=lambda path: path.name)
def test_docs_say_gym_needs_python_3_13(path: Path) -> None:
    """Each page with the block says NeMo Gym 0.7 runs on Python 3.13 or newer."""
    assert "3.13 or newer" in path.read_text()
