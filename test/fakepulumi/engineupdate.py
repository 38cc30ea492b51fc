"""The update's steps (``up`` and its preview): the stack and default providers, each program resource
registered as a create, update, replace or same step, ``--target``'s skipped and untargeted steps,
then the deletes of what the program no longer declares."""

from __future__ import annotations

import uuid
from typing import Any, cast

from .engineoutput import EngineOutput
from .enginestate import STACK_TYPE, custom_state, is_provider, timestamp
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
from .targets import (
    dependencies,
    dependents_closure,
    not_found_message,
    untargeted_create_message,
    untargeted_delete_message,
)
from .values import UNKNOWN, has_unknown, plain, to_state


class EngineUpdate(EngineOutput):
    """The steps of an update (or its preview) and the deletes that end it."""

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
            if is_provider(old) and old["urn"] not in self.handled:
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
        gone = [o for o in self.olds.values() if o["urn"] not in self.handled and not is_provider(o)]
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
        if not is_provider(old):
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
        new = custom_state(urn, type_, parent[0].urn if parent else self.stack_urn, provider_ref)
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
        now = timestamp()
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
