"""The hot-path bench's report: ratio tables and the store server's profile summary."""

from __future__ import annotations

from pathlib import Path

from bench._hotpath_driver import SideSamples
from bench._hotpath_report import (
    Row,
    goal_summary,
    growth_table,
    main_tables,
    profile_summary,
    tracing_table,
)


def _row(side: str, baseline: bool, scale: float) -> Row:
    samples = SideSamples(
        capture=[scale] * 3,
        resolve=[scale] * 3,
        begin=[scale] * 3,
        put=[scale] * 3,
        turns=[0, 1, 2],
        alone=[scale],
        burst=[scale],
    )
    return Row("delta", side, 3, samples, baseline=baseline)


def test_main_tables_give_each_side_its_ratio_to_the_baseline() -> None:
    """A side three times slower than the baseline reads 3.0x in every ratio column."""
    lines = main_tables([_row("gym stand-in", True, 2.0), _row("ours dir", False, 6.0)])
    (ratios,) = [line for line in lines if line.startswith("delta  ours dir") and "x" in line]
    assert ratios.split()[3:] == ["3.0x"] * 10


def test_growth_table_brackets_the_ratio() -> None:
    """Growth rows carry each figure with its ratio to the baseline of the same length."""
    lines = growth_table([_row("gym stand-in", True, 2.0), _row("ours dir", False, 6.0)])
    assert lines[-1].split()[4:] == ["6.0", "(3.0x)"] * 4


def test_tracing_table_divides_each_traced_side_by_its_plain_twin() -> None:
    """Traced 1.25x its twin: both p50s, the added ms, CPU per call off -> on, 1.25x ratios."""
    plain, traced = _row("ours dir", False, 4.0), _row("traced dir", False, 5.0)
    plain.samples.server_cpu_s, traced.samples.server_cpu_s = 0.003, 0.006
    plain.samples.client_cpu_s, traced.samples.client_cpu_s = 0.0015, 0.00225
    rows = [_row("gym stand-in", True, 1.0), plain, traced, _row("ours redis", False, 8.0)]
    (_, line) = tracing_table(rows)
    assert line.split() == [
        *["delta", "dir", "4.00", "5.00", "+1.00"],
        *["1.000", "->", "2.000", "0.500", "->", "0.750"],
        *["1.25x", "1.25x"],
    ]


def test_goal_summary_says_which_goal_is_met() -> None:
    """A side 3x the baseline misses the 2x goals; its 6 ms alone misses the 3 ms goal."""
    (_, line) = goal_summary([_row("gym stand-in", True, 2.0), _row("ours dir", False, 6.0)], [])
    assert "capture p99 3.0x (NOT met)" in line and "alone p50 6.0 ms (NOT met)" in line


def test_goal_summary_lists_the_growth_ratios_by_length() -> None:
    """Growth rows give one ratio per rollout length, shortest first."""
    rows = [
        Row("delta", "gym stand-in", 10, _row("", True, 2.0).samples, baseline=True),
        Row("delta", "ours dir", 10, _row("", False, 4.0).samples),
        Row("delta", "gym stand-in", 50, _row("", True, 2.0).samples, baseline=True),
        Row("delta", "ours dir", 50, _row("", False, 2.0).samples),
    ]
    assert goal_summary([], rows)[-1].endswith("capture p50 ratio by length: 10: 2.0x, 50: 1.0x")


def test_profile_summary_ranks_innermost_frames_by_share(tmp_path: Path) -> None:
    """Self shares count the innermost frame of each stack, path shortened to its package."""
    raw = tmp_path / "store-dir-delta.txt"
    root = "run (/x/.venv/lib/python3.11/site-packages/uvicorn/server.py:10)"
    read = "_read_entries (/x/service/token_finalizer/sources/file.py:570)"
    raw.write_text(f"{root};{read};loads (<built-in>) 3\n{root};{read} 1\n")
    lines = profile_summary(raw)
    assert lines[2:4] == [
        "     75.0%  loads (<built-in>)",
        "     25.0%  _read_entries (token_finalizer/sources/file.py)",
    ]


def test_profile_summary_credits_our_functions_once_per_stack(tmp_path: Path) -> None:
    """Inclusive shares list only our functions, each counted once however deep it recurses."""
    raw = tmp_path / "store-redis-full.txt"
    ours = "resolve (/x/service/token_finalizer/core/lineage_resolution.py:{})"
    raw.write_text(f"{ours.format(1)};{ours.format(9)};sha (<built-in>) 2\nhash (<built-in>) 2\n")
    lines = profile_summary(raw)
    inclusive = lines[lines.index("  inclusive (ours):") + 1 :]
    assert inclusive == ["     50.0%  resolve (token_finalizer/core/lineage_resolution.py)"]


def test_profile_summary_leaves_waiting_threads_out_of_the_shares(tmp_path: Path) -> None:
    """Samples of the event loop's poll count as waiting: the busy rest makes 100%."""
    raw = tmp_path / "store-dir-full.txt"
    poll = "EpollSelector.select (/usr/lib/python3.11/selectors.py:468)"
    raw.write_text(f"{poll} 9\nwork (/x/service/token_finalizer/sources/file.py:1) 1\n")
    lines = profile_summary(raw)
    assert lines[0].endswith("1 busy samples of 10 (the rest wait for work)")
    assert lines[2] == "    100.0%  work (token_finalizer/sources/file.py)"
