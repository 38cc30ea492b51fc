"""Run test modules in a random order, to find a test that passes only after another one.

Usage:
    .venv/bin/python hack/shuffle.py PATH... [--seed N] [-- PYTEST_ARGS...]

A test must create what it reads; one that reads what an earlier test of its module left in a
module-scoped environment passes in file order and fails alone. This collects the node ids under
``PATH...`` (``pytest --collect-only -q``), shuffles the modules and the tests within each module with
a seed it prints, and runs pytest with the ids in that order: pytest runs ids given on its command line
in the given order. A module's ids stay together, so its module-scoped fixtures are set up once, as
in a normal run. ``--seed N`` repeats an order. ``PYTEST_ARGS`` go to both the collection and the run
(``-k``, ``-x``, ``-p no:cacheprovider``, ...).

Standard library only: the project's locks need no pytest-randomly for it.
"""

from __future__ import annotations

import argparse
import random
import re
import subprocess
import sys
from collections.abc import Sequence


def node_ids(collected: str) -> list[str]:
    """The ids in ``pytest --collect-only -q``'s output: its lines up to the first blank one."""
    ids = []
    for line in collected.splitlines():
        if not line.strip():
            break
        if "::" in line:
            ids.append(line.strip())
    return ids


def _collect_args(pytest_args: Sequence[str]) -> list[str]:
    """``pytest_args`` without the verbosity flags: the collection's ``-q`` alone lists one id a line."""
    loud = {"--quiet", "--verbose"}
    return [a for a in pytest_args if a not in loud and not re.fullmatch(r"-[qv]+", a)]


def shuffled(ids: Sequence[str], seed: int) -> list[str]:
    """``ids`` with the modules in a random order and each module's tests in a random order, each
    module's ids kept together; the same seed gives the same order."""
    modules: dict[str, list[str]] = {}
    for node in ids:
        modules.setdefault(node.split("::", 1)[0], []).append(node)
    rng = random.Random(seed)
    order = list(modules)
    rng.shuffle(order)
    out: list[str] = []
    for module in order:
        tests = list(modules[module])
        rng.shuffle(tests)
        out.extend(tests)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    pytest_args: list[str] = []
    if "--" in args:
        at = args.index("--")
        args, pytest_args = args[:at], args[at + 1 :]
    parser = argparse.ArgumentParser(description="Run test modules with their tests in a random order.")
    parser.add_argument("paths", nargs="+", help="test files or folders")
    parser.add_argument("--seed", type=int, help="repeat the order of an earlier run (default: a new one)")
    opts = parser.parse_args(args)
    seed = opts.seed if opts.seed is not None else random.SystemRandom().randrange(1, 2**31)
    pytest = [sys.executable, "-m", "pytest"]
    collect = subprocess.run(
        [*pytest, "--collect-only", "-q", *_collect_args(pytest_args), *opts.paths],
        capture_output=True,
        text=True,
    )
    if collect.returncode != 0:
        sys.stderr.write(collect.stdout + collect.stderr)
        print("shuffle: the collection failed", file=sys.stderr)
        return collect.returncode
    ids = node_ids(collect.stdout)
    if not ids:
        print("shuffle: no tests collected", file=sys.stderr)
        return 5
    order = shuffled(ids, seed)
    rerun = f"--seed {seed}"
    print(f"shuffle: {len(order)} tests, seed {seed} (repeat with {rerun})", flush=True)
    code = subprocess.run([*pytest, *pytest_args, *order]).returncode
    print(f"shuffle: seed {seed} (repeat with {rerun}), pytest exit {code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
