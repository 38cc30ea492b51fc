"""The Program artifact, without a cluster: checks, determinism, digest, content, the cache."""

from __future__ import annotations

import copy
import gzip
import hashlib
import io
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from pko.controllers.program.artifact import (
    ArtifactCache,
    InvalidProgram,
    artifact_path,
    artifact_url,
    build_artifact,
    check_program,
)
from pko.controllers.program.reconciler import desired_status
from pko.controllers.program.server import advertised_address

SEED = Path(__file__).resolve().parents[1] / "data" / "seeds" / "001-staticwebsite-program.yaml"


def seed_program(**meta: Any) -> dict[str, Any]:
    doc: dict[str, Any] = next(d for d in yaml.safe_load_all(SEED.read_text()) if d)
    doc["metadata"].update({"namespace": "ns", **meta})
    return doc


def members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: m for m in tar.getmembers()}


def project(data: bytes) -> Any:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        f = tar.extractfile("Pulumi.yaml")
        assert f is not None
        return yaml.safe_load(f.read())


def test_the_same_program_always_gives_the_same_bytes_and_digest() -> None:
    first = build_artifact(seed_program())
    again = build_artifact(seed_program())
    assert first.data == again.data and first.digest == again.digest
    assert first.digest == "sha256:" + hashlib.sha256(first.data).hexdigest()
    assert first.size == len(first.data)
    # Key order in the object does not matter.
    shuffled = seed_program()
    body = shuffled["program"]
    shuffled["program"] = {k: body[k] for k in reversed(list(body))}
    resources = shuffled["program"]["resources"]
    shuffled["program"]["resources"] = {k: resources[k] for k in reversed(list(resources))}
    assert build_artifact(shuffled).data == first.data


def test_a_changed_body_or_name_changes_the_digest() -> None:
    base = build_artifact(seed_program())
    changed = seed_program()
    changed["program"]["outputs"]["extra"] = "x"
    assert build_artifact(changed).digest != base.digest
    assert build_artifact(seed_program(name="other")).digest != base.digest


def test_the_archive_has_one_normalised_pulumi_yaml() -> None:
    data = build_artifact(seed_program()).data
    assert gzip.decompress(data)  # plain gzip
    assert data[4:8] == b"\0\0\0\0"  # gzip header mtime 0
    info = members(data)
    assert list(info) == ["Pulumi.yaml"]
    m = info["Pulumi.yaml"]
    assert (m.mtime, m.uid, m.gid, m.mode, m.uname, m.gname) == (0, 0, 0, 0o644, "", "")
    assert m.isfile()


def test_pulumi_yaml_round_trips_the_program_body() -> None:
    obj = seed_program()
    doc = project(build_artifact(obj).data)
    assert doc["name"] == "staticwebsite" and doc["runtime"] == "yaml"
    assert list(doc)[:2] == ["name", "runtime"]
    assert doc["resources"] == obj["program"]["resources"]
    assert doc["outputs"] == obj["program"]["outputs"]
    assert "configuration" not in doc


def test_every_body_section_and_scalar_type_survives() -> None:
    obj = seed_program()
    obj["program"] = {
        "configuration": {"count": {"type": "Number", "default": 3}, "names": {"type": "List<String>"}},
        "variables": {
            "flag": True,
            "ratio": 0.5,
            "nothing": None,
            "yes": "yes",
            "on": "on",
            "uni": "héllo ✓",
        },
        "packages": {"random": "random@4.16.0"},
        "resources": {"pw": {"type": "random:RandomPassword", "properties": {"length": 16}}},
        "outputs": {"pw": "${pw.result}", "multi": "line one\nline two\n"},
    }
    doc = project(build_artifact(obj).data)
    for key in ("configuration", "variables", "packages", "resources", "outputs"):
        assert doc[key] == obj["program"][key], key
    assert list(doc) == ["name", "runtime", "packages", "configuration", "variables", "resources", "outputs"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"resources": {"b": {"type": "Bucket"}}}, "program.resources[b].type"),
        ({"resources": {"b": {"type": "aws:s3 :Bucket"}}}, "program.resources[b].type"),
        ({"resources": {"b": {"type": ""}}}, "program.resources[b].type"),
        ({"resources": {"b": {"properties": {}}}}, "program.resources[b].type"),
        (
            {"resources": {"b": {"type": "aws:s3:Bucket", "get": {"id": "x"}, "properties": {"a": 1}}}},
            "program.resources[b].get",
        ),
        ({"configuration": {"c": {}}}, "program.configuration[c]"),
        ({"configuration": {"c": {"type": "Boolean"}}}, "program.configuration[c].type"),
        ({"packages": {"p": " "}}, "program.packages[p]"),
    ],
)
def test_invalid_bodies_are_refused_naming_the_field(body: dict[str, Any], field: str) -> None:
    obj = seed_program()
    obj["program"] = body
    _, errors = check_program(obj)
    assert any(e.path == field for e in errors), errors
    with pytest.raises(InvalidProgram) as exc:
        build_artifact(obj)
    assert field in str(exc.value)


def test_valid_tokens_are_accepted() -> None:
    obj = seed_program()
    obj["program"] = {
        "resources": {
            "a": {"type": "aws:s3/bucket:Bucket"},
            "b": {"type": "pulumi:providers:kubernetes"},
            "c": {"type": "kubernetes:apps/v1:Deployment"},
            "d": {"type": "random:RandomString"},
        }
    }
    assert check_program(obj)[1] == []
    obj["program"] = {}
    assert check_program(obj)[1] == []  # an empty program is valid Pulumi YAML


def test_paths_and_urls_follow_the_go_operator() -> None:
    assert artifact_path("ns", "p", 3) == "programs/ns/p/3.tar.gz"
    assert artifact_url("op.ns:80", "ns", "p", 3) == "http://op.ns:80/programs/ns/p/3"
    assert artifact_url("https://files.example/", "ns", "p", 3) == "https://files.example/programs/ns/p/3"
    assert advertised_address("svc:80", ("", 9090)) == "svc:80"
    assert advertised_address("", ("127.0.0.1", 1234)) == "127.0.0.1:1234"
    assert advertised_address("", ("::1", 1234)) == "[::1]:1234"
    assert advertised_address("", ("", 9090)).endswith(":9090")


def test_the_cache_is_keyed_by_uid_and_generation_and_bounded() -> None:
    cache = ArtifactCache(maxsize=2)
    a1 = seed_program(uid="a", generation=1)
    first = cache.get(a1)
    assert cache.get(copy.deepcopy(a1)) is first
    cache.get(seed_program(uid="b", generation=1))
    cache.get(seed_program(uid="a", generation=2))
    assert len(cache) == 2  # a/1 was least recently used
    assert cache.get(a1) is not first and cache.get(a1).data == first.data
    bad = seed_program(uid="c", generation=1)
    bad["program"] = {"resources": {"b": {"type": "Bucket"}}}
    with pytest.raises(InvalidProgram):
        cache.get(bad)


def test_desired_status_is_stable_once_recorded() -> None:
    obj = seed_program(uid="u", generation=2)
    artifact = build_artifact(obj)
    status = desired_status(obj, artifact, "op:80")
    assert status["observedGeneration"] == 2
    art = status["artifact"]
    assert art["url"] == "http://op:80/programs/ns/staticwebsite/2"
    assert art["path"] == "programs/ns/staticwebsite/2.tar.gz"
    assert (art["revision"], art["digest"], art["size"]) == ("2", artifact.digest, artifact.size)
    assert [(c["type"], c["status"]) for c in status["conditions"]] == [("Ready", "True")]
    obj["status"] = copy.deepcopy(status)
    assert desired_status(obj, artifact, "op:80") == status

    invalid = InvalidProgram(check_program({"program": {"configuration": {"c": {}}}})[1])
    bad = desired_status(obj, invalid, "op:80")
    assert "artifact" not in bad
    conds = {c["type"]: c for c in bad["conditions"]}
    assert conds["Ready"]["status"] == "False" and conds["Stalled"]["status"] == "True"
    assert conds["Stalled"]["reason"] == "ProgramInvalid"
    assert "program.configuration[c]" in conds["Stalled"]["message"]
