"""pko.git's modules import one way (lsremote -> ssh -> remote), deferred imports included."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

GIT = Path(__file__).resolve().parents[2] / "pko" / "git"


def git_imports(path: Path) -> set[str]:
    """The pko.git modules ``path`` imports anywhere (a function's deferred import counts too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "pko.git":
                found.update(alias.name for alias in node.names)
            elif node.module.startswith("pko.git."):
                found.add(node.module.removeprefix("pko.git."))
        elif isinstance(node, ast.Import):
            found.update(a.name.removeprefix("pko.git.") for a in node.names if a.name.startswith("pko.git."))
    return found


def test_the_pko_git_modules_form_no_import_cycle() -> None:
    modules = {p.stem for p in GIT.glob("*.py") if p.stem != "__init__"}
    graph = {m: git_imports(GIT / f"{m}.py") & modules for m in modules}
    assert graph["ssh"] >= {"remote"} and "ssh" in graph["lsremote"]  # the graph is read at all

    def cycle_from(start: str, path: tuple[str, ...]) -> tuple[str, ...] | None:
        for nxt in sorted(graph[start]):
            if nxt in path:
                return (*path[path.index(nxt) :], nxt)
            found = cycle_from(nxt, (*path, nxt))
            if found:
                return found
        return None

    cycles = [c for m in sorted(modules) if (c := cycle_from(m, (m,)))]
    assert not cycles, f"import cycles in pko.git: {cycles}"


@pytest.mark.parametrize(
    "order", [("pko.git.ssh", "pko.git.remote"), ("pko.git.remote", "pko.git.ssh"), ("pko.git.lsremote",)]
)
def test_each_module_imports_first_in_a_fresh_interpreter(order: tuple[str, ...]) -> None:
    code = "; ".join(f"import {m}" for m in order)
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
