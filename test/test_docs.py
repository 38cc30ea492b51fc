"""The docs site builds strict, offline, and fails on what a reader would trip over.

``mkdocs build --strict`` of ``mkdocs.yml`` must pass. Its ``validation`` settings turn a broken link,
a page left out of the nav and a dangling anchor into warnings, which ``--strict`` makes fatal: each
of the three is proven here on a tiny copy of the site built with the real configuration. The README
is the front door: at most 200 lines, and every link in it (and in CONTRIBUTING.md) reaches a file,
and a heading of a docs page where it names one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README_MAX_LINES = 200


def load_config() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    return config


def build(config_file: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of ``config_file`` into ``site``, with no network needed."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config_file), "-d", str(site)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = build(REPO / "mkdocs.yml", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def nav_pages(nav: list[Any]) -> list[str]:
    pages: list[str] = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages.extend(nav_pages(value) if isinstance(value, list) else [value])
    return pages


def test_the_site_builds_strict(site: Path) -> None:
    assert (site / "index.html").is_file()
    assert (site / "search" / "search_index.json").is_file()


def test_every_page_is_in_the_nav_once() -> None:
    pages = nav_pages(load_config()["nav"])
    assert len(pages) == len(set(pages)), pages
    on_disk = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(pages) == on_disk


def test_the_build_fetches_nothing(site: Path) -> None:
    """No web fonts (``theme.font: false``) and no plugin that downloads (only the built-in search)."""
    config = load_config()
    assert config["theme"]["font"] is False
    assert config["plugins"] == ["search"]
    for page in site.rglob("*.html"):
        text = page.read_text()
        assert "fonts.googleapis.com" not in text and "fonts.gstatic.com" not in text, page


def test_validation_makes_the_three_mistakes_warnings() -> None:
    validation = load_config()["validation"]
    assert validation["nav"]["omitted_files"] == "warn"
    assert validation["nav"]["not_found"] == "warn"
    assert validation["links"]["not_found"] == "warn"
    assert validation["links"]["anchors"] == "warn"
    assert validation["links"]["unrecognized_links"] == "warn"


# --- a tiny copy of the site, broken on purpose ------------------------------------------------

GOOD = {
    "index.md": "# Home\n\nSee [the other page](other.md#a-heading).\n",
    "other.md": "# Other\n\n## A heading\n\nText.\n",
}
BROKEN = {
    "a broken link": (
        {**GOOD, "index.md": "# Home\n\nSee [a page](missing.md).\n"},
        "contains a link 'missing.md', but the target is not found",
    ),
    "a page missing from the nav": (
        {**GOOD, "stray.md": "# Stray\n"},
        "are not included in the \"nav\" configuration",
    ),
    "a dangling anchor": (
        {**GOOD, "index.md": "# Home\n\nSee [the other page](other.md#no-such-heading).\n"},
        "does not contain an anchor '#no-such-heading'",
    ),
}


def tiny_site(tmp_path: Path, pages: dict[str, str]) -> Path:
    """A copy of the site's configuration over ``pages``, with a nav of ``GOOD``'s pages."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in pages.items():
        (docs / name).write_text(text)
    config = {**load_config(), "docs_dir": "docs", "nav": [{"Home": "index.md"}, {"Other": "other.md"}]}
    config_file = tmp_path / "mkdocs.yml"
    config_file.write_text(yaml.safe_dump(config))
    return config_file


def test_the_tiny_copy_builds_when_nothing_is_broken(tmp_path: Path) -> None:
    proc = build(tiny_site(tmp_path, GOOD), tmp_path / "site")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("mistake", sorted(BROKEN))
def test_a_mistake_fails_the_build(tmp_path: Path, mistake: str) -> None:
    pages, warning = BROKEN[mistake]
    proc = build(tiny_site(tmp_path, pages), tmp_path / "site")
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert warning in output, output
# --- the front door ----------------------------------------------------------------------------

_LINK = re.compile(r"\]\(([^)\s]+)\)")


def local_links(path: Path) -> list[str]:
    return [t for t in _LINK.findall(path.read_text()) if not re.match(r"[a-z]+:", t)]


def test_the_readme_is_short() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"


@pytest.mark.parametrize("name", ["README.md", "CONTRIBUTING.md"])
def test_front_door_links_reach_their_target(site: Path, name: str) -> None:
    """Each relative link names a file of the repository; one into docs/ with ``#x`` names a heading."""
    source = REPO / name
    for target in local_links(source):
        file, _, anchor = target.partition("#")
        assert file, f"{name}: an anchor of its own ({target}): link into docs/ instead"
        assert (REPO / file).exists(), f"{name}: {target}: no such file"
        if anchor and file.startswith("docs/") and file.endswith(".md"):
            page = file.removeprefix("docs/").removesuffix(".md")
            html = site / ("index.html" if page == "index" else f"{page}/index.html")
            assert f'id="{anchor}"' in html.read_text(), f"{name}: {target}: no such heading"
