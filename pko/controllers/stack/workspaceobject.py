"""The Workspace a Stack owns, built from the Stack's spec and its resolved source (pure, no I/O).

Follows the Go operator's ``stackReconcilerSession`` (NewWorkspace, setupWorkspace,
setupWorkspaceFromGitSource/FluxSource, UpdateConfig, SetEnvs, SetSecretEnvs): same name (the
Stack's), labels, owner reference, env order, mount paths and config items, so a user's
``workspaceTemplate`` written for the Go operator merges the same way.

Secret *values* never enter the Workspace: Secret-backed env vars are ``secretKeyRef``\\ s, and
Secret- or ConfigMap-backed config values are files the pod mounts (``valueFrom.path``), read
inside the workspace pod. The deprecated inline ``spec.secrets`` (and ``Literal`` secret refs) are
values the user wrote into the Stack itself; they are passed on as the Go operator does.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pko.api.stack import ConfigMapRef, GitAuthConfig, ResourceRef, Stack, StackSpec
from pko.api.stackterms import SHARD_LABEL
from pko.api.workspace import API_VERSION as WORKSPACE_API_VERSION
from pko.api.workspace import KIND as WORKSPACE_KIND
from pko.api.workspace import GitAuth
from pko.controllers.resources import STACK_COMPONENT, STACK_COMPONENT_LABEL, STACK_NAME_LABEL
from pko.controllers.strategicmerge import strategic_merge

__all__ = [
    "CONFIGMAP_MOUNT_ROOT",
    "PULUMI_CONTAINER",
    "SECRET_MOUNT_ROOT",
    "ArtifactRevision",
    "GitRevision",
    "PackRevision",
    "ProjectInfoRevision",
    "ResolvedSource",
    "build_workspace",
    "pack_commits",
    "stack_labels",
    "workspace_name",
]

SECRET_MOUNT_ROOT: Final = "/var/run/secrets/stacks.pulumi.com/secrets"
CONFIGMAP_MOUNT_ROOT: Final = "/var/run/configmaps/stacks.pulumi.com/configmaps"
PULUMI_CONTAINER: Final = "pulumi"

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class GitRevision:
    """A git source pinned to one commit (a branch is resolved to its head first)."""

    url: str
    commit: str
    dir: str | None = None
    shallow: bool = False


@dataclass(frozen=True, slots=True)
class PackRevision:
    """A policy pack's own source pinned: a git repository at one commit (its branch resolved to its
    head), or with ``artifact`` a Flux source's artifact (``url``) at its digest (``commit``):
    fetched by the workspace pod into a directory of the pack's name, ``path`` in it."""

    name: str
    url: str
    commit: str
    path: str | None = None
    auth: GitAuth | None = None
    artifact: bool = False


@dataclass(frozen=True, slots=True)
class ArtifactRevision:
    """A Flux source's or a Program's artifact."""

    url: str
    digest: str
    revision: str
    dir: str | None = None


@dataclass(frozen=True, slots=True)
class ProjectInfoRevision:
    """No source: a minimal Pulumi.yaml from ``status.projectInfo`` (destroy after the source is gone)."""

    name: str
    runtime: str


ResolvedSource = GitRevision | ArtifactRevision | ProjectInfoRevision


def workspace_name(stack_name: str) -> str:
    """The Workspace of a Stack has the Stack's name (Go: nameForWorkspace)."""
    return stack_name


def stack_labels(stack_name: str, own: Mapping[str, str] | None = None) -> dict[str, str]:
    """Labels of a Stack's Workspace and Updates (Go: labelsForWorkspace), with the shard label of
    ``own`` (the Stack's labels) so its shard's informers see them (:mod:`pko.controllers.sharding`)."""
    shard = {SHARD_LABEL: own[SHARD_LABEL]} if own and SHARD_LABEL in own else {}
    return {STACK_COMPONENT_LABEL: STACK_COMPONENT, STACK_NAME_LABEL: stack_name, **shard}


def stack_owner_reference(stack: Stack, *, controller: bool) -> Obj:
    """An ownerReference to ``stack`` (read from the API: it needs the uid), blocking owner deletion."""
    meta = stack.metadata
    if not meta.name or not meta.uid:
        raise ValueError("the Stack needs metadata.name and metadata.uid")
    return {
        "apiVersion": stack.api_version,
        "kind": stack.kind,
        "name": meta.name,
        "uid": meta.uid,
        "controller": controller,
        "blockOwnerDeletion": True,
    }


def _secret_key(name: str, key: str, *, optional: bool = False) -> Obj:
    selector: Obj = {"name": name, "key": key}
    if optional:
        selector["optional"] = True
    return selector


def _ref_secret_key(ref: ResourceRef) -> Obj:
    if ref.secret is None:
        raise ValueError(f"a {ref.type} reference cannot be mapped to a Secret key")
    return _secret_key(ref.secret.name, ref.secret.key)


def _git_auth(spec: StackSpec) -> Obj | None:
    """The Workspace's git auth: Secret key selectors only (the fetch step reads the values)."""
    auth: Obj = {}
    if spec.git_auth_secret:
        name = spec.git_auth_secret
        auth["sshPrivateKey"] = _secret_key(name, "sshPrivateKey", optional=True)
        auth["password"] = _secret_key(name, "password", optional=True)
        auth["username"] = _secret_key(name, "username", optional=True)
        auth["token"] = _secret_key(name, "accessToken", optional=True)
    ga: GitAuthConfig | None = spec.git_auth
    if ga is not None:
        if ga.ssh_auth is not None:
            auth["sshPrivateKey"] = _ref_secret_key(ga.ssh_auth.ssh_private_key)
            if ga.ssh_auth.password is not None:
                auth["password"] = _ref_secret_key(ga.ssh_auth.password)
        if ga.basic_auth is not None:
            auth["username"] = _ref_secret_key(ga.basic_auth.user_name)
            auth["password"] = _ref_secret_key(ga.basic_auth.password)
        if ga.access_token is not None:
            auth["token"] = _ref_secret_key(ga.access_token)
        app = ga.github_app
        if app is not None and all(r.secret for r in (app.app_id, app.installation_id, app.private_key)):
            auth["githubApp"] = {
                "appID": _ref_secret_key(app.app_id),
                "installationID": _ref_secret_key(app.installation_id),
                "privateKey": _ref_secret_key(app.private_key),
            }
    return auth or None


def _pack_source(pack: PackRevision) -> Obj:
    """A Workspace's ``policyPackSources`` entry: the pack's repository at its commit, shallow (a pack
    needs no history), or its artifact at its digest; ``dir`` its path (the fetch checks it exists)."""
    if pack.artifact:
        flux: Obj = {"url": pack.url, "digest": pack.commit}
        if pack.path:
            flux["dir"] = pack.path
        return {"name": pack.name, "flux": flux}
    git: Obj = {"url": pack.url, "ref": pack.commit, "shallow": True}
    if pack.path:
        git["dir"] = pack.path
    if pack.auth is not None:
        git["auth"] = pack.auth.wire()
    return {"name": pack.name, "git": git}


def pack_commits(workspace: Mapping[str, Any] | None) -> dict[str, str]:
    """The commit (an artifact's digest) of each pack a Workspace fetches (``spec.policyPackSources``),
    by pack name."""
    sources = ((workspace or {}).get("spec") or {}).get("policyPackSources") or []
    return {
        str(s.get("name")): str((s.get("git") or {}).get("ref") or (s.get("flux") or {}).get("digest") or "")
        for s in sources
    }


def _source_spec(spec: StackSpec, source: ResolvedSource | None) -> Obj:
    if isinstance(source, GitRevision):
        git: Obj = {"url": source.url, "ref": source.commit}
        if source.dir:
            git["dir"] = source.dir
        if source.shallow:
            git["shallow"] = True
        auth = _git_auth(spec)
        if auth is not None:
            git["auth"] = auth
        return {"git": git}
    if isinstance(source, ArtifactRevision):
        flux: Obj = {"url": source.url, "digest": source.digest}
        if source.dir:
            flux["dir"] = source.dir
        return {"flux": flux}
    if isinstance(source, ProjectInfoRevision):
        return {"projectInfo": {"name": source.name, "runtime": source.runtime}}
    return {}


class _PodMounts:
    """Volumes of the workspace pod and mounts of its ``pulumi`` container, each added once."""

    def __init__(self) -> None:
        self.volumes: list[Obj] = []
        self.mounts: list[Obj] = []

    def add(self, volume: Obj, mount_path: str) -> None:
        if any(v["name"] == volume["name"] for v in self.volumes):
            return
        self.volumes.append(volume)
        self.mounts.append({"name": volume["name"], "mountPath": mount_path})

    def secret_path(self, name: str, key: str) -> str:
        mount = f"{SECRET_MOUNT_ROOT}/{name}"
        self.add({"name": f"secret-{name}", "secret": {"secretName": name}}, mount)
        return posixpath.join(mount, key)

    def configmap_path(self, ref: ConfigMapRef) -> str:
        mount = f"{CONFIGMAP_MOUNT_ROOT}/{ref.name}"
        self.add({"name": f"configmap-{ref.name}", "configMap": {"name": ref.name}}, mount)
        return posixpath.join(mount, ref.key)


def _env(spec: StackSpec) -> list[Obj]:
    env: list[Obj] = []
    if spec.backend:
        env.append({"name": "PULUMI_BACKEND_URL", "value": spec.backend})
    if spec.access_token_secret:
        env.append(
            {
                "name": "PULUMI_ACCESS_TOKEN",
                "valueFrom": {"secretKeyRef": _secret_key(spec.access_token_secret, "accessToken")},
            }
        )
    for name in sorted(spec.env_refs or {}):
        ref = (spec.env_refs or {})[name]
        if ref.type == "Literal" and ref.literal is not None:
            env.append({"name": name, "value": ref.literal.value})
        elif ref.type == "Secret":
            env.append({"name": name, "valueFrom": {"secretKeyRef": _ref_secret_key(ref)}})
        elif ref.type == "ConfigMap" and ref.config_map is not None:
            selector = {"name": ref.config_map.name, "key": ref.config_map.key}
            env.append({"name": name, "valueFrom": {"configMapKeyRef": selector}})
        else:
            raise ValueError(f'spec.envRefs[{name}]: ref type "{ref.type}" is not supported')
    return env


def _config(spec: StackSpec, mounts: _PodMounts) -> list[Obj]:
    items: list[Obj] = []
    for key in sorted(spec.config or {}):
        items.append({"key": key, "value": (spec.config or {})[key], "secret": False})
    for key in sorted(spec.config_ref or {}):
        cm_ref = (spec.config_ref or {})[key]
        value_from: Obj = {"path": mounts.configmap_path(cm_ref)}
        if cm_ref.json_ is not None:
            value_from["json"] = cm_ref.json_
        items.append({"key": key, "valueFrom": value_from, "secret": False})
    for key in sorted(spec.secrets or {}):
        items.append({"key": key, "value": (spec.secrets or {})[key], "secret": True})
    for key in sorted(spec.secrets_ref or {}):
        ref = (spec.secrets_ref or {})[key]
        if ref.type == "Literal" and ref.literal is not None:
            items.append({"key": key, "value": ref.literal.value, "secret": True})
        elif ref.type == "Secret" and ref.secret is not None:
            path = mounts.secret_path(ref.secret.name, ref.secret.key)
            items.append({"key": key, "valueFrom": {"path": path}, "secret": True})
        else:
            raise ValueError(f'spec.secretsRef[{key}]: ref type "{ref.type}" is not supported')
    return items


def _workspace_stack(spec: StackSpec, mounts: _PodMounts, *, deleting: bool) -> Obj:
    # A Workspace built for a destroy never creates the stack: an empty one would "destroy"
    # nothing and report success while the resources stay.
    wss: Obj = {"name": spec.stack, "create": not spec.use_local_stack_only and not deleting}
    if spec.secrets_provider:
        # Set before any config, or the provider silently resets (Go operator issue 135).
        wss["secretsProvider"] = spec.secrets_provider
    config = _config(spec, mounts)
    if config:
        wss["config"] = config
    if spec.environment is not None:
        wss["environment"] = list(spec.environment)
    return wss


def _merge_template(workspace: Obj, template: Mapping[str, Any]) -> Obj:
    """``template`` (a partial Workspace) strategic-merged over ``workspace``."""
    merged = strategic_merge(workspace, {k: v for k, v in template.items() if k in ("metadata", "spec")})
    # A template customises; it does not rename, re-home or re-own the Workspace.
    merged["metadata"].update({k: workspace["metadata"][k] for k in ("name", "namespace", "ownerReferences")})
    return merged


def build_workspace(
    stack: Stack,
    source: ResolvedSource | None,
    *,
    deleting: bool = False,
    templates: Sequence[Mapping[str, Any]] = (),
    packs: Sequence[PackRevision] = (),
) -> Obj:
    """The Workspace to apply for ``stack`` with ``source`` (None: the template brings the program);
    ``deleting``: built to run the destroy, so the stack is never created. ``templates``: the shared
    WorkspaceTemplates' specs (:mod:`pko.controllers.stack.templates`), lowest first, merged before
    the Stack's own ``workspaceTemplate``. ``packs``: the policy packs from git the pod fetches (set
    after the templates: no template drops one).

    ``stack`` must come from the API (the owner reference needs its uid). Raises ValueError for a
    reference the Go operator refuses (Env/FS refs): ``pko.api.validation`` reports those first.
    """
    spec = stack.spec
    name = stack.metadata.name or ""
    mounts = _PodMounts()
    wss = _workspace_stack(spec, mounts, deleting=deleting or isinstance(source, ProjectInfoRevision))
    container: Obj = {"name": PULUMI_CONTAINER}
    if mounts.mounts:
        container["volumeMounts"] = mounts.mounts
    pod_spec: Obj = {"containers": [container]}
    if mounts.volumes:
        pod_spec["volumes"] = mounts.volumes
    ws_spec: Obj = {"podTemplate": {"spec": pod_spec}, **_source_spec(spec, source)}
    if spec.service_account_name:
        ws_spec["serviceAccountName"] = spec.service_account_name
    env = _env(spec)
    if env:
        ws_spec["env"] = env
    workspace: Obj = {
        "apiVersion": WORKSPACE_API_VERSION,
        "kind": WORKSPACE_KIND,
        "metadata": {
            "name": workspace_name(name),
            "namespace": stack.metadata.namespace,
            "labels": stack_labels(name, stack.metadata.labels),
            "ownerReferences": [stack_owner_reference(stack, controller=True)],
        },
        "spec": ws_spec,
    }
    for template in (*templates, spec.workspace_template or {}):
        if template:
            workspace = _merge_template(workspace, template)
    ws_spec = workspace["spec"]
    if isinstance(source, ProjectInfoRevision):
        for key in ("git", "flux", "local"):
            ws_spec.pop(key, None)
    env_from: list[Obj] = list(ws_spec.get("envFrom") or [])
    env_from += [{"configMapRef": {"name": n}} for n in spec.envs or []]
    env_from += [{"secretRef": {"name": n}} for n in spec.env_secrets or []]
    if env_from:
        ws_spec["envFrom"] = env_from
    ws_spec["stacks"] = [wss]
    if packs:
        ws_spec["policyPackSources"] = [_pack_source(pack) for pack in packs]
    else:
        ws_spec.pop("policyPackSources", None)
    return workspace
