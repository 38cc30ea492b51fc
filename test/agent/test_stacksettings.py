"""agent/stacksettings.py without Pulumi: where the stack settings file is, and its snapshots on disk
(taken once, never overwritten, restored with the stack's secrets-provider settings kept).
test_config_reset.py shows the same through the agent on the real engine."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from pko.agent import stacksettings as ss


def project(tmp_path: Path, text: str = "name: p\nruntime: yaml\n", name: str = "Pulumi.yaml") -> Path:
    work = tmp_path / "workspace"
    work.mkdir(parents=True, exist_ok=True)
    (work / name).write_text(text)
    return work


def test_the_settings_file_is_where_the_cli_keeps_it(tmp_path: Path) -> None:
    work = project(tmp_path)
    assert ss.settings_path(work, "dev") == work / "Pulumi.dev.yaml"
    # A fully qualified name uses its last component, as the CLI does (the stack's Name()).
    assert ss.settings_path(work, "org/p/dev") == work / "Pulumi.dev.yaml"
    # The project file's extension, whatever other settings files exist.
    (work / "Pulumi.dev.json").write_text("{}")
    assert ss.settings_path(work, "dev") == work / "Pulumi.dev.yaml"
    (work / "Pulumi.yaml").rename(work / "Pulumi.yml")
    assert ss.settings_path(work, "dev") == work / "Pulumi.dev.yml"


def test_a_json_project_and_the_clis_order(tmp_path: Path) -> None:
    work = project(tmp_path, '{"name": "p", "runtime": "yaml", "stackConfigDir": "conf"}', "Pulumi.json")
    assert ss.settings_path(work, "dev") == work / "conf" / "Pulumi.dev.json"
    (work / "Pulumi.yaml").write_text("name: p\nruntime: yaml\n")  # .json is found first, as by the CLI
    assert ss.settings_path(work, "dev") == work / "conf" / "Pulumi.dev.json"


def test_stack_config_dir_and_the_legacy_config_dir(tmp_path: Path) -> None:
    work = project(tmp_path, "name: p\nruntime: yaml\nstackConfigDir: settings/stacks\n")
    assert ss.settings_path(work, "org/p/prod") == work / "settings" / "stacks" / "Pulumi.prod.yaml"
    (work / "Pulumi.yaml").write_text("name: p\nruntime: yaml\nconfig: ../shared\n")
    assert ss.settings_path(work, "prod") == tmp_path / "shared" / "Pulumi.prod.yaml"
    # Go's filepath.Join keeps even an absolute stackConfigDir under the project.
    (work / "Pulumi.yaml").write_text("name: p\nruntime: yaml\nstackConfigDir: /etc/pulumi\n")
    assert ss.settings_path(work, "prod") == work / "etc" / "pulumi" / "Pulumi.prod.yaml"
    # A config block (the project's config schema) is not a directory.
    (work / "Pulumi.yaml").write_text("name: p\nruntime: yaml\nconfig:\n  a:\n    type: string\n")
    assert ss.settings_path(work, "prod") == work / "Pulumi.prod.yaml"


def test_no_project_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ss.StackSettingsError, match="no Pulumi project file"):
        ss.settings_path(tmp_path, "dev")


def test_a_snapshot_is_taken_once_and_survives_a_new_store(tmp_path: Path) -> None:
    work = project(tmp_path)
    path = work / "Pulumi.dev.yaml"
    original = b"# the checkout's\nconfig:\n  p:own: checkout\n"
    path.write_bytes(original)
    path.chmod(0o640)
    directory = ss.default_snapshot_dir(work)
    assert directory == tmp_path / ".agent" / "stack-settings"
    store = ss.SnapshotStore(directory)
    assert store.take(path, "dev")
    path.write_text("config:\n  p:own: changed\n  p:a: '1'\n")
    assert not store.take(path, "org/p/dev")  # same file, same snapshot

    files = list(directory.iterdir())
    assert len(files) == 1 and files[0].stat().st_mode & 0o777 == 0o600
    assert directory.stat().st_mode & 0o777 == 0o700
    assert b"checkout" not in files[0].read_bytes()  # not greppable (base64), though not encrypted
    stored = files[0].read_bytes()

    again = ss.SnapshotStore(directory)  # an agent restart
    assert not again.take(path, "dev")
    assert files[0].read_bytes() == stored
    assert again.restore(path, "dev")
    assert path.read_bytes() == original and path.stat().st_mode & 0o777 == 0o640


def test_an_absent_file_is_removed_again(tmp_path: Path) -> None:
    work = project(tmp_path)
    path = work / "Pulumi.dev.yaml"
    store = ss.SnapshotStore(ss.default_snapshot_dir(work))
    assert not store.restore(path, "dev")  # nothing to restore: the snapshot is taken now
    path.write_text("config:\n  p:a: '1'\nenvironment:\n  - org/env\n")
    assert store.restore(path, "dev")
    assert not path.exists()
    assert store.restore(path, "dev")  # nothing there: nothing to do
    assert not path.exists()


def test_the_stacks_secrets_provider_settings_are_kept(tmp_path: Path) -> None:
    """A stack the agent created has its secrets provider in the file; the checkout's file knows
    nothing of it, and without it the CLI would use the backend's default secrets manager."""
    work = project(tmp_path)
    path = work / "Pulumi.dev.yaml"
    store = ss.SnapshotStore(ss.default_snapshot_dir(work))
    store.take(path, "dev")
    path.write_text(
        "secretsprovider: awskms://alias/k\nencryptedkey: a2V5\n"
        "config:\n  p:pw:\n    secure: v1:abc\nenvironment:\n  - org/env\n"
    )
    store.restore(path, "dev")
    assert yaml.safe_load(path.read_text()) == {"secretsprovider": "awskms://alias/k", "encryptedkey": "a2V5"}

    # The checkout's own text is kept and the keys appended.
    own = "# ours\nconfig:\n  p:own: checkout # a comment\n"
    other = project(tmp_path / "other")
    opath = other / "Pulumi.dev.yaml"
    opath.write_text(own)
    ostore = ss.SnapshotStore(ss.default_snapshot_dir(other))
    ostore.take(opath, "dev")
    opath.write_text("encryptionsalt: v1:salt=:v1:x:y\nconfig:\n  p:own: changed\n  p:a: '1'\n")
    ostore.restore(opath, "dev")
    text = opath.read_text()
    assert text.startswith(own)
    assert yaml.safe_load(text) == {"config": {"p:own": "checkout"}, "encryptionsalt": "v1:salt=:v1:x:y"}

    # The checkout's own secrets provider wins.
    opath.write_text("encryptionsalt: v1:ours\nconfig: {}\n")
    ostore2 = ss.SnapshotStore(tmp_path / "elsewhere")
    ostore2.take(opath, "dev")
    opath.write_text("encryptionsalt: v1:new\nconfig:\n  p:a: '1'\n")
    ostore2.restore(opath, "dev")
    assert opath.read_text() == "encryptionsalt: v1:ours\nconfig: {}\n"


def test_a_flow_style_or_json_file_is_rewritten_whole(tmp_path: Path) -> None:
    assert ss.restored_content(b"{config: {p:a: x}}\n", b"encryptionsalt: s\n", False) is not None
    merged = ss.restored_content(b"{config: {p:a: x}}\n", b"encryptionsalt: s\n", False)
    assert merged is not None and yaml.safe_load(merged) == {"config": {"p:a": "x"}, "encryptionsalt": "s"}
    doc = ss.restored_content(b'{"config": {}}', b'{"encryptionsalt": "s", "config": {"p:a": "1"}}', True)
    assert doc is not None and json.loads(doc) == {"config": {}, "encryptionsalt": "s"}
    assert ss.restored_content(None, b'{"config": {"p:a": "1"}}', True) is None


def test_an_unwritable_snapshot_directory_keeps_the_snapshot_in_memory(tmp_path: Path) -> None:
    work = project(tmp_path)
    path = work / "Pulumi.dev.yaml"
    path.write_text("config:\n  p:own: checkout\n")
    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the directory would be: mkdir fails even for root
    store = ss.SnapshotStore(blocker / "snapshots")
    assert store.take(path, "dev")
    path.write_text("config:\n  p:own: changed\n")
    assert store.restore(path, "dev")
    assert path.read_text() == "config:\n  p:own: checkout\n"


def test_a_broken_snapshot_is_an_error_not_a_new_snapshot(tmp_path: Path) -> None:
    work = project(tmp_path)
    path = work / "Pulumi.dev.yaml"
    directory = tmp_path / "snaps"
    ss.SnapshotStore(directory).take(path, "dev")
    (stored,) = directory.iterdir()
    stored.write_text("{not json")
    path.write_text("config:\n  p:a: '1'\n")
    with pytest.raises(ss.StackSettingsError, match="unreadable"):
        ss.SnapshotStore(directory).restore(path, "dev")
    with pytest.raises(ss.StackSettingsError, match="unreadable"):
        ss.SnapshotStore(directory).take(path, "dev")
    assert stored.read_text() == "{not json"
    assert path.read_text() == "config:\n  p:a: '1'\n"


def test_a_snapshot_taken_meanwhile_by_another_process_wins(tmp_path: Path) -> None:
    work = project(tmp_path)
    path = work / "Pulumi.dev.yaml"
    path.write_text("config:\n  p:own: first\n")
    directory = tmp_path / "snaps"
    late = ss.SnapshotStore(directory)
    assert late.get(path) is None
    ss.SnapshotStore(directory).take(path, "dev")  # the other process
    path.write_text("config:\n  p:own: second\n")
    late._persist(ss.Snapshot(path, path.read_bytes(), 0o644), "dev")  # loses the race to link
    snapshot = late.get(path)
    assert snapshot is not None and snapshot.content == b"config:\n  p:own: first\n"
    assert [p.name for p in directory.iterdir() if p.name.startswith(".")] == []  # no temporary left
    assert os.listdir(directory) == [f"{late._key(path)}.json"]
