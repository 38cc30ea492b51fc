"""A real Prometheus for the tests (hack/build-prometheus.sh builds it; test/ and e2e/ use it): started
on loopback with a scrape config and rule files the test gives, queried over its HTTP API, stopped with
its data."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from pko.devtools.builds import tool_binary

__all__ = [
    "PROMETHEUS_DIR",
    "Prometheus",
    "rule_spec",
    "rules_without_waiting",
    "running_prometheus",
    "scrape_pko",
]

PROMETHEUS_DIR = Path(__file__).resolve().parents[2] / "config" / "prometheus"


def rule_spec() -> dict[str, Any]:
    """The shipped PrometheusRule's spec: the rule file a plain Prometheus (and promtool) reads."""
    doc = yaml.safe_load((PROMETHEUS_DIR / "prometheusrule.yaml").read_text())
    assert doc["kind"] == "PrometheusRule" and doc["apiVersion"] == "monitoring.coreos.com/v1"
    spec: dict[str, Any] = doc["spec"]
    return spec


def rules_without_waiting() -> dict[str, Any]:
    """The shipped rules evaluated each second with no ``for``: a test sees an alert fire at once
    (the durations are promtool's to test: test/test_prometheus_rules.py)."""
    spec: dict[str, Any] = json.loads(json.dumps(rule_spec()))
    for group in spec["groups"]:
        group["interval"] = "1s"
        for rule in group["rules"]:
            rule.pop("for", None)
    return spec


def scrape_pko(target: str, token_file: Path, interval: str = "1s") -> dict[str, Any]:
    """A config that scrapes the operator at ``target`` (host:port) as a deployed Prometheus does
    (docs/metrics.md): HTTPS (its self-signed certificate, so no verification) with the bearer token
    in ``token_file``, every ``interval``, evaluating rules as often."""
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [
            {
                "job_name": "pko",
                "scheme": "https",
                "tls_config": {"insecure_skip_verify": True},
                "authorization": {"credentials_file": str(token_file)},
                "static_configs": [{"targets": [target]}],
            }
        ],
    }


class Prometheus:
    """Prometheus's HTTP API at ``url``."""

    def __init__(self, url: str, log: Path) -> None:
        self.url = url
        self.log = log

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as response:
            body = json.loads(response.read())
        assert body.get("status") == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector: ``[{"metric": {...}, "value": [t, "v"]}, ...]``."""
        result: list[dict[str, Any]] = self.get("/api/v1/query", query=expr)["result"]
        return result

    def alerts(self, state: str = "firing") -> list[dict[str, Any]]:
        return [a for a in self.get("/api/v1/alerts")["alerts"] if a["state"] == state]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running_prometheus(
    workdir: Path, config: dict[str, Any], rules: dict[str, Any] | None = None
) -> Iterator[Prometheus]:
    """Prometheus with ``config`` (its ``rule_files`` set to ``rules``, a rule file's content, if
    given) on a free loopback port until the block ends. Wait for :meth:`Prometheus.ready` before use."""
    workdir.mkdir(parents=True, exist_ok=True)
    if rules is not None:
        (workdir / "rules.yaml").write_text(yaml.safe_dump(rules))
        config = {**config, "rule_files": [str(workdir / "rules.yaml")]}
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = _free_port()
    log = workdir / "prometheus.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                tool_binary("build-prometheus.sh", "prometheus"),
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield Prometheus(f"http://127.0.0.1:{port}", log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
