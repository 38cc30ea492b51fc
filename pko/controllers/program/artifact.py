"""A Program as a deterministic tarball: checked, rendered to ``Pulumi.yaml``, packed, digested.

Why deterministic: the artifact's bytes are a pure function of the Program object (its name and
its ``program:`` body at one generation). The Program controller records the digest in
``status.artifact``, and any operator replica can serve the same bytes by rebuilding them from its
informer cache: no shared disk, nothing lost on a restart. So nothing in the archive may depend on
time, the host or dict order: one member ``Pulumi.yaml`` with mtime 0, uid/gid 0, mode 0644, no
user names, in a USTAR archive whose gzip header has mtime 0 and no file name; YAML keys sorted
below a fixed top-level order. (zlib's output could differ between zlib builds: replicas running
the same image agree.)

The layout follows the Go operator (``pulumi/program_controller.go``): ``Pulumi.yaml`` holds
``name: <Program name>``, ``runtime: yaml`` and the body; the artifact path is
``programs/<ns>/<name>/<generation>.tar.gz`` and its URL ``<adv-addr>/programs/<ns>/<name>/<generation>``.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import re
import tarfile
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import yaml

from pko.api.program import Program
from pko.api.validation import FieldError, format_errors, parse_program

__all__ = [
    "PROJECT_FILE",
    "ArtifactCache",
    "InvalidProgram",
    "ProgramArtifact",
    "artifact_path",
    "artifact_url",
    "build_artifact",
    "check_program",
    "project_yaml",
]

PROJECT_FILE: Final = "Pulumi.yaml"
# Top-level keys of Pulumi.yaml in the order written; body keys beyond these follow, sorted.
_KEY_ORDER: Final = ("name", "runtime", "packages", "configuration", "variables", "resources", "outputs")
_BODY_KEYS: Final = frozenset(_KEY_ORDER[2:])
# A Pulumi type token: `<package>:<type>` or `<package>:<module>:<type>` (module may hold `/`);
# lenient beyond "a package, a colon, no blanks", so no valid token is ever refused.
_TYPE_TOKEN: Final = re.compile(r"^[^:\s]+(:[^:\s]+)+$")
DEFAULT_CACHE_SIZE: Final = 256


class InvalidProgram(ValueError):
    """The Program cannot be turned into an artifact; ``errors`` name the fields at fault."""

    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__(format_errors(errors))
        self.errors = errors


@dataclass(frozen=True, slots=True)
class ProgramArtifact:
    """The tarball of one Program generation and what ``status.artifact`` says about it."""

    data: bytes
    digest: str
    """``sha256:<hex>`` of ``data``."""

    @property
    def size(self) -> int:
        return len(self.data)


def _token_errors(program: Program) -> list[FieldError]:
    """Checks beyond api/validation that only matter when the body is turned into Pulumi YAML."""
    errors: list[FieldError] = []
    for name, resource in sorted((program.program.resources or {}).items()):
        if not _TYPE_TOKEN.match(resource.type):
            errors.append(
                FieldError(
                    f"program.resources[{name}].type",
                    f"{resource.type!r} is not a Pulumi type token (<package>:<module>:<type>, "
                    "e.g. aws:s3:Bucket)",
                )
            )
    for name, spec in sorted((program.program.packages or {}).items()):
        if not spec.strip():
            errors.append(FieldError(f"program.packages[{name}]", "must not be empty"))
    return errors


def check_program(obj: Mapping[str, Any]) -> tuple[Program | None, list[FieldError]]:
    """Parse and check a raw Program: the model, and every problem found (empty when servable)."""
    program, errors = parse_program(obj)
    if program is not None:
        errors = [*errors, *_token_errors(program)]
    if not (obj.get("metadata") or {}).get("name"):
        errors.append(FieldError("metadata.name", "required"))
    return program, errors


def _sorted(value: Any) -> Any:
    """``value`` with every mapping's keys sorted (lists keep their order)."""
    if isinstance(value, Mapping):
        return {str(k): _sorted(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def project_yaml(name: str, body: Mapping[str, Any]) -> str:
    """The text of ``Pulumi.yaml``: name, ``runtime: yaml``, then the body in a fixed key order."""
    document: dict[str, Any] = {"name": name, "runtime": "yaml"}
    for key in _KEY_ORDER[2:]:
        if body.get(key) is not None:
            document[key] = _sorted(body[key])
    for key in sorted(k for k in body if k not in _BODY_KEYS and k not in document):
        if body[key] is not None:
            document[key] = _sorted(body[key])
    text: str = yaml.safe_dump(
        document, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1 << 20
    )
    return text


def _tarball(files: Mapping[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size = len(files[name])
            info.mtime = 0
            info.mode = 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(files[name]))
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def build_artifact(obj: Mapping[str, Any]) -> ProgramArtifact:
    """The artifact of a raw Program object; raises :class:`InvalidProgram` when it fails checks."""
    _, errors = check_program(obj)
    if errors:
        raise InvalidProgram(errors)
    name = str(obj["metadata"]["name"])
    text = project_yaml(name, obj.get("program") or {})
    data = _tarball({PROJECT_FILE: text.encode()})
    return ProgramArtifact(data, "sha256:" + hashlib.sha256(data).hexdigest())


def artifact_path(namespace: str, name: str, generation: int) -> str:
    """Where the Go operator stores the artifact (``status.artifact.path``)."""
    return f"programs/{namespace}/{name}/{generation}.tar.gz"


def artifact_url(advertised: str, namespace: str, name: str, generation: int) -> str:
    """``status.artifact.url``: the advertised address (``http://`` if it has no scheme) + path."""
    base = advertised.rstrip("/")
    if "://" not in base:
        base = "http://" + base
    return f"{base}/programs/{namespace}/{name}/{generation}"


class ArtifactCache:
    """Built artifacts by (uid, generation), least recently used dropped beyond ``maxsize``.

    The key is sound because a Program's body and name cannot change without a new generation
    (or, for the name, a new object). Only valid artifacts are kept; an invalid Program is
    re-checked on each call, which is cheap and rare.
    """

    def __init__(self, maxsize: int = DEFAULT_CACHE_SIZE) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self.maxsize = maxsize
        self._entries: OrderedDict[tuple[str, int], ProgramArtifact] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, obj: Mapping[str, Any]) -> ProgramArtifact:
        """The artifact of ``obj`` (built on a miss); raises :class:`InvalidProgram`."""
        meta = obj.get("metadata") or {}
        if not meta.get("uid"):
            return build_artifact(obj)  # not from the apiserver: no identity to cache under
        key = (str(meta["uid"]), int(meta.get("generation") or 0))
        cached = self._entries.get(key)
        if cached is not None:
            self._entries.move_to_end(key)
            return cached
        artifact = build_artifact(obj)
        self._entries[key] = artifact
        while len(self._entries) > self.maxsize:
            self._entries.popitem(last=False)
        return artifact
