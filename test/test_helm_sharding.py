"""The chart as a shard (docs/sharding.md): ``watchLabelSelector`` and ``leaderElection.id`` reach the
manager, and the settings they parse into hold a Lease of the shard's own and scope its Workspaces
and Updates; two releases with two selectors hold two Leases."""

from __future__ import annotations

from pathlib import Path

import pytest
from helmtest import env_of, manager, template
from pko.api.stackterms import SHARD_LABEL

from pko.settings.cli import parse_settings

pytestmark = pytest.mark.timeout(300)


def _settings(home: Path, selector: str) -> tuple[str, dict[str, str]]:
    """The Lease name and label selectors of the manager one release with ``selector`` runs."""
    objs = template(
        home, "--set-string", f"watchLabelSelector={selector}", "--set", "leaderElection.id=pko-fleet"
    )
    _, container = manager(objs)
    env = {k: v for k, v in env_of(container).items() if isinstance(v, str)}
    assert (env["WATCH_LABEL_SELECTOR"], env["LEADER_ELECTION_ID"]) == (selector, "pko-fleet")
    options = parse_settings(container["args"], {**env, "POD_NAMESPACE": "ops"}).manager_options("me")
    assert options.leader_election is not None
    return options.leader_election.lease_name, dict(options.label_selectors)


def test_two_shard_releases_hold_two_leases_and_scope_their_workspaces(tmp_path: Path) -> None:
    lease_a, selectors_a = _settings(tmp_path, f"{SHARD_LABEL}=a")
    lease_default, selectors_default = _settings(tmp_path, f"!{SHARD_LABEL}")
    assert lease_a != lease_default and {lease_a[:10], lease_default[:10]} == {"pko-fleet-"}
    assert selectors_a["workspaces.auto.pulumi.com"] == f"{SHARD_LABEL}=a"
    assert selectors_default["updates.auto.pulumi.com"] == f"!{SHARD_LABEL}"
