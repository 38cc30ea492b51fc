"""One big Stack (issue 44): thousands of resources previewed, previewed under the approval gate, and
deployed then destroyed, on the control plane the test suite starts (no node), with the largest
object the operator wrote, the time and the memory of each.

    .venv/bin/python hack/bench/bigstack.py                      # 2,000 previewed, 2,000 deployed
    .venv/bin/python hack/bench/bigstack.py --deployed 500       # a shorter deploy

It runs test/controllers/test_status_bounds_cluster.py (the suite runs it with 300 deployed) with the
sizes given: the real operator and apiserver, the play-kubelet's real agents, the stand-in Pulumi CLI,
whose ``up`` of 2,000 resources takes about three minutes on 2 cores (it rewrites its state file per
step), so this is no suite test. Each test asserts every object under ``MAX_OBJECT_BYTES``
(pko.api.limits) and prints a ``bigstack`` line; this prints them as one JSON document. The memory is
the peak RSS of the test process (the operator runs in it, with the suite's harness) and of the
Stack's agent process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEST = "test/controllers/test_status_bounds_cluster.py"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--previewed", type=int, default=2000, help="resources previewed (default 2000)")
    parser.add_argument("--deployed", type=int, default=2000, help="resources deployed (default 2000)")
    args = parser.parse_args(argv)
    env = {
        **os.environ,
        "PKO_BIG_STACK_RESOURCES": str(args.previewed),
        "PKO_BIG_STACK_DEPLOYED": str(args.deployed),
    }
    command = [str(REPO / ".venv" / "bin" / "pytest"), "-q", "-s", "-p", "no:cacheprovider", TEST]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    rows = [
        json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines() if line.startswith("bigstack ")
    ]
    print(json.dumps({"previewed": args.previewed, "deployed": args.deployed, "runs": rows}, indent=2))
    if done.returncode != 0:
        print(done.stdout[-4000:], file=sys.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
