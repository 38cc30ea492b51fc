"""agent/policypacks.py without an engine: the engine's policy events and error text (as pulumi v3.274
writes them, seen in test_policy_packs.py) read into violations and failures, and a pack's
configuration into the CLI's files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pko.agent import policypacks
from pko.api.generated.pko.agent import v1 as pb

URN = "urn:pulumi:dev::policed::command:local:Command::step"


def event(level: str, policy: str = "no-forbidden-commands", urn: str = URN) -> dict[str, object]:
    return {
        "sequence": 7,
        "policyEvent": {
            "resourceUrn": urn,
            "message": "A command may not say 'forbidden'.\n\x1b[31mthis command says 'forbidden'\x1b[0m",
            "color": "never",
            "policyName": policy,
            "policyPackName": "pko-commands",
            "policyPackVersion": "0.1.0",
            "policyPackVersionTag": "0.1.0",
            "enforcementLevel": level,
        },
    }


def test_engine_levels_read_as_the_apis_words_and_each_violation_is_kept_once() -> None:
    seen = policypacks.PolicyObservations()
    for data in (
        event("mandatory"),
        event("warning", "advisory-one"),
        event("mandatory"),
        {"summaryEvent": {}},
    ):
        seen.observe(data)
    seen.observe(event("none", "off", urn=""))
    assert [(v.policy, v.enforcement_level, v.urn) for v in seen.violations] == [
        ("no-forbidden-commands", "mandatory", URN),
        ("advisory-one", "advisory", URN),
        ("off", "disabled", ""),
    ]
    assert seen.violations[0].message == "A command may not say 'forbidden'.\nthis command says 'forbidden'"
    assert [v.policy for v in seen.mandatory] == ["no-forbidden-commands"]


def test_only_a_mandatory_violation_fails_a_run_and_its_message_names_pack_policy_resource_and_message() -> (
    None
):
    seen = policypacks.PolicyObservations()
    seen.observe(event("warning", "advisory-one"))
    assert policypacks.violation_failure(seen, "") is None
    seen.observe(event("mandatory"))
    failure = policypacks.violation_failure(seen, "detail")
    assert failure is not None and failure.reason == "PolicyViolation"
    assert failure.message == (
        f"1 mandatory policy violation(s): pko-commands@0.1.0 no-forbidden-commands (mandatory) on {URN}: "
        "this command says 'forbidden'"
    )


def test_many_mandatory_violations_name_the_first_three() -> None:
    seen = policypacks.PolicyObservations()
    for n in range(5):
        seen.observe(event("mandatory", urn=f"{URN}-{n}"))
    failure = policypacks.violation_failure(seen, "")
    assert failure is not None and failure.message.startswith("5 mandatory policy violation(s): ")
    assert failure.message.endswith("(and 2 more)") and f"{URN}-2" in failure.message
    assert f"{URN}-3" not in failure.message


BROKEN_STDERR = """\
error: [runtime] Running program '/w/policies/broken' failed with an unhandled exception:
/w/policies/broken/index.js:26
this is not javascript(
     ^^
SyntaxError: Unexpected identifier 'is'
error: policy pack not started: could not read policy pack port: io: read/write on closed pipe
"""


def test_a_pack_that_did_not_start_is_named_with_its_runtimes_words() -> None:
    packs = [
        pb.PolicyPack(name="commands", path="policies/commands"),
        pb.PolicyPack(name="broken", path="policies/broken"),
    ]
    failure = policypacks.pack_failure(BROKEN_STDERR, [], packs, Path("/w"), "")
    assert failure is not None and failure.reason == "PolicyPackFailed"
    assert (
        failure.message == "policy pack 'broken' could not be loaded: SyntaxError: Unexpected identifier 'is'"
    )


# A TypeScript pack with type errors (ts-node's TSError, tsc's diagnostics: test_policy_packs.py).
MISTYPED_STDERR = """\
error: [runtime] Running program '/w/policies/typed' failed with an unhandled exception:

TSError: \u2a2f Unable to compile TypeScript:

{errors}

error: policy pack not started: could not read policy pack port: io: read/write on closed pipe
"""
TYPE_ERROR = "index.ts({line},7): error TS2322: Type 'string' is not assignable to type 'number'."


def test_a_typescript_pack_that_does_not_compile_is_named_with_tscs_words() -> None:
    packs = [pb.PolicyPack(name="typed", path="policies/typed")]
    text = MISTYPED_STDERR.format(errors=TYPE_ERROR.format(line=38))
    failure = policypacks.pack_failure(text, [], packs, Path("/w"), "")
    assert failure is not None and failure.reason == "PolicyPackFailed"
    assert failure.message == (
        "policy pack 'typed' could not be loaded: TSError: \u2a2f Unable to compile TypeScript: "
        "index.ts(38,7): error TS2322: Type 'string' is not assignable to type 'number'."
    )
    # Many type errors: the first three, and how many more.
    text = MISTYPED_STDERR.format(errors="\n".join(TYPE_ERROR.format(line=n) for n in range(40, 45)))
    failure = policypacks.pack_failure(text, [], packs, Path("/w"), "")
    assert failure is not None
    said = failure.message.removeprefix("policy pack 'typed' could not be loaded: TSError: ")
    assert said.count("error TS2322") == 3 and said.endswith("'number'. (and 2 more)"), said
    assert "index.ts(40,7)" in said and "index.ts(42,7)" in said and "index.ts(43,7)" not in said, said


def test_a_pack_directory_without_a_project_is_named_with_the_engines_words() -> None:
    text = (
        'error: failed to load Pulumi policy project located at "/w/missing": '
        "open /w/missing/PulumiPolicy.yaml: no such file or directory"
    )
    failure = policypacks.pack_failure(text, [], [pb.PolicyPack(name="missing")], Path("/w"), "")
    assert failure is not None
    assert failure.message == (
        "policy pack 'missing' could not be loaded: failed to load Pulumi policy project located at "
        '"/w/missing": open /w/missing/PulumiPolicy.yaml: no such file or directory'
    )


def test_a_failure_that_no_pack_caused_is_left_to_the_other_reasons() -> None:
    packs = [pb.PolicyPack(name="commands")]
    text = "error: update failed\nerror: the stack is currently locked by 1 lock(s)"
    assert policypacks.failure(text, [], policypacks.PolicyObservations(), packs, Path("/w")) is None
    assert policypacks.pack_failure(BROKEN_STDERR, [], [], Path("/w"), "") is None  # no packs ran


def test_configuration_becomes_one_file_per_pack_and_none_without_any(tmp_path: Path) -> None:
    plain = [pb.PolicyPack(name="a", path="/packs/a"), pb.PolicyPack(name="b")]
    assert policypacks.pack_args(plain, tmp_path, tmp_path / "cfg", "op") == policypacks.PackArgs(
        [str(Path("/packs/a")), str(tmp_path / "b")], []
    )
    configured = [plain[0], pb.PolicyPack(name="b", config='{"p": "mandatory"}')]
    args = policypacks.pack_args(configured, tmp_path, tmp_path / "cfg", "op")
    assert [json.loads(Path(c).read_text()) for c in args.configs] == [{}, {"p": "mandatory"}]
    with pytest.raises(ValueError, match="policy pack 'b': its config is not JSON"):
        policypacks.pack_args([pb.PolicyPack(name="b", config="{")], tmp_path, tmp_path / "cfg", "op")
