"""The pydantic models: wire names, round trips, defaults, enums and helpers."""

from __future__ import annotations

import copy
import types
import typing
from datetime import UTC, datetime, timedelta, timezone
from typing import Annotated, Any

import pytest
from pko.api.meta import (
    CONDITION_MESSAGE_MAX,
    Condition,
    ObjectMeta,
    OwnerReference,
    format_time,
    is_condition_true,
    parse_go_duration,
    remove_condition,
    set_condition,
)
from pko.api.program import Program
from pko.api.stack import Stack, StackSpec, StackStatus
from pko.api.update import Update, UpdateStatus
from pko.api.validation import deprecation_warnings
from pko.api.workspace import Workspace, WorkspaceSpec, WorkspaceStatus
from pydantic import BaseModel, ValidationError

from .manifests import (
    full_program,
    full_program_status,
    full_stack,
    full_stack_status,
    full_update,
    full_update_status,
    full_workspace,
    full_workspace_status,
    stack_variants,
)

T0 = datetime(2024, 10, 17, 20, 41, 49, tzinfo=UTC)


def _unwrap(tp: Any) -> Any:
    while True:
        if typing.get_origin(tp) is Annotated:
            tp = typing.get_args(tp)[0]
        elif typing.get_origin(tp) in (typing.Union, types.UnionType):
            (tp,) = [a for a in typing.get_args(tp) if a is not type(None)]
        else:
            return tp


def _walk_models(model: type[BaseModel], data: Any, seen: dict[type[BaseModel], set[str]]) -> None:
    """Record, per model class, which of its fields `data` sets (anywhere it occurs)."""
    seen.setdefault(model, set())
    if not isinstance(data, dict):
        return
    for name, info in model.model_fields.items():
        wire = info.alias or name
        tp = _unwrap(info.annotation)
        origin = typing.get_origin(tp)
        item = _unwrap(typing.get_args(tp)[-1]) if origin in (list, dict) else None
        sub = tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None
        sub_item = item if isinstance(item, type) and issubclass(item, BaseModel) else None
        if wire in data:
            seen[model].add(wire)
        value = data.get(wire)
        if sub is not None:
            _walk_models(sub, value, seen)
        elif sub_item is not None:
            values = value.values() if isinstance(value, dict) else value or []
            for v in values:
                _walk_models(sub_item, v, seen)
            seen.setdefault(sub_item, set())


def missing_fields(model: type[BaseModel], data: dict[str, Any]) -> set[str]:
    """``Model.field`` for every field of every reachable model that `data` never sets."""
    seen: dict[type[BaseModel], set[str]] = {}
    _walk_models(model, data, seen)
    return {
        f"{cls.__name__}.{info.alias or name}"
        for cls, fields in seen.items()
        if cls not in (ObjectMeta, OwnerReference)  # server-managed
        for name, info in cls.model_fields.items()
        if (info.alias or name) not in fields
    }


@pytest.mark.parametrize(
    ("model", "objs"),
    [
        (Stack, [{**v, "status": full_stack_status()} for v in stack_variants().values()]),
        (Workspace, [{**full_workspace(), "status": full_workspace_status()}]),
        (Update, [{**full_update(), "status": full_update_status()}]),
        (Program, [{**full_program(), "status": full_program_status()}]),
    ],
    ids=["Stack", "Workspace", "Update", "Program"],
)
def test_full_object_sets_every_field_and_round_trips_unchanged(
    model: type[BaseModel], objs: list[dict[str, Any]]
) -> None:
    # The fixtures really cover the API (so the cluster round-trip test covers it too)...
    assert set.intersection(*(missing_fields(model, obj) for obj in objs)) == set()
    # ...and parsing then serialising gives back exactly the same document.
    for obj in objs:
        parsed = model.model_validate(copy.deepcopy(obj))
        assert parsed.wire() == obj  # type: ignore[attr-defined]


def test_wire_names_follow_the_go_json_tags() -> None:
    stack = Stack.model_validate(full_stack())
    spec = stack.spec
    assert spec.env_secrets == ["env-secret"]  # Go SecretEnvs, json "envSecrets"
    assert spec.secrets_ref is not None and spec.secrets_ref["apiKey"].secret is not None
    assert spec.config_ref is not None and spec.config_ref["fromMap"].json_ is True
    assert spec.git_auth is not None and spec.git_auth.github_app is not None
    assert spec.git_auth.github_app.app_id.type == "Secret"  # json "appID"
    program = Program.model_validate(full_program())
    resources = program.program.resources
    assert resources is not None and resources["bucket"].options is not None
    assert resources["bucket"].options.import_ == "bucket-id"  # json "import"
    ws = Workspace.model_validate(full_workspace())
    assert ws.spec.pulumi_log_level == 9  # Go PulumiLogVerbosity, json "pulumiLogLevel"


def test_models_accept_python_names_and_emit_camel_case() -> None:
    spec = StackSpec(stack="org/p/dev", project_repo="https://x", branch="main", resync_frequency_seconds=120)
    assert spec.wire()["projectRepo"] == "https://x"
    assert spec.wire()["resyncFrequencySeconds"] == 120
    assert "program_ref" not in spec.wire() and "programRef" not in spec.wire()


def test_unknown_fields_are_ignored_not_fatal() -> None:
    obj = full_stack()
    obj["spec"]["futureField"] = {"x": 1}
    stack = Stack.model_validate(obj)
    assert "futureField" not in stack.spec.wire()


def test_metadata_keeps_fields_it_does_not_model() -> None:
    obj = full_stack()
    obj["metadata"]["managedFields"] = [{"manager": "kubectl", "operation": "Apply"}]
    assert Stack.model_validate(obj).wire()["metadata"]["managedFields"] == obj["metadata"]["managedFields"]


def test_legacy_v1alpha1_stack_with_deprecated_fields_parses() -> None:
    # The seed blog's pulumi.com/v1alpha1 manifest: accessTokenSecret, envSecrets, initOnCreate.
    stack = Stack.model_validate(
        {
            "apiVersion": "pulumi.com/v1alpha1",
            "kind": "Stack",
            "metadata": {"name": "my-stack"},
            "spec": {
                "accessTokenSecret": "accesstoken",
                "stack": "org/nginx/dev",
                "initOnCreate": True,
                "projectRepo": "https://github.com/metral/pulumi-nginx",
                "commit": "2b0889718d3e63feeb6079ccd5e4488d8601e353",
                "config": {"aws:region": "us-west-2"},
                "envSecrets": ["aws-creds"],
                "destroyOnFinalize": True,
            },
        }
    )
    assert stack.api_version == "pulumi.com/v1alpha1"
    assert stack.spec.access_token_secret == "accesstoken"
    assert stack.spec.env_secrets == ["aws-creds"]
    # Removed before 1.0, still in users' manifests: accepted (so they apply unchanged), ignored.
    assert stack.spec.init_on_create is True
    assert "spec.initOnCreate was removed before v1.0 and is ignored" in deprecation_warnings(stack.spec)


def test_program_body_is_top_level_program_not_spec() -> None:
    program = Program.model_validate({"metadata": {"name": "p"}, "program": {"outputs": {"u": "x"}}})
    assert program.program.outputs == {"u": "x"}
    assert "spec" not in program.wire()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("workspaceReclaimPolicy", "Keep"),
        ("resyncFrequencySeconds", -1),
        ("retryMaxBackoffDurationSeconds", -5),
        ("retryPolicy", {"transient": {"baseSeconds": 0}}),
        ("retryPolicy", {"transient": {"factor": 0.5}}),
        ("retryPolicy", {"transient": {"maxSeconds": 0}}),
        ("retryPolicy", {"transient": {"jitter": 1}}),
        ("retryPolicy", {"transient": {"jitter": -0.1}}),
        ("retryPolicy", {"deterministic": {"baseSeconds": -1}}),
        ("retryPolicy", {"deterministic": {"factor": 0.99}}),
        ("prerequisites", [{"name": "a", "requirement": {"succeededWithinDuration": "-1h"}}]),
        ("prerequisites", [{"name": "a", "requirement": {"succeededWithinDuration": "1 hour"}}]),
        ("envRefs", {"X": {"type": "Configmap"}}),
        ("envRefs", {"X": {"literal": {"value": "v"}}}),
    ],
)
def test_stack_spec_rejects_values_the_crd_rejects(field: str, value: Any) -> None:
    with pytest.raises(ValidationError):
        StackSpec.model_validate({"stack": "s", field: value})


def test_stack_defaults_match_the_go_operator() -> None:
    spec = StackSpec(stack="s")
    assert spec.workspace_reclaim_policy == "Retain"
    assert spec.resync_frequency() == 60
    assert not spec.refresh and not spec.destroy_on_finalize and not spec.shallow


@pytest.mark.parametrize(("value", "effective"), [(None, 60), (0, 60), (30, 60), (60, 60), (300, 300)])
def test_resync_frequency_is_at_least_sixty_seconds(value: int | None, effective: int) -> None:
    assert StackSpec(stack="s", resync_frequency_seconds=value).resync_frequency() == effective


def test_git_source_is_present_when_any_inline_git_field_is_set() -> None:
    assert not StackSpec(stack="s").has_git_source()
    assert StackSpec(stack="s", branch="main").has_git_source()
    assert StackSpec(stack="s", shallow=True).has_git_source()
    assert StackSpec(stack="s", git_auth_secret="creds").has_git_source()


def test_workspace_defaults_profile_and_service_account() -> None:
    spec = WorkspaceSpec()
    assert spec.security_profile == "restricted"
    assert spec.service_account_name == "default"
    assert spec.image is None  # depends on the profile: see with_defaults()


@pytest.mark.parametrize(
    ("profile", "image"),
    [("restricted", "pulumi/pulumi:latest-nonroot"), ("baseline", "pulumi/pulumi:latest")],
)
def test_workspace_image_defaults_by_security_profile(profile: Any, image: str) -> None:
    assert WorkspaceSpec(security_profile=profile).with_defaults().image == image


def test_workspace_with_defaults_keeps_an_explicit_image() -> None:
    assert WorkspaceSpec(image="my/image:1").with_defaults().image == "my/image:1"


def test_workspace_resource_requests_default_to_64mi_and_100m_without_limits() -> None:
    defaulted = WorkspaceSpec().with_defaults()
    assert defaulted.resources == {"requests": {"memory": "64Mi", "cpu": "100m"}}


def test_workspace_resource_defaults_fill_only_missing_or_zero_requests() -> None:
    spec = WorkspaceSpec(resources={"requests": {"memory": "0", "cpu": "2"}, "limits": {"memory": "1Gi"}})
    defaulted = spec.with_defaults()
    assert defaulted.resources == {"requests": {"memory": "64Mi", "cpu": "2"}, "limits": {"memory": "1Gi"}}
    assert spec.resources == {
        "requests": {"memory": "0", "cpu": "2"},
        "limits": {"memory": "1Gi"},
    }  # unchanged


def test_workspace_rejects_unknown_security_profile_and_pull_policy() -> None:
    with pytest.raises(ValidationError):
        WorkspaceSpec.model_validate({"securityProfile": "privileged"})
    with pytest.raises(ValidationError):
        WorkspaceSpec.model_validate({"imagePullPolicy": "Sometimes"})
    with pytest.raises(ValidationError):
        WorkspaceSpec.model_validate({"pulumiLogLevel": -1})


def test_update_rejects_unknown_type_and_negative_parallelism() -> None:
    with pytest.raises(ValidationError):
        Update.model_validate({"spec": {"type": "import"}})
    with pytest.raises(ValidationError):
        Update.model_validate({"spec": {"parallel": -1}})


def test_status_models_carry_observed_generation_and_conditions() -> None:
    for status in (StackStatus, WorkspaceStatus, UpdateStatus):
        assert {"observed_generation", "conditions"} <= set(status.model_fields)


def test_next_retry_time_is_an_extension_on_stack_status_only() -> None:
    assert "next_retry_time" in StackStatus.model_fields
    status = StackStatus.model_validate(full_stack_status())
    assert status.next_retry_time == datetime(2024, 10, 17, 21, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", timedelta(0)),
        ("0s", timedelta(0)),
        ("90s", timedelta(seconds=90)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1.5s", timedelta(seconds=1.5)),
        ("300ms", timedelta(milliseconds=300)),
        ("2h45m30.5s", timedelta(hours=2, minutes=45, seconds=30.5)),
        ("+5m", timedelta(minutes=5)),
        ("10µs", timedelta(microseconds=10)),
    ],
)
def test_go_durations_parse(text: str, expected: timedelta) -> None:
    assert parse_go_duration(text) == expected


@pytest.mark.parametrize("text", ["", "-1h", "1d", "h", "1h-5m", "5", "1.h5"])
def test_invalid_or_negative_go_durations_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_go_duration(text)


def test_times_serialise_as_rfc3339_utc_whole_seconds() -> None:
    assert format_time(datetime(2024, 10, 17, 22, 41, 49, 123456, tzinfo=timezone(timedelta(hours=2)))) == (
        "2024-10-17T20:41:49Z"
    )
    assert format_time(datetime(2024, 10, 17, 20, 41, 49)) == "2024-10-17T20:41:49Z"  # naive means UTC


def test_set_condition_moves_transition_time_only_when_status_changes() -> None:
    conditions: list[Condition] = []
    assert set_condition(conditions, "Ready", "False", "NotReadyInProgress", "in progress", at=T0)
    later = T0 + timedelta(minutes=5)
    assert set_condition(conditions, "Ready", "False", "NotReadyStalled", "stalled", at=later)
    assert conditions[0].last_transition_time == T0 and conditions[0].reason == "NotReadyStalled"
    assert not set_condition(conditions, "Ready", "False", "NotReadyStalled", "stalled", at=later)
    assert set_condition(
        conditions, "Ready", "True", "ProcessingCompleted", "done", observed_generation=3, at=later
    )
    assert conditions[0].last_transition_time == later and conditions[0].observed_generation == 3
    assert is_condition_true(conditions, "Ready")


def test_set_condition_truncates_messages_the_crd_would_refuse() -> None:
    conditions: list[Condition] = []
    set_condition(conditions, "Stalled", "True", "UpdateFailed", "x" * (CONDITION_MESSAGE_MAX + 100), at=T0)
    assert len(conditions[0].message) == CONDITION_MESSAGE_MAX
    Condition.model_validate(conditions[0].wire())  # still valid against the CRD constraints


def test_remove_condition() -> None:
    conditions: list[Condition] = []
    set_condition(conditions, "Reconciling", "True", "StackProcessing", "m", at=T0)
    set_condition(conditions, "Ready", "False", "NotReadyInProgress", "m", at=T0)
    assert remove_condition(conditions, "Reconciling")
    assert not remove_condition(conditions, "Reconciling")
    assert [c.type for c in conditions] == ["Ready"]


def test_condition_constraints_match_metav1() -> None:
    good = {
        "type": "Ready",
        "status": "True",
        "reason": "Ok",
        "message": "",
        "lastTransitionTime": "2024-01-01T00:00:00Z",
    }
    Condition.model_validate(good)
    for bad in ({"status": "Maybe"}, {"reason": ""}, {"reason": "has space"}, {"type": "not valid!"}):
        with pytest.raises(ValidationError):
            Condition.model_validate({**good, **bad})
