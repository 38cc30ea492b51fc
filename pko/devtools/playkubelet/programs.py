"""What the images hold here: the known images, their entrypoints, and how their programs map onto
this host (the package docstring's **Programs**); pure text functions, no I/O but the bootstrap copy."""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

# The test world's images (what test/controllers/conftest.py's operator and kubelet fixtures and
# hack/bench/deploy.py use).
AGENT_IMAGE = "pko-agent:test"
# The images the play-kubelet can "pull" unless a module says otherwise: the agent image the operator
# is configured with, the Go operator's default workspace images, and two common utility images.
KNOWN_IMAGES: tuple[str, ...] = (
    AGENT_IMAGE,
    "pulumi/pulumi:latest-nonroot",
    "pulumi/pulumi:latest",
    "busybox",
    "alpine",
)
# The agent image's ENTRYPOINT (agent/Dockerfile): a container with only args runs through tini.
IMAGE_CONFIG: dict[str, tuple[list[str], list[str]]] = {
    AGENT_IMAGE: (["/tini", "--"], ["/agent", "serve", "--workspace", "/share/workspace"]),
}
# The kubelet's FallbackToLogsOnError tail: 80 lines, at most 2 KiB.
TAIL_LINES = 80
TAIL_BYTES = 2048
SLEEP_FOREVER = [sys.executable, "-c", "import time; time.sleep(10**9)"]
BOOTSTRAP = ["<bootstrap-copy>"]  # sentinel argv: the agent image's copy step, done in-process
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


# -- pure helpers ----------------------------------------------------------------------------------


def rewrite_paths(text: str, mounts: Sequence[tuple[str, Path]]) -> str:
    """Replace each container path under a mount by the host directory standing in for it.

    ``mounts`` is ``(mountPath, host dir)``; longer mount paths win. A mount path matches only as
    a whole path (``/share`` in ``/share/x`` or ``--dir=/share``, not in ``/shared`` or ``/a/share``).
    """
    for mount_path, host in sorted(mounts, key=lambda m: len(m[0]), reverse=True):
        mp = mount_path.rstrip("/")
        if not mp:
            continue
        pattern = re.compile(r"(?<![\w.\-~])" + re.escape(mp) + r"(?![\w.\-])")
        text = pattern.sub(_literal(str(host)), text)
    return text


def _literal(value: str) -> Callable[[re.Match[str]], str]:
    """A ``re.sub`` replacement that is ``value`` as it is (no backslash or group escapes)."""
    return lambda _m: value


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)")


def expand_vars(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion (``$$`` escapes; unknown references stay as they are)."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)

    return _VAR_REF.sub(sub, text)


def normalize_image(image: str) -> str:
    """``busybox`` -> ``docker.io/library/busybox:latest`` (how a runtime names an image)."""
    name, digest = [*image.split("@", 1), ""][:2]
    first = name.split("/", 1)[0]
    if "/" not in name:
        name = f"docker.io/library/{name}"
    elif not ("." in first or ":" in first or first == "localhost"):
        name = f"docker.io/{name}"
    if digest:
        return f"{name}@{digest}"
    if ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    return name


def _strip_tini(argv: list[str]) -> list[str]:
    """The program tini would run: drop ``tini`` and its options (``--`` ends them)."""
    if not argv or os.path.basename(argv[0]) != "tini":
        return argv
    rest = argv[1:]
    while rest and rest[0].startswith("-"):
        if rest.pop(0) == "--":
            break
    return rest


def translate_argv(argv: list[str], pod_ip: str) -> list[str]:
    """Map the agent image's programs onto this host (see the module docstring)."""
    prog = _strip_tini(argv)
    if not prog:
        return argv
    base = os.path.basename(prog[0])
    if base in ("agent", "pko-agent"):
        args = prog[1:]
        if args and args[0] == "--":
            args = args[1:]
        if args and args[0] == "serve":
            rest: list[str] = []
            skip = False
            for a in args[1:]:
                if skip:
                    skip = False
                elif a == "--host":
                    skip = True
                elif rest and rest[-1] == "--metrics-bind-address" and a.startswith(":"):
                    rest.append(f"{pod_ip}{a}")  # ':PORT' is every interface of the pod's own network
                elif not a.startswith("--host="):
                    rest.append(a)
            args = ["serve", "--host", pod_ip, *rest]
        return [sys.executable, "-m", "pko.agent", *args]
    if base == "cp" and any(
        a.startswith("/") and os.path.basename(a) in ("agent", "tini") for a in prog[1:-1]
    ):
        return [*BOOTSTRAP, prog[-1]]
    return prog


def tail(text: str, lines: int = TAIL_LINES, max_bytes: int = TAIL_BYTES) -> str:
    """The last ``lines`` lines of ``text``, then at most its last ``max_bytes`` bytes."""
    kept = "\n".join(text.splitlines()[-lines:])
    raw = kept.encode()
    if len(raw) > max_bytes:
        kept = raw[-max_bytes:].decode(errors="replace")
    return kept


def bootstrap_copy(dest: Path, log_path: Path) -> int:
    """The agent image's ``cp -r /agent /agent-lib /tini /share/``: shims that run this checkout's agent."""
    dest.mkdir(parents=True, exist_ok=True)
    agent = dest / "agent"
    agent.write_text(
        f'#!/bin/sh\n[ "$1" = "--" ] && shift\nexec {shlex.quote(sys.executable)} -m pko.agent "$@"\n'
    )
    tini = dest / "tini"
    tini.write_text(
        "#!/bin/sh\n"
        'while [ "${1#-}" != "$1" ]; do [ "$1" = "--" ] && { shift; break; }; shift; done\n'
        'exec "$@"\n'
    )
    for f in (agent, tini):
        f.chmod(0o755)
    log_path.write_text("")
    return 0
