"""deploy/grafana/pplex-trio.json and deploy/prometheus/alerts.yml, checked against the server's /metrics.

Every metric a panel or an alert reads must be one the real server exports,
under the name its type gives it (``_bucket``, ``_sum``, ``_count`` of a
histogram, ``_total`` of a counter, a gauge's own name); the names come from a
live ``/metrics`` (its ``# TYPE`` lines, there before the first sample).
Debian's ``promtool`` (``bash .ci/setup --test`` installs it) loads the rules
as Prometheus would, runs them on made-up series (tests/deploy/alerts_test.yml)
and parses every PromQL expression of the dashboard.
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

REPO = pathlib.Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "pplex-trio.json"
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
ALERTS_TEST = pathlib.Path(__file__).with_name("alerts_test.yml")

PROMETHEUS_OWN = {"up"}  # series Prometheus writes itself for every target
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}

_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
}


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression reads (functions, keywords, labels and Grafana variables left out)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings (label values, regexes)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)  # label lists
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\$\w+", " ", expr)  # matchers, ranges, variables
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][\w:]*)(\s*\()?", expr):
        if match.group(2) is None and match.group(1).lower() not in _KEYWORDS:
            names.add(match.group(1))
    return names


def series_names(family: str, kind: str) -> set[str]:
    return {family + suffix for suffix in SUFFIXES.get(kind, ())}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_exprs() -> dict[str, str]:
    """Every PromQL expression of the dashboard, by where it is: the panels' targets and the variables' queries."""
    exprs = {}
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            exprs[f"panel {panel['id']} {target['refId']}"] = target["expr"]
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"]
            found = re.fullmatch(r"label_values\((.+),\s*\w+\)", query)
            assert found, f"variable {variable['name']}: a label_values(series, label) query, not {query!r}"
            exprs[f"variable {variable['name']}"] = found.group(1)
    return exprs


def alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def every_reference() -> dict[str, set[str]]:
    """Series name -> where it is read."""
    where: dict[str, set[str]] = {}
    exprs = dashboard_exprs() | {f"alert {rule['alert']}": rule["expr"] for rule in alert_rules()}
    for place, expr in exprs.items():
        for name in metric_names(expr):
            where.setdefault(name, set()).add(place)
    return where


def test_metric_names_are_read_out_of_promql():
    expr = (
        'histogram_quantile(0.99, sum by (le, instance) (rate(pplex_a_bucket{instance=~"$instance", '
        'x="by (y)"}[$__rate_interval]))) > 0.01 and on (instance) pplex_b == bool 1 or vector(0) '
        'unless up{job="pplex-trio"} offset 5m'
    )
    assert metric_names(expr) == {"pplex_a_bucket", "pplex_b", "up"}


@pytest.fixture
async def exported(virtual_server) -> set[str]:
    """The series names the real server's /metrics exports, from its families' types (the test asks for
    ``autojump_clock``)."""
    handle = await virtual_server()
    return {
        name
        for family in text_string_to_metric_families(await handle.metrics())
        for name in series_names(family.name, family.type)
    }


def allowed_names(exported: set[str]) -> set[str]:
    return exported | PROMETHEUS_OWN


async def test_the_dashboard_and_the_alerts_read_only_exported_metrics(exported, autojump_clock):
    references = every_reference()
    assert {name for name in references if name.startswith("pplex_")} >= {
        "pplex_slots",
        "pplex_queued",
        "pplex_tick_lateness_seconds_bucket",
        "pplex_engine_stalled",
        "pplex_added_latency_stage_seconds_bucket",
        "pplex_frames_dropped_total",
        "pplex_unready",
        "pplex_response_latency_seconds_bucket",
        "pplex_barge_ins_total",
        "pplex_resumes_total",
    }
    unknown = {name: sorted(places) for name, places in references.items() if name not in allowed_names(exported)}
    assert not unknown, f"not exported by the server (or not under this name for its type): {unknown}"


def test_the_dashboard_is_one_grafana_imports():
    board = dashboard()
    assert board["schemaVersion"] >= 36 and board["uid"] == "pplex-trio"
    variables = {variable["name"]: variable for variable in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["instance"]["includeAll"] and variables["instance"]["multi"]
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    rows = [panel["title"] for panel in board["panels"] if panel["type"] == "row"]
    assert rows == [
        "Capacity",
        "Timing",
        "Latency stages",
        "Drops",
        "Quality",
        "Errors and refusals",
        "Per replica",
        "Resumes",
        "WebRTC",
    ]
    for panel in board["panels"]:
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"} and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert 'instance=~"$instance"' in target["expr"], (panel["title"], target["expr"])
            assert target["datasource"]["uid"] == "${datasource}"


async def test_the_resumes_panel_shows_each_outcome_the_server_counts_and_the_held_slots(
    virtual_server, autojump_clock
):
    handle = await virtual_server()
    (family,) = [f for f in text_string_to_metric_families(await handle.metrics()) if f.name == "pplex_resumes"]
    outcomes = {sample.labels["outcome"] for sample in family.samples if sample.name == "pplex_resumes_total"}
    assert outcomes == {"resumed", "expired", "refused", "wrong_token"}
    panels = {panel["title"]: panel for panel in dashboard()["panels"]}
    resumes = panels["Resumes /s, by outcome"]
    (target,) = resumes["targets"]
    assert target["expr"].startswith("sum by (outcome) (rate(pplex_resumes_total{") and target["legendFormat"] == (
        "{{outcome}}"
    )
    assert all(outcome in resumes["description"] for outcome in outcomes)  # each line explained
    held = panels["Held slots (paused calls, returning clients)"]
    assert 'pplex_slots{state="held",' in held["targets"][0]["expr"]  # (a paused call's slot counts as held)


def test_the_alerts_are_the_ones_docs_deploy_describes():
    rules = {rule["alert"]: rule for rule in alert_rules()}
    assert set(rules) == {
        "PplexTicksLate",
        "PplexEngineStalled",
        "PplexSlotsExhaustedWithQueue",
        "PplexFramesDroppedRising",
        "PplexReplicaNotReady",
        "PplexReplicaDown",
        "PplexResponseLatencyHigh",
    }
    deploy_doc = (REPO / "docs" / "DEPLOY.md").read_text()
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in ("warning", "critical") and re.fullmatch(r"\d+[sm]", rule["for"])
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        assert f"`{name}`" in deploy_doc, f"docs/DEPLOY.md does not say what {name} means"


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed: `bash .ci/setup --test` installs Debian's (apt-get install prometheus)")
    return found


def run_promtool(*args: str | pathlib.Path) -> None:
    done = subprocess.run([promtool(), *map(str, args)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_prometheus_loads_the_alert_rules():
    run_promtool("check", "rules", ALERTS)


def test_the_alerts_fire_on_made_up_series(tmp_path):
    """tests/deploy/alerts_test.yml on the rules without their annotations (whose text it would compare)."""
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations")
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(rules))
    shutil.copy(ALERTS_TEST, tmp_path / "alerts_test.yml")
    run_promtool("test", "rules", tmp_path / "alerts_test.yml")


def test_every_dashboard_query_is_valid_promql(tmp_path):
    """The dashboard's expressions, Grafana's variables filled in, as recording rules promtool parses."""
    rules = [
        {"record": f"dashboard:expr_{n}", "expr": expr.replace("$__rate_interval", "5m").replace("$instance", ".*")}
        for n, expr in enumerate(dashboard_exprs().values())
    ]
    (tmp_path / "dashboard.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    run_promtool("check", "rules", tmp_path / "dashboard.yml")
