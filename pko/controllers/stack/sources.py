"""A Stack's source resolved to a revision: a git commit (a branch head looked up with the Stack's
credentials), a Flux source's or a Program's artifact (reads only: the caches, Secrets, the git
remote; no writes). When it cannot be had (or may not be: git credentials over plain HTTP,
:mod:`pko.controllers.stack.insecuretransport`), a destroy may still run from the saved ``projectInfo``
(:func:`pko.controllers.stack.ensure.saved_project`).

Each :class:`~pko.controllers.stack.steps.Unresolved` says what the Stack awaits
(:mod:`~pko.controllers.stack.waits`): a Program or a Flux source (and its artifact) is watched, so
its change wakes the Stack; Secrets are read directly, never cached (an operator watching every
Secret in the cluster would hold them all in memory), so a Stack waiting on one looks again on a
timer, as one whose branch lookup failed does.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Sequence
from typing import Any

from pko.api.stack import FluxSource, PolicyPack, Stack
from pko.api.workspace import GitAuth
from pko.controllers.secretaccess import SECRET_FORBIDDEN_REASON, SecretAccess, SecretForbidden
from pko.controllers.sharding import own_program_url
from pko.controllers.stack.branchpoll import BranchResolver, GitCredentials, GitLookupError
from pko.controllers.stack.insecuretransport import pack_refusal, refusal
from pko.controllers.stack.steps import Resolved, Unresolved
from pko.controllers.stack.switch import artifact_served
from pko.controllers.stack.waits import Awaited
from pko.controllers.stack.watches import FLUX_SOURCES, artifact_of, namespace_of
from pko.controllers.stack.workspaceobject import (
    ArtifactRevision,
    GitRevision,
    PackRevision,
)
from pko.machinery.conditions import get_condition
from pko.machinery.informer import SharedInformer
from pko.machinery.manager import CACHE_SYNCED, Manager
from pko.machinery.resource import Obj, Resource, ResourceClient
from pko.machinery.store import object_key

__all__ = ["SourceResolver"]


def _decode(secret: Obj, key: str) -> str | None:
    value = (secret.get("data") or {}).get(key)
    if value is None:
        return None
    return base64.b64decode(value).decode()


class SourceResolver:
    """Resolves Stacks' sources (see the module docstring)."""

    def __init__(
        self,
        manager: Manager,
        programs: SharedInformer,
        secrets: ResourceClient,
        branches: BranchResolver,
        *,
        allow_insecure_git_credentials: bool = False,
        program_server: str = "",
        access: SecretAccess | None = None,
    ) -> None:
        self.manager = manager
        # Who the operator is and the role to bind: a refused Secret read's message.
        self.access = access or SecretAccess()
        # A Program's artifact is fetched from this operator's own server (pko.controllers.sharding).
        self.program_server = program_server
        self.programs = programs
        self.secrets = secrets
        self.branches = branches
        self.allow_insecure_git_credentials = allow_insecure_git_credentials

    async def resolve(
        self, obj: Obj, stack: Stack, packs: Sequence[PolicyPack] = ()
    ) -> Resolved | Unresolved:
        """The source at its current revision, the revision, and whether its artifact is the one
        served now, with ``packs`` (policy packs from git or Flux) at their commits or digests;
        :class:`Unresolved` when either cannot be had (a destroy may still run from
        :func:`saved_project`)."""
        got = await self._program(obj, stack)
        if isinstance(got, Unresolved) or not packs:
            return got
        revisions: list[PackRevision] = []
        for pack in packs:
            revision = await self._pack(stack, pack)
            if isinstance(revision, Unresolved):
                return revision
            revisions.append(revision)
        return dataclasses.replace(got, packs=tuple(revisions))

    async def _pack(self, stack: Stack, pack: PolicyPack) -> PackRevision | Unresolved:
        """A policy pack's git source at its commit (a branch looked up as the Stack's own is, with the
        pack's credentials), or its Flux source's artifact at its digest (as the program's is);
        Unresolved as for the program's source, the message naming the pack."""
        named = f"policy pack {pack.name!r}"
        if pack.flux_source is not None:
            found = self._flux_artifact(stack.metadata.namespace, pack.flux_source)
            if isinstance(found, Unresolved):
                # The Flux watch wakes the Stack for its packs' sources, its own and those its
                # WorkspaceTemplates enforce (watches.flux_source_stacks); a kind not served keeps its
                # timer (FLUX_KIND), as for the program's source.
                awaits = Awaited.PACK_SOURCE if found.awaits is Awaited.FLUX_SOURCE else found.awaits
                return dataclasses.replace(found, message=f"{named}: {found.message}", awaits=awaits)
            artifact, _ = found
            return PackRevision(pack.name, artifact.url, artifact.digest, artifact.dir, artifact=True)
        git = pack.git
        assert git is not None
        refused = pack_refusal(pack, self.allow_insecure_git_credentials)
        if refused is not None:
            return refused
        creds = await self._pack_credentials(stack.metadata.namespace, git.auth)
        if isinstance(creds, Unresolved):
            return dataclasses.replace(creds, message=f"{named}: {creds.message}")
        commit = git.commit or ""
        if not commit:
            try:
                commit = await self.branches.head(
                    git.url, git.branch or "", creds, float(stack.spec.resync_frequency())
                )
            except GitLookupError as exc:
                return Unresolved("SourceUnavailable", f"{named}: {exc}", Awaited.GIT_REMOTE)
        return PackRevision(pack.name, git.url, commit, pack.path, git.auth)

    async def _program(self, obj: Obj, stack: Stack) -> Resolved | Unresolved:
        """The program's source (see :meth:`resolve`)."""
        spec = stack.spec
        namespace = namespace_of(obj)
        if spec.project_repo:
            # The plan asks for no read of such a source; refused here too, so no caller can send
            # credentials over plain HTTP that the operator does not allow.
            refused = refusal(stack, self.allow_insecure_git_credentials)
            if refused is not None:
                return refused
            creds = await self.git_credentials(stack)
            if isinstance(creds, Unresolved):
                return creds
            commit = spec.commit or ""
            if not commit:
                try:
                    commit = await self.branches.head(
                        spec.project_repo, spec.branch or "", creds, float(spec.resync_frequency())
                    )
                except GitLookupError as exc:
                    return Unresolved("SourceUnavailable", str(exc), Awaited.GIT_REMOTE)
            return Resolved(GitRevision(spec.project_repo, commit, spec.repo_dir, spec.shallow), commit)
        if spec.flux_source is not None:
            found = self._flux_artifact(namespace, spec.flux_source)
            if isinstance(found, Unresolved):
                return found
            source, served = found
            return Resolved(source, source.digest or source.revision, served)
        if spec.program_ref is not None:
            program = self.programs.indexer.get_by_key(object_key(namespace, spec.program_ref.name))
            if program is None:
                return Unresolved(
                    "SourceUnavailable", "unable to retrieve program for stack", Awaited.PROGRAM
                )
            artifact = artifact_of(program)
            if artifact is None:
                return Unresolved("SourceUnavailable", "Program has no artifact", Awaited.PROGRAM)
            revision = str(artifact.get("revision") or "")
            digest = str(artifact.get("digest") or "")
            url = own_program_url(str(artifact["url"]), self.program_server)
            source = ArtifactRevision(url, digest, revision)
            return Resolved(source, digest or revision, artifact_served(program))
        return Resolved(None, "")

    def _flux_artifact(
        self, namespace: str | None, flux: FluxSource
    ) -> tuple[ArtifactRevision, bool] | Unresolved:
        """A Flux source's artifact (from its status, in the informer's cache) and whether it is the one
        served now; Unresolved while the kind is not served, the object is missing or has no artifact
        (its Ready condition's reason and message then)."""
        ref = flux.source_ref
        resource = self.flux_resource(ref.api_version, ref.kind)
        if resource is None:
            return Unresolved(
                "SpecInvalid",
                f"cannot process source reference: unsupported Flux source {ref.api_version} {ref.kind}",
            )
        if self.manager.optional_cache_status(resource) != CACHE_SYNCED:
            return Unresolved(
                "SourceUnavailable",
                f"could not resolve sourceRef: {resource.kind} ({resource.api_version}) is not served "
                "by the cluster (are Flux's CRDs installed?)",
                Awaited.FLUX_KIND,
            )
        source_obj = self.manager.informer(resource).indexer.get_by_key(object_key(namespace, ref.name))
        if source_obj is None:
            return Unresolved(
                "SourceUnavailable",
                f'could not resolve sourceRef: {resource.plural}.{resource.group} "{ref.name}" not found',
                Awaited.FLUX_SOURCE,
            )
        artifact = artifact_of(source_obj)
        if artifact is None:
            ready = get_condition((source_obj.get("status") or {}).get("conditions"), "Ready")
            detail = (
                f" ({ready.get('reason')}: {ready.get('message')})"
                if ready and ready.get("status") != "True"
                else ""
            )
            return Unresolved(
                "SourceUnavailable", f"Flux source has no artifact{detail}", Awaited.FLUX_SOURCE
            )
        revision = str(artifact.get("revision") or "")
        digest = str(artifact.get("digest") or "")
        # The digest is what changed (Flux may keep the revision for new content, e.g. a new
        # ignore rule), so it is the "commit" compared and recorded, as upstream does.
        source = ArtifactRevision(str(artifact["url"]), digest, revision, flux.dir)
        return source, artifact_served(source_obj)

    def flux_resource(self, api_version: str, kind: str) -> Resource | None:
        group, _, version = api_version.partition("/")
        for resource in FLUX_SOURCES:
            if resource.group == group and resource.version == version and resource.kind == kind:
                return resource
        return None

    async def _secret(self, namespace: str | None, name: str, context: str = "") -> Obj | Unresolved:
        """The Secret, read directly; a missing one, or one the operator may not read (403: the
        secrets-per-namespace install without its RoleBinding), Stalls the Stack (looked for again later).
        ``context`` prefixes the message (what the Secret was for)."""
        try:
            secret = await self.access.get_or_none(self.secrets, name, namespace, context)
        except SecretForbidden as refused:
            return Unresolved(SECRET_FORBIDDEN_REASON, str(refused), Awaited.SECRET)
        if secret is None:
            return Unresolved(
                "SpecInvalid",
                f'{context}unable to get secret {namespace}/{name}: secrets "{name}" not found',
                Awaited.SECRET,
            )
        return secret

    async def _secret_value(self, namespace: str | None, name: str, key: str, what: str) -> str | Unresolved:
        secret = await self._secret(namespace, name, f"{what}: ")
        if isinstance(secret, Unresolved):
            return secret
        value = _decode(secret, key)
        if value is None:
            return Unresolved(
                "SpecInvalid",
                f'{what}: no key "{key}" found in secret {namespace}/{name}',
                Awaited.SECRET,
            )
        return value

    async def _pack_credentials(
        self, namespace: str | None, auth: GitAuth | None
    ) -> GitCredentials | Unresolved:
        """Credentials for a policy pack's branch lookup: its ``git.auth`` Secret keys (the fetch step in
        the pod reads the same keys)."""
        if auth is None:
            return GitCredentials()
        values: dict[str, str] = {}
        named = (
            ("ssh_private_key", auth.ssh_private_key, "SSH private key"),
            ("username", auth.username, "username"),
            ("password", auth.password, "password"),
            ("token", auth.token, "token"),
        )
        for field, selector, what in named:
            if selector is None:
                continue
            got = await self._secret_value(
                namespace,
                str(selector.get("name") or ""),
                str(selector.get("key") or ""),
                f"reading git.auth {what}",
            )
            if isinstance(got, Unresolved):
                if selector.get("optional"):
                    continue
                return got
            values[field] = got
        return GitCredentials(**values)

    async def git_credentials(self, stack: Stack) -> GitCredentials | Unresolved:
        """Credentials for the branch lookup, read from Secrets (Go: resolveGitAuth)."""
        spec = stack.spec
        namespace = stack.metadata.namespace
        if spec.git_auth_secret:
            name = spec.git_auth_secret
            secret = await self._secret(namespace, name)
            if isinstance(secret, Unresolved):
                return secret
            if _decode(secret, "sshPrivateKey") is not None:
                return GitCredentials(
                    ssh_private_key=_decode(secret, "sshPrivateKey"), password=_decode(secret, "password")
                )
            if _decode(secret, "accessToken") is not None:
                return GitCredentials(token=_decode(secret, "accessToken"))
            if _decode(secret, "username") is not None:
                password = _decode(secret, "password")
                if password is None:
                    return Unresolved(
                        "SpecInvalid",
                        f'creating gitAuth: no key "password" found in secret {namespace}/{name}',
                        Awaited.SECRET,
                    )
                return GitCredentials(username=_decode(secret, "username"), password=password)
            return GitCredentials()
        auth = spec.git_auth
        if auth is None:
            return GitCredentials()

        # (field, secret reference, what it is), read in this order; the first that cannot be had stalls
        refs: list[tuple[str, Any, str]] = []
        if auth.ssh_auth is not None:
            refs.append(("ssh_private_key", auth.ssh_auth.ssh_private_key, "SSH private key"))
            if auth.ssh_auth.password:
                refs.append(("password", auth.ssh_auth.password, "SSH password"))
        elif auth.access_token is not None:
            refs.append(("token", auth.access_token, "personal access token"))
        elif auth.basic_auth is not None:
            refs.append(("username", auth.basic_auth.user_name, "username"))
            refs.append(("password", auth.basic_auth.password, "password"))
        values: dict[str, str] = {}
        for field, ref, what in refs:
            secret = ref.secret
            got = await self._secret_value(namespace, secret.name, secret.key, f"resolving gitAuth {what}")
            if isinstance(got, Unresolved):
                return got
            values[field] = got
        if values:
            return GitCredentials(**values)
        # A GitHub App token is minted by the workspace's fetch step; the lookup goes without.
        return GitCredentials()
