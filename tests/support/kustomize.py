"""A small kustomize: render deploy/kubernetes/ as `kustomize build` would, offline.

This machine has no kustomize binary, so the tests render the kustomizations
themselves. Only what the manifests use is supported, and anything else in a
kustomization.yaml is refused rather than ignored:

- `resources`: YAML files (every document) and directories holding a
  kustomization.yaml (rendered first);
- `patches` without `target`: strategic merge patches, matched by kind and
  name; `$patch: delete` removes the resource; maps merge, lists of named
  objects (containers, env, volumes, ...) merge by `name`, other lists are
  replaced;
- `patches` with `target` (kind, name): JSON 6902 operations `replace`, `add`
  and `remove`.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

__all__ = ["render"]

_KNOWN_KEYS = {"apiVersion", "kind", "resources", "patches"}


def _key(resource: dict[str, Any]) -> tuple[str, str]:
    return resource["kind"], resource["metadata"]["name"]


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _named(items: list[Any]) -> bool:
    return bool(items) and all(isinstance(item, dict) and "name" in item for item in items)


def _merge(base: Any, patch: Any) -> Any:
    """`patch` merged into `base` (strategic merge, as far as the manifests need it)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            merged[key] = _merge(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(patch, list) and _named(base) and _named(patch):
        merged_list = [dict(item) for item in base]
        names = [item["name"] for item in merged_list]
        for item in patch:
            if item["name"] in names:
                index = names.index(item["name"])
                merged_list[index] = _merge(merged_list[index], item)
            else:
                merged_list.append(copy.deepcopy(item))
        return merged_list
    return copy.deepcopy(patch)


def _pointer(path: str) -> list[str]:
    return [part.replace("~1", "/").replace("~0", "~") for part in path.split("/")[1:]]


def _json6902(resource: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    result = copy.deepcopy(resource)
    for operation in operations:
        *parents, last = _pointer(operation["path"])
        node: Any = result
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        op = operation["op"]
        if isinstance(node, list):
            index = len(node) if last == "-" else int(last)
            if op == "add":
                node.insert(index, copy.deepcopy(operation["value"]))
            elif op == "replace":
                node[index] = copy.deepcopy(operation["value"])
            elif op == "remove":
                del node[index]
            else:
                raise ValueError(f"JSON 6902 op {op!r} is not supported here")
        elif op in {"add", "replace"}:
            if op == "replace" and last not in node:
                raise KeyError(f"replace of a missing {operation['path']}")
            node[last] = copy.deepcopy(operation["value"])
        elif op == "remove":
            del node[last]
        else:
            raise ValueError(f"JSON 6902 op {op!r} is not supported here")
    return result


def render(directory: Path) -> list[dict[str, Any]]:
    """The resources of the kustomization in `directory`, patches applied, in order."""
    (kustomization,) = _documents(directory / "kustomization.yaml")
    unknown = set(kustomization) - _KNOWN_KEYS
    if unknown:
        raise ValueError(f"{directory}: kustomization keys not rendered here: {sorted(unknown)}")
    resources: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        resources.extend(render(path) if path.is_dir() else _documents(path))
    keys = [_key(resource) for resource in resources]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{directory}: a resource is defined twice")
    for patch in kustomization.get("patches", []):
        documents = _documents(directory / patch["path"])
        target = patch.get("target")
        if target is not None:
            (operations,) = documents
            index = keys.index((target["kind"], target["name"]))
            resources[index] = _json6902(resources[index], operations)
            continue
        for document in documents:
            index = keys.index(_key(document))
            if document.get("$patch") == "delete":
                del resources[index], keys[index]
            else:
                resources[index] = _merge(resources[index], document)
    return resources
