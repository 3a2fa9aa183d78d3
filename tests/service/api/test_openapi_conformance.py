"""Property-based conformance: generated requests against the documented schema (schemathesis).

Every operation of /openapi.json is called with generated valid and invalid
inputs, in-process (schemathesis' ASGI transport, which runs the app's
lifespan); no answer may be a 5xx, and every answer must match the status
codes, content types and bodies the document declares.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, settings

from token_finalizer.api import create_app
from token_finalizer.settings import Settings, settings_from_mapping

schema = schemathesis.openapi.from_dict(create_app(Settings()).openapi())


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    """One app (file source over a fresh directory) for every generated case."""
    capture_dir: Path = tmp_path_factory.mktemp("capture")
    config = {"sources": {"local": {"kind": "file", "dir": str(capture_dir)}}}
    return create_app(settings_from_mapping(config, env={}))


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_answers_conform_to_the_openapi_document(case: schemathesis.Case, app: FastAPI) -> None:
    """Generated calls of each operation get documented, non-5xx answers."""
    case.call_and_validate(app=app)
