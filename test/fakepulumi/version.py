"""The version the stand-in CLI reports.

By default it claims the version of the installed ``pulumi`` SDK, as a CLI installed alongside it
would; ``PULUMI_FAKE_VERSION`` overrides it. The version matters: the Automation API streams engine
events over gRPC (``--event-log tcp://...``) for CLIs newer than 3.205.0 and through a file before.
"""

from __future__ import annotations

import os
from importlib import metadata

_FALLBACK = "3.202.0"


def cli_version() -> str:
    override = os.environ.get("PULUMI_FAKE_VERSION")
    if override:
        return override.removeprefix("v")
    try:
        return metadata.version("pulumi")
    except metadata.PackageNotFoundError:
        return _FALLBACK
