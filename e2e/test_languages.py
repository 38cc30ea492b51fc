"""Programs in every language the workspace image runs, on the real node with the real engine: the seed
walkthrough's TypeScript nginx (a Deployment and a Service through @pulumi/kubernetes) from git, as the
seed's Stack is written; a JavaScript program; a Go program from git; Python programs with their own
requirements, with and without a virtualenv; and the bad input a user meets first (a TypeScript type
error, a missing npm or pip package, a runtime the image lacks, a misspelled one), each ending in a
condition that says what to fix in the compiler's, npm's, pip's or the engine's own words.

Workspace pods reach no registry here, as in an air-gapped cluster: a program's own dependencies come
from what the test serves on the node's address, as users serve theirs: an npm registry
(test/npmregistry.py: the TypeScript program's lockfile from the npm cache the image build filled, and
a package the test makes), a Go module proxy (test/goproxy.py: the pko module cache, which
hack/build-runtimes.sh filled with the modules a Go program on the pinned SDK needs) and a Python package
index (test/pypiindex.py: a wheel the test makes). What a program does not install itself
(@pulumi/pulumi, the providers' SDKs, TypeScript) the image has in /node_modules; the Python SDK is in
the image's Python, and a virtualenv gets it and pip's own tools from the image's wheelhouse."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dulwich.repo import Repo
from gitserver import git_commit, serve_git
from goproxy import go_sum, serve_module_cache
from npmregistry import Registry, lockfile_subset, make_package, serve_registry
from pypiindex import Index, make_wheel, serve_index

from .conftest import Kube
from .test_walkthrough import NODE_IP, gone, ready, stack

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hack"))
from versions import cache_dir, versions  # hack/versions.py

pytestmark = pytest.mark.timeout(1800)

REPO = Path(__file__).resolve().parents[1]
IMAGE_LOCK = REPO / "images" / "workspace" / "nodejs" / "package-lock.json"

# What pulumi-kubernetes awaits a Service through, beyond config/samples/rbac.yaml's Deployment kinds.
SERVICES_ROLE = """\
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: pulumi-services
rules:
  - apiGroups: [""]
    resources: [services]
    verbs: [get, list, watch, create, update, patch, delete]
  - apiGroups: [""]
    resources: [endpoints]
    verbs: [get, list, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: pulumi-services
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: pulumi-services
subjects:
  - kind: ServiceAccount
    name: pulumi
"""

# The seed's kubernetes-ts-nginx, with a Service in front, and the web server this node can run (no
# image registry here): Debian's python3 serving HTTP under the restricted profile.
NGINX_TS = """\
import * as k8s from "@pulumi/kubernetes";

const appLabels = { app: "nginx" };
const deployment = new k8s.apps.v1.Deployment("nginx", {
    spec: {
        selector: { matchLabels: appLabels },
        replicas: 1,
        template: {
            metadata: { labels: appLabels },
            spec: {
                securityContext: {
                    runAsNonRoot: true, runAsUser: 1000, seccompProfile: { type: "RuntimeDefault" },
                },
                containers: [{
                    name: "nginx",
                    image: "localhost/pko-base-python:bookworm",
                    imagePullPolicy: "Never",
                    command: ["python3", "-m", "http.server", "8080"],
                    ports: [{ containerPort: 8080 }],
                    readinessProbe: { httpGet: { path: "/", port: 8080 }, periodSeconds: 1 },
                    securityContext: { allowPrivilegeEscalation: false, capabilities: { drop: ["ALL"] } },
                }],
            },
        },
    },
});
const service = new k8s.core.v1.Service("nginx", {
    spec: { selector: appLabels, ports: [{ port: 80, targetPort: 8080 }] },
});

export const name = deployment.metadata.name;
export const serviceName = service.metadata.name;
export const clusterIP = service.spec.clusterIP;
"""

TSCONFIG = {
    "compilerOptions": {
        "strict": True,
        "outDir": "bin",
        "target": "es2020",
        "module": "commonjs",
        "moduleResolution": "node",
        "sourceMap": True,
        "noImplicitReturns": True,
        "forceConsistentCasingInFileNames": True,
    },
    "files": ["index.ts"],
}

# The SDK packages the TypeScript program declares and installs from its lockfile (the seed's
# package.json lists these; the versions are the image's, so the lockfile is cut from the image's).
TS_DEPENDENCIES = ("@pulumi/pulumi", "@pulumi/kubernetes", "@types/node", "typescript")

# A JavaScript program: @pulumi/kubernetes from the image, its own dependency from the registry.
GREETER_JS = """\
"use strict";
const k8s = require("@pulumi/kubernetes");
const { greet } = require("pko-e2e-greeting");

const settings = new k8s.core.v1.ConfigMap("greeting", {
    metadata: { name: "javascript-greeting" },
    data: { greeting: greet("javascript") },
});
exports.greeting = settings.data["greeting"];
"""

GREETING_PACKAGE = {"index.js": 'exports.greet = (who) => "hello from " + who;\n'}

# A Go program on the Pulumi SDK alone: the ConfigMap is registered by its type token, and the engine
# loads the image's kubernetes provider at the version asked for.
MAIN_GO = """\
package main

import (
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

type ConfigMap struct {
	pulumi.CustomResourceState
	Data pulumi.StringMapOutput `pulumi:"data"`
}

func main() {
	pulumi.Run(func(ctx *pulumi.Context) error {
		var settings ConfigMap
		err := ctx.RegisterResource("kubernetes:core/v1:ConfigMap", "settings", pulumi.Map{
			"apiVersion": pulumi.String("v1"),
			"kind":       pulumi.String("ConfigMap"),
			"metadata":   pulumi.Map{"name": pulumi.String("golang-settings")},
			"data":       pulumi.StringMap{"language": pulumi.String("go")},
		}, &settings, pulumi.Version("%(kubernetes)s"))
		if err != nil {
			return err
		}
		ctx.Export("language", settings.Data.MapIndex(pulumi.String("language")))
		return nil
	})
}
"""

# A Python program with a requirement of its own: the ConfigMap is registered by its type token.
GREETER_PY = """\
import pulumi
from pko_e2e_greeting import greet

greeting = greet("%(name)s")
pulumi.CustomResource(
    "kubernetes:core/v1:ConfigMap",
    "greeting",
    {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "%(name)s-greeting"},
        "data": {"greeting": greeting},
    },
    pulumi.ResourceOptions(version="%(kubernetes)s"),
)
pulumi.export("greeting", greeting)
"""

GREETING_WHEEL = {"pko_e2e_greeting/__init__.py": 'def greet(who):\n    return "hello from " + who\n'}
PY_REQUIREMENTS = b"pulumi>=3.0.0,<4.0.0\npko-e2e-greeting==1.0.0\n"

TYPE_ERROR_TS = """\
import * as pulumi from "@pulumi/pulumi";

const replicas: number = "three";
export const answer = pulumi.output(replicas);
"""


def _project(name: str, runtime: str) -> bytes:
    return f"name: {name}\nruntime: {runtime}\n".encode()


def _json(doc: Any) -> bytes:
    return (json.dumps(doc, indent=2) + "\n").encode()


@pytest.fixture
def sources(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The programs' git repository, npm registry and Go module proxy, on the node's address."""
    v = versions()
    lock = json.loads(IMAGE_LOCK.read_text())
    pinned = lock["packages"][""]["dependencies"]
    ts_lock = lockfile_subset(lock, {name: pinned[name] for name in TS_DEPENDENCIES}, "nginx")
    ts_package = {
        "name": "nginx",
        "main": "index.ts",
        "dependencies": ts_lock["packages"][""]["dependencies"],
    }

    registry = Registry()
    registry.add_lockfile(ts_lock, cache_dir() / "npm")
    registry.add_tarball(make_package("pko-e2e-greeting", "1.0.0", GREETING_PACKAGE))

    index = Index()
    index.add_wheel(make_wheel(tmp_path / "wheels", "pko-e2e-greeting", "1.0.0", GREETING_WHEEL))
    python = {"kubernetes": v["PULUMI_KUBERNETES_VERSION"]}

    sdk = f"github.com/pulumi/pulumi/sdk/v3 v{v['PULUMI_VERSION']}"
    go_mod = f"module example.com/golang\n\ngo 1.25\n\nrequire {sdk}\n"
    main_go = MAIN_GO % {"kubernetes": v["PULUMI_KUBERNETES_VERSION"]}
    files = {
        # The seed's shape: a program folder in a repository, on a branch.
        "nginx/Pulumi.yaml": _project("nginx", "nodejs"),
        "nginx/index.ts": NGINX_TS.encode(),
        "nginx/tsconfig.json": _json(TSCONFIG),
        "nginx/package.json": _json(ts_package),
        "nginx/package-lock.json": _json(ts_lock),
        "greeter/Pulumi.yaml": _project("greeter", "nodejs"),
        "greeter/index.js": GREETER_JS.encode(),
        "greeter/package.json": _json(
            {"name": "greeter", "main": "index.js", "dependencies": {"pko-e2e-greeting": "^1.0.0"}}
        ),
        "golang/Pulumi.yaml": _project("golang", "go"),
        "golang/main.go": main_go.encode(),
        "golang/go.mod": go_mod.encode(),
        "golang/go.sum": go_sum(
            tmp_path / "golang", {"go.mod": go_mod, "main.go": main_go}, cache_dir() / "go" / "mod"
        ),
        # Python: requirements into the image's Python; a virtualenv made by the language host.
        "pyplain/Pulumi.yaml": _project("pyplain", "python"),
        "pyplain/__main__.py": (GREETER_PY % {**python, "name": "pyplain"}).encode(),
        "pyplain/requirements.txt": PY_REQUIREMENTS,
        "pyvenv/Pulumi.yaml": b"name: pyvenv\nruntime:\n  name: python\n  options:\n    virtualenv: venv\n",
        "pyvenv/__main__.py": (GREETER_PY % {**python, "name": "pyvenv"}).encode(),
        "pyvenv/requirements.txt": PY_REQUIREMENTS,
        # Bad input.
        "pymissing/Pulumi.yaml": _project("pymissing", "python"),
        "pymissing/__main__.py": b"import pko_e2e_absent\n",
        "pymissing/requirements.txt": b"pko-e2e-absent==1.0\n",
        "typeerror/Pulumi.yaml": _project("typeerror", "nodejs"),
        "typeerror/index.ts": TYPE_ERROR_TS.encode(),
        "typeerror/package.json": _json({"name": "typeerror", "main": "index.ts"}),
        "missingdep/Pulumi.yaml": _project("missingdep", "nodejs"),
        "missingdep/index.js": b'require("pko-e2e-absent");\n',
        "missingdep/package.json": _json({"name": "missingdep", "dependencies": {"pko-e2e-absent": "1.0.0"}}),
        "dotnet/Pulumi.yaml": _project("dotnet", "dotnet"),
        "misspelled/Pulumi.yaml": _project("misspelled", "nodjs"),
    }
    repo = Repo.init_bare(str(tmp_path / "repo.git"), mkdir=True)
    git_commit(repo, files, b"programs in every language")
    repo.refs.set_symbolic_ref(b"HEAD", b"refs/heads/main")
    downloads = cache_dir() / "go" / "mod" / "cache" / "download"
    with (
        serve_git(repo, host=NODE_IP) as git,
        serve_registry(registry, host=NODE_IP) as npm,
        serve_module_cache(downloads, host=NODE_IP) as goproxy,
        serve_index(index, host=NODE_IP) as pypi,
    ):
        yield {"git": git, "npm": npm, "goproxy": goproxy, "pypi": pypi}


def _pip(sources: dict[str, str]) -> dict[str, str]:
    """pip's environment for the test's index: plain HTTP on the node's address must be trusted."""
    return {"PIP_INDEX_URL": sources["pypi"], "PIP_TRUSTED_HOST": NODE_IP}


def _from_git(url: str, directory: str) -> str:
    return f"projectRepo: {url}\n  branch: main\n  repoDir: {directory}"


def _finish(k: Kube, *names: str) -> None:
    for name in names:
        k.run("delete", "stack", name, "--wait=false")
    for name in names:
        gone(k, "stack", name, within=600)
        gone(k, "workspace", name)
        k.run("delete", "pvc", f"{name}-state", "--wait=false")


def test_the_seed_typescript_nginx_javascript_and_go_programs_deploy(
    kube: Kube, sources: dict[str, str]
) -> None:
    k = kube
    k.apply(SERVICES_ROLE)
    npm = {"NPM_CONFIG_REGISTRY": sources["npm"]}
    go = {"GOPROXY": sources["goproxy"], "GOSUMDB": "off", "GOFLAGS": "-mod=mod"}
    k.apply(stack("nginx", _from_git(sources["git"], "nginx"), npm))
    k.apply(stack("greeter", _from_git(sources["git"], "greeter"), npm))
    k.apply(stack("golang", _from_git(sources["git"], "golang"), go))

    # TypeScript: the seed's program, its dependencies installed from its lockfile, compiled by ts-node.
    s = ready(k, "nginx", within=900)
    outputs = s["status"]["outputs"]
    assert set(outputs) == {"name", "serviceName", "clusterIP"}, outputs
    deployment = k.get("deployment", outputs["name"])
    assert deployment is not None
    assert deployment["status"].get("readyReplicas") == 1, deployment["status"]
    k.run("rollout", "status", f"deployment/{outputs['name']}", "--timeout=60s")
    service = k.get("service", outputs["serviceName"])
    assert service is not None and service["spec"]["clusterIP"] == outputs["clusterIP"], service
    # The program's own @pulumi/kubernetes, from its lockfile (the image's /node_modules comes after it).
    installed = k.run(
        "exec", "nginx-workspace-0", "-c", "pulumi", "--", "sh", "-c",
        "cd /share/workspace && node -p \"require.resolve('@pulumi/kubernetes') + ' ' + "
        "require('@pulumi/kubernetes/package.json').version\"",
    )  # fmt: skip
    where, version = installed.split()
    assert where.startswith("/share/") and "/node_modules/@pulumi/kubernetes/" in where, installed
    assert version == versions()["PULUMI_KUBERNETES_VERSION"], installed

    # JavaScript: the image's @pulumi/kubernetes and the registry's package.
    s = ready(k, "greeter", within=600)
    assert s["status"]["outputs"] == {"greeting": "hello from javascript"}, s["status"]
    settings = k.get("configmap", "javascript-greeting")
    assert settings is not None and settings["data"] == {"greeting": "hello from javascript"}

    # Go: modules from the proxy, compiled in the pod by the image's toolchain.
    s = ready(k, "golang", within=900)
    assert s["status"]["outputs"] == {"language": "go"}, s["status"]
    assert k.get("configmap", "golang-settings") is not None

    _finish(k, "nginx", "greeter", "golang")
    gone(k, "deployment", outputs["name"])
    gone(k, "service", outputs["serviceName"])
    gone(k, "configmap", "javascript-greeting")
    gone(k, "configmap", "golang-settings")


def _stalled_or_failed(k: Kube, name: str, within: float = 600) -> dict[str, Any]:
    """The Stack once it stops making progress: Stalled, or its last update failed."""

    def probe() -> dict[str, Any] | None:
        s = k.get("stack", name)
        if k.condition(s, "Stalled").get("status") == "True":
            return s
        last = ((s or {}).get("status") or {}).get("lastUpdate") or {}
        return s if last.get("state") == "failed" else None

    result: dict[str, Any] = k.until(f"stack {name} stalled or failed", probe, within)
    return result


def _said(s: dict[str, Any]) -> str:
    """Every message the Stack shows a user: its conditions and its last update."""
    status = s.get("status") or {}
    parts = [f"{c.get('type')}/{c.get('reason')}: {c.get('message')}" for c in status.get("conditions") or []]
    parts.append(str((status.get("lastUpdate") or {}).get("message")))
    return "\n".join(parts)


def test_python_programs_install_their_requirements_with_and_without_a_virtualenv(
    kube: Kube, sources: dict[str, str]
) -> None:
    k = kube
    names = ("pyplain", "pyvenv")
    for name in names:
        k.apply(stack(name, _from_git(sources["git"], name), _pip(sources)))
    for name in names:
        s = ready(k, name, within=900)
        assert s["status"]["outputs"] == {"greeting": f"hello from {name}"}, s["status"]
        settings = k.get("configmap", f"{name}-greeting")
        assert settings is not None and settings["data"] == {"greeting": f"hello from {name}"}
    # Without a virtualenv the requirement is in the Python the program ran with (the image's); with
    # one, in the virtualenv the language host made in the program's folder, beside the SDK.
    where = k.run(
        "exec", "pyplain-workspace-0", "-c", "pulumi", "--",
        "python3", "-c", "import pko_e2e_greeting; print(pko_e2e_greeting.__file__)",
    )  # fmt: skip
    assert where.startswith("/opt/pulumi/python/"), where
    where = k.run(
        "exec", "pyvenv-workspace-0", "-c", "pulumi", "--", "sh", "-c",
        "cd /share/workspace && venv/bin/python -c "
        "'import pko_e2e_greeting, pulumi; print(pko_e2e_greeting.__file__, pulumi.__file__)'",
    )  # fmt: skip
    assert where.count("/share/") == 2 and "/venv/" in where, where
    _finish(k, *names)
    for name in names:
        gone(k, "configmap", f"{name}-greeting")


def test_bad_programs_end_in_a_condition_in_the_tools_own_words(kube: Kube, sources: dict[str, str]) -> None:
    k = kube
    npm = {"NPM_CONFIG_REGISTRY": sources["npm"], **_pip(sources)}
    cases = {
        # name: the words a user must read in the Stack's conditions or its last update
        "typeerror": ["index.ts(3,7)", "TS2322", "not assignable to type 'number'"],
        "missingdep": ["pko-e2e-absent", "E404", sources["npm"]],
        "dotnet": ["runtime 'dotnet' has no language host", "it runs: go, nodejs, python, yaml"],
        "misspelled": ["runtime 'nodjs' has no language host", "pulumi-language-nodjs"],
        "pymissing": ["No matching distribution found for pko-e2e-absent==1.0"],
    }
    for name in cases:
        k.apply(stack(name, _from_git(sources["git"], name), npm))
    for name, words in cases.items():
        s = _stalled_or_failed(k, name)
        said = _said(s)
        for word in words:
            assert word in said, f"{name}: {word!r} not in what the stack says:\n{said}"
    _finish(k, *cases)
