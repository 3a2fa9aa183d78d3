"""Fixtures of the NeMo Gym wheel suite: a real `store serve`, and where the wheel lives.

Run only in a venv with NeMo Gym 0.7.0 installed (README.md); the project's
default test run never enters this folder (pyproject `norecursedirs`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.servers import free_port, running_process

# The unpacked wheel: its test modules (responses_api_models/...) are imported from here.
WHEEL = Path(os.environ.get("GYM_WHEEL", "/tmp/gym/wheel"))
if str(WHEEL) not in sys.path:
    sys.path.append(str(WHEEL))


@pytest.fixture(scope="session")
def store_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`token-finalizer store serve` over a fresh directory, no tokens."""
    port = free_port()
    directory = tmp_path_factory.mktemp("gym-wheel-store")
    args = ["store", "serve", "--port", str(port), "--dir", str(directory)]
    with running_process(args, port=port):
        yield f"http://127.0.0.1:{port}"
