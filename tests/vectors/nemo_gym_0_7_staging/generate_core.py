"""Regenerate the core_*.json staging vectors in this directory (run by hand, never in CI).

    python3.13 tests/vectors/nemo_gym_0_7_staging/generate_core.py --reference PATH/nemo_gym

``--reference`` is the ``nemo_gym`` directory of the unpacked 0.7.0 wheel
(``pip download --no-deps --ignore-requires-python nemo-gym==0.7.0``, then
unzip). Run it with Python 3.13 in a virtual environment holding pydantic,
orjson and numpy. Only the wheel's ``token_id_capture`` package is imported,
under an empty ``nemo_gym`` package built in a temporary directory, so none
of NeMo Gym's server dependencies are needed.

The files feed the unit tests of ``token_finalizer.core.staging``:

- ``core_digests.json``: token, chain, extras and staging digests of chosen inputs;
- ``core_records.json``: wire values each type accepts (with its JSON dump) or refuses;
- ``core_verify.json``: receipts and fetched snapshots (optionally tampered
  after validation) with the verifier's row or ``{error_class, code, detail}``;
- ``core_terminal.json``: the parent-link walk and witness attribution over manifest rows;
- ``core_ledger.json``: ledger writes (rows written, outcomes, manifest),
  manifests of hand-written rows, and parent resolution.

Every expected value is what the released code answers, except where
docs/staging.md deliberately differs: such a case carries our expected value,
the reference's answer under ``reference`` and a ``note``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# The case builders live beside this script (private modules, not tests).
sys.path.insert(0, str(HERE))

from _core_digest_cases import digest_cases, record_cases  # noqa: E402
from _core_ledger_cases import ledger_cases  # noqa: E402
from _core_reference import Reference  # noqa: E402
from _core_terminal_cases import terminal_cases  # noqa: E402
from _core_verify_cases import verify_cases  # noqa: E402

# --------------------------------------------------------------------------- main


def write(name: str, payload: Any) -> None:
    path = HERE / name
    path.write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {path.relative_to(HERE.parents[2])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", type=Path, required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        ref = Reference(args.reference, Path(workdir))
        header = {
            "generated_by": "tests/vectors/nemo_gym_0_7_staging/generate_core.py",
            "reference": "nemo-gym 0.7.0",
        }
        write("core_digests.json", {**header, **digest_cases(ref)})
        write("core_records.json", {**header, **record_cases(ref)})
        write("core_verify.json", {**header, **verify_cases(ref)})
        write("core_terminal.json", {**header, **terminal_cases(ref)})
        write("core_ledger.json", {**header, **ledger_cases(ref)})


if __name__ == "__main__":
    main()
