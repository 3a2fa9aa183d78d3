"""The import-linter contracts (pyproject.toml [tool.importlinter]) cover what they claim to.

`lint-imports` itself runs in CI (.ci/run) and fails on a broken contract;
these tests keep the contracts' hand-written lists from going stale.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CLIENT_PACKAGE = ROOT / "client" / "token_finalizer_client"


def _contract(contract_id: str) -> dict[str, Any]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contracts: list[dict[str, Any]] = config["contracts"]
    return next(contract for contract in contracts if contract["id"] == contract_id)


def test_every_private_client_module_is_forbidden_to_the_service() -> None:
    """The service may not import any `token_finalizer_client._*` module: the list is whole."""
    private = {
        f"token_finalizer_client.{path.stem}"
        for path in CLIENT_PACKAGE.glob("_*.py")
        if path.name != "__init__.py"
    }
    forbidden = set(_contract("service-uses-public-client-modules")["forbidden_modules"])
    assert (len(private) > 1, forbidden) == (True, private)


def test_the_public_client_modules_stay_allowed() -> None:
    """`protocol` and `transport` are what the service imports: they are never forbidden."""
    forbidden = set(_contract("service-uses-public-client-modules")["forbidden_modules"])
    public = {"token_finalizer_client.protocol", "token_finalizer_client.transport"}
    assert all((CLIENT_PACKAGE / f"{name.split('.')[1]}.py").is_file() for name in public)
    assert forbidden.isdisjoint(public)
