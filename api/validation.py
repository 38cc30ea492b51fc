"""Cross-field rules of the API, checked by the operator before it acts, written once.

Reconcilers call ``parse_*`` on the raw object: it returns the model and every problem found,
each a ``FieldError`` named by its wire path (``spec.envRefs[FOO].secret``). A non-empty list
means the object is stuck until its spec changes: the Stack reconciler reports
``format_errors(errors)`` as the message of ``Stalled/SpecInvalid``.

The rules come from the Go operator v2: its CEL rule (Stack name length), the checks its
controllers make before acting (git source, git auth, resource refs, namespace isolation, Flux
source reference) and the constraints its API docs state in prose (commit/branch exclusive,
Program get/properties exclusive, ...). Rules are pure functions of the object (and its
namespace), so they are tested without a cluster.

Those a CEL expression can state are also ``Rule`` markers on the models (``pko.api.markers``),
so the apiserver refuses such an object on write; the checks here stay, as the operator's
defence: objects stored before a rule existed (an upgrade; CRD validation ratcheting keeps
unchanged invalid fields), CRDs installed from an older pko, and the rules CEL cannot state
(namespaces, deprecated ref types, duplicate config keys across maps, the workspace template
supplying the program). A CEL rule never refuses what these checks accept.
"""

from __future__ import annotations

import types
import typing
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final, TypeVar

from pko.api.program import Program
from pko.api.stack import MAX_NAME_LENGTH, NAME_TOO_LONG_MESSAGE, ResourceRef, Stack, StackSpec
from pko.api.stackpolicypacks import PolicyPack
from pko.api.update import Update
from pko.api.workspace import GitAuth, Workspace, WorkspaceSpec, WorkspaceStack
from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_camel

from pko.git import GIT_URL_SCHEMES, GitURLError, parse_remote

_UNION_KEYS: Final[Mapping[str, str]] = {
    "Env": "env",
    "FS": "filesystem",
    "Secret": "secret",
    "Literal": "literal",
    "ConfigMap": "config_map",
}

# Messages the Go operator uses for the same problems (users search for them).
MSG_CROSS_NAMESPACE: Final = "cross-namespace refs are not allowed"


@dataclass(frozen=True)
class FieldError:
    """One problem, at a wire-format field path (camelCase, ``[key]`` for map keys and indexes)."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def format_errors(errors: Iterable[FieldError]) -> str:
    """One line for a condition message: ``path: message; path: message``."""
    return "; ".join(str(e) for e in errors)


M = TypeVar("M", bound=BaseModel)


def _unwrap(tp: Any) -> Any:
    """Strip ``Annotated`` and ``| None`` so the container or model type shows."""
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            tp = typing.get_args(tp)[0]
        elif origin is typing.Union or origin is types.UnionType:
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return Any
            tp = args[0]
        else:
            return tp


def _loc_path(model: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as a wire path, following the model to tell map keys from fields."""
    path = ""
    tp: Any = model
    for part in loc:
        tp = _unwrap(tp)
        origin = typing.get_origin(tp)
        if isinstance(part, int) or origin is dict:
            path += f"[{part}]"
            tp = typing.get_args(tp)[-1] if origin in (list, dict) else Any
            continue
        path += f".{part}" if path else part
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            fields = tp.model_fields
            info = next((f for n, f in fields.items() if part in (n, f.alias)), None)
            tp = info.annotation if info is not None else Any
        else:
            tp = Any
    return path


def validation_errors(model: type[BaseModel], exc: ValidationError) -> list[FieldError]:
    """Pydantic's errors as FieldErrors, at wire paths (the names the input used)."""
    return [FieldError(_loc_path(model, tuple(err["loc"])) or "<root>", err["msg"]) for err in exc.errors()]


def _parse(
    model: type[M], validate: Callable[[M], list[FieldError]], obj: Mapping[str, Any]
) -> tuple[M | None, list[FieldError]]:
    """Parse ``obj`` as ``model``, then run its cross-field checks; None only when it does not parse."""
    try:
        parsed = model.model_validate(obj)
    except ValidationError as exc:
        return None, validation_errors(model, exc)
    return parsed, validate(parsed)


# --- shared pieces ---------------------------------------------------------------------------


def _duplicates(values: Iterable[str]) -> list[str]:
    return sorted(v for v, n in Counter(values).items() if n > 1)


def _ref_union_errors(ref: ResourceRef, path: str) -> Iterator[FieldError]:
    """``type`` names exactly one union member, and that member is the one set."""
    expected = _UNION_KEYS[ref.type]
    present = [key for key in _UNION_KEYS.values() if getattr(ref, key, None) is not None]
    if expected not in present:
        yield FieldError(f"{path}.{to_camel(expected)}", f"required when type is {ref.type!r}")
    for key in present:
        if key != expected:
            yield FieldError(f"{path}.{to_camel(key)}", f"must not be set when type is {ref.type!r}")


def _namespace_errors(ref: ResourceRef, path: str, namespace: str | None) -> Iterator[FieldError]:
    if ref.secret is not None and ref.secret.namespace and ref.secret.namespace != namespace:
        yield FieldError(f"{path}.secret.namespace", MSG_CROSS_NAMESPACE)


def _value_ref_errors(ref: ResourceRef, path: str, namespace: str | None) -> Iterator[FieldError]:
    """A ref used for an env var (Secret, Literal, ConfigMap) or a secret config value (Secret,
    Literal: the schema allows ConfigMap for envRefs only); Env/FS are refused in v2."""
    yield from _ref_union_errors(ref, path)
    if ref.type in ("Env", "FS"):
        yield FieldError(f"{path}.type", f'ref type "{ref.type}" is deprecated')
    yield from _namespace_errors(ref, path, namespace)


def _secret_ref_errors(ref: ResourceRef, path: str, namespace: str | None) -> Iterator[FieldError]:
    """A ref used for a credential read by the operator: only a Secret is supported in v2."""
    yield from _ref_union_errors(ref, path)
    if ref.type != "Secret":
        yield FieldError(
            f"{path}.type",
            f"{ref.type} selectors are no longer supported in v2, please use a secret reference instead",
        )
    yield from _namespace_errors(ref, path, namespace)


# --- Stack -----------------------------------------------------------------------------------

_GIT_FIELDS: Final = ("projectRepo", "commit", "branch", "repoDir", "gitAuth", "gitAuthSecret", "shallow")


def _template_supplies_program(spec: StackSpec) -> bool:
    """Whether the workspaceTemplate brings the program itself (a source or an init container)."""
    template = spec.workspace_template or {}
    ws_spec = template.get("spec") or {}
    if any(ws_spec.get(key) for key in ("git", "flux", "local", "projectInfo")):
        return True
    pod_spec = (ws_spec.get("podTemplate") or {}).get("spec") or {}
    return bool(pod_spec.get("initContainers"))


def _stack_source_errors(spec: StackSpec) -> Iterator[FieldError]:
    sources = [
        name
        for name, present in (
            ("projectRepo", spec.has_git_source()),
            ("fluxSource", spec.flux_source is not None),
            ("programRef", spec.program_ref is not None),
        )
        if present
    ]
    if len(sources) > 1:
        yield FieldError(
            "spec",
            f"only one of projectRepo, fluxSource or programRef may be set (found {', '.join(sources)})",
        )
    elif not sources and not _template_supplies_program(spec):
        yield FieldError(
            "spec",
            "one of projectRepo, fluxSource or programRef is required "
            "(or a workspaceTemplate that supplies the program)",
        )


def _stack_git_errors(spec: StackSpec, namespace: str | None) -> Iterator[FieldError]:
    if not spec.has_git_source():
        return
    if not spec.project_repo:
        used = [name for name, value in zip(_GIT_FIELDS, _git_values(spec), strict=True) if value]
        yield FieldError("spec.projectRepo", f"required when {', '.join('spec.' + u for u in used)} is set")
    else:
        problem = git_url_error(spec.project_repo)
        if problem:
            yield FieldError("spec.projectRepo", problem)
    if spec.commit and spec.branch:
        yield FieldError("spec.branch", "mutually exclusive with spec.commit")
    elif spec.project_repo and not spec.commit and not spec.branch:
        yield FieldError("spec", "one of commit or branch is required with projectRepo")
    if spec.git_auth is not None and spec.git_auth_secret:
        yield FieldError("spec.gitAuth", "mutually exclusive with spec.gitAuthSecret")
    auth = spec.git_auth
    if auth is None:
        return
    path = "spec.gitAuth"
    if not (auth.ssh_auth or auth.access_token or auth.basic_auth or auth.github_app):
        yield FieldError(path, "must specify one of accessToken, sshAuth, basicAuth or githubApp")
    refs: list[tuple[str, ResourceRef | None]] = [(f"{path}.accessToken", auth.access_token)]
    if auth.ssh_auth is not None:
        refs += [
            (f"{path}.sshAuth.sshPrivateKey", auth.ssh_auth.ssh_private_key),
            (f"{path}.sshAuth.password", auth.ssh_auth.password),
        ]
    if auth.basic_auth is not None:
        refs += [
            (f"{path}.basicAuth.userName", auth.basic_auth.user_name),
            (f"{path}.basicAuth.password", auth.basic_auth.password),
        ]
    if auth.github_app is not None:
        refs += [
            (f"{path}.githubApp.appID", auth.github_app.app_id),
            (f"{path}.githubApp.installationID", auth.github_app.installation_id),
            (f"{path}.githubApp.privateKey", auth.github_app.private_key),
        ]
    for ref_path, ref in refs:
        if ref is not None:
            yield from _secret_ref_errors(ref, ref_path, namespace)


def policy_pack_errors(pack: PolicyPack, path: str) -> list[FieldError]:
    """A policy pack's problems (the twin of its CEL rules, :mod:`pko.api.stackpolicypacks`): one
    source (git or fluxSource); with ``git``, ``path`` inside it, a URL git clones from, a branch or a
    commit, usable credentials; with ``fluxSource``, a ``<group>/<version>`` and its ``dir`` inside."""
    errors: list[FieldError] = []
    if pack.flux_source is not None:
        return _flux_pack_errors(pack, path)
    git = pack.git
    if git is None:
        return errors  # the model refuses a pack without a path
    if _leaves(pack.path):
        message = "with git, path is a directory inside the repository: relative, without '..'"
        errors.append(FieldError(f"{path}.path", message))
    problem = git_url_error(git.url)
    if problem:
        errors.append(FieldError(f"{path}.git.url", problem))
    if (git.branch is None) == (git.commit is None):
        errors.append(FieldError(f"{path}.git", "exactly one of branch or commit is required"))
    auth = git.auth
    if auth is not None and not (auth.ssh_private_key or auth.username or auth.token or auth.github_app):
        errors.append(
            FieldError(f"{path}.git.auth", "must specify one of sshPrivateKey, username, token or githubApp")
        )
    if auth is not None and auth.username is not None and auth.password is None:
        errors.append(FieldError(f"{path}.git.auth.password", "required with username"))
    return errors


def _leaves(directory: str | None) -> bool:
    """Whether a directory meant to be inside a fetched source is absolute or climbs out."""
    return directory is not None and (directory.startswith("/") or ".." in directory.split("/"))


def _flux_pack_errors(pack: PolicyPack, path: str) -> list[FieldError]:
    flux = pack.flux_source
    assert flux is not None
    errors: list[FieldError] = []
    if pack.git is not None or pack.path is not None:
        message = "with fluxSource, neither git nor path: fluxSource.dir is the pack's directory"
        errors.append(FieldError(path, message))
    api_version = flux.source_ref.api_version
    group, _, version = api_version.partition("/")
    if not group or not version or "/" in version:
        where = f"{path}.fluxSource.sourceRef.apiVersion"
        errors.append(FieldError(where, f"must be <group>/<version>, got {api_version!r}"))
    if _leaves(flux.dir):
        message = "a directory inside the artifact: relative, without '..'"
        errors.append(FieldError(f"{path}.fluxSource.dir", message))
    return errors


def git_url_error(url: str) -> str | None:
    """Why ``url`` cannot name a git repository, or None when its form is one git clones from.

    :func:`pko.git.parse_remote` decides (git's own rules), the same function the workspace agent's
    fetch parses with, so the two accept the same URLs; an absolute path or ``file://`` URL is
    accepted here and allowed by the workspace only with ``GIT_ALLOW_LOCAL``. The message never
    repeats the URL, which may carry credentials.
    """
    try:
        parse_remote(url)
    except GitURLError as exc:
        return str(exc)
    return None


def _git_values(spec: StackSpec) -> tuple[object, ...]:
    return (
        spec.project_repo,
        spec.commit,
        spec.branch,
        spec.repo_dir,
        spec.git_auth,
        spec.git_auth_secret,
        spec.shallow,
    )


def _stack_flux_errors(spec: StackSpec) -> Iterator[FieldError]:
    if spec.flux_source is None:
        return
    api_version = spec.flux_source.source_ref.api_version
    group, _, version = api_version.partition("/")
    if not group or not version or "/" in version:
        yield FieldError(
            "spec.fluxSource.sourceRef.apiVersion", f"must be <group>/<version>, got {api_version!r}"
        )


def _stack_config_errors(spec: StackSpec) -> Iterator[FieldError]:
    """A config key may come from one place only: the Workspace keys its stack config by key."""
    sources = (
        ("config", spec.config),
        ("configRef", spec.config_ref),
        ("secrets", spec.secrets),
        ("secretsRef", spec.secrets_ref),
    )
    seen: dict[str, str] = {}
    for field, values in sources:
        for key in sorted(values or {}):
            if key in seen:
                yield FieldError(f"spec.{field}[{key}]", f"key is also set in spec.{seen[key]}")
            else:
                seen[key] = field


def _stack_env_errors(spec: StackSpec, namespace: str | None) -> Iterator[FieldError]:
    implied = {
        "PULUMI_ACCESS_TOKEN": "spec.accessTokenSecret" if spec.access_token_secret else None,
        "PULUMI_BACKEND_URL": "spec.backend" if spec.backend else None,
    }
    for key, ref in sorted((spec.env_refs or {}).items()):
        path = f"spec.envRefs[{key}]"
        yield from _value_ref_errors(ref, path, namespace)
        if implied.get(key):
            yield FieldError(path, f"conflicts with {implied[key]}, which also sets {key}")
    for key, secret_ref in sorted((spec.secrets_ref or {}).items()):
        yield from _value_ref_errors(secret_ref, f"spec.secretsRef[{key}]", namespace)


def _stack_prerequisite_errors(stack: Stack) -> Iterator[FieldError]:
    for index, prereq in enumerate(stack.spec.prerequisites or []):
        if prereq.name == stack.metadata.name:
            yield FieldError(f"spec.prerequisites[{index}].name", "a stack cannot be its own prerequisite")


def validate_stack(stack: Stack) -> list[FieldError]:
    """Every cross-field problem of a Stack; empty when it can be processed."""
    spec = stack.spec
    namespace = stack.metadata.namespace
    errors: list[FieldError] = []
    name = stack.metadata.name or ""
    if len(name) > MAX_NAME_LENGTH:
        errors.append(FieldError("metadata.name", NAME_TOO_LONG_MESSAGE))
    errors += _stack_source_errors(spec)
    errors += _stack_git_errors(spec, namespace)
    errors += _stack_flux_errors(spec)
    errors += _stack_env_errors(spec, namespace)
    errors += _stack_config_errors(spec)
    errors += _stack_prerequisite_errors(stack)
    for index, pack in enumerate(spec.policy_packs or []):
        errors += policy_pack_errors(pack, f"spec.policyPacks[{index}]")
    ref = spec.workspace_template_ref
    if ref is not None and ref.namespace and ref.namespace != namespace:
        errors.append(FieldError("spec.workspaceTemplateRef.namespace", MSG_CROSS_NAMESPACE))
    return errors


def parse_stack(obj: Mapping[str, Any]) -> tuple[Stack | None, list[FieldError]]:
    """Parse a raw Stack and check it; the Stack is None only when it does not parse at all."""
    return _parse(Stack, validate_stack, obj)


def deprecation_warnings(spec: StackSpec) -> list[str]:
    """Deprecated Stack fields in use, with what replaces them (for a Warning event)."""
    warnings: list[str] = []
    replacements = (
        (
            "accessTokenSecret",
            spec.access_token_secret,
            "spec.envRefs[PULUMI_ACCESS_TOKEN] with a secret ref",
        ),
        ("envs", spec.envs, "spec.envRefs"),
        ("envSecrets", spec.env_secrets, "spec.envRefs"),
        ("secrets", spec.secrets, "spec.secretsRef"),
        ("gitAuthSecret", spec.git_auth_secret, "spec.gitAuth"),
    )
    for field, value, instead in replacements:
        if value:
            warnings.append(f"spec.{field} is deprecated; use {instead}")
    if spec.expect_no_refresh_changes:
        warnings.append("spec.expectNoRefreshChanges is ignored")
    if spec.init_on_create is not None:
        warnings.append("spec.initOnCreate was removed before v1.0 and is ignored")
    return warnings


# --- Workspace -------------------------------------------------------------------------------


def _workspace_git_errors(auth: GitAuth | None) -> Iterator[FieldError]:
    if auth is not None and auth.username is not None and auth.password is None:
        yield FieldError("spec.git.auth.password", "required with spec.git.auth.username")


def _workspace_stack_errors(index: int, stack: WorkspaceStack) -> Iterator[FieldError]:
    base = f"spec.stacks[{index}]"
    items = stack.config or []
    for key in _duplicates(item.key for item in items):
        yield FieldError(f"{base}.config", f"duplicate key {key!r}")
    for i, item in enumerate(items):
        path = f"{base}.config[{i}]"
        if item.value is not None and item.value_from is not None:
            yield FieldError(f"{path}.valueFrom", "mutually exclusive with value")
        elif item.value is None and item.value_from is None:
            yield FieldError(path, "one of value or valueFrom is required")
        if item.value_from is not None and bool(item.value_from.env) == bool(item.value_from.path):
            yield FieldError(f"{path}.valueFrom", "exactly one of env or path is required")
        if item.path and isinstance(item.value, (dict, list)):
            yield FieldError(f"{path}.path", "a path key cannot take a structured value (object or array)")


def validate_workspace(ws: Workspace) -> list[FieldError]:
    """Every cross-field problem of a Workspace; empty when it can be processed."""
    return workspace_spec_errors(ws.spec)


def workspace_spec_errors(spec: WorkspaceSpec) -> list[FieldError]:
    """Every cross-field problem of a Workspace's spec (the Workspace controller stalls on them)."""
    errors: list[FieldError] = []
    sources = [
        name
        for name, value in (
            ("git", spec.git),
            ("flux", spec.flux),
            ("local", spec.local),
            ("projectInfo", spec.project_info),
        )
        if value is not None
    ]
    if len(sources) > 1:
        errors.append(
            FieldError(
                "spec", f"only one of git, flux, local or projectInfo may be set (found {', '.join(sources)})"
            )
        )
    if spec.git is not None:
        if not spec.git.url:
            errors.append(FieldError("spec.git.url", "required"))
        elif (problem := git_url_error(spec.git.url)) is not None:
            errors.append(FieldError("spec.git.url", problem))
        errors += _workspace_git_errors(spec.git.auth)
    if spec.flux is not None and not spec.flux.url:
        errors.append(FieldError("spec.flux.url", "required"))
    for name in _duplicates(str(env.get("name")) for env in spec.env or []):
        errors.append(FieldError("spec.env", f"duplicate name {name!r}"))
    stacks = spec.stacks or []
    for name in _duplicates(s.name for s in stacks):
        errors.append(FieldError("spec.stacks", f"duplicate name {name!r}"))
    for index, stack in enumerate(stacks):
        errors += _workspace_stack_errors(index, stack)
    return errors


def parse_workspace(obj: Mapping[str, Any]) -> tuple[Workspace | None, list[FieldError]]:
    """Parse a raw Workspace and check it; the Workspace is None only when it does not parse."""
    return _parse(Workspace, validate_workspace, obj)


# --- Update ----------------------------------------------------------------------------------


def validate_update(update: Update) -> list[FieldError]:
    """Every cross-field problem of an Update; empty when it can be run."""
    spec = update.spec
    errors: list[FieldError] = []
    for field, value in (
        ("workspaceName", spec.workspace_name),
        ("stackName", spec.stack_name),
        ("type", spec.type),
    ):
        if not value:
            errors.append(FieldError(f"spec.{field}", "required"))
    if spec.remove and spec.type != "destroy":
        errors.append(FieldError("spec.remove", "only applies to a destroy"))
    if spec.run_program and spec.type not in ("destroy", "refresh"):
        errors.append(FieldError("spec.runProgram", "only applies to a destroy or a refresh"))
    return errors


def parse_update(obj: Mapping[str, Any]) -> tuple[Update | None, list[FieldError]]:
    """Parse a raw Update and check it; the Update is None only when it does not parse."""
    return _parse(Update, validate_update, obj)


# --- Program ---------------------------------------------------------------------------------


def validate_program(program: Program) -> list[FieldError]:
    """Every cross-field problem of a Program; empty when it can be served."""
    body = program.program
    errors: list[FieldError] = []
    for name, config in sorted((body.configuration or {}).items()):
        if config.type is None and config.default is None:
            errors.append(FieldError(f"program.configuration[{name}]", "one of type or default is required"))
    for name, resource in sorted((body.resources or {}).items()):
        if resource.get is not None and resource.properties:
            errors.append(FieldError(f"program.resources[{name}].get", "mutually exclusive with properties"))
    return errors


def parse_program(obj: Mapping[str, Any]) -> tuple[Program | None, list[FieldError]]:
    """Parse a raw Program and check it; the Program is None only when it does not parse."""
    return _parse(Program, validate_program, obj)


__all__ = [
    "GIT_URL_SCHEMES",
    "MSG_CROSS_NAMESPACE",
    "FieldError",
    "deprecation_warnings",
    "format_errors",
    "git_url_error",
    "parse_program",
    "parse_stack",
    "parse_update",
    "parse_workspace",
    "validate_program",
    "validate_stack",
    "validate_update",
    "validate_workspace",
    "validation_errors",
]
