"""Fetch one revision of a git repository into an empty directory, with dulwich.

A revision is what the Workspace's `git.ref` holds: a full or abbreviated commit SHA, a branch, a tag,
a full ref name, or nothing (the remote's HEAD). Names resolve by :mod:`pko.git.refs`'s rule, the
order of `git rev-parse`: a tag wins over a branch of the same name (``refs/heads/<name>`` names
the branch). A Stack hands its Workspace the commit its branch resolved to, never the name.

Shallow fetches (depth 1) are used when asked for and possible: the server must advertise shallow
support and, for a commit no ref points at, accept a want of an unadvertised commit. Otherwise all
branches and tags are fetched and the commit looked up among them.

Invariants: the checkout is at exactly the resolved commit (a branch checkout also has the branch
as HEAD, so Pulumi records the branch); the repository's recorded remote URL carries no password;
errors are SourceError subclasses whose message names the revision and the redacted URL.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import structlog
from dulwich.client import (
    GitClient,
    HTTPUnauthorized,
    Urllib3HttpGitClient,
    get_transport_and_path,
)
from dulwich.config import ConfigDict
from dulwich.errors import GitProtocolError, HangupException, NotGitRepository
from dulwich.objects import Commit, ObjectID, Tag
from dulwich.objectspec import AmbiguousShortId, scan_for_short_id
from dulwich.refs import Ref
from dulwich.repo import Repo
from pko.agent import transfer
from pko.agent.errors import (
    AuthError,
    RefNotFound,
    SourceError,
    UnreachableError,
    UsageError,
)

from pko.git import GitCredentials, GitURLError, Remote, redact_text, redact_url, resolve_ref
from pko.git import remote as git_remote
from pko.git.ssh import ssh_client

__all__ = ["GitCheckout", "GitCredentials", "Remote", "Want", "fetch_git", "parse_remote", "resolve_revision"]

log = structlog.get_logger(__name__)

_FULL_SHA = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
_SHORT_SHA = re.compile(r"^[0-9a-f]{4,63}$")
_PEELED_SUFFIX = b"^{}"


@dataclass(frozen=True)
class GitCheckout:
    """The result of a fetch: which commit is checked out, and through which ref if any."""

    commit: str
    ref: str | None
    shallow: bool


@dataclass(frozen=True)
class Want:
    """How a revision resolved against the remote's advertised refs.

    ``ref``: a named ref, fetch its object. ``commit``: a full SHA, fetch it directly.
    ``scan``: an abbreviated SHA, fetch every branch and tag and look for it.
    """

    kind: Literal["ref", "commit", "scan"]
    sha: ObjectID | None = None
    ref: Ref | None = None


def resolve_revision(revision: str, refs: Mapping[Ref, ObjectID | None]) -> Want | None:
    """Resolve `revision` against advertised `refs`; None when it cannot name anything there.

    Nothing (or ``HEAD``) is the remote's HEAD, a full SHA is that commit, a name is a ref by
    :mod:`pko.git.refs`'s rule (git's rev-parse order: tags before branches), and any other
    hexadecimal string an abbreviated SHA to scan for.
    """
    rev = revision.strip()
    if rev in ("", "HEAD"):
        sha = refs.get(Ref(b"HEAD"))
        return Want("ref", sha, Ref(b"HEAD")) if sha else None
    if _FULL_SHA.match(rev):
        return Want("commit", ObjectID(rev.encode()))
    found = resolve_ref(refs, rev)
    if found is not None:
        name, sha = found
        return Want("ref", sha, name)
    if _SHORT_SHA.match(rev):
        return Want("scan")
    return None


def _all_branches_and_tags(refs: Mapping[Ref, ObjectID | None]) -> list[ObjectID]:
    wanted = {
        sha
        for name, sha in refs.items()
        if sha and name.startswith((b"refs/heads/", b"refs/tags/")) and not name.endswith(_PEELED_SUFFIX)
    }
    head = refs.get(Ref(b"HEAD"))
    if head:
        wanted.add(head)
    return sorted(wanted)


def parse_remote(url: str) -> Remote:
    """Classify `url` as :func:`pko.git.parse_remote` does (the API's projectRepo check draws the
    same line), as a UsageError naming the redacted URL when git cannot clone from it.

    A local repository is whatever the pod can read (a mounted Secret, the service account's token
    directory): refused unless the operator of the pod explicitly allows it (``GIT_ALLOW_LOCAL``).
    """
    if not url.strip():
        raise UsageError("no git URL given (set GIT_URL or --git-url)")
    try:
        remote = git_remote.parse_remote(url)
    except GitURLError as exc:
        # a remote-helper "URL" is a command line (ext::sh -c ...): nothing in it can be redacted
        shown = "" if git_remote.is_remote_helper(url) else f" {redact_url(url.strip())}"
        raise UsageError(f"unsupported git URL{shown}: {exc}") from None
    if remote.transport == "local" and os.environ.get("GIT_ALLOW_LOCAL", "").strip().lower() not in (
        "1",
        "true",
        "yes",
    ):
        raise UsageError(
            f"local git URL {remote.display} refused: set GIT_ALLOW_LOCAL=true in the fetch container"
        )
    return remote


def _http_client(remote: Remote, creds: GitCredentials, timeout: float) -> GitClient:
    username, password = creds.basic_auth(remote.username, remote.password)
    config = ConfigDict()
    ca_file = os.environ.get("GIT_SSL_CAINFO")
    if ca_file:
        config.set((b"http",), b"sslCAInfo", ca_file.encode())
    return Urllib3HttpGitClient(
        remote.url, username=username, password=password, config=config, timeout=timeout
    )


def _client_for(remote: Remote, creds: GitCredentials, timeout: float) -> tuple[GitClient, str]:
    if remote.transport == "http":
        return _http_client(remote, creds, timeout), remote.path
    if remote.transport == "ssh":
        return ssh_client(remote, creds, timeout), remote.path
    client, path = get_transport_and_path(remote.url)
    return client, path


def fetch_git(
    url: str,
    revision: str,
    dest: Path,
    *,
    shallow: bool = False,
    credentials: GitCredentials | None = None,
    timeout: float = 60.0,
) -> GitCheckout:
    """Fetch `revision` of `url` into the empty directory `dest` and check it out.

    On error `dest` holds a partial repository; the caller discards it.
    """
    creds = credentials or GitCredentials()
    remote = parse_remote(url)
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise UsageError(f"cannot fetch into {dest}: the directory is not empty")
    log.info("fetching git source", url=remote.display, revision=revision or "HEAD", shallow=shallow)
    with _translated_errors(remote, creds, revision):
        client, path = _client_for(remote, creds, timeout)
        try:
            with Repo.init(str(dest)) as repo:
                return _fetch_and_checkout(client, path, repo, remote, revision, shallow)
        finally:
            client.close()


def _fetch_and_checkout(
    client: GitClient, path: str, repo: Repo, remote: Remote, revision: str, shallow: bool
) -> GitCheckout:
    seen: dict[str, Want | None] = {}
    advertised: dict[Ref, ObjectID] = {}

    def wants(refs: Mapping[Ref, ObjectID], depth: int | None = None) -> list[ObjectID]:
        advertised.update({k: v for k, v in refs.items() if v})
        want = seen["want"] = resolve_revision(revision, refs)
        if want is None:
            return []
        if want.kind == "scan":
            return _all_branches_and_tags(refs)
        assert want.sha is not None
        return [want.sha]

    def all_refs(refs: Mapping[Ref, ObjectID], depth: int | None = None) -> list[ObjectID]:
        advertised.update({k: v for k, v in refs.items() if v})
        return _all_branches_and_tags(refs)

    depth = 1 if shallow else None
    try:
        with transfer.network():
            result = client.fetch(path, repo, determine_wants=wants, depth=depth)
    except GitProtocolError as exc:
        want = seen.get("want")
        if _is_transport_failure(exc) or want is None:
            raise
        if want.kind == "commit":
            # Servers may refuse a commit no ref points at; it may still be in a branch's history.
            log.info("commit not fetchable directly, fetching all branches and tags", url=remote.display)
            with transfer.network():
                result = client.fetch(path, repo, determine_wants=all_refs, depth=None)
        elif "does not support shallow" in str(exc):
            log.info("server cannot serve shallow fetches, fetching full history", url=remote.display)
            with transfer.network():
                result = client.fetch(path, repo, determine_wants=wants, depth=None)
        else:
            raise
    want = seen.get("want")
    if want is None:
        if not advertised:
            raise RefNotFound(
                f"repository {remote.display} is empty: revision {revision or 'HEAD'!r} not found"
            )
        raise RefNotFound(f"revision {revision!r} not found in {remote.display}")

    commit = _resolve_commit(repo, want, revision, remote)
    branch = _branch_of(want, result.symrefs)
    _record(repo, remote, want, commit, branch, advertised)
    repo.get_worktree().reset_index(commit.tree)
    shallow_now = bool(repo.get_shallow())
    log.info("git source fetched", url=remote.display, commit=commit.id.decode(), ref=_ref_str(want.ref))
    return GitCheckout(commit=commit.id.decode(), ref=_ref_str(branch or want.ref), shallow=shallow_now)


def _ref_str(ref: Ref | None) -> str | None:
    return ref.decode() if ref is not None else None


def _resolve_commit(repo: Repo, want: Want, revision: str, remote: Remote) -> Commit:
    store = repo.object_store
    if want.kind == "scan":
        try:
            obj = scan_for_short_id(store, revision.strip().encode(), Commit)
        except KeyError:
            raise RefNotFound(f"revision {revision!r} not found in {remote.display}") from None
        except AmbiguousShortId:
            raise UsageError(
                f"revision {revision!r} is ambiguous in {remote.display}: give more digits"
            ) from None
    else:
        assert want.sha is not None
        if want.sha not in store:
            raise RefNotFound(f"revision {revision!r} not found in {remote.display}")
        obj = store[want.sha]
    while isinstance(obj, Tag):
        obj = store[obj.object[1]]
    if not isinstance(obj, Commit):
        raise RefNotFound(
            f"revision {revision!r} in {remote.display} is a {obj.type_name.decode()}, not a commit"
        )
    return obj


def _branch_of(want: Want, symrefs: Mapping[Ref, Ref]) -> Ref | None:
    if want.ref == b"HEAD":
        target = symrefs.get(Ref(b"HEAD"))
        return target if target and target.startswith(b"refs/heads/") else None
    if want.ref is not None and want.ref.startswith(b"refs/heads/"):
        return want.ref
    return None


def _record(
    repo: Repo,
    remote: Remote,
    want: Want,
    commit: Commit,
    branch: Ref | None,
    advertised: Mapping[Ref, ObjectID],
) -> None:
    """Write origin, remote-tracking refs, tags and HEAD the way `git clone` would leave them."""
    config = repo.get_config()
    config.set((b"remote", b"origin"), b"url", remote.url.encode())
    config.set((b"remote", b"origin"), b"fetch", b"+refs/heads/*:refs/remotes/origin/*")
    config.write_to_path()
    store = repo.object_store
    for name, sha in advertised.items():
        if name.endswith(_PEELED_SUFFIX) or sha not in store:
            continue
        if name.startswith(b"refs/heads/"):
            repo.refs[Ref(b"refs/remotes/origin/" + name[len(b"refs/heads/") :])] = sha
        elif name.startswith(b"refs/tags/"):
            repo.refs[name] = sha
    if branch is not None:
        local = Ref(branch)
        repo.refs[local] = commit.id
        repo.refs.set_symbolic_ref(Ref(b"HEAD"), local)
        section = (b"branch", branch[len(b"refs/heads/") :])
        config.set(section, b"remote", b"origin")
        config.set(section, b"merge", branch)
        config.write_to_path()
    else:
        # A detached HEAD: drop the symbolic HEAD first, or writing it would move the unborn branch.
        del repo.refs[Ref(b"HEAD")]
        repo.refs.add_if_new(Ref(b"HEAD"), commit.id)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _is_transport_failure(exc: BaseException) -> bool:
    """True when the error is about reaching or authenticating to the server, not about the revision."""
    import urllib3.exceptions

    if re.search(r"unexpected http resp (401|403|407)\b", str(exc)):
        return True
    return any(
        isinstance(e, urllib3.exceptions.HTTPError | OSError | SourceError | HTTPUnauthorized)
        for e in _chain(exc)
    )


def _unreachable_reason(exc: BaseException) -> str | None:
    import urllib3.exceptions

    for e in _chain(exc):
        if isinstance(e, urllib3.exceptions.NameResolutionError | socket.gaierror):
            return "name resolution failed"
        if isinstance(e, urllib3.exceptions.SSLError):
            return f"TLS handshake failed ({e})"
        # Before the timeouts: urllib3 2.x makes NewConnectionError a ConnectTimeoutError subclass.
        if isinstance(e, ConnectionRefusedError) or (
            isinstance(e, urllib3.exceptions.NewConnectionError) and "refused" in str(e).lower()
        ):
            return "connection refused"
        if isinstance(
            e, urllib3.exceptions.ConnectTimeoutError | urllib3.exceptions.ReadTimeoutError | TimeoutError
        ):
            return "timed out"
        if isinstance(e, urllib3.exceptions.NewConnectionError):
            return "connection failed"
        if isinstance(e, ConnectionError):
            return "connection lost"
    for e in _chain(exc):
        if isinstance(e, urllib3.exceptions.MaxRetryError | urllib3.exceptions.ProtocolError):
            return type(e.__cause__ or e).__name__
    return None


@contextmanager
def _translated_errors(remote: Remote, creds: GitCredentials, revision: str) -> Iterator[None]:
    """Turn dulwich, urllib3 and socket errors into SourceErrors that say what to check."""
    secrets = (*creds.secrets(), remote.password)
    has_creds = bool(creds.token or creds.password or creds.username or remote.password)
    try:
        yield
    except SourceError:
        raise
    except HTTPUnauthorized as exc:
        if has_creds:
            raise AuthError(
                f"authentication failed for {remote.display}: the server rejected the credentials "
                "(check GIT_TOKEN, or GIT_USERNAME and GIT_PASSWORD)"
            ) from exc
        raise AuthError(
            f"authentication failed for {remote.display}: the server requires credentials "
            "(set GIT_TOKEN, or GIT_USERNAME and GIT_PASSWORD)"
        ) from exc
    except NotGitRepository as exc:
        raise SourceError(
            f"no git repository at {remote.display} (or it is not visible with the credentials given)"
        ) from exc
    except (GitProtocolError, OSError) as exc:
        status = re.search(r"unexpected http resp (\d{3})\b", str(exc))
        if status and status.group(1) in ("401", "403"):
            raise AuthError(
                f"authentication failed for {remote.display}: access denied (HTTP {status.group(1)})"
            ) from exc
        reason = _unreachable_reason(exc)
        if reason is not None:
            where = f"{remote.host}:{remote.port}" if remote.port else (remote.host or remote.display)
            raise UnreachableError(f"cannot reach {where} for {remote.display}: {reason}") from exc
        detail = redact_text(str(exc).strip() or type(exc).__name__, secrets)
        if isinstance(exc, HangupException):
            raise SourceError(f"the git server for {remote.display} hung up: {detail}") from exc
        if isinstance(exc, OSError) and not isinstance(exc, GitProtocolError):
            raise SourceError(f"cannot write the checkout of {remote.display}: {detail}") from exc
        raise SourceError(f"fetching {revision or 'HEAD'!r} from {remote.display} failed: {detail}") from exc
