"""The committed betterproto2 code matches api/agent.proto (hack/gen_proto.py --check)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from pko.devtools import gen_proto

REPO = Path(__file__).resolve().parents[2]


def test_generated_code_matches_the_proto() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "hack" / "gen_proto.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr


def test_drift_is_detected(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    gen_proto.generate(fresh)
    committed = tmp_path / "committed"
    shutil.copytree(fresh, committed)
    assert gen_proto.diff(fresh, committed) == []

    module = committed / "pko" / "agent" / "v1" / "__init__.py"
    module.write_text(module.read_text().replace("operation_id", "operation_key", 1))
    (committed / "stale.py").write_text("")
    (committed / "message_pool.py").unlink()
    assert gen_proto.diff(fresh, committed) == [
        "missing: message_pool.py",
        "stale: stale.py",
        "differs: pko/agent/v1/__init__.py",
    ]


def test_generated_messages_round_trip() -> None:
    from pko.api.generated.pko.agent import v1 as pb

    result = pb.OperationResult(
        operation_id="u-1",
        type=pb.OperationType.UP,
        state=pb.OperationState.FAILED,
        outputs={"password": pb.OutputValue(value=b'"s3cret"', secret=True)},
        failure=pb.Failure(
            reason="StackLocked",
            lock=pb.LockInfo(owner="me@host (pid 1)"),
            pending_operations=[pb.PendingOperation(urn="urn:pulumi:dev::p::t::r", type="creating")],
        ),
    )
    event = pb.OperationEvent(sequence=7, result=result)
    assert pb.OperationEvent.parse(bytes(event)) == event
    assert pb.OperationResult.from_json(result.to_json()) == result
