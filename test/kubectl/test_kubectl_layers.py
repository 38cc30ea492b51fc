"""The plugin reads the Stack API's vocabulary (annotations, condition types and reasons, the approval
rule) from pko.api.stackterms, as the controllers and the generated reference do: it imports no
controller, and spells none of those values again."""

from __future__ import annotations

import ast
from pathlib import Path

from pko.api import stackterms

from pko.devtools.build_plugin import plugin_modules

KUBECTL = Path(__file__).resolve().parents[2] / "pko" / "kubectl"


def _imports(path: Path) -> set[str]:
    """The modules ``path`` (a module of pko.kubectl) imports, relative imports resolved."""
    package = ["pko", "kubectl"]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            anchor = package[: len(package) - node.level + 1] if node.level else []
            base = ".".join([*anchor, *([node.module] if node.module else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _controller(module: str) -> bool:
    return module == "pko.controllers" or module.startswith("pko.controllers.")


def test_no_plugin_module_imports_a_controller() -> None:
    sources = sorted(KUBECTL.glob("*.py"))
    assert len(sources) > 10
    direct = {p.name: sorted(m for m in _imports(p) if _controller(m)) for p in sources}
    assert {name: found for name, found in direct.items() if found} == {}
    # Nor through anything it imports (the modules the one-file plugin bundles).
    assert [m for m in plugin_modules() if _controller(m)] == []


def test_the_import_check_sees_every_spelling(tmp_path: Path) -> None:
    spellings = [
        "from pko.controllers.stack.approval import resource_ops",
        "import pko.controllers.resources",
        "from pko import controllers",
        "from ..controllers.stack import approval",
    ]
    for i, line in enumerate(spellings):
        module = tmp_path / f"m{i}.py"
        module.write_text(f"def f() -> None:\n    {line}\n")
        assert any(_controller(m) for m in _imports(module)), line


def test_no_plugin_module_restates_the_api_vocabulary() -> None:
    vocabulary = {
        value: name
        for name, value in vars(stackterms).items()
        if name.isupper() and isinstance(value, str)
    }
    assert {"pulumi.com/approved-plan", "pulumi.com/cancel-request", "AwaitingApproval"} <= set(vocabulary)
    restated = []
    for path in sorted(KUBECTL.glob("*.py")):
        for stmt in ast.parse(path.read_text(), str(path)).body:
            value = stmt.value if isinstance(stmt, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(value, ast.Constant) and value.value in vocabulary:
                restated.append(f"{path.name}:{stmt.lineno}: {vocabulary[value.value]}")
    assert restated == []
