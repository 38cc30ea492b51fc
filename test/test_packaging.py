"""The distribution installs one import namespace, `pko`, from a wheel as well as editable."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FOLDER_OF = {"pko": REPO / "pko", "pko.api": REPO / "api", "pko.agent": REPO / "agent"}
# Packages deliberately left out of the wheel, with the reason.
NOT_SHIPPED = {
    # Support for the tests and the tools (pko/devtools/__init__.py): importable from a checkout (the
    # editable install, or `python3 -m` from the repository root), of no use in the images.
    "pko.devtools",
}


def _declared_packages() -> list[str]:
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages: list[str] = cfg["tool"]["setuptools"]["packages"]
    return packages


def _package_folders() -> set[str]:
    """Every folder with an __init__.py under the three roots, as its import name."""
    found: set[str] = set()
    for root_name, root in FOLDER_OF.items():
        for init in root.rglob("__init__.py"):
            rel = init.parent.relative_to(root)
            if "__pycache__" in rel.parts:
                continue
            found.add(".".join([root_name, *rel.parts]) if rel.parts else root_name)
    return found


def test_every_package_folder_is_declared() -> None:
    shipped = {p for p in _package_folders() if not any(p == n or p.startswith(f"{n}.") for n in NOT_SHIPPED)}
    missing = shipped - set(_declared_packages())
    assert not missing, f"add these to [tool.setuptools] packages in pyproject.toml: {sorted(missing)}"


def test_the_support_package_is_importable_but_not_shipped() -> None:
    import pko.devtools.waiting

    assert Path(pko.devtools.waiting.__file__).parent == REPO / "pko" / "devtools"
    assert not NOT_SHIPPED & set(_declared_packages())


def test_editable_install_imports_the_namespace() -> None:
    import pko.agent
    import pko.api

    import pko

    assert Path(pko.api.__file__).parent == REPO / "api"
    assert Path(pko.agent.__file__).parent == REPO / "agent"


@pytest.mark.slow
def test_wheel_installs_only_pko_into_a_fresh_venv(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(REPO)],
        check=True,
        capture_output=True,
    )
    (wheel,) = dist.glob("pko-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        tops = {n.split("/", 1)[0] for n in zf.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"pko"}, tops
    assert not any(n.startswith("pko/devtools/") for n in zf.namelist())

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=False, with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
    )
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # Dependencies come from this interpreter's site-packages, appended after the venv's own (so
    # its editable-install finder is never activated): the test is about our layout, not PyPI.
    deps = [p for p in sys.path if p.endswith("site-packages")]
    code = f"import sys; sys.path.extend({deps!r}); import pko, pko.api, pko.agent; print(pko.api.__file__)"
    out = subprocess.run(
        [str(py), "-I", "-c", code], check=True, capture_output=True, text=True, cwd=tmp_path
    )
    assert f"{site}/pko/api/__init__.py" in out.stdout
    assert not (Path(site) / "api").exists() and not (Path(site) / "agent").exists()
