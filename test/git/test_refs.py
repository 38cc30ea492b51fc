"""The one ref rule (pko.git.refs): git's rev-parse order, tags before branches."""

from __future__ import annotations

import pytest

from pko.git import branch_ref, ref_candidates, resolve_ref

SHA = {n: bytes([ord("a") + n]) * 40 for n in range(8)}


def test_candidates_follow_git_help_revisions() -> None:
    assert ref_candidates("v1") == [
        "refs/v1",
        "refs/tags/v1",
        "refs/heads/v1",
        "refs/remotes/v1",
        "refs/remotes/v1/HEAD",
    ]
    assert ref_candidates("refs/heads/v1")[0] == "refs/heads/v1"  # a full name first, as given
    assert ref_candidates("HEAD")[0] == "HEAD"
    assert ref_candidates("") == []


def test_each_rule_wins_over_every_later_one() -> None:
    """Remove the winner, and the next rule's ref is what the name means."""
    refs = {
        b"refs/x": SHA[1],
        b"refs/tags/x": SHA[2],
        b"refs/heads/x": SHA[3],
        b"refs/remotes/x": SHA[4],
        b"refs/remotes/x/HEAD": SHA[5],
    }
    for name, sha in list(refs.items()):
        assert resolve_ref(refs, "x") == (name, sha)
        del refs[name]
    assert resolve_ref(refs, "x") is None


def test_a_tag_wins_over_a_branch_of_the_same_name() -> None:
    refs = {b"refs/heads/v1": SHA[1], b"refs/tags/v1": SHA[2]}
    assert resolve_ref(refs, "v1") == (b"refs/tags/v1", SHA[2])
    assert resolve_ref(refs, "heads/v1") == (b"refs/heads/v1", SHA[1])  # via refs/<name>
    assert resolve_ref(refs, "refs/heads/v1") == (b"refs/heads/v1", SHA[1])
    assert resolve_ref(refs, branch_ref("v1")) == (b"refs/heads/v1", SHA[1])


def test_a_full_name_is_never_read_as_a_short_one() -> None:
    refs = {b"refs/heads/refs/heads/x": SHA[1], b"refs/heads/x": SHA[2]}
    assert resolve_ref(refs, "refs/heads/x") == (b"refs/heads/x", SHA[2])


def test_empty_values_count_as_absent() -> None:
    assert resolve_ref({b"refs/tags/v1": b"", b"refs/heads/v1": SHA[1]}, "v1") == (b"refs/heads/v1", SHA[1])
    assert resolve_ref({b"refs/tags/v1": None}, "v1") is None


def test_peel_gives_the_commit_an_annotated_tag_tags_when_advertised() -> None:
    refs = {b"refs/tags/v1": SHA[1], b"refs/tags/v1^{}": SHA[2], b"refs/tags/v2": SHA[3]}
    assert resolve_ref(refs, "v1") == (b"refs/tags/v1", SHA[1])
    assert resolve_ref(refs, "v1", peel=True) == (b"refs/tags/v1", SHA[2])
    assert resolve_ref(refs, "v2", peel=True) == (b"refs/tags/v2", SHA[3])


@pytest.mark.parametrize(
    ("branch", "full"),
    [
        ("main", "refs/heads/main"),
        ("v1", "refs/heads/v1"),
        ("feature/x", "refs/heads/feature/x"),
        ("refs/heads/main", "refs/heads/main"),
        ("refs/tags/v1", "refs/tags/v1"),
    ],
)
def test_a_stack_branch_is_its_full_name(branch: str, full: str) -> None:
    assert branch_ref(branch) == full
