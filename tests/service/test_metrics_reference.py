"""The metrics tables of the docs list exactly the families both servers' /metrics export.

Each server runs as a real process (`serve` over a file source, `store
serve` over a directory) and its live exposition is read: every family
(ours and the process collector's) must be named in a row of its table (docs/finalizer-api.md,
docs/store-protocol.md#metrics) and every row a family, and no family may be
a `*_created` series, neither from one process nor from the sum over
`--workers 2` (prometheus-client's multiprocess collector), which exports
the same families on both servers.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.servers import free_port, running_process

ROOT = Path(__file__).resolve().parents[2]
TOKEN = {"Authorization": "Bearer t"}
_ROW = re.compile(r"^\| (`\w+`(?:, `\w+`)*)", re.MULTILINE)
_NAME = re.compile(r"`(\w+)`")
_TYPE = re.compile(r"^# TYPE (\S+) \w+$", re.MULTILINE)


def _documented(page: str, section: str | None = None) -> set[str]:
    text = (ROOT / "docs" / page).read_text()
    if section is not None:
        text = text.split(section, 1)[1].split("\n### ", 1)[0]
    return {name for row in _ROW.findall(text) for name in _NAME.findall(row)}


def _families(base: str) -> set[str]:
    answer = httpx.get(base + "/metrics", headers=TOKEN, timeout=10)
    assert answer.status_code == 200
    names = _TYPE.findall(answer.text)
    assert len(names) == len(set(names)), "a family exported twice"
    return set(names)


@pytest.fixture(scope="module")
def finalizer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[set[str]]:
    """The families of a running `serve`'s /metrics."""
    where = tmp_path_factory.mktemp("finalizer")
    config = where / "config.yaml"
    config.write_text(f"sources:\n  local: {{kind: file, dir: '{where}'}}\n")
    port = free_port()
    with running_process(["serve", "--config", str(config), "--port", str(port)], port=port):
        yield _families(f"http://127.0.0.1:{port}")


def _store_families(where: Path, *extra: str) -> set[str]:
    port = free_port()
    args = ["store", "serve", "--dir", str(where), "--port", str(port), "--token", "t", *extra]
    with running_process(args, port=port):
        return _families(f"http://127.0.0.1:{port}")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The families of a running `store serve`'s /metrics."""
    return _store_families(tmp_path_factory.mktemp("store"))


def test_finalizer_table_is_the_live_families(finalizer: set[str]) -> None:
    """docs/finalizer-api.md's metrics table lists exactly the families `serve` exports."""
    section = _documented("finalizer-api.md", "## Health, readiness, metrics")
    table = {name for name in section if name.startswith(("token_finalizer_", "process_"))}
    assert table == finalizer


def test_store_table_is_the_live_families(store: set[str]) -> None:
    """docs/store-protocol.md#metrics lists exactly the families `store serve` exports."""
    assert _documented("store-protocol.md", "### Metrics") == store


def test_no_created_families(finalizer: set[str], store: set[str]) -> None:
    """Neither server exports a `*_created` family."""
    assert [name for name in finalizer | store if name.endswith("_created")] == []


def test_no_created_families_summed_over_workers(tmp_path: Path) -> None:
    """`store serve --workers 2` (the multiprocess sum) exports no `*_created` family either."""
    families = _store_families(tmp_path, "--workers", "2")
    assert "token_finalizer_store_requests_total" in families
    assert [name for name in families if name.endswith("_created")] == []


def test_store_table_holds_summed_over_workers(tmp_path: Path, store: set[str]) -> None:
    """`store serve --workers 2` exports the same families as one worker: the table holds."""
    assert _store_families(tmp_path, "--workers", "2") == store


def test_finalizer_summed_over_workers_exports_the_same_families(
    tmp_path: Path, finalizer: set[str]
) -> None:
    """`serve --workers 2` exports the families of one worker, and no `*_created` one."""
    config = tmp_path / "config.yaml"
    config.write_text(f"sources:\n  local: {{kind: file, dir: '{tmp_path}'}}\n")
    port = free_port()
    args = ["serve", "--config", str(config), "--port", str(port), "--workers", "2"]
    with running_process(args, port=port):
        families = _families(f"http://127.0.0.1:{port}")
    assert families == finalizer
