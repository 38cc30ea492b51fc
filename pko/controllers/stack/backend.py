"""Whether a Stack's Pulumi state dies with its workspace pod (pure, no I/O).

A ``file://`` backend is a directory inside the workspace pod. Unless a durable volume is mounted
there, the state is gone when the pod is replaced (a spec change, a node drain, an eviction), and
the next update recreates every resource Pulumi no longer knows about. The operator warns at
creation; this module decides.

The decision reads the pod that actually runs: the Workspace is built from the Stack
(:func:`~pko.controllers.stack.workspaceobject.build_workspace`, ``workspaceTemplate`` merged in)
and turned into its pod (:func:`~pko.controllers.workspace.workloads.desired_statefulset`, with the
default ``share`` emptyDir and the Workspace's ``podTemplate`` merged in). Then, among the mounts of
the ``pulumi`` container, the longest ``mountPath`` that is the state directory or a parent of it
decides: an ``emptyDir`` or a generic ephemeral volume (``volumes[].ephemeral``, deleted with the
pod) is ephemeral, any other volume (persistentVolumeClaim, hostPath, nfs, csi...) is durable
enough, and no mount at all is the container's own filesystem.

The path is resolved as Pulumi's diy backend resolves it (``massageBlobPath``): ``file://`` is cut
off, the query string is dropped, ``~`` is the home directory, and a relative path is relative to
the working directory of ``pulumi`` (the project directory the agent runs in, under
``/share/workspace``). Pulumi keeps everything it writes under ``<path>/.pulumi``, so that is the
directory checked: a volume mounted at ``<path>/.pulumi`` alone keeps the state too.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import unquote

from pko.api.stack import Stack
from pko.api.workspace import WorkspaceSpec
from pko.controllers.options import ControllerOptions
from pko.controllers.stack.workspaceobject import PULUMI_CONTAINER, build_workspace
from pko.controllers.workspace.workloads import WORKSPACE_DIR, desired_statefulset, parse_spec

__all__ = ["EPHEMERAL_BACKEND_REASON", "ephemeral_backend"]

EPHEMERAL_BACKEND_REASON: Final = "EphemeralBackend"
"""The reason of the warning condition and Event for a Stack whose state is lost with its pod."""

_FILE_SCHEME: Final = "file:"
# Where the diy backend keeps stacks, history, backups and locks, under the backend's directory.
_BOOKKEEPING_DIR: Final = ".pulumi"
# Volume sources that are deleted with the pod.
_EPHEMERAL_SOURCES: Final = {"emptyDir": "an emptyDir volume", "ephemeral": "an ephemeral volume"}
# ``~`` is the home directory in /etc/passwd of the user pulumi runs as (Go's os/user, not $HOME):
# root in pulumi/pulumi, the ``pulumi`` user (uid 1000) in pulumi/pulumi:*-nonroot.
_ROOT_HOME: Final = "/root"
_NONROOT_HOME: Final = "/home/pulumi"
# The builders need an identity read from the API; the pod spec does not depend on it.
_STAND_IN_NAME: Final = "stack"
_STAND_IN_UID: Final = "00000000-0000-0000-0000-000000000000"

Obj = dict[str, Any]


def ephemeral_backend(stack: Stack) -> str | None:
    """Why ``stack``'s state is lost when its workspace pod is replaced, as a message for the user.

    None when the state is durable, when ``spec.backend`` is unset or not a ``file://`` URL, and
    when the Stack cannot be turned into a pod (the reconciler reports that error itself).
    """
    backend = (stack.spec.backend or "").strip()
    relative = _file_path(backend)
    if relative is None:
        return None
    built = _workspace_pod(stack)
    if built is None:
        return None
    spec, pod = built
    container = next((c for c in pod.get("containers") or [] if c.get("name") == PULUMI_CONTAINER), None)
    if container is None:
        return None
    path = _resolve(relative, home=_home(pod, container), cwd=_working_dir(spec))
    where = _where(posixpath.join(path, _BOOKKEEPING_DIR), pod, container)
    if where is None:
        return None
    shown = backend if _clean(relative) == path else f"{backend} ({path})"
    return (
        f"state in {shown} is lost when the workspace pod is replaced ({where}); "
        "use a PersistentVolumeClaim or an object store (s3://, gs://, azblob://)"
    )


def _file_path(backend: str) -> str | None:
    """The path part of a ``file://`` backend URL as Pulumi reads it (None: not a file backend).

    Pulumi strips the ``file://`` prefix and keeps the rest verbatim up to the query string;
    ``file://relative`` is a relative path, not a host.
    """
    if backend[: len(_FILE_SCHEME)].lower() != _FILE_SCHEME:
        return None
    rest = backend[len(_FILE_SCHEME) :]
    if rest.startswith("//"):
        rest = rest[2:]
    elif not rest.startswith("/"):
        return None  # file:x is no path Pulumi opens
    return rest.split("?", 1)[0]


def _clean(path: str) -> str:
    """``filepath.Clean`` (POSIX ``normpath`` keeps a leading ``//``; Go does not)."""
    cleaned = posixpath.normpath(path)
    return "/" + cleaned.lstrip("/") if cleaned.startswith("/") else cleaned


def _resolve(path: str, *, home: str, cwd: str) -> str:
    """The absolute directory Pulumi opens for ``file://<path>`` (``massageBlobPath``)."""
    if path.startswith("~"):
        # Go's rule, verbatim: "~" alone is home, else the text after the first two characters.
        path = home if path == "~" else posixpath.join(home, path[2:])
    path = posixpath.join(cwd, path)
    # The bucket URL is parsed again before it is opened: a fragment is cut, escapes are decoded.
    return _clean(unquote(path.split("#", 1)[0]))


def _workspace_pod(stack: Stack) -> tuple[WorkspaceSpec, Obj] | None:
    """The Workspace spec and workspace pod spec ``stack`` gets (None: it gets none, being invalid)."""
    meta = stack.metadata
    if not meta.name or not meta.uid:
        identity = {"name": meta.name or _STAND_IN_NAME, "uid": meta.uid or _STAND_IN_UID}
        stack = stack.model_copy(update={"metadata": meta.model_copy(update=identity)})
    try:
        workspace = build_workspace(stack, None)
        workspace["metadata"]["uid"] = _STAND_IN_UID
        spec = parse_spec(workspace)
        statefulset = desired_statefulset(workspace, spec, ControllerOptions())
    except ValueError:
        return None
    pod: Obj = statefulset["spec"]["template"]["spec"]
    return spec, pod


def _working_dir(spec: WorkspaceSpec) -> str:
    """Where pulumi runs: the agent resolves the ``/share/workspace`` link, which points at a
    ``local`` source's directory, or at the fetched project under ``/share``."""
    if spec.local is not None and spec.local.dir:
        # A relative link target is relative to the link's directory.
        return posixpath.join(posixpath.dirname(WORKSPACE_DIR), spec.local.dir)
    return WORKSPACE_DIR


def _home(pod: Mapping[str, Any], container: Mapping[str, Any]) -> str:
    """The home directory of the user ``pulumi`` runs as, as the official images define it."""
    uid = (container.get("securityContext") or {}).get("runAsUser")
    if uid is None:
        uid = (pod.get("securityContext") or {}).get("runAsUser")
    if uid is None:  # the image's own user
        return _NONROOT_HOME if "nonroot" in str(container.get("image") or "") else _ROOT_HOME
    return _ROOT_HOME if uid == 0 else _NONROOT_HOME


def _under(path: str, mount: str) -> bool:
    return mount == "/" or path == mount or path.startswith(mount + "/")


def _where(path: str, pod: Mapping[str, Any], container: Mapping[str, Any]) -> str | None:
    """Where ``path`` lives if it is lost with the pod (None: on a durable volume)."""
    mounts = [
        (_clean(str(m["mountPath"])), str(m.get("name") or ""))
        for m in container.get("volumeMounts") or []
        if m.get("mountPath")
    ]
    covering = [(mount, name) for mount, name in mounts if _under(path, mount)]
    if not covering:
        return "it is on the container's own filesystem"
    _, name = max(covering, key=lambda m: len(m[0]))
    volume = next((v for v in pod.get("volumes") or [] if v.get("name") == name), None)
    if volume is None:
        return None  # a mount of no volume: the pod is refused, nothing runs to lose state
    for source, kind in _EPHEMERAL_SOURCES.items():
        if volume.get(source) is not None:
            return f'it is on {kind} "{name}"'
    return None
