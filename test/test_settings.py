"""The declared settings (pko.settings) against what they feed: the Options classes, the controllers, the
address modes and images of the API, and the settings table of docs/operator.md, read back a second way
(from ``pko --help``). The names and defaults themselves are pinned in test/test_settings_names.py."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path
from typing import Any

import pytest

from pko.controllers.options import AddressMode, ControllerOptions
from pko.controllers.retrysettings import RetrySettings
from pko.devtools import apiref_settings, gen_apiref
from pko.machinery.controller import CONTROLLER_NAMES
from pko.machinery.leaderelection import LeaderElectionConfig
from pko.machinery.manageroptions import ManagerOptions
from pko.settings import DECLARED, Settings, build_parser, parse_settings
from pko.settings.operator import GROUPS

REPO = Path(__file__).resolve().parents[1]
OPTIONS: dict[str, type[Any]] = {
    cls.__name__: cls for cls in (ControllerOptions, RetrySettings, ManagerOptions, LeaderElectionConfig)
}
# Fields no flag sets: built by the process (the identity, the election, the retry settings as a whole)
# or left at their defaults by the operator (the manager's internals).
NOT_FED = {
    "ControllerOptions": {"retry"},
    "RetrySettings": set(),
    "ManagerOptions": {
        "leader_election",
        "resync_period",
        "discovery_interval",
        "optional_sync_timeout",
        "liveness_stall_threshold",
    },
    "LeaderElectionConfig": {"identity", "predecessors", "release_on_cancel"},
}


def fed() -> dict[str, dict[str, Any]]:
    """Options class -> field -> the setting feeding it (a ``field[key]`` feed: key -> setting)."""
    out: dict[str, dict[str, Any]] = {name: {} for name in OPTIONS}
    for setting in DECLARED:
        for feed in setting.feeds:
            cls, _, field = feed.partition(".")
            name, _, key = field.partition("[")
            if key:
                out[cls].setdefault(name, {})[key.removesuffix("]")] = setting
            else:
                assert name not in out[cls], f"{feed} is fed twice"
                out[cls][name] = setting
    return out


def test_every_feed_names_a_field_and_every_field_has_a_setting_or_a_reason() -> None:
    for cls, fields in fed().items():
        declared = {f.name for f in dataclasses.fields(OPTIONS[cls])}
        assert set(fields) <= declared, cls
        assert set(fields) | NOT_FED[cls] == declared, cls


def test_the_options_classes_defaults_are_the_declared_defaults() -> None:
    """A test or tool building ControllerOptions() gets what the operator gets with no flag."""
    parsed = parse_settings([], env={})
    for cls, fields in fed().items():
        defaults = {f.name: f for f in dataclasses.fields(OPTIONS[cls])}
        for name, setting in fields.items():
            field = defaults[name]
            if field.default is not dataclasses.MISSING:
                assert field.default == setting.__get__(parsed), (cls, name)
    assert parsed.controller_options() == ControllerOptions()
    options = parsed.manager_options("me")
    assert dataclasses.replace(options, max_concurrent_reconciles={}) == ManagerOptions()


def test_one_worker_setting_per_controller_and_the_address_modes_of_the_agent_client() -> None:
    workers = fed()["ManagerOptions"]["max_concurrent_reconciles"]
    assert tuple(workers) == CONTROLLER_NAMES
    assert dict(parse_settings([], env={}).max_concurrent_reconciles) == {
        name: int(setting.default) for name, setting in workers.items()
    }
    assert Settings.workspace_address_mode.kind.choices == typing.get_args(AddressMode)


def test_the_workspace_images_shown_are_the_apis() -> None:
    from pko.api.workspace import DEFAULT_IMAGES

    for profile, image in DEFAULT_IMAGES.items():
        assert f"{image} ({profile})" in Settings.workspace_image.shown


def test_settings_compare_by_value_and_refuse_a_missing_one() -> None:
    assert parse_settings([], env={}) == parse_settings([], env={})
    assert parse_settings(["--watch-namespace=a"], env={}) != parse_settings([], env={})
    values = dict(parse_settings([], env={}).values)
    del values["log_level"]
    with pytest.raises(ValueError, match="log_level"):
        Settings(values)


# --- the docs' table ---------------------------------------------------------------------------------


def settings_page() -> dict[Path, str]:
    """What hack/gen_apiref.py writes to the page (test/test_apiref.py checks every generated page)."""
    path = gen_apiref.SETTINGS_PAGE
    return {path: apiref_settings.render_page(path.read_text())}


def table() -> str:
    page = settings_page()[gen_apiref.SETTINGS_PAGE]
    begin, end = page.index(apiref_settings.BEGIN), page.index(apiref_settings.END)
    return page[begin:end]


def test_the_table_lists_every_flag_and_variable_of_pko_help_in_its_section() -> None:
    """A second reading: the flags and ``[VARIABLES]`` of ``pko --help``, each on a row of the table."""
    parser = build_parser({})
    help_text = parser.format_help()
    flags = set(re.findall(r"^  (--[a-z-]+)", help_text, flags=re.MULTILINE)) - {"--version"}
    words = " ".join(help_text.split("\n\n", 1)[1].split())  # after the usage; [A, else B] may wrap
    variables = {v for group in re.findall(r"\[([A-Z_, else]+)\]", words) for v in group.split(", else ")}
    variables -= {action.metavar for action in parser._actions}  # [BOOL]: a value, not a variable
    assert {"POD_NAMESPACE", "MAX_CONCURRENT_RECONCILES", "LOG_LEVEL"} <= variables
    assert len(flags) == len(DECLARED) > 30
    rows = [line for line in table().splitlines() if line.startswith("| `--")]
    assert len(rows) == len(flags)
    for flag in flags:
        assert any(row.startswith(f"| `{flag}`") for row in rows), flag
    for var in variables:
        assert any(f"`{var}`" in row for row in rows), var
    sections = re.split(r"^### ", table(), flags=re.MULTILINE)[1:]
    assert [s.split("\n", 1)[0].lower() for s in sections] == [g.title.lower() for g in GROUPS]
    for setting in DECLARED:
        section = sections[GROUPS.index(setting.group)]
        assert f"| `{setting.flag}`" in section
        assert setting.default_shown() == "" or f"`{setting.default}`" in section or setting.shown


def test_the_committed_table_drifts_when_a_declaration_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    assert gen_apiref.stale_files(settings_page()) == []
    changed = tuple(
        dataclasses.replace(s, help=s.help + " (changed)") if s.name == "agent_image" else s for s in DECLARED
    )
    monkeypatch.setattr(apiref_settings, "DECLARED", changed)
    assert gen_apiref.stale_files(settings_page()) == [gen_apiref.SETTINGS_PAGE]


def test_a_page_without_the_markers_is_refused() -> None:
    with pytest.raises(SystemExit, match="lacks the lines"):
        apiref_settings.render_page("# no table here\n")


def test_each_retry_setting_names_a_stack_field_of_the_crd_and_the_retries_table_lists_it() -> None:
    """A second reading of the Stack fields: the Stack CRD's schema, not the models' names."""
    from pko.api import crdgen

    stack = next(d for d in crdgen.DEFINITIONS if d.kind == "Stack")
    schema = crdgen.object_schema(stack)
    overridable = [s for s in DECLARED if s.overrides]
    assert {s.name for s in overridable} == {s.name for s in fed()["RetrySettings"].values()}
    page = apiref_settings.render_retries_page(gen_apiref.RETRIES_PAGE.read_text())
    for setting in overridable:
        node = schema
        for part in setting.overrides.split("."):
            node = node["properties"][part]
        assert node["type"] in ("integer", "number"), setting.overrides
        assert f"| `{setting.flag}` | `{setting.env[0]}` | `{setting.overrides}` |" in page


# Read by the process itself, not a setting: the pod's name prefixes its leader election identity.
PROCESS_VARIABLES = {"POD_NAME"}
MANAGER_MANIFESTS = [
    *sorted((REPO / "config").glob("manager/*.yaml")),
    *sorted((REPO / "config").glob("local/*.yaml")),
    REPO / "charts/pko/templates/deployment-controller-manager.yaml",
]


def test_the_manifests_and_the_chart_give_the_manager_only_flags_and_variables_it_declares() -> None:
    """An unknown flag stops the operator, but a misspelt variable would be ignored without a word."""
    variables = {var for s in DECLARED for var in s.env} | PROCESS_VARIABLES
    flags = {flag for s in DECLARED for flag in (s.flag, *s.aliases)}
    seen_variables: set[str] = set()
    seen_flags: set[str] = set()
    for path in MANAGER_MANIFESTS:
        text = path.read_text()
        seen_variables |= set(re.findall(r"^\s*- name: ([A-Z][A-Z0-9_]*)\s*$", text, flags=re.MULTILINE))
        seen_flags |= set(re.findall(r"^\s*- (--[a-z][a-z-]*)", text, flags=re.MULTILINE))
    assert {"POD_NAMESPACE", "AGENT_IMAGE", "LEADER_ELECTION_LEASE_DURATION"} <= seen_variables
    assert {"--leader-elect", "--program-fs-adv-addr"} <= seen_flags
    assert seen_variables <= variables
    assert seen_flags <= flags
