"""A Stack whose projectRepo needs credentials, end to end on the node: a git smart-HTTPS server (its
certificate from the suite's own CA, which the operator and the workspace pods trust as
docs/stacks.md says: e2e/conftest.py's git_tls) that refuses anonymous requests, credentials from a
Kubernetes Secret through ``spec.gitAuth`` (as users write it for the Pulumi Kubernetes Operator), the
operator's branch lookup (from the operator pod) and the agent's fetch (from the workspace pod) both
authenticating, a pushed commit picked up by the branch poll, and wrong credentials reported without
the secret value ever showing. Against either operator (``PKO_E2E_OPERATOR``)."""

from __future__ import annotations

import base64
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from dulwich.repo import Repo

from pko.devtools.gitserver import ServerTLS, git_app, serve_wsgi

from .conftest import NODE_IP, OPERATOR, OPERATOR_NS, Kube, trusting_git_ca
from .stacks import bare_repository, gitops_commit, gone, ready
from .stacks import stack as claimed

pytestmark = pytest.mark.timeout(1800)

USER = "e2e-user"
PASSWORD = "e2e-git-passw0rd-9c2e"  # must never show in an object or a log line
TOKEN = "e2e-git-t0ken-51aa"  # sent as the basic-auth password of the user "git" (agent/gitfetch.py)
WRONG_PASSWORD = "e2e-wrong-passw0rd-77d0"
WRONG_TOKEN = "e2e-wrong-t0ken-0b3f"
SECRETS = (PASSWORD, TOKEN, WRONG_PASSWORD, WRONG_TOKEN)


@dataclass(frozen=True)
class Request:
    remote: str
    method: str
    path: str
    user: str | None  # the basic-auth user name sent, if any
    accepted: bool


@dataclass
class AuthGit:
    """A WSGI app: the smart-HTTP app (git_app) behind HTTP basic auth, recording every request."""

    app: Callable[..., Iterable[bytes]]
    accounts: set[tuple[str, str]]
    url: str = ""
    repo: Repo | None = None
    ca: str = ""  # the PEM file of the CA that signed the server's certificate
    seen: list[Request] = field(default_factory=list)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        user: str | None = None
        ok = False
        header = str(environ.get("HTTP_AUTHORIZATION") or "")
        if header.lower().startswith("basic "):
            try:
                user, _, password = base64.b64decode(header[6:]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                user, password = "?", ""
            ok = (user, password) in self.accounts
        path = str(environ.get("PATH_INFO") or "")
        self.seen.append(
            Request(str(environ.get("REMOTE_ADDR")), str(environ["REQUEST_METHOD"]), path, user, ok)
        )
        if not ok:
            body = b"authentication required\n"
            start_response(
                "401 Unauthorized",
                [
                    ("WWW-Authenticate", 'Basic realm="e2e git"'),
                    ("Content-Type", "text/plain"),
                    ("Content-Length", str(len(body))),
                ],
            )
            return [body]
        return self.app(environ, start_response)

    def from_(self, remote: str, method: str, path_end: str) -> list[Request]:
        return [
            r for r in self.seen if r.remote == remote and r.method == method and r.path.endswith(path_end)
        ]


@pytest.fixture
def auth_git_server(tmp_path: Any, git_tls: ServerTLS) -> Iterator[AuthGit]:
    """Like test_walkthrough's git_server (the node's own address, which pods reach), but over HTTPS
    and only for ``e2e-user`` with PASSWORD, or a token (TOKEN) sent as the password of the user
    ``git``."""
    repo = bare_repository(tmp_path)
    # two path segments (org/repo): the Go operator refuses a URL with one (docs/differences.md)
    git = AuthGit(git_app({"/e2e/repo.git": repo}), {(USER, PASSWORD), ("git", TOKEN)})
    with serve_wsgi(git, host=NODE_IP, tls=git_tls) as base:
        git.url, git.repo, git.ca = f"{base}/e2e/repo.git", repo, str(git_tls.ca)
        yield git


def stack(name: str, source: str) -> str:
    """The suite's Stack (e2e/stacks.py), its workspace pods trusting the git server's CA."""
    return trusting_git_ca(claimed(name, source))


def _status_of(git: AuthGit, user: str | None = None, password: str = "") -> tuple[int, str]:
    request = urllib.request.Request(f"{git.url}/info/refs?service=git-upload-pack")
    if user is not None:
        basic = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {basic}")
    try:
        trusting = ssl.create_default_context(cafile=git.ca)
        with urllib.request.urlopen(request, timeout=10, context=trusting) as r:
            return r.status, ""
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("WWW-Authenticate") or ""


def _secret(name: str, **data: str) -> str:
    lines = "".join(f"  {key}: {value}\n" for key, value in data.items())
    return f"apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\nstringData:\n{lines}"


def _ref(secret: str, key: str) -> str:
    return f"{{type: Secret, secret: {{name: {secret}, key: {key}}}}}"


def _git_source(url: str, auth: str, *, branch: str | None = "main", commit: str | None = None) -> str:
    """The Stack's source lines, as users write them (``stack()`` indents them by two)."""
    pin = f"branch: {branch}" if branch else f"commit: {commit}"
    return (
        f"projectRepo: {url}\n  {pin}\n  repoDir: app\n  resyncFrequencySeconds: 60\n  gitAuth:\n    {auth}"
    )


def _basic_auth(secret: str) -> str:
    return (
        f"basicAuth:\n      userName: {_ref(secret, 'username')}\n      password: {_ref(secret, 'password')}"
    )


def _access_token(secret: str) -> str:
    return f"accessToken: {_ref(secret, 'accessToken')}"


def _operator_ip(k: Kube) -> str:
    pods = k.json("-n", OPERATOR_NS, "get", "pods", "-l", "control-plane=controller-manager")["items"]
    running = [p for p in pods if not p["metadata"].get("deletionTimestamp") and p["status"].get("podIP")]
    assert len(running) == 1, [p["metadata"]["name"] for p in pods]
    ip: str = running[0]["status"]["podIP"]
    return ip


def _pod_ip(k: Kube, name: str) -> str:
    pod = k.get("pod", name)
    assert pod is not None and pod["status"].get("podIP"), pod
    ip: str = pod["status"]["podIP"]
    return ip


def _assert_never_shown(k: Kube, pods: Iterable[str]) -> None:
    """No secret value in any Stack, Workspace, Update or Event, nor in the operator's or the workspace
    pods' logs (every container)."""
    shown = k.run("get", "stack,workspace,update,events", "-o", "yaml")
    shown += k.run("-n", OPERATOR_NS, "get", "events", "-o", "yaml")
    logs = [k.run("-n", OPERATOR_NS, "logs", "deployment/controller-manager", "--all-containers")]
    logs += [k.run("logs", pod, "--all-containers", "--prefix", check=False) for pod in pods]
    logs += [k.run("logs", pod, "--all-containers", "--previous", check=False) for pod in pods]
    for value in SECRETS:
        assert value not in shown, f"a git credential is shown in an object: {value}"
        for text in logs:
            assert value not in text, f"a git credential is in a log: {value}"


def _stalled(k: Kube, name: str, timeout: float) -> dict[str, Any]:
    """Stack ``name`` once it is Stalled."""

    def stalled() -> dict[str, Any] | None:
        st = k.get("stack", name)
        return st if k.condition(st, "Stalled").get("status") == "True" else None

    return k.until(f"stack {name} Stalled", stalled, timeout)


def _remove(k: Kube, name: str, secret: str) -> None:
    """Delete Stack ``name`` and wait for it and its Workspace to go; then its Secret."""
    k.run("delete", "stack", name, "--wait=false")
    gone(k, "stack", name)
    gone(k, "workspace", name)
    k.run("delete", "secret", secret)


def test_git_stack_with_basic_auth_tracks_its_branch(kube: Kube, auth_git_server: AuthGit) -> None:
    k, git = kube, auth_git_server
    assert git.repo is not None
    # the server: anonymous and wrong credentials refused with a Basic challenge, the right ones served
    assert git.url.startswith("https://"), git.url
    assert _status_of(git) == (401, 'Basic realm="e2e git"')
    assert _status_of(git, USER, WRONG_PASSWORD)[0] == 401
    assert _status_of(git, "git", WRONG_TOKEN)[0] == 401
    assert _status_of(git, USER, PASSWORD) == (200, "")
    assert _status_of(git, "git", TOKEN) == (200, "")
    git.seen.clear()

    k.apply(_secret("gitauth-creds", username=USER, password=PASSWORD))
    k.apply(stack("gitauth", _git_source(git.url, _basic_auth("gitauth-creds"))))
    head = git.repo.refs[b"refs/heads/main"].decode()
    s = ready(k, "gitauth")
    assert s["status"]["lastUpdate"]["lastSuccessfulCommit"] == head, s["status"]
    assert s["status"]["outputs"] == {"greeting": "one"}, s["status"]
    assert k.condition(s, "InsecureTransport") == {}, s["status"]  # HTTPS: nothing to warn of

    # Both ends authenticated: the branch lookup (ls-remote) from the operator pod, and the fetch
    # (git-upload-pack) from the workspace pod; neither got in without the Secret's credentials.
    operator, workspace = _operator_ip(k), _pod_ip(k, "gitauth-workspace-0")
    assert operator != workspace
    lookups = git.from_(operator, "GET", "/info/refs")
    assert any(r.accepted and r.user == USER for r in lookups), git.seen
    fetches = git.from_(workspace, "POST", "/git-upload-pack")
    assert fetches and all(r.accepted and r.user == USER for r in fetches), git.seen
    assert not git.from_(operator, "POST", "/git-upload-pack"), (
        "the operator cloned: it should only list refs"
    )
    assert {r.remote for r in git.seen} <= {operator, workspace}, git.seen

    # A push to the branch: the next poll (resyncFrequencySeconds: 60) finds it, the workspace fetches
    # it with the same credentials, and the new output shows.
    before = len(git.seen)
    pushed = gitops_commit(git.repo, "two")

    def deployed() -> dict[str, Any] | None:
        st = k.get("stack", "gitauth") or {}
        status = st.get("status") or {}
        done = (status.get("lastUpdate") or {}).get("lastSuccessfulCommit") == pushed
        return st if done and k.condition(st, "Ready").get("status") == "True" else None

    s = k.until("the pushed commit deployed", deployed, 400)
    assert s["status"]["outputs"] == {"greeting": "two"}, s["status"]
    later = git.seen[before:]
    workspace = _pod_ip(k, "gitauth-workspace-0")  # the new commit rolled the workspace pod
    assert any(r.remote == operator and r.path.endswith("/info/refs") and r.accepted for r in later), later
    assert any(r.remote == workspace and r.method == "POST" and r.accepted for r in later), later
    assert all(r.user == USER for r in later if r.accepted), later

    _assert_never_shown(k, ["gitauth-workspace-0"])
    _remove(k, "gitauth", "gitauth-creds")


def test_a_wrong_password_stalls_the_branch_lookup_and_is_never_shown(
    kube: Kube, auth_git_server: AuthGit
) -> None:
    """Tracking a branch: the operator's lookup (from the operator pod) is refused before any
    workspace runs; the Stack is Stalled and says which repository refused which credentials."""
    k, git = kube, auth_git_server
    k.apply(_secret("gitauth-wrong", username=USER, password=WRONG_PASSWORD))
    k.apply(stack("gitauth-wrong", _git_source(git.url, _basic_auth("gitauth-wrong"))))

    s = _stalled(k, "gitauth-wrong", 300)
    assert k.condition(s, "Ready").get("status") == "False", s["status"]
    why = k.condition(s, "Stalled")
    # e.g. "listing https://10.87.0.1:35607/e2e/repo.git: authentication failed: the server rejected the
    # credentials (spec.gitAuth)"
    assert why["reason"] == "SourceUnavailable", why
    if OPERATOR == "pko":
        assert git.url in why["message"] and "credentials" in why["message"], why
    else:  # go-git's words and the server's body, no repository named (docs/differences.md)
        assert why["message"] == "listing: authentication required: authentication required\n", why
    operator = _operator_ip(k)
    assert any(r.user == USER and not r.accepted for r in git.from_(operator, "GET", "/info/refs")), git.seen
    assert not [r for r in git.seen if r.accepted], "a wrong credential was let in"
    assert k.get("workspace", "gitauth-wrong") is None, "a workspace ran without a source revision"
    _assert_never_shown(k, [])

    # Fixing the Secret is all it takes (the next lookup, within 30s, uses the new credentials).
    k.apply(_secret("gitauth-wrong", username=USER, password=PASSWORD))
    s = ready(k, "gitauth-wrong")
    assert s["status"]["outputs"] == {"greeting": "one"}, s["status"]
    _assert_never_shown(k, ["gitauth-wrong-workspace-0"])
    _remove(k, "gitauth-wrong", "gitauth-wrong")


def test_a_wrong_token_refused_at_fetch_is_reported_and_never_shown(
    kube: Kube, auth_git_server: AuthGit
) -> None:
    """Pinned to a commit: no branch lookup, so the agent's fetch in the workspace pod (the token sent
    as the password of "git") is what is refused."""
    k, git = kube, auth_git_server
    assert git.repo is not None
    head = git.repo.refs[b"refs/heads/main"].decode()
    k.apply(_secret("gitauth-token", accessToken=WRONG_TOKEN))
    source = _git_source(git.url, _access_token("gitauth-token"), branch=None, commit=head)
    k.apply(stack("gitauth-pinned", source))

    def fetch_refused() -> list[Request] | None:
        pod = k.get("pod", "gitauth-pinned-workspace-0") or {}
        ip = (pod.get("status") or {}).get("podIP")
        refused = [r for r in git.from_(ip, "GET", "/info/refs") if r.user == "git"] if ip else []
        return refused or None

    k.until("the workspace's fetch refused", fetch_refused, 300)
    assert not [r for r in git.seen if r.accepted], "a wrong credential was let in"
    if OPERATOR == "pko":
        _fetch_refusal_said(k, git)
    else:  # the Go operator's Workspace waits for its StatefulSet (docs/differences.md)
        assert k.condition(k.get("stack", "gitauth-pinned"), "Ready").get("status") != "True"
    _assert_never_shown(k, ["gitauth-pinned-workspace-0"])

    # Fixing the Secret is all it takes: the fetch container's next start reads the new token.
    k.apply(_secret("gitauth-token", accessToken=TOKEN))
    s = ready(k, "gitauth-pinned")
    assert s["status"]["outputs"] == {"greeting": "one"}, s["status"]
    assert any(r.user == "git" and r.accepted for r in git.seen), git.seen
    _assert_never_shown(k, ["gitauth-pinned-workspace-0"])
    _remove(k, "gitauth-pinned", "gitauth-token")


def _fetch_refusal_said(k: Kube, git: AuthGit) -> None:
    """pko: the Workspace says the fetch was refused (InitContainerFailed, in the agent's words), and
    the Stack says why once the fetch has failed three times in a row (the Workspace is then Stalled:
    only a changed Secret or spec fixes it); until then it is Reconciling, "waiting for workspace
    readiness"."""

    def said() -> dict[str, Any] | None:
        ws = k.get("workspace", "gitauth-pinned")
        return ws if k.condition(ws, "Ready").get("reason") == "InitContainerFailed" else None

    ws = k.until("workspace gitauth-pinned InitContainerFailed", said, 300)
    message = k.condition(ws, "Ready")["message"]
    assert "authentication failed for " + git.url in message, message
    assert "the server rejected the credentials" in message, message
    st = _stalled(k, "gitauth-pinned", 400)
    assert k.condition(st, "Ready").get("status") == "False", st["status"]
    why = k.condition(st, "Stalled")
    assert why["reason"] == "WorkspaceFailed", why
    assert why["message"].startswith("InitContainerFailed: "), why
    assert f"authentication failed for {git.url}: the server rejected the credentials" in why["message"]
