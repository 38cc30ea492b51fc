"""docs/reference/api.md and conditions.md are what hack/gen_apiref.py generates now, and they cover
every field, reason, annotation and metric (each checked here by a second way of finding them)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import markdown
import pytest

from pko.devtools import apiref_api, apiref_tables, gen_apiref

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


@functools.cache
def pages() -> dict[Path, str]:
    """Generated once per session; tests must not modify it."""
    return gen_apiref.expected_files()


def api_page() -> str:
    return pages()[gen_apiref.API_PAGE]


def conditions_page() -> str:
    return pages()[gen_apiref.CONDITIONS_PAGE]


# --- drift -----------------------------------------------------------------------------------


def test_committed_pages_match_the_code() -> None:
    for path, text in pages().items():
        assert path.read_text() == text, f"{path.relative_to(REPO)} is out of date: run hack/gen_apiref.py"


def test_check_passes_now_and_fails_on_drift(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gen_apiref, "expected_files", pages)
    assert gen_apiref.main(["--check"]) == 0
    drifted = {path: text + "drift\n" for path, text in pages().items()}
    monkeypatch.setattr(gen_apiref, "expected_files", lambda: drifted)
    assert gen_apiref.main(["--check"]) == 1


# --- the API reference -----------------------------------------------------------------------


def sections(text: str) -> dict[str, str]:
    """Heading (## or ###) -> its text up to the next heading."""
    parts = re.split(r"^#{2,3} (.+)$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_field_of_every_model_has_a_row_in_its_section() -> None:
    by_heading = sections(api_page())
    fields = apiref_api.documented_fields()
    assert len(fields) > 250
    missing = [
        (heading, wire) for heading, wire in fields if f"| `{wire}`" not in by_heading.get(heading, "")
    ]
    assert missing == []


def test_every_kind_and_nested_model_of_the_crds_is_documented() -> None:
    """Each kind's spec and status fields, read from the CRD schema rather than the models, have rows."""
    from pko.api import crdgen

    by_heading = sections(api_page())
    for definition in crdgen.DEFINITIONS:
        kind = definition.kind
        assert kind in by_heading
        schema = crdgen.object_schema(definition)
        parts = [p for p in ("spec", "status") if p in schema["properties"]]
        if definition.kind == "WorkspaceTemplate":
            # its spec is a partial Workspace (documented there) and policyPacks; it has no status
            assert parts == ["spec"] and "partial [EnforcedWorkspace](#enforcedworkspace)" in by_heading[kind]
            enforced = by_heading["EnforcedWorkspace"]
            assert "partial [Workspace](#workspace)" in enforced and "| `policyPacks`" in enforced
            continue
        assert "status" in parts
        for part in parts:
            section = by_heading[f"{definition.kind}{part.capitalize()}"]
            for name in schema["properties"][part]["properties"]:
                assert f"| `{name}`" in section, (definition.kind, part, name)
    # Spot checks of what the page says, from the schema side.
    stack_spec = by_heading["StackSpec"]
    assert "one of `Retain`, `Delete`" in stack_spec
    assert "partial [Workspace](#workspace)" in stack_spec
    assert "size(self.metadata.name) <= 42" in by_heading["Stack"]
    assert "`restricted`" in by_heading["WorkspaceSpec"]  # a CRD default
    assert "list map keyed by `type`" in by_heading["StackStatus"]


def anchors_and_links(text: str) -> tuple[set[str], list[str]]:
    md = markdown.Markdown(extensions=["tables", "toc"])
    html = md.convert(text)
    return set(re.findall(r'id="([^"]+)"', html)), re.findall(r'href="([^"]+)"', html)


@pytest.mark.parametrize("which", ["api", "conditions"])
def test_links_resolve_and_no_raw_html(which: str) -> None:
    path = gen_apiref.API_PAGE if which == "api" else gen_apiref.CONDITIONS_PAGE
    text = pages()[path]
    ids, links = anchors_and_links(text)
    assert links
    for link in links:
        if link.startswith("https://"):
            continue
        target, _, anchor = link.partition("#")
        if target:
            assert (path.parent / target).resolve().is_file(), link
        else:
            assert anchor in ids, link
    body = re.sub(r"`[^`]*`", "", text.split("\n", 1)[1])  # the generated-file comment is the one tag
    assert not re.search(r"<[a-zA-Z/!]", body)


def test_slug_is_the_one_mkdocs_uses() -> None:
    from markdown.extensions.toc import slugify

    for heading in ("GitHubAppAuth (Stack)", "StackSpec", "ProjectInfo (Update)"):
        assert apiref_api.slug(heading) == slugify(heading, "-")


# --- conditions, Events, annotations, metrics ------------------------------------------------


def test_every_reason_constant_and_condition_type_appears() -> None:
    from pko.api import program, stack, update, workspace

    page = conditions_page()
    constants = apiref_tables._reason_constants()
    assert len(constants) > 10
    for _, value, module in constants:
        assert f"`{value}`" in page, (value, module)
    for api in (stack, program, workspace, update):
        for name in dir(api):
            if name.startswith("CONDITION_"):
                assert f"`{getattr(api, name)}`" in page


def test_every_literal_event_reason_in_the_source_appears() -> None:
    """A second reading: Emit("Type", "Reason", ...) calls found by a regular expression."""
    page = sections(conditions_page())["Events"]
    literal = re.compile(r'Emit\(\s*"(Normal|Warning)",\s*"([A-Za-z]+)"')
    seen = set()
    for path in (REPO / "pko").rglob("*.py"):
        for event_type, reason in literal.findall(path.read_text()):
            seen.add(reason)
            assert re.search(rf"\| `{reason}` \| \w+ \| [^|]*{event_type}", page), reason
    assert len(seen) > 20


def test_a_new_variable_reason_must_be_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    trimmed = dict(apiref_tables.PASS_THROUGH)
    trimmed.pop(("pko/controllers/workspace/workloads.py", "diagnose_pod", "PodDiagnosis"))
    monkeypatch.setattr(apiref_tables, "PASS_THROUGH", trimmed)
    with pytest.raises(SystemExit, match="diagnose_pod"):
        apiref_tables.scan()


def test_every_metric_defined_in_the_source_appears() -> None:
    """A second reading: the names given to prometheus_client metrics and families in pko/."""
    page = sections(conditions_page())["Metrics"]
    defined = re.compile(r'(?:Counter|Gauge|Histogram|Summary|MetricFamily)\(\s*"([a-z_]+)"')
    names = {n for path in (REPO / "pko").rglob("*.py") for n in defined.findall(path.read_text())}
    assert len(names) > 20
    for name in names:
        assert re.search(rf"\| `{name}(_total)?` \|", page), name


def test_every_label_and_annotation_of_the_controllers_appears() -> None:
    from pko.controllers import resources
    from pko.controllers.workspace import workloads

    page = sections(conditions_page())["Annotations and labels"]
    keys = [
        getattr(module, name)
        for module in (resources, workloads)
        for name in dir(module)
        if ("LABEL" in name or "ANNOTATION" in name) and "pulumi.com/" in str(getattr(module, name))
    ]
    assert len(keys) > 8
    for key in keys:
        assert f"| `{key}` |" in page
