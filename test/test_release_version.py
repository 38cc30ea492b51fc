"""The version is written once (``pko.version.VERSION``); everything that shows it must say the same."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import yaml
from setuptools.config.expand import read_attr

from pko.version import VERSION

REPO = Path(__file__).resolve().parent.parent


def test_the_version_is_semver_0_n_m_until_the_api_is_stable() -> None:
    from pko.devtools.releasefiles import validate_version

    assert validate_version(f"v{VERSION}", VERSION) == VERSION


def test_pyproject_reads_the_version_from_the_code() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert read_attr(attr, package_dir={"pko": str(REPO / "pko")}, root_dir=REPO) == VERSION


def test_the_operator_the_agent_and_the_plugin_print_it() -> None:
    for module, prog in (("pko", "pko"), ("pko.agent", "agent"), ("pko.kubectl", "kubectl-pko")):
        out = subprocess.run(
            [sys.executable, "-m", module, "--version"], capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == f"{prog} {VERSION}"


def test_the_chart_is_the_version() -> None:
    chart = yaml.safe_load((REPO / "charts/pko/Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == (VERSION, VERSION)


def test_the_changelog_has_an_entry_for_it() -> None:
    assert f"\n## [{VERSION}] - " in (REPO / "CHANGELOG.md").read_text()


def test_released_images_are_labelled_with_it() -> None:
    from pko.devtools.releasefiles import oci_labels

    labels = oci_labels(VERSION, "0" * 40, "https://example.test/pko")
    assert labels["org.opencontainers.image.version"] == VERSION
    assert (
        labels["org.opencontainers.image.licenses"]
        == tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["license"]
    )
