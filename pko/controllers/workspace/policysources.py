"""Policy packs from sources of their own (issue 43): how the workspace pod fetches them (pure).

A Stack's ``spec.policyPacks[].git`` reaches its Workspace as ``spec.policyPackSources`` (at the
commit its branch resolved to), its ``fluxSource`` as the artifact's URL and digest. Each becomes one
init container after ``fetch``, running the agent's ``init`` as ``fetch`` does for the program (dulwich,
the same credentials from the same kinds of Secret key references; an artifact's digest checked and
its unpacked size bounded the same way; the same deadline), into ``/share/policy/<name>``: beside the
program's directory, where the agent looks for a pack the Update marks as fetched
(``PolicyPack.fetched``). The credentials are given to that init container only, never to the
``pulumi`` container that runs the program. ``SOURCE_NAME`` makes a failed fetch's one line name the pack.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pko.api.workspace import FluxSource, GitSource, WorkspaceSpec

__all__ = ["POLICY_DIR", "POLICY_FETCH_PREFIX", "flux_env", "git_env", "policy_fetches"]

Obj = dict[str, Any]

POLICY_DIR: Final = "/share/policy"
"""Where the packs are fetched, one directory per pack name: ``policy`` beside ``/share/workspace``,
where the agent looks (beside its ``--workspace`` path)."""
POLICY_FETCH_PREFIX: Final = "fetch-policy-"
"""Init container names: the prefix and the pack's index (a pack name may be 63 characters)."""


def _secret_env(name: str, selector: Mapping[str, Any] | None) -> list[Obj]:
    return [] if selector is None else [{"name": name, "valueFrom": {"secretKeyRef": dict(selector)}}]


def git_env(git: GitSource) -> list[Obj]:
    """The environment of ``agent init`` for a git source: URL, revision, directory, credentials as
    Secret key references (values never enter the pod spec)."""
    env: list[Obj] = [
        {"name": "GIT_URL", "value": git.url or ""},
        {"name": "GIT_REVISION", "value": git.ref or ""},
        {"name": "GIT_DIR", "value": git.dir or ""},
    ]
    if git.shallow:
        env.append({"name": "GIT_SHALLOW", "value": "true"})
    auth = git.auth
    if auth is not None:
        env += _secret_env("GIT_SSH_PRIVATE_KEY", auth.ssh_private_key)
        env += _secret_env("GIT_USERNAME", auth.username)
        env += _secret_env("GIT_PASSWORD", auth.password)
        env += _secret_env("GIT_TOKEN", auth.token)
        if auth.github_app is not None:
            env += _secret_env("GIT_GITHUB_APP_ID", auth.github_app.app_id)
            env += _secret_env("GIT_GITHUB_APP_INSTALLATION_ID", auth.github_app.installation_id)
            env += _secret_env("GIT_GITHUB_APP_PRIVATE_KEY", auth.github_app.private_key)
    return env


def flux_env(flux: FluxSource, max_untar_size: int | None) -> list[Obj]:
    """The environment of ``agent init`` for an artifact (a Flux source's or a Program's): URL, the
    digest it must have, directory, and the operator's bound on its unpacked size when set."""
    env: list[Obj] = [
        {"name": "FLUX_URL", "value": flux.url or ""},
        {"name": "FLUX_DIGEST", "value": flux.digest or ""},
        {"name": "FLUX_DIR", "value": flux.dir or ""},
    ]
    if max_untar_size is not None:
        env.append({"name": "FLUX_MAX_UNTAR_SIZE_BYTES", "value": str(max_untar_size)})
    return env


def policy_fetches(
    spec: WorkspaceSpec, max_untar_size: int | None = None
) -> list[tuple[str, list[str], list[Obj]]]:
    """(container name, args, env) of each pack's fetch, in the spec's order; ``max_untar_size`` bounds
    an artifact's unpacked size as for the program's (``--flux-max-untar-size-bytes``)."""
    fetches = []
    for index, source in enumerate(spec.policy_pack_sources or []):
        args = ["/share/agent", "init", "-t", f"{POLICY_DIR}/{source.name}"]
        fetch = git_env(source.git) if source.git is not None else []
        if source.flux is not None:
            fetch = flux_env(source.flux, max_untar_size)
        env = [*fetch, {"name": "SOURCE_NAME", "value": f"policy pack {source.name!r}"}]
        fetches.append((f"{POLICY_FETCH_PREFIX}{index}", args, env))
    return fetches
