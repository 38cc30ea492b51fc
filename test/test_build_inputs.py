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


def _hashed(variable: str) -> list[str]:
    """The paths hack/build-images.sh hashes into ``variable`` (its ``inputs_hash`` line)."""
    script = (REPO / "hack" / "build-images.sh").read_text()
    inputs = re.search(rf'{variable}="\$\(inputs_hash "[^"]*" ((?:[^)]|\n)*)\)"', script)
    assert inputs, f"no {variable} line in hack/build-images.sh"
    return inputs.group(1).replace("\\\n", " ").split()


def test_the_workspace_image_hash_covers_its_build_context() -> None:
    """Every file the workspace image's build context admits (its .dockerignore allow-list: the locks, the
    Node.js packages, the build scripts) is read by its hash, and every COPY from the context is admitted:
    a lock added to the image without the hash (requirements-policy.lock, say) would ship a stale image."""
    ignore = (REPO / "images" / "workspace" / "Dockerfile.dockerignore").read_text().split()
    admitted = [line[1:] for line in ignore if line.startswith("!")]
    hashed = [REPO / p for p in _hashed("ws_hash")]
    assert "requirements-policy.lock" in admitted
    for path in admitted:
        source = REPO / path
        assert source.is_file(), f"the workspace image's context admits {path}, which does not exist"
        assert any(source == h or h in source.parents for h in hashed), f"ws_hash does not read {path}"
    dockerfile = (REPO / "images" / "workspace" / "Dockerfile").read_text().replace("\\\n", " ")
    copies = [line.split()[1:-1] for line in dockerfile.splitlines() if line.startswith("COPY ")]
    sources = [s for args in copies if not any(a.startswith("--from") for a in args) for s in args]
    sources = [s for s in sources if not s.startswith("--")]
    assert "requirements-policy.lock" in sources
    assert set(sources) <= set(admitted), (
        f"COPY of what the context does not admit: {set(sources) - set(admitted)}"
    )
