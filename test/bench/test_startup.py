"""startup.py's pure parts on made-up input: the import time read from a ``-X importtime`` log, and the
table of medians with the second revision's ratio to the first."""

from __future__ import annotations

import startup

LOG = """\
import time: self [us] | cumulative | imported package
import time:        97 |         97 |   _io
import time:       846 |       1244 | _frozen_importlib_external
import time:       300 |        300 |     pko.machinery
import time:       500 |       2000 | pko
import time:        10 |         10 | pko.__main__
"""


def test_import_time_is_the_sum_of_the_top_level_cumulative_times() -> None:
    assert startup.importtime_total(LOG) == (1244 + 2000 + 10) / 1e6


def test_the_table_shows_each_median_and_the_second_revisions_ratio_to_the_first() -> None:
    labels = ["before (aaaaaaa)", "HEAD (bbbbbbb)"]
    mid = {key: dict(zip(labels, (4.0, 2.0), strict=True)) for key, _, _ in startup.FIGURES}
    mid["kubernetes_asyncio_modules"] = dict(zip(labels, (0, 0), strict=True))
    lines = startup.table(labels, mid).splitlines()
    assert lines[0] == "| figure | before (aaaaaaa) | HEAD (bbbbbbb) | ratio |"
    assert "| `import pko.__main__`: import time (s) | 4.00 | 2.00 | 0.50x |" in lines
    assert "| `import pko.__main__`: VmRSS after (MB) | 4 | 2 | 0.50x |" in lines
    assert "| `import pko.__main__`: of which kubernetes_asyncio's | 0 | 0 | n/a |" in lines
    assert len(lines) == 2 + len(startup.FIGURES)
    alone = startup.table(labels[1:], {key: {labels[1]: 2.0} for key, _, _ in startup.FIGURES}).splitlines()
    assert alone[0] == "| figure | HEAD (bbbbbbb) |" and alone[2].endswith("| 2.00 |")
