"""The Program reconciler: a Program's body becomes a served tarball recorded in ``status.artifact``.

Per generation it checks the body (:func:`pko.controllers.program.artifact.check_program`), builds the
deterministic tarball and writes, by server-side apply on ``/status`` as
``pulumi-kubernetes-operator/program-status``, what the Go operator writes (``observedGeneration``,
``artifact`` {path, url, revision, digest, size, lastUpdateTime}) plus our ``conditions``
extension: ``Ready`` True once the artifact is served, and for a body that cannot be served
``Ready`` False and ``Stalled`` True with reason ``ProgramInvalid`` and the fields at fault (the
artifact is then withdrawn: its URL would answer 404). A status that already says all this is
not written again, so a settled Program costs no API calls; only a new generation is reconciled.

The bytes are not stored anywhere: :class:`pko.controllers.program.server.ProgramServer`, a runnable on every
replica, rebuilds them from the Program cache on request.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

import structlog
from prometheus_client import Gauge

from pko.controllers.options import ControllerOptions
from pko.controllers.program.artifact import (
    ArtifactCache,
    InvalidProgram,
    ProgramArtifact,
    artifact_path,
    artifact_url,
)
from pko.controllers.program.server import ProgramServer, advertised_address
from pko.controllers.resources import FIELD_MANAGER_PROGRAM_STATUS, PROGRAMS
from pko.machinery.conditions import format_time, set_condition
from pko.machinery.controller import Result
from pko.machinery.informer import SharedInformer
from pko.machinery.manager import Manager
from pko.machinery.predicates import generation_changed
from pko.machinery.resource import Obj
from pko.machinery.writes import StatusWriter

__all__ = [
    "CONTROLLER_NAME",
    "REASON_ARTIFACT_READY",
    "REASON_PROGRAM_INVALID",
    "ProgramReconciler",
    "desired_status",
    "setup",
]

CONTROLLER_NAME: Final = "program-controller"
REASON_PROGRAM_INVALID: Final = "ProgramInvalid"
REASON_ARTIFACT_READY: Final = "ArtifactReady"
# Condition messages are bounded by the CRD (32768); a list of field errors never gets near, but cut anyway.
_MESSAGE_MAX: Final = 4096
# How long a reconcile waits for the artifact server to bind before retrying (only when the
# advertised address is derived from the bound one).
_SERVING_TIMEOUT: Final = 30.0

log = structlog.get_logger("pko.controllers.program.reconciler")


def _generation(obj: Obj) -> int:
    return int((obj.get("metadata") or {}).get("generation") or 0)


def desired_status(obj: Obj, artifact: ProgramArtifact | InvalidProgram, advertised: str) -> Obj:
    """The status this controller owns for ``obj``: a pure function of it and the artifact.

    Unchanged parts keep their timestamps (``lastUpdateTime`` while the digest and URL stay, each
    condition's ``lastTransitionTime`` while its status stays), so recomputing a settled Program
    gives exactly its current status.
    """
    meta = obj["metadata"]
    namespace, name, generation = str(meta["namespace"]), str(meta["name"]), _generation(obj)
    current: Obj = obj.get("status") or {}
    conditions: list[Obj] | None = current.get("conditions")
    status: Obj = {"observedGeneration": generation}
    if isinstance(artifact, InvalidProgram):
        message = f"invalid program: {artifact}"
        if len(message) > _MESSAGE_MAX:
            message = message[: _MESSAGE_MAX - 3] + "..."
        conditions = set_condition(conditions, "Ready", "False", REASON_PROGRAM_INVALID, message, generation)
        conditions = set_condition(conditions, "Stalled", "True", REASON_PROGRAM_INVALID, message, generation)
    else:
        record: Obj = {
            "path": artifact_path(namespace, name, generation),
            "url": artifact_url(advertised, namespace, name, generation),
            "revision": str(generation),
            "digest": artifact.digest,
            "size": artifact.size,
        }
        previous: Obj = current.get("artifact") or {}
        same = all(previous.get(k) == v for k, v in record.items())
        record["lastUpdateTime"] = previous.get("lastUpdateTime") if same else None
        record["lastUpdateTime"] = record["lastUpdateTime"] or format_time()
        status["artifact"] = record
        message = f"artifact for generation {generation} is available"
        conditions = set_condition(conditions, "Ready", "True", REASON_ARTIFACT_READY, message, generation)
        conditions = [c for c in conditions if c.get("type") != "Stalled"]
    status["conditions"] = conditions
    return status


# The status fields this controller owns.
STATUS_FIELDS: Final = ("observedGeneration", "artifact", "conditions")


class ProgramReconciler:
    """Reconciles one Program key: check, build, record (see the module docstring)."""

    def __init__(
        self,
        manager: Manager,
        options: ControllerOptions | None = None,
        *,
        cache: ArtifactCache | None = None,
    ) -> None:
        options = options or ControllerOptions()
        self.informer = manager.informer(PROGRAMS)
        self.client = manager.client(PROGRAMS)
        self.cache = cache or ArtifactCache()
        self.server = ProgramServer(self.informer, self.cache, options.program_fs_addr)
        if self.server.bind is None and not options.program_fs_adv_addr:
            raise ValueError("--program-fs-adv-addr is required when the program file server is disabled")
        self.advertised = options.program_fs_adv_addr
        self.status = StatusWriter(
            self.informer, FIELD_MANAGER_PROGRAM_STATUS, STATUS_FIELDS, client=self.client, force=True
        )

    async def _advertised(self) -> str:
        if self.advertised:
            return self.advertised
        bound = await asyncio.wait_for(self.server.wait_serving(), _SERVING_TIMEOUT)
        return advertised_address("", bound)

    async def reconcile(self, key: str) -> Result:
        obj = self.informer.indexer.get_by_key(key)
        if obj is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
            return Result.done()  # nothing to record; the LRU forgets its bytes in time
        result: ProgramArtifact | InvalidProgram
        try:
            result = self.cache.get(obj)
        except InvalidProgram as exc:
            result = exc
        status = desired_status(obj, result, await self._advertised())
        if await self.status.write(obj, status) is None:
            return Result.done()
        if isinstance(result, InvalidProgram):
            log.info("program invalid", program=key, generation=_generation(obj), errors=str(result))
        else:
            log.info(
                "program artifact recorded", program=key, generation=_generation(obj), digest=result.digest
            )
        return Result.done()


def _count(informer: SharedInformer) -> float:
    return float(len(informer.indexer))


def setup(manager: Manager, options: ControllerOptions | None = None, **kwargs: Any) -> ProgramReconciler:
    """Declare the program controller, its artifact server (every replica) and ``programs_active``."""
    reconciler = ProgramReconciler(manager, options, **kwargs)
    manager.add_runnable("program-fs", reconciler.server.run, leader_only=False)
    manager.controller(CONTROLLER_NAME, reconciler).for_(PROGRAMS, predicate=generation_changed)
    gauge = Gauge("programs_active", "Number of Program objects currently tracked", registry=manager.registry)
    informer = reconciler.informer
    gauge.set_function(lambda: _count(informer))
    return reconciler
