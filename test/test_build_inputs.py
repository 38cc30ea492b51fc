"""An image is rebuilt when what it is built from changes (hack/build-images.sh hashes its inputs): the
agent image's inputs must cover every module of pko that the agent imports, or a change there ships a
stale agent (pko/version.py and pko/git were once missing: the agent said the old version)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# pko's import name -> its folder in the repository (pyproject's package-dir).
ROOTS = {"pko.agent": "agent", "pko.api": "api"}


def _path(module: str) -> Path:
    for name, folder in ROOTS.items():
        if module == name or module.startswith(name + "."):
            return REPO / folder / module.removeprefix(name).lstrip(".").replace(".", "/")
    return REPO / module.replace(".", "/")


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pko"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("pko")}
    return found


def test_the_agent_image_hash_covers_what_the_agent_imports() -> None:
    script = (REPO / "hack" / "build-images.sh").read_text()
    inputs = re.search(r'agent_hash="\$\(inputs_hash "" ((?:[^)]|\n)*)\)"', script)
    assert inputs, "no agent_hash line in hack/build-images.sh"
    hashed = [REPO / p for p in inputs.group(1).replace("\\\n", " ").split()]
    sources: dict[str, Path] = {}
    todo = set().union(*(_imports(p) for p in (REPO / "agent").glob("*.py")))
    while todo:  # what the agent imports, and what that imports (the closure)
        module = todo.pop()
        base = _path(module)
        py = base.with_suffix(".py")
        sources[module] = py if py.exists() else base / "__init__.py"
        if sources[module].exists():
            todo |= _imports(sources[module]) - set(sources)
    missing = []
    for module, source in sorted(sources.items()):
        if not any(source == h or h in source.parents for h in hashed):
            missing.append(f"{module} ({source.relative_to(REPO)})")
    assert not missing, f"the agent imports these, but its image hash does not read them: {missing}"
