"""The stand-in Pulumi CLI (test/fakepulumi) installed for a test or a tool: :func:`make_fake_pulumi`
writes a ``bin/pulumi`` shim backed by that package and returns its :class:`FakePulumi` layout (the
layout :class:`~pko.devtools.realpulumi.RealPulumi` shares, so a test, the agent or the play-kubelet
takes either). The ``fake_pulumi`` pytest fixture is test/fakepulumi/fixtures.py.

The shim is a Python script whose shebang is the running interpreter, so the Automation API's child
process *is* the fake CLI (signals such as SIGINT reach it directly, no shell in between).

Use it either through the environment (``fake.env`` puts the shim first on PATH and points
PULUMI_HOME, PULUMI_BACKEND_URL and PULUMI_CONFIG_PASSPHRASE at temporary places) or explicitly with
``PulumiCommand(root=str(fake.root))``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

PASSPHRASE = "fake-pulumi-test-passphrase"
# The stand-in itself is a test fixture (test/fakepulumi), loaded by the shim from its location.
STANDIN_PACKAGE = Path(__file__).resolve().parents[2] / "test" / "fakepulumi"


@dataclass(frozen=True)
class FakePulumi:
    root: Path  # for PulumiCommand(root=...): the shim is root/bin/pulumi
    bin_dir: Path
    home: Path  # PULUMI_HOME
    state_dir: Path  # the file backend's directory
    backend_url: str
    passphrase: str

    @property
    def command(self) -> Path:
        return self.bin_dir / "pulumi"

    @property
    def path_dirs(self) -> list[Path]:
        """The directories an image puts first on PATH for this CLI."""
        return [self.bin_dir]

    def seed_home(self, home: Path) -> None:
        """Make ``home`` a PULUMI_HOME this CLI can run with (the stand-in needs nothing there)."""
        home.mkdir(parents=True, exist_ok=True)

    @property
    def env(self) -> dict[str, str]:
        """Variables to add to the environment of anything that runs ``pulumi``."""
        return {
            "PATH": os.pathsep.join([*map(str, self.path_dirs), os.environ.get("PATH", "")]),
            "PULUMI_HOME": str(self.home),
            "PULUMI_BACKEND_URL": self.backend_url,
            "PULUMI_CONFIG_PASSPHRASE": self.passphrase,
            "PULUMI_SKIP_UPDATE_CHECK": "true",
        }


def install_shim(root: Path) -> Path:
    """Write ``root/bin/pulumi`` running the stand-in with this interpreter; return the bin directory."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    shim = bin_dir / "pulumi"
    # The package is loaded by its location (nothing else of test/ is importable from the shim).
    package, name = STANDIN_PACKAGE, STANDIN_PACKAGE.name
    shim.write_text(
        f"#!{sys.executable}\n"
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location({name!r}, {str(package / '__init__.py')!r},"
        f" submodule_search_locations=[{str(package)!r}])\n"
        f"sys.modules[{name!r}] = package = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(package)\n"
        f"from {name}.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n",
        encoding="utf-8",
    )
    shim.chmod(0o755)
    return bin_dir


def make_fake_pulumi(base: Path) -> FakePulumi:
    """The stand-in under ``base``: its shim, a file backend and a PULUMI_HOME of its own."""
    root = base / "pulumi-cli"
    state = base / "state"
    home = base / "pulumi-home"
    state.mkdir(parents=True, exist_ok=True)
    home.mkdir(parents=True, exist_ok=True)
    return FakePulumi(
        root=root,
        bin_dir=install_shim(root),
        home=home,
        state_dir=state,
        backend_url=f"file://{state}",
        passphrase=PASSPHRASE,
    )
