"""config/prometheus: the alert rules are valid for the pinned Prometheus (`promtool check rules`), each
alert fires and stays quiet when its unit tests say (`promtool test rules`), and every series the rules and
the Grafana dashboard read is one the operator serves (its registry, as docs/reference/conditions.md
lists it), so renaming a metric cannot silently blind an alert. (A real Prometheus scraping a running
operator and firing an alert: test/controllers/test_alerts.py.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pko.devtools import apiref_tables
from pko.devtools.builds import tool_binary
from pko.devtools.prometheus import PROMETHEUS_DIR, rule_spec

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = PROMETHEUS_DIR / "grafana-dashboard.json"
# A metric name in PromQL: an identifier not followed by "(" (a function) nor inside {..} or "..".
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "unless",
    "and",
    "or",
    "bool",
}


def dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool_binary("build-prometheus.sh", "promtool"), *args],
        cwd=cwd, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def series_names(expr: str) -> set[str]:
    """The metric names an expression reads (labels, strings, functions and keywords left out)."""
    expr = re.sub(r'"[^"]*"', "", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)
    names = set()
    for match in _IDENT.finditer(expr):
        rest = expr[match.end() :].lstrip()
        if rest.startswith("(") or match.group() in _PROMQL_WORDS:
            continue
        names.add(match.group())
    return names


def served_series() -> set[str]:
    """What the operator's registry serves, histogram and counter series included."""
    names = set()
    for row in apiref_tables._metric_rows():
        name, type_ = row[0].strip("`"), row[1]
        names.add(name)
        if type_ == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


@pytest.fixture
def rules_dir(tmp_path: Path) -> Path:
    """The rule spec as the plain rule file promtool and Prometheus read, beside the unit tests."""
    (tmp_path / "pko.rules.json").write_text(json.dumps(rule_spec()))
    shutil.copy(PROMETHEUS_DIR / "prometheusrule_test.yaml", tmp_path)
    return tmp_path


def test_the_rules_are_valid(rules_dir: Path) -> None:
    proc = promtool("check", "rules", "pko.rules.json", cwd=rules_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    alerts = [r["alert"] for g in rule_spec()["groups"] for r in g["rules"]]
    assert f"SUCCESS: {len(alerts)} rules found" in proc.stdout


def test_every_alert_fires_and_stays_quiet_as_its_unit_tests_say(rules_dir: Path) -> None:
    proc = promtool("test", "rules", "prometheusrule_test.yaml", cwd=rules_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tested = set(re.findall(r"alertname: (\w+)", (PROMETHEUS_DIR / "prometheusrule_test.yaml").read_text()))
    alerts = {r["alert"] for g in rule_spec()["groups"] for r in g["rules"]}
    assert alerts <= tested, f"alerts without a unit test: {sorted(alerts - tested)}"


def test_the_dashboards_queries_parse(tmp_path: Path) -> None:
    """Each panel's query as a recording rule: promtool parses every expression of a rule file."""
    rules = [{"record": f"pko:dashboard:{i}", "expr": e} for i, e in enumerate(dashboard_exprs())]
    (tmp_path / "dashboard.rules.json").write_text(json.dumps({"groups": [{"name": "d", "rules": rules}]}))
    proc = promtool("check", "rules", "--lint=none", "dashboard.rules.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_series_read_is_served() -> None:
    served = served_series()
    exprs = [r["expr"] for g in rule_spec()["groups"] for r in g["rules"]] + dashboard_exprs()
    read = set().union(*(series_names(e) for e in exprs))
    assert read, "no series found in the rules and the dashboard"
    assert read <= served, f"read but not served by the operator: {sorted(read - served)}"


def test_series_names_reads_only_metric_names() -> None:
    expr = 'sum by (type, le) (rate(pko_update_duration_seconds_bucket{result="x"}[30m])) / time() > 1'
    assert series_names(expr) == {"pko_update_duration_seconds_bucket"}
    assert series_names('absent(up{name="a b"} == 1) unless on (namespace) stacks_failing') == {
        "up",
        "stacks_failing",
    }
