"""The chart tests' shared pieces: the pinned helm (hack/build-helm.sh), `helm template` of charts/pko,
and config/default as kustomize renders it, to compare with."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from pko.devtools import gen_helm
from pko.devtools.builds import tool_binary

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "pko"
CONFIG_DEFAULT = REPO / "config" / "default"
MANAGED_BY = "app.kubernetes.io/managed-by"
TIMEOUT = 180

Obj = dict[str, Any]
Key = tuple[str, str, str | None]


def helm_binary() -> str:
    return tool_binary("build-helm.sh", "helm")


def helm(home: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """The pinned helm, with its cache, config and data under ``home`` (nothing of the user's)."""
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    cmd = [helm_binary(), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=env, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}")
    return proc


# libyaml's loader where PyYAML has it: a render with the CRDs is 0.9 s to parse in pure Python.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def objects(text: str) -> list[Obj]:
    return [doc for doc in yaml.load_all(text, Loader=_LOADER) if doc]


def key(obj: Obj) -> Key:
    return obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace")


def by_key(objs: list[Obj]) -> dict[Key, Obj]:
    out = {key(o): o for o in objs}
    assert len(out) == len(objs), "two objects with the same kind, name and namespace"
    return out


@functools.cache
def kustomized() -> tuple[str, ...]:
    """`kubectl kustomize config/default`, one YAML document per object (cached as text: callers get
    their own copies)."""
    out = subprocess.run(
        ["kubectl", "kustomize", str(CONFIG_DEFAULT)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=True,
    ).stdout
    return tuple(yaml.safe_dump(o) for o in objects(out))


def config_default() -> list[Obj]:
    return [yaml.load(doc, Loader=_LOADER) for doc in kustomized()]


def config_namespace() -> str:
    return next(o["metadata"]["namespace"] for o in config_default() if "namespace" in o["metadata"])


def app_version() -> str:
    return str(yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"])


def as_helm_installs(obj: Obj) -> Obj:
    """config/default's object as the chart renders it with the default values: the managed-by label
    says Helm, and the images carry the chart's appVersion for a tag (config/ says `latest`)."""
    labels = obj["metadata"].get("labels") or {}
    if labels.get(MANAGED_BY) == "kustomize":
        labels[MANAGED_BY] = "Helm"
    if obj["kind"] == "Deployment":
        _, container = manager([obj])
        container["image"] = with_app_version(container["image"])
        for var in container["env"]:
            if var["name"] == "AGENT_IMAGE":
                var["value"] = with_app_version(var["value"])
    return obj


def with_app_version(ref: str) -> str:
    return gen_helm.join_image({**gen_helm.parse_image(ref), "tag": app_version()})


def template(home: Path, *args: str, namespace: str | None = None) -> list[Obj]:
    ns = namespace or config_namespace()
    return objects(
        helm(home, "template", "pko", str(CHART), "--namespace", ns, "--include-crds", *args).stdout
    )


def refused(home: Path, *args: str) -> str:
    """`helm template` with these arguments fails: its error output."""
    proc = helm(home, "template", "pko", str(CHART), *args, check=False)
    assert proc.returncode != 0, f"helm template {' '.join(args)} rendered:\n{proc.stdout[:2000]}"
    return proc.stderr


def manager(objs: list[Obj]) -> tuple[Obj, Obj]:
    deploy = next(o for o in objs if o["kind"] == "Deployment")
    container = next(c for c in deploy["spec"]["template"]["spec"]["containers"] if c["name"] == "manager")
    return deploy, container


def env_of(container: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
