"""Cross-field rules (pko.api.validation): each rule accepts the good case and names the bad field."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pko.api.stack import NAME_TOO_LONG_MESSAGE
from pko.api.validation import (
    FieldError,
    deprecation_warnings,
    format_errors,
    git_url_error,
    parse_program,
    parse_stack,
    parse_update,
    parse_workspace,
)

from pko.devtools.stacks import stack as build_stack

from .manifests import full_program, full_update, full_workspace

GIT = {"projectRepo": "https://github.com/pulumi/examples", "branch": "master"}
SECRET_REF = {"type": "Secret", "secret": {"name": "s", "key": "k"}}


def stack_obj(spec: dict[str, Any], *, name: str = "my-stack", namespace: str = "ns") -> dict[str, Any]:
    return build_stack(name, namespace, **{"stack": "org/project/dev", **spec})


def stack_errors(spec: dict[str, Any], **kw: Any) -> list[FieldError]:
    stack, errors = parse_stack(stack_obj(spec, **kw))
    assert stack is not None
    return errors


def paths(errors: list[FieldError]) -> list[str]:
    return [e.path for e in errors]


# --- seed manifests are valid ----------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        # the 2.0 announcement walkthrough (Flux source)
        {
            "serviceAccountName": "random-yaml",
            "fluxSource": {
                "sourceRef": {
                    "apiVersion": "source.toolkit.fluxcd.io/v1",
                    "kind": "GitRepository",
                    "name": "ex",
                },
                "dir": "random-yaml/",
            },
            "refresh": True,
            "continueResyncOnCommitMatch": True,
            "resyncFrequencySeconds": 300,
            "destroyOnFinalize": True,
            "envRefs": {
                "PULUMI_ACCESS_TOKEN": {"type": "Secret", "secret": {"name": "pulumi-api-secret", "key": "t"}}
            },
        },
        # the docs' Program example
        {
            "serviceAccountName": "pulumi",
            "programRef": {"name": "staticwebsite"},
            "config": {"aws:region": "x"},
        },
        # the docs' git example, commit pinned
        {"projectRepo": "https://github.com/pulumi/examples", "repoDir": "k/", "commit": "03658b55"},
        # the 1.0-era manifest with deprecated fields
        {
            "accessTokenSecret": "t",
            "projectRepo": "https://x",
            "commit": "2b08897",
            "envSecrets": ["aws-creds"],
        },
        # no source: the program comes from the workspace template (local source or an init container)
        {"workspaceTemplate": {"spec": {"local": {"dir": "/src"}}}},
        {"workspaceTemplate": {"spec": {"podTemplate": {"spec": {"initContainers": [{"name": "gen"}]}}}}},
    ],
)
def test_documented_stacks_have_no_errors(spec: dict[str, Any]) -> None:
    assert stack_errors(spec) == []


# --- Stack rules -----------------------------------------------------------------------------


def test_stack_name_longer_than_42_characters_is_invalid() -> None:
    assert paths(stack_errors(GIT, name="a" * 43)) == ["metadata.name"]
    assert stack_errors(GIT, name="a" * 42) == []


def test_exactly_one_source_is_required() -> None:
    errors = stack_errors({})
    assert paths(errors) == ["spec"]
    assert "one of projectRepo, fluxSource or programRef is required" in errors[0].message


@pytest.mark.parametrize(
    ("spec", "found"),
    [
        ({**GIT, "programRef": {"name": "p"}}, "projectRepo, programRef"),
        (
            {
                "programRef": {"name": "p"},
                "fluxSource": {"sourceRef": {"apiVersion": "a/v1", "kind": "K", "name": "n"}},
            },
            "fluxSource, programRef",
        ),
        ({"branch": "main", "programRef": {"name": "p"}}, "projectRepo, programRef"),  # any git field counts
    ],
)
def test_sources_are_mutually_exclusive(spec: dict[str, Any], found: str) -> None:
    errors = [e for e in stack_errors(spec) if e.path == "spec"]
    assert len(errors) == 1 and f"found {found}" in errors[0].message


def test_commit_and_branch_are_exclusive() -> None:
    errors = stack_errors({**GIT, "commit": "abc"})
    assert errors == [FieldError("spec.branch", "mutually exclusive with spec.commit")]


def test_project_repo_needs_a_commit_or_branch() -> None:
    errors = stack_errors({"projectRepo": "https://x"})
    assert errors == [FieldError("spec", "one of commit or branch is required with projectRepo")]


GOOD_GIT_URLS = [
    "https://github.com/pulumi/examples",
    "https://user:token@github.com/pulumi/examples.git",
    "HTTPS://github.com/pulumi/examples.git",
    "http://127.0.0.1:9/r.git",
    "ssh://git@github.com/pulumi/examples.git",
    "ssh://git@github.com:2222/pulumi/examples.git",
    "git+ssh://git@github.com/pulumi/examples.git",
    "git://example.com/repo.git",
    "file:///srv/git/repo.git",
    "git@github.com:pulumi/examples.git",
    "github.com:pulumi/examples.git",  # scp-like without a user: git accepts it
    "[::1]:repo.git",
    "/srv/git/repo.git",  # a local path: the fetch container needs GIT_ALLOW_LOCAL
    " https://github.com/pulumi/examples ",
    "git@github.com:pulumi/examples::x",  # "::" inside an scp-like path is no remote helper
    "https://github.com/pulumi/examples::x",
]


@pytest.mark.parametrize("url", GOOD_GIT_URLS)
def test_git_urls_git_can_clone_from_are_accepted(url: str) -> None:
    assert git_url_error(url) is None
    assert stack_errors({"projectRepo": url, "branch": "main"}) == []


BAD_GIT_URLS = [
    ("hhtp://github.com/pulumi/examples.git", "invalid URL scheme: hhtp (use https://, http://"),
    ("ftp://example.com/repo.git", "invalid URL scheme: ftp"),
    ("https:///pulumi/examples", "a https:// URL needs a host"),
    ("ssh://", "a ssh:// URL needs a host"),
    ("https://[::1/x", "invalid URL"),
    ("git@:pulumi/examples.git", "an scp-like URL (user@host:path) needs a host"),
    ("github.com/pulumi/examples", "not a git URL (use https://"),
    ("examples", "not a git URL"),
    # git's remote helpers (<transport>::<address>), checked before the scp-like rule: not host "ext"
    ("ext::sh -c touch% pwned", "git remote-helper URLs (<transport>::<address>, such as ext:: or fd::)"),
    ("fd::17", "git remote-helper URLs"),
    ("foo::bar", "git remote-helper URLs"),
]


@pytest.mark.parametrize(("url", "message"), BAD_GIT_URLS)
def test_git_urls_git_cannot_clone_from_are_refused_naming_the_field(url: str, message: str) -> None:
    problem = git_url_error(url)
    assert problem is not None and problem.startswith(message), problem
    errors = stack_errors({"projectRepo": url, "branch": "main"})
    assert errors == [FieldError("spec.projectRepo", problem)]


def test_a_refused_git_url_is_not_repeated_in_the_message() -> None:
    # it may carry credentials
    problem = git_url_error("hhtp://user:s3cret@github.com/pulumi/examples.git")
    assert problem is not None and "s3cret" not in problem


@pytest.mark.parametrize("url", [*GOOD_GIT_URLS, *(url for url, _ in BAD_GIT_URLS)])
def test_the_git_url_check_and_the_workspace_fetch_accept_the_same_urls(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator's check (Stalled at once) and the agent's fetch (the init container) draw one line."""
    from pko.agent.errors import UsageError
    from pko.agent.gitfetch import parse_remote

    monkeypatch.setenv("GIT_ALLOW_LOCAL", "true")
    try:
        parse_remote(url.strip())
        fetch_accepts = True
    except UsageError:
        fetch_accepts = False
    assert (git_url_error(url) is None) == fetch_accepts


def test_git_fields_need_project_repo() -> None:
    errors = stack_errors({"branch": "main", "repoDir": "d"})
    assert paths(errors) == ["spec.projectRepo"]
    assert "spec.branch" in errors[0].message and "spec.repoDir" in errors[0].message


def test_git_auth_and_git_auth_secret_are_exclusive() -> None:
    errors = stack_errors({**GIT, "gitAuthSecret": "creds", "gitAuth": {"accessToken": SECRET_REF}})
    assert errors == [FieldError("spec.gitAuth", "mutually exclusive with spec.gitAuthSecret")]


def test_git_auth_needs_a_mode() -> None:
    assert paths(stack_errors({**GIT, "gitAuth": {}})) == ["spec.gitAuth"]


def test_git_auth_with_several_modes_is_accepted_first_one_wins() -> None:
    # docs/stacks.md: "Only one authentication mode will be considered if more than one option is specified"
    assert (
        stack_errors(
            {**GIT, "gitAuth": {"accessToken": SECRET_REF, "sshAuth": {"sshPrivateKey": SECRET_REF}}}
        )
        == []
    )


@pytest.mark.parametrize(
    ("auth", "path"),
    [
        ({"accessToken": {"type": "Literal", "literal": {"value": "t"}}}, "spec.gitAuth.accessToken.type"),
        (
            {"sshAuth": {"sshPrivateKey": {"type": "Env", "env": {"name": "K"}}}},
            "spec.gitAuth.sshAuth.sshPrivateKey.type",
        ),
        (
            {"basicAuth": {"userName": SECRET_REF, "password": {"type": "FS", "filesystem": {"path": "/p"}}}},
            "spec.gitAuth.basicAuth.password.type",
        ),
        (
            {
                "githubApp": {
                    "appID": SECRET_REF,
                    "installationID": SECRET_REF,
                    "privateKey": {"type": "Literal", "literal": {"value": "k"}},
                }
            },
            "spec.gitAuth.githubApp.privateKey.type",
        ),
    ],
)
def test_git_credentials_must_come_from_secrets(auth: dict[str, Any], path: str) -> None:
    errors = stack_errors({**GIT, "gitAuth": auth})
    assert paths(errors) == [path]
    assert "please use a secret reference instead" in errors[0].message


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ({"type": "Secret"}, [("spec.envRefs[X].secret", "required when type is 'Secret'")]),
        (
            {"type": "Literal", "secret": {"name": "s", "key": "k"}},
            [
                ("spec.envRefs[X].literal", "required when type is 'Literal'"),
                ("spec.envRefs[X].secret", "must not be set when type is 'Literal'"),
            ],
        ),
        (
            {"type": "Secret", "secret": {"name": "s", "key": "k"}, "literal": {"value": "v"}},
            [
                ("spec.envRefs[X].literal", "must not be set when type is 'Secret'"),
            ],
        ),
    ],
)
def test_resource_ref_union_member_must_match_type(
    ref: dict[str, Any], expected: list[tuple[str, str]]
) -> None:
    assert stack_errors({**GIT, "envRefs": {"X": ref}}) == [FieldError(p, m) for p, m in expected]


def test_config_map_refs_are_for_env_refs() -> None:
    ref = {"type": "ConfigMap", "configMap": {"name": "settings", "key": "region"}}
    assert stack_errors({**GIT, "envRefs": {"REGION": ref}}) == []
    missing = stack_errors({**GIT, "envRefs": {"REGION": {"type": "ConfigMap"}}})
    assert missing == [FieldError("spec.envRefs[REGION].configMap", "required when type is 'ConfigMap'")]


@pytest.mark.parametrize("kind", ["Env", "FS"])
def test_env_and_fs_refs_are_deprecated_in_v2(kind: str) -> None:
    ref = (
        {"type": "Env", "env": {"name": "HOME"}}
        if kind == "Env"
        else {"type": "FS", "filesystem": {"path": "/x"}}
    )
    errors = stack_errors({**GIT, "secretsRef": {"k": ref}})
    assert errors == [FieldError("spec.secretsRef[k].type", f'ref type "{kind}" is deprecated')]


def test_cross_namespace_secret_refs_are_not_allowed() -> None:
    other = {"type": "Secret", "secret": {"name": "s", "key": "k", "namespace": "elsewhere"}}
    same = {"type": "Secret", "secret": {"name": "s", "key": "k", "namespace": "ns"}}
    errors = stack_errors({**GIT, "envRefs": {"A": other, "B": same}, "gitAuth": {"accessToken": other}})
    assert errors == [
        FieldError("spec.gitAuth.accessToken.secret.namespace", "cross-namespace refs are not allowed"),
        FieldError("spec.envRefs[A].secret.namespace", "cross-namespace refs are not allowed"),
    ]


def test_flux_source_api_version_must_be_group_and_version() -> None:
    flux = {"sourceRef": {"apiVersion": "GitRepository", "kind": "GitRepository", "name": "r"}}
    assert paths(stack_errors({"fluxSource": flux})) == ["spec.fluxSource.sourceRef.apiVersion"]


def test_a_config_key_may_come_from_one_place_only() -> None:
    errors = stack_errors(
        {
            **GIT,
            "config": {"region": "a", "size": "b"},
            "secretsRef": {"region": {"type": "Literal", "literal": {"value": "c"}}},
            "secrets": {"size": "d"},
        }
    )
    assert errors == [
        FieldError("spec.secrets[size]", "key is also set in spec.config"),
        FieldError("spec.secretsRef[region]", "key is also set in spec.config"),
    ]


@pytest.mark.parametrize(
    ("spec", "key", "field"),
    [
        ({"accessTokenSecret": "tok"}, "PULUMI_ACCESS_TOKEN", "spec.accessTokenSecret"),
        ({"backend": "s3://b"}, "PULUMI_BACKEND_URL", "spec.backend"),
    ],
)
def test_env_refs_may_not_repeat_variables_other_fields_set(
    spec: dict[str, Any], key: str, field: str
) -> None:
    errors = stack_errors({**GIT, **spec, "envRefs": {key: SECRET_REF}})
    assert paths(errors) == [f"spec.envRefs[{key}]"] and field in errors[0].message


def test_a_stack_cannot_be_its_own_prerequisite() -> None:
    errors = stack_errors({**GIT, "prerequisites": [{"name": "other"}, {"name": "my-stack"}]})
    assert paths(errors) == ["spec.prerequisites[1].name"]


def test_schema_errors_come_back_as_field_paths_with_map_keys() -> None:
    obj = stack_obj({**GIT, "envRefs": {"my_var": {"type": "Nope"}}, "resyncFrequencySeconds": -1})
    stack, errors = parse_stack(obj)
    assert stack is None
    assert sorted(paths(errors)) == ["spec.envRefs[my_var].type", "spec.resyncFrequencySeconds"]


def test_parse_reports_a_missing_required_field() -> None:
    obj = stack_obj(GIT)
    del obj["spec"]["stack"]
    stack, errors = parse_stack(obj)
    assert stack is None and paths(errors) == ["spec.stack"]


def test_format_errors_is_one_line_for_a_condition_message() -> None:
    errors = stack_errors({**GIT, "commit": "abc"}, name="a" * 43)
    assert format_errors(errors) == (
        f"metadata.name: {NAME_TOO_LONG_MESSAGE}; spec.branch: mutually exclusive with spec.commit"
    )


def test_deprecated_fields_produce_warnings_naming_their_replacement() -> None:
    stack, _ = parse_stack(
        stack_obj(
            {
                **GIT,
                "accessTokenSecret": "t",
                "envs": ["cm"],
                "envSecrets": ["s"],
                "secrets": {"a": "b"},
                "gitAuthSecret": "g",
                "expectNoRefreshChanges": True,
            }
        )
    )
    assert stack is not None
    assert deprecation_warnings(stack.spec) == [
        "spec.accessTokenSecret is deprecated; use spec.envRefs[PULUMI_ACCESS_TOKEN] with a secret ref",
        "spec.envs is deprecated; use spec.envRefs",
        "spec.envSecrets is deprecated; use spec.envRefs",
        "spec.secrets is deprecated; use spec.secretsRef",
        "spec.gitAuthSecret is deprecated; use spec.gitAuth",
        "spec.expectNoRefreshChanges is ignored",
    ]
    current, _ = parse_stack(stack_obj(GIT))
    assert current is not None and deprecation_warnings(current.spec) == []


# --- Workspace rules -------------------------------------------------------------------------


def ws_obj(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "auto.pulumi.com/v1alpha1",
        "kind": "Workspace",
        "metadata": {"name": "w"},
        "spec": spec,
    }


def ws_errors(spec: dict[str, Any]) -> list[FieldError]:
    ws, errors = parse_workspace(ws_obj(spec))
    assert ws is not None
    return errors


def test_minimal_and_typical_workspaces_are_valid() -> None:
    assert ws_errors({}) == []
    assert ws_errors({"git": {"url": "https://x", "ref": "main"}, "stacks": [{"name": "dev"}]}) == []


def test_full_workspace_fixture_reports_only_its_deliberate_conflict() -> None:
    _, errors = parse_workspace(full_workspace())
    assert paths(errors) == ["spec"]  # git, flux, local and projectInfo all set


def test_workspace_sources_are_mutually_exclusive() -> None:
    errors = ws_errors({"git": {"url": "https://x"}, "local": {"dir": "/d"}})
    assert errors == [
        FieldError("spec", "only one of git, flux, local or projectInfo may be set (found git, local)")
    ]


def test_workspace_git_and_flux_need_a_url() -> None:
    assert ws_errors({"git": {"ref": "main"}}) == [FieldError("spec.git.url", "required")]
    assert ws_errors({"flux": {"digest": "sha256:x"}}) == [FieldError("spec.flux.url", "required")]


def test_workspace_git_url_is_checked_as_a_stack_projectrepo_is() -> None:
    problem = git_url_error("hhtp://x/r.git")
    assert problem is not None
    assert ws_errors({"git": {"url": "hhtp://x/r.git"}}) == [FieldError("spec.git.url", problem)]
    assert ws_errors({"git": {"url": "git@github.com:org/r.git"}}) == []


def test_workspace_git_username_needs_a_password() -> None:
    errors = ws_errors({"git": {"url": "https://x", "auth": {"username": {"name": "s", "key": "u"}}}})
    assert paths(errors) == ["spec.git.auth.password"]


@pytest.mark.parametrize(
    ("item", "path"),
    [
        ({"key": "a"}, "spec.stacks[0].config[0]"),
        ({"key": "a", "value": "x", "valueFrom": {"env": "E"}}, "spec.stacks[0].config[0].valueFrom"),
        ({"key": "a", "valueFrom": {}}, "spec.stacks[0].config[0].valueFrom"),
        ({"key": "a", "valueFrom": {"env": "E", "path": "/p"}}, "spec.stacks[0].config[0].valueFrom"),
        ({"key": "a.b", "path": True, "value": {"x": 1}}, "spec.stacks[0].config[0].path"),
    ],
)
def test_workspace_config_items(item: dict[str, Any], path: str) -> None:
    assert paths(ws_errors({"stacks": [{"name": "dev", "config": [item]}]})) == [path]


def test_workspace_duplicate_keys_are_reported() -> None:
    errors = ws_errors(
        {
            "env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}],
            "stacks": [
                {"name": "dev", "config": [{"key": "k", "value": 1}, {"key": "k", "value": 2}]},
                {"name": "dev"},
            ],
        }
    )
    assert errors == [
        FieldError("spec.env", "duplicate name 'A'"),
        FieldError("spec.stacks", "duplicate name 'dev'"),
        FieldError("spec.stacks[0].config", "duplicate key 'k'"),
    ]


# --- Update and Program rules ----------------------------------------------------------------


def test_update_needs_workspace_stack_and_type() -> None:
    _, errors = parse_update({"spec": {}})
    assert paths(errors) == ["spec.workspaceName", "spec.stackName", "spec.type"]


def test_full_update_is_valid_and_remove_or_run_program_need_the_right_type() -> None:
    obj = full_update()
    assert parse_update(obj)[1] == []
    obj["spec"]["type"] = "up"
    assert paths(parse_update(obj)[1]) == ["spec.remove", "spec.runProgram"]
    obj["spec"]["type"] = "refresh"
    assert paths(parse_update(obj)[1]) == ["spec.remove"]


def test_full_program_is_valid() -> None:
    assert parse_program(full_program())[1] == []


def test_program_getter_excludes_properties_and_config_needs_type_or_default() -> None:
    obj = copy.deepcopy(full_program())
    obj["program"]["resources"]["existing"]["properties"] = {"bucket": "b"}
    obj["program"]["configuration"]["bare"] = {}
    _, errors = parse_program(obj)
    assert errors == [
        FieldError("program.configuration[bare]", "one of type or default is required"),
        FieldError("program.resources[existing].get", "mutually exclusive with properties"),
    ]
