"""The deployment engine: preview, update, refresh and destroy over the file backend.

It follows the real engine's observable contract (pkg/engine, pkg/resource/deploy, pkg/backend/diy):

* events, in order: ``preludeEvent``; per step ``resourcePreEvent`` then ``resOutputsEvent`` (or a
  ``diagnosticEvent`` + ``resOpFailedEvent`` on failure); ``summaryEvent``; finally ``cancelEvent``.
  Default-provider steps are emitted but not counted, as the engine marks them internal.
* a non-preview operation takes the stack lock first (no events if that fails), persists the
  checkpoint with a pending operation before each resource operation and without it after, appends
  a history entry (``succeeded``/``failed``) and a backup, then releases the lock.
* a step failure stops scheduling further steps; the stack gets ``error: update failed``. The first
  SIGINT/SIGTERM cancels gracefully (in-flight operations are told to stop, nothing new starts) and
  reports ``update canceled``; a second one terminates, leaving any in-flight operation pending.
* a previous checkpoint's pending operations produce the real warning; pending creates survive
  ``up`` and only ``refresh --clear-pending-creates`` (or ``stack import``) drops them.
* ``--target`` (with ``--target-dependents``) follows the step generator: untargeted resources get
  ``same`` steps and keep their old state, untargeted creates are skipped (reported as ``same``, not
  saved), deletes are limited to the targets and their dependents, and an unknown literal target
  fails the operation, with no ``update failed`` line: ``refresh`` before it starts, ``up`` and
  ``destroy`` once their other steps ran.
* ``refresh`` reads each resource back from its provider: changed outputs (drift) make the step an
  ``update`` with ``diffs``/``detailedDiff`` and new state; ``import`` issues ``same`` steps for the
  existing resources, then an ``import`` step per resource (history kind ``resource-import``).
"""

from __future__ import annotations

import math
import signal
import time
from types import FrameType
from typing import Any

from .enginestate import custom_state, is_provider, timestamp
from .engineupdate import EngineUpdate
from .errors import BailError, CliError
from .importing import ImportSpec
from .providers import ProviderError, canonical_type, provider_for
from .request import NoChangesExpected, operation_name
from .targets import dependencies, dependents_closure
from .values import plain, to_event, to_state

_LABELS = {
    ("update", True): "Previewing update",
    ("update", False): "Updating",
    ("refresh", True): "Previewing refresh",
    ("refresh", False): "Refreshing",
    ("destroy", True): "Previewing destroy",
    ("destroy", False): "Destroying",
    ("import", True): "Previewing import",
    ("import", False): "Importing",
}


class Terminate(Exception):
    """Raised by the second interrupt: stop now, leave in-flight operations pending."""


class Engine(EngineUpdate):
    """One operation (``Request``) on one stack: run() is the CLI's RunE."""

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        name = "SIGTERM" if signum == signal.SIGTERM else "^C"
        if self._signals == 1:
            if signum == signal.SIGTERM:
                msg = (
                    "SIGTERM received; cancelling. If you would like to terminate immediately, "
                    "send SIGTERM again.\n"
                )
            else:
                msg = "^C received; cancelling. If you would like to terminate immediately, press ^C again.\n"
            if not self.req.dry_run:
                msg += (
                    "<{%fg 9%}>Note that terminating immediately may lead to orphaned resources and other "
                    "inconsistencies.\n<{%reset%}>"
                )
            self._notices.append(msg)
            self.cancelled.set()
        else:
            self._notices.append(f"<{{%fg 9%}}>{name} received; terminating<{{%reset%}}>")
            raise Terminate()

    # -- run -------------------------------------------------------------------------------------------
    def run(self) -> None:
        """Run the operation; raises BailError/CliError on failure, like the CLI's RunE."""
        sc, req = self.sc, self.req
        if sc.project.runtime != "yaml":
            raise CliError(
                f"failed to load language plugin {sc.project.runtime}: the fake pulumi CLI only runs "
                "runtime: yaml programs"
            )
        stack_values = self._load_config()
        self.base = sc.backend.load_deployment(sc.ref)
        for res in self.base.get("resources") or []:
            self.olds[res["urn"]] = res
        self.base_pending = [op for op in self.base.get("pending_operations") or []]

        if not req.dry_run:
            sc.backend.lock(sc.ref)
        start = time.time()
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        error: BaseException | None = None
        try:
            label = _LABELS[(req.kind, req.dry_run)]
            self.display.line(f"{label} ({sc.shown_name}):")
            prelude = {k: "[secret]" if secret else text for k, (_v, secret, text) in stack_values.items()}
            self.emit({"preludeEvent": {"config": prelude}})
            if self.base_pending and not req.dry_run and req.kind == "update":
                self._warn_pending()
            try:
                if req.kind == "update":
                    if req.refresh:
                        self._refresh_olds()
                    self._update({k: (plain_v, secret) for k, (plain_v, secret, _t) in stack_values.items()})
                elif req.kind == "refresh":
                    self._refresh()
                elif req.kind == "import":
                    self._import()
                else:
                    self._destroy()
            except Terminate:
                self.failed = True
            self.failed = self.failed or self.gen_error
            outcome = "canceled" if self.cancelled.is_set() else "failed"
            if (self.failed and not self.bailed) or self.cancelled.is_set():
                self.diag("", "error", f"{'preview' if req.dry_run else 'update'} {outcome}")
            duration = time.time() - start
            self.emit(
                {
                    "summaryEvent": {
                        "maybeCorrupt": False,
                        "durationSeconds": math.ceil(duration),
                        "resourceChanges": self.counts,
                        "PolicyPacks": {},
                        "isPreview": req.dry_run,
                        "result": "succeeded"
                        if not (self.unsuccessful or self.cancelled.is_set())
                        else ("canceled" if self.cancelled.is_set() else "failed"),
                    }
                }
            )
            self.emit({"cancelEvent": {}})
            self._print_summary(duration)
        except BaseException as exc:
            error = exc
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.log.close()
            if not req.dry_run:
                # Saved even after a termination: an interrupted operation stays pending, as in the real CLI.
                self.save()
                self._record_history(
                    start, error is None and not self.unsuccessful and not self.cancelled.is_set()
                )
                sc.backend.unlock(sc.ref)
        if error is not None:
            raise error
        if self.unsuccessful or self.cancelled.is_set():
            raise BailError()
        if req.expect_no_changes and self.has_changes():
            raise NoChangesExpected(operation_name(req))
        if req.kind == "destroy" and req.remove and not req.dry_run:
            sc.backend.remove(sc.ref, force=False)
            path = sc.project.root / f"Pulumi.{sc.ref.name}.yaml"
            path.unlink(missing_ok=True)

    # -- refresh / destroy -----------------------------------------------------------------------------
    def _refresh(self) -> None:
        """Read every (targeted) resource back; drift becomes an ``update`` step and new state.

        As deploymentExecutor.refresh: targets are checked first (nothing runs if one is unknown),
        and ``--target-dependents`` adds, in state order, resources depending on a refreshed one.
        """
        if self.targets.constrained and self._report_missing_targets(set(self.olds)):
            self.bailed = True
            return
        refreshed: dict[str, dict[str, Any]] = {}
        for old in list(self.olds.values()):
            if self.cancelled.is_set():
                break
            if self._refresh_targeted(old):
                refreshed[old["urn"]] = self._refresh_one(old)
        if not self.req.dry_run:
            self.news = [refreshed.get(urn, old) for urn, old in self.olds.items()]
            self.handled = set(self.olds)
            self.base_pending = [
                op
                for op in self.base_pending
                if op.get("type") == "creating" and not self.req.clear_pending_creates
            ]

    def _refresh_olds(self) -> None:
        """``--refresh`` on ``up``/``preview``: each resource is read back first (its refresh step in
        the event stream), and the update then diffs against, and keeps, what was read. The refresh
        steps are not counted in the update's summary."""
        counts = dict(self.counts)
        for urn, old in list(self.olds.items()):
            if self.cancelled.is_set():
                break
            self.olds[urn] = self._refresh_one(old, keep=True)
        self.counts = counts

    def _refresh_targeted(self, old: dict[str, Any]) -> bool:
        if self.targets_actual.contains(old["urn"]):
            return True
        if self.req.target_dependents and any(self.targets_actual.contains(d) for d in dependencies(old)):
            self.targets_actual.add(old["urn"])
            return True
        return False

    def _refresh_one(self, old: dict[str, Any], keep: bool = False) -> dict[str, Any]:
        """One refresh step; returns the state to keep (the old one unless the resource drifted, or,
        unless ``keep``, on a preview)."""
        urn, type_, provider_ref = old["urn"], old["type"], old.get("provider", "")
        meta = self._state_meta(old)
        self.step_event("resourcePreEvent", "refresh", urn, type_, meta, meta, provider_ref)
        provider = provider_for(type_) if old.get("custom") and not is_provider(old) else None
        inputs = self._decrypt_state(old.get("inputs") or {})
        outputs = self._decrypt_state(old.get("outputs") or {})
        fresh = provider.refresh(urn, old.get("id", ""), inputs, outputs) if provider else outputs
        changed = sorted(k for k in set(outputs) | set(fresh) if plain(outputs.get(k)) != plain(fresh.get(k)))
        if not changed:
            self.step_event("resOutputsEvent", "same", urn, type_, meta, meta, provider_ref)
            if not is_provider(old):
                self.count("same")
            return old
        detailed = {k: {"diffKind": _diff_kind(k, outputs, fresh), "inputDiff": False} for k in changed}
        new_meta = self._state_meta(old, (inputs, fresh))
        self.step_event(
            "resOutputsEvent", "update", urn, type_, meta, new_meta, provider_ref, changed, detailed
        )
        self.progress("update", type_, urn.rsplit("::", 1)[1], done=True)
        self.count("update")
        if self.req.dry_run and not keep:
            return old
        return {**old, "outputs": to_state(fresh, self._encrypt), "modified": timestamp()}

    def _destroy(self) -> None:
        """Delete everything, or (``--target``) the targets and their dependents; the latter need
        ``--target-dependents`` unless targeted themselves, and the rest keep their state."""
        if not self.targets.constrained:
            for old in reversed(list(self.olds.values())):
                if self.cancelled.is_set():
                    break
                self._delete(old, "delete", internal=is_provider(old))
            return
        missing = self._report_missing_targets(set(self.olds))
        allowed = dependents_closure(list(self.olds.values()), self.targets)
        doomed = [o for o in self.olds.values() if o["urn"] in allowed]
        if self._allow_untargeted_deletes(doomed):
            for old in self.olds.values():
                if old["urn"] not in allowed:
                    self._untargeted_same(old)
            for old in reversed(doomed):
                if self.cancelled.is_set():
                    break
                self._delete(old, "delete", internal=is_provider(old))
        self.bailed = self.bailed or missing

    # -- import ------------------------------------------------------------------------------------------
    def _import(self) -> None:
        """importer.importResources: ``same`` steps for what exists, a stack if there is none, then an
        ``import`` step per resource. An id already imported under the same URN is left alone."""
        for old in self.olds.values():
            if self.cancelled.is_set():
                return
            self._untargeted_same(old)
            if is_provider(old) and old["urn"].rsplit("::", 1)[1].startswith("default_"):
                self.providers_used[old["type"].split(":")[2]] = f"{old['urn']}::{old.get('id', '')}"
        stack = None if self.stack_urn in self.olds else self._stack_step()
        for spec in self.req.imports:
            if self.cancelled.is_set() or self.failed:
                break
            self._import_one(spec)
        if stack is not None and not self.failed:
            self._finish_stack(stack, {})

    def _import_one(self, spec: ImportSpec) -> None:
        type_ = canonical_type(spec.type)
        provider = provider_for(type_)
        assert provider is not None, "the import command checks types first"
        urn = self.urn(type_, spec.urn_name)
        old = self.olds.get(urn)
        if old is not None and old.get("id") == spec.id:
            return
        provider_ref = self._ensure_provider(type_.split(":", 1)[0])
        new = custom_state(urn, type_, self.stack_urn, provider_ref)
        if self.req.protect_imports:
            new["protect"] = True
        self.step_event("resourcePreEvent", "import", urn, type_, None, self._state_meta(new), provider_ref)
        self.progress("import", type_, spec.urn_name, done=False)
        pending = {"resource": new, "type": "importing"}
        self.pending_ops.append(pending)
        self.save()
        try:
            if old is not None:
                raise ProviderError(f"resource '{urn}' already exists")
            read = provider.read(urn, spec.id)
            if read is None:
                raise ProviderError(f"resource '{spec.id}' does not exist")
        except ProviderError as exc:
            self.pending_ops.remove(pending)
            self._step_failed("import", new, None, provider_ref, str(exc), spec.urn_name)
            return
        self.pending_ops.remove(pending)
        inputs, outputs = read
        now = timestamp()
        new.update(id=spec.id, created=now, modified=now)
        magic_old = {**new, "inputs": to_event(inputs), "outputs": to_event(outputs)}
        self.step_event(
            "resOutputsEvent",
            "import",
            urn,
            type_,
            self._state_meta(magic_old),
            self._state_meta(new, (inputs, outputs)),
            provider_ref,
        )
        self.progress("import", type_, spec.urn_name, done=True)
        self.count("import")
        self.handled.add(urn)
        if not self.req.dry_run:
            self.news.append(
                {
                    **new,
                    "inputs": to_state(inputs, self._encrypt),
                    "outputs": to_state(outputs, self._encrypt),
                }
            )
            self.save()

    def _step_failed(
        self,
        op: str,
        new: dict[str, Any],
        old: dict[str, Any] | None,
        provider_ref: str,
        error: str,
        name: str,
    ) -> None:
        """A failed resource operation: its diagnostic, the resOpFailedEvent, and the operation fails."""
        self.diag(new["urn"], "error", error)
        self.step_event(
            "resOpFailedEvent",
            op,
            new["urn"],
            new["type"],
            self._state_meta(old),
            self._state_meta(new),
            provider_ref,
        )
        self.progress(op, new["type"], name, done=True, error=error)
        self.failed = True
        self.save()


def _diff_kind(key: str, old: dict[str, Any], new: dict[str, Any]) -> str:
    if key not in old:
        return "add"
    return "delete" if key not in new else "update"
