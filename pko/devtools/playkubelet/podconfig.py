"""What a pod's containers are given: volumes, the pod's kube identity, each container's mounts,
environment, working directory and argv (the package docstring's **Sandbox** and **Identity**)."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiException

from pko.machinery.quantity import parse_quantity
from pko.machinery.resource import CONFIGMAPS, SECRETS, ResourceClient

from .podstate import PodState
from .programs import BASE_PATH, SLEEP_FOREVER, expand_vars, rewrite_paths, translate_argv
from .runtime import ConfigError, Container, Obj

SA_TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"


class PodConfig(PodState):
    """Resolves a pod's volumes and identity, and each container's process inputs, from the API."""

    def _mounts(self, c: Container) -> list[tuple[str, Path]]:
        out: list[tuple[str, Path]] = []
        for m in c.spec.get("volumeMounts") or []:
            host = self.volume_paths.get(m.get("name", ""))
            if host is None:
                continue
            if m.get("subPath"):
                host = host / m["subPath"]
                host.mkdir(parents=True, exist_ok=True)
            out.append((str(m["mountPath"]), host))
        return out

    def _workdir(self, c: Container, mounts: list[tuple[str, Path]]) -> Path:
        wd = c.spec.get("workingDir")
        if not wd:
            path = self.dir / "rootfs" / c.name
        else:
            rewritten = rewrite_paths(wd, mounts)
            path = Path(rewritten) if rewritten != wd else self.dir / "rootfs" / c.name / wd.lstrip("/")
        path.mkdir(parents=True, exist_ok=True)  # a runtime creates a missing working directory
        return path

    async def _env(self, c: Container, mounts: list[tuple[str, Path]]) -> dict[str, str]:
        """The process environment: host basics, the image's env, then the container's (which wins)."""
        server = urlsplit(self.k.server)
        env: dict[str, str] = {
            "PATH": ":".join([*map(str, self.k.pulumi.path_dirs), BASE_PATH]),
            "HOSTNAME": self.name,
            "HOME": str(self.dir / "home" / c.name),
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "NO_PROXY": "127.0.0.1,localhost",
            "KUBERNETES_SERVICE_HOST": server.hostname or "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(server.port or 443),
            **self.k.image_environment(self.dir / "pulumi-home"),
        }
        _mkdir(Path(env["HOME"]))
        if self.kubeconfig is not None and any(m[0].rstrip("/") == SA_TOKEN_PATH for m in mounts):
            env["KUBECONFIG"] = str(self.kubeconfig)
        own: dict[str, str] = {}
        for source in c.spec.get("envFrom") or []:
            prefix = source.get("prefix", "")
            data = await self._env_source(source)
            for k, v in data.items():
                own[prefix + k] = v
        for var in c.spec.get("env") or []:
            name = var["name"]
            if "valueFrom" in var:
                value = await self._value_from(c, var["valueFrom"])
                if value is None:
                    continue
                own[name] = value
            else:
                own[name] = expand_vars(rewrite_paths(str(var.get("value", "")), mounts), {**env, **own})
        env.update(own)
        return env

    async def _env_source(self, source: Obj) -> dict[str, str]:
        for kind, resource in (("configMapRef", CONFIGMAPS), ("secretRef", SECRETS)):
            ref = source.get(kind)
            if ref is None:
                continue
            obj = await self._read(resource, ref["name"], bool(ref.get("optional")))
            if obj is None:
                return {}
            return _data(obj)
        return {}

    async def _read(self, resource: Any, name: str, optional: bool) -> Obj | None:
        try:
            return await ResourceClient(self.k.api, resource, self.namespace).get(name)
        except ApiException as exc:
            if exc.status == 404:
                if optional:
                    return None
                raise ConfigError(f'{resource.kind.lower()} "{name}" not found') from None
            raise

    async def _value_from(self, c: Container, source: Obj) -> str | None:
        if "fieldRef" in source:
            return self._field(source["fieldRef"]["fieldPath"])
        if "resourceFieldRef" in source:
            return self._resource_field(c, source["resourceFieldRef"])
        for kind, resource in (("configMapKeyRef", CONFIGMAPS), ("secretKeyRef", SECRETS)):
            ref = source.get(kind)
            if ref is None:
                continue
            optional = bool(ref.get("optional"))
            obj = await self._read(resource, ref["name"], optional)
            if obj is None:
                return None
            data = _data(obj)
            if ref["key"] not in data:
                if optional:
                    return None
                raise ConfigError(
                    f"couldn't find key {ref['key']} in {resource.kind} {self.namespace}/{ref['name']}"
                )
            return data[ref["key"]]
        return None

    def _field(self, path: str) -> str:
        meta = self.pod["metadata"]
        spec = self.pod.get("spec") or {}
        m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
        if m:
            return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
        values = {
            "metadata.name": self.name,
            "metadata.namespace": self.namespace,
            "metadata.uid": self.uid,
            "spec.nodeName": self.k.node_name,
            "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
            "status.hostIP": "127.0.0.1",
            "status.podIP": self.ip or "",
            "status.podIPs": self.ip or "",
        }
        if path not in values:
            raise ConfigError(f"unsupported fieldPath {path!r}")
        return str(values[path])

    def _resource_field(self, c: Container, ref: Obj) -> str:
        target = self.container(ref.get("containerName") or c.name) or c
        resources = target.spec.get("resources") or {}
        kind, _, res = str(ref["resource"]).partition(".")
        node = {"cpu": "2", "memory": "8Gi", "ephemeral-storage": "100Gi"}
        raw = (resources.get(kind) or {}).get(res)
        if raw is None and kind == "requests":
            raw = (resources.get("limits") or {}).get(res, "0")
        if raw is None:
            raw = node.get(res, "0")
        divisor = parse_quantity(ref.get("divisor") or "1") or Decimal(1)  # the apiserver defaults it to "0"
        value = parse_quantity(raw) / divisor
        return str(int(value.to_integral_value(rounding=ROUND_CEILING)))

    def _argv(self, c: Container, env: Mapping[str, str], mounts: list[tuple[str, Path]]) -> list[str]:
        command = c.spec.get("command") or []
        args = c.spec.get("args")
        entrypoint, cmd = self.k.image_config.get(c.image, ([], []))
        argv = [*command, *(args or [])] if command else [*entrypoint, *(args if args is not None else cmd)]
        argv = [expand_vars(rewrite_paths(a, mounts), env) for a in argv]
        if not argv:
            return list(SLEEP_FOREVER)
        return translate_argv(argv, self.ip or "127.0.0.1")

    # -- volumes and identity

    async def _make_volumes(self) -> None:
        for vol in (self.pod.get("spec") or {}).get("volumes") or []:
            name = vol["name"]
            path = self.dir / "volumes" / name
            if "persistentVolumeClaim" in vol:
                path = self.k.root / "pvc" / self.namespace / vol["persistentVolumeClaim"]["claimName"]
            path.mkdir(parents=True, exist_ok=True)
            self.volume_paths[name] = path
            if "secret" in vol:
                src = vol["secret"]
                obj = await self._read(SECRETS, src["secretName"], bool(src.get("optional")))
                _write_items(path, _data(obj) if obj else {}, src.get("items"))
            elif "configMap" in vol:
                src = vol["configMap"]
                obj = await self._read(CONFIGMAPS, src["name"], bool(src.get("optional")))
                _write_items(path, _data(obj) if obj else {}, src.get("items"))
            elif "downwardAPI" in vol:
                self._write_downward(path, vol["downwardAPI"].get("items") or [])
            elif "projected" in vol:
                for source in vol["projected"].get("sources") or []:
                    await self._write_projection(path, source)

    def _write_downward(self, path: Path, items: list[Obj]) -> None:
        for item in items:
            if "fieldRef" in item:
                value = self._field(item["fieldRef"]["fieldPath"])
            else:
                value = self._resource_field(self.main[0], item["resourceFieldRef"])
            target = path / item["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(value)

    async def _write_projection(self, path: Path, source: Obj) -> None:
        if "serviceAccountToken" in source:
            sat = source["serviceAccountToken"]
            audiences = [sat["audience"]] if sat.get("audience") else None
            token = await self._mint(audiences, int(sat.get("expirationSeconds", 3607)))
            (path / sat.get("path", "token")).write_text(token)
        elif "secret" in source or "configMap" in source:
            kind, resource = ("secret", SECRETS) if "secret" in source else ("configMap", CONFIGMAPS)
            src = source[kind]
            obj = await self._read(resource, src["name"], bool(src.get("optional")))
            _write_items(path, _data(obj) if obj else {}, src.get("items"))
        elif "downwardAPI" in source:
            self._write_downward(path, source["downwardAPI"].get("items") or [])

    async def _mint(self, audiences: list[str] | None, expiration: int = 3607) -> str:
        """A TokenRequest token for the pod's service account, bound to this pod (as the kubelet gets one)."""
        sa = (self.pod.get("spec") or {}).get("serviceAccountName") or "default"
        spec: Obj = {
            "expirationSeconds": expiration,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": self.name, "uid": self.uid},
        }
        if audiences:
            spec["audiences"] = audiences
        body: Any = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        resp: Any = await client.CoreV1Api(self.k.api).create_namespaced_service_account_token(
            sa, self.namespace, body, _preload_content=False
        )
        return str(json.loads(await resp.read())["status"]["token"])

    async def _make_kubeconfig(self) -> None:
        token = await self._mint(None)
        ca = base64.b64encode(self.k.ca_file.read_bytes()).decode()
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "in-cluster", "cluster": {"server": self.k.server, "certificate-authority-data": ca}}
            ],
            "users": [{"name": "pod", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "in-cluster",
                    "context": {"cluster": "in-cluster", "user": "pod", "namespace": self.namespace},
                }
            ],
            "current-context": "in-cluster",
        }
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / "kubeconfig"
        path.write_text(json.dumps(cfg, indent=2))
        path.chmod(0o600)
        self.kubeconfig = path


def _mkdir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)


def _data(obj: Obj) -> dict[str, str]:
    """A Secret's or ConfigMap's entries as text."""
    out = {k: str(v) for k, v in (obj.get("data") or {}).items()} if obj.get("kind") == "ConfigMap" else {}
    if obj.get("kind") == "Secret":
        for k, v in (obj.get("data") or {}).items():
            out[k] = base64.b64decode(v).decode(errors="replace")
        out.update({k: str(v) for k, v in (obj.get("stringData") or {}).items()})
    for k, v in (obj.get("binaryData") or {}).items():
        out[k] = base64.b64decode(v).decode(errors="replace")
    return out


def _write_items(path: Path, data: Mapping[str, str], items: list[Obj] | None) -> None:
    pairs = [(i["key"], i["path"]) for i in items] if items else [(k, k) for k in data]
    for key, rel in pairs:
        if key not in data:
            raise ConfigError(f"configmap/secret has no key {key!r}")
        target = path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(data[key])
