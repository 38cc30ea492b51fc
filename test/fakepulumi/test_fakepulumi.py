"""The stand-in CLI, driven only through ``pulumi.automation`` as the agent drives the real CLI."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from pulumi import automation as auto

from pko.devtools.standin import FakePulumi

from .config import parse_config_key, parse_property_path, set_value

PROGRAM = """
name: demo
runtime: yaml
config:
  greeting:
    type: string
    default: hello
  length:
    type: integer
    default: 8
resources:
  name:
    type: random:RandomString
    properties:
      length: ${length}
      special: false
  pw:
    type: random:RandomPassword
    properties:
      length: 16
  echo:
    type: test:index:Echo
    properties:
      text: ${greeting}-${name.result}
outputs:
  name: ${name.result}
  password: ${pw.result}
  text: ${echo.text}
"""


def write_project(path: Path, body: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "Pulumi.yaml").write_text(body, encoding="utf-8")
    return path


def open_stack(fake: FakePulumi, work_dir: Path, name: str = "dev") -> auto.Stack:
    cmd = auto.PulumiCommand(root=str(fake.root))
    return auto.create_or_select_stack(
        name, work_dir=str(work_dir), opts=auto.LocalWorkspaceOptions(pulumi_command=cmd)
    )


def state_file(fake: FakePulumi, project: str = "demo", stack: str = "dev") -> dict[str, Any]:
    path = fake.state_dir / ".pulumi" / "stacks" / project / f"{stack}.json"
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def lock_files(fake: FakePulumi, project: str = "demo", stack: str = "dev") -> list[Path]:
    directory = fake.state_dir / ".pulumi" / "locks" / "organization" / project / stack
    return sorted(directory.glob("*.json")) if directory.exists() else []


def expected_random_string(urn: str, inputs: dict[str, Any], charset: str) -> str:
    seed = hashlib.sha256((urn + json.dumps(inputs, sort_keys=True)).encode()).digest()
    stream = hashlib.sha256(seed + (0).to_bytes(4, "big")).digest()
    return "".join(charset[b % len(charset)] for b in stream[: inputs["length"]])


# -- pure pieces --------------------------------------------------------------------------------------------
def test_property_paths_parse_like_pulumi() -> None:
    assert parse_property_path('a.b[0]["c.d"].e') == ["a", "b", 0, "c.d", "e"]
    assert parse_property_path('["x"]') == ["x"]
    assert parse_config_key('proj:["a.b"]', True, "other") == 'proj:["a.b"]'
    assert parse_config_key("outer.inner", True, "proj") == "proj:outer.inner"
    assert parse_config_key("aws:region", False, "proj") == "aws:region"


def test_path_set_coerces_nested_scalars_and_only_appends_to_arrays() -> None:
    cfg: dict[str, Any] = {}
    set_value(cfg, "p:list[0]", "true", path=True)
    set_value(cfg, "p:list[1]", "7", path=True)
    set_value(cfg, "p:top", "42", path=True)
    assert cfg == {"p:list": [True, 7], "p:top": "42"}
    with pytest.raises(Exception, match="array index out of range"):
        set_value(cfg, "p:list[5]", "x", path=True)


# -- CLI basics ---------------------------------------------------------------------------------------------
def test_version_whoami_and_stack_selection(fake_pulumi: FakePulumi, tmp_path: Path) -> None:
    work = write_project(tmp_path / "proj", PROGRAM)
    cmd = auto.PulumiCommand(root=str(fake_pulumi.root))
    assert cmd.version is not None and cmd.version.major == 3
    ws = auto.LocalWorkspace(work_dir=str(work), pulumi_command=cmd)
    who = ws.who_am_i()
    assert who.user and who.url == fake_pulumi.backend_url
    with pytest.raises(auto.StackNotFoundError, match="no stack named 'dev' found"):
        auto.select_stack("dev", work_dir=str(work), opts=auto.LocalWorkspaceOptions(pulumi_command=cmd))
    open_stack(fake_pulumi, work)
    open_stack(fake_pulumi, work, "prod")
    stacks = {s.name: s for s in ws.list_stacks()}
    assert set(stacks) == {"dev", "prod"} and stacks["prod"].current
    with pytest.raises(auto.StackAlreadyExistsError):
        ws.create_stack("dev")
    assert (fake_pulumi.state_dir / ".pulumi" / "stacks" / "demo" / "dev.json").exists()


def test_config_plain_secret_and_structured(fake_pulumi: FakePulumi, tmp_path: Path) -> None:
    work = write_project(tmp_path / "proj", PROGRAM)
    stack = open_stack(fake_pulumi, work)
    stack.set_all_config(
        {"greeting": auto.ConfigValue("hi"), "token": auto.ConfigValue("s3cr3t", secret=True)}
    )
    stack.set_all_config(
        {
            "outer.inner": auto.ConfigValue("v"),
            "outer.flag": auto.ConfigValue("true"),
            "list[0]": auto.ConfigValue("a"),
            '["dotted.key"]': auto.ConfigValue("d"),
            "outer.key": auto.ConfigValue("k", secret=True),
        },
        path=True,
    )
    settings_text = (work / "Pulumi.dev.yaml").read_text()
    assert "s3cr3t" not in settings_text
    settings = yaml.safe_load(settings_text)
    assert settings["config"]["demo:token"]["secure"].startswith("v1:")
    assert settings["encryptionsalt"].startswith("v1:")
    assert settings["config"]["demo:dotted.key"] == "d"

    config = stack.get_all_config()
    assert config["demo:greeting"].value == "hi" and not config["demo:greeting"].secret
    assert config["demo:token"].value == "s3cr3t" and config["demo:token"].secret
    assert json.loads(config["demo:list"].value) == ["a"]
    outer = stack.get_config("outer", path=True)
    assert outer.secret and json.loads(outer.value) == {"inner": "v", "flag": True, "key": "k"}
    assert stack.get_config("outer.flag", path=True).value == "true"

    wrong = dict(fake_pulumi.env, PULUMI_CONFIG_PASSPHRASE="not-the-passphrase")
    cmd = auto.PulumiCommand(root=str(fake_pulumi.root))
    ws = auto.LocalWorkspace(work_dir=str(work), pulumi_command=cmd, env_vars=wrong)
    with pytest.raises(auto.CommandError, match="incorrect passphrase"):
        ws.get_all_config("dev")


def test_set_all_config_json_like_the_go_agent(fake_pulumi: FakePulumi, tmp_path: Path) -> None:
    work = write_project(tmp_path / "proj", PROGRAM)
    stack = open_stack(fake_pulumi, work)
    stack.set_all_config_json(
        json.dumps(
            {
                "demo:obj": {"value": '{"a":[1,2]}', "objectValue": {"a": [1, 2]}, "secret": False},
                "demo:plain": {"value": "x", "secret": False},
                "demo:hidden": {"value": "y", "secret": True},
            }
        )
    )
    config = stack.get_all_config()
    assert json.loads(config["demo:obj"].value) == {"a": [1, 2]}
    assert config["demo:hidden"].secret and config["demo:hidden"].value == "y"


# -- operations ---------------------------------------------------------------------------------------------
def test_up_streams_events_and_returns_outputs(fake_pulumi: FakePulumi, tmp_path: Path) -> None:
    work = write_project(tmp_path / "proj", PROGRAM)
    stack = open_stack(fake_pulumi, work)
    stack.set_all_config({"length": auto.ConfigValue("12"), "greeting": auto.ConfigValue("hi")})
    events: list[auto.EngineEvent] = []
    result = stack.up(on_event=events.append, message="first")

    assert result.summary.result == "succeeded" and result.summary.kind == "update"
    assert result.summary.message == "first"
    assert result.summary.resource_changes == {"create": 4}
    urn = "urn:pulumi:dev::demo::random:index/randomString:RandomString::name"
    charset = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    name = expected_random_string(urn, {"length": 12, "special": False}, charset)
    assert result.outputs["name"].value == name and not result.outputs["name"].secret
    assert result.outputs["text"].value == f"hi-{name}"
    assert result.outputs["password"].secret and len(result.outputs["password"].value) == 16

    assert [e.sequence for e in events] == list(range(len(events)))
    assert events[0].prelude_event is not None and events[-1].cancel_event is not None
    assert events[-2].summary_event is not None
    assert events[-2].summary_event.resource_changes == {"create": 4}
    created = [e.resource_pre_event.metadata.urn for e in events if e.resource_pre_event]
    assert created[0].endswith("pulumi:pulumi:Stack::demo-dev") and urn in created
    pw_outputs = [
        e.res_outputs_event.metadata.new.outputs
        for e in events
        if e.res_outputs_event
        and e.res_outputs_event.metadata.urn.endswith("::pw")
        and e.res_outputs_event.metadata.new is not None
    ]
    assert pw_outputs and pw_outputs[0] is not None
    assert pw_outputs[0]["result"]["ciphertext"] == "[secret]"

    again = stack.up()
    assert again.summary.resource_changes == {"same": 4}
    assert again.outputs["name"].value == name


def test_preview_reports_changes_without_touching_state(fake_pulumi: FakePulumi, tmp_path: Path) -> None:
    work = write_project(tmp_path / "proj", PROGRAM)
    stack = open_stack(fake_pulumi, work)
    stack.set_config("length", auto.ConfigValue("8"))
    before = state_file(fake_pulumi)
    preview = stack.preview()
    assert preview.change_summary == {"create": 4}
    assert state_file(fake_pulumi)["checkpoint"]["latest"].get("resources") == before["checkpoint"][
        "latest"
    ].get("resources")
    stack.up()
    stack.set_config("length", auto.ConfigValue("9"))
    assert stack.preview().change_summary == {"same": 2, "replace": 1, "update": 1}


def test_replace_update_delete_refresh_destroy_and_history(fake_pulumi: FakePulumi, tmp_path: Path) -> None:
    work = write_project(tmp_path / "proj", PROGRAM)
    stack = open_stack(fake_pulumi, work)
    stack.set_config("length", auto.ConfigValue("8"))
    first = stack.up().outputs["name"].value
    stack.set_config("length", auto.ConfigValue("10"))
    second = stack.up()
    assert second.summary.resource_changes == {"same": 2, "replace": 1, "update": 1}
    assert len(second.outputs["name"].value) == 10 and second.outputs["name"].value != first

    write_project(
        work,
        PROGRAM.replace(
            "  pw:\n    type: random:RandomPassword\n    properties:\n      length: 16\n", ""
        ).replace("  password: ${pw.result}\n", ""),
    )
    third = stack.up()
    assert third.summary.resource_changes == {"same": 3, "delete": 1}
    assert set(third.outputs) == {"name", "text"}

    refreshed = stack.refresh()
    assert refreshed.summary.kind == "refresh" and refreshed.summary.resource_changes == {"same": 3}
    destroyed = stack.destroy()
    assert destroyed.summary.resource_changes == {"delete": 3}
    assert state_file(fake_pulumi)["checkpoint"]["latest"]["resources"] == []

    history = stack.history()
    assert [h.kind for h in history] == ["destroy", "refresh", "update", "update", "update"]
    assert [h.version for h in history] == [5, 4, 3, 2, 1]
    assert all(h.result == "succeeded" for h in history)
    assert history[-1].config["demo:length"].value == "8"


def test_failing_resource_is_a_command_error_with_diagnostics(
    fake_pulumi: FakePulumi, tmp_path: Path
) -> None:
    work = write_project(
        tmp_path / "proj",
        "name: demo\nruntime: yaml\nresources:\n"
        "  ok:\n    type: test:index:Echo\n    properties:\n      a: 1\n"
        "  bad:\n    type: test:index:Fail\n    properties:\n      message: the cloud said no\n",
    )
    stack = open_stack(fake_pulumi, work)
    events: list[auto.EngineEvent] = []
    with pytest.raises(auto.CommandError) as failure:
        stack.up(on_event=events.append)
    text = str(failure.value)
    assert "code: 1" in text and "the cloud said no" in text and "update failed" in text
    diags = [e.diagnostic_event for e in events if e.diagnostic_event]
    assert any(d.urn and d.urn.endswith("test:index:Fail::bad") and d.severity == "error" for d in diags)
    assert any(e.res_op_failed_event for e in events)
    assert events[-1].cancel_event is not None
    assert lock_files(fake_pulumi) == []
    assert stack.history()[0].result == "failed"
    latest = state_file(fake_pulumi)["checkpoint"]["latest"]
    assert [r["urn"].rsplit("::", 1)[1] for r in latest["resources"] if r["type"] == "test:index:Echo"] == [
        "ok"
    ]
    assert not latest.get("pending_operations")


def _children_running_pulumi(command: Path) -> list[int]:
    """Pids of our child processes running the fake CLI (what the agent signals on cancel)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == os.getpid() and str(command).encode() in cmdline:
            pids.append(int(entry.name))
    return pids


def _pending_types(fake: FakePulumi) -> list[str]:
    latest = state_file(fake)["checkpoint"]["latest"]
    return [op["type"] for op in latest.get("pending_operations") or []]


def _eventually(check: Callable[[], bool], timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def _run_in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


HANG = (
    "name: demo\nruntime: yaml\nresources:\n"
    "  before:\n    type: test:index:Echo\n  wait:\n    type: test:index:Hang\n"
)


@pytest.mark.parametrize("version", ["", "3.202.0"], ids=["grpc-event-stream", "event-log-file"])
def test_sigint_cancels_a_hanging_update_gracefully(
    fake_pulumi: FakePulumi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    if version:
        monkeypatch.setenv("PULUMI_FAKE_VERSION", version)
    work = write_project(tmp_path / "proj", HANG)
    stack = open_stack(fake_pulumi, work)
    started = threading.Event()
    events: list[auto.EngineEvent] = []

    def on_event(event: auto.EngineEvent) -> None:
        events.append(event)
        pre = event.resource_pre_event
        if pre and pre.metadata.type == "test:index:Hang":
            started.set()

    thread, box = _run_in_thread(lambda: stack.up(on_event=on_event))
    try:
        assert started.wait(60), "the hanging resource never started"
        assert lock_files(fake_pulumi), "an update in flight holds the lock"
        # The pre-event precedes the checkpoint write that records the pending operation (as in the engine).
        assert _eventually(lambda: _pending_types(fake_pulumi) == ["creating"])
        children = _children_running_pulumi(fake_pulumi.command)
        assert len(children) == 1
        os.kill(children[0], signal.SIGINT)
        thread.join(60)
        assert not thread.is_alive()
    finally:
        for pid in _children_running_pulumi(fake_pulumi.command):
            os.kill(pid, signal.SIGKILL)
        thread.join(60)

    error = box.get("error")
    assert isinstance(error, auto.CommandError) and "update canceled" in str(error)
    assert any(e.stdout_event and "^C received; cancelling" in e.stdout_event.message for e in events)
    assert events[-1].cancel_event is not None
    assert lock_files(fake_pulumi) == []
    latest = state_file(fake_pulumi)["checkpoint"]["latest"]
    assert not latest.get("pending_operations")
    assert not any(r["type"] == "test:index:Hang" for r in latest["resources"])
    assert stack.history()[0].result == "failed"


CRASH = """name: demo
runtime: yaml
config:
  crash:
    type: boolean
    default: true
resources:
  boom:
    type: test:index:Crash
    properties:
      crash: ${crash}
"""


def test_crash_leaves_lock_and_pending_create(fake_pulumi: FakePulumi, tmp_path: Path) -> None:
    work = write_project(tmp_path / "proj", CRASH)
    stack = open_stack(fake_pulumi, work)
    with pytest.raises(auto.CommandError, match="code: -9"):
        stack.up()
    assert len(lock_files(fake_pulumi)) == 1
    with pytest.raises(
        auto.ConcurrentUpdateError, match=r"the stack is currently locked by 1 lock\(s\)"
    ) as held:
        stack.up()
    assert "pulumi cancel" in str(held.value) and "(pid " in str(held.value)

    stack.cancel()
    assert lock_files(fake_pulumi) == []
    stack.set_config("crash", auto.ConfigValue("false"))
    events: list[auto.EngineEvent] = []
    result = stack.up(on_event=events.append)
    assert result.summary.result == "succeeded"
    warnings = [
        e.diagnostic_event.message
        for e in events
        if e.diagnostic_event and e.diagnostic_event.severity == "warning"
    ]
    assert any(
        "with 1 pending operations from previous deployment" in w
        and "urn:pulumi:dev::demo::test:index:Crash::boom, interrupted while creating" in w
        for w in warnings
    )
    # Pending creates need a human (or --clear-pending-creates): they survive `up`.
    assert state_file(fake_pulumi)["checkpoint"]["latest"]["pending_operations"]
    stack.refresh(clear_pending_creates=True)
    assert not state_file(fake_pulumi)["checkpoint"]["latest"].get("pending_operations")


def test_service_style_conflict_message(
    fake_pulumi: FakePulumi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = write_project(tmp_path / "proj", CRASH)
    stack = open_stack(fake_pulumi, work)
    with pytest.raises(auto.CommandError):
        stack.up()
    monkeypatch.setenv("PULUMI_FAKE_LOCK_MESSAGE", "service")
    with pytest.raises(auto.ConcurrentUpdateError, match="Conflict: Another update is currently in progress"):
        stack.up()


RESOURCE_OPTIONS_PROGRAM = """
name: demo
runtime: yaml
variables:
  base: ${first}
resources:
  later:
    type: test:index:Echo
    properties:
      text: later
    options:
      dependsOn:
        - ${first}
        - ${base}
  child:
    type: test:Echo
    properties:
      text: ${base.text}-child
    options:
      parent: ${first}
      deletedWith: ${base}
  first:
    type: test:index:Echo
    properties:
      text: first
outputs:
  child: ${child.text}
"""


def test_resource_references_in_options(fake_pulumi: FakePulumi, tmp_path: Path) -> None:
    """``${res}`` is a resource in dependsOn/parent/deletedWith (as in pulumi-yaml), never a value."""
    work = write_project(tmp_path / "proj", RESOURCE_OPTIONS_PROGRAM)
    stack = open_stack(fake_pulumi, work)
    assert stack.preview().change_summary == {"create": 4}
    result = stack.up()
    assert result.summary.resource_changes == {"create": 4}
    assert result.outputs["child"].value == "first-child"

    prefix = "urn:pulumi:dev::demo::"
    first, later = f"{prefix}test:index:Echo::first", f"{prefix}test:index:Echo::later"
    child = f"{prefix}test:index:Echo$test:index:Echo::child"
    resources = {r["urn"]: r for r in state_file(fake_pulumi)["checkpoint"]["latest"]["resources"]}
    urns = list(resources)
    assert urns.index(first) < urns.index(later) and urns.index(first) < urns.index(child)
    assert resources[later]["dependencies"] == [first]  # dependsOn, sorted and deduplicated
    assert resources[later]["parent"] == f"{prefix}pulumi:pulumi:Stack::demo-dev"
    assert resources[child]["parent"] == first and resources[child]["deletedWith"] == first
    assert resources[child]["dependencies"] == [first]  # implicit, from ${base.text}; parent is not one
    assert "dependencies" not in resources[first] and "deletedWith" not in resources[later]
    assert stack.up().summary.resource_changes == {"same": 4}

    def fails_with(replace: tuple[str, str], message: str) -> None:
        write_project(work, RESOURCE_OPTIONS_PROGRAM.replace(*replace))
        with pytest.raises(auto.CommandError, match=message):
            stack.up()

    fails_with(("- ${base}", "- ${base.id}"), "resource option dependsOn: expected resource, got string")
    fails_with(("- ${first}", "- first"), "resource option dependsOn: expected resource, got string")
    fails_with(
        ("      dependsOn:\n        - ${first}\n        - ${base}", "      dependsOn: ${first}"),
        "resource option dependsOn value must be a list of resources",
    )
    fails_with(("parent: ${first}", "parent: ${first.urn}"), "resource option parent: expected resource")
    fails_with(("deletedWith: ${base}", "provider: ${base}"), "passed as Provider was not a provider")
    fails_with(("text: later", "text: ${first}"), "cannot use resource 'first' as a value")
    fails_with(("child: ${child.text}", "child: x-${child}"), "cannot use resource 'child' as a value")
    # The failed updates changed nothing: the state still holds the four resources as before.
    assert {r["urn"] for r in state_file(fake_pulumi)["checkpoint"]["latest"]["resources"]} == set(urns)
    assert stack.destroy().summary.resource_changes == {"delete": 4}


def test_program_and_config_errors(fake_pulumi: FakePulumi, tmp_path: Path) -> None:
    work = write_project(
        tmp_path / "proj",
        "name: demo\nruntime: yaml\nconfig:\n  required:\n    type: string\noutputs:\n  out: ${required}\n",
    )
    stack = open_stack(fake_pulumi, work)
    with pytest.raises(auto.CommandError, match="Stack 'dev' is missing configuration value 'required'"):
        stack.up()
    assert lock_files(fake_pulumi) == []
    write_project(work, "name: demo\nruntime: yaml\noutputs:\n  out: ${nowhere.value}\n")
    with pytest.raises(auto.CommandError, match='"nowhere" not found'):
        stack.up()
    write_project(work, "name: demo\nruntime: go\n")
    with pytest.raises(auto.CommandError, match="installing dependencies failed"):
        auto.LocalWorkspace(
            work_dir=str(work), pulumi_command=auto.PulumiCommand(root=str(fake_pulumi.root))
        ).install()


def test_export_import_roundtrip_and_environments_unsupported(
    fake_pulumi: FakePulumi, tmp_path: Path
) -> None:
    work = write_project(tmp_path / "proj", PROGRAM)
    stack = open_stack(fake_pulumi, work)
    stack.set_config("length", auto.ConfigValue("6"))
    stack.up()
    exported = stack.export_stack()
    assert exported.version == 3 and exported.deployment is not None
    secrets = [r for r in exported.deployment["resources"] if r["urn"].endswith("::pw")]
    assert json.loads(secrets[0]["outputs"]["result"]["plaintext"])  # --show-secrets decrypts
    stack.destroy()
    stack.import_stack(exported)
    assert stack.outputs()["password"].secret
    assert stack.refresh().summary.resource_changes == {"same": 4}
    with pytest.raises(auto.CommandError, match="does not support environments"):
        stack.add_environments("some-env")


def test_history_timestamps_parse_and_order(fake_pulumi: FakePulumi, tmp_path: Path) -> None:
    work = write_project(tmp_path / "proj", "name: demo\nruntime: yaml\noutputs:\n  x: 1\n")
    stack = open_stack(fake_pulumi, work)
    stack.up()
    stack.up(message="second")
    info = stack.info()
    assert info is not None and info.end_time is not None and info.message == "second"
    assert info.start_time <= info.end_time
    assert stack.outputs()["x"].value == 1
    summaries = stack.workspace.list_stacks()
    assert summaries[0].last_update is not None and summaries[0].resource_count == 1
