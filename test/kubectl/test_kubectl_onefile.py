"""``kubectl-pko`` as one file (hack/build_plugin.py): reproducible, holding only what the plugin
imports, and working against the real apiserver on a Python with none of pko's dependencies
(``python -I -S``: no site-packages, no user site, no ``PYTHON*`` variables)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from pko.devtools.build_plugin import EPOCH, FILE_NAME, LOCK, BuildError, build_plugin, plugin_modules
from pko.machinery.resource import Resource, ResourceClient
from pko.version import VERSION

from . import stacks as fx
from .plugin import Env, Result, kubeconfig_for

DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment")
OPERATOR_IMAGE = "registry.example/pko:9.8.7"


@pytest.fixture(scope="module")
def onefile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_plugin(tmp_path_factory.mktemp("onefile"))


def run_bare(path: Path, *argv: str, home: Path | None = None) -> Result:
    """Run the file as a user would, on this Python without its site-packages (``-I -S``)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home or path.parent)}
    proc = subprocess.run(
        [sys.executable, "-I", "-S", str(path), *argv], env=env, capture_output=True, text=True, timeout=60
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def test_the_bare_python_has_none_of_pkos_dependencies() -> None:
    """The precondition of the tests below: what they run cannot come from the venv."""
    for module in ("yaml", "aiohttp", "kubernetes_asyncio", "pko"):
        proc = subprocess.run([sys.executable, "-I", "-S", "-c", f"import {module}"], capture_output=True)
        assert proc.returncode == 1, module


def test_the_build_is_reproducible(onefile: Path, tmp_path: Path) -> None:
    again = build_plugin(tmp_path)
    assert again.name == FILE_NAME == onefile.name
    assert hashlib.sha256(again.read_bytes()).digest() == hashlib.sha256(onefile.read_bytes()).digest()
    assert onefile.read_bytes().startswith(b"#!/usr/bin/env python3\n")
    assert onefile.stat().st_mode & 0o111 == 0o111
    with zipfile.ZipFile(onefile) as archive:
        infos = archive.infolist()
    assert [i.filename for i in infos] == sorted(i.filename for i in infos)
    assert {i.date_time for i in infos} == {EPOCH}


def test_the_file_holds_only_what_the_plugin_imports(onefile: Path) -> None:
    with zipfile.ZipFile(onefile) as archive:
        names = set(archive.namelist())
        inits = {n for n in names if n.endswith("/__init__.py") and n.startswith("pko/")}
        assert all(archive.read(n) == b"" for n in inits)  # packages are markers: no operator wiring
        lock = json.loads(LOCK.read_text())["PyYAML"]
        for name, digest in lock["files"].items():
            assert hashlib.sha256(archive.read(name)).hexdigest() == digest
    modules = {n for n in names if n.startswith("pko/")} - inits
    outside = {n for n in modules if not n.startswith("pko/kubectl/")}
    assert outside == {
        "pko/version.py",
        "pko/machinery/conditions.py",
        "pko/machinery/resourcetype.py",  # the resource paths the operator spells too
        "pko/machinery/kubeconfigfile.py",  # the kubeconfig reader of the operator and the agent
        "pko/api/stackterms.py",  # the Stack API's vocabulary, without its models
    }
    assert modules == {m.replace(".", "/") + ".py" for m in plugin_modules()}
    assert "pko/machinery/resource.py" not in names
    assert {n.split("/")[0] for n in names} == {"__main__.py", "LICENSES", "pko", "yaml"}
    assert not any(n.endswith((".so", ".pyd", ".pyc")) for n in names)  # nothing a zip cannot load


def test_an_import_the_file_cannot_hold_fails_the_build(tmp_path: Path) -> None:
    """A checkout whose plugin imports aiohttp (at run time) does not build; under TYPE_CHECKING,
    in a relative import or from pko's own modules, imports are followed as Python follows them."""
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools]\npackage-dir = { "pko" = "pko" }\n')
    (tmp_path / "pko" / "kubectl").mkdir(parents=True)
    (tmp_path / "pko" / "__init__.py").write_text("import aiohttp\n")  # a package: never bundled
    (tmp_path / "pko" / "kubectl" / "__init__.py").write_text("")
    helper = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import aiohttp\n"
    (tmp_path / "pko" / "helper.py").write_text(helper)
    main = tmp_path / "pko" / "kubectl" / "__main__.py"
    main.write_text("def f() -> None:\n    from .. import helper\n")
    assert set(plugin_modules(tmp_path)) == {"pko.kubectl.__main__", "pko.helper"}
    main.write_text("def f() -> None:\n    import aiohttp.web\n")
    with pytest.raises(BuildError, match=r"aiohttp \(by pko.kubectl.__main__\)"):
        plugin_modules(tmp_path)


def test_version_without_a_cluster(onefile: Path, tmp_path: Path) -> None:
    assert run_bare(onefile, "--version") == Result(0, f"kubectl-pko {VERSION}\n", "")
    assert run_bare(onefile, "version", "--client") == Result(0, f"Client Version: {VERSION}\n", "")
    down = kubeconfig_for(_any_kubeconfig(tmp_path), tmp_path / "down", "default", server="https://127.0.0.1:1")
    unknown = run_bare(onefile, "--kubeconfig", str(down), "version")
    assert unknown.code == 0, unknown.err
    assert unknown.out.startswith(f"Client Version: {VERSION}\nOperator Version: unknown (cannot reach the ")
    assert unknown.err == ""
    required = run_bare(onefile, "--kubeconfig", str(down), "version", "--server", "-o", "json")
    assert required.code == 5 and required.err.startswith("error: cannot reach the apiserver")
    doc = json.loads(required.out)
    assert (doc["clientVersion"], doc["operators"]) == (VERSION, None) and doc["error"]


def _any_kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig to rewrite (its server is replaced): a token and no CA."""
    path = tmp_path / "source"
    path.write_text(
        json.dumps(
            {
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


@pytest.fixture(scope="module")
async def env(
    api_client: ApiClient, cluster: Any, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Env]:
    tmp = tmp_path_factory.mktemp("kubectl-pko-onefile")
    e = Env(api_client, namespace, kubeconfig_for(Path(cluster.kubeconfig), tmp / "kubeconfig", namespace))
    await e.put("stacks", fx.stack("web", status=fx.ready_status("web-1")))
    await e.put("updates", fx.update("web-1", failed=None))
    await e.put("stacks", fx.stack("flaky", status=fx.retrying_status("flaky-2")))
    await e.put("updates", fx.update("flaky-2"))
    labels = {
        "control-plane": "controller-manager",
        "app.kubernetes.io/name": "pulumi-kubernetes-operator",
        "app.kubernetes.io/version": "9.8.7",
    }
    deployments = ResourceClient(api_client, DEPLOYMENTS, namespace, field_manager="pko-test")
    await deployments.create(
        {
            "metadata": {"name": "controller-manager", "labels": labels},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {"control-plane": "controller-manager"}},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [
                            {"name": "sidecar", "image": "registry.example/other:1"},
                            {"name": "manager", "image": OPERATOR_IMAGE},
                        ]
                    },
                },
            },
        }
    )
    yield e


@pytest.mark.cluster
async def test_status_from_the_one_file(env: Env, onefile: Path) -> None:
    bare = run_bare(onefile, "--kubeconfig", str(env.kubeconfig), "status", "web", "-o", "json")
    assert bare.code == 0, bare.err
    doc = json.loads(bare.out)
    assert (doc["namespace"], doc["name"], doc["state"]) == (env.ns, "web", "Ready")
    assert doc["lastUpdate"]["resourceChanges"] == {"create": 2, "same": 1}  # read from the Update
    assert doc["outputs"]["password"] == "[secret]"
    # The same text as the installed plugin prints, but for the ages that the clock moves.
    listing = run_bare(onefile, "--kubeconfig", str(env.kubeconfig), "status", "-o", "yaml")
    installed = await env.pko("status", "-o", "yaml")
    assert (listing.code, listing.out) == (installed.code, installed.out) == (1, installed.out)
    why = run_bare(onefile, "--kubeconfig", str(env.kubeconfig), "why", "flaky")
    assert why.code == 1 and "The last up (Update flaky-2) failed: ProgramError: " in why.out


@pytest.mark.cluster
async def test_version_from_the_one_file(env: Env, onefile: Path) -> None:
    result = run_bare(onefile, "--kubeconfig", str(env.kubeconfig), "version")
    assert result.code == 0, result.err
    assert result.out.startswith(f"Client Version: {VERSION}\n")
    ours = f"Operator Version: 9.8.7\nOperator Image: {OPERATOR_IMAGE}\n"
    assert f"{ours}Operator Deployment: {env.ns}/controller-manager\n" in result.out
    as_json = await env.pko("version", "--server", "-o", "json")
    doc = json.loads(as_json.out)
    assert as_json.code == 0 and doc["clientVersion"] == VERSION
    expected = {"namespace": env.ns, "name": "controller-manager", "version": "9.8.7"}
    expected["image"] = OPERATOR_IMAGE
    assert expected in doc["operators"]
