"""hack/test.sh's e2e side (issue 45: CI's budget): the node boots with the images every e2e module needs,
and SeaweedFS, which only the S3 modules run, is built beside the first modules and imported into the
running node when built (``hack/localnode.py import-images``). The S3 modules run after the others (before
test_release.py, which runs last) and wait for it through one fixture, ``seaweedfs_image``, which reads the
exit status the background build writes (``pko.devtools.localnode.images.wait_late_import``)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pko.devtools.localnode.images import LateImportFailed, wait_late_import
from pko.devtools.waiting import NotReached

REPO = Path(__file__).resolve().parents[1]


def test_the_wait_ends_when_the_background_import_writes_status_0(tmp_path: Path) -> None:
    status = tmp_path / "late-images.rc"
    writer = threading.Timer(0.5, status.write_text, ("0\n",))
    writer.start()
    try:
        wait_late_import(status, within=30)
    finally:
        writer.cancel()
    assert status.read_text() == "0\n"


def test_a_failed_build_is_an_error_naming_its_exit_and_the_end_of_its_log(tmp_path: Path) -> None:
    status = tmp_path / "late-images.rc"
    (tmp_path / "late-images.log").write_text("build-seaweedfs: weed 4.53 (./weed)\ngo: no space left\n")
    status.write_text("1\n")
    with pytest.raises(LateImportFailed) as failed:
        wait_late_import(status, within=30)
    message = str(failed.value)
    assert "exit 1" in message and str(tmp_path / "late-images.log") in message
    assert message.endswith("go: no space left\n")


def test_no_status_within_the_bound_is_not_reached_and_names_the_log(tmp_path: Path) -> None:
    with pytest.raises(NotReached, match=r"late-images\.log"):
        wait_late_import(tmp_path / "late-images.rc", within=0.1)


def _collected_modules() -> list[str]:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", "e2e"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    modules: list[str] = []
    for line in out.splitlines():
        if "::" in line and line.split("::")[0] not in modules:
            modules.append(line.split("::")[0])
    return modules


def test_the_modules_that_run_seaweedfs_run_after_the_others_and_before_the_release_module() -> None:
    modules = _collected_modules()
    s3 = sorted(
        f"e2e/{p.name}" for p in (REPO / "e2e").glob("test_*.py") if "seaweedfs" in p.read_text().lower()
    )
    assert s3, "no e2e module runs SeaweedFS"
    assert modules[-1] == "e2e/test_release.py", modules
    assert sorted(modules[-1 - len(s3) : -1]) == s3, modules
