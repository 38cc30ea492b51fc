"""``python3 -m pko.devtools.localnode`` (``hack/localnode.py``): the command line."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

import pko.devtools.localnode as package
from pko.devtools.localnode.images import (
    dev_archives,
    import_images,
    remove_images,
    trust_registry,
    untrust_registry,
)
from pko.devtools.localnode.node import (
    COMPONENTS,
    IMAGES,
    NODE2,
    NODE2_COMPONENTS,
    _log,
)
from pko.devtools.localnode.node2 import (
    node_add,
    node_lose,
    node_remove,
)
from pko.devtools.localnode.processes import (
    restart,
    status,
)
from pko.devtools.localnode.up import (
    down,
    up,
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="hack/localnode.py", description=(package.__doc__ or "").split("\n\n")[0]
    )
    p.add_argument(
        "command",
        choices=(
            "up",
            "down",
            "status",
            "restart",
            "node-add",
            "node-remove",
            "node-lose",
            "trust-registry",
            "untrust-registry",
            "remove-images",
            "import-images",
        ),
    )
    p.add_argument(
        "operands",
        nargs="*",
        help="restart: the component; (un)trust-registry: HOST:PORT [CA_FILE]; remove-images: PATTERN...",
    )
    p.add_argument("--signal", default="TERM", choices=("TERM", "KILL"), help="restart: how it stops")
    p.add_argument("--down-for", type=float, default=0.0, help="restart: seconds between stop and start")
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        type=Path,
        default=[],
        help=f"an OCI archive to import (default: every {IMAGES}/*.oci.tar)",
    )
    args = p.parse_args(argv)
    imports = args.imports or dev_archives()
    if args.command == "trust-registry":
        if len(args.operands) != 2:
            p.error("trust-registry needs HOST:PORT CA_FILE")
        print(trust_registry(args.operands[0], Path(args.operands[1])))
        return 0
    if args.command == "untrust-registry":
        if len(args.operands) != 1:
            p.error("untrust-registry needs HOST:PORT")
        untrust_registry(args.operands[0])
        return 0
    if args.command == "remove-images":
        if not args.operands:
            p.error("remove-images needs at least one PATTERN")
        print("\n".join(remove_images(args.operands)))
        return 0
    if args.command == "import-images":
        import_images(imports)
        return 0
    if args.command == "node-add":
        try:
            node_add(imports)
        except BaseException:
            _log(f"node-add failed; removing {NODE2.name} (logs in .node/logs/*-2.log)")
            node_remove()
            raise
        return 0
    if args.command == "node-remove":
        node_remove()
        return 0
    if args.command == "node-lose":
        node_lose()
        return 0
    if args.command == "up":
        try:
            print(up(imports))
        except BaseException:
            _log("up failed; tearing down (logs in .node/logs)")
            down()
            raise
        return 0
    if args.command == "down":
        down()
        return 0
    if args.command == "restart":
        if len(args.operands) != 1 or args.operands[0] not in (*COMPONENTS, *NODE2_COMPONENTS):
            p.error(f"restart needs one component of {', '.join((*COMPONENTS, *NODE2_COMPONENTS))}")
        print(restart(args.operands[0], signal.Signals[f"SIG{args.signal}"], args.down_for))
        return 0
    return status()


if __name__ == "__main__":
    sys.exit(main())
