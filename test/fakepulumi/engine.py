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
from typing import Any

from . import config as cfgmod
from .errors import BailError, CliError
from .eventlog import EventLog
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
}


class Terminate(Exception):
    """Raised by the second interrupt: stop now, leave in-flight operations pending."""


@dataclass
class Request:
    kind: str  # "update" | "refresh" | "destroy"
    dry_run: bool
    message: str = ""
    exec_kind: str = "cli"
    event_log: str | None = None
    replace: list[str] = field(default_factory=list)
    clear_pending_creates: bool = False
    show_secrets: bool = False
    remove: bool = False


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
}
_DOING = {
    "create": "creating",
    "update": "updating",
    "delete": "deleting",
    "replace": "replacing",
    "refresh": "refreshing",
    "create-replacement": "creating replacement",
    "delete-replaced": "deleting original",
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
    ) -> None:
        metadata: dict[str, Any] = {"op": op, "urn": urn, "type": type_, "old": old, "new": new}
        if diffs:
            metadata["keys"] = diffs
            metadata["diffs"] = diffs
        metadata.update({"detailedDiff": None, "provider": provider})
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
                    self._update({k: (plain_v, secret) for k, (plain_v, secret, _t) in stack_values.items()})
                elif req.kind == "refresh":
                    self._refresh()
                else:
                    self._destroy()
            except Terminate:
                self.failed = True
            outcome = "canceled" if self.cancelled.is_set() else "failed"
            if self.failed or self.cancelled.is_set():
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
                        if not (self.failed or self.cancelled.is_set())
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
                self._record_history(start, error is None and not self.failed and not self.cancelled.is_set())
                sc.backend.unlock(sc.ref)
        if error is not None:
            raise error
        if self.failed or self.cancelled.is_set():
            raise BailError()
        if req.kind == "destroy" and req.remove and not req.dry_run:
            sc.backend.remove(sc.ref, force=False)
            path = sc.project.root / f"Pulumi.{sc.ref.name}.yaml"
            path.unlink(missing_ok=True)

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
        sc, req = self.sc, self.req
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
            if self.failed:
                break
        if self.failed or self.cancelled.is_set():
            return
        for old in reversed(list(self.olds.values())):
            if old["urn"] in self.handled or old["type"].startswith("pulumi:providers:"):
                continue
            self._delete(old, "delete")
            if self.failed:
                return
        for old in self.pending_deletes[:]:
            self._delete(old, "delete-replaced")
        for old in reversed(list(self.olds.values())):
            if old["type"].startswith("pulumi:providers:") and old["urn"] not in self.handled:
                self._delete(old, "delete", internal=True)
        # Stack outputs (RegisterResourceOutputs on the root stack).
        try:
            outputs = {k: evaluator.evaluate(v) for k, v in spec.outputs.items()}
        except ProgramError as exc:
            self.diag(self.stack_urn, "error", str(exc))
            self.failed = True
            return
        new = dict(stack["new"])
        if not req.dry_run:
            new["outputs"] = to_state(outputs, self._encrypt)
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
        self._outputs = outputs

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
        new: dict[str, Any] = {
            "urn": urn,
            "custom": True,
            "id": "",
            "type": type_,
            "inputs": {},
            "outputs": {},
            "parent": parent[0].urn if parent else self.stack_urn,
            "provider": provider_ref,
        }
        if protect:
            new["protect"] = True
        if "deletedWith" in refs:
            new["deletedWith"] = refs["deletedWith"][0].urn
        if deps:
            new["dependencies"] = deps
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

    def _finish(
        self, name: str, urn: str, new: dict[str, Any], inputs: Any, outputs: Any, evaluator: Evaluator
    ) -> None:
        if isinstance(outputs, dict) and any(isinstance(v, Secret) for v in outputs.values()):
            for v in outputs.values():
                if isinstance(v, Secret):
                    self._collect_secret_texts(plain(v))
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
        for old in list(self.olds.values()):
            if self.cancelled.is_set():
                break
            internal = old["type"].startswith("pulumi:providers:")
            meta = self._state_meta(old)
            self.step_event(
                "resourcePreEvent", "refresh", old["urn"], old["type"], meta, meta, old.get("provider", "")
            )
            self.step_event(
                "resOutputsEvent", "same", old["urn"], old["type"], meta, meta, old.get("provider", "")
            )
            if not internal:
                self.count("same")
        if not self.req.dry_run:
            self.news = list(self.olds.values())
            self.handled = set(self.olds)
            self.base_pending = [
                op
                for op in self.base_pending
                if op.get("type") == "creating" and not self.req.clear_pending_creates
            ]

    def _destroy(self) -> None:
        for old in reversed(list(self.olds.values())):
            if self.cancelled.is_set():
                break
            internal = old["type"].startswith("pulumi:providers:")
            self._delete(old, "delete", internal=internal)
        if not self.req.dry_run:
            self.news = []

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
            "same": "unchanged",
        }
        if self.req.dry_run:
            words = {
                "create": "to create",
                "update": "to update",
                "delete": "to delete",
                "replace": "to replace",
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
            "kind": self.req.kind,
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
