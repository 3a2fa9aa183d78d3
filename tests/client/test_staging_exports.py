"""The staging classes are exported, and using them loads neither NeMo Gym nor pydantic."""

from __future__ import annotations

import json
import subprocess
import sys

import token_finalizer_client

_PROBE = """
import json, sys
import token_finalizer_client as c
ledger = c.HttpCaptureLedger("http://x.test", token="t")
c.HttpStagingSink("http://x.test").close()
c.HttpStagingSource("http://x.test").close()
c.StageResult(ok=False, error="e")
print(json.dumps(sorted(sys.modules)))
"""


def test_staging_names_are_exported() -> None:
    """The ledger, sink, source, their result types and the ledger errors are public names."""
    expected = {
        "HttpCaptureLedger",
        "HttpStagingSink",
        "HttpStagingSource",
        "StageResult",
        "StagedCallBaseSnapshot",
        "LedgerConflictError",
        "InvalidLedgerRequestError",
    }
    assert expected <= set(token_finalizer_client.__all__)
    assert all(hasattr(token_finalizer_client, name) for name in expected)


def test_making_the_staging_clients_loads_no_gym_and_no_pydantic() -> None:
    """A fresh interpreter making each staging client has no nemo_gym or pydantic module."""
    result = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = json.loads(result.stdout)
    assert [name for name in loaded if name.startswith(("nemo_gym", "pydantic"))] == []
