"""The full-store bench at a tiny size: the store fills, refuses with 507 only, drains, resumes.

Nothing here is timed; the run checks what the bench reports on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench._full_store_run import full_store_run
from bench._hotpath_workload import Workload
from bench.full_store import report
from tests.support.redis_processes import needs_redis_server

pytestmark = needs_redis_server


@pytest.mark.parametrize("mark", ["0.9", "off"])
def test_a_full_store_refuses_with_507_only_then_resumes(tmp_path: Path, mark: str) -> None:
    """Two writers fill 8 MB: refusals are 507s, no other error, retires work, writes resume."""
    workload = Workload(rollouts=2, calls=12, delta=False, new_prompt_tokens=800)
    run = full_store_run(tmp_path, mark=mark, maxmemory="8mb", workload=workload, full_calls=3)
    assert run.refused_507 > 0 and run.other_errors == []
    assert run.retired > 0 and run.retire_failures == 0 and run.resumed
    assert len(report([run])) == 5
