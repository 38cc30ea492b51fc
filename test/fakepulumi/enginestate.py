"""The engine's state: the base checkpoint and the new one it builds step by step, saved (with its pending
operations) before and after each resource operation, the stack's config, and the history entry."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

from . import config as cfgmod
from .eventlog import EventLog
from .request import Request
from .stackctx import StackContext
from .targets import UrnTargets
from .values import from_state
from .version import cli_version

STACK_TYPE = "pulumi:pulumi:Stack"
_HISTORY_KIND = {"import": "resource-import"}
"""Request kinds whose history ``kind`` differs (apitype.ResourceImportUpdate)."""


class Display:
    """Progress text on stdout, flushed per line so ``on_output`` sees it live."""

    def line(self, text: str = "") -> None:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


class EngineState:
    """One operation's state; the layers above add its output (EngineOutput), the update's steps
    (EngineUpdate) and the run itself (Engine)."""

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

    @property
    def unsuccessful(self) -> bool:
        return self.failed or self.bailed

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


def is_provider(res: dict[str, Any]) -> bool:
    return str(res.get("type", "")).startswith("pulumi:providers:")


def custom_state(urn: str, type_: str, parent: str, provider_ref: str) -> dict[str, Any]:
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


def timestamp() -> str:
    from .backend import now_rfc3339

    return now_rfc3339()
