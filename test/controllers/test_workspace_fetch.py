"""The ``fetch`` init container a Workspace's source becomes (pure: no cluster): git, Flux, a local
directory or a bare project, credentials only as Secret references."""

from __future__ import annotations

from pko.controllers.options import ControllerOptions

from .builders import OPTIONS, RESTRICTED_CAPS, Obj, env_of, pod_spec, workspace


def fetch_of(ws: Obj, options: ControllerOptions = OPTIONS) -> Obj:
    init = pod_spec(ws, options)["initContainers"]
    assert [c["name"] for c in init][:2] == ["bootstrap", "fetch"]
    fetch: Obj = init[1]
    assert fetch["image"] == "example/agent:v1"
    assert fetch["imagePullPolicy"] == "Always"
    assert fetch["volumeMounts"] == [{"name": "share", "mountPath": "/share"}]
    assert fetch["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert env_of(fetch)["PULUMI_ENV"]["value"] == "/share/.env"
    return fetch


def test_no_source_no_fetch_container() -> None:
    assert [c["name"] for c in pod_spec(workspace({}))["initContainers"]] == ["bootstrap"]


def test_git_source_with_secret_references_only() -> None:
    secret = {"name": "git-creds", "key": "token"}
    app = {
        "appID": {"name": "app", "key": "id"},
        "installationID": {"name": "app", "key": "inst"},
        "privateKey": {"name": "app", "key": "pem"},
    }
    ws = workspace(
        {
            "git": {
                "url": "https://example.com/repo.git",
                "ref": "abc123",
                "dir": "infra",
                "shallow": True,
                "auth": {
                    "token": secret,
                    "username": {"name": "git-creds", "key": "user"},
                    "password": {"name": "git-creds", "key": "pw"},
                    "sshPrivateKey": {"name": "git-creds", "key": "ssh"},
                    "githubApp": app,
                },
            }
        }
    )
    fetch = fetch_of(ws)
    assert fetch["args"] == [
        "/share/agent",
        "init",
        "-t",
        "/share/source",
        "--workspace-dir",
        "/share/workspace",
    ]
    env = env_of(fetch)
    assert env["GIT_URL"]["value"] == "https://example.com/repo.git"
    assert env["GIT_REVISION"]["value"] == "abc123"
    assert env["GIT_DIR"]["value"] == "infra"
    assert env["GIT_SHALLOW"]["value"] == "true"
    assert env["GIT_TOKEN"]["valueFrom"] == {"secretKeyRef": secret}
    assert env["GIT_USERNAME"]["valueFrom"] == {"secretKeyRef": {"name": "git-creds", "key": "user"}}
    assert env["GIT_PASSWORD"]["valueFrom"] == {"secretKeyRef": {"name": "git-creds", "key": "pw"}}
    assert env["GIT_SSH_PRIVATE_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "git-creds", "key": "ssh"}}
    assert env["GIT_GITHUB_APP_ID"]["valueFrom"] == {"secretKeyRef": app["appID"]}
    assert env["GIT_GITHUB_APP_INSTALLATION_ID"]["valueFrom"] == {"secretKeyRef": app["installationID"]}
    assert env["GIT_GITHUB_APP_PRIVATE_KEY"]["valueFrom"] == {"secretKeyRef": app["privateKey"]}
    for var in fetch["env"]:
        if var["name"] not in ("GIT_URL", "GIT_REVISION", "GIT_DIR", "GIT_SHALLOW", "PULUMI_ENV"):
            assert "value" not in var, var


def test_the_fetch_container_takes_known_hosts_from_the_pod_template() -> None:
    """How a user trusts an SSH host for the fetch: env on the ``fetch`` init container through the
    pod template, merged by name into the operator's container (which keeps its own env)."""
    known = {"name": "SSH_KNOWN_HOSTS", "value": "/etc/pko/known_hosts"}
    mount = {"name": "known-hosts", "mountPath": "/etc/pko", "readOnly": True}
    ws = workspace(
        {
            "git": {"url": "git@git.example:org/repo.git", "ref": "abc123"},
            "podTemplate": {
                "spec": {
                    "initContainers": [{"name": "fetch", "env": [known], "volumeMounts": [mount]}],
                    "volumes": [{"name": "known-hosts", "configMap": {"name": "known-hosts"}}],
                }
            },
        }
    )
    spec = pod_spec(ws)
    fetch = next(c for c in spec["initContainers"] if c["name"] == "fetch")
    env = env_of(fetch)
    assert env["SSH_KNOWN_HOSTS"] == known and env["GIT_URL"]["value"] == "git@git.example:org/repo.git"
    assert (
        mount in fetch["volumeMounts"] and {"name": "share", "mountPath": "/share"} in fetch["volumeMounts"]
    )
    assert {"name": "known-hosts", "configMap": {"name": "known-hosts"}} in spec["volumes"]


def test_git_source_without_auth_or_shallow() -> None:
    env = env_of(fetch_of(workspace({"git": {"url": "https://h/r.git", "ref": "main"}})))
    assert set(env) == {"GIT_URL", "GIT_REVISION", "GIT_DIR", "PULUMI_ENV"}
    assert env["GIT_DIR"]["value"] == ""


def test_flux_source_and_untar_limit_from_options() -> None:
    ws = workspace({"flux": {"url": "http://src/a.tgz", "digest": "sha256:ff", "dir": "p"}})
    fetch = fetch_of(ws)
    assert fetch["args"] == [
        "/share/agent",
        "init",
        "-t",
        "/share/source",
        "--workspace-dir",
        "/share/workspace",
    ]
    env = env_of(fetch)
    assert (env["FLUX_URL"]["value"], env["FLUX_DIGEST"]["value"], env["FLUX_DIR"]["value"]) == (
        "http://src/a.tgz",
        "sha256:ff",
        "p",
    )
    assert "FLUX_MAX_UNTAR_SIZE_BYTES" not in env
    options = ControllerOptions(
        agent_image="example/agent:v1", agent_image_pull_policy="Always", flux_max_untar_size_bytes=1024
    )
    assert env_of(fetch_of(ws, options))["FLUX_MAX_UNTAR_SIZE_BYTES"]["value"] == "1024"


def test_local_source_links_the_directory() -> None:
    fetch = fetch_of(workspace({"local": {"dir": "/app/prog"}}))
    assert fetch["args"] == ["/bin/busybox", "ln", "-sfn", "/app/prog", "/share/workspace"]
    assert env_of(fetch)["LOCAL_DIR"]["value"] == "/app/prog"


def test_project_info_writes_a_minimal_project() -> None:
    fetch = fetch_of(workspace({"projectInfo": {"name": "proj", "runtime": "yaml"}}))
    assert fetch["args"] == ["/share/agent", "init", "-t", "/share/workspace"]
    env = env_of(fetch)
    assert env["PROJECT_NAME"]["value"] == "proj"
    assert env["PROJECT_RUNTIME"]["value"] == "yaml"


def test_restricted_profile_applies_to_fetch() -> None:
    fetch = fetch_of(workspace({"git": {"url": "https://git.example/r.git"}}))
    assert fetch["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": RESTRICTED_CAPS}
