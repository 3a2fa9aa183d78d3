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


def _imports_of(path: Path, package_root: Path) -> set[str]:
    """Every project module `path` imports, at any depth of the file (TYPE_CHECKING included)."""
    import ast

    parts = path.relative_to(package_root).with_suffix("").parts
    module = ".".join(parts)
    # A relative import counts from the file's package (`__init__` is its own package).
    package = parts[:-1]
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            origin = ".".join([*base, *([node.module] if node.module else [])])
            names.add(origin)
            names.update(f"{origin}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name != module}


def test_no_two_modules_import_each_other() -> None:
    """No module imports a module that imports it back, not even for annotations only."""
    roots = {ROOT / "service": ROOT / "service", ROOT / "client": ROOT / "client"}
    imports: dict[str, set[str]] = {}
    for source, package_root in roots.items():
        for path in source.rglob("*.py"):
            name = ".".join(path.relative_to(package_root).with_suffix("").parts)
            imports[name.removesuffix(".__init__")] = _imports_of(path, package_root)
    circles = sorted(
        f"{first} <-> {second}"
        for first, targets in imports.items()
        for second in targets
        if second in imports
        and first < second
        and first in imports[second]
        and not second.startswith(first + ".")
        and not first.startswith(second + ".")
    )
    assert circles == []
