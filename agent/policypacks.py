"""Policy packs on a preview or an up: the CLI arguments a request's packs become, the violations the
engine reports, and the failure a run that a pack stopped ends with.

The engine (pulumi v3.274 with the v3.259 language hosts) runs a pack directory through its language
host (``RunPlugin`` of kind analyzer: for Node.js ``@pulumi/pulumi/cmd/run-policy-pack``, which needs
``@pulumi/policy`` beside the pack or on NODE_PATH) and reports each violation as a ``policyEvent``
(pack name and version, policy, enforcement level "mandatory"/"warning"/"remediate"/"none", resource,
message). A mandatory violation makes the CLI exit with an error after it refused the resource's step;
a pack that does not start ends the run with one of the engine's own lines
(pkg/engine/update.go, pkg/resource/plugin/analyzer_plugin.go), its runtime's error as a diagnostic.
Those two failures get their own reasons, PolicyViolation and PolicyPackFailed, so a controller never
reads them as a program error or a bare exit status.

A Python pack goes to the engine as a launcher the agent writes (:mod:`pko.agent.policypython`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pko.agent.policypython import launcher as python_launcher
from pko.api.generated.pko.agent import v1 as pb
from pko.api.stackterms import POLICY_PACK_FAILED, POLICY_VIOLATION

REASON_POLICY_VIOLATION = POLICY_VIOLATION
REASON_POLICY_PACK_FAILED = POLICY_PACK_FAILED

# The engine's enforcement levels as the API names them (pulumi's own words in `pulumi policy`).
_LEVELS = {"warning": "advisory", "advisory": "advisory", "mandatory": "mandatory", "remediate": "remediate"}
_LEVELS |= {"none": "disabled", "disabled": "disabled"}
# The engine's lines for a pack that did not load or start (analyzer_plugin.go, update.go, plugin.go).
_PACK_FAILED = re.compile(
    r"policy pack not started|failed to load Pulumi policy project|could not start policy pack"
    r"|policy pack \S+ failed to start|policy pack not found at|policy pack's dependencies are not installed"
    r"|validating policy config|loading PulumiPolicy\.yaml"
)
# A runtime's own error line in a pack's diagnostic: "SyntaxError: Unexpected identifier 'is'",
# "Error: Cannot find module '@pulumi/policy'", "ModuleNotFoundError: No module named 'pulumi_policy'".
_RUNTIME_ERROR = re.compile(r"^\s*(?:[A-Z]\w*)?Error: .+")
# A TypeScript pack's type errors: ts-node's "TSError: \u2a2f Unable to compile TypeScript:" is followed by
# tsc's diagnostics, "index.ts(27,7): error TS2322: Type 'string' is not assignable to type 'number'."
# (ts-node's own format: a tsconfig's "pretty", which `pulumi policy new` writes, does not change it).
_TSC_ERROR = re.compile(r"^\s*\S+\(\d+,\d+\): error TS\d+: .+")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # a fetched pack's name: its directory
_MESSAGE_VIOLATIONS = 3  # violations (type errors) a failure's message names; the result lists them all


@dataclass(frozen=True)
class PackArgs:
    """The CLI's view of a request's packs: ``--policy-pack`` directories (a Python pack's launcher) and,
    when any pack has configuration, one ``--policy-pack-config`` file per pack (the CLI pairs them by
    position); ``launchers``: the directories written for Python packs."""

    paths: list[str]
    configs: list[str]
    launchers: list[str] = field(default_factory=list)

    def remove(self) -> None:
        """Remove what :func:`pack_args` wrote: the operation's files outlive it in no case."""
        for config in self.configs:
            Path(config).unlink(missing_ok=True)
        for launcher in self.launchers:
            shutil.rmtree(launcher, ignore_errors=True)


def pack_path(pack: pb.PolicyPack, program_dir: Path, policy_dir: Path | None = None) -> Path:
    """Where ``pack`` is: its path (or its name, the Go agent's only field), under the program's
    directory unless absolute; a fetched pack's path under its checkout, ``<policy_dir>/<name>``
    (the workspace pod's ``/share/policy``; default ``policy`` beside the program's directory)."""
    if pack.fetched:
        return (policy_dir or program_dir.parent / "policy") / pack.name / pack.path
    return program_dir / (pack.path or pack.name)


def pack_args(
    packs: Sequence[pb.PolicyPack],
    program_dir: Path,
    config_dir: Path,
    operation_id: str,
    env: Mapping[str, str] | None = None,
    policy_dir: Path | None = None,
) -> PackArgs:
    """The arguments for ``packs``, writing each pack's configuration into ``config_dir`` (a pack
    without any gets ``{}``: its defaults). Configuration that is not a JSON object is refused here
    with ValueError naming the pack, not by the CLI after the program started. A Python pack's
    ``--policy-pack`` is its launcher (:func:`python_launcher`), written into ``config_dir`` too."""
    values = [_config(_fetched_inside(pack)) for pack in packs]  # refused before anything is written
    args = PackArgs([], [], [])
    try:
        for i, pack in enumerate(packs):
            directory = pack_path(pack, program_dir, policy_dir)
            launch_dir = config_dir / f"{operation_id}-{i}-python"
            launcher = python_launcher(pack, directory, launch_dir, os.environ if env is None else env)
            if launcher is not None:
                args.launchers.append(str(launcher.parent))
            args.paths.append(str(launcher or directory))
        if any(p.config for p in packs):
            config_dir.mkdir(parents=True, exist_ok=True)
            for i, value in enumerate(values):
                file = config_dir / f"{operation_id}-{i}.json"
                file.write_text(json.dumps(value))
                args.configs.append(str(file))
    except BaseException:
        args.remove()  # a pack refused (its virtualenv): nothing of the operation stays behind
        raise
    return args


def _fetched_inside(pack: pb.PolicyPack) -> pb.PolicyPack:
    """``pack``, when it is not fetched or its directory stays inside its checkout; else ValueError."""
    if pack.fetched and (
        not _DNS_LABEL.match(pack.name) or pack.path.startswith("/") or ".." in pack.path.split("/")
    ):
        raise ValueError(f"policy pack {pack.name!r}: a fetched pack's path must stay inside its repository")
    return pack


def _config(pack: pb.PolicyPack) -> dict[str, Any]:
    """The pack's configuration as the JSON object the CLI reads ({} without any)."""
    try:
        value = json.loads(pack.config) if pack.config else {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"policy pack {pack.name!r}: its config is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"policy pack {pack.name!r}: its config must be a JSON object")
    return value


def enforcement_level(engine_level: str) -> str:
    """The API's word for the engine's enforcement level (unknown ones kept as the engine says)."""
    return _LEVELS.get(engine_level, engine_level)


@dataclass
class PolicyObservations:
    """The policy violations and pack diagnostics of one run, gathered from its engine events."""

    violations: list[pb.PolicyViolation] = field(default_factory=list)
    _seen: set[tuple[str, ...]] = field(default_factory=set)

    def observe(self, event: Mapping[str, Any]) -> None:
        policy = event.get("policyEvent")
        if not isinstance(policy, Mapping):
            return
        violation = pb.PolicyViolation(
            policy_pack=str(policy.get("policyPackName") or ""),
            policy_pack_version=str(policy.get("policyPackVersion") or ""),
            policy=str(policy.get("policyName") or ""),
            enforcement_level=enforcement_level(str(policy.get("enforcementLevel") or "")),
            urn=str(policy.get("resourceUrn") or ""),
            message=_ANSI.sub("", str(policy.get("message") or "")).strip(),
        )
        key = (
            violation.policy_pack,
            violation.policy,
            violation.enforcement_level,
            violation.urn,
            violation.message,
        )
        if key not in self._seen:  # a preview and its update report the same violation
            self._seen.add(key)
            self.violations.append(violation)

    @property
    def mandatory(self) -> list[pb.PolicyViolation]:
        return [v for v in self.violations if v.enforcement_level == "mandatory"]


def describe(violation: pb.PolicyViolation) -> str:
    """One violation in a sentence: pack@version, policy, resource, the policy's own message."""
    pack = (
        f"{violation.policy_pack}@{violation.policy_pack_version}"
        if violation.policy_pack_version
        else (violation.policy_pack)
    )
    where = violation.urn or "the stack"
    said = f"{pack} {violation.policy} ({violation.enforcement_level}) on {where}"
    message = violation.message.splitlines()[-1] if violation.message else ""
    return f"{said}: {message}" if message else said


def violation_failure(observations: PolicyObservations, detail: str) -> pb.Failure | None:
    """The failure of a run that reported a mandatory violation, or None when it reported none."""
    mandatory = observations.mandatory
    if not mandatory:
        return None
    named = "; ".join(describe(v) for v in mandatory[:_MESSAGE_VIOLATIONS])
    more = (
        f" (and {len(mandatory) - _MESSAGE_VIOLATIONS} more)" if len(mandatory) > _MESSAGE_VIOLATIONS else ""
    )
    return pb.Failure(
        reason=REASON_POLICY_VIOLATION,
        message=f"{len(mandatory)} mandatory policy violation(s): {named}{more}",
        detail=detail,
    )


def pack_failure(
    error_text: str,
    diagnostics: Iterable[tuple[str, str]],
    packs: Sequence[pb.PolicyPack],
    program_dir: Path,
    detail: str,
    launched: Sequence[str] = (),
    policy_dir: Path | None = None,
) -> pb.Failure | None:
    """The failure of a run whose policy pack did not load or start, naming the pack and quoting the
    tool (the runtime's error line and tsc's type errors, else the engine's), or None when no pack
    failed. ``launched``: what the CLI was given for each pack (:attr:`PackArgs.paths`: a Python
    pack's launcher)."""
    text = _ANSI.sub("", error_text)
    engine = next((line.strip() for line in text.splitlines() if _PACK_FAILED.search(line)), None)
    if engine is None or not packs:
        return None
    engine = engine.removeprefix("error:").strip()
    said = [_ANSI.sub("", message) for _, message in diagnostics]
    # The pack the engine's line names, else the first a diagnostic or the text names (the longest path
    # first: one pack's directory may begin with another's name).
    named = [(str(pack_path(p, program_dir, policy_dir)), p) for p in packs]
    named += list(zip(launched, packs, strict=False))
    paths = sorted(named, key=lambda item: -len(item[0]))
    pack = next(
        (p for texts in ([engine], said, [text]) for path, p in paths if any(path in t for t in texts)),
        packs[0],
    )
    path = str(pack_path(pack, program_dir, policy_dir))
    # The runtime's words: in the pack's diagnostic when the engine sent one, else on the CLI's stderr.
    sources = [m for m in said if path in m] or [text]
    lines = [line.strip() for message in sources for line in message.splitlines()]
    tool = list(dict.fromkeys(line for line in lines if _RUNTIME_ERROR.match(line)))
    tsc = list(dict.fromkeys(line for line in lines if _TSC_ERROR.match(line)))
    if (more := len(tsc) - _MESSAGE_VIOLATIONS) > 0:  # a pack with many type errors: the first ones
        tsc = [*tsc[: _MESSAGE_VIOLATIONS - 1], f"{tsc[_MESSAGE_VIOLATIONS - 1]} (and {more} more)"]
    words = _sentence(tool + tsc) or engine
    return pb.Failure(
        reason=REASON_POLICY_PACK_FAILED,
        message=f"policy pack {pack.name!r} could not be loaded: {words}",
        detail=detail,
    )


def _sentence(lines: Sequence[str]) -> str:
    """A tool's lines in one sentence, "; " between them; a line that ends with a colon (ts-node's
    "Unable to compile TypeScript:") runs on into the next."""
    said = ""
    for line in lines:
        said += (" " if said.endswith(":") else "; ") + line if said else line
    return said


def failure(
    error_text: str,
    diagnostics: Iterable[tuple[str, str]],
    observations: PolicyObservations,
    packs: Sequence[pb.PolicyPack],
    program_dir: Path,
    launched: Sequence[str] = (),
    policy_dir: Path | None = None,
) -> pb.Failure | None:
    """The failure a policy pack caused in a run that failed: a pack that did not load, else a
    mandatory violation; None when the packs had no part in it (classify it as any other)."""
    detail = "\n".join([line for line in _ANSI.sub("", error_text).splitlines() if line.strip()][-20:])
    failed = pack_failure(error_text, diagnostics, packs, program_dir, detail, launched, policy_dir)
    return failed or violation_failure(observations, detail)


def refused(out: pb.OperationResult, message: str, started: datetime) -> pb.OperationResult:
    """The result of a preview or up refused before the CLI ran: a pack's configuration is unusable."""
    out.state = pb.OperationState.FAILED
    out.failure = pb.Failure(reason=REASON_POLICY_PACK_FAILED, message=message)
    out.summary = pb.UpdateSummary(
        start_time=started, end_time=datetime.now(UTC), result="failed", message=message
    )
    return out
