"""Programs in every language the workspace image runs, on the real node with the real engine, applied
from examples/ as users apply them (docs/examples.md), with examples/components/local-node and the
addresses of the servers below: the seed walkthrough's TypeScript nginx (a Deployment and a Service
through @pulumi/kubernetes) from git, as the seed's Stack is written; a JavaScript program; a Go program;
a Python program with its requirements.txt; Python programs with a requirement from an index, with and
without a virtualenv (inline here); and the bad input a user meets first (a TypeScript type
error, a missing npm or pip package, a runtime the image lacks, a misspelled one), each ending in a
condition that says what to fix in the compiler's, npm's, pip's or the engine's own words.

Workspace pods reach no registry here, as in an air-gapped cluster: a program's own dependencies come
from what the test serves on the node's address, as users serve theirs: an npm registry
(pko/devtools/npmregistry.py: the TypeScript and JavaScript examples' lockfiles, which must be cut from the
image's own, from the npm cache the image build filled), a Go module proxy (pko/devtools/goproxy.py: the pko
module cache, which hack/build-runtimes.sh filled with the modules a Go program on the pinned SDK needs:
the Go example's go.sum must be what they resolve to) and a Python package index (pko/devtools/pypiindex.py: a
wheel the test makes). The git server serves the examples' program folders at their paths in this
repository, over HTTPS with a certificate of the suite's own CA, which the operator and the workspace
pods trust as docs/stacks.md says (e2e/conftest.py's git_tls), so either operator fetches it
(``PKO_E2E_OPERATOR``); and over SSH on port 22 for examples/git-ssh, whose host key each operator's
install trusts (pko's in GIT_SSH_KNOWN_HOSTS, the Go operator's in a file SSH_KNOWN_HOSTS names) and
the example's known_hosts holds for the workspace's fetch. What a program does not install itself
(@pulumi/pulumi, the providers' SDKs, TypeScript) the image has in /node_modules; the Python SDK is in
the image's Python, and a virtualenv gets it and pip's own tools from the image's wheelhouse. Where the
Go operator differs (a Flux source's recorded revision, a Python program's requirements, a missing
language host's words, a Node.js or Go program's destroy at deletion), the tests assert what it does
(docs/differences.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dulwich.repo import Repo

from pko.devtools.examples import EXAMPLES, local_example
from pko.devtools.fluxsource import GITREPOSITORY_CRD, artifact_app, tarball
from pko.devtools.gitserver import ServerTLS, git_commit, serve_git, serve_wsgi
from pko.devtools.gitssh import known_hosts_line, new_ed25519_openssh, serve_git_ssh
from pko.devtools.goproxy import go_sum, serve_module_cache
from pko.devtools.npmregistry import Registry, lockfile_subset, serve_registry
from pko.devtools.pypiindex import Index, make_wheel, serve_index
from pko.devtools.versions import cache_dir, versions

from .conftest import GIT_SSH_HOST_KEY, NODE_IP, OPERATOR, Kube, trusting_git_ca
from .stacks import flux_source_ready, gone, ready
from .stacks import stack as claimed

pytestmark = pytest.mark.timeout(1800)

REPO = Path(__file__).resolve().parents[1]
IMAGE_LOCK = REPO / "images" / "workspace" / "nodejs" / "package-lock.json"

# The npm packages each JavaScript/TypeScript example pins in its package-lock.json: the image's
# versions, so its lockfile is the closure of these in the image's lockfile (asserted below).
NPM_EXAMPLES = {
    "nginx": ("@pulumi/pulumi", "@pulumi/kubernetes", "@types/node", "typescript"),
    "javascript": ("@pulumi/pulumi", "@pulumi/kubernetes"),
}
PROGRAMS = EXAMPLES / "programs"

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


def _example_files() -> dict[str, bytes]:
    """The examples' program folders, at their paths in this repository (what a Stack's repoDir names)."""
    return {
        str(path.relative_to(REPO)): path.read_bytes()
        for path in sorted(PROGRAMS.rglob("*"))
        if path.is_file()
    }


def _check_pins(tmp_path: Path) -> None:
    """The examples' dependency pins are the workspace image's (what an air-gapped cluster has): the npm
    lockfiles are cut from the image's, and go.sum is what the pko module cache resolves go.mod to."""
    v = versions()
    lock = json.loads(IMAGE_LOCK.read_text())
    pinned = lock["packages"][""]["dependencies"]
    for name, roots in NPM_EXAMPLES.items():
        want = lockfile_subset(lock, {root: pinned[root] for root in roots}, name)
        have = json.loads((PROGRAMS / name / "package-lock.json").read_text())
        assert have == want, f"examples/programs/{name}/package-lock.json: not the image's pins"
        package = json.loads((PROGRAMS / name / "package.json").read_text())
        assert package["dependencies"] == want["packages"][""]["dependencies"], package
    go = PROGRAMS / "go"
    go_mod, main_go = (go / "go.mod").read_text(), (go / "main.go").read_text()
    assert f"github.com/pulumi/pulumi/sdk/v3 v{v['PULUMI_VERSION']}" in go_mod, go_mod
    assert f'pulumi.Version("{v["PULUMI_KUBERNETES_VERSION"]}")' in main_go
    tidy = go_sum(tmp_path / "golang", {"go.mod": go_mod, "main.go": main_go}, cache_dir() / "go" / "mod")
    assert (go / "go.sum").read_bytes() == tidy, "examples/programs/go/go.sum: not what go mod tidy resolves"


def stack(name: str, source: str, env: dict[str, str] | None = None) -> str:
    """The suite's Stack (e2e/stacks.py), its workspace pods trusting the git server's CA."""
    return trusting_git_ca(claimed(name, source, env))


# The repository's path on the git server over SSH: two segments, as for HTTPS (the Go operator refuses
# one: docs/differences.md).
SSH_PATH = "/e2e/programs.git"


@pytest.fixture
def sources(tmp_path: Path, git_tls: ServerTLS) -> Iterator[dict[str, str]]:
    """The programs' git repository (over HTTPS, and over SSH on port 22 with a deploy key), npm
    registry and Go module proxy, on the node's address."""
    v = versions()
    _check_pins(tmp_path)
    registry = Registry()
    for name in NPM_EXAMPLES:
        lockfile = json.loads((PROGRAMS / name / "package-lock.json").read_text())
        registry.add_lockfile(lockfile, cache_dir() / "npm")

    index = Index()
    index.add_wheel(make_wheel(tmp_path / "wheels", "pko-e2e-greeting", "1.0.0", GREETING_WHEEL))
    python = {"kubernetes": v["PULUMI_KUBERNETES_VERSION"]}

    files = {
        **_example_files(),
        # A requirement from the index, into the image's Python; and into a virtualenv the language
        # host makes.
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
    commit = git_commit(repo, files, b"programs in every language")
    # The Flux source's artifact: the repository's files, as source-controller packs them.
    artifact, digest = tarball(files)
    path = f"/gitrepository/default/pko-examples/{digest[7:19]}.tar.gz"
    repo.refs.set_symbolic_ref(b"HEAD", b"refs/heads/main")
    downloads = cache_dir() / "go" / "mod" / "cache" / "download"
    deploy_key = new_ed25519_openssh()
    with (
        serve_git(repo, "/e2e/programs.git", NODE_IP, git_tls) as git,  # the Go operator wants org/repo
        serve_git_ssh({SSH_PATH: repo}, deploy_key, host=NODE_IP, port=22, host_key=GIT_SSH_HOST_KEY),
        serve_registry(registry, host=NODE_IP) as npm,
        serve_module_cache(downloads, host=NODE_IP) as goproxy,
        serve_index(index, host=NODE_IP) as pypi,
        serve_wsgi(artifact_app(path, artifact), host=NODE_IP) as artifacts,
    ):
        ssh = f"ssh://git@{NODE_IP}{SSH_PATH}"
        yield {
            "git": git, "ssh": ssh, "deploy_key": deploy_key, "npm": npm, "goproxy": goproxy, "pypi": pypi,
            "flux_url": artifacts + path, "flux_digest": digest, "flux_revision": f"main@sha1:{commit}",
        }  # fmt: skip


def _pip(sources: dict[str, str]) -> dict[str, str]:
    """pip's environment for the test's index: plain HTTP on the node's address must be trusted."""
    return {"PIP_INDEX_URL": sources["pypi"], "PIP_TRUSTED_HOST": NODE_IP}


def _from_git(url: str, directory: str) -> str:
    return f"projectRepo: {url}\n  branch: main\n  repoDir: {directory}"


def _env_ops(env: dict[str, str]) -> list[dict[str, Any]]:
    """JSON patch operations adding ``env`` (the package mirrors' addresses) to a Stack's envRefs."""
    return [
        {
            "op": "add",
            "path": f"/spec/envRefs/{key}",
            "value": {"type": "Literal", "literal": {"value": value}},
        }
        for key, value in env.items()
    ]


def _example(k: Kube, folder: Path, name: str, sources: dict[str, str], env: dict[str, str]) -> None:
    """``examples/<name>`` applied as docs/examples.md says for the local node: its program from the
    test's git server (its workspace pod trusting the server's CA), ``env`` (the package mirrors'
    addresses) in its workspace pod."""
    ops = [{"op": "replace", "path": "/spec/projectRepo", "value": sources["git"]}, *_env_ops(env)]
    k.apply(trusting_git_ca(k.run("kustomize", str(local_example(name, folder / name, ops)))))


def _flux_source_example(k: Kube, folder: Path, sources: dict[str, str], env: dict[str, str]) -> None:
    """examples/flux-source with this test in the place of Flux's source-controller
    (pko.devtools.fluxsource: the GitRepository kind alone, no controller): the folder applied, then the
    status source-controller writes once it has stored the repository's artifact, which the test
    serves on the node's address. pko reads nothing of a Flux source but that status."""
    example = k.run("kustomize", str(local_example("flux-source", folder / "flux-source", _env_ops(env))))
    flux_source_ready(
        k, example, "pko-examples", sources["flux_url"], sources["flux_digest"], sources["flux_revision"]
    )


def _git_ssh_example(k: Kube, folder: Path, sources: dict[str, str], env: dict[str, str]) -> None:
    """examples/git-ssh as its header says: the deploy key's Secret, then the folder, its program from
    the test's server over SSH (whose host key the local-node component writes in known_hosts)."""
    key = f"--from-literal=sshPrivateKey={sources['deploy_key']}"
    k.apply(k.run("create", "secret", "generic", "git-deploy-key", key, "--dry-run=client", "-o", "yaml"))
    _example(k, folder, "git-ssh", {**sources, "git": sources["ssh"]}, env)


# The Go operator (v2.9.0) runs every destroy at a Stack's deletion in a Workspace of the saved project
# alone (its Pulumi.yaml), where `pulumi install` fails for these: npm, with no package.json there, takes
# the image's /node_modules above it for the project's; go finds no go.mod. The Stack then stalls on
# its finalizer, its resources left (docs/differences.md). The tool's words it shows, by Stack.
GO_UNDESTROYED = {
    "nginx": "npm error",
    "javascript": "npm error",
    "git-ssh": "npm error",
    "flux-source": "npm error",
    "golang": "go.mod file not found",
}


def _finish(k: Kube, *names: str, made: tuple[tuple[str, str], ...] = ()) -> None:
    """Delete the Stacks; wait until they, their Workspaces and ``made`` (kind, name: what their
    destroys remove) are gone; then their state claims go."""
    for name in names:
        k.run("delete", "stack", name, "--wait=false")
    stuck = [name for name in names if OPERATOR == "go" and name in GO_UNDESTROYED]
    for name in stuck:
        _destroy_never_installed(k, name)
    for kind, obj in made if stuck else ():  # never destroyed: removed by hand
        assert k.get(kind, obj) is not None, f"{kind} {obj} went without a destroy"
        k.run("delete", kind, obj, "--wait=false")
    for name in names:
        gone(k, "stack", name, within=600)
        gone(k, "workspace", name)
        k.run("delete", "pvc", f"{name}-state", "--wait=false")
    for kind, obj in made:
        gone(k, kind, obj)


def _destroy_never_installed(k: Kube, name: str) -> None:
    """The Go operator: Stack ``name``, deleted, stalls in the Workspace of its saved project; its
    finalizer is then removed by hand, as its users must."""

    def stalled() -> dict[str, Any] | None:
        s = k.get("stack", name)
        return s if k.condition(s, "Stalled").get("status") == "True" else None

    s = k.until(f"stack {name} stalled in its deletion", stalled, 600)
    why = k.condition(s, "Stalled")
    assert why.get("reason") == "WorkspaceFailed", why
    assert why["message"].startswith("InstallationFailed: "), why
    assert GO_UNDESTROYED[name] in why["message"], why
    project = ((k.get("workspace", name) or {}).get("spec") or {}).get("projectInfo") or {}
    assert project.get("name"), f"workspace {name}: not of the saved project"
    k.run("patch", "stack", name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}')


def test_the_seed_typescript_nginx_javascript_and_go_examples_deploy(
    kube: Kube, sources: dict[str, str], tmp_path: Path
) -> None:
    k = kube
    npm = {"NPM_CONFIG_REGISTRY": sources["npm"]}
    go = {"GOPROXY": sources["goproxy"], "GOSUMDB": "off", "GOFLAGS": "-mod=mod"}
    _example(k, tmp_path, "nginx", sources, npm)
    _example(k, tmp_path, "javascript", sources, npm)
    _example(k, tmp_path, "go", sources, go)
    _git_ssh_example(k, tmp_path, sources, npm)
    _flux_source_example(k, tmp_path, sources, npm)

    # TypeScript: the seed's program, its dependencies installed from its lockfile, compiled by ts-node;
    # the web server's image from the stack's config (the local node's own, by the local-node component).
    s = ready(k, "nginx", within=900)
    outputs = s["status"]["outputs"]
    assert set(outputs) == {"name", "serviceName", "clusterIP"}, outputs
    deployment = k.get("deployment", outputs["name"])
    assert deployment is not None
    assert deployment["status"].get("readyReplicas") == 1, deployment["status"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "localhost/pko-base-python:bookworm", container
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

    # JavaScript: no compile step, its text from the stack's config.
    s = ready(k, "javascript", within=600)
    greeting = s["status"]["outputs"]
    assert greeting["greeting"] == "hello from javascript" and set(greeting) == {"name", "greeting"}, greeting
    settings = k.get("configmap", greeting["name"])
    assert settings is not None and settings["data"] == {"greeting": "hello from javascript"}

    # git-ssh: the same program over SSH with the deploy key, the server trusted by known_hosts alone
    # (the operator's branch lookup and the workspace's fetch; each operator's install trusts it:
    # e2e/conftest.py).
    known = k.get("configmap", "known-hosts") or {}
    assert known["data"]["known_hosts"].strip() == known_hosts_line(NODE_IP, 22, GIT_SSH_HOST_KEY).strip()
    s = ready(k, "git-ssh", within=600)
    ssh_greeting = s["status"]["outputs"]
    assert ssh_greeting["greeting"] == "hello over ssh", ssh_greeting
    settings = k.get("configmap", ssh_greeting["name"])
    assert settings is not None and settings["data"] == {"greeting": "hello over ssh"}
    _finish(k, "git-ssh", made=(("configmap", ssh_greeting["name"]),))
    k.run("delete", "secret", "git-deploy-key")
    k.run("delete", "configmap", "known-hosts")

    # flux-source: the same program from the Flux source's artifact, its digest the deployed revision
    # (the Go operator records the source's revision, branch@sha1:commit: docs/differences.md).
    s = ready(k, "flux-source", within=600)
    flux_greeting = s["status"]["outputs"]
    assert flux_greeting["greeting"] == "hello from a flux source", flux_greeting
    deployed = sources["flux_digest"] if OPERATOR == "pko" else sources["flux_revision"]
    assert s["status"]["lastUpdate"]["lastSuccessfulCommit"] == deployed, s["status"]
    settings = k.get("configmap", flux_greeting["name"])
    assert settings is not None and settings["data"] == {"greeting": "hello from a flux source"}
    _finish(k, "flux-source", made=(("configmap", flux_greeting["name"]),))
    k.run("delete", "gitrepository", "pko-examples")
    k.run("delete", "crd", GITREPOSITORY_CRD["metadata"]["name"], "--wait=false")

    # Go: modules from the proxy, compiled in the pod by the image's toolchain.
    s = ready(k, "golang", within=900)
    assert s["status"]["outputs"] == {"language": "go"}, s["status"]
    assert k.get("configmap", "golang-settings") is not None

    made = (
        ("deployment", outputs["name"]),
        ("service", outputs["serviceName"]),
        ("configmap", greeting["name"]),
        ("configmap", "golang-settings"),
    )
    _finish(k, "nginx", "javascript", "golang", made=made)


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


def _requirements_where_the_program_runs(k: Kube, names: tuple[str, ...]) -> None:
    """pko: the agent installs a pip project's requirements where the program runs."""
    for name in names:
        s = ready(k, name, within=900)
        assert s["status"]["outputs"] == {"greeting": f"hello from {name}"}, s["status"]
        settings = k.get("configmap", f"{name}-greeting")
        assert settings is not None and settings["data"] == {"greeting": f"hello from {name}"}
    # Without a virtualenv the requirement is in the Python the program ran with (the image's).
    where = k.run(
        "exec", "pyplain-workspace-0", "-c", "pulumi", "--",
        "python3", "-c", "import pko_e2e_greeting; print(pko_e2e_greeting.__file__)",
    )  # fmt: skip
    assert where.startswith("/opt/pulumi/python/"), where
    # In the virtualenv the language host made in the program's folder, beside the SDK.
    where = k.run(
        "exec", "pyvenv-workspace-0", "-c", "pulumi", "--", "sh", "-c",
        "cd /share/workspace && venv/bin/python -c "
        "'import pko_e2e_greeting, pulumi; print(pko_e2e_greeting.__file__, pulumi.__file__)'",
    )  # fmt: skip
    assert where.count("/share/") == 2 and "/venv/" in where, where


def _requirements_where_the_program_never_looks(k: Kube, names: tuple[str, ...]) -> None:
    """The Go operator's agent runs `pulumi install` as it is: the image's Python language host (v3.78)
    makes a virtualenv of the program's folder itself (the `virtualenv` option unseen), installs the
    requirements there, and runs the program with the image's Python, which lacks them: the update
    fails (docs/differences.md)."""
    for name in names:
        s = _stalled_or_failed(k, name, within=900)
        said = _said(s)
        assert "ModuleNotFoundError: No module named 'pko_e2e_greeting'" in said, said
        assert k.get("configmap", f"{name}-greeting") is None
        where = k.run(
            "exec", f"{name}-workspace-0", "-c", "pulumi", "--", "sh", "-c",
            "cd /share/workspace && test ! -e venv && bin/python -c "
            "'import pko_e2e_greeting; print(pko_e2e_greeting.__file__)'",
        )  # fmt: skip
        assert where.startswith("/share/") and "/lib/python3" in where and "/venv/" not in where, where


def test_python_programs_install_their_requirements_with_and_without_a_virtualenv(
    kube: Kube, sources: dict[str, str], tmp_path: Path
) -> None:
    k = kube
    # The example: its requirements.txt is satisfied by the image's Python (nothing to download: the
    # index would refuse what it lacks). Inline: a requirement the index serves, installed into the
    # image's Python, and into a virtualenv the language host makes.
    names = ("pyplain", "pyvenv")
    _example(k, tmp_path, "python", sources, _pip(sources))
    for name in names:
        k.apply(stack(name, _from_git(sources["git"], name), _pip(sources)))
    s = ready(k, "python", within=900)
    assert s["status"]["outputs"] == {"next": "1.3.0"}, s["status"]
    release = k.get("configmap", "python-release")
    assert release is not None and release["data"] == {"release": "1.2.3", "next": "1.3.0"}, release
    if OPERATOR == "pko":
        _requirements_where_the_program_runs(k, names)
    else:
        _requirements_where_the_program_never_looks(k, names)
    _finish(k, "python", *names)
    gone(k, "configmap", "python-release")
    for name in names:
        gone(k, "configmap", f"{name}-greeting")


def test_bad_programs_end_in_a_condition_in_the_tools_own_words(kube: Kube, sources: dict[str, str]) -> None:
    k = kube
    npm = {"NPM_CONFIG_REGISTRY": sources["npm"], **_pip(sources)}
    # A runtime the image has no language host for: pko's agent says which runtimes the image has; the
    # Go operator's Stack shows the engine's words (docs/differences.md).
    no_host = (
        {
            "dotnet": ["runtime 'dotnet' has no language host", "it runs: go, nodejs, python, yaml"],
            "misspelled": ["runtime 'nodjs' has no language host", "pulumi-language-nodjs"],
        }
        if OPERATOR == "pko"
        else {
            "dotnet": ["no language plugin 'pulumi-language-dotnet' found"],
            "misspelled": ["no language plugin 'pulumi-language-nodjs' found"],
        }
    )
    cases = {
        # name: the words a user must read in the Stack's conditions or its last update
        "typeerror": ["index.ts(3,7)", "TS2322", "not assignable to type 'number'"],
        "missingdep": ["pko-e2e-absent", "E404", sources["npm"]],
        **no_host,
        "pymissing": ["No matching distribution found for pko-e2e-absent==1.0"],
    }
    for name in cases:
        k.apply(stack(name, _from_git(sources["git"], name), npm))
    for name, words in cases.items():
        s = _stalled_or_failed(k, name)
        said = _said(s)
        for word in words:
            assert word in said, f"{name}: {word!r} not in what the stack says:\n{said}"
        if OPERATOR == "go" and name != "typeerror":  # `pulumi install` failed: the Workspace stalled
            stalled = k.condition(s, "Stalled")
            assert stalled.get("reason") == "WorkspaceFailed", stalled
            assert stalled["message"].startswith("InstallationFailed: "), stalled
    _finish(k, *cases)
