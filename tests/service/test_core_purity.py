"""The core stands alone: importing all of `token_finalizer.core` loads no web framework."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

_WEB_MODULES = ("fastapi", "starlette", "uvicorn", "httpx")
# Imports every module of the core package (found by walking it, so a new
# module is covered without touching this test), then lists what got loaded.
_PROBE = """
import importlib, json, pkgutil, sys
import token_finalizer.core as core
names = [info.name for info in pkgutil.walk_packages(core.__path__, core.__name__ + ".")]
for name in names:
    importlib.import_module(name)
print(json.dumps({"imported": names, "loaded": sorted(sys.modules)}))
"""


@pytest.fixture(scope="module")
def probe() -> dict[str, list[str]]:
    """What a fresh interpreter imported from the core, and every module it then had loaded."""
    result = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    probed: dict[str, list[str]] = json.loads(result.stdout)
    return probed


def test_core_modules_are_found(probe: dict[str, list[str]]) -> None:
    """The walk finds the core's modules, so the import check below is not vacuous."""
    assert "token_finalizer.core.codec" in probe["imported"]


def test_core_import_loads_no_web_framework(probe: dict[str, list[str]]) -> None:
    """A fresh import of every core module loads no fastapi, starlette, uvicorn or httpx."""
    web = [
        name
        for name in probe["loaded"]
        if any(name == root or name.startswith(f"{root}.") for root in _WEB_MODULES)
    ]
    assert web == []
