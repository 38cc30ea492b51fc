"""Policy packs for tests on the real engine (issue 43): the pinned ``@pulumi/policy`` npm package,
fetched once into the pko cache, and JavaScript packs made from it (no compile); TypeScript packs as a git
repository holds them, with no node_modules (:func:`write_typescript_pack`); and Python packs, with a
virtualenv of the pinned ``pulumi-policy`` made once into the pko cache (:func:`python_policy_env`).

What the engine needs to run such a pack, offline: pulumi v3.274 runs a pack directory through its
language host (``pulumi-language-nodejs``, built by hack/build-sources.sh, starts
``@pulumi/pulumi/cmd/run-policy-pack``: no ``pulumi-analyzer-policy`` plugin), so the pack needs
``@pulumi/policy`` (here in its own ``node_modules``, as ``npm install`` leaves it) and ``@pulumi/pulumi``
with its dependencies, which the image's SDK set has (hack/build-runtimes.sh's ``node_modules``: the
image's /node_modules, on NODE_PATH outside an image). :func:`engine_env` says what to add to the
engine's environment for that. A Python pack needs nothing of the engine's environment: the agent
launches it with the virtualenv its PulumiPolicy.yaml names (agent/policypacks.py says why).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from pko.devtools.builds import built
from pko.devtools.versions import cache_dir

__all__ = [
    "COMMAND",
    "JS_PACK",
    "POLICED_PROGRAM",
    "POLICED_URN",
    "POLICY_SDK",
    "POLICY_SDK_INTEGRITY",
    "PYTHON_PACK",
    "PYTHON_POLICY_LOCK",
    "TSCONFIG",
    "TS_PACK",
    "engine_dirs",
    "engine_env",
    "policy_sdk",
    "python_policy_env",
    "python_policy_wheels",
    "write_pack",
    "write_python_pack",
    "write_typescript_pack",
]

REPO = Path(__file__).resolve().parents[2]
POLICY_SDK = ("@pulumi/policy", "1.21.0")
POLICY_SDK_INTEGRITY = (
    "sha512-tLczMS7S2UUpc1qO9xvGY54GumUShTNxm/BY/T1fb0Hp/ILScxXzrmLpkbt4KUGZAcX/EdGLVuMGHyhreqbfvg=="
)
POLICY_SDK_PYTHON = ("pulumi-policy", "1.21.0")
# pulumi-policy 1.21.0 and the Pulumi SDK, every file's sha256: hack/lock.sh's, which the workspace image
# installs its policy environment from (/opt/pulumi/policy).
PYTHON_POLICY_LOCK = REPO / "requirements-policy.lock"
UV_VERSION = "0.13.8"  # hack/lock.sh's uv, in the same cache folder


def policy_sdk(runtimes: Path) -> Path:
    """The pinned @pulumi/policy tarball, fetched once with npm into the pko cache (beside the runtimes
    of hack/build-runtimes.sh, ``runtimes``) and refused unless its sha512 is the pin."""
    name, version = POLICY_SDK
    cache = runtimes.parents[1] / "npm-packs"
    tarball = cache / f"pulumi-policy-{version}.tgz"
    if not tarball.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "pack", f"{name}@{version}", "--pack-destination", str(cache)],
            check=True,
            capture_output=True,
            timeout=120,
        )
    digest = base64.b64encode(hashlib.sha512(tarball.read_bytes()).digest()).decode()
    if f"sha512-{digest}" != POLICY_SDK_INTEGRITY:
        raise RuntimeError(f"{tarball}: not the pinned {name}@{version} (sha512-{digest})")
    return tarball


def write_pack(directory: Path, sdk: Path, source: str, name: str = "pko-pack") -> None:
    """A JavaScript pack in ``directory``: ``source`` as its index.js, @pulumi/policy from the tarball
    ``sdk`` in its own node_modules."""
    target = directory / "node_modules" / "@pulumi" / "policy"
    target.mkdir(parents=True)
    with tarfile.open(sdk) as archive:
        for member in archive.getmembers():
            member.name = member.name.partition("/")[2]  # package/... -> ...
            if member.name:
                archive.extract(member, target, filter="data")
    (directory / "PulumiPolicy.yaml").write_text("runtime: nodejs\ndescription: a pko test pack\n")
    manifest = {"name": name, "version": "0.1.0", "main": "index.js"}
    (directory / "package.json").write_text(
        json.dumps(manifest | {"dependencies": {POLICY_SDK[0]: POLICY_SDK[1]}})
    )
    (directory / "index.js").write_text(source)


def engine_dirs(runtimes: Path) -> list[Path]:
    """Where the Node.js language host (hack/build-sources.sh) and Node.js (``runtimes``, of
    hack/build-runtimes.sh) are: first on the engine's PATH outside an image, which has the host beside
    ``pulumi`` (so the engine's ambient plugin lookup stays on: :func:`engine_env`)."""
    return [built("build-sources.sh") / "bin", runtimes / "nodejs" / "bin"]


def engine_env(path: str, runtimes: Path) -> dict[str, str]:
    """What the real engine's environment needs, beyond the workspace image's, to run a JavaScript pack
    outside the image: :func:`engine_dirs` before ``path``, the image's SDK set on NODE_PATH."""
    return {
        "PATH": os.pathsep.join([*map(str, engine_dirs(runtimes)), path]),
        "NODE_PATH": str(runtimes / "node_modules"),
        "PULUMI_IGNORE_AMBIENT_PLUGINS": "false",
    }


def _uv(cache: Path) -> Path:
    """hack/lock.sh's pinned uv, installed as that script installs it when the cache lacks it."""
    tools = cache / f"uv-{UV_VERSION}"
    if not (tools / ".installed").is_file():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(tools)], check=True, capture_output=True)
        pip = [str(tools / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, f"uv=={UV_VERSION}"], check=True, capture_output=True, timeout=300)
        (tools / ".installed").touch()
    return tools / "bin" / "uv"


def python_policy_env(cache: Path | None = None) -> Path:
    """A virtualenv holding exactly :data:`PYTHON_POLICY_LOCK` (hash-checked, ``--no-deps``), made once
    with uv under the pko cache in a folder named after the lock's digest; uv's own cache (hack/lock.sh's)
    keeps the wheels, so a rebuild needs no package index. Returns the virtualenv's directory."""
    cache = cache or cache_dir()
    lock = PYTHON_POLICY_LOCK.read_bytes()
    venv = cache / f"python-policy-{hashlib.sha256(lock).hexdigest()[:12]}"
    if (venv / ".installed").is_file():
        return venv
    uv = _uv(cache)
    env = {**os.environ, "UV_CACHE_DIR": str(cache / "uv-cache")}
    subprocess.run(
        [str(uv), "venv", "--quiet", "--clear", "--python", sys.executable, str(venv)],
        check=True,
        capture_output=True,
        env=env,
    )
    install = [str(uv), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python")]
    install += ["--require-hashes", "--no-deps", "--requirement", str(PYTHON_POLICY_LOCK)]
    # The cache first, the index only for what it lacks (a first run, a new lock).
    if subprocess.run([*install, "--offline"], capture_output=True, env=env).returncode != 0:
        subprocess.run(install, check=True, capture_output=True, env=env, timeout=600)
    (venv / ".installed").touch()
    return venv


def python_policy_wheels(cache: Path | None = None) -> Path:
    """The wheels of :data:`PYTHON_POLICY_LOCK`, hash-checked, fetched once with pip into the pko cache:
    a ``PIP_FIND_LINKS`` folder (with ``PIP_NO_INDEX``) from which the agent makes a pack's virtualenv
    out of its requirements.txt offline, as the workspace image's wheelhouse serves programs."""
    cache = cache or cache_dir()
    lock = PYTHON_POLICY_LOCK.read_bytes()
    wheels = cache / f"python-policy-wheels-{hashlib.sha256(lock).hexdigest()[:12]}"
    if (wheels / ".downloaded").is_file():
        return wheels
    download = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check"]
    download += ["--require-hashes", "--no-deps", "--only-binary", ":all:", "--dest", str(wheels)]
    subprocess.run(
        [*download, "--requirement", str(PYTHON_POLICY_LOCK)], check=True, capture_output=True, timeout=600
    )
    (wheels / ".downloaded").touch()
    return wheels


def write_python_pack(
    directory: Path,
    source: str,
    virtualenv: Path | str | None,
    name: str = "pko-pack",
    version: str = "0.1.0",
    requirements: str | None = f"{POLICY_SDK_PYTHON[0]}=={POLICY_SDK_PYTHON[1]}\n",
) -> None:
    """A Python pack in ``directory``: ``source`` as its __main__.py, ``requirements`` as its
    requirements.txt (none when None), PulumiPolicy.yaml naming ``virtualenv`` (:func:`python_policy_env`,
    or a folder of the pack the agent makes from the requirements; None: the Python on PATH) and the
    pack's version (a Python pack takes it from there, not from its code). ``name`` goes into the
    description: the pack's own name is the one its source gives PolicyPack."""
    directory.mkdir(parents=True)
    options = f"\n  options:\n    virtualenv: {virtualenv}" if virtualenv else ""
    (directory / "PulumiPolicy.yaml").write_text(
        f"runtime:\n  name: python{options}\ndescription: {name}, a pko test pack\nversion: {version}\n"
    )
    if requirements is not None:
        (directory / "requirements.txt").write_text(requirements)
    (directory / "__main__.py").write_text(source)


def write_typescript_pack(
    directory: Path, source: str, name: str = "pko-pack", version: str = "0.1.0"
) -> None:
    """A TypeScript pack in ``directory`` as a git repository holds it: ``source`` as its index.ts,
    :data:`TSCONFIG`, a package.json of ``name`` and ``version``, no node_modules. The engine's Node.js
    language host type-checks and runs it with the TypeScript and ts-node of the image's SDK set
    (/node_modules), and tsc looks for @pulumi/policy's types only in a node_modules of the pack's folder
    or one above it: outside an image, link one above ``directory`` to hack/build-runtimes.sh's."""
    directory.mkdir(parents=True)
    (directory / "PulumiPolicy.yaml").write_text("runtime: nodejs\ndescription: a TypeScript pack\n")
    (directory / "package.json").write_text(json.dumps({"name": name, "version": version}))
    (directory / "tsconfig.json").write_text(TSCONFIG)
    (directory / "index.ts").write_text(source)


# --- the packs and the program the agent tests and hack/bench/policy.py run -----------------------
# A Pulumi YAML program of one local command, and three packs (JavaScript, TypeScript below, Python) with
# one mandatory policy (no command saying "forbidden") and one advisory (a command should say how to undo
# it).

COMMAND = "command:local:Command"
POLICED_PROGRAM = """\
name: policed
runtime: yaml
config:
  create:
    type: string
resources:
  step:
    type: command:local:Command
    properties:
      create: ${create}
"""
JS_PACK = """\
const { PolicyPack } = require("@pulumi/policy");
new PolicyPack("pko-commands", {
  policies: [
    {
      name: "no-forbidden-commands",
      description: "A command may not say 'forbidden'.",
      enforcementLevel: "mandatory",
      validateResource: (args, reportViolation) => {
        if (args.type === "command:local:Command" && String(args.props.create || "").includes("forbidden")) {
          reportViolation("this command says 'forbidden'");
        }
      },
    },
    {
      name: "commands-have-delete",
      description: "A command should say how to undo it.",
      enforcementLevel: "advisory",
      validateResource: (args, reportViolation) => {
        if (args.type === "command:local:Command" && !args.props.delete) {
          reportViolation("no delete command");
        }
      },
    },
  ],
});
"""
POLICED_URN = f"urn:pulumi:dev::policed::{COMMAND}::step"

PYTHON_PACK = """\
from pulumi_policy import EnforcementLevel, PolicyPack, ResourceValidationPolicy


def is_command(args):
    return args.resource_type == "command:local:Command"


def no_forbidden(args, report_violation):
    if is_command(args) and "forbidden" in str(args.props.get("create") or ""):
        report_violation("this command says 'forbidden'")


def has_delete(args, report_violation):
    if is_command(args) and not args.props.get("delete"):
        report_violation("no delete command")


PolicyPack(
    "pko-commands-py",
    policies=[
        ResourceValidationPolicy(
            name="no-forbidden-commands",
            description="A command may not say 'forbidden'.",
            enforcement_level=EnforcementLevel.MANDATORY,
            validate=no_forbidden,
        ),
        ResourceValidationPolicy(
            name="commands-have-delete",
            description="A command should say how to undo it.",
            enforcement_level=EnforcementLevel.ADVISORY,
            validate=has_delete,
        ),
    ],
)
"""

# The JavaScript pack in TypeScript (:func:`write_typescript_pack`), typed with @pulumi/policy's own
# types, and its tsconfig.json as `pulumi policy new kubernetes-typescript` writes it (strict; its
# "pretty" does not change ts-node's diagnostics).
TS_PACK = """\
import { PolicyPack, ReportViolation, ResourceValidationArgs } from "@pulumi/policy";

// What the policies read of a command:local:Command.
interface CommandProps {
    create?: string;
    delete?: string;
}

function command(args: ResourceValidationArgs): CommandProps | undefined {
    return args.type === "command:local:Command" ? (args.props as CommandProps) : undefined;
}

new PolicyPack("pko-commands", {
    policies: [
        {
            name: "no-forbidden-commands",
            description: "A command may not say 'forbidden'.",
            enforcementLevel: "mandatory",
            validateResource: (args: ResourceValidationArgs, reportViolation: ReportViolation): void => {
                if (command(args)?.create?.includes("forbidden")) {
                    reportViolation("this command says 'forbidden'");
                }
            },
        },
        {
            name: "commands-have-delete",
            description: "A command should say how to undo it.",
            enforcementLevel: "advisory",
            validateResource: (args: ResourceValidationArgs, reportViolation: ReportViolation): void => {
                const props = command(args);
                if (props && !props.delete) {
                    reportViolation("no delete command");
                }
            },
        },
    ],
});
"""
TSCONFIG = """\
{
    "compilerOptions": {
        "strict": true,
        "outDir": "bin",
        "target": "es2016",
        "module": "commonjs",
        "moduleResolution": "node",
        "sourceMap": true,
        "experimentalDecorators": true,
        "pretty": true,
        "noFallthroughCasesInSwitch": true,
        "noImplicitReturns": true,
        "forceConsistentCasingInFileNames": true
    },
    "files": ["index.ts"]
}
"""
