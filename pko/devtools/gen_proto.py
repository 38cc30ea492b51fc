#!/usr/bin/env python3
"""Generate the agent's betterproto2 code from api/agent.proto into api/generated/.

Usage: python hack/gen_proto.py [--check]

The generated code is committed so that neither the operator image nor a user needs protoc. With
``--check`` nothing is written: the command exits 1 and names the files that differ when the
committed code does not match what the .proto generates now (test/agent/test_proto_drift.py runs it).

Invariant: api/generated/ holds exactly the generator's output plus our own package docstring in
api/generated/__init__.py (the generator writes that file empty; we keep it as a marker only).
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "api"
PROTOS = ["agent.proto"]
OUT_DIR = ROOT / "api" / "generated"
# Files in OUT_DIR that we own rather than the generator.
OWN_FILES = {Path("__init__.py")}
PLUGIN_OPTIONS = "client_generation=async,server_generation=async"


def _plugin_path() -> Path:
    """The betterproto2 protoc plugin installed next to this interpreter (the venv's bin/)."""
    candidate = Path(sys.executable).parent / "protoc-gen-python_betterproto2"
    found = candidate if candidate.exists() else shutil.which("protoc-gen-python_betterproto2")
    if found is None:
        raise SystemExit("protoc-gen-python_betterproto2 not found: pip install betterproto2-compiler")
    return Path(found)


def generate(dest: Path) -> None:
    """Run protoc (from grpcio-tools) with the betterproto2 plugin, writing into ``dest``."""
    import grpc_tools  # type: ignore[import-untyped]  # the well-known .proto files ship inside it

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"-I{well_known}",
        f"--plugin=protoc-gen-python_betterproto2={_plugin_path()}",
        f"--python_betterproto2_out={dest}",
        f"--python_betterproto2_opt={PLUGIN_OPTIONS}",
        *(str(PROTO_DIR / p) for p in PROTOS),
    ]
    # The plugin pipes its output through `ruff check --fix` and `ruff format`, found on PATH and
    # configured from the working directory: run it beside the output (no pyproject.toml there) with
    # this venv's ruff first on PATH so the result depends only on the tool versions.
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=dest, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"protoc failed ({proc.returncode}):\n{proc.stderr}")


def _tree(root: Path) -> set[Path]:
    return {
        p.relative_to(root) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    } - OWN_FILES


def diff(generated: Path, committed: Path) -> list[str]:
    """Relative paths that are missing, extra or different in ``committed``."""
    new, old = _tree(generated), _tree(committed) if committed.exists() else set()
    problems = [f"missing: {p}" for p in sorted(new - old)]
    problems += [f"stale: {p}" for p in sorted(old - new)]
    problems += [
        f"differs: {p}"
        for p in sorted(new & old)
        if not filecmp.cmp(generated / p, committed / p, shallow=False)
    ]
    return problems


def install(generated: Path, committed: Path) -> None:
    """Replace the generator-owned files in ``committed`` with ``generated``."""
    for rel in _tree(committed) if committed.exists() else set():
        (committed / rel).unlink()
    for rel in sorted(_tree(generated)):
        target = committed / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(generated / rel, target)
    # Drop directories the generator no longer produces.
    for d in sorted((p for p in committed.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        if not any(f for f in d.rglob("*") if f.is_file() and "__pycache__" not in f.parts):
            shutil.rmtree(d)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if api/generated/ is out of date")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pko-proto-") as tmp:
        out = Path(tmp)
        generate(out)
        problems = diff(out, OUT_DIR)
        if args.check:
            if problems:
                print("api/generated/ is out of date; run python hack/gen_proto.py", file=sys.stderr)
                print("\n".join(problems), file=sys.stderr)
                return 1
            return 0
        install(out, OUT_DIR)
        print(
            f"generated {len(_tree(out))} files into {OUT_DIR.relative_to(ROOT)}"
            + (f" ({len(problems)} changed)" if problems else " (no changes)")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
