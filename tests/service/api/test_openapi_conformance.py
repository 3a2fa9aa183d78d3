"""Property-based conformance: generated requests against the documented schema (schemathesis).

Every operation of /openapi.json is called with generated valid and invalid
inputs on a real server; no answer may be a 5xx, and every answer must match
the status codes, content types and bodies the document declares.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from tests.support.servers import running_app
from token_finalizer.api import create_app
from token_finalizer.settings import Settings, settings_from_mapping

schema = schemathesis.openapi.from_dict(create_app(Settings()).openapi())


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One served app (file source over a fresh directory) for every generated case."""
    capture_dir: Path = tmp_path_factory.mktemp("capture")
    config = {"sources": {"local": {"kind": "file", "dir": str(capture_dir)}}}
    with running_app(create_app(settings_from_mapping(config, env={}))) as base:
        yield base


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_answers_conform_to_the_openapi_document(case: schemathesis.Case, base_url: str) -> None:
    """Generated calls of each operation get documented, non-5xx answers."""
    case.call_and_validate(base_url=base_url)
