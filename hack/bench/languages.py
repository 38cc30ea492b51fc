"""The same resources in YAML, Python, TypeScript and Go, on the real node, side by side in one run; and
the workspace image with every language beside its core (YAML and Python only).

    hack/up.sh
    .venv/bin/python hack/bench/languages.py            # YAML, Python, TypeScript, Go; 2 config updates each
    .venv/bin/python hack/bench/languages.py --updates 1 --languages yaml,go

Each language's program creates one ConfigMap through pulumi-kubernetes from a config value and exports
it; each is served from git on the node's address (Go modules from the pko module cache as a GOPROXY:
pods reach no proxy here), and each Stack keeps its state on a claim of its own. Per language, one after
another: the Stack applied -> Ready (the first deploy: workspace pod, program fetch, `pulumi install`,
the first `pulumi up` with the TypeScript or Go compile), then config changes -> Ready, each beside the
`pulumi up` the agent ran (its log, operation start -> end). The YAML program runs a second time on the
core image (`images/workspace/Dockerfile --target core`), for pod created -> agent serving with each
image; the images' sizes are read from their archives. Figures are one run's medians.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from common import REPO
from driver import exit_on_sigterm, log
from dulwich.repo import Repo
from node import KUBECONFIG, NAMESPACE, POLL, _kube_time, agent_log, when
from timeline import operation_span

from pko.devtools.benchrecord import recording
from pko.devtools.gitserver import git_commit, serve_git
from pko.devtools.goproxy import go_sum, serve_module_cache
from pko.devtools.kubectl import run
from pko.devtools.localnode.images import import_images
from pko.devtools.stacks import claimed_stack
from pko.devtools.versions import cache_dir, versions
from pko.devtools.waiting import wait_until

NODE_IP = "10.87.0.1"  # hack/localnode.py: the node's own address, which pods reach
LANGUAGES = ("yaml", "python", "typescript", "go")
CORE_IMAGE = "pko-workspace-core:dev"

YAML = """\
name: bench-yaml
runtime: yaml
config:
  greeting:
    type: string
resources:
  settings:
    type: kubernetes:core/v1:ConfigMap
    properties:
      metadata:
        name: bench-yaml
      data:
        greeting: ${greeting}
outputs:
  greeting: ${settings.data.greeting}
"""

PYTHON = """\
import pulumi

config = pulumi.Config()
settings = pulumi.CustomResource(
    "kubernetes:core/v1:ConfigMap",
    "settings",
    {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "bench-python"},
        "data": {"greeting": config.require("greeting")},
    },
    pulumi.ResourceOptions(version="%(kubernetes)s"),
)
pulumi.export("greeting", settings.data.apply(lambda data: data["greeting"]))
"""

TYPESCRIPT = """\
import * as pulumi from "@pulumi/pulumi";
import * as k8s from "@pulumi/kubernetes";

const config = new pulumi.Config();
const settings = new k8s.core.v1.ConfigMap("settings", {
    metadata: { name: "bench-typescript" },
    data: { greeting: config.require("greeting") },
});
export const greeting = settings.data["greeting"];
"""

GO = """\
package main

import (
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi/config"
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
			"metadata":   pulumi.Map{"name": pulumi.String("bench-go")},
			"data":       pulumi.StringMap{"greeting": pulumi.String(config.Require(ctx, "greeting"))},
		}, &settings, pulumi.Version("%(kubernetes)s"))
		if err != nil {
			return err
		}
		ctx.Export("greeting", settings.Data.MapIndex(pulumi.String("greeting")))
		return nil
	})
}
"""

# Go's caches on the Stack's state claim, so a new pod reuses them (docs/workspaces.md: Go build cache).
GO_CACHES = {"GOCACHE": "/state/go-build", "GOMODCACHE": "/state/go-mod"}


def stack_manifest(name: str, language: str, sources: dict[str, str], image: str | None) -> str:
    """The Stack ``name`` of the language's folder in the served repository (``sources["git"]``), its
    Go modules from ``sources["goproxy"]`` and Go's caches on its state claim (:data:`GO_CACHES`), its
    state on a claim of its own, a ``greeting`` config value; ``image``: its workspace image (else the
    operator's default): the e2e suite's Stack (claimed_stack)."""
    return claimed_stack(
        name,
        f"projectRepo: {sources['git']}\n  branch: main\n  repoDir: {language}",
        passphrase="bench",
        config={"greeting": "hello"},
        env={"GOPROXY": sources["goproxy"], "GOSUMDB": "off", **GO_CACHES},
        workspace={"image": image} if image else None,
    )


def kubectl(*args: str, input: str | None = None) -> str:
    return run("-n", NAMESPACE, *args, kubeconfig=KUBECONFIG, input=input, timeout=600).stdout


def get(kind: str, name: str) -> dict[str, Any] | None:
    out = subprocess.run(
        ["kubectl", f"--kubeconfig={KUBECONFIG}", "-n", NAMESPACE, "get", kind, name, "-o", "json"],
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout) if out.returncode == 0 else None


def go_files(workdir: Path) -> dict[str, bytes]:
    """The Go program with its go.sum, from the pko module cache alone (hack/build-runtimes.sh fills it)."""
    v = versions()
    sdk = f"github.com/pulumi/pulumi/sdk/v3 v{v['PULUMI_VERSION']}"
    files = {
        "go.mod": f"module example.com/bench\n\ngo 1.25\n\nrequire {sdk}\n",
        "main.go": GO % {"kubernetes": v["PULUMI_KUBERNETES_VERSION"]},
    }
    locked = go_sum(workdir / "go", files, cache_dir() / "go" / "mod")
    return {**{name: text.encode() for name, text in files.items()}, "go.sum": locked}


def programs(workdir: Path) -> dict[str, bytes]:
    kubernetes = versions()["PULUMI_KUBERNETES_VERSION"]
    tsconfig = {
        "compilerOptions": {"strict": True, "target": "es2020", "module": "commonjs"},
        "files": ["index.ts"],
    }
    files = {
        "yaml/Pulumi.yaml": YAML.encode(),
        "python/Pulumi.yaml": b"name: bench-python\nruntime: python\n",
        "python/__main__.py": (PYTHON % {"kubernetes": kubernetes}).encode(),
        "typescript/Pulumi.yaml": b"name: bench-typescript\nruntime: nodejs\n",
        "typescript/index.ts": TYPESCRIPT.encode(),
        "typescript/package.json": json.dumps({"name": "bench-typescript", "main": "index.ts"}).encode(),
        "typescript/tsconfig.json": json.dumps(tsconfig).encode(),
        "go/Pulumi.yaml": b"name: bench-go\nruntime: go\n",
    }
    files.update({f"go/{name}": data for name, data in go_files(workdir).items()})
    return files


def ready_for(name: str, generation: int) -> dict[str, Any] | None:
    stack = get("stack", name)
    status = (stack or {}).get("status") or {}
    ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    last = status.get("lastUpdate") or {}
    if ready and ready[0].get("status") == "True" and last.get("generation") == generation:
        return stack
    if last.get("generation") == generation and last.get("state") == "failed":
        raise RuntimeError(f"stack {name}: {last.get('message')}")
    return None


async def until_ready(name: str, generation: int, within: float = 900) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        return ready_for(name, generation)

    stack: dict[str, Any] = await wait_until(
        f"stack {name} generation {generation} Ready", check, within=within, interval=POLL
    )
    return stack


def up_seconds(stack: dict[str, Any]) -> float:
    """The agent's operation start -> end for the Stack's last update (its `pulumi up`)."""
    pod = f"{stack['metadata']['name']}-workspace-0"
    update = get("update", stack["status"]["lastUpdate"]["name"]) or {}
    op = update.get("metadata", {}).get("uid")
    span = operation_span(agent_log(pod), str(op))
    if span is None:
        raise RuntimeError(f"the agent's log in {pod} has no start and end for operation {op}")
    return span[1] - span[0]


def serving_seconds(name: str) -> float:
    """The workspace pod's creation -> its agent's `server listening` (whole seconds at creation)."""
    pod = get("pod", f"{name}-workspace-0") or {}
    created = _kube_time(pod["metadata"]["creationTimestamp"]) or 0.0
    listening = [when(e) for e in agent_log(f"{name}-workspace-0") if e.get("msg") == "server listening"]
    return listening[-1] - created


async def change_config(name: str, greeting: str) -> tuple[float, float]:
    """A config change applied -> the Stack Ready at its generation: (wall seconds, its `pulumi up`)."""
    t0 = time.time()
    change = json.dumps({"spec": {"config": {"greeting": greeting}}})
    patched = json.loads(kubectl("patch", "stack", name, "--type=merge", "-o", "json", "-p", change))
    stack = await until_ready(name, int(patched["metadata"]["generation"]))
    wall = time.time() - t0
    assert stack["status"]["outputs"] == {"greeting": greeting}, stack["status"]
    return wall, up_seconds(stack)


async def new_pod(name: str) -> None:
    """The workspace pod deleted -> a new pod (another uid) whose agent is ready (its readiness probe)."""
    pod = f"{name}-workspace-0"
    old = (get("pod", pod) or {})["metadata"]["uid"]
    kubectl("delete", "pod", pod, "--wait=false")

    async def serving() -> bool:
        new = get("pod", pod) or {}
        if new.get("metadata", {}).get("uid") in (None, old):
            return False
        statuses = (new.get("status") or {}).get("containerStatuses") or []
        return any(c.get("name") == "pulumi" and c.get("ready") for c in statuses)

    await wait_until(f"a new {pod} serving", serving, within=600, interval=POLL)


async def run_language(
    language: str, sources: dict[str, str], updates: int, image: str | None, new_pod_update: bool
) -> dict[str, Any]:
    name = f"bench-{language}" + ("-core" if image else "")
    t0 = time.time()
    kubectl("apply", "-f", "-", input=stack_manifest(name, language, sources, image))
    stack = await until_ready(name, 1)
    row: dict[str, Any] = {
        "first": time.time() - t0,
        "first_up": up_seconds(stack),
        "serving": serving_seconds(name),
    }
    walls, ups = [], []
    for i in range(updates):
        wall, up = await change_config(name, f"hello {i + 1}")
        walls.append(wall)
        ups.append(up)
    if updates:
        row["update"], row["update_up"] = statistics.median(walls), statistics.median(ups)
    if new_pod_update:
        await new_pod(name)
        row["new_pod_update"], row["new_pod_update_up"] = await change_config(name, "in a new pod")
    log(f"  {name}: " + ", ".join(f"{k} {v:.1f}s" for k, v in row.items()))
    kubectl("delete", "stack", name, "--wait=false")

    async def gone() -> bool:
        return get("stack", name) is None

    await wait_until(f"stack {name} deleted", gone, within=600, interval=POLL)
    kubectl("delete", "pvc", f"{name}-state", "--wait=false")
    return row


def image_sizes(archive: Path) -> tuple[int, int]:
    """An OCI archive's (compressed, unpacked) bytes: what a registry pull moves, what a node stores."""
    packed = unpacked = 0
    with tarfile.open(archive) as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]

        def blob(digest: str) -> tarfile.ExFileObject:
            return tar.extractfile("blobs/" + digest.replace(":", "/"))  # type: ignore[return-value]

        manifest = json.load(blob(index["manifests"][0]["digest"]))
        for layer in manifest["layers"]:
            packed += int(layer["size"])
            with gzip.open(blob(layer["digest"])) as stream:
                while chunk := stream.read(1 << 20):
                    unpacked += len(chunk)
    return packed, unpacked


def core_image() -> Path:
    out = cache_dir() / "images-bench"
    subprocess.run(["bash", str(REPO / "hack" / "build-images.sh")], check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "PKO_WORKSPACE_CORE_OUT": str(out)})  # fmt: skip
    return out / "pko-workspace-core.oci.tar"


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    """Every figure of the run, as the tables print them and the JSON records them."""
    languages = [lang for lang in args.languages.split(",") if lang]
    core = core_image() if args.core else None
    if core is not None:
        log("importing the core image into the node")
        import_images([core])
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        repo = Repo.init_bare(str(Path(tmp) / "repo.git"), mkdir=True)
        git_commit(repo, programs(Path(tmp)), b"one ConfigMap in every language")
        repo.refs.set_symbolic_ref(b"HEAD", b"refs/heads/main")
        sources = {
            "git": stack.enter_context(serve_git(repo, host=NODE_IP)),
            "goproxy": stack.enter_context(
                serve_module_cache(cache_dir() / "go" / "mod" / "cache" / "download", host=NODE_IP)
            ),
        }
        rows: dict[str, dict[str, Any]] = {}
        for language in languages:
            log(f"{language}")
            rows[language] = await run_language(language, sources, args.updates, None, args.new_pod)
        if core is not None:
            log("yaml on the core image")
            rows["yaml (core image)"] = await run_language("yaml", sources, 0, CORE_IMAGE, False)
    images = []
    if core is not None:
        full = cache_dir() / "images" / "pko-workspace.oci.tar"
        for label, archive in (
            ("every language (pko-workspace:dev)", full),
            ("core: YAML and Python (--target core)", core),
        ):
            packed, unpacked = image_sizes(archive)
            images.append({"image": label, "archive_bytes": packed, "unpacked_bytes": unpacked})
    return {"updates_per_language": args.updates, "programs": rows, "images": images}


def print_tables(figures: dict[str, Any]) -> None:
    """The run's tables, from the figures bench() took (the same dict the JSON records)."""
    print("# The same ConfigMap in every language, on the local node, real Pulumi engine\n")
    print(f"One run, {figures['updates_per_language']} config update(s) per language (medians); seconds.\n")
    print("| program | apply -> Ready (first deploy) | its `pulumi up` | pod created -> agent serving "
          "| config change -> Ready | its `pulumi up` | in a new pod: config change -> Ready "
          "| its `pulumi up` |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")

    def pair(r: dict[str, Any], key: str) -> str:
        return f"{r[key]:.1f} | {r[key + '_up']:.1f}" if key in r else "- | -"

    for language, r in figures["programs"].items():
        print(
            f"| {language} | {r['first']:.1f} | {r['first_up']:.1f} | {r['serving']:.1f} "
            f"| {pair(r, 'update')} | {pair(r, 'new_pod_update')} |"
        )
    if figures["images"]:
        print("\n## Workspace images\n")
        print("| workspace image | archive (pulled) | unpacked |")
        print("|---|---:|---:|")
        for image in figures["images"]:
            print(
                f"| {image['image']} | {image['archive_bytes'] / 1e6:.0f} MB | "
                f"{image['unpacked_bytes'] / 1e6:.0f} MB |"
            )


def main() -> int:
    exit_on_sigterm()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--updates", type=int, default=2, help="config updates per language")
    p.add_argument(
        "--languages", default=",".join(LANGUAGES), help="comma-separated, of " + ",".join(LANGUAGES)
    )
    p.add_argument("--no-core", dest="core", action="store_false", help="skip the core image's run")
    p.add_argument(
        "--no-new-pod", dest="new_pod", action="store_false", help="skip the config change in a new pod"
    )
    p.add_argument("--json", type=Path, help="write every printed figure and the run's record here")
    args = p.parse_args()
    if not KUBECONFIG.exists():
        print("bench: no local node; run hack/up.sh first", file=sys.stderr)
        return 2
    with recording("hack/bench/languages.py", args.json, vars(args)) as run:
        run.figures.update(asyncio.run(bench(args)))
        print_tables(run.figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
