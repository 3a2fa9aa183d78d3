"""deploy/prometheus/ and deploy/grafana/: alert rules and the dashboard, checked as code.

The real `promtool` (Debian's `prometheus` package; .ci/run installs it)
checks the rules, runs their unit tests (alerts_test.yml) and parses every
expression of the dashboard, written out as recording rules. These tests skip
only where promtool is not on PATH. The others need no binary: every metric
name the rules and the dashboard use is one the servers export (the live
/metrics of the finalizer and of the store server, with the labels their
metrics declare), every alert has a case that fires and one that does not,
thresholds that mirror a server setting agree with it, and every alert has its
section in docs/operations.md.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from tests.support.asgi import in_process
from token_finalizer import MemoryTokenStore
from token_finalizer._constants import DEFAULT_MASK_FRACTION_MIN_SAMPLES, DEFAULT_MEMORY_HIGH_WATER
from token_finalizer.api import create_app
from token_finalizer.service.metrics import ServiceMetrics
from token_finalizer.settings import settings_from_mapping
from token_finalizer.store_server import create_store_app
from token_finalizer.store_server.metrics import StoreMetrics

ROOT = Path(__file__).resolve().parent.parent
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
ALERTS_TEST = ROOT / "deploy" / "prometheus" / "alerts_test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "token-finalizer.json"
OPERATIONS = ROOT / "docs" / "operations.md"

# A family: its type and its label names.
Family = tuple[str, frozenset[str]]

# Labels Prometheus adds to every scraped series.
_TARGET_LABELS = frozenset({"job", "instance"})
_TYPE_LINE = re.compile(r"^# TYPE (\S+) (\w+)$", re.MULTILINE)
_HISTOGRAM_SERIES = ("_bucket", "_count", "_sum")

# Grafana's variables, replaced by what they stand for before promtool reads an expression.
_GRAFANA_VARIABLES = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$__range": "1h",
    "$source": ".*",
}
_LABEL_VALUES = re.compile(r"^label_values\((\w+),\s*\w+\)$")

# PromQL words that are not metric names, and the clauses whose parentheses hold labels.
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
_KEYWORDS |= {"and", "or", "unless", "inf", "nan"}
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w.$])[a-zA-Z_:][\w:]*(?!\w)(?!\s*\()")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, labels and keywords left out)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values and string arguments
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = _LABEL_LISTS.sub(" ", text)
    return {name for name in _IDENTIFIER.findall(text) if name.lower() not in _KEYWORDS}


def _rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def _alerts() -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for rule in _rules() if "alert" in rule}


def _dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def _panels() -> list[dict[str, Any]]:
    return [panel for panel in _dashboard()["panels"] if panel["type"] != "row"]


def _dashboard_expressions() -> dict[str, str]:
    """Every PromQL expression of the dashboard by where it is, Grafana's variables replaced."""
    found = {}
    for panel in _panels():
        for target in panel["targets"]:
            found[f"panel {panel['id']} ({panel['title']}) {target['refId']}"] = target["expr"]
    for variable in _dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            match = _LABEL_VALUES.match(variable["query"]["query"])
            assert match is not None, f"variable {variable['name']}: not label_values(m, label)"
            found[f"variable {variable['name']}"] = match.group(1)
    for where, expr in found.items():
        for variable, value in _GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, f"{where}: a Grafana variable this test does not know: {expr}"
        found[where] = expr
    return found


def _series(families: dict[str, Family]) -> dict[str, frozenset[str]]:
    """The series names a scrape of these families carries (histograms as their three), with
    the labels each can have (the server's, `le` on buckets, and the target's)."""
    series = {}
    for family, (kind, labels) in families.items():
        if kind == "histogram":
            series[family + "_bucket"] = labels | {"le"} | _TARGET_LABELS
            series[family + "_count"] = series[family + "_sum"] = labels | _TARGET_LABELS
        else:
            series[family] = labels | _TARGET_LABELS
    return series


def _declared(metrics: object) -> dict[str, tuple[str, ...]]:
    """Each family's label names as its metric declares them (a family's name in the text)."""
    return {
        metric._name + ("_total" if metric._type == "counter" else ""): metric._labelnames
        for metric in vars(metrics).values()
        if isinstance(metric, MetricWrapperBase)
    }


def _live_families(exposition: str, metrics: object) -> dict[str, Family]:
    """The families of a live /metrics text, with the labels their metrics declare."""
    # Label names are only in the text once a series exists: read them where they are declared.
    declared = _declared(metrics)
    return {
        name: (kind, frozenset(declared.get(name, ())))
        for name, kind in _TYPE_LINE.findall(exposition)
    }


@pytest.fixture(scope="module")
def finalizer_families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Family]:
    """The families of the finalizer's live /metrics, with the labels its metrics declare."""
    capture = tmp_path_factory.mktemp("capture")
    settings = settings_from_mapping({"sources": {"local": {"kind": "file", "dir": str(capture)}}})
    with in_process(create_app(settings)) as client:
        answer = client.get("/metrics")
    assert answer.status_code == 200
    return _live_families(answer.text, ServiceMetrics())


@pytest.fixture(scope="module")
def store_families() -> dict[str, Family]:
    """The families of the store server's live /metrics, with the labels its metrics declare."""
    with in_process(create_store_app(MemoryTokenStore())) as client:
        answer = client.get("/metrics")
    assert answer.status_code == 200
    return _live_families(answer.text, StoreMetrics())


@pytest.fixture(scope="module")
def exported(
    finalizer_families: dict[str, Family], store_families: dict[str, Family]
) -> dict[str, frozenset[str]]:
    """Every series either server exports, with the labels it can have."""
    return _series(finalizer_families) | _series(store_families)


def test_store_families_are_read_with_their_labels(store_families: dict[str, Family]) -> None:
    """The store's live families carry their declared labels (shard gauges: `node`)."""
    assert store_families["token_finalizer_store_requests_total"] == (
        "counter",
        frozenset({"route", "role", "status"}),
    )
    assert store_families["token_finalizer_store_shard_writable"] == ("gauge", frozenset({"node"}))


def _used_series() -> dict[str, str]:
    """Every expression of the rules and the dashboard, by where it is."""
    used = {f"alert {rule['alert']}": rule["expr"] for rule in _rules()}
    return used | _dashboard_expressions()


@pytest.fixture(scope="module")
def promtool() -> str:
    """The promtool binary (Debian's `prometheus` package)."""
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not on PATH (.ci/run installs Debian's prometheus package)")
    return path


def _run(promtool: str, *args: str) -> None:
    done = subprocess.run(
        [promtool, *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"promtool {' '.join(args)}:\n{done.stdout}{done.stderr}"


def test_alert_rules_pass_promtool_check(promtool: str) -> None:
    """`promtool check rules` accepts deploy/prometheus/alerts.yml."""
    _run(promtool, "check", "rules", str(ALERTS))


def test_alert_unit_tests_pass(promtool: str) -> None:
    """`promtool test rules` passes every case of deploy/prometheus/alerts_test.yml."""
    _run(promtool, "test", "rules", str(ALERTS_TEST))


def test_every_dashboard_expression_parses(promtool: str, tmp_path: Path) -> None:
    """Each dashboard expression, as a recording rule, passes `promtool check rules`."""
    # Each rule is named after its panel, so promtool's complaint says which one.
    rules = [
        {"record": "dashboard:" + re.sub(r"\W+", "_", where).strip("_"), "expr": expr}
        for where, expr in _dashboard_expressions().items()
    ]
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    _run(promtool, "check", "rules", str(path))


def test_metric_names_finds_the_selected_metrics_only() -> None:
    """The name extractor keeps metrics and leaves out functions, labels, keywords and durations."""
    expr = (
        'histogram_quantile(0.99, sum by (le, route) (rate(a_seconds_bucket{route="x"}[5m])))'
        " / on (route) group_left b_total offset 5m > bool 0.5 unless c"
    )
    assert metric_names(expr) == {"a_seconds_bucket", "b_total", "c"}


def test_every_metric_the_rules_and_the_dashboard_use_is_exported(
    exported: dict[str, frozenset[str]],
) -> None:
    """Every metric name in alerts.yml and the dashboard is a series one of the servers exports."""
    used = _used_series()
    unknown = {
        where: sorted(metric_names(expr) - set(exported))
        for where, expr in used.items()
        if metric_names(expr) - set(exported)
    }
    assert unknown == {}
    assert all(metric_names(expr) for expr in used.values())


_SELECTOR = re.compile(r"([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}")
_MATCHER_LABEL = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")


def test_every_label_the_rules_and_the_dashboard_use_is_exported(
    exported: dict[str, frozenset[str]],
) -> None:
    """Each label matched or grouped on is one the selected series carries (or a target label)."""
    series = exported
    any_label = frozenset().union(*series.values())
    wrong = []
    for where, expr in _used_series().items():
        for name, matchers in _SELECTOR.findall(expr):
            unknown = set(_MATCHER_LABEL.findall(matchers)) - series[name]
            wrong += [f"{where}: {name} has no label {label}" for label in sorted(unknown)]
        for labels in _LABEL_LIST.findall(expr):
            listed = {label.strip() for label in labels.split(",") if label.strip()}
            wrong += [f"{where}: no series has label {label}" for label in listed - any_label]
    assert wrong == []


def test_alert_unit_tests_feed_series_shaped_like_the_servers(
    exported: dict[str, frozenset[str]],
) -> None:
    """Each input series of alerts_test.yml has exactly its family's labels, plus the target's."""
    series = exported
    for case in yaml.safe_load(ALERTS_TEST.read_text())["tests"]:
        for given in case["input_series"]:
            match = re.fullmatch(r"(\w+)\{(.*)\}", given["series"])
            assert match is not None, given["series"]
            labels = set(re.findall(r"(\w+)=", match.group(2)))
            assert labels == series[match.group(1)], given["series"]


def test_every_alert_has_a_case_that_fires_and_one_that_does_not() -> None:
    """alerts_test.yml expects each alert once with alerts and once with none."""
    fires: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(ALERTS_TEST.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (fires if check["exp_alerts"] else quiet).add(check["alertname"])
    assert fires == set(_alerts())
    assert quiet == set(_alerts())


def test_mask_fraction_alert_uses_the_deployed_guard_threshold() -> None:
    """TokenFinalizerMaskFractionHigh fires where deploy/'s guard refuses, on as many builds."""
    capture = yaml.safe_load((ROOT / "deploy" / "finalizer.yaml").read_text())["token_id_capture"]
    assert capture["mask_fraction_min_samples"] == DEFAULT_MASK_FRACTION_MIN_SAMPLES
    expr = " ".join(_alerts()["TokenFinalizerMaskFractionHigh"]["expr"].split())
    assert f") > {capture['max_mask_fraction']} and" in expr
    assert expr.endswith(f">= {capture['mask_fraction_min_samples']}")


def test_memory_alert_uses_the_store_high_water_mark() -> None:
    """TokenFinalizerStoreMemoryHigh fires from the fraction at which the store answers 507."""
    expr = _alerts()["TokenFinalizerStoreMemoryHigh"]["expr"].strip()
    assert expr.endswith(f">= {DEFAULT_MEMORY_HIGH_WATER}")


def _operations_sections() -> set[str]:
    return set(re.findall(r"^### (TokenFinalizer\w+)$", OPERATIONS.read_text(), re.MULTILINE))


def test_every_alert_has_its_section_in_the_operations_guide() -> None:
    """docs/operations.md has one section per alert, and each alert's runbook points to it."""
    alerts = _alerts()
    assert _operations_sections() == set(alerts)
    for name, rule in alerts.items():
        assert rule["annotations"]["runbook"] == f"docs/operations.md#{name.lower()}"


def _cells(panel: dict[str, Any]) -> Iterator[tuple[int, int]]:
    grid = panel["gridPos"]
    for x in range(grid["x"], grid["x"] + grid["w"]):
        for y in range(grid["y"], grid["y"] + grid["h"]):
            yield x, y


def test_dashboard_panels_have_unique_ids_and_do_not_overlap() -> None:
    """Panel ids are unique and no two panels share a cell of Grafana's 24-column grid."""
    panels = _dashboard()["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels)
    taken: dict[tuple[int, int], int] = {}
    for panel in panels:
        for cell in _cells(panel):
            assert cell[0] < 24
            assert taken.setdefault(cell, panel["id"]) == panel["id"], f"panel {panel['id']}"


def test_dashboard_queries_go_to_the_chosen_prometheus() -> None:
    """Every panel and query uses the dashboard's `datasource` variable, not a fixed uid."""
    chosen = {"type": "prometheus", "uid": "${datasource}"}
    for panel in _panels():
        assert panel["datasource"] == chosen
        assert all(target["datasource"] == chosen for target in panel["targets"])


def test_ci_installs_promtool_and_runs_the_checks() -> None:
    """.ci/run installs Debian's prometheus package when promtool is missing, and runs it."""
    script = (ROOT / ".ci" / "run").read_text()
    assert "apt-get install -y --no-install-recommends prometheus" in script
    assert "promtool check rules deploy/prometheus/alerts.yml" in script
    assert "promtool test rules deploy/prometheus/alerts_test.yml" in script
