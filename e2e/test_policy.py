"""Policy packs (issue 43) on the node with the real engine: a TypeScript pack and a Python pack from a
git repository of their own, as a platform team keeps them, with neither ``node_modules`` nor a
virtualenv committed: the workspace image's ``@pulumi/policy``, TypeScript and ts-node (/node_modules)
and ``/opt/pulumi/policy`` run them (docs/policy.md). The program comes from git too, pinned by commit.

One Stack names the TypeScript pack and references a WorkspaceTemplate that enforces the Python pack
(the namespace's shared settings: the Stack does not name that pack). Its program breaks both packs'
mandatory policy: nothing is created, the Stack is Stalled ``PolicyViolation`` naming the pack, the
policy and the resource, with a Warning Event per violated policy, ``kubectl pko why`` and the
``pko_policy_violations_total`` metric saying so. Its program fixed in git (the Stack moved to the
new commit), it is Ready, the packs' advisory policy reported as Warning Events. Beside it, a Stack
whose TypeScript pack has a type error fails ``PolicyPackFailed`` in tsc's words, not an engine exit
status.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dulwich.repo import Repo

from pko.devtools.gitserver import git_commit, serve_git

from .conftest import NODE_IP, Kube
from .stacks import gone, metrics, ready, stack

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.pko_only("policy packs are a pko extension (issue 43)"),
]

PLUGIN = Path(sys.executable).with_name("kubectl-pko")
GUARDED, BROKEN, TEMPLATE = "policed", "policed-broken", "platform"
URN = "urn:pulumi:dev::policed::kubernetes:core/v1:ConfigMap::settings"
MANDATORY, ADVISORY = "no-forbidden-greeting", "configmaps-name-a-team"
TS, PY = "pko-e2e-greetings", "pko-e2e-greetings-py"  # the packs' own names (PolicyPack)

APP = """\
name: policed
runtime: yaml
resources:
  settings:
    type: kubernetes:core/v1:ConfigMap
    properties:
      metadata:
        name: policed-settings
      data:
        greeting: {greeting}
outputs:
  greeting: ${{settings.data.greeting}}
"""
# The TypeScript pack: typed with @pulumi/policy's own types, type-checked (strict) and run by the
# image's TypeScript and ts-node, as a TypeScript program is.
TS_PACK = f"""\
import {{ PolicyPack, ReportViolation, ResourceValidationArgs }} from "@pulumi/policy";

// What the policies read of a ConfigMap.
interface ConfigMapProps {{
    metadata?: {{ labels?: Record<string, string> }};
    data?: Record<string, string>;
}}

function configMap(args: ResourceValidationArgs): ConfigMapProps | undefined {{
    return args.type === "kubernetes:core/v1:ConfigMap" ? (args.props as ConfigMapProps) : undefined;
}}

new PolicyPack("{TS}", {{
    policies: [
        {{
            name: "{MANDATORY}",
            description: "No ConfigMap may greet with 'forbidden'.",
            enforcementLevel: "mandatory",
            validateResource: (args: ResourceValidationArgs, reportViolation: ReportViolation): void => {{
                if (configMap(args)?.data?.greeting === "forbidden") {{
                    reportViolation("this ConfigMap's greeting is forbidden");
                }}
            }},
        }},
        {{
            name: "{ADVISORY}",
            description: "A ConfigMap should carry a team label.",
            enforcementLevel: "advisory",
            validateResource: (args: ResourceValidationArgs, reportViolation: ReportViolation): void => {{
                const props = configMap(args);
                if (props && !props.metadata?.labels?.team) {{
                    reportViolation("no team label");
                }}
            }},
        }},
    ],
}});
"""
# The broken pack: the TypeScript pack with a type error, which tsc reports before any policy runs.
MISTYPED = 'const limit: number = "forbidden";\n'
TSCONFIG = b"""\
{
    "compilerOptions": {
        "strict": true,
        "target": "es2016",
        "module": "commonjs",
        "moduleResolution": "node",
        "noImplicitReturns": true,
        "forceConsistentCasingInFileNames": true
    },
    "files": ["index.ts"]
}
"""
PY_PACK = f"""\
from pulumi_policy import EnforcementLevel, PolicyPack, ResourceValidationPolicy


def is_config_map(args):
    return args.resource_type == "kubernetes:core/v1:ConfigMap"


def no_forbidden_greeting(args, report_violation):
    if is_config_map(args) and (args.props.get("data") or {{}}).get("greeting") == "forbidden":
        report_violation("this ConfigMap's greeting is forbidden")


def names_a_team(args, report_violation):
    if is_config_map(args) and not ((args.props.get("metadata") or {{}}).get("labels") or {{}}).get("team"):
        report_violation("no team label")


PolicyPack("{PY}", policies=[
    ResourceValidationPolicy(
        name="{MANDATORY}",
        description="No ConfigMap may greet with 'forbidden'.",
        enforcement_level=EnforcementLevel.MANDATORY,
        validate=no_forbidden_greeting,
    ),
    ResourceValidationPolicy(
        name="{ADVISORY}",
        description="A ConfigMap should carry a team label.",
        enforcement_level=EnforcementLevel.ADVISORY,
        validate=names_a_team,
    ),
])
"""
# The platform team's repository: each pack as `pulumi policy new` lays it out, minus what it installs.
PACKS = {
    "packs/ts/PulumiPolicy.yaml": b"runtime: nodejs\ndescription: greetings, in TypeScript\n",
    "packs/ts/package.json": f'{{"name": "{TS}", "version": "0.1.0"}}\n'.encode(),
    "packs/ts/tsconfig.json": TSCONFIG,
    "packs/ts/index.ts": TS_PACK.encode(),
    "packs/py/PulumiPolicy.yaml": b"runtime: python\ndescription: greetings, in Python\nversion: 0.2.0\n",
    "packs/py/__main__.py": PY_PACK.encode(),
    "packs/broken/PulumiPolicy.yaml": b"runtime: nodejs\ndescription: a pack that does not compile\n",
    "packs/broken/package.json": b'{"name": "broken", "version": "0.1.0"}\n',
    "packs/broken/tsconfig.json": TSCONFIG,
    "packs/broken/index.ts": (TS_PACK + MISTYPED).encode(),
}


def _pack(name: str, path: str, url: str) -> str:
    return f"    - name: {name}\n      path: {path}\n      git: {{url: '{url}', branch: main}}\n"


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Repo, str]]:
    """The program's repository (its URL and the repository) and the packs' (its URL), both served on
    the node's own address, which the operator's branch lookup and the workspace pods reach."""
    root = tmp_path_factory.mktemp("policy")
    app = Repo.init_bare(str(root / "app.git"), mkdir=True)
    git_commit(app, {"app/Pulumi.yaml": APP.format(greeting="forbidden").encode()}, b"greet: forbidden")
    packs = Repo.init_bare(str(root / "packs.git"), mkdir=True)
    git_commit(packs, PACKS, b"the greetings packs")
    for repo in (app, packs):
        repo.refs.set_symbolic_ref(b"HEAD", b"refs/heads/main")
    with (
        serve_git(app, "/app.git", host=NODE_IP) as app_url,
        serve_git(packs, "/packs.git", host=NODE_IP) as packs_url,
    ):
        yield app_url, app, packs_url


def _manifests(app_url: str, commit: str, packs_url: str) -> str:
    template = (
        f"apiVersion: auto.pulumi.com/v1alpha1\nkind: WorkspaceTemplate\nmetadata:\n  name: {TEMPLATE}\n"
        f"spec:\n  policyPacks:\n{_pack('greetings-py', 'packs/py', packs_url)}"
    )
    source = f"projectRepo: {app_url}\n  commit: {commit}\n  repoDir: app\n"
    guarded = f"{source}  workspaceTemplateRef:\n    name: {TEMPLATE}\n  policyPacks:\n"
    guarded += _pack("greetings", "packs/ts", packs_url)
    broken = f"{source}  policyPacks:\n{_pack('broken', 'packs/broken', packs_url)}"
    return "---\n".join([template, stack(GUARDED, guarded.rstrip()), stack(BROKEN, broken.rstrip())])


def _warnings(k: Kube, name: str) -> list[str]:
    events = k.json(
        "get", "events", "--field-selector", f"involvedObject.kind=Stack,involvedObject.name={name}"
    )
    return [
        e["message"] for e in events["items"] if e["reason"] == "PolicyViolation" and e["type"] == "Warning"
    ]


def _event(k: Kube, name: str, *said: str) -> str:
    """The Stack's PolicyViolation Warning Event that says all of ``said``."""

    def probe() -> str | None:
        return next((m for m in _warnings(k, name) if all(s in m for s in said)), None)

    found: str = k.until(f"a PolicyViolation Event of {name} saying {said}", probe, 60)
    return found


def _stalled(k: Kube, name: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        s = k.get("stack", name)
        return s if k.condition(s, "Stalled").get("reason") == "PolicyViolation" else None

    result: dict[str, Any] = k.until(f"stack {name} Stalled PolicyViolation", probe, 420)
    return result


def _update(k: Kube, s: dict[str, Any]) -> dict[str, Any]:
    update = k.get("update", s["status"]["lastUpdate"]["name"])
    assert update is not None
    return update


def test_packs_from_git_refuse_a_program_until_it_is_fixed_and_a_broken_pack_fails_in_its_own_words(
    kube: Kube, repos: tuple[str, Repo, str]
) -> None:
    k, (app_url, app, packs_url) = kube, repos
    first = app.refs[b"refs/heads/main"].decode()
    k.apply(_manifests(app_url, first, packs_url))

    # A mandatory violation of either pack: nothing created, Stalled naming the pack, policy and resource.
    s = _stalled(k, GUARDED)
    message = k.condition(s, "Stalled")["message"]
    for said in (f"{TS}@0.1.0", MANDATORY, URN, "this ConfigMap's greeting is forbidden"):
        assert said in message, message
    assert k.get("configmap", "policed-settings") is None, "created although a mandatory policy refused it"
    assert s["status"]["lastFailure"]["reason"] == "PolicyViolation", s["status"]["lastFailure"]
    update = _update(k, s)
    assert k.condition(update, "Failed")["reason"] == "PolicyViolation", update["status"]
    listed = {
        (v["policyPack"], v["policy"], v["enforcementLevel"], v["urn"])
        for v in update["status"]["policyViolations"]
    }
    assert {(TS, MANDATORY, "mandatory", URN), (PY, MANDATORY, "mandatory", URN)} <= listed, listed
    # The Python pack is the template's: the Stack does not name it, and cannot drop it.
    enforced = update["metadata"]["annotations"]["pulumi.com/enforced-policy-packs"]
    assert enforced == f'{{"greetings-py": "default/{TEMPLATE}"}}', enforced
    _event(k, GUARDED, f"policy {MANDATORY} of pack {TS}@0.1.0 (mandatory", URN)
    _event(k, GUARDED, f"policy {MANDATORY} of pack {PY}@0.2.0 (mandatory", URN)
    why = subprocess.run(
        [str(PLUGIN), "why", GUARDED], capture_output=True, text=True, env=k.env, timeout=60, check=False
    )
    assert MANDATORY in why.stdout and "PolicyViolation" in why.stdout, why.stdout + why.stderr
    labels = {f'pack="{TS}"', f'policy="{MANDATORY}"', 'enforcement="mandatory"'}

    def counted() -> bool:
        samples = [
            line for line in metrics(k).splitlines() if line.startswith("pko_policy_violations_total{")
        ]
        return any(all(label in line for label in labels) for line in samples)

    k.until(f"pko_policy_violations_total with {labels}", counted, 60)

    # The pack that does not compile: its own failure, in tsc's words, and nothing run.
    def pack_failed() -> dict[str, Any] | None:
        b = k.get("stack", BROKEN)
        failure = ((b or {}).get("status") or {}).get("lastFailure") or {}
        return b if failure.get("reason") == "PolicyPackFailed" else None

    b = k.until(f"stack {BROKEN} failed PolicyPackFailed", pack_failed, 300)
    failure = b["status"]["lastFailure"]["message"]
    line = len(TS_PACK.splitlines()) + 1
    said = f"index.ts({line},7): error TS2322: Type 'string' is not assignable to type 'number'."
    assert "policy pack 'broken'" in failure and "Unable to compile TypeScript" in failure, failure
    assert said in failure, failure
    assert k.condition(b, "Ready").get("status") == "False", b["status"]

    # The program fixed in git, the Stack moved to that commit: Ready, the advisory policy a Warning.
    fixed = git_commit(app, {"app/Pulumi.yaml": APP.format(greeting="hello").encode()}, b"greet: hello")
    k.run("patch", "stack", GUARDED, "--type=merge", "-p", f'{{"spec": {{"commit": "{fixed}"}}}}')
    s = ready(k, GUARDED, 300)
    assert s["status"]["outputs"] == {"greeting": "hello"}, s["status"]
    assert s["status"]["lastUpdate"]["lastSuccessfulCommit"] == fixed
    update = _update(k, s)
    listed = {
        (v["policyPack"], v["policy"], v["enforcementLevel"]) for v in update["status"]["policyViolations"]
    }
    assert listed == {(TS, ADVISORY, "advisory"), (PY, ADVISORY, "advisory")}, listed
    _event(k, GUARDED, f"policy {ADVISORY} of pack {TS}@0.1.0 (advisory", "no team label")
    _event(k, GUARDED, f"policy {ADVISORY} of pack {PY}@0.2.0 (advisory", "no team label")

    for name in (GUARDED, BROKEN):
        k.run("delete", "stack", name, "--wait=false")
    for name in (GUARDED, BROKEN):
        gone(k, "stack", name)
    gone(k, "configmap", "policed-settings")
    k.run("delete", "workspacetemplate", TEMPLATE)
