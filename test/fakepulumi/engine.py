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

import json
import math
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, cast

from . import config as cfgmod
from .errors import EXIT_NO_CHANGES, BailError, CliError
from .eventlog import EventLog
from .importing import ImportSpec
from .program import (
    RESOURCE_LIST_OPTIONS,
    RESOURCE_OPTIONS,
    Evaluator,
    ProgramError,
    ResourceView,
    load_program,
    program_config,
    resource_order,
)
from .providers import PACKAGE_VERSIONS, OpContext, ProviderError, canonical_type, provider_for
from .stackctx import StackContext
from .targets import (
    UrnTargets,
    dependencies,
    dependents_closure,
    not_found_message,
    untargeted_create_message,
    untargeted_delete_message,
)
from .values import UNKNOWN, Secret, from_state, has_unknown, plain, to_event, to_state
from .version import cli_version

STACK_TYPE = "pulumi:pulumi:Stack"
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
_HISTORY_KIND = {"import": "resource-import"}
"""Request kinds whose history ``kind`` differs (apitype.ResourceImportUpdate)."""
_NO_CHANGE_OPS = ("same", "read", "discard", "read-replacement")
"""Step ops that engine.HasChanges does not count as changes."""


class Terminate(Exception):
    """Raised by the second interrupt: stop now, leave in-flight operations pending."""


@dataclass
class Request:
    kind: str  # "update" | "refresh" | "destroy" | "import"
    dry_run: bool
    message: str = ""
    exec_kind: str = "cli"
    event_log: str | None = None
    replace: list[str] = field(default_factory=list)
    clear_pending_creates: bool = False
    show_secrets: bool = False
    remove: bool = False
    targets: list[str] = field(default_factory=list)
    target_dependents: bool = False
    expect_no_changes: bool = False
    imports: list[ImportSpec] = field(default_factory=list)
    protect_imports: bool = True
    refresh: bool = False  # `up`/`preview --refresh`: read every resource back before the update


class NoChangesExpected(CliError):
    """backenderr.NoChangesExpectedError: checked after the operation, exit code 7 (ExitNoChanges)."""

    def __init__(self, operation: str) -> None:
        super().__init__(
            f"no changes were expected for {operation} but changes were proposed", EXIT_NO_CHANGES
        )


class Display:
    """Progress text on stdout, flushed per line so ``on_output`` sees it live."""

    def line(self, text: str = "") -> None:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


_SYMBOL = {
    "create": "+",
    "update": "~",
    "delete": "-",
    "replace": "+-",
    "same": " ",
    "refresh": " ",
    "create-replacement": "++",
    "delete-replaced": "--",
    "import": "=",
}
_DONE = {
    "create": "created",
    "update": "updated",
    "delete": "deleted",
    "replace": "replaced",
    "same": "",
    "refresh": "refreshed",
    "create-replacement": "created replacement",
    "delete-replaced": "deleted original",
    "import": "imported",
}
_DOING = {
    "create": "creating",
    "update": "updating",
    "delete": "deleting",
    "replace": "replacing",
    "refresh": "refreshing",
    "create-replacement": "creating replacement",
    "delete-replaced": "deleting original",
    "import": "importing",
}


class Engine:
    def __init__(self, sc: StackContext, req: Request) -> None:
        self.sc = sc
        self.req = req
        self.project = sc.project.name
        self.stack = sc.ref.name
        self.stack_urn = self.urn(STACK_TYPE, f"{self.project}-{self.stack}")
        self.display = Display()
        self.log = EventLog(req.event_log)
        self.cancelled = threading.Event()
        self._notices: list[str] = []
        self._signals = 0
        self.counts: dict[str, int] = {}
        self.failed = False
        self.bailed = False
        """A failure already explained by its own diagnostic: no ``update failed`` line (a bail error)."""
        self.targets = UrnTargets(req.targets)
        self.targets_actual = self.targets.copy()
        self.skipped_creates: set[str] = set()
        self.registered: set[str] = set()
        self.gen_error = False
        """The step generator saw an error but (in a preview) kept going; the operation fails at the end."""
        self.diags: list[tuple[str, str, str]] = []  # (urn, severity, message)
        self._secret_texts: list[str] = []
        # State bookkeeping.
        self.base: dict[str, Any] = {}
        self.olds: dict[str, dict[str, Any]] = {}
        self.news: list[dict[str, Any]] = []
        self.handled: set[str] = set()
        self.pending_deletes: list[dict[str, Any]] = []
        self.pending_ops: list[dict[str, Any]] = []
        self.base_pending: list[dict[str, Any]] = []
        self.providers_used: dict[str, str] = {}

    # -- helpers -----------------------------------------------------------------------------------
    def urn(self, type_: str, name: str) -> str:
        return f"urn:pulumi:{self.stack}::{self.project}::{type_}::{name}"

    def _decrypt_state(self, value: Any) -> Any:
        return from_state(value, self.sc.decrypt)

    def _encrypt(self, plaintext: str) -> str:
        return self.sc.encrypt(plaintext)

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

    def emit(self, body: dict[str, Any]) -> None:
        while self._notices:
            message = self._notices.pop(0)
            self.log.emit({"stdoutEvent": {"message": message, "color": "raw"}})
            self.display.line(message.replace("<{%fg 9%}>", "").replace("<{%reset%}>", "").rstrip("\n"))
        self.log.emit(body)

    def _filter(self, text: str) -> str:
        for secret in self._secret_texts:
            if secret:
                text = text.replace(secret, "[secret]")
        return text

    def diag(self, urn: str, severity: str, message: str) -> None:
        message = self._filter(message)
        self.diags.append((urn, severity, message))
        body: dict[str, Any] = {
            "prefix": f"{severity}: ",
            "message": message.rstrip("\n") + "\n",
            "color": "raw",
            "severity": severity,
        }
        if urn:
            body = {"urn": urn, **body}
        self.emit({"diagnosticEvent": body})

    @staticmethod
    def _state_meta(
        res: dict[str, Any] | None, values: tuple[Any, Any] | None = None
    ) -> dict[str, Any] | None:
        """StepEventStateMetadata; ``values`` are (inputs, outputs) as engine values, else masked state."""
        if res is None:
            return None
        if values is None:
            inputs, outputs = _mask_state(res.get("inputs") or {}), _mask_state(res.get("outputs") or {})
        else:
            inputs, outputs = to_event(values[0]), to_event(values[1])
        meta: dict[str, Any] = {"type": res["type"], "urn": res["urn"]}
        if res.get("custom"):
            meta["custom"] = True
        if res.get("delete"):
            meta["delete"] = True
        meta.update({"id": res.get("id", ""), "parent": res.get("parent", "")})
        if res.get("protect"):
            meta["protect"] = True
        meta.update({"inputs": inputs, "outputs": outputs, "provider": res.get("provider", "")})
        return meta

    def step_event(
        self,
        kind: str,
        op: str,
        urn: str,
        type_: str,
        old: dict[str, Any] | None,
        new: dict[str, Any] | None,
        provider: str = "",
        diffs: list[str] | None = None,
        detailed_diff: dict[str, Any] | None = None,
    ) -> None:
        """A step event; a refresh's drift carries ``diffs`` and ``detailedDiff`` but no ``keys``."""
        metadata: dict[str, Any] = {"op": op, "urn": urn, "type": type_, "old": old, "new": new}
        if diffs and detailed_diff is None:
            metadata["keys"] = diffs
        if diffs:
            metadata["diffs"] = diffs
        metadata.update({"detailedDiff": detailed_diff, "provider": provider})
        body: dict[str, Any] = {"metadata": metadata}
        if self.req.dry_run and kind != "resOpFailedEvent":
            body["planning"] = True
        if kind == "resOpFailedEvent":
            body.update({"status": 0, "steps": sum(self.counts.values())})
        self.emit({kind: body})

    def count(self, op: str) -> None:
        self.counts[op] = self.counts.get(op, 0) + 1

    def progress(self, op: str, type_: str, name: str, done: bool, error: str | None = None) -> None:
        if op == "same" and not done:
            return
        verb = _DONE.get(op, op) if done else _DOING.get(op, op)
        suffix = f" error: {error}" if error else ""
        if error:
            verb = f"**{_DOING.get(op, op)} failed**"
        self.display.line(f" {_SYMBOL.get(op, ' '):<2} {type_} {name} {verb}{suffix}".rstrip())

    # -- checkpoint ----------------------------------------------------------------------------------
    def save(self) -> None:
        if self.req.dry_run:
            return
        resources = list(self.news)
        seen = {r["urn"] for r in resources}
        for old in self.olds.values():
            if old["urn"] not in self.handled and old["urn"] not in seen:
                resources.append(old)
        resources.extend(self.pending_deletes)
        deployment: dict[str, Any] = dict(self.base)
        deployment["resources"] = resources
        ops = [*self.pending_ops, *self.base_pending]
        if ops:
            deployment["pending_operations"] = ops
        else:
            deployment.pop("pending_operations", None)
        provider_state = self.sc.secrets_provider_state()
        if provider_state is not None:
            deployment["secrets_providers"] = provider_state
        self.sc.backend.save_checkpoint(self.sc.ref, deployment)

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
            raise NoChangesExpected(_operation_name(req))
        if req.kind == "destroy" and req.remove and not req.dry_run:
            sc.backend.remove(sc.ref, force=False)
            path = sc.project.root / f"Pulumi.{sc.ref.name}.yaml"
            path.unlink(missing_ok=True)

    @property
    def unsuccessful(self) -> bool:
        return self.failed or self.bailed

    def has_changes(self) -> bool:
        """engine.HasChanges: any step other than same/read counts, the stack's own create included."""
        return any(n for op, n in self.counts.items() if op not in _NO_CHANGE_OPS)

    def _load_config(self) -> dict[str, tuple[Any, bool, str]]:
        """Full key -> (plaintext value, secret, display text)."""
        out: dict[str, tuple[Any, bool, str]] = {}
        for key, raw in self.sc.config.items():
            secret = cfgmod.is_secret(raw)
            value = cfgmod.decrypt(raw, self.sc.decrypt) if secret else raw
            text = cfgmod.value_text(value, lambda c: c)
            if secret:
                self._collect_secret_texts(value)
            out[key] = (text if not cfgmod.is_object(raw) else value, secret, text)
        return out

    def _collect_secret_texts(self, value: Any) -> None:
        if isinstance(value, str) and len(value) > 2:
            self._secret_texts.append(value)
        elif isinstance(value, dict):
            for v in value.values():
                self._collect_secret_texts(v)
        elif isinstance(value, list):
            for v in value:
                self._collect_secret_texts(v)

    def _warn_pending(self) -> None:
        lines = "".join(
            f"  * {op['resource']['urn']}, interrupted while {op['type']}\n" for op in self.base_pending
        )
        self.diag(
            "",
            "warning",
            "Attempting to deploy or update resources "
            f"with {len(self.base_pending)} pending operations from previous deployment.\n"
            + lines
            + "These resources are in an unknown state because the Pulumi CLI was interrupted while waiting "
            "for changes to these resources to complete. You should confirm whether or not the operations "
            "listed completed successfully by checking the state of the appropriate provider. For example, "
            "if you are using AWS, you can confirm using the AWS Console.\n\n"
            "Once you have confirmed the status of the interrupted operations, you can repair your stack "
            "using `pulumi refresh` which will refresh the state from the provider you are using and clear "
            "the pending operations if there are any.\n\n"
            "Note that `pulumi refresh` will need to be run interactively to clear pending CREATE "
            "operations.",
        )

    # -- update --------------------------------------------------------------------------------------
    def _stack_step(self) -> dict[str, Any]:
        old = self.olds.get(self.stack_urn)
        op = "same" if old else "create"
        new = {
            "urn": self.stack_urn,
            "custom": False,
            "type": STACK_TYPE,
            "outputs": (old or {}).get("outputs") or {},
        }
        self.step_event(
            "resourcePreEvent", op, self.stack_urn, STACK_TYPE, self._state_meta(old), self._state_meta(new)
        )
        self.progress(op, STACK_TYPE, f"{self.project}-{self.stack}", done=False)
        self.count(op)
        self.handled.add(self.stack_urn)
        if not self.req.dry_run:
            self.news.append(new)
            self.save()
        return {"op": op, "old": old, "new": new}

    def _ensure_provider(self, package: str) -> str:
        if package in self.providers_used:
            return self.providers_used[package]
        version = PACKAGE_VERSIONS.get(package, "1.0.0")
        urn = self.urn(f"pulumi:providers:{package}", "default_" + version.replace(".", "_"))
        old = self.olds.get(urn)
        id_ = old["id"] if old else str(uuid.uuid4())
        ptype = f"pulumi:providers:{package}"
        new: dict[str, Any] = {
            "urn": urn,
            "custom": True,
            "id": id_,
            "type": ptype,
            "inputs": {"version": version},
            "outputs": {"version": version},
        }
        op = "same" if old else "create"
        self.step_event("resourcePreEvent", op, urn, ptype, self._state_meta(old), self._state_meta(new))
        self.handled.add(urn)
        if not self.req.dry_run:
            self.news.append(new)
        self.step_event("resOutputsEvent", op, urn, ptype, self._state_meta(old), self._state_meta(new))
        ref = f"{urn}::{id_}"
        self.providers_used[package] = ref
        return ref

    def _update(self, stack_config: dict[str, tuple[Any, bool]]) -> None:
        sc = self.sc
        try:
            spec = load_program(sc.project)
            values = program_config(spec, self.project, self.stack, stack_config)
            order = resource_order(spec)
        except ProgramError as exc:
            self.diag(self.stack_urn, "error", str(exc))
            self.failed = True
            return
        stack = self._stack_step()
        evaluator = Evaluator(spec, values)
        for name in order:
            if self.cancelled.is_set():
                break
            decl = spec.resources[name]
            try:
                self._register(evaluator, name, decl.type, decl.properties, decl.options)
            except ProgramError as exc:
                self.diag(self.stack_urn, "error", str(exc))
                self.failed = True
            if self.unsuccessful:
                break
        if self.unsuccessful or self.cancelled.is_set():
            return
        # As the executor: targets are checked once the program is done, before the deletes run.
        missing = self._report_missing_targets(set(self.olds) | self.registered)
        self._delete_unregistered()
        if self.failed:
            return
        for old in self.pending_deletes[:]:
            self._delete(old, "delete-replaced")
        for old in reversed(list(self.olds.values())):
            if _is_provider(old) and old["urn"] not in self.handled:
                if self.targets.constrained and not self.targets.contains(old["urn"]):
                    self._untargeted_same(old)
                else:
                    self._delete(old, "delete", internal=True)
        # Stack outputs (RegisterResourceOutputs on the root stack).
        try:
            outputs = {k: evaluator.evaluate(v) for k, v in spec.outputs.items()}
        except ProgramError as exc:
            self.diag(self.stack_urn, "error", str(exc))
            self.failed = True
            return
        self._finish_stack(stack, outputs, errored=missing or self.gen_error)
        self._outputs = outputs
        self.bailed = self.bailed or missing

    def _finish_stack(self, stack: dict[str, Any], outputs: dict[str, Any], errored: bool = False) -> None:
        """RegisterResourceOutputs on the root stack; an errored deployment keeps the old outputs the
        program did not produce again."""
        new = dict(stack["new"])
        if not self.req.dry_run:
            new["outputs"] = to_state(outputs, self._encrypt)
            if errored:
                new["outputs"] = {**(stack["new"].get("outputs") or {}), **new["outputs"]}
            self.news[self.news.index(stack["new"])] = new
        self.step_event(
            "resOutputsEvent",
            stack["op"],
            self.stack_urn,
            STACK_TYPE,
            self._state_meta(stack["old"]),
            self._state_meta(new, ({}, outputs)),
        )
        self.progress(stack["op"], STACK_TYPE, f"{self.project}-{self.stack}", done=True)

    def _report_missing_targets(self, known: set[str]) -> bool:
        """checkTargets: an error per literal target naming no resource; True when there was one."""
        missing = [target for target in self.targets.literals if target not in known]
        for target in missing:
            self.diag("", "error", not_found_message(target))
        return bool(missing)

    def _delete_unregistered(self) -> None:
        """Delete what the program no longer declares (GenerateDeletes). With ``--target`` only the
        targets and their dependents may go, and the rest keep their state through ``same`` steps."""
        gone = [o for o in self.olds.values() if o["urn"] not in self.handled and not _is_provider(o)]
        if self.targets.constrained:
            allowed = dependents_closure(list(self.olds.values()), self.targets)
            doomed = [o for o in gone if o["urn"] in allowed]
            if not self._allow_untargeted_deletes(doomed):
                return
            for old in gone:
                if old["urn"] not in allowed:
                    self._untargeted_same(old)
        else:
            doomed = gone
        for old in reversed(doomed):
            self._delete(old, "delete")
            if self.failed:
                return

    def _allow_untargeted_deletes(self, doomed: list[dict[str, Any]]) -> bool:
        """Deleting a dependent that was not itself targeted needs ``--target-dependents``: each is an
        error; a preview reports them and goes on, an update deletes nothing."""
        if self.req.target_dependents:
            return True
        unspecified = [o["urn"] for o in doomed if not self.targets.contains(o["urn"])]
        for urn in unspecified:
            self.diag(urn, "error", untargeted_delete_message(urn))
        self.gen_error = self.gen_error or bool(unspecified)
        return self.req.dry_run or not unspecified

    def _targeted_for_update(self, new: dict[str, Any]) -> bool:
        """isTargetedForUpdate: named by a target, or (``--target-dependents``) depending on one."""
        if not self.targets.constrained:
            return True
        deps = dependencies(new, with_provider=True)
        if self.targets.contains(new["urn"]) or (
            self.req.target_dependents and any(self.targets_actual.contains(d) for d in deps)
        ):
            self.targets_actual.add(new["urn"])
            return True
        return False

    def _untargeted_same(self, old: dict[str, Any]) -> None:
        """NewUntargetedSameStep: the old state carries over untouched, after its own old dependencies."""
        urn = old["urn"]
        if urn in self.handled:
            return
        self.handled.add(urn)
        for dep in dependencies(old, with_provider=True):
            if dep in self.olds:
                self._untargeted_same(self.olds[dep])
        meta = self._state_meta(old)
        for kind in ("resourcePreEvent", "resOutputsEvent"):
            self.step_event(kind, "same", urn, old["type"], meta, meta, old.get("provider", ""))
        if not _is_provider(old):
            self.count("same")
        if not self.req.dry_run:
            self.news.append(old)
            self.save()

    def _skip_untargeted(
        self, name: str, new: dict[str, Any], inputs: Any, old: dict[str, Any] | None, evaluator: Evaluator
    ) -> None:
        """An untargeted resource: kept as it was, or, if new, a skipped create (a ``same`` step that is
        never saved and whose outputs the program sees as unknown)."""
        urn = new["urn"]
        if old is not None:
            self._untargeted_same(old)
            outputs = self._decrypt_state(old.get("outputs") or {})
            self._collect_secret_outputs(outputs)
            evaluator.resources[name] = ResourceView(urn=urn, id=old.get("id", ""), outputs=outputs)
            return
        self.skipped_creates.add(urn)
        self.handled.add(urn)
        meta = self._state_meta(new, (inputs, {}))
        for kind in ("resourcePreEvent", "resOutputsEvent"):
            self.step_event(kind, "same", urn, new["type"], meta, meta, new.get("provider", ""))
        self.count("same")
        evaluator.resources[name] = ResourceView(urn=urn, id=UNKNOWN, outputs=cast(dict[str, Any], UNKNOWN))

    def _needs_skipped_create(self, new: dict[str, Any]) -> bool:
        """validateSteps: a targeted step depending on a skipped create is an error. A preview reports
        each once and goes on; an update stops (True) before touching the resource."""
        for dep in dependencies(new, with_provider=True):
            if dep not in self.skipped_creates:
                continue
            self.diag(new["urn"], "error", untargeted_create_message(new["urn"], dep))
            self.gen_error = True
            if not self.req.dry_run:
                self.bailed = True
                return True
            self.skipped_creates.discard(dep)
        return False

    def _register(
        self, evaluator: Evaluator, name: str, token: str, props: dict[str, Any], options: dict[str, Any]
    ) -> None:
        type_ = canonical_type(token)
        provider = provider_for(type_)
        if provider is None:
            raise ProgramError(f"unknown resource type {token!r}: the fake pulumi CLI has no provider for it")
        inputs = evaluator.evaluate(props)
        protect = bool(plain(evaluator.evaluate(options.get("protect", False))))
        refs = self._resource_options(evaluator, options)
        parent = refs.get("parent")
        qualified = f"{parent[0].qualified_type}${type_}" if parent else type_
        urn = self.urn(qualified, name)
        provider_ref = self._ensure_provider(type_.split(":", 1)[0])
        old = self.olds.get(urn)
        old_inputs = self._decrypt_state(old.get("inputs") or {}) if old else None
        if old is None:
            op = "create"
        elif old["type"] != type_ or urn in self.req.replace:
            op = "replace"
        elif plain(old_inputs) == plain(inputs) and not has_unknown(inputs):
            op = "same"
        else:
            op = "replace" if provider.replace_on_change else "update"
        diffs = (
            sorted(
                k
                for k in set(inputs) | set(old_inputs or {})
                if plain((old_inputs or {}).get(k)) != plain(inputs.get(k))
            )
            if old
            else None
        )
        # As the Go SDK (which pulumi-yaml uses) does: implicit and dependsOn URNs, sorted, no duplicates.
        deps = sorted(
            {evaluator.resources[d].urn for d in evaluator.spec.resources[name].property_deps}
            | {r.urn for r in refs.get("dependsOn", [])}
        )
        new = _custom_state(urn, type_, parent[0].urn if parent else self.stack_urn, provider_ref)
        if protect:
            new["protect"] = True
        if "deletedWith" in refs:
            new["deletedWith"] = refs["deletedWith"][0].urn
        if deps:
            new["dependencies"] = deps
        self.registered.add(urn)
        if not self._targeted_for_update(new):
            self._skip_untargeted(name, new, inputs, old, evaluator)
            return
        if self._needs_skipped_create(new):
            return
        short = type_
        if op == "same":
            assert old is not None
            outputs = self._decrypt_state(old.get("outputs") or {})
            new.update(id=old.get("id", ""), created=old.get("created"))
            self._emit_step(op, urn, type_, old, new, provider_ref, inputs, outputs, diffs)
            self._finish(name, urn, new, inputs, outputs, evaluator)
            self.count("same")
            return
        pre_op = "create-replacement" if op == "replace" else op
        self.step_event(
            "resourcePreEvent",
            pre_op,
            urn,
            type_,
            self._state_meta(old),
            self._state_meta(new, (inputs, {})),
            provider_ref,
            diffs,
        )
        self.progress(op, short, name, done=False)
        if self.req.dry_run:
            self.handled.add(urn)
            outputs = provider.preview_outputs(inputs)
            self.step_event(
                "resOutputsEvent",
                pre_op,
                urn,
                type_,
                self._state_meta(old),
                self._state_meta(new, (inputs, outputs)),
                provider_ref,
                diffs,
            )
            if op == "replace":
                self.step_event(
                    "resourcePreEvent",
                    "replace",
                    urn,
                    type_,
                    self._state_meta(old),
                    self._state_meta(new, (inputs, outputs)),
                    provider_ref,
                    diffs,
                )
                self.step_event(
                    "resOutputsEvent",
                    "replace",
                    urn,
                    type_,
                    self._state_meta(old),
                    self._state_meta(new, (inputs, outputs)),
                    provider_ref,
                    diffs,
                )
            known_id: Any = old.get("id", "") if op == "update" and old is not None else UNKNOWN
            evaluator.resources[name] = ResourceView(urn=urn, id=known_id, outputs=outputs)
            self.count(op)
            return
        pending_state = {**new, "inputs": to_state(inputs, self._encrypt)}
        pending = {
            "resource": pending_state,
            "type": "creating" if op in ("create", "replace") else "updating",
        }
        self.pending_ops.append(pending)
        self.save()
        ctx = OpContext(cancelled=self.cancelled, before_crash=self.save)
        try:
            if op == "update":
                assert old is not None
                outputs = provider.update(urn, old.get("id", ""), inputs, ctx)
                id_ = old.get("id", "")
            else:
                id_, outputs = provider.create(urn, inputs, ctx)
        except ProviderError as exc:
            self.pending_ops.remove(pending)
            self.diag(urn, "error", str(exc))
            self.step_event(
                "resOpFailedEvent",
                pre_op,
                urn,
                type_,
                self._state_meta(old),
                self._state_meta(new, (inputs, {})),
                provider_ref,
                diffs,
            )
            self.progress(op, short, name, done=True, error=str(exc))
            self.failed = True
            self.save()
            return
        self.pending_ops.remove(pending)
        now = _now()
        new.update(id=id_, created=(old or {}).get("created", now) if op == "update" else now, modified=now)
        if op == "replace" and old is not None:
            self.pending_deletes.append({**old, "delete": True})
        self._emit_step(pre_op, urn, type_, old, new, provider_ref, inputs, outputs, diffs)
        if op == "replace":
            self._emit_step("replace", urn, type_, old, new, provider_ref, inputs, outputs, diffs)
        self._finish(name, urn, new, inputs, outputs, evaluator)
        self.progress(op, short, name, done=True)
        self.count(op)

    @staticmethod
    def _resource_options(evaluator: Evaluator, options: dict[str, Any]) -> dict[str, list[ResourceView]]:
        """Resource-valued options, by name; a single-resource option maps to a one-item list.

        Explicit provider resources cannot exist here (no ``pulumi:providers:*`` resource type is
        modelled), so ``provider``/``providers`` always fail, with pulumi-yaml's wording.
        """
        refs: dict[str, list[ResourceView]] = {}
        for option in RESOURCE_OPTIONS:
            if option in options:
                refs[option] = [evaluator.resource_option(options[option], option)]
        for option in RESOURCE_LIST_OPTIONS:
            if option in options:
                refs[option] = evaluator.resource_list_option(options[option], option)
        for option in ("provider", "providers"):
            for res in refs.get(option, []):
                word = "Provider" if option == "provider" else "provider"  # pulumi-yaml's own capitalisation
                raise ProgramError(
                    f"resource passed as {word} was not a provider resource '{res.urn.rsplit('::', 1)[1]}'"
                )
        return refs

    def _emit_step(
        self,
        op: str,
        urn: str,
        type_: str,
        old: dict[str, Any] | None,
        new: dict[str, Any],
        provider_ref: str,
        inputs: Any,
        outputs: Any,
        diffs: list[str] | None,
    ) -> None:
        """Events after a step succeeded; ``same`` and logical ``replace`` steps also get their pre-event."""
        new_meta = self._state_meta(new, (inputs, outputs))
        if op in ("same", "replace"):
            self.step_event(
                "resourcePreEvent", op, urn, type_, self._state_meta(old), new_meta, provider_ref, diffs
            )
        self.step_event(
            "resOutputsEvent", op, urn, type_, self._state_meta(old), new_meta, provider_ref, diffs
        )

    def _collect_secret_outputs(self, outputs: Any) -> None:
        """Remember secret output texts so diagnostics never print them."""
        if isinstance(outputs, dict):
            for v in outputs.values():
                if isinstance(v, Secret):
                    self._collect_secret_texts(plain(v))

    def _finish(
        self, name: str, urn: str, new: dict[str, Any], inputs: Any, outputs: Any, evaluator: Evaluator
    ) -> None:
        self._collect_secret_outputs(outputs)
        evaluator.resources[name] = ResourceView(urn=urn, id=new.get("id", ""), outputs=outputs)
        self.handled.add(urn)
        if self.req.dry_run:
            return
        new["inputs"] = to_state(inputs, self._encrypt)
        new["outputs"] = to_state(outputs, self._encrypt)
        new = {k: v for k, v in new.items() if v is not None}
        self.news.append(new)
        self.save()

    def _delete(self, old: dict[str, Any], op: str, internal: bool = False) -> None:
        urn, type_ = old["urn"], old["type"]
        name = urn.rsplit("::", 1)[1]
        self.step_event(
            "resourcePreEvent", op, urn, type_, self._state_meta(old), None, old.get("provider", "")
        )
        if old.get("protect") and not self.req.dry_run:
            message = (
                f'unable to delete resource "{urn}"\nas it is currently marked for protection. To unprotect '
                "the resource, remove the `protect` flag from the resource in your Pulumi program and run "
                f"`pulumi up`, or use the command:\n`pulumi state unprotect '{urn}'`"
            )
            self.diag(urn, "error", message)
            self.step_event(
                "resOpFailedEvent", op, urn, type_, self._state_meta(old), None, old.get("provider", "")
            )
            self.failed = True
            return
        if not internal:
            self.progress(op, type_, name, done=False)
        if not self.req.dry_run:
            if op == "delete-replaced":
                self.pending_deletes.remove(old)
            else:
                self.handled.add(urn)
            self.save()
        self.step_event(
            "resOutputsEvent", op, urn, type_, self._state_meta(old), None, old.get("provider", "")
        )
        if not internal:
            self.progress(op, type_, name, done=True)
            if op != "delete-replaced":
                self.count(op)

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
        provider = provider_for(type_) if old.get("custom") and not _is_provider(old) else None
        inputs = self._decrypt_state(old.get("inputs") or {})
        outputs = self._decrypt_state(old.get("outputs") or {})
        fresh = provider.refresh(urn, old.get("id", ""), inputs, outputs) if provider else outputs
        changed = sorted(k for k in set(outputs) | set(fresh) if plain(outputs.get(k)) != plain(fresh.get(k)))
        if not changed:
            self.step_event("resOutputsEvent", "same", urn, type_, meta, meta, provider_ref)
            if not _is_provider(old):
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
        return {**old, "outputs": to_state(fresh, self._encrypt), "modified": _now()}

    def _destroy(self) -> None:
        """Delete everything, or (``--target``) the targets and their dependents; the latter need
        ``--target-dependents`` unless targeted themselves, and the rest keep their state."""
        if not self.targets.constrained:
            for old in reversed(list(self.olds.values())):
                if self.cancelled.is_set():
                    break
                self._delete(old, "delete", internal=_is_provider(old))
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
                self._delete(old, "delete", internal=_is_provider(old))
        self.bailed = self.bailed or missing

    # -- import ------------------------------------------------------------------------------------------
    def _import(self) -> None:
        """importer.importResources: ``same`` steps for what exists, a stack if there is none, then an
        ``import`` step per resource. An id already imported under the same URN is left alone."""
        for old in self.olds.values():
            if self.cancelled.is_set():
                return
            self._untargeted_same(old)
            if _is_provider(old) and old["urn"].rsplit("::", 1)[1].startswith("default_"):
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
        new = _custom_state(urn, type_, self.stack_urn, provider_ref)
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
        now = _now()
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

    # -- epilogue ----------------------------------------------------------------------------------------
    def _print_summary(self, duration: float) -> None:
        outputs = getattr(self, "_outputs", None)
        if outputs:
            self.display.line("Outputs:")
            width = max(len(k) for k in outputs)
            for key in sorted(outputs):
                value = outputs[key]
                text = (
                    "[secret]"
                    if isinstance(value, Secret)
                    else ("output<string>" if value is UNKNOWN else json.dumps(plain(value)))
                )
                self.display.line(f"    {key:<{width}}: {text}")
            self.display.line()
        if self.diags:
            self.display.line("Diagnostics:")
            for urn, severity, message in self.diags:
                where = urn.rsplit("::", 2)
                header = f"{where[1]} ({where[2]})" if urn else f"{STACK_TYPE} ({self.project}-{self.stack})"
                self.display.line(f"  {header}:")
                for text in message.rstrip("\n").split("\n"):
                    self.display.line(
                        f"    {severity}: {text}"
                        if text is message.rstrip("\n").split("\n")[0]
                        else f"    {text}"
                    )
                self.display.line()
        self.display.line("Resources:")
        words = {
            "create": "created",
            "update": "updated",
            "delete": "deleted",
            "replace": "replaced",
            "import": "imported",
            "same": "unchanged",
        }
        if self.req.dry_run:
            words = {
                "create": "to create",
                "update": "to update",
                "delete": "to delete",
                "replace": "to replace",
                "import": "to import",
                "same": "unchanged",
            }
        for op, n in self.counts.items():
            sym = _SYMBOL.get(op, " ").strip()
            self.display.line(f"    {sym + ' ' if sym else ''}{n} {words.get(op, op)}")
        self.display.line()
        self.display.line(f"Duration: {max(1, math.ceil(duration))}s")
        self.display.line()

    def _record_history(self, start: float, succeeded: bool) -> None:
        cfg = {}
        for key, raw in self.sc.config.items():
            secret, is_obj = cfgmod.is_secret(raw), cfgmod.is_object(raw)
            if is_obj:
                text = json.dumps(raw, separators=(",", ":"))
            else:
                text = raw["secure"] if secret else str(raw)
            cfg[key] = {"string": text, "secret": secret, "object": is_obj}
        info = {
            "kind": _HISTORY_KIND.get(self.req.kind, self.req.kind),
            "startTime": int(start),
            "message": self.req.message,
            "environment": {
                "exec.kind": self.req.exec_kind,
                "pulumi.version": f"v{cli_version()}",
                "pulumi.os": sys.platform,
                "pulumi.arch": "x64",
            },
            "config": cfg,
            "result": "succeeded" if succeeded else "failed",
            "endTime": int(time.time()),
            "resourceChanges": self.counts,
        }
        self.sc.backend.add_history(self.sc.ref, info)
        self.sc.backend.backup(self.sc.ref)


def _operation_name(req: Request) -> str:
    """The operation NoChangesExpectedError names: ``preview``, ``update`` or ``refresh``."""
    if req.kind == "update":
        return "preview" if req.dry_run else "update"
    return req.kind


def _diff_kind(key: str, old: dict[str, Any], new: dict[str, Any]) -> str:
    if key not in old:
        return "add"
    return "delete" if key not in new else "update"


def _is_provider(res: dict[str, Any]) -> bool:
    return str(res.get("type", "")).startswith("pulumi:providers:")


def _custom_state(urn: str, type_: str, parent: str, provider_ref: str) -> dict[str, Any]:
    """A custom resource's state before its provider has run (id, inputs and outputs still empty)."""
    return {
        "urn": urn,
        "custom": True,
        "id": "",
        "type": type_,
        "inputs": {},
        "outputs": {},
        "parent": parent,
        "provider": provider_ref,
    }


def _now() -> str:
    from .backend import now_rfc3339

    return now_rfc3339()


def _mask_state(value: Any) -> Any:
    from .values import SECRET_SIG, SIG_KEY

    if isinstance(value, dict):
        if value.get(SIG_KEY) == SECRET_SIG:
            return {SIG_KEY: SECRET_SIG, "ciphertext": "[secret]"}
        return {k: _mask_state(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask_state(v) for v in value]
    return value
