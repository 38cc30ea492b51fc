"""``--target``, ``--expect-no-changes``, drift on refresh and ``pulumi import``, driven through
``pulumi.automation`` as the agent drives the real CLI (plus one by-hand ``pulumi import``)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from pulumi import automation as auto

from pko.devtools.standin import FakePulumi

from .test_fakepulumi import open_stack, state_file, write_project

PREFIX = "urn:pulumi:dev::demo::"
STACK_URN = f"{PREFIX}pulumi:pulumi:Stack::demo-dev"


def urn(name: str, type_: str = "test:index:Echo") -> str:
    return f"{PREFIX}{type_}::{name}"


def resources(fake: FakePulumi) -> dict[str, dict[str, Any]]:
    """The stack's state, by URN."""
    return {r["urn"]: r for r in state_file(fake)["checkpoint"]["latest"]["resources"]}


def step_ops(events: list[auto.EngineEvent]) -> dict[str, str]:
    """The op of each resource's final (outputs) event, by resource name, the stack and providers left out."""
    ops = {}
    for event in events:
        done = event.res_outputs_event
        if done and done.metadata.type not in ("pulumi:pulumi:Stack",):
            if not done.metadata.type.startswith("pulumi:providers:"):
                ops[done.metadata.urn.rsplit("::", 1)[1]] = done.metadata.op.value
    return ops


def error_texts(events: list[auto.EngineEvent]) -> list[str]:
    return [
        e.diagnostic_event.message.rstrip("\n")
        for e in events
        if e.diagnostic_event and e.diagnostic_event.severity == "error"
    ]


# -- --target ------------------------------------------------------------------------------------------
TARGETS = """
name: demo
runtime: yaml
config:
  v:
    type: string
    default: one
resources:
  a:
    type: test:index:Echo
    properties:
      text: ${v}
  b:
    type: test:index:Echo
    properties:
      text: ${a.text}-b
  c:
    type: test:index:Echo
    properties:
      text: ${v}-c
outputs:
  a: ${a.text}
  b: ${b.text}
  c: ${c.text}
"""


def texts(fake: FakePulumi) -> dict[str, str]:
    return {
        u.rsplit("::", 1)[1]: r["outputs"]["text"]
        for u, r in resources(fake).items()
        if r["type"] == "test:index:Echo"
    }


def test_targeted_up_changes_only_targets_and_their_dependents(
    fake_pulumi: FakePulumi, tmp_path: Path
) -> None:
    work = write_project(tmp_path / "proj", TARGETS)
    stack = open_stack(fake_pulumi, work)
    stack.up()
    stack.set_config("v", auto.ConfigValue("two"))

    events: list[auto.EngineEvent] = []
    result = stack.up(target=[urn("a")], on_event=events.append)
    assert step_ops(events) == {"a": "update", "b": "same", "c": "same"}
    assert result.summary.resource_changes == {"same": 3, "update": 1}
    assert texts(fake_pulumi) == {"a": "two", "b": "one-b", "c": "one-c"}
    # Stack outputs are still evaluated: untargeted resources contribute their old outputs.
    assert {k: v.value for k, v in result.outputs.items()} == {"a": "two", "b": "one-b", "c": "one-c"}

    preview = stack.preview(target=[urn("a")], target_dependents=True)
    assert preview.change_summary == {"same": 3, "update": 1}
    assert texts(fake_pulumi)["b"] == "one-b"
    events.clear()
    stack.up(target=[urn("a")], target_dependents=True, on_event=events.append)
    assert step_ops(events) == {"a": "same", "b": "update", "c": "same"}
    assert texts(fake_pulumi) == {"a": "two", "b": "two-b", "c": "one-c"}
    assert stack.up().summary.resource_changes == {"same": 3, "update": 1}  # c catches up untargeted


def test_untargeted_creates_are_skipped_and_deletes_limited(fake_pulumi: FakePulumi, tmp_path: Path) -> None:
    work = write_project(tmp_path / "proj", TARGETS)
    stack = open_stack(fake_pulumi, work)
    stack.up()
    without_c = TARGETS.replace("  c:\n    type: test:index:Echo\n    properties:\n      text: ${v}-c\n", "")
    with_d = without_c.replace(
        "outputs:\n", "  d:\n    type: test:index:Echo\n    properties:\n      text: new\noutputs:\n"
    ).replace("  c: ${c.text}\n", "")
    write_project(work, with_d)

    events: list[auto.EngineEvent] = []
    result = stack.up(target=[urn("a")], on_event=events.append)
    # d is a skipped create (a `same` step, never saved); c, gone from the program, is kept as it was.
    assert step_ops(events) == {"a": "same", "b": "same", "d": "same", "c": "same"}
    assert result.summary.resource_changes == {"same": 5}
    assert set(texts(fake_pulumi)) == {"a", "b", "c"}

    result = stack.up(target=[urn("d"), urn("c")])
    assert result.summary.resource_changes == {"same": 3, "create": 1, "delete": 1}
    assert set(texts(fake_pulumi)) == {"a", "b", "d"}


def test_targeted_errors_are_worded_like_the_engine(fake_pulumi: FakePulumi, tmp_path: Path) -> None:
    work = write_project(tmp_path / "proj", TARGETS)
    stack = open_stack(fake_pulumi, work)
    stack.up()
    before = resources(fake_pulumi)

    nowhere = urn("nowhere")
    events: list[auto.EngineEvent] = []
    with pytest.raises(auto.CommandError, match="code: 1") as missing:
        stack.up(target=[nowhere], on_event=events.append)
    hint = f"Target '{nowhere}' could not be found in the stack. Did you forget to escape $ in your shell?"
    assert error_texts(events) == [hint]  # a bail: no `update failed` line
    assert hint in str(missing.value)
    assert stack.history()[0].result == "failed" and resources(fake_pulumi) == before
    child = f"{PREFIX}test:index:Echo$test:index:Echo::x"
    events.clear()
    with pytest.raises(auto.CommandError):
        stack.refresh(target=[child], on_event=events.append)
    # Refresh checks first and refreshes nothing; a URN with `$` gets no shell hint.
    assert error_texts(events) == [f"Target '{child}' could not be found in the stack."]
    assert not [e for e in events if e.resource_pre_event]
    assert stack.history()[0].kind == "refresh" and stack.history()[0].result == "failed"

    extended = TARGETS.replace(
        "outputs:\n",
        "  d:\n    type: test:index:Echo\n    properties:\n      text: new\n"
        "  e:\n    type: test:index:Echo\n    properties:\n      text: ${d.text}-e\n"
        "outputs:\n",
    )
    write_project(work, extended)
    events.clear()
    with pytest.raises(auto.CommandError, match="which was was not specified in --target list"):
        stack.up(target=[urn("e")], on_event=events.append)
    assert error_texts(events) == [
        f"Resource '{urn('e')}' depends on '{urn('d')}' which was was not specified in --target list."
    ]
    assert urn("d") not in resources(fake_pulumi) and urn("e") not in resources(fake_pulumi)

    # Destroying a resource others depend on needs them targeted too, or --target-dependents.
    write_project(work, TARGETS)
    with pytest.raises(auto.CommandError) as dependents:
        stack.destroy(target=[urn("a")])
    assert f"Resource '{urn('b')}' will be destroyed but was not specified in --target list." in str(
        dependents.value
    )
    assert "update failed" in str(dependents.value) and resources(fake_pulumi).keys() == before.keys()
    destroyed = stack.destroy(target=[urn("a")], target_dependents=True)
    assert destroyed.summary.resource_changes == {"delete": 2, "same": 2}
    assert set(texts(fake_pulumi)) == {"c"} and STACK_URN in resources(fake_pulumi)


# -- --expect-no-changes -------------------------------------------------------------------------------
def test_expect_no_changes(fake_pulumi: FakePulumi, tmp_path: Path) -> None:
    work = write_project(tmp_path / "proj", TARGETS)
    stack = open_stack(fake_pulumi, work)
    with pytest.raises(auto.CommandError, match="code: 7") as preview:
        stack.preview(expect_no_changes=True)
    assert "error: no changes were expected for preview but changes were proposed" in str(preview.value)
    assert not state_file(fake_pulumi)["checkpoint"]["latest"].get("resources")

    stack.up()
    stack.preview(expect_no_changes=True)
    assert stack.up(expect_no_changes=True).summary.resource_changes == {"same": 4}
    stack.refresh(expect_no_changes=True)

    stack.set_config("v", auto.ConfigValue("two"))
    with pytest.raises(auto.CommandError, match="code: 7") as up:
        stack.up(expect_no_changes=True)
    # The check comes after the update, which was applied and recorded as a success.
    assert "no changes were expected for update but changes were proposed" in str(up.value)
    assert texts(fake_pulumi)["a"] == "two"
    history = stack.history()
    assert history[0].result == "succeeded" and history[0].resource_changes == {"same": 1, "update": 3}


# -- drift -----------------------------------------------------------------------------------------------
def drift_program(cloud: Path) -> str:
    return f"""
name: demo
runtime: yaml
resources:
  d:
    type: test:index:Drift
    properties:
      path: {cloud}
  e:
    type: test:index:Echo
    properties:
      text: ${{d.value}}
  other:
    type: test:index:Echo
    properties:
      text: unrelated
outputs:
  value: ${{d.value}}
"""


def test_refresh_detects_drift(fake_pulumi: FakePulumi, tmp_path: Path) -> None:
    cloud = tmp_path / "cloud.txt"
    cloud.write_text("one")
    work = write_project(tmp_path / "proj", drift_program(cloud))
    stack = open_stack(fake_pulumi, work)
    assert stack.up().outputs["value"].value == "one"
    assert resources(fake_pulumi)[urn("d", "test:index:Drift")]["id"] == str(cloud)
    assert stack.refresh().summary.resource_changes == {"same": 4}

    cloud.write_text("two")
    with pytest.raises(auto.CommandError, match="code: 7") as check:
        stack.preview_refresh(expect_no_changes=True)
    assert "no changes were expected for refresh but changes were proposed" in str(check.value)
    events: list[auto.EngineEvent] = []
    assert stack.preview_refresh(on_event=events.append).change_summary == {"same": 3, "update": 1}
    assert resources(fake_pulumi)[urn("d", "test:index:Drift")]["outputs"]["value"] == "one"
    pre = [e.resource_pre_event.metadata for e in events if e.resource_pre_event]
    assert {m.op.value for m in pre} == {"refresh"}
    (drifted,) = [
        e.res_outputs_event.metadata
        for e in events
        if e.res_outputs_event and e.res_outputs_event.metadata.op.value == "update"
    ]
    assert drifted.urn == urn("d", "test:index:Drift") and drifted.diffs == ["value"]
    assert drifted.detailed_diff is not None and drifted.detailed_diff["value"].diff_kind.value == "update"
    assert drifted.new is not None and drifted.new.outputs is not None
    assert drifted.new.outputs["value"] == "two"

    # Targeting leaves the drifted resource alone; --target-dependents follows d's dependents.
    assert stack.refresh(target=[urn("other")]).summary.resource_changes == {"same": 1}
    events.clear()
    refreshed = stack.refresh(
        target=[urn("d", "test:index:Drift")], target_dependents=True, on_event=events.append
    )
    assert refreshed.summary.resource_changes == {"same": 1, "update": 1}
    assert step_ops(events) == {"d": "update", "e": "same"}
    state = resources(fake_pulumi)[urn("d", "test:index:Drift")]
    assert state["outputs"]["value"] == "two" and state["inputs"] == {"path": str(cloud)}
    stack.refresh(expect_no_changes=True)
    # The program did not change, so `up` keeps the refreshed value; e's input follows it.
    up = stack.up()
    assert up.outputs["value"].value == "two" and up.summary.resource_changes == {"same": 3, "update": 1}

    # `up --refresh` (the operator's `refresh: true`): drift read back first, then kept by the update.
    cloud.write_text("three")
    assert stack.up().outputs["value"].value == "two"  # without --refresh the state is believed
    cloud.write_text("four")
    events.clear()
    refreshed_up = stack.up(refresh=True, on_event=events.append)
    assert refreshed_up.outputs["value"].value == "four"
    assert "refresh" in {e.resource_pre_event.metadata.op.value for e in events if e.resource_pre_event}
    assert resources(fake_pulumi)[urn("d", "test:index:Drift")]["outputs"]["value"] == "four"


# -- import ---------------------------------------------------------------------------------------------
def test_import_resources(fake_pulumi: FakePulumi, tmp_path: Path) -> None:
    cloud = tmp_path / "existing.txt"
    cloud.write_text("found")
    work = write_project(
        tmp_path / "proj", "name: demo\nruntime: yaml\nresources:\n  a:\n    type: test:index:Echo\n"
    )
    stack = open_stack(fake_pulumi, work)
    stack.up()

    result = stack.import_resources(
        resources=[
            {"type": "test:index:Echo", "name": "imported", "id": "some-id"},
            {"type": "test:index:Drift", "name": "drifty", "id": str(cloud)},
        ],
        protect=False,
        message="adopt",
    )
    assert result.summary.kind == "resource-import" and result.summary.message == "adopt"
    assert result.summary.resource_changes == {"same": 2, "import": 2}
    echo, drift = (
        resources(fake_pulumi)[urn("imported")],
        resources(fake_pulumi)[urn("drifty", "test:index:Drift")],
    )
    assert echo["id"] == "some-id" and echo["custom"] and echo["inputs"] == {} and not echo.get("protect")
    assert drift["id"] == str(cloud) and drift["outputs"] == {"path": str(cloud), "value": "found"}
    code = yaml.safe_load(result.generated_code)
    assert code == {
        "resources": {
            "imported": {"type": "test:Echo"},
            "drifty": {"type": "test:Drift", "properties": {"path": str(cloud)}},
        }
    }

    # Declaring them as generated makes the next update a no-op; imports are protected by default.
    program = yaml.safe_load((work / "Pulumi.yaml").read_text())
    program["resources"].update(code["resources"])
    write_project(work, yaml.safe_dump(program))
    assert stack.up(expect_no_changes=True).summary.resource_changes == {"same": 4}
    protected = stack.import_resources(resources=[{"type": "test:index:Echo", "name": "kept", "id": "x"}])
    assert resources(fake_pulumi)[urn("kept")]["protect"] is True
    assert yaml.safe_load(protected.generated_code)["resources"]["kept"]["options"] == {"protect": True}

    with pytest.raises(auto.CommandError, match=f"resource '{tmp_path / 'absent'}' does not exist"):
        stack.import_resources(
            resources=[{"type": "test:index:Drift", "name": "gone", "id": str(tmp_path / "absent")}]
        )
    assert stack.history()[0].result == "failed" and urn("gone", "test:index:Drift") not in resources(
        fake_pulumi
    )
    with pytest.raises(auto.CommandError, match=f"resource '{urn('a')}' already exists"):
        stack.import_resources(resources=[{"type": "test:index:Echo", "name": "a", "id": "other-id"}])
    with pytest.raises(
        auto.CommandError,
        match="1 error occurred:\n\t\\* resource 'noid' of type 'test:index:Echo' has no ID",
    ):
        stack.import_resources(resources=[{"type": "test:index:Echo", "name": "noid"}])


def test_pulumi_import_by_hand(fake_pulumi: FakePulumi, tmp_path: Path) -> None:
    """What a user types in a workspace pod: the stack is selected, the backend comes from the env."""
    work = write_project(tmp_path / "proj", "name: demo\nruntime: yaml\n")
    open_stack(fake_pulumi, work)
    env = {**os.environ, **fake_pulumi.env}

    def pulumi(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["pulumi", *args], cwd=work, env=env, capture_output=True, text=True, timeout=120
        )

    done = pulumi("import", "test:index:Echo", "imported", "some-id", "--yes")
    assert done.returncode == 0, done.stderr
    notice, _, code = done.stdout.partition(
        "Please note that the imported resources are marked as protected."
    )
    assert (
        "Importing (dev):" in notice
        and "Please copy the following code into your Pulumi application." in notice
    )
    assert "= 1 imported" in notice
    assert yaml.safe_load(code.split("take effect.\n\n", 1)[1]) == {
        "resources": {"imported": {"type": "test:Echo", "options": {"protect": True}}}
    }
    exported = json.loads(pulumi("stack", "export").stdout)
    (state,) = [r for r in exported["deployment"]["resources"] if r["urn"] == urn("imported")]
    assert state["id"] == "some-id" and state["protect"] is True and state["parent"] == STACK_URN

    missing = pulumi("import", "test:index:Echo", "only-a-name", "--yes")
    assert missing.returncode == 1
    assert missing.stderr == (
        "error: an inline resource must be specified if no converter or import file is used, missing id\n"
    )
    unconfirmed = pulumi("import", "test:index:Echo", "x", "y")
    assert unconfirmed.returncode == 2 and "--yes or --skip-preview" in unconfirmed.stderr
    no_flag = pulumi("destroy", "--yes", "--expect-no-changes")  # the real destroy has no such flag
    assert no_flag.returncode == 2 and no_flag.stderr == "error: unknown flag: --expect-no-changes\n"
