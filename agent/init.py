"""`agent init`: put the program's source where `agent serve` expects it.

The workspace pod's init container runs this once before the agent starts. Three kinds of source,
exactly one per run:
- git (`GIT_URL`, `GIT_REVISION`, `GIT_DIR`, `GIT_SHALLOW`, credentials), via dulwich;
- a tarball artifact (`FLUX_URL`, `FLUX_DIGEST`, `FLUX_DIR`, `FLUX_MAX_UNTAR_SIZE_BYTES`): Flux sources
  and the operator's Program artifacts;
- project info only (`PROJECT_NAME`, `PROJECT_RUNTIME`): a minimal Pulumi.yaml, no program.

Every setting has a flag; a flag wins over its environment variable. Secrets are read from the
environment or from files (``--git-token-file``), never from flag values, which `ps` would show.

Invariants: the target directory is either absent, empty, or holds a complete fetch of the same source
(a rerun of the init container is a no-op); a fetch lands in a sibling staging directory and is moved
into place only when complete; the project sub-directory must exist inside the fetched tree. With
``--workspace-dir`` the sub-directory is also symlinked there (what the Go operator's init script
does with ``ln -s``).

Exit codes: 0 done, 1 the source could not be fetched, 2 the settings are wrong. On failure one line
goes to stderr, naming the problem and never a credential.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import structlog
import yaml
from pko.agent import transfer
from pko.agent.artifact import DEFAULT_MAX_MEMBERS, DEFAULT_MAX_UNTAR_SIZE, fetch_artifact, override_host
from pko.agent.errors import SourceError, UsageError, redact_text, redact_url
from pko.agent.gitfetch import GitCredentials, fetch_git

from pko.git.ssh import known_hosts as ssh_known_hosts

log = structlog.get_logger(__name__)

DEFAULT_TARGET_DIR = "/share/workspace"
_GITHUB_APP_VARS = ("GIT_GITHUB_APP_ID", "GIT_GITHUB_APP_INSTALLATION_ID", "GIT_GITHUB_APP_PRIVATE_KEY")


DEFAULT_DEADLINE = 600.0
DEFAULT_LOW_SPEED_LIMIT = 1024.0
DEFAULT_LOW_SPEED_TIME = 60.0


def add_init_arguments(parser: argparse.ArgumentParser) -> None:
    """Register `init`'s flags; each defaults to its environment variable, read when the command runs."""
    parser.add_argument(
        "-t", "--target-dir", help=f"directory to fetch the source into (default {DEFAULT_TARGET_DIR})"
    )
    parser.add_argument(
        "--workspace-dir", help="also symlink the project directory here (e.g. /share/workspace)"
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="network timeout in seconds (default 60)")
    parser.add_argument(
        "--source-name",
        help="what the source is, to begin a failure's line (e.g. \"policy pack 'x'\") [SOURCE_NAME]",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="one deadline for the whole fetch, in seconds: a server that trickles or stalls cannot "
        f"hold init longer [INIT_DEADLINE, default {DEFAULT_DEADLINE:.0f}]",
    )
    parser.add_argument(
        "--low-speed-limit",
        type=float,
        default=None,
        help="give up when a download receives fewer bytes per second than this, averaged over "
        f"--low-speed-time; 0 disables [INIT_LOW_SPEED_LIMIT, default {DEFAULT_LOW_SPEED_LIMIT:.0f}]",
    )
    parser.add_argument(
        "--low-speed-time",
        type=float,
        default=None,
        help="the window of --low-speed-limit, in seconds "
        f"[INIT_LOW_SPEED_TIME, default {DEFAULT_LOW_SPEED_TIME:.0f}]",
    )

    git = parser.add_argument_group("git source")
    git.add_argument("--git-url", help="repository URL [GIT_URL]")
    git.add_argument(
        "--git-revision", help="commit SHA, branch, tag or ref; default the remote HEAD [GIT_REVISION]"
    )
    git.add_argument("--git-dir", help="project directory inside the repository [GIT_DIR]")
    git.add_argument(
        "--git-shallow",
        action="store_true",
        default=None,
        help="fetch only the needed commit [GIT_SHALLOW=true]",
    )
    git.add_argument("--git-username", help="username for HTTP(S) basic auth [GIT_USERNAME]")
    git.add_argument(
        "--git-password-file", help="file holding the password or SSH key passphrase [GIT_PASSWORD]"
    )
    git.add_argument("--git-token-file", help="file holding an access token [GIT_TOKEN]")
    git.add_argument(
        "--git-ssh-private-key-file", help="file holding the SSH private key [GIT_SSH_PRIVATE_KEY]"
    )
    git.add_argument(
        "--git-ssh-known-hosts-file",
        action="append",
        help="known_hosts file trusted for SSH; repeatable [GIT_SSH_KNOWN_HOSTS holds contents, "
        "GIT_SSH_KNOWN_HOSTS_FILE a path; default ~/.ssh/known_hosts and /etc/ssh/ssh_known_hosts]",
    )

    flux = parser.add_argument_group("artifact source (Flux or Program)")
    flux.add_argument("--flux-url", help="tarball URL [FLUX_URL]")
    flux.add_argument("--flux-digest", help="expected digest, sha256:<hex> [FLUX_DIGEST]")
    flux.add_argument("--flux-dir", help="project directory inside the artifact [FLUX_DIR]")
    flux.add_argument(
        "--flux-max-untar-size-bytes",
        type=int,
        help=f"limit on unpacked size, -1 for none (default {DEFAULT_MAX_UNTAR_SIZE}) "
        "[FLUX_MAX_UNTAR_SIZE_BYTES]",
    )

    info = parser.add_argument_group("project info (no source)")
    info.add_argument("--project-name", help="project name for a sourceless workspace [PROJECT_NAME]")
    info.add_argument(
        "--project-runtime", help="project runtime for a sourceless workspace [PROJECT_RUNTIME]"
    )


@dataclass(frozen=True)
class GitSpec:
    url: str
    revision: str
    subdir: str
    shallow: bool
    credentials: GitCredentials


@dataclass(frozen=True)
class ArtifactSpec:
    url: str
    digest: str
    subdir: str
    max_size: int | None


@dataclass(frozen=True)
class ProjectInfoSpec:
    name: str
    runtime: str


@dataclass(frozen=True)
class InitRequest:
    target: Path
    source: GitSpec | ArtifactSpec | ProjectInfoSpec
    workspace: Path | None = None
    timeout: float = 60.0
    secrets: tuple[str, ...] = field(default=(), repr=False)


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _read_file(path: str, what: str) -> str:
    try:
        return Path(path).expanduser().read_text()
    except OSError as exc:
        raise UsageError(f"cannot read {what} from {path}: {exc.strerror or exc}") from None


def _secret(flag_file: str | None, env: Mapping[str, str], name: str, what: str) -> str | None:
    """A secret from the flag's file, else ``$NAME``, else the file named by ``$NAME_FILE``.

    A trailing newline (what `echo` and most secret files add) is dropped: no token or password
    legitimately ends with one, and sending it breaks basic auth.
    """
    if flag_file:
        value = _read_file(flag_file, what)
    elif env.get(name):
        value = env[name]
    elif env.get(f"{name}_FILE"):
        value = _read_file(env[f"{name}_FILE"], what)
    else:
        return None
    return value.rstrip("\r\n") or None


def _known_hosts(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    return ssh_known_hosts(env, args.git_ssh_known_hosts_file or [])


def resolve_request(args: argparse.Namespace, env: Mapping[str, str]) -> InitRequest:
    """Combine flags and environment into one request; raises UsageError for contradictory settings."""

    def pick(flag: str | None, name: str) -> str:
        return flag if flag is not None else env.get(name, "")

    git_url = pick(args.git_url, "GIT_URL")
    flux_url = pick(args.flux_url, "FLUX_URL")
    project_name = pick(args.project_name, "PROJECT_NAME")
    chosen = [n for n, v in (("git", git_url), ("flux", flux_url), ("project", project_name)) if v]
    if not chosen:
        raise UsageError("nothing to fetch: set GIT_URL (--git-url), FLUX_URL (--flux-url) or PROJECT_NAME")
    if len(chosen) > 1:
        raise UsageError(f"more than one source given ({', '.join(chosen)}): give exactly one")
    target = Path(args.target_dir or DEFAULT_TARGET_DIR)
    workspace = Path(args.workspace_dir) if args.workspace_dir else None

    source: GitSpec | ArtifactSpec | ProjectInfoSpec
    secrets: tuple[str, ...] = ()
    if git_url:
        token = _secret(args.git_token_file, env, "GIT_TOKEN", "the git token")
        if not token and any(env.get(v) for v in _GITHUB_APP_VARS):
            raise UsageError(
                "GitHub App authentication (GIT_GITHUB_APP_ID) is not supported by this agent: "
                "use an installation or personal access token in GIT_TOKEN"
            )
        creds = GitCredentials(
            username=pick(args.git_username, "GIT_USERNAME") or None,
            password=_secret(args.git_password_file, env, "GIT_PASSWORD", "the git password"),
            token=token,
            ssh_private_key=_secret(
                args.git_ssh_private_key_file, env, "GIT_SSH_PRIVATE_KEY", "the SSH private key"
            ),
        )
        if creds.ssh_private_key or not git_url.lower().startswith(("http://", "https://")):
            creds = dataclasses.replace(creds, known_hosts=_known_hosts(args, env))
        secrets = tuple(s for s in creds.secrets() if s)
        source = GitSpec(
            url=git_url,
            revision=pick(args.git_revision, "GIT_REVISION"),
            subdir=pick(args.git_dir, "GIT_DIR"),
            shallow=bool(args.git_shallow) or _truthy(env.get("GIT_SHALLOW")),
            credentials=creds,
        )
    elif flux_url:
        digest = pick(args.flux_digest, "FLUX_DIGEST")
        if not digest:
            raise UsageError("an artifact URL needs its digest: set FLUX_DIGEST (--flux-digest)")
        url = override_host(flux_url, env.get("SOURCE_CONTROLLER_LOCALHOST"))
        source = ArtifactSpec(
            url=url, digest=digest, subdir=pick(args.flux_dir, "FLUX_DIR"), max_size=_max_size(args, env)
        )
    else:
        runtime = pick(args.project_runtime, "PROJECT_RUNTIME")
        if not runtime:
            raise UsageError(
                "a project-info workspace needs a runtime: set PROJECT_RUNTIME (--project-runtime)"
            )
        source = ProjectInfoSpec(name=project_name, runtime=runtime)
    return InitRequest(
        target=target, source=source, workspace=workspace, timeout=args.timeout, secrets=secrets
    )


def _max_size(args: argparse.Namespace, env: Mapping[str, str]) -> int | None:
    value: int | str | None = args.flux_max_untar_size_bytes
    if value is None:
        value = env.get("FLUX_MAX_UNTAR_SIZE_BYTES") or None
    if value is None:
        return DEFAULT_MAX_UNTAR_SIZE
    try:
        number = int(value)
    except ValueError:
        raise UsageError(
            f"invalid FLUX_MAX_UNTAR_SIZE_BYTES {value!r}: expected a byte count or -1"
        ) from None
    if number == -1:
        return None
    if number < 0:
        raise UsageError(f"invalid FLUX_MAX_UNTAR_SIZE_BYTES {number}: expected a byte count or -1")
    return number


def _identity(source: GitSpec | ArtifactSpec) -> dict[str, str]:
    """What makes two fetches the same; recorded beside the target so a rerun can recognise it."""
    if isinstance(source, GitSpec):
        return {"kind": "git", "url": redact_url(source.url), "revision": source.revision}
    return {"kind": "artifact", "url": redact_url(source.url), "digest": source.digest.strip().lower()}


def _marker(target: Path) -> Path:
    return target.parent / f".{target.name}.pko-source.json"


def _fetch_into_place(request: InitRequest, fetch: Callable[[Path], None]) -> bool:
    """Run `fetch` into a staging directory and move it to the target; False if already there."""
    assert not isinstance(request.source, ProjectInfoSpec)
    target = request.target
    identity = _identity(request.source)
    marker = _marker(target)
    if target.exists() and not target.is_dir():
        raise UsageError(f"target {target} exists and is not a directory")
    if target.is_dir() and any(target.iterdir()):
        try:
            recorded = json.loads(marker.read_text())
        except (OSError, ValueError):
            recorded = None
        if recorded == identity:
            log.info("source already fetched", target=str(target))
            return False
        raise UsageError(
            f"target {target} is not empty and does not hold this source: remove it or pick another"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)  # a leftover of an interrupted run: ours by name
    staging.mkdir()
    try:
        fetch(staging)
        _project_dir(staging, _subdir(request.source))
        if target.is_dir():
            target.rmdir()  # empty, checked above
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    marker.write_text(json.dumps(identity))
    return True


def _subdir(source: GitSpec | ArtifactSpec | ProjectInfoSpec) -> str:
    return "" if isinstance(source, ProjectInfoSpec) else source.subdir


def _project_dir(root: Path, subdir: str) -> Path:
    """`root/subdir`, refusing paths that leave `root` and sub-directories that do not exist."""
    clean = subdir.strip().strip("/")
    if not clean or clean == ".":
        return root
    if ".." in Path(clean).parts:
        raise UsageError(f"project directory {subdir!r} must stay inside the source")
    path = root / clean
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if not (real == real_root or real.startswith(real_root + os.sep)):
        raise UsageError(f"project directory {subdir!r} resolves outside the source")
    if not path.is_dir():
        raise SourceError(f"project directory {subdir!r} not found in the source")
    return path


def _link_workspace(workspace: Path, project: Path) -> None:
    """Point `workspace` at `project`; an existing link to the same place is kept."""
    destination = project.absolute()
    if workspace.is_symlink():
        if Path(os.readlink(workspace)) == destination:
            return
        raise UsageError(
            f"workspace {workspace} already links to {os.readlink(workspace)}, not {destination}"
        )
    if workspace.exists():
        raise UsageError(f"workspace {workspace} already exists and is not a symlink")
    workspace.parent.mkdir(parents=True, exist_ok=True)
    workspace.symlink_to(destination, target_is_directory=True)


def _write_project_file(target: Path, spec: ProjectInfoSpec) -> None:
    target.mkdir(parents=True, exist_ok=True)
    document = {"name": spec.name, "runtime": spec.runtime}
    (target / "Pulumi.yaml").write_text(yaml.safe_dump(document, sort_keys=False))


def execute(request: InitRequest) -> Path:
    """Carry out `request`; returns the project directory. Raises SourceError on failure."""
    source = request.source
    if isinstance(source, ProjectInfoSpec):
        _write_project_file(request.target, source)
        project = request.target
    else:
        if isinstance(source, GitSpec):
            git = source

            def fetch(staging: Path) -> None:
                checkout = fetch_git(
                    git.url,
                    git.revision,
                    staging,
                    shallow=git.shallow,
                    credentials=git.credentials,
                    timeout=request.timeout,
                )
                log.info("checked out", commit=checkout.commit, ref=checkout.ref, shallow=checkout.shallow)

        else:
            artifact = source

            def fetch(staging: Path) -> None:
                fetch_artifact(
                    artifact.url,
                    artifact.digest,
                    staging,
                    max_size=artifact.max_size,
                    max_members=DEFAULT_MAX_MEMBERS,
                    timeout=request.timeout,
                )

        _fetch_into_place(request, fetch)
        project = _project_dir(request.target, source.subdir)
    if request.workspace is not None:
        _link_workspace(request.workspace, project)
    log.info("source ready", project_dir=str(project), workspace=str(request.workspace or project))
    return project


def _seconds(args: argparse.Namespace, env: Mapping[str, str], flag: str, var: str, default: float) -> float:
    if getattr(args, flag, None) is not None:
        value = float(getattr(args, flag))
    else:
        text = env.get(var, "").strip()
        try:
            value = float(text) if text else default
        except ValueError:
            raise UsageError(f"{var} must be a number, got {text!r}") from None
    if value < 0:
        raise UsageError(f"{var} must not be negative, got {value:g}")
    return value


@dataclass(frozen=True)
class Limits:
    """How long init may take, and how slow its downloads may be."""

    deadline: float
    low_speed_limit: float
    low_speed_time: float


def _limits(args: argparse.Namespace, env: Mapping[str, str]) -> Limits:
    return Limits(
        deadline=_seconds(args, env, "deadline", "INIT_DEADLINE", DEFAULT_DEADLINE),
        low_speed_limit=_seconds(
            args, env, "low_speed_limit", "INIT_LOW_SPEED_LIMIT", DEFAULT_LOW_SPEED_LIMIT
        ),
        low_speed_time=_seconds(args, env, "low_speed_time", "INIT_LOW_SPEED_TIME", DEFAULT_LOW_SPEED_TIME),
    )


def _what(source: GitSpec | ArtifactSpec | ProjectInfoSpec) -> tuple[str, str]:
    """(host, what init waits for) for the deadline's message."""
    if isinstance(source, GitSpec):
        url = source.url
        host = urlsplit(url).hostname if "://" in url else url.partition("@")[2].partition(":")[0] or url
        return host or url, "the git repository"
    if isinstance(source, ArtifactSpec):
        return urlsplit(source.url).hostname or redact_url(source.url), "the artifact download"
    return "", "writing the project file"


def _watchdog(
    limits: Limits,
    source: GitSpec | ArtifactSpec | ProjectInfoSpec,
    secrets: tuple[str, ...],
    named: str = "",
) -> threading.Event:
    """Ends the process when the whole fetch outlives the deadline, or a download stays below the
    low-speed limit: transports block in places no timeout reaches (a git:// or SSH peer that goes
    silent, a server trickling bytes), so a watchdog thread is the one bound that holds for all of
    them. Set the returned event to stop it."""
    host, what = _what(source)
    started = time.monotonic()
    check = transfer.LowSpeedCheck(limits.low_speed_limit, limits.low_speed_time)
    transfer.install()
    done = threading.Event()

    def give_up(why: str) -> None:
        _fail(redact_text(f"{why} waiting for {what} from {host}", secrets), named)
        sys.stderr.flush()
        os._exit(1)

    def watch() -> None:
        while not done.wait(0.5):
            if time.monotonic() - started >= limits.deadline:
                give_up(f"gave up after {limits.deadline:.0f}s (the init deadline)")
            got = check.too_slow(transfer.phase_start(), transfer.received())
            if got is not None:
                give_up(
                    f"gave up: {got} bytes in the last {limits.low_speed_time:.0f}s, below the "
                    f"low-speed limit of {limits.low_speed_limit:.0f} bytes/s,"
                )

    threading.Thread(target=watch, name="init-watchdog", daemon=True).start()
    return done


def run_init(args: argparse.Namespace) -> int:
    """Entry point of `agent init`: 0 on success, 1 if the fetch failed, 2 for bad settings."""
    secrets: tuple[str, ...] = ()
    named = args.source_name if args.source_name is not None else os.environ.get("SOURCE_NAME", "")
    try:
        request = resolve_request(args, os.environ)
        secrets = request.secrets
        watchdog = _watchdog(_limits(args, os.environ), request.source, secrets, named)
        try:
            execute(request)
        finally:
            watchdog.set()
    except UsageError as exc:
        _fail(redact_text(str(exc), secrets), named)
        return 2
    except SourceError as exc:
        _fail(redact_text(str(exc), secrets), named)
        return 1
    except Exception as exc:
        # A bug or an environment problem: still one line and no secrets. No traceback in the log:
        # renderers that show locals would print the credentials held in them.
        _fail(redact_text(f"unexpected error: {type(exc).__name__}: {exc}", secrets), named)
        return 1
    return 0


def _fail(message: str, named: str = "") -> None:
    """One line on stderr; ``named`` (``--source-name``) begins it: which of a pod's fetches failed."""
    message = f"{named}: {message}" if named else message
    log.error("init failed", error=message)
    print(f"agent init: {message}", file=sys.stderr)
