"""The operator's Secret and ConfigMap rights, against the apiserver (issue 46, least privilege).

The operator runs as its ServiceAccount bound to config/rbac as shipped (the cluster-wide install).
A Stack that names Secrets and a ConfigMap every way it can (gitAuth's basic auth, which the operator
reads itself to resolve the branch head and the agent reads again to fetch; envRefs from a Secret
and a ConfigMap and a secretsRef, which reach the workspace pod through the kubelet) deploys with
those rights only. The same identity may not list or watch Secrets or ConfigMaps, anywhere, and
caches neither kind. It may GET a Secret by name in any namespace: RBAC cannot narrow ``get`` to
the Secrets Stacks reference, and docs/security.md says so (the namespaced install confines it to
the watched namespaces: test_namespaced).

(A secretsRef Secret is a file the pod mounts: the play-kubelet writes the volume but does not map
the path the agent reads from its config, so that one is checked on the StatefulSet, not run.)
"""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from dulwich.repo import Repo
from dulwich.server import DictBackend
from dulwich.web import make_wsgi_chain
from kubernetes_asyncio.client import ApiException

from pko.devtools.gitserver import git_commit, serve_wsgi
from pko.machinery.resource import CONFIGMAPS, SECRETS, STATEFULSETS, ResourceClient

from .conftest import operator_env
from .test_stack import Env as StackEnv

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

# The loopback git server speaks plain HTTP: the credentials' transport is another module's
# subject (test_stack_insecuretransport*), not this module's.
OPERATOR_OPTIONS = {"allow_insecure_git_credentials": True}

Obj = dict[str, Any]
USER, PASSWORD = "deployer", "hunter2-not-in-a-log"
PROGRAM = (
    "name: guarded\nruntime: yaml\nresources:\n  echo:\n    type: test:index:Echo\n"
    "    properties:\n      value: hello\noutputs:\n  greeting: ${echo.value}\n"
)


class Env(StackEnv):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.secrets = ResourceClient(self.api, SECRETS, self.ns)
        self.configmaps = ResourceClient(self.api, CONFIGMAPS, self.ns)


env = operator_env(Env)


def _basic_auth(app: Any) -> Any:
    """``app`` behind HTTP basic auth: USER and PASSWORD, or 401."""
    expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()

    def wrapped(environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("HTTP_AUTHORIZATION") != expected:
            start_response("401 Unauthorized", [("WWW-Authenticate", 'Basic realm="git"')])
            return [b"unauthorized\n"]
        return app(environ, start_response)

    return wrapped


@pytest.fixture(scope="module")
def private_git(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A repository only USER with PASSWORD may read: its URL."""
    repo = Repo.init_bare(str(tmp_path_factory.mktemp("private-git")))
    git_commit(repo, {"app/Pulumi.yaml": PROGRAM.encode()}, b"guarded")
    repo.refs.set_symbolic_ref(b"HEAD", b"refs/heads/main")
    with serve_wsgi(_basic_auth(make_wsgi_chain(DictBackend({"/repo.git": repo})))) as base:
        yield base + "/repo.git"


def _secret_ref(name: str, key: str) -> Obj:
    return {"type": "Secret", "secret": {"name": name, "key": key}}


def operator_user(env: Env) -> str:
    return f"system:serviceaccount:{env.operator.namespace}:{env.operator.service_account}"


def can_i(env: Env, *args: str) -> bool:
    """``kubectl auth can-i ARGS --as=<the operator's account>`` as the cluster admin (exit 0: yes)."""
    proc = subprocess.run(
        [
            "kubectl",
            f"--kubeconfig={env.operator.cluster.kubeconfig}",
            "auth",
            "can-i",
            *args,
            f"--as={operator_user(env)}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.stdout.strip() in ("yes", "no"), proc.stderr
    return proc.returncode == 0


async def test_a_stack_naming_secrets_and_configmaps_deploys_with_get_by_name_only(
    env: Env, private_git: str
) -> None:
    await env.secrets.create(
        {
            "metadata": {"name": "git-basic"},
            "stringData": {"username": USER, "password": PASSWORD},
        }
    )
    await env.secrets.create({"metadata": {"name": "app-secrets"}, "stringData": {"token": "t0ken"}})
    await env.configmaps.create({"metadata": {"name": "app-config"}, "data": {"region": "eu-west-1"}})
    await env.create_stack(
        "guarded",
        {
            "projectRepo": private_git,
            "branch": "main",
            "repoDir": "app",
            "gitAuth": {
                "basicAuth": {
                    "userName": _secret_ref("git-basic", "username"),
                    "password": _secret_ref("git-basic", "password"),
                }
            },
            "envRefs": {
                "APP_TOKEN": _secret_ref("app-secrets", "token"),
                "APP_REGION": {"type": "ConfigMap", "configMap": {"name": "app-config", "key": "region"}},
            },
        },
    )
    stack = await env.condition("guarded", "Ready", "ProcessingCompleted")
    assert stack["status"]["outputs"] == {"greeting": "hello"}

    # The env of the pod names the Secret and the ConfigMap: the kubelet resolved them, not the operator.
    statefulsets = ResourceClient(env.api, STATEFULSETS, env.ns)
    sts = next(s for s in (await statefulsets.list()).items if s["metadata"]["name"].startswith("guarded"))
    pod = sts["spec"]["template"]["spec"]
    env_vars = {e["name"]: e.get("valueFrom") for c in pod["containers"] for e in c.get("env") or []}
    assert env_vars["APP_TOKEN"] == {"secretKeyRef": {"name": "app-secrets", "key": "token"}}
    assert env_vars["APP_REGION"] == {"configMapKeyRef": {"name": "app-config", "key": "region"}}

    # Neither kind is cached: no informer of the running operator lists or watches them.
    manager = env.operator.manager
    assert manager is not None
    cached = {informer.resource.name for informer in manager.factory.informers}
    assert not cached & {"secrets", "configmaps"}, cached


async def test_a_secrets_ref_secret_is_a_volume_of_the_pod_not_a_read_of_the_operator(env: Env) -> None:
    await env.secrets.create({"metadata": {"name": "db"}, "stringData": {"password": "pw"}})
    await env.create_program("plain", {"outputs": {"greeting": "hi"}})
    await env.create_stack(
        "mounted",
        {"programRef": {"name": "plain"}, "secretsRef": {"dbPassword": _secret_ref("db", "password")}},
    )
    statefulsets = ResourceClient(env.api, STATEFULSETS, env.ns)

    async def applied() -> Obj | None:
        items = (await statefulsets.list()).items
        return next((s for s in items if s["metadata"]["name"].startswith("mounted")), None)

    sts = await env.stack_until("mounted", "the StatefulSet of mounted", applied, within=120)
    volumes = sts["spec"]["template"]["spec"].get("volumes") or []
    assert {v["name"]: (v.get("secret") or {}).get("secretName") for v in volumes}["secret-db"] == "db"


async def test_the_operator_may_not_list_or_watch_secrets_or_configmaps(env: Env) -> None:
    api = env.operator.api
    assert api is not None
    refused = [
        lambda: ResourceClient(api, SECRETS).list(),  # every namespace
        lambda: ResourceClient(api, SECRETS, env.ns).list(),
        lambda: ResourceClient(api, CONFIGMAPS).list(),
        lambda: ResourceClient(api, CONFIGMAPS, env.ns).list(),
    ]
    for request in refused:
        with pytest.raises(ApiException) as denied:
            await request()
        assert denied.value.status == 403

    # What `kubectl auth can-i` answers for the operator's account (a SubjectAccessReview).
    for verb in ("list", "watch"):
        for kind in ("secrets", "configmaps"):
            assert not can_i(env, verb, kind, "--all-namespaces")
            assert not can_i(env, verb, kind, "-n", env.ns)
    assert not can_i(env, "delete", "secrets", "-n", env.ns)
    assert can_i(env, "create", "secrets", "-n", env.ns)  # the outputs Secret of each Update


async def test_the_cluster_wide_install_may_still_get_a_secret_by_name_anywhere(env: Env) -> None:
    """The limit docs/security.md states: ``get`` cannot be narrowed to referenced Secrets."""
    api = env.operator.api
    assert api is not None
    await env.secrets.create({"metadata": {"name": "bystander"}, "stringData": {"k": "v"}})
    got = await ResourceClient(api, SECRETS, env.ns).get_or_none("bystander")
    assert got is not None
    assert can_i(env, "get", "secrets", "-n", "kube-system")
