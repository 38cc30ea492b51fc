"""``spec.outputs``: the one Secret or ConfigMap that holds a Stack's latest successful outputs (pure).

Upstream writes one immutable outputs Secret per Update (``<update>-stack-outputs``, every value
JSON, :func:`pko.controllers.update.status.outputs_secret`): a new name each run, so no workload
can mount it. Here the Stack keeps one object of a stable name in its namespace holding the outputs
of its last successful up, written when the reconcile that records that up reads its outputs
Secret (:func:`publishing_update` says which Update, the reconciler reads it, :func:`publish`
decides the write; a write goes before the status that records the Update, so a failure that
propagates records nothing and the next reconcile tries again).

Invariants:

* written only from an up that succeeded (a row of :mod:`~pko.controllers.stack.kinds`), never
  from a failed, cancelled or preview run: the object always holds outputs of one successful up;
* the object is created, or updated in place (same uid) when this Stack owns it (an
  ownerReference with the Stack's uid, so it is deleted with the Stack); an object of that name
  the Stack does not own is never written: the ``OutputsNotWritten`` condition and a Warning Event
  say so, and the Stack looks again every :data:`OUTPUTS_RECHECK` seconds, so removing the object
  (or fixing the RBAC that refused a write) is enough;
* a secret output only ever goes into a Secret: a ConfigMap leaves it out and names it in the
  ``pulumi.com/secret-outputs-omitted`` annotation (docs/stacks.md says why this, not a stall);
* keys are the per-Update Secret's (sanitised output names); a string output is its value as is
  (what an environment variable or a mounted file wants), any other the same JSON as there.

The reconciler reads the Update's outputs Secret and the object of ``spec.outputs`` before deciding;
a read the apiserver refuses (403: the secrets-per-namespace install, not bound in the Stack's
namespace) decides nothing: :func:`unreadable` plans a Warning Event that says what to bind
(:class:`~pko.controllers.secretaccess.SecretAccess`) and a look again on the Secret timer.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any, Final

from pko.api.stack import Stack, StackOutputs
from pko.api.stackterms import (
    OUTPUTS_NOT_OWNED,
    OUTPUTS_NOT_WRITTEN,
    OUTPUTS_WRITE_FAILED,
    SECRET_OUTPUTS_OMITTED_ANNOTATION,
)
from pko.controllers.resources import SECRETS_ANNOTATION
from pko.controllers.secretaccess import SECRET_FORBIDDEN_REASON
from pko.controllers.stack.kinds import recorded_kind
from pko.controllers.stack.steps import (
    Emit,
    Log,
    Observed,
    Plan,
    UpdateOutputs,
    Write,
    WriteOutputs,
    after,
)
from pko.controllers.stack.watches import update_complete
from pko.controllers.stack.workspaceobject import stack_labels
from pko.machinery.conditions import get_condition, is_true, remove_condition, set_condition
from pko.machinery.objects import set_controller_reference
from pko.machinery.resource import Obj

__all__ = [
    "OUTPUTS_RECHECK",
    "outputs_body",
    "owned_by",
    "publish",
    "publishing_update",
    "recheck",
    "unreadable",
    "update_outputs",
]

OUTPUTS_RECHECK: Final = 120.0
"""While the object could not be written, the Stack looks again this often (Secrets and ConfigMaps
are not watched: nothing else would tell it the way is clear)."""


def publishing_update(obj: Obj, stack: Stack | None, current: Obj | None, last: Obj | None) -> Obj | None:
    """The Update whose outputs the object should be written with now (None: nothing to write):
    the one ``status.currentUpdate`` names once it ended as a successful up (not cancelled); else,
    while ``OutputsNotWritten`` says an earlier write did not happen, the last Update when it
    succeeded. ``current``/``last``: those Updates as read (None: gone or none)."""
    if stack is None or stack.spec.outputs is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
        return None
    status: Obj = obj.get("status") or {}
    named = status.get("currentUpdate") or {}
    if named:
        if current is None or not update_complete(current) or named.get("cancelRequest"):
            return None
        return current if _succeeded_up(named, current) else None
    if last is None or not is_true(status.get("conditions"), OUTPUTS_NOT_WRITTEN):
        return None
    recorded = status.get("lastUpdate") or {}
    last_name = (last.get("metadata") or {}).get("name")
    if recorded.get("state") != "succeeded" or recorded.get("name") != last_name:
        return None
    return last if _succeeded_up(recorded, last) else None


def _succeeded_up(named: Mapping[str, Any], update: Obj) -> bool:
    """``update`` is a kind that publishes its outputs, succeeded, and has an outputs Secret."""
    upd_status = update.get("status") or {}
    failed = get_condition(upd_status.get("conditions"), "Failed") or {}
    return (
        recorded_kind(named, update).publishes_outputs
        and (update.get("spec") or {}).get("type") == "up"
        and failed.get("status") == "False"
        and bool(upd_status.get("outputs"))
    )


def update_outputs(update: str, secret: Mapping[str, Any]) -> UpdateOutputs:
    """The outputs an Update's outputs Secret holds (a value that is not base64 is left out)."""
    annotation = ((secret.get("metadata") or {}).get("annotations") or {}).get(SECRETS_ANNOTATION)
    try:
        secret_keys = frozenset(str(k) for k in json.loads(annotation)) if annotation else frozenset()
    except (ValueError, TypeError):
        secret_keys = frozenset()
    values: dict[str, bytes] = {}
    for key, encoded in (secret.get("data") or {}).items():
        try:
            values[str(key)] = base64.b64decode(str(encoded), validate=True)
        except (binascii.Error, ValueError):
            continue
    return UpdateOutputs(update, values, secret_keys & values.keys())


def _text(raw: bytes) -> str:
    """A value as apps read it: a JSON string's text, any other JSON as it is."""
    try:
        value = json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")
    return value if isinstance(value, str) else raw.decode("utf-8")


def owned_by(existing: Obj, stack_obj: Obj) -> bool:
    """``existing`` names the Stack (this one: its uid) among its owners."""
    uid = (stack_obj.get("metadata") or {}).get("uid")
    refs = (existing.get("metadata") or {}).get("ownerReferences") or []
    return bool(uid) and any(ref.get("uid") == uid for ref in refs)


def outputs_body(stack_obj: Obj, spec: StackOutputs, outputs: UpdateOutputs, existing: Obj | None) -> Obj:
    """The object ``spec`` names holding ``outputs``: new, or ``existing`` (one the Stack owns) with
    its data replaced and its labels, annotations and owner kept (its resourceVersion too, so the
    update is refused if it changed since it was read)."""
    meta = stack_obj.get("metadata") or {}
    omitted = sorted(outputs.secret) if spec.kind == "ConfigMap" else []
    text = {k: _text(v) for k, v in sorted(outputs.values.items()) if k not in omitted}
    body: Obj = dict(existing) if existing is not None else {"apiVersion": "v1", "kind": spec.kind}
    body_meta: Obj = dict(body.get("metadata") or {"name": spec.name, "namespace": meta.get("namespace")})
    body_meta["labels"] = {**(body_meta.get("labels") or {}), **stack_labels(str(meta.get("name")))}
    annotations = {
        k: v
        for k, v in (body_meta.get("annotations") or {}).items()
        if k not in (SECRETS_ANNOTATION, SECRET_OUTPUTS_OMITTED_ANNOTATION)
    }
    if spec.kind == "Secret":
        annotations[SECRETS_ANNOTATION] = json.dumps(sorted(outputs.secret))
        body["type"] = body.get("type") or "Opaque"
        body["data"] = {k: base64.b64encode(v.encode()).decode("ascii") for k, v in text.items()}
        body.pop("stringData", None)
    else:
        if omitted:
            annotations[SECRET_OUTPUTS_OMITTED_ANNOTATION] = json.dumps(omitted)
        body["data"] = text
        body.pop("binaryData", None)
    body_meta["annotations"] = annotations
    body["metadata"] = body_meta
    if existing is None:
        set_controller_reference(stack_obj, body, block_owner_deletion=True)
    return body


def publish(observed: Observed, stack: Stack, status: Obj) -> WriteOutputs | list[Write]:
    """What ``spec.outputs`` asks of this reconcile: the write to make first (decided again with
    its answer), or the Events that say how it went, with the ``OutputsNotWritten`` condition set
    or cleared on ``status``."""
    spec, obj = stack.spec.outputs, observed.obj
    generation = int((obj.get("metadata") or {}).get("generation") or 0)
    if spec is None:
        _clear(status)
        return []
    where = f"{spec.kind} {spec.name}"
    written, outputs = observed.outputs_written, observed.update_outputs
    if written is not None:
        if written.failure is not None:
            why = f"(HTTP {written.failure.status}): {_api_message(written.failure.message)}"
            if written.failure.status == 403:  # secrets-per-namespace, not bound here: what to bind
                verb = "update" if observed.outputs_object is not None else "create"
                namespace = (obj.get("metadata") or {}).get("namespace")
                why = observed.settings.access.forbidden(namespace, spec.name, verb=verb, kind=spec.kind)
            message = (
                f"the outputs of Update {outputs.update if outputs else '?'} could not be written to "
                f"{where}: {why}; tried again every {OUTPUTS_RECHECK:.0f}s"
            )
            return _not_written(status, False, message, generation, observed)
        _clear(status)
        return [Emit("Normal", "OutputsWritten", _written_message(spec, outputs))]
    if outputs is None:
        return []
    existing = observed.outputs_object
    if existing is not None and not owned_by(existing, obj):
        message = (
            f"{where} exists and is not owned by this Stack, so its outputs (Update {outputs.update}) "
            f"were not written to it; delete or rename that {spec.kind}, or set spec.outputs.name "
            f"to another name (looked at again every {OUTPUTS_RECHECK:.0f}s)"
        )
        return _not_written(status, True, message, generation, observed)
    return WriteOutputs(outputs_body(obj, spec, outputs, existing), existing=existing is not None)


def _clear(status: Obj) -> None:
    if get_condition(status.get("conditions"), OUTPUTS_NOT_WRITTEN) is not None:
        status["conditions"] = remove_condition(status.get("conditions"), OUTPUTS_NOT_WRITTEN)


def _not_written(
    status: Obj, foreign: bool, message: str, generation: int, observed: Observed
) -> list[Write]:
    """Mark the condition (``foreign``: the object is not the Stack's, else the write was refused);
    a Warning Event when it says something new (not at every look again)."""
    before = get_condition(status.get("conditions"), OUTPUTS_NOT_WRITTEN) or {}
    status["conditions"] = set_condition(
        status.get("conditions"),
        OUTPUTS_NOT_WRITTEN,
        "True",
        OUTPUTS_NOT_OWNED if foreign else OUTPUTS_WRITE_FAILED,
        message,
        generation,
        observed.now,
    )
    if before.get("status") == "True" and before.get("message") == message:
        return []
    return [Emit("Warning", OUTPUTS_NOT_OWNED if foreign else OUTPUTS_WRITE_FAILED, message)]


def _api_message(body: str) -> str:
    """The apiserver's ``Status`` message from a response body (the body when it is not one)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return body
    return str(parsed.get("message") or body) if isinstance(parsed, dict) else body


def _written_message(spec: StackOutputs, outputs: UpdateOutputs | None) -> str:
    if outputs is None:
        return f"outputs written to {spec.kind} {spec.name}"
    message = f"outputs of Update {outputs.update} written to {spec.kind} {spec.name}"
    if spec.kind == "ConfigMap" and outputs.secret:
        message += f" (secret outputs left out: {', '.join(sorted(outputs.secret))})"
    return message


def recheck(plan: Plan) -> Plan:
    """``plan``, looking again within :data:`OUTPUTS_RECHECK` while ``OutputsNotWritten`` holds."""
    if plan.then is not None or not is_true(plan.status.get("conditions"), OUTPUTS_NOT_WRITTEN):
        return plan
    result = plan.result
    if result.kind == "requeue" or (result.kind == "requeue_after" and result.delay <= OUTPUTS_RECHECK):
        return plan
    plan.result = after(OUTPUTS_RECHECK)
    return plan


def unreadable(obj: Obj, refused: str, requeue: float | None) -> Plan:
    """The reconcile of Stack ``obj`` when a read before deciding was refused (``refused``: what to
    bind, :class:`~pko.controllers.secretaccess.SecretForbidden`): a Warning Event, as a refused
    gitAuth Secret's Stalled condition words it, and a look again in ``requeue`` seconds (the
    Secret timer: RBAC is not watched); nothing else is written, the Update in flight stays named."""
    meta = obj.get("metadata") or {}
    fields = {"stack": f"{meta.get('namespace')}/{meta.get('name')}", "reason": SECRET_FORBIDDEN_REASON}
    said = Log("a Secret the Stack needs was refused", fields)
    return Plan([Emit("Warning", SECRET_FORBIDDEN_REASON, refused), said], after(requeue))
