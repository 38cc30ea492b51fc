"""What the engine shows: the event stream (step events with their state metadata, diagnostics with
secrets masked) and the progress lines and closing summary on stdout."""

from __future__ import annotations

import json
import math
from typing import Any

from .enginestate import STACK_TYPE, EngineState
from .values import UNKNOWN, Secret, plain, to_event

_NO_CHANGE_OPS = ("same", "read", "discard", "read-replacement")
"""Step ops that engine.HasChanges does not count as changes."""

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


class EngineOutput(EngineState):
    """The event stream, diagnostics and stdout of one operation."""

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

    def has_changes(self) -> bool:
        """engine.HasChanges: any step other than same/read counts, the stack's own create included."""
        return any(n for op, n in self.counts.items() if op not in _NO_CHANGE_OPS)

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

    def _collect_secret_outputs(self, outputs: Any) -> None:
        """Remember secret output texts so diagnostics never print them."""
        if isinstance(outputs, dict):
            for v in outputs.values():
                if isinstance(v, Secret):
                    self._collect_secret_texts(plain(v))

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


def _mask_state(value: Any) -> Any:
    from .values import SECRET_SIG, SIG_KEY

    if isinstance(value, dict):
        if value.get(SIG_KEY) == SECRET_SIG:
            return {SIG_KEY: SECRET_SIG, "ciphertext": "[secret]"}
        return {k: _mask_state(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask_state(v) for v in value]
    return value
