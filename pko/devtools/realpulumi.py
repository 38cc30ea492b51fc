"""The real Pulumi engine for tests and tools: the CLI, language hosts and providers hack/build-pulumi.sh
builds from their Go modules (cached in ~/.cache/pko), laid out like the stand-in's
:class:`~pko.devtools.standin.FakePulumi` so a test, a benchmark, the agent or the play-kubelet takes
either.

Each :func:`make_real_pulumi` gets a PULUMI_HOME of its own whose ``plugins/`` holds every provider the
engine built (linked, read-only, shared), a file backend directory, and the offline switches the workspace
image sets (IMAGE_ENV): a plugin the engine lacks is an error naming it, never a download.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from pko.devtools.builds import built
from pko.devtools.standin import FakePulumi

PASSPHRASE = "real-pulumi-test-passphrase"
# The workspace image's environment (images/workspace/Dockerfile, which says why each is set).
IMAGE_ENV = {
    "PULUMI_SKIP_UPDATE_CHECK": "true",
    "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
    "PULUMI_DISABLE_REGISTRY_RESOLVE": "true",
    "PULUMI_IGNORE_AMBIENT_PLUGINS": "true",
    "KUBE_FEATURE_WatchListClient": "false",
}


@functools.cache
def engine_dir() -> Path:
    """The built engine (bin/, plugins/), building it first if the cache lacks it (minutes, once).
    ``PKO_PULUMI_ENGINE`` names another engine directory of the same layout to test instead."""
    chosen = os.environ.get("PKO_PULUMI_ENGINE")
    if chosen:
        return Path(chosen)
    return built("build-pulumi.sh")


@dataclass(frozen=True)
class RealPulumi(FakePulumi):
    """The real engine, with the stand-in's fields (root, bin_dir, home, state_dir, backend_url)."""

    @property
    def path_dirs(self) -> list[Path]:
        """The engine, then this interpreter's directory, whose `python3` has the `pulumi` SDK (the
        workspace image's /opt/pulumi/python/bin)."""
        return [self.bin_dir, Path(sys.executable).parent]

    @property
    def env(self) -> dict[str, str]:
        return {**super().env, **IMAGE_ENV}

    def seed_home(self, home: Path) -> None:
        """Install every provider the engine built into ``home/plugins``, as the workspace image has them:
        a directory per plugin (the CLI lists real directories only, never a symlink to one) whose
        files link to the built ones."""
        built = self.root / "plugins"
        for plugin in sorted(built.iterdir()) if built.is_dir() else []:
            target = home / "plugins" / plugin.name
            if plugin.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                for file in plugin.iterdir():
                    if not (target / file.name).exists():
                        (target / file.name).symlink_to(file)
            elif not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.touch()  # the install's .lock marker


def make_real_pulumi(base: Path) -> RealPulumi:
    engine = engine_dir()
    state = base / "state"
    home = base / "pulumi-home"
    state.mkdir(parents=True, exist_ok=True)
    real = RealPulumi(
        root=engine,
        bin_dir=engine / "bin",
        home=home,
        state_dir=state,
        backend_url=f"file://{state}",
        passphrase=PASSPHRASE,
    )
    real.seed_home(home)
    return real


def install_command_provider(real: RealPulumi) -> None:
    """Put the pulumi-command plugin hack/build-sources.sh built into ``real``'s PULUMI_HOME, as the
    workspace image has it (its files linked, the directory real)."""
    plugins = built("build-sources.sh") / "plugins"
    for plugin in plugins.glob("resource-command-v*"):
        target = real.home / "plugins" / plugin.name
        if plugin.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            for file in plugin.iterdir():
                (target / file.name).symlink_to(file)
        else:
            target.touch()
