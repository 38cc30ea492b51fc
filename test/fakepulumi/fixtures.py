"""The ``fake_pulumi`` pytest fixture: a temporary ``bin/pulumi`` backed by this package, installed by
pko.devtools.standin (:func:`~pko.devtools.standin.make_fake_pulumi`, which tools and the play-kubelet
use too), with its environment applied to ``os.environ``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pko.devtools.standin import FakePulumi, make_fake_pulumi


@pytest.fixture
def fake_pulumi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakePulumi]:
    """A fresh fake CLI, state backend and PULUMI_HOME, with its env applied to ``os.environ``."""
    fake = make_fake_pulumi(tmp_path)
    for key, value in fake.env.items():
        monkeypatch.setenv(key, value)
    yield fake
