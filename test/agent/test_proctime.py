"""The agent's start-up figure counts from the process's own start, as the kernel recorded it."""

from __future__ import annotations

import subprocess
import sys

from pko.agent.proctime import seconds_since_start


def test_counts_from_the_process_start_not_from_the_first_line() -> None:
    code = "import time; time.sleep(0.4); from pko.agent.proctime import seconds_since_start as s; print(s())"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    age = float(out)
    assert 0.4 <= age < 30, age


def test_this_process_is_older_than_its_tests() -> None:
    age = seconds_since_start()
    assert age is not None and age > 0
