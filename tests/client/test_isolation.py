"""The client package stands alone: importing it loads no server code."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import token_finalizer_client

_SERVER_MODULES = ("token_finalizer.", "fastapi", "uvicorn", "starlette", "pydantic")
_PROBE = "import json, sys, token_finalizer_client; print(json.dumps(sorted(sys.modules)))"


def test_import_loads_no_server_modules() -> None:
    """A fresh interpreter importing the package has no service, FastAPI or uvicorn module."""
    result = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = json.loads(result.stdout)
    server_side = [
        name for name in loaded if name == "token_finalizer" or name.startswith(_SERVER_MODULES)
    ]
    assert server_side == []


def test_import_loads_no_numpy() -> None:
    """numpy is optional: importing the package (and making a list client) does not load it."""
    probe = (
        "import sys, token_finalizer_client as c; c.FinalizerClient('http://x.test').close(); "
        "print('numpy' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "False"


def test_every_public_name_is_exported() -> None:
    """The package root exports the clients, results, the sink and the whole error tree."""
    expected = {
        "APIConnectionError",
        "APIStatusError",
        "APITimeoutError",
        "AsyncFinalizerClient",
        "AuthenticationError",
        "BadRequestError",
        "Finalized",
        "FinalizerClient",
        "FinalizerError",
        "HttpTokenSink",
        "MaskFractionExceeded",
        "NotFoundError",
        "PayloadTooLargeError",
        "PermissionDeniedError",
        "ServerError",
        "SourceUnavailableError",
    }
    assert expected <= set(token_finalizer_client.__all__)
    assert all(hasattr(token_finalizer_client, name) for name in token_finalizer_client.__all__)


def test_an_unknown_name_is_an_attribute_error() -> None:
    """The package's lazy lookup answers a name it does not have with AttributeError."""
    with pytest.raises(AttributeError, match="no attribute 'FinaliserClient'"):
        _ = token_finalizer_client.FinaliserClient
