"""The Stack reconciler alone (see stackenv.py): Stacks the schema accepts but the operator cannot run end
with a clear reason and stay quiet."""

from __future__ import annotations

import asyncio

from pko.devtools.kstatus import kstatus
from pko.machinery.resource import Obj, ResourceClient

from .stackenv import CRDS, SECRET_RECHECK, Env, remove_flux_crd, stack_env

env = stack_env()


# --- schema-valid but wrong ------------------------------------------------------------------

# Mistakes the Stack CRD's CEL rules refuse on create (two sources, commit and branch, projectRepo
# without either, a ref whose member is not the one its type names) never reach the operator:
# test/api/test_cel_rules.py has them, and test/api/test_validation.py their Python twins.
WRONG: list[tuple[str, Obj, str, str, str]] = [
    ("no-source", {}, "Stalled", "SpecInvalid", "one of projectRepo, fluxSource or programRef is required"),
    (
        "cross-ns",
        {
            "programRef": {"name": "p"},
            "envRefs": {"T": {"type": "Secret", "secret": {"namespace": "other", "name": "s", "key": "k"}}},
        },
        "Stalled",
        "SpecInvalid",
        "cross-namespace refs are not allowed",
    ),
    (
        "env-ref",
        {"programRef": {"name": "p"}, "envRefs": {"T": {"type": "Env", "env": {"name": "HOME"}}}},
        "Stalled",
        "SpecInvalid",
        'ref type "Env" is deprecated',
    ),
    (
        "fs-ref",
        {
            "programRef": {"name": "p"},
            "secretsRef": {"k": {"type": "FS", "filesystem": {"path": "/etc/passwd"}}},
        },
        "Stalled",
        "SpecInvalid",
        'ref type "FS" is deprecated',
    ),
    (
        "missing-program",
        {"programRef": {"name": "nope"}},
        "Stalled",
        "SourceUnavailable",
        "unable to retrieve program for stack",
    ),
    (
        "no-artifact",
        {"programRef": {"name": "bare"}},
        "Stalled",
        "SourceUnavailable",
        "Program has no artifact",
    ),
    (
        "flux-absent",
        {
            "fluxSource": {
                "sourceRef": {
                    "apiVersion": "source.toolkit.fluxcd.io/v1",
                    "kind": "GitRepository",
                    "name": "g",
                }
            }
        },
        "Stalled",
        "SourceUnavailable",
        "are Flux's CRDs installed?",
    ),
    (
        "flux-kind",
        {"fluxSource": {"sourceRef": {"apiVersion": "example.com/v1", "kind": "Thing", "name": "g"}}},
        "Stalled",
        "SpecInvalid",
        "unsupported Flux source",
    ),
    (
        "flux-version",
        {
            "fluxSource": {
                "sourceRef": {"apiVersion": "gitrepositories", "kind": "GitRepository", "name": "g"}
            }
        },
        "Stalled",
        "SpecInvalid",
        "must be <group>/<version>",
    ),
    (
        "git-secret",
        {"projectRepo": "https://127.0.0.1:9/r.git", "branch": "main", "gitAuthSecret": "nope"},
        "Stalled",
        "SpecInvalid",
        'secrets "nope" not found',
    ),
    (
        "git-key",
        {
            "projectRepo": "https://127.0.0.1:9/r.git",
            "branch": "main",
            "gitAuth": {"accessToken": {"type": "Secret", "secret": {"name": "gitcreds", "key": "nokey"}}},
        },
        "Stalled",
        "SpecInvalid",
        'no key "nokey"',
    ),
    (
        "git-literal-auth",
        {
            "projectRepo": "http://127.0.0.1:9/r.git",
            "branch": "main",
            "gitAuth": {"accessToken": {"type": "Literal", "literal": {"value": "t"}}},
        },
        "Stalled",
        "SpecInvalid",
        "no longer supported in v2",
    ),
    (
        # refused before any lookup or Workspace: no 30 s SourceUnavailable loop, no failing fetch
        "bad-scheme",
        {"projectRepo": "hhtp://github.com/x/y.git", "branch": "main"},
        "Stalled",
        "SpecInvalid",
        "spec.projectRepo: invalid URL scheme: hhtp",
    ),
    (
        "unreachable",
        {"projectRepo": "http://127.0.0.1:9/r.git", "branch": "main"},
        "Stalled",
        "SourceUnavailable",
        "listing http://127.0.0.1:9/r.git",
    ),
    (
        "dup-config",
        {"programRef": {"name": "p"}, "config": {"k": "1"}, "secrets": {"k": "2"}},
        "Stalled",
        "SpecInvalid",
        "key is also set in spec.config",
    ),
    (
        "self-prereq",
        {"programRef": {"name": "p"}, "prerequisites": [{"name": "self-prereq"}]},
        "Stalled",
        "SpecInvalid",
        "cannot be its own prerequisite",
    ),
    (
        "token-conflict",
        {
            "programRef": {"name": "p"},
            "accessTokenSecret": "t",
            "envRefs": {"PULUMI_ACCESS_TOKEN": {"type": "Literal", "literal": {"value": "x"}}},
        },
        "Stalled",
        "SpecInvalid",
        "conflicts with spec.accessTokenSecret",
    ),
    (
        "missing-prereq",
        {"programRef": {"name": "p"}, "prerequisites": [{"name": "ghost"}, {"name": "ghost2"}]},
        "Reconciling",
        "PrerequisiteNotSatisfied",
        "multiple prerequisites were not satisfied ghost, ghost2",
    ),
]


async def test_schema_valid_but_wrong_stacks_end_with_a_clear_reason_and_stay_quiet(env: Env) -> None:
    # flux-absent needs Flux's kind not served: a module before this one on the same apiserver may have
    # served it (each removes it when it ends; this waits until that removal is done).
    await remove_flux_crd(ResourceClient(env.stacks.api, CRDS))
    await env.program("p")
    await env.programs.create(
        {
            "apiVersion": "pulumi.com/v1",
            "kind": "Program",
            "metadata": {"name": "bare", "namespace": env.ns},
            "program": {"outputs": {"x": 1}},
        }
    )
    await env.secrets.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "gitcreds", "namespace": env.ns},
            "stringData": {"token": "t"},
        }
    )
    for name, spec, _, _, _ in WRONG:
        await env.create_stack(name, spec)
    for name, _, type_, reason, text in WRONG:
        conditions = await env.wait_condition(name, type_, reason)
        assert text in conditions[type_][2], (name, conditions[type_][2])
        assert ("Stalled" in conditions) != ("Reconciling" in conditions), name
        # Flux's health checks and kpt (kstatus) see each as a failure or still in progress, never done.
        expected = "Failed" if type_ == "Stalled" else "InProgress"
        assert kstatus(await env.stack(name)) == expected, name
    versions = {name: (await env.stack(name))["metadata"]["resourceVersion"] for name, *_ in WRONG}
    reconciles = env.reconciles()
    await asyncio.sleep(60)  # a minute of watching: no write, no Update, no hot loop
    for name, *_ in WRONG:
        assert (await env.stack(name))["metadata"]["resourceVersion"] == versions[name], (
            f"{name} kept being written"
        )
        assert await env.updates_of(name) == []
    assert await env.get(env.workspaces, "bad-scheme") is None
    # Not a hot loop: unavailable sources are looked at again every 30 s and missing Secrets every
    # SECRET_RECHECK (4 s in this module), nothing else: at most one reconcile per 4 s per Stack.
    assert env.reconciles() - reconciles <= len(WRONG) * (60 / SECRET_RECHECK + 1)
