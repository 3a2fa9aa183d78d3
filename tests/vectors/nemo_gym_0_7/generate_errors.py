"""Regenerate errors.json: every record `error` NeMo Gym 0.7.0 defines (by hand, never in CI).

    python tests/vectors/nemo_gym_0_7/generate_errors.py [--reference /tmp/gym/wheel/nemo_gym]

Run it with a Python 3.13 environment holding pydantic, numpy and orjson
(never the project's own), as `generate.py`; `--reference` is the
``nemo_gym`` directory of the unpacked 0.7.0 wheel. Two parts:

- ``defined``: read from Gym's source with `ast`, not copied: the error
  argument of every `_unusable(...)` call in ``delivery.py`` and every
  `_failed_build(...)` call in ``consumer.py``, as a ``literal`` or, for an
  f-string, a ``template`` whose ``{}`` stand for its expressions (each
  expression's source is under ``fields``);
- ``cases``: what Gym's own `finalize_rollout_token_capture` answers for
  records and sources that reach each of those branches: the record's
  ``_ng_token_capture.error`` and the build's ``error``, which ours must
  equal byte for byte (tests/service/core/test_gym_error_strings.py).

A branch no caller can reach in 0.7.0 gets its case by replacing the one
function that would lead there, named under ``patched``.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from generate import DEFAULT_REFERENCE, HERE, Reference

GYM_WHEEL = Path("/tmp/gym/wheel/nemo_gym")
# Where each module passes a record's error, and which argument it is.
_ERROR_ARGUMENTS = {
    "delivery.py": ("_unusable", 1),
    "consumer.py": ("_failed_build", 2),
}


def _shape(node: ast.expr, source: str) -> dict[str, Any]:
    """A literal error, or an f-string as a template and the source of its fields."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {"literal": node.value}
    if isinstance(node, ast.JoinedStr):
        template, fields = [], []
        for part in node.values:
            if isinstance(part, ast.Constant):
                template.append(str(part.value).replace("{", "{{").replace("}", "}}"))
            elif isinstance(part, ast.FormattedValue):
                template.append("{}")
                fields.append(ast.get_source_segment(source, part.value))
        return {"template": "".join(template), "fields": fields}
    return {"expression": ast.get_source_segment(source, node)}


def defined_errors(package: Path) -> list[dict[str, Any]]:
    """Every error argument of Gym's record-masking helpers, in source order."""
    found = []
    for name, (helper, index) in _ERROR_ARGUMENTS.items():
        source = (package / "token_id_capture" / name).read_text()
        tree = ast.parse(source)
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for call in ast.walk(function):
                if (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Name)
                    and call.func.id == helper
                ):
                    error = _shape(call.args[index], source)
                    found.append({"module": name, "function": function.name, **error})
    unique: dict[str, dict[str, Any]] = {}
    for item in found:  # one entry per (text, function): a helper may repeat a text
        key = json.dumps([item["function"], item.get("literal"), item.get("template")])
        unique.setdefault(key, item)
    return list(unique.values())


class _Source:
    """A TokenSource for Gym's finalize: an empty snapshot, or a freeze that raises."""

    def __init__(self, raises: Exception | None = None) -> None:
        self.raises = raises

    async def freeze(self, rollout_id: str) -> Any:
        if self.raises is not None:
            raise self.raises
        return SimpleNamespace(
            rollout_id=rollout_id, entries=(), incomplete=False, snapshot_id="s", version=1
        )

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        return False


def _record(**fields: Any) -> dict[str, Any]:
    return {"response": {"id": "resp", "output": []}, **fields}


# (name, what it shows, the record, how the freeze answers, the function patched to None)
_CASES: list[tuple[str, str, dict[str, Any], Exception | None, str | None]] = [
    ("no_capture_key", "a record naming no rollout", _record(), None, None),
    (
        "malformed_explicit_id",
        "an explicit _ng_rollout_id breaking the id pattern",
        _record(_ng_rollout_id="a/b"),
        None,
        None,
    ),
    (
        "malformed_explicit_id_not_a_string",
        "an explicit _ng_rollout_id that is not a string",
        _record(_ng_rollout_id=7),
        None,
        None,
    ),
    (
        "empty_capture",
        "a rollout whose freeze finds no token record",
        _record(_ng_rollout_id="r-empty"),
        None,
        None,
    ),
    (
        "freeze_raises",
        "a source whose freeze raises",
        _record(_ng_rollout_id="r-down"),
        RuntimeError("store is down"),
        None,
    ),
    (
        "nothing_recorded",
        "the consumer answering no build (unreachable in 0.7.0: trajectories_from_source "
        "always answers one)",
        _record(_ng_rollout_id="r-none"),
        None,
        "trajectories_from_source",
    ),
]


async def _answers(ref: Reference) -> list[dict[str, Any]]:
    cases = []
    for name, description, record, raises, patched in _CASES:
        original = getattr(ref.delivery, patched) if patched else None
        if patched:

            async def nothing(*args: Any, **kwargs: Any) -> None:
                return None

            setattr(ref.delivery, patched, nothing)
        try:
            result = json.loads(json.dumps(record))
            build = await ref.delivery.finalize_rollout_token_capture(result, _Source(raises))
        finally:
            if patched:
                setattr(ref.delivery, patched, original)
        case = {
            "name": name,
            "description": description,
            "inputs": {"record": record, "freeze_raises": None},
            "expected": {
                "record_error": result["_ng_token_capture"]["error"],
                "build_error": build["error"],
            },
        }
        if raises is not None:
            raised = {"class": type(raises).__name__, "message": str(raises)}
            case["inputs"]["freeze_raises"] = raised
        if patched:
            case["patched"] = patched
        cases.append(case)
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", type=Path, default=GYM_WHEEL)
    args = parser.parse_args()
    reference = args.reference if args.reference.exists() else DEFAULT_REFERENCE
    with tempfile.TemporaryDirectory() as workdir:
        ref = Reference(reference, Path(workdir))
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Gym warns for every record it masks
            cases = asyncio.run(_answers(ref))
    payload = {
        "generated_by": "tests/vectors/nemo_gym_0_7/generate_errors.py",
        "reference": "nemo-gym 0.7.0",
        "about": (
            "Every error string NeMo Gym 0.7.0 puts in a record's _ng_token_capture.error and "
            "its build's error: 'defined' as read from its source, 'cases' as its "
            "finalize_rollout_token_capture answers them."
        ),
        "defined": defined_errors(reference),
        "cases": cases,
    }
    path = HERE / "errors.json"
    path.write_text(json.dumps(payload, indent=1) + "\n", encoding="ascii")
    print(f"wrote {path.relative_to(HERE.parents[2])}")


if __name__ == "__main__":
    main()
